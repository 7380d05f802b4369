//! `Action`: what one decided call does next; the call carries it out.

use super::{reply::Reply, task_probe::TaskProbe};

use crate::{IdempotencyKey, execution::ExecutionRecord};

/// What a call does once its turn decided: answer, send the attempt recorded `dispatched`, or
/// ask the target about the MCP task the call became (the answer goes back to the turn).
pub(super) enum Action {
    Reply(Reply),
    Send {
        record: ExecutionRecord,
        key: IdempotencyKey,
    },
    AskTask {
        record: ExecutionRecord,
        probe: TaskProbe,
    },
}
