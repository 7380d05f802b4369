//! Someone is told when an execution becomes held behind `replay-guard proxy` (the built
//! binary): `--on-held-url` gets one POST and `--on-held` one run per held execution, with the
//! execution and nothing of the call's arguments or credentials; the held queue lists it; the
//! operator asks the tool's status command, then settles it, and the repeat behaves so.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::*;

/// A lost response on an irreversible tool: the URL gets one POST, the command one run, each
/// with the execution (held, its tool and target) and neither the arguments nor the client's
/// credential; the repeat, held again, tells nobody twice; `ledger list --held` shows it;
/// `resolve --probe` shows the status command's answer and settles nothing, then settles it
/// with that answer kept; the repeat after it is answered as applied, never run.
#[tokio::test]
async fn a_held_execution_is_told_queued_probed_and_settled() {
    let server = json_server().await;
    let (base, posted) = post_receiver().await;
    let url = format!("{base}/hooks/held");
    let dir = temp_dir("cli-proxy-held", "hooks");
    let ledger = dir.join("ledger.jsonl");
    let ran = dir.join("ran.jsonl");
    let command = format!("cat >> '{}'; echo >> '{}'", ran.display(), ran.display());
    // The tool's status command, as an operator's policy names it.
    let policy = dir.join("policy.toml");
    let probe_stdin = dir.join("probe-stdin.json");
    std::fs::write(
        &policy,
        format!(
            "[tools.deploy_release]\nclass = \"irreversible\"\nstatus_command = [\"sh\", \"-c\", \"cat > '{}'; echo applied; echo seen in the release log\"]\n",
            probe_stdin.display()
        ),
    )
    .unwrap();
    let policy_arg = policy.to_string_lossy().into_owned();
    let proxy = start_proxy(
        &server.url,
        &[
            "--ledger",
            &ledger.to_string_lossy(),
            "--on-held-url",
            &url,
            "--on-held",
            &command,
            "--policy",
            &policy_arg,
        ],
    )
    .await;
    server.state.lose_next_response("deploy_release");
    let secret = "Bearer s3cret-of-the-client";
    let mut client = hyper_client();
    let held = send(
        &mut client,
        deploy_request(&proxy.url, 1, &[("authorization", secret)]),
    )
    .await
    .unwrap();
    let held = read_jsonrpc_response(held, &json!(1)).await.unwrap();
    let execution = structured(&held).unwrap()["mcp_replay_guard"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while posted.lock().unwrap().is_empty() || !ran.exists() {
        assert!(tokio::time::Instant::now() < deadline, "nobody was told");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The repeat is held again: nobody is told a second time.
    let again = send(
        &mut client,
        deploy_request(&proxy.url, 2, &[("authorization", secret)]),
    )
    .await
    .unwrap();
    read_jsonrpc_response(again, &json!(2)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    let posted: Vec<Value> = posted
        .lock()
        .unwrap()
        .iter()
        .map(|(path, body)| {
            assert_eq!(path, "/hooks/held");
            serde_json::from_slice(body).expect("JSON")
        })
        .collect();
    assert_eq!(posted.len(), 1, "{posted:#?}");
    let ran = std::fs::read_to_string(&ran).unwrap();
    let ran: Vec<Value> = ran
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(ran.len(), 1, "{ran:#?}");
    for notice in [&posted[0], &ran[0]] {
        assert_eq!(notice["event"], "held");
        assert_eq!(notice["execution_id"], execution.as_str());
        assert_eq!(notice["tool"], "deploy_release");
        assert!(
            matches!(notice["state"].as_str(), Some("unknown" | "needs_review")),
            "{notice}"
        );
        let text = notice.to_string();
        for never in ["s3cret", "catalog", "2026.07.22", "arguments"] {
            assert!(!text.contains(never), "{never} in {text}");
        }
    }

    let list = replay_guard(&[
        "--json",
        "ledger",
        "list",
        "--ledger",
        &ledger.to_string_lossy(),
        "--held",
    ])
    .await;
    assert_eq!(list.code, 0, "{list:#?}");
    let listed: Vec<Value> = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["execution_id"], execution.as_str());

    // The operator asks the tool's status command first: its answer is shown, nothing settled.
    let ledger_arg = ledger.to_string_lossy().into_owned();
    let probed = replay_guard(&[
        "resolve",
        "--ledger",
        &ledger_arg,
        &execution,
        "--probe",
        "--policy",
        &policy_arg,
    ])
    .await;
    assert_eq!(probed.code, 0, "{probed:#?}");
    assert!(
        probed.stdout.contains("applied") && probed.stdout.contains("seen in the release log"),
        "{probed:#?}"
    );
    let stdin_seen = std::fs::read_to_string(dir.join("probe-stdin.json")).unwrap();
    assert!(
        stdin_seen.contains(&execution) && !stdin_seen.contains("s3cret"),
        "{stdin_seen}"
    );
    let still: Vec<Value> = serde_json::from_str(
        &replay_guard(&[
            "--json",
            "ledger",
            "list",
            "--ledger",
            &ledger_arg,
            "--held",
        ])
        .await
        .stdout,
    )
    .unwrap();
    assert_eq!(still.len(), 1, "a probe alone settles nothing");

    // Then settles it, the probe's answer kept with the note and the operator.
    let settled = replay_guard(&[
        "resolve",
        "--ledger",
        &ledger_arg,
        &execution,
        "--probe",
        "--policy",
        &policy_arg,
        "--applied",
        "--note",
        "the release log shows it",
        "--operator",
        "alice",
    ])
    .await;
    assert_eq!(settled.code, 0, "{settled:#?}");
    let show = replay_guard(&["audit", "show", "--ledger", &ledger_arg, &execution]).await;
    assert!(
        show.stdout.contains("settled as applied by operator:alice (the release log shows it); the probe answered: applied"),
        "{show:#?}"
    );

    // The repeat behaves as the resolution says: applied, so it is never run again.
    let after = send(
        &mut client,
        deploy_request(&proxy.url, 3, &[("authorization", secret)]),
    )
    .await
    .unwrap();
    let after = read_jsonrpc_response(after, &json!(3)).await.unwrap();
    assert_eq!(server.state.side_effects("deploy_release"), 1, "{after:#}");
    assert_eq!(
        structured(&after).unwrap()["mcp_replay_guard"]["state"],
        "resolved_applied",
        "{after:#}"
    );
    proxy.stop().await;
}
