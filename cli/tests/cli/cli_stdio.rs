//! `replay-guard stdio` end to end, as real processes: the built binary in front of
//! `examples/stdio_server` (an rmcp stdio server whose effects file is the count of side
//! effects), driven over the wrapper's own stdin/stdout either by rmcp's real client (over the
//! child's pipes, `transport-async-rw`, so that the test keeps the process and its exit code)
//! or, where the bytes on stdout are the point, by newline JSON-RPC written by the test.

use crate::support as temp;
use crate::support::stdio_example;

use std::{path::PathBuf, process::Stdio, time::Duration};

use rmcp::{
    ServiceExt,
    model::{CallToolRequestParams, CallToolResult},
    service::{RoleClient, RunningService},
};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::{Child, ChildStdin, ChildStdout, Command},
};

const BIN: &str = env!("CARGO_BIN_EXE_replay-guard");
const WAIT: Duration = Duration::from_secs(30);
/// The relay's own refusals (`mcp_replay_guard::relay::RELAY_ERROR`).
const RELAY_ERROR: i64 = -32603;

/// One test's files: the guard's ledger, the policy, the server's effects, pid, fault-once
/// and ledger files, and the wrapper's stderr (kept for a failing test).
struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(name: &str, policy: &str) -> Self {
        let dir = temp::temp_dir("cli-stdio", name);
        std::fs::write(dir.join("policy.toml"), policy).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// The effect lines the server wrote (the ground truth).
    fn effects(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("effects"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The pid the server wrote once it hung after its effect (polled with a deadline).
    async fn hung_server_pid(&self) -> String {
        let pid_file = self.dir.join("pid");
        tokio::time::timeout(WAIT, async {
            loop {
                if let Ok(pid) = std::fs::read_to_string(&pid_file)
                    && !pid.trim().is_empty()
                {
                    return pid.trim().to_owned();
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the server never hung after its effect; see {:?}", self.dir))
    }

    /// SIGKILLs the hung server and clears its pid file.
    async fn kill_hung_server(&self) {
        let pid = self.hung_server_pid().await;
        let killed = std::process::Command::new("kill")
            .args(["-9", &pid])
            .status()
            .unwrap();
        assert!(killed.success(), "kill -9 {pid}");
        std::fs::remove_file(self.dir.join("pid")).unwrap();
    }

    /// `replay-guard --json ledger list` of the guard's ledger.
    fn ledger_list(&self) -> Vec<Value> {
        ledger_list(&self.path("ledger.jsonl"))
    }

    /// The ledger holds `read_flag` executions and nothing else: no `set_flag` began.
    fn assert_only_read_flag_executions(&self) {
        let tools: Vec<Value> = self
            .ledger_list()
            .iter()
            .map(|r| r["tool"].clone())
            .collect();
        // The identical read_flag calls are one to three executions (a repeat arriving before
        // the wrapper noted the earlier answer's write is handed that kept answer); none is a
        // set_flag.
        assert!(
            !tools.is_empty() && tools.iter().all(|tool| tool == "read_flag"),
            "no set_flag execution began: {tools:?}"
        );
    }

    /// `replay-guard stdio --ledger … --policy … EXTRA… -- stdio_server`, with the server's
    /// environment `env` (inherited by every child it starts).
    fn wrapper(&self, extra: &[&str], env: &[(&str, &str)]) -> Child {
        let mut command = Command::new(BIN);
        command
            .arg("stdio")
            .args(["--ledger", &self.path("ledger.jsonl")])
            .args(["--policy", &self.path("policy.toml")])
            .args(extra)
            .arg("--")
            .arg(stdio_example::example_binary())
            .env("RUST_LOG", "warn")
            .env("EFFECTS_FILE", self.path("effects"))
            .env("FAULT_ONCE_FILE", self.path("fault-once"))
            .env("PID_FILE", self.path("pid"))
            .env_remove("FAULT")
            .env_remove("LEDGER")
            .env_remove("HUGE_BYTES")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("stderr"))
                    .unwrap(),
            )
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        command.spawn().expect("replay-guard starts")
    }
}

/// `replay-guard --json ledger list PATH`.
fn ledger_list(path: &str) -> Vec<Value> {
    let out = std::process::Command::new(BIN)
        .args(["--json", "ledger", "list", path])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits for the wrapper to exit; its code.
async fn exit_code(child: &mut Child) -> Option<i32> {
    tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the wrapper exits")
        .unwrap()
        .code()
}

/// rmcp's client over the wrapper's stdio.
async fn rmcp_client(child: &mut Child) -> RunningService<RoleClient, ()> {
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    tokio::time::timeout(WAIT, ().serve((stdout, stdin)))
        .await
        .expect("initialize in time")
        .expect("initialize through the wrapper")
}

fn tool_call(tool: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        unreachable!()
    };
    CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments)
}

/// The guard's record in an answer it gave itself.
fn guard_record(result: &CallToolResult) -> Value {
    let structured = result
        .structured_content
        .clone()
        .unwrap_or_else(|| panic!("no structuredContent: {result:?}"));
    structured["mcp_replay_guard"].clone()
}

fn text(result: &CallToolResult) -> String {
    serde_json::to_value(result).unwrap()["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn deploy() -> Value {
    json!({"service": "catalog", "version": "2026.07.22"})
}

/// a. An irreversible call whose server was SIGKILLed after the effect and before its answer:
/// the host hears the outcome is unknown (with the execution ID), the wrapper exits non-zero,
/// and a new wrapper on the same ledger holds the repeat for review under the same execution.
#[tokio::test]
async fn a_killed_server_leaves_an_irreversible_call_held_under_one_execution_id() {
    let files = Files::new("killed", "[tools.deploy]\nclass = \"irreversible\"\n");
    let mut wrapper = files.wrapper(&[], &[("FAULT", "hang_after_effect")]);
    let client = rmcp_client(&mut wrapper).await;
    let (first, ()) = tokio::join!(
        tokio::time::timeout(WAIT, client.call_tool(tool_call("deploy", deploy()))),
        files.kill_hung_server(),
    );
    let first = first
        .expect("an answer, not a hang")
        .expect("a CallToolResult, not a JSON-RPC error");
    assert_eq!(first.is_error, Some(true), "{first:?}");
    let record = guard_record(&first);
    let execution = record["execution_id"].as_str().expect("an execution id");
    assert!(execution.starts_with("act_"), "{record}");
    assert!(text(&first).contains("unknown"), "{}", text(&first));
    assert_eq!(files.effects().len(), 1, "the deploy ran once");
    let code = exit_code(&mut wrapper).await;
    assert!(code.is_some_and(|c| c != 0), "the wrapper exited {code:?}");
    drop(client);

    // A new wrapper (the host started again) on the same ledger, the same call.
    let mut again = files.wrapper(&[], &[]);
    let client = rmcp_client(&mut again).await;
    let repeat = tokio::time::timeout(WAIT, client.call_tool(tool_call("deploy", deploy())))
        .await
        .expect("in time")
        .expect("a CallToolResult");
    assert_eq!(repeat.is_error, Some(true), "{repeat:?}");
    let held = guard_record(&repeat);
    assert_eq!(
        held["execution_id"], execution,
        "the same execution: {held}"
    );
    assert_eq!(held["state"], "needs_review", "{held}");
    assert!(
        text(&repeat).contains("NOT sent again"),
        "{}",
        text(&repeat)
    );
    assert_eq!(files.effects().len(), 1, "never deployed twice");
    let records = files.ledger_list();
    assert_eq!(records.len(), 1, "{records:?}");
    client.cancel().await.unwrap();
    assert_eq!(exit_code(&mut again).await, Some(0));
}

/// b. An idempotent call with `--execution-id-in-meta --restart`: the server is SIGKILLed after
/// the effect; the repeat goes to the restarted child under the same `_meta` key, and the
/// honouring server (its ledger shared across restarts) does not run it again.
#[tokio::test]
async fn an_idempotent_call_is_resent_to_the_restarted_child_under_the_same_key() {
    let files = Files::new("restart", "[tools.set_flag]\nclass = \"idempotent\"\n");
    let server_ledger = files.path("server-ledger.jsonl");
    let mut wrapper = files.wrapper(
        &["--restart", "--execution-id-in-meta"],
        &[("FAULT", "hang_after_effect"), ("LEDGER", &server_ledger)],
    );
    let client = rmcp_client(&mut wrapper).await;
    let flag = json!({"name": "beta", "value": true});
    let (first, ()) = tokio::join!(
        tokio::time::timeout(WAIT, client.call_tool(tool_call("set_flag", flag.clone()))),
        files.kill_hung_server(),
    );
    let first = first.expect("an answer").expect("a CallToolResult");
    assert_eq!(first.is_error, Some(true), "{first:?}");
    let execution = guard_record(&first)["execution_id"]
        .as_str()
        .expect("an execution id")
        .to_owned();
    assert_eq!(files.effects().len(), 1);
    // The server half recorded the call under the key the guard put in `_meta`.
    let server_records = std::fs::read_to_string(&server_ledger).unwrap();
    assert!(
        server_records.contains(&execution),
        "the key in _meta is the execution ID"
    );

    // The repeat, through the same wrapper: re-sent to the restarted child under the same
    // `_meta` key. The server half knows that key from the killed child's attempt (its ledger
    // outlives it), and says so instead of running the tool again; the guard relays that.
    let repeat = tokio::time::timeout(WAIT, client.call_tool(tool_call("set_flag", flag)))
        .await
        .expect("an answer, not a hang");
    let Err(rmcp::ServiceError::McpError(refused)) = repeat else {
        panic!("the server half's refusal: {repeat:?}");
    };
    assert_eq!(refused.code.0, -32083, "KEY_OUTCOME_UNKNOWN: {refused:?}");
    // The server names its own execution; that one was keyed with the guard's execution ID.
    let server_execution = refused
        .message
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .find(|word| word.starts_with("act_"))
        .unwrap_or_else(|| panic!("no execution named: {refused:?}"));
    let server_records = ledger_list(&server_ledger);
    let keyed = server_records
        .iter()
        .find(|r| r["execution_id"] == server_execution)
        .unwrap_or_else(|| panic!("{server_execution} in {server_records:?}"));
    assert_eq!(keyed["idempotency_key"], execution.as_str(), "{keyed}");
    assert_eq!(files.effects().len(), 1, "the honouring server ran it once");
    let records = files.ledger_list();
    assert_eq!(records.len(), 1, "one execution: {records:?}");
    assert_eq!(records[0]["execution_id"], execution.as_str());
    assert_eq!(records[0]["attempts"], 2, "dispatched twice: {records:?}");
    assert_eq!(records[0]["state"], "unknown", "{records:?}");
    assert!(
        wrapper.try_wait().unwrap().is_none(),
        "the wrapper serves on"
    );
    // The restarted child serves other calls.
    let read = tokio::time::timeout(
        WAIT,
        client.call_tool(tool_call("read_flag", json!({"name": "beta"}))),
    )
    .await
    .expect("in time")
    .expect("a result");
    assert_eq!(text(&read), "beta is true");
    client.cancel().await.unwrap();
    assert_eq!(exit_code(&mut wrapper).await, Some(0));
}

// ---- newline JSON-RPC written by the test ------------------------------------------------

/// The host end of a wrapper, in raw lines: every line the wrapper prints must be JSON.
struct Host {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
    /// Every message read, in order.
    seen: Vec<Value>,
}

impl Host {
    /// The wrapper still serves: `read_flag` (id `id`) gets the server's answer.
    async fn assert_serving(&mut self, id: i64) {
        let read = self
            .request(
                id,
                "tools/call",
                json!({"name": "read_flag", "arguments": {"name": "beta"}}),
            )
            .await;
        assert_eq!(
            read["result"]["content"][0]["text"], "beta is false",
            "{read}"
        );
    }

    fn new(mut child: Child) -> Self {
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            stdout,
            seen: Vec::new(),
        }
    }

    async fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    async fn send(&mut self, message: &Value) {
        self.send_line(&message.to_string()).await;
    }

    /// The next line (`None` at the end of stdout); a line that is not JSON fails the test.
    async fn next(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("a line from the wrapper in time")
            .unwrap()?;
        let message: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
            panic!("stdout carried a line that is not JSON ({e}): {line:.200}")
        });
        self.seen.push(message.clone());
        Some(message)
    }

    async fn next_message(&mut self) -> Value {
        self.next().await.expect("the wrapper's stdout is open")
    }

    async fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let answer = self.next_message().await;
        assert_eq!(answer["id"], id, "{answer}");
        answer
    }

    async fn initialize(&mut self) {
        let answer = self.request(1, "initialize", initialize_params()).await;
        assert!(answer["result"]["protocolVersion"].is_string(), "{answer}");
        self.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
    }

    /// Closes stdin; the lines left on stdout (each JSON), the ids of every message the
    /// wrapper printed, and its exit code.
    async fn finish(mut self) -> (Vec<Value>, Vec<Value>, Option<i32>) {
        drop(self.stdin.take());
        let mut rest = Vec::new();
        while let Some(message) = self.next().await {
            rest.push(message);
        }
        let code = exit_code(&mut self.child).await;
        let ids = self.seen.iter().map(|m| m["id"].clone()).collect();
        (rest, ids, code)
    }
}

fn initialize_params() -> Value {
    json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "cli-stdio-test", "version": "1"},
    })
}

fn set_flag_call(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "set_flag", "arguments": {"name": "beta", "value": true}}})
}

/// c. What the host sends that cannot be relayed is answered, nothing of it reaches the
/// server, and the wrapper serves on.
#[tokio::test]
async fn bad_input_is_answered_unsent_and_the_wrapper_serves_on() {
    let files = Files::new("bad-input", "[tools.set_flag]\nclass = \"idempotent\"\n");
    let mut host = Host::new(files.wrapper(&["--max-line-bytes", "2048"], &[]));
    host.initialize().await;

    // Not JSON.
    host.send_line("this is not json").await;
    let answer = host.next_message().await;
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    assert!(answer["id"].is_null(), "{answer}");
    host.assert_serving(2).await;

    // A batch of two calls: an error for each id.
    host.send(&json!([set_flag_call(10), set_flag_call(11)]))
        .await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let answer = host.next_message().await;
        assert_eq!(answer["error"]["code"], RELAY_ERROR, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("nothing was sent")),
            "{answer}"
        );
        ids.push(answer["id"].as_i64().unwrap());
    }
    ids.sort_unstable();
    assert_eq!(ids, [10, 11]);
    host.assert_serving(3).await;

    // A line over the bound: an error for its id.
    let mut long = set_flag_call(12);
    long["params"]["arguments"]["padding"] = json!("p".repeat(10_000));
    host.send(&long).await;
    let answer = host.next_message().await;
    assert_eq!(answer["id"], 12, "{answer}");
    assert_eq!(answer["error"]["code"], RELAY_ERROR, "{answer}");
    host.assert_serving(4).await;

    assert_eq!(
        files.effects(),
        Vec::<String>::new(),
        "nothing reached the server"
    );
    let (rest, ids, code) = host.finish().await;
    assert_eq!(rest, Vec::<Value>::new(), "nothing more on stdout");
    let want: Vec<Value> = [
        json!(1),
        Value::Null,
        json!(2),
        json!(10),
        json!(11),
        json!(3),
    ]
    .into_iter()
    .chain([json!(12), json!(4)])
    .collect();
    let mut got = ids;
    got[3..5].sort_by_key(|id| id.as_i64());
    assert_eq!(got, want, "one answer for each request, nothing else");
    assert_eq!(code, Some(0));
    // Only the three `read_flag` calls became executions (unlisted: irreversible).
    files.assert_only_read_flag_executions();
}

/// A `tools/call` with `"id": null` or without an id is refused unsent with -32600 (a
/// lenient server would run it, unrecorded), and the wrapper serves on.
#[tokio::test]
async fn a_tools_call_without_an_id_is_refused_unsent() {
    let files = Files::new("no-id", "[tools.set_flag]\nclass = \"irreversible\"\n");
    let mut host = Host::new(files.wrapper(&[], &[]));
    host.initialize().await;
    let mut null_id = set_flag_call(0);
    null_id["id"] = Value::Null;
    let mut no_id = set_flag_call(0);
    no_id.as_object_mut().unwrap().remove("id");
    for (call, id) in [(null_id, 2), (no_id, 3)] {
        host.send(&call).await;
        // A request right behind it: the refusal comes first, then its answer.
        host.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "read_flag", "arguments": {"name": "beta"}}}))
            .await;
        let answer = host.next_message().await;
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert!(answer["id"].is_null(), "{answer}");
        let read = host.next_message().await;
        assert_eq!(read["id"], id, "{read}");
    }
    host.assert_serving(4).await;
    assert_eq!(files.effects(), Vec::<String>::new(), "set_flag never ran");
    let (rest, _, code) = host.finish().await;
    assert_eq!(rest, Vec::<Value>::new());
    assert_eq!(code, Some(0));
    files.assert_only_read_flag_executions();
}

/// d. A child that exits at once: the host's pending `initialize` is answered with a
/// JSON-RPC error, and the wrapper exits with the child's code.
#[tokio::test]
async fn a_child_that_exits_at_once_answers_initialize_and_passes_its_exit_code_on() {
    let files = Files::new("exit-at-once", "");
    let mut host = Host::new(files.wrapper(&[], &[("FAULT", "exit_at_once")]));
    host.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": initialize_params()}))
        .await;
    let answer = host.next_message().await;
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(
        answer["error"]["code"].is_i64(),
        "a JSON-RPC error: {answer}"
    );
    assert!(answer.get("result").is_none(), "{answer}");
    // The wrapper ends by itself, with the child's code: stdout closes.
    assert_eq!(host.next().await, None);
    assert_eq!(exit_code(&mut host.child).await, Some(3));
}

/// d. A child that writes a line that is not JSON: dropped, never relayed; serving goes on.
#[tokio::test]
async fn a_child_writing_garbage_is_ignored_and_serving_goes_on() {
    let files = Files::new("garbage", "[tools.set_flag]\nclass = \"idempotent\"\n");
    let mut host = Host::new(files.wrapper(&[], &[("FAULT", "garbage")]));
    host.initialize().await;
    host.send(&set_flag_call(2)).await;
    let answer = host.next_message().await;
    assert_eq!(answer["id"], 2, "{answer}");
    assert!(
        answer["result"]["content"][0]["text"].is_string(),
        "{answer}"
    );
    assert_eq!(files.effects().len(), 1);
    let (rest, ids, code) = host.finish().await;
    assert_eq!(rest, Vec::<Value>::new());
    // Only the two answers reached stdout, both JSON (`next` parses every line).
    assert_eq!(ids, [json!(1), json!(2)]);
    assert_eq!(code, Some(0));
}

/// e. An answer over `--max-line-bytes`: not relayed; the host gets the guard's uncertain
/// answer for its id, and nothing else.
#[tokio::test]
async fn an_answer_over_the_line_bound_becomes_the_uncertain_answer() {
    let files = Files::new("huge", "[tools.deploy]\nclass = \"irreversible\"\n");
    let mut host = Host::new(files.wrapper(
        &["--max-line-bytes", "65536"],
        &[("FAULT", "huge_answer"), ("HUGE_BYTES", "200000")],
    ));
    host.initialize().await;
    let answer = host
        .request(
            2,
            "tools/call",
            json!({"name": "deploy", "arguments": deploy()}),
        )
        .await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    let record = &answer["result"]["structuredContent"]["mcp_replay_guard"];
    let execution = record["execution_id"].as_str().expect("an execution id");
    assert!(execution.starts_with("act_"), "{record}");
    assert!(
        answer.to_string().len() < 65536,
        "the huge answer itself was not relayed"
    );
    assert_eq!(files.effects().len(), 1, "the deploy ran once");
    // The repeat is held, not run again.
    let repeat = host
        .request(
            3,
            "tools/call",
            json!({"name": "deploy", "arguments": deploy()}),
        )
        .await;
    assert_eq!(
        repeat["result"]["structuredContent"]["mcp_replay_guard"]["execution_id"], execution,
        "{repeat}"
    );
    assert_eq!(files.effects().len(), 1, "never deployed twice");
    let (rest, ids, code) = host.finish().await;
    assert_eq!(rest, Vec::<Value>::new(), "nothing else on stdout");
    assert_eq!(ids, [json!(1), json!(2), json!(3)], "one line per request");
    assert_eq!(code, Some(0));
}

// ---- the promise at every seam ---------------------------------------------------------------

/// Waits until the pipe of `stdout` holds bytes, reading none of them.
async fn until_readable(stdout: ChildStdout) -> std::os::fd::OwnedFd {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let fd = stdout.into_owned_fd().unwrap();
    tokio::task::spawn_blocking(move || {
        let mut polled = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        let ready = poll(&mut polled, PollTimeout::from(30_000u16)).unwrap();
        assert_eq!(ready, 1, "the answer reaches the host's pipe in time");
        fd
    })
    .await
    .unwrap()
}

/// An answer written into the host's pipe proves nothing: a host that dies before reading it
/// leaves the execution completed and undelivered, and a new host (a new wrapper on the same
/// ledger) repeating the call is handed the kept result, not a second run.
#[tokio::test]
async fn a_host_that_dies_with_the_answer_unread_gets_the_kept_result_on_the_repeat() {
    let files = Files::new("host-dies", "[tools.deploy]\nclass = \"irreversible\"\n");
    let mut host = Host::new(files.wrapper(&[], &[]));
    host.initialize().await;
    host.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "deploy", "arguments": deploy()}}))
        .await;
    // The answer enters the host's pipe; the host dies without reading it (its ends close,
    // as the kernel closes a killed process's).
    let Host {
        mut child,
        stdin,
        stdout,
        ..
    } = host;
    let unread = until_readable(stdout.into_inner().into_inner()).await;
    drop((stdin, unread));
    assert_eq!(exit_code(&mut child).await, Some(0));
    assert_eq!(files.effects().len(), 1, "the deploy ran");
    let records = files.ledger_list();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        records[0]["state"], "completed_result_not_delivered",
        "written into the pipe is not delivered: {records:?}"
    );

    // A new host repeats the call: the kept result, no second deploy.
    let mut host = Host::new(files.wrapper(&[], &[]));
    host.initialize().await;
    let repeat = host
        .request(
            2,
            "tools/call",
            json!({"name": "deploy", "arguments": deploy()}),
        )
        .await;
    assert_ne!(repeat["result"]["isError"], true, "{repeat}");
    let text = repeat["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.ends_with(": done"), "the tool's own answer: {repeat}");
    assert_eq!(files.effects().len(), 1, "never deployed twice");
    // The host reads on: its next lines prove it read the answer, and now it is delivered.
    // (The first line after an answer may reach the wrapper before the wrapper has noted that
    // answer's write; it then stays undelivered, the safe side. The answer to that line is
    // written after the deploy's, so the line after it proves both.)
    host.assert_serving(3).await;
    host.assert_serving(4).await;
    let (_, _, code) = host.finish().await;
    assert_eq!(code, Some(0));
    let records = files.ledger_list();
    let deploys: Vec<&Value> = records.iter().filter(|r| r["tool"] == "deploy").collect();
    assert_eq!(deploys.len(), 1, "one execution: {records:?}");
    assert_eq!(deploys[0]["attempts"], 1, "{records:?}");
    assert_eq!(deploys[0]["state"], "delivered", "{records:?}");
}

/// A line that is not a request (an array holding the word `initialize`) is never kept as the
/// `initialize` replayed to a restarted server: the restart serves on, nothing panics.
#[tokio::test]
async fn a_line_that_is_not_a_request_is_never_replayed_as_initialize() {
    let files = Files::new(
        "replay-not-request",
        "[tools.set_flag]\nclass = \"idempotent\"\n",
    );
    let mut host = Host::new(files.wrapper(&["--restart"], &[("FAULT", "hang_after_effect")]));
    host.initialize().await;
    for line in [r#"["initialize"]"#, r#"{"method": "initialize"}"#] {
        host.send_line(line).await;
        let answer = host.next_message().await;
        assert!(answer["error"]["code"].is_i64(), "{line}: {answer}");
    }
    // The child hangs after the call's effect and is killed: the wrapper restarts it and
    // replays the host's initialize.
    host.send(&set_flag_call(2)).await;
    files.kill_hung_server().await;
    let answer = host.next_message().await;
    assert_eq!(answer["id"], 2, "{answer}");
    // The restarted child serves (the flag was set before the kill).
    let read = host
        .request(
            3,
            "tools/call",
            json!({"name": "read_flag", "arguments": {"name": "beta"}}),
        )
        .await;
    assert_eq!(
        read["result"]["content"][0]["text"], "beta is true",
        "{read}"
    );
    let (rest, _, code) = host.finish().await;
    assert_eq!(rest, Vec::<Value>::new());
    assert_eq!(code, Some(0));
}

/// A cut line (not JSON) is answered -32700 for the id its start names, in the middle of the
/// stream and at its end alike; nothing is sent.
#[tokio::test]
async fn a_cut_line_is_answered_for_the_id_it_names() {
    let files = Files::new("cut-line", "[tools.set_flag]\nclass = \"idempotent\"\n");
    let mut host = Host::new(files.wrapper(&[], &[]));
    host.initialize().await;
    host.send_line(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"set_fl"#)
        .await;
    let answer = host.next_message().await;
    assert_eq!(answer["error"]["code"], -32700, "{answer}");
    assert_eq!(answer["id"], 7, "{answer}");
    // The host's last line, cut by the end of its stdin.
    let stdin = host.stdin.as_mut().unwrap();
    stdin
        .write_all(br#"{"jsonrpc":"2.0","id":"eight","method":"tools/call","params":{"na"#)
        .await
        .unwrap();
    let (rest, _, code) = host.finish().await;
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(rest[0]["error"]["code"], -32700, "{rest:?}");
    assert_eq!(rest[0]["id"], "eight", "{rest:?}");
    assert_eq!(code, Some(0));
    assert_eq!(files.effects(), Vec::<String>::new(), "nothing was sent");
}

/// The host's order on the wire: a call and its cancellation, five times over, reach the
/// server in the order the host sent them (the server, `cat`, writes what it receives).
#[tokio::test]
async fn calls_and_cancellations_reach_the_server_in_the_hosts_order() {
    let files = Files::new("order", "[tools.deploy]\nclass = \"irreversible\"\n");
    let received = files.path("received");
    let mut command = Command::new(BIN);
    command
        .arg("stdio")
        .args(["--ledger", &files.path("ledger.jsonl")])
        .args(["--policy", &files.path("policy.toml")])
        // `sh` keeps the server's stdout open while `cat` writes what it receives.
        .args(["--", "sh", "-c", "cat > \"$RECEIVED\""])
        .env("RECEIVED", &received)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut host = Host::new(command.spawn().unwrap());
    let mut sent = Vec::new();
    for id in 10..15 {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "deploy", "arguments": {"service": "catalog", "version": id}}});
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "changed my mind"}});
        host.send(&call).await;
        host.send(&cancel).await;
        sent.push(format!("call {id}"));
        sent.push(format!("cancel {id}"));
    }
    let read = || -> Vec<String> {
        std::fs::read_to_string(&received)
            .unwrap_or_default()
            .lines()
            .map(|line| {
                let message: Value = serde_json::from_str(line).unwrap();
                match message["method"].as_str() {
                    Some("tools/call") => format!("call {}", message["id"]),
                    _ => format!("cancel {}", message["params"]["requestId"]),
                }
            })
            .collect()
    };
    tokio::time::timeout(WAIT, async {
        while read().len() < sent.len() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every message reaches the server");
    assert_eq!(read(), sent);
    // One answer per call (the server answers none: each is unknown once its wait ends).
    let (rest, ids, _) = host.finish().await;
    assert_eq!(rest.len(), 5, "{rest:?}");
    let mut ids: Vec<i64> = ids.iter().filter_map(Value::as_i64).collect();
    ids.sort_unstable();
    assert_eq!(ids, [10, 11, 12, 13, 14]);
}

/// SIGTERM: the wrapper stops reading the host, the call in flight is answered (written to
/// the host), and the server's process group is ended before the wrapper exits 143.
#[tokio::test]
async fn sigterm_answers_the_call_in_flight_and_ends_the_server() {
    let files = Files::new("sigterm", "[tools.deploy]\nclass = \"irreversible\"\n");
    let mut host = Host::new(files.wrapper(&[], &[("ANSWER_DELAY_MS", "1500")]));
    host.initialize().await;
    host.send(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "deploy", "arguments": deploy()}}))
        .await;
    // The tool ran and waits before it answers: the call is in flight.
    let server = files.hung_server_pid().await;
    let wrapper = host.child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &wrapper])
        .status()
        .unwrap();
    assert!(sent.success());
    let answer = host.next_message().await;
    assert_eq!(answer["id"], 2, "{answer}");
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(text.ends_with(": done"), "the server's answer: {answer}");
    assert_eq!(host.next().await, None, "nothing more");
    assert_eq!(exit_code(&mut host.child).await, Some(143));
    let alive = std::process::Command::new("kill")
        .args(["-0", &server])
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!alive.success(), "the server (pid {server}) is gone");
    let records = files.ledger_list();
    assert_eq!(
        records[0]["state"], "completed_result_not_delivered",
        "the answer's outcome is recorded: {records:?}"
    );
    assert_eq!(files.effects().len(), 1);
}

/// `stdio --json --admin-listen`: the start line, on stderr (stdout is the host's), is one JSON
/// object naming the admin listener; its `/metrics` counts the call the host made, and
/// `/readyz` reads the ledger.
#[tokio::test]
async fn the_admin_listener_of_stdio_counts_its_calls_and_its_start_line_is_json() {
    let files = Files::new("admin", "[tools.deploy]\nclass = \"irreversible\"\n");
    let mut wrapper = files.wrapper(&["--json", "--admin-listen", "127.0.0.1:0"], &[]);
    let client = rmcp_client(&mut wrapper).await;
    let stderr = std::fs::read_to_string(files.dir.join("stderr")).unwrap();
    let start: Value = serde_json::from_str(stderr.lines().next().expect("a start line"))
        .unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert!(
        start["relaying"].as_str().unwrap().starts_with("stdio:"),
        "{start}"
    );
    assert!(start["pid"].as_u64().is_some(), "{start}");
    let admin = start["admin"].as_str().expect("the admin URL").to_owned();

    let done = tokio::time::timeout(WAIT, client.call_tool(tool_call("deploy", deploy())))
        .await
        .expect("in time")
        .expect("a CallToolResult");
    assert_ne!(done.is_error, Some(true), "{done:?}");
    let (status, metrics) = temp::get_text(&format!("{admin}/metrics")).await;
    assert_eq!(status, http::StatusCode::OK, "{metrics}");
    for sample in [
        "mcp_replay_guard_calls_total{tool=\"deploy\",decision=\"start\"} 1",
        "mcp_replay_guard_outcomes_total{tool=\"deploy\",outcome=\"completed\"} 1",
        "mcp_replay_guard_held_executions{tool=\"deploy\"} 0",
    ] {
        assert!(metrics.contains(sample), "{sample} not in:\n{metrics}");
    }
    assert_eq!(
        temp::get_text(&format!("{admin}/readyz")).await.0,
        http::StatusCode::OK
    );
    client.cancel().await.unwrap();
    assert_eq!(exit_code(&mut wrapper).await, Some(0));
    assert_eq!(files.effects().len(), 1);
}

/// `stdio --otlp-endpoint`: a `tools/call` whose `params._meta` carries a W3C `traceparent` is
/// guarded in the host's trace: the guard's span of the call, with its execution id, reaches a
/// real OTLP receiver with the host's trace id, below the wrapper's span of the request, whose
/// parent is the host's span.
#[tokio::test]
async fn a_calls_span_joins_the_trace_its_meta_names() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;

    let files = Files::new("trace", "[tools.deploy]\nclass = \"irreversible\"\n");
    let (endpoint, posted) = temp::post_receiver().await;
    let mut host = Host::new(files.wrapper(
        &["--otlp-endpoint", &endpoint],
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
    ));
    host.initialize().await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let params = json!({
        "name": "deploy",
        "arguments": deploy(),
        "_meta": {"traceparent": format!("00-{trace}-{parent}-01")},
    });
    let done = host.request(2, "tools/call", params).await;
    assert!(done.get("result").is_some(), "{done}");
    let (_, _, code) = host.finish().await;
    assert_eq!(code, Some(0));

    let mut spans = Vec::new();
    for (path, body) in posted.lock().unwrap().iter() {
        assert_eq!(path, "/v1/traces");
        let export = ExportTraceServiceRequest::decode(body.clone()).expect("OTLP protobuf");
        for resource in export.resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
    }
    let call = spans
        .iter()
        .find(|span| span.name == "tools_call")
        .unwrap_or_else(|| panic!("no tools_call span: {spans:#?}"));
    assert_eq!(hex::encode(&call.trace_id), trace);
    assert!(
        call.attributes.iter().any(|kv| kv.key == "execution_id"),
        "{call:#?}"
    );
    let request = spans
        .iter()
        .find(|span| span.span_id == call.parent_span_id)
        .expect("the call's parent span exported");
    assert_eq!(request.name, "mcp_request");
    assert_eq!(hex::encode(&request.parent_span_id), parent);
    assert_eq!(files.effects().len(), 1);
}
