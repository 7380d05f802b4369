//! Every message the crate writes itself, produced for real (the guard over a hyper client,
//! the server half in front of rmcp's server, both against the test server of tests/support)
//! and validated against the official MCP schema of its era (tests/schemas/mcp): each message
//! against `JSONRPCMessage`, each tools/call result against `CallToolResult`, with
//! `resultType` exactly in 2026-07-28.
//!
//! The kinds, exhaustively (every answer body built in `guard/answer.rs`, `guard/service.rs`
//! and `integrations/server/service.rs`):
//!
//! - guard, results: held for review, in progress, result not kept, denied (first and
//!   repeated), task failed (synthesized from `tasks/get`), kept result re-keyed (same era and
//!   the other era), and the answer after a caller's last attempt (`Guard::unanswered`, the
//!   proxy's: cli/tests/proxy/cli_proxy_answers.rs runs it through the built proxy);
//! - guard, JSON-RPC errors: 413 (body past the limit, no id known), -32600 (a POST it cannot
//!   read, a batch carrying tools/call, a malformed caller Idempotency-Key), -32601 (no
//!   contract in strict mode), -32602 (an integer past 64 bits), -32020 (a 2026-07-28 header
//!   that disagrees with the body), -32022 (a tools/call in a revision it does not speak);
//! - server half: replay (JSON, SSE, the other era), 422 key reused, 409 in flight, 409
//!   outcome unknown, 503 not recorded, 400 malformed key, 400 unreadable call, 400 batch, 413,
//!   422 integer past 64 bits. Its 503 "shutting down" (a keyed call's task cancelled by a
//!   runtime shutdown) is the same `jsonrpc_error` with the call's id as the 503 tested here;
//!   it cannot be produced without shutting down the runtime the test runs on.
//! - the proxy's 502 (nothing sent): cli/tests/proxy/cli_proxy_answers.rs.

use crate::support;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use mcp_replay_guard::{
    ExecutionId, Target,
    contract::{ContractRegistry, ToolContract},
    execution::{
        Claim, Claimed, EventKind, ExecutionRecord, ExecutionState, LedgerEvent, Timestamp,
    },
    fingerprint::FingerprintKey,
    guard::{Authorization, AuthorizationRequest, Authorize, GuardLayer, GuardRequestBody},
    integrations::server::IdempotencyLayer,
    ledger::{Ledger, LedgerError, MemoryLedger},
    protocol::{Era as WireEra, RequestId},
};
use serde_json::{Value, json};
use support::*;
use tower::{Layer, Service, ServiceExt};

fn key() -> FingerprintKey {
    FingerprintKey::from_bytes(&[9; 32]).unwrap()
}

fn contracts(strict: bool) -> ContractRegistry {
    ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .tool("slow_deploy", ToolContract::irreversible())
        .tool(
            "create_payment",
            ToolContract::idempotent().keep_results(false),
        )
        .strict(strict)
        .build()
        .unwrap()
}

/// One guard layer per case: the target is fixed, so a call is one intent whichever server
/// (era) it goes to.
fn layer(ledger: &MemoryLedger) -> GuardLayer {
    GuardLayer::new(ledger.clone(), contracts(false), key()).target(Target::new("schema-test"))
}

type Client = mcp_replay_guard::guard::Guard<
    hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        GuardRequestBody,
    >,
>;

fn guarded(layer: &GuardLayer) -> Client {
    layer.layer(hyper_client_with_body::<GuardRequestBody>())
}

async fn server(era: Era) -> TestServer {
    match era {
        Era::Sessions => TestServer::start().await,
        Era::Stateless => TestServer::start_with(ServerOptions::stateless()).await,
    }
}

/// The whole body as one JSON value: the message itself, or the data of its one SSE event.
async fn message<B>(response: Response<B>) -> (StatusCode, Value)
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let status = response.status();
    let text = body_text(response.into_body()).await.unwrap();
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .chain(std::iter::once(text.trim()))
        .find_map(|s| serde_json::from_str::<Value>(s).ok())
        .unwrap_or_else(|| panic!("no JSON in {text}"));
    (status, json)
}

async fn call(client: &mut Client, request: Request<Full<Bytes>>) -> (StatusCode, Value) {
    message(send(client, request).await.expect("an answer")).await
}

fn deploy(version: &str) -> Value {
    json!({"service": "catalog", "version": version})
}

fn state(message: &Value) -> &Value {
    &message["result"]["structuredContent"]["mcp_replay_guard"]["state"]
}

#[derive(Debug)]
struct DenyAll;

#[async_trait]
impl Authorize for DenyAll {
    async fn authorize(&self, _: AuthorizationRequest<'_>) -> Authorization {
        Authorization::Deny {
            reason: "deploys are frozen".into(),
        }
    }
}

/// A call whose answer the caller dropped unread: completed, not delivered.
async fn completed_undelivered(
    client: &mut Client,
    ledger: &MemoryLedger,
    request: Request<Full<Bytes>>,
) {
    drop(send(client, request).await.unwrap());
    wait_for_state(ledger, ExecutionState::Completed).await;
}

#[tokio::test]
async fn the_guards_own_results_are_valid_mcp_in_both_eras() {
    for era in Era::ALL {
        let server = server(era).await;
        let session = era.open_session(&server.url).await;
        let session = session.as_deref();
        let url = &server.url;

        // Held for review: the response of an irreversible call is lost, the repeat is answered.
        let ledger = MemoryLedger::new();
        let mut client = guarded(&layer(&ledger));
        server.state.lose_next_response("deploy_release");
        let lost = send(
            &mut client,
            era.tool_call(url, session, 1, "deploy_release", deploy("1")),
        );
        assert!(lost.await.is_err());
        let (_, answer) = call(
            &mut client,
            era.tool_call(url, session, 2, "deploy_release", deploy("1")),
        )
        .await;
        assert_valid_tool_answer(era, "needs review", &answer, &json!(2));
        assert_eq!(state(&answer), "needs_review", "{answer}");

        // In progress: a repeat while the first still runs, past the attach wait.
        let ledger = MemoryLedger::new();
        let mut client = guarded(&layer(&ledger).attach_timeout(Duration::from_millis(20)));
        let first = tokio::spawn(client.clone().oneshot(era.tool_call(
            url,
            session,
            3,
            "slow_deploy",
            json!({"service": "a"}),
        )));
        server
            .state
            .wait_for_started("slow_deploy", 1, Duration::from_secs(5))
            .await;
        let (_, answer) = call(
            &mut client,
            era.tool_call(url, session, 4, "slow_deploy", json!({"service": "a"})),
        )
        .await;
        assert_valid_tool_answer(era, "in progress", &answer, &json!(4));
        assert!(
            first_text(&answer).unwrap().contains("in progress"),
            "{answer}"
        );
        drop(first.await);

        // Result not kept (its contract keeps none), then a kept result re-keyed.
        let ledger = MemoryLedger::new();
        let mut client = guarded(&layer(&ledger));
        let payment = json!({"amount": 5, "currency": "eur"});
        let request = era.tool_call(url, session, 5, "create_payment", payment.clone());
        completed_undelivered(&mut client, &ledger, request).await;
        let (_, answer) = call(
            &mut client,
            era.tool_call(url, session, 6, "create_payment", payment),
        )
        .await;
        assert_valid_tool_answer(era, "result not kept", &answer, &json!(6));
        assert!(
            first_text(&answer).unwrap().contains("not kept"),
            "{answer}"
        );

        let ledger = MemoryLedger::new();
        let mut client = guarded(&layer(&ledger));
        let request = era.tool_call(url, session, 7, "deploy_release", deploy("2"));
        completed_undelivered(&mut client, &ledger, request).await;
        let (_, answer) = call(
            &mut client,
            era.tool_call(url, session, 8, "deploy_release", deploy("2")),
        )
        .await;
        assert_valid_tool_answer(era, "kept result", &answer, &json!(8));
        assert_eq!(first_text(&answer), Some("deployed catalog 2"), "{answer}");

        // Denied, then the same denial repeated.
        let ledger = MemoryLedger::new();
        let mut client = guarded(&layer(&ledger).authorizer(DenyAll));
        for (id, kind) in [(9, "denied"), (10, "repeated denial")] {
            let (_, answer) = call(
                &mut client,
                era.tool_call(url, session, id, "deploy_release", deploy("3")),
            )
            .await;
            assert_valid_tool_answer(era, kind, &answer, &json!(id));
            assert_eq!(state(&answer), "denied", "{answer}");
        }
        assert_eq!(
            server.state.side_effects("deploy_release"),
            2,
            "{}",
            era.label()
        );
    }
}

#[tokio::test]
async fn a_task_that_failed_is_answered_in_the_callers_era() {
    for era in Era::ALL {
        let (url, seen) = task_server("failed").await;
        let ledger = MemoryLedger::new();
        let mut client = guarded(&layer(&ledger));
        let request = |id| era.tool_call(&url, None, id, "deploy_release", deploy("4"));
        assert!(send(&mut client, request(1)).await.is_err());
        let record = wait_for_state(&ledger, ExecutionState::Unknown).await;
        ledger
            .append(LedgerEvent {
                execution_id: record.execution_id(),
                at: Timestamp::now(),
                kind: EventKind::TaskCreated {
                    task_id: "t-1".into(),
                },
            })
            .await
            .unwrap();

        let (_, answer) = call(&mut client, request(2)).await;

        assert_valid_tool_answer(era, "task failed", &answer, &json!(2));
        assert_eq!(answer["result"]["isError"], true, "{answer}");
        assert_eq!(*seen.lock().unwrap(), ["tools/call", "tasks/get"]);
    }
}

#[tokio::test]
async fn a_kept_result_is_handed_back_in_the_era_of_the_repeat() {
    for (kept_in, asked_in) in [
        (Era::Sessions, Era::Stateless),
        (Era::Stateless, Era::Sessions),
    ] {
        let server = server(kept_in).await;
        let session = kept_in.open_session(&server.url).await;
        let ledger = MemoryLedger::new();
        let mut client = guarded(&layer(&ledger));
        let request = kept_in.tool_call(
            &server.url,
            session.as_deref(),
            1,
            "deploy_release",
            deploy("5"),
        );
        completed_undelivered(&mut client, &ledger, request).await;

        let (_, answer) = call(
            &mut client,
            asked_in.tool_call(
                &server.url,
                session.as_deref(),
                2,
                "deploy_release",
                deploy("5"),
            ),
        )
        .await;

        assert_valid_tool_answer(
            asked_in,
            "kept result from the other era",
            &answer,
            &json!(2),
        );
        assert_eq!(first_text(&answer), Some("deployed catalog 5"), "{answer}");
        assert_eq!(server.state.side_effects("deploy_release"), 1);
    }
}

/// A request, the kind it is, and the status, JSON-RPC code and id its error answer has.
type ExpectedError = (
    &'static str,
    Request<Full<Bytes>>,
    StatusCode,
    i64,
    Option<Value>,
);

/// A raw POST with the era's headers.
fn raw_post(
    era: Era,
    url: &str,
    session: Option<&str>,
    version: &str,
    body: &str,
) -> Request<Full<Bytes>> {
    let mut request = era.tool_call(url, session, 0, "deploy_release", json!({}));
    *request.body_mut() = Full::new(Bytes::from(body.to_owned()));
    request.headers_mut().insert(
        "mcp-protocol-version",
        HeaderValue::from_str(version).unwrap(),
    );
    request
}

fn version(era: Era) -> &'static str {
    match era {
        Era::Sessions => PROTOCOL_VERSION,
        Era::Stateless => STATELESS_PROTOCOL_VERSION,
    }
}

/// A tools/call body with `params.name` twice: unreadable as one call, its id still known.
fn duplicate_name_body(id: i64) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"deploy_release","name":"x","arguments":{{}},"_meta":{}}}}}"#,
        stateless_meta()
    )
}

fn batch_body() -> String {
    json!([
        tool_call_body(1, "deploy_release", deploy("6")),
        tool_call_body(2, "deploy_release", deploy("7"))
    ])
    .to_string()
}

#[tokio::test]
async fn the_guards_jsonrpc_errors_are_valid_mcp_and_carry_the_id_when_known() {
    for era in Era::ALL {
        let server = server(era).await;
        let session = era.open_session(&server.url).await;
        let session = session.as_deref();
        let url = &server.url;
        let ledger = MemoryLedger::new();
        let mut client = guarded(&layer(&ledger).max_body_bytes(512));
        let mut errors: Vec<ExpectedError> = vec![
            (
                "body past the limit",
                era.tool_call(url, session, 1, "deploy_release", deploy(&"9".repeat(600))),
                StatusCode::PAYLOAD_TOO_LARGE,
                -32600,
                None,
            ),
            (
                "unreadable tools/call",
                raw_post(era, url, session, version(era), &duplicate_name_body(2)),
                StatusCode::BAD_REQUEST,
                -32600,
                Some(json!(2)),
            ),
            (
                "integer past 64 bits",
                {
                    let mut r = era.tool_call(url, session, 3, "deploy_release", json!({}));
                    let body = era_body(
                        era,
                        3,
                        r#"{"service":"a","version":123456789012345678901234567890}"#,
                    );
                    *r.body_mut() = Full::new(Bytes::from(body));
                    r
                },
                StatusCode::OK,
                -32602,
                Some(json!(3)),
            ),
            (
                "malformed caller Idempotency-Key",
                with_idempotency_key(
                    era.tool_call(url, session, 4, "deploy_release", deploy("8")),
                    "\"unterminated",
                ),
                StatusCode::BAD_REQUEST,
                -32600,
                Some(json!(4)),
            ),
        ];
        match era {
            // Batches exist only in 2025-03-26; a batch carrying tools/call is never guarded.
            Era::Sessions => errors.push((
                "batch carrying tools/call",
                raw_post(era, url, session, "2025-03-26", &batch_body()),
                StatusCode::BAD_REQUEST,
                -32600,
                None,
            )),
            // In 2026-07-28 a batch is not a request at all; a header that disagrees with the
            // body and a revision the guard does not speak get the era's own codes.
            Era::Stateless => errors.extend([
                (
                    "batch in an era without batches",
                    raw_post(era, url, session, version(era), &batch_body()),
                    StatusCode::BAD_REQUEST,
                    -32600,
                    None,
                ),
                (
                    "Mcp-Name disagreeing with the body",
                    {
                        let mut r = era.tool_call(url, session, 6, "deploy_release", deploy("5"));
                        r.headers_mut()
                            .insert("mcp-name", HeaderValue::from_static("other_tool"));
                        r
                    },
                    StatusCode::BAD_REQUEST,
                    -32020,
                    Some(json!(6)),
                ),
                (
                    "tools/call in an unsupported revision",
                    raw_post(era, url, session, "2099-01-01", &era_body(era, 7, "{}")),
                    StatusCode::BAD_REQUEST,
                    -32022,
                    Some(json!(7)),
                ),
            ]),
        }
        for (kind, request, status, code, id) in errors {
            let (got, answer) = call(&mut client, request).await;
            assert_eq!(got, status, "{kind}: {answer}");
            assert_valid_message(era, kind, &answer, id.as_ref());
            assert_eq!(answer["error"]["code"], code, "{kind}: {answer}");
            if id.is_none() {
                assert!(
                    answer.get("id").is_none(),
                    "{kind}: no id is known: {answer}"
                );
            }
        }

        // No contract in strict mode: -32601.
        let strict = GuardLayer::new(ledger.clone(), contracts(true), key());
        let (_, answer) = call(
            &mut guarded(&strict),
            era.tool_call(url, session, 5, "no_such_tool", json!({})),
        )
        .await;
        assert_valid_message(era, "no contract", &answer, Some(&json!(5)));
        assert_eq!(answer["error"]["code"], -32601, "{answer}");
        assert_eq!(server.state.total_side_effects(), 0);
    }
}

/// The body of a tools/call with raw `arguments` JSON, as the era writes it.
fn era_body(era: Era, id: i64, arguments: &str) -> String {
    let meta = match era {
        Era::Sessions => String::new(),
        Era::Stateless => format!(r#","_meta":{}"#, stateless_meta()),
    };
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"deploy_release","arguments":{arguments}{meta}}}}}"#
    )
}

/// The answer the proxy gives after its last attempt, built by the guard from its ledger.
#[tokio::test]
async fn the_answer_after_a_callers_last_attempt_is_valid_mcp_in_both_eras() {
    for (era, wire) in [
        (Era::Sessions, WireEra::Sessions),
        (Era::Stateless, WireEra::Stateless),
    ] {
        let server = server(era).await;
        let session = era.open_session(&server.url).await;
        let ledger = MemoryLedger::new();
        let guard = guarded(&layer(&ledger));
        server.state.lose_next_response("create_payment");
        let payment = json!({"amount": 7, "currency": "eur"});
        let request = era.tool_call(
            &server.url,
            session.as_deref(),
            1,
            "create_payment",
            payment,
        );
        let error = guard.clone().oneshot(request).await.unwrap_err();
        assert!(error.is_unknown(), "{error}");
        let execution = error.execution_id().unwrap();
        wait_for_state(&ledger, ExecutionState::Unknown).await;

        let answer = guard
            .unanswered(execution, &RequestId::from(1), wire)
            .await
            .unwrap()
            .expect("the execution is in the ledger");

        let (_, answer) = message(answer.map(Full::new)).await;
        assert_valid_tool_answer(era, "after the last attempt", &answer, &json!(1));
        assert_eq!(answer["result"]["isError"], true);
        let text = first_text(&answer).unwrap();
        assert!(text.contains(&execution.to_string()), "{text}");
        assert_eq!(server.state.side_effects("create_payment"), 1);
    }
}

async fn keyed(request: Request<Full<Bytes>>) -> (StatusCode, Value) {
    message(send(&mut hyper_client(), request).await.unwrap()).await
}

#[tokio::test]
async fn the_server_halfs_answers_are_valid_mcp_in_both_eras() {
    for era in Era::ALL {
        let options = match era {
            Era::Sessions => ServerOptions::default(),
            Era::Stateless => ServerOptions::stateless(),
        };
        let layer = IdempotencyLayer::new(MemoryLedger::new(), key()).max_body_bytes(1024);
        let server = TestServer::start_with(ServerOptions {
            idempotency: Some(layer),
            ..options
        })
        .await;
        let session = era.open_session(&server.url).await;
        let session = session.as_deref();
        let url = &server.url;
        let keyed_call = |id, tool: &str, args: Value, key: &str| {
            with_idempotency_key(era.tool_call(url, session, id, tool, args), key)
        };

        let (_, first) = keyed(keyed_call(1, "deploy_release", deploy("1"), "k-1")).await;
        assert!(first.get("result").is_some(), "{first}");
        let (status, replay) = keyed(keyed_call(2, "deploy_release", deploy("1"), "k-1")).await;
        assert_eq!(status, StatusCode::OK);
        assert_valid_tool_answer(era, "replay", &replay, &json!(2));

        let mut sse_only = keyed_call(3, "deploy_release", deploy("1"), "k-1");
        sse_only
            .headers_mut()
            .insert("accept", HeaderValue::from_static("text/event-stream"));
        let (_, replay) = keyed(sse_only).await;
        assert_valid_tool_answer(era, "replay as SSE", &replay, &json!(3));

        let other = match era {
            Era::Sessions => Era::Stateless,
            Era::Stateless => Era::Sessions,
        };
        let in_other_era = with_idempotency_key(
            other.tool_call(url, session, 4, "deploy_release", deploy("1")),
            "k-1",
        );
        let (_, replay) = keyed(in_other_era).await;
        assert_valid_tool_answer(other, "replay in the other era", &replay, &json!(4));
        assert_eq!(server.state.side_effects("deploy_release"), 1);

        let slow = tokio::spawn(hyper_client().request(keyed_call(
            5,
            "slow_deploy",
            json!({"service": "b"}),
            "k-2",
        )));
        server
            .state
            .wait_for_started("slow_deploy", 1, Duration::from_secs(5))
            .await;
        let mut errors = vec![
            (
                "key reused",
                keyed_call(6, "deploy_release", deploy("2"), "k-1"),
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(json!(6)),
            ),
            (
                "key in flight",
                keyed_call(7, "slow_deploy", json!({"service": "b"}), "k-2"),
                StatusCode::CONFLICT,
                Some(json!(7)),
            ),
            (
                "malformed key",
                keyed_call(8, "deploy_release", deploy("3"), "\"unterminated"),
                StatusCode::BAD_REQUEST,
                Some(json!(8)),
            ),
            (
                "unreadable call",
                with_idempotency_key(
                    raw_post(era, url, session, version(era), &duplicate_name_body(9)),
                    "k-3",
                ),
                StatusCode::BAD_REQUEST,
                Some(json!(9)),
            ),
            (
                "body past the limit",
                keyed_call(10, "deploy_release", deploy(&"9".repeat(2000)), "k-4"),
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
            ),
            (
                "integer past 64 bits",
                {
                    let mut r = keyed_call(11, "deploy_release", json!({}), "k-5");
                    *r.body_mut() = Full::new(Bytes::from(era_body(
                        era,
                        11,
                        r#"{"service":"a","version":123456789012345678901234567890}"#,
                    )));
                    r
                },
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(json!(11)),
            ),
        ];
        if era == Era::Sessions {
            errors.push((
                "batch carrying tools/call",
                with_idempotency_key(
                    raw_post(era, url, session, "2025-03-26", &batch_body()),
                    "k-6",
                ),
                StatusCode::BAD_REQUEST,
                None,
            ));
        }
        for (kind, request, status, id) in errors {
            let (got, answer) = keyed(request).await;
            assert_eq!(got, status, "{kind}: {answer}");
            assert_valid_message(era, kind, &answer, id.as_ref());
            assert!(answer.get("error").is_some(), "{kind}: {answer}");
            if id.is_none() {
                assert!(
                    answer.get("id").is_none(),
                    "{kind}: no id is known: {answer}"
                );
            }
        }
        drop(slow.await);
        let ran = server
            .state
            .wait_for_side_effects("slow_deploy", 1, Duration::from_secs(5))
            .await;
        assert_eq!(ran, 1);
    }
}

/// A ledger whose storage fails on every write: the fault of a full or broken disk.
#[derive(Debug, Default)]
struct BrokenLedger(MemoryLedger);

#[async_trait]
impl Ledger for BrokenLedger {
    async fn claim(&self, _: Claim) -> Result<Claimed, LedgerError> {
        Err(LedgerError::Storage("the disk is broken".into()))
    }
    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.0.append(event).await
    }
    async fn get(&self, id: ExecutionId) -> Result<Option<ExecutionRecord>, LedgerError> {
        self.0.get(id).await
    }
    async fn events(&self, id: ExecutionId) -> Result<Vec<LedgerEvent>, LedgerError> {
        self.0.events(id).await
    }
    async fn list(&self) -> Result<Vec<ExecutionRecord>, LedgerError> {
        self.0.list().await
    }
    async fn store_result(&self, id: ExecutionId, result: Bytes) -> Result<String, LedgerError> {
        self.0.store_result(id, result).await
    }
    async fn load_result(&self, reference: &str) -> Result<Option<Bytes>, LedgerError> {
        self.0.load_result(reference).await
    }
}

/// The server half's answers that need an inner service that fails (HTTP 500 after the call
/// reached it) or a ledger that fails: the smallest real path is the layer over a service.
#[tokio::test]
async fn the_server_halfs_outcome_unknown_and_not_recorded_are_valid_mcp() {
    let inner = tower::service_fn(|_: Request<_>| async {
        let mut response = Response::new(Full::new(Bytes::from_static(b"boom")));
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        Ok::<_, std::convert::Infallible>(response)
    });
    for era in Era::ALL {
        let request = |id| {
            with_idempotency_key(
                era.tool_call(
                    "http://127.0.0.1/mcp",
                    None,
                    id,
                    "deploy_release",
                    deploy("1"),
                ),
                "k-500",
            )
        };
        let mut server = IdempotencyLayer::new(MemoryLedger::new(), key()).layer(inner);
        let first = server
            .ready()
            .await
            .unwrap()
            .call(request(1))
            .await
            .unwrap();
        assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let answer = server
            .ready()
            .await
            .unwrap()
            .call(request(2))
            .await
            .unwrap();
        let (status, answer) = message(answer).await;
        assert_eq!(status, StatusCode::CONFLICT, "{answer}");
        assert_valid_message(era, "outcome unknown", &answer, Some(&json!(2)));

        let mut broken =
            IdempotencyLayer::with_shared_ledger(Arc::new(BrokenLedger::default()), key())
                .layer(inner);
        let answer = broken
            .ready()
            .await
            .unwrap()
            .call(request(3))
            .await
            .unwrap();
        let (status, answer) = message(answer).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
        assert_valid_message(era, "not recorded", &answer, Some(&json!(3)));
    }
}
