//! What an error chain from an HTTP client proves about the wire.

use std::error::Error as StdError;

/// Whether an error proves that nothing was sent: a connect error anywhere in its source
/// chain (hyper-util's [`is_connect`](hyper_util::client::legacy::Error::is_connect), or an
/// `io::Error` of kind `ConnectionRefused`). Anything else may have left after the bytes did.
pub(crate) fn nothing_was_sent(error: &(dyn StdError + 'static)) -> bool {
    std::iter::successors(Some(error), |&e| e.source()).any(nothing_was_sent_here)
}

/// Whether this one link of an error chain, its sources aside, proves that nothing was sent;
/// for a walk that weighs other errors on the way (a guard's own verdict) before going on.
pub(crate) fn nothing_was_sent_here(error: &(dyn StdError + 'static)) -> bool {
    if error.is::<NotWritten>() {
        return true;
    }
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        return io.kind() == std::io::ErrorKind::ConnectionRefused;
    }
    error
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .is_some_and(hyper_util::client::legacy::Error::is_connect)
}

/// A message transport's proof that not one byte of a message was written (its peer was gone
/// before the write began): what a connect error proves over HTTP.
#[derive(Debug, thiserror::Error)]
#[error("{0}; nothing was written")]
pub(crate) struct NotWritten(pub(crate) String);

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("wrapped")]
    struct Wrapped(#[source] io::Error);

    #[test]
    fn a_refused_connection_anywhere_in_the_chain_proves_nothing_was_sent() {
        let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
        assert!(nothing_was_sent(&refused()));
        assert!(nothing_was_sent(&Wrapped(refused())));
        assert!(!nothing_was_sent(&Wrapped(io::Error::from(
            io::ErrorKind::ConnectionReset
        ))));
        assert!(!nothing_was_sent(&io::Error::from(io::ErrorKind::TimedOut)));
    }
}
