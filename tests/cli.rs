//! The `replay-guard` binary over a real ledger file.

use std::{path::Path, process::Command, time::Duration};

use mcp_replay_guard::{
    ExecutionId, IdempotencyKey,
    contract::RetryClass,
    ledger::{Claim, EventKind, ExecutionState, FileLedger, Ledger, LedgerEvent, Timestamp},
};

fn replay_guard(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_replay-guard"))
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn claim(byte: u8) -> Claim {
    Claim {
        fingerprint: format!("hmac-sha256:{}", format!("{byte:02x}").repeat(32))
            .parse()
            .unwrap(),
        tool: "deploy_release".into(),
        actor: "signed-process:com.example.agent".into(),
        intent_scope: "run:cli".into(),
        target: "deploy-api.internal.example/mcp".into(),
        credential_ref: None,
        retry_class: RetryClass::Irreversible,
        link_window: Duration::from_secs(600),
        retention: Duration::from_secs(3600),
        owner: "guard:cli-test".into(),
        at: Timestamp::now(),
    }
}

/// A ledger with one delivered execution and one held for review.
async fn ledger(path: &Path) -> (ExecutionId, ExecutionId) {
    let ledger = FileLedger::open(path).unwrap();
    let mut ids = Vec::new();
    for byte in [1, 2] {
        let id = ledger
            .claim(claim(byte))
            .await
            .unwrap()
            .record()
            .execution_id;
        let event = |kind| LedgerEvent {
            execution_id: id,
            at: Timestamp::now(),
            kind,
        };
        ledger.append(event(EventKind::Authorized)).await.unwrap();
        let dispatched = EventKind::Dispatched {
            attempt: 1,
            idempotency_key: IdempotencyKey::from(id),
            key_from_caller: false,
            jsonrpc_id: Some(1.into()),
            session_id: None,
            owner: Some("guard:cli-test".into()),
        };
        ledger.append(event(dispatched)).await.unwrap();
        if byte == 1 {
            ledger
                .append(event(EventKind::Completed {
                    target_status: 200,
                    is_error: false,
                    result_reference: None,
                }))
                .await
                .unwrap();
            ledger
                .append(event(EventKind::Delivered {
                    jsonrpc_id: Some(1.into()),
                }))
                .await
                .unwrap();
        } else {
            ledger
                .append(event(EventKind::Unknown {
                    target_status: None,
                    attempt: None,
                    reason: "stream cut".into(),
                }))
                .await
                .unwrap();
            ledger
                .append(event(EventKind::NeedsReview {
                    reason: "irreversible".into(),
                }))
                .await
                .unwrap();
        }
        ids.push(id);
    }
    (ids[0], ids[1])
}

#[tokio::test]
async fn verify_list_show_and_resolve_a_ledger() {
    let dir = std::env::temp_dir().join(format!("mrg-cli-{}", ExecutionId::new().ulid()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ledger.jsonl");
    let (delivered, held) = ledger(&path).await;
    let p = path.to_str().unwrap();

    let (code, out, _) = replay_guard(&["audit", "verify", p]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ok: 10 events, head sha256:"), "{out}");

    let (code, out, _) = replay_guard(&["ledger", "list", p, "--state", "needs_review"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&held.to_string()) && !out.contains(&delivered.to_string()),
        "{out}"
    );

    let (code, out, _) = replay_guard(&["audit", "show", p, &held.to_string()]);
    assert_eq!(code, 0);
    assert!(
        out.contains("1. agent processes: one (guard:cli-test)")
            && out.contains("3. target: unknown (stream cut)"),
        "{out}"
    );

    let (code, out, _) = replay_guard(&[
        "resolve",
        p,
        &held.to_string(),
        "--not-applied",
        "--note",
        "checked the deploy API",
        "--operator",
        "alice",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("resolved_not_applied"), "{out}");
    let reopened = FileLedger::open(&path).unwrap();
    assert_eq!(
        reopened.get(held).await.unwrap().unwrap().state,
        ExecutionState::ResolvedNotApplied
    );
    drop(reopened);

    // Settling an execution that is not held is refused, with what to do next.
    let (code, _, err) = replay_guard(&[
        "resolve",
        p,
        &delivered.to_string(),
        "--applied",
        "--note",
        "x",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("audit show"), "{err}");

    // One changed byte: exit 1, naming the seq.
    let text = std::fs::read_to_string(&path).unwrap();
    let tampered = text.replacen("stream cut", "stream cUt", 1);
    assert_ne!(text, tampered);
    std::fs::write(&path, tampered).unwrap();
    let (code, out, _) = replay_guard(&["audit", "verify", p]);
    assert_eq!(code, 1);
    assert!(out.starts_with("seq 9: "), "{out}");

    let (code, _, err) = replay_guard(&[
        "audit",
        "verify",
        dir.join("missing.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("no ledger at"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// README carries the shipped policy file verbatim, so the documented example is the one that
/// `call --policy` is tested with.
#[test]
fn readme_carries_the_example_policy_verbatim() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let policy = std::fs::read_to_string(format!("{root}/examples/policy.toml")).unwrap();
    assert!(
        readme.contains(&format!("```toml\n{policy}```")),
        "README's policy example differs from examples/policy.toml"
    );
}
