//! `resolve --probe` runs the built-in probe the record calls for, as the built binary: a call
//! that became an MCP task is asked about with `tasks/get` at its target (after the handshake
//! of the era the server speaks), and a command run under a marker on an SSH host has its
//! marker read there, before anything is settled.

use crate::support;

use mcp_replay_guard::{
    ExecutionId,
    execution::{EventKind, ExecutionState},
    ledger::{FileLedger, Ledger},
};
use serde_json::{Value, json};
use support::{call, event_now, replay_guard, task_server_speaking};

/// The one execution in the ledger at `path`.
async fn only_execution(path: &std::path::Path) -> (ExecutionId, ExecutionState) {
    let records = FileLedger::open_read_only(path)
        .unwrap()
        .list()
        .await
        .unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    (records[0].execution_id(), records[0].state())
}

/// A `tools/call` whose answer is lost after it became a task (its task id landed, as after a
/// crash between the two writes): `resolve --probe` asks the server `tasks/get` in either era
/// and shows the task's status (completed → applied; working → in progress), settles nothing
/// alone, and with `--applied --note` keeps the answer in the resolved event. The call is
/// never sent again.
#[tokio::test]
async fn a_held_call_that_became_a_task_is_probed_with_tasks_get_in_both_eras() {
    for (version, status, verdict) in [
        ("2025-11-25", "completed", "applied"),
        ("2026-07-28", "working", "in_progress"),
    ] {
        let dir = support::temp_dir("cli", "task-probe");
        let ledger = dir.join("ledger.jsonl");
        let p = ledger.to_str().unwrap();
        let (url, seen) = task_server_speaking(version, status).await;
        let args = json!({"service": "catalog", "version": "5"});
        let called = call(&url, "deploy_release", args, &["--ledger", p]).await;
        assert_eq!(called.code, 3, "{version}: {called:#?}");
        let (execution, state) = only_execution(&ledger).await;
        assert!(
            matches!(state, ExecutionState::Unknown | ExecutionState::NeedsReview),
            "{state:?}"
        );
        let writer = FileLedger::open(&ledger).unwrap();
        let created = EventKind::TaskCreated {
            task_id: "t-1".into(),
        };
        writer.append(event_now(execution, created)).await.unwrap();
        drop(writer);
        let id = execution.to_string();

        // The target is recorded without its scheme: the error says what makes the probe apply.
        let unasked = replay_guard(&["resolve", "--ledger", p, &id, "--probe"]).await;
        assert_eq!(unasked.code, 2, "{unasked:#?}");
        assert!(
            unasked.stderr.contains("tasks/get") && unasked.stderr.contains("--url http"),
            "{unasked:#?}"
        );
        // Another server than the one the task lives on is refused before anything is sent.
        let elsewhere = replay_guard(&[
            "resolve",
            "--ledger",
            p,
            &id,
            "--probe",
            "--url",
            "http://127.0.0.1:9/mcp",
        ])
        .await;
        assert_eq!(elsewhere.code, 2, "{elsewhere:#?}");
        assert!(
            elsewhere.stderr.contains("not the execution's target"),
            "{elsewhere:#?}"
        );

        let probed = replay_guard(&[
            "--json", "resolve", "--ledger", p, &id, "--probe", "--url", &url,
        ])
        .await;
        assert_eq!(probed.code, 0, "{version}: {probed:#?}");
        let answer: Value = serde_json::from_str(probed.stdout.trim()).unwrap();
        assert_eq!(answer["probe"], verdict, "{version}: {answer:#}");
        assert_eq!(answer["by"], "tasks/get", "{answer:#}");
        let said = answer["said"].as_str().unwrap();
        assert!(said.contains("task t-1") && said.contains(&url), "{said}");
        if status == "completed" {
            assert!(said.contains("deployed by task t-1"), "{said}");
        }
        assert_eq!(
            only_execution(&ledger).await.1,
            state,
            "a probe alone settles nothing"
        );

        if status == "completed" {
            let settled = replay_guard(&[
                "resolve",
                "--ledger",
                p,
                &id,
                "--probe",
                "--url",
                &url,
                "--applied",
                "--note",
                "the task says so",
                "--operator",
                "alice",
            ])
            .await;
            assert_eq!(settled.code, 0, "{settled:#?}");
            assert!(
                settled
                    .stdout
                    .contains("tasks/get answered: tasks/get of task t-1")
            );
            let show = replay_guard(&["audit", "show", "--ledger", p, &id]).await;
            assert!(
                show.stdout.contains(
                    "settled as applied by operator:alice (the task says so); the probe \
                     answered: tasks/get of task t-1 at"
                ) && show.stdout.contains("deployed by task t-1"),
                "{show:#?}"
            );
            assert_eq!(
                only_execution(&ledger).await.1,
                ExecutionState::ResolvedApplied
            );
        }
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen.iter().filter(|m| *m == "tools/call").count(),
            1,
            "the call was never sent again: {seen:?}"
        );
        assert!(seen.iter().any(|m| m == "tasks/get"), "{seen:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
