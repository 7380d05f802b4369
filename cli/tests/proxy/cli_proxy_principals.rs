//! Principals behind `replay-guard proxy` (the built binary) and
//! OAuth-protected upstreams, between plain hyper clients and rmcp's own server. Each client is
//! its own connection, held open: an answer it read but did not confirm stays undelivered and
//! kept, so a repeat of the same actor gets the kept result, and another actor's repeat would
//! too if the proxy did not tell them apart.

use crate::support;

use std::{path::Path, time::Duration};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::{Value, json};
use support::*;

const ALICE: &str = "Bearer alice-token-s3cr3t";
const BOB: &str = "Bearer bob-token-s3cr3t";

/// [`deploy_as`], read to the JSON-RPC answer.
async fn deployed_as(url: &str, id: i64, headers: &[(&str, &str)]) -> (HyperClient, Value) {
    let (client, response) = deploy_as(url, id, headers).await;
    assert_eq!(response.status(), StatusCode::OK);
    let message = read_jsonrpc_response(response, &json!(id)).await.unwrap();
    (client, message)
}

fn deployment(message: &Value) -> &Value {
    &message["result"]["structuredContent"]["deployment"]
}

/// Every file the ledger left under `dir` (ledger, key, kept results), as text.
fn ledger_dir_text(dir: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            text.push_str(&ledger_dir_text(&path));
        } else {
            text.push_str(&String::from_utf8_lossy(&std::fs::read(path).unwrap()));
        }
    }
    text
}

fn assert_nowhere(secret: &str, ledger: &str, stderr: &str) {
    let bare = secret.trim_start_matches("Bearer ");
    assert!(!ledger.contains(bare), "{secret:?} is in the ledger");
    assert!(!stderr.contains(bare), "{secret:?} is in the proxy's log");
}

/// Two clients with different tokens send identical irreversible calls: each runs, and each
/// gets its own result; the same token again (on another connection) gets its kept result.
/// Neither token reaches the ledger or the proxy's trace log. (Before, every client was the
/// actor `replay-guard`: the second client was handed the first client's kept result.)
#[tokio::test]
async fn clients_with_different_tokens_never_share_a_kept_result() {
    let server = json_server().await;
    let dir = temp_dir("cli-proxy-principals", "tokens");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy_logged(
        &server.url,
        &["--ledger", &ledger.to_string_lossy()],
        "trace",
    )
    .await;

    let (_alice, first) = deployed_as(&proxy.url, 1, &[("authorization", ALICE)]).await;
    assert_eq!(deployment(&first), 1, "{first}");
    let (_bob, second) = deployed_as(&proxy.url, 2, &[("authorization", BOB)]).await;
    assert_eq!(deployment(&second), 2, "{second}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    // The control: Alice again, while her first answer is kept and undelivered.
    let (_again, repeat) = deployed_as(&proxy.url, 3, &[("authorization", ALICE)]).await;
    assert_eq!(deployment(&repeat), 1, "{repeat}");
    assert_eq!(repeat["id"], 3, "{repeat}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);

    let records = ledger_list(&ledger);
    assert_eq!(records.len(), 2, "{records:#?}");
    let actors: Vec<&str> = records
        .iter()
        .map(|r| r["actor"].as_str().unwrap())
        .collect();
    assert_ne!(actors[0], actors[1]);
    for actor in &actors {
        assert!(actor.starts_with("credentials:hmac-sha256:"), "{actor}");
        assert_eq!(actor.len(), "credentials:hmac-sha256:".len() + 32);
    }
    let stderr = proxy.stop().await;
    assert!(stderr.contains("TRACE"), "the proxy logged at trace level");
    let text = ledger_dir_text(&dir);
    assert_nowhere(ALICE, &text, &stderr);
    assert_nowhere(BOB, &text, &stderr);
    let _ = std::fs::remove_dir_all(dir);
}

/// Alice's response is lost: her repeat is held for review. Bob's identical call runs (two
/// effects) and never shows Alice's execution id; Bob sending Alice's execution id as his own
/// `Idempotency-Key` is refused unsent (a target that honours keys would hand him her result).
#[tokio::test]
async fn a_held_answer_for_one_client_is_never_another_clients() {
    let server = json_server().await;
    let proxy = start_proxy(&server.url, &[]).await;
    server.state.lose_next_response("deploy_release");

    // The proxy answers Alice honestly on her first attempt: held for review.
    let (_alice, held) = deployed_as(&proxy.url, 1, &[("authorization", ALICE)]).await;
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let (_alice, repeat) = deployed_as(&proxy.url, 2, &[("authorization", ALICE)]).await;
    assert_eq!(
        structured(&repeat).unwrap()["mcp_replay_guard"]["execution_id"],
        structured(&held).unwrap()["mcp_replay_guard"]["execution_id"],
        "{repeat}"
    );
    let alices = structured(&held).unwrap()["mcp_replay_guard"].clone();
    assert_eq!(alices["state"], "needs_review", "{held}");
    let alices_execution = alices["execution_id"].as_str().unwrap().to_owned();

    let (_bob, refused) = deploy_as(
        &proxy.url,
        3,
        &[
            ("authorization", BOB),
            ("idempotency-key", &alices_execution),
        ],
    )
    .await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let refusal = read_response_to_end(refused).await;
    assert_eq!(refusal["id"], 3, "{refusal}");
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    assert!(!refusal.to_string().contains("deployed"), "{refusal}");
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);

    let (_bob, bobs) = deployed_as(&proxy.url, 4, &[("authorization", BOB)]).await;
    assert_eq!(deployment(&bobs), 2, "{bobs}");
    assert!(!bobs.to_string().contains(&alices_execution), "{bobs}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);
}

/// Clients that authenticate with an API key header, a cookie, a query token or a header the
/// user names (`--credential-header`) are told apart as `Authorization` clients are: Alice's
/// irreversible call is held after its response was lost; Bob's identical call with his own
/// credential runs (two effects) and never shows Alice's execution id. Neither credential
/// reaches the ledger. (Before, all of them were one actor, `anonymous`: Bob was handed
/// Alice's held answer and his call never ran.)
#[tokio::test]
async fn clients_with_any_credential_are_told_apart() {
    // The case, Alice's and Bob's headers, Alice's and Bob's query strings.
    type Headers = &'static [(&'static str, &'static str)];
    type Case = (&'static str, Headers, Headers, &'static str, &'static str);
    let cases: [Case; 4] = [
        (
            "x-api-key",
            &[("x-api-key", "alice-key-s3cr3t")],
            &[("x-api-key", "bob-key-s3cr3t")],
            "",
            "",
        ),
        (
            "cookie",
            &[("cookie", "theme=dark; session=alice-cookie-s3cr3t")],
            &[("cookie", "theme=dark; session=bob-cookie-s3cr3t")],
            "",
            "",
        ),
        (
            "query",
            &[],
            &[],
            "?access_token=alice-query-s3cr3t",
            "?access_token=bob-query-s3cr3t",
        ),
        (
            "credential-header",
            &[("x-tenant-secret", "alice-tenant-s3cr3t")],
            &[("x-tenant-secret", "bob-tenant-s3cr3t")],
            "",
            "",
        ),
    ];
    for (case, alice, bob, alice_query, bob_query) in cases {
        let server = json_server().await;
        let dir = temp_dir("cli-proxy-principals", &format!("credentials-{case}"));
        let ledger = dir.join("ledger.jsonl");
        let proxy = start_proxy_logged(
            &server.url,
            &[
                "--ledger",
                &ledger.to_string_lossy(),
                "--credential-header",
                "X-Tenant-Secret",
            ],
            "trace",
        )
        .await;
        server.state.lose_next_response("deploy_release");

        let alice_url = format!("{}{alice_query}", proxy.url);
        let (_alice, held) = deployed_as(&alice_url, 1, alice).await;
        let alices = structured(&held).unwrap()["mcp_replay_guard"].clone();
        assert_eq!(alices["state"], "needs_review", "{case}: {held}");
        let alices_execution = alices["execution_id"].as_str().unwrap().to_owned();
        assert_eq!(server.state.side_effects("deploy_release"), 1, "{case}");
        // The control: Alice's repeat is her own held execution, not a second run.
        let (_alice, repeat) = deployed_as(&alice_url, 2, alice).await;
        assert!(
            repeat.to_string().contains(&alices_execution),
            "{case}: {repeat}"
        );
        assert_eq!(server.state.side_effects("deploy_release"), 1, "{case}");

        let bob_url = format!("{}{bob_query}", proxy.url);
        let (_bob, bobs) = deployed_as(&bob_url, 3, bob).await;
        assert_eq!(deployment(&bobs), 2, "{case}: {bobs}");
        assert!(
            !bobs.to_string().contains(&alices_execution),
            "{case}: {bobs}"
        );
        assert_eq!(server.state.side_effects("deploy_release"), 2, "{case}");

        let records = ledger_list(&ledger);
        assert_eq!(records.len(), 2, "{case}: {records:#?}");
        assert_ne!(records[0]["actor"], records[1]["actor"], "{case}");
        let stderr = proxy.stop().await;
        // Said once, at start: what a client without credentials is.
        let said = "a client that sends none acts as `anonymous`";
        assert_eq!(stderr.matches(said).count(), 1, "{case}: {stderr}");
        let text = ledger_dir_text(&dir);
        for secret in [alice, bob]
            .iter()
            .flat_map(|headers| headers.iter().map(|h| h.1))
        {
            let secret = secret.rsplit('=').next().unwrap();
            assert_nowhere(secret, &text, &stderr);
        }
        for query in [alice_query, bob_query]
            .into_iter()
            .filter(|q| !q.is_empty())
        {
            assert_nowhere(query.rsplit('=').next().unwrap(), &text, &stderr);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Alice's stream is cut after its first event; Bob's GET with her session and Last-Event-ID
/// is refused unsent (the upstream would replay her answer to him), also when he sends it to
/// an OAuth metadata path, and Alice's own resume still completes her execution.
#[tokio::test]
async fn another_clients_resume_of_a_cut_stream_is_refused() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..ServerOptions::default()
    })
    .await;
    let dir = temp_dir("cli-proxy-principals", "resume");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;
    let mut client = hyper_client();
    let authorized = |mut request: Request<Full<Bytes>>, token: &str| {
        request
            .headers_mut()
            .insert("authorization", token.parse().unwrap());
        request
    };
    let initialize = post(
        &proxy.url,
        None,
        PROTOCOL_VERSION,
        initialize_body(0, PROTOCOL_VERSION),
    );
    let response = send(&mut client, authorized(initialize, ALICE))
        .await
        .unwrap();
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = read_jsonrpc_response(response, &json!(0)).await.unwrap();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let initialized = post(&proxy.url, Some(&session), PROTOCOL_VERSION, initialized);
    let response = send(&mut client, authorized(initialized, ALICE))
        .await
        .unwrap();
    assert!(response.status().is_success());
    let _ = body_text(response.into_body()).await;

    server
        .state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);
    let call = post(
        &proxy.url,
        Some(&session),
        PROTOCOL_VERSION,
        tool_call_body(1, "deploy_release", deploy_args()),
    );
    let response = send(&mut client, authorized(call, ALICE)).await.unwrap();
    assert!(read_jsonrpc_response(response, &json!(1)).await.is_err());
    let records = wait_until(|| {
        let records = ledger_list(&ledger);
        (records.len() == 1 && records[0]["state"] == "unknown").then_some(records)
    })
    .await;
    let last_event_id = records[0]["correlation"]["last_event_id"]
        .as_str()
        .expect("an event id")
        .to_owned();

    let resume_at = |url: &str, token: &str| {
        let request = get_stream(url, Some(&session), PROTOCOL_VERSION, Some(&last_event_id));
        authorized(request, token)
    };
    // Also at a metadata path, which goes around the guard (the test server, like many,
    // serves MCP on any path): a GET with Last-Event-ID is a resume wherever it is sent.
    let metadata_path = proxy
        .url
        .replace("/mcp", "/.well-known/oauth-protected-resource");
    for url in [proxy.url.as_str(), &metadata_path] {
        let mut bob = hyper_client();
        let response = send(&mut bob, resume_at(url, BOB)).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{url}");
        let refusal = body_text(response.into_body()).await.unwrap();
        assert!(!refusal.contains("deployed"), "{refusal}");
        assert!(server.state.resume_requests().is_empty(), "{url}");
    }

    let response = send(&mut client, resume_at(&proxy.url, ALICE))
        .await
        .unwrap();
    let answer = read_response_to_end(response).await;
    assert_eq!(deployment(&answer), 1, "{answer}");
    assert_eq!(server.state.resume_requests().len(), 1);
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// Polls (every 20 ms, up to 10 s) until `done` gives a value.
async fn wait_until<T>(done: impl Fn() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(value) = done() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the condition never held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `--actor-header`: two gateway identities are two actors (two effects); a request without
/// the header is refused unsent; the header never reaches the upstream, an OAuth metadata
/// request's included.
#[tokio::test]
async fn a_gateway_header_names_the_actor_and_is_required() {
    let server = json_server().await;
    let dir = temp_dir("cli-proxy-principals", "gateway");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(
        &server.url,
        &[
            "--ledger",
            &ledger.to_string_lossy(),
            "--actor-header",
            "X-Gateway-User",
        ],
    )
    .await;
    // The same Authorization for both: only the gateway's header tells them apart.
    let alice = [("x-gateway-user", "user:alice"), ("authorization", ALICE)];
    let bob = [("x-gateway-user", "user:bob"), ("authorization", ALICE)];
    let (_alice, first) = deployed_as(&proxy.url, 1, &alice).await;
    let (_bob, second) = deployed_as(&proxy.url, 2, &bob).await;
    assert_eq!(
        (deployment(&first), deployment(&second)),
        (&json!(1), &json!(2))
    );
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    for request in server.state.tool_call_requests("deploy_release") {
        assert!(
            request.headers.get("x-gateway-user").is_none(),
            "{request:?}"
        );
    }
    let mut actors: Vec<String> = ledger_list(&ledger)
        .iter()
        .map(|r| r["actor"].as_str().unwrap().to_owned())
        .collect();
    actors.sort();
    assert_eq!(actors, ["user:alice", "user:bob"]);

    let (_anyone, refused) = deploy_as(&proxy.url, 3, &[("authorization", ALICE)]).await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let refusal = read_response_to_end(refused).await;
    assert_eq!(refusal["id"], 3, "{refusal}");
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(message.contains("x-gateway-user"), "{message}");
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 2);
    assert_eq!(server.state.side_effects("deploy_release"), 2);

    // Nor on an OAuth metadata request, which goes around the guard.
    let metadata = Request::get(
        proxy
            .url
            .replace("/mcp", "/.well-known/oauth-protected-resource"),
    )
    .header("x-gateway-user", "user:alice")
    .body(Full::default())
    .unwrap();
    let _ = send(&mut hyper_client(), metadata).await.unwrap();
    let requests = server.state.all_requests();
    let fetched = requests
        .last()
        .expect("the metadata request reached the upstream");
    assert_eq!(fetched.method, http::Method::GET);
    assert!(
        fetched.headers.get("x-gateway-user").is_none(),
        "{fetched:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Contradictory ways to name the actor or the scope are a usage error (exit 2).
#[tokio::test]
async fn contradictory_principal_flags_are_refused() {
    for flags in [
        ["--actor", "ops", "--actor-header", "x-user"],
        ["--scope", "run:1", "--scope-header", "x-run"],
    ] {
        let mut args = vec![
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9/mcp",
        ];
        args.extend(flags);
        let run = replay_guard(&args).await;
        assert_eq!(run.code, 2, "{run:#?}");
        assert!(run.stderr.contains("cannot be used with"), "{run:#?}");
    }
}

/// An OAuth-protected upstream: an unauthenticated client gets its 401 with
/// `WWW-Authenticate` and body unchanged (on `initialize` and on `tools/call`, which is recorded
/// as refused, not run), and the metadata documents come from the upstream's own well-known
/// paths. (Before, every path went to the MCP endpoint: the metadata was the endpoint's 401.)
#[tokio::test]
async fn an_oauth_upstreams_challenge_and_metadata_pass_through() {
    let server = json_server_with_bearer(Some("upstream-token")).await;
    let origin = format!("http://{}", server.addr);
    let dir = temp_dir("cli-proxy-principals", "oauth");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;
    let proxy_origin = proxy.url.trim_end_matches("/mcp").to_owned();
    let mut client = hyper_client();

    let initialize = post(
        &proxy.url,
        None,
        STATELESS_PROTOCOL_VERSION,
        initialize_body(0, STATELESS_PROTOCOL_VERSION),
    );
    for request in [initialize, deploy_request(&proxy.url, 1, &[])] {
        let response = send(&mut client, request).await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            response.headers()[http::header::WWW_AUTHENTICATE],
            BearerGate::<()>::challenge(&origin).as_str()
        );
        assert_eq!(
            body_text(response.into_body()).await.unwrap(),
            UNAUTHORIZED_BODY
        );
    }
    assert_eq!(server.state.side_effects("deploy_release"), 0);
    let records = ledger_list(&ledger);
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["state"], "failed", "{records:#?}");
    assert_eq!(records[0]["target_status"], 401, "{records:#?}");

    for (path, field, expected) in [
        (RESOURCE_METADATA_PATH, "resource", server.url.clone()),
        (AUTHORIZATION_SERVER_METADATA_PATH, "issuer", origin.clone()),
    ] {
        let request = Request::get(format!("{proxy_origin}{path}"))
            .body(Full::default())
            .unwrap();
        let response = send(&mut client, request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let document: Value =
            serde_json::from_str(&body_text(response.into_body()).await.unwrap()).unwrap();
        assert_eq!(document[field], expected.as_str(), "{path}: {document}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `--header 'Authorization: Bearer T'`: the proxy holds the upstream's token. A client that
/// sends none works; a client with its own Authorization is still its own actor (the header is
/// replaced upstream, the actor comes from what the client sent). T reaches neither the ledger
/// nor the proxy's trace log.
#[tokio::test]
async fn a_token_the_proxy_holds_reaches_the_upstream_and_nowhere_else() {
    const HELD: &str = "Bearer proxy-held-s3cr3t";
    let server = json_server_with_bearer(Some("proxy-held-s3cr3t")).await;
    let dir = temp_dir("cli-proxy-principals", "held");
    let ledger = dir.join("ledger.jsonl");
    let header = format!("Authorization: {HELD}");
    let proxy = start_proxy_logged(
        &server.url,
        &["--ledger", &ledger.to_string_lossy(), "--header", &header],
        "trace",
    )
    .await;

    let (_nobody, first) = deployed_as(&proxy.url, 1, &[]).await;
    assert_eq!(deployment(&first), 1, "{first}");
    let (_alice, second) = deployed_as(&proxy.url, 2, &[("authorization", ALICE)]).await;
    assert_eq!(deployment(&second), 2, "{second}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    for request in server.state.tool_call_requests("deploy_release") {
        let sent: Vec<_> = request.headers.get_all("authorization").iter().collect();
        assert_eq!(sent, [HELD], "{request:?}");
    }
    let mut actors: Vec<String> = ledger_list(&ledger)
        .iter()
        .map(|r| r["actor"].as_str().unwrap().to_owned())
        .collect();
    actors.sort();
    assert_eq!(actors[0], "anonymous");
    assert!(
        actors[1].starts_with("credentials:hmac-sha256:"),
        "{actors:?}"
    );

    let stderr = proxy.stop().await;
    let text = ledger_dir_text(&dir);
    assert_nowhere(HELD, &text, &stderr);
    assert_nowhere(ALICE, &text, &stderr);
    let _ = std::fs::remove_dir_all(dir);
}

/// The record's correlation carries the session and the client as it named itself: from the
/// session's `initialize` (2025-11-25), or from the request's `_meta` (2026-07-28); `audit
/// show` prints them.
#[tokio::test]
async fn correlation_carries_the_session_and_the_client_in_both_eras() {
    let dir = temp_dir("cli-proxy-principals", "correlation");

    // The session era: the proxy remembers the client of the session's initialize.
    let server = TestServer::start().await;
    let ledger = dir.join("sessions.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;
    let mut client = hyper_client();
    let session = initialize(&mut client, &proxy.url).await.unwrap().unwrap();
    let answer = call_tool(
        &mut client,
        &proxy.url,
        Some(&session),
        1,
        "deploy_release",
        deploy_args(),
    )
    .await
    .unwrap();
    assert_eq!(deployment(&answer), 1, "{answer}");
    let records = ledger_list(&ledger);
    assert_eq!(records.len(), 1, "{records:#?}");
    let correlation = &records[0]["correlation"];
    assert_eq!(correlation["session_id"], session.as_str(), "{correlation}");
    assert_eq!(
        correlation["client_info"],
        json!({"name": "support-client", "version": "0.0.0"}),
        "{correlation}"
    );
    let show = replay_guard_blocking(&["audit", "show", &ledger.to_string_lossy()]);
    assert_eq!(show.code, 0, "{show:?}");
    assert!(
        show.stdout
            .contains(&format!("(session {session}, client support-client 0.0.0)")),
        "{}",
        show.stdout
    );

    // The stateless era: the request names its client in `_meta`.
    let server = json_server().await;
    let ledger = dir.join("stateless.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;
    let (_client, answer) = deployed_as(&proxy.url, 1, &[]).await;
    assert_eq!(deployment(&answer), 1, "{answer}");
    let records = ledger_list(&ledger);
    let correlation = &records[0]["correlation"];
    assert!(correlation.get("session_id").is_none(), "{correlation}");
    assert_eq!(
        correlation["client_info"],
        json!({"name": "support-client", "version": "0.0.0"}),
        "{correlation}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The OAuth metadata paths go around the guard, so only what a metadata request is passes
/// that way: a GET of a path without dot segments. A `tools/call` POSTed to a metadata path
/// (the test server, like many, serves MCP on any path) is guarded like any other, and a path
/// that climbs out of `/.well-known/` (`/../`, or `%2e%2e`, which an upstream may normalise to
/// its MCP endpoint) is refused unsent. (Before, both went to the upstream unguarded, with a
/// token the proxy holds: the call was never recorded, so nothing stopped its repeat.)
#[tokio::test]
async fn only_a_plain_get_of_a_metadata_path_goes_around_the_guard() {
    let server = json_server().await;
    let dir = temp_dir("cli-proxy-principals", "metadata-bypass");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;
    let proxy_origin = proxy.url.trim_end_matches("/mcp").to_owned();
    let mut client = hyper_client();

    let around = format!("{proxy_origin}/.well-known/oauth-protected-resource");
    let (_, message) = deployed_as(&around, 1, &[]).await;
    assert!(message.get("result").is_some(), "{message}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let records = ledger_list(&ledger);
    assert_eq!(records.len(), 1, "the call is guarded: {records:#?}");

    let before = server.state.all_requests().len();
    for climb in [
        "/.well-known/oauth-protected-resource/../../mcp",
        "/.well-known/openid-configuration/%2E%2e/%2e%2E/mcp",
    ] {
        let request = Request::get(format!("{proxy_origin}{climb}"))
            .header("accept", "text/event-stream")
            .body(Full::default())
            .unwrap();
        let response = send(&mut client, request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{climb}");
    }
    assert_eq!(
        server.state.all_requests().len(),
        before,
        "nothing was sent"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A token the proxy holds says nothing about its clients: without `--actor-header` or
/// `--actor`, every client that sends no Authorization is one actor (`anonymous`). The proxy
/// says so when it starts, and not when the flags say who acts.
#[tokio::test]
async fn a_held_token_without_a_way_to_tell_clients_apart_is_warned_about() {
    const WARNING: &str = "anonymous clients share kept results";
    let server = json_server_with_bearer(Some("held")).await;
    let held = ["--header", "Authorization: Bearer held"];
    let proxy = start_proxy_logged(&server.url, &held, "warn").await;
    let stderr = proxy.stop().await;
    assert!(stderr.contains(WARNING), "{stderr}");
    assert!(!stderr.contains("Bearer held"), "{stderr}");

    let told = [&held[..], &["--actor-header", "x-gateway-user"]].concat();
    let proxy = start_proxy_logged(&server.url, &told, "warn").await;
    let stderr = proxy.stop().await;
    assert!(!stderr.contains(WARNING), "{stderr}");
}
