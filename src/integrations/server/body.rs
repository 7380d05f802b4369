//! Request and response bodies of the server-side Idempotency-Key layer.

use std::{
    fmt,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::observe::{BufferedBody, Observed, Recorder};

pin_project! {
    /// The body the layer hands to the inner service: the caller's body untouched, or the bytes
    /// the layer read to classify a keyed POST.
    pub struct IdempotencyRequestBody<B> {
        #[pin]
        kind: RequestKind<B>,
    }
}

pin_project! {
    #[project = RequestKindProj]
    enum RequestKind<B> {
        Passthrough { #[pin] inner: B },
        Buffered { #[pin] inner: BufferedBody },
    }
}

impl<B> IdempotencyRequestBody<B> {
    pub(super) fn passthrough(inner: B) -> Self {
        Self {
            kind: RequestKind::Passthrough { inner },
        }
    }

    pub(super) fn buffered(data: Bytes) -> Self {
        Self {
            kind: RequestKind::Buffered {
                inner: BufferedBody::new(data).0,
            },
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for IdempotencyRequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            RequestKind::Passthrough { inner } => {
                f.debug_tuple("Passthrough").field(inner).finish()
            }
            RequestKind::Buffered { inner } => f.debug_tuple("Buffered").field(inner).finish(),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for IdempotencyRequestBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            RequestKindProj::Passthrough { inner } => inner.poll_frame(cx),
            RequestKindProj::Buffered { inner } => {
                inner.poll_frame(cx).map_err(|never| match never {})
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Passthrough { inner } => inner.is_end_stream(),
            RequestKind::Buffered { inner } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Passthrough { inner } => inner.size_hint(),
            RequestKind::Buffered { inner } => inner.size_hint(),
        }
    }
}

pin_project! {
    /// The response body of the layer: the inner service's body (watched for the final JSON-RPC
    /// response of a keyed call, which is recorded before the frame carrying it is handed on),
    /// or an answer the layer wrote itself (a replay, a 409, a 422).
    pub struct IdempotencyResponseBody<B: Body> {
        #[pin]
        kind: ResponseKind<B>,
    }
}

pin_project! {
    #[project = ResponseKindProj]
    enum ResponseKind<B: Body> {
        Passthrough { #[pin] inner: B },
        Observed { watch: Observed<B, B::Error> },
        Answer { data: Option<Bytes> },
    }
}

impl<B: Body> IdempotencyResponseBody<B> {
    pub(super) fn passthrough(inner: B) -> Self {
        Self {
            kind: ResponseKind::Passthrough { inner },
        }
    }

    pub(super) fn answer(data: Bytes) -> Self {
        Self {
            kind: ResponseKind::Answer { data: Some(data) },
        }
    }

    pub(super) fn observed(inner: B, sse: bool, recorder: Recorder) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Send,
    {
        let max = recorder.max_result_bytes;
        let describe = |_: &B::Error| String::from("the response body failed");
        let watch = Observed::new(inner, recorder, sse, max, describe, None);
        Self {
            kind: ResponseKind::Observed { watch },
        }
    }
}

impl<B: Body + fmt::Debug> fmt::Debug for IdempotencyResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ResponseKind::Passthrough { inner } => {
                f.debug_tuple("Passthrough").field(inner).finish()
            }
            ResponseKind::Observed { .. } => f.write_str("Observed"),
            ResponseKind::Answer { data } => f.debug_tuple("Answer").field(data).finish(),
        }
    }
}

impl<B> Body for IdempotencyResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            ResponseKindProj::Passthrough { inner } => inner.poll_frame(cx),
            ResponseKindProj::Observed { watch } => watch.poll_next(cx),
            ResponseKindProj::Answer { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(d))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::Passthrough { inner } => inner.is_end_stream(),
            ResponseKind::Observed { watch } => watch.is_end_stream(),
            ResponseKind::Answer { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Passthrough { inner } => inner.size_hint(),
            ResponseKind::Observed { watch } => watch.size_hint(),
            ResponseKind::Answer { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
