//! The fault matrix: every named fault point × every retry class × both
//! protocol eras, against rmcp's own Streamable HTTP server on 127.0.0.1 and a `FileLedger` on
//! disk. Each cell asserts the side-effect count the class allows, the final ledger state and
//! what the agent was told, then the table is printed (docs/proof.md, "Fault matrix", carries it).
//!
//! The stack is `GuardLayer` → `ResumeLayer` → hyper-util client, with no retry layer: the agent
//! itself calls once more, with a new JSON-RPC id, whenever its first call gave it no result.
//! A killed client is a child process (this test binary run again with `MRG_CHILD` set, see
//! `child_entry`) whose guard dispatched over the same ledger file.

use mcp_replay_guard_test_support as support;

/// The stdio column: the example stdio server needs the `server` feature.
#[cfg(feature = "server")]
#[path = "fault_matrix/stdio.rs"]
mod stdio;

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Uri};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use mcp_replay_guard::{
    Actor, ExecutionId, IntentScope,
    contract::ContractRegistry,
    execution::{ExecutionRecord, ExecutionState},
    guard::{Guard, GuardLayer, GuardRequestBody},
    ledger::{FileLedger, Ledger},
    resume::{Resume, ResumeLayer},
};
use serde_json::{Value, json};
use support::*;
use tower::{Layer, Service, ServiceExt};

// ---- the axes ----------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    BeforeAnyByte,
    AfterRequestReached,
    MidSse,
    ResultUnread,
    SessionLost,
    ServerError,
    ProcessKilled,
    UnknownPastWindow,
    JsonRpcErrorAfterEffect,
    RetentionPassedWhileRunning,
}

impl Point {
    const ALL: [Point; 10] = [
        Point::BeforeAnyByte,
        Point::AfterRequestReached,
        Point::MidSse,
        Point::ResultUnread,
        Point::SessionLost,
        Point::ServerError,
        Point::ProcessKilled,
        Point::UnknownPastWindow,
        Point::JsonRpcErrorAfterEffect,
        Point::RetentionPassedWhileRunning,
    ];

    fn label(self) -> &'static str {
        match self {
            Point::BeforeAnyByte => "before any byte (connection refused)",
            Point::AfterRequestReached => "request reached the server, no response (tool ran)",
            Point::MidSse => "mid-SSE, after the first event (tool ran)",
            Point::ResultUnread => "result event sent, caller dropped the body unread",
            Point::SessionLost => "404 session loss (server forgot the session)",
            Point::ServerError => "HTTP 500, answered before the tool ran",
            Point::ProcessKilled => "client process SIGKILLed after dispatch (tool ran)",
            Point::UnknownPastWindow => {
                "outcome unknown (no response, tool ran), repeated after the link window"
            }
            Point::JsonRpcErrorAfterEffect => {
                "JSON-RPC error after the effect (the tool ran, then answered -32603)"
            }
            Point::RetentionPassedWhileRunning => {
                "the clock passes retention while the owner lives (another process runs the call)"
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    ReadOnly,
    Idempotent,
    Recoverable,
    Irreversible,
}

impl Class {
    const ALL: [Class; 4] = [
        Class::ReadOnly,
        Class::Idempotent,
        Class::Recoverable,
        Class::Irreversible,
    ];

    fn label(self) -> &'static str {
        match self {
            Class::ReadOnly => "read_only",
            Class::Idempotent => "idempotent",
            Class::Recoverable => "recoverable",
            Class::Irreversible => "irreversible",
        }
    }

    /// The test server's tool of this class, and the arguments every call of a cell sends.
    fn tool(self) -> (&'static str, Value) {
        match self {
            Class::ReadOnly => ("list_branches", json!({})),
            Class::Idempotent => ("create_payment", json!({"amount": 500, "currency": "eur"})),
            Class::Recoverable => ("rotate_credential", json!({"name": "db-password"})),
            Class::Irreversible => (
                "deploy_release",
                json!({"service": "catalog", "version": "2026.07.22"}),
            ),
        }
    }

    fn from_tool(tool: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|class| class.tool().0 == tool)
    }
}

fn registry() -> ContractRegistry {
    one_contract_per_class()
}

/// The link window of the cells that repeat a call after it: short, so that the wall clock
/// passes it within the cell.
const SHORT_WINDOW: Duration = Duration::from_millis(300);

/// [`registry`], with every tool's link window [`SHORT_WINDOW`].
fn short_window_registry() -> ContractRegistry {
    use mcp_replay_guard::contract::ToolContract;
    ContractRegistry::builder()
        .tool("list_branches", ToolContract::read_only())
        .tool(
            "create_payment",
            ToolContract::idempotent().link_window(SHORT_WINDOW),
        )
        .tool(
            "rotate_credential",
            ToolContract::recoverable().link_window(SHORT_WINDOW),
        )
        .tool(
            "deploy_release",
            ToolContract::irreversible().link_window(SHORT_WINDOW),
        )
        .build()
        .expect("valid contracts")
}

/// [`registry`], with every tool's link window and retention [`SHORT_WINDOW`]: the wall clock
/// passes the retention of a call while its owner still runs it.
fn short_retention_registry() -> ContractRegistry {
    use mcp_replay_guard::contract::ToolContract;
    let short = |contract: ToolContract| contract.link_window(SHORT_WINDOW).retention(SHORT_WINDOW);
    ContractRegistry::builder()
        .tool("list_branches", short(ToolContract::read_only()))
        .tool("create_payment", short(ToolContract::idempotent()))
        .tool("rotate_credential", short(ToolContract::recoverable()))
        .tool("deploy_release", short(ToolContract::irreversible()))
        .build()
        .expect("valid contracts")
}

/// Waits (polling the wall clock, with a deadline) until every recorded execution is past
/// its link window.
async fn wait_past_link_windows(ledger: &FileLedger) {
    wait_past(ledger, |r| r.link_until()).await;
}

/// Waits (polling the wall clock, with a deadline) until every recorded execution is past
/// the time `until` reads from it.
async fn wait_past(
    ledger: &FileLedger,
    until: impl Fn(&ExecutionRecord) -> mcp_replay_guard::execution::Timestamp,
) {
    use mcp_replay_guard::execution::Timestamp;
    let records = ledger.list().await.expect("list");
    let Some(until) = records.iter().map(until).max() else {
        return;
    };
    let deadline = tokio::time::Instant::now() + SHORT_WINDOW * 10;
    while Timestamp::now() <= until {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the window never passed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The guard every process of a cell runs: same actor and scope, the contracts given, and the
/// fingerprint key kept beside the ledger file, so a process that reopens the ledger finds the
/// executions of the one that died.
fn guard_layer_with(ledger: &FileLedger, registry: ContractRegistry) -> GuardLayer {
    GuardLayer::new(
        ledger.clone(),
        registry,
        ledger.fingerprint_key().expect("fingerprint key"),
    )
    .actor(Actor::from("signed-process:com.example.agent"))
    .intent_scope(IntentScope::from("run:fault-matrix"))
}

// ---- what a cell expects -----------------------------------------------------------------

const UNCERTAIN: &str = "uncertain: needs_review + execution id";
const RESULT: &str = TOLD_RESULT;
const PROBE_RESULT: &str = TOLD_PROBE_RESULT;
const NOT_RECORDED: &str = "not recorded (read-only)";

/// One row of the matrix: what happened (observed) or what the class allows (expected).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    side_effects: usize,
    ledger: String,
    told: String,
    /// How many times the recoverable tool's status probe was asked.
    probes: usize,
}

/// What the contract of `class` allows at `point` in `era`; `None` where the point does not
/// exist in that era.
fn expected(point: Point, era: Era, class: Class) -> Option<Row> {
    use Class::*;
    if point == Point::SessionLost && era == Era::Stateless {
        return None;
    }
    if point == Point::RetentionPassedWhileRunning {
        // The other process's call ran the tool and is still in flight: a repeat waits for it
        // (the attach wait ends with an honest "in progress"), never runs it again.
        let (side_effects, ledger, second) = match class {
            ReadOnly => (2, NOT_RECORDED, RESULT),
            _ => (1, "dispatched", "uncertain: dispatched + execution id"),
        };
        return Some(Row {
            side_effects,
            ledger: ledger.to_owned(),
            told: format!("nothing (another process runs it) → {second}"),
            probes: 0,
        });
    }
    // The tool ran and the outcome reached nobody: the class decides what the repeat does.
    let lost_after_run = matches!(
        point,
        Point::AfterRequestReached
            | Point::ProcessKilled
            | Point::UnknownPastWindow
            | Point::JsonRpcErrorAfterEffect
    ) || (point == Point::MidSse && era == Era::Stateless);
    let guarded_error = |text: &'static str| {
        if class == ReadOnly {
            "transport error"
        } else {
            text
        }
    };
    let first = match point {
        Point::BeforeAnyByte => guarded_error("error: not sent"),
        Point::AfterRequestReached | Point::UnknownPastWindow => {
            guarded_error("error: outcome unknown")
        }
        Point::MidSse if era == Era::Sessions => RESULT,
        Point::MidSse => "stream broke before the result",
        Point::ResultUnread => "nothing (body dropped unread)",
        Point::SessionLost => "HTTP 404",
        Point::ServerError => "HTTP 500",
        Point::ProcessKilled => "nothing (process killed)",
        Point::JsonRpcErrorAfterEffect => "JSON-RPC error -32603",
        Point::RetentionPassedWhileRunning => unreachable!("answered above"),
    };
    let second = match (class, lost_after_run, point) {
        (_, _, Point::MidSse) if era == Era::Sessions => None,
        (Irreversible, true, _) | (Irreversible, _, Point::ServerError) => Some(UNCERTAIN),
        (Recoverable, true, _) => Some(PROBE_RESULT),
        _ => Some(RESULT),
    };
    let side_effects = match (class, lost_after_run, point) {
        (ReadOnly | Idempotent, true, _) => 2,
        (ReadOnly, _, Point::ResultUnread) => 2,
        (Irreversible, _, Point::ServerError) => 0,
        _ => 1,
    };
    let ledger = match (class, lost_after_run, point) {
        (ReadOnly, ..) => NOT_RECORDED,
        (Idempotent, true, _) => "completed, delivered (2 attempts)",
        (Recoverable, true, _) => "resolved_applied, delivered",
        (Irreversible, true, _) | (Irreversible, _, Point::ServerError) => "needs_review",
        (_, _, Point::BeforeAnyByte | Point::ServerError) => "completed, delivered (2 attempts)",
        (_, _, Point::SessionLost) => "failed; then completed, delivered",
        _ => "completed, delivered",
    };
    let probes = match (class, lost_after_run, point) {
        (Recoverable, true, _) | (Recoverable, _, Point::ServerError) => 1,
        _ => 0,
    };
    Some(Row {
        side_effects,
        ledger: ledger.to_owned(),
        told: match second {
            Some(second) => format!("{first} → {second}"),
            None => first.to_owned(),
        },
        probes,
    })
}

// ---- the client stack --------------------------------------------------------------------

/// hyper-util's connector, except that while `refuse` is above zero a connect goes to a port
/// nobody listens on: a real `ECONNREFUSED` from the kernel, before any request byte exists.
#[derive(Clone)]
struct RefusingConnector {
    inner: HttpConnector,
    refuse: Arc<AtomicUsize>,
    dead: Uri,
}

impl Service<Uri> for RefusingConnector {
    type Response = <HttpConnector as Service<Uri>>::Response;
    type Error = <HttpConnector as Service<Uri>>::Error;
    type Future = <HttpConnector as Service<Uri>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let refuse = self
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        self.inner
            .call(if refuse { self.dead.clone() } else { uri })
    }
}

fn dead_uri() -> Uri {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("local addr");
    drop(listener);
    format!("http://{addr}/").parse().expect("uri")
}

type Stack = Guard<Resume<Client<RefusingConnector, GuardRequestBody>>>;

fn stack(layer: &GuardLayer, refuse: &Arc<AtomicUsize>) -> Stack {
    let connector = RefusingConnector {
        inner: HttpConnector::new(),
        refuse: refuse.clone(),
        dead: dead_uri(),
    };
    let client = Client::builder(TokioExecutor::new()).build(connector);
    let resume = ResumeLayer::new()
        .max_attempts(3)
        .max_delay(Duration::from_millis(20));
    layer.layer(resume.layer(client))
}

// ---- one cell ----------------------------------------------------------------------------

/// The agent calls the cell's tool with JSON-RPC id `id`.
async fn call(
    client: &mut Stack,
    era: Era,
    url: &str,
    session: Option<&str>,
    id: i64,
    class: Class,
) -> Told {
    let (tool, args) = class.tool();
    agent_call(client, era.tool_call(url, session, id, tool, args), id).await
}

fn temp_ledger(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "mrg-matrix-{name}-{}-{}",
        std::process::id(),
        ExecutionId::new().ulid()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("ledger.jsonl");
    (dir, path)
}

/// Runs a child process whose guard dispatches the cell's call over the ledger at `path`
/// (its contracts: `contracts`, `default` or `short-retention`) and never sees the answer;
/// returns it, alive, once the tool has run on the server.
async fn dispatch_and_hold(
    server: &TestServer,
    era: Era,
    class: Class,
    path: &Path,
    contracts: &str,
) -> std::process::Child {
    let (tool, _) = class.tool();
    let mut child = child_process(&format!(
        "{}|{tool}|{}|{}|{contracts}",
        era.token(),
        path.display(),
        server.url
    ))
    .stdout(Stdio::null())
    .stderr(Stdio::inherit())
    .spawn()
    .expect("spawn the child");
    let ran = server
        .state
        .wait_for_side_effects(tool, 1, Duration::from_secs(30))
        .await;
    if ran != 1 {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(ran, 1, "the child's call never reached {tool}");
    child
}

/// Runs a child process whose guard dispatches the cell's call over the ledger at `path` and
/// never sees the answer; kills it (SIGKILL) once the tool has run on the server.
async fn kill_after_dispatch(server: &TestServer, era: Era, class: Class, path: &Path) {
    let mut child = dispatch_and_hold(server, era, class, path, "default").await;
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("reap the child");
    assert!(!status.success(), "the child ended by itself: {status}");
}

/// The child side: does nothing unless `MRG_CHILD` names a task (`era|tool|ledger|url|contracts`).
#[test]
#[ignore = "a child process's entry point, run by the tests that start it (with MRG_CHILD set)"]
fn child_entry() {
    let Ok(task) = std::env::var("MRG_CHILD") else {
        return;
    };
    let parts: Vec<&str> = task.split('|').collect();
    let [era, tool, path, url, contracts] = parts[..] else {
        panic!("bad child task {task}");
    };
    let contracts = match contracts {
        "short-retention" => short_retention_registry(),
        _ => registry(),
    };
    let era = Era::from_token(era).expect("era");
    let class = Class::from_tool(tool).expect("tool");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let ledger = FileLedger::open(path).expect("open the ledger");
        // Under the guard: a transport that sends the request, then never hands the answer
        // back, so this process is killed with the execution `dispatched`.
        let client = support::hyper_client_with_body::<GuardRequestBody>();
        let stall = tower::service_fn(move |request: Request<GuardRequestBody>| {
            let client = client.clone();
            async move {
                let response = client.oneshot(request).await;
                std::future::pending::<()>().await;
                response
            }
        });
        let mut guarded = guard_layer_with(&ledger, contracts).layer(stall);
        let session = era.open_session(url).await;
        let (tool, args) = class.tool();
        let _ = send(
            &mut guarded,
            era.tool_call(url, session.as_deref(), 1, tool, args),
        )
        .await;
        unreachable!("the stalled call returned");
    });
}

fn render_ledger(records: &[ExecutionRecord]) -> String {
    if records.is_empty() {
        return NOT_RECORDED.to_owned();
    }
    let mut records = records.to_vec();
    records.sort_by_key(|r| r.accepted_at());
    records
        .iter()
        .map(|r| {
            let mut text = r.state().as_str().to_owned();
            if r.delivered_at().is_some() {
                text.push_str(", delivered");
            }
            if r.attempts() > 1 {
                write!(text, " ({} attempts)", r.attempts()).unwrap();
            }
            text
        })
        .collect::<Vec<_>>()
        .join("; then ")
}

async fn run_cell(point: Point, era: Era, class: Class) -> Row {
    let server = TestServer::start_with(match era {
        Era::Sessions => ServerOptions {
            event_store: true,
            sse_retry: Some(Duration::from_millis(10)),
            ..ServerOptions::default()
        },
        Era::Stateless => ServerOptions::stateless(),
    })
    .await;
    let (tool, _) = class.tool();
    let url = server.url.clone();
    let faults = server.state.faults();
    let (dir, path) = temp_ledger(tool);

    if point == Point::ProcessKilled {
        kill_after_dispatch(&server, era, class, &path).await;
    }
    // The process that runs the call and lives on while the cell repeats it.
    let holder = if point == Point::RetentionPassedWhileRunning {
        Some(dispatch_and_hold(&server, era, class, &path, "short-retention").await)
    } else {
        None
    };
    // This process's guard: for a killed client, the fresh one that reopens its ledger.
    let ledger = FileLedger::open(&path).expect("open the ledger");
    let probe = CredentialStatusProbe::new(&url, era);
    let contracts = match point {
        Point::UnknownPastWindow => short_window_registry(),
        Point::RetentionPassedWhileRunning => short_retention_registry(),
        _ => registry(),
    };
    let contracts = contracts
        .with_status_probe("rotate_credential", probe.clone())
        .expect("rotate_credential is recoverable");
    let mut layer = guard_layer_with(&ledger, contracts);
    if point == Point::RetentionPassedWhileRunning {
        // The attach wait ends well before the held call would.
        layer = layer.attach_timeout(Duration::from_millis(500));
    }
    let refuse = Arc::new(AtomicUsize::new(0));
    let mut client = stack(&layer, &refuse);
    let mut session = era.open_session(&url).await;

    let first = match point {
        Point::BeforeAnyByte => {
            refuse.store(1, Ordering::SeqCst);
            call(&mut client, era, &url, session.as_deref(), 1, class).await
        }
        Point::AfterRequestReached
        | Point::UnknownPastWindow
        | Point::MidSse
        | Point::ServerError => {
            faults.schedule(
                tool,
                match point {
                    Point::AfterRequestReached | Point::UnknownPastWindow => {
                        Fault::DropResponseAfterTool
                    }
                    Point::MidSse => Fault::CutStreamAfterFirstEvent,
                    _ => Fault::Status(500),
                },
            );
            call(&mut client, era, &url, session.as_deref(), 1, class).await
        }
        Point::ResultUnread => {
            let (tool, args) = class.tool();
            let request = era.tool_call(&url, session.as_deref(), 1, tool, args);
            drop(send(&mut client, request).await.expect("the response head"));
            assert_eq!(
                server
                    .state
                    .wait_for_side_effects(tool, 1, Duration::from_secs(5))
                    .await,
                1
            );
            if class != Class::ReadOnly {
                // The guard reads the dropped stream on in the background to keep the result.
                wait_for_state(&ledger, ExecutionState::Completed).await;
            }
            Told::Nothing("body dropped unread")
        }
        Point::SessionLost => {
            assert_eq!(era, Era::Sessions, "no session to lose in 2026-07-28");
            server.state.clear_sessions();
            let told = call(&mut client, era, &url, session.as_deref(), 1, class).await;
            // What a session-era client does on 404: a new session, then the call again.
            session = era.open_session(&url).await;
            told
        }
        Point::ProcessKilled => Told::Nothing("process killed"),
        Point::JsonRpcErrorAfterEffect => {
            server.state.fail_next_after_effect(tool);
            call(&mut client, era, &url, session.as_deref(), 1, class).await
        }
        Point::RetentionPassedWhileRunning => Told::Nothing("another process runs it"),
    };
    if point == Point::UnknownPastWindow {
        wait_past_link_windows(&ledger).await;
    }
    if point == Point::RetentionPassedWhileRunning {
        wait_past(&ledger, |r| r.retain_until()).await;
    }
    let second = if first.is_result() {
        None
    } else {
        Some(call(&mut client, era, &url, session.as_deref(), 2, class).await)
    };

    let records = ledger.list().await.expect("list");
    check_answers(&server, &records, class, second.as_ref());
    let row = Row {
        side_effects: server.state.side_effects(tool),
        ledger: render_ledger(&records),
        told: match &second {
            Some(second) => format!("{} → {}", first.render(), second.render()),
            None => first.render(),
        },
        probes: probe.asked(),
    };
    let report = ledger.verify().expect("verify");
    assert!(report.is_ok(), "{point:?} {era:?} {class:?}: {report}");
    if let Some(mut holder) = holder {
        holder.kill().expect("SIGKILL");
        holder.wait().expect("reap the child");
    }
    drop((client, layer, ledger));
    std::fs::remove_dir_all(&dir).ok();
    row
}

/// Checks beyond the printed row: an uncertain answer names the execution that is held, and
/// every re-send of an idempotent or recoverable call carried the execution's own key.
fn check_answers(
    server: &TestServer,
    records: &[ExecutionRecord],
    class: Class,
    second: Option<&Told>,
) {
    let (tool, _) = class.tool();
    if let Some(Told::Uncertain(answer)) = second
        && answer["result"]["structuredContent"]["mcp_replay_guard"]["state"] == "needs_review"
    {
        let held = answer["result"]["structuredContent"]["mcp_replay_guard"].clone();
        let record = records
            .iter()
            .find(|r| r.state() == ExecutionState::NeedsReview)
            .expect("a held execution");
        assert_eq!(
            held["execution_id"],
            json!(record.execution_id().to_string())
        );
        assert_eq!(answer["result"]["isError"], true);
        assert!(
            first_text(answer).is_some_and(|t| t.contains("NOT sent again")),
            "{answer}"
        );
    }
    let sent_keys: Vec<Option<String>> = server
        .state
        .all_requests()
        .into_iter()
        .filter(|r| r.tool.as_deref() == Some(tool))
        .map(|r| r.idempotency_key)
        .collect();
    match class {
        Class::ReadOnly => assert!(sent_keys.iter().all(Option::is_none), "{sent_keys:?}"),
        _ => {
            // Whatever reached the server carried the key of one of the cell's executions.
            let ids: Vec<Option<String>> = records
                .iter()
                .map(|r| Some(r.execution_id().to_string()))
                .collect();
            for key in &sent_keys {
                assert!(ids.contains(key), "{key:?} is no execution's: {ids:?}");
            }
            // Every run of the tool (a re-send included) carried the key of the execution it
            // belongs to: the newest one (after a 404 the refused first one never ran).
            let last = records.iter().max_by_key(|r| r.accepted_at());
            let last = last.map(|r| r.execution_id().to_string());
            let run_keys = server.state.idempotency_keys(tool);
            assert!(
                run_keys.iter().all(|k| *k == last),
                "{run_keys:?} vs {last:?}"
            );
        }
    }
}

async fn matrix(era: Era) {
    let mut table = format!(
        "\nFault matrix, {}. Stack: GuardLayer → ResumeLayer → hyper-util, no retry layer: \
         the agent calls once more (new JSON-RPC id) when its first call gave no result.\n\n\
         | fault point | era | class | side effects | ledger state | agent told |\n\
         |---|---|---|---|---|---|\n",
        era.label()
    );
    let mut wrong = Vec::new();
    for point in Point::ALL {
        for class in Class::ALL {
            let Some(want) = expected(point, era, class) else {
                writeln!(
                    table,
                    "| {} | {} | {} | n/a | n/a | n/a: 2026-07-28 has no sessions, so no session to lose |",
                    point.label(),
                    era.label(),
                    class.label()
                )
                .unwrap();
                continue;
            };
            let got = run_cell(point, era, class).await;
            writeln!(
                table,
                "| {} | {} | {} | {} | {} | {} |",
                point.label(),
                era.label(),
                class.label(),
                got.side_effects,
                got.ledger,
                got.told
            )
            .unwrap();
            if got != want {
                wrong.push(format!(
                    "{point:?} × {class:?}:\n  expected {want:?}\n  observed {got:?}"
                ));
            }
        }
    }
    println!("{table}");
    assert!(
        wrong.is_empty(),
        "{} cells differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_2025_11_25_with_sessions() {
    matrix(Era::Sessions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_2026_07_28_stateless() {
    matrix(Era::Stateless).await;
}
