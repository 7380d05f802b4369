//! The one outcome classifier of a `tools/call` attempt, in the manner of
//! `tower_http::classify`: a status the target answered with, or an error the send failed with,
//! → what is known about the tool having run (DESIGN §3). The guard, the server half and the
//! rmcp adapter all ask it.
//!
//! When in doubt the answer is `unknown`, never a made-up failure: a `failed` record frees the
//! intent (or the server half's key) for a second run, so it is given only to statuses that
//! mean the server refused the call before the tool ran.

/// JSON-RPC error code of the server half: the first request with the `Idempotency-Key` is
/// still running (HTTP 409). Public as `integrations::server::KEY_IN_FLIGHT`.
pub(crate) const KEY_IN_FLIGHT: i64 = -32082;
/// JSON-RPC error code of the server half: the first request with the `Idempotency-Key` may
/// have run but its answer was not kept (HTTP 409). Public as
/// `integrations::server::KEY_OUTCOME_UNKNOWN`.
pub(crate) const KEY_OUTCOME_UNKNOWN: i64 = -32083;

/// Whether a JSON-RPC error answering a `tools/call` leaves open that the tool ran. Any other
/// JSON-RPC error is a refusal (an unknown tool, bad params: MCP reports a tool's own failure
/// in its result), and so is `failed`. Over HTTP the server half's 409 says so already; over a
/// transport without statuses (stdio) only the code does.
pub(crate) fn error_may_have_run(code: i64) -> bool {
    matches!(code, KEY_IN_FLIGHT | KEY_OUTCOME_UNKNOWN)
}

/// What the status of a `tools/call` answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusClass {
    /// 2xx: the outcome is in the body (a JSON-RPC response); observe it.
    Answered,
    /// The server refused the call before running the tool: `failed`, not applied.
    RefusedBeforeRunning,
    /// The tool may have run: `unknown`.
    Unknown,
}

/// Classifies the HTTP status of an answer to a `tools/call`.
///
/// Refused before running (DESIGN §3): 400 (unreadable), 401 and 403 (not allowed), 404 (no
/// such session or endpoint), 405, 406 and 415 (method, `Accept`, content type), 422
/// (unprocessable, or a key reused for another call), 429 (rate limited). Every other status
/// leaves the outcome unknown, among them:
///
/// - 408: the server, or a gateway in front of it, gave up on the request; a gateway may
///   have forwarded it whole first.
/// - 409: the server half answers it while the first request with the same key still runs:
///   the tool is running.
/// - 410: something is gone, perhaps because the call already ran (a delete).
/// - 5xx: the server failed somewhere, perhaps after the tool ran.
pub(crate) fn classify_status(status: u16) -> StatusClass {
    match status {
        200..=299 => StatusClass::Answered,
        400 | 401 | 403 | 404 | 405 | 406 | 415 | 422 | 429 => StatusClass::RefusedBeforeRunning,
        _ => StatusClass::Unknown,
    }
}

/// Whether the status of an answer to a `tools/call` means it was refused before running.
pub(crate) fn refused_before_running(status: u16) -> bool {
    classify_status(status) == StatusClass::RefusedBeforeRunning
}

/// What a failed send says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// Provably nothing left the process: `not_sent`, and it may be sent again.
    NotSent,
    /// The request may have left: `unknown`.
    Unknown,
}

/// Classifies a send error. `body_polled`: the transport read the request body (before that,
/// no byte of it left). `proves_nothing_sent`: the error's source chain proves nothing was
/// sent (a connect error, a refused connection), as the protocol's error walk reads it.
pub(crate) fn classify_error(body_polled: bool, proves_nothing_sent: bool) -> ErrorClass {
    if body_polled && !proves_nothing_sent {
        ErrorClass::Unknown
    } else {
        ErrorClass::NotSent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every status from 100 to 599. The list of DESIGN §3 is refused before running, 2xx is
    /// answered, everything else is unknown. The server half used to call every 4xx refused
    /// (so 408, 409, 410 and the other unlisted 4xx freed the key for a second run) while the
    /// guard called them unknown.
    #[test]
    fn every_status_is_classified_as_design_says() {
        const REFUSED: [u16; 9] = [400, 401, 403, 404, 405, 406, 415, 422, 429];
        for status in 100..=599 {
            let expected = if (200..300).contains(&status) {
                StatusClass::Answered
            } else if REFUSED.contains(&status) {
                StatusClass::RefusedBeforeRunning
            } else {
                StatusClass::Unknown
            };
            assert_eq!(classify_status(status), expected, "HTTP {status}");
            assert_eq!(
                refused_before_running(status),
                expected == StatusClass::RefusedBeforeRunning,
                "HTTP {status}"
            );
        }
    }

    /// The statuses the two halves disagreed on: the tool may have run.
    #[test]
    fn timeout_conflict_and_gone_leave_the_outcome_unknown() {
        for status in [408, 409, 410, 413, 500, 502, 503, 504] {
            assert_eq!(
                classify_status(status),
                StatusClass::Unknown,
                "HTTP {status}"
            );
        }
    }

    #[test]
    fn a_send_error_is_not_sent_only_with_proof() {
        // (body polled, the chain proves nothing was sent, class)
        let rows = [
            (false, false, ErrorClass::NotSent),
            (false, true, ErrorClass::NotSent),
            (true, true, ErrorClass::NotSent),
            (true, false, ErrorClass::Unknown),
        ];
        for (polled, proof, expected) in rows {
            assert_eq!(
                classify_error(polled, proof),
                expected,
                "polled {polled}, proof {proof}"
            );
        }
    }
}
