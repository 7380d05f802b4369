//! Trusted annotations: what a trusted target's `tools/list` answer says of its tools, read as
//! the answer passes to the caller and kept (bounded) for the resolution of that target's tools
//! without a contract. An untrusted target's list is never read.

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{
    BoxError, GuardError, GuardRequestBody, GuardResponseBody, call::Call, future::Answer,
    intent::request_target, layer::Config,
};

use crate::{
    Target,
    contract::AnnotationCache,
    protocol::{
        RequestId, ToolAnnotations,
        response::{Examined, ResponseScanner},
        tools_list::listed_annotations,
    },
};

impl Config {
    /// The annotations `target` published for `tool`, if the registry trusts `target` and its
    /// list passed through this guard.
    pub(super) fn annotations_of(&self, target: &Target, tool: &str) -> Option<ToolAnnotations> {
        if !self.contracts.trusts(target) {
            return None;
        }
        self.annotations.get(target, tool)
    }

    /// Whether a `tools/list` request is worth watching: its target is trusted.
    pub(super) fn watches_list_of(&self, parts: &http::request::Parts) -> bool {
        self.contracts
            .trusts(&request_target(parts, self.target.as_ref()))
    }
}

/// Reads a `tools/list` answer as it streams (JSON or SSE) and records the tools' annotations
/// once the response to the request is seen.
#[derive(Debug)]
pub(super) struct ListWatch {
    scanner: ResponseScanner,
    id: RequestId,
    target: Target,
    cache: AnnotationCache,
    done: bool,
}

impl ListWatch {
    fn new(
        headers: &HeaderMap,
        id: RequestId,
        target: Target,
        cache: AnnotationCache,
        max: usize,
    ) -> Self {
        Self {
            scanner: ResponseScanner::new(ResponseScanner::is_sse(headers), max),
            id,
            target,
            cache,
            done: false,
        }
    }

    /// Feeds a data frame of the answer.
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        if self.done {
            return;
        }
        let Self {
            scanner,
            id,
            target,
            cache,
            done,
        } = self;
        scanner.feed(chunk, |message| {
            if let Some(listed) = listed_annotations(message, id) {
                cache.record(target, listed);
                *done = true;
            }
            Examined::Unread
        });
    }

    /// The answer ended: a JSON body is complete now.
    pub(super) fn end(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        if let Some(listed) = self
            .scanner
            .json_body()
            .and_then(|body| listed_annotations(body, &self.id))
        {
            self.cache.record(&self.target, listed);
        }
    }

    /// Whether the annotations were recorded (or the answer ended without them).
    pub(super) fn is_done(&self) -> bool {
        self.done
    }
}

impl<S, RB> Call<S>
where
    S: Service<Request<GuardRequestBody>, Response = Response<RB>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    /// A `tools/list` to a trusted target: passed through, its answer watched on the way back.
    pub(super) async fn list_tools(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
        id: RequestId,
    ) -> Answer<RB> {
        let target = request_target(&parts, self.config.target.as_ref());
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
}
