//! `Call`: one request through the guard, and the only part generic over the inner service.
//!
//! A `tools/call` goes [`Route`] → [`Intent`](super::intent::Intent) → [`Attached`] (single
//! flight) → [`Turn`] (ledger step, decision, the writes it needs) → [`Action`] → sent here,
//! its outcome recorded by [`Dispatched`](super::dispatched::Dispatched).

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use tower_service::Service;
use tracing::Instrument;

use super::{
    BoxError, GuardError, GuardRequestBody, GuardResponseBody, ProbeOutcome,
    action::Action,
    answer,
    attached::Attached,
    config::Config,
    future::{Answer, answered},
    inflight::Inflight,
    intent::Intent,
    ledger_step::LedgerStep,
    listing::ListWatch,
    resume::Resume,
    route::Route,
    task_probe::TaskProbe,
    turn::Turn,
};

use crate::{
    observe::{self, Unread},
    protocol::RequestId,
};

/// One call through the guard, with its own clone of the inner service.
pub(super) struct Call<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
    pub(super) inflight: Arc<Inflight>,
}

impl<S, RB> Call<S>
where
    S: Service<Request<GuardRequestBody>, Response = Response<RB>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    pub(super) async fn run<B>(self, request: Request<B>) -> Answer<RB>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let started = std::time::Instant::now();
        let (mut parts, body) = request.into_parts();
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
        match Route::of(&self.config, &mut parts, &bytes).await? {
            Route::PassThrough => self.pass_through(parts, bytes).await,
            Route::Refused(response) => answered(response),
            Route::Resume {
                last_event_id,
                session_id,
            } => self.resume(parts, bytes, &last_event_id, session_id).await,
            Route::ListTools(id) => self.list_tools(parts, bytes, id).await,
            Route::ToolCall(intent) => {
                // Its own target: an application logs one line per call by enabling it.
                let span = tracing::info_span!(
                    target: "mcp_replay_guard::call",
                    "tools_call",
                    tool = %intent.call.name,
                    fingerprint = %intent.fingerprint.short(),
                    execution_id = tracing::field::Empty,
                    decision = tracing::field::Empty,
                    outcome = tracing::field::Empty,
                    status = tracing::field::Empty,
                );
                self.tool_call(parts, bytes, *intent, started)
                    .instrument(span)
                    .await
            }
        }
    }

    /// A guarded `tools/call`: single flight, then the turn's actions until one answers. The
    /// guard's own time, from `started` until the call is sent or answered without the
    /// target, is measured.
    async fn tool_call(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
        intent: Intent,
        started: std::time::Instant,
    ) -> Answer<RB> {
        let config = self.config.clone();
        let step = LedgerStep::new(&config, &intent);
        let tool = &intent.call.name;
        let owner = match Attached::of(step, &self.inflight).await? {
            Attached::Owner(owner) => owner,
            Attached::Reply(reply) => {
                crate::metrics::added(tool, started);
                return reply.into_answer();
            }
        };
        let mut turn = Turn::new(step, owner);
        let mut action = turn.next().await?;
        loop {
            action = match action {
                Action::Reply(reply) => {
                    crate::metrics::added(tool, started);
                    return reply.into_answer();
                }
                Action::AskTask { record, probe } => {
                    let outcome = self.ask_task(&parts, &intent, &probe).await;
                    turn.probed(record, outcome).await?
                }
                Action::Send { record, key } => {
                    let mut dispatched = turn.into_dispatched(record, key);
                    let (request, polled) = dispatched.request(&config, &intent, parts, bytes);
                    crate::metrics::added(tool, started);
                    return match self.send(request).await {
                        Ok(response) => dispatched.answered(step, &self.inflight, response).await,
                        Err(error) => dispatched.failed(step, &polled, error).await,
                    };
                }
            };
        }
    }

    /// A GET with `Last-Event-ID`: when it continues the broken stream of an execution, the
    /// answer it brings completes that execution.
    async fn resume(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
        last_event_id: &str,
        session_id: Option<String>,
    ) -> Answer<RB> {
        let resume = match Resume::take(
            &self.config,
            &self.inflight,
            &parts,
            last_event_id,
            session_id,
        ) {
            Ok(Some(resume)) => resume,
            Ok(None) => return self.pass_through(parts, bytes).await,
            Err(refused) => return answered(*refused),
        };
        let (body, _) = GuardRequestBody::new(bytes);
        match self.send(Request::from_parts(parts, body)).await {
            Ok(response) => resume.answered(&self.config, &self.inflight, response),
            Err(error) => Err(resume.failed(&self.inflight, error)),
        }
    }

    /// A `tools/list` to a trusted target: passed through, its answer watched on the way back.
    async fn list_tools(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
        id: RequestId,
    ) -> Answer<RB> {
        let target = self.config.target_of(&parts);
        let (body, _) = GuardRequestBody::new(bytes);
        let response = self
            .send(Request::from_parts(parts, body))
            .await
            .map_err(GuardError::inner)?;
        if !response.status().is_success() {
            return Ok(response.map(GuardResponseBody::passthrough));
        }
        let watch = ListWatch::new(
            response.headers(),
            id,
            target,
            self.config.annotations.clone(),
            self.config.max_body_bytes,
        );
        Ok(response.map(|body| GuardResponseBody::listed(body, watch)))
    }

    /// Asks the target about the MCP task a call became: `tasks/get` through the inner service.
    async fn ask_task(
        &mut self,
        parts: &http::request::Parts,
        intent: &Intent,
        probe: &TaskProbe,
    ) -> ProbeOutcome {
        let response = match self.send(probe.request(parts, intent)).await {
            Ok(response) if response.status().is_success() => response,
            Ok(response) => {
                return TaskProbe::unknown(format!(
                    "tasks/get answered HTTP {}",
                    response.status()
                ));
            }
            Err(error) => return TaskProbe::unknown(format!("tasks/get failed: {error}")),
        };
        let limit = self.config.max_body_bytes.max(intent.max_result_bytes);
        match Limited::new(response.into_body(), limit).collect().await {
            Ok(collected) => probe.outcome(&collected.to_bytes(), intent),
            Err(error) => TaskProbe::unknown(format!("tasks/get answer unreadable: {error}")),
        }
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
        // Ready right before the send: no slot below is held across ledger work.
        std::future::poll_fn(|cx| self.inner.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        self.inner.call(request).await.map_err(Into::into)
    }
}
