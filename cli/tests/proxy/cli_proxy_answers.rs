//! Honest first answers from the built `replay-guard proxy`: when the upstream exchange of a
//! dispatched `tools/call` fails, the client's same request is answered from the guard's
//! ledger (never a bare 502), and a 502 comes only when nothing was sent, as a JSON-RPC error
//! for the request's id. Every answer is validated against the MCP schema of its era.

use crate::support;

use std::time::Duration;

use http::StatusCode;
use mcp_replay_guard::integrations::server::IdempotencyLayer;
use mcp_replay_guard::{fingerprint::FingerprintKey, ledger::MemoryLedger};
use serde_json::{Value, json};
use support::*;

async fn server(era: Era, options: ServerOptions) -> TestServer {
    let options = match era {
        Era::Sessions => options,
        Era::Stateless => ServerOptions {
            stateless: true,
            ..options
        },
    };
    TestServer::start_with(options).await
}

/// A plain hyper client's `tools/call` through the proxy: (status, content type, message).
async fn through(
    proxy: &str,
    era: Era,
    session: Option<&str>,
    id: i64,
    tool: &str,
    args: Value,
) -> (StatusCode, String, Value) {
    let request = era.tool_call(proxy, session, id, tool, args);
    let response =
        tokio::time::timeout(Duration::from_secs(30), send(&mut hyper_client(), request))
            .await
            .expect("the proxy answers")
            .expect("an HTTP answer");
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, content_type, read_response_to_end(response).await)
}

fn guard_record(message: &Value) -> &Value {
    &message["result"]["structuredContent"]["mcp_replay_guard"]
}

/// The guard's answer for a call whose outcome it does not know: an error result whose text
/// names the execution.
fn assert_an_error_naming_its_execution(answer: &Value) {
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let execution = guard_record(answer)["execution_id"].as_str().unwrap();
    assert!(first_text(answer).unwrap().contains(execution), "{answer}");
}

/// A resume (GET + `Last-Event-ID`) of the session's stream through the proxy, answered 200.
async fn resume(
    proxy: &str,
    session: Option<&str>,
    last_event_id: &str,
) -> http::Response<hyper::body::Incoming> {
    let resume = get_stream(proxy, session, PROTOCOL_VERSION, Some(last_event_id));
    let response = send(&mut hyper_client(), resume).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response
}

#[tokio::test]
async fn a_lost_response_on_an_irreversible_call_is_answered_honestly_on_the_first_attempt() {
    for era in Era::ALL {
        let server = server(era, ServerOptions::default()).await;
        let proxy = start_proxy(&server.url, &[]).await;
        let session = era.open_session(&proxy.url).await;
        server.state.lose_next_response("deploy_release");

        let (status, content_type, answer) = through(
            &proxy.url,
            era,
            session.as_deref(),
            7,
            "deploy_release",
            json!({"service": "catalog", "version": "1"}),
        )
        .await;

        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(content_type, "application/json");
        assert_valid_tool_answer(era, "held for review by the proxy", &answer, &json!(7));
        assert_eq!(answer["result"]["isError"], true, "{answer}");
        let record = guard_record(&answer);
        assert_eq!(record["state"], "needs_review", "{answer}");
        let execution = record["execution_id"].as_str().unwrap();
        assert!(first_text(&answer).unwrap().contains(execution), "{answer}");
        assert_eq!(server.state.side_effects("deploy_release"), 1);
        assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    }
}

#[tokio::test]
async fn a_lost_response_on_an_idempotent_call_is_resent_under_its_key_on_the_same_request() {
    for era in Era::ALL {
        // The server honours the key: the re-send is answered from what it kept.
        let layer = IdempotencyLayer::new(
            MemoryLedger::new(),
            FingerprintKey::from_bytes(&[4; 32]).unwrap(),
        );
        let server = server(
            era,
            ServerOptions {
                idempotency: Some(layer),
                ..ServerOptions::default()
            },
        )
        .await;
        let dir = temp_dir("proxy-answers", "policy");
        let policy = dir.join("policy.toml");
        std::fs::write(&policy, "[tools.create_payment]\nclass = \"idempotent\"\n").unwrap();
        let proxy = start_proxy(&server.url, &["--policy", &policy.to_string_lossy()]).await;
        let session = era.open_session(&proxy.url).await;
        server.state.lose_next_response("create_payment");

        let (status, _, answer) = through(
            &proxy.url,
            era,
            session.as_deref(),
            3,
            "create_payment",
            json!({"amount": 12, "currency": "eur"}),
        )
        .await;

        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["id"], 3);
        assert_ne!(
            answer["result"]["isError"], true,
            "the real result: {answer}"
        );
        let requests = server.state.tool_call_requests("create_payment");
        assert_eq!(requests.len(), 2, "sent, then re-sent by the proxy");
        let keys: Vec<_> = requests.iter().map(|r| r.idempotency_key.clone()).collect();
        assert!(keys[0].is_some() && keys[0] == keys[1], "{keys:?}");
        assert_eq!(server.state.side_effects("create_payment"), 1);
    }
}

#[tokio::test]
async fn an_upstream_that_is_down_is_a_502_jsonrpc_error_with_the_request_id() {
    for era in Era::ALL {
        let server = server(era, ServerOptions::default()).await;
        let url = server.url.clone();
        server.shutdown();
        // Nothing listens there once the accept loop has stopped.
        tokio::time::timeout(Duration::from_secs(10), async {
            while tokio::net::TcpStream::connect(server.addr).await.is_ok() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the upstream goes down");
        // A credential in the upstream URL and one from the client never reach the answer.
        let with_userinfo = url.replace("http://", "http://ops:url-secret-9@");
        let proxy = start_proxy(&with_userinfo, &[]).await;
        let mut request = era.tool_call(
            &proxy.url,
            None,
            11,
            "deploy_release",
            json!({"service": "catalog", "version": "1"}),
        );
        request.headers_mut().insert(
            "authorization",
            http::HeaderValue::from_static("Bearer client-secret-7"),
        );
        let response = send(&mut hyper_client(), request).await.unwrap();
        let status = response.status();
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let answer = read_response_to_end(response).await;
        for secret in ["url-secret-9", "client-secret-7"] {
            assert!(!answer.to_string().contains(secret), "{answer}");
        }

        assert_eq!(status, StatusCode::BAD_GATEWAY, "{answer}");
        assert_eq!(content_type, "application/json");
        assert_valid_message(era, "upstream down", &answer, Some(&json!(11)));
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("nothing was sent"), "{message}");
        assert_eq!(server.state.side_effects("deploy_release"), 0);
    }
}

/// What a client gets through the proxy when the upstream's answer head arrived and its body
/// was then cut with nothing resumable in it: a JSON answer cut mid-body, or an SSE stream
/// with no event id (a server without priming events) cut before the result.
#[tokio::test]
async fn a_response_cut_after_its_head_with_nothing_to_resume_is_answered_honestly_on_the_first_attempt()
 {
    let cases = [
        (
            Era::Stateless,
            ServerOptions {
                json_response: true,
                ..ServerOptions::default()
            },
        ),
        (
            Era::Sessions,
            ServerOptions {
                sse_retry: None,
                ..ServerOptions::default()
            },
        ),
    ];
    for (era, options) in cases {
        let server = server(era, options).await;
        let proxy = start_proxy(&server.url, &[]).await;
        let session = era.open_session(&proxy.url).await;
        server
            .state
            .faults()
            .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);

        let request = era.tool_call(
            &proxy.url,
            session.as_deref(),
            9,
            "deploy_release",
            json!({"service": "catalog", "version": "1"}),
        );
        let response =
            tokio::time::timeout(Duration::from_secs(30), send(&mut hyper_client(), request))
                .await
                .expect("the proxy answers")
                .expect("an HTTP answer");
        let status = response.status();
        let answer = read_jsonrpc_response(response, &json!(9)).await;

        let answer = answer
            .unwrap_or_else(|error| panic!("{}: the first answer is lost: {error}", era.label()));
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_valid_tool_answer(era, "a cut answer held for review", &answer, &json!(9));
        assert_eq!(answer["result"]["isError"], true, "{answer}");
        let record = guard_record(&answer);
        assert!(
            ["unknown", "needs_review"].contains(&record["state"].as_str().unwrap()),
            "{answer}"
        );
        let execution = record["execution_id"].as_str().unwrap();
        assert!(first_text(&answer).unwrap().contains(execution), "{answer}");
        assert_eq!(server.state.side_effects("deploy_release"), 1);
        assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    }
}

/// An upstream that answers a `tools/call` with an event stream that ends cleanly, with no
/// answer and no event id to resume from (a server that finished the stream early): the
/// client gets the guard's uncertain answer on that stream, not an empty one.
#[tokio::test]
async fn an_event_stream_that_ends_without_an_answer_or_an_event_id_ends_with_the_honest_answer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}/mcp", listener.local_addr().unwrap());
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = served.clone();
    let server = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut request = vec![0u8; 65536];
                let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut request).await;
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let empty = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 0\r\n\r\n";
                let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, empty.as_bytes()).await;
            });
        }
    });
    let proxy = start_proxy(&upstream, &[]).await;

    let (status, content_type, answer) = through(
        &proxy.url,
        Era::Stateless,
        None,
        5,
        "deploy_release",
        json!({"service": "catalog", "version": "1"}),
    )
    .await;

    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(content_type, "text/event-stream");
    assert_valid_tool_answer(Era::Stateless, "an empty stream", &answer, &json!(5));
    assert_an_error_naming_its_execution(&answer);
    assert_eq!(
        served.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "sent once"
    );
    server.abort();
}

/// The slow tool's `tools/call` (id `id`, session era) through the proxy at `proxy`, its
/// stream cut after the first event and read to that end. Returns the last event id the client
/// saw, once the tool has made its effect.
async fn cut_call_run_to_its_end(
    server: &TestServer,
    proxy: &str,
    session: Option<&str>,
    id: i64,
) -> String {
    server
        .state
        .faults()
        .schedule("slow_deploy", Fault::CutStreamAfterFirstEvent);
    let call = Era::Sessions.tool_call(
        proxy,
        session,
        id,
        "slow_deploy",
        json!({"service": "catalog"}),
    );
    let response = send(&mut hyper_client(), call).await.unwrap();
    let mut cut = SseReader::new(response.into_body());
    let mut last_event_id = None;
    while let Ok(Some(event)) = cut.next_event().await {
        last_event_id = event.id.or(last_event_id);
    }
    let last_event_id = last_event_id.expect("the priming event has an id");
    assert_eq!(
        server
            .state
            .wait_for_side_effects("slow_deploy", 1, Duration::from_secs(30))
            .await,
        1
    );
    last_event_id
}

/// A cut stream resumed (GET + `Last-Event-ID`) after the server let go of its events (the
/// call finished, and the server keeps no event store): the resume stream ends empty. The
/// client gets the guard's uncertain answer for its call on that stream, instead of an empty
/// stream it would resume again and again, or take for a failure.
#[tokio::test]
async fn a_resume_that_finds_the_answer_gone_ends_with_the_honest_answer() {
    let server = server(Era::Sessions, ServerOptions::default()).await;
    let proxy = start_proxy(&server.url, &[]).await;
    let session = Era::Sessions.open_session(&proxy.url).await;
    // The call runs to its end meanwhile; the server then has nothing to replay.
    let last_event_id = cut_call_run_to_its_end(&server, &proxy.url, session.as_deref(), 4).await;
    // rmcp lets go of a request's stream as soon as its tool returned, which nothing on the
    // wire shows: a moment for that, so that the resume comes after (it is not what is tested).
    tokio::time::sleep(Duration::from_millis(300)).await;

    let response = resume(&proxy.url, session.as_deref(), &last_event_id).await;
    let answer = read_jsonrpc_response(response, &json!(4)).await;

    let answer = answer.unwrap_or_else(|error| panic!("the resume answers nothing: {error}"));
    assert_valid_tool_answer(
        Era::Sessions,
        "a resume with nothing left",
        &answer,
        &json!(4),
    );
    assert_an_error_naming_its_execution(&answer);
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
    assert_eq!(server.state.tool_call_requests("slow_deploy").len(), 1);
}

/// An upstream with an event store, killed after the side effect while the call's stream was
/// cut: the client's resume (GET + `Last-Event-ID`) finds the upstream unreachable, and gets
/// the guard's uncertain answer for its call as an SSE `message` event, which its SDK takes
/// as the call's answer on its first attempt. (Before: a plain-text 502, on which an SDK
/// waits for its own timeout.)
#[tokio::test]
async fn a_resume_with_the_upstream_gone_is_answered_from_the_ledger_as_an_event() {
    let server = server(
        Era::Sessions,
        ServerOptions {
            event_store: true,
            ..ServerOptions::default()
        },
    )
    .await;
    let proxy = start_proxy(&server.url, &[]).await;
    let session = Era::Sessions.open_session(&proxy.url).await;
    let last_event_id = cut_call_run_to_its_end(&server, &proxy.url, session.as_deref(), 7).await;
    // The upstream dies after the effect: its port refuses.
    let address = server.addr;
    server.shutdown();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(address).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server stops listening"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A second resume (the client tries again) is answered the same: the stream stays the
    // execution's.
    for _ in 0..2 {
        let response = resume(&proxy.url, session.as_deref(), &last_event_id).await;
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "{response:?}"
        );
        let answer = read_jsonrpc_response(response, &json!(7))
            .await
            .unwrap_or_else(|error| panic!("the resume answers nothing: {error}"));
        assert_valid_tool_answer(
            Era::Sessions,
            "a resume with the upstream gone",
            &answer,
            &json!(7),
        );
        assert_an_error_naming_its_execution(&answer);
    }
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
    assert_eq!(server.state.tool_call_requests("slow_deploy").len(), 1);
}
