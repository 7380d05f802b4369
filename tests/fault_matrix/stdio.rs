//! The stdio column of the fault matrix: four faults of a stdio server × the four retry
//! classes, through the library's `relay::{Relay, lines}` driven here as `replay-guard stdio`
//! drives it, against `examples/stdio_server` as a child process (its effects file the count
//! of side effects) and a `FileLedger` on disk.
//!
//! Every cell: the first call meets the fault; the agent calls once more (new JSON-RPC id),
//! through a new child where the first one is gone. The tools' contracts are the guard's
//! (the test server's `set_flag` stands in for a read-only tool too: every run of it leaves an
//! effect line, so a re-send shows). No status probe: a recoverable call is held.

use std::{fmt::Write as _, path::PathBuf, process::Stdio, time::Duration};

use bytes::Bytes;
use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    guard::GuardLayer,
    ledger::{FileLedger, Ledger},
    protocol::RequestId,
    relay::{
        ClientQueue, Relay, WireQueue,
        lines::{self, Line},
    },
};
use serde_json::{Value, json};
use tokio::{
    io::BufReader,
    process::{Child, Command},
    sync::oneshot,
    task::JoinHandle,
};

use crate::support::stdio_example;

use super::Class;

const WAIT: Duration = Duration::from_secs(30);
/// `--max-line-bytes` of every cell; the huge answer is over it.
const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The child exited before the call's line was written: the driver has nobody to write
    /// it to.
    ChildGone,
    /// The tool ran, the child never answered; the driver closed its stdin and it went.
    NoAnswer,
    /// The tool ran, then the child was SIGKILLed before its answer.
    ChildKilled,
    /// The tool ran and answered over the line bound: the answer was not relayed.
    AnswerTooLarge,
    /// The tool ran and answered; the answer was written into the host's pipe, and the host
    /// died before reading it. The repeat comes from a new host (a new relay on the ledger).
    HostGone,
}

impl Fault {
    const ALL: [Fault; 5] = [
        Fault::ChildGone,
        Fault::NoAnswer,
        Fault::ChildKilled,
        Fault::AnswerTooLarge,
        Fault::HostGone,
    ];

    fn label(self) -> &'static str {
        match self {
            Fault::ChildGone => "before the line is written (child already gone)",
            Fault::NoAnswer => "after the effect, no answer (stdin closed, child went)",
            Fault::ChildKilled => "after the effect, child SIGKILLed",
            Fault::AnswerTooLarge => "answer over --max-line-bytes (tool ran)",
            Fault::HostGone => "host dies with the answer unread (tool ran, answered)",
        }
    }

    /// The server's `FAULT`.
    fn env(self) -> &'static str {
        match self {
            Fault::ChildGone => "exit_at_once",
            Fault::NoAnswer | Fault::ChildKilled => "hang_after_effect",
            Fault::AnswerTooLarge => "huge_answer",
            Fault::HostGone => "none",
        }
    }
}

/// The stdio server's tool that stands for `class`.
fn tool(class: Class) -> (&'static str, Value) {
    match class {
        Class::ReadOnly | Class::Idempotent => ("set_flag", json!({"name": "beta", "value": true})),
        Class::Recoverable => ("charge", json!({"account": "acme", "cents": 500})),
        Class::Irreversible => (
            "deploy",
            json!({"service": "catalog", "version": "2026.07.22"}),
        ),
    }
}

fn contract(class: Class) -> ToolContract {
    match class {
        Class::ReadOnly => ToolContract::read_only(),
        Class::Idempotent => ToolContract::idempotent(),
        Class::Recoverable => ToolContract::recoverable(),
        Class::Irreversible => ToolContract::irreversible(),
    }
}

// ---- what the agent was told ---------------------------------------------------------------

const RESULT: &str = "result";
const UNCERTAIN: &str = "uncertain + execution id";
const NOT_SENT: &str = "error: not sent";
const MAY_HAVE_RUN: &str = "error: may have run";

/// The class of one answer.
fn told(answer: &Value) -> &'static str {
    let result = &answer["result"];
    if result.is_object() {
        let execution = result["structuredContent"]["mcp_replay_guard"]["execution_id"].as_str();
        return match (result["isError"].as_bool(), execution) {
            (Some(true), Some(id)) if id.starts_with("act_") => UNCERTAIN,
            (Some(true), _) => "tool error",
            _ => RESULT,
        };
    }
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    // A guarded call says "not sent"; a pass-through request (read_only) carries the wire's
    // own proof, "nothing was written".
    let proofs = ["not sent", "nothing was sent", "nothing was written"];
    if proofs.iter().any(|proof| message.contains(proof)) {
        NOT_SENT
    } else {
        MAY_HAVE_RUN
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Cell {
    effects: usize,
    first: &'static str,
    repeat: &'static str,
    ledger: String,
}

/// What the class allows after `fault`.
fn expected(fault: Fault, class: Class) -> Cell {
    use Class::*;
    if fault == Fault::ChildGone {
        // Provably never written: every class continues it, once.
        let ledger = if class == ReadOnly {
            "not recorded"
        } else {
            "completed, delivered (2 attempts)"
        };
        return Cell {
            effects: 1,
            first: NOT_SENT,
            repeat: RESULT,
            ledger: ledger.into(),
        };
    }
    if fault == Fault::HostGone {
        // Written into a pipe is not delivered: the repeat is handed the kept result.
        let (effects, ledger) = match class {
            ReadOnly => (2, "not recorded"),
            _ => (1, "completed, delivered"),
        };
        return Cell {
            effects,
            first: RESULT,
            repeat: RESULT,
            ledger: ledger.into(),
        };
    }
    // The tool ran and its answer reached nobody.
    let (effects, first, repeat, ledger) = match class {
        ReadOnly => (2, MAY_HAVE_RUN, RESULT, "not recorded"),
        Idempotent => (2, UNCERTAIN, RESULT, "completed, delivered (2 attempts)"),
        Recoverable | Irreversible => (1, UNCERTAIN, UNCERTAIN, "needs_review"),
    };
    Cell {
        effects,
        first,
        repeat,
        ledger: ledger.into(),
    }
}

// ---- the driver ------------------------------------------------------------------------------

/// One cell's files.
struct Files {
    dir: PathBuf,
}

impl Files {
    fn effects(&self) -> usize {
        std::fs::read_to_string(self.dir.join("effects"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// The example as a child; its one-shot `fault` (the once-file is shared by every child of
    /// the cell, so a restarted child is healthy).
    fn child(&self, fault: Fault) -> Child {
        let mut command = self.command();
        command
            .env("FAULT_ONCE_FILE", self.dir.join("fault-once"))
            .env("PID_FILE", self.dir.join("pid"))
            .env("FAULT", fault.env())
            .env("HUGE_BYTES", (MAX_LINE * 2).to_string());
        command.spawn().expect("the example starts")
    }

    /// The example, with no fault.
    fn command(&self) -> Command {
        let mut command = Command::new(stdio_example::example_binary());
        command
            .env("EFFECTS_FILE", self.dir.join("effects"))
            .env_remove("FAULT")
            .env_remove("LEDGER")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// The pid the child wrote once it hung after the effect (polled, with a deadline).
    async fn hung_pid(&self) -> String {
        let file = self.dir.join("pid");
        tokio::time::timeout(WAIT, async {
            loop {
                if let Ok(pid) = std::fs::read_to_string(&file)
                    && !pid.trim().is_empty()
                {
                    return pid.trim().to_owned();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the child hangs after the effect")
    }
}

/// A child being driven as `replay-guard stdio` drives it: the wire queue written to its
/// stdin, its stdout lines to the relay; when it is gone (or told to stop: its stdin closed),
/// the rest of its stdout read, `server_gone`, and the queue handed back.
struct Driven {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<WireQueue>,
}

impl Driven {
    fn start(relay: &Relay, mut queue: WireQueue, mut child: Child) -> Self {
        let relay = relay.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut stdin = child.stdin.take().expect("piped");
            let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
            tokio::select! {
                _ = lines::write_queue(&mut queue, &mut stdin) => {}
                _ = read_server(&relay, &mut stdout) => {}
                _ = stopped => {}
            }
            drop(stdin);
            let _ = tokio::time::timeout(Duration::from_secs(5), read_server(&relay, &mut stdout))
                .await;
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
            relay.server_gone();
            queue
        });
        Self {
            stop: Some(stop),
            task,
        }
    }

    /// Closes the child's stdin (MCP's stdio shutdown); the queue back once it is gone.
    async fn stop(mut self) -> WireQueue {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.gone().await
    }

    /// The queue back once the child is gone by itself.
    async fn gone(self) -> WireQueue {
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the child goes")
            .expect("the driver")
    }
}

async fn read_server<R: tokio::io::AsyncBufRead + Unpin>(relay: &Relay, stdout: &mut R) {
    while let Ok(Some(line)) = lines::read_line(stdout, MAX_LINE).await {
        match line {
            Line::Message(message) => relay.from_server(message).await,
            Line::TooLong(prefix) => relay.server_message_too_large(&prefix, MAX_LINE),
        }
    }
}

/// The agent's side: messages in through the relay, answers out of the client queue.
struct Agent {
    relay: Relay,
    answers: ClientQueue,
}

impl Agent {
    async fn send(&self, message: Value) {
        self.relay
            .from_client(Bytes::from(message.to_string()))
            .await;
    }

    /// The next message for the agent, written to it as the CLI writes it: delivered once the
    /// agent's next message comes.
    async fn answer(&mut self) -> Value {
        let message = tokio::time::timeout(WAIT, self.answers.next())
            .await
            .expect("an answer in time")
            .expect("the relay is open");
        let value = serde_json::from_slice(message.message()).expect("JSON");
        message.written();
        value
    }

    /// A message that proves the agent read every answer before it.
    async fn read_on(&self) {
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}))
            .await;
    }

    async fn initialize(&mut self) {
        self.send(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "fault-matrix", "version": "1"}}}),
        )
        .await;
        let answer = self.answer().await;
        assert!(answer["result"]["protocolVersion"].is_string(), "{answer}");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    async fn call(&self, id: i64, class: Class) {
        let (name, arguments) = tool(class);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                         "params": {"name": name, "arguments": arguments}}))
            .await;
    }
}

/// A ledger file of its own and a guard over it, for one tool of `class`.
fn guarded(class: Class, label: &str) -> (PathBuf, Files, FileLedger, GuardLayer) {
    let (dir, path) = super::temp_ledger(label);
    let files = Files { dir: dir.clone() };
    let ledger = FileLedger::open(&path).expect("open the ledger");
    let (name, _) = tool(class);
    let registry = ContractRegistry::builder()
        .tool(name, contract(class))
        .build()
        .expect("a valid contract");
    let key = ledger.fingerprint_key().expect("fingerprint key");
    let layer = GuardLayer::new(ledger.clone(), registry, key);
    (dir, files, ledger, layer)
}

async fn run_cell(fault: Fault, class: Class) -> Cell {
    let (dir, files, ledger, layer) = guarded(class, &format!("stdio-{}", class.label()));
    let layer = layer
        .actor(Actor::from("signed-process:com.example.agent"))
        .intent_scope(IntentScope::from("run:fault-matrix-stdio"))
        .max_body_bytes(MAX_LINE);
    let (mut relay, mut queue, answers) = Relay::new(&layer);
    let mut agent = Agent {
        relay: relay.clone(),
        answers,
    };

    let first = match fault {
        Fault::ChildGone => {
            let mut child = files.child(fault);
            let status = tokio::time::timeout(WAIT, child.wait())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(status.code(), Some(3), "exit_at_once");
            relay.server_gone();
            // The call reaches the wire with no child to write it to.
            agent.call(1, class).await;
            let outgoing = tokio::time::timeout(WAIT, queue.next())
                .await
                .expect("the call reaches the wire")
                .expect("the wire is open");
            outgoing.not_written("the server is gone");
            agent.answer().await
        }
        Fault::NoAnswer | Fault::ChildKilled => {
            let driven = Driven::start(&relay, queue, files.child(fault));
            agent.initialize().await;
            agent.call(1, class).await;
            let pid = files.hung_pid().await;
            assert_eq!(files.effects(), 1, "the tool ran");
            queue = if fault == Fault::ChildKilled {
                let killed = std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status()
                    .unwrap();
                assert!(killed.success());
                driven.gone().await
            } else {
                driven.stop().await
            };
            agent.answer().await
        }
        Fault::AnswerTooLarge => {
            let driven = Driven::start(&relay, queue, files.child(fault));
            agent.initialize().await;
            agent.call(1, class).await;
            let first = agent.answer().await;
            queue = driven.stop().await;
            first
        }
        Fault::HostGone => {
            let driven = Driven::start(&relay, queue, files.child(fault));
            agent.initialize().await;
            agent.call(1, class).await;
            // Written to the host, which dies before its next message.
            let first = agent.answer().await;
            drop(driven.stop().await);
            let (new_relay, new_queue, answers) = Relay::new(&layer);
            (relay, queue) = (new_relay, new_queue);
            agent = Agent {
                relay: relay.clone(),
                answers,
            };
            first
        }
    };
    assert_eq!(first["id"], 1, "{first}");

    // The agent calls once more, new id, through a healthy child.
    let driven = Driven::start(&relay, queue, files.child(fault));
    agent.initialize().await;
    agent.call(2, class).await;
    let repeat = agent.answer().await;
    assert_eq!(repeat["id"], 2, "{repeat}");
    agent.read_on().await;
    let _ = driven.stop().await;

    // An uncertain repeat names the execution the first answer named.
    let execution = |answer: &Value| {
        answer["result"]["structuredContent"]["mcp_replay_guard"]["execution_id"].clone()
    };
    if told(&repeat) == UNCERTAIN && told(&first) == UNCERTAIN {
        assert_eq!(execution(&repeat), execution(&first), "{first}\n{repeat}");
    }
    let records = ledger.list().await.expect("list");
    let report = ledger.verify().expect("verify");
    assert!(report.is_ok(), "{fault:?} {class:?}: {report}");
    let cell = Cell {
        effects: files.effects(),
        first: told(&first),
        repeat: told(&repeat),
        ledger: match super::render_ledger(&records).as_str() {
            super::NOT_RECORDED => "not recorded".to_owned(),
            other => other.to_owned(),
        },
    };
    drop((agent, relay, layer, ledger));
    std::fs::remove_dir_all(&dir).ok();
    cell
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_stdio() {
    let mut table = String::from(
        "\nFault matrix, stdio (relay::Relay over examples/stdio_server, no status probe). \
         The agent calls once more (new id, healthy child) after the fault.\n\n\
         | fault | class | side effects | ledger state | first answer | repeat |\n\
         |---|---|---|---|---|---|\n",
    );
    let mut wrong = Vec::new();
    for fault in Fault::ALL {
        for class in Class::ALL {
            let got = run_cell(fault, class).await;
            writeln!(
                table,
                "| {} | {} | {} | {} | {} | {} |",
                fault.label(),
                class.label(),
                got.effects,
                got.ledger,
                got.first,
                got.repeat
            )
            .unwrap();
            let want = expected(fault, class);
            if got != want {
                wrong.push(format!(
                    "{fault:?} × {class:?}:\n  expected {want:?}\n  observed {got:?}"
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

/// A call still waiting in the wire queue when the child went was never written to it: it
/// goes to the next child (as `replay-guard stdio --restart` does with what waits, after
/// replaying the host's initialize), and its answer is that child's, once. `server_gone`
/// fails only what a writer took from the queue.
#[tokio::test]
async fn a_call_queued_when_the_child_went_gets_the_next_childs_answer_once() {
    let class = Class::Irreversible;
    let (dir, files, ledger, layer) = guarded(class, "stdio-queued");
    let (relay, mut queue, answers) = Relay::new(&layer);
    let mut agent = Agent {
        relay: relay.clone(),
        answers,
    };
    // The call is dispatched and waits in the queue (nobody writes it: the child it was meant
    // for has just gone); then the driver learns the child is gone.
    agent.call(1, class).await;
    let wire = relay.guard().get_ref();
    tokio::time::timeout(WAIT, async {
        while !wire.is_waiting(&RequestId::from(1)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the call reaches the wire");
    relay.server_gone();

    // The next child: the host's initialize replayed on its stdin directly (its answer kept
    // from the agent), then the queue written to it.
    let mut child = files.command().spawn().expect("the example starts");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let initialize = json!({"jsonrpc": "2.0", "id": "replay-initialize", "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "fault-matrix", "version": "1"}}});
    lines::write_line(&mut stdin, initialize.to_string().as_bytes())
        .await
        .unwrap();
    let Ok(Some(Line::Message(_initialized))) = lines::read_line(&mut stdout, MAX_LINE).await
    else {
        panic!("no initialize answer");
    };
    let notification = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    lines::write_line(&mut stdin, notification.to_string().as_bytes())
        .await
        .unwrap();
    let driver = {
        let relay = relay.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = lines::write_queue(&mut queue, &mut stdin) => {}
                _ = read_server(&relay, &mut stdout) => {}
            }
        })
    };

    let answer = agent.answer().await;
    assert_eq!(answer["id"], 1, "{answer}");
    agent.read_on().await;
    // Whatever else the agent is told, until the child's effect is on disk and its stdout
    // has ended.
    tokio::time::timeout(WAIT, async {
        while files.effects() < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the call ran on the next child");
    let _ = child.kill().await;
    tokio::time::timeout(WAIT, driver).await.unwrap().unwrap();
    relay.server_gone();
    // Every relay gone, the client queue ends once it has given out all it had.
    let Agent {
        relay: agents,
        mut answers,
    } = agent;
    drop((relay, agents));
    let mut more = Vec::new();
    while let Some(message) = tokio::time::timeout(WAIT, answers.next())
        .await
        .expect("the client queue ends")
    {
        more.push(String::from_utf8_lossy(message.message()).into_owned());
    }
    assert_eq!(files.effects(), 1);
    assert_eq!(
        (told(&answer), more),
        (RESULT, Vec::new()),
        "the call was never written to the child that went; the next one ran it, and its \
         answer is the one answer for id 1: {answer}"
    );
    let records = ledger.list().await.expect("list");
    assert_eq!(super::render_ledger(&records), "completed, delivered");
    std::fs::remove_dir_all(&dir).ok();
}
