//! Observation of a dispatched call, shared by the guard and the server half: the buffered
//! request body with its proof that the bytes left ([`request`]), the outcome recorder that
//! records `unknown` when it is dropped unrecorded ([`recorder`]), the observed response body
//! that holds the answer until it is recorded ([`body`]), and the bounded wait for a ledger
//! change ([`wait`]).
//!
//! Nothing here decides: it records what happened to a call the caller's layer chose to send.

mod body;
mod probe;
mod recorder;
mod request;
mod response;
mod wait;

pub(crate) use body::Observed;
pub(crate) use recorder::{Recorder, Settlement, Watchers, Write, write_from_drop};
#[cfg(feature = "server")]
pub(crate) use recorder::{spawn_finishing, written};
pub(crate) use request::{BufferedBody, Polled, Unread, collect};
pub(crate) use response::BoxFuture;
pub(crate) use wait::until_changed;
