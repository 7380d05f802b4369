//! Unit tests of the guard as a tower service: readiness and the inner-service accessors.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tower::{Layer, ServiceExt, limit::ConcurrencyLimit, service_fn};

use super::{Authorization, AuthorizationRequest, Authorize, GuardLayer, GuardRequestBody};
use crate::{
    BoxError,
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    ledger::MemoryLedger,
};

fn layer() -> GuardLayer {
    let contracts = ContractRegistry::builder()
        .tool("deploy", ToolContract::irreversible())
        .build()
        .unwrap();
    GuardLayer::new(
        MemoryLedger::new(),
        contracts,
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    )
}

fn post(body: Value) -> Request<Full<Bytes>> {
    Request::post("http://127.0.0.1:9/mcp")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A target answering every request with an empty JSON-RPC result for its id.
async fn target(request: Request<GuardRequestBody>) -> Result<Response<Full<Bytes>>, BoxError> {
    let body = request.into_body().collect().await?.to_bytes();
    let id = serde_json::from_slice::<Value>(&body)?["id"].clone();
    let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"content": [], "isError": false}});
    let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Allows every call, once told to: holds a call in the guard's ledger work.
#[derive(Debug)]
struct Held {
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

#[async_trait]
impl Authorize for Held {
    async fn authorize(&self, _: AuthorizationRequest<'_>) -> Authorization {
        self.entered.notify_one();
        self.release.notified().await;
        Authorization::Allow
    }
}

/// The guard polls its inner service ready right before it sends: a `tools/call` held in its
/// ledger work (here: authorization) holds no `ConcurrencyLimit` slot, so another request
/// gets through meanwhile. (Before, the call took the ready inner service with it and held
/// the only slot until its send.)
#[tokio::test]
async fn a_call_in_its_ledger_work_holds_no_slot_of_the_service_below() {
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let guard = layer()
        .authorizer(Held {
            entered: entered.clone(),
            release: release.clone(),
        })
        .layer(ConcurrencyLimit::new(service_fn(target), 1));
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "deploy", "arguments": {"version": "1"}}});
    let held = tokio::spawn(guard.clone().oneshot(post(call)));
    entered.notified().await;

    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let listed = tokio::time::timeout(Duration::from_secs(5), guard.clone().oneshot(post(list)))
        .await
        .expect("tools/list waited for the slot a held tools/call pinned")
        .unwrap();
    assert!(listed.status().is_success());

    release.notify_one();
    let answered = held.await.unwrap().unwrap();
    let body = answered.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["id"], 1);
}

#[test]
fn the_inner_service_is_reachable_through_the_guard() {
    let mut guard = layer().layer(7_u32);
    assert_eq!(*guard.get_ref(), 7);
    *guard.get_mut() = 8;
    assert_eq!(guard.into_inner(), 8);
}

mod over_resume {
    //! The guard over a `ResumeLayer`: one SSE parser for both.

    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::Method;
    use http_body::Frame;
    use http_body_util::{StreamBody, combinators::UnsyncBoxBody};

    use super::*;
    use crate::{
        execution::ExecutionState,
        ledger::Ledger,
        protocol::sse::{PUSHED_BYTES, SseParser},
        resume::ResumeLayer,
    };

    type Stream = UnsyncBoxBody<Bytes, std::io::Error>;

    const NOTE: &str = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#;
    const ANSWER: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}"#;

    fn stream(frames: Vec<String>, cut: bool) -> Stream {
        let mut frames: Vec<Result<Frame<Bytes>, std::io::Error>> = frames
            .into_iter()
            .map(|f| Ok(Frame::data(Bytes::from(f))))
            .collect();
        if cut {
            frames.push(Err(std::io::ErrorKind::ConnectionReset.into()));
        }
        UnsyncBoxBody::new(StreamBody::new(tokio_stream::iter(frames)))
    }

    fn sse(body: Stream, status: u16) -> Response<Stream> {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "text/event-stream")
            .body(body)
            .unwrap()
    }

    /// The tests' one `deploy` call (irreversible), through a guard recording in `ledger` over
    /// a resume layer (up to `max_attempts` resumes) over `target`.
    async fn deploy_through_resume<S>(
        ledger: &MemoryLedger,
        target: S,
        max_attempts: u32,
    ) -> Response<impl http_body::Body<Data = Bytes, Error = BoxError>>
    where
        S: tower_service::Service<
                Request<GuardRequestBody>,
                Response = Response<Stream>,
                Error = BoxError,
            > + Clone
            + Send
            + 'static,
        S::Future: Send,
    {
        let contracts = ContractRegistry::builder()
            .tool("deploy", ToolContract::irreversible())
            .build()
            .unwrap();
        let guard = GuardLayer::new(
            ledger.clone(),
            contracts,
            FingerprintKey::from_bytes(&[7; 32]).unwrap(),
        )
        .layer(
            ResumeLayer::new()
                .backoff(Duration::from_millis(1))
                .max_attempts(max_attempts)
                .layer(target),
        );
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "deploy", "arguments": {"version": "1"}}});
        let mut request = post_request(call);
        request
            .headers_mut()
            .insert("mcp-protocol-version", "2025-11-25".parse().unwrap());
        guard.oneshot(request).await.unwrap()
    }

    /// A guard over a resume layer over a target whose POST answers `post` (broken after it
    /// when `cut`) and whose GET answers `get` (404 when `None`); with the ledger and the
    /// GETs counted.
    async fn call(
        post: Vec<String>,
        cut: bool,
        get: Option<Vec<String>>,
    ) -> (MemoryLedger, Result<Bytes, BoxError>, usize) {
        call_and(post, cut, get, true).await
    }

    /// [`call`], the body read (or dropped unread, when not `read`).
    async fn call_and(
        post: Vec<String>,
        cut: bool,
        get: Option<Vec<String>>,
        read: bool,
    ) -> (MemoryLedger, Result<Bytes, BoxError>, usize) {
        let ledger = MemoryLedger::new();
        let gets = Arc::new(AtomicUsize::new(0));
        let counted = gets.clone();
        let target = service_fn(move |request: Request<GuardRequestBody>| {
            let (post, get, gets) = (post.clone(), get.clone(), counted.clone());
            async move {
                if request.method() == Method::GET {
                    gets.fetch_add(1, Ordering::SeqCst);
                    return Ok::<_, BoxError>(match get {
                        Some(frames) => sse(stream(frames, false), 200),
                        None => sse(stream(vec![], false), 404),
                    });
                }
                Ok(sse(stream(post, cut), 200))
            }
        });
        let response = deploy_through_resume(&ledger, target, 1).await;
        let body = if read {
            response.into_body().collect().await.map(|b| b.to_bytes())
        } else {
            drop(response);
            Ok(Bytes::new())
        };
        // Let the ledger writes and the drain (tasks of their own) finish.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        (ledger, body, gets.load(Ordering::SeqCst))
    }

    fn post_request(body: Value) -> Request<Full<Bytes>> {
        let mut request = post(body);
        request.headers_mut().remove("mcp-protocol-version");
        request
    }

    fn messages(body: &[u8]) -> Vec<String> {
        SseParser::parse_all(body, 1 << 20)
            .unwrap()
            .into_iter()
            .filter(|e| e.event == "message")
            .map(|e| e.data)
            .collect()
    }

    /// The guard parsed the stream a second time after the resume layer had: every byte went
    /// through two SSE parsers (and each event's JSON through two parses). Now the guard
    /// reads the resume layer's events from its tap, and the outcome is the same.
    #[tokio::test]
    async fn over_a_resume_layer_the_stream_is_parsed_once() {
        let text = format!("id: 1\ndata: {NOTE}\n\nid: 2\ndata: {ANSWER}\n\n");
        let frames = [&text[..5], &text[5..40], &text[40..]];
        let before = PUSHED_BYTES.with(std::cell::Cell::get);
        let (ledger, body, gets) = call(frames.map(str::to_owned).to_vec(), false, None).await;
        let pushed = PUSHED_BYTES.with(std::cell::Cell::get) - before;
        assert_eq!(body.unwrap(), text.as_bytes(), "frames go on untouched");
        assert_eq!(pushed, text.len(), "one parser saw the stream, once");
        assert_eq!(gets, 0);
        let record = ledger.list().await.unwrap().remove(0);
        assert_eq!(record.state, ExecutionState::Completed);
        assert!(record.result_reference.is_some(), "{record:?}");
    }

    /// A break the resume layer cannot recover: the guard records `unknown` with the event id
    /// it read from the tap.
    #[tokio::test]
    async fn an_unrecovered_break_records_the_event_id_from_the_tap() {
        let post = vec![format!("id: 1\ndata: {NOTE}\n\ndata: {{\"json")];
        let (ledger, body, gets) = call(post, true, None).await;
        assert!(body.is_err());
        assert_eq!(gets, 1);
        let record = ledger.list().await.unwrap().remove(0);
        assert_eq!(record.state, ExecutionState::Unknown);
        assert_eq!(record.correlation.last_event_id.as_deref(), Some("1"));
    }

    /// A stream torn inside an event and resumed: the guard records the answer of the
    /// replayed stream; the caller gets each message once, in order, and the torn one's
    /// first bytes end in an event no client reads as JSON-RPC.
    #[tokio::test]
    async fn a_stream_torn_inside_an_event_and_resumed_gives_each_message_once() {
        let post = vec![
            format!("id: 1\ndata: {NOTE}\n\nid: 2\ndata: {}", &NOTE[..9]),
            String::new(),
        ];
        let get = vec![
            format!("id: 1\ndata: {NOTE}\n\n"),
            format!("id: 2\ndata: {NOTE}\n\nid: 3\nda"),
            format!("ta: {ANSWER}\n\n"),
        ];
        let (ledger, body, gets) = call(post, true, Some(get)).await;
        let body = body.unwrap();
        assert_eq!(gets, 1);
        assert_eq!(messages(&body), [NOTE, NOTE, ANSWER]);
        let record = ledger.list().await.unwrap().remove(0);
        assert_eq!(record.state, ExecutionState::Completed);
        assert!(record.result_reference.is_some(), "{record:?}");
    }

    /// A body the caller dropped unread is drained for its answer: the tap goes with it.
    #[tokio::test]
    async fn a_tapped_body_dropped_unread_is_drained_for_its_answer() {
        let post = vec![
            format!("id: 1\ndata: {NOTE}\n\n"),
            format!("id: 2\ndata: {ANSWER}\n\n"),
        ];
        let before = PUSHED_BYTES.with(std::cell::Cell::get);
        let (ledger, _, _) = call_and(post.clone(), false, None, false).await;
        let pushed = PUSHED_BYTES.with(std::cell::Cell::get) - before;
        assert_eq!(pushed, post.concat().len(), "parsed once, in the drain too");
        let record = ledger.list().await.unwrap().remove(0);
        assert_eq!(record.state, ExecutionState::Completed);
        assert!(record.result_reference.is_some(), "{record:?}");
        assert!(record.delivered_at.is_none());
    }

    /// One event of the attack property's target: its id, and the message it carries.
    fn encode_event(id: usize, data: &str, style: u8) -> String {
        let eol = ["\n", "\r", "\r\n"][usize::from(style % 3)];
        let mut out = String::new();
        if style & 4 != 0 {
            out.push_str(&format!(": keep-alive{eol}"));
        }
        out.push_str(&format!("id: {id}{eol}"));
        if style & 8 != 0 {
            out.push_str(&format!("event: message{eol}"));
        }
        if style & 16 != 0 {
            out.push_str(&format!("retry: 1{eol}"));
        }
        out.push_str(&format!("data: {data}{eol}{eol}"));
        out
    }

    /// The messages of the attack property: notes (with non-ASCII text, to split inside
    /// UTF-8), then the answer.
    fn attack_messages(notes: usize) -> Vec<String> {
        let mut messages: Vec<String> = (0..notes)
            .map(|i| {
                format!(
                    r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"n":{i},"t":"é😀"}}}}"#
                )
            })
            .collect();
        messages.push(ANSWER.to_owned());
        messages
    }

    fn split_at(text: &[u8], cuts: &[usize]) -> Vec<Bytes> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut frames = Vec::new();
        let mut start = 0;
        for cut in cuts.into_iter().chain([text.len()]) {
            if cut > start {
                frames.push(Bytes::copy_from_slice(&text[start..cut]));
                start = cut;
            }
        }
        frames
    }

    /// A guard over a resume layer over a target whose POST stream breaks at `cut` and whose
    /// GET replays every event after `Last-Event-ID`: the caller's bytes (up to an error)
    /// and the ledger.
    async fn call_replaying(
        notes: usize,
        styles: Vec<u8>,
        bom: bool,
        cut: usize,
        cuts: Vec<usize>,
        replay_all: bool,
        get_cut: Option<usize>,
    ) -> (MemoryLedger, Vec<u8>, bool, bool) {
        let messages = attack_messages(notes);
        let mut first = String::new();
        if bom {
            first.push('\u{feff}');
        }
        let mut first_event_end = 0;
        for (i, m) in messages.iter().enumerate() {
            first.push_str(&encode_event(i + 1, m, styles[i % styles.len()]));
            if i == 0 {
                first_event_end = first.len();
            }
        }
        let cut = cut % (first.len() + 1);
        // A break after the first event ended has a cursor to resume from.
        let resumable = cut >= first_event_end;
        let first_frames = split_at(&first.as_bytes()[..cut], &cuts);
        let broken = cut < first.len();
        let ledger = MemoryLedger::new();
        let gets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let target = service_fn(move |request: Request<GuardRequestBody>| {
            let (messages, first_frames, cuts) =
                (messages.clone(), first_frames.clone(), cuts.clone());
            let gets = gets.clone();
            async move {
                if request.method() == Method::GET {
                    let after: usize = request
                        .headers()
                        .get("last-event-id")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(0);
                    // A target that replays from further back than asked: the splice drops
                    // what it delivered.
                    let after = if replay_all { 0 } else { after };
                    let mut replay = String::new();
                    for (i, m) in messages.iter().enumerate().skip(after) {
                        replay.push_str(&encode_event(i + 1, m, 0));
                    }
                    // The first resume breaks too, at `get_cut`.
                    let first_get = gets.fetch_add(1, Ordering::SeqCst) == 0;
                    let end = match get_cut {
                        Some(c) if first_get => c % (replay.len() + 1),
                        _ => replay.len(),
                    };
                    let mut frames = split_at(&replay.as_bytes()[..end], &cuts)
                        .into_iter()
                        .map(|b| Ok(Frame::data(b)))
                        .collect::<Vec<Result<_, std::io::Error>>>();
                    if end < replay.len() {
                        frames.push(Err(std::io::ErrorKind::ConnectionReset.into()));
                    }
                    let body = UnsyncBoxBody::new(StreamBody::new(tokio_stream::iter(frames)));
                    return Ok::<_, BoxError>(sse(body, 200));
                }
                let mut frames: Vec<Result<Frame<Bytes>, std::io::Error>> = first_frames
                    .into_iter()
                    .map(|b| Ok(Frame::data(b)))
                    .collect();
                if broken {
                    frames.push(Err(std::io::ErrorKind::ConnectionReset.into()));
                }
                Ok(sse(
                    UnsyncBoxBody::new(StreamBody::new(tokio_stream::iter(frames))),
                    200,
                ))
            }
        });
        let response = deploy_through_resume(&ledger, target, 3).await;
        let mut body = response.into_body();
        let mut bytes = Vec::new();
        let mut failed = false;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => bytes.extend_from_slice(&frame.into_data().unwrap()),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        drop(body);
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        (ledger, bytes, failed, resumable)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Whatever the framing, the line endings, the BOM, comments, `retry:` and where the
        /// stream breaks: the caller reads each message at most once, in order, all of them
        /// when the answer came; the ledger says `completed` with the result exactly when the
        /// caller got the answer, `unknown` otherwise.
        #[test]
        fn a_stream_broken_anywhere_and_resumed_gives_each_message_once_and_the_right_outcome(
            notes in 0usize..4,
            styles in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..5),
            bom in proptest::prelude::any::<bool>(),
            cut in proptest::prelude::any::<usize>(),
            cuts in proptest::collection::vec(proptest::prelude::any::<usize>(), 0..6),
            replay_all in proptest::prelude::any::<bool>(),
            get_cut in proptest::option::of(proptest::prelude::any::<usize>()),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let expected = attack_messages(notes);
            let (ledger, bytes, failed, resumable) =
                runtime.block_on(call_replaying(notes, styles, bom, cut, cuts, replay_all, get_cut));
            let got: Vec<String> = messages(&bytes)
                .into_iter()
                .filter(|m| !m.is_empty())
                .collect();
            proptest::prop_assert!(got.len() <= expected.len(), "{got:?}");
            proptest::prop_assert_eq!(&got[..], &expected[..got.len()]);
            let answered = got.last().map(String::as_str) == Some(ANSWER);
            if resumable {
                proptest::prop_assert_eq!(&got, &expected);
            }
            let record = runtime.block_on(ledger.list()).unwrap().remove(0);
            if answered {
                proptest::prop_assert_eq!(record.state, ExecutionState::Completed);
                proptest::prop_assert!(record.result_reference.is_some(), "{:?}", record);
            } else {
                proptest::prop_assert!(failed, "no answer and no error");
                proptest::prop_assert_eq!(record.state, ExecutionState::Unknown, "{:?}", got);
            }
        }
    }
}
