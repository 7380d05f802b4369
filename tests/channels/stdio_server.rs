//! The server half over stdio, end to end: `examples/stdio_server` (an rmcp server behind
//! `IdempotencyLayer::serve_lines`) as a child process spoken to in newline JSON-RPC, its
//! effects file the count of side effects; and `serve_lines` in-process over a server that
//! goes away.

use crate::stdio_example;
use crate::support as temp;

use std::{collections::VecDeque, path::PathBuf, process::Stdio, time::Duration};

use mcp_replay_guard::{
    EXECUTION_ID_META_KEY,
    fingerprint::FingerprintKey,
    integrations::server::{IdempotencyLayer, KEY_OUTCOME_UNKNOWN, KEY_REUSED},
    ledger::MemoryLedger,
};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, duplex, split},
    process::{Child, ChildStdin, ChildStdout, Command},
};

const WAIT: Duration = Duration::from_secs(30);

/// The example as a child: its stdin, its stdout read line by line, its files.
struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
    /// Lines read while waiting for another id.
    unclaimed: VecDeque<Value>,
    effects: PathBuf,
    dir: PathBuf,
    next_id: i64,
}

impl Server {
    async fn start(name: &str, env: &[(&str, &str)]) -> Self {
        let dir = temp::temp_dir("stdio-server", name);
        Self::start_in(dir, env).await
    }

    async fn start_in(dir: PathBuf, env: &[(&str, &str)]) -> Self {
        let effects = dir.join("effects");
        let mut command = Command::new(stdio_example::example_binary());
        command
            .env("EFFECTS_FILE", &effects)
            .env("FAULT_ONCE_FILE", dir.join("fault-once"))
            .env("PID_FILE", dir.join("pid"))
            .env_remove("FAULT")
            .env_remove("LEDGER")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // The server's log, for a test that fails: `<dir>/stderr`.
            .stderr(std::fs::File::create(dir.join("stderr")).expect("the log file"))
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("the example starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            stdout,
            unclaimed: VecDeque::new(),
            effects,
            dir,
            next_id: 1,
        }
    }

    async fn send_line(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.stdin.write_all(b"\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn send(&mut self, message: &Value) {
        self.send_line(&message.to_string()).await;
    }

    /// The next line of stdout, as JSON (a line that is not JSON fails the test).
    async fn next_message(&mut self) -> Value {
        if let Some(message) = self.unclaimed.pop_front() {
            return message;
        }
        let line = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("a line from the server in time")
            .unwrap()
            .expect("the server's stdout is open");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:.200}"))
    }

    /// The answer for `id`; other messages are kept for later.
    async fn answer(&mut self, id: &Value) -> Value {
        if let Some(at) = self.unclaimed.iter().position(|m| &m["id"] == id) {
            return self.unclaimed.remove(at).unwrap();
        }
        loop {
            let line = tokio::time::timeout(WAIT, self.stdout.next_line())
                .await
                .unwrap_or_else(|_| panic!("no answer for id {id} in time; see {:?}", self.dir))
                .unwrap()
                .expect("the server's stdout is open");
            let message: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line:.200}"));
            if &message["id"] == id {
                return message;
            }
            self.unclaimed.push_back(message);
        }
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = json!(self.next_id);
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        self.answer(&id).await
    }

    async fn initialize(&mut self) {
        let answer = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "stdio-server-test", "version": "1"},
                }),
            )
            .await;
        assert!(answer["result"]["protocolVersion"].is_string(), "{answer}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    /// `tools/call` of `tool`, under the execution-id key `key` in `_meta` when there is one.
    async fn call(&mut self, tool: &str, arguments: Value, key: Option<&str>) -> Value {
        let mut params = json!({"name": tool, "arguments": arguments});
        if let Some(key) = key {
            params["_meta"] = json!({EXECUTION_ID_META_KEY: key});
        }
        self.request("tools/call", params).await
    }

    /// The effect lines written so far.
    fn effects(&self) -> Vec<String> {
        std::fs::read_to_string(&self.effects)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Closes stdin and waits for the exit.
    async fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin);
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the server exits when its stdin ends")
            .unwrap();
        let _ = std::fs::remove_dir_all(&self.dir);
        status
    }
}

fn deploy(version: &str) -> Value {
    json!({"service": "catalog", "version": version})
}

#[tokio::test]
async fn the_same_key_twice_runs_once_and_the_repeat_gets_the_first_result() {
    let mut server = Server::start("same-key", &[]).await;
    server.initialize().await;
    let first = server.call("deploy", deploy("1.0"), Some("key-1")).await;
    let second = server.call("deploy", deploy("1.0"), Some("key-1")).await;

    assert_eq!(
        server.effects(),
        [r#"deploy {"service":"catalog","version":"1.0"}"#],
        "one deployment"
    );
    assert_eq!(first["id"], 2);
    assert_eq!(second["id"], 3, "re-keyed to the repeat's id: {second}");
    assert!(first["result"]["content"][0]["text"].is_string(), "{first}");
    assert_eq!(second["result"], first["result"]);
    assert!(server.finish().await.success());
}

#[tokio::test]
async fn the_same_key_for_other_arguments_is_refused() {
    let mut server = Server::start("key-reused", &[]).await;
    server.initialize().await;
    let first = server
        .call("charge", json!({"account": "a", "cents": 100}), Some("k"))
        .await;
    let other = server
        .call("charge", json!({"account": "a", "cents": 900}), Some("k"))
        .await;

    assert!(first["result"].is_object(), "{first}");
    assert_eq!(other["error"]["code"], KEY_REUSED, "{other}");
    assert_eq!(other["id"], 3);
    assert_eq!(server.effects(), [r#"charge {"account":"a","cents":100}"#]);
    assert!(server.finish().await.success());
}

#[tokio::test]
async fn calls_without_a_key_run_every_time() {
    let mut server = Server::start("no-key", &[]).await;
    server.initialize().await;
    for _ in 0..2 {
        let answer = server
            .call("set_flag", json!({"name": "beta", "value": true}), None)
            .await;
        assert!(answer["result"].is_object(), "{answer}");
    }
    let read = server
        .call("read_flag", json!({"name": "beta"}), None)
        .await;

    assert_eq!(read["result"]["content"][0]["text"], "beta is true");
    assert_eq!(server.effects().len(), 2, "{:?}", server.effects());
    assert!(server.finish().await.success());
}

#[tokio::test]
async fn a_line_that_is_not_json_is_answered_and_serving_goes_on() {
    let mut server = Server::start("not-json", &[]).await;
    server.initialize().await;
    server.send_line("this is not json").await;
    let answer = server.next_message().await;
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    assert!(answer.get("id").is_none_or(Value::is_null), "{answer}");

    let after = server.call("deploy", deploy("2.0"), Some("after")).await;
    assert!(after["result"].is_object(), "{after}");
    assert_eq!(server.effects().len(), 1);
    assert!(server.finish().await.success());
}

/// The server dies (SIGKILL) after the effect and before its answer; started again on the
/// same file ledger, the repeat of the key is refused as of unknown outcome, never run again.
#[tokio::test]
async fn a_call_whose_server_died_after_the_effect_is_not_run_again() {
    let dir = temp::temp_dir("stdio-server", "killed");
    let ledger = dir.join("ledger.jsonl");
    let ledger = ledger.to_str().unwrap();
    let env = [("LEDGER", ledger), ("FAULT", "hang_after_effect")];
    let mut server = Server::start_in(dir.clone(), &env).await;
    server.initialize().await;
    server
        .send(
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                "name": "deploy", "arguments": deploy("3.0"),
                "_meta": {EXECUTION_ID_META_KEY: "deploy-3.0"},
            }}),
        )
        .await;
    let pid_file = dir.join("pid");
    let pid = tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(pid) = std::fs::read_to_string(&pid_file)
                && !pid.is_empty()
            {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the server hangs after the effect");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .unwrap();
    assert!(killed.success());
    let _ = server.child.wait().await;
    assert_eq!(server.effects().len(), 1);

    let mut again = Server::start_in(dir.clone(), &env).await;
    again.initialize().await;
    let repeat = again
        .call("deploy", deploy("3.0"), Some("deploy-3.0"))
        .await;
    assert_eq!(repeat["error"]["code"], KEY_OUTCOME_UNKNOWN, "{repeat}");
    assert_eq!(again.effects().len(), 1, "never deployed twice");
    // A new key is a new call: it runs (the fault was one-shot).
    let new = again
        .call("deploy", deploy("3.0"), Some("deploy-3.0-b"))
        .await;
    assert!(new["result"].is_object(), "{new}");
    assert_eq!(again.effects().len(), 2);
    assert!(again.finish().await.success());
}

/// An answer too large to keep (8 MiB, over the 4 MiB the layer keeps) still reaches the
/// client whole; its repeat is refused, never run again.
#[tokio::test]
async fn a_huge_answer_is_relayed_and_its_repeat_is_not_run_again() {
    let mut server = Server::start("huge", &[("FAULT", "huge_answer")]).await;
    server.initialize().await;
    let first = server.call("deploy", deploy("4.0"), Some("huge")).await;
    let text = first["result"]["content"][0]["text"].as_str().unwrap();
    assert_eq!(text.len(), 8 << 20);
    let repeat = server.call("deploy", deploy("4.0"), Some("huge")).await;
    assert_eq!(repeat["error"]["code"], KEY_OUTCOME_UNKNOWN, "{repeat}");
    assert_eq!(server.effects().len(), 1);
    assert!(server.finish().await.success());
}

#[tokio::test]
async fn the_fault_knobs_that_need_no_call() {
    let garbage = Server::start("garbage", &[("FAULT", "garbage")]).await;
    let mut garbage = garbage;
    let first = tokio::time::timeout(WAIT, garbage.stdout.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.as_deref(), Some("this is not json"));
    garbage.initialize().await;
    assert!(garbage.finish().await.success());

    let exit = Server::start("exit", &[("FAULT", "exit_at_once")]).await;
    assert_eq!(exit.finish().await.code(), Some(3));
}

/// `serve_lines` in-process: the server reads a `tools/call` and goes away without answering.
/// The client hears that the outcome is unknown (not that the call failed), and a repeat of
/// the key is refused.
#[tokio::test]
async fn a_server_gone_mid_call_makes_the_outcome_unknown() {
    let ledger = MemoryLedger::new();
    let layer = IdempotencyLayer::new(ledger, FingerprintKey::generate().unwrap());
    let (client_end, relay_client) = duplex(64 * 1024);
    let (server_end, relay_server) = duplex(64 * 1024);
    let (from_client, to_client) = split(relay_client);
    let (from_server, to_server) = split(relay_server);
    let relay = tokio::spawn(layer.serve_lines(
        (BufReader::new(from_client), to_client),
        (BufReader::new(from_server), to_server),
    ));
    // The server: reads one line, then ends.
    let server = tokio::spawn(async move {
        let mut lines = BufReader::new(server_end).lines();
        lines.next_line().await.unwrap()
    });
    let (client_in, mut client_out) = split(client_end);
    let mut client_in = BufReader::new(client_in).lines();
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "deploy", "arguments": deploy("5.0"),
        "_meta": {EXECUTION_ID_META_KEY: "gone"},
    }});
    client_out
        .write_all(format!("{call}\n").as_bytes())
        .await
        .unwrap();
    let written = server.await.unwrap().expect("the call reached the server");
    assert_eq!(serde_json::from_str::<Value>(&written).unwrap(), call);

    let answer = tokio::time::timeout(WAIT, client_in.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["id"], 7);
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("outcome is unknown"), "{message}");
    assert!(!message.contains("failed"), "{message}");
    // The server is gone: the relay ends.
    tokio::time::timeout(WAIT, relay)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
