//! Who acts in a proxied call, and in which scope: read from each client request before the
//! guard sees it, and handed to the guard as request extensions.
//!
//! The actor, by the flags (`--actor` and `--actor-header` exclude each other):
//!
//! 1. `--actor NAME`: one fixed actor for every client.
//! 2. `--actor-header NAME`: the value of a header a trusted gateway in front sets. A request
//!    without it is refused unsent; the header is not forwarded.
//! 3. Otherwise the client's `Authorization` value, as a keyed tag
//!    (`authorization:hmac-sha256:<32 hex>`): never the value, not reversible, the same in every
//!    proxy that shares the `--ledger` (its key is derived from the ledger's fingerprint key,
//!    under a label of its own). A request without `Authorization` acts as `anonymous`.
//!
//! The scope: `--scope S` for every client, or `--scope-header NAME` (refused without it; not
//! forwarded).

use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, header};
use mcp_replay_guard::{Actor, IntentScope, fingerprint::FingerprintKey};
use sha2::Sha256;

/// The actor of a request that presents no `Authorization` (when the actor comes from it).
pub(super) const ANONYMOUS: &str = "anonymous";

/// Label of the actor-tag key derivation: HMAC(fingerprint key, label). A tag is keyed apart
/// from every fingerprint, so the two can never be taken for each other.
const ACTOR_TAG_LABEL: &[u8] = b"mcp-replay-guard/v1/proxy-actor-tag";

/// The longest actor or scope a gateway header may carry, in bytes.
const MAX_HEADER_VALUE: usize = 256;

/// Where the actor of a request comes from.
#[derive(Clone)]
enum ActorSource {
    Authorization(Hmac<Sha256>),
    Header(HeaderName),
    Fixed(Actor),
}

/// Where the scope of a request comes from.
#[derive(Debug, Clone)]
pub(super) enum ScopeSource {
    Header(HeaderName),
    Fixed(IntentScope),
}

/// How the proxy tells its clients apart.
#[derive(Clone)]
pub(super) struct Principals {
    actor: ActorSource,
    scope: ScopeSource,
}

impl std::fmt::Debug for Principals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The tag key is secret.
        let actor = match &self.actor {
            ActorSource::Authorization(_) => "authorization tag".to_owned(),
            ActorSource::Header(name) => format!("header {name}"),
            ActorSource::Fixed(actor) => format!("fixed {actor}"),
        };
        f.debug_struct("Principals")
            .field("actor", &actor)
            .field("scope", &self.scope)
            .finish()
    }
}

/// Why a request names no principal: it is refused before anything is sent.
#[derive(Debug, thiserror::Error)]
pub(super) enum Unidentified {
    #[error("the request has no {0} header, which the gateway in front of the proxy sets")]
    Missing(HeaderName),
    #[error(
        "the {0} header is not a visible ASCII value of 1 to {MAX_HEADER_VALUE} bytes (the gateway in front of the proxy sets it)"
    )]
    Invalid(HeaderName),
}

impl Principals {
    /// The actor from `fixed` or the `header`, else from `Authorization` tagged under `key`;
    /// the scope from `scope`.
    pub(super) fn new(
        fixed: Option<&str>,
        header: Option<HeaderName>,
        scope: ScopeSource,
        key: &FingerprintKey,
    ) -> Self {
        let actor = match (fixed, header) {
            (Some(actor), _) => ActorSource::Fixed(Actor::new(actor)),
            (None, Some(header)) => ActorSource::Header(header),
            (None, None) => {
                let mut derive = Hmac::<Sha256>::new_from_slice(key.expose_bytes())
                    .expect("HMAC takes keys of any length");
                derive.update(ACTOR_TAG_LABEL);
                let tag_key = Hmac::<Sha256>::new_from_slice(&derive.finalize().into_bytes())
                    .expect("HMAC takes keys of any length");
                ActorSource::Authorization(tag_key)
            }
        };
        Self { actor, scope }
    }

    /// Who acts in the request with these `headers`, and in which scope. The gateway's headers
    /// are removed: they are for the proxy, not the upstream.
    pub(super) fn identify(
        &self,
        headers: &mut HeaderMap,
    ) -> Result<(Actor, IntentScope), Unidentified> {
        let actor = match &self.actor {
            ActorSource::Fixed(actor) => actor.clone(),
            ActorSource::Header(name) => Actor::new(gateway_value(headers, name)?),
            ActorSource::Authorization(tag_key) => match headers.get(header::AUTHORIZATION) {
                Some(value) => Actor::new(tag(tag_key, value.as_bytes())),
                None => Actor::new(ANONYMOUS),
            },
        };
        let scope = match &self.scope {
            ScopeSource::Fixed(scope) => scope.clone(),
            ScopeSource::Header(name) => IntentScope::new(gateway_value(headers, name)?),
        };
        Ok((actor, scope))
    }

    /// Removes the gateway's headers from a request that names no principal (an OAuth
    /// metadata request): they are for the proxy, never the upstream.
    pub(super) fn remove_gateway_headers(&self, headers: &mut HeaderMap) {
        if let ActorSource::Header(name) = &self.actor {
            headers.remove(name);
        }
        if let ScopeSource::Header(name) = &self.scope {
            headers.remove(name);
        }
    }
}

/// `authorization:hmac-sha256:` and the first 128 bits of HMAC(tag key, value), in hex.
fn tag(tag_key: &Hmac<Sha256>, value: &[u8]) -> String {
    let mut mac = tag_key.clone();
    mac.update(value);
    let digest = mac.finalize().into_bytes();
    format!("authorization:hmac-sha256:{}", hex::encode(&digest[..16]))
}

/// The value of a gateway header, taken out of `headers`.
fn gateway_value(headers: &mut HeaderMap, name: &HeaderName) -> Result<String, Unidentified> {
    let mut values = match headers.entry(name) {
        header::Entry::Occupied(entry) => entry.remove_entry_mult().1,
        header::Entry::Vacant(_) => return Err(Unidentified::Missing(name.clone())),
    };
    let value = values
        .next()
        .ok_or_else(|| Unidentified::Missing(name.clone()))?;
    // Two values would leave the choice to the order of headers: refused, as a bad value.
    if values.next().is_some() {
        return Err(Unidentified::Invalid(name.clone()));
    }
    match value.to_str() {
        Ok(text) if !text.trim().is_empty() && text.len() <= MAX_HEADER_VALUE => {
            Ok(text.trim().to_owned())
        }
        _ => Err(Unidentified::Invalid(name.clone())),
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn key(byte: u8) -> FingerprintKey {
        FingerprintKey::from_bytes(&[byte; 32]).unwrap()
    }

    fn by_authorization(key: &FingerprintKey) -> Principals {
        Principals::new(None, None, ScopeSource::Fixed(IntentScope::new("cli")), key)
    }

    fn with_authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn an_authorization_tag_is_keyed_stable_and_never_the_value() {
        let principals = by_authorization(&key(7));
        let (alice, _) = principals
            .identify(&mut with_authorization("Bearer alice-secret"))
            .unwrap();
        let (again, _) = by_authorization(&key(7))
            .identify(&mut with_authorization("Bearer alice-secret"))
            .unwrap();
        let (bob, _) = principals
            .identify(&mut with_authorization("Bearer bob-secret"))
            .unwrap();
        let (other_key, _) = by_authorization(&key(8))
            .identify(&mut with_authorization("Bearer alice-secret"))
            .unwrap();
        assert_eq!(alice, again);
        assert_ne!(alice, bob);
        assert_ne!(alice, other_key);
        let text = alice.as_str();
        assert!(text.starts_with("authorization:hmac-sha256:"), "{text}");
        assert_eq!(text.len(), "authorization:hmac-sha256:".len() + 32);
        assert!(!text.contains("alice"), "{text}");
        // Keyed apart from the fingerprint: the tag is not HMAC(fingerprint key, value).
        let mut plain = Hmac::<Sha256>::new_from_slice(key(7).expose_bytes()).unwrap();
        plain.update(b"Bearer alice-secret");
        let plain = hex::encode(&plain.finalize().into_bytes()[..16]);
        assert!(!text.ends_with(&plain));
    }

    #[test]
    fn no_authorization_is_anonymous() {
        let (actor, scope) = by_authorization(&key(7))
            .identify(&mut HeaderMap::new())
            .unwrap();
        assert_eq!(actor.as_str(), ANONYMOUS);
        assert_eq!(scope.as_str(), "cli");
    }

    #[test]
    fn gateway_headers_are_read_removed_and_required() {
        let principals = Principals::new(
            None,
            Some(HeaderName::from_static("x-user")),
            ScopeSource::Header(HeaderName::from_static("x-run")),
            &key(7),
        );
        let mut headers = with_authorization("Bearer t");
        headers.insert("x-user", HeaderValue::from_static("user:alice"));
        headers.insert("x-run", HeaderValue::from_static("run:1"));
        let (actor, scope) = principals.identify(&mut headers).unwrap();
        assert_eq!((actor.as_str(), scope.as_str()), ("user:alice", "run:1"));
        assert!(headers.get("x-user").is_none() && headers.get("x-run").is_none());
        assert!(headers.get(header::AUTHORIZATION).is_some());

        let mut missing = with_authorization("Bearer t");
        missing.insert("x-run", HeaderValue::from_static("run:1"));
        assert!(matches!(
            principals.identify(&mut missing),
            Err(Unidentified::Missing(_))
        ));
        for bad in [" ", &"a".repeat(MAX_HEADER_VALUE + 1)] {
            let mut headers = HeaderMap::new();
            headers.insert("x-user", HeaderValue::from_str(bad).unwrap());
            headers.insert("x-run", HeaderValue::from_static("run:1"));
            assert!(matches!(
                principals.identify(&mut headers),
                Err(Unidentified::Invalid(_))
            ));
        }
        let mut twice = HeaderMap::new();
        twice.append("x-user", HeaderValue::from_static("user:alice"));
        twice.append("x-user", HeaderValue::from_static("user:bob"));
        twice.insert("x-run", HeaderValue::from_static("run:1"));
        assert!(matches!(
            principals.identify(&mut twice),
            Err(Unidentified::Invalid(_))
        ));
    }

    #[test]
    fn a_fixed_actor_ignores_authorization() {
        let principals = Principals::new(
            Some("team:ops"),
            None,
            ScopeSource::Fixed(IntentScope::new("cli")),
            &key(7),
        );
        let (actor, _) = principals
            .identify(&mut with_authorization("Bearer x"))
            .unwrap();
        assert_eq!(actor.as_str(), "team:ops");
    }
}
