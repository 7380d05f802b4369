//! Who acts in a request, read from the credentials it carries: for a channel that serves many
//! callers (a proxy in front of an MCP server) and has no authenticated identity to give them.
//!
//! # The rule
//!
//! Every credential a server could receive from the request enters the actor: the values of
//! `Authorization`, `Proxy-Authorization`, `Cookie`, `X-API-Key`, `Api-Key`, `X-Auth-Token`,
//! any header added with [`CredentialActors::header`], and the request's whole query string
//! (a server may take a credential from any query parameter: `access_token`, `key`, `sig`, a
//! name of its own; one left out would make two principals one actor, and hand one of them
//! the other's result). Two requests are one actor only when they carry the same credentials.
//! A request that carries none is [`ANONYMOUS`]: every such caller is one actor.
//!
//! What is compared, so that spellings a server reads as one credential are one actor:
//!
//! - an authentication scheme (`Bearer`, `Basic`, …) case-insensitively: `Bearer X` and
//!   `bearer X` are one credential; the credential after it byte for byte;
//! - cookies and query parameters in any order of names (the values of one name keep their
//!   order: a server may read the first);
//! - surrounding whitespace ignored.
//!
//! The actor is a keyed tag, `credentials:hmac-sha256:<32 hex>`: never the credential, not
//! reversible, the same in every process that holds the same [`FingerprintKey`] (its key is
//! derived from it under a label of its own, so a tag is never a fingerprint).
//!
//! An opaque token says nothing of whom it was issued to: a refreshed token is another actor.
//!
//! ```
//! use mcp_replay_guard::{credentials::{ANONYMOUS, CredentialActors}, fingerprint::FingerprintKey};
//!
//! let actors = CredentialActors::new(&FingerprintKey::from_bytes(&[7; 32]).unwrap());
//! let request = |auth: &str| {
//!     http::Request::post("http://127.0.0.1/mcp?tenant=a")
//!         .header("authorization", auth)
//!         .body(())
//!         .unwrap()
//! };
//! let (alice, again) = (request("Bearer alice"), request("bearer  alice"));
//! let alice_actor = actors.actor(alice.headers(), alice.uri());
//! assert_eq!(alice_actor, actors.actor(again.headers(), again.uri()));
//! assert!(alice_actor.as_str().starts_with("credentials:hmac-sha256:"));
//! assert!(!alice_actor.as_str().contains("alice"));
//!
//! let nobody = http::Request::post("http://127.0.0.1/mcp").body(()).unwrap();
//! assert_eq!(actors.actor(nobody.headers(), nobody.uri()).as_str(), ANONYMOUS);
//! ```

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, Uri, header};
use sha2::Sha256;

use crate::{Actor, fingerprint::FingerprintKey};

/// The actor of a request that carries no credential.
pub const ANONYMOUS: &str = "anonymous";

/// The prefix of every tag.
const TAG_PREFIX: &str = "credentials:hmac-sha256:";

/// Label of the tag key's derivation: HMAC(fingerprint key, label).
const TAG_LABEL: &[u8] = b"mcp-replay-guard/v1/credential-actor-tag";

/// The query string's place among the credentials (no header name can be spelled so).
const QUERY: &str = "?";

/// The credential headers every request is read for, besides those added with
/// [`CredentialActors::header`].
pub const CREDENTIAL_HEADERS: [HeaderName; 6] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-auth-token"),
];

/// Tells callers apart by the credentials their requests carry (see the [module docs](self)).
///
/// # Clone
///
/// Cloning copies the tag key (a few hundred bytes) and the header names.
#[derive(Clone)]
pub struct CredentialActors {
    tag_key: Hmac<Sha256>,
    /// Sorted, without duplicates.
    headers: Vec<HeaderName>,
}

impl fmt::Debug for CredentialActors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The tag key is secret.
        f.debug_struct("CredentialActors")
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl CredentialActors {
    /// Tags under a key derived from `key` (a ledger's fingerprint key: every process that
    /// shares the ledger gives one caller one actor).
    pub fn new(key: &FingerprintKey) -> Self {
        let mut derive = Hmac::<Sha256>::new_from_slice(key.expose_bytes())
            .expect("HMAC takes keys of any length");
        derive.update(TAG_LABEL);
        let tag_key = Hmac::<Sha256>::new_from_slice(&derive.finalize().into_bytes())
            .expect("HMAC takes keys of any length");
        let mut headers = CREDENTIAL_HEADERS.to_vec();
        headers.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        Self { tag_key, headers }
    }

    /// Reads `name` as a credential too (a header the server authenticates with).
    pub fn header(mut self, name: HeaderName) -> Self {
        if let Err(at) = self
            .headers
            .binary_search_by(|known| known.as_str().cmp(name.as_str()))
        {
            self.headers.insert(at, name);
        }
        self
    }

    /// The headers read as credentials, by name.
    pub fn headers(&self) -> &[HeaderName] {
        &self.headers
    }

    /// The actor of a request with these `headers` to `uri`: a tag of every credential it
    /// carries, or [`ANONYMOUS`].
    pub fn actor(&self, headers: &HeaderMap, uri: &Uri) -> Actor {
        let mut mac = self.tag_key.clone();
        let mut any = false;
        let mut feed = |name: &str, value: &[u8]| {
            any = true;
            mac.update(&(name.len() as u64).to_be_bytes());
            mac.update(name.as_bytes());
            mac.update(&(value.len() as u64).to_be_bytes());
            mac.update(value);
        };
        for name in &self.headers {
            if *name == header::COOKIE {
                let cookies = headers
                    .get_all(name)
                    .iter()
                    .flat_map(|value| value.as_bytes().split(|&b| b == b';'));
                if let Some(cookies) = by_name(cookies, b'=', b"; ") {
                    feed(name.as_str(), &cookies);
                }
                continue;
            }
            for value in headers.get_all(name) {
                let value = trim(value.as_bytes());
                if value.is_empty() {
                    continue;
                }
                if *name == header::AUTHORIZATION || *name == header::PROXY_AUTHORIZATION {
                    feed(name.as_str(), &without_scheme_case(value));
                } else {
                    feed(name.as_str(), value);
                }
            }
        }
        let query = uri
            .query()
            .unwrap_or_default()
            .as_bytes()
            .split(|&b| b == b'&');
        if let Some(query) = by_name(query, b'=', b"&") {
            feed(QUERY, &query);
        }
        if !any {
            return Actor::new(ANONYMOUS);
        }
        let digest = mac.finalize().into_bytes();
        Actor::new(format!("{TAG_PREFIX}{}", hex::encode(&digest[..16])))
    }
}

/// `Scheme credentials` with the scheme in lower case and one space after it (a scheme is
/// case-insensitive, RFC 9110 §11.1); a value without a space (no scheme) as it is.
fn without_scheme_case(value: &[u8]) -> Vec<u8> {
    match value.iter().position(|&b| b == b' ' || b == b'\t') {
        Some(end) => {
            let mut canonical = value[..end].to_ascii_lowercase();
            canonical.push(b' ');
            canonical.extend_from_slice(trim(&value[end..]));
            canonical
        }
        None => value.to_vec(),
    }
}

/// The non-empty `parts` (trimmed), ordered by their name (what comes before `equals`; the
/// order of one name's values kept), joined by `separator`; `None` when there is none.
fn by_name<'a>(
    parts: impl Iterator<Item = &'a [u8]>,
    equals: u8,
    separator: &[u8],
) -> Option<Vec<u8>> {
    let mut parts: Vec<&[u8]> = parts.map(trim).filter(|part| !part.is_empty()).collect();
    if parts.is_empty() {
        return None;
    }
    let name = |part: &&[u8]| -> Vec<u8> {
        let end = part.iter().position(|&b| b == equals).unwrap_or(part.len());
        part[..end].to_vec()
    };
    parts.sort_by_key(name);
    Some(parts.join(separator))
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |end| end + 1);
    &bytes[start..end.max(start)]
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn actors(byte: u8) -> CredentialActors {
        CredentialActors::new(&FingerprintKey::from_bytes(&[byte; 32]).unwrap())
    }

    fn actor_of(actors: &CredentialActors, headers: &[(&str, &str)], uri: &str) -> String {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        actors
            .actor(&map, &uri.parse().unwrap())
            .as_str()
            .to_owned()
    }

    const URL: &str = "http://127.0.0.1/mcp";

    #[test]
    fn every_credential_separates_callers_and_none_is_anonymous() {
        let actors = actors(7).header(HeaderName::from_static("x-tenant-key"));
        let anonymous = actor_of(&actors, &[], URL);
        assert_eq!(anonymous, ANONYMOUS);
        // Headers that are no credential leave a caller anonymous.
        assert_eq!(
            actor_of(
                &actors,
                &[("user-agent", "a"), ("mcp-session-id", "s")],
                URL
            ),
            ANONYMOUS
        );
        let cases: [(&[(&str, &str)], &str); 9] = [
            (&[("authorization", "Bearer alice")], URL),
            (&[("proxy-authorization", "Basic YWxpY2U6eA==")], URL),
            (&[("cookie", "session=alice")], URL),
            (&[("x-api-key", "alice")], URL),
            (&[("api-key", "alice")], URL),
            (&[("x-auth-token", "alice")], URL),
            (&[("x-tenant-key", "alice")], URL),
            (&[], "http://127.0.0.1/mcp?access_token=alice"),
            (&[], "http://127.0.0.1/mcp?sig=alice"),
        ];
        let mut seen = std::collections::HashSet::new();
        for (headers, uri) in cases {
            let alice = actor_of(&actors, headers, uri);
            assert!(alice.starts_with(TAG_PREFIX), "{alice}");
            assert_eq!(alice.len(), TAG_PREFIX.len() + 32);
            assert!(!alice.contains("alice"), "{alice}");
            assert!(seen.insert(alice.clone()), "{headers:?} {uri}: {alice}");
            let bob_headers: Vec<(&str, String)> = headers
                .iter()
                .map(|(n, v)| {
                    (
                        *n,
                        v.replace("alice", "bob")
                            .replace("YWxpY2U6eA==", "Ym9iOng="),
                    )
                })
                .collect();
            let bob_headers: Vec<(&str, &str)> =
                bob_headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let bob = actor_of(&actors, &bob_headers, &uri.replace("alice", "bob"));
            assert_ne!(alice, bob, "{headers:?} {uri}");
            assert_ne!(bob, ANONYMOUS);
        }
    }

    #[test]
    fn one_credential_spelled_as_a_server_reads_it_is_one_actor() {
        let actors = actors(7);
        let same = |a: &[(&str, &str)], ua: &str, b: &[(&str, &str)], ub: &str| {
            assert_eq!(
                actor_of(&actors, a, ua),
                actor_of(&actors, b, ub),
                "{a:?} {b:?}"
            );
        };
        same(
            &[("authorization", "Bearer T")],
            URL,
            &[("authorization", "bearer  T ")],
            URL,
        );
        same(
            &[("cookie", "a=1; b=2")],
            URL,
            &[("cookie", "b=2"), ("cookie", "a=1")],
            URL,
        );
        same(&[], "http://h/mcp?key=k&x=1", &[], "http://h/mcp?x=1&key=k");
        // The credential itself is compared byte for byte; a bare token has no scheme.
        let differ = |a: &[(&str, &str)], ua: &str, b: &[(&str, &str)], ub: &str| {
            assert_ne!(
                actor_of(&actors, a, ua),
                actor_of(&actors, b, ub),
                "{a:?} {b:?}"
            );
        };
        differ(
            &[("authorization", "Bearer T")],
            URL,
            &[("authorization", "Bearer t")],
            URL,
        );
        differ(
            &[("authorization", "TokenA")],
            URL,
            &[("authorization", "tokena")],
            URL,
        );
        // Two values of one name keep their order (a server may read the first).
        differ(
            &[],
            "http://h/mcp?key=a&key=b",
            &[],
            "http://h/mcp?key=b&key=a",
        );
        // One credential under another name is another credential.
        differ(&[("x-api-key", "k")], URL, &[("api-key", "k")], URL);
        differ(&[("x-api-key", "k")], URL, &[], "http://h/mcp?x-api-key=k");
    }

    #[test]
    fn a_tag_is_keyed_apart_from_every_other_key() {
        let headers = [("authorization", "Bearer alice")];
        assert_ne!(
            actor_of(&actors(7), &headers, URL),
            actor_of(&actors(8), &headers, URL)
        );
        assert_eq!(
            actor_of(&actors(7), &headers, URL),
            actor_of(&actors(7), &headers, URL)
        );
        // Not HMAC(fingerprint key, value): the tag key is derived under its own label.
        let mut plain = Hmac::<Sha256>::new_from_slice(&[7; 32]).unwrap();
        plain.update(b"Bearer alice");
        let plain = hex::encode(&plain.finalize().into_bytes()[..16]);
        assert!(!actor_of(&actors(7), &headers, URL).ends_with(&plain));
        assert!(!format!("{:?}", actors(7)).contains("tag_key"));
    }
}
