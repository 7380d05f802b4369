//! The answer to a `POST` read as rmcp's reqwest backend reads it; bounded body reads.

use std::borrow::Cow;

use bytes::Buf;
use http::{
    HeaderMap, HeaderValue, Response, StatusCode,
    header::{CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE},
};
use http_body::Body;
use http_body_util::BodyExt;
use rmcp::{
    ErrorData,
    model::{ClientJsonRpcMessage, ClientRequest, ServerJsonRpcMessage},
    transport::streamable_http_client::{
        AuthRequiredError, HttpStatusError, InsufficientScopeError, StreamableHttpError,
        StreamableHttpPostResponse, StreamableHttpResponseLimits,
    },
};

use crate::BoxError;

use super::{
    BODY_PREVIEW, EVENT_STREAM, Error, JSON, MAX_RETRY_AFTER, READ_FAILURE, SESSION_ID,
    error::TowerClientError,
    media_type_is,
    sse::{SseBody, StreamKey},
};

/// Reads the answer to a `POST` the way rmcp's reqwest backend does.
//
// Longer than most functions: one `match` over the status and content type with an arm per
// answer rmcp's backend distinguishes, kept in its order so the two can be compared.
pub(super) async fn read_post_response<RB>(
    response: Response<RB>,
    message: &ClientJsonRpcMessage,
    session_was_attached: bool,
    limits: StreamableHttpResponseLimits,
    stream: StreamKey,
) -> Result<StreamableHttpPostResponse, Error>
where
    RB: Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    let status = response.status();
    auth_challenge(status, response.headers())?;
    if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    if status == StatusCode::NOT_FOUND && session_was_attached {
        return Err(StreamableHttpError::SessionExpired);
    }
    let content_type = response.headers().get(CONTENT_TYPE).cloned();
    let is_json = content_type
        .as_ref()
        .is_some_and(|ct| media_type_is(ct, JSON));
    // A 429, and a 5xx that cannot carry a JSON-RPC error, return without reading the body.
    let status_error = match status_error(status, response.headers()) {
        Some(error) if !is_json || status == StatusCode::TOO_MANY_REQUESTS => {
            return Err(error.into());
        }
        other => other,
    };
    let session_id = response
        .headers()
        .get(&SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Nothing in the answer to a notification, response or error is load-bearing.
    let awaits_no_response = !matches!(message, ClientJsonRpcMessage::Request(_));
    let body = response.into_body();
    if status.is_success() && body.size_hint().exact() == Some(0) && awaits_no_response {
        return Ok(StreamableHttpPostResponse::Accepted);
    }

    if !status.is_success() {
        let is_auth_failure = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        let text = if is_json && !is_auth_failure {
            match read_bounded(body, limits.max_json_response_size).await {
                Ok(bytes) => {
                    let full = String::from_utf8_lossy(&bytes);
                    if let Ok(error @ ServerJsonRpcMessage::Error(_)) =
                        serde_json::from_str::<ServerJsonRpcMessage>(&full)
                    {
                        // A rejected `server/discover` must be re-correlated first.
                        if let Some(response) =
                            discover_rejection(message, session_was_attached, status, &full)
                        {
                            return Ok(response);
                        }
                        return Ok(StreamableHttpPostResponse::Json(error, session_id));
                    }
                    tracing::warn!("HTTP {status}: the JSON body is not a JSON-RPC error");
                    truncated(&bytes, limits.max_error_response_size)
                }
                Err(error @ StreamableHttpError::ResponseBodyTooLarge { .. }) => {
                    return Err(status_error.map_or(error, Into::into));
                }
                Err(_) => truncated(READ_FAILURE.as_bytes(), limits.max_error_response_size),
            }
        } else {
            match read_prefix(body, limits.max_error_response_size).await {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(_) => truncated(READ_FAILURE.as_bytes(), limits.max_error_response_size),
            }
        };
        if let Some(response) = discover_rejection(message, session_was_attached, status, &text) {
            return Ok(response);
        }
        if let Some(error) = status_error {
            return Err(error.into());
        }
        return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
            format!("HTTP {status}: {text}"),
        )));
    }

    match content_type {
        Some(ct) if media_type_is(&ct, EVENT_STREAM) => Ok(StreamableHttpPostResponse::Sse(
            SseBody::new(body, limits.max_sse_event_size, stream, None, true).boxed(),
            session_id,
        )),
        Some(ct) if media_type_is(&ct, JSON) => {
            let bytes = read_bounded(body, limits.max_json_response_size).await?;
            match serde_json::from_slice::<ServerJsonRpcMessage>(&bytes) {
                Ok(message) => Ok(StreamableHttpPostResponse::Json(message, session_id)),
                Err(error) if awaits_no_response => {
                    tracing::warn!(
                        "unparsable JSON answer to a notification, taken as accepted: {error}"
                    );
                    Ok(StreamableHttpPostResponse::Accepted)
                }
                Err(error) => Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                    format!(
                        "could not parse JSON response as ServerJsonRpcMessage: {error}: {}",
                        preview(&bytes)
                    ),
                ))),
            }
        }
        // A POST that awaits no response needs nothing from the body.
        other if awaits_no_response => {
            tracing::warn!(content_type = ?other, "unexpected content type on a POST that awaits no response");
            Ok(StreamableHttpPostResponse::Accepted)
        }
        other => Err(unexpected_content_type(other.as_ref())),
    }
}

/// `401` / `403` with a challenge: the errors rmcp's auth client acts on.
pub(super) fn auth_challenge(status: StatusCode, headers: &HeaderMap) -> Result<(), Error> {
    let Some(challenge) = headers.get(WWW_AUTHENTICATE) else {
        return Ok(());
    };
    let challenge = || {
        challenge.to_str().map(str::to_owned).map_err(|_| {
            StreamableHttpError::UnexpectedServerResponse(Cow::Borrowed(
                "invalid www-authenticate header value",
            ))
        })
    };
    match status {
        StatusCode::UNAUTHORIZED => Err(StreamableHttpError::AuthRequired(AuthRequiredError::new(
            challenge()?,
        ))),
        StatusCode::FORBIDDEN => {
            let challenge = challenge()?;
            let scope = challenge_scope(&challenge);
            Err(StreamableHttpError::InsufficientScope(
                InsufficientScopeError::new(challenge, scope),
            ))
        }
        _ => Ok(()),
    }
}

/// The `scope` parameter of a `WWW-Authenticate` challenge, quoted or not.
pub(super) fn challenge_scope(challenge: &str) -> Option<String> {
    // ASCII lowercasing keeps byte offsets.
    let start = challenge.to_ascii_lowercase().find("scope=")? + "scope=".len();
    let rest = &challenge[start..];
    if let Some(quoted) = rest.strip_prefix('"') {
        return quoted.find('"').map(|end| quoted[..end].to_owned());
    }
    let end = rest
        .find(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .unwrap_or(rest.len());
    (end > 0).then(|| rest[..end].to_owned())
}

/// The status metadata rmcp keeps for `429` and `5xx`.
pub(super) fn status_error(status: StatusCode, headers: &HeaderMap) -> Option<HttpStatusError> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let retry_after = headers
        .get(RETRY_AFTER)
        .filter(|v| v.len() <= MAX_RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

/// rmcp tells a legacy server from a modern one by the JSON-RPC error its `server/discover`
/// gets; a 4xx from middleware in front of a legacy server cannot echo the request id, so
/// the error is re-correlated here (and made up when the body has none).
pub(super) fn discover_rejection(
    message: &ClientJsonRpcMessage,
    session_was_attached: bool,
    status: StatusCode,
    body: &str,
) -> Option<StreamableHttpPostResponse> {
    if session_was_attached
        || !crate::decide::classify::refused_before_running(status.as_u16())
        || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
    {
        return None;
    }
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match serde_json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(error)) => error.error,
        _ => ErrorData::invalid_request(
            format!("server/discover rejected with HTTP {status}: {body}"),
            None,
        ),
    };
    Some(StreamableHttpPostResponse::Json(
        ServerJsonRpcMessage::error(error, Some(request.id.clone())),
        None,
    ))
}

pub(super) fn unexpected_content_type(content_type: Option<&HeaderValue>) -> Error {
    StreamableHttpError::UnexpectedContentType(
        content_type.map(|ct| String::from_utf8_lossy(ct.as_bytes()).into_owned()),
    )
}

/// A whole body of at most `max` bytes: a larger declared or counted size is
/// [`StreamableHttpError::ResponseBodyTooLarge`], found before the excess is buffered.
pub(super) async fn read_bounded<B>(body: B, max: usize) -> Result<Vec<u8>, Error>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let too_large = || StreamableHttpError::ResponseBodyTooLarge { max_size: max };
    if body.size_hint().lower() > max as u64 {
        return Err(too_large());
    }
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| StreamableHttpError::Client(TowerClientError::body(e)))?;
        if let Ok(mut data) = frame.into_data() {
            if data.remaining() > max - bytes.len() {
                return Err(too_large());
            }
            while data.has_remaining() {
                let chunk = data.chunk();
                bytes.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    Ok(bytes)
}

/// At most the first `max` bytes of a body, for a diagnostic; the rest is never read.
pub(super) async fn read_prefix<B>(body: B, max: usize) -> Result<Vec<u8>, Error>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    while bytes.len() < max {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(|e| StreamableHttpError::Client(TowerClientError::body(e)))?;
        if let Ok(mut data) = frame.into_data() {
            while data.has_remaining() && bytes.len() < max {
                let chunk = data.chunk();
                let n = chunk.len().min(max - bytes.len());
                bytes.extend_from_slice(&chunk[..n]);
                data.advance(n);
            }
        }
    }
    Ok(bytes)
}

pub(super) fn truncated(bytes: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned()
}

pub(super) fn preview(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "<empty>".to_owned();
    }
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    if text.len() > BODY_PREVIEW {
        let mut end = BODY_PREVIEW;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}
