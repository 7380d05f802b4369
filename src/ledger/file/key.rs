//! The fingerprint key kept beside the ledger, and the key id its chain names.

use super::*;

/// The id a ledger records for its fingerprint key: HMAC-SHA256 under the key of a fixed
/// label. It names the key without revealing it.
pub(super) fn key_id(key: &FingerprintKey) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.expose_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(b"mcp-replay-guard key id");
    format!("hmac-sha256:{}", hex::encode(mac.finalize().into_bytes()))
}

/// The first 16 hex digits of a key id, enough to tell two keys apart in a message.
pub(super) fn short_id(id: &str) -> &str {
    let end = id.len().min("hmac-sha256:".len() + 16);
    &id[..end]
}

/// Whether a ledger that names `bound` (if any) may be used with the key of id `id`.
pub(super) fn check_key(bound: Option<&str>, id: &str) -> Result<(), LedgerError> {
    match bound {
        Some(bound) if bound != id => Err(LedgerError::storage(format!(
            "the fingerprint key is not the key this ledger was written with (the ledger names \
             key {}, this one is {}): restore the ledger's own key file; another key would \
             recognise none of its intents",
            short_id(bound),
            short_id(id)
        ))),
        _ => Ok(()),
    }
}

/// Reads the key file, `None` when there is none.
pub(super) fn read_key(p: &Path) -> Result<Option<FingerprintKey>, LedgerError> {
    let text = match fs::read_to_string(p) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failed(&format!("cannot read the key {}", p.display()), e)),
    };
    // The errors never carry the file's content.
    let bytes = hex::decode(text.trim())
        .map_err(|_| LedgerError::storage(format!("the key file {} is not hex", p.display())))?;
    FingerprintKey::from_bytes(&bytes)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_id_names_the_key_without_revealing_it() {
        let key = FingerprintKey::from_bytes(&[7; 32]).unwrap();
        let id = key_id(&key);
        assert!(
            id.starts_with("hmac-sha256:") && id.len() == 12 + 64,
            "{id}"
        );
        assert!(!id.contains(&hex::encode(key.expose_bytes())));
        assert_ne!(id, key_id(&FingerprintKey::from_bytes(&[8; 32]).unwrap()));
        assert_eq!(short_id(&id).len(), 12 + 16);
        assert!(check_key(None, &id).is_ok() && check_key(Some(&id), &id).is_ok());
        assert!(check_key(Some("hmac-sha256:00"), &id).is_err());
    }
}
