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
    credentials::{ANONYMOUS, CredentialActors},
    execution::{EventKind, ExecutionRecord, ExecutionState, LedgerEvent, Timestamp},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody, STRUCTURED_KEY},
    integrations::server::IdempotencyLayer,
    ledger::{FileLedger, Ledger, LedgerError, MemoryLedger},
};
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};

use crate::{
    disk::{Machine, PlannedCrash, ProcessDisk},
    plan::{Carrier, DEFAULT_RETENTION_MS, Entry, LedgerKind, Plan, Tool, Victim},
    proxy::{self, Caller, ProxyClients},
    stdio::StdioClient,
    target::{self, Started},
    witness::{self, Acked, AckedWrites, Witness},
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
    /// How far the agents' machine clock was stepped, in all (ms).
    static STEPPED_MS: Cell<i64> = const { Cell::new(0) };
    /// How far the target machine's clock is from the simulated time (its skew and its own
    /// steps, ms).
    static TARGET_OFFSET_MS: Cell<i64> = const { Cell::new(0) };
    /// The runtime of the target's life now.
    static TARGET_RUNTIME: Cell<Option<tokio::runtime::Id>> = const { Cell::new(None) };
}

/// The agents' machine clock: simulated time, and the steps the plan gave it.
fn sim_clock() -> Timestamp {
    let now = i64::try_from(EPOCH_MS + NOW_MS.with(Cell::get)).unwrap_or(i64::MAX);
    // The target machine has a clock of its own: told apart by the runtime reading it (each
    // simulated host runs its own).
    let on_target = tokio::runtime::Handle::try_current()
        .is_ok_and(|runtime| TARGET_RUNTIME.with(Cell::get) == Some(runtime.id()));
    let offset = if on_target {
        TARGET_OFFSET_MS.with(Cell::get)
    } else {
        STEPPED_MS.with(Cell::get)
    };
    Timestamp::from_millis(u64::try_from(now + offset).unwrap_or(0))
}

/// Simulated time (ms since the start of the run), the oracle's clock: it never steps.
pub fn now_ms() -> u64 {
    NOW_MS.with(Cell::get)
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
    /// When each intent (as the target names it) was first asked for, by any attempt.
    intent_first_asked: HashMap<String, u64>,
    first_tag: HashMap<String, String>,
    delivered: HashMap<String, u64>,
    resolved: HashMap<String, u64>,
    /// Executions an operator settled as not applied (once their owner was gone), and when:
    /// from then on a new execution of the intent is the operator's call, whenever its caller
    /// asked.
    resolved_not_applied: HashMap<String, u64>,
    /// The last request of each execution that reached the target (its tag).
    last_tag: HashMap<String, String>,
    /// Attempts whose caller still waits for the guard's answer.
    pending: std::collections::HashSet<String>,
    /// The steps of the agents' machine clock as they were carried out (ms, by ms).
    steps: Vec<(u64, i64)>,
    progress: HashMap<u32, Progress>,
    /// When each agent process crashed (process, ms).
    crashes: Vec<(usize, u64)>,
    disks: Vec<Option<Arc<ProcessDisk>>>,
    /// A hold is on, or ended this recently (ms): the network may still carry a request.
    quiet_after: u64,
    holding: bool,
    target_up: bool,
    /// The planned kills between a relay's write of an answer and the client's read of it
    /// (process, which answer), until they fire.
    answer_crashes: Vec<(usize, u32)>,
    /// How many answers each process's relays handed to its callers, over its lives.
    answers_written: HashMap<usize, u32>,
    /// A process to kill before the next step: an answer was just written to it.
    dies_after_answer: Option<usize>,
    /// Per proxy connection (by its caller's address): how many bytes the caller's end has
    /// read, which is what its TCP acknowledgements would say it took.
    read_by_clients: HashMap<std::net::SocketAddr, u64>,
    /// The plan's hosts cancel what their callers gave up on (stdio).
    stdio_cancels: bool,
}

impl Shared {
    pub fn note(&mut self, text: String) {
        self.timeline.push((self.now_ms, text));
    }

    /// Process `p`'s relay handed an answer to its caller; `true` when the plan kills the
    /// process right there, before the caller reads it.
    pub fn answer_written(&mut self, p: usize) -> bool {
        let written = self.answers_written.entry(p).or_default();
        *written += 1;
        let written = *written;
        let Some(at) = self
            .answer_crashes
            .iter()
            .position(|&(process, answer)| process == p && answer == written)
        else {
            return false;
        };
        self.answer_crashes.remove(at);
        self.dies_after_answer = Some(p);
        self.note(format!(
            "p{p}: answer {written} is written to the client; the process dies before it is read"
        ));
        true
    }

    /// The caller's end of proxy connection `client` read `bytes` more of it.
    pub fn client_read(&mut self, client: std::net::SocketAddr, bytes: u64) {
        *self.read_by_clients.entry(client).or_default() += bytes;
    }

    /// How much of proxy connection `client` its caller's end has read.
    pub fn read_by_client(&self, client: std::net::SocketAddr) -> u64 {
        self.read_by_clients.get(&client).copied().unwrap_or(0)
    }

    /// Whether a stdio host cancels what its callers gave up on.
    pub fn stdio_cancels(&self) -> bool {
        self.stdio_cancels
    }

    /// The head of attempt `tag`'s request reached the proxy: through the proxy, that is
    /// when it was asked of the guard.
    pub fn arrived(&mut self, tag: &str) {
        if let Some(asked) = self.issued.get_mut(tag) {
            *asked = self.now_ms;
        }
    }

    fn violation(&mut self, text: String) {
        self.note(format!("VIOLATION: {text}"));
        self.violations.push(text);
    }

    /// `honours`: the target honours `set_flag`'s key itself (no server half in front).
    pub fn start_work(
        &mut self,
        tool: Tool,
        key: &str,
        actor: &str,
        tag: &str,
        honours: bool,
    ) -> Started {
        if !key.is_empty() {
            self.key_actor
                .entry(key.to_owned())
                .or_insert_with(|| actor.to_owned());
            self.first_tag
                .entry(key.to_owned())
                .or_insert_with(|| tag.to_owned());
            self.last_tag.insert(key.to_owned(), tag.to_owned());
        }
        if tool == Tool::SetFlag && honours {
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
        if tool == Tool::SetFlag && self.honoured.contains_key(key) {
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
/// network, no agent process crashed within the last second (what it sent just before may
/// still be on its way), the target up.
#[derive(Debug)]
struct TargetProbe(Arc<Mutex<Shared>>);

#[async_trait::async_trait]
impl StatusProbe for TargetProbe {
    async fn probe(&self, request: ProbeRequest<'_>) -> ProbeOutcome {
        let shared = self.0.lock().unwrap();
        let key = request.execution.execution_id().to_string();
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
pub struct Io<S = turmoil::net::TcpStream> {
    stream: TokioIo<S>,
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
}

const TCP_TIMEOUT: Duration = Duration::from_secs(10);

impl<S> Io<S> {
    pub fn new(stream: S) -> Self {
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

impl<S> Connection for Io<S> {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

use std::{future::Future, pin::Pin, task::Poll};

fn timeout() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "the connection timed out")
}

impl<S: tokio::io::AsyncRead + Unpin> hyper::rt::Read for Io<S> {
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

impl<S: tokio::io::AsyncWrite + Unpin> hyper::rt::Write for Io<S> {
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
pub struct LocalExecutor;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExecutor {
    fn execute(&self, future: F) {
        tokio::task::spawn_local(future);
    }
}

pub type Connector = tower::util::BoxCloneSyncService<http::Uri, Io, std::io::Error>;

/// Connects to the target.
pub fn connector() -> Connector {
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

/// What every credential of the simulation begins with: none may reach the ledger.
const SECRET: &str = "secret-";

/// The actor of every call in a stdio plan: the one principal of a stdio client, which
/// carries no credential (it has no headers).
const STDIO_ACTOR: u8 = 0;

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
            drawn: true,
        }),
        _ => None,
    });
    let disk = Arc::new(ProcessDisk::new(
        env.machine.clone(),
        env.ops[p].clone(),
        planned,
    ));
    env.shared.lock().unwrap().disks[p] = Some(disk.clone());
    let mut compactor = None;
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
                if let Some(reference) = &record.result_reference()
                    && !matches!(ledger.load_result(reference).await, Ok(Some(_)))
                {
                    lost.push(record.execution_id().to_string());
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
            if let Some(problem) = env.machine.check_acked(&env.path) {
                shared.violation(format!("p{p}: {problem}"));
            }
            if let Err(error) = mcp_replay_guard::ledger::verify_file(&env.path) {
                shared.violation(format!("p{p}: the chain does not verify: {error}"));
            }
            shared.note(format!("p{p}: up"));
            let ledger = Arc::new(ledger);
            compactor = Some(ledger.clone());
            ledger
        }
    };
    // Every write a ledger acknowledged survives every crash: checked from the oracle's own
    // record of the acknowledgements, for the tools whose executions outlast the schedule.
    witness::held_after_crash(&*ledger, &env.acked).await;
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
    let synced_on =
        (env.plan.ledger == LedgerKind::File).then(|| (env.machine.clone(), env.path.clone()));
    let ledger: Arc<dyn Ledger> = Arc::new(Witness::new(ledger, env.acked.clone(), synced_on));
    let layer = GuardLayer::new(
        ledger.clone(),
        contracts(&env.plan, &env.shared),
        env.key.clone(),
    )
    .intent_scope(IntentScope::new("run:sim"))
    .attach_timeout(Duration::from_millis(env.plan.attach_ms))
    .drain_timeout(Duration::from_secs(5));
    // A stdio client is one principal, and has no headers for the execution's key.
    let layer = if env.plan.stdio {
        layer
            .actor(Actor::new(actor_name(STDIO_ACTOR)))
            .execution_id_in_meta(true)
    } else {
        layer
    };
    match env.stack {
        Stack::Guard if env.plan.proxy => {
            let (layer, key) = (layer.clone(), env.key.clone());
            tokio::task::spawn_local(proxy::serve(p, layer, key, env.shared.clone()));
            spawn_calls(&env, p, ProxyClients::new(p, env.shared.clone()));
        }
        Stack::Guard if env.plan.stdio => spawn_calls(
            &env,
            p,
            StdioClient::new(env.shared.clone(), p, layer.clone()),
        ),
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
    for entry in &env.plan.entries {
        match *entry {
            Entry::Operator { at_ms } if p == 0 => {
                let (env, layer, ledger) = (env.clone(), layer.clone(), ledger.clone());
                tokio::task::spawn_local(async move { operator(env, layer, ledger, at_ms).await });
            }
            Entry::Resolver { at_ms } if p == 0 => {
                let (env, layer, ledger) = (env.clone(), layer.clone(), ledger.clone());
                tokio::task::spawn_local(async move { resolver(env, layer, ledger, at_ms).await });
            }
            Entry::Compact {
                process,
                at_ms,
                killed,
            } if process == p => {
                if let Some(file) = compactor.clone() {
                    let (env, disk) = (env.clone(), disk.clone());
                    tokio::task::spawn_local(async move {
                        compact(env, file, p, at_ms, killed.then_some(disk)).await
                    });
                }
            }
            _ => {}
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
        carrier,
        ..
    } = entry
    else {
        return;
    };
    let (actor, carrier) = if env.plan.stdio {
        (STDIO_ACTOR, None)
    } else {
        (actor, carrier)
    };
    let (number, name) = (actor, actor_name(actor));
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
        // Who asks: an actor that names itself, or one read from the credential it carries
        // now (a refreshed credential is another actor, and the oracle's principal).
        let now = env.shared.lock().unwrap().now_ms;
        let credential = carrier.map(|carrier| {
            let generation = env.plan.credential_generation(number, now);
            (carrier, format!("{SECRET}{name}-{generation}"))
        });
        let actor = match &credential {
            // A credential is where it is carried and its value: a server may read a cookie
            // and an API key of the same bytes as two principals.
            Some((carrier, secret)) => {
                format!("{name}.{}.{carrier:?}", &secret[secret.len() - 1..])
            }
            // The proxy tells its clients apart by their credentials only: every caller that
            // sends none is one principal.
            None if env.plan.proxy => ANONYMOUS.to_owned(),
            None => name.clone(),
        };
        {
            let mut shared = env.shared.lock().unwrap();
            shared.progress.entry(id).or_default().attempts += 1;
            shared.issued.insert(tag.clone(), now);
            let intent = format!("{actor}/{}/{}", tool.name(), json!({"x": args}));
            shared.intent_first_asked.entry(intent).or_insert(now);
            shared.pending.insert(tag.clone());
            shared.note(format!("{actor} asks {tag}: {}(x={args})", tool.name()));
        }
        let last = attempt + 1 == attempts;
        let body = json!({"jsonrpc": "2.0", "id": u64::from(id) * 100 + u64::from(attempt),
            "method": "tools/call", "params": {"name": tool.name(), "arguments": {"x": args}}});
        let uri = match &credential {
            Some((Carrier::Query, secret)) => format!("http://target/mcp?access_token={secret}"),
            _ => "http://target/mcp".to_owned(),
        };
        let mut request = Request::post(uri)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", env.plan.era.version())
            .header("x-sim-tag", &tag)
            .header("x-sim-actor", &actor)
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a valid request");
        let expected = match &credential {
            None if env.plan.proxy => Actor::new(ANONYMOUS),
            None => Actor::new(actor.clone()),
            Some((carrier, secret)) => {
                let (name, value) = match carrier {
                    Carrier::Authorization => ("authorization", format!("Bearer {secret}")),
                    Carrier::ApiKey => ("x-api-key", secret.clone()),
                    Carrier::Cookie => ("cookie", format!("session={secret}")),
                    Carrier::Query => ("x-sim-carrier", "query".to_owned()),
                };
                request.headers_mut().insert(
                    http::HeaderName::from_static(name),
                    http::HeaderValue::from_str(&value).expect("a header value"),
                );
                CredentialActors::new(&env.key).actor(request.headers(), request.uri())
            }
        };
        request.extensions_mut().insert(expected.clone());
        if env.plan.half_closes(id, attempt) {
            request.extensions_mut().insert(Caller::HalfCloses);
        } else if env.plan.proxy && env.plan.unread(id, attempt) {
            request.extensions_mut().insert(Caller::DropsUnread);
        }
        // Over stdio the client reads every line of the child's stdout: an answer handed to a
        // call was read (the host that dies before reading is the planned crash after an
        // answer instead).
        let unread = !env.plan.stdio && env.plan.unread(id, attempt);
        let exchange = async {
            let response = service.clone().oneshot(request).await.map_err(Into::into)?;
            if unread {
                // The answer's head came; its body is dropped unread.
                drop(response);
                return Err::<(http::StatusCode, Bytes), BoxError>(
                    "dropped the answer unread".into(),
                );
            }
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
            shared.pending.remove(&tag);
            let keeps = env.plan.keeps_results(tool);
            let settled = read_answer(
                &mut shared,
                (&actor, expected.as_str()),
                &tag,
                keeps,
                answer,
            );
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
/// `who`: the caller's principal as the oracle names it, and the actor the guard was given.
fn read_answer(
    shared: &mut Shared,
    who: (&str, &str),
    tag: &str,
    keeps: bool,
    answer: Answer,
) -> bool {
    let (actor, given) = who;
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
        // The principal that started it, as the target saw it (when it reached the target).
        let started_by = shared.key_actor.get(execution).cloned();
        if owner != given || started_by.as_ref().is_some_and(|by| by != actor) {
            shared.violation(format!(
                "{actor} was handed the record of {execution}, an execution of {}",
                started_by.unwrap_or_else(|| owner.to_owned())
            ));
        }
        let why = record["why_not_resent"].as_str().unwrap_or_default();
        // An answer that the effect happened (its result not kept) hands the outcome to this
        // caller: the execution is delivered, as with its result.
        if matches!(state.as_str(), "completed" | "resolved_applied") {
            let now = shared.now_ms;
            shared.delivered.entry(execution.to_owned()).or_insert(now);
        }
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
    match message
        .as_ref()
        .and_then(|m| m.pointer("/error/code"))
        .and_then(Value::as_i64)
    {
        // A JSON-RPC error (over stdio, every failure is one).
        Some(code) => shared.note(format!(
            "{actor} {tag}: status {status}, JSON-RPC error {code}"
        )),
        None => shared.note(format!("{actor} {tag}: status {status}")),
    }
    false
}

/// Waits until `at_ms`; `false` when this life started after it (what was planned for then
/// happened to a process that was down, so not at all).
async fn until(env: &Env, at_ms: u64) -> bool {
    let now = env.shared.lock().unwrap().now_ms;
    if at_ms < now {
        return false;
    }
    tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    true
}

/// Process `p` compacts the file ledger while the others go on appending; with `killed`, the
/// process dies at the compaction's directory sync.
async fn compact(
    env: Arc<Env>,
    ledger: Arc<FileLedger>,
    p: usize,
    at_ms: u64,
    killed: Option<Arc<ProcessDisk>>,
) {
    if !until(&env, at_ms).await {
        return;
    }
    if let Some(disk) = killed {
        disk.die_at_dir_sync.store(true, Ordering::SeqCst);
    }
    let compacted = ledger.compact(Timestamp::now()).await;
    env.shared.lock().unwrap().note(format!(
        "p{p}: compacts the ledger: {:?}",
        compacted.map(|report| report.kept_executions)
    ));
}

/// An operator who, for eight seconds from `at_ms`, settles as not applied every execution
/// the target is still running (each once). The guard must refuse while the process that
/// sent it lives and its caller still waits for the answer; once that process is gone, the
/// operator's word settles it.
async fn resolver(env: Arc<Env>, layer: GuardLayer, ledger: Arc<dyn Ledger>, at_ms: u64) {
    if !until(&env, at_ms).await {
        return;
    }
    let mut tried = std::collections::HashSet::new();
    for _ in 0..32 {
        for record in ledger.list().await.unwrap_or_default() {
            let id = record.execution_id();
            if !tried.contains(&id) && settle_as_not_applied(&env, &layer, record).await {
                tried.insert(id);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The resolver's look at one execution: if the target is running it, tries to settle it
/// (`true`).
async fn settle_as_not_applied(env: &Env, layer: &GuardLayer, record: ExecutionRecord) -> bool {
    let key = record.execution_id().to_string();
    let owner = {
        let shared = env.shared.lock().unwrap();
        if !shared.in_progress(&key) {
            return false;
        }
        shared.last_tag.get(&key).cloned().and_then(|tag| {
            let call = target::parse_tag(&tag).0?;
            let process = env.plan.calls().find_map(|e| match e {
                Entry::Call { id, process, .. } if *id == call => Some(*process),
                _ => None,
            })?;
            let asked = shared.issued.get(&tag).copied().unwrap_or(0);
            let alive = shared.pending.contains(&tag)
                && !shared
                    .crashes
                    .iter()
                    .any(|(c, at)| *c == process && *at >= asked);
            alive.then_some(process)
        })
    };
    let asked = env.shared.lock().unwrap().now_ms;
    let resolved = layer
        .handle()
        .resolve(
            record.execution_id(),
            false,
            "sim",
            "the target shows nothing yet",
        )
        .await;
    // The owner's attempt had ended before the operator asked (its end was written, and the
    // ledger acknowledged it) although its caller had not read the answer yet: nothing the
    // owner runs stands in the way then (the target may still run the tool, as after any
    // unknown outcome; that is the operator's call).
    let owner = owner.filter(|_| !attempt_ended(&env.acked.lock().unwrap(), &key, asked));
    let mut shared = env.shared.lock().unwrap();
    shared.note(format!(
        "operator resolves {key}, still running, as not applied: {:?}",
        resolved.as_ref().map(|r| r.state())
    ));
    // A resolution whose write failed may still have been recorded (a crash after its sync):
    // it counts as the operator's word, as one that succeeded does. Over a live owner, only
    // a success is certain to have passed the guard's refusal (a failed read fails too).
    match (resolved, owner) {
        (Ok(_), Some(owner)) => shared.violation(format!(
            "an operator settled {key} while p{owner}, alive, still runs it"
        )),
        (Err(LedgerError::StillRunning { .. }), _) | (Err(_), Some(_)) => {}
        (_, None) => {
            let now = shared.now_ms;
            shared.resolved_not_applied.entry(key).or_insert(now);
        }
    }
    true
}

/// Whether the latest attempt of execution `key` had ended by `at_ms`, by the oracle's record of
/// what the ledger acknowledged: the last event of the attempt's life asked for by then ends it
/// (an outcome), rather than starts or continues it.
fn attempt_ended(acked: &[Acked], key: &str, at_ms: u64) -> bool {
    const RUNNING: [&str; 3] = ["accepted", "authorized", "dispatched"];
    const ENDED: [&str; 5] = ["unknown", "completed", "failed", "not_sent", "needs_review"];
    acked
        .iter()
        .filter(|w| w.acknowledged && w.asked_ms <= at_ms && w.execution_id.to_string() == key)
        .filter(|w| RUNNING.contains(&w.event) || ENDED.contains(&w.event))
        .max_by_key(|w| w.asked_ms)
        .is_some_and(|w| ENDED.contains(&w.event))
}

/// An operator: resolves every held execution the target shows applied.
async fn operator(env: Arc<Env>, layer: GuardLayer, ledger: Arc<dyn Ledger>, at_ms: u64) {
    // An operator who comes while the process is down comes once it is up again.
    let now = env.shared.lock().unwrap().now_ms;
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
    let Ok(records) = ledger.list().await else {
        return;
    };
    for record in records {
        let key = record.execution_id().to_string();
        let held = matches!(
            record.state(),
            ExecutionState::NeedsReview | ExecutionState::Unknown
        );
        if held && env.shared.lock().unwrap().applied(&key) {
            let resolved = layer
                .handle()
                .resolve(
                    record.execution_id(),
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
                resolved.map(|r| r.state())
            ));
        }
    }
}

/// Every file under `dir`, in its subdirectories too.
fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for path in entries.flatten().map(|entry| entry.path()) {
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files.sort();
    files
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
    ClockStep(i64),
    TargetClockStep(i64),
}

fn host_name(victim: Victim, processes: usize) -> Vec<String> {
    match victim {
        Victim::Process(p) => vec![format!("p{p}")],
        Victim::Machine => (0..processes).map(|p| format!("p{p}")).collect(),
        Victim::Target => vec!["target".into()],
    }
}

/// Runs `plan` to its end through `stack` and checks it.
pub fn run(plan: &Plan, dir: &std::path::Path, stack: Stack) -> Outcome {
    let plan = Arc::new(plan.clone());
    let shared = Arc::new(Mutex::new(Shared {
        disks: vec![None; plan.processes],
        target_up: true,
        stdio_cancels: plan.stdio_cancels,
        answer_crashes: plan
            .entries
            .iter()
            .filter_map(|e| match *e {
                Entry::CrashAfterAnswer {
                    process, answer, ..
                } if plan.stdio => Some((process, answer)),
                _ => None,
            })
            .collect(),
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
    STEPPED_MS.with(|n| n.set(0));
    TARGET_OFFSET_MS.with(|n| n.set(plan.target_skew_ms));
    TARGET_RUNTIME.with(|r| r.set(None));
    mcp_replay_guard::simulation::set_clock(sim_clock);
    mcp_replay_guard::simulation::seed_ids(plan.seed);

    let mut sim = turmoil::Builder::new()
        .tick_duration(TICK)
        .simulation_duration(Duration::from_millis(LIMIT_MS + 10_000))
        .rng_seed(plan.seed)
        .build();
    {
        let (shared, plan) = (shared.clone(), plan.clone());
        // The server half's ledger is the target's database: it outlives the target's crashes.
        let keys = plan.server_half.then(|| {
            IdempotencyLayer::new(
                MemoryLedger::new(),
                FingerprintKey::from_bytes(&[9; 32]).expect("a key"),
            )
        });
        sim.host("target", move || {
            let (shared, plan, keys) = (shared.clone(), plan.clone(), keys.clone());
            async move {
                let runtime = tokio::runtime::Handle::current().id();
                TARGET_RUNTIME.with(|r| r.set(Some(runtime)));
                if plan.stdio {
                    let lines = target::serve_lines(shared.clone(), plan.clone(), keys.clone());
                    tokio::task::spawn_local(lines);
                }
                target::serve(shared, plan, keys).await
            }
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
            // A step is not undone: the second action is a step of nothing.
            Entry::ClockStep { at_ms, by_ms } => {
                span(at_ms, 0, Action::ClockStep(by_ms), Action::ClockStep(0))
            }
            Entry::TargetClockStep { at_ms, by_ms } => span(
                at_ms,
                0,
                Action::TargetClockStep(by_ms),
                Action::TargetClockStep(0),
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
            // A crash inside a compaction has no entry of its own: a kill, up again 500 ms on.
            let (tear, corrupt, down_ms) = plan
                .entries
                .iter()
                .find_map(|e| match *e {
                    Entry::DiskCrash {
                        process,
                        tear,
                        corrupt,
                        down_ms,
                        ..
                    } if process == p && planned.drawn => Some((tear, corrupt, down_ms)),
                    _ => None,
                })
                .unwrap_or((0, false, 500));
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
        // A process killed between its relay's write of an answer and its read of it.
        let dies = shared.lock().unwrap().dies_after_answer.take();
        if let Some(p) = dies {
            let down_ms = plan
                .entries
                .iter()
                .find_map(|e| match *e {
                    Entry::CrashAfterAnswer {
                        process, down_ms, ..
                    } if process == p => Some(down_ms),
                    _ => None,
                })
                .unwrap_or(0);
            crash(&mut sim, &env, &mut down, Victim::Process(p), None);
            actions
                .entry(now + down_ms)
                .or_default()
                .push(Action::Restart(Victim::Process(p)));
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
    // The end of a run kills every host: nothing of theirs writes on the way out.
    mcp_replay_guard::simulation::kill(|| drop(sim));
    mcp_replay_guard::simulation::clear_clock();
    let mut shared = Arc::try_unwrap(shared)
        .map(|m| m.into_inner().unwrap())
        .unwrap_or_else(|shared| std::mem::take(&mut *shared.lock().unwrap()));
    shared.now_ms = now;
    for problem in env.machine.violations.lock().unwrap().drain(..) {
        shared.violation(problem);
    }
    let records = end_records(&plan, &env);
    // No credential reaches the ledger's files (records, results, side files).
    for file in files_under(dir) {
        if std::fs::read(&file)
            .is_ok_and(|bytes| bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()))
        {
            shared.violation(format!("a credential is written in {}", file.display()));
        }
    }
    let acked = env.acked.lock().unwrap().clone();
    check_effects(&plan, &mut shared, &acked, &records);
    if plan.ledger == LedgerKind::Memory {
        // An unsettled execution may be kept past its retention while its owner (this
        // process, for the memory ledger) lives; nothing else may. This one check reads the
        // records' own states: it holds the purge to the index it purges (an outcome's event
        // does not name the state it leaves: a re-send refused over an unknown outcome keeps
        // it unknown), while every check of the promise is computed without them.
        let unsettled = records
            .values()
            .filter(|(record, _)| record.state().is_unsettled())
            .count();
        // Retention runs on the machine clock: past the furthest it was ever stepped forward.
        let ahead = shared
            .steps
            .iter()
            .scan(0i64, |stepped, (_, by)| {
                *stepped += by;
                Some(*stepped)
            })
            .max()
            .unwrap_or(0)
            .max(0) as u64;
        env.memory
            .purge_expired(ts(now + ahead).saturating_add(RETENTION + Duration::from_secs(1)));
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
            for host in host_name(victim, env.plan.processes) {
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
        Action::Partition(p, on) if env.plan.stdio => {
            // Turmoil drops a partitioned link's segments, and its TCP never sends them again:
            // the stream would stall forever, which a pipe never does.
            env.shared.lock().unwrap().note(format!(
                "network: p{p}'s pipes to its child are not partitioned: {on}"
            ));
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
        Action::ClockStep(0) | Action::TargetClockStep(0) => {}
        Action::TargetClockStep(by_ms) => {
            TARGET_OFFSET_MS.with(|n| n.set(n.get() + by_ms));
            let mut shared = env.shared.lock().unwrap();
            shared.note(format!("machine: the target's clock steps by {by_ms} ms"));
        }
        Action::ClockStep(by_ms) => {
            STEPPED_MS.with(|n| n.set(n.get() + by_ms));
            let mut shared = env.shared.lock().unwrap();
            shared.steps.push((now, by_ms));
            shared.note(format!("machine: the agents' clock steps by {by_ms} ms"));
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
    for host in host_name(victim, env.plan.processes) {
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
            // What the process sent just before may still be on its way to the target: until
            // it has arrived, the target's status probe cannot say "not applied".
            shared.quiet_after = shared.quiet_after.max(now + 1_000);
            if let Some(disk) = &shared.disks[p] {
                disk.dead.store(true, Ordering::SeqCst);
            }
        }
        if host == "target" {
            env.shared.lock().unwrap().target_down();
        }
        env.shared.lock().unwrap().note(format!("{host}: CRASH"));
        mcp_replay_guard::simulation::kill(|| sim.crash(host.as_str()));
        down.insert(host, true);
        crashed = true;
    }
    if victim == Victim::Machine && (crashed || power.is_some()) {
        let (tear, corrupt) = power.unwrap_or((0, false));
        let told = env
            .machine
            .power_loss(&env.path, tear, corrupt)
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
            let events = ledger
                .events(record.execution_id())
                .await
                .unwrap_or_default();
            records.insert(record.execution_id().to_string(), (record, events));
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
    acked: &[Acked],
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
            let settled = |effect: &Effect| settled_at(plan, shared, acked, records, effect);
            // An operator's "not applied" lets the next execution start, for a caller asked
            // before it too: the other's acceptance, not its ask, must come after it.
            let accepted = |effect: &Effect| {
                acked
                    .iter()
                    .filter(|w| w.event == "accepted" && w.execution_id.to_string() == effect.key)
                    .map(|w| w.asked_ms)
                    .min()
            };
            let not_applied_before = |earlier: &Effect, later: &Effect| {
                shared
                    .resolved_not_applied
                    .get(&earlier.key)
                    // (An acceptance a crash kept from being acknowledged: by the run itself.)
                    .is_some_and(|at| *at <= accepted(later).unwrap_or(later.at))
            };
            let ok = settled(first).is_some_and(|s| s <= b)
                || settled(second).is_some_and(|s| s <= a)
                || not_applied_before(first, second)
                || not_applied_before(second, first);
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
/// computed from the plan, the ground truth and the oracle's own record of what the ledger
/// acknowledged and when it was asked to (the witness), never from a field the ledger wrote
/// (`link_until`, `retain_until`, an event's time, a state): the oracle must not take the
/// system's word for its own clocks. The windows run on the agents' machine clock, as the
/// guard's do: the clock steps the simulation carried out are applied to them.
///
/// - Delivered to a caller, or resolved as applied by the operator: from then on.
/// - A `completed` or a resolution as applied that the ledger acknowledged, or that a killed
///   process wrote unacknowledged and a ledger reopened after it (or the ledger at the end)
///   held: from when it was
///   asked for, and not before the machine clock reads its acceptance plus the link window
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
    acked: &[Acked],
    records: &HashMap<String, (ExecutionRecord, Vec<LedgerEvent>)>,
    effect: &Effect,
) -> Option<u64> {
    let key = effect.key.as_str();
    let steps = &shared.steps;
    let mut candidates = vec![];
    candidates.extend(shared.delivered.get(key).copied());
    candidates.extend(shared.resolved.get(key).copied());
    let of_this = || acked.iter().filter(|a| a.execution_id.to_string() == key);
    // When it was accepted: the simulated time the witness saw the claim asked for, and what
    // the machine clock read then. A claim the ledger wrote and a crash kept from
    // acknowledging has no acknowledged acceptance: it was accepted no earlier than its intent
    // was first asked for and no later than the request that reached the target was asked,
    // so its window ends no earlier than from the lowest reading of the clock in between.
    let asked_here = shared.issued.get(&effect.tag).copied().unwrap_or(0);
    let accepted = of_this()
        .filter(|a| a.event == "accepted")
        .map(|a| a.asked_ms)
        .min()
        .map(|at| (at, machine_ms(steps, at)))
        .or_else(|| {
            let first = shared.intent_first_asked.get(&effect.intent).copied()?;
            Some((first, lowest_reading(steps, first, asked_here.max(first))))
        });
    // Whether a settling event of this execution survived in the ledger (its kind only).
    let kept = records.get(key).is_some_and(|(_, events)| {
        events.iter().any(|e| {
            matches!(
                e.kind,
                EventKind::Completed { .. } | EventKind::Resolved { applied: true, .. }
            )
        })
    });
    let settled = of_this()
        .filter(|a| a.settles && (a.acknowledged || a.held_after_crash || kept))
        .map(|a| a.asked_ms)
        .min();
    if let (Some(settled), Some((accepted, reading))) = (settled, accepted) {
        let window_ends = reading + plan.link_window_ms as i64 + 1;
        candidates.push(settled.max(when_machine_reads(steps, accepted, window_ends)));
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
    let retention_ends =
        machine_ms(steps, retained_from) + plan.retention_of(effect.tool) as i64 + 1;
    candidates.push(when_machine_reads(steps, retained_from, retention_ends));
    candidates.into_iter().min()
}

/// What the agents' machine clock reads at simulated time `at` (ms from the run's start),
/// given the steps carried out (when, by how much).
fn machine_ms(steps: &[(u64, i64)], at: u64) -> i64 {
    at as i64
        + steps
            .iter()
            .filter(|(when, _)| *when <= at)
            .map(|(_, by)| by)
            .sum::<i64>()
}

/// The lowest reading of the agents' machine clock from simulated time `from` to `to`: at
/// `from`, or right after a step back in between.
fn lowest_reading(steps: &[(u64, i64)], from: u64, to: u64) -> i64 {
    steps
        .iter()
        .filter(|(when, _)| *when > from && *when <= to)
        .map(|(when, _)| machine_ms(steps, *when))
        .fold(machine_ms(steps, from), i64::min)
}

/// The earliest simulated time from `from` on at which the agents' machine clock reads
/// `reading` or later. Between two steps it runs at the simulation's pace.
fn when_machine_reads(steps: &[(u64, i64)], from: u64, reading: i64) -> u64 {
    let mut starts: Vec<u64> = std::iter::once(from)
        .chain(
            steps
                .iter()
                .map(|(when, _)| *when)
                .filter(|when| *when > from),
        )
        .collect();
    starts.sort_unstable();
    starts.dedup();
    for (i, start) in starts.iter().enumerate() {
        let offset = machine_ms(steps, *start) - *start as i64;
        let at = (reading - offset).max(*start as i64) as u64;
        match starts.get(i + 1) {
            Some(next) if at >= *next => continue,
            _ => return at,
        }
    }
    from
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
