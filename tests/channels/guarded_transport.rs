//! `GuardedTransport` around real rmcp client transports: the `stdio_server` example as a
//! child process (`TokioChildProcess`), killed by SIGKILL after its side effect and before its
//! answer line, then started again; and an in-memory duplex whose server goes away mid-call.
//! The example's effects file is the count of side effects.

use crate::stdio_example;
use crate::support as temp;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use mcp_replay_guard::{
    ExecutionId,
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{GuardLayer, STRUCTURED_KEY},
    integrations::{rmcp::GuardedTransport, server::KEY_OUTCOME_UNKNOWN},
    ledger::{Ledger, MemoryLedger},
};
use rmcp::{
    ServiceExt,
    model::{CallToolRequestParams, CallToolResult},
    service::{RunningService, ServiceError},
    transport::TokioChildProcess,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn layer(ledger: MemoryLedger) -> GuardLayer {
    let contracts = ContractRegistry::builder()
        .tool("deploy", ToolContract::irreversible())
        .tool("set_flag", ToolContract::idempotent())
        .tool("read_flag", ToolContract::read_only())
        .build()
        .unwrap();
    GuardLayer::new(ledger, contracts, FingerprintKey::generate().unwrap())
        .execution_id_in_meta(true)
}

/// The example's files for one test: effects, its own ledger, the fault's one-shot marker.
struct Files(PathBuf);

impl Files {
    fn new(name: &str) -> Self {
        Self(temp::temp_dir("guarded-transport", name))
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn effects(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("effects"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

async fn client(
    guard: &GuardLayer,
    files: &Files,
    fault: Option<&str>,
) -> RunningService<rmcp::RoleClient, ()> {
    let mut command = tokio::process::Command::new(stdio_example::example_binary());
    command
        .env("EFFECTS_FILE", files.path("effects"))
        .env("LEDGER", files.path("server-ledger.jsonl"))
        .env("FAULT_ONCE_FILE", files.path("fault-once"))
        .env("PID_FILE", files.path("pid"));
    if let Some(fault) = fault {
        command.env("FAULT", fault);
    }
    let child = TokioChildProcess::new(command).expect("the example starts");
    ().serve(GuardedTransport::new(guard, child))
        .await
        .expect("initialize through the guard")
}

async fn call(
    client: &RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    arguments: Value,
) -> Result<CallToolResult, ServiceError> {
    let call = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().cloned().unwrap_or_default());
    tokio::time::timeout(WAIT, client.call_tool(call))
        .await
        .expect("an answer in time, never a hang")
}

/// Kills the example with SIGKILL once it wrote its pid (after the effect, before the answer).
async fn kill_when_hung(pid_file: &Path) {
    let deadline = Instant::now() + WAIT;
    let pid = loop {
        if let Ok(pid) = std::fs::read_to_string(pid_file)
            && !pid.trim().is_empty()
        {
            break pid.trim().to_owned();
        }
        assert!(Instant::now() < deadline, "the tool never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let status = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

/// The guard's own record in an answer: `structuredContent.mcp_replay_guard`.
fn guard_record(result: &CallToolResult) -> &Value {
    &result
        .structured_content
        .as_ref()
        .unwrap_or_else(|| panic!("the guard's answer has structured content: {result:?}"))
        [STRUCTURED_KEY]
}

fn execution_of(result: &CallToolResult) -> ExecutionId {
    guard_record(result)["execution_id"]
        .as_str()
        .expect("an execution id")
        .parse()
        .unwrap()
}

/// Kills the server mid-call through the first client and returns the uncertain answer.
async fn lost_answer(
    guard: &GuardLayer,
    files: &Files,
    tool: &str,
    arguments: Value,
) -> CallToolResult {
    let first = client(guard, files, Some("hang_after_effect")).await;
    let pending = {
        let peer = first.peer().clone();
        let call = CallToolRequestParams::new(tool.to_owned())
            .with_arguments(arguments.as_object().cloned().unwrap_or_default());
        tokio::spawn(async move { peer.call_tool(call).await })
    };
    kill_when_hung(&files.path("pid")).await;
    let answer = tokio::time::timeout(WAIT, pending)
        .await
        .expect("the call is answered when its server dies, never left hanging")
        .unwrap()
        .expect("the guard's answer is a result, not a transport error");
    let _ = first.cancel().await;
    answer
}

#[tokio::test]
async fn an_irreversible_call_whose_server_was_killed_is_held_after_the_restart() {
    let files = Files::new("irreversible");
    let ledger = MemoryLedger::new();
    let guard = layer(ledger.clone());
    let args = json!({"service": "catalog", "version": "2026.12"});

    let lost = lost_answer(&guard, &files, "deploy", args.clone()).await;
    assert_eq!(lost.is_error, Some(true), "{lost:?}");
    assert_eq!(guard_record(&lost)["state"], "unknown", "{lost:?}");
    let execution = execution_of(&lost);

    // The server again (its fault spent), the same call: held, the same execution.
    let second = client(&guard, &files, None).await;
    let held = call(&second, "deploy", args).await.unwrap();
    assert_eq!(held.is_error, Some(true), "{held:?}");
    assert_eq!(guard_record(&held)["state"], "needs_review", "{held:?}");
    assert_eq!(execution_of(&held), execution, "told the same execution");
    assert_eq!(files.effects().len(), 1, "{:?}", files.effects());
    let record = ledger.get(execution).await.unwrap().unwrap();
    assert_eq!(record.state(), ExecutionState::NeedsReview);
    assert_eq!(record.attempts(), 1, "never sent again");
    second.cancel().await.unwrap();
}

#[tokio::test]
async fn an_idempotent_call_is_re_sent_under_its_meta_key_and_the_server_runs_it_once() {
    let files = Files::new("idempotent");
    let ledger = MemoryLedger::new();
    let guard = layer(ledger.clone());
    let args = json!({"name": "beta", "value": true});

    let lost = lost_answer(&guard, &files, "set_flag", args.clone()).await;
    let execution = execution_of(&lost);

    let second = client(&guard, &files, None).await;
    let again = call(&second, "set_flag", args).await;
    // The server half saw the same key, whose first run was cut: it does not run it again.
    let Err(ServiceError::McpError(error)) = &again else {
        panic!("the server half's answer to a key whose first run was cut: {again:?}");
    };
    assert_eq!(i64::from(error.code.0), KEY_OUTCOME_UNKNOWN, "{error:?}");
    assert_eq!(files.effects().len(), 1, "{:?}", files.effects());
    let record = ledger.get(execution).await.unwrap().unwrap();
    assert_eq!(record.attempts(), 2, "re-sent once, under the same key");
    assert_eq!(
        record.state(),
        ExecutionState::Unknown,
        "the server's 'may have run' is not a failure that frees the intent"
    );
    // And a third ask is not a new execution either.
    let third = call(&second, "set_flag", json!({"name": "beta", "value": true})).await;
    assert!(third.is_err(), "{third:?}");
    assert_eq!(files.effects().len(), 1);
    second.cancel().await.unwrap();
}

#[tokio::test]
async fn calls_pass_and_read_only_tools_are_not_recorded() {
    let files = Files::new("plain");
    let ledger = MemoryLedger::new();
    let guard = layer(ledger.clone());
    let client = client(&guard, &files, None).await;
    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "deploy"));
    let set = call(&client, "set_flag", json!({"name": "a", "value": true}))
        .await
        .unwrap();
    assert_ne!(set.is_error, Some(true), "{set:?}");
    let read = call(&client, "read_flag", json!({"name": "a"}))
        .await
        .unwrap();
    assert_eq!(
        read.content[0].as_text().map(|t| t.text.as_str()),
        Some("a is true")
    );
    assert_eq!(files.effects().len(), 1);
    client.cancel().await.unwrap();
}
