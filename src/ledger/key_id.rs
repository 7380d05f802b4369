//! The id a durable ledger records for its fingerprint key, and the check of a key against it:
//! the file ledger keeps it in its chain, the PostgreSQL ledger in a row of its own.

use super::LedgerError;
use crate::fingerprint::FingerprintKey;

/// The id a ledger records for its fingerprint key: HMAC-SHA256 under the key of a fixed
/// label. It names the key without revealing it.
pub(crate) fn key_id(key: &FingerprintKey) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.expose_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(b"mcp-replay-guard key id");
    format!("hmac-sha256:{}", hex::encode(mac.finalize().into_bytes()))
}

/// The first 16 hex digits of a key id, enough to tell two keys apart in a message.
pub(crate) fn short_id(id: &str) -> &str {
    let end = id.len().min("hmac-sha256:".len() + 16);
    &id[..end]
}

/// Whether a ledger that names `bound` (if any) may be used with the key of id `id`; when it
/// may not, the error names both ids (never a key) and ends with `remedy`.
pub(crate) fn check_key(bound: Option<&str>, id: &str, remedy: &str) -> Result<(), LedgerError> {
    match bound {
        Some(bound) if bound != id => Err(LedgerError::storage(format!(
            "the fingerprint key is not the key this ledger was written with (the ledger names \
             key {}, this one is {}): {remedy}; another key would recognise none of its intents",
            short_id(bound),
            short_id(id)
        ))),
        _ => Ok(()),
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
        assert!(check_key(None, &id, "x").is_ok() && check_key(Some(&id), &id, "x").is_ok());
        let refused = check_key(Some("hmac-sha256:00"), &id, "give the right one").unwrap_err();
        assert!(
            refused.to_string().contains("give the right one"),
            "{refused}"
        );
    }
}
