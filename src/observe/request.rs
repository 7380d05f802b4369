//! The buffered request body, with its proof of whether the bytes left.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::BoxError;

/// Request bytes the layer read whole (to classify and fingerprint them), handed on as a body.
///
/// It tells whether the transport ever read it ([`Polled`]): a body never polled proves that
/// the request was not sent.
#[derive(Debug)]
pub(crate) struct BufferedBody {
    data: Option<Bytes>,
    polled: Polled,
}

/// Whether a [`BufferedBody`] was ever polled: once it was, its bytes may have left.
#[derive(Debug, Clone, Default)]
pub(crate) struct Polled(Arc<AtomicBool>);

impl Polled {
    /// Whether the transport read the body (so the request may have been sent).
    pub(crate) fn was_polled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl BufferedBody {
    /// The body over `data`, and its proof of polling.
    pub(crate) fn new(data: Bytes) -> (Self, Polled) {
        let polled = Polled::default();
        let body = Self {
            // An empty body has no frame to give.
            data: Some(data).filter(|d| !d.is_empty()),
            polled: polled.clone(),
        };
        (body, polled)
    }
}

impl Body for BufferedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.polled.0.store(true, Ordering::Release);
        Poll::Ready(self.data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// Why a request body could not be read whole.
#[derive(Debug)]
pub(crate) enum Unread {
    /// It is larger than the layer keeps.
    TooLarge,
    /// Reading it failed.
    Failed(BoxError),
}

/// Reads a request body whole, up to `max` bytes: what both layers do before they classify.
pub(crate) async fn collect<B>(body: B, max: usize) -> Result<Bytes, Unread>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(Unread::TooLarge),
        Err(error) => Err(Unread::Failed(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_never_polled_proves_nothing_left() {
        let (body, polled) = BufferedBody::new(Bytes::from_static(b"{}"));
        assert!(!polled.was_polled());
        assert_eq!(body.size_hint().exact(), Some(2));
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"{}");
        assert!(polled.was_polled());
    }

    #[test]
    fn an_empty_body_ends_at_once() {
        let (body, _) = BufferedBody::new(Bytes::new());
        assert!(body.is_end_stream());
    }

    #[tokio::test]
    async fn collect_tells_too_large_from_failed() {
        let big = http_body_util::Full::new(Bytes::from_static(b"0123456789"));
        assert!(matches!(collect(big, 4).await, Err(Unread::TooLarge)));
        let small = http_body_util::Full::new(Bytes::from_static(b"0123"));
        assert_eq!(&collect(small, 4).await.unwrap()[..], b"0123");
    }
}
