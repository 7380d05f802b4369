//! What a retry class allows after an unknown outcome: the one table the guard's
//! decision and `ReplayPolicy` both read.

use crate::execution::RetryClass;

/// What may follow an unknown outcome of a call of a given class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterUnknown {
    /// Read-only: re-send freely, no execution identity needed.
    ResendFreely,
    /// Idempotent: re-send, but only under the same execution ID and `Idempotency-Key`.
    ResendUnderKey,
    /// Recoverable: the contract's status probe decides.
    Probe,
    /// Irreversible (or unlisted): never re-send; held for review.
    Review,
}

impl AfterUnknown {
    /// What `class` allows.
    pub(crate) const fn of(class: RetryClass) -> Self {
        match class {
            RetryClass::ReadOnly => Self::ResendFreely,
            RetryClass::Idempotent => Self::ResendUnderKey,
            RetryClass::Recoverable => Self::Probe,
            RetryClass::Irreversible => Self::Review,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "Retry classes", row by row.
    #[test]
    fn the_retry_class_table() {
        let rows = [
            (RetryClass::ReadOnly, AfterUnknown::ResendFreely),
            (RetryClass::Idempotent, AfterUnknown::ResendUnderKey),
            (RetryClass::Recoverable, AfterUnknown::Probe),
            (RetryClass::Irreversible, AfterUnknown::Review),
        ];
        for (class, expected) in rows {
            assert_eq!(AfterUnknown::of(class), expected, "{class}");
        }
    }
}
