//! HTTPS for `replay-guard call` and `replay-guard proxy`, run as the built binary against
//! rmcp's own server behind rustls on 127.0.0.1, with certificates made in the test
//! (tests/support/tls.rs). The server's side-effect counters are the ground truth.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

fn deploy_args() -> Value {
    json!({"service": "catalog", "version": "2026.07.22"})
}

fn path(path: &std::path::Path) -> String {
    path.to_string_lossy().into_owned()
}

/// `replay-guard --json call --url URL --tool deploy_release --args … EXTRA…`, with `env`.
async fn call(url: &str, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let args = deploy_args().to_string();
    let mut command = replay_guard_command(call_argv(url, "deploy_release", &args, extra));
    command.envs(env.iter().copied());
    Run::from_output(&command.output().await.expect("the binary runs"))
}

/// A stateless `deploy_release` call through the proxy at `proxy`, answered 502: its text.
async fn bad_gateway_text(proxy: &str) -> String {
    let mut client = hyper_client();
    let request = post(
        proxy,
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(1, "deploy_release", deploy_args()),
    );
    let response = send(&mut client, request).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::BAD_GATEWAY);
    body_text(response.into_body()).await.unwrap()
}

#[tokio::test]
async fn call_over_https_with_a_private_ca_runs_a_lost_call_once_and_exits_3_twice() {
    let certs = TestCerts::generate("call-lost");
    let server = TestServer::start_tls(ServerOptions::default(), &certs).await;
    let ledger = path(&certs.dir.join("ledger.jsonl"));
    let ca = path(&certs.ca_pem);
    server.state.lose_next_response("deploy_release");

    let extra = ["--ca-cert", ca.as_str(), "--ledger", ledger.as_str()];
    let first = call(&server.url, &extra, &[]).await;
    assert_eq!(first.code, 3, "{first:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let second = call(&server.url, &extra, &[]).await;
    assert_eq!(second.code, 3, "{second:#?}");
    assert_eq!(second.execution_id(), first.execution_id());
    assert_eq!(
        second.json()["result"]["structuredContent"]["mcp_replay_guard"]["state"],
        "needs_review"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
}

/// A self-signed certificate marked CA, presented as the server's own and passed with
/// `--ca-cert`: TLS refuses it (`CaUsedAsEndEntity`), and the error says what is wrong with the
/// certificate and how to make a proper one, not to pass the `--ca-cert` that was passed.
/// Nothing is sent, from `call` or through the proxy.
#[tokio::test]
async fn a_ca_certificate_used_as_the_servers_own_is_explained() {
    let certs = TestCerts::ca_as_server("ca-as-server");
    let ca = path(&certs.ca_pem);
    let server = TestServer::start_tls(ServerOptions::stateless(), &certs).await;
    let run = call(
        &server.url,
        &["--protocol", "2026-07-28", "--ca-cert", &ca],
        &[],
    )
    .await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("Nothing was sent"), "{run:#?}");
    for says in ["is a CA certificate", "CA:FALSE", "subjectAltName"] {
        assert!(run.stderr.contains(says), "{says}: {run:#?}");
    }
    assert!(!run.stderr.contains(CA_CERT_HINT_START), "{run:#?}");

    let proxy = start_proxy(&server.url, &["--ca-cert", &ca]).await;
    let text = bad_gateway_text(&proxy.url).await;
    assert!(text.contains("is a CA certificate"), "{text}");
    assert!(!text.contains(CA_CERT_HINT_START), "{text}");
    assert_eq!(server.state.all_requests().len(), 0);
}

/// The start of the advice for a certificate signed by a CA the client does not trust.
const CA_CERT_HINT_START: &str = "if the server's certificate is signed by a private CA";

/// Without `--ca-cert` the platform's roots are trusted (`SSL_CERT_FILE` names them here),
/// and a system without any root says to pass `--ca-cert`.
#[tokio::test]
async fn call_trusts_the_platform_roots_without_ca_cert() {
    let certs = TestCerts::generate("call-platform");
    let server = TestServer::start_tls(ServerOptions::stateless(), &certs).await;
    let ca = path(&certs.ca_pem);
    let run = call(&server.url, &[], &[("SSL_CERT_FILE", &ca)]).await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(run.json()["outcome"], "completed");
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    let empty = certs.dir.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let empty = path(&empty);
    let run = call(
        &server.url,
        &[],
        &[("SSL_CERT_FILE", &empty), ("SSL_CERT_DIR", &empty)],
    )
    .await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        run.stderr.contains("no trusted root certificates") && run.stderr.contains("--ca-cert"),
        "{run:#?}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
}

/// A server certificate `call` does not trust (another CA, none of the platform's roots, an
/// expired certificate, another name): exit 2, nothing sent, `--ca-cert` suggested; in the
/// stateless era, where the `tools/call` is the first request, the ledger records it `not_sent`.
#[tokio::test]
async fn call_to_a_server_it_does_not_trust_exits_2_and_records_not_sent() {
    let trusted = TestCerts::generate("call-trusted");
    let trusted_ca = path(&trusted.ca_pem);
    let other = TestCerts::generate("call-other");
    let expired = TestCerts::expired("call-expired");
    let misnamed = TestCerts::for_names("call-misnamed", &["example.invalid"]);
    let no_env: Vec<(&str, &str)> = Vec::new();
    let platform_roots = vec![("SSL_CERT_FILE", trusted_ca.as_str())];
    let cases = [
        (
            "another CA",
            &other,
            trusted.ca_cert_arg().to_vec(),
            &no_env,
        ),
        (
            "not among the platform's roots",
            &other,
            vec![],
            &platform_roots,
        ),
        ("expired", &expired, expired.ca_cert_arg().to_vec(), &no_env),
        (
            "another name",
            &misnamed,
            misnamed.ca_cert_arg().to_vec(),
            &no_env,
        ),
    ];
    for (case, certs, tls_args, env) in cases {
        let server = TestServer::start_tls(ServerOptions::stateless(), certs).await;
        let ledger = temp_dir("cli-tls", "untrusted").join("ledger.jsonl");
        let ledger = path(&ledger);
        let mut extra: Vec<&str> = vec!["--protocol", "2026-07-28", "--ledger", &ledger];
        extra.extend(tls_args.iter().map(String::as_str));
        let run = call(&server.url, &extra, env).await;
        assert_eq!(run.code, 2, "{case}: {run:#?}");
        assert!(run.stderr.contains("Nothing was sent"), "{case}: {run:#?}");
        assert!(run.stderr.contains("--ca-cert"), "{case}: {run:#?}");
        assert!(run.stderr.contains("certificate"), "{case}: {run:#?}");
        let records = ledger_records(&ledger).await;
        assert_eq!(records.len(), 1, "{case}: {records:#?}");
        assert_eq!(records[0]["state"], "not_sent", "{case}: {records:#?}");
        assert_eq!(server.state.all_requests().len(), 0, "{case}");
        assert_eq!(server.state.side_effects("deploy_release"), 0, "{case}");
    }

    // In the session era the handshake of `initialize` fails first: nothing recorded, same advice.
    let server = TestServer::start_tls(ServerOptions::default(), &other).await;
    let run = call(&server.url, &["--ca-cert", &trusted_ca], &[]).await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        run.stderr.contains("Nothing was sent") && run.stderr.contains("--ca-cert"),
        "{run:#?}"
    );
    assert_eq!(server.state.all_requests().len(), 0);
}

#[tokio::test]
async fn the_proxy_over_an_https_upstream_runs_a_lost_call_once() {
    let certs = TestCerts::generate("proxy-upstream");
    let server = TestServer::start_tls(ServerOptions::stateless(), &certs).await;
    let ledger = path(&certs.dir.join("ledger.jsonl"));
    let ca = path(&certs.ca_pem);
    let proxy = start_proxy(&server.url, &["--ca-cert", &ca, "--ledger", &ledger]).await;
    assert!(proxy.url.starts_with("http://"), "{}", proxy.url);
    server.state.lose_next_response("deploy_release");

    let mut client = hyper_client();
    // The answer was lost: the proxy says so on this same request.
    let first = call_tool_stateless(&mut client, &proxy.url, 1, "deploy_release", deploy_args())
        .await
        .expect("the guard answers the first attempt honestly");
    assert_eq!(first["result"]["isError"], true, "{first}");
    assert_eq!(
        first["result"]["structuredContent"]["mcp_replay_guard"]["state"], "needs_review",
        "{first}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    let second = call_tool_stateless(&mut client, &proxy.url, 2, "deploy_release", deploy_args())
        .await
        .expect("the guard answers");
    assert_eq!(
        second["result"]["structuredContent"]["mcp_replay_guard"]["state"], "needs_review",
        "{second}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
}

/// An upstream certificate the proxy does not trust: a 502 that suggests `--ca-cert`, and
/// the execution is `not_sent` (so the client's repeat is sent, once the proxy trusts it).
#[tokio::test]
async fn an_upstream_the_proxy_does_not_trust_is_a_502_and_not_sent() {
    let certs = TestCerts::generate("proxy-untrusted");
    let other = TestCerts::generate("proxy-other");
    let server = TestServer::start_tls(ServerOptions::stateless(), &certs).await;
    let ledger = path(&certs.dir.join("ledger.jsonl"));
    let other_ca = path(&other.ca_pem);
    let proxy = start_proxy(&server.url, &["--ca-cert", &other_ca, "--ledger", &ledger]).await;

    let text = bad_gateway_text(&proxy.url).await;
    assert!(text.contains("--ca-cert"), "{text}");
    let records = ledger_records(&ledger).await;
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["state"], "not_sent", "{records:#?}");
    assert_eq!(server.state.all_requests().len(), 0);
    assert_eq!(server.state.side_effects("deploy_release"), 0);
}

/// An upstream that accepts the connection and never answers the ClientHello: the proxy's
/// connect gives up after its handshake bound (10 s) with a 502, and nothing was sent.
#[tokio::test]
async fn a_stalled_upstream_handshake_is_a_502_and_not_sent() {
    let certs = TestCerts::generate("proxy-stalled");
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("https://{}/mcp", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            held.push(stream);
        }
    });
    let ledger = path(&certs.dir.join("ledger.jsonl"));
    let ca = path(&certs.ca_pem);
    let proxy = start_proxy(&upstream, &["--ca-cert", &ca, "--ledger", &ledger]).await;

    let request = post(
        &proxy.url,
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(1, "deploy_release", deploy_args()),
    );
    let response =
        tokio::time::timeout(Duration::from_secs(60), send(&mut hyper_client(), request))
            .await
            .expect("the proxy's connect is bounded")
            .unwrap();
    assert_eq!(response.status(), http::StatusCode::BAD_GATEWAY);
    let text = body_text(response.into_body()).await.unwrap();
    assert!(text.contains("did not finish within"), "{text}");
    let records = ledger_records(&ledger).await;
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["state"], "not_sent", "{records:#?}");
    held.abort();
}

/// The proxy's own listener over TLS: an HTTPS client that trusts the test CA gets its
/// answers, delivered as over HTTP (its next request on the connection confirms the last);
/// a client that connects and never sends its ClientHello blocks nobody.
#[tokio::test]
async fn the_proxy_serves_https_and_a_stalled_handshake_blocks_no_one() {
    let certs = TestCerts::generate("proxy-listener");
    let server = TestServer::start_with(ServerOptions {
        json_response: true,
        ..ServerOptions::stateless()
    })
    .await;
    let ledger = path(&certs.dir.join("ledger.jsonl"));
    let (cert, key) = (path(&certs.cert_pem), path(&certs.key_pem));
    let proxy = start_proxy(
        &server.url,
        &["--tls-cert", &cert, "--tls-key", &key, "--ledger", &ledger],
    )
    .await;
    assert!(proxy.url.starts_with("https://127.0.0.1:"), "{}", proxy.url);
    let authority = proxy
        .url
        .trim_start_matches("https://")
        .trim_end_matches("/mcp")
        .to_owned();

    // Connected, and silent: the handshake waits on this connection's own task.
    let mut silent = tokio::net::TcpStream::connect(&authority).await.unwrap();

    let mut client = certs.https_client();
    for id in [1, 2] {
        let answer = tokio::time::timeout(
            Duration::from_secs(20),
            call_tool_stateless(&mut client, &proxy.url, id, "deploy_release", deploy_args()),
        )
        .await
        .expect("a stalled handshake does not hold the proxy")
        .expect("an answer over HTTPS");
        assert_eq!(
            answer["result"]["structuredContent"]["deployment"],
            json!(id),
            "{answer}"
        );
    }
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    // ... answered while the silent connection still waits for its handshake: had it held the
    // accept loop, the others would have waited for its timeout, which closes it.
    let mut byte = [0u8; 1];
    assert_eq!(
        silent.try_read(&mut byte).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "the silent connection is still open, unanswered"
    );
    // ... and the proxy gives up on it at its handshake bound: it closes the connection.
    let closed = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::io::AsyncReadExt::read(&mut silent, &mut byte),
    )
    .await
    .expect("the proxy closes a connection that never sends its ClientHello");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    // The second request on the TLS connection showed the first answer was read.
    let records = ledger_records(&ledger).await;
    assert_eq!(records.len(), 2, "{records:#?}");
    let delivered = records.iter().filter(|r| r["state"] == "delivered").count();
    assert_eq!(delivered, 1, "{records:#?}");

    // Plain HTTP to the HTTPS listener is no request at all.
    let plain = post(
        &proxy.url.replace("https://", "http://"),
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(3, "deploy_release", deploy_args()),
    );
    assert!(send(&mut hyper_client(), plain).await.is_err());
    assert_eq!(server.state.side_effects("deploy_release"), 2);
}

/// `replay-guard proxy --listen 127.0.0.1:0 --upstream UPSTREAM ARGS…`, expected to refuse to
/// start.
async fn proxy_refusal(upstream: &str, args: &[&str]) -> Run {
    let mut argv = vec!["proxy", "--listen", "127.0.0.1:0", "--upstream", upstream];
    argv.extend_from_slice(args);
    let (run, _) = replay_guard_within(&argv, Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("the proxy with {args:?} should exit, not serve"));
    run
}

#[tokio::test]
async fn bad_tls_files_and_flags_exit_2_with_a_clear_message() {
    let certs = TestCerts::generate("bad-files");
    let other = TestCerts::generate("bad-files-other");
    let (cert, key) = (path(&certs.cert_pem), path(&certs.key_pem));
    let other_key = path(&other.key_pem);
    let missing = path(&certs.dir.join("missing.pem"));
    let garbage = certs.dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let garbage = path(&garbage);
    // A key file cut short: its content must never be shown.
    let cut_key = certs.dir.join("cut.key");
    std::fs::write(
        &cut_key,
        "-----BEGIN PRIVATE KEY-----\nS3CR3TKEYMATERIALS3CR3T\n",
    )
    .unwrap();
    let cut_key = path(&cut_key);

    let refusals: [(&[&str], &[&str]); 7] = [
        (&["--tls-cert", &cert], &["--tls-key"]),
        (&["--tls-key", &key], &["--tls-cert"]),
        (
            &["--tls-cert", &missing, "--tls-key", &key],
            &["--tls-cert", "missing.pem", "cannot read"],
        ),
        (
            &["--tls-cert", &garbage, "--tls-key", &key],
            &["--tls-cert", "garbage.pem", "no certificate"],
        ),
        (
            &["--tls-cert", &cert, "--tls-key", &garbage],
            &["--tls-key", "garbage.pem", "no private key"],
        ),
        (
            &["--tls-cert", &cert, "--tls-key", &cut_key],
            &["--tls-key", "cut.key"],
        ),
        (
            &["--tls-cert", &cert, "--tls-key", &other_key],
            &["--tls-cert", "--tls-key", "private key it was issued for"],
        ),
    ];
    for (args, says) in refusals {
        let run = proxy_refusal("http://127.0.0.1:9/mcp", args).await;
        assert_eq!(run.code, 2, "{args:?}: {run:#?}");
        for words in says {
            assert!(
                run.stderr.contains(words),
                "{args:?} should say {words:?}: {run:#?}"
            );
        }
        assert!(!run.stderr.contains("S3CR3T"), "{run:#?}");
        assert!(run.stdout.is_empty(), "{args:?}: never listened: {run:#?}");
    }

    let url = "https://127.0.0.1:9/mcp";
    for (ca, says) in [
        (&missing, "cannot read"),
        (&garbage, "no certificate"),
        (&key, "no certificate"),
    ] {
        let run = call(url, &["--ca-cert", ca], &[]).await;
        assert_eq!(run.code, 2, "{run:#?}");
        assert!(
            run.stderr.contains("--ca-cert") && run.stderr.contains(says),
            "{ca}: {run:#?}"
        );
    }
    let run = call("ftp://127.0.0.1:9/mcp", &[], &[]).await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("https://"), "{run:#?}");
    let run = proxy_refusal("ftp://127.0.0.1:9/mcp", &[]).await;
    assert_eq!(run.code, 2, "{run:#?}");
}
