//! The one outcome classifier of a `tools/call` attempt, in the manner of
//! `tower_http::classify`: a status the target answered with, a JSON-RPC error it answered
//! with, or an error the send failed with → what is known about the tool having run. The
//! guard (over HTTP and over a message transport), the server half and the rmcp adapter all
//! ask it.
//!
//! When in doubt the answer is `unknown`, never a made-up failure: a `failed` record frees the
//! intent (or the server half's key) for a second run, so it is given only to answers that
//! mean the server refused the call before the tool ran.

/// JSON-RPC error code of the server half: the first request with the `Idempotency-Key` is
/// still running (HTTP 409). Public as `integrations::server::KEY_IN_FLIGHT`.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) const KEY_IN_FLIGHT: i64 = -32082;
/// JSON-RPC error code of the server half: the first request with the `Idempotency-Key` may
/// have run but its answer was not kept (HTTP 409). Public as
/// `integrations::server::KEY_OUTCOME_UNKNOWN`.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) const KEY_OUTCOME_UNKNOWN: i64 = -32083;

/// The JSON-RPC error codes that prove a `tools/call` was refused before its tool ran, and
/// why. Every one is an answer about the request itself, given before any tool is looked up
/// or run; MCP answers an unknown tool and invalid arguments with `-32602`.
const REFUSED_BEFORE_RUNNING: [(i64, &str); 4] = [
    (-32700, "parse error: the server could not read the request"),
    (-32600, "invalid request: not a request the server accepts"),
    (-32601, "method not found: the server has no tools/call"),
    (
        -32602,
        "invalid params: an unknown tool or arguments the tool refuses",
    ),
];

/// Whether a JSON-RPC error answering a `tools/call` leaves open that the tool ran.
///
/// Only the codes of [`REFUSED_BEFORE_RUNNING`] prove it did not (they are `failed`). Every
/// other code may come after the effect: `-32603` (an exception after the commit, rmcp's
/// `ErrorData::internal_error`), the implementation-defined `-32000..=-32099` (a gateway's
/// error after forwarding; the server half's "the first request may have run"), and any code
/// a server invents. A tool's own failure is not a JSON-RPC error at all: it is a result with
/// `isError: true`, an answer like any other. Over HTTP a refusing status says so already;
/// over a transport without statuses (stdio) only the code does.
pub(crate) fn error_may_have_run(code: i64) -> bool {
    !REFUSED_BEFORE_RUNNING
        .iter()
        .any(|(refused, _)| *refused == code)
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
/// Refused before running: 400 (unreadable), 401 and 403 (not allowed), 404 (no
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

    /// Every status from 100 to 599. The refusing statuses are refused before running, 2xx is
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

    /// One row per code: only the four that prove the request was refused before any tool
    /// ran are refusals. Every other code answering a `tools/call` used to be `failed`, which
    /// freed the intent: a tool that made its effect and then answered `-32603` ran again on
    /// the repeat.
    #[test]
    fn only_a_json_rpc_error_that_proves_the_tool_did_not_run_is_a_refusal() {
        let rows: [(i64, bool); 27] = [
            (-32700, false), // parse error
            (-32600, false), // invalid request
            (-32601, false), // method not found
            (-32602, false), // invalid params: MCP's unknown tool and bad arguments
            (-32603, true),  // internal error: perhaps after the effect
            (-32000, true),  // implementation-defined server errors, first of the range
            (-32001, true),  // a common "request timed out"
            (-32020, true),  // 2026-07-28 header mismatch (HTTP says 400 on its own)
            (-32021, true),  // 2026-07-28 missing client capability, perhaps mid-run
            (-32022, true),  // 2026-07-28 unsupported protocol version (HTTP 400)
            (-32042, true),  // URL elicitation required, perhaps mid-run
            (-32081, true),  // the server half's key reused (HTTP 422)
            (KEY_IN_FLIGHT, true),
            (KEY_OUTCOME_UNKNOWN, true),
            (-32084, true), // the server half's key not recorded (HTTP 503)
            (-32099, true), // last of the range
            (-32100, true), // reserved, undefined
            (-32768, true), // reserved, undefined
            (-32769, true),
            (-32699, true),
            (-1, true),
            (0, true),
            (1, true),
            (32603, true),
            (400, true),
            (i64::MIN, true),
            (i64::MAX, true),
        ];
        for (code, may_have_run) in rows {
            assert_eq!(
                error_may_have_run(code),
                may_have_run,
                "JSON-RPC error {code}"
            );
        }
        let refusals: Vec<i64> = (-33_000..=33_000)
            .filter(|code| !error_may_have_run(*code))
            .collect();
        assert_eq!(refusals, [-32700, -32602, -32601, -32600]);
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
