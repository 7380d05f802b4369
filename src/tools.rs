//! For tools built on the crate: what the `replay-guard` command (a proxy, a one-shot call)
//! uses to speak for a guard it fronts. A library user who stacks the layers needs none of it.
//!
//! - [`jsonrpc_error`] and [`refused_request`]: the JSON-RPC answers the guard writes when it
//!   sends nothing, for a front end that refuses a request before the guard sees it.
//! - [`redact_url`]: a URL as it may be shown (no user info, no query values).
//! - [`INEXACT_NUMBER`] and [`has_inexact_number`]: arguments that cannot be fingerprinted
//!   exactly, refused unsent with that reason.
//! - [`task_outcome`]: what the answer to a `tasks/get` says of the call that became the task,
//!   read as the guard reads its own probe's.
//! - [`sse`]: the bounded, incremental Server-Sent Events parser the guard reads streams with.

pub use crate::answer::{jsonrpc_error, refused_request};
pub use crate::guard::redact::redact_url;
pub use crate::guard::task_probe::task_outcome;
pub use crate::protocol::numbers::{INEXACT_NUMBER, has_inexact_number};

/// The bounded, incremental Server-Sent Events parser the guard reads streams with.
pub mod sse {
    pub use crate::protocol::sse::{DEFAULT_MAX_EVENT_SIZE, SseError, SseEvent, SseParser};
}
