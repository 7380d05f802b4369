//! One simulation run: the hosts (the target and the agent processes), the driver that
//! carries out the plan's crashes, partitions and holds between steps, and the checks.

use std::{
    cell::Cell,
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{
        Client,
        connect::{Connected, Connection},
    },
    rt::TokioIo,
};
use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ProbeOutcome, ProbeRequest, StatusProbe, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody, STRUCTURED_KEY},
    ledger::{
        EventKind, ExecutionRecord, ExecutionState, FileLedger, Ledger, LedgerEvent, MemoryLedger,
        Timestamp,
    },
};
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};

use crate::{
    disk::{Machine, PlannedCrash, ProcessDisk},
    plan::{DEFAULT_RETENTION_MS, Entry, LedgerKind, Plan, Tool, Victim},
    target::{self, Started},
    witness::{self, AckedWrites, Witness},
};

/// One step of simulated time.
pub const TICK: Duration = Duration::from_millis(20);
/// Past this, a call still unanswered is a violation.
pub const LIMIT_MS: u64 = 120_000;
/// The simulated wall clock at time zero (2026-07-22T00:00:00Z).
const EPOCH_MS: u64 = 1_784_678_400_000;
/// The longest retention of any contract (a tool without a short one from the plan).
const RETENTION: Duration = Duration::from_millis(DEFAULT_RETENTION_MS);

thread_local! {
    static NOW_MS: Cell<u64> = const { Cell::new(0) };
}

fn sim_clock() -> Timestamp {
    Timestamp::from_millis(EPOCH_MS + NOW_MS.with(Cell::get))
}

fn ts(ms: u64) -> Timestamp {
    Timestamp::from_millis(EPOCH_MS + ms)
}

/// One run of the tool at the target.
#[derive(Debug, Clone)]
struct Effect {
    tool: Tool,
    intent: String,
    key: String,
    tag: String,
    at: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    attempts: u8,
    next_at: u64,
    done: bool,
}

/// Everything the hosts and the driver share (one thread: the mutex is never contended).
#[derive(Debug, Default)]
pub struct Shared {
    now_ms: u64,
    timeline: Vec<(u64, String)>,
    violations: Vec<String>,
    effects: Vec<Effect>,
    running: HashMap<String, u32>,
    /// `set_flag` keys: `None` while the first request runs, then its effect number.
    honoured: HashMap<String, Option<u64>>,
    key_actor: HashMap<String, String>,
    issued: HashMap<String, u64>,
    first_tag: HashMap<String, String>,
    delivered: HashMap<String, u64>,
    resolved: HashMap<String, u64>,
    progress: HashMap<u32, Progress>,
    /// When each agent process crashed (process, ms).
    crashes: Vec<(usize, u64)>,
    disks: Vec<Option<Arc<ProcessDisk>>>,
    /// A hold is on, or ended this recently (ms): the network may still carry a request.
    quiet_after: u64,
    holding: bool,
    target_up: bool,
}

impl Shared {
    pub fn note(&mut self, text: String) {
        self.timeline.push((self.now_ms, text));
    }

    fn violation(&mut self, text: String) {
        self.note(format!("VIOLATION: {text}"));
        self.violations.push(text);
    }

    pub fn start_work(&mut self, tool: Tool, key: &str, actor: &str, tag: &str) -> Started {
        if !key.is_empty() {
            self.key_actor
                .entry(key.to_owned())
                .or_insert_with(|| actor.to_owned());
            self.first_tag
                .entry(key.to_owned())
                .or_insert_with(|| tag.to_owned());
        }
        if tool == Tool::SetFlag {
            return match self.honoured.get(key) {
                Some(Some(n)) => Started::Replay(*n),
                Some(None) => Started::Conflict,
                None => {
                    self.honoured.insert(key.to_owned(), None);
                    Started::Run
                }
            };
        }
        let running = self.running.entry(key.to_owned()).or_default();
        *running += 1;
        if *running > 1 && tool != Tool::Read {
            self.violation(format!(
                "two requests of execution {key} ({}) run at the target at once",
                tool.name()
            ));
        }
        Started::Run
    }

    pub fn finish_work(&mut self, tool: Tool, intent: &str, key: &str) -> u64 {
        let n = self.effects.len() as u64 + 1;
        let tag = self.first_tag.get(key).cloned().unwrap_or_default();
        self.effects.push(Effect {
            tool,
            intent: intent.to_owned(),
            key: key.to_owned(),
            tag,
            at: self.now_ms,
        });
        if let Some(running) = self.running.get_mut(key) {
            *running = running.saturating_sub(1);
        }
        if tool == Tool::SetFlag {
            self.honoured.insert(key.to_owned(), Some(n));
        }
        self.note(format!(
            "target: EFFECT #{n} of {} under {key}",
            tool.name()
        ));
        n
    }

    fn applied(&self, key: &str) -> bool {
        self.effects.iter().any(|e| e.key == key)
    }

    fn in_progress(&self, key: &str) -> bool {
        self.running.get(key).is_some_and(|n| *n > 0) || self.honoured.get(key) == Some(&None)
    }

    /// The target crashed: the work it was doing is gone.
    fn target_down(&mut self) {
        self.target_up = false;
        self.running.clear();
        self.honoured.retain(|_, n| n.is_some());
    }
}

/// The status probe of `charge`: asks the target what became of the execution. It answers
/// "not applied" only when nothing can still arrive: no run, no effect, no hold in the
/// network, the target up.
#[derive(Debug)]
struct TargetProbe(Arc<Mutex<Shared>>);

#[async_trait::async_trait]
impl StatusProbe for TargetProbe {
    async fn probe(&self, request: ProbeRequest<'_>) -> ProbeOutcome {
        let shared = self.0.lock().unwrap();
        let key = request.execution.execution_id.to_string();
        let n = shared.effects.iter().position(|e| e.key == key);
        if let Some(n) = n {
            return ProbeOutcome::Applied {
                result: Some(
                    target::tool_result(&Value::Null, &key, n as u64 + 1)["result"].clone(),
                ),
            };
        }
        if shared.in_progress(&key) {
            return ProbeOutcome::InProgress;
        }
        if !shared.target_up || shared.holding || shared.now_ms < shared.quiet_after {
            return ProbeOutcome::Unknown {
                reason: "the target cannot be asked now".into(),
            };
        }
        ProbeOutcome::NotApplied
    }
}

/// A turmoil TCP stream as a hyper-util client connection, with the kernel's user timeout:
/// a connection that carries nothing for [`TCP_TIMEOUT`] fails (simulated TCP never gives
/// up on a partitioned peer; a real one does).
struct Io {
    stream: TokioIo<turmoil::net::TcpStream>,
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
}

const TCP_TIMEOUT: Duration = Duration::from_secs(10);

impl Io {
    fn new(stream: turmoil::net::TcpStream) -> Self {
        Self {
            stream: TokioIo::new(stream),
            idle: Box::pin(tokio::time::sleep(TCP_TIMEOUT)),
        }
    }

    fn progressed(&mut self) {
        self.idle
            .as_mut()
            .reset(tokio::time::Instant::now() + TCP_TIMEOUT);
    }

    /// `polled`, with progress restarting the timeout and a pending one past it failing.
    fn timed<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                self.progressed();
                Poll::Ready(result)
            }
            Poll::Pending if self.idle.as_mut().poll(cx).is_ready() => Poll::Ready(Err(timeout())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Connection for Io {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

use std::{future::Future, pin::Pin, task::Poll};

fn timeout() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "the connection timed out")
}

impl hyper::rt::Read for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        this.timed(cx, polled)
    }
}

impl hyper::rt::Write for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.timed(cx, polled)
    }
    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }
    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Runs the hyper client's connection tasks on the host's `LocalSet`, which drops its tasks
/// in the order they were spawned when the host crashes. On the runtime (hyper-util's
/// `TokioExecutor`) a crash dropped them in an order that followed tokio's task IDs, a
/// counter of the whole process: a single-threaded runtime keeps its tasks in four lists
/// chosen by ID and drops them list by list. Each connection sends its FIN (or RST) as it is
/// dropped, and turmoil draws each message's latency from the schedule's random stream in the
/// order the messages are sent; so which connection's FIN reached the target first, and every
/// later draw, depended on how many tasks the process had made before (on this thread or any
/// other), and one seed gave two timelines in one process.
#[derive(Clone, Copy, Debug)]
struct LocalExecutor;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExecutor {
    fn execute(&self, future: F) {
        tokio::task::spawn_local(future);
    }
}

type Connector = tower::util::BoxCloneSyncService<http::Uri, Io, std::io::Error>;

fn connector() -> Connector {
    tower::util::BoxCloneSyncService::new(tower::service_fn(|_uri: http::Uri| {
        Box::pin(async {
            turmoil::net::TcpStream::connect(("target", target::PORT))
                .await
                .map(Io::new)
        })
    }))
}

fn contracts(plan: &Plan, shared: &Arc<Mutex<Shared>>) -> ContractRegistry {
    let window = Duration::from_millis(plan.link_window_ms);
    let with = |contract: ToolContract, tool: Tool| {
        contract
            .link_window(window)
            .retention(Duration::from_millis(plan.retention_of(tool)))
            .keep_results(plan.keeps_results(tool))
    };
    ContractRegistry::builder()
        .tool(Tool::Read.name(), ToolContract::read_only())
        .tool(
            Tool::SetFlag.name(),
            with(ToolContract::idempotent(), Tool::SetFlag),
        )
        .tool(
            Tool::Charge.name(),
            with(
                ToolContract::recoverable().status_probe(TargetProbe(shared.clone())),
                Tool::Charge,
            ),
        )
        .tool(
            Tool::Deploy.name(),
            with(ToolContract::irreversible(), Tool::Deploy),
        )
        .build()
        .expect("valid contracts")
}

fn actor_name(actor: u8) -> String {
    format!("agent-{}", (b'a' + actor) as char)
}

/// What the agents call through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    /// `GuardLayer` over a hyper client: the system under test.
    Guard,
    /// The hyper client alone: every attempt re-sent as it is (what a generic retry does), to
    /// show that the checks fail when the promise is not kept.
    BlindRetry,
}

struct Env {
    stack: Stack,
    plan: Arc<Plan>,
    shared: Arc<Mutex<Shared>>,
    machine: Arc<Machine>,
    ops: Vec<Arc<AtomicU32>>,
    memory: MemoryLedger,
    /// What the agents' ledgers acknowledged, over every life.
    acked: AckedWrites,
    path: PathBuf,
    key: FingerprintKey,
}

/// One life of agent process `p`: open the ledger (recovering from the last crash), check
/// it, and run the calls of this process that are not finished.
async fn process(env: Arc<Env>, p: usize) -> turmoil::Result {
    let planned = env.plan.entries.iter().find_map(|e| match e {
        Entry::DiskCrash {
            process,
            op,
            phase,
            machine,
            ..
        } if *process == p => Some(PlannedCrash {
            op: *op,
            phase: *phase,
            machine: *machine,
        }),
        _ => None,
    });
    let disk = Arc::new(ProcessDisk::new(
        env.machine.clone(),
        env.ops[p].clone(),
        planned,
    ));
    env.shared.lock().unwrap().disks[p] = Some(disk.clone());
    let ledger: Arc<dyn Ledger> = match env.plan.ledger {
        LedgerKind::Memory => Arc::new(env.memory.clone()),
        LedgerKind::File => {
            let corrupted = env.machine.corrupted.load(Ordering::SeqCst);
            let opened = FileLedger::open_batched_on(&env.path, disk.clone()).and_then(|ledger| {
                ledger.bind_fingerprint_key(&env.key)?;
                Ok(ledger)
            });
            let ledger = match opened {
                Ok(ledger) => ledger,
                Err(error) => {
                    // A damaged acknowledged line must be refused; a crash during the open
                    // (its recovery write) ends this life anyway. Anything else is a bug.
                    let refused = corrupted || disk.dead.load(Ordering::SeqCst);
                    let text = format!("p{p}: the ledger refuses to open: {error}");
                    if refused {
                        env.shared.lock().unwrap().note(text);
                    } else {
                        env.shared.lock().unwrap().violation(text);
                    }
                    std::future::pending::<()>().await;
                    unreachable!()
                }
            };
            // Never a `completed` naming a result that is not there: both are one write.
            let mut lost = Vec::new();
            for record in ledger.list().await.unwrap_or_default() {
                if let Some(reference) = &record.result_reference
                    && !matches!(ledger.load_result(reference).await, Ok(Some(_)))
                {
                    lost.push(record.execution_id.to_string());
                }
            }
            let mut shared = env.shared.lock().unwrap();
            for execution in lost {
                shared.violation(format!(
                    "p{p}: {execution} names a kept result the reopened ledger does not hold"
                ));
            }
            if corrupted {
                shared.violation(format!(
                    "p{p}: the ledger opened over a damaged acknowledged line"
                ));
            }
            let _ = env.machine.track(env.path.clone());
            if let Some(problem) = env.machine.check_acked(&env.path) {
                shared.violation(format!("p{p}: {problem}"));
            }
            if let Err(error) = mcp_replay_guard::ledger::verify_file(&env.path) {
                shared.violation(format!("p{p}: the chain does not verify: {error}"));
            }
            shared.note(format!("p{p}: up"));
            Arc::new(ledger)
        }
    };
    // Every write a ledger acknowledged survives every crash: checked from the oracle's own
    // record of the acknowledgements, for the tools whose executions outlast the schedule.
    let lost = witness::lost(&*ledger, &env.acked, |tool| {
        Tool::from_name(tool).is_some_and(|tool| env.plan.retention_ms(tool).is_none())
    })
    .await;
    {
        let mut shared = env.shared.lock().unwrap();
        for write in lost {
            shared.violation(format!("p{p}: an acknowledged write is gone: {write}"));
        }
    }
    let ledger: Arc<dyn Ledger> = Arc::new(Witness::new(ledger, env.acked.clone()));
    let layer = GuardLayer::new(
        ledger.clone(),
        contracts(&env.plan, &env.shared),
        env.key.clone(),
    )
    .intent_scope(IntentScope::new("run:sim"))
    .attach_timeout(Duration::from_millis(env.plan.attach_ms))
    .drain_timeout(Duration::from_secs(5));
    match env.stack {
        Stack::Guard => {
            let client = Client::builder(LocalExecutor).build::<_, GuardRequestBody>(connector());
            spawn_calls(
                &env,
                p,
                ServiceBuilder::new().layer(layer.clone()).service(client),
            );
        }
        Stack::BlindRetry => spawn_calls(
            &env,
            p,
            Client::builder(LocalExecutor).build::<_, Full<Bytes>>(connector()),
        ),
    }
    if p == 0 {
        for entry in &env.plan.entries {
            if let Entry::Operator { at_ms } = entry {
                let (env, layer, at_ms) = (env.clone(), layer.clone(), *at_ms);
                let ledger = ledger.clone();
                tokio::task::spawn_local(async move { operator(env, layer, ledger, at_ms).await });
            }
        }
    }
    std::future::pending::<()>().await;
    Ok(())
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the calls of process `p` that are not finished.
fn spawn_calls<S, B>(env: &Arc<Env>, p: usize, service: S)
where
    S: tower::Service<Request<Full<Bytes>>, Response = http::Response<B>> + Clone + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + 'static,
    B::Error: Into<BoxError>,
{
    for entry in env.plan.calls() {
        if let Entry::Call { id, process, .. } = entry
            && *process == p
            && !env
                .shared
                .lock()
                .unwrap()
                .progress
                .entry(*id)
                .or_default()
                .done
        {
            let (env, entry, service) = (env.clone(), entry.clone(), service.clone());
            tokio::task::spawn_local(async move { call(env, entry, service).await });
        }
    }
}

/// One caller's logical call: asks until it gets an answer it can act on, or runs out of
/// attempts. The last attempt waits as long as it takes: the guard must answer it.
async fn call<S, B>(env: Arc<Env>, entry: Entry, service: S)
where
    S: tower::Service<Request<Full<Bytes>>, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let Entry::Call {
        id,
        actor,
        tool,
        args,
        at_ms,
        attempts,
        timeout_ms,
        backoff_ms,
        ..
    } = entry
    else {
        return;
    };
    let actor = actor_name(actor);
    loop {
        let (attempt, next_at) = {
            let mut shared = env.shared.lock().unwrap();
            let progress = shared.progress.entry(id).or_default();
            if progress.attempts >= attempts {
                progress.done = true;
                return;
            }
            let attempt = progress.attempts;
            (attempt, progress.next_at.max(at_ms))
        };
        let now = env.shared.lock().unwrap().now_ms;
        if next_at > now {
            tokio::time::sleep(Duration::from_millis(next_at - now)).await;
        }
        let tag = format!("c{id}t{attempt}");
        {
            let mut shared = env.shared.lock().unwrap();
            shared.progress.entry(id).or_default().attempts += 1;
            let now = shared.now_ms;
            shared.issued.insert(tag.clone(), now);
            shared.note(format!("{actor} asks {tag}: {}(x={args})", tool.name()));
        }
        let last = attempt + 1 == attempts;
        let body = json!({"jsonrpc": "2.0", "id": u64::from(id) * 100 + u64::from(attempt),
            "method": "tools/call", "params": {"name": tool.name(), "arguments": {"x": args}}});
        let mut request = Request::post("http://target/mcp")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", env.plan.era.version())
            .header("x-sim-tag", &tag)
            .header("x-sim-actor", &actor)
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        request.extensions_mut().insert(Actor::new(actor.clone()));
        let exchange = async {
            let response = service.clone().oneshot(request).await.map_err(Into::into)?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(Into::into)?
                .to_bytes();
            Ok::<_, BoxError>((status, bytes))
        };
        let answer = if last {
            Some(exchange.await)
        } else {
            tokio::time::timeout(Duration::from_millis(timeout_ms), exchange)
                .await
                .ok()
        };
        let settled = {
            let mut shared = env.shared.lock().unwrap();
            let keeps = env.plan.keeps_results(tool);
            let settled = read_answer(&mut shared, &actor, &tag, keeps, answer);
            let now = shared.now_ms;
            let progress = shared.progress.entry(id).or_default();
            progress.next_at = now + backoff_ms;
            if settled {
                progress.done = true;
            }
            settled
        };
        if settled {
            return;
        }
    }
}

type Answer = Option<Result<(http::StatusCode, Bytes), Box<dyn std::error::Error + Send + Sync>>>;

/// What the caller makes of an answer; `true` when it needs to ask no more. `keeps`: the
/// plan keeps the tool's results.
fn read_answer(shared: &mut Shared, actor: &str, tag: &str, keeps: bool, answer: Answer) -> bool {
    let (status, bytes) = match answer {
        None => {
            shared.note(format!("{actor} {tag}: gave up waiting"));
            return false;
        }
        Some(Err(error)) => {
            shared.note(format!("{actor} {tag}: error: {error}"));
            return false;
        }
        Some(Ok(answer)) => answer,
    };
    let text = String::from_utf8_lossy(&bytes);
    if let Some(at) = text.find("sim-effect:") {
        let key: String = text[at + "sim-effect:".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let owner = shared.key_actor.get(&key).cloned().unwrap_or_default();
        if owner != actor {
            shared.violation(format!(
                "{actor} was handed the result of {key}, an execution of {owner}"
            ));
        }
        let now = shared.now_ms;
        shared.delivered.entry(key.clone()).or_insert(now);
        shared.note(format!("{actor} {tag}: got the result of {key}"));
        return true;
    }
    let message = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .chain(std::iter::once(text.as_ref()))
        .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok());
    let record = message
        .as_ref()
        .and_then(|m| m.pointer(&format!("/result/structuredContent/{STRUCTURED_KEY}")));
    if let Some(record) = record {
        let state = record["state"].as_str().unwrap_or_default().to_owned();
        let execution = record["execution_id"].as_str().unwrap_or_default();
        let owner = record["actor"].as_str().unwrap_or_default();
        if owner != actor {
            shared.violation(format!(
                "{actor} was handed the record of {execution}, an execution of {owner}"
            ));
        }
        let why = record["why_not_resent"].as_str().unwrap_or_default();
        shared.note(format!(
            "{actor} {tag}: the guard answers {state} ({why}) for {execution}"
        ));
        // The target's answer is what completes an execution, and the plan keeps this tool's
        // results: the result was kept with its `completed`, in one write, and must be there.
        // (A resolution, by an operator or a probe, completes without a result.)
        if keeps && state == "completed" && why.contains("not kept") {
            shared.violation(format!(
                "{actor} {tag}: the kept result of {execution} is gone (the guard answers completed, not kept)"
            ));
        }
        return why.contains("not kept") || state == "denied";
    }
    shared.note(format!("{actor} {tag}: status {status}"));
    false
}

/// An operator: resolves every held execution the target shows applied.
async fn operator(env: Arc<Env>, layer: GuardLayer, ledger: Arc<dyn Ledger>, at_ms: u64) {
    let now = env.shared.lock().unwrap().now_ms;
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
    let Ok(records) = ledger.list().await else {
        return;
    };
    for record in records {
        let key = record.execution_id.to_string();
        let held = matches!(
            record.state,
            ExecutionState::NeedsReview | ExecutionState::Unknown
        );
        if held && env.shared.lock().unwrap().applied(&key) {
            let resolved = layer
                .resolve(
                    record.execution_id,
                    true,
                    "sim",
                    "the target shows the effect",
                )
                .await;
            let mut shared = env.shared.lock().unwrap();
            let now = shared.now_ms;
            shared.resolved.entry(key.clone()).or_insert(now);
            shared.note(format!(
                "operator resolves {key} applied: {:?}",
                resolved.map(|r| r.state)
            ));
        }
    }
}

/// What one run found.
pub struct Outcome {
    pub violations: Vec<String>,
    pub timeline: Vec<String>,
    pub effects: usize,
    pub virtual_ms: u64,
}

enum Action {
    Crash(Victim),
    Restart(Victim),
    Partition(usize, bool),
    Hold(usize, bool),
}

fn host_name(victim: Victim) -> Vec<String> {
    match victim {
        Victim::Process(p) => vec![format!("p{p}")],
        Victim::Machine => vec!["p0".into(), "p1".into()],
        Victim::Target => vec!["target".into()],
    }
}

/// Runs `plan` to its end through `stack` and checks it.
pub fn run(plan: &Plan, dir: &std::path::Path, stack: Stack) -> Outcome {
    let plan = Arc::new(plan.clone());
    let shared = Arc::new(Mutex::new(Shared {
        disks: vec![None; plan.processes],
        target_up: true,
        ..Shared::default()
    }));
    let path = dir.join("ledger.jsonl");
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("a scratch directory");
    let mut seed_key = [0u8; 32];
    seed_key[..8].copy_from_slice(&plan.seed.to_le_bytes());
    let env = Arc::new(Env {
        stack,
        plan: plan.clone(),
        shared: shared.clone(),
        machine: Arc::new(Machine::default()),
        ops: (0..plan.processes).map(|_| Arc::default()).collect(),
        memory: MemoryLedger::new(),
        acked: AckedWrites::default(),
        path: path.clone(),
        key: FingerprintKey::from_bytes(&seed_key).expect("a key"),
    });
    NOW_MS.with(|n| n.set(0));
    mcp_replay_guard::simulation::set_clock(sim_clock);
    mcp_replay_guard::simulation::seed_ids(plan.seed);

    let mut sim = turmoil::Builder::new()
        .tick_duration(TICK)
        .simulation_duration(Duration::from_millis(LIMIT_MS + 10_000))
        .rng_seed(plan.seed)
        .build();
    {
        let (shared, plan) = (shared.clone(), plan.clone());
        sim.host("target", move || {
            target::serve(shared.clone(), plan.clone())
        });
    }
    for p in 0..plan.processes {
        let env = env.clone();
        sim.host(format!("p{p}"), move || process(env.clone(), p));
    }

    let mut actions: BTreeMap<u64, Vec<Action>> = BTreeMap::new();
    // An action at `at` and its undoing `lasting` later.
    let mut span = |at: u64, lasting: u64, on: Action, off: Action| {
        actions.entry(at).or_default().push(on);
        actions.entry(at + lasting).or_default().push(off);
    };
    for entry in &plan.entries {
        match *entry {
            Entry::Crash {
                at_ms,
                victim,
                down_ms,
            } => span(
                at_ms,
                down_ms,
                Action::Crash(victim),
                Action::Restart(victim),
            ),
            Entry::Partition {
                process,
                at_ms,
                for_ms,
            } => span(
                at_ms,
                for_ms,
                Action::Partition(process, true),
                Action::Partition(process, false),
            ),
            Entry::Hold {
                process,
                at_ms,
                for_ms,
            } => span(
                at_ms,
                for_ms,
                Action::Hold(process, true),
                Action::Hold(process, false),
            ),
            _ => {}
        }
    }
    let mut down: HashMap<String, bool> = HashMap::new();
    let mut now;
    loop {
        now = sim.elapsed().as_millis() as u64;
        NOW_MS.with(|n| n.set(now));
        shared.lock().unwrap().now_ms = now;
        // The plan's actions that are due.
        let due: Vec<u64> = actions.range(..=now).map(|(at, _)| *at).collect();
        for at in due {
            for action in actions.remove(&at).unwrap_or_default() {
                apply(&mut sim, &env, &mut down, action, now);
            }
        }
        // A crash planned inside a disk operation fired: carry it out.
        let fired: Vec<(usize, PlannedCrash)> = {
            let shared = shared.lock().unwrap();
            shared
                .disks
                .iter()
                .enumerate()
                .filter_map(|(p, d)| Some((p, d.as_ref()?.fired.lock().unwrap().take()?)))
                .collect()
        };
        for (p, planned) in fired {
            let Some(Entry::DiskCrash {
                tear,
                corrupt,
                down_ms,
                ..
            }) = plan
                .entries
                .iter()
                .find(|e| matches!(e, Entry::DiskCrash { process, .. } if *process == p))
                .cloned()
            else {
                continue;
            };
            let victim = if planned.machine {
                Victim::Machine
            } else {
                Victim::Process(p)
            };
            shared.lock().unwrap().note(format!(
                "disk: p{p} crashes {:?} its disk operation {} ({victim:?})",
                planned.phase, planned.op
            ));
            crash(
                &mut sim,
                &env,
                &mut down,
                victim,
                Some((u64::from(tear), corrupt)),
            );
            actions
                .entry(now + down_ms)
                .or_default()
                .push(Action::Restart(victim));
        }
        let all_done = {
            let shared = shared.lock().unwrap();
            plan.calls().all(|e| match e {
                Entry::Call { id, .. } => shared.progress.get(id).is_some_and(|p| p.done),
                _ => true,
            })
        };
        if all_done && actions.is_empty() {
            break;
        }
        if now > LIMIT_MS {
            let mut shared = shared.lock().unwrap();
            let open: Vec<u32> = plan
                .calls()
                .filter_map(|e| match e {
                    Entry::Call { id, .. } if !shared.progress.get(id).is_some_and(|p| p.done) => {
                        Some(*id)
                    }
                    _ => None,
                })
                .collect();
            // A process whose ledger refuses to open (a damaged acknowledged line) serves no
            // call; that is the refusal it owes, not a hang.
            if !env.machine.corrupted.load(Ordering::SeqCst) {
                shared.violation(format!("calls never answered: {open:?}"));
            }
            break;
        }
        if let Err(error) = sim.step() {
            shared
                .lock()
                .unwrap()
                .violation(format!("a host failed: {error}"));
            break;
        }
    }
    drop(sim);
    mcp_replay_guard::simulation::clear_clock();
    let mut shared = Arc::try_unwrap(shared)
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_else(|shared| std::mem::take(&mut *shared.lock().unwrap()));
    shared.now_ms = now;
    for problem in env.machine.violations.lock().unwrap().drain(..) {
        shared.violation(problem);
    }
    let records = end_records(&plan, &env);
    check_effects(&plan, &mut shared, &records);
    if plan.ledger == LedgerKind::Memory {
        // An unsettled execution may be kept past its retention while its owner (this
        // process, for the memory ledger) lives; nothing else may.
        let unsettled = records
            .values()
            .filter(|(record, _)| record.state.is_unsettled())
            .count();
        env.memory
            .purge_expired(ts(now).saturating_add(RETENTION + Duration::from_secs(1)));
        if env.memory.len() > unsettled {
            shared.violation(format!(
                "{} records outlive their retention ({unsettled} of them unsettled)",
                env.memory.len()
            ));
        }
    }
    let _ = std::fs::remove_dir_all(dir);
    let timeline = readable(&shared.timeline);
    Outcome {
        effects: shared.effects.len(),
        // As the timeline names them (E1, E2, …).
        violations: timeline
            .iter()
            .filter(|line| line.contains("VIOLATION: "))
            .cloned()
            .collect(),
        timeline,
        virtual_ms: now,
    }
}

fn apply(
    sim: &mut turmoil::Sim<'_>,
    env: &Arc<Env>,
    down: &mut HashMap<String, bool>,
    action: Action,
    now: u64,
) {
    match action {
        Action::Crash(victim) => crash(sim, env, down, victim, None),
        Action::Restart(victim) => {
            for host in host_name(victim) {
                if host.starts_with('p')
                    && host[1..].parse::<usize>().unwrap_or(9) >= env.plan.processes
                {
                    continue;
                }
                if down.remove(&host).is_some() {
                    env.shared.lock().unwrap().note(format!("{host}: restarts"));
                    if host == "target" {
                        env.shared.lock().unwrap().target_up = true;
                    }
                    sim.bounce(host.as_str());
                }
            }
        }
        Action::Partition(p, on) => {
            let host = format!("p{p}");
            env.shared
                .lock()
                .unwrap()
                .note(format!("network: {host} partitioned from the target: {on}"));
            if on {
                sim.partition(host.as_str(), "target");
            } else {
                sim.repair(host.as_str(), "target");
            }
        }
        Action::Hold(p, on) => {
            let host = format!("p{p}");
            let mut shared = env.shared.lock().unwrap();
            shared.note(format!("network: {host} held: {on}"));
            shared.holding = on;
            shared.quiet_after = now + 1_000;
            drop(shared);
            if on {
                sim.hold(host.as_str(), "target");
            } else {
                sim.release(host.as_str(), "target");
            }
        }
    }
}

fn crash(
    sim: &mut turmoil::Sim<'_>,
    env: &Arc<Env>,
    down: &mut HashMap<String, bool>,
    victim: Victim,
    power: Option<(u64, bool)>,
) {
    let mut crashed = false;
    for host in host_name(victim) {
        let p = host.strip_prefix('p').and_then(|p| p.parse::<usize>().ok());
        if p.is_some_and(|p| p >= env.plan.processes) || down.contains_key(&host) {
            continue;
        }
        // Nothing the dying process does from here reaches the disk: a SIGKILL runs no
        // destructor.
        if let Some(p) = p {
            let mut shared = env.shared.lock().unwrap();
            let now = shared.now_ms;
            shared.crashes.push((p, now));
            if let Some(disk) = &shared.disks[p] {
                disk.dead.store(true, Ordering::SeqCst);
            }
        }
        if host == "target" {
            env.shared.lock().unwrap().target_down();
        }
        env.shared.lock().unwrap().note(format!("{host}: CRASH"));
        sim.crash(host.as_str());
        down.insert(host, true);
        crashed = true;
    }
    if victim == Victim::Machine && (crashed || power.is_some()) {
        let (tear, corrupt) = power.unwrap_or((0, false));
        let told = env
            .machine
            .power_loss(tear, corrupt)
            .unwrap_or_else(|e| e.to_string());
        env.shared
            .lock()
            .unwrap()
            .note(format!("machine: power loss: {told}"));
    }
}

/// The ledger's records at the end (read without writing), keyed by execution id.
fn end_records(plan: &Plan, env: &Env) -> HashMap<String, (ExecutionRecord, Vec<LedgerEvent>)> {
    env.machine.repair_damage();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let ledger: Box<dyn Ledger> = match plan.ledger {
            LedgerKind::Memory => Box::new(env.memory.clone()),
            LedgerKind::File => match FileLedger::open_read_only(&env.path) {
                Ok(ledger) => Box::new(ledger),
                Err(_) => return HashMap::new(),
            },
        };
        let mut records = HashMap::new();
        for record in ledger.list().await.unwrap_or_default() {
            let events = ledger.events(record.execution_id).await.unwrap_or_default();
            records.insert(record.execution_id.to_string(), (record, events));
        }
        records
    })
}

/// The promise: two effects of one intent only when one of them was settled before the
/// other was asked for (delivered to a caller, resolved by an operator or a probe, or
/// settled and past its link window), and never twice under one key.
fn check_effects(
    plan: &Plan,
    shared: &mut Shared,
    records: &HashMap<String, (ExecutionRecord, Vec<LedgerEvent>)>,
) {
    let effects = shared.effects.clone();
    for (i, second) in effects.iter().enumerate() {
        if second.tool == Tool::Read {
            continue;
        }
        for first in &effects[..i] {
            if first.intent != second.intent {
                continue;
            }
            if first.key == second.key {
                shared.violation(format!(
                    "{} ran twice under one key {} (effects at {} and {} ms)",
                    second.tool.name(),
                    second.key,
                    first.at,
                    second.at
                ));
                continue;
            }
            let asked = |effect: &Effect| shared.issued.get(&effect.tag).copied().unwrap_or(0);
            let (a, b) = (asked(first), asked(second));
            let settled = |effect: &Effect| settled_at(plan, shared, records, effect);
            let ok =
                settled(first).is_some_and(|s| s <= b) || settled(second).is_some_and(|s| s <= a);
            if !ok {
                shared.violation(format!(
                    "a second effect of {}: {} (asked at {a} ms by {}) and {} (asked at {b} ms by {}), neither settled before the other was asked for",
                    second.intent, first.key, first.tag, second.key, second.tag
                ));
            }
        }
    }
}

/// The earliest time the execution of `effect` may stop standing in the way of a new one,
/// computed from the plan and the ground truth, never from a deadline the ledger derived
/// (`link_until`, `retain_until`): the oracle must not take the system's word for its own
/// clocks.
///
/// - Delivered to a caller, or resolved as applied by the operator: from then on.
/// - Completed or resolved as applied in the ledger (the event, not a state a record could
///   be given by a bug): from that event, and not before its acceptance plus the link window
///   the plan configured. The window counts from acceptance (as the contract says), so
///   acceptance plus window is the earliest a correct guard starts a new execution; counting
///   it from the completion instead would be later and would flag correct schedules.
/// - Failed, unknown, not sent, needs review: never by their state; only by retention.
/// - Retention, from the plan's retention for the tool and the target's own record of the
///   run. A correct guard keeps an unsettled execution while its owner lives and, once it is
///   settled or its owner is gone, counts retention from its last event. While the owner
///   lives, the last event about a run that ended at `t_end` (the effect's time at the
///   target) comes at or after `t_end` (the answer or the failure that records its outcome
///   cannot precede the end of the work it reports; an earlier `unknown` leaves it unsettled,
///   and so kept), so it may be forgotten no earlier than `t_end + retention`. If the owner
///   process crashed at any time after the run was asked for, the last event is at least the
///   `dispatched` of the request that reached the target, written after that attempt was
///   asked (and synced before it was sent), so no earlier than `asked + retention`. Both are
///   lower bounds of the moment a correct guard may forget; the oracle uses the weaker one
///   whenever a crash could have made it apply, so no correct schedule is flagged.
fn settled_at(
    plan: &Plan,
    shared: &Shared,
    records: &HashMap<String, (ExecutionRecord, Vec<LedgerEvent>)>,
    effect: &Effect,
) -> Option<u64> {
    let key = effect.key.as_str();
    let to_ms = |t: Timestamp| t.as_millis().saturating_sub(EPOCH_MS);
    let mut candidates = vec![];
    candidates.extend(shared.delivered.get(key).copied());
    candidates.extend(shared.resolved.get(key).copied());
    if let Some((_, events)) = records.get(key) {
        let accepted = events.iter().find_map(|e| match &e.kind {
            EventKind::Accepted { .. } => Some(to_ms(e.at)),
            _ => None,
        });
        let settled = events.iter().find_map(|e| match &e.kind {
            EventKind::Completed { .. } => Some(to_ms(e.at)),
            EventKind::Resolved { applied: true, .. } => Some(to_ms(e.at)),
            _ => None,
        });
        if let (Some(settled), Some(accepted)) = (settled, accepted) {
            candidates.push(settled.max(accepted + plan.link_window_ms + 1));
        }
    }
    // The request that first reached the target under this key, and who asked it.
    let asked = shared.issued.get(&effect.tag).copied().unwrap_or(0);
    let owner = match target::parse_tag(&effect.tag) {
        (Some(call), _) => plan.calls().find_map(|e| match e {
            Entry::Call { id, process, .. } if *id == call => Some(*process),
            _ => None,
        }),
        (None, _) => None,
    };
    let owner_crashed = owner.is_none_or(|owner| {
        shared
            .crashes
            .iter()
            .any(|(p, at)| *p == owner && *at >= asked)
    });
    let retained_from = if owner_crashed { asked } else { effect.at };
    candidates.push(retained_from + plan.retention_of(effect.tool) + 1);
    candidates.into_iter().min()
}

/// The timeline with execution ids named E1, E2, … in order of appearance.
fn readable(timeline: &[(u64, String)]) -> Vec<String> {
    let mut names: HashMap<String, String> = HashMap::new();
    timeline
        .iter()
        .map(|(at, text)| {
            let mut out = String::new();
            let mut rest = text.as_str();
            while let Some(i) = rest.find("act_") {
                out.push_str(&rest[..i]);
                let id: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let next = names.len() + 1;
                out.push_str(
                    names
                        .entry(id.clone())
                        .or_insert_with(|| format!("E{next}")),
                );
                rest = &rest[i + id.len()..];
            }
            out.push_str(rest);
            format!("{:>7.3}s {out}", *at as f64 / 1000.0)
        })
        .collect()
}
