//! Client authentication on `replay-guard proxy` (the built binary), between plain hyper
//! clients and rmcp's own server whose tools count their side effects: API keys (`--clients`)
//! and JWTs (`--jwt-jwks`, `--jwt-issuer`, `--jwt-audience`). A client that does not prove who
//! it is gets 401 and nothing else: no request upstream, no ledger line. The principal it
//! proves is the actor, so a refreshed token is the same actor and its held call stays held.

use crate::support;

use std::{
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::*;

const ALICE_KEY: &str = "k-alice-7d1f0c2a9e";
const BOB_KEY: &str = "k-bob-4be8913f60";
const ISSUER: &str = "https://id.example.test";
const AUDIENCE: &str = "replay-guard-proxy";

fn write_clients(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("clients.toml");
    let sha = |key: &str| hex::encode(Sha256::digest(key.as_bytes()));
    std::fs::write(
        &path,
        format!(
            "[[client]]\nprincipal = \"alice\"\nkey_sha256 = \"{}\"\n\n[[client]]\nprincipal = \"bob\"\nkey_sha256 = \"{}\"\n",
            sha(ALICE_KEY),
            sha(BOB_KEY)
        ),
    )
    .unwrap();
    path
}

fn ledger_lines(ledger: &Path) -> usize {
    std::fs::read_to_string(ledger)
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

/// A 401 that names the scheme, and says why without the credential.
async fn assert_refused(response: Response<hyper::body::Incoming>, secret: &str) {
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let challenge = response.headers()["www-authenticate"].to_str().unwrap();
    assert!(challenge.starts_with("Bearer"), "{challenge}");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("nothing was sent"), "{body}");
    assert!(!body.contains(secret), "{body}");
}

/// Two API-key principals send the same irreversible call: two executions, two effects; each
/// repeats on a new connection and gets its own kept result. A wrong key and no key get 401:
/// no request reaches the upstream, no line reaches the ledger. No key is in the ledger or the
/// proxy's trace log.
#[tokio::test]
async fn api_key_principals_are_actors_and_a_client_without_a_key_gets_401_and_nothing_else() {
    let server = json_server().await;
    let dir = temp_dir("cli-proxy-auth", "keys");
    let ledger = dir.join("ledger.jsonl");
    let clients = write_clients(&dir);
    let proxy = start_proxy_logged(
        &server.url,
        &[
            "--ledger",
            &ledger.to_string_lossy(),
            "--clients",
            &clients.to_string_lossy(),
        ],
        "trace",
    )
    .await;

    let alice = format!("Bearer {ALICE_KEY}");
    let (_a, first) = deploy_as(&proxy.url, 1, &[("authorization", &alice)]).await;
    let first = read_jsonrpc_response(first, &json!(1)).await.unwrap();
    let (_b, second) = deploy_as(&proxy.url, 2, &[("x-api-key", BOB_KEY)]).await;
    let second = read_jsonrpc_response(second, &json!(2)).await.unwrap();
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    let deployment = |m: &Value| m["result"]["structuredContent"]["deployment"].clone();
    assert_ne!(deployment(&first), deployment(&second));
    // The same principal again, as an API key in the other header: its own kept result.
    let (_a2, again) = deploy_as(&proxy.url, 3, &[("x-api-key", ALICE_KEY)]).await;
    let again = read_jsonrpc_response(again, &json!(3)).await.unwrap();
    assert_eq!(deployment(&again), deployment(&first), "{again}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);

    let upstream_before = server.state.all_requests().len();
    let lines_before = ledger_lines(&ledger);
    for (id, headers) in [
        (4, vec![("authorization", "Bearer k-mallory-000")]),
        (5, vec![("x-api-key", "k-mallory-000")]),
        (6, vec![]),
        (
            7,
            vec![("authorization", alice.as_str()), ("x-api-key", BOB_KEY)],
        ),
    ] {
        let (_c, response) = deploy_as(&proxy.url, id, &headers).await;
        assert_refused(response, "k-mallory-000").await;
    }
    assert_eq!(server.state.all_requests().len(), upstream_before);
    assert_eq!(ledger_lines(&ledger), lines_before);

    let log = proxy.stop().await;
    let ledger_text = std::fs::read_to_string(&ledger).unwrap();
    for secret in [ALICE_KEY, BOB_KEY, "k-mallory-000"] {
        assert!(!ledger_text.contains(secret), "{secret} is in the ledger");
        assert!(!log.contains(secret), "{secret} is in the log");
    }
    assert!(ledger_text.contains("principal:alice") && ledger_text.contains("principal:bob"));
    // The upstream never saw a client's key: it is the proxy's credential.
    for request in server.state.all_requests() {
        assert!(
            !request.headers.contains_key("x-api-key")
                && !request.headers.contains_key("authorization"),
            "{:?}",
            request.headers
        );
    }
}

/// An ES256 key of the test's own, as the proxy's JWKS and as the client's signer.
struct Signer {
    der: Vec<u8>,
    jwk: Value,
}

impl Signer {
    fn new(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let point = pair.public_key_raw();
        assert_eq!(point.len(), 65, "an uncompressed P-256 point");
        use base64::Engine as _;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
            "x": b64(&point[1..33]), "y": b64(&point[33..]),
        });
        Self {
            der: pair.serialize_der(),
            jwk,
        }
    }

    fn token(&self, sub: &str, audience: &str, expires_in: i64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let mut header = Header::new(Algorithm::ES256);
        header.kid = self.jwk["kid"].as_str().map(str::to_owned);
        let claims = json!({
            "iss": ISSUER, "sub": sub, "aud": audience,
            "iat": now, "exp": now + expires_in,
            // Two tokens of one principal differ, as a refresh makes them.
            "jti": mcp_replay_guard::ExecutionId::new().to_string(),
        });
        jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ec_der(&self.der)).unwrap()
    }
}

/// A principal whose response was lost refreshes its JWT and repeats: the same actor (its
/// `iss` and `sub`), so the irreversible call stays held: one effect. Tokens that are expired,
/// signed by another key or for another audience get 401, with no request upstream and no
/// ledger line.
#[tokio::test]
async fn a_refreshed_jwt_is_the_same_actor_and_a_bad_one_gets_401_and_nothing_else() {
    let server = json_server().await;
    let dir = temp_dir("cli-proxy-auth", "jwt");
    let ledger = dir.join("ledger.jsonl");
    let signer = Signer::new("k1");
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, json!({"keys": [signer.jwk]}).to_string()).unwrap();
    let proxy = start_proxy_logged(
        &server.url,
        &[
            "--ledger",
            &ledger.to_string_lossy(),
            "--jwt-jwks",
            &jwks.to_string_lossy(),
            "--jwt-issuer",
            ISSUER,
            "--jwt-audience",
            AUDIENCE,
        ],
        "trace",
    )
    .await;

    server
        .state
        .faults()
        .schedule("deploy_release", Fault::DropResponseAfterTool);
    let first = format!("Bearer {}", signer.token("alice", AUDIENCE, 600));
    let (_a, lost) = deploy_as(&proxy.url, 1, &[("authorization", &first)]).await;
    let _ = read_jsonrpc_response(lost, &json!(1)).await;
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let refreshed = format!("Bearer {}", signer.token("alice", AUDIENCE, 900));
    assert_ne!(first, refreshed);
    let (_a2, repeat) = deploy_as(&proxy.url, 2, &[("authorization", &refreshed)]).await;
    let repeat = read_jsonrpc_response(repeat, &json!(2)).await.unwrap();
    assert_eq!(
        server.state.side_effects("deploy_release"),
        1,
        "the refreshed token's repeat ran the call again: {repeat}"
    );
    assert!(
        repeat.to_string().contains("needs_review") || repeat.to_string().contains("unknown"),
        "{repeat}"
    );

    let upstream_before = server.state.all_requests().len();
    let lines_before = ledger_lines(&ledger);
    let stranger = Signer::new("k1");
    let bad = [
        signer.token("alice", AUDIENCE, -3600),
        stranger.token("alice", AUDIENCE, 600),
        signer.token("alice", "another-service", 600),
        "not.a.jwt".to_owned(),
    ];
    for (n, token) in bad.iter().enumerate() {
        let authorization = format!("Bearer {token}");
        let (_c, response) = deploy_as(
            &proxy.url,
            10 + n as i64,
            &[("authorization", &authorization)],
        )
        .await;
        assert_refused(response, token).await;
    }
    assert_eq!(server.state.all_requests().len(), upstream_before);
    assert_eq!(ledger_lines(&ledger), lines_before);
    let log = proxy.stop().await;
    let ledger_text = std::fs::read_to_string(&ledger).unwrap();
    assert!(ledger_text.contains(&format!("principal:{ISSUER}#alice")));
    // Every signed token (the last of `bad` is no token): its signature is nowhere.
    for token in bad[..3].iter().chain([&first, &refreshed]) {
        let signature = token
            .trim_start_matches("Bearer ")
            .rsplit('.')
            .next()
            .unwrap();
        assert!(signature.len() > 40, "{token}");
        assert!(!ledger_text.contains(signature), "a token is in the ledger");
        assert!(!log.contains(signature), "a token is in the log: {token}");
    }
}

/// A clients file or JWKS that cannot authenticate anyone stops the proxy at start-up with the
/// reason; half of the JWT flags is refused by the parser.
#[tokio::test]
async fn a_bad_clients_file_or_jwks_stops_the_proxy_at_start_up() {
    let dir = temp_dir("cli-proxy-auth", "bad-config");
    let clients = dir.join("clients.toml");
    std::fs::write(
        &clients,
        "[[client]]\nprincipal = \"a\"\nkey_sha256 = \"12\"\n",
    )
    .unwrap();
    let hs = dir.join("hs.json");
    std::fs::write(
        &hs,
        json!({"keys": [{"kty": "oct", "alg": "HS256", "k": "c2VjcmV0"}]}).to_string(),
    )
    .unwrap();
    let clients_flag = clients.to_string_lossy().into_owned();
    let hs_flag = hs.to_string_lossy().into_owned();
    for (args, says) in [
        (
            vec!["--clients", clients_flag.as_str()],
            "key_sha256 is not 64 hex digits",
        ),
        (
            vec![
                "--jwt-jwks",
                hs_flag.as_str(),
                "--jwt-issuer",
                ISSUER,
                "--jwt-audience",
                AUDIENCE,
            ],
            "only public keys",
        ),
        (vec!["--jwt-jwks", hs_flag.as_str()], "--jwt-issuer"),
    ] {
        let mut argv = vec![
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9/mcp",
        ];
        argv.extend(args);
        let run = replay_guard(&argv).await;
        assert_eq!(run.code, 2, "{argv:?}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{argv:?}: {}", run.stderr);
    }
}

/// The proxy's arguments for TLS with client certificates the test CA signs, plus `extra`.
fn mtls_args(certs: &TestCerts, ledger: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--ledger".into(),
        ledger.to_string_lossy().into_owned(),
        "--tls-cert".into(),
        certs.cert_pem.to_string_lossy().into_owned(),
        "--tls-key".into(),
        certs.key_pem.to_string_lossy().into_owned(),
        "--client-ca".into(),
        certs.ca_pem.to_string_lossy().into_owned(),
    ];
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    args
}

/// Over the proxy's TLS listener with `--client-ca`: a client certificate the CA signed is the
/// principal its subject names (two subjects, two executions; the same subject again, its kept
/// result); a client without a certificate gets 401, and nothing reaches the upstream or the
/// ledger.
#[tokio::test]
async fn a_client_certificate_is_the_principal_and_a_client_without_one_gets_401() {
    let server = json_server().await;
    let certs = TestCerts::generate("proxy-client-ca");
    let dir = temp_dir("cli-proxy-auth", "mtls");
    let ledger = dir.join("ledger.jsonl");
    let args = mtls_args(&certs, &ledger, &[]);
    let proxy = start_proxy(
        &server.url,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    assert!(proxy.url.starts_with("https://"), "{}", proxy.url);
    let url = proxy.url.replace("https://127.0.0.1", "https://localhost");
    let deployment = |m: &Value| m["result"]["structuredContent"]["deployment"].clone();
    let (mut answers, mut open) = (Vec::new(), Vec::new());
    for (id, name) in [(1, "alice"), (2, "bob"), (3, "alice")] {
        let client = certs.https_client_as(name);
        let response = client
            .request(deploy_request(&url, id, &[]))
            .await
            .expect("the proxy answers over TLS");
        assert_eq!(response.status(), StatusCode::OK);
        answers.push(read_jsonrpc_response(response, &json!(id)).await.unwrap());
        // Held open: the answer stays undelivered, so a repeat gets the kept result.
        open.push(client);
    }
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    assert_ne!(deployment(&answers[0]), deployment(&answers[1]));
    assert_eq!(deployment(&answers[2]), deployment(&answers[0]));

    let upstream_before = server.state.all_requests().len();
    let lines_before = ledger_lines(&ledger);
    let response = certs
        .https_client()
        .request(deploy_request(&url, 4, &[]))
        .await
        .expect("a client without a certificate still connects");
    assert_refused(response, "no-secret-here").await;
    assert_eq!(server.state.all_requests().len(), upstream_before);
    assert_eq!(ledger_lines(&ledger), lines_before);
    let ledger_text = std::fs::read_to_string(&ledger).unwrap();
    assert!(
        ledger_text.contains("principal:cert:CN=alice"),
        "{ledger_text}"
    );
    assert!(ledger_text.contains("principal:cert:CN=bob"));
    drop(open);
    proxy.stop().await;
}

/// `--client-principal-san uri`: the principal is the certificate's URI name (a SPIFFE ID), not
/// its subject; a certificate without one gets 401.
#[tokio::test]
async fn a_client_certificate_can_name_its_principal_by_a_uri() {
    let server = json_server().await;
    let certs = TestCerts::generate("proxy-client-san");
    let dir = temp_dir("cli-proxy-auth", "mtls-san");
    let ledger = dir.join("ledger.jsonl");
    let args = mtls_args(&certs, &ledger, &["--client-principal-san", "uri"]);
    let proxy = start_proxy(
        &server.url,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    let spiffe = "spiffe://example.test/agent/alice";
    let client = certs.https_client_with("shared-cn", Some(spiffe));
    let response = client
        .request(deploy_request(&proxy.url, 1, &[]))
        .await
        .expect("the proxy answers over TLS");
    assert_eq!(response.status(), StatusCode::OK);
    read_jsonrpc_response(response, &json!(1)).await.unwrap();
    let response = certs
        .https_client_as("shared-cn")
        .request(deploy_request(&proxy.url, 2, &[]))
        .await
        .expect("a certificate without the name still connects");
    assert_refused(response, "no-secret-here").await;
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let ledger_text = std::fs::read_to_string(&ledger).unwrap();
    assert!(
        ledger_text.contains(&format!("principal:cert:{spiffe}")),
        "{ledger_text}"
    );
    drop(client);
    proxy.stop().await;
}
