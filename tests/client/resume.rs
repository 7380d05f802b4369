//! `ResumeLayer` end to end: a broken SSE response stream is recovered with GET +
//! `Last-Event-ID` against rmcp's own server, never with a second POST.

use crate::support;

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use mcp_replay_guard::{
    Actor,
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    ledger::{Ledger, MemoryLedger},
    resume::ResumeLayer,
};
use serde_json::json;
use support::*;
use tower::{Layer, ServiceBuilder, service_fn};

fn guard(ledger: &MemoryLedger) -> GuardLayer {
    let registry = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .tool("slow_deploy", ToolContract::irreversible())
        .build()
        .unwrap();
    GuardLayer::new(
        ledger.clone(),
        registry,
        FingerprintKey::from_bytes(&[5; 32]).unwrap(),
    )
    .actor(Actor::from("agent:resume-test"))
}

fn resume() -> ResumeLayer {
    ResumeLayer::new()
        .max_attempts(3)
        .max_delay(Duration::from_millis(20))
}

#[tokio::test]
async fn a_stream_cut_after_the_first_event_is_resumed_not_reposted() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..Default::default()
    })
    .await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let ledger = MemoryLedger::new();
    let mut client = ServiceBuilder::new()
        .layer(guard(&ledger))
        .layer(resume())
        .service(hyper_client_with_body::<GuardRequestBody>());
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);

    let response = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "deploy_release",
        json!({"service": "catalog", "version": "1"}),
    )
    .await
    .unwrap();

    assert_eq!(
        first_text(&response),
        Some("deployed catalog 1"),
        "{response}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let requests = server.state.all_requests();
    let posts: Vec<_> = requests
        .iter()
        .filter(|r| r.tool.as_deref() == Some("deploy_release"))
        .collect();
    let gets: Vec<_> = requests
        .iter()
        .filter(|r| r.method == Method::GET)
        .collect();
    assert_eq!(posts.len(), 1, "{requests:#?}");
    assert_eq!(gets.len(), 1, "{requests:#?}");
    assert!(gets[0].last_event_id.is_some());
    assert_eq!(gets[0].session_id, session);
    // The guard above saw one unbroken stream.
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].state(), ExecutionState::Completed);
}

#[tokio::test]
async fn a_resume_that_recovers_nothing_ends_unknown_and_is_not_reposted() {
    // Without an event store rmcp cannot replay a finished request: every GET gets an empty
    // stream.
    let server = TestServer::start().await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let ledger = MemoryLedger::new();
    let mut client = ServiceBuilder::new()
        .layer(guard(&ledger))
        .layer(resume())
        .service(hyper_client_with_body::<GuardRequestBody>());
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);
    server
        .state
        .wait_for_side_effects("deploy_release", 0, Duration::ZERO)
        .await;

    let result = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "deploy_release",
        json!({"service": "catalog", "version": "2"}),
    )
    .await;
    assert!(result.is_err(), "{result:?}");
    assert_eq!(
        server
            .state
            .wait_for_side_effects("deploy_release", 1, Duration::from_secs(5))
            .await,
        1
    );
    let requests = server.state.all_requests();
    assert_eq!(
        requests
            .iter()
            .filter(|r| r.tool.as_deref() == Some("deploy_release"))
            .count(),
        1
    );
    assert_eq!(
        requests.iter().filter(|r| r.method == Method::GET).count(),
        3,
        "one GET per attempt"
    );
    let record = ledger.list().await.unwrap().remove(0);
    assert_eq!(record.state(), ExecutionState::Unknown);
    assert!(record.correlation().last_event_id.is_some(), "{record:?}");
}

/// A mock transport whose POST stream breaks after one event and whose resume GET is refused.
#[tokio::test]
async fn a_refused_resume_surfaces_the_break_after_one_get() {
    type Log = Arc<Mutex<Vec<(Method, Option<String>)>>>;
    let seen: Log = Arc::default();
    let log = seen.clone();
    let inner = service_fn(move |request: Request<Full<Bytes>>| {
        let log = log.clone();
        async move {
            let last = request
                .headers()
                .get("last-event-id")
                .map(|v| v.to_str().unwrap().to_owned());
            log.lock().unwrap().push((request.method().clone(), last));
            let frames: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> =
                if request.method() == Method::POST {
                    vec![
                        Ok(http_body::Frame::data(Bytes::from_static(
                            b"id: s/0\nretry: 1\ndata:\n\n",
                        ))),
                        Err(std::io::Error::new(
                            std::io::ErrorKind::ConnectionReset,
                            "cut",
                        )),
                    ]
                } else {
                    vec![]
                };
            let status = if request.method() == Method::POST {
                200
            } else {
                404
            };
            let response = Response::builder()
                .status(status)
                .header("content-type", "text/event-stream")
                .body(StreamBody::new(tokio_stream::iter(frames)))
                .unwrap();
            Ok::<_, Infallible>(response)
        }
    });
    let mut client = resume().layer(inner);
    let request = post(
        "http://127.0.0.1:1/mcp",
        Some("s-1"),
        PROTOCOL_VERSION,
        tool_call_body(1, "deploy_release", json!({})),
    );
    let response = send(&mut client, request).await.unwrap();
    let error = response.into_body().collect().await.unwrap_err();
    assert!(error.to_string().contains("404"), "{error}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [(Method::POST, None), (Method::GET, Some("s/0".to_owned()))]
    );
}
