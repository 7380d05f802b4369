//! `POST /executions/act_…/resolve`: an operator settles an execution, as `replay-guard
//! resolve` does, through the library's own `guard::resolve` (which refuses an execution
//! whose owner is alive and may still be running it).
//!
//! # What is checked, in order; the first that fails refuses, and nothing is written
//!
//! 1. The page was given a token at start-up (else it is read-only): `403`.
//! 2. The form came from the page itself: `403` otherwise. A browser says where a POST comes
//!    from. `Sec-Fetch-Site` (every current browser sends it) must be `same-origin`; it is
//!    the one to trust, because the page's own form carries `Origin: null` (every answer says
//!    `Referrer-Policy: no-referrer`, and a browser then hides the origin of a form it
//!    posts). Without it (an older browser), `Origin` must be one of the page's own
//!    (`--allowed-origin`, or its loopback origins). A client that sends neither is no
//!    browser: nothing of an operator's rides along with it, and the token decides.
//! 3. The body is a form, at most [`MAX_BODY`] bytes, sent within [`BODY_TIMEOUT`]: `415`,
//!    `413`, `408`.
//! 4. The token typed into the form is the page's (compared in constant time): `403`. The
//!    token is the defence against a forged form too: the page has no cookie or session, so a
//!    page elsewhere that posts to it has nothing an operator's browser adds by itself, and
//!    cannot know the token.
//! 5. The outcome, a note and the operator's name are there: `400`.
//! 6. The ledger settles it: `409` when it refuses (an owner still running the call, an
//!    execution already settled), with its message.
//!
//! A refusal shows the execution's page again, the message on top and the form as it was
//! typed (never the token). A resolution answers `303` to the execution's page, which shows it.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode, header};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use mcp_replay_guard::{ExecutionId, guard::resolve, ledger::LedgerError};

use super::{
    answer::{self, Answer},
    execution,
    form::ResolveForm,
    site::{Site, said},
};
use crate::{LOCK_TIMEOUT, mcp_http::BoxError};

/// The largest form taken: a note of [`MAX_NOTE`](super::form::MAX_NOTE) characters, each
/// percent-encoded, and the rest.
pub(super) const MAX_BODY: usize = 64 * 1024;

/// How long a form's body may take to arrive.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// A refused form: the status, what to say, and the form as it was typed (without the token).
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) status: StatusCode,
    pub(super) message: String,
    pub(super) form: ResolveForm,
}

/// The answer to a posted resolve form of execution `id`.
pub(super) async fn post<B>(site: &Site, id: ExecutionId, request: Request<B>) -> Answer
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match settle(site, id, request).await {
        Ok(()) => answer::see_other(&format!("/executions/{id}")),
        Err(refusal) => execution::page(site, id, Some(refusal)).await,
    }
}

/// Checks the form (see the module docs) and settles execution `id`.
async fn settle<B>(site: &Site, id: ExecutionId, request: Request<B>) -> Result<(), Refusal>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let refuse = |status, message: &str| Refusal {
        status,
        message: message.to_owned(),
        form: ResolveForm::default(),
    };
    let Some(token) = &site.token else {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "This page is read-only: it was started without a token (--token-file or \
             REPLAY_GUARD_REVIEW_TOKEN), so it resolves nothing. Nothing was written.",
        ));
    };
    if let Some(elsewhere) = elsewhere(site, request.headers()) {
        return Err(refuse(
            StatusCode::FORBIDDEN,
            &format!(
                "The form was not sent from this page ({elsewhere}): only the page's own form \
                 resolves. Nothing was written."
            ),
        ));
    }
    let form = read_form(request)
        .await
        .map_err(|(status, message)| refuse(status, &message))?;
    if !token.matches(&form.token) {
        return Err(Refusal {
            status: StatusCode::FORBIDDEN,
            message: "The token is missing or wrong: nothing was written. Type the token this \
                      page was started with."
                .to_owned(),
            form: form.without_token(),
        });
    }
    let form = form.without_token();
    if let Some(problem) = form.problem() {
        return Err(Refusal {
            status: StatusCode::BAD_REQUEST,
            message: format!("{problem} Nothing was written."),
            form,
        });
    }
    let applied = form.applied == Some(true);
    let by = format!("operator:{}", form.operator.trim());
    let opened = match site.location.open_to_settle(LOCK_TIMEOUT, &site.key).await {
        Ok(opened) => opened,
        Err(error) => {
            return Err(Refusal {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: format!(
                    "Cannot open the ledger {} to write: {error:#}",
                    site.location
                ),
                form,
            });
        }
    };
    match resolve(&*opened.ledger(), id, applied, &by, form.note.trim()).await {
        Ok(record) => {
            tracing::info!(
                execution = %id,
                state = record.state_label(),
                by = %by,
                "resolved from the review page"
            );
            Ok(())
        }
        Err(error) => Err(Refusal {
            status: match &error {
                LedgerError::NotFound(_) => StatusCode::NOT_FOUND,
                error if error.is_still_running() || error.is_invalid_transition() => {
                    StatusCode::CONFLICT
                }
                _ => StatusCode::SERVICE_UNAVAILABLE,
            },
            message: format!("The ledger refused it, and nothing was written: {error}."),
            form,
        }),
    }
}

/// Where the request says it came from, when that is not the page itself (see the module
/// docs, step 2).
fn elsewhere(site: &Site, headers: &HeaderMap) -> Option<String> {
    match headers.get("sec-fetch-site") {
        Some(fetch) if fetch.as_bytes() == b"same-origin" => None,
        Some(fetch) => Some(format!(
            "Sec-Fetch-Site: {}",
            String::from_utf8_lossy(fetch.as_bytes())
                .chars()
                .take(32)
                .collect::<String>()
        )),
        None => site
            .origins
            .check_origin(headers)
            .err()
            .map(|foreign| said(&foreign)),
    }
}

/// The form in `request`'s body: bounded in size and time.
async fn read_form<B>(request: Request<B>) -> Result<ResolveForm, (StatusCode, String)>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let is_form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| {
            media
                .trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if !is_form {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "The form must be sent as application/x-www-form-urlencoded. Nothing was written."
                .to_owned(),
        ));
    }
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("The form is larger than {MAX_BODY} bytes. Nothing was written."),
        )
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY as u64) {
        return Err(too_large());
    }
    let body = Limited::new(request.into_body(), MAX_BODY);
    match tokio::time::timeout(BODY_TIMEOUT, body.collect()).await {
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            "The form did not arrive in time. Nothing was written.".to_owned(),
        )),
        Ok(Err(error)) if error.is::<LengthLimitError>() => Err(too_large()),
        Ok(Err(error)) => Err((
            StatusCode::BAD_REQUEST,
            format!("The form could not be read ({error}). Nothing was written."),
        )),
        Ok(Ok(collected)) => Ok(ResolveForm::parse(&collected.to_bytes())),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::HeaderValue;
    use mcp_replay_guard::ledger::MemoryLedger;

    use super::*;
    use crate::{
        ledger_location::{KeyOptions, LedgerLocation},
        proxy::origins::Origins,
    };

    #[test]
    fn sec_fetch_site_decides_and_origin_only_without_it() {
        let site = Site {
            ledger: Arc::new(MemoryLedger::new()),
            location: LedgerLocation::File("review.jsonl".into()),
            key: KeyOptions { key_file: None },
            token: None,
            origins: Origins::new("127.0.0.1:8080".parse().unwrap(), "http", &[], &[]),
        };
        let from = |headers: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.insert(*name, HeaderValue::from_static(value));
            }
            elsewhere(&site, &map)
        };
        assert_eq!(from(&[]), None);
        // The page's own form under `Referrer-Policy: no-referrer`.
        assert_eq!(
            from(&[("sec-fetch-site", "same-origin"), ("origin", "null")]),
            None
        );
        assert_eq!(from(&[("origin", "http://127.0.0.1:8080")]), None);
        for foreign in ["cross-site", "same-site", "none"] {
            let said = from(&[
                ("sec-fetch-site", foreign),
                ("origin", "http://127.0.0.1:8080"),
            ]);
            assert!(said.is_some_and(|s| s.contains(foreign)), "{foreign}");
        }
        for origin in ["null", "http://evil.example", "http://127.0.0.1:9"] {
            assert!(from(&[("origin", origin)]).is_some(), "{origin}");
        }
    }
}
