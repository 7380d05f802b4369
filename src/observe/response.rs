//! The boxed future both layers return.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

/// A call's future, boxed: a guarded call awaits the ledger several times, and a hand-written
/// state machine for it would hide the decision this crate exists for.
pub(crate) struct BoxFuture<T>(Pin<Box<dyn Future<Output = T> + Send>>);

impl<T> BoxFuture<T> {
    /// Boxes `future`.
    pub(crate) fn new(future: impl Future<Output = T> + Send + 'static) -> Self {
        Self(Box::pin(future))
    }
}

impl<T> std::fmt::Debug for BoxFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<T> Future for BoxFuture<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.0.as_mut().poll(cx)
    }
}
