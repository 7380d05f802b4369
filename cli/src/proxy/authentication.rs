//! Client authentication on the proxy's listener: who is calling, proved, before anything of the
//! request is read or sent.
//!
//! Two sources, either or both:
//!
//! - **API keys** (`--clients FILE`): a TOML file of `[[client]]` entries, each a `principal`
//!   and the SHA-256 of its key in hex (`key_sha256`), never the key. The key comes as
//!   `Authorization: Bearer KEY` or `X-API-Key: KEY`. The principal is the entry's name.
//! - **JWT** (`--jwt-jwks FILE`, `--jwt-issuer`, `--jwt-audience`): a bearer token signed by a
//!   key of the JWKS, its `exp` and `nbf` checked with a 30 s leeway, its `iss` and `aud`
//!   those named. The principal is the token's `iss` and `sub`, so a refreshed token (new
//!   `exp`, same `sub`) is the same principal.
//!
//! The credential that authenticated the client is removed from the request: it is for the
//! proxy, never the upstream. A request that does not authenticate is answered 401 with a
//! `WWW-Authenticate: Bearer` challenge; nothing is sent and nothing is recorded, and the
//! reason is logged without the credential.

use std::{collections::HashMap, path::Path, time::Duration};

use anyhow::{Context, bail};
use http::{HeaderMap, HeaderName, HeaderValue, header};
use jsonwebtoken::{
    Algorithm, DecodingKey, Validation,
    jwk::{Jwk, JwkSet},
};
use mcp_replay_guard::Actor;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::tls::{ClientIdentity, SanKind};

/// `X-API-Key`: the other header an API key may come in.
const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// How far a token's `exp` and `nbf` may be off this host's clock.
const LEEWAY: Duration = Duration::from_secs(30);

/// The largest clients or JWKS file read, in bytes.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The challenge of a 401.
pub(super) const CHALLENGE: &str = "Bearer realm=\"replay-guard\"";

/// What the certificate a client presented names, verified against `--client-ca`: set on each
/// request of its connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClientCertificate(pub(super) ClientIdentity);

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Principal(String);

impl Principal {
    /// The actor the guard records: the principal, under a prefix that says it was proved.
    pub(super) fn actor(&self) -> Actor {
        Actor::new(format!("principal:{}", self.0))
    }
}

/// Why a request did not authenticate. Never holds the credential.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum Unauthenticated {
    #[error("the request carries no credential (Authorization: Bearer, or X-API-Key)")]
    Missing,
    #[error("the request carries more than one credential")]
    Ambiguous,
    #[error("the API key is not one of the clients file's")]
    UnknownKey,
    #[error("the bearer token is not a valid JWT of the configured issuer: {0}")]
    InvalidToken(String),
    #[error(
        "the client certificate has no subject alternative name of the kind that names a principal"
    )]
    NoAlternativeName,
}

/// The clients file: `[[client]]` entries.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientsFile {
    #[serde(default)]
    client: Vec<ClientEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientEntry {
    principal: String,
    key_sha256: String,
}

/// What a JWT names of its caller.
#[derive(Debug, Deserialize)]
struct Claims {
    iss: String,
    sub: String,
}

/// The JWT settings: the keys, and what a token must say.
struct Jwt {
    keys: JwkSet,
    issuer: String,
    audience: String,
}

/// How the proxy authenticates its clients.
pub(super) struct Authentication {
    /// Principal by the SHA-256 of its key.
    keys: HashMap<[u8; 32], String>,
    jwt: Option<Jwt>,
    /// A verified client certificate names the principal (`--client-ca`): its subject, or its
    /// first subject alternative name of a kind.
    certificates: Option<Option<SanKind>>,
}

impl std::fmt::Debug for Authentication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authentication")
            .field("api_key_clients", &self.keys.len())
            .field("jwt_issuer", &self.jwt.as_ref().map(|jwt| &jwt.issuer))
            .finish()
    }
}

impl Authentication {
    /// From the flags: `None` when neither source is configured.
    pub(super) fn from_files(
        clients: Option<&Path>,
        jwks: Option<&Path>,
        issuer: Option<&str>,
        audience: Option<&str>,
        certificates: Option<Option<SanKind>>,
    ) -> anyhow::Result<Option<Self>> {
        let keys = match clients {
            Some(path) => read_clients(path)?,
            None => HashMap::new(),
        };
        let jwt = match (jwks, issuer, audience) {
            (None, None, None) => None,
            (Some(path), Some(issuer), Some(audience)) => Some(Jwt {
                keys: read_jwks(path)?,
                issuer: issuer.to_owned(),
                audience: audience.to_owned(),
            }),
            _ => bail!("--jwt-jwks, --jwt-issuer and --jwt-audience go together"),
        };
        if clients.is_none() && jwt.is_none() && certificates.is_none() {
            return Ok(None);
        }
        Ok(Some(Self {
            keys,
            jwt,
            certificates,
        }))
    }

    /// The principal of the request with these `headers`, sent on a connection whose client
    /// presented `certificate`; the credential it proved itself with is removed. A verified
    /// certificate names the principal; the headers are then left as they are.
    pub(super) fn authenticate(
        &self,
        headers: &mut HeaderMap,
        certificate: Option<&ClientCertificate>,
    ) -> Result<Principal, Unauthenticated> {
        if let (Some(names), Some(ClientCertificate(identity))) = (self.certificates, certificate) {
            return match names {
                None => Ok(Principal(format!("cert:{}", identity.subject))),
                Some(kind) => identity
                    .alternative_names
                    .iter()
                    .find(|(of, _)| *of == kind)
                    .map(|(_, name)| Principal(format!("cert:{name}")))
                    .ok_or(Unauthenticated::NoAlternativeName),
            };
        }
        let bearer = single(headers, &header::AUTHORIZATION)?;
        let api_key = single(headers, &X_API_KEY)?;
        let principal = match (bearer, api_key) {
            (Some(_), Some(_)) => return Err(Unauthenticated::Ambiguous),
            (None, None) => return Err(Unauthenticated::Missing),
            (None, Some(key)) => self.by_key(key.as_bytes())?,
            (Some(authorization), None) => {
                let token = authorization
                    .to_str()
                    .ok()
                    .and_then(|value| {
                        let (scheme, token) = value.split_once(' ')?;
                        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
                    })
                    .ok_or(Unauthenticated::Missing)?;
                self.by_key(token.as_bytes())
                    .or_else(|unknown| match &self.jwt {
                        // A JWT has three dot-separated parts; an API key is tried first.
                        Some(jwt) if token.split('.').count() == 3 => jwt.verify(token),
                        _ => Err(unknown),
                    })?
            }
        };
        headers.remove(header::AUTHORIZATION);
        headers.remove(X_API_KEY);
        Ok(principal)
    }

    fn by_key(&self, key: &[u8]) -> Result<Principal, Unauthenticated> {
        let digest: [u8; 32] = Sha256::digest(key).into();
        self.keys
            .get(&digest)
            .map(|name| Principal(name.clone()))
            .ok_or(Unauthenticated::UnknownKey)
    }

    /// What the proxy says at start-up of where principals come from.
    pub(super) fn describe(&self) -> String {
        let mut sources = Vec::new();
        if !self.keys.is_empty() {
            sources.push(format!("{} API-key clients", self.keys.len()));
        }
        if let Some(jwt) = &self.jwt {
            sources.push(format!("JWTs of {} for {}", jwt.issuer, jwt.audience));
        }
        if self.certificates.is_some() {
            sources.push("certificates of --client-ca".to_owned());
        }
        sources.join(" and ")
    }
}

impl Jwt {
    fn verify(&self, token: &str) -> Result<Principal, Unauthenticated> {
        let invalid = |why: &str| Unauthenticated::InvalidToken(why.to_owned());
        let header = jsonwebtoken::decode_header(token).map_err(|_| invalid("not a JWT"))?;
        let jwk = match &header.kid {
            Some(kid) => self.keys.find(kid),
            None if self.keys.keys.len() == 1 => self.keys.keys.first(),
            None => None,
        }
        .ok_or_else(|| invalid("no key of the JWKS has its kid"))?;
        let algorithm = key_algorithm(jwk).ok_or_else(|| invalid("the key names no algorithm"))?;
        // The key's algorithm, never the token's word for it.
        if header.alg != algorithm {
            return Err(invalid("its algorithm is not its key's"));
        }
        let key = DecodingKey::from_jwk(jwk).map_err(|_| invalid("the JWKS key is unusable"))?;
        let mut validation = Validation::new(algorithm);
        validation.leeway = LEEWAY.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let data = jsonwebtoken::decode::<Claims>(token, &key, &validation).map_err(|error| {
            use jsonwebtoken::errors::ErrorKind as K;
            invalid(match error.kind() {
                K::ExpiredSignature => "expired",
                K::ImmatureSignature => "not valid yet",
                K::InvalidSignature => "its signature is not its key's",
                K::InvalidAudience => "another audience",
                K::InvalidIssuer => "another issuer",
                K::MissingRequiredClaim(_) => "a required claim is missing",
                _ => "malformed",
            })
        })?;
        let Claims { iss, sub } = data.claims;
        Ok(Principal(format!("{iss}#{sub}")))
    }
}

/// The algorithm a JWK is for: its `alg`, else the one its curve implies.
fn key_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, KeyAlgorithm};
    if let Some(alg) = jwk.common.key_algorithm {
        return match alg {
            KeyAlgorithm::ES256 => Some(Algorithm::ES256),
            KeyAlgorithm::ES384 => Some(Algorithm::ES384),
            KeyAlgorithm::RS256 => Some(Algorithm::RS256),
            KeyAlgorithm::RS384 => Some(Algorithm::RS384),
            KeyAlgorithm::RS512 => Some(Algorithm::RS512),
            KeyAlgorithm::PS256 => Some(Algorithm::PS256),
            KeyAlgorithm::PS384 => Some(Algorithm::PS384),
            KeyAlgorithm::PS512 => Some(Algorithm::PS512),
            KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
            // A shared secret in a key set would let anyone who reads the set sign.
            _ => None,
        };
    }
    match &jwk.algorithm {
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Some(Algorithm::ES256),
            EllipticCurve::P384 => Some(Algorithm::ES384),
            _ => None,
        },
        AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
        _ => None,
    }
}

/// The one value of `name` in `headers`, if any; two are refused.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h HeaderValue>, Unauthenticated> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    match values.next() {
        Some(_) => Err(Unauthenticated::Ambiguous),
        None => Ok(first),
    }
}

fn read_bounded(path: &Path, what: &str) -> anyhow::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot open the {what} {}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read the {what} {}", path.display()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        bail!(
            "the {what} {} is larger than {MAX_FILE_BYTES} bytes",
            path.display()
        );
    }
    Ok(text)
}

fn read_clients(path: &Path) -> anyhow::Result<HashMap<[u8; 32], String>> {
    let text = read_bounded(path, "clients file")?;
    let file: ClientsFile = toml::from_str(&text)
        .with_context(|| format!("the clients file {} is not valid", path.display()))?;
    let mut keys = HashMap::new();
    for (n, entry) in file.client.into_iter().enumerate() {
        let at = || format!("{}: client {}", path.display(), n + 1);
        let principal = entry.principal.trim();
        if principal.is_empty() || principal.len() > 256 || principal.chars().any(char::is_control)
        {
            bail!(
                "{}: the principal is empty, too long, or has control characters",
                at()
            );
        }
        let digest: [u8; 32] = hex::decode(entry.key_sha256.trim())
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .with_context(|| format!("{}: key_sha256 is not 64 hex digits", at()))?;
        if keys.values().any(|known| known == principal) {
            bail!("{}: the principal {principal:?} is named twice", at());
        }
        if keys.insert(digest, principal.to_owned()).is_some() {
            bail!("{}: the same key is given to two principals", at());
        }
    }
    if keys.is_empty() {
        bail!("the clients file {} names no client", path.display());
    }
    Ok(keys)
}

fn read_jwks(path: &Path) -> anyhow::Result<JwkSet> {
    let text = read_bounded(path, "JWKS file")?;
    let keys: JwkSet = serde_json::from_str(&text)
        .with_context(|| format!("the JWKS file {} is not a JWK set", path.display()))?;
    if keys.keys.is_empty() {
        bail!("the JWKS file {} holds no key", path.display());
    }
    for jwk in &keys.keys {
        if key_algorithm(jwk).is_none() {
            bail!(
                "the JWKS file {} holds a key of no usable algorithm (a shared secret, or no \
                 alg): only public keys sign clients' tokens",
                path.display()
            );
        }
        DecodingKey::from_jwk(jwk)
            .with_context(|| format!("the JWKS file {} holds an unusable key", path.display()))?;
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clients(text: &str) -> anyhow::Result<HashMap<[u8; 32], String>> {
        let dir = std::env::temp_dir().join(format!(
            "replay-guard-clients-{}",
            mcp_replay_guard::ExecutionId::new()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("clients.toml");
        std::fs::write(&path, text).unwrap();
        read_clients(&path)
    }

    fn sha(key: &str) -> String {
        hex::encode(Sha256::digest(key.as_bytes()))
    }

    #[test]
    fn a_key_authenticates_its_principal_and_is_removed() {
        let auth = Authentication {
            keys: clients(&format!(
                "[[client]]\nprincipal = \"alice\"\nkey_sha256 = \"{}\"\n",
                sha("k-alice")
            ))
            .unwrap(),
            jwt: None,
            certificates: None,
        };
        for (name, value) in [
            ("authorization", "Bearer k-alice"),
            ("x-api-key", "k-alice"),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(HeaderName::from_static(name), value.parse().unwrap());
            let principal = auth.authenticate(&mut headers, None).unwrap();
            assert_eq!(principal.actor().as_str(), "principal:alice");
            assert!(headers.is_empty(), "{name} was not removed");
        }
        let mut wrong = HeaderMap::new();
        wrong.insert(header::AUTHORIZATION, "Bearer k-mallory".parse().unwrap());
        assert_eq!(
            auth.authenticate(&mut wrong, None),
            Err(Unauthenticated::UnknownKey)
        );
        assert_eq!(
            auth.authenticate(&mut HeaderMap::new(), None),
            Err(Unauthenticated::Missing)
        );
        let mut both = HeaderMap::new();
        both.insert(header::AUTHORIZATION, "Bearer k-alice".parse().unwrap());
        both.insert(X_API_KEY, "k-alice".parse().unwrap());
        assert_eq!(
            auth.authenticate(&mut both, None),
            Err(Unauthenticated::Ambiguous)
        );
    }

    #[test]
    fn a_bad_clients_file_is_refused_with_where() {
        let good = sha("k");
        for (text, says) in [
            ("", "names no client"),
            (
                "[[client]]\nprincipal = \"a\"\nkey_sha256 = \"zz\"\n",
                "client 1: key_sha256",
            ),
            (
                &format!("[[client]]\nprincipal = \" \"\nkey_sha256 = \"{good}\"\n"),
                "principal is empty",
            ),
            (
                &format!(
                    "[[client]]\nprincipal = \"a\"\nkey_sha256 = \"{good}\"\n[[client]]\nprincipal = \"b\"\nkey_sha256 = \"{good}\"\n"
                ),
                "client 2: the same key",
            ),
            (
                &format!("[[client]]\nprincipal = \"a\"\nkey = \"{good}\"\n"),
                "not valid",
            ),
        ] {
            let error = format!("{:#}", clients(text).unwrap_err());
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }
}
