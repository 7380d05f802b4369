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

/// A command run over SSH under the marker of an execution whose answer the ledger never got
/// (dispatched, then unknown, its target the host's key as the SSH integration names a host):
/// `resolve --probe` with the SSH flags reads the marker on the real sshd and shows it (exited
/// → applied, with the exit status); an execution with no marker there reads not applied; a
/// host that presents another key than the target names is refused, nothing read.
#[tokio::test]
async fn a_held_command_on_an_ssh_host_is_probed_by_its_marker() {
    use mcp_replay_guard::{
        execution::Claim,
        integrations::ssh::{MarkedCommand, run_marked},
    };
    use support::{dispatched_as, fingerprint_of_byte, sshd};
    if sshd::sshd_or_skip().is_none() {
        return;
    }
    let sshd = sshd::Sshd::start("resolve-probe").await;
    let dir = support::temp_dir("cli", "ssh-probe");
    let ledger = dir.join("ledger.jsonl");
    let p = ledger.to_str().unwrap();
    let state_dir = dir.join("markers").to_string_lossy().into_owned();
    let held = |byte: u8, target: &str| {
        let writer = FileLedger::open(&ledger).unwrap();
        let claim = Claim::new(
            fingerprint_of_byte(byte),
            "restart_service",
            "signed-process:com.example.agent".into(),
            "run:ssh".into(),
            target.into(),
            mcp_replay_guard::execution::RetryClass::Irreversible,
            "guard:ssh-test",
        );
        async move {
            let id = writer.claim(claim).await.unwrap().record().execution_id();
            let dispatched = dispatched_as(id, 1, Some("guard:ssh-test"), Some(1));
            writer.append(event_now(id, dispatched)).await.unwrap();
            let unknown = EventKind::Unknown {
                target_status: None,
                attempt: None,
                reason: "the connection broke".into(),
            };
            writer.append(event_now(id, unknown)).await.unwrap();
            id
        }
    };
    let ran = held(1, &sshd.host_fingerprint).await;
    let never = held(2, &sshd.host_fingerprint).await;
    let elsewhere = held(3, "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA").await;
    // The command runs under the marker; its answer never reaches the ledger.
    let session = sshd.config().connect().await.unwrap();
    let command = MarkedCommand::new("echo restarted").state_dir(state_dir.clone());
    run_marked(&session, ran, &command).await.unwrap();
    session.disconnect().await;

    let host = format!("127.0.0.1:{}", sshd.port);
    let key = sshd.dir.join("user_key").to_string_lossy().into_owned();
    let user = sshd::account();
    let probe = |id: ExecutionId| {
        let id = id.to_string();
        let argv = [
            "--json",
            "resolve",
            "--ledger",
            p,
            &id,
            "--probe",
            "--ssh-host",
            &host,
            "--ssh-user",
            &user,
            "--ssh-key",
            &key,
            "--ssh-state-dir",
            &state_dir,
        ]
        .map(str::to_owned);
        async move {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            replay_guard(&argv).await
        }
    };
    let applied = probe(ran).await;
    assert_eq!(applied.code, 0, "{applied:#?}");
    let answer: Value = serde_json::from_str(applied.stdout.trim()).unwrap();
    assert_eq!(answer["probe"], "applied", "{answer:#}");
    assert_eq!(answer["by"], "the SSH marker", "{answer:#}");
    let said = answer["said"].as_str().unwrap();
    assert!(
        said.contains(&sshd.host_fingerprint) && said.contains("restarted"),
        "{said}"
    );
    assert!(!applied.stdout.contains("PRIVATE KEY"), "{applied:#?}");

    let absent = probe(never).await;
    assert_eq!(absent.code, 0, "{absent:#?}");
    let answer: Value = serde_json::from_str(absent.stdout.trim()).unwrap();
    assert_eq!(answer["probe"], "not_applied", "{answer:#}");

    let refused = probe(elsewhere).await;
    assert_eq!(refused.code, 2, "{refused:#?}");
    assert!(
        refused.stderr.contains("does not match the pin")
            && refused.stderr.contains("nothing was settled"),
        "{refused:#?}"
    );

    // Without the flags, the error says what the probe needs.
    let id = ran.to_string();
    let bare = replay_guard(&["resolve", "--ledger", p, &id, "--probe"]).await;
    assert_eq!(bare.code, 2, "{bare:#?}");
    assert!(bare.stderr.contains("--ssh-host"), "{bare:#?}");
    for id in [ran, never, elsewhere] {
        assert_eq!(
            FileLedger::open_read_only(&ledger)
                .unwrap()
                .get(id)
                .await
                .unwrap()
                .unwrap()
                .state(),
            ExecutionState::Unknown,
            "a probe alone settles nothing"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}
