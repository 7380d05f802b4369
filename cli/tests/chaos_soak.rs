//! The seeded chaos soak: two agent processes share one `FileLedger` and call
//! the four classes of tools on two rmcp servers (one per protocol era), while this process
//! injects random faults into the servers and the plan repeats intents at random, often from
//! both processes at once. At the end: no irreversible execution ran twice and no new one was
//! started over an undelivered one, every completed result loads, the hash chain verifies, and
//! each child's peak resident memory stays under a stated bound.
//!
//! Meanwhile a third agent process, a victim, works on the intents the two agents are at and
//! is SIGKILLed at a random moment, again and again; every second victim starts on the same
//! intents as the one before it, so it continues the executions its predecessor left
//! dispatched (re-sends, probes, continuations of never-sent ones) and is killed in the middle
//! of those. The two agents continue whatever the victims leave behind.
//!
//! And a compactor process opens the same ledger and calls `FileLedger::compact(now)` in a loop
//! (archive the file as `<ledger>.<seq>.archive`, start a new one with a checkpoint and the
//! retained executions' lines), with a short random pause, and is SIGKILLed again and again
//! (up to 12 times at the default size): half of the kills at a random moment of its life
//! (opening the ledger, compacting, pausing), half a few milliseconds after it began writing a
//! new file, inside a compaction. The end checks read the ledger as one chain, the archives
//! oldest first and then the live file: the chain verifies through every archive (`verify_file` and
//! `replay-guard audit verify`); every execution the chain ever held is still in the ledger with
//! the events it was written with, in order (compaction copies the retained executions' lines
//! into the new file: a copy counts once, at its first position); and the irreversible check
//! orders executions by those first positions. A compactor that fails a compaction ends and
//! fails the soak.
//!
//! `MRG_SOAK_CALLS` sets the number of planned calls (default 2,000; 100,000 for a long run),
//! `MRG_SOAK_SEED` replays a run: the seed is printed first. The seed fixes every child's plan
//! (which intent, which era, which duplicates) and the sequence of faults; which call a fault
//! lands on also depends on timing, so a replay repeats the workload, not every interleaving.

mod support;

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use mcp_replay_guard::{
    Actor, ExecutionId, IntentScope,
    contract::{ContractRegistry, ProbeOutcome, ProbeRequest, StatusProbe},
    execution::{ExecutionRecord, ExecutionState, LedgerEvent, Timestamp},
    guard::{GuardLayer, GuardRequestBody},
    ledger::{FileLedger, Ledger, chain, verify_file},
    resume::ResumeLayer,
};
use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};
use support::*;
use tower::ServiceBuilder;

const DEFAULT_CALLS: usize = 2_000;
/// Calls each child keeps in flight at once.
const CONCURRENCY: usize = 4;
/// Attempts an agent makes for one planned call before it gives up.
const AGENT_ATTEMPTS: i64 = 4;
/// Peak resident memory a child may reach. A fixed allowance for the runtime, the client and
/// the test binary, plus 3 KiB per planned call for the ledger's in-memory index: each child
/// catches up with every execution of both processes and keeps them (and their kept results)
/// for the contract's retention, about 2 KiB each measured. Measured peaks: 21.8 MiB at 2,000
/// calls, 38.7 MiB at 10,000, 251.5 MiB at 100,000; the bounds there are 37.9, 61.3 and
/// 325 MiB.
fn memory_bound_kib(calls: usize) -> u64 {
    32 * 1024 + 3 * calls as u64
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={value:?} is not a number: {e}")),
    )
}

// ---- the workload --------------------------------------------------------------------------

/// One intent of the plan: what the agent means to do, the same in both processes.
#[derive(Debug, Clone)]
struct Intent {
    era: Era,
    tool: &'static str,
    args: Value,
}

/// Intent `j` of the run with `seed`: a tool of each class in fixed proportions, unique
/// arguments per intent (read-only calls have none), and an era.
fn intent(seed: u64, j: usize) -> Intent {
    let mut rng = StdRng::seed_from_u64(seed ^ (j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let era = if rng.random_bool(0.5) {
        Era::Sessions
    } else {
        Era::Stateless
    };
    let (tool, args) = match rng.random_range(0..100) {
        0..35 => (
            "deploy_release",
            json!({"service": format!("svc-{j}"), "version": format!("{seed:x}.{j}")}),
        ),
        35..60 => (
            "create_payment",
            json!({"amount": j + 1, "currency": "eur"}),
        ),
        60..80 => ("rotate_credential", json!({"name": format!("cred-{j}")})),
        _ => ("list_branches", json!({})),
    };
    Intent { era, tool, args }
}

/// The intents child `child` calls, in order: mostly intent `k` at step `k` (the other child
/// calls it at about the same time: a duplicate across processes), and one time in four an
/// intent from the last 16 steps again (a later duplicate, from either process).
fn plan(seed: u64, child: usize, calls: usize) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(child as u64 + 1));
    (0..calls)
        .map(|k| {
            if k > 0 && rng.random_bool(0.25) {
                rng.random_range(k.saturating_sub(16)..k)
            } else {
                k
            }
        })
        .collect()
}

fn registry() -> ContractRegistry {
    one_contract_per_class()
}

/// The status probe of the server the probed execution went to (one per era).
#[derive(Debug)]
struct ProbeByTarget(Vec<(String, CredentialStatusProbe)>);

#[async_trait]
impl StatusProbe for ProbeByTarget {
    async fn probe(&self, request: ProbeRequest<'_>) -> ProbeOutcome {
        let target = request.execution.target().to_string();
        match self.0.iter().find(|(url, _)| url.contains(&target)) {
            Some((_, probe)) => probe.probe(request).await,
            None => ProbeOutcome::Unknown {
                reason: format!("no probe for target {target}"),
            },
        }
    }
}

// ---- the child: one agent process ----------------------------------------------------------

/// Runs this test binary again as soak child `index`.
fn spawn_child(index: usize, path: &Path, urls: &[String; 2], seed: u64, calls: usize) -> Command {
    child_process(&format!(
        "{index}|{}|{}|{}|{seed}|{calls}",
        path.display(),
        urls[0],
        urls[1]
    ))
}

/// The child side: does nothing unless `MRG_CHILD` names a task.
#[test]
#[ignore = "a child process's entry point, run by the tests that start it (with MRG_CHILD set)"]
fn child_entry() {
    let Ok(task) = std::env::var("MRG_CHILD") else {
        return;
    };
    let parts: Vec<&str> = task.split('|').collect();
    if let [
        "victim",
        index,
        path,
        sessions_url,
        stateless_url,
        seed,
        start,
    ] = parts[..]
    {
        return victim_entry(
            index.parse().expect("index"),
            Path::new(path),
            [sessions_url.to_owned(), stateless_url.to_owned()],
            seed.parse().expect("seed"),
            start.parse().expect("start"),
        );
    }
    if let ["compactor", index, path, seed] = parts[..] {
        return compactor_entry(
            index.parse().expect("index"),
            Path::new(path),
            seed.parse().expect("seed"),
        );
    }
    let [index, path, sessions_url, stateless_url, seed, calls] = parts[..] else {
        panic!("bad child task {task}");
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (index, seed) = (index.parse().expect("index"), seed.parse().expect("seed"));
    let plan = plan(seed, index, calls.parse().expect("calls"));
    let stats = runtime.block_on(soak_child(
        index,
        Path::new(path),
        [sessions_url.to_owned(), stateless_url.to_owned()],
        seed,
        plan,
    ));
    drop(runtime);
    println!("\nSOAK_CHILD {stats} vmhwm_kib={}", peak_rss_kib());
}

/// Peak resident set size of this process (`VmHWM` in `/proc/self/status`), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

#[derive(Debug, Default)]
struct ChildStats {
    calls: AtomicUsize,
    results: AtomicUsize,
    uncertain: AtomicUsize,
    gave_up: AtomicUsize,
    attempts: AtomicUsize,
}

impl std::fmt::Display for ChildStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |a: &AtomicUsize| a.load(Ordering::SeqCst);
        write!(
            f,
            "calls={} results={} uncertain={} gave_up={} attempts={}",
            n(&self.calls),
            n(&self.results),
            n(&self.uncertain),
            n(&self.gave_up),
            n(&self.attempts)
        )
    }
}

async fn soak_child(
    index: usize,
    path: &Path,
    urls: [String; 2],
    seed: u64,
    plan: Vec<usize>,
) -> ChildStats {
    let calls = plan.len();
    let ledger = FileLedger::open(path).expect("open the shared ledger");
    let probes = Era::ALL
        .iter()
        .zip(&urls)
        .map(|(era, url)| (url.clone(), CredentialStatusProbe::new(url, *era)))
        .collect();
    let client = ServiceBuilder::new()
        .layer(
            GuardLayer::new(
                ledger.clone(),
                registry()
                    .with_status_probe("rotate_credential", ProbeByTarget(probes))
                    .expect("rotate_credential is recoverable"),
                ledger.fingerprint_key().expect("the shared key"),
            )
            .actor(Actor::from("signed-process:com.example.agent"))
            .intent_scope(IntentScope::from(format!("run:soak-{seed:x}"))),
        )
        .layer(
            ResumeLayer::new()
                .max_attempts(3)
                .max_delay(Duration::from_millis(20)),
        )
        .service(hyper_client_with_body::<GuardRequestBody>());
    let session = Arc::new(Mutex::new(Era::Sessions.open_session(&urls[0]).await));
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicUsize::new(0));
    let stats = Arc::new(ChildStats::default());
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (mut client, urls, session, plan, next, stats) = (
                client.clone(),
                urls.clone(),
                session.clone(),
                plan.clone(),
                next.clone(),
                stats.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&j) = plan.get(k) else { break };
                    let intent = intent(seed, j);
                    let url = &urls[usize::from(intent.era == Era::Stateless)];
                    stats.calls.fetch_add(1, Ordering::SeqCst);
                    // The agent: call, and call again (new JSON-RPC id) until it gets a result
                    // or an uncertain answer; a lost session is opened anew first.
                    let mut told = Told::Nothing("not called");
                    for attempt in 0..AGENT_ATTEMPTS {
                        let id = ((index * calls + k) as i64) * AGENT_ATTEMPTS + attempt + 1;
                        let current = session.lock().unwrap().clone();
                        let request = intent.era.tool_call(
                            url,
                            current.as_deref(),
                            id,
                            intent.tool,
                            intent.args.clone(),
                        );
                        stats.attempts.fetch_add(1, Ordering::SeqCst);
                        told = agent_call(&mut client, request, id).await;
                        if told.is_final() {
                            break;
                        }
                        if matches!(told, Told::Status(404)) && intent.era == Era::Sessions {
                            let fresh = Era::Sessions.open_session(&urls[0]).await;
                            *session.lock().unwrap() = fresh;
                        }
                    }
                    let counter = match told {
                        Told::Result(_) => &stats.results,
                        Told::Uncertain(_) => &stats.uncertain,
                        _ => &stats.gave_up,
                    };
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("a soak worker panicked");
    }
    Arc::into_inner(stats).expect("the workers are done")
}

/// Intents a victim calls: from a little behind `start` (where the agents were when it was
/// spawned) to well ahead of it, each one once.
const VICTIM_BEHIND: usize = 8;
const VICTIM_AHEAD: usize = 64;

/// A victim agent process: the agents' client on intents around `start`, until it is killed.
fn victim_entry(index: usize, path: &Path, urls: [String; 2], seed: u64, start: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let plan = (start.saturating_sub(VICTIM_BEHIND)..start + VICTIM_AHEAD).collect();
    runtime.block_on(soak_child(index, path, urls, seed, plan));
}

/// How far the agents got: the executions accepted in the ledger so far.
fn progress(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|text| text.matches("\"event\":\"accepted\"").count())
        .unwrap_or(0)
}

/// Until `stop`, keeps one victim process running and SIGKILLs it after a random while (the
/// moment is the chaos; nothing waits for a state); returns how many were killed.
fn kill_victims(
    path: PathBuf,
    urls: [String; 2],
    seed: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<usize> {
    tokio::task::spawn_blocking(move || {
        let mut rng = StdRng::seed_from_u64(seed.rotate_left(17));
        let (mut killed, mut start) = (0, 0);
        while !stop.load(Ordering::SeqCst) {
            // Every second victim starts where the one before it did: it continues what that
            // one left dispatched, and is killed in the middle of it.
            if killed % 2 == 0 {
                start = progress(&path);
            }
            let mut victim = child_process(&format!(
                "victim|{}|{}|{}|{}|{seed}|{start}",
                2 + killed,
                path.display(),
                urls[0],
                urls[1]
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn a victim");
            std::thread::sleep(Duration::from_millis(rng.random_range(100..600)));
            victim.kill().expect("SIGKILL a victim");
            victim.wait().expect("reap a victim");
            killed += 1;
            // A pause before the next one, so that the agents, not the victims, do most of the
            // work (and the soak takes about as long as without them).
            std::thread::sleep(Duration::from_millis(rng.random_range(200..1200)));
        }
        killed
    })
}

/// The most compactors a run kills: one per 160 planned calls, at least 10 (12 at the default
/// 2,000 calls), so that a CI run stays short (each compactor reads the whole ledger when it
/// opens it, and each completed compaction makes every process read the new file again) and a
/// long run keeps compacting.
fn compactor_kills(calls: usize) -> usize {
    (calls / 160).max(10)
}

/// A compactor process: compacts the shared ledger (archive, new file with the retained
/// executions) again and again, with a short random pause, until it is killed. A compaction
/// that fails ends the process with the error on stderr: the parent fails the soak with it.
fn compactor_entry(index: usize, path: &Path, seed: u64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let ledger = match FileLedger::open(path) {
            Ok(ledger) => ledger,
            Err(error) => {
                eprintln!("compactor {index}: cannot open the ledger: {error}");
                std::process::exit(1);
            }
        };
        let mut rng = StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0xC2B2_AE35));
        loop {
            if let Err(error) = ledger.compact(Timestamp::now()).await {
                eprintln!("compactor {index}: compaction failed: {error}");
                std::process::exit(1);
            }
            // Pacing, not waiting for a state.
            tokio::time::sleep(Duration::from_millis(rng.random_range(20..150))).await;
        }
    });
}

/// What the compactor killer did.
#[derive(Debug, Default)]
struct Compactors {
    killed: usize,
    /// Kills that left a `<ledger>.compacting` file the compactor had written and not yet put
    /// in place: the kill landed in the middle of a compaction.
    mid_compaction: usize,
}

/// Until `stop` (or `max` kills), keeps one compactor process running and SIGKILLs it, again
/// and again; a compactor that ended on its own (a compaction failed) fails the soak. Half of
/// the kills land at a random moment of the compactor's life (opening the ledger, compacting,
/// pausing); the other half a random few milliseconds after the compactor began writing a new
/// file (its `.compacting` file changed), so that many land inside a compaction.
fn kill_compactors(
    path: PathBuf,
    seed: u64,
    max: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Compactors> {
    tokio::task::spawn_blocking(move || {
        let mut rng = StdRng::seed_from_u64(seed.rotate_left(29));
        let compacting = sibling(&path, "compacting");
        let mut found = Compactors::default();
        while !stop.load(Ordering::SeqCst) && found.killed < max {
            let before = modified(&compacting);
            let mut compactor = child_process(&format!(
                "compactor|{}|{}|{seed}",
                found.killed,
                path.display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn a compactor");
            if rng.random_bool(0.5) {
                std::thread::sleep(Duration::from_millis(rng.random_range(100..700)));
            } else {
                // Until the compactor starts a compaction (bounded: a compactor that ends or
                // stalls is killed anyway), then a random moment into it.
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                while modified(&compacting) == before
                    && std::time::Instant::now() < deadline
                    && compactor.try_wait().expect("poll a compactor").is_none()
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(rng.random_range(0..10)));
            }
            let ended = compactor.try_wait().expect("poll a compactor");
            compactor.kill().expect("SIGKILL a compactor");
            let output = compactor.wait_with_output().expect("reap a compactor");
            assert!(
                ended.is_none(),
                "compactor {} ended on its own ({}): {}",
                found.killed,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            found.killed += 1;
            let after = modified(&compacting);
            found.mid_compaction += usize::from(after.is_some() && after != before);
            // A pause before the next one, so that compaction stays a fraction of the work.
            std::thread::sleep(Duration::from_millis(rng.random_range(1000..2500)));
        }
        found
    })
}

/// When `path` was last written (`None` when there is no such file).
fn modified(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// `<ledger>.<suffix>`, the way the ledger names the files beside it.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().expect("a file name").to_os_string();
    name.push(format!(".{suffix}"));
    path.with_file_name(name)
}

// ---- the parent: servers, faults, and the checks -------------------------------------------

/// The faults the scheduler draws from (each lands on the next call of its tool).
const FAULTS: [Fault; 6] = [
    Fault::DropResponseAfterTool,
    Fault::CutStreamAfterFirstEvent,
    Fault::Status(500),
    Fault::Status(502),
    Fault::Status(404),
    Fault::RefuseBeforeRead,
];

/// Until `stop`, keeps a random fault waiting (at random) for the next call of a random tool.
fn schedule_faults(
    servers: [Arc<ServerState>; 2],
    seed: u64,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rng = StdRng::seed_from_u64(!seed);
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let server = &servers[rng.random_range(0..2)];
            let tool = TOOL_NAMES[rng.random_range(0..TOOL_NAMES.len())];
            let fault = FAULTS[rng.random_range(0..FAULTS.len())].clone();
            if rng.random_bool(0.3) && server.faults().pending_for(tool) == 0 {
                server.faults().schedule(tool, fault);
            }
        }
    })
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "mrg-soak-{}-{}",
        std::process::id(),
        ExecutionId::new().ulid()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// The ledger's lines as one chain: the archives (oldest first, as `verify_file` found them
/// through the checkpoints), then the live file.
#[derive(Debug, Default)]
struct Chain {
    /// The `seq` of the first line of each (execution, event name).
    positions: HashMap<(ExecutionId, String), u64>,
    /// Each execution's events in the order they were first written. Compaction writes the
    /// retained executions' events again into the new file: a copy of an event already seen
    /// (the same execution, time and kind) is not a new one.
    events: HashMap<ExecutionId, Vec<LedgerEvent>>,
    lines: usize,
}

fn read_chain(files: &[PathBuf]) -> Chain {
    let mut read = Chain::default();
    for file in files {
        let text = std::fs::read_to_string(file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        for line in text.lines() {
            let line = chain::parse_line(line).expect("a verified line parses");
            read.lines += 1;
            if let Some(event) = line.event() {
                read.positions
                    .entry((event.execution_id, event.kind.name().to_owned()))
                    .or_insert(line.seq);
                let events = read.events.entry(event.execution_id).or_default();
                if !events.contains(event) {
                    events.push(event.clone());
                }
            }
        }
    }
    read
}

/// Compaction lost, reordered or invented no event: every execution the chain ever held is
/// still in the ledger (a 24-hour retention expires none during the soak), with its events in
/// the order they were first written. Returns how many executions were compared.
async fn check_compacted_events(
    ledger: &FileLedger,
    history: &Chain,
    records: &[ExecutionRecord],
) -> usize {
    let live: std::collections::HashSet<ExecutionId> =
        records.iter().map(|r| r.execution_id()).collect();
    for (id, written) in &history.events {
        assert!(
            live.contains(id),
            "execution {id} was in the chain and is gone from the ledger"
        );
        let mut first = Vec::new();
        for event in ledger.events(*id).await.expect("events") {
            if !first.contains(&event) {
                first.push(event);
            }
        }
        assert_eq!(
            &first, written,
            "execution {id}: the ledger's events are not the ones the chain wrote"
        );
    }
    assert_eq!(
        history.events.len(),
        records.len(),
        "an execution of the ledger is in no file"
    );
    history.events.len()
}

/// What the irreversible check found.
#[derive(Debug, Default)]
struct Irreversible {
    intents: usize,
    runs: usize,
    executions: usize,
    repeats_after_delivery: usize,
    held: usize,
}

/// No irreversible execution ran twice, every run belongs to an execution of the ledger, and
/// a new execution of an intent was only ever started after the previous one was delivered
/// to the agent or provably did not run (a deliberate repeat, not a blind re-send).
async fn check_irreversible(
    history: &Chain,
    servers: &[&TestServer],
    records: &[ExecutionRecord],
) -> Irreversible {
    let by_id: HashMap<String, &ExecutionRecord> = records
        .iter()
        .map(|r| (r.execution_id().to_string(), r))
        .collect();
    let mut found = Irreversible::default();
    let mut runs_per_key: HashMap<String, usize> = HashMap::new();
    let mut intents = std::collections::HashSet::new();
    for server in servers {
        for run in server.state.tool_runs("deploy_release") {
            found.runs += 1;
            intents.insert(run.arguments.to_string());
            let key = run
                .idempotency_key
                .expect("every guarded run carries a key");
            let record = by_id
                .get(&key)
                .unwrap_or_else(|| panic!("a run under {key}, which is no execution"));
            assert_eq!(record.tool(), "deploy_release");
            *runs_per_key.entry(key).or_default() += 1;
        }
    }
    found.intents = intents.len();
    let twice: Vec<_> = runs_per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "irreversible executions ran twice: {twice:?}"
    );

    let mut per_intent: BTreeMap<String, Vec<&ExecutionRecord>> = BTreeMap::new();
    for record in records.iter().filter(|r| r.tool() == "deploy_release") {
        found.executions += 1;
        found.held += usize::from(record.state() == ExecutionState::NeedsReview);
        per_intent
            .entry(record.fingerprint().to_string())
            .or_default()
            .push(record);
    }
    // Order by the chain (the order the claims were decided in, across both processes), not by
    // timestamps: a claim is stamped before it waits for the file lock.
    let seq = |record: &ExecutionRecord, event: &str| {
        history
            .positions
            .get(&(record.execution_id(), event.to_owned()))
            .copied()
    };
    for executions in per_intent.values_mut() {
        executions.sort_by_key(|r| seq(r, "accepted"));
        for pair in executions.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            let accepted = seq(later, "accepted").expect("every execution was accepted");
            let delivered = matches!(
                earlier.state(),
                ExecutionState::Completed | ExecutionState::ResolvedApplied
            ) && seq(earlier, "delivered").is_some_and(|at| at < accepted);
            let did_not_run = matches!(
                earlier.state(),
                ExecutionState::Failed | ExecutionState::ResolvedNotApplied
            );
            assert!(
                delivered || did_not_run,
                "a new execution over one the agent never got:\n{earlier:#?}\n{later:#?}"
            );
            found.repeats_after_delivery += usize::from(delivered);
        }
    }
    found
}

/// Every completed execution's result is kept and loads as JSON. Returns how many.
async fn check_results(ledger: &FileLedger, records: &[ExecutionRecord]) -> usize {
    let mut completed = 0;
    for record in records
        .iter()
        .filter(|r| r.state() == ExecutionState::Completed)
    {
        completed += 1;
        let reference = record
            .result_reference()
            .unwrap_or_else(|| panic!("completed without a kept result: {record:#?}"));
        let bytes = ledger
            .load_result(reference)
            .await
            .expect("load_result")
            .unwrap_or_else(|| panic!("result {reference} does not load"));
        let result: Value = serde_json::from_slice(&bytes).expect("a kept result is JSON");
        assert!(result.get("content").is_some(), "{result}");
    }
    completed
}

/// The same check an operator runs: `replay-guard audit verify` (when the binary is built).
fn cli_verify(path: &Path) {
    let Some(binary) = option_env!("CARGO_BIN_EXE_replay-guard") else {
        println!("replay-guard not built (feature cli off): skipping `audit verify`");
        return;
    };
    let output = Command::new(binary)
        .args(["audit", "verify"])
        .arg(path)
        .output()
        .expect("run replay-guard");
    assert!(
        output.status.success(),
        "replay-guard audit verify: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak_two_processes_one_file_ledger_no_duplicate_side_effects() {
    let seed = env_number("MRG_SOAK_SEED").unwrap_or_else(rand::random);
    let calls = env_number("MRG_SOAK_CALLS").map_or(DEFAULT_CALLS, |n| n as usize);
    println!("chaos soak: MRG_SOAK_SEED={seed} MRG_SOAK_CALLS={calls} (set both to replay)");

    let sessions = TestServer::start_with(ServerOptions {
        event_store: true,
        sse_retry: Some(Duration::from_millis(10)),
        ..ServerOptions::default()
    })
    .await;
    let stateless = TestServer::start_with(ServerOptions::stateless()).await;
    let urls = [sessions.url.clone(), stateless.url.clone()];
    let dir = temp_dir();
    let path = dir.join("ledger.jsonl");
    println!("ledger: {} (removed when the soak passes)", path.display());
    // Created here, once, so both children read the same fingerprint key.
    FileLedger::open(&path)
        .and_then(|ledger| ledger.fingerprint_key())
        .expect("create the ledger and its key");

    let stop = Arc::new(AtomicBool::new(false));
    let scheduler = schedule_faults(
        [sessions.state.clone(), stateless.state.clone()],
        seed,
        stop.clone(),
    );
    let victims = kill_victims(path.clone(), urls.clone(), seed, stop.clone());
    let compactors = kill_compactors(path.clone(), seed, compactor_kills(calls), stop.clone());
    let per_child = [calls - calls / 2, calls / 2];
    let children: Vec<_> = (0..2)
        .map(|i| {
            spawn_child(i, &path, &urls, seed, per_child[i])
                .spawn()
                .expect("spawn a soak child")
        })
        .collect();
    let outputs = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|c| c.wait_with_output().expect("wait for a soak child"))
            .collect::<Vec<_>>()
    })
    .await
    .expect("join");
    stop.store(true, Ordering::SeqCst);
    scheduler.await.expect("the fault scheduler");
    let killed = victims.await.expect("the victim killer");
    assert!(
        killed > 0,
        "no victim was killed: the soak tested no continuation"
    );
    let compactors = compactors.await.expect("the compactor killer");

    let mut planned = 0;
    for (i, output) in outputs.iter().enumerate() {
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "child {i} failed: {stdout}");
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("SOAK_CHILD "))
            .unwrap_or_else(|| panic!("child {i} printed no stats: {stdout}"));
        println!("child {i}: {line}");
        let field = |name: &str| -> u64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line}"))
        };
        planned += field("calls");
        let peak = field("vmhwm_kib");
        let bound = memory_bound_kib(calls);
        assert!(
            peak < bound,
            "child {i} peaked at {peak} KiB resident, over the {bound} KiB bound"
        );
    }
    assert_eq!(planned, calls as u64, "every planned call was made");

    let fired: usize = [&sessions, &stateless]
        .iter()
        .map(|s| s.state.faults().fired().len())
        .sum();
    // Reopen first: a victim killed after its dispatch left an execution whose owner is gone,
    // and the open records it `unknown` (one more line), so the chain is read after that.
    let ledger = FileLedger::open(&path).expect("reopen the ledger");
    let report = verify_file(&path).expect("read the ledger");
    assert!(report.is_ok(), "{report}");
    cli_verify(&path);
    let records = ledger.list().await.expect("list");
    let completed = check_results(&ledger, &records).await;
    let history = read_chain(&report.files);
    assert_eq!(
        history.lines as u64, report.verified,
        "every verified line was read"
    );
    let compared = check_compacted_events(&ledger, &history, &records).await;
    let irreversible = check_irreversible(&history, &[&sessions, &stateless], &records).await;
    // Each file before the live one is an archive a compaction left; an archive beside the
    // ledger that no checkpoint names was linked by a compactor killed before it put the new
    // file in place.
    let compactions = report.files.len() - 1;
    let unnamed = std::fs::read_dir(&dir)
        .expect("read the soak dir")
        .flatten()
        .map(|entry| entry.path())
        .filter(|p| p.extension().is_some_and(|e| e == "archive") && !report.files.contains(p))
        .count();
    let side_effects: usize = [&sessions, &stateless]
        .iter()
        .map(|s| s.state.total_side_effects())
        .sum();
    println!(
        "faults fired: {fired}; victims killed: {killed}; side effects: {side_effects}; \
         executions: {}; completed results (all load): {completed}; chain: {} lines \
         verified in {} files\n\
         compactions: {compactions}; compactors killed: {} ({} mid-compaction, {unnamed} of \
         them after archiving, before the swap); executions whose events survived every \
         compaction: {compared}\n\
         irreversible: {} intents, {} runs, {} executions, 0 ran twice, {} deliberate repeats \
         after delivery, {} held for review",
        records.len(),
        report.verified,
        report.files.len(),
        compactors.killed,
        compactors.mid_compaction,
        irreversible.intents,
        irreversible.runs,
        irreversible.executions,
        irreversible.repeats_after_delivery,
        irreversible.held
    );
    assert!(fired > 0, "no fault fired: the soak tested nothing");
    assert!(
        compactors.killed > 0 && compactions > 0,
        "no compactor was killed or no compaction happened: the soak tested no compaction"
    );
    drop(ledger);
    std::fs::remove_dir_all(&dir).ok();
}
