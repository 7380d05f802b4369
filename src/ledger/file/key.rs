//! The fingerprint key kept beside the ledger, and the key id its chain names.

use super::*;

pub(super) use crate::ledger::key_id::{key_id, short_id};

/// Whether a ledger that names `bound` (if any) may be used with the key of id `id`.
pub(super) fn check_key(bound: Option<&str>, id: &str) -> Result<(), LedgerError> {
    crate::ledger::key_id::check_key(bound, id, "restore the ledger's own key file")
}

/// Reads the key file, `None` when there is none.
pub(super) fn read_key(p: &Path) -> Result<Option<FingerprintKey>, LedgerError> {
    let text = match fs::read_to_string(p) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failed(&format!("cannot read the key {}", p.display()), e)),
    };
    // The errors never carry the file's content.
    FingerprintKey::from_hex(&text)
        .map(Some)
        .map_err(|e| failed(&format!("the key file {}", p.display()), e))
}

/// Creates the 0600 key file beside a ledger (or reads the one a racing process created), its
/// name made durable through `disk`.
pub(super) fn create_key(
    path: &Path,
    key_path: &Path,
    disk: &dyn Disk,
) -> Result<FingerprintKey, LedgerError> {
    let key = FingerprintKey::generate().map_err(|e| failed("cannot make a fingerprint key", e))?;
    // Write a private temporary file, then link it into place: if another process won the
    // race, its key is the one everybody uses.
    let tmp = sibling(path, &format!("key.{}.tmp", std::process::id()));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| failed(&format!("cannot create {}", tmp.display()), e))?;
    file.write_all(hex::encode(key.expose_bytes()).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| failed(&format!("cannot write {}", tmp.display()), e))?;
    let linked = fs::hard_link(&tmp, key_path);
    let _ = fs::remove_file(&tmp);
    match linked {
        // The key must outlive a power loss as the ledger lines made with it do.
        Ok(()) => disk
            .sync_dir(super::disk::parent_dir(key_path))
            .map(|()| key)
            .map_err(|e| failed(&format!("cannot make {} durable", key_path.display()), e)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            read_key(key_path)?.ok_or_else(|| {
                storage(
                    &format!("cannot read {}", key_path.display()),
                    "it vanished",
                )
            })
        }
        Err(e) => Err(failed(&format!("cannot create {}", key_path.display()), e)),
    }
}
