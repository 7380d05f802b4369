//! The deterministic simulator: the real guard and the real ledgers through thousands of
//! seeded schedules of crashes, cut responses, partitions, held packets and clocks past a
//! window, with the promise checked at the end of every one.
//!
//! - `MRG_SIM_SCHEDULES=N` runs N schedules (default 10,000); `MRG_SIM_BASE=S` starts at seed
//!   S (default a fixed base, so CI runs the same schedules every time; `random` for a new
//!   one, printed).
//! - `MRG_SIM_SEED=S` replays one schedule and prints its timeline.
//!
//! A failing schedule is shrunk (entries of its plan dropped while it still fails) and
//! printed as its plan and a readable timeline, with the command that replays it.

mod disk;
mod plan;
mod target;
mod world;

use std::{
    path::PathBuf,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Instant,
};

use plan::Plan;
use world::{Outcome, Stack};

/// The simulator's tests run one at a time: beside other simulations on other threads of
/// this process, one schedule has been seen to shift a request by two steps (some state the
/// threads share, not found yet; see `the_same_seed_is_the_same_schedule`). The 10,000
/// schedules still run on every core, beside each other.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn scratch(seed: u64) -> PathBuf {
    // tmpfs where there is one: the simulated disk decides durability, not the real one.
    let base = ["/dev/shm"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    // A directory of its own for every run, even of the same seed.
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    base.join(format!("mrg-sim-{}-{seed}-{run}", std::process::id()))
}

fn run(plan: &Plan) -> Outcome {
    if std::env::var_os("MRG_SIM_LOG").is_some() {
        // The guard's own tracing, for a replay.
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_test_writer()
            .try_init();
    }
    world::run(plan, &scratch(plan.seed), Stack::Guard)
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    if value == "random" {
        return Some(rand::random());
    }
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number or `random`")),
    )
}

/// Drops plan entries while the schedule still fails; the shortest failing plan.
fn shrink(plan: &Plan) -> (Plan, Outcome) {
    let mut best = plan.clone();
    let mut outcome = run(&best);
    let mut progress = true;
    let mut runs = 0;
    while progress && runs < 400 {
        progress = false;
        let mut i = 0;
        while i < best.entries.len() {
            let candidate = best.without(i);
            runs += 1;
            let tried = run(&candidate);
            if tried.violations.is_empty() {
                i += 1;
            } else {
                best = candidate;
                outcome = tried;
                progress = true;
            }
        }
    }
    (best, outcome)
}

fn report(plan: &Plan) -> String {
    // A replay with the guard's log is read as it is, not shrunk; so is a run that only
    // needs to know whether it fails (tests/sim/mutants.sh).
    let (shrunk, outcome) = if std::env::var_os("MRG_SIM_LOG").is_some()
        || std::env::var_os("MRG_SIM_NO_SHRINK").is_some()
    {
        (plan.clone(), run(plan))
    } else {
        shrink(plan)
    };
    format!(
        "schedule {seed} breaks the promise:\n{violations}\n\nshrunk to {n} of {m} entries:\n{shrunk}\ntimeline:\n{timeline}\n\nreplay: MRG_SIM_SEED={seed} cargo test --all-features --test sim -- --nocapture",
        seed = plan.seed,
        violations = outcome.violations.join("\n"),
        n = shrunk.entries.len(),
        m = plan.entries.len(),
        timeline = outcome.timeline.join("\n"),
    )
}

/// The CI budget: 10,000 schedules (or `MRG_SIM_SCHEDULES`), over every core.
#[test]
fn schedules_keep_the_promise() {
    let _alone = alone();
    if let Some(seed) = env_u64("MRG_SIM_SEED") {
        let plan = Plan::generate(seed);
        let outcome = run(&plan);
        println!("{plan}\n{}", outcome.timeline.join("\n"));
        assert!(outcome.violations.is_empty(), "{}", report(&plan));
        println!(
            "schedule {seed}: no violation ({} effects)",
            outcome.effects
        );
        return;
    }
    let count = env_u64("MRG_SIM_SCHEDULES").unwrap_or(10_000);
    let base = env_u64("MRG_SIM_BASE").unwrap_or(0x5EED_0000);
    println!("simulating {count} schedules from seed {base}");
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let effects = AtomicU64::new(0);
    let virtual_ms = AtomicU64::new(0);
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let failure = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= count || failed.load(Ordering::SeqCst) {
                            return None;
                        }
                        let plan = Plan::generate(base.wrapping_add(i));
                        let outcome = run(&plan);
                        effects.fetch_add(outcome.effects as u64, Ordering::SeqCst);
                        virtual_ms.fetch_add(outcome.virtual_ms, Ordering::SeqCst);
                        if !outcome.violations.is_empty() {
                            failed.store(true, Ordering::SeqCst);
                            return Some((i, plan));
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|w| w.join().expect("a worker"))
            .min_by_key(|(i, _)| *i)
    });
    let elapsed = started.elapsed();
    let ran = next.load(Ordering::SeqCst).min(count);
    println!(
        "{ran} schedules in {:.1} s ({:.0} schedules/s on {threads} threads), {} effects, {:.0} simulated minutes",
        elapsed.as_secs_f64(),
        ran as f64 / elapsed.as_secs_f64(),
        effects.load(Ordering::SeqCst),
        virtual_ms.load(Ordering::SeqCst) as f64 / 60_000.0
    );
    if let Some((i, plan)) = failure {
        panic!("after {} schedules, {}", i + 1, report(&plan));
    }
}

/// A seed is a schedule: replayed as a user replays it (`MRG_SIM_SEED`, a process of its
/// own), the same seed twice gives the same timeline, event for event. A run inside a process
/// that ran other simulations before is not compared: some state the process keeps across
/// simulations still reaches the schedule (seed 3588685850 delivers one request after a crash
/// a few steps later on every second run of it in one process, and on the first when the
/// process ran other schedules before; see the README).
#[test]
fn the_same_seed_is_the_same_schedule() {
    let _alone = alone();
    for seed in 0..150 {
        let seed = 0xD5E7_0000 + seed;
        let first = replay_in_a_process_of_its_own(seed);
        let second = replay_in_a_process_of_its_own(seed);
        assert!(
            !first.is_empty(),
            "seed {seed}: the replay printed no timeline"
        );
        assert_eq!(first, second, "seed {seed} replays differently");
    }
}

/// The timeline `MRG_SIM_SEED=seed` prints, run by this test binary in a new process.
fn replay_in_a_process_of_its_own(seed: u64) -> Vec<String> {
    let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "schedules_keep_the_promise", "--nocapture"])
        .env("MRG_SIM_SEED", seed.to_string())
        .env_remove("MRG_SIM_LOG")
        .output()
        .expect("the test binary runs");
    assert!(
        output.status.success(),
        "seed {seed}: the replay failed:\n{}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| is_timeline_line(line))
        .map(without_scratch)
        .collect()
}

/// `line` with the scratch directory's name (it holds the process id and a run number)
/// written as `mrg-sim`.
fn without_scratch(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find("mrg-sim-") {
        out.push_str(&rest[..i]);
        out.push_str("mrg-sim");
        rest = rest[i + "mrg-sim-".len()..]
            .trim_start_matches(|c: char| c.is_ascii_digit() || c == '-');
    }
    out.push_str(rest);
    out
}

/// A line of a printed timeline: `  7.280s p0: restarts`.
fn is_timeline_line(line: &str) -> bool {
    line.trim_start().split_once("s ").is_some_and(|(at, _)| {
        at.split_once('.').is_some_and(|(s, ms)| {
            !s.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit())
                && ms.len() == 3
                && ms.bytes().all(|b| b.is_ascii_digit())
        })
    })
}

/// Seeds that once broke the promise, each a fixed bug (the README's simulator section says
/// which). A seed names a schedule of this version of `Plan::generate`; the shrunk plans
/// below keep each schedule whatever the generator becomes.
const REGRESSIONS: &[u64] = &[
    // A re-send of an unknown execution that was not sent made the execution `not_sent`;
    // past its link window a repeat ran as a new execution (set_flag twice).
    1_592_590_567,
    // The same with a refusal: a 429 on the re-send made the execution `failed`, and the
    // next repeat ran as a new execution.
    1_592_590_620,
    // Three concurrent twins after a restart: the owner's re-send was lost, the next owner's
    // probe found it applied and handed it back; the third twin, waiting all along, started
    // a new execution.
    7_044_674,
];

/// The shrunk plans of [`REGRESSIONS`], written out.
fn regression_plans() -> Vec<Plan> {
    use plan::{Entry::*, Era, Fault, LedgerKind, Tool, Victim};
    vec![
        Plan {
            seed: 1_592_590_567,
            ledger: LedgerKind::File,
            processes: 1,
            era: Era::Stateless,
            sse: false,
            link_window_ms: 4632,
            attach_ms: 914,
            keep_results: [true, false, true, true],
            retention_ms: [None; 4],
            entries: vec![
                Call {
                    id: 2,
                    process: 0,
                    actor: 0,
                    tool: Tool::SetFlag,
                    args: 0,
                    at_ms: 426,
                    attempts: 4,
                    timeout_ms: 3190,
                    backoff_ms: 2477,
                },
                TargetFault {
                    call: 2,
                    attempt: 0,
                    fault: Fault::Slow { ms: 2179 },
                },
                Crash {
                    at_ms: 2262,
                    victim: Victim::Machine,
                    down_ms: 2262,
                },
                Crash {
                    at_ms: 2742,
                    victim: Victim::Target,
                    down_ms: 2248,
                },
            ],
        },
        Plan {
            seed: 1_592_590_620,
            ledger: LedgerKind::Memory,
            processes: 1,
            era: Era::Sessions,
            sse: false,
            link_window_ms: 3900,
            attach_ms: 1660,
            keep_results: [true, true, true, false],
            retention_ms: [None; 4],
            entries: vec![
                Call {
                    id: 3,
                    process: 0,
                    actor: 0,
                    tool: Tool::SetFlag,
                    args: 1,
                    at_ms: 3964,
                    attempts: 4,
                    timeout_ms: 3968,
                    backoff_ms: 550,
                },
                TargetFault {
                    call: 3,
                    attempt: 0,
                    fault: Fault::LostAfterEffect,
                },
                TargetFault {
                    call: 3,
                    attempt: 1,
                    fault: Fault::Status { code: 429 },
                },
            ],
        },
    ]
}

#[test]
fn schedules_that_once_failed_keep_the_promise() {
    let _alone = alone();
    let only = env_u64("MRG_SIM_REGRESSION");
    let plans = REGRESSIONS
        .iter()
        .map(|&seed| Plan::generate(seed))
        .chain(regression_plans())
        .filter(|plan| only.is_none_or(|seed| seed == plan.seed));
    for plan in plans {
        let outcome = run(&plan);
        assert!(outcome.violations.is_empty(), "{}", report(&plan));
    }
}

/// The checks can fail: the same kind of schedules through a generic retry (the hyper client
/// alone, every attempt re-sent as it is) break the promise, and the simulator says so.
#[test]
fn a_generic_retry_breaks_the_promise_and_the_simulator_says_so() {
    let _alone = alone();
    let broken = (0..100)
        .filter(|i| {
            let plan = Plan::generate(0xB11D_0000 + i);
            !world::run(&plan, &scratch(plan.seed), Stack::BlindRetry)
                .violations
                .is_empty()
        })
        .count();
    println!("{broken} of 100 schedules break the promise without the guard");
    assert!(
        broken >= 20,
        "only {broken} of 100 schedules broke the promise without the guard"
    );
}
