//! The PostgreSQL ledger against a real server.
//!
//! The server comes from `MCP_REPLAY_GUARD_POSTGRES_URL` (e.g.
//! `postgres://postgres@127.0.0.1:5432/mrg_test`). Unset, they are reported as ignored, except
//! under CI (`CI` set), where they fail. Each test works in a schema
//! of its own (`mrg_t_<test>_<ulid>`, through `PostgresLedger::connect_with_schema`), dropped
//! when the test passes, so the tests run in parallel in one database; a failed test leaves
//! its schema behind for inspection.
//!
//! `MCP_REPLAY_GUARD_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/mrg_dev \
//!  cargo test --features postgres --test postgres -- postgres_ledger`

use crate::support;

use std::{collections::HashSet, sync::Arc, time::Duration};

use bytes::Bytes;
use mcp_replay_guard::{
    Actor, ExecutionId, IntentScope,
    contract::{ContractRegistry, ToolContract},
    execution::{Claim, Claimed, EventKind, ExecutionState, LedgerEvent, Timestamp},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    ledger::{
        Ledger, LedgerError, PostgresLedger,
        chain::{ChainProblem, VerifyReport},
    },
};
use serde_json::{Value, json};
use support::*;
use tower::{Layer, retry::Retry};

fn claim(n: u32, at: u64) -> Claim {
    let mut claim = deploy_claim(fingerprint_of(n), "run:5f8097", "test");
    claim.credential_ref = Some("deploy-service".into());
    claim.link_window = Duration::from_secs(60);
    claim.at = Timestamp::from_millis(at);
    claim
}

fn event(id: ExecutionId, at: u64, kind: EventKind) -> LedgerEvent {
    LedgerEvent {
        execution_id: id,
        at: Timestamp::from_millis(at),
        kind,
    }
}

/// The first attempt of `id`, JSON-RPC id 7, by no owner in particular.
fn first_dispatched(id: ExecutionId) -> EventKind {
    dispatched_as(id, 1, None, Some(7))
}

async fn verified(ledger: &PostgresLedger) -> VerifyReport {
    ledger.verify().await.unwrap()
}

async fn new_execution(ledger: &PostgresLedger, n: u32, at: u64) -> ExecutionId {
    match ledger.claim(claim(n, at)).await.unwrap() {
        Claimed::New(record) => record.execution_id(),
        Claimed::Existing(record) => panic!("expected a new execution, got {record:?}"),
    }
}

pub(crate) async fn the_lifecycle_reads_as_the_design_record_and_survives_a_restart() {
    let Some(schema) = TestSchema::new("lifecycle") else {
        return;
    };
    let ledger = schema.replica().await;
    let id = new_execution(&ledger, 1, 1_000).await;
    ledger
        .append(event(id, 1_001, EventKind::Authorized))
        .await
        .unwrap();
    ledger
        .append(event(id, 1_002, first_dispatched(id)))
        .await
        .unwrap();
    let reference = ledger
        .store_result(id, Bytes::from_static(b"{\"content\":[]}"))
        .await
        .unwrap();
    let record = ledger
        .append(event(
            id,
            7_000,
            EventKind::Completed {
                target_status: 201,
                is_error: false,
                result_reference: Some(reference.clone()),
            },
        ))
        .await
        .unwrap();
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(json["state"], "completed_result_not_delivered");
    assert_eq!(json["execution_id"], json!(id.to_string()));
    assert_eq!(json["target_status"], 201);
    assert_eq!(json["result_reference"], json!(reference));
    assert_eq!(json["dispatched_at"], "1970-01-01T00:00:01.002Z");
    assert_eq!(json["attempts"], 1);
    assert_eq!(
        ledger.load_result(&reference).await.unwrap().unwrap(),
        &b"{\"content\":[]}"[..]
    );
    // What a reader gets back from the table is exactly what the writer returned.
    assert_eq!(ledger.get(id).await.unwrap().as_ref(), Some(&record));
    // Still linkable: a repeat gets this execution back.
    assert!(
        matches!(ledger.claim(claim(1, 2_000)).await.unwrap(), Claimed::Existing(r) if r.execution_id() == id)
    );
    let record = ledger
        .append(event(id, 7_001, EventKind::Delivered { jsonrpc_id: None }))
        .await
        .unwrap();
    assert_eq!(serde_json::to_value(&record).unwrap()["state"], "delivered");
    // Delivered: the same intent again is a new execution.
    let second = new_execution(&ledger, 1, 8_000).await;
    assert_ne!(second, id);

    // A restart: a new ledger over the same tables reads the same.
    drop(ledger);
    let ledger = schema.replica().await;
    assert_eq!(ledger.get(id).await.unwrap(), Some(record));
    let names = event_names(&ledger, id).await;
    assert_eq!(
        names,
        [
            "accepted",
            "authorized",
            "dispatched",
            "completed",
            "delivered"
        ]
    );
    let ids: Vec<_> = ledger
        .list()
        .await
        .unwrap()
        .iter()
        .map(|r| r.execution_id())
        .collect();
    assert_eq!(ids, [id, second]);
    let report = verified(&ledger).await;
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.verified, 6);
    assert_eq!(
        schema
            .query_i64s(&ledger, "SELECT count(*) FROM {s}.mrg_schema_version")
            .await,
        [2]
    );
    schema.drop(&ledger).await;
}

pub(crate) async fn two_replicas_racing_500_claims_of_one_intent_have_one_winner_and_one_chain() {
    let Some(schema) = TestSchema::new("race") else {
        return;
    };
    // Two replicas: separate ledgers, separate pools, separate writers.
    let replicas = [schema.replica().await, schema.replica().await];
    const CALLERS: u32 = 500;
    let start = Arc::new(tokio::sync::Barrier::new(CALLERS as usize));
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let ledger = replicas[i as usize % 2].clone();
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let shared = ledger.claim(claim(0, 1_000)).await.unwrap();
                // And an execution of its own, so that both replicas keep extending the chain.
                let own = match ledger.claim(claim(i + 1, 1_000)).await.unwrap() {
                    Claimed::New(record) => record.execution_id(),
                    Claimed::Existing(record) => panic!("a private intent was linked: {record:?}"),
                };
                ledger
                    .append(event(own, 1_001, EventKind::Authorized))
                    .await
                    .unwrap();
                shared
            })
        })
        .collect();
    let mut new = 0;
    let mut ids = HashSet::new();
    for task in tasks {
        let claimed = task.await.unwrap();
        new += usize::from(matches!(claimed, Claimed::New(_)));
        ids.insert(claimed.record().execution_id());
    }
    assert_eq!(
        (new, ids.len()),
        (1, 1),
        "exactly one winner, one execution"
    );

    // One linear chain: 1 shared accepted + 500 accepted + 500 authorized, seq 1..=1001.
    let lines = 1 + 2 * i64::from(CALLERS);
    assert_eq!(
        schema
            .query_i64s(
                &replicas[0],
                "SELECT count(*), min(seq), max(seq), count(DISTINCT prev) FROM {s}.mrg_events"
            )
            .await,
        [lines, 1, lines, lines]
    );
    for replica in &replicas {
        let report = verified(replica).await;
        assert!(report.is_ok(), "{report}");
        assert_eq!(report.verified, lines as u64);
    }
    assert_eq!(
        replicas[1].list().await.unwrap().len(),
        1 + CALLERS as usize
    );
    schema.drop(&replicas[0]).await;
}

pub(crate) async fn transitions_the_state_machine_refuses_write_nothing() {
    let Some(schema) = TestSchema::new("refused") else {
        return;
    };
    let ledger = schema.replica().await;
    let id = new_execution(&ledger, 1, 0).await;
    let completed = || {
        event(
            id,
            1,
            EventKind::Completed {
                target_status: 200,
                is_error: false,
                result_reference: None,
            },
        )
    };
    let err = ledger.append(completed()).await.unwrap_err();
    assert!(err.is_invalid_transition(), "{err}");
    assert_eq!(
        ledger.get(id).await.unwrap().unwrap().state(),
        ExecutionState::Accepted
    );
    assert_eq!(ledger.events(id).await.unwrap().len(), 1);
    assert_eq!(verified(&ledger).await.verified, 1);

    // A refused event next to an allowed one (same batch or not): only the allowed one lands.
    let (refused, allowed) = tokio::join!(
        ledger.append(completed()),
        ledger.append(event(id, 2, EventKind::Authorized))
    );
    assert!(refused.unwrap_err().is_invalid_transition());
    assert_eq!(allowed.unwrap().state(), ExecutionState::Authorized);
    // A second `accepted` for the same execution is refused too.
    let accepted = claim(1, 3).accepted_event(id);
    assert!(
        ledger
            .append(accepted)
            .await
            .unwrap_err()
            .is_invalid_transition()
    );
    let names = event_names(&ledger, id).await;
    assert_eq!(names, ["accepted", "authorized"]);
    assert_eq!(
        schema
            .query_i64s(&ledger, "SELECT count(*) FROM {s}.mrg_events")
            .await,
        [2]
    );

    let missing = ExecutionId::new();
    assert!(matches!(
        ledger.append(event(missing, 1, EventKind::Authorized)).await,
        Err(LedgerError::NotFound(m)) if m == missing
    ));
    assert!(matches!(
        ledger.store_result(missing, Bytes::from_static(b"{}")).await,
        Err(LedgerError::NotFound(m)) if m == missing
    ));
    let report = verified(&ledger).await;
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.verified, 2);
    schema.drop(&ledger).await;
}

pub(crate) async fn an_edited_or_deleted_event_row_is_named_by_its_seq() {
    let Some(schema) = TestSchema::new("tamper") else {
        return;
    };
    let ledger = schema.replica().await;
    let id = new_execution(&ledger, 1, 0).await;
    for (at, kind) in [
        (1, EventKind::Authorized),
        (2, first_dispatched(id)),
        (
            3,
            EventKind::Unknown {
                target_status: None,
                attempt: None,
                reason: "connection reset".into(),
            },
        ),
        (
            4,
            EventKind::NeedsReview {
                reason: "unknown outcome".into(),
            },
        ),
    ] {
        ledger.append(event(id, at, kind)).await.unwrap();
    }
    let report = verified(&ledger).await;
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.verified, 5);

    // A field value inside a line.
    let original = schema.line(&ledger, 4).await;
    assert!(original.contains("connection reset"), "{original}");
    schema
        .set_line(
            &ledger,
            4,
            &original.replace("connection reset", "refused by server"),
        )
        .await;
    let report = verified(&ledger).await;
    assert_eq!(
        report.first_bad,
        Some((4, ChainProblem::Edited)),
        "{report}"
    );
    assert_eq!(report.verified, 3);
    schema.set_line(&ledger, 4, &original).await;
    assert!(verified(&ledger).await.is_ok());

    // A number inside a line.
    let original = schema.line(&ledger, 3).await;
    assert!(original.contains("\"attempt\":1"), "{original}");
    schema
        .set_line(
            &ledger,
            3,
            &original.replace("\"attempt\":1", "\"attempt\":2"),
        )
        .await;
    assert_eq!(
        verified(&ledger).await.first_bad,
        Some((3, ChainProblem::Edited))
    );
    schema.set_line(&ledger, 3, &original).await;

    // A column that copies the line (the hash the next append chains to).
    schema
        .sql(
            &ledger,
            "UPDATE {s}.mrg_events SET hash = 'sha256:' || repeat('0', 64) WHERE seq = 2",
        )
        .await;
    assert_eq!(
        verified(&ledger).await.first_bad,
        Some((2, ChainProblem::Edited))
    );
    schema
        .sql(
            &ledger,
            "UPDATE {s}.mrg_events SET hash = (line::jsonb)->>'hash' WHERE seq = 2",
        )
        .await;
    assert!(verified(&ledger).await.is_ok());

    // A deleted row: the gap is named at the line after it.
    assert_eq!(
        schema
            .sql(&ledger, "DELETE FROM {s}.mrg_events WHERE seq = 3")
            .await,
        1
    );
    let report = verified(&ledger).await;
    assert_eq!(
        report.first_bad,
        Some((4, ChainProblem::Deleted { missing: 1 })),
        "{report}"
    );
    assert_eq!(report.verified, 2);
    schema.drop(&ledger).await;
}

pub(crate) async fn settled_links_end_with_the_window_and_purged_records_leave_the_index_not_the_chain()
 {
    let Some(schema) = TestSchema::new("retention") else {
        return;
    };
    let ledger = schema.replica().await;
    let first = new_execution(&ledger, 1, 0).await;
    // In flight, it holds its intent past the window.
    assert!(matches!(
        ledger.claim(claim(1, 60_001)).await.unwrap(),
        Claimed::Existing(r) if r.execution_id() == first
    ));
    let reference = ledger
        .store_result(first, Bytes::from_static(b"{\"content\":[]}"))
        .await
        .unwrap();
    ledger
        .append(event(first, 1, first_dispatched(first)))
        .await
        .unwrap();
    let completed = EventKind::Completed {
        target_status: 200,
        is_error: false,
        result_reference: Some(reference.clone()),
    };
    ledger.append(event(first, 2, completed)).await.unwrap();
    // Completed, not delivered: its result is handed back inside the window only.
    assert!(matches!(
        ledger.claim(claim(1, 60_000)).await.unwrap(),
        Claimed::Existing(r) if r.execution_id() == first
    ));
    let second = new_execution(&ledger, 1, 60_001).await;
    assert_ne!(second, first);
    assert_eq!(ledger.list().await.unwrap().len(), 2);

    // Retention counts from the last event (2 ms).
    assert_eq!(
        ledger
            .purge_expired(Timestamp::from_millis(3_600_002))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        ledger
            .purge_expired(Timestamp::from_millis(3_600_003))
            .await
            .unwrap(),
        1
    );
    assert!(ledger.get(first).await.unwrap().is_none());
    assert!(ledger.get(second).await.unwrap().is_some());
    assert_eq!(ledger.load_result(&reference).await.unwrap(), None);
    assert!(matches!(
        ledger.append(event(first, 1, EventKind::Authorized)).await,
        Err(LedgerError::NotFound(m)) if m == first
    ));
    // The chain keeps every event.
    assert_eq!(ledger.events(first).await.unwrap().len(), 3);
    let report = verified(&ledger).await;
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.verified, 4);

    // In flight while its owner's lease lives: retention never ends the hold.
    assert_eq!(
        ledger
            .purge_expired(Timestamp::from_millis(10_000_000))
            .await
            .unwrap(),
        0
    );
    let denied = EventKind::Denied {
        reason: "no".into(),
    };
    ledger.append(event(second, 60_002, denied)).await.unwrap();
    assert_eq!(
        ledger
            .purge_expired(Timestamp::from_millis(10_000_000))
            .await
            .unwrap(),
        1
    );
    assert!(ledger.list().await.unwrap().is_empty());
    assert_eq!(
        schema
            .query_i64s(&ledger, "SELECT count(*) FROM {s}.mrg_results")
            .await,
        [0]
    );
    schema.drop(&ledger).await;
}

pub(crate) async fn an_owner_is_alive_while_its_ledger_runs_and_dead_once_dropped() {
    let Some(schema) = TestSchema::new("owners") else {
        return;
    };
    let observer = schema.replica().await;
    let owning = schema.replica().await;
    let mut owned = claim(1, 0);
    owned.owner = "guard:owners-test".into();
    owning.claim(owned).await.unwrap();

    assert!(owning.is_owner_alive("guard:owners-test").await);
    assert!(observer.is_owner_alive("guard:owners-test").await);
    assert!(!observer.is_owner_alive("guard:never-claimed").await);

    // The owning replica goes away: its leases are released.
    drop(owning);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while observer.is_owner_alive("guard:owners-test").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease outlived its ledger"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    schema.drop(&observer).await;
}

pub(crate) async fn replicas_connecting_together_migrate_once() {
    let Some(schema) = TestSchema::new("migrate") else {
        return;
    };
    let connects: Vec<_> = (0..8)
        .map(|_| {
            let (url, name) = (schema.url.clone(), schema.name.clone());
            tokio::spawn(async move { PostgresLedger::connect_with_schema(&url, &name).await })
        })
        .collect();
    let mut ledgers = Vec::new();
    for connect in connects {
        ledgers.push(connect.await.unwrap().unwrap());
    }
    assert_eq!(
        schema
            .query_i64s(
                &ledgers[0],
                "SELECT count(*), max(version)::int8 FROM {s}.mrg_schema_version"
            )
            .await,
        [2, 2]
    );
    assert_eq!(ledgers[3].schema(), schema.name);
    schema.drop(&ledgers[0]).await;
}

pub(crate) async fn errors_and_debug_output_never_show_the_password() {
    let unreachable = PostgresLedger::connect("postgres://mrg:s3cr3t-pw@127.0.0.1:1/nowhere")
        .await
        .unwrap_err();
    let message = unreachable.to_string();
    assert!(matches!(unreachable, LedgerError::Storage(_)), "{message}");
    assert!(!message.contains("s3cr3t-pw"), "{message}");
    assert!(message.contains("reachable"), "{message}");

    let garbled = PostgresLedger::connect("postgres://mrg:s3cr3t-pw@127.0.0.1:port/x")
        .await
        .unwrap_err()
        .to_string();
    assert!(!garbled.contains("s3cr3t-pw"), "{garbled}");
    assert!(garbled.contains("URL"), "{garbled}");

    let bad_schema = PostgresLedger::connect_with_schema("postgres://127.0.0.1:1/x", "Bad-Name")
        .await
        .unwrap_err()
        .to_string();
    assert!(bad_schema.contains("schema name"), "{bad_schema}");

    // With a server (trust auth accepts any password): Debug shows no credentials.
    let Some(schema) = TestSchema::new("debug") else {
        return;
    };
    let Some((scheme, rest)) = schema.url.split_once("://") else {
        return;
    };
    let Some((user, host)) = rest.split_once('@').filter(|(user, _)| !user.contains(':')) else {
        eprintln!("skipped the Debug check: the URL already carries a password");
        return;
    };
    let with_password = format!("{scheme}://{user}:s3cr3t-pw@{host}");
    let ledger = PostgresLedger::connect_with_schema(&with_password, &schema.name)
        .await
        .unwrap();
    let debug = format!("{ledger:?}");
    assert!(!debug.contains("s3cr3t-pw"), "{debug}");
    assert!(debug.contains(&schema.name), "{debug}");
    schema.drop(&ledger).await;
}

// ---- the guard end to end over PostgreSQL ----

fn guard_answer(response: &Value) -> &Value {
    response
        .pointer("/result/structuredContent/mcp_replay_guard")
        .unwrap_or_else(|| panic!("not a guard answer: {response}"))
}

pub(crate) async fn a_lost_response_on_an_irreversible_tool_is_recorded_for_review_in_postgres() {
    let Some(schema) = TestSchema::new("guard") else {
        return;
    };
    let ledger = schema.replica().await;
    let server = TestServer::start().await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let registry = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()
        .unwrap();
    let layer = GuardLayer::new(
        ledger.clone(),
        registry,
        FingerprintKey::from_bytes(&[9; 32]).unwrap(),
    )
    .actor(Actor::from("signed-process:com.example.agent"))
    .intent_scope(IntentScope::from("run:5f8097"));
    let mut client = Retry::new(
        RetryEveryError(3),
        layer.layer(hyper_client_with_body::<GuardRequestBody>()),
    );
    server.state.lose_next_response("deploy_release");
    let args = json!({"service": "catalog", "version": "2026.07.22"});

    let response = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "deploy_release",
        args.clone(),
    )
    .await
    .unwrap();

    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(response["result"]["isError"], true, "{response}");
    let answer = guard_answer(&response);
    assert_eq!(answer["state"], "needs_review");

    // Another replica reads the same from PostgreSQL.
    let other = schema.replica().await;
    let records = other.list().await.unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    let stored = &records[0];
    assert_eq!(stored.state(), ExecutionState::NeedsReview);
    assert_eq!(stored.attempts(), 1);
    assert_eq!(
        answer["execution_id"],
        json!(stored.execution_id().to_string())
    );
    let names = event_names(&other, stored.execution_id()).await;
    assert_eq!(names.first(), Some(&"accepted"), "{names:?}");
    // The answer held for review, then each repeat answered from the ledger, counted.
    let settled: Vec<_> = names.iter().filter(|n| **n != "repeated").collect();
    assert_eq!(settled.last(), Some(&&"needs_review"), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| **n == "dispatched").count(),
        1,
        "{names:?}"
    );

    // Asking again gives the same answer, still without sending.
    let again = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        3,
        "deploy_release",
        args,
    )
    .await
    .unwrap();
    assert_eq!(guard_answer(&again)["execution_id"], answer["execution_id"]);
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    // The repeat is an event of the execution: the timeline counts how often an agent asked.
    let repeats = |names: Vec<&str>| names.iter().filter(|n| **n == "repeated").count();
    let before = repeats(names);
    let after = repeats(event_names(&other, stored.execution_id()).await);
    assert_eq!(after, before + 1, "one more repeat recorded");
    let report = verified(&other).await;
    assert!(report.is_ok(), "{report}");
    schema.drop(&other).await;
}

/// In PostgreSQL: an execution dispatched by an owner that is gone and
/// continued through another replica belongs to the continuing owner, whose lease is taken
/// in the dispatch's own transaction (that replica never claimed anything). A stale
/// continuation, from what was read before, is refused.
pub(crate) async fn a_continuation_moves_the_owner_and_its_lease_with_it() {
    let Some(schema) = TestSchema::new("continue") else {
        return;
    };
    let dispatched = |id, attempt, owner| dispatched(id, attempt, Some(owner));
    let observer = schema.replica().await;
    let first = schema.replica().await;
    let mut owned = claim(1, 0);
    owned.owner = "guard:pg-one".into();
    let id = first.claim(owned).await.unwrap().record().execution_id();
    first
        .append(event(id, 1, dispatched(id, 1, "guard:pg-one")))
        .await
        .unwrap();
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while observer.is_owner_alive("guard:pg-one").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease outlived its ledger"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let second = schema.replica().await;
    let unknown = |attempt| EventKind::Unknown {
        target_status: None,
        reason: "its owner is gone".into(),
        attempt: Some(attempt),
    };
    // the replica that connects after the owner is gone settles its dispatched
    // attempt as unknown (as the file ledger does on open), so the continuation starts there.
    let orphan = second.get(id).await.unwrap().unwrap();
    assert_eq!(
        (orphan.state(), orphan.attempts()),
        (ExecutionState::Unknown, 1)
    );
    let record = second
        .append(event(id, 3, dispatched(id, 2, "guard:pg-two")))
        .await
        .unwrap();
    assert_eq!(record.owner(), "guard:pg-two");

    let record = observer.get(id).await.unwrap().unwrap();
    assert_eq!(record.state(), ExecutionState::Dispatched);
    assert_eq!((record.owner(), record.attempts()), ("guard:pg-two", 2));
    assert!(observer.is_owner_alive("guard:pg-two").await);
    assert_eq!(
        schema
            .query_i64s(
                &observer,
                "SELECT count(*) FROM {s}.mrg_executions WHERE owner = 'guard:pg-two'"
            )
            .await,
        [1]
    );
    // From what was read before attempt 2: both refused, nothing written.
    for stale in [unknown(1), dispatched(id, 2, "guard:pg-three")] {
        let error = observer.append(event(id, 4, stale)).await.unwrap_err();
        assert!(error.is_invalid_transition(), "{error}");
    }
    assert_eq!(observer.events(id).await.unwrap().len(), 4);
    let report = verified(&observer).await;
    assert!(report.is_ok(), "{report}");
    drop(second);
    schema.drop(&observer).await;
}

/// In PostgreSQL: an execution re-sent over an unknown outcome by another replica, which
/// then went away, stays past its retention while the replica that sent the earlier attempt
/// lives (that attempt may still be running at the target), and leaves once it is gone too.
pub(crate) async fn the_owner_of_an_earlier_attempt_in_doubt_holds_retention() {
    let Some(schema) = TestSchema::new("earlier_owner") else {
        return;
    };
    let dispatched = |id, attempt, owner| dispatched(id, attempt, Some(owner));
    let unknown = |attempt| EventKind::Unknown {
        target_status: None,
        reason: "no answer".into(),
        attempt: Some(attempt),
    };
    let observer = schema.replica().await;
    let first = schema.replica().await;
    let mut owned = claim(1, 0);
    owned.owner = "guard:pg-first".into();
    let id = first.claim(owned).await.unwrap().record().execution_id();
    first
        .append(event(id, 1, dispatched(id, 1, "guard:pg-first")))
        .await
        .unwrap();
    first.append(event(id, 2, unknown(1))).await.unwrap();
    let second = schema.replica().await;
    second
        .append(event(id, 3, dispatched(id, 2, "guard:pg-second")))
        .await
        .unwrap();
    second.append(event(id, 4, unknown(2))).await.unwrap();
    drop(second);
    let gone = |owner: &'static str| {
        let observer = &observer;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while observer.is_owner_alive(owner).await {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{owner} outlived its ledger"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    gone("guard:pg-second").await;
    let record = observer.get(id).await.unwrap().unwrap();
    assert_eq!(record.owner(), "guard:pg-second");
    assert_eq!(record.earlier_owners(), ["guard:pg-first"]);

    let day_later = Timestamp::from_millis(86_400_000 * 30);
    assert_eq!(observer.purge_expired(day_later).await.unwrap(), 0);
    assert!(observer.get(id).await.unwrap().is_some());
    drop(first);
    gone("guard:pg-first").await;
    assert_eq!(observer.purge_expired(day_later).await.unwrap(), 1);
    assert!(observer.get(id).await.unwrap().is_none());
    schema.drop(&observer).await;
}

/// An execution left `dispatched` by an owner whose lease ended reads `unknown` from a ledger
/// that connects afterwards, as it does in a file ledger reopened (it used to read
/// `dispatched` in PostgreSQL), and from one that was connected all along; settled once.
pub(crate) async fn a_dispatched_execution_whose_owner_is_gone_reads_unknown_from_another_replica()
{
    let Some(schema) = TestSchema::new("orphan") else {
        return;
    };
    let observer = schema.replica().await;
    let first = schema.replica().await;
    let mut owned = claim(1, 0);
    owned.owner = "guard:orphan-one".into();
    let id = first.claim(owned).await.unwrap().record().execution_id();
    first
        .append(event(id, 1, dispatched(id, 1, Some("guard:orphan-one"))))
        .await
        .unwrap();
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while observer.is_owner_alive("guard:orphan-one").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease outlived its ledger"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The observer connected while the owner lived: it reads what was written.
    let before = observer.get(id).await.unwrap().unwrap();
    assert_eq!(before.state(), ExecutionState::Dispatched);

    let second = schema.replica().await;
    for ledger in [&second, &observer] {
        let record = ledger.get(id).await.unwrap().unwrap();
        assert_eq!(record.state(), ExecutionState::Unknown);
        assert!(
            record
                .reason()
                .is_some_and(|r| r.contains("ended before its outcome was observed")),
            "{:?}",
            record.reason()
        );
    }
    // Settled once: a third replica writes nothing more.
    let third = schema.replica().await;
    assert_eq!(third.events(id).await.unwrap().len(), 3);
    assert!(third.verify().await.unwrap().is_ok());
    schema.drop(&third).await;
}

/// A failed query keeps the PostgreSQL error as its source.
pub(crate) async fn a_postgres_failure_keeps_its_source() {
    let Some(schema) = TestSchema::new("source") else {
        return;
    };
    let ledger = schema.replica().await;
    schema.sql(&ledger, "DROP SCHEMA {s} CASCADE").await;
    let error = ledger.get(ExecutionId::new()).await.unwrap_err();
    assert!(matches!(error, LedgerError::Storage(_)), "{error}");
    let source = std::error::Error::source(&error).expect("a source");
    assert!(
        source.downcast_ref::<tokio_postgres::Error>().is_some(),
        "{source:?}"
    );
}

// ---- partitions: one chain per partition of the intent space ----

/// The chain (partition) an execution's intent is in, as its index row says.
async fn chain_of(schema: &TestSchema, ledger: &PostgresLedger, id: ExecutionId) -> i64 {
    let statement =
        format!("SELECT chain::int8 FROM {{s}}.mrg_executions WHERE execution_id = '{id}'");
    schema.query_i64s(ledger, &statement).await[0]
}

pub(crate) async fn two_replicas_racing_on_one_intent_create_exactly_one_execution_in_many_partitions()
 {
    let Some(schema) = TestSchema::new("race_each") else {
        return;
    };
    let replicas = [schema.replica().await, schema.replica().await];
    // 64 intents, in as many partitions nearly; 8 callers per intent, half on each replica,
    // all let go at once.
    const INTENTS: u32 = 64;
    const CALLERS: u32 = 8;
    let start = Arc::new(tokio::sync::Barrier::new((INTENTS * CALLERS) as usize));
    let tasks: Vec<_> = (0..INTENTS * CALLERS)
        .map(|i| {
            let ledger = replicas[i as usize % 2].clone();
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let claimed = ledger.claim(claim(i / CALLERS, 1_000)).await.unwrap();
                (i / CALLERS, claimed)
            })
        })
        .collect();
    let mut by_intent: Vec<(usize, HashSet<ExecutionId>)> =
        (0..INTENTS).map(|_| (0, HashSet::new())).collect();
    for task in tasks {
        let (intent, claimed) = task.await.unwrap();
        let (new, ids) = &mut by_intent[intent as usize];
        *new += usize::from(matches!(claimed, Claimed::New(_)));
        ids.insert(claimed.record().execution_id());
    }
    let mut chains = HashSet::new();
    for (intent, (new, ids)) in by_intent.iter().enumerate() {
        assert_eq!((*new, ids.len()), (1, 1), "intent {intent}");
        chains.insert(chain_of(&schema, &replicas[0], *ids.iter().next().unwrap()).await);
    }
    // Spread over many partitions (64 intents over 256 fill about 57).
    assert!(chains.len() > 32, "{chains:?}");
    assert_eq!(
        schema
            .query_i64s(
                &replicas[0],
                "SELECT count(*), count(DISTINCT (actor, intent_scope, fingerprint)) \
                 FROM {s}.mrg_executions"
            )
            .await,
        [i64::from(INTENTS), i64::from(INTENTS)]
    );
    let report = verified(&replicas[1]).await;
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.verified, u64::from(INTENTS));
    schema.drop(&replicas[0]).await;
}

pub(crate) async fn verify_names_an_edited_or_deleted_row_in_a_chain_other_than_the_first() {
    let Some(schema) = TestSchema::new("tamper_chain") else {
        return;
    };
    let ledger = schema.replica().await;
    for n in 0..40 {
        let id = new_execution(&ledger, n, 0).await;
        ledger
            .append(event(id, 1, EventKind::Authorized))
            .await
            .unwrap();
    }
    assert!(verified(&ledger).await.is_ok());
    // The first line of a chain other than chain 0, and the next line of that chain.
    let [seq, chain] = schema
        .query_i64s(
            &ledger,
            "SELECT e.seq, x.chain::int8 FROM {s}.mrg_events e \
             JOIN {s}.mrg_executions x USING (execution_id) \
             WHERE x.chain <> 0 ORDER BY e.seq LIMIT 1",
        )
        .await[..]
    else {
        panic!("no line outside chain 0");
    };
    let next = schema
        .query_i64s(
            &ledger,
            &format!(
                "SELECT min(e.seq) FROM {{s}}.mrg_events e \
                 JOIN {{s}}.mrg_executions x USING (execution_id) \
                 WHERE x.chain = {chain} AND e.seq > {seq}"
            ),
        )
        .await[0];

    let original = schema.line(&ledger, seq).await;
    schema
        .set_line(&ledger, seq, &original.replace("run:5f8097", "run:forged"))
        .await;
    let report = verified(&ledger).await;
    assert_eq!(
        report.first_bad,
        Some((seq as u64, ChainProblem::Edited)),
        "{report}"
    );
    assert_eq!(report.verified, seq as u64 - 1);
    schema.set_line(&ledger, seq, &original).await;
    assert!(verified(&ledger).await.is_ok());

    // Deleted: the chain's next line follows nothing (the lines of the other chains around
    // it still verify).
    schema
        .sql(
            &ledger,
            &format!("DELETE FROM {{s}}.mrg_events WHERE seq = {seq}"),
        )
        .await;
    let report = verified(&ledger).await;
    let (bad, problem) = report.first_bad.clone().expect("the deletion is caught");
    assert_eq!(bad, next as u64, "{report}");
    assert!(
        matches!(
            problem,
            ChainProblem::BrokenLink | ChainProblem::Deleted { .. }
        ),
        "{report}"
    );
    schema.drop(&ledger).await;
}

/// A line copied from one chain's position onto another's, re-sealed, forks the chain it
/// claims to follow: the second line that follows one line is caught.
pub(crate) async fn a_line_sealed_after_a_line_that_already_has_a_successor_is_a_fork() {
    let Some(schema) = TestSchema::new("fork") else {
        return;
    };
    let ledger = schema.replica().await;
    let id = new_execution(&ledger, 1, 0).await;
    ledger
        .append(event(id, 1, EventKind::Authorized))
        .await
        .unwrap();
    ledger
        .append(event(id, 2, first_dispatched(id)))
        .await
        .unwrap();
    let mut lines = schema.lines(&ledger).await;
    // A third line re-sealed after the first, as if the chain had forked there.
    let first = mcp_replay_guard::ledger::chain::parse_line(&lines[0]).unwrap();
    let third = mcp_replay_guard::ledger::chain::parse_line(&lines[2]).unwrap();
    let forged =
        mcp_replay_guard::ledger::chain::ChainedLine::seal(third.seq, first.hash, third.body);
    lines[2] = forged.to_json_line();
    schema.replace_chain(&ledger, &lines).await;
    let report = verified(&ledger).await;
    assert_eq!(
        report.first_bad,
        Some((third.seq, ChainProblem::BrokenLink)),
        "{report}"
    );
    schema.drop(&ledger).await;
}

/// The claim is atomic in its partition's row, not in a lock every claim waits for: with one
/// chain's head row locked from outside, a claim in that partition waits (in one replica),
/// while a claim in another partition goes through (in another replica).
pub(crate) async fn a_locked_chain_holds_up_a_claim_of_its_partition_not_one_of_another() {
    let Some(schema) = TestSchema::new("row_lock") else {
        return;
    };
    let ledger = schema.replica().await;
    let other = schema.replica().await;
    let mut by_chain: std::collections::HashMap<i64, u32> = std::collections::HashMap::new();
    for n in 0..64 {
        let id = new_execution(&ledger, n, 0).await;
        by_chain.insert(chain_of(&schema, &ledger, id).await, n);
    }
    assert!(by_chain.len() > 1, "{by_chain:?}");
    let (&locked, &held_up) = by_chain.iter().next().unwrap();
    let (_, &free) = by_chain.iter().find(|(c, _)| **c != locked).unwrap();

    let client = ledger.pool().get().await.unwrap();
    client
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM \"{}\".mrg_chains WHERE chain = {locked} FOR UPDATE",
            schema.name
        ))
        .await
        .unwrap();
    // A repeat of an intent still takes its chain's lock to decide.
    let waiting = {
        let other = other.clone();
        tokio::spawn(async move { other.claim(claim(held_up, 1)).await })
    };
    let free = tokio::time::timeout(Duration::from_secs(10), ledger.claim(claim(free, 1)))
        .await
        .expect("a claim in another partition does not wait");
    assert!(matches!(free.unwrap(), Claimed::Existing(_)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the claim did not wait for its chain"
    );
    client.batch_execute("COMMIT").await.unwrap();
    let claimed = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(claimed, Claimed::Existing(_)));
    drop(client);
    drop(other);
    schema.drop(&ledger).await;
}

/// A ledger made before partitions (one chain, `seq` 1.. from the genesis, no `mrg_chains`,
/// no `chain` column) opens, verifies with every line as it was, and goes on: its chain is
/// chain 0, new lines take `seq`s after it, and its executions are still found and claimed.
/// A write shaped as the builds from before partitions write (no `chain`) fails.
pub(crate) async fn a_ledger_made_before_partitions_opens_verifies_and_goes_on() {
    let Some(schema) = TestSchema::new("unpartitioned") else {
        return;
    };
    let ledger = schema.replica().await;
    // In flight: a repeat links to it.
    let open = new_execution(&ledger, 1, 1_000).await;
    ledger
        .append(event(open, 1_001, EventKind::Authorized))
        .await
        .unwrap();
    // Settled and delivered.
    let done = new_execution(&ledger, 2, 1_000).await;
    for (at, kind) in [
        (1_001, first_dispatched(done)),
        (
            1_002,
            EventKind::Completed {
                target_status: 200,
                is_error: false,
                result_reference: None,
            },
        ),
        (1_003, EventKind::Delivered { jsonrpc_id: None }),
    ] {
        ledger.append(event(done, at, kind)).await.unwrap();
    }
    // The same lines as one chain from the genesis, as a build from before partitions wrote
    // them (their `seq`s are 1..=6 already), and its tables.
    let mut prev = mcp_replay_guard::ledger::chain::ChainHash::GENESIS;
    let single: Vec<String> = schema
        .lines(&ledger)
        .await
        .iter()
        .map(|text| {
            let line = mcp_replay_guard::ledger::chain::parse_line(text).unwrap();
            let line =
                mcp_replay_guard::ledger::chain::ChainedLine::seal(line.seq, prev, line.body);
            prev = line.hash;
            line.to_json_line()
        })
        .collect();
    assert_eq!(single.len(), 6);
    schema.replace_chain(&ledger, &single).await;
    for statement in [
        "DROP TABLE {s}.mrg_chains",
        "DROP SEQUENCE {s}.mrg_events_seq",
        "ALTER TABLE {s}.mrg_executions DROP COLUMN chain",
    ] {
        schema.sql(&ledger, statement).await;
    }
    drop(ledger);

    let ledger = schema.replica().await;
    assert_eq!(schema.lines(&ledger).await, single, "no line was rewritten");
    let report = verified(&ledger).await;
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.head(), (6, prev).into());
    assert_eq!(
        schema
            .query_i64s(
                &ledger,
                "SELECT seq FROM {s}.mrg_chains WHERE chain = 0 AND hash = \
                 (SELECT hash FROM {s}.mrg_events WHERE seq = 6)"
            )
            .await,
        [6]
    );
    assert_eq!(
        schema
            .query_i64s(
                &ledger,
                "SELECT count(*) FROM {s}.mrg_executions WHERE chain = 0"
            )
            .await,
        [2]
    );
    // It goes on: the repeat links, the append lands, a new intent starts.
    assert!(matches!(
        ledger.claim(claim(1, 2_000)).await.unwrap(),
        Claimed::Existing(r) if r.execution_id() == open
    ));
    ledger
        .append(event(open, 2_001, first_dispatched(open)))
        .await
        .unwrap();
    let again = new_execution(&ledger, 2, 2_002).await;
    assert_ne!(again, done);
    let report = verified(&ledger).await;
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.verified, 8);
    assert_eq!(
        schema
            .query_i64s(&ledger, "SELECT min(seq) FROM {s}.mrg_events WHERE seq > 6")
            .await,
        [7]
    );
    let names = event_names(&ledger, open).await;
    assert_eq!(names, ["accepted", "authorized", "dispatched"]);

    // What a build from before partitions upserts: refused, nothing recorded.
    let client = ledger.pool().get().await.unwrap();
    let old_write = format!(
        "INSERT INTO \"{}\".mrg_executions (execution_id, actor, intent_scope, fingerprint, \
         tool, state, owner, accepted_seq, last_seq, link_until_ms, retain_until_ms, record) \
         VALUES ('act_x', 'a', 's', 'f', 't', 'accepted', 'o', 9, 9, 0, 0, '{{}}')",
        schema.name
    );
    let error = client.execute(old_write.as_str(), &[]).await.unwrap_err();
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::NOT_NULL_VIOLATION),
        "{error}"
    );
    drop(client);
    schema.drop(&ledger).await;
}

/// Cutting the tail of one chain leaves every chain linked: the chain's head row, which its
/// writers move in the same transaction as its lines, no longer matches its last line.
pub(crate) async fn a_chain_whose_last_line_was_cut_does_not_verify() {
    let Some(schema) = TestSchema::new("cut_chain") else {
        return;
    };
    let ledger = schema.replica().await;
    for n in 0..40 {
        new_execution(&ledger, n, 0).await;
    }
    assert!(verified(&ledger).await.is_ok());
    // The last line of a chain that is not the newest line of all.
    let [seq, chain] = schema
        .query_i64s(
            &ledger,
            "SELECT seq, chain::int8 FROM {s}.mrg_chains \
             WHERE seq > 0 AND seq < (SELECT max(seq) FROM {s}.mrg_events) \
             ORDER BY seq LIMIT 1",
        )
        .await[..]
    else {
        panic!("no chain to cut");
    };
    schema
        .sql(
            &ledger,
            &format!("DELETE FROM {{s}}.mrg_events WHERE seq = {seq}"),
        )
        .await;
    let report = verified(&ledger).await;
    assert!(
        matches!(
            report.first_bad,
            Some((bad, ChainProblem::AnchorNotFound { .. })) if bad == seq as u64
        ),
        "chain {chain}: {report}"
    );
    schema.drop(&ledger).await;
}

pub(crate) async fn a_claim_with_its_dispatch_is_one_write_and_one_winner_across_replicas() {
    let Some(schema) = TestSchema::new("claim_dispatched") else {
        return;
    };
    let replicas = [schema.replica().await, schema.replica().await];
    const CALLERS: usize = 40;
    let start = Arc::new(tokio::sync::Barrier::new(CALLERS));
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let ledger = replicas[i % 2].clone();
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let mut dispatch = mcp_replay_guard::execution::Dispatch::default();
                dispatch.jsonrpc_id = Some(7.into());
                let owner = format!("guard:{}", i % 2);
                let mut claim = claim(0, 1_000);
                claim.owner = owner;
                ledger.claim_dispatched(claim, dispatch).await.unwrap()
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut ids = HashSet::new();
    for task in tasks {
        let claimed = task.await.unwrap();
        ids.insert(claimed.record().execution_id());
        if let Claimed::New(record) = claimed {
            winners.push(record);
        }
    }
    assert_eq!(
        (winners.len(), ids.len()),
        (1, 1),
        "one winner, one execution"
    );
    let record = &winners[0];
    // The winner's record is already dispatched, by the claim's owner, under its own key.
    assert_eq!(record.state(), ExecutionState::Dispatched);
    assert_eq!(record.attempts(), 1);
    assert_eq!(
        record
            .idempotency_key()
            .as_ref()
            .map(|k| k.as_str().to_owned()),
        Some(record.execution_id().to_string())
    );
    // Its two events, and nothing else: the 39 that linked wrote nothing.
    let names = event_names(&replicas[1], record.execution_id()).await;
    assert_eq!(names, ["accepted", "dispatched"]);
    assert_eq!(
        schema
            .query_i64s(
                &replicas[0],
                "SELECT count(*), max(seq) - min(seq) FROM {s}.mrg_events"
            )
            .await,
        [2, 1]
    );
    let report = verified(&replicas[0]).await;
    assert!(report.is_ok(), "{report}");
    schema.drop(&replicas[0]).await;
}
