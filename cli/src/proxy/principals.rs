//! Who acts in a proxied call, and in which scope: read from each client request before the
//! guard sees it, and handed to the guard as request extensions.
//!
//! The actor, by the flags (`--actor` and `--actor-header` exclude each other):
//!
//! 1. `--actor NAME`: one fixed actor for every client.
//! 2. `--actor-header NAME`: the value of a header a trusted gateway in front sets. A request
//!    without it is refused unsent; the header is not forwarded.
//! 3. Otherwise every credential the client's request carries (`Authorization`,
//!    `Proxy-Authorization`, `Cookie`, `X-API-Key`, the `--credential-header`s, the query
//!    string: the library's `credentials` rule), as a keyed tag
//!    (`credentials:hmac-sha256:<32 hex>`): never a value, not reversible, the same in every
//!    proxy that shares the `--ledger` (its key is derived from the ledger's fingerprint key,
//!    under a label of its own). A request that carries none acts as `anonymous`.
//!
//! The scope: `--scope S` for every client, or `--scope-header NAME` (refused without it; not
//! forwarded).

use std::sync::Arc;

use super::authentication::{Authentication, ClientCertificate, Unauthenticated};
use http::{HeaderMap, HeaderName, Uri, header};
use mcp_replay_guard::{
    Actor, IntentScope, credentials::CredentialActors, fingerprint::FingerprintKey,
};

/// The longest actor or scope a gateway header may carry, in bytes.
const MAX_HEADER_VALUE: usize = 256;

/// Where the actor of a request comes from.
#[derive(Clone)]
enum ActorSource {
    Credentials(CredentialActors),
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
    /// `--clients`, `--jwt-*`: the actor is the principal a request proves.
    authentication: Option<Arc<Authentication>>,
}

impl std::fmt::Debug for Principals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The tag key is secret.
        let actor = match &self.actor {
            ActorSource::Credentials(actors) => format!("{actors:?}"),
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
    /// The actor from `fixed` or the `header`, else from the request's credentials (those of
    /// [`CredentialActors`] and the `credential_headers`) tagged under `key`; the scope from
    /// `scope`.
    pub(super) fn new(
        fixed: Option<&str>,
        header: Option<HeaderName>,
        credential_headers: Vec<HeaderName>,
        scope: ScopeSource,
        key: &FingerprintKey,
    ) -> Self {
        let actor = match (fixed, header) {
            (Some(actor), _) => ActorSource::Fixed(Actor::new(actor)),
            (None, Some(header)) => ActorSource::Header(header),
            (None, None) => ActorSource::Credentials(
                credential_headers
                    .into_iter()
                    .fold(CredentialActors::new(key), CredentialActors::header),
            ),
        };
        Self {
            actor,
            scope,
            authentication: None,
        }
    }

    /// With client authentication, the actor of every request is the principal it proves.
    pub(super) fn authenticated_by(mut self, authentication: Option<Authentication>) -> Self {
        self.authentication = authentication.map(Arc::new);
        self
    }

    /// The principal's actor of the request with these `headers`, when clients authenticate
    /// (the credential is removed); `Ok(None)` when they do not.
    pub(super) fn authenticate(
        &self,
        headers: &mut HeaderMap,
        certificate: Option<&ClientCertificate>,
    ) -> Result<Option<Actor>, Unauthenticated> {
        match &self.authentication {
            Some(authentication) => Ok(Some(
                authentication.authenticate(headers, certificate)?.actor(),
            )),
            None => Ok(None),
        }
    }

    /// The credential headers that name the actor, when the actor comes from them.
    pub(super) fn credential_headers(&self) -> Option<&[HeaderName]> {
        if self.authentication.is_some() {
            return None;
        }
        match &self.actor {
            ActorSource::Credentials(actors) => Some(actors.headers()),
            _ => None,
        }
    }

    /// Who acts in the request with these `headers` to `uri`, and in which scope. The
    /// gateway's headers are removed: they are for the proxy, not the upstream.
    pub(super) fn identify(
        &self,
        headers: &mut HeaderMap,
        uri: &Uri,
        authenticated: Option<Actor>,
    ) -> Result<(Actor, IntentScope), Unidentified> {
        let actor = match (authenticated, &self.actor) {
            (Some(actor), _) => actor,
            (None, ActorSource::Fixed(actor)) => actor.clone(),
            (None, ActorSource::Header(name)) => Actor::new(gateway_value(headers, name)?),
            (None, ActorSource::Credentials(actors)) => actors.actor(headers, uri),
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

    const URI: &str = "http://127.0.0.1/mcp";

    fn by_credentials(key: &FingerprintKey) -> Principals {
        Principals::new(
            None,
            None,
            vec![HeaderName::from_static("x-tenant-key")],
            ScopeSource::Fixed(IntentScope::new("cli")),
            key,
        )
    }

    fn with_authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn actor(principals: &Principals, headers: &mut HeaderMap, uri: &str) -> Actor {
        principals
            .identify(headers, &uri.parse().unwrap(), None)
            .unwrap()
            .0
    }

    #[test]
    fn every_credential_the_client_sends_names_its_actor() {
        let principals = by_credentials(&key(7));
        let alice = actor(&principals, &mut with_authorization("Bearer alice"), URI);
        assert!(
            alice.as_str().starts_with("credentials:hmac-sha256:"),
            "{alice}"
        );
        assert!(!alice.as_str().contains("alice"), "{alice}");
        let again = actor(&principals, &mut with_authorization("bearer alice"), URI);
        assert_eq!(alice, again);
        let mut tenant = HeaderMap::new();
        tenant.insert("x-tenant-key", HeaderValue::from_static("alice"));
        let by_tenant = actor(&principals, &mut tenant, URI);
        let by_query = actor(
            &principals,
            &mut HeaderMap::new(),
            "http://h/mcp?token=alice",
        );
        let nobody = actor(&principals, &mut HeaderMap::new(), URI);
        assert_eq!(nobody.as_str(), mcp_replay_guard::credentials::ANONYMOUS);
        for other in [&by_tenant, &by_query, &nobody] {
            assert_ne!(&alice, other);
        }
        assert_ne!(by_tenant, by_query);
        let names = principals.credential_headers().unwrap();
        assert!(names.iter().any(|name| name == "x-tenant-key"), "{names:?}");
    }

    #[test]
    fn gateway_headers_are_read_removed_and_required() {
        let principals = Principals::new(
            None,
            Some(HeaderName::from_static("x-user")),
            Vec::new(),
            ScopeSource::Header(HeaderName::from_static("x-run")),
            &key(7),
        );
        let mut headers = with_authorization("Bearer t");
        headers.insert("x-user", HeaderValue::from_static("user:alice"));
        headers.insert("x-run", HeaderValue::from_static("run:1"));
        let (actor, scope) = principals
            .identify(&mut headers, &URI.parse().unwrap(), None)
            .unwrap();
        assert_eq!((actor.as_str(), scope.as_str()), ("user:alice", "run:1"));
        assert!(headers.get("x-user").is_none() && headers.get("x-run").is_none());
        assert!(headers.get(header::AUTHORIZATION).is_some());

        let mut missing = with_authorization("Bearer t");
        missing.insert("x-run", HeaderValue::from_static("run:1"));
        assert!(matches!(
            principals.identify(&mut missing, &URI.parse().unwrap(), None),
            Err(Unidentified::Missing(_))
        ));
        for bad in [" ", &"a".repeat(MAX_HEADER_VALUE + 1)] {
            let mut headers = HeaderMap::new();
            headers.insert("x-user", HeaderValue::from_str(bad).unwrap());
            headers.insert("x-run", HeaderValue::from_static("run:1"));
            assert!(matches!(
                principals.identify(&mut headers, &URI.parse().unwrap(), None),
                Err(Unidentified::Invalid(_))
            ));
        }
        let mut twice = HeaderMap::new();
        twice.append("x-user", HeaderValue::from_static("user:alice"));
        twice.append("x-user", HeaderValue::from_static("user:bob"));
        twice.insert("x-run", HeaderValue::from_static("run:1"));
        assert!(matches!(
            principals.identify(&mut twice, &URI.parse().unwrap(), None),
            Err(Unidentified::Invalid(_))
        ));
    }

    #[test]
    fn a_fixed_actor_ignores_authorization() {
        let principals = Principals::new(
            Some("team:ops"),
            None,
            Vec::new(),
            ScopeSource::Fixed(IntentScope::new("cli")),
            &key(7),
        );
        let fixed = actor(&principals, &mut with_authorization("Bearer x"), URI);
        assert_eq!(fixed.as_str(), "team:ops");
        assert!(principals.credential_headers().is_none());
    }
}
