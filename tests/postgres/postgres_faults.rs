//! The guard over a PostgreSQL ledger whose connection dies at a chosen COMMIT: the
//! connection passes through a relay the test cuts ([`PgRelay`]), either before the COMMIT
//! reaches the server (nothing recorded) or once the server answered it (recorded, the answer
//! lost). The ground truth is the test server's side-effect counter.
//!
//! The server comes from `MCP_REPLAY_GUARD_POSTGRES_URL`, as for every test of
//! `tests/postgres.rs`: unset, they are reported as ignored, except under CI (`CI` set), where
//! they fail.

use crate::support;

use std::{collections::HashMap, time::Duration};

use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    ledger::{Ledger, PostgresLedger},
};
use serde_json::{Value, json};
use support::*;
use tower::Layer;

/// A guard over `ledger`, as every replica of one agent is configured (same actor, scope and
/// key: one intent is one intent on every replica).
fn guard(ledger: PostgresLedger) -> GuardLayer {
    let registry = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .tool("slow_deploy", ToolContract::irreversible())
        .tool("create_payment", ToolContract::idempotent())
        .build()
        .unwrap();
    GuardLayer::new(
        ledger,
        registry,
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    )
    .actor(Actor::from("signed-process:com.example.agent"))
    .intent_scope(IntentScope::from("run:pg-faults"))
}

/// A replica of `schema` through a relay the test cuts, and a test server with a session:
/// (relay, ledger, server, session).
async fn relayed(schema: &TestSchema) -> (PgRelay, PostgresLedger, TestServer, Option<String>) {
    let relay = PgRelay::start(&schema.url).await;
    let ledger = schema.replica_through(&relay).await;
    let server = TestServer::start().await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    (relay, ledger, server, session)
}

/// The tool's own answer: its `structuredContent`, never a guard answer.
fn tool_answer(response: &Value) -> &Value {
    let structured = response
        .pointer("/result/structuredContent")
        .unwrap_or_else(|| panic!("no result: {response}"));
    assert!(
        structured.get("mcp_replay_guard").is_none(),
        "a guard answer, not the tool's: {response}"
    );
    structured
}

/// How many times the tool body ran for each `version` argument.
fn runs_by_version(server: &TestServer, tool: &str) -> HashMap<String, usize> {
    let mut runs = HashMap::new();
    for run in server.state.tool_runs(tool) {
        let version = run.arguments["version"].as_str().unwrap_or("").to_owned();
        *runs.entry(version).or_default() += 1;
    }
    runs
}

/// A claim whose COMMIT the server made but whose answer was lost: the guard knows it sent
/// nothing. It used to fail the call, and the caller's repeat found the execution dispatched by
/// a live owner that sent nothing, read it as an unknown outcome and held it for review (one
/// lost answer of a batch held every call of the batch, none ran). Now each call runs once.
pub(crate) async fn a_lost_commit_answer_on_batched_claims_runs_each_call_once() {
    let Some(schema) = TestSchema::new("claim_answer") else {
        return;
    };
    let (relay, ledger, server, session) = relayed(&schema).await;
    let layer = guard(ledger.clone());
    let calls = 8;

    relay.arm(Cut::CommitAnswerLost, 0);
    let mut running = Vec::new();
    for n in 0..calls {
        let mut client = layer.layer(hyper_client_with_body::<GuardRequestBody>());
        let (url, session) = (server.url.clone(), session.clone());
        running.push(tokio::spawn(async move {
            let args = json!({"service": "catalog", "version": format!("v{n}")});
            let first = call_tool(
                &mut client,
                &url,
                session.as_deref(),
                n,
                "deploy_release",
                args.clone(),
            )
            .await;
            match first {
                Ok(answer) => answer,
                // A caller that got an error asks again, as any caller would.
                Err(_) => call_tool(
                    &mut client,
                    &url,
                    session.as_deref(),
                    100 + n,
                    "deploy_release",
                    args,
                )
                .await
                .unwrap(),
            }
        }));
    }
    let mut answers = Vec::new();
    for call in running {
        answers.push(call.await.unwrap());
    }

    assert_eq!(relay.fired(), 1, "one COMMIT answer was lost");
    for answer in &answers {
        tool_answer(answer);
    }
    let runs = runs_by_version(&server, "deploy_release");
    for n in 0..calls {
        assert_eq!(runs.get(&format!("v{n}")), Some(&1), "runs: {runs:?}");
    }
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), calls as usize, "{records:#?}");
    for record in &records {
        assert_eq!(record.state(), ExecutionState::Completed, "{record:#?}");
        assert_eq!(record.attempts(), 1, "{record:#?}");
    }
    let report = ledger.verify().await.unwrap();
    assert!(report.is_ok(), "{report}");
    schema.drop(&ledger).await;
}

/// Calls `deploy_release` once with the `completed`'s COMMIT meeting `cut`: the caller gets the
/// tool's answer, the ledger ends with one completed execution (its result kept, one
/// `completed` event), and the tool ran once.
async fn the_completed_is_recorded_once_after(cut: Cut) {
    let schema = TestSchema::new("outcome").expect("checked by the caller");
    let (relay, ledger, server, session) = relayed(&schema).await;
    let mut client = guard(ledger.clone()).layer(hyper_client_with_body::<GuardRequestBody>());
    // The claim's COMMIT goes through; the `completed`'s is cut.
    relay.arm(cut, 1);
    let answer = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "deploy_release",
        json!({"service": "catalog", "version": "v1"}),
    )
    .await
    .unwrap();
    assert_eq!(relay.fired(), 1);
    assert_eq!(tool_answer(&answer)["deployment"], 1);

    let record = only_record(&ledger).await;
    assert_eq!(record.state(), ExecutionState::Completed, "{record:#?}");
    assert!(record.result_reference().is_some(), "{record:#?}");
    let names = event_names(&ledger, record.execution_id()).await;
    assert_eq!(
        names.iter().filter(|n| **n == "completed").count(),
        1,
        "{names:?}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let report = ledger.verify().await.unwrap();
    assert!(report.is_ok(), "{report}");
    schema.drop(&ledger).await;
}

/// The `completed` of an answered call whose COMMIT never reached the server: the caller got
/// its result and the ledger kept `dispatched`, so a later repeat was told the response was
/// lost and held for review. The outcome write is retried (same attempt) until it is recorded.
pub(crate) async fn a_completed_whose_commit_was_cut_is_written_again_before_the_caller_reads_on() {
    if postgres_url().is_none() {
        return;
    }
    the_completed_is_recorded_once_after(Cut::BeforeCommit).await;
}

/// The `completed` of an answered call whose COMMIT the server made but whose answer was lost:
/// the retried write finds it recorded, takes it as recorded (one `completed`, the result
/// kept) and hands the caller its result.
pub(crate) async fn a_completed_whose_commit_answer_was_lost_is_recorded_once() {
    if postgres_url().is_none() {
        return;
    }
    the_completed_is_recorded_once_after(Cut::CommitAnswerLost).await;
}

/// Two replicas, one intent: the second replica's claim loses its COMMIT answer while the
/// first replica's call runs. It used to fail that call (nothing sent); its caller asked again
/// once the first caller had read its answer, which by the link rule is a new intent, and the
/// tool ran twice. The guard now retries the claim under the call's own ask time and attaches
/// to the first replica's execution.
pub(crate) async fn a_claim_that_loses_its_commit_answer_still_attaches_to_the_other_replicas_call()
{
    let Some(schema) = TestSchema::new("attach") else {
        return;
    };
    let first_ledger = schema.replica().await;
    let relay = PgRelay::start(&schema.url).await;
    let second_ledger = schema.replica_through(&relay).await;
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(2),
        ..ServerOptions::default()
    })
    .await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let mut first = guard(first_ledger.clone()).layer(hyper_client_with_body::<GuardRequestBody>());
    let mut second =
        guard(second_ledger.clone()).layer(hyper_client_with_body::<GuardRequestBody>());
    let args = json!({"service": "catalog"});

    let (url, first_session, first_args) = (server.url.clone(), session.clone(), args.clone());
    let first_call = tokio::spawn(async move {
        let body = tool_call_body(1, "slow_deploy", first_args);
        let request = post(&url, first_session.as_deref(), PROTOCOL_VERSION, body);
        // Read to its end: the answer is delivered.
        read_response_to_end(send(&mut first, request).await.unwrap()).await
    });
    assert_eq!(
        server
            .state
            .wait_for_started("slow_deploy", 1, Duration::from_secs(10))
            .await,
        1
    );
    relay.arm(Cut::CommitAnswerLost, 0);
    let second_answer = call_tool(
        &mut second,
        &server.url,
        session.as_deref(),
        2,
        "slow_deploy",
        args.clone(),
    )
    .await;
    let first_answer = first_call.await.unwrap();
    assert_eq!(
        relay.fired(),
        1,
        "the second replica's claim lost its answer"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while first_ledger.list().await.unwrap()[0]
        .delivered_at()
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first answer was never recorded delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second_answer = match second_answer {
        Ok(answer) => answer,
        // Its caller asks again, after the first caller read its answer.
        Err(_) => call_tool(
            &mut second,
            &server.url,
            session.as_deref(),
            3,
            "slow_deploy",
            args,
        )
        .await
        .unwrap(),
    };

    assert_eq!(server.state.side_effects("slow_deploy"), 1);
    assert_eq!(tool_answer(&second_answer), tool_answer(&first_answer));
    let records = first_ledger.list().await.unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    schema.drop(&first_ledger).await;
}

/// A claim that lost its COMMIT answer while the ledger then stayed out of reach past the
/// call's deadline: the caller is told the ledger failed, and nothing was sent. Its attempt,
/// recorded by that COMMIT, used to read as dispatched by a live owner that never answered:
/// the caller's repeat was held for review and never ran. Once the ledger answers again, the
/// attempt is recorded `not_sent`, and the repeat runs the call once.
pub(crate) async fn a_claim_given_up_after_its_answer_was_lost_is_not_sent_and_its_repeat_runs_once()
 {
    let Some(schema) = TestSchema::new("not_sent") else {
        return;
    };
    let (relay, ledger, server, session) = relayed(&schema).await;
    let mut client = guard(ledger.clone())
        .attach_timeout(Duration::from_secs(1))
        .layer(hyper_client_with_body::<GuardRequestBody>());
    let args = json!({"service": "catalog", "version": "v1"});

    relay.arm_with_outage(Cut::CommitAnswerLost, 0);
    let first = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        1,
        "deploy_release",
        args.clone(),
    )
    .await;
    assert!(first.is_err(), "the ledger was out of reach: {first:?}");
    assert_eq!(relay.fired(), 1);
    assert_eq!(server.state.side_effects("deploy_release"), 0);

    relay.restore();
    let again = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "deploy_release",
        args,
    )
    .await
    .unwrap();
    assert_eq!(tool_answer(&again)["deployment"], 1);
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let record = only_record(&ledger).await;
    assert_eq!(
        (record.state(), record.attempts()),
        (ExecutionState::Completed, 2),
        "{record:#?}"
    );
    let names = event_names(&ledger, record.execution_id()).await;
    // (`delivered` follows once the caller's read of the body is seen to its end.)
    assert_eq!(
        names[..5],
        [
            "accepted",
            "dispatched",
            "not_sent",
            "dispatched",
            "completed"
        ],
        "{names:?}"
    );
    let report = ledger.verify().await.unwrap();
    assert!(report.is_ok(), "{report}");
    schema.drop(&ledger).await;
}

/// The `dispatched` of a re-send (an idempotent call whose first answer was lost) whose
/// COMMIT answer was lost: the guard had recorded the attempt and not sent it. The call failed
/// and the attempt read as one whose outcome is unknown. The next try finds its own attempt
/// recorded and sends it.
pub(crate) async fn a_resend_whose_dispatch_lost_its_commit_answer_is_sent_by_the_same_call() {
    let Some(schema) = TestSchema::new("resend") else {
        return;
    };
    let (relay, ledger, server, session) = relayed(&schema).await;
    let mut client = guard(ledger.clone()).layer(hyper_client_with_body::<GuardRequestBody>());
    let args = json!({"amount": 1250, "currency": "EUR"});

    server.state.lose_next_response("create_payment");
    let lost = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        1,
        "create_payment",
        args.clone(),
    )
    .await;
    assert!(lost.is_err(), "{lost:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let records = ledger.list().await.unwrap();
        if records
            .first()
            .is_some_and(|r| r.state() == ExecutionState::Unknown)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{records:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The repeat's claim goes through; its re-send's `dispatched` loses its answer.
    relay.arm(Cut::CommitAnswerLost, 1);
    let again = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "create_payment",
        args,
    )
    .await
    .unwrap();
    assert_eq!(relay.fired(), 1);
    tool_answer(&again);
    assert_eq!(server.state.side_effects("create_payment"), 2);
    let record = only_record(&ledger).await;
    assert_eq!(
        (record.state(), record.attempts()),
        (ExecutionState::Completed, 2),
        "{record:#?}"
    );
    let report = ledger.verify().await.unwrap();
    assert!(report.is_ok(), "{report}");
    schema.drop(&ledger).await;
}
