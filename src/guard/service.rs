//! `GuardLayer` / `Guard<S>`: the decision applied to real requests.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use dashmap::{DashMap, mapref::entry::Entry};
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use tokio::sync::watch;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

use super::{
    Authorization, AuthorizationRequest, Authorize, BoxError, GuardError, GuardRequestBody,
    GuardResponseBody, ProbeOutcome, ProbeRequest, StatusProbe, UncertainReason, answer,
};
use crate::{
    Actor, CredentialRef, ExecutionId, IDEMPOTENCY_KEY, IdempotencyKey, IdempotencyKeyFormat,
    IntentScope, Target,
    contract::{ContractRegistry, RetryClass},
    decide::{
        call::{Decision, Facts, decide},
        classify::{ErrorClass, classify_error, refused_before_running},
        flight::{Flight, single_flight},
        probe::AfterProbe,
    },
    fingerprint::{ActionRecord, Channel, Fingerprint, FingerprintKey},
    ledger::{
        Claim, Claimed, ClientInfo, EventKind, ExecutionRecord, ExecutionState, Ledger,
        LedgerEvent, Timestamp,
    },
    observe::{self, Polled, Recorder, Settlement, Unread, Watchers, Write, write_from_drop},
    protocol::{
        self, Era, Message, RequestId, RequestKind, ResumeKey, ToolCall, response::ResponseScanner,
    },
};

/// How many times one call decides again because another attempt moved its execution on
/// between its decision and its write, before it answers "in progress".
const MAX_DECISIONS: usize = 8;

/// What a status probe led to.
enum Probed {
    /// Applied, recorded as resolved: hand back its result (when kept).
    Applied(ExecutionRecord, Option<Bytes>),
    /// Not applied, recorded as resolved: send again under the same key.
    NotApplied(ExecutionRecord),
    /// The guard's own answer (in progress, held for review).
    Answer(Response<Bytes>),
    /// Another attempt settled or moved the execution meanwhile: decide again.
    Moved,
}

/// A ledger that linked another actor's (or intent's) execution to a call: never handed back.
fn foreign_link() -> GuardError {
    GuardError::ledger(crate::ledger::LedgerError::Storage(
        "the ledger linked an execution of another actor or intent to this call; nothing was \
         handed back or sent"
            .into(),
    ))
}

/// Default bound on a buffered request body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

#[derive(Clone)]
struct Config {
    ledger: Arc<dyn Ledger>,
    contracts: Arc<ContractRegistry>,
    key: FingerprintKey,
    actor: Actor,
    intent_scope: IntentScope,
    credential_ref: Option<CredentialRef>,
    target: Option<Target>,
    authorizer: Option<Arc<dyn Authorize>>,
    probes: HashMap<String, Arc<dyn StatusProbe>>,
    max_body_bytes: usize,
    attach_timeout: Duration,
    drain_timeout: Duration,
    key_format: IdempotencyKeyFormat,
    owner: String,
}

/// A [`Layer`] that puts the guard in front of an MCP client transport.
///
/// # When a call is re-sent
///
/// Only as its tool's contract and the ledger allow: see the [module docs](super).
///
/// # Clone
///
/// Clones share the ledger and the in-flight table, so two services built from one layer
/// single-flight the same intents.
#[derive(Clone)]
pub struct GuardLayer {
    config: Arc<Config>,
    inflight: Arc<Inflight>,
}

impl std::fmt::Debug for GuardLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardLayer")
            .field("ledger", &self.config.ledger)
            .field("actor", &self.config.actor)
            .field("intent_scope", &self.config.intent_scope)
            .field("owner", &self.config.owner)
            .finish_non_exhaustive()
    }
}

impl GuardLayer {
    /// A guard recording into `ledger`, governed by `contracts`, fingerprinting under `key`.
    ///
    /// Defaults: actor `anonymous`, intent scope `process:<random>` (links repeats within this
    /// guard's life only), target from each request's URI, no authorization hook, 4 MiB body
    /// limit, 30 s attach wait, raw `Idempotency-Key`.
    pub fn new(ledger: impl Ledger, contracts: ContractRegistry, key: FingerprintKey) -> Self {
        let owner = format!("guard:{}", ExecutionId::new().ulid());
        Self {
            config: Arc::new(Config {
                ledger: Arc::new(ledger),
                contracts: Arc::new(contracts),
                key,
                actor: Actor::new("anonymous"),
                intent_scope: IntentScope::new(format!("process:{owner}")),
                credential_ref: None,
                target: None,
                authorizer: None,
                probes: HashMap::new(),
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
                attach_timeout: Duration::from_secs(30),
                drain_timeout: Duration::from_secs(60),
                key_format: IdempotencyKeyFormat::Raw,
                owner,
            }),
            inflight: Arc::default(),
        }
    }

    fn config(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// The default actor (a request's [`Actor`] extension overrides it).
    pub fn actor(mut self, actor: Actor) -> Self {
        self.config().actor = actor;
        self
    }

    /// The default intent scope (a request's [`IntentScope`] extension overrides it).
    pub fn intent_scope(mut self, scope: IntentScope) -> Self {
        self.config().intent_scope = scope;
        self
    }

    /// The default credential reference (a request's [`CredentialRef`] extension overrides it).
    pub fn credential_ref(mut self, credential_ref: CredentialRef) -> Self {
        self.config().credential_ref = Some(credential_ref);
        self
    }

    /// The target; by default each request's URI authority and path.
    pub fn target(mut self, target: Target) -> Self {
        self.config().target = Some(target);
        self
    }

    /// The authorization hook, asked once per new execution.
    pub fn authorizer(mut self, authorizer: impl Authorize) -> Self {
        self.config().authorizer = Some(Arc::new(authorizer));
        self
    }

    /// The status probe of a recoverable tool.
    pub fn status_probe(mut self, tool: impl Into<String>, probe: impl StatusProbe) -> Self {
        self.config().probes.insert(tool.into(), Arc::new(probe));
        self
    }

    /// The largest request body buffered; a larger `tools/call` is refused before sending.
    pub fn max_body_bytes(mut self, max: usize) -> Self {
        self.config().max_body_bytes = max;
        self
    }

    /// How long a repeat waits for an in-flight attempt of the same execution.
    pub fn attach_timeout(mut self, timeout: Duration) -> Self {
        self.config().attach_timeout = timeout;
        self
    }

    /// How long a response body the caller dropped before its JSON-RPC response is still read
    /// in the background to learn the outcome (after that, the outcome is `unknown`).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.config().drain_timeout = timeout;
        self
    }

    /// How the `Idempotency-Key` header is spelled.
    pub fn idempotency_key_format(mut self, format: IdempotencyKeyFormat) -> Self {
        self.config().key_format = format;
        self
    }

    /// The ledger.
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.config.ledger
    }

    /// Settles a `needs_review` (or unknown) execution as an operator: applied or not applied,
    /// recorded as a `resolved` event with the note.
    pub async fn resolve(
        &self,
        execution_id: ExecutionId,
        applied: bool,
        operator: &str,
        note: &str,
    ) -> Result<ExecutionRecord, crate::ledger::LedgerError> {
        resolve(
            &*self.config.ledger,
            execution_id,
            applied,
            &format!("operator:{operator}"),
            note,
        )
        .await
    }
}

impl GuardLayer {
    /// Ends the guard's background work, for a process that is about to exit.
    ///
    /// Drains of response bodies that callers dropped before the JSON-RPC response (see
    /// [`drain_timeout`](Self::drain_timeout)) get up to `grace` to learn their outcome; then
    /// they stop, and their calls are recorded `unknown`. Returns once every ledger write the
    /// guard started in the background has finished, among them the `unknown` of a call that
    /// was dropped between dispatch and outcome. A drain that starts later stops at once.
    pub async fn shut_down(&self, grace: Duration) {
        let background = &self.inflight.background;
        let mut running = background.running.subscribe();
        if tokio::time::timeout(grace, running.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            background.stop.send_replace(true);
        }
        // The sender lives in `self`.
        let _ = running.wait_for(|n| *n == 0).await;
    }
}

/// Records an operator's (or any settler's) resolution.
pub async fn resolve(
    ledger: &dyn Ledger,
    execution_id: ExecutionId,
    applied: bool,
    by: &str,
    note: &str,
) -> Result<ExecutionRecord, crate::ledger::LedgerError> {
    ledger
        .append(LedgerEvent {
            execution_id,
            at: Timestamp::now(),
            kind: EventKind::Resolved {
                applied,
                by: by.to_owned(),
                note: note.to_owned(),
                result_reference: None,
                attempt: None,
            },
        })
        .await
}

impl<S> Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            config: self.config.clone(),
            inflight: self.inflight.clone(),
        }
    }
}

/// The guard middleware; see [`GuardLayer`].
#[derive(Clone)]
pub struct Guard<S> {
    inner: S,
    config: Arc<Config>,
    inflight: Arc<Inflight>,
}

impl<S> Guard<S> {
    /// The guard's own answer to a `tools/call` whose every attempt lost its answer, for a
    /// caller that stops asking (the proxy, after the attempts it allows): a `CallToolResult`
    /// with `isError: true`, the execution record as it stands in the ledger, and what asking
    /// again would do, for the caller's request `id` and `era`. Never a second send.
    ///
    /// `None` when the ledger has no such execution.
    pub async fn unanswered(
        &self,
        execution_id: ExecutionId,
        id: &RequestId,
        era: Era,
    ) -> Result<Option<Response<Bytes>>, GuardError> {
        let record = self
            .config
            .ledger
            .get(execution_id)
            .await
            .map_err(GuardError::ledger)?;
        Ok(record.map(|record| {
            let mut response = answer::unanswered(id, era, &record);
            response.extensions_mut().insert(execution_id);
            response
        }))
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Guard<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The future of [`Guard`]. Boxed inside: the decision awaits the ledger several times, and a
/// hand-written state machine for it would hide the logic this crate exists for.
pub struct ResponseFuture<RB> {
    inner: observe::BoxFuture<Answer<RB>>,
}

impl<RB> std::fmt::Debug for ResponseFuture<RB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<RB> Future for ResponseFuture<RB> {
    type Output = Answer<RB>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner).poll(cx)
    }
}

impl<S, B, RB> Service<Request<B>> for Guard<S>
where
    S: Service<Request<GuardRequestBody>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<GuardResponseBody<RB>>;
    type Error = GuardError;
    type Future = ResponseFuture<RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(GuardError::inner)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The ready service goes with this call; the clone (maybe not ready) stays.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let call = Call {
            inner,
            inner_ready: true,
            config: self.config.clone(),
            inflight: self.inflight.clone(),
        };
        ResponseFuture {
            inner: observe::BoxFuture::new(call.run(request)),
        }
    }
}

type Answer<RB> = Result<Response<GuardResponseBody<RB>>, GuardError>;

fn answered<RB>(response: Response<Bytes>) -> Answer<RB> {
    Ok(response.map(GuardResponseBody::answer))
}

struct Call<S> {
    inner: S,
    inner_ready: bool,
    config: Arc<Config>,
    inflight: Arc<Inflight>,
}

/// What the guard knows of one `tools/call` once it is fingerprinted.
struct Intent {
    call: ToolCall,
    fingerprint: Fingerprint,
    actor: Actor,
    intent_scope: IntentScope,
    target: Target,
    credential_ref: Option<CredentialRef>,
    class: RetryClass,
    link_window: Duration,
    retention: Duration,
    keep_results: bool,
    max_result_bytes: usize,
    session_id: Option<String>,
    client_info: Option<ClientInfo>,
    caller_key: Option<IdempotencyKey>,
    /// The caller's era: the shape of every answer the guard writes for this call.
    era: Era,
}

impl<S, RB> Call<S>
where
    S: Service<Request<GuardRequestBody>, Response = Response<RB>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    async fn run<B>(self, request: Request<B>) -> Answer<RB>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = request.into_parts();
        let max = self.config.max_body_bytes;
        let bytes = match observe::collect(body, max).await {
            Ok(bytes) => bytes,
            Err(Unread::TooLarge) => {
                return answered(answer::jsonrpc_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    None,
                    -32600,
                    format!(
                        "the request body is larger than the guard's {max}-byte limit; nothing was sent"
                    ),
                ));
            }
            Err(Unread::Failed(error)) => return Err(GuardError::request_body(error)),
        };
        let classified = protocol::classify(&parts.method, &parts.headers, &bytes);
        let mut parts = parts;
        if let Ok(c) = &classified {
            protocol::headers::add_standard_headers(&mut parts.headers, c);
        }
        let era = classified.as_ref().map_or(Era::Sessions, |c| c.era());
        let call = match classified {
            Ok(c) => match c.kind {
                RequestKind::Message(Message::ToolCall(call)) => (call, c.session_id),
                RequestKind::Resume { last_event_id } => {
                    return self
                        .resume(parts, bytes, &last_event_id, c.session_id)
                        .await;
                }
                ref kind @ RequestKind::Batch(_) if kind.tool_calls().next().is_some() => {
                    return answered(answer::jsonrpc_error(
                        StatusCode::BAD_REQUEST,
                        None,
                        -32600,
                        "a JSON-RPC batch carrying tools/call cannot be guarded; send each tools/call in its own request".into(),
                    ));
                }
                _ => return self.pass_through(parts, bytes).await,
            },
            Err(error) if parts.method == http::Method::POST => {
                return answered(answer::jsonrpc_error(
                    StatusCode::BAD_REQUEST,
                    protocol::request_id_of(&bytes).as_ref(),
                    -32600,
                    format!("{error}; nothing was sent"),
                ));
            }
            Err(_) => return self.pass_through(parts, bytes).await,
        };
        let (call, session_id) = call;
        let intent = match self.intent(&parts, call, session_id, era) {
            Ok(intent) => intent,
            Err(response) => return answered(*response),
        };
        if intent.class == RetryClass::ReadOnly {
            return self.pass_through(parts, bytes).await;
        }
        if protocol::has_integer_beyond_64_bits(&intent.call.arguments, &bytes) {
            return answered(answer::jsonrpc_error(
                StatusCode::OK,
                Some(&intent.call.id),
                -32602,
                format!("{}; nothing was sent", protocol::INEXACT_INTEGER),
            ));
        }
        if self.config.key_of_another_actor(&intent).await? {
            return answered(answer::jsonrpc_error(
                StatusCode::BAD_REQUEST,
                Some(&intent.call.id),
                -32600,
                "the Idempotency-Key names an execution this caller did not start; send the call \
                 without it, or with a key of its own; nothing was sent"
                    .into(),
            ));
        }
        let span = tracing::info_span!(
            "tools_call",
            tool = %intent.call.name,
            fingerprint = %intent.fingerprint.short(),
            execution_id = tracing::field::Empty,
            decision = tracing::field::Empty,
        );
        self.guarded(parts, bytes, intent).instrument(span).await
    }

    fn intent(
        &self,
        parts: &http::request::Parts,
        call: ToolCall,
        session_id: Option<String>,
        era: Era,
    ) -> Result<Intent, Box<Response<Bytes>>> {
        let config = &self.config;
        let ext = &parts.extensions;
        let actor = ext.get::<Actor>().unwrap_or(&config.actor).clone();
        let intent_scope = ext
            .get::<IntentScope>()
            .unwrap_or(&config.intent_scope)
            .clone();
        let credential_ref = ext
            .get::<CredentialRef>()
            .or(config.credential_ref.as_ref())
            .cloned();
        let target = request_target(parts, config.target.as_ref());
        let caller_key = match parts
            .headers
            .get(IDEMPOTENCY_KEY)
            .map(IdempotencyKey::from_header)
        {
            None => None,
            Some(Ok(key)) => Some(key),
            Some(Err(error)) => {
                return Err(Box::new(answer::jsonrpc_error(
                    StatusCode::BAD_REQUEST,
                    Some(&call.id),
                    -32600,
                    format!("{error}; nothing was sent"),
                )));
            }
        };
        let resolved = config
            .contracts
            .resolve(&call.name, &target, None)
            .map_err(|error| {
                Box::new(answer::jsonrpc_error(
                    StatusCode::OK,
                    Some(&call.id),
                    -32601,
                    format!("{error}; nothing was sent"),
                ))
            })?;
        let contract = resolved.contract;
        let record = ActionRecord::new(
            actor.clone(),
            intent_scope.clone(),
            call.name.clone(),
            Channel::mcp(target.clone()),
        )
        .borrowed_arguments(&call.arguments);
        // A multi-round-trip continuation is a new intent, not a re-issue of the call it
        // continues.
        let record = match call.continuation() {
            Some(continuation) => record.continuation(continuation),
            None => record,
        };
        let record = match &credential_ref {
            Some(c) => record.credential_ref(c.clone()),
            None => record,
        };
        let fingerprint = config.key.fingerprint(record, contract.fingerprint_rules());
        // Set by whoever knows the session's `initialize` (the proxy); a 2026-07-28 request
        // names its client itself.
        let client_info = ext.get::<ClientInfo>().cloned().or_else(|| {
            call.meta
                .as_ref()?
                .get("io.modelcontextprotocol/clientInfo")
                .and_then(ClientInfo::from_json)
        });
        Ok(Intent {
            call,
            fingerprint,
            actor,
            intent_scope,
            target,
            credential_ref,
            class: contract.class(),
            link_window: contract.link_window_duration(),
            retention: contract.retention_duration(),
            keep_results: contract.keeps_results(),
            max_result_bytes: contract.max_result_size(),
            session_id,
            client_info,
            caller_key,
            era,
        })
    }

    /// A GET with `Last-Event-ID`: never a re-issue. When it continues the broken stream of an
    /// execution, the answer it brings completes that execution.
    async fn resume(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
        last_event_id: &str,
        session_id: Option<String>,
    ) -> Answer<RB> {
        // A broken stream belongs to the actor whose call it answered: another actor's GET
        // with its event id is refused unsent (the target would replay that call's answer
        // to it), and neither takes nor completes the execution.
        let actor = parts
            .extensions
            .get::<Actor>()
            .unwrap_or(&self.config.actor)
            .clone();
        // The same event id on another endpoint or session is another stream.
        let target = request_target(&parts, self.config.target.as_ref());
        let key = ResumeKey::new(target.clone(), session_id.clone(), last_event_id);
        let Some((_, link)) = self
            .inflight
            .resume_links
            .remove_if(&key, |_, link| link.actor == actor)
        else {
            if self.inflight.resume_links.contains_key(&key) {
                tracing::warn!("a resume of another actor's stream was refused");
                return answered(answer::jsonrpc_error(
                    StatusCode::FORBIDDEN,
                    None,
                    -32600,
                    "this stream answers another caller's call: it is not resumed for this one; \
                     nothing was sent"
                        .into(),
                ));
            }
            return self.pass_through(parts, bytes).await;
        };
        tracing::info!(execution_id = %link.execution_id, %last_event_id, "a resume stream continues an execution");
        let (body, _) = GuardRequestBody::new(bytes);
        let response = self
            .send(Request::from_parts(parts, body))
            .await
            .map_err(GuardError::inner)?;
        if !response.status().is_success() {
            return Ok(response.map(GuardResponseBody::passthrough));
        }
        let mut recorder = self.recorder(
            link.actor,
            link.execution_id,
            link.request_id,
            response.status().as_u16(),
            (target, session_id),
        );
        recorder.keep_results = link.keep_results;
        recorder.max_result_bytes = link.max_result_bytes;
        recorder.last_event_id = Some(last_event_id.to_owned());
        recorder.resume = true;
        let max = self.config.max_body_bytes.max(link.max_result_bytes);
        Ok(response.map(|b| GuardResponseBody::observed(b, recorder, true, max)))
    }

    async fn pass_through(mut self, parts: http::request::Parts, bytes: Bytes) -> Answer<RB> {
        let (body, _) = GuardRequestBody::new(bytes);
        let response = self
            .send(Request::from_parts(parts, body))
            .await
            .map_err(GuardError::inner)?;
        Ok(response.map(GuardResponseBody::passthrough))
    }

    async fn send(&mut self, request: Request<GuardRequestBody>) -> Result<Response<RB>, BoxError> {
        if !self.inner_ready {
            std::future::poll_fn(|cx| self.inner.poll_ready(cx))
                .await
                .map_err(Into::into)?;
        }
        self.inner_ready = false;
        self.inner.call(request).await.map_err(Into::into)
    }

    async fn guarded(
        self,
        parts: http::request::Parts,
        bytes: Bytes,
        intent: Intent,
    ) -> Answer<RB> {
        let key = IntentKey::new(
            intent.actor.clone(),
            intent.intent_scope.clone(),
            intent.fingerprint,
        );
        loop {
            let mut settled = match self.inflight.acquire(key.clone()) {
                Acquired::Owner(owner) => return self.own(parts, bytes, intent, owner).await,
                Acquired::Waiter(receiver) => receiver,
            };
            tracing::Span::current().record("decision", "attach");
            let wait = async {
                settled
                    .wait_for(Option::is_some)
                    .await
                    .map(|value| value.clone())
            };
            match tokio::time::timeout(self.config.attach_timeout, wait).await {
                // The attempt this call waited for completed: its answer is this call's answer,
                // kept or not, as when the attempt ran in another process (deciding again would
                // find the execution delivered and start a second one).
                Ok(Ok(Some(Settlement::Completed {
                    execution_id,
                    result,
                }))) => {
                    let record = self
                        .config
                        .ledger
                        .get(execution_id)
                        .await
                        .map_err(GuardError::ledger)?;
                    if let Some(record) = record
                        && let Some(response) = self
                            .config
                            .hand_back(&record, &intent, result, None)
                            .await?
                    {
                        return Ok(response);
                    }
                    // Gone from the index (or not this caller's): decide again.
                }
                Ok(Ok(_)) => {}  // any other outcome: decide again from the ledger
                Ok(Err(_)) => {} // the owner went away without settling: decide again
                Err(_) => {
                    let claimed = self.config.claim(&intent).await?;
                    return answered(answer::uncertain(
                        &intent.call.id,
                        intent.era,
                        claimed.record(),
                        UncertainReason::InProgress,
                    ));
                }
            }
        }
    }

    /// This call owns the intent in this process: decide and act.
    ///
    /// Every write between the decision and the send is conditional on what the decision saw
    /// (the state machine refuses a second `authorized`, a `dispatched` whose attempt is not
    /// new, an `unknown` for an attempt that is no longer the latest). When one is refused,
    /// another attempt (in another process) moved the execution on meanwhile: nothing was
    /// sent, and the call decides again from the ledger, which then attaches to that attempt.
    ///
    /// Longer than most functions here: it is the decision table's `match`, kept in one piece
    /// so that the path from a claim to a send reads top to bottom.
    async fn own(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
        intent: Intent,
        owner: Owner,
    ) -> Answer<RB> {
        let has_probe = self.config.probes.contains_key(&intent.call.name);
        let reply_id = intent.call.id.clone();
        for _ in 0..MAX_DECISIONS {
            let mut claimed = self.config.claim(&intent).await?;
            let decision = loop {
                let task_known = claimed.record().correlation.task_id.is_some();
                let attempt_alive = self.config.attempt_elsewhere(&claimed).await;
                let facts = Facts {
                    attempt_alive,
                    has_probe,
                    task_known,
                };
                let decision = decide(&claimed, facts);
                if decision != Decision::Attach {
                    break decision;
                }
                // Another process's guard owns the execution: wait (bounded) for it to move
                // on, then decide again.
                match self.config.wait_for_other_attempt(claimed.record()).await? {
                    // The attempt this call waited for completed: its answer is this call's
                    // answer, even when another caller already received it (claiming again
                    // would find a delivered execution and start a second one).
                    Some(current) if current.state == ExecutionState::Completed => {
                        let stored = self.config.kept_result(&current).await?;
                        return self
                            .config
                            .hand_back(&current, &intent, stored, Some(owner))
                            .await?
                            .map_or_else(|| Err(foreign_link()), Ok);
                    }
                    Some(_) => claimed = self.config.claim(&intent).await?,
                    None => {
                        return answered(answer::uncertain(
                            &reply_id,
                            intent.era,
                            claimed.record(),
                            UncertainReason::InProgress,
                        ));
                    }
                }
            };
            let mut record = claimed.record().clone();
            let span = tracing::Span::current();
            span.record("execution_id", tracing::field::display(record.execution_id));
            span.record("decision", tracing::field::debug(decision));
            tracing::info!(state = record.state.as_str(), "decided");
            let id = record.execution_id;
            // A dispatched execution whose attempt is gone has an unknown outcome: record it
            // so (only if that attempt is still the latest).
            if record.state == ExecutionState::Dispatched && !matches!(decision, Decision::Start) {
                match self
                    .config
                    .mark_unknown(&record, "the attempt ended before its outcome was observed")
                    .await?
                {
                    Some(unknown) => record = unknown,
                    None => continue,
                }
            }
            let to_send = match decision {
                Decision::Start | Decision::Continue => {
                    if matches!(record.state, ExecutionState::Accepted) {
                        match self.config.authorize(&record, &intent).await {
                            Ok(Some(denied)) => {
                                owner.settle(Settlement::Other);
                                return answered(answer::denied(&reply_id, intent.era, &denied));
                            }
                            Ok(None) => {
                                match self.config.append_moved(id, EventKind::Authorized).await? {
                                    Some(authorized) => record = authorized,
                                    None => continue,
                                }
                            }
                            Err(e) if e.is_ledger_transition() => continue,
                            Err(e) => return Err(e),
                        }
                    }
                    record
                }
                Decision::Resend => record,
                // Attachment happened before the claim; it never turns into a re-send here.
                Decision::Attach => {
                    return answered(answer::uncertain(
                        &reply_id,
                        intent.era,
                        &record,
                        UncertainReason::InProgress,
                    ));
                }
                Decision::Probe => match self.probe(&parts, &intent, record).await? {
                    Probed::Applied(record, result) => {
                        return self
                            .config
                            .hand_back(&record, &intent, result, Some(owner))
                            .await?
                            .map_or_else(|| Err(foreign_link()), Ok);
                    }
                    Probed::NotApplied(record) => record,
                    Probed::Answer(response) => return answered(response),
                    Probed::Moved => continue,
                },
                Decision::ReturnStored => {
                    let stored = self.config.kept_result(&record).await?;
                    return self
                        .config
                        .hand_back(&record, &intent, stored, Some(owner))
                        .await?
                        .map_or_else(|| Err(foreign_link()), Ok);
                }
                Decision::RepeatDenial => {
                    return answered(answer::denied(&reply_id, intent.era, &record));
                }
                Decision::Uncertain(reason) => {
                    if reason == UncertainReason::NeedsReview
                        && record.state != ExecutionState::NeedsReview
                    {
                        let why = format!(
                            "unknown outcome; a tool of class {} is not re-sent",
                            record.retry_class
                        );
                        record = self
                            .config
                            .append_or_current(id, EventKind::NeedsReview { reason: why })
                            .await?;
                    }
                    tracing::warn!(
                        state = record.state_label(),
                        "answered with an uncertain result"
                    );
                    return answered(answer::uncertain(&reply_id, intent.era, &record, reason));
                }
            };
            // Recorded before anything leaves; refused when another attempt moved the
            // execution on since this call decided: then nothing is sent, and it decides again.
            match self.config.record_dispatch(&intent, &to_send).await? {
                Some((record, key)) => {
                    return self
                        .send_dispatched(parts, bytes, intent, record, key, owner)
                        .await;
                }
                None => continue,
            }
        }
        // Moved on under this call every time it decided: another attempt is busy with it.
        let claimed = self.config.claim(&intent).await?;
        answered(answer::uncertain(
            &reply_id,
            intent.era,
            claimed.record(),
            UncertainReason::InProgress,
        ))
    }

    async fn probe(
        &mut self,
        parts: &http::request::Parts,
        intent: &Intent,
        record: ExecutionRecord,
    ) -> Result<Probed, GuardError> {
        let outcome = match (
            &record.correlation.task_id,
            self.config.probes.get(&intent.call.name),
        ) {
            (Some(task_id), _) => {
                let task_id = task_id.clone();
                self.probe_task(parts, intent, &task_id).await
            }
            (None, Some(probe)) => {
                let request = ProbeRequest {
                    execution: &record,
                    arguments: &intent.call.arguments,
                };
                probe.clone().probe(request).await
            }
            (None, None) => ProbeOutcome::Unknown {
                reason: "no status probe".into(),
            },
        };
        tracing::info!(?outcome, "status probe answered");
        let id = record.execution_id;
        let reply_id = &intent.call.id;
        match AfterProbe::of(outcome) {
            AfterProbe::HandBack { result } => {
                let stored = match result.as_ref().map(serde_json::to_vec) {
                    Some(Ok(bytes))
                        if intent.keep_results && bytes.len() <= intent.max_result_bytes =>
                    {
                        let bytes = Bytes::from(bytes);
                        let reference = self
                            .config
                            .ledger
                            .store_result(id, bytes.clone())
                            .await
                            .map_err(GuardError::ledger)?;
                        Some((reference, bytes))
                    }
                    _ => None,
                };
                let resolved = EventKind::Resolved {
                    applied: true,
                    by: "probe".into(),
                    note: "the status probe found the action applied".into(),
                    result_reference: stored.as_ref().map(|(r, _)| r.clone()),
                    attempt: Some(record.attempts),
                };
                Ok(match self.config.append_moved(id, resolved).await? {
                    Some(record) => Probed::Applied(record, stored.map(|(_, result)| result)),
                    None => Probed::Moved,
                })
            }
            AfterProbe::Resend => {
                let resolved = EventKind::Resolved {
                    applied: false,
                    by: "probe".into(),
                    note: "the status probe found the action not applied; sent again under the same key".into(),
                    result_reference: None,
                    attempt: Some(record.attempts),
                };
                Ok(match self.config.append_moved(id, resolved).await? {
                    Some(record) => Probed::NotApplied(record),
                    None => Probed::Moved,
                })
            }
            AfterProbe::InProgress => Ok(Probed::Answer(answer::uncertain(
                reply_id,
                intent.era,
                &record,
                UncertainReason::InProgress,
            ))),
            AfterProbe::Review { reason } => {
                let review = EventKind::NeedsReview {
                    reason: format!("status probe: {reason}"),
                };
                Ok(match self.config.append_moved(id, review).await? {
                    Some(record) => Probed::Answer(answer::uncertain(
                        reply_id,
                        intent.era,
                        &record,
                        UncertainReason::NeedsReview,
                    )),
                    None => Probed::Moved,
                })
            }
        }
    }

    /// The built-in status probe of a call that became an MCP task: `tasks/get` (a read) through
    /// the inner service, with the call's session, protocol version and `_meta`.
    async fn probe_task(
        &mut self,
        parts: &http::request::Parts,
        intent: &Intent,
        task_id: &str,
    ) -> ProbeOutcome {
        let probe_id = format!("mcp-replay-guard-probe-{}", ExecutionId::new().ulid());
        let body = protocol::headers::tasks_get(&probe_id, task_id, intent.call.meta.as_ref());
        let mut request = Request::new(GuardRequestBody::new(body).0);
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = parts.uri.clone();
        *request.headers_mut() = parts.headers.clone();
        let headers = request.headers_mut();
        headers.remove(IDEMPOTENCY_KEY);
        headers.remove(http::header::CONTENT_LENGTH);
        protocol::headers::retarget_to_tasks_get(headers, task_id);
        let unknown = |reason: String| ProbeOutcome::Unknown { reason };
        let response = match self.send(request).await {
            Ok(response) if response.status().is_success() => response,
            Ok(response) => {
                return unknown(format!("tasks/get answered HTTP {}", response.status()));
            }
            Err(error) => return unknown(format!("tasks/get failed: {error}")),
        };
        let limit = self.config.max_body_bytes.max(intent.max_result_bytes);
        let bytes = match Limited::new(response.into_body(), limit).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => return unknown(format!("tasks/get answer unreadable: {error}")),
        };
        let Some(task) = protocol::response::find_response(&bytes, &RequestId::String(probe_id))
            .and_then(|m| m.get("result").cloned())
        else {
            return unknown("no answer to tasks/get".into());
        };
        match task.get("status").and_then(serde_json::Value::as_str) {
            Some("completed") => ProbeOutcome::Applied {
                result: task.get("result").cloned(),
            },
            // The tool ran and failed: that is an outcome, and running it again could repeat
            // whatever it did before failing.
            Some("failed") => ProbeOutcome::Applied {
                result: Some(answer::result_for(
                    intent.era,
                    serde_json::json!({
                        "content": [{"type": "text", "text": format!("task {task_id} failed")}],
                        "isError": true,
                    }),
                )),
            },
            Some("working" | "input_required") => ProbeOutcome::InProgress,
            other => unknown(format!("task status {other:?}")),
        }
    }

    /// Sends an attempt whose `dispatched` is recorded ([`Config::record_dispatch`]), with
    /// the `Idempotency-Key`.
    async fn send_dispatched(
        mut self,
        mut parts: http::request::Parts,
        bytes: Bytes,
        intent: Intent,
        record: ExecutionRecord,
        key: IdempotencyKey,
        mut owner: Owner,
    ) -> Answer<RB> {
        let id = record.execution_id;
        let key_from_caller = intent.caller_key.is_some();
        owner.dispatched(self.config.ledger.clone(), id, record.attempts);
        if !key_from_caller {
            parts
                .headers
                .insert(IDEMPOTENCY_KEY, key.to_header_value(self.config.key_format));
        }
        tracing::info!(attempt = record.attempts, "dispatched");
        let (body, polled) = GuardRequestBody::new(bytes);
        let mut response = match self.send(Request::from_parts(parts, body)).await {
            Ok(response) => response,
            Err(error) => {
                return send_failed(&self.config, &record, &polled, error, owner).await;
            }
        };
        // The caller can tell which execution a target's answer belongs to.
        response.extensions_mut().insert(id);
        let status = response.status();
        if status.is_success() {
            let sse = ResponseScanner::is_sse(response.headers());
            let mut recorder = self.recorder(
                intent.actor.clone(),
                id,
                intent.call.id,
                status.as_u16(),
                (intent.target.clone(), intent.session_id.clone()),
            );
            recorder.attempt = Some(record.attempts);
            recorder.keep_results = intent.keep_results;
            recorder.max_result_bytes = intent.max_result_bytes;
            recorder.settle = Some(Box::new(move |settlement| owner.settle(settlement)));
            let max = self.config.max_body_bytes.max(intent.max_result_bytes);
            return Ok(response.map(|b| GuardResponseBody::observed(b, recorder, sse, max)));
        }
        let kind = if refused_before_running(status.as_u16()) {
            EventKind::Failed {
                target_status: Some(status.as_u16()),
                reason: format!("the target refused the call with HTTP {status}"),
            }
        } else {
            EventKind::Unknown {
                target_status: Some(status.as_u16()),
                attempt: Some(record.attempts),
                reason: format!("HTTP {status} on tools/call: the tool may have run"),
            }
        };
        self.config.append(id, kind).await?;
        owner.settle(Settlement::Other);
        Ok(response.map(GuardResponseBody::passthrough))
    }
}

async fn send_failed<RB>(
    config: &Config,
    record: &ExecutionRecord,
    polled: &Polled,
    error: BoxError,
    owner: Owner,
) -> Answer<RB> {
    let id = record.execution_id;
    {
        let sent = classify_error(
            polled.was_polled(),
            protocol::transport::nothing_was_sent(&*error),
        ) == ErrorClass::Unknown;
        let (kind, error) = if sent {
            (
                EventKind::Unknown {
                    target_status: None,
                    attempt: Some(record.attempts),
                    reason: format!(
                        "transport error after the request may have been sent: {error}"
                    ),
                },
                GuardError::unknown(id, error),
            )
        } else {
            (
                EventKind::NotSent {
                    reason: format!("transport error before the request was sent: {error}"),
                },
                GuardError::not_sent(id, error),
            )
        };
        tracing::warn!(outcome = kind.name(), "send failed");
        config.append(id, kind).await?;
        owner.settle(Settlement::Other);
        Err(error)
    }
}

impl Config {
    /// Whether the caller's `Idempotency-Key` is the key of another actor's execution: sent,
    /// it would let a target that honours keys hand that execution's result to this caller.
    async fn key_of_another_actor(&self, intent: &Intent) -> Result<bool, GuardError> {
        let Some(id) = intent
            .caller_key
            .as_ref()
            .and_then(IdempotencyKey::execution_id)
        else {
            return Ok(false);
        };
        let record = self.ledger.get(id).await.map_err(GuardError::ledger)?;
        Ok(record.is_some_and(|record| record.actor != intent.actor))
    }

    /// Whether a live attempt in another process (a guard with another owner whose process is
    /// still running) owns an execution that has not left.
    async fn attempt_elsewhere(&self, claimed: &Claimed) -> bool {
        let Claimed::Existing(record) = claimed else {
            return false;
        };
        matches!(
            record.state,
            ExecutionState::Accepted | ExecutionState::Authorized | ExecutionState::Dispatched
        ) && record.owner != self.owner
            && self.ledger.is_owner_alive(&record.owner).await
    }

    /// Waits until the execution leaves its in-flight state or its owner dies; `None` when
    /// the attach wait ran out.
    async fn wait_for_other_attempt(
        &self,
        record: &ExecutionRecord,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        let deadline = tokio::time::Instant::now() + self.attach_timeout;
        observe::until_changed(&*self.ledger, record, &self.owner, deadline)
            .await
            .map_err(GuardError::ledger)
    }

    /// The result kept for `record`, if one was.
    async fn kept_result(&self, record: &ExecutionRecord) -> Result<Option<Bytes>, GuardError> {
        match &record.result_reference {
            Some(reference) => self
                .ledger
                .load_result(reference)
                .await
                .map_err(GuardError::ledger),
            None => Ok(None),
        }
    }

    /// The one place a finished execution's answer is handed to a caller: its kept result
    /// (delivered when the caller reads it), or honestly that it finished and its result was not kept.
    ///
    /// `None`, and nothing handed back, when the execution is not this caller's: another
    /// actor's execution is no link, whatever path led to it (the intent key holds the actor,
    /// so no claim and no in-process attach ever leads there; this is the last check).
    async fn hand_back<RB>(
        &self,
        record: &ExecutionRecord,
        intent: &Intent,
        result: Option<Bytes>,
        owner: Option<Owner>,
    ) -> Result<Option<Response<GuardResponseBody<RB>>>, GuardError> {
        if record.actor != intent.actor
            || record.intent_scope != intent.intent_scope
            || record.fingerprint != intent.fingerprint
        {
            tracing::error!(execution_id = %record.execution_id, "an execution of another intent or actor was linked to this call; its result is not handed back");
            return Ok(None);
        }
        let reply_id = &intent.call.id;
        let settled = Settlement::Completed {
            execution_id: record.execution_id,
            result: result.clone(),
        };
        let Some(result) = result else {
            if let Some(owner) = owner {
                owner.settle(settled);
            }
            let mut response =
                answer::uncertain(reply_id, intent.era, record, UncertainReason::ResultNotKept);
            response.extensions_mut().insert(record.execution_id);
            return Ok(Some(response.map(GuardResponseBody::answer)));
        };
        // Delivered once the caller holds it: read to its end, or when a caller that took
        // the delivery over records it.
        let delivery = super::Delivery {
            ledger: self.ledger.clone(),
            execution_id: record.execution_id,
            request_id: reply_id.clone(),
            answered: Arc::default(),
        };
        if let Some(owner) = owner {
            owner.settle(settled);
        }
        // As on a target's answer: the caller can tell which execution it belongs to.
        let mut response = answer::stored_result(reply_id, intent.era, &result);
        response.extensions_mut().insert(record.execution_id);
        Ok(Some(
            response.map(|data| GuardResponseBody::kept(data, delivery)),
        ))
    }

    /// Records `dispatched` for the next attempt of `record`, before anything is sent, with
    /// this guard as the owner. `None` when the ledger refused it because another attempt
    /// moved the execution on since `record` was read: then nothing may be sent.
    async fn record_dispatch(
        &self,
        intent: &Intent,
        record: &ExecutionRecord,
    ) -> Result<Option<(ExecutionRecord, IdempotencyKey)>, GuardError> {
        let key = intent
            .caller_key
            .clone()
            .unwrap_or_else(|| IdempotencyKey::from(record.execution_id));
        let dispatched = EventKind::Dispatched {
            attempt: record.attempts + 1,
            idempotency_key: key.clone(),
            key_from_caller: intent.caller_key.is_some(),
            jsonrpc_id: Some(intent.call.id.clone()),
            session_id: intent.session_id.clone(),
            client_info: intent.client_info.clone(),
            owner: Some(self.owner.clone()),
        };
        Ok(self
            .append_moved(record.execution_id, dispatched)
            .await?
            .map(|record| (record, key)))
    }

    async fn claim(&self, intent: &Intent) -> Result<Claimed, GuardError> {
        self.ledger
            .claim(Claim {
                fingerprint: intent.fingerprint,
                tool: intent.call.name.clone(),
                actor: intent.actor.clone(),
                intent_scope: intent.intent_scope.clone(),
                target: intent.target.clone(),
                credential_ref: intent.credential_ref.clone(),
                retry_class: intent.class,
                link_window: intent.link_window,
                retention: intent.retention,
                owner: self.owner.clone(),
                at: Timestamp::now(),
            })
            .await
            .map_err(GuardError::ledger)
    }

    async fn append(
        &self,
        id: ExecutionId,
        kind: EventKind,
    ) -> Result<ExecutionRecord, GuardError> {
        self.ledger
            .append(LedgerEvent {
                execution_id: id,
                at: Timestamp::now(),
                kind,
            })
            .await
            .map_err(GuardError::ledger)
    }

    /// Records that the attempt of `record` (dispatched by an owner that is gone) has an
    /// unknown outcome. `None` when that attempt is no longer the latest (another attempt was
    /// dispatched meanwhile, or it settled): nothing is written then.
    async fn mark_unknown(
        &self,
        record: &ExecutionRecord,
        reason: &str,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        let kind = EventKind::Unknown {
            target_status: None,
            reason: reason.into(),
            attempt: Some(record.attempts),
        };
        self.append_moved(record.execution_id, kind).await
    }

    /// Appends `kind`; `None` when the state machine refused it because another attempt moved
    /// the execution on meanwhile (nothing was written).
    async fn append_moved(
        &self,
        id: ExecutionId,
        kind: EventKind,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        match self.append(id, kind).await {
            Ok(record) => Ok(Some(record)),
            Err(e) if e.is_ledger_transition() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Appends `kind`; when another attempt (in this process or another) moved the execution
    /// on meanwhile so that `kind` no longer applies, takes the record as it now is.
    async fn append_or_current(
        &self,
        id: ExecutionId,
        kind: EventKind,
    ) -> Result<ExecutionRecord, GuardError> {
        match self.append(id, kind).await {
            Ok(record) => Ok(record),
            Err(e) if e.is_ledger_transition() => self
                .ledger
                .get(id)
                .await
                .map_err(GuardError::ledger)?
                .ok_or_else(|| GuardError::ledger(crate::ledger::LedgerError::NotFound(id))),
            Err(e) => Err(e),
        }
    }

    /// Runs the hook; returns the denied record, or `None` when allowed.
    async fn authorize(
        &self,
        record: &ExecutionRecord,
        intent: &Intent,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        let Some(authorizer) = &self.authorizer else {
            return Ok(None);
        };
        let request = AuthorizationRequest {
            execution: record,
            arguments: &intent.call.arguments,
        };
        match authorizer.authorize(request).await {
            Authorization::Allow => Ok(None),
            Authorization::Deny { reason } => {
                tracing::info!(%reason, "authorization denied");
                self.append(record.execution_id, EventKind::Denied { reason })
                    .await
                    .map(Some)
            }
        }
    }
}

/// The target a request is recorded under: the caller's [`Target`] extension, the layer's,
/// else the request URI's host, port and path.
fn request_target(parts: &http::request::Parts, configured: Option<&Target>) -> Target {
    parts
        .extensions
        .get::<Target>()
        .or(configured)
        .cloned()
        .unwrap_or_else(|| protocol::target_of(&parts.uri))
}

/// A URL as it may be recorded, logged or printed: scheme, host, port and path, without the
/// userinfo (`user:secret@`), the query (`?token=…`) and the fragment, any of which may carry a
/// credential. Works on text that does not parse as a URL too (what a user typed), so an error
/// about a bad URL never repeats its secret.
///
/// ```
/// use mcp_replay_guard::guard::redact_url;
///
/// assert_eq!(
///     redact_url("http://agent:s3cr3t@127.0.0.1:8000/mcp?token=t0k"),
///     "http://…@127.0.0.1:8000/mcp?…"
/// );
/// assert_eq!(redact_url("http://127.0.0.1:8000/mcp"), "http://127.0.0.1:8000/mcp");
/// assert_eq!(redact_url("agent:s3cr3t@bad host/mcp"), "…@bad host/mcp");
/// // Without `//` no authority can be told apart: nothing up to an `@` is shown.
/// assert_eq!(redact_url("http:/\\agent:s3cr3t@host/mcp"), "http:/…@host/mcp");
/// ```
pub fn redact_url(url: &str) -> String {
    let url = url.trim();
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let had_query = rest.contains(['?', '#']);
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let host = authority.rsplit('@').next().unwrap_or("");
    // An `@` after the authority (a URL typed without `//`, a `\` for a `/`) may still end
    // a userinfo: whatever comes before it is not shown.
    let (path, path_cut) = match path.rfind('@') {
        Some(at) => (&path[at + 1..], true),
        None => (path, false),
    };
    let mut out = String::new();
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    if host.len() < authority.len() {
        out.push_str("…@");
    }
    out.push_str(host);
    if path_cut {
        out.push_str("/…@");
    }
    out.push_str(path);
    if had_query {
        out.push_str("?…");
    }
    out
}

use crate::ledger::IntentKey;

/// In-process state: single flight (one owner per intent at a time), and the broken streams a
/// resume GET may continue.
#[derive(Debug, Default)]
struct Inflight {
    intents: DashMap<IntentKey, watch::Sender<Option<Settlement>>>,
    resume_links: DashMap<ResumeKey, ResumeLink>,
    background: Background,
}

/// The guard's work that outlives a call: ledger writes started from a `Drop` (a call dropped
/// between dispatch and outcome) and drains of response bodies a caller dropped. Counted, so
/// that a process can wait for it before it exits ([`GuardLayer::shut_down`]).
#[derive(Debug)]
struct Background {
    running: watch::Sender<usize>,
    stop: watch::Sender<bool>,
}

impl Default for Background {
    fn default() -> Self {
        Self {
            running: watch::Sender::new(0),
            stop: watch::Sender::new(false),
        }
    }
}

/// One piece of background work, counted until it is dropped.
pub(super) struct BackgroundTask(Arc<Inflight>);

impl Drop for BackgroundTask {
    fn drop(&mut self) {
        self.0.background.running.send_modify(|n| *n -= 1);
    }
}

/// Bound on remembered broken streams (each is a few dozen bytes).
const MAX_RESUME_LINKS: usize = 10_000;

/// A broken response stream of an execution, by its target, session and the last event id the
/// caller saw ([`ResumeKey`]): a GET of that stream with that `Last-Event-ID` (from a resume layer, or from a client that resumes by itself) belongs
/// to the execution, and a result that arrives on it completes the execution.
#[derive(Debug, Clone)]
struct ResumeLink {
    actor: Actor,
    execution_id: ExecutionId,
    request_id: RequestId,
    keep_results: bool,
    max_result_bytes: usize,
}

impl Inflight {
    fn background_task(self: &Arc<Self>) -> BackgroundTask {
        self.background.running.send_modify(|n| *n += 1);
        BackgroundTask(self.clone())
    }

    /// `write`, counted as background work until it finishes (or is dropped).
    fn tracked(self: &Arc<Self>, write: Write) -> Write {
        let task = self.background_task();
        Box::pin(async move {
            write.await;
            drop(task);
        })
    }

    /// Resolves once [`GuardLayer::shut_down`] tells background drains to stop.
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = self.background.stop.subscribe();
        async move {
            // The sender lives as long as the `Inflight` a background task holds.
            let _ = stop.wait_for(|stop| *stop).await;
        }
    }

    fn link(&self, key: ResumeKey, link: ResumeLink) {
        if self.resume_links.len() >= MAX_RESUME_LINKS {
            self.resume_links.clear();
        }
        self.resume_links.insert(key, link);
    }
}

enum Acquired {
    Owner(Owner),
    Waiter(watch::Receiver<Option<Settlement>>),
}

impl Inflight {
    fn acquire(self: &Arc<Self>, key: IntentKey) -> Acquired {
        // The entry stays locked from the look to the insert: one owner per intent.
        let entry = self.intents.entry(key.clone());
        let live = match &entry {
            Entry::Occupied(occupied) => Some(occupied.get().subscribe()),
            Entry::Vacant(_) => None,
        };
        match single_flight(live) {
            Flight::Attach(settled) => Acquired::Waiter(settled),
            Flight::Own => {
                let (sender, _) = watch::channel(None);
                entry.insert(sender.clone());
                Acquired::Owner(Owner {
                    inflight: self.clone(),
                    key,
                    sender,
                    abandoned: None,
                })
            }
        }
    }
}

/// Ownership of an intent in this process. Dropping it releases the intent; if the attempt was
/// dispatched and never settled, the execution is recorded `unknown`.
pub(super) struct Owner {
    inflight: Arc<Inflight>,
    key: IntentKey,
    sender: watch::Sender<Option<Settlement>>,
    abandoned: Option<(Arc<dyn Ledger>, ExecutionId, u32)>,
}

impl Owner {
    fn dispatched(&mut self, ledger: Arc<dyn Ledger>, id: ExecutionId, attempt: u32) {
        self.abandoned = Some((ledger, id, attempt));
    }

    /// Publishes the outcome to attached waiters; the intent is released first, so a waiter
    /// that must decide again becomes the next owner instead of waiting on a settled channel.
    pub(super) fn settle(mut self, settlement: Settlement) {
        self.abandoned = None;
        self.release();
        self.sender.send_replace(Some(settlement));
    }

    fn release(&self) {
        self.inflight
            .intents
            .remove_if(&self.key, |_, s| s.same_channel(&self.sender));
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.release();
        if let Some((ledger, id, attempt)) = self.abandoned.take() {
            // Dropped between dispatch and outcome (the caller cancelled, or dropped the body
            // before the response arrived): the target may have run it.
            let record = async move {
                let event = LedgerEvent {
                    execution_id: id,
                    at: Timestamp::now(),
                    kind: EventKind::Unknown {
                        target_status: None,
                        // Only this attempt: a later one (re-sent meanwhile) is not marked.
                        attempt: Some(attempt),
                        reason: "the caller dropped the call before its outcome was observed"
                            .into(),
                    },
                };
                if let Err(error) = ledger.append(event).await {
                    tracing::warn!(execution_id = %id, %error, "could not record an abandoned attempt");
                }
            };
            write_from_drop(self.inflight.tracked(Box::pin(record)));
        }
        if self.sender.borrow().is_none() {
            self.sender.send_replace(Some(Settlement::Other));
        }
    }
}

impl<S> Call<S> {
    /// The recorder of a response the guard observes for `actor`'s call, with this process's
    /// single flight and resume links as its watchers.
    fn recorder(
        &self,
        actor: Actor,
        execution_id: ExecutionId,
        request_id: RequestId,
        status: u16,
        stream: (Target, Option<String>),
    ) -> Recorder {
        let mut recorder = Recorder::new(self.config.ledger.clone(), execution_id, request_id);
        recorder.status = status;
        recorder.drain_timeout = self.config.drain_timeout;
        recorder.deliver_at_end = true;
        recorder.watchers = Some(Arc::new(Local {
            actor,
            inflight: self.inflight.clone(),
            stream,
        }));
        recorder
    }
}

/// What this process learns of an observed call's outcome: a broken stream becomes a resume
/// link of the call's actor; writes from a `Drop` and drains count as background work.
struct Local {
    actor: Actor,
    inflight: Arc<Inflight>,
    /// The stream's target and session: with an event id, the key a resume GET links by.
    stream: (Target, Option<String>),
}

impl Watchers for Local {
    fn broke_at(&self, last_event_id: &str, recorder: &Recorder) {
        let link = ResumeLink {
            actor: self.actor.clone(),
            execution_id: recorder.execution_id,
            request_id: recorder.request_id.clone(),
            keep_results: recorder.keep_results,
            max_result_bytes: recorder.max_result_bytes,
        };
        let (target, session_id) = self.stream.clone();
        let key = ResumeKey::new(target, session_id, last_event_id.to_owned());
        self.inflight.link(key, link);
    }

    fn track(&self, write: Write) -> Write {
        self.inflight.tracked(write)
    }

    fn drain(&self) -> (Box<dyn Send>, Write) {
        let work = self.inflight.background_task();
        (Box::new(work), Box::pin(self.inflight.stopped()))
    }
}
