use std::{
    convert::Infallible,
    sync::atomic::{AtomicBool, Ordering},
};

use http_body::Frame;
use rmcp::model::RequestId;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tower::util::BoxCloneService;

use super::*;
use super::{error::*, response::*, sse::*};
use std::{
    pin::Pin,
    sync::Mutex,
    task::{Context, Poll},
    time::Duration,
};

use http::header::{ACCEPT, AUTHORIZATION};
use http_body_util::BodyExt;
use rmcp::model::ServerJsonRpcMessage;

type Seen = Arc<Mutex<Vec<Request<Bytes>>>>;
/// Not `Sync`: the adapter does not need it.
type TestClient<B> =
    TowerHttpClient<BoxCloneService<Request<Full<Bytes>>, Response<B>, Infallible>>;

/// A client whose service records each request and answers with `respond()`.
fn client<B, F>(respond: F) -> (TestClient<B>, Seen)
where
    B: Body + Send + 'static,
    F: Fn() -> Response<B> + Clone + Send + Sync + 'static,
{
    let seen = Seen::default();
    let record = seen.clone();
    let service = tower::service_fn(move |request: Request<Full<Bytes>>| {
        let (record, respond) = (record.clone(), respond.clone());
        async move {
            let (parts, body) = request.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            record
                .lock()
                .unwrap()
                .push(Request::from_parts(parts, body));
            Ok::<_, Infallible>(respond())
        }
    });
    (TowerHttpClient::new(BoxCloneService::new(service)), seen)
}

fn respond(status: u16, headers: &[(&str, &str)], body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::builder().status(status);
    for (name, value) in headers {
        response = response.header(*name, *value);
    }
    response
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap()
}

fn message(value: serde_json::Value) -> ClientJsonRpcMessage {
    serde_json::from_value(value).unwrap()
}

fn tool_call() -> ClientJsonRpcMessage {
    message(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "deploy_release", "arguments": {"service": "catalog"}}}))
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HashMap<HeaderName, HeaderValue> {
    pairs
        .iter()
        .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
        .collect()
}

const URI: &str = "http://127.0.0.1:1/mcp";

async fn post<B>(
    client: &TestClient<B>,
    message: ClientJsonRpcMessage,
    session: Option<&str>,
) -> Result<StreamableHttpPostResponse, Error>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    client
        .post_message(
            URI.into(),
            message,
            session.map(Into::into),
            None,
            HashMap::new(),
        )
        .await
}

#[tokio::test]
async fn a_post_carries_what_rmcps_reqwest_client_sends() {
    let (client, seen) = client(|| respond(202, &[], ""));
    let custom = headers(&[("mcp-protocol-version", "2025-11-25"), ("x-tenant", "a")]);
    let answer = client
        .post_message(
            URI.into(),
            tool_call(),
            Some("s-1".into()),
            Some("t0k".into()),
            custom,
        )
        .await
        .unwrap();
    assert!(matches!(answer, StreamableHttpPostResponse::Accepted));

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let request = &seen[0];
    assert_eq!(request.method(), Method::POST);
    assert_eq!(request.uri(), URI);
    let h = request.headers();
    assert_eq!(h[ACCEPT], "text/event-stream, application/json");
    assert_eq!(h[CONTENT_TYPE], "application/json");
    assert_eq!(h[AUTHORIZATION], "Bearer t0k");
    assert!(h[AUTHORIZATION].is_sensitive());
    assert_eq!(h["mcp-session-id"], "s-1");
    assert_eq!(h["mcp-protocol-version"], "2025-11-25");
    assert_eq!(h["x-tenant"], "a");
    assert!(!h.contains_key("last-event-id"));
    let body: serde_json::Value = serde_json::from_slice(request.body()).unwrap();
    assert_eq!(body, serde_json::to_value(tool_call()).unwrap());
}

#[tokio::test]
async fn a_reserved_custom_header_is_refused_before_anything_is_sent() {
    let (client, seen) = client(|| respond(202, &[], ""));
    for name in ["accept", "mcp-session-id", "last-event-id"] {
        let custom =
            HashMap::from([(HeaderName::from_static(name), HeaderValue::from_static("x"))]);
        let error = client
            .post_message(URI.into(), tool_call(), None, None, custom)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, StreamableHttpError::ReservedHeaderConflict(n) if n == name),
            "{error:?}"
        );
    }
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn statuses_become_the_errors_rmcp_acts_on() {
    let challenge = (
        "www-authenticate",
        r#"Bearer error="insufficient_scope", scope="a b""#,
    );
    let (c, _) = client(|| respond(404, &[], "no such session"));
    let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
    assert!(
        matches!(error, StreamableHttpError::SessionExpired),
        "{error:?}"
    );
    let error = post(&c, tool_call(), None).await.unwrap_err();
    assert!(
        matches!(&error, StreamableHttpError::UnexpectedServerResponse(m) if m == "HTTP 404 Not Found: no such session"),
        "{error:?}"
    );

    let (c, _) = client(|| respond(401, &[("www-authenticate", "Bearer")], ""));
    let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
    assert!(
        matches!(&error, StreamableHttpError::AuthRequired(e) if e.www_authenticate_header == "Bearer"),
        "{error:?}"
    );

    let (c, _) = client(move || respond(403, &[challenge], ""));
    let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
    assert!(
        matches!(&error, StreamableHttpError::InsufficientScope(e) if e.get_required_scope() == Some("a b")),
        "{error:?}"
    );

    for status in [429, 503] {
        let (c, _) = client(move || respond(status, &[("retry-after", "7")], "busy"));
        let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
        assert!(
            matches!(&error, StreamableHttpError::HttpStatus(e)
                if e.status == status && e.retry_after.as_deref() == Some("7")),
            "{error:?}"
        );
    }

    // A JSON-RPC error in a 5xx body is the answer, not a transport failure.
    let rpc_error = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"boom"}}"#;
    let (c, _) = client(move || respond(500, &[("content-type", JSON)], rpc_error));
    let answer = post(&c, tool_call(), Some("s")).await.unwrap();
    assert!(matches!(
        answer,
        StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(_), _)
    ));

    let (c, _) = client(|| respond(204, &[], ""));
    assert!(matches!(
        post(&c, tool_call(), Some("s")).await.unwrap(),
        StreamableHttpPostResponse::Accepted
    ));
}

#[tokio::test]
async fn a_rejected_discover_is_answered_with_its_own_id() {
    let discover =
        || message(json!({"jsonrpc": "2.0", "id": 9, "method": "server/discover", "params": {}}));
    let (c, _) = client(|| respond(400, &[("content-type", "text/plain")], "legacy server"));
    let answer = post(&c, discover(), None).await.unwrap();
    let StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(error), None) = answer else {
        panic!("{answer:?}");
    };
    assert_eq!(error.id, Some(RequestId::Number(9)));
    assert!(error.error.message.contains("legacy server"), "{error:?}");
}

#[tokio::test]
async fn json_answers_are_bounded_and_parsed() {
    let ok = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;
    let (c, _) = client(move || {
        respond(
            200,
            &[
                ("content-type", "Application/JSON; charset=utf-8"),
                ("mcp-session-id", "s-2"),
            ],
            ok,
        )
    });
    let answer = post(&c, tool_call(), None).await.unwrap();
    assert!(
        matches!(&answer, StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Response(_), Some(s)) if s == "s-2"),
        "{answer:?}"
    );

    let mut limits = StreamableHttpResponseLimits::default();
    limits.max_json_response_size = ok.len() - 1;
    let error = c
        .post_message_with_response_limits(
            URI.into(),
            tool_call(),
            None,
            None,
            HashMap::new(),
            limits,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, StreamableHttpError::ResponseBodyTooLarge { max_size } if max_size == ok.len() - 1),
        "{error:?}"
    );

    // Without a declared length the bytes are counted.
    let (c, _) = client(move || {
        let chunks = ok
            .as_bytes()
            .chunks(8)
            .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::copy_from_slice(c))));
        let body = http_body_util::StreamBody::new(tokio_stream::iter(chunks.collect::<Vec<_>>()));
        Response::builder()
            .header("content-type", JSON)
            .body(body)
            .unwrap()
    });
    let error = c
        .post_message_with_response_limits(
            URI.into(),
            tool_call(),
            None,
            None,
            HashMap::new(),
            limits,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, StreamableHttpError::ResponseBodyTooLarge { .. }),
        "{error:?}"
    );

    // An empty or unusable answer to a notification is an acceptance.
    let initialized = || message(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let (c, _) = client(|| respond(200, &[("content-type", JSON)], ""));
    assert!(matches!(
        post(&c, initialized(), Some("s")).await.unwrap(),
        StreamableHttpPostResponse::Accepted
    ));
    let (c, _) = client(|| respond(200, &[("content-type", "text/html")], "<p>ok</p>"));
    assert!(matches!(
        post(&c, initialized(), Some("s")).await.unwrap(),
        StreamableHttpPostResponse::Accepted
    ));
    let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
    assert!(
        matches!(&error, StreamableHttpError::UnexpectedContentType(Some(ct)) if ct == "text/html"),
        "{error:?}"
    );
}

async fn sse_events(body: &'static str) -> Vec<Sse> {
    let (c, _) = client(move || respond(200, &[("content-type", EVENT_STREAM)], body));
    let StreamableHttpPostResponse::Sse(stream, _) =
        post(&c, tool_call(), Some("s")).await.unwrap()
    else {
        panic!("not an SSE answer");
    };
    stream.map(Result::unwrap).collect().await
}

#[tokio::test]
async fn sse_blocks_become_the_events_rmcp_reads() {
    let events = sse_events(concat!(
        "data: \nid: 0/0\nretry: 3000\n\n",
        ": keep-alive\n\n",
        "event: message\ndata: {\"a\":\n",
        "data: 1}\nid: 1/0\n\n",
        "event: ping\ndata: x\n\n",
        "id: 2/0\nretry: 10\n\n",
    ))
    .await;
    let expected = [
        Sse::default().data("").id("0/0").retry(3000),
        Sse::default().data("{\"a\":\n1}").id("1/0"),
        Sse::default().event("ping").data("x"),
        // A block without data still moves the resume point (and the retry).
        Sse::default().id("2/0").retry(10),
    ];
    assert_eq!(events, expected);
}

fn sse_error_source(error: &SseError) -> &TowerClientError {
    let SseError::Body(source) = error else {
        panic!("{error}");
    };
    source.downcast_ref().unwrap()
}

#[tokio::test]
async fn an_oversized_event_ends_the_stream_and_its_resumption_once() {
    let big: &'static str =
        Box::leak(format!("data: \nid: 0/7\n\ndata: {}\n\n", "x".repeat(100)).into_boxed_str());
    let (c, seen) = client(move || respond(200, &[("content-type", EVENT_STREAM)], big));
    let mut limits = StreamableHttpResponseLimits::default();
    limits.max_sse_event_size = 64;
    let answer = c
        .post_message_with_response_limits(
            URI.into(),
            tool_call(),
            Some("s".into()),
            None,
            HashMap::new(),
            limits,
        )
        .await
        .unwrap();
    let StreamableHttpPostResponse::Sse(mut stream, _) = answer else {
        panic!("{answer:?}");
    };
    assert_eq!(
        stream.next().await.unwrap().unwrap(),
        Sse::default().data("").id("0/7")
    );
    let error = stream.next().await.unwrap().unwrap_err();
    let source = sse_error_source(&error);
    assert!(source.is_event_too_large(), "{source}");
    assert!(stream.next().await.is_none());

    let resume = || {
        c.get_stream_with_max_sse_event_size(
            URI.into(),
            Some("s".into()),
            Some("0/7".into()),
            None,
            HashMap::new(),
            64,
        )
    };
    let error = resume().await.err().unwrap();
    assert!(
        matches!(error, StreamableHttpError::ServerDoesNotSupportSse),
        "{error:?}"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the refused resume was not sent"
    );
    // Refused once: a later resume from the same point is sent.
    assert!(resume().await.is_ok());
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_get_carries_the_resume_point_and_reads_its_statuses() {
    let (c, seen) = client(|| respond(200, &[("content-type", EVENT_STREAM)], "data: 1\n\n"));
    let stream = c
        .get_stream(
            URI.into(),
            Some("s-3".into()),
            Some("4/1".into()),
            Some("t".into()),
            headers(&[("mcp-protocol-version", "2025-11-25")]),
        )
        .await
        .unwrap();
    assert_eq!(
        stream.map(Result::unwrap).collect::<Vec<_>>().await,
        [Sse::default().data("1")]
    );
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let h = seen[0].headers();
    assert_eq!(seen[0].method(), Method::GET);
    assert_eq!(h[ACCEPT], "text/event-stream, application/json");
    assert_eq!(h["mcp-session-id"], "s-3");
    assert_eq!(h["last-event-id"], "4/1");
    assert_eq!(h[AUTHORIZATION], "Bearer t");
    assert_eq!(h["mcp-protocol-version"], "2025-11-25");
    assert!(!h.contains_key(CONTENT_TYPE));

    let get = |status: u16, content_type: &'static str| async move {
        let (c, _) = client(move || respond(status, &[("content-type", content_type)], ""));
        c.get_stream(URI.into(), None, None, None, HashMap::new())
            .await
            .err()
    };
    let error = get(405, EVENT_STREAM).await.unwrap();
    assert!(
        matches!(error, StreamableHttpError::ServerDoesNotSupportSse),
        "{error:?}"
    );
    let error = get(404, EVENT_STREAM).await.unwrap();
    assert!(
        matches!(&error, StreamableHttpError::Client(e) if e.status() == Some(StatusCode::NOT_FOUND)),
        "{error:?}"
    );
    let error = get(502, EVENT_STREAM).await.unwrap();
    assert!(
        matches!(&error, StreamableHttpError::HttpStatus(e) if e.status == 502),
        "{error:?}"
    );
    let error = get(200, "text/plain").await.unwrap();
    assert!(
        matches!(&error, StreamableHttpError::UnexpectedContentType(Some(ct)) if ct == "text/plain"),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_delete_ends_the_session() {
    let (c, seen) = client(|| respond(200, &[], ""));
    c.delete_session(URI.into(), "s-4".into(), None, HashMap::new())
        .await
        .unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen[0].method(), Method::DELETE);
    assert_eq!(seen[0].headers()["mcp-session-id"], "s-4");
    assert!(!seen[0].headers().contains_key(ACCEPT));

    let (c, _) = client(|| respond(405, &[], ""));
    c.delete_session(URI.into(), "s".into(), None, HashMap::new())
        .await
        .unwrap();
    let (c, _) = client(|| respond(500, &[], ""));
    let error = c
        .delete_session(URI.into(), "s".into(), None, HashMap::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StreamableHttpError::Client(e) if e.is_status()),
        "{error:?}"
    );
}

/// A body fed through a channel that records whether it was read to its end.
struct ChannelBody {
    rx: mpsc::UnboundedReceiver<Bytes>,
    ended: Arc<AtomicBool>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = std::task::ready!(self.rx.poll_recv(cx));
        if next.is_none() {
            self.ended.store(true, Ordering::SeqCst);
        }
        Poll::Ready(next.map(|data| Ok(Frame::data(data))))
    }
}

/// Opens a POST stream whose first chunk is a JSON-RPC response; returns the stream, the
/// sender of the rest of the body and the "read to its end" flag.
async fn response_stream() -> (
    BoxStream<'static, Result<Sse, SseError>>,
    mpsc::UnboundedSender<Bytes>,
    Arc<AtomicBool>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let ended = Arc::new(AtomicBool::new(false));
    let body = Arc::new(Mutex::new(Some(ChannelBody {
        rx,
        ended: ended.clone(),
    })));
    let (c, _) = client(move || {
        let body = body.lock().unwrap().take().unwrap();
        Response::builder()
            .header("content-type", EVENT_STREAM)
            .body(body)
            .unwrap()
    });
    tx.send(Bytes::from_static(
        b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
    ))
    .unwrap();
    let StreamableHttpPostResponse::Sse(stream, _) =
        post(&c, tool_call(), Some("s")).await.unwrap()
    else {
        panic!("not an SSE answer");
    };
    (stream, tx, ended)
}

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_request_stream_is_read_to_its_end_once_the_response_was_taken() {
    let (mut stream, tx, ended) = response_stream().await;
    assert!(is_response(
        stream
            .next()
            .await
            .unwrap()
            .unwrap()
            .data
            .as_deref()
            .unwrap()
    ));
    // rmcp asks for the next item (the response is in its hands), then drops the stream.
    let next = tokio::time::timeout(Duration::from_millis(10), stream.next()).await;
    assert!(next.is_err(), "nothing more yet");
    drop(stream);
    drop(tx);
    settle().await;
    assert!(
        ended.load(Ordering::SeqCst),
        "read to its end in the background"
    );
}

#[tokio::test]
async fn a_stream_dropped_before_the_response_was_taken_is_left_alone() {
    let (mut stream, tx, ended) = response_stream().await;
    stream.next().await.unwrap().unwrap();
    drop(stream);
    drop(tx);
    settle().await;
    assert!(!ended.load(Ordering::SeqCst));
}

#[test]
fn small_parsers() {
    let ct = |v: &'static str| HeaderValue::from_static(v);
    assert!(media_type_is(&ct("text/event-stream"), EVENT_STREAM));
    assert!(media_type_is(
        &ct(" TEXT/Event-Stream ; charset=utf-8"),
        EVENT_STREAM
    ));
    assert!(!media_type_is(&ct("text/event-streams"), EVENT_STREAM));
    assert!(!media_type_is(&ct("application/json-patch+json"), JSON));

    assert_eq!(
        challenge_scope(r#"Bearer scope="files:read files:write""#).as_deref(),
        Some("files:read files:write")
    );
    assert_eq!(
        challenge_scope("Bearer scope=read:data, error=x").as_deref(),
        Some("read:data")
    );
    assert_eq!(challenge_scope(r#"Bearer SCOPE="""#).as_deref(), Some(""));
    assert_eq!(challenge_scope("Bearer scope=,"), None);
    assert_eq!(challenge_scope(r#"Bearer error="invalid_token""#), None);

    assert!(is_response(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
    assert!(is_response(
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m"}}"#
    ));
    assert!(!is_response(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#));
    assert!(!is_response(
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#
    ));
    assert!(!is_response(""));
}

#[test]
fn errors_say_what_failed() {
    let error = TowerClientError::service(std::io::Error::other("refused"));
    assert!(error.is_service() && !error.is_body());
    assert_eq!(
        std::error::Error::source(&error).unwrap().to_string(),
        "refused"
    );
    let error = TowerClientError::unexpected_status(StatusCode::GONE);
    assert!(error.is_status());
    assert_eq!(error.status(), Some(StatusCode::GONE));
    assert!(std::error::Error::source(&error).is_none());
    let error = TowerClientError::event_too_large(
        64,
        crate::protocol::sse::SseError::EventTooLarge { limit: 64 },
    );
    assert!(error.is_event_too_large());
    assert_eq!(
        error.to_string(),
        "an SSE event exceeded the 64-byte max_sse_event_size"
    );
}
