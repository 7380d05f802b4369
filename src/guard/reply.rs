//! `Reply`: an answer the guard writes itself, not generic over the target's body.

use bytes::Bytes;
use http::Response;

use super::{Delivery, GuardResponseBody, future::Answer};

/// What the guard answers a caller with, when the answer is not the target's.
pub(super) enum Reply {
    /// An answer of the guard's own (an error, an uncertain result, a denial).
    Written(Response<Bytes>),
    /// A finished execution's kept result: delivered once the caller reads it to its end.
    Kept(Response<Bytes>, Delivery),
}

impl Reply {
    /// The reply as the guard's response.
    pub(super) fn into_answer<RB>(self) -> Answer<RB> {
        Ok(match self {
            Reply::Written(response) => response.map(GuardResponseBody::answer),
            Reply::Kept(response, delivery) => {
                response.map(|data| GuardResponseBody::kept(data, delivery))
            }
        })
    }
}

impl From<Response<Bytes>> for Reply {
    fn from(response: Response<Bytes>) -> Self {
        Reply::Written(response)
    }
}
