//! `ResponseFuture`: the future of a guarded call.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::Response;

use super::{GuardError, GuardResponseBody};

use crate::observe;

/// The future of [`Guard`](super::Guard). Boxed inside: the decision awaits the ledger several times, and a
/// hand-written state machine for it would hide the logic this crate exists for.
pub struct ResponseFuture<RB> {
    pub(super) inner: observe::BoxFuture<Answer<RB>>,
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

pub(super) type Answer<RB> = Result<Response<GuardResponseBody<RB>>, GuardError>;

pub(super) fn answered<RB>(response: Response<Bytes>) -> Answer<RB> {
    Ok(response.map(GuardResponseBody::answer))
}
