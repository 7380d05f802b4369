//! Self-test of the shared end-to-end support in `tests/support/`: the rmcp
//! test server, its side-effect counters and the fault injection, exercised
//! through a bare hyper client (no guard).

use mcp_replay_guard_test_support as support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const WAIT: Duration = Duration::from_secs(5);

fn deploy_args() -> Value {
    json!({"service": "api", "version": "1.2.3"})
}

/// The hyper error in `error`'s source chain, if any.
fn hyper_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a hyper::Error> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            return Some(h);
        }
        current = e.source();
    }
    None
}

async fn post_tool(
    client: &mut hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        http_body_util::Full<bytes::Bytes>,
    >,
    server: &TestServer,
    session: Option<&str>,
    id: i64,
    tool: &str,
    args: Value,
) -> http::Response<hyper::body::Incoming> {
    let request = post(
        &server.url,
        session,
        PROTOCOL_VERSION,
        tool_call_body(id, tool, args),
    );
    send(client, request).await.expect("response head")
}

#[tokio::test]
async fn every_tool_runs_once_and_records_idempotency_keys() {
    let server = TestServer::start().await;
    let state = &server.state;
    let url = &server.url;
    let mut client = hyper_client();

    let session = initialize(&mut client, url).await.expect("initialize");
    let s = session.as_deref();
    assert!(s.is_some(), "session-era server issues Mcp-Session-Id");
    assert_eq!(state.session_ids(), vec![session.clone().unwrap()]);

    let r = call_tool(
        &mut client,
        url,
        s,
        1,
        "deploy_release",
        json!({"service": "api", "version": "1.2.3", "region": "eu-west-1"}),
    )
    .await
    .unwrap();
    assert_eq!(first_text(&r), Some("deployed api 1.2.3"));
    assert_eq!(structured(&r), Some(&json!({"deployment": 1})));

    // create_payment: twice with the same key (the server does not dedupe),
    // once without a key.
    for (id, expected) in [(2, "payment 1"), (3, "payment 2")] {
        let request = with_idempotency_key(
            post(
                url,
                s,
                PROTOCOL_VERSION,
                tool_call_body(
                    id,
                    "create_payment",
                    json!({"amount": 100, "currency": "EUR"}),
                ),
            ),
            "key-1",
        );
        let response = send(&mut client, request).await.unwrap();
        let r = read_jsonrpc_response(response, &json!(id)).await.unwrap();
        assert_eq!(first_text(&r), Some(expected));
    }
    let r = call_tool(
        &mut client,
        url,
        s,
        4,
        "create_payment",
        json!({"amount": 5, "currency": "USD"}),
    )
    .await
    .unwrap();
    assert_eq!(first_text(&r), Some("payment 3"));
    assert_eq!(
        state.idempotency_keys("create_payment"),
        vec![Some("key-1".to_owned()), Some("key-1".to_owned()), None]
    );

    // rotate_credential + the read-only status probe.
    let r = call_tool(
        &mut client,
        url,
        s,
        5,
        "credential_status",
        json!({"name": "db"}),
    )
    .await
    .unwrap();
    assert_eq!(
        structured(&r),
        Some(&json!({"rotated": false, "rotations": 0}))
    );
    let r = call_tool(
        &mut client,
        url,
        s,
        6,
        "rotate_credential",
        json!({"name": "db"}),
    )
    .await
    .unwrap();
    assert_eq!(r.pointer("/result/isError"), Some(&json!(false)));
    let r = call_tool(
        &mut client,
        url,
        s,
        7,
        "credential_status",
        json!({"name": "db"}),
    )
    .await
    .unwrap();
    assert_eq!(
        structured(&r),
        Some(&json!({"rotated": true, "rotations": 1}))
    );
    assert_eq!(state.rotations("db"), 1);

    let r = call_tool(&mut client, url, s, 8, "list_branches", json!({}))
        .await
        .unwrap();
    assert_eq!(
        structured(&r),
        Some(&json!({"branches": ["main", "release"]}))
    );

    let r = call_tool(
        &mut client,
        url,
        s,
        9,
        "slow_deploy",
        json!({"service": "api"}),
    )
    .await
    .unwrap();
    assert_eq!(first_text(&r), Some("slow deployed api"));

    assert_eq!(state.side_effects("deploy_release"), 1);
    assert_eq!(state.side_effects("create_payment"), 3);
    assert_eq!(state.side_effects("rotate_credential"), 1);
    assert_eq!(state.side_effects("credential_status"), 2);
    assert_eq!(state.side_effects("list_branches"), 1);
    assert_eq!(state.side_effects("slow_deploy"), 1);
    assert_eq!(state.started("slow_deploy"), 1);
    assert_eq!(state.total_side_effects(), 9);
    for tool in TOOL_NAMES {
        assert!(state.side_effects(tool) >= 1, "{tool} ran");
    }

    // Runs know their session; the request log saw every exchange in order.
    let runs = state.tool_runs("deploy_release");
    assert_eq!(runs[0].session_id, session);
    assert_eq!(runs[0].arguments["region"], json!("eu-west-1"));
    let requests = state.requests();
    assert_eq!(requests[0].jsonrpc_method.as_deref(), Some("initialize"));
    assert_eq!(requests[0].session_id, None);
    assert_eq!(
        requests[1].jsonrpc_method.as_deref(),
        Some("notifications/initialized")
    );
    let payments = state.tool_call_requests("create_payment");
    assert_eq!(payments.len(), 3);
    assert_eq!(payments[0].idempotency_key.as_deref(), Some("key-1"));
    assert_eq!(payments[0].jsonrpc_id, Some(json!(2)));
    assert_eq!(payments[2].idempotency_key, None);
    assert!(payments.iter().all(|r| r.session_id == session
        && r.method == http::Method::POST
        && r.protocol_version.as_deref() == Some(PROTOCOL_VERSION)
        && r.fault.is_none()));
    assert_eq!(requests.len(), 2 + 9);
    assert_eq!(state.all_requests(), requests);
}

#[tokio::test]
async fn helpers_work_through_a_tower_stack() {
    let server = TestServer::start().await;
    let mut stack = tower::ServiceBuilder::new()
        .timeout(Duration::from_secs(5))
        .service(hyper_client());
    let session = initialize(&mut stack, &server.url).await.unwrap();
    let r = call_tool(
        &mut stack,
        &server.url,
        session.as_deref(),
        1,
        "list_branches",
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(r["id"], json!(1));
    assert_eq!(server.state.side_effects("list_branches"), 1);
}

#[tokio::test]
async fn drop_response_after_tool_loses_the_response_but_the_tool_ran() {
    let server = TestServer::start().await;
    let state = &server.state;
    let mut client = hyper_client();
    let session = initialize(&mut client, &server.url).await.unwrap();

    state
        .faults()
        .schedule("deploy_release", Fault::DropResponseAfterTool);
    assert_eq!(state.faults().pending_for("deploy_release"), 1);

    let error = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "deploy_release",
        deploy_args(),
    )
    .await
    .expect_err("no response may arrive");
    let hyper_error = hyper_error(&*error).unwrap_or_else(|| panic!("{}", error_chain(&*error)));
    assert!(
        hyper_error.is_incomplete_message(),
        "expected 'connection closed before message completed', got {}",
        error_chain(&*error)
    );
    assert!(is_lost_exchange(&*error));

    // Ground truth: the tool ran exactly once, before the response was lost.
    assert_eq!(state.side_effects("deploy_release"), 1);
    assert!(state.faults().is_empty());
    assert_eq!(
        state.faults().fired(),
        vec![FiredFault {
            target: "deploy_release".to_owned(),
            fault: Fault::DropResponseAfterTool
        }]
    );
    let logged = state.tool_call_requests("deploy_release");
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0].fault, Some(Fault::DropResponseAfterTool));

    // The fault was consumed: the next call is answered.
    let r = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        3,
        "deploy_release",
        deploy_args(),
    )
    .await
    .unwrap();
    assert_eq!(structured(&r), Some(&json!({"deployment": 2})));
}

#[tokio::test]
async fn cut_stream_after_first_event_delivers_priming_then_fails() {
    let server = TestServer::start().await;
    let state = &server.state;
    let mut client = hyper_client();
    let session = initialize(&mut client, &server.url).await.unwrap();

    state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);
    let response = post_tool(
        &mut client,
        &server,
        session.as_deref(),
        2,
        "deploy_release",
        deploy_args(),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()[http::header::CONTENT_TYPE],
        "text/event-stream"
    );
    let (events, error) = SseReader::new(response.into_body()).read_all().await;
    assert_eq!(events.len(), 1, "only the priming event: {events:?}");
    let priming = &events[0];
    assert!(priming.id.is_some(), "priming event carries an id");
    assert_eq!(priming.retry, Some(3000));
    assert!(!priming.is_jsonrpc_response());
    let error = error.expect("the body must fail after the first event");
    assert!(is_lost_exchange(&*error), "{}", error_chain(&*error));

    // The tool still runs to completion on the server.
    assert_eq!(
        state.wait_for_side_effects("deploy_release", 1, WAIT).await,
        1
    );
}

#[tokio::test]
async fn resume_with_last_event_id_replays_an_in_flight_result() {
    // Plain LocalSessionManager: the request stream is resumable while the
    // request is in flight, so use the slow tool.
    let server = TestServer::start().await;
    let state = &server.state;
    let mut client = hyper_client();
    let session = initialize(&mut client, &server.url).await.unwrap();
    let s = session.as_deref();

    state
        .faults()
        .schedule("slow_deploy", Fault::CutStreamAfterFirstEvent);
    let response = post_tool(
        &mut client,
        &server,
        s,
        7,
        "slow_deploy",
        json!({"service": "api"}),
    )
    .await;
    let (events, error) = SseReader::new(response.into_body()).read_all().await;
    assert!(error.is_some());
    let last_event_id = events[0].id.clone().expect("priming id");
    assert_eq!(state.side_effects("slow_deploy"), 0, "still sleeping");

    let resumed = send(
        &mut client,
        get_stream(&server.url, s, PROTOCOL_VERSION, Some(&last_event_id)),
    )
    .await
    .unwrap();
    assert_eq!(resumed.status(), 200);
    let r = read_jsonrpc_response(resumed, &json!(7)).await.unwrap();
    assert_eq!(first_text(&r), Some("slow deployed api"));
    assert_eq!(state.side_effects("slow_deploy"), 1);

    let get = state
        .requests()
        .into_iter()
        .find(|r| r.method == http::Method::GET)
        .expect("GET logged");
    assert_eq!(get.last_event_id.as_deref(), Some(last_event_id.as_str()));
    assert_eq!(get.session_id, session);
}

#[tokio::test]
async fn resume_with_event_store_replays_a_completed_result() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..ServerOptions::default()
    })
    .await;
    let state = &server.state;
    let mut client = hyper_client();
    let session = initialize(&mut client, &server.url).await.unwrap();
    let s = session.as_deref();

    state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);
    let response = post_tool(&mut client, &server, s, 3, "deploy_release", deploy_args()).await;
    let (events, error) = SseReader::new(response.into_body()).read_all().await;
    assert!(error.is_some());
    let last_event_id = events[0].id.clone().expect("priming id");
    assert!(last_event_id.starts_with("ev-"), "{last_event_id}");
    assert_eq!(
        state.wait_for_side_effects("deploy_release", 1, WAIT).await,
        1
    );

    // The request completed before the client came back: replayed anyway.
    let resumed = send(
        &mut client,
        get_stream(&server.url, s, PROTOCOL_VERSION, Some(&last_event_id)),
    )
    .await
    .unwrap();
    let r = read_jsonrpc_response(resumed, &json!(3)).await.unwrap();
    assert_eq!(structured(&r), Some(&json!({"deployment": 1})));
    assert_eq!(state.side_effects("deploy_release"), 1);
    assert!(!state.event_store().unwrap().is_empty());
}

#[tokio::test]
async fn resume_with_event_store_follows_an_in_flight_request() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..ServerOptions::default()
    })
    .await;
    let state = &server.state;
    let mut client = hyper_client();
    let session = initialize(&mut client, &server.url).await.unwrap();
    let s = session.as_deref();

    state
        .faults()
        .schedule("slow_deploy", Fault::CutStreamAfterFirstEvent);
    let response = post_tool(
        &mut client,
        &server,
        s,
        4,
        "slow_deploy",
        json!({"service": "api"}),
    )
    .await;
    let (events, error) = SseReader::new(response.into_body()).read_all().await;
    assert!(error.is_some());
    assert_eq!(state.side_effects("slow_deploy"), 0, "still sleeping");

    // The replay stays open and delivers the response when it is produced,
    // then ends.
    let last_event_id = events[0].id.clone().expect("priming id");
    let resumed = send(
        &mut client,
        get_stream(&server.url, s, PROTOCOL_VERSION, Some(&last_event_id)),
    )
    .await
    .unwrap();
    let (events, error) = SseReader::new(resumed.into_body()).read_all().await;
    assert!(error.is_none());
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].json().unwrap()["id"], json!(4));
    assert_eq!(state.side_effects("slow_deploy"), 1);
}

#[tokio::test]
async fn status_fault_answers_without_running_the_tool() {
    let server = TestServer::start().await;
    let state = &server.state;
    let mut client = hyper_client();
    let session = initialize(&mut client, &server.url).await.unwrap();

    state
        .faults()
        .schedule("create_payment", Fault::Status(500));
    let args = json!({"amount": 1, "currency": "EUR"});
    let response = post_tool(
        &mut client,
        &server,
        session.as_deref(),
        2,
        "create_payment",
        args.clone(),
    )
    .await;
    assert_eq!(response.status(), 500);
    let error = read_jsonrpc_response(response, &json!(2))
        .await
        .expect_err("500 is not a JSON-RPC response");
    assert!(error.to_string().contains("500"), "{error}");
    assert_eq!(state.side_effects("create_payment"), 0);

    // Logged as received but not as having reached rmcp.
    assert!(state.tool_call_requests("create_payment").is_empty());
    let all: Vec<_> = state
        .all_requests()
        .into_iter()
        .filter(|r| r.tool.as_deref() == Some("create_payment"))
        .collect();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].fault, Some(Fault::Status(500)));

    let r = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        3,
        "create_payment",
        args,
    )
    .await
    .unwrap();
    assert_eq!(first_text(&r), Some("payment 1"));
}

#[tokio::test]
async fn refuse_before_read_closes_without_running_the_tool() {
    let server = TestServer::start().await;
    let state = &server.state;
    let mut client = hyper_client();
    let session = initialize(&mut client, &server.url).await.unwrap();

    state
        .faults()
        .schedule("rotate_credential", Fault::RefuseBeforeRead);
    let error = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "rotate_credential",
        json!({"name": "db"}),
    )
    .await
    .expect_err("refused");
    assert!(is_lost_exchange(&*error), "{}", error_chain(&*error));
    assert_eq!(state.side_effects("rotate_credential"), 0);
    assert_eq!(state.rotations("db"), 0);
    assert!(state.tool_call_requests("rotate_credential").is_empty());
    assert!(state.faults().is_empty());

    let r = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        3,
        "rotate_credential",
        json!({"name": "db"}),
    )
    .await
    .unwrap();
    assert_eq!(r["id"], json!(3));
    assert_eq!(state.side_effects("rotate_credential"), 1);
}

#[tokio::test]
async fn clear_sessions_makes_old_session_ids_404() {
    let server = TestServer::start().await;
    let state = &server.state;
    let mut client = hyper_client();
    let session = initialize(&mut client, &server.url).await.unwrap();
    call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        1,
        "list_branches",
        json!({}),
    )
    .await
    .unwrap();

    state.clear_sessions();
    assert!(state.session_ids().is_empty());

    let response = post_tool(
        &mut client,
        &server,
        session.as_deref(),
        2,
        "deploy_release",
        deploy_args(),
    )
    .await;
    assert_eq!(response.status(), 404);
    assert_eq!(state.side_effects("deploy_release"), 0);

    // A fresh handshake works again.
    let fresh = initialize(&mut client, &server.url).await.unwrap();
    assert_ne!(fresh, session);
    call_tool(
        &mut client,
        &server.url,
        fresh.as_deref(),
        3,
        "deploy_release",
        deploy_args(),
    )
    .await
    .unwrap();
    assert_eq!(state.side_effects("deploy_release"), 1);
}

#[tokio::test]
async fn slow_tool_runs_concurrently() {
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_millis(200),
        ..ServerOptions::default()
    })
    .await;
    let url = server.url.clone();
    let mut client = hyper_client();
    let session = initialize(&mut client, &url).await.unwrap();

    let calls = (1..=2).map(|id| {
        let mut client = client.clone();
        let url = url.clone();
        let session = session.clone();
        tokio::spawn(async move {
            call_tool(
                &mut client,
                &url,
                session.as_deref(),
                id,
                "slow_deploy",
                json!({"service": "api"}),
            )
            .await
            .unwrap()
        })
    });
    let handles: Vec<_> = calls.collect();
    assert_eq!(
        server.state.wait_for_started("slow_deploy", 2, WAIT).await,
        2
    );
    assert!(server.state.side_effects("slow_deploy") < 2);
    for handle in handles {
        handle.await.unwrap();
    }
    assert_eq!(server.state.side_effects("slow_deploy"), 2);
}

#[tokio::test]
async fn stateless_server_serves_both_eras_and_injects_faults() {
    let server = TestServer::start_with(ServerOptions::stateless()).await;
    let state = &server.state;
    let url = &server.url;
    let mut client = hyper_client();

    // 2026-07-28: no handshake, per-request _meta and Mcp-Method/Mcp-Name.
    let r = call_tool_stateless(&mut client, url, 1, "deploy_release", deploy_args())
        .await
        .unwrap();
    assert_eq!(structured(&r), Some(&json!({"deployment": 1})));
    // A 2025-era request without a session is served statelessly as well.
    let r = call_tool(&mut client, url, None, 2, "list_branches", json!({}))
        .await
        .unwrap();
    assert_eq!(r["id"], json!(2));
    // initialize is answered but issues no session.
    assert_eq!(initialize(&mut client, url).await.unwrap(), None);
    assert!(state.session_ids().is_empty());

    state
        .faults()
        .schedule("deploy_release", Fault::DropResponseAfterTool);
    let error = call_tool_stateless(&mut client, url, 3, "deploy_release", deploy_args())
        .await
        .expect_err("dropped");
    assert!(is_lost_exchange(&*error), "{}", error_chain(&*error));
    assert_eq!(state.side_effects("deploy_release"), 2);

    // Without priming events the first event is the response: the cut loses
    // it before anything is forwarded, and the tool still runs.
    state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);
    let request = post(
        url,
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(4, "deploy_release", deploy_args()),
    );
    let response = send(&mut client, request).await.unwrap();
    let (events, error) = SseReader::new(response.into_body()).read_all().await;
    assert!(
        events.iter().all(|e| !e.is_jsonrpc_response()),
        "{events:?}"
    );
    assert!(error.is_some());
    assert_eq!(
        state.wait_for_side_effects("deploy_release", 3, WAIT).await,
        3
    );

    // RefuseBeforeRead fires on the Mcp-Name header without reading the body.
    state
        .faults()
        .schedule("create_payment", Fault::RefuseBeforeRead);
    let error = call_tool_stateless(
        &mut client,
        url,
        5,
        "create_payment",
        json!({"amount": 1, "currency": "EUR"}),
    )
    .await
    .expect_err("refused");
    assert!(is_lost_exchange(&*error), "{}", error_chain(&*error));
    assert_eq!(state.side_effects("create_payment"), 0);
    let refused = state
        .all_requests()
        .into_iter()
        .find(|r| r.fault == Some(Fault::RefuseBeforeRead))
        .unwrap();
    assert_eq!(refused.tool.as_deref(), Some("create_payment"));
    assert_eq!(refused.body, None, "body never read");

    state.faults().schedule("list_branches", Fault::Status(503));
    let request = post(
        url,
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(6, "list_branches", json!({})),
    );
    assert_eq!(send(&mut client, request).await.unwrap().status(), 503);
    assert_eq!(state.side_effects("list_branches"), 1);
}

#[tokio::test]
async fn stateless_server_with_event_store_resumes_after_a_cut() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..ServerOptions::stateless()
    })
    .await;
    let state = &server.state;
    let mut client = hyper_client();

    state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);
    let request = post(
        &server.url,
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(1, "deploy_release", deploy_args()),
    );
    let response = send(&mut client, request).await.unwrap();
    let (events, error) = SseReader::new(response.into_body()).read_all().await;
    assert!(error.is_some());
    assert_eq!(events.len(), 1);
    let last_event_id = events[0].id.clone().expect("priming id");
    assert_eq!(
        state.wait_for_side_effects("deploy_release", 1, WAIT).await,
        1
    );

    let resumed = send(
        &mut client,
        get_stream(
            &server.url,
            None,
            STATELESS_PROTOCOL_VERSION,
            Some(&last_event_id),
        ),
    )
    .await
    .unwrap();
    let r = read_jsonrpc_response(resumed, &json!(1)).await.unwrap();
    assert_eq!(structured(&r), Some(&json!({"deployment": 1})));
    assert_eq!(state.side_effects("deploy_release"), 1);
}

#[tokio::test]
async fn stateless_json_response_mode() {
    let server = TestServer::start_with(ServerOptions {
        json_response: true,
        ..ServerOptions::stateless()
    })
    .await;
    let mut client = hyper_client();
    let request = post(
        &server.url,
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(1, "list_branches", json!({})),
    );
    let response = send(&mut client, request).await.unwrap();
    assert_eq!(
        response.headers()[http::header::CONTENT_TYPE],
        "application/json"
    );
    let r = read_jsonrpc_response(response, &json!(1)).await.unwrap();
    assert_eq!(r["id"], json!(1));

    server
        .state
        .faults()
        .schedule("create_payment", Fault::DropResponseAfterTool);
    let error = call_tool_stateless(
        &mut client,
        &server.url,
        2,
        "create_payment",
        json!({"amount": 1, "currency": "EUR"}),
    )
    .await
    .expect_err("dropped");
    assert!(is_lost_exchange(&*error), "{}", error_chain(&*error));
    assert_eq!(server.state.side_effects("create_payment"), 1);
}

#[tokio::test]
async fn dropping_the_server_stops_it() {
    let server = TestServer::start().await;
    let url = server.url.clone();
    let mut client = hyper_client();
    initialize(&mut client, &url).await.unwrap();
    drop(server);
    let mut fresh = hyper_client();
    let mut refused = false;
    for _ in 0..100 {
        if initialize(&mut fresh, &url).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refused, "server still answering after drop");
}
