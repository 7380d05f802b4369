//! A response stream as rmcp's `Sse` items, and the resume points it refuses.

use std::{
    collections::VecDeque,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, Bytes};
use futures_core::{Stream, stream::BoxStream};
use http_body::Body;
use http_body_util::{BodyExt, combinators::UnsyncBoxBody};
use rmcp::transport::streamable_http_client::SseError;
use sse_stream::Sse;

use crate::{
    BoxError, Target,
    protocol::{
        ResumeKey,
        sse::{SseEvent, SseParser},
    },
};

use super::{REFUSED_RESUMES, error::TowerClientError};

/// The stream positions (target, session, the last event id rmcp saw) whose resumption is
/// refused.
#[derive(Debug, Default)]
pub(super) struct RefusedResumes(Mutex<VecDeque<ResumeKey>>);

/// Where a response stream comes from, to refuse its resumption after an oversized event.
pub(super) struct StreamKey {
    pub(super) uri: Arc<str>,
    pub(super) session_id: Option<Arc<str>>,
    pub(super) refused: Arc<RefusedResumes>,
}

impl StreamKey {
    pub(super) fn refuse(&self, last_event_id: String) {
        let mut refused = self
            .refused
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if refused.len() == REFUSED_RESUMES {
            refused.pop_front();
        }
        refused.push_back(self.resume_key(last_event_id));
    }

    /// The stream at `last_event_id`; the target is the URI rmcp was given, unchanged.
    fn resume_key(&self, last_event_id: impl Into<String>) -> ResumeKey {
        let session_id = self.session_id.as_deref().map(str::to_owned);
        ResumeKey::new(Target::new(&*self.uri), session_id, last_event_id)
    }

    pub(super) fn take_refused(&self, last_event_id: &str) -> bool {
        let mut refused = self
            .refused
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = self.resume_key(last_event_id);
        let found = refused.iter().position(|point| *point == key);
        found.and_then(|i| refused.remove(i)).is_some()
    }
}

/// A `text/event-stream` body as the [`Sse`] stream rmcp expects, bounded per event. Dropped
/// after rmcp took a request's response, it reads the rest of the body in the background (see
/// `# When the rest of a response stream is read` in the module docs).
pub(super) struct SseBody {
    body: Option<UnsyncBoxBody<Bytes, BoxError>>,
    parser: SseParser,
    ready: VecDeque<Sse>,
    failed: Option<SseError>,
    /// The last id and retry this stream handed to rmcp.
    announced_id: Option<String>,
    announced_retry: Option<Duration>,
    /// The id rmcp would resume from: the last one announced, else the one this `GET` resumed.
    resume_point: Option<String>,
    key: StreamKey,
    /// This stream carries one request's response (it is not a `GET` listen stream).
    carries_response: bool,
    /// A JSON-RPC response was handed to rmcp; then rmcp asked for the next item.
    response_yielded: bool,
    response_taken: bool,
}

/// How long a request's stream is read on, in the background, once rmcp took the response.
pub(super) const FINISH_AFTER_RESPONSE: Duration = Duration::from_secs(5);

impl SseBody {
    pub(super) fn new<B>(
        body: B,
        max_event_size: usize,
        key: StreamKey,
        last_event_id: Option<String>,
        carries_response: bool,
    ) -> Self
    where
        B: Body + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let body = body
            .map_frame(|frame| frame.map_data(|mut data| data.copy_to_bytes(data.remaining())))
            .map_err(Into::into);
        Self {
            body: Some(UnsyncBoxBody::new(body)),
            parser: SseParser::with_max_event_size(max_event_size),
            ready: VecDeque::new(),
            failed: None,
            announced_id: None,
            announced_retry: None,
            resume_point: last_event_id,
            key,
            carries_response,
            response_yielded: false,
            response_taken: false,
        }
    }

    pub(super) fn boxed(self) -> BoxStream<'static, Result<Sse, SseError>> {
        Box::pin(self)
    }

    pub(super) fn push(&mut self, chunk: &[u8]) {
        let Self {
            parser,
            ready,
            announced_id,
            announced_retry,
            ..
        } = self;
        let result = parser.push(chunk, |event| {
            if event.id.is_some() {
                announced_id.clone_from(&event.id);
            }
            if event.retry.is_some() {
                *announced_retry = event.retry;
            }
            ready.push_back(to_sse(event));
        });
        // A block without data is not an event, but its id and retry are: rmcp resumes from
        // the id (rmcp's own parser passes such blocks on as events without data).
        let id = parser.reconnect_id();
        let id_changed = announced_id.as_deref().unwrap_or_default() != id;
        let retry_changed = parser.retry() != *announced_retry;
        if id_changed || retry_changed {
            let mut sse = Sse::default();
            if id_changed {
                *announced_id = Some(id.to_owned());
                sse.id = Some(id.to_owned());
            }
            if retry_changed {
                *announced_retry = parser.retry();
                sse.retry = parser.retry().map(millis);
            }
            ready.push_back(sse);
        }
        if announced_id.is_some() {
            self.resume_point.clone_from(announced_id);
        }
        if let Err(error) = result {
            let limit = self.parser.max_event_size();
            self.body = None;
            if let Some(id) = self.resume_point.clone() {
                self.key.refuse(id);
            }
            let error = TowerClientError::event_too_large(limit, error);
            self.failed = Some(SseError::Body(Box::new(error)));
        }
    }
}

pub(super) fn to_sse(event: SseEvent) -> Sse {
    Sse {
        event: Some(event.event).filter(|e| e != "message"),
        data: Some(event.data),
        id: event.id,
        retry: event.retry.map(millis),
    }
}

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Whether an event's data is a JSON-RPC response or error (not a request or notification).
pub(super) fn is_response(data: &str) -> bool {
    crate::protocol::response::is_response(data.as_bytes())
}

impl Stream for SseBody {
    type Item = Result<Sse, SseError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.response_taken |= this.response_yielded;
        loop {
            if let Some(sse) = this.ready.pop_front() {
                if this.carries_response && !this.response_yielded {
                    this.response_yielded = sse.data.as_deref().is_some_and(is_response);
                }
                return Poll::Ready(Some(Ok(sse)));
            }
            if let Some(error) = this.failed.take() {
                return Poll::Ready(Some(Err(error)));
            }
            let Some(body) = this.body.as_mut() else {
                return Poll::Ready(None);
            };
            match std::task::ready!(Pin::new(body).poll_frame(cx)) {
                None => this.body = None,
                Some(Err(error)) => {
                    this.body = None;
                    let error = TowerClientError::body(error);
                    return Poll::Ready(Some(Err(SseError::Body(Box::new(error)))));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        this.push(&data);
                    }
                }
            }
        }
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        if !self.response_taken {
            return;
        }
        let (Some(mut body), Ok(runtime)) =
            (self.body.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        drop(runtime.spawn(async move {
            let rest = async { while let Some(Ok(_)) = body.frame().await {} };
            let _ = tokio::time::timeout(FINISH_AFTER_RESPONSE, rest).await;
        }));
    }
}
