//! A schedule: everything one simulation run does, drawn from one seed before it starts.
//!
//! A plan is data (calls, target faults, crashes, partitions, operator visits), so a failing
//! plan can be shrunk by dropping entries and run again: every entry is named by a stable id
//! (a call's faults name the call, not its position), so removing one entry leaves the others
//! meaning what they meant.

use std::fmt;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

/// The four retry classes, one tool each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Tool {
    /// `read_only`: re-sent freely.
    Read,
    /// `idempotent`, against a target that honours `Idempotency-Key`.
    SetFlag,
    /// `recoverable`, with a status probe that asks the target.
    Charge,
    /// `irreversible`: never re-sent.
    Deploy,
}

impl Tool {
    pub const ALL: [Tool; 4] = [Tool::Read, Tool::SetFlag, Tool::Charge, Tool::Deploy];

    pub fn name(self) -> &'static str {
        match self {
            Tool::Read => "read_status",
            Tool::SetFlag => "set_flag",
            Tool::Charge => "charge",
            Tool::Deploy => "deploy",
        }
    }

    pub fn from_name(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.name() == name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerKind {
    Memory,
    File,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Era {
    Sessions,  // 2025-11-25
    Stateless, // 2026-07-28
}

impl Era {
    pub fn version(self) -> &'static str {
        match self {
            Era::Sessions => "2025-11-25",
            Era::Stateless => "2026-07-28",
        }
    }
}

/// What the target does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// Reads the request, then closes the connection without running the tool.
    DropBeforeEffect,
    /// Runs the tool, then closes the connection without an answer.
    LostAfterEffect,
    /// Runs the tool, answers as SSE and cuts the stream after `frames` frames (0: after
    /// the headers; 1: after the priming event; 2: after the result event).
    CutAfter { frames: u8 },
    /// Takes `ms` to run the tool.
    Slow { ms: u64 },
    /// Answers this status without running the tool.
    Status { code: u16 },
    /// Runs the tool, then answers HTTP 200 with a JSON-RPC error of `code` (an exception
    /// after the commit, a gateway's error after forwarding): the effect happened.
    ErrorAfterEffect { code: i32 },
}

/// What crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Victim {
    /// One agent process (SIGKILL: the kernel keeps what it wrote).
    Process(usize),
    /// The machine of the agent processes (power loss: what was not synced is lost).
    Machine,
    /// The MCP target's process.
    Target,
}

/// Where, inside one disk operation, a crash falls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    BeforeWrite,
    AfterWrite,
    AfterSync,
}

/// Where a call carries its credential when its actor is read from credentials, as the proxy
/// reads it (every credential a server could receive enters the actor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Carrier {
    Authorization,
    ApiKey,
    Cookie,
    Query,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Entry {
    /// One caller's logical call: it asks up to `attempts` times until it gets an answer it
    /// can act on.
    Call {
        id: u32,
        process: usize,
        actor: u8,
        tool: Tool,
        args: u8,
        at_ms: u64,
        attempts: u8,
        timeout_ms: u64,
        backoff_ms: u64,
        /// `None`: the caller names its actor (an `Actor` of its own); else the actor is read
        /// from the credential it carries there, and a refreshed credential is another actor.
        #[serde(default)]
        carrier: Option<Carrier>,
    },
    /// The credential of `actor` is replaced at `at_ms` (a refreshed token): its calls from
    /// then on carry the new one.
    Refresh { actor: u8, at_ms: u64 },
    /// The clock of the agents' machine steps by `by_ms` at `at_ms` (forward past a window or
    /// a retention, or back). The processes of one machine share its clock, and a file ledger's
    /// processes share one machine.
    ClockStep { at_ms: u64, by_ms: i64 },
    /// Process `process` compacts the file ledger at `at_ms`, while the others append; with
    /// `killed`, the process is killed inside the compaction, as it syncs the directory that
    /// holds the compacted file's new name (and restarts 500 ms later).
    Compact {
        process: usize,
        at_ms: u64,
        #[serde(default)]
        killed: bool,
    },
    /// The caller of attempt `attempt` of call `call` drops the answer unread (a client that
    /// resets the connection): it was not delivered, and the caller asks again.
    Unread { call: u32, attempt: u8 },
    /// An operator who settles as not applied every execution the target is still running,
    /// at `at_ms`: the guard must refuse while the process that owns it lives.
    Resolver { at_ms: u64 },
    /// The target's behaviour for attempt `attempt` of call `call`.
    TargetFault {
        call: u32,
        attempt: u8,
        fault: Fault,
    },
    /// A crash at `at_ms`; the victim restarts `down_ms` later.
    Crash {
        at_ms: u64,
        victim: Victim,
        down_ms: u64,
    },
    /// Process `process` crashes inside its `op`-th disk operation (counted over its
    /// lives); with `machine`, the whole machine does, the disk loses what was not synced
    /// and keeps `tear` thousandths of it (a kernel may have written out any prefix of the
    /// unsynced bytes: the rest, any suffix, is lost); with `corrupt`, the last synced line is
    /// damaged too.
    DiskCrash {
        process: usize,
        op: u32,
        phase: Phase,
        machine: bool,
        tear: u16,
        corrupt: bool,
        down_ms: u64,
    },
    /// No packet between `process` and the target from `at_ms` for `for_ms`.
    Partition {
        process: usize,
        at_ms: u64,
        for_ms: u64,
    },
    /// Packets between `process` and the target are held from `at_ms` for `for_ms`, then
    /// delivered (a delay that reorders connections).
    Hold {
        process: usize,
        at_ms: u64,
        for_ms: u64,
    },
    /// An operator resolves every held execution from what the target really did.
    Operator { at_ms: u64 },
    /// The target machine's clock steps by `by_ms` at `at_ms` (forward or back), its own step
    /// apart from the agents'.
    TargetClockStep { at_ms: u64, by_ms: i64 },
    /// In a proxy plan: the caller of attempt `attempt` of call `call` closes its side of
    /// the connection right after its request (a half-close, as `nc -N` does) and reads the
    /// answer to its end.
    HalfClose { call: u32, attempt: u8 },
    /// In a stdio plan: process `process` is killed right after its relay wrote its
    /// `answer`-th answer (counted over its lives) to the client and before the client read
    /// it: the answer is in the client's pipe, and nobody reads it.
    CrashAfterAnswer {
        process: usize,
        answer: u32,
        down_ms: u64,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub seed: u64,
    pub ledger: LedgerKind,
    pub processes: usize,
    pub era: Era,
    /// Answers as SSE (else JSON) when the target has no fault for the request.
    pub sse: bool,
    pub link_window_ms: u64,
    pub attach_ms: u64,
    /// Per tool (in [`Tool::ALL`] order): whether results are kept.
    pub keep_results: [bool; 4],
    /// Per tool (in [`Tool::ALL`] order): a short retention (ms, at least the link window),
    /// or `None` for [`DEFAULT_RETENTION_MS`].
    pub retention_ms: [Option<u64>; 4],
    /// The crate's server half (`IdempotencyLayer`) stands in front of the target and honours
    /// every tool's key; else the target honours `set_flag`'s itself.
    #[serde(default)]
    pub server_half: bool,
    /// Every agent process talks to the target as a stdio client does: through the crate's
    /// relay, over newline-delimited JSON-RPC with a child the target runs per connection,
    /// instead of HTTP.
    #[serde(default)]
    pub stdio: bool,
    /// In a stdio plan: a caller that gives up waiting has its host send the child
    /// `notifications/cancelled` for its request (as an SDK's request timeout does).
    #[serde(default)]
    pub stdio_cancels: bool,
    /// How far the target machine's clock is from the agents' (ms, either way): the server
    /// half's ledger reads it.
    #[serde(default)]
    pub target_skew_ms: i64,
    /// Every agent process is a `replay-guard proxy` with its clients on the same host: the
    /// callers send plain HTTP to it, and it guards the calls to the target.
    #[serde(default)]
    pub proxy: bool,
    pub entries: Vec<Entry>,
}

/// The retention of a tool without a short one: longer than any schedule.
pub const DEFAULT_RETENTION_MS: u64 = 3_600_000;

/// The seed of the draws added after the first ones (JSON-RPC errors after the effect, short
/// retentions and the slow runs that outlast them): a second generator, so that the plan a
/// seed drew before is drawn unchanged, with these added to it.
const SECOND_DRAWS: u64 = 0x5EA4_5EA4_5EA4_5EA4;

/// The seed of the third draws (more processes and actors, credentials that change, clock
/// steps, compaction, an operator racing a live owner), for the same reason.
const THIRD_DRAWS: u64 = 0x7C1D_7C1D_7C1D_7C1D;

/// The seed of the fourth draws (callers that drop an answer unread), for the same reason.
const FOURTH_DRAWS: u64 = 0x0DD5_0DD5_0DD5_0DD5;

/// The seed of the sixth draws (a compaction killed at its directory sync, and a power loss
/// after it), for the same reason.
const SIXTH_DRAWS: u64 = 0xC0DE_C0DE_C0DE_C0DE;

/// The seed of the seventh draws (the proxy as the channel, and its half-closing callers),
/// for the same reason.
const SEVENTH_DRAWS: u64 = 0x9805_9805_9805_9805;

/// The seed of the eighth draws (the target machine's own clock: its skew from the agents'
/// and its own steps), for the same reason.
const EIGHTH_DRAWS: u64 = 0x0C10_C0C1_0C10_C0C1;

/// The seed of the ninth draws (stdio hosts that cancel what they gave up on), for the same
/// reason.
const NINTH_DRAWS: u64 = 0xCA9C_E15C_A9CE_15CA;

/// The seed of the fifth draws (the channel: stdio through the relay, and the crash between
/// the relay's write of an answer and the client's read of it), for the same reason.
const FIFTH_DRAWS: u64 = 0x57D1_057D_1057_D105;

impl Plan {
    /// The plan of `seed`.
    pub fn generate(seed: u64) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let ledger = if rng.random_bool(0.3) {
            LedgerKind::Memory
        } else {
            LedgerKind::File
        };
        let processes = match ledger {
            LedgerKind::Memory => 1,
            LedgerKind::File => rng.random_range(1..=2),
        };
        let era = if rng.random_bool(0.5) {
            Era::Sessions
        } else {
            Era::Stateless
        };
        let mut entries = Vec::new();
        let calls = rng.random_range(2..=8);
        for id in 0..calls {
            // A small intent space, so that repeats and concurrent twins are common.
            let tool = Tool::ALL[rng.random_range(0..4)];
            let attempts = rng.random_range(1..=4);
            entries.push(Entry::Call {
                id,
                process: rng.random_range(0..processes),
                actor: u8::from(rng.random_bool(0.2)),
                tool,
                args: rng.random_range(0..2),
                at_ms: rng.random_range(0..6_000),
                attempts,
                timeout_ms: rng.random_range(200..4_000),
                backoff_ms: rng.random_range(50..3_000),
                carrier: None,
            });
            for attempt in 0..attempts {
                if rng.random_bool(0.35) {
                    let fault = match rng.random_range(0..6) {
                        0 => Fault::DropBeforeEffect,
                        1 => Fault::LostAfterEffect,
                        2 => Fault::CutAfter {
                            frames: rng.random_range(0..3),
                        },
                        3 | 4 => Fault::Slow {
                            ms: rng.random_range(300..6_000),
                        },
                        _ => Fault::Status {
                            code: [500, 503, 429, 409][rng.random_range(0..4)],
                        },
                    };
                    entries.push(Entry::TargetFault {
                        call: id,
                        attempt,
                        fault,
                    });
                }
            }
        }
        for _ in 0..rng.random_range(0..=2) {
            let victim = match (ledger, rng.random_range(0..3)) {
                (LedgerKind::File, 0) => Victim::Machine,
                (LedgerKind::File, 1) => Victim::Process(rng.random_range(0..processes)),
                _ => Victim::Target,
            };
            entries.push(Entry::Crash {
                at_ms: rng.random_range(0..10_000),
                victim,
                down_ms: rng.random_range(50..3_000),
            });
        }
        if ledger == LedgerKind::File && rng.random_bool(0.4) {
            let machine = rng.random_bool(0.5);
            entries.push(Entry::DiskCrash {
                process: rng.random_range(0..processes),
                op: rng.random_range(1..30),
                phase: [Phase::BeforeWrite, Phase::AfterWrite, Phase::AfterSync]
                    [rng.random_range(0..3)],
                machine,
                tear: rng.random_range(0..=1_000),
                corrupt: machine && rng.random_bool(0.15),
                down_ms: rng.random_range(50..3_000),
            });
        }
        if rng.random_bool(0.25) {
            entries.push(Entry::Partition {
                process: rng.random_range(0..processes),
                at_ms: rng.random_range(0..10_000),
                for_ms: rng.random_range(100..4_000),
            });
        }
        if rng.random_bool(0.25) {
            entries.push(Entry::Hold {
                process: rng.random_range(0..processes),
                at_ms: rng.random_range(0..10_000),
                for_ms: rng.random_range(100..3_000),
            });
        }
        for _ in 0..rng.random_range(0..=1) {
            entries.push(Entry::Operator {
                at_ms: rng.random_range(2_000..20_000),
            });
        }
        let mut plan = Plan {
            seed,
            ledger,
            processes,
            era,
            sse: rng.random_bool(0.5),
            link_window_ms: rng.random_range(500..8_000),
            attach_ms: rng.random_range(300..4_000),
            keep_results: [(); 4].map(|()| rng.random_bool(0.8)),
            retention_ms: [None; 4],
            server_half: false,
            stdio: false,
            proxy: false,
            target_skew_ms: 0,
            stdio_cancels: false,
            entries,
        };
        plan.draw_seams(&mut StdRng::seed_from_u64(seed ^ SECOND_DRAWS));
        plan.draw_hosts(&mut StdRng::seed_from_u64(seed ^ THIRD_DRAWS));
        plan.draw_callers(&mut StdRng::seed_from_u64(seed ^ FOURTH_DRAWS));
        plan.draw_channel(&mut StdRng::seed_from_u64(seed ^ FIFTH_DRAWS));
        plan.draw_compaction_kills(&mut StdRng::seed_from_u64(seed ^ SIXTH_DRAWS));
        plan.draw_proxy(&mut StdRng::seed_from_u64(seed ^ SEVENTH_DRAWS));
        plan.draw_target_clock(&mut StdRng::seed_from_u64(seed ^ EIGHTH_DRAWS));
        let cancels = StdRng::seed_from_u64(seed ^ NINTH_DRAWS).random_bool(0.5);
        plan.stdio_cancels = plan.stdio && cancels;
        plan
    }

    /// The sixth draws: in a third of the plans with a compaction, the compacting process is
    /// killed at the compaction's directory sync, and the machine loses power 1–5 s later
    /// (what a name not yet synced into its directory is exposed to).
    fn draw_compaction_kills(&mut self, rng: &mut StdRng) {
        let (kill, after) = (rng.random_bool(1.0 / 3.0), rng.random_range(1_000..5_000));
        let compaction = self.entries.iter_mut().find_map(|e| match e {
            Entry::Compact { at_ms, killed, .. } => Some((at_ms, killed)),
            _ => None,
        });
        if let (true, Some((at_ms, killed))) = (kill, compaction) {
            *killed = true;
            let at_ms = *at_ms + after;
            self.entries.push(Entry::Crash {
                at_ms,
                victim: Victim::Machine,
                down_ms: 500,
            });
        }
    }

    /// The fourth draws: attempts whose caller drops the answer unread.
    fn draw_callers(&mut self, rng: &mut StdRng) {
        let calls: Vec<(u32, u8)> = self
            .calls()
            .filter_map(|e| match e {
                Entry::Call { id, attempts, .. } => Some((*id, *attempts)),
                _ => None,
            })
            .collect();
        for (call, attempts) in calls {
            // Never the last attempt: its caller waits for an answer it reads.
            for attempt in 0..attempts.saturating_sub(1) {
                if rng.random_bool(0.15) {
                    self.entries.push(Entry::Unread { call, attempt });
                }
            }
        }
    }

    /// The seventh draws: half the plans that are not stdio go through the proxy, and in
    /// those some attempts' callers half-close.
    fn draw_proxy(&mut self, rng: &mut StdRng) {
        self.proxy = !self.stdio && rng.random_bool(0.5);
        let calls: Vec<(u32, u8)> = self
            .calls()
            .filter_map(|e| match e {
                Entry::Call { id, attempts, .. } => Some((*id, *attempts)),
                _ => None,
            })
            .collect();
        for (call, attempts) in calls {
            for attempt in 0..attempts {
                if rng.random_bool(0.1) && self.proxy && !self.unread(call, attempt) {
                    self.entries.push(Entry::HalfClose { call, attempt });
                }
            }
        }
    }

    /// The eighth draws: in half the plans the target machine's clock is skewed from the
    /// agents' by up to a minute either way, and it steps on its own (forward up to 30 s, back
    /// up to 10 s).
    fn draw_target_clock(&mut self, rng: &mut StdRng) {
        let skew = rng.random_range(1_000..60_000);
        if rng.random_bool(0.5) {
            self.target_skew_ms = if rng.random_bool(0.5) { skew } else { -skew };
        }
        for _ in 0..rng.random_range(0..=2) {
            let forward = rng.random_bool(0.6);
            let by_ms = if forward {
                rng.random_range(500..30_000)
            } else {
                -rng.random_range(500..10_000)
            };
            let at_ms = rng.random_range(0..12_000);
            if rng.random_bool(0.4) {
                self.entries.push(Entry::TargetClockStep { at_ms, by_ms });
            }
        }
    }

    /// Whether the caller of attempt `attempt` of call `call` half-closes (a proxy plan).
    pub fn half_closes(&self, call: u32, attempt: u8) -> bool {
        self.proxy
            && self.entries.iter().any(|e| {
                matches!(e, Entry::HalfClose { call: c, attempt: a } if *c == call && *a == attempt)
            })
    }

    /// Whether the caller of attempt `attempt` of call `call` drops its answer unread.
    pub fn unread(&self, call: u32, attempt: u8) -> bool {
        self.entries.iter().any(
            |e| matches!(e, Entry::Unread { call: c, attempt: a } if *c == call && *a == attempt),
        )
    }

    /// The fifth draws: a third of the plans talk stdio through the relay; in some of those
    /// with a file ledger (a process of a memory ledger is never killed: its ledger would die
    /// with it), a process dies between the relay's write of an answer and the client's read.
    fn draw_channel(&mut self, rng: &mut StdRng) {
        self.stdio = rng.random_bool(1.0 / 3.0);
        let (crash, process, answer, down_ms) = (
            rng.random_bool(0.5),
            rng.random_range(0..self.processes),
            rng.random_range(1..=4),
            rng.random_range(50..3_000),
        );
        if self.stdio && crash && self.ledger == LedgerKind::File {
            self.entries.push(Entry::CrashAfterAnswer {
                process,
                answer,
                down_ms,
            });
        }
    }

    /// The third draws: up to four processes on one file ledger, a third actor, calls in a
    /// burst, actors read from credentials (some refreshed during the schedule), clock steps, a
    /// compaction while others append, and an operator who tries to settle what a live process
    /// still runs.
    fn draw_hosts(&mut self, rng: &mut StdRng) {
        self.server_half = rng.random_bool(0.5);
        let processes = if self.ledger == LedgerKind::File && rng.random_bool(0.4) {
            rng.random_range(3..=4)
        } else {
            self.processes
        };
        self.processes = processes;
        for entry in &mut self.entries {
            if let Entry::Call {
                process,
                actor,
                carrier,
                ..
            } = entry
            {
                let (moved, third, carried) = (
                    rng.random_bool(0.5),
                    rng.random_bool(0.25),
                    rng.random_bool(0.4),
                );
                let (to, kind) = (rng.random_range(0..processes), rng.random_range(0..4));
                if moved {
                    *process = to;
                }
                if third {
                    *actor = 2;
                }
                if carried {
                    *carrier = Some(
                        [
                            Carrier::Authorization,
                            Carrier::ApiKey,
                            Carrier::Cookie,
                            Carrier::Query,
                        ][kind],
                    );
                }
            }
        }
        // A burst: every call asked within 100 ms, so that the writes of concurrent calls
        // share the ledger's batches (a `delivered` beside a write that must be synced).
        if rng.random_bool(0.25) {
            let base = rng.random_range(0..3_000);
            for entry in &mut self.entries {
                if let Entry::Call { at_ms, .. } = entry {
                    *at_ms = base + rng.random_range(0..100);
                }
            }
        }
        for actor in 0..3 {
            if rng.random_bool(0.2) {
                self.entries.push(Entry::Refresh {
                    actor,
                    at_ms: rng.random_range(0..8_000),
                });
            }
        }
        for _ in 0..rng.random_range(0..=2) {
            if rng.random_bool(0.4) {
                let forward = rng.random_bool(0.6);
                let by_ms = if forward {
                    // Past a link window, sometimes past a short retention.
                    rng.random_range(500..12_000)
                } else {
                    -rng.random_range(500..6_000)
                };
                self.entries.push(Entry::ClockStep {
                    at_ms: rng.random_range(0..12_000),
                    by_ms,
                });
            }
        }
        if self.ledger == LedgerKind::File && rng.random_bool(0.5) {
            self.entries.push(Entry::Compact {
                process: rng.random_range(0..processes),
                at_ms: rng.random_range(0..12_000),
                killed: false,
            });
        }
        if rng.random_bool(0.5) {
            self.entries.push(Entry::Resolver {
                at_ms: rng.random_range(0..8_000),
            });
        }
    }

    /// The generation of `actor`'s credential at `at_ms`: how often it was refreshed by then.
    pub fn credential_generation(&self, actor: u8, at_ms: u64) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e, Entry::Refresh { actor: a, at_ms: t } if *a == actor && *t <= at_ms))
            .count()
    }

    /// The second draws: short retentions, and, on attempts the first draws left without a
    /// fault, JSON-RPC errors after the effect and slow runs that outlast a short retention.
    fn draw_seams(&mut self, rng: &mut StdRng) {
        if rng.random_bool(0.35) {
            for (i, tool) in Tool::ALL.into_iter().enumerate() {
                // Retention at least the link window: a policy the guard accepts.
                if tool != Tool::Read && rng.random_bool(0.7) {
                    self.retention_ms[i] = Some(self.link_window_ms + rng.random_range(500..4_000));
                }
            }
        }
        let calls: Vec<(u32, Tool, u8)> = self
            .calls()
            .filter_map(|e| match e {
                Entry::Call {
                    id, tool, attempts, ..
                } => Some((*id, *tool, *attempts)),
                _ => None,
            })
            .collect();
        for (id, tool, attempts) in calls {
            for attempt in 0..attempts {
                let draw: f64 = rng.random();
                let slow = rng.random_range(300..3_000);
                let code = [-32603, -32000, -32001][rng.random_range(0..3)];
                if self.fault(id, attempt).is_some() {
                    continue;
                }
                let fault = if draw < 0.1 {
                    Fault::ErrorAfterEffect { code }
                } else if draw < 0.5
                    && let Some(retention) = self.retention_ms(tool)
                    // Outlasting the retention, yet under the 10 s a silent TCP connection
                    // lives: the call is still running, not cut.
                    && retention + slow < 9_000
                {
                    Fault::Slow {
                        ms: retention + slow,
                    }
                } else {
                    continue;
                };
                self.entries.push(Entry::TargetFault {
                    call: id,
                    attempt,
                    fault,
                });
            }
        }
    }

    /// The short retention of `tool`, if the plan gives it one.
    pub fn retention_ms(&self, tool: Tool) -> Option<u64> {
        self.retention_ms[Tool::ALL.iter().position(|t| *t == tool).unwrap_or(0)]
    }

    /// The retention of `tool`'s contract, in ms.
    pub fn retention_of(&self, tool: Tool) -> u64 {
        self.retention_ms(tool).unwrap_or(DEFAULT_RETENTION_MS)
    }

    pub fn calls(&self) -> impl Iterator<Item = &Entry> {
        self.entries
            .iter()
            .filter(|e| matches!(e, Entry::Call { .. }))
    }

    pub fn fault(&self, call: u32, attempt: u8) -> Option<Fault> {
        self.entries.iter().find_map(|e| match e {
            Entry::TargetFault {
                call: c,
                attempt: a,
                fault,
            } if *c == call && *a == attempt => Some(*fault),
            _ => None,
        })
    }

    pub fn keeps_results(&self, tool: Tool) -> bool {
        self.keep_results[Tool::ALL.iter().position(|t| *t == tool).unwrap_or(0)]
    }

    /// The plan without entry `index` (and, for a call, without its faults).
    pub fn without(&self, index: usize) -> Plan {
        let mut plan = self.clone();
        let removed = plan.entries.remove(index);
        if let Entry::Call { id, .. } = removed {
            plan.entries.retain(|e| {
                !matches!(e, Entry::TargetFault { call, .. } | Entry::Unread { call, .. } | Entry::HalfClose { call, .. } if *call == id)
            });
        }
        plan
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plan of seed {}: {:?} ledger, {} process(es), era {}, {}, link window {} ms, attach wait {} ms, results kept {:?}, short retention (ms) {:?}, server half {}, target clock skew {} ms, {}",
            self.seed,
            self.ledger,
            self.processes,
            self.era.version(),
            if self.sse {
                "SSE answers"
            } else {
                "JSON answers"
            },
            self.link_window_ms,
            self.attach_ms,
            self.keep_results,
            self.retention_ms,
            self.server_half,
            self.target_skew_ms,
            if self.stdio_cancels {
                "stdio through the relay, cancelling what it gives up on"
            } else if self.stdio {
                "stdio through the relay"
            } else if self.proxy {
                "HTTP through the proxy"
            } else {
                "HTTP"
            }
        )?;
        for entry in &self.entries {
            writeln!(f, "  {entry:?}")?;
        }
        Ok(())
    }
}
