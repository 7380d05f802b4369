//! Seeded schedules against a real PostgreSQL ledger: the simulator's promise (`cli/tests/sim`)
//! where the simulator cannot go. The simulator drives the file and memory ledgers on a
//! simulated clock and network; the PostgreSQL ledger's rules (its chain locks, its batched
//! writer, the owner leases in `mrg_owners` read on the database's clock) only run against a
//! server, so here every schedule runs the real guard over real `PostgresLedger` replicas,
//! a real HTTP MCP server and real TCP.
//!
//! A schedule is drawn from its seed (`StdRng::seed_from_u64`) as data, printed on failure
//! with the command that replays it:
//!
//! - 2 to 4 replicas of one agent (same actor, scope and fingerprint key: one intent is one
//!   intent on every replica), each with a ledger of its own in the schedule's schema, some
//!   through a [`PgRelay`] the schedule cuts;
//! - a few calls per replica over a small space of intents (irreversible tools, one slow
//!   enough that twins overlap it; an idempotent tool against a server that honours
//!   `Idempotency-Key`; a read-only tool), all at once, each retried after an error;
//! - faults at seeded moments: a relay cut before a COMMIT reaches the server or once its
//!   answer is lost; every backend of the schedule terminated (`pg_terminate_backend`), or
//!   one replica's; a relayed replica killed mid-call (its connections cut, its calls
//!   aborted, its ledger dropped: its owner's lease outlives it, as a crashed process's
//!   does) and a new replica in its place, over a new connection, repeating its calls;
//! - in half the plans, a replica that joins while the others' calls are in flight: a ledger
//!   that connects settles the executions whose owner is gone, and must leave the others'.
//!
//! The checks read the plan, what each caller was told and the server's own record of its
//! tools' runs (each run traced to the POST that caused it by its JSON-RPC id), never the
//! ledger's fields:
//!
//! - an intent of an irreversible or idempotent tool runs again only if a caller of it was
//!   handed an answer after its previous run and before the guard took in the POST that ran
//!   it again (a repeat after an answer is a new intent; before one, it must link to the
//!   execution that ran, whatever its state);
//! - no two runs under one `Idempotency-Key`;
//! - every call is answered within [`CALL_DEADLINE`]: a wait without end is a violation, not
//!   a test timeout;
//! - before the schedule's first fault, every call is answered by its tool: a live replica's
//!   call is attached to, never held for review or re-sent beside;
//! - the chains verify ([`PostgresLedger::verify`]) once the schedule is over;
//! - once every ledger of the schedule is dropped, none of its connections is left on the
//!   server.
//!
//! `MRG_PG_SCHEDULES=N` runs N schedules (default [`DEFAULT_SCHEDULES`]); `MRG_PG_BASE=S`
//! starts at seed S (default a fixed base, so CI runs the same schedules each time; `random`
//! for a new one, printed); `MRG_PG_SEED=S` replays one schedule and prints its timeline.
//! The server comes from `MCP_REPLAY_GUARD_POSTGRES_URL`, as in `tests/postgres.rs`:
//! unset, the test is skipped with a message, except under CI (`CI` set), where it fails.
//! Each schedule works in a schema of its own, dropped when the schedule passes.
//!
//! A seed fixes the plan, not the interleaving: the schedules run in real time on a real
//! server, so a replay repeats the same calls and faults at the same moments, and a race may
//! fall the other way.

use mcp_replay_guard_test_support as support;

use std::{
    collections::BTreeMap,
    fmt,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use http_body::Body;
use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    integrations::server::IdempotencyLayer,
    ledger::{MemoryLedger, PostgresLedger},
};
use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde_json::Value;
use support::*;
use tower::Layer;

/// Schedules in one run unless `MRG_PG_SCHEDULES` says otherwise: CI's share, a few seconds
/// of wall time (see the figures in docs/simulation.md).
const DEFAULT_SCHEDULES: u64 = 10;

/// The first seed unless `MRG_PG_BASE` says otherwise.
const DEFAULT_BASE: u64 = 0x9E5C_0000;

/// Longest a caller waits for one answer (its POST sent, its body read to the end). Every
/// wait of the guard is bounded well inside it (the attach wait, the ledger's retries under
/// the call's deadline); a call past it hangs, and that breaks the promise.
const CALL_DEADLINE: Duration = Duration::from_secs(20);

/// The guards' attach wait: how long a repeat waits for another replica's attempt. Short, so
/// that a schedule whose killed replica still holds its lease ends within seconds.
const ATTACH: Duration = Duration::from_secs(3);

/// How long a guard still reads a body its caller dropped (a killed replica's calls).
const DRAIN: Duration = Duration::from_secs(2);

/// How long `slow_deploy` runs: long enough that a twin on another replica finds it
/// dispatched and running.
const SLOW_TOOL: Duration = Duration::from_millis(150);

/// Longest wait of a step of the harness itself (see [`within`]).
const HARNESS_DEADLINE: Duration = Duration::from_secs(30);

/// How long a dropped ledger's connections may take to leave the server.
const CONNECTIONS_GONE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Irreversible,
    Idempotent,
    ReadOnly,
}

/// The intents a schedule draws its calls from: (tool, arguments, class).
const INTENTS: [(&str, &str, Class); 6] = [
    ("slow_deploy", r#"{"service":"a"}"#, Class::Irreversible),
    ("slow_deploy", r#"{"service":"b"}"#, Class::Irreversible),
    (
        "deploy_release",
        r#"{"service":"catalog","version":"v1"}"#,
        Class::Irreversible,
    ),
    (
        "create_payment",
        r#"{"amount":100,"currency":"EUR"}"#,
        Class::Idempotent,
    ),
    (
        "create_payment",
        r#"{"amount":250,"currency":"EUR"}"#,
        Class::Idempotent,
    ),
    ("list_branches", "{}", Class::ReadOnly),
];

fn intent_args(intent: usize) -> Value {
    serde_json::from_str(INTENTS[intent].1).expect("valid arguments")
}

fn intent_label(intent: usize) -> String {
    let (tool, args, _) = INTENTS[intent];
    format!("{tool}{args}")
}

/// The intent a run of the server's tool belongs to: its tool, and every argument the intent
/// names (the tools record an absent optional one as null).
fn intent_of_run(tool: &str, arguments: &Value) -> Option<usize> {
    (0..INTENTS.len()).find(|&i| {
        let (name, _, _) = INTENTS[i];
        name == tool
            && intent_args(i)
                .as_object()
                .expect("an object")
                .iter()
                .all(|(k, v)| arguments.get(k) == Some(v))
    })
}

/// One replica of the plan.
#[derive(Debug, Clone, Copy)]
struct ReplicaPlan {
    /// Its ledger connects through a relay the schedule may cut or kill.
    relayed: bool,
    /// It connects (a replica scaled up) at this moment of the schedule, not before it starts:
    /// a ledger that connects settles the executions whose owner is gone, while the other
    /// replicas' calls are in flight.
    joins_at_ms: Option<u64>,
}

/// One call of the plan: a caller on `replica` asks for `intent` at `at_ms`, and asks again
/// after an error up to `retries` times, `backoff_ms` apart.
#[derive(Debug, Clone, Copy)]
struct CallPlan {
    replica: usize,
    intent: usize,
    at_ms: u64,
    retries: u8,
    backoff_ms: u64,
}

/// A fault at a moment of the schedule.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The relay of `replica` cuts the connection that carries the `skip + 1`-th COMMIT from
    /// now, as `cut` says.
    Cut {
        replica: usize,
        cut: Cut,
        skip: usize,
        at_ms: u64,
    },
    /// Every backend of the schedule's ledgers is terminated by the server.
    TerminateAll { at_ms: u64 },
    /// Every backend of one replica's ledger is terminated by the server.
    TerminateOne { replica: usize, at_ms: u64 },
    /// A relayed replica dies: its connections cut and no new one, its calls aborted, its
    /// guard and ledger dropped. A new replica (a new ledger connection, a new guard) takes
    /// its place `back_after_ms` later and asks its calls again.
    Kill {
        replica: usize,
        at_ms: u64,
        back_after_ms: u64,
    },
}

impl Fault {
    fn at_ms(&self) -> u64 {
        match *self {
            Fault::Cut { at_ms, .. }
            | Fault::TerminateAll { at_ms }
            | Fault::TerminateOne { at_ms, .. }
            | Fault::Kill { at_ms, .. } => at_ms,
        }
    }
}

/// A schedule, drawn from its seed.
#[derive(Debug, Clone)]
struct Plan {
    seed: u64,
    replicas: Vec<ReplicaPlan>,
    calls: Vec<CallPlan>,
    faults: Vec<Fault>,
}

impl Plan {
    fn generate(seed: u64) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut replicas: Vec<ReplicaPlan> = (0..rng.random_range(2..=4usize))
            .map(|i| ReplicaPlan {
                relayed: i > 0 && rng.random_bool(0.6),
                joins_at_ms: None,
            })
            .collect();
        // A small space, so that twins and repeats are common; a slow irreversible tool in
        // most, so that twins overlap an attempt in flight.
        let mut space: Vec<usize> = Vec::new();
        if rng.random_bool(0.8) {
            space.push(rng.random_range(0..2));
        }
        while space.len() < rng.random_range(2..=3) {
            let intent = rng.random_range(0..INTENTS.len());
            if !space.contains(&intent) {
                space.push(intent);
            }
        }
        let mut calls = Vec::new();
        for replica in 0..replicas.len() {
            for _ in 0..rng.random_range(1..=4) {
                calls.push(CallPlan {
                    replica,
                    intent: space[rng.random_range(0..space.len())],
                    at_ms: rng.random_range(0..=250),
                    retries: rng.random_range(1..=3),
                    backoff_ms: rng.random_range(20..=150),
                });
            }
        }
        let relayed: Vec<usize> = (0..replicas.len())
            .filter(|&r| replicas[r].relayed)
            .collect();
        let mut faults = Vec::new();
        let count = if rng.random_bool(0.25) {
            0
        } else {
            rng.random_range(1..=3)
        };
        for _ in 0..count {
            let at_ms = rng.random_range(50..=400);
            let fault = match rng.random_range(0..5) {
                0 | 4 if !relayed.is_empty() => Fault::Cut {
                    replica: relayed[rng.random_range(0..relayed.len())],
                    cut: if rng.random_bool(0.5) {
                        Cut::BeforeCommit
                    } else {
                        Cut::CommitAnswerLost
                    },
                    skip: rng.random_range(0..=2),
                    at_ms,
                },
                3 if !relayed.is_empty()
                    && !faults.iter().any(|f| matches!(f, Fault::Kill { .. })) =>
                {
                    Fault::Kill {
                        replica: relayed[rng.random_range(0..relayed.len())],
                        at_ms,
                        back_after_ms: rng.random_range(50..=400),
                    }
                }
                1 | 3 => Fault::TerminateAll { at_ms },
                _ => Fault::TerminateOne {
                    replica: rng.random_range(0..replicas.len()),
                    at_ms,
                },
            };
            faults.push(fault);
        }
        faults.sort_by_key(Fault::at_ms);
        // Faults name only the replicas there from the start.
        if rng.random_bool(0.5) {
            let joins_at_ms = rng.random_range(30..=200);
            let replica = replicas.len();
            replicas.push(ReplicaPlan {
                relayed: false,
                joins_at_ms: Some(joins_at_ms),
            });
            for _ in 0..rng.random_range(1..=2) {
                calls.push(CallPlan {
                    replica,
                    intent: space[rng.random_range(0..space.len())],
                    at_ms: joins_at_ms + rng.random_range(0..=60),
                    retries: rng.random_range(1..=3),
                    backoff_ms: rng.random_range(20..=150),
                });
            }
        }
        Plan {
            seed,
            replicas,
            calls,
            faults,
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {}", self.seed)?;
        for (i, r) in self.replicas.iter().enumerate() {
            let how = if r.relayed {
                "through a relay"
            } else {
                "direct"
            };
            match r.joins_at_ms {
                None => writeln!(f, "  replica r{i}: {how}")?,
                Some(at) => writeln!(f, "  replica r{i}: {how}, joins at {at} ms")?,
            }
        }
        for (i, c) in self.calls.iter().enumerate() {
            writeln!(
                f,
                "  call c{i}: r{} asks {} at {} ms ({} retries, {} ms apart)",
                c.replica,
                intent_label(c.intent),
                c.at_ms,
                c.retries,
                c.backoff_ms
            )?;
        }
        if self.faults.is_empty() {
            writeln!(f, "  no fault")?;
        }
        for fault in &self.faults {
            writeln!(f, "  fault: {fault:?}")?;
        }
        Ok(())
    }
}

/// What a caller was told by one POST.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// The tool's own answer (run now, or kept and handed back).
    Tool,
    /// The guard's: unknown outcome, held for review.
    Held,
    /// The guard's: another attempt is still in flight.
    InProgress,
    /// The guard's: every attempt the caller allowed lost its answer.
    Unanswered,
    /// The guard's: completed, result not kept.
    NotKept,
    /// Any other answer of the guard's.
    Guard(String),
    /// An error: transport, HTTP status, JSON-RPC error, a body cut short.
    Error(String),
    /// No answer within [`CALL_DEADLINE`].
    Hung,
}

impl Answer {
    /// The kind of answer, for the figures of a run.
    fn kind(&self) -> &'static str {
        match self {
            Answer::Tool => "tool",
            Answer::Held => "held",
            Answer::InProgress => "in progress",
            Answer::Unanswered => "unanswered",
            Answer::NotKept => "not kept",
            Answer::Guard(_) => "other guard answer",
            Answer::Error(_) => "error",
            Answer::Hung => "hung",
        }
    }

    /// A caller asks again after these (the guard says so for an unanswered call).
    fn asks_again(&self) -> bool {
        matches!(self, Answer::Error(_) | Answer::Unanswered)
    }
}

/// One POST as its caller saw it.
#[derive(Debug, Clone)]
struct Post {
    call: usize,
    replica: String,
    intent: usize,
    try_no: u8,
    asked: Instant,
    /// When the response's head came back.
    head: Option<Instant>,
    /// The start of the poll of the body that yielded the JSON-RPC response: no guard can have
    /// seen this answer delivered before it.
    answered: Option<Instant>,
    /// `None` while under way, and for ever for a killed caller's that had read none (one
    /// killed after it read its answer keeps it).
    answer: Option<Answer>,
    /// When the caller had its answer (or gave up on it).
    ended: Option<Instant>,
}

/// What a schedule records as it runs: the callers' POSTs and a timeline.
#[derive(Default)]
struct Log {
    posts: Vec<Post>,
    notes: Vec<(Instant, String)>,
}

type SharedLog = Arc<Mutex<Log>>;

fn note(log: &SharedLog, text: String) {
    log.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .notes
        .push((Instant::now(), text));
}

/// What a replica's callers call through.
#[derive(Clone)]
enum Stack {
    /// The guard over the replica's ledger.
    Guard(GuardLayer),
    /// A bare HTTP client, as without this crate: the check that the schedules can fail.
    Bare,
}

/// The guard of every replica (same actor, scope and key: one agent).
fn guard(ledger: PostgresLedger) -> GuardLayer {
    let registry = ContractRegistry::builder()
        .tool("slow_deploy", ToolContract::irreversible())
        .tool("deploy_release", ToolContract::irreversible())
        .tool("create_payment", ToolContract::idempotent())
        .tool("list_branches", ToolContract::read_only())
        .build()
        .expect("valid contracts");
    GuardLayer::new(
        ledger,
        registry,
        FingerprintKey::from_bytes(&[7; 32]).expect("a key"),
    )
    .actor(Actor::from("signed-process:com.example.agent"))
    .intent_scope(IntentScope::from("run:pg-schedules"))
    .attach_timeout(ATTACH)
    .drain_timeout(DRAIN)
}

/// `url` with `application_name` set: the schedule finds its own backends by it (to
/// terminate them, and to see that none is left), and no other test's.
fn with_application_name(url: &str, name: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={name}")
}

/// The JSON-RPC response in a body read so far (JSON, or SSE `data:` lines complete so far).
fn response_in(bytes: &[u8]) -> Option<Value> {
    let is_response = |v: &Value| {
        v.get("id").is_some() && (v.get("result").is_some() || v.get("error").is_some())
    };
    let text = String::from_utf8_lossy(bytes);
    if let Ok(value) = serde_json::from_str::<Value>(text.trim())
        && is_response(&value)
    {
        return Some(value);
    }
    let complete = text.rsplit_once('\n').map_or("", |(lines, _)| lines);
    complete
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(is_response)
}

/// Reads a body to its end, as a caller that takes its whole answer does; returns when the
/// frame that completed the JSON-RPC response was polled for, and the response.
/// `on_response` hears of the response as soon as its frame is read: the caller holds its
/// answer from then on, even if it dies before the body ends.
async fn read_answer<B>(
    body: B,
    on_response: impl FnOnce(Instant, &Value),
) -> Result<(Instant, Value), String>
where
    B: Body,
    B::Error: std::fmt::Display,
{
    let mut on_response = Some(on_response);
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    let mut found = None;
    loop {
        let (polled_at, frame) = std::future::poll_fn(|cx| {
            let polled_at = Instant::now();
            Pin::as_mut(&mut body)
                .poll_frame(cx)
                .map(|frame| (polled_at, frame))
        })
        .await;
        match frame {
            None => break,
            Some(Err(e)) => return Err(format!("the body ended with an error: {e}")),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(bytes::Buf::chunk(data));
                    if found.is_none() {
                        found = response_in(&bytes).map(|r| (polled_at, r));
                        if let Some((at, response)) = &found
                            && let Some(heard) = on_response.take()
                        {
                            heard(*at, response);
                        }
                    }
                }
            }
        }
    }
    found.ok_or_else(|| {
        format!(
            "no JSON-RPC response in {}",
            String::from_utf8_lossy(&bytes)
        )
    })
}

/// What a JSON-RPC response tells its caller.
fn classify(response: &Value) -> Answer {
    if let Some(error) = response.get("error") {
        return Answer::Error(format!("JSON-RPC error {error}"));
    }
    let Some(structured) = response.pointer("/result/structuredContent") else {
        return Answer::Guard(format!("a result without structuredContent: {response}"));
    };
    let Some(guard) = structured.get("mcp_replay_guard") else {
        return Answer::Tool;
    };
    match guard.get("why_not_resent").and_then(Value::as_str) {
        Some("unknown outcome on a tool that may not be re-sent") => Answer::Held,
        Some("an attempt of the same execution is still in flight") => Answer::InProgress,
        Some("every attempt the caller allowed lost its answer") => Answer::Unanswered,
        Some(why) if why.starts_with("the result was not kept") => Answer::NotKept,
        why => Answer::Guard(format!("{why:?}")),
    }
}

/// One POST through `stack`, its body read to the end.
async fn post_once(
    stack: &Stack,
    url: &str,
    session: Option<&str>,
    id: i64,
    intent: usize,
    noted: &Noted,
) -> Told {
    let body = tool_call_body(id, INTENTS[intent].0, intent_args(intent));
    let request = post(url, session, PROTOCOL_VERSION, body);
    match stack {
        Stack::Guard(layer) => {
            let mut client = layer.layer(hyper_client_with_body::<GuardRequestBody>());
            answer_of(send(&mut client, request).await, noted).await
        }
        Stack::Bare => answer_of(send(&mut hyper_client(), request).await, noted).await,
    }
}

/// A POST's entry in the log, written as it learns things: a caller killed mid-read has
/// still had what it read.
struct Noted {
    log: SharedLog,
    index: usize,
}

impl Noted {
    fn update(&self, change: impl FnOnce(&mut Post)) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut log.posts[self.index]);
    }
}

/// What a caller is told by a response (or by the error that came instead).
async fn answer_of<B>(sent: Result<http::Response<B>, BoxError>, noted: &Noted) -> Told
where
    B: Body,
    B::Error: std::fmt::Display,
{
    let response = match sent {
        Ok(response) => response,
        Err(e) => {
            return Told {
                head: None,
                answered: None,
                answer: Answer::Error(error_chain(&*e)),
            };
        }
    };
    let head = Some(Instant::now());
    noted.update(|post| post.head = head);
    let status = response.status();
    let heard = |at: Instant, response: &Value| {
        if status.is_success() {
            noted.update(|post| {
                post.answered = Some(at);
                post.answer = Some(classify(response));
            });
        }
    };
    let (answered, answer) = match read_answer(response.into_body(), heard).await {
        Ok((_, response)) if !status.is_success() => {
            (None, Answer::Error(format!("HTTP {status}: {response}")))
        }
        Ok((at, response)) => (Some(at), classify(&response)),
        Err(e) => (None, Answer::Error(format!("HTTP {status}: {e}"))),
    };
    Told {
        head,
        answered,
        answer,
    }
}

/// What one POST told its caller, and when.
struct Told {
    /// When the response's head came back (the guard had taken the call in before).
    head: Option<Instant>,
    /// See [`Post::answered`].
    answered: Option<Instant>,
    answer: Answer,
}

/// The JSON-RPC id of a call's POST: the server's record of a run names the POST that
/// caused it.
fn jsonrpc_id(call: usize, try_no: u8) -> usize {
    call * 10 + usize::from(try_no) + 1
}

/// A caller: asks at its moment, asks again after an error as the plan allows, and records
/// every POST and what it was told.
async fn caller(
    call: usize,
    plan: CallPlan,
    replica: String,
    stack: Stack,
    url: String,
    session: Option<String>,
    log: SharedLog,
) {
    for try_no in 0..=plan.retries {
        let id = i64::try_from(jsonrpc_id(call, try_no)).expect("small");
        let post_index = {
            let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
            log.posts.push(Post {
                call,
                replica: replica.clone(),
                intent: plan.intent,
                try_no,
                asked: Instant::now(),
                head: None,
                answered: None,
                answer: None,
                ended: None,
            });
            log.posts.len() - 1
        };
        let noted = Noted {
            log: log.clone(),
            index: post_index,
        };
        let posted = tokio::time::timeout(
            CALL_DEADLINE,
            post_once(&stack, &url, session.as_deref(), id, plan.intent, &noted),
        )
        .await;
        let told = posted.unwrap_or(Told {
            head: None,
            answered: None,
            answer: Answer::Hung,
        });
        let again = told.answer.asks_again() && try_no < plan.retries;
        {
            let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
            let post = &mut log.posts[post_index];
            post.head = told.head;
            post.answered = told.answered;
            post.answer = Some(told.answer);
            post.ended = Some(Instant::now());
        }
        if !again {
            return;
        }
        tokio::time::sleep(Duration::from_millis(plan.backoff_ms)).await;
    }
}

/// A replica while the schedule runs.
struct Replica {
    name: String,
    relay: Option<PgRelay>,
    ledger: Option<PostgresLedger>,
    stack: Option<Stack>,
    session: Option<String>,
    callers: Vec<tokio::task::JoinHandle<()>>,
    killed: bool,
}

/// A replica's ledger (through a relay when `relayed`), guard (unless `bare`: the ledger is
/// then left unused) and MCP session.
async fn start_replica(
    schema: &TestSchema,
    name: String,
    relayed: bool,
    bare: bool,
    server: &TestServer,
) -> Replica {
    let relay = if relayed {
        Some(PgRelay::start(&schema.url).await)
    } else {
        None
    };
    let url = with_application_name(&schema.url, &name);
    let url = relay.as_ref().map_or(url.clone(), |relay| relay.url(&url));
    let ledger = within(
        "a replica's connection",
        PostgresLedger::connect_with_schema(&url, &schema.name),
    )
    .await
    .unwrap_or_else(|e| panic!("connecting replica {name}: {e}"));
    let session = within(
        "the MCP handshake",
        initialize(&mut hyper_client(), &server.url),
    )
    .await
    .expect("an MCP session");
    Replica {
        name,
        stack: Some(if bare {
            Stack::Bare
        } else {
            Stack::Guard(guard(ledger.clone()))
        }),
        ledger: Some(ledger),
        relay,
        session,
        callers: Vec::new(),
        killed: false,
    }
}

fn spawn_caller(
    replica: &mut Replica,
    call: usize,
    plan: CallPlan,
    start: tokio::time::Instant,
    server: &TestServer,
    log: &SharedLog,
) {
    let stack = replica.stack.clone().expect("a live replica");
    let (name, url, session, log) = (
        replica.name.clone(),
        server.url.clone(),
        replica.session.clone(),
        log.clone(),
    );
    replica.callers.push(tokio::spawn(async move {
        tokio::time::sleep_until(start + Duration::from_millis(plan.at_ms)).await;
        caller(call, plan, name, stack, url, session, log).await;
    }));
}

/// Terminates the backends whose `application_name` starts with `prefix`; how many.
async fn terminate(admin: &PostgresLedger, prefix: &str) -> i64 {
    within("terminating backends", async {
        let client = admin.pool().get().await.expect("the admin's connection");
        let row = client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 AND starts_with(application_name, $1::text)",
                &[&prefix],
            )
            .await
            .expect("pg_terminate_backend");
        row.get(0)
    })
    .await
}

/// The backends whose `application_name` starts with `prefix`.
async fn backends(admin: &PostgresLedger, prefix: &str) -> Vec<String> {
    within("counting backends", async {
        let client = admin.pool().get().await.expect("the admin's connection");
        client
            .query(
                "SELECT application_name || ' (' || coalesce(state, '?') || ')' \
                 FROM pg_stat_activity WHERE starts_with(application_name, $1::text)",
                &[&prefix],
            )
            .await
            .expect("pg_stat_activity")
            .iter()
            .map(|row| row.get::<_, Option<String>>(0).unwrap_or_default())
            .collect()
    })
    .await
}

/// What a schedule found.
#[derive(Default)]
struct Outcome {
    violations: Vec<String>,
    timeline: Vec<String>,
    effects: usize,
    posts: usize,
    /// How many POSTs were answered so, by kind of answer.
    told: BTreeMap<&'static str, usize>,
    /// Connections the relays cut at a COMMIT.
    cuts: usize,
    /// Backends the server terminated.
    terminated: i64,
    /// Replicas killed.
    kills: usize,
}

impl Outcome {
    fn add(&mut self, other: &Outcome) {
        self.effects += other.effects;
        self.posts += other.posts;
        for (kind, n) in &other.told {
            *self.told.entry(kind).or_default() += n;
        }
        self.cuts += other.cuts;
        self.terminated += other.terminated;
        self.kills += other.kills;
    }

    /// The figures of a run.
    fn figures(&self) -> String {
        let told: Vec<String> = self.told.iter().map(|(k, n)| format!("{n} {k}")).collect();
        format!(
            "{} POSTs ({}), {} effects, {} COMMITs cut, {} backends terminated, {} replicas killed",
            self.posts,
            told.join(", "),
            self.effects,
            self.cuts,
            self.terminated,
            self.kills
        )
    }
}

/// Runs `plan` in its own schema through the guard (or, `bare`, without it); the schema is
/// dropped when the schedule passes, and after a bare one, which is expected to fail.
async fn run_schedule(plan: &Plan, schema: TestSchema, tag: &str, bare: bool) -> Outcome {
    let prefix = format!("mrgps-{tag}-");
    let admin_url = with_application_name(&schema.url, &format!("mrgpa-{tag}"));
    let admin = within(
        "the admin's connection",
        PostgresLedger::connect_with_schema(&admin_url, &schema.name),
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to {POSTGRES_URL_VAR}: {e}"));
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: SLOW_TOOL,
        idempotency: Some(IdempotencyLayer::new(
            MemoryLedger::new(),
            FingerprintKey::from_bytes(&[9; 32]).expect("a key"),
        )),
        ..ServerOptions::default()
    })
    .await;
    let log: SharedLog = Arc::default();
    let mut replicas = Vec::new();
    // The replicas there from the start (the plan's first ones: the faults name them by index).
    for (i, r) in plan.replicas.iter().enumerate() {
        if r.joins_at_ms.is_none() {
            let name = format!("{prefix}r{i}g0");
            replicas.push(start_replica(&schema, name, r.relayed, bare, &server).await);
        }
    }

    let start = tokio::time::Instant::now();
    let started = Instant::now();
    let mut calls: Vec<CallPlan> = plan.calls.clone();
    for (i, call) in plan.calls.iter().enumerate() {
        if plan.replicas[call.replica].joins_at_ms.is_none() {
            spawn_caller(&mut replicas[call.replica], i, *call, start, &server, &log);
        }
    }

    // The faults, and the replica that comes back after a kill, in time order.
    enum Step {
        Fault(Fault),
        ComeBack(usize),
        Join(usize),
    }
    let mut steps: Vec<(u64, Step)> = Vec::new();
    for (i, r) in plan.replicas.iter().enumerate() {
        if let Some(at_ms) = r.joins_at_ms {
            steps.push((at_ms, Step::Join(i)));
        }
    }
    for fault in &plan.faults {
        steps.push((fault.at_ms(), Step::Fault(*fault)));
        if let Fault::Kill {
            replica,
            at_ms,
            back_after_ms,
        } = *fault
        {
            steps.push((at_ms + back_after_ms, Step::ComeBack(replica)));
        }
    }
    steps.sort_by_key(|(at, _)| *at);
    let mut first_fault: Option<Instant> = None;
    let mut terminated = 0;
    for (at_ms, step) in steps {
        tokio::time::sleep_until(start + Duration::from_millis(at_ms)).await;
        match step {
            Step::Fault(fault) => {
                first_fault.get_or_insert_with(Instant::now);
                match fault {
                    Fault::Cut {
                        replica, cut, skip, ..
                    } => {
                        if let Some(relay) = &replicas[replica].relay {
                            relay.arm(cut, skip);
                        }
                        note(
                            &log,
                            format!("r{replica}'s relay armed: {cut:?}, skip {skip}"),
                        );
                    }
                    Fault::TerminateAll { .. } => {
                        let n = terminate(&admin, &prefix).await;
                        terminated += n;
                        note(&log, format!("{n} backends of the schedule terminated"));
                    }
                    Fault::TerminateOne { replica, .. } => {
                        let name = replicas[replica].name.clone();
                        let n = terminate(&admin, &name).await;
                        terminated += n;
                        note(&log, format!("{n} backends of r{replica} terminated"));
                    }
                    Fault::Kill { replica, .. } => {
                        let r = &mut replicas[replica];
                        if let Some(relay) = &r.relay {
                            relay.kill();
                        }
                        for caller in &r.callers {
                            caller.abort();
                        }
                        r.stack = None;
                        r.ledger = None;
                        r.killed = true;
                        note(&log, format!("r{replica} killed"));
                    }
                }
            }
            Step::Join(replica) => {
                let name = format!("{prefix}r{replica}g0");
                let relayed = plan.replicas[replica].relayed;
                let mut joined = start_replica(&schema, name, relayed, bare, &server).await;
                for (i, call) in plan.calls.iter().enumerate() {
                    if call.replica == replica {
                        spawn_caller(&mut joined, i, *call, start, &server, &log);
                    }
                }
                note(&log, format!("r{replica} joins over a new connection"));
                replicas.push(joined);
            }
            Step::ComeBack(replica) => {
                let name = format!("{prefix}r{replica}g1");
                let mut back = start_replica(&schema, name, false, bare, &server).await;
                let now_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
                let theirs: Vec<CallPlan> = plan
                    .calls
                    .iter()
                    .filter(|c| c.replica == replica)
                    .map(|c| CallPlan {
                        at_ms: now_ms + c.at_ms / 3,
                        ..*c
                    })
                    .collect();
                for call in theirs {
                    calls.push(call);
                    spawn_caller(&mut back, calls.len() - 1, call, start, &server, &log);
                }
                note(
                    &log,
                    format!("r{replica} back over a new connection, asking its calls again"),
                );
                replicas.push(back);
            }
        }
    }

    let mut violations = Vec::new();
    // Every caller ends within its deadlines (each POST is bounded by CALL_DEADLINE; this
    // bound only catches a caller stuck outside one).
    let caller_bound = CALL_DEADLINE * 5 + Duration::from_secs(5);
    for replica in &mut replicas {
        for handle in replica.callers.drain(..) {
            match tokio::time::timeout(caller_bound, handle).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_cancelled() => {}
                Ok(Err(e)) => violations.push(format!("a caller of {} failed: {e}", replica.name)),
                Err(_) => violations.push(format!(
                    "a caller of {} was still waiting after {caller_bound:?}",
                    replica.name
                )),
            }
        }
    }
    // A killed caller's run may still be under way on the server.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while server.state.started("slow_deploy") > server.state.side_effects("slow_deploy")
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let log = std::mem::take(&mut *log.lock().unwrap_or_else(PoisonError::into_inner));
    let mut runs: Vec<(Instant, usize, ToolRun)> = Vec::new();
    for tool in [
        "slow_deploy",
        "deploy_release",
        "create_payment",
        "list_branches",
    ] {
        for run in server.state.tool_runs(tool) {
            match intent_of_run(tool, &run.arguments) {
                Some(intent) => runs.push((run.at, intent, run)),
                None => violations.push(format!("{tool} ran for no intent of the plan: {run:?}")),
            }
        }
    }
    runs.sort_by_key(|(at, _, _)| *at);
    violations.extend(check(&log.posts, &runs, first_fault));

    let report = within("the verification", admin.verify()).await;
    match &report {
        Ok(report) if report.is_ok() => {}
        Ok(report) => violations.push(format!("the ledger does not verify: {report}")),
        Err(e) => violations.push(format!("the ledger could not be verified: {e}")),
    }

    // Every ledger of the schedule dropped: none of their connections may stay.
    let killed: Vec<String> = replicas
        .iter()
        .filter(|r| r.killed)
        .map(|r| r.name.clone())
        .collect();
    let relays: Vec<PgRelay> = replicas.iter_mut().filter_map(|r| r.relay.take()).collect();
    let cuts = relays.iter().map(PgRelay::fired).sum();
    drop(replicas);
    let deadline = tokio::time::Instant::now() + CONNECTIONS_GONE;
    let mut left = backends(&admin, &prefix).await;
    while !left.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = backends(&admin, &prefix).await;
    }
    if !left.is_empty() {
        violations.push(format!(
            "connections left {} s after every ledger was dropped (killed: {killed:?}): {left:?}",
            CONNECTIONS_GONE.as_secs()
        ));
    }
    drop(relays);

    let timeline = timeline(started, &log, &runs);
    if violations.is_empty() || bare {
        within("dropping the schema", schema.drop(&admin)).await;
    } else {
        violations.push(format!(
            "the schedule's tables are kept in schema {}",
            schema.name
        ));
    }
    let mut told = BTreeMap::new();
    for answer in log.posts.iter().filter_map(|p| p.answer.as_ref()) {
        *told.entry(answer.kind()).or_default() += 1;
    }
    Outcome {
        effects: runs.len(),
        posts: log.posts.len(),
        violations,
        timeline,
        told,
        cuts,
        terminated,
        kills: plan
            .faults
            .iter()
            .filter(|f| matches!(f, Fault::Kill { .. }))
            .count(),
    }
}

/// The promise, from what the callers were told and what the server ran.
fn check(
    posts: &[Post],
    runs: &[(Instant, usize, ToolRun)],
    first_fault: Option<Instant>,
) -> Vec<String> {
    let mut violations = Vec::new();
    for p in posts {
        if p.answer == Some(Answer::Hung) {
            violations.push(format!(
                "c{} try {} ({}, {}) had no answer within {} s",
                p.call,
                p.try_no,
                p.replica,
                intent_label(p.intent),
                CALL_DEADLINE.as_secs()
            ));
        }
        // Before any fault, nothing can have made an outcome unknown: a twin attaches to the
        // live attempt and is handed its answer.
        if let (Some(answer), Some(ended)) = (&p.answer, p.ended)
            && *answer != Answer::Tool
            && first_fault.is_none_or(|fault| ended < fault)
        {
            violations.push(format!(
                "c{} try {} ({}, {}) was answered {answer:?} before any fault",
                p.call,
                p.try_no,
                p.replica,
                intent_label(p.intent),
            ));
        }
    }
    let mut by_intent: BTreeMap<usize, Vec<&(Instant, usize, ToolRun)>> = BTreeMap::new();
    for run in runs {
        by_intent.entry(run.1).or_default().push(run);
    }
    for (intent, runs) in &by_intent {
        if INTENTS[*intent].2 == Class::ReadOnly {
            continue;
        }
        for pair in runs.windows(2) {
            let (before, again) = (pair[0].0, pair[1].0);
            // The guard took the POST that ran again in before its response's head came
            // back (and before the run): an answer handed to a caller after that cannot have
            // made it a new intent, nor can the answer to that POST itself. Two milliseconds
            // more for the ledger's clock, which counts a delivery in the same millisecond as
            // the ask as before it.
            let cause = post_of_run(posts, &pair[1].2);
            let taken_in_by = cause
                .and_then(|p| p.head)
                .map_or(again, |head| head.min(again) + Duration::from_millis(2));
            let answered_between = posts.iter().any(|p| {
                p.intent == *intent
                    && cause.is_none_or(|cause| !std::ptr::eq(p, cause))
                    && p.answer == Some(Answer::Tool)
                    && p.answered.is_some_and(|at| before < at && at < taken_in_by)
            });
            if !answered_between {
                let by = cause.map_or("an unknown POST".to_owned(), |p| {
                    format!("c{} try {}", p.call, p.try_no)
                });
                violations.push(format!(
                    "{} ran again (key {:?}, for {by}) with no caller handed an answer since \
                     its run under key {:?} before that POST was taken in",
                    intent_label(*intent),
                    pair[1].2.idempotency_key,
                    pair[0].2.idempotency_key
                ));
            }
        }
    }
    let mut by_key: BTreeMap<(usize, Option<String>), usize> = BTreeMap::new();
    for (_, intent, run) in runs {
        if INTENTS[*intent].2 == Class::ReadOnly {
            continue;
        }
        *by_key
            .entry((*intent, run.idempotency_key.clone()))
            .or_default() += 1;
    }
    for ((intent, key), n) in by_key {
        if n > 1 {
            violations.push(format!(
                "{} ran {n} times under Idempotency-Key {key:?}",
                intent_label(intent)
            ));
        }
    }
    violations
}

/// The POST whose JSON-RPC id the run carries.
fn post_of_run<'a>(posts: &'a [Post], run: &ToolRun) -> Option<&'a Post> {
    let id: usize = run.request_id.parse().ok()?;
    posts.iter().find(|p| jsonrpc_id(p.call, p.try_no) == id)
}

/// What happened, in time order, from the schedule's start.
fn timeline(started: Instant, log: &Log, runs: &[(Instant, usize, ToolRun)]) -> Vec<String> {
    let ms = |at: Instant| at.saturating_duration_since(started).as_millis();
    let mut lines: Vec<(Instant, String)> = log.notes.clone();
    for p in &log.posts {
        lines.push((
            p.asked,
            format!(
                "c{} try {} asked on {}: {}",
                p.call,
                p.try_no,
                p.replica,
                intent_label(p.intent)
            ),
        ));
        let told = match (&p.answer, p.ended) {
            (None, _) => "no answer (its caller was killed)".to_owned(),
            (Some(answer), None) => format!("{answer:?}, and then its caller was killed"),
            (Some(answer), Some(_)) => format!("{answer:?}"),
        };
        let at = p.answered.unwrap_or(p.asked);
        lines.push((at, format!("c{} try {} told: {told}", p.call, p.try_no)));
    }
    for (at, intent, run) in runs {
        let by = post_of_run(&log.posts, run).map_or(String::new(), |p| {
            format!(" for c{} try {}", p.call, p.try_no)
        });
        lines.push((
            *at,
            format!(
                "server ran {}{by} under key {:?}",
                intent_label(*intent),
                run.idempotency_key
            ),
        ));
    }
    lines.sort_by_key(|(at, _)| *at);
    lines
        .into_iter()
        .map(|(at, line)| format!("{:>6} ms  {line}", ms(at)))
        .collect()
}

/// Runs one schedule on a runtime of its own (a killed replica's leftover tasks end with it).
fn run(plan: &Plan, bare: bool) -> Outcome {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let tag = format!(
        "{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    );
    let schema = TestSchema::new("pgs").expect("the URL was checked");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    // A step of the harness that fails (a bounded wait of its own, a connection refused)
    // fails the schedule with its plan, as a broken promise does.
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(run_schedule(plan, schema, &tag, bare))
    }));
    runtime.shutdown_timeout(Duration::from_secs(5));
    ran.unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Outcome {
            violations: vec![format!("the schedule stopped: {message}")],
            ..Outcome::default()
        }
    })
}

/// `future`, or a panic naming `what` once [`HARNESS_DEADLINE`] passed: the harness's own
/// waits (connections, the MCP handshake, the queries that terminate and count backends, the
/// verification) have an end too.
async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HARNESS_DEADLINE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {HARNESS_DEADLINE:?}"))
}

fn report(plan: &Plan, outcome: &Outcome) -> String {
    format!(
        "schedule {seed} breaks the promise:\n{violations}\n\nplan:\n{plan}\ntimeline:\n{timeline}\n\n\
         replay: MRG_PG_SEED={seed} cargo test --all-features --test pg_schedules -- --nocapture",
        seed = plan.seed,
        violations = outcome.violations.join("\n"),
        timeline = outcome.timeline.join("\n"),
    )
}

/// CI's budget of PostgreSQL schedules (`MRG_PG_SCHEDULES`, from `MRG_PG_BASE`), or one
/// schedule replayed (`MRG_PG_SEED`).
#[test]
fn pg_schedules_keep_the_promise() {
    if postgres_url().is_none() {
        return;
    }
    if let Some(seed) = env_u64("MRG_PG_SEED") {
        let plan = Plan::generate(seed);
        let outcome = run(&plan, false);
        println!("{plan}\ntimeline:\n{}", outcome.timeline.join("\n"));
        assert!(outcome.violations.is_empty(), "{}", report(&plan, &outcome));
        println!("schedule {seed}: no violation; {}", outcome.figures());
        return;
    }
    let count = env_u64("MRG_PG_SCHEDULES").unwrap_or(DEFAULT_SCHEDULES);
    let base = env_u64("MRG_PG_BASE").unwrap_or(DEFAULT_BASE);
    println!("running {count} PostgreSQL schedules from seed {base}");
    let started = Instant::now();
    let mut total = Outcome::default();
    for i in 0..count {
        let plan = Plan::generate(base.wrapping_add(i));
        let outcome = run(&plan, false);
        total.add(&outcome);
        if !outcome.violations.is_empty() {
            panic!("after {} schedules, {}", i + 1, report(&plan, &outcome));
        }
    }
    println!(
        "{count} schedules in {:.1} s, no violation; {}",
        started.elapsed().as_secs_f64(),
        total.figures()
    );
}

/// The checks can fail without a mutant: two replicas whose callers ask for one irreversible
/// and one idempotent call at the same moment through a bare HTTP client (no guard, no
/// ledger, as without this crate) run each twice, and the schedule says so. (The quick
/// payment's second run may come after the first caller's answer, which makes it a new
/// intent: only its missing key is certain to be reported.)
#[test]
fn a_client_without_the_guard_breaks_the_promise_and_the_schedules_say_so() {
    if postgres_url().is_none() {
        return;
    }
    let at_once = |replica, intent| CallPlan {
        replica,
        intent,
        at_ms: 0,
        retries: 0,
        backoff_ms: 0,
    };
    let plan = Plan {
        seed: 0,
        replicas: vec![
            ReplicaPlan {
                relayed: false,
                joins_at_ms: None,
            };
            2
        ],
        calls: vec![at_once(0, 0), at_once(1, 0), at_once(0, 3), at_once(1, 3)],
        faults: Vec::new(),
    };
    let outcome = run(&plan, true);
    let violations = outcome.violations.join("\n");
    for expected in [
        r#"slow_deploy{"service":"a"} ran again (key None, for c"#,
        r#"slow_deploy{"service":"a"} ran 2 times under Idempotency-Key None"#,
        r#"create_payment{"amount":100,"currency":"EUR"} ran 2 times under Idempotency-Key None"#,
    ] {
        assert!(
            violations.contains(expected),
            "expected {expected:?} among the violations:\n{violations}\n{}",
            outcome.timeline.join("\n")
        );
    }
}
