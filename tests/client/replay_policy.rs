//! `ReplayPolicy` under `tower::retry::Retry`, counting the exact attempts that reach the inner
//! service for each kind of request × each kind of failure: first over a bare transport
//! (`tower_test::mock`), then with a real `GuardLayer` between the policy and the transport.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{GuardError, GuardLayer, GuardRequestBody},
    ledger::{Ledger, MemoryLedger},
    replay_policy::{Backoff, ReplayPolicy},
};
use tower::{Layer, Service, ServiceExt, retry::Retry, retry::budget::TpsBudget};
use tower_test::mock;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ATTEMPTS: u32 = 3;

fn contracts() -> ContractRegistry {
    ContractRegistry::builder()
        .tool("list_branches", ToolContract::read_only())
        .tool("create_payment", ToolContract::idempotent())
        .tool("rotate_credential", ToolContract::recoverable())
        .tool("deploy_release", ToolContract::irreversible())
        .build()
        .unwrap()
}

fn policy() -> ReplayPolicy {
    ReplayPolicy::new(contracts())
        .max_attempts(ATTEMPTS)
        .backoff(Backoff::none())
}

/// What the test sends.
#[derive(Clone, Copy, Debug)]
enum Traffic {
    /// A `tools/call` of the tool.
    Tool(&'static str),
    /// A `tools/call` of the tool carrying `Idempotency-Key: caller-key-1`.
    ToolWithKey(&'static str),
    /// `tools/list`.
    ToolsList,
    /// A GET that opens a listen stream.
    Listen,
    /// A POST that is not MCP (a form body).
    PlainPost,
    /// A plain POST with `Idempotency-Key: caller-key-1`.
    PlainPostWithKey,
    /// A plain PUT.
    PlainPut,
}

impl Traffic {
    fn request(self) -> Request<Full<Bytes>> {
        let call = |tool: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"{tool}","arguments":{{"n":1}}}}}}"#
            )
        };
        let (method, body, key) = match self {
            Self::Tool(tool) => ("POST", call(tool), false),
            Self::ToolWithKey(tool) => ("POST", call(tool), true),
            Self::ToolsList => (
                "POST",
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#.into(),
                false,
            ),
            Self::Listen => ("GET", String::new(), false),
            Self::PlainPost => ("POST", "amount=5".into(), false),
            Self::PlainPostWithKey => ("POST", "amount=5".into(), true),
            Self::PlainPut => ("PUT", "amount=5".into(), false),
        };
        let mut builder = Request::builder()
            .method(method)
            .uri("http://127.0.0.1:9/mcp")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if key {
            builder = builder.header("idempotency-key", "caller-key-1");
        }
        builder.body(Full::new(Bytes::from(body))).unwrap()
    }
}

/// How each attempt fails.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `io::ErrorKind::ConnectionRefused`, before the body is read.
    Refused,
    /// A real hyper-util connect error (connecting to a closed port), before the body is read.
    HyperConnect,
    /// `io::ErrorKind::ConnectionReset` before the body is read.
    ResetBeforeBody,
    /// The body is read to its end, then `io::ErrorKind::ConnectionReset`.
    ResetAfterBody,
    /// The body is read, then a 500 answer.
    Status500,
}

/// What the inner service saw.
#[derive(Debug, Default)]
struct Seen {
    attempts: u32,
    keys: Vec<Option<String>>,
}

/// A port nothing listens on.
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

async fn hyper_connect_error() -> BoxError {
    let port = closed_port().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let error = client
        .request(
            Request::get(format!("http://127.0.0.1:{port}/"))
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(error.is_connect(), "{error:?}");
    Box::new(error)
}

/// Answers every request that reaches the mock transport with `fault`, recording each attempt.
async fn transport<B>(
    mut handle: mock::Handle<Request<B>, Response<Full<Bytes>>>,
    fault: Fault,
) -> Seen
where
    B: Body + Send + 'static,
    B::Error: std::fmt::Debug,
{
    let mut seen = Seen::default();
    while let Some((request, respond)) = handle.next_request().await {
        seen.attempts += 1;
        seen.keys.push(
            request
                .headers()
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned()),
        );
        let read_body = async { request.into_body().collect().await.unwrap() };
        match fault {
            Fault::Refused => {
                respond.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
            }
            Fault::HyperConnect => respond.send_error(hyper_connect_error().await),
            Fault::ResetBeforeBody => {
                respond.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
            }
            Fault::ResetAfterBody => {
                read_body.await;
                respond.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
            }
            Fault::Status500 => {
                read_body.await;
                respond.send_response(
                    Response::builder()
                        .status(StatusCode::INTERNAL_SERVER_ERROR)
                        .body(Full::default())
                        .unwrap(),
                )
            }
        }
    }
    seen
}

/// Sends one request through `Retry<ReplayPolicy, mock>`; returns what the transport saw.
async fn over_bare_transport(send: Traffic, fault: Fault) -> (Seen, Result<StatusCode, BoxError>) {
    let (mock, handle) = mock::pair::<Request<Full<Bytes>>, Response<Full<Bytes>>>();
    let transport = tokio::spawn(transport(handle, fault));
    let result = Retry::new(policy(), mock)
        .oneshot(send.request())
        .await
        .map(|r| r.status());
    (transport.await.unwrap(), result)
}

#[tokio::test]
async fn over_a_bare_transport_each_class_is_resent_only_as_its_contract_allows() {
    use Fault::*;
    use Traffic::*;
    let all = ATTEMPTS;
    #[rustfmt::skip]
    let rows: &[(Traffic, Fault, u32)] = &[
        // Nothing was sent: every request is re-sent.
        (Tool("deploy_release"),    Refused,        all),
        (Tool("deploy_release"),    HyperConnect,   all),
        (Tool("rotate_credential"), Refused,        all),
        (Tool("create_payment"),    HyperConnect,   all),
        (Tool("unlisted_tool"),     Refused,        all),
        (PlainPost,                 HyperConnect,   all),
        // The outcome is unknown (an error proves nothing without the guard below).
        (Tool("list_branches"),     ResetAfterBody, all),
        (ToolsList,                 ResetAfterBody, all),
        (Listen,                    ResetAfterBody, all),
        (Tool("create_payment"),    ResetAfterBody, 1),
        (ToolWithKey("create_payment"), ResetAfterBody, all),
        (Tool("rotate_credential"), ResetAfterBody, 1),
        (Tool("deploy_release"),    ResetAfterBody, 1),
        (Tool("deploy_release"),    ResetBeforeBody, 1),
        (ToolWithKey("deploy_release"), ResetAfterBody, 1),
        (Tool("unlisted_tool"),     ResetAfterBody, 1),
        (PlainPost,                 ResetAfterBody, 1),
        (PlainPostWithKey,          ResetAfterBody, all),
        (PlainPut,                  ResetAfterBody, all),
        // An answer is never re-sent, whatever its status.
        (Tool("list_branches"),     Status500,      1),
        (Listen,                    Status500,      1),
        (PlainPut,                  Status500,      1),
    ];
    for &(send, fault, expected) in rows {
        let (seen, result) = over_bare_transport(send, fault).await;
        assert_eq!(seen.attempts, expected, "{send:?} × {fault:?}");
        match fault {
            Status500 => assert_eq!(result.unwrap(), StatusCode::INTERNAL_SERVER_ERROR),
            _ => assert!(result.is_err(), "{send:?} × {fault:?}"),
        }
        // A re-send keeps the caller's key.
        if matches!(send, ToolWithKey(_) | PlainPostWithKey) {
            assert!(
                seen.keys
                    .iter()
                    .all(|k| k.as_deref() == Some("caller-key-1")),
                "{send:?}: {:?}",
                seen.keys
            );
        }
    }
}

/// `Retry<ReplayPolicy, Guard<mock>>`.
struct Guarded {
    ledger: MemoryLedger,
    seen: Seen,
    result: Result<StatusCode, GuardError>,
}

async fn through_the_guard(send: Traffic, fault: Fault) -> Guarded {
    let ledger = MemoryLedger::new();
    let guard = GuardLayer::new(
        ledger.clone(),
        contracts(),
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    );
    let (mock, handle) = mock::pair::<Request<GuardRequestBody>, Response<Full<Bytes>>>();
    let transport = tokio::spawn(transport(handle, fault));
    let result = Retry::new(policy(), guard.layer(mock))
        .oneshot(send.request())
        .await
        .map(|r| r.status());
    Guarded {
        ledger,
        seen: transport.await.unwrap(),
        result,
    }
}

#[tokio::test]
async fn above_the_guard_each_class_is_resent_only_as_its_contract_allows() {
    use Fault::*;
    use Traffic::*;
    let all = ATTEMPTS;
    #[rustfmt::skip]
    let rows: &[(Traffic, Fault, u32, Option<ExecutionState>)] = &[
        // The guard saw the transport fail before it read the body: not sent, re-sent, and the
        // guard continues the same execution each time.
        (Tool("deploy_release"),    ResetBeforeBody, all, Some(ExecutionState::NotSent)),
        (Tool("rotate_credential"), ResetBeforeBody, all, Some(ExecutionState::NotSent)),
        (Tool("create_payment"),    ResetBeforeBody, all, Some(ExecutionState::NotSent)),
        (Tool("deploy_release"),    Refused,         all, Some(ExecutionState::NotSent)),
        // The body was read: the outcome is unknown.
        (Tool("create_payment"),    ResetAfterBody,  all, Some(ExecutionState::Unknown)),
        (Tool("rotate_credential"), ResetAfterBody,  1,   Some(ExecutionState::Unknown)),
        (Tool("deploy_release"),    ResetAfterBody,  1,   Some(ExecutionState::Unknown)),
        (Tool("unlisted_tool"),     ResetAfterBody,  1,   Some(ExecutionState::Unknown)),
        // Read-only tools and other MCP traffic pass through the guard and are re-sent freely.
        (Tool("list_branches"),     ResetAfterBody,  all, None),
        (ToolsList,                 ResetAfterBody,  all, None),
        (Listen,                    ResetAfterBody,  all, None),
    ];
    for &(send, fault, expected, state) in rows {
        let Guarded {
            ledger,
            seen,
            result,
        } = through_the_guard(send, fault).await;
        let what = format!("{send:?} × {fault:?}");
        assert_eq!(seen.attempts, expected, "{what}");
        let error = result.unwrap_err();
        let Some(state) = state else {
            assert!(error.is_inner(), "{what}: {error}");
            assert!(ledger.list().await.unwrap().is_empty(), "{what}");
            assert!(seen.keys.iter().all(Option::is_none), "{what}");
            continue;
        };
        assert_eq!(
            (error.is_not_sent(), error.is_unknown()),
            (
                state == ExecutionState::NotSent,
                state == ExecutionState::Unknown
            ),
            "{what}: {error}"
        );
        // One execution, whatever the number of attempts, and every attempt under its key.
        let records = ledger.list().await.unwrap();
        assert_eq!(records.len(), 1, "{what}");
        let record = &records[0];
        assert_eq!(Some(record.execution_id()), error.execution_id(), "{what}");
        assert_eq!(record.state(), state, "{what}");
        let key = record.execution_id().to_string();
        assert_eq!(seen.keys.len(), expected as usize);
        assert!(
            seen.keys.iter().all(|k| k.as_deref() == Some(key.as_str())),
            "{what}: {:?} vs {key}",
            seen.keys
        );
    }
}

#[tokio::test(start_paused = true)]
async fn backoff_doubles_between_attempts_up_to_its_cap() {
    let policy = ReplayPolicy::new(contracts())
        .max_attempts(4)
        .backoff(Backoff::exponential(
            Duration::from_millis(100),
            Duration::from_millis(250),
        ));
    let (mock, handle) = mock::pair::<Request<Full<Bytes>>, Response<Full<Bytes>>>();
    let times = Arc::new(Mutex::new(Vec::new()));
    let start = tokio::time::Instant::now();
    let recorded = times.clone();
    let transport = tokio::spawn(async move {
        let mut handle = handle;
        while let Some((_, respond)) = handle.next_request().await {
            recorded.lock().unwrap().push(start.elapsed());
            respond.send_error(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        }
    });
    let result = Retry::new(policy, mock)
        .oneshot(Traffic::Tool("deploy_release").request())
        .await;
    assert!(result.is_err());
    transport.await.unwrap();
    let ms: Vec<u128> = times
        .lock()
        .unwrap()
        .iter()
        .map(|d| d.as_millis())
        .collect();
    assert_eq!(ms, [0, 100, 300, 550]);
}

#[tokio::test]
async fn a_shared_budget_bounds_resends_across_requests() {
    // One re-send in reserve, and requests earn none.
    let budget = Arc::new(TpsBudget::new(Duration::from_secs(1), 1, 0.0));
    let policy = policy().budget(budget);
    let (mock, handle) = mock::pair::<Request<Full<Bytes>>, Response<Full<Bytes>>>();
    let transport = tokio::spawn(transport(handle, Fault::Refused));
    let mut client = Retry::new(policy, mock);
    for _ in 0..3 {
        let result = client
            .ready()
            .await
            .unwrap()
            .call(Traffic::ToolsList.request())
            .await;
        assert!(result.is_err());
    }
    drop(client);
    // 2 attempts for the first request (the reserve paid one re-send), 1 for each other.
    assert_eq!(transport.await.unwrap().attempts, 4);
}

#[tokio::test]
async fn one_attempt_means_no_resend_even_when_nothing_was_sent() {
    let (mock, handle) = mock::pair::<Request<Full<Bytes>>, Response<Full<Bytes>>>();
    let transport = tokio::spawn(transport(handle, Fault::Refused));
    let result = Retry::new(policy().max_attempts(1), mock)
        .oneshot(Traffic::ToolsList.request())
        .await;
    assert!(result.is_err());
    assert_eq!(transport.await.unwrap().attempts, 1);
}
