//! The simulated MCP target: a hyper HTTP/1 server on simulated TCP whose tools count their
//! side effects (the ground truth of every check), with the faults of the plan.
//!
//! Each tool's work runs in a task of its own, so a client that hangs up does not cancel it
//! (disconnection is not cancellation); a crash of the target's host ends it. `set_flag`
//! honours `Idempotency-Key` as the IETF draft says (a repeat gets the first answer, a repeat
//! while the first runs gets 409); the other tools run once per request that reaches them.
//! In the plans with the server half, the crate's `IdempotencyLayer` stands in front of the
//! target instead and honours the key of every tool (its ledger, a database of the target's,
//! outlives the target's crashes), and `set_flag` runs once per request that reaches it.

use std::{
    convert::Infallible,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, combinators::BoxBody};
use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use mcp_replay_guard::integrations::server::IdempotencyLayer;
use serde_json::{Value, json};
use tower::{Layer, ServiceExt};

use crate::{
    plan::{Fault, Plan, Tool},
    world::Shared,
};

pub const PORT: u16 = 80;
/// Where the target serves its stdio face: each connection is one child process's stdin and
/// stdout, newline-delimited JSON-RPC.
pub const LINE_PORT: u16 = 81;
/// The longest line either end of a child's pipes reads (rmcp's own bound).
pub const MAX_LINE: usize = 16 * 1024 * 1024;
/// Where a stdio caller puts, in `params._meta`, what an HTTP caller sends as `x-sim-tag` and
/// `x-sim-actor` (the simulation's names for the attempt and its principal).
pub const TAG_META: &str = "sim/tag";
pub const ACTOR_META: &str = "sim/actor";

type Body = BoxBody<Bytes, std::io::Error>;

/// The target's software (restarted after a crash by the simulation). `keys`: the server
/// half's, when the plan puts it in front.
pub async fn serve(
    shared: Arc<Mutex<Shared>>,
    plan: Arc<Plan>,
    keys: Option<IdempotencyLayer>,
) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let (shared, plan, keys) = (shared.clone(), plan.clone(), keys.clone());
        tokio::task::spawn_local(async move {
            let http1 = hyper::server::conn::http1::Builder::new();
            let io = TokioIo::new(stream);
            let _ = match keys {
                Some(keys) => {
                    let tool = tower::service_fn(move |request| {
                        handle(shared.clone(), plan.clone(), request)
                    });
                    http1
                        .serve_connection(io, TowerToHyperService::new(keys.layer(tool)))
                        .await
                }
                None => {
                    let tool = tower::service_fn(move |request| {
                        handle(shared.clone(), plan.clone(), request)
                    });
                    http1
                        .serve_connection(io, TowerToHyperService::new(tool))
                        .await
                }
            };
        });
    }
}

/// The target's stdio face (restarted with the target): every connection is a child started
/// for one client, alive until either end closes it. Its `tools/call` lines run the same tools,
/// ground truth and faults as the HTTP face.
pub async fn serve_lines(
    shared: Arc<Mutex<Shared>>,
    plan: Arc<Plan>,
    keys: Option<IdempotencyLayer>,
) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", LINE_PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let (shared, plan, keys) = (shared.clone(), plan.clone(), keys.clone());
        tokio::task::spawn_local(child(shared, plan, keys, stream));
    }
}

/// What a child does with one line.
enum Reply {
    Line(Bytes),
    /// The child closes its stdout and exits: the answer is lost, and so is every other one
    /// it still owed.
    Exit,
    Nothing,
}

/// One child's life: each line is handled on a task of its own (runs overlap, so answers may
/// come out of request order), each answer written as one line when it is ready.
async fn child(
    shared: Arc<Mutex<Shared>>,
    plan: Arc<Plan>,
    keys: Option<IdempotencyLayer>,
    stream: turmoil::net::TcpStream,
) {
    use mcp_replay_guard::relay::lines::{Line, read_line, write_line};

    let (read, mut write) = stream.into_split();
    let mut reader = tokio::io::BufReader::new(read);
    let (out, mut replies) = tokio::sync::mpsc::unbounded_channel::<Reply>();
    let writing = async move {
        while let Some(reply) = replies.recv().await {
            match reply {
                Reply::Line(line) => {
                    if write_line(&mut write, &line).await.is_err() {
                        return;
                    }
                }
                Reply::Exit => return,
                Reply::Nothing => {}
            }
        }
    };
    let reading = async move {
        while let Ok(Some(Line::Message(line))) = read_line(&mut reader, MAX_LINE).await {
            let (shared, plan, keys, out) =
                (shared.clone(), plan.clone(), keys.clone(), out.clone());
            tokio::task::spawn_local(async move {
                let _ = out.send(reply(shared, plan, keys, line).await);
            });
        }
    };
    // Either end closing ends the child: its stdin (the client is gone) or its stdout.
    tokio::select! {
        () = writing => {}
        () = reading => {}
    }
}

/// The child's handling of one line: a `tools/call` goes through the same handler as an HTTP
/// request, its tag, actor and key read from `params._meta`; the HTTP outcome is turned into
/// what a stdio server does.
async fn reply(
    shared: Arc<Mutex<Shared>>,
    plan: Arc<Plan>,
    keys: Option<IdempotencyLayer>,
    line: Bytes,
) -> Reply {
    let Ok(message) = serde_json::from_slice::<Value>(&line) else {
        return Reply::Nothing;
    };
    let Some(id) = message.get("id").cloned() else {
        return Reply::Nothing;
    };
    if message.get("method").and_then(Value::as_str) != Some("tools/call") {
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {}});
        return Reply::Line(Bytes::from(answer.to_string()));
    }
    let meta = |name: &str| {
        message
            .pointer("/params/_meta")
            .and_then(|meta| meta.get(name))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut request = Request::post("http://target/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", plan.era.version())
        .header("x-sim-tag", meta(TAG_META))
        .header("x-sim-actor", meta(ACTOR_META));
    let key = meta(mcp_replay_guard::EXECUTION_ID_META_KEY);
    if !key.is_empty() {
        request = request.header("idempotency-key", key);
    }
    let request = request
        .body(http_body_util::Full::new(line))
        .expect("a valid request");
    // One handler each: behind the server half it takes the half's request body.
    let response = match keys {
        Some(keys) => match keys
            .layer(tower::service_fn(move |request| {
                handle(shared.clone(), plan.clone(), request)
            }))
            .oneshot(request)
            .await
        {
            Ok(response) => response.map(|body| body.map_err(std::io::Error::other).boxed()),
            Err(_) => return Reply::Exit,
        },
        None => match handle(shared, plan, request).await {
            Ok(response) => response,
            Err(_) => return Reply::Exit,
        },
    };
    let status = response.status();
    let sse = response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    // A cut stream is an answer lost after the effect.
    let Ok(body) = response.into_body().collect().await else {
        return Reply::Exit;
    };
    let body = body.to_bytes();
    let message = if sse {
        let text = String::from_utf8_lossy(&body);
        let Some(data) = text.lines().find_map(|l| l.strip_prefix("data:")) else {
            return Reply::Exit;
        };
        Bytes::from(data.trim().to_owned())
    } else {
        body
    };
    if matches!(status.as_u16(), 500 | 503) {
        // A stdio server has no status: a server that failed says so with an internal error,
        // which proves nothing about whether the tool ran.
        let error = json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": -32603, "message": format!("sim: status {status}")}});
        return Reply::Line(Bytes::from(error.to_string()));
    }
    // Any other answer is already a JSON-RPC message for its id (a 429 or a 409 carries a
    // server error, which proves nothing either).
    Reply::Line(message)
}

/// The value of header `name` of `request`, or empty.
pub fn header<B>(request: &Request<B>, name: &str) -> String {
    request
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// The JSON-RPC response for `id`.
pub fn tool_result(id: &Value, key: &str, n: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": {
        "content": [{"type": "text", "text": format!("sim-effect:{key} n={n}")}],
        "isError": false,
    }})
}

async fn handle<B>(
    shared: Arc<Mutex<Shared>>,
    plan: Arc<Plan>,
    request: Request<B>,
) -> Result<Response<Body>, std::io::Error>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tag = header(&request, "x-sim-tag");
    let actor = header(&request, "x-sim-actor");
    // A guarded call carries its execution ID; a read-only one is named by its attempt.
    let key = Some(header(&request, "idempotency-key"))
        .filter(|k| !k.is_empty())
        .unwrap_or_else(|| tag.clone());
    let bytes = request
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    let message: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let Some(tool) = message
        .pointer("/params/name")
        .and_then(Value::as_str)
        .and_then(Tool::from_name)
    else {
        return Ok(json_response(
            StatusCode::OK,
            &json!({"jsonrpc": "2.0", "id": id, "result": {}}),
        ));
    };
    let (call, attempt) = parse_tag(&tag);
    let fault = call.and_then(|c| plan.fault(c, attempt));
    let intent = intent_of(&actor, tool, &message);
    shared.lock().unwrap().note(format!(
        "target: {} {tag} key {key} fault {fault:?}",
        tool.name()
    ));
    match fault {
        Some(Fault::Status { code }) => {
            return Ok(json_response(
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "sim"}}),
            ));
        }
        Some(Fault::DropBeforeEffect) => return Err(std::io::Error::other("dropped")),
        _ => {}
    }
    let work_ms = match fault {
        Some(Fault::Slow { ms }) => ms,
        _ => 20,
    };
    // The tool runs in a task of its own: a client that hangs up does not stop it. The server
    // half calls this service from a task of its own, outside the host's local set: the task
    // is spawned on the host's runtime, which a crash of the target drops whole.
    let (done, answer) = tokio::sync::oneshot::channel();
    let honours = !plan.server_half;
    {
        let shared = shared.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let started = shared
                .lock()
                .unwrap()
                .start_work(tool, &key, &actor, &tag, honours);
            let n = match started {
                Started::Conflict => {
                    let _ = done.send(None);
                    return;
                }
                Started::Replay(n) => n,
                Started::Run => {
                    tokio::time::sleep(Duration::from_millis(work_ms)).await;
                    shared.lock().unwrap().finish_work(tool, &intent, &key)
                }
            };
            let _ = done.send(Some(n));
        });
    }
    let Ok(outcome) = answer.await else {
        return Err(std::io::Error::other("the target's work ended"));
    };
    let Some(n) = outcome else {
        return Ok(json_response(
            StatusCode::CONFLICT,
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "in flight"}}),
        ));
    };
    if let Some(Fault::ErrorAfterEffect { code }) = fault {
        // The work is done (and counted); the answer says only that something went wrong.
        let error = json!({"jsonrpc": "2.0", "id": id,
            "error": {"code": code, "message": "sim: failed after the effect"}});
        return Ok(if plan.sse {
            sse(&error, None)
        } else {
            json_response(StatusCode::OK, &error)
        });
    }
    let result = tool_result(&id, &key, n);
    match fault {
        Some(Fault::LostAfterEffect) => Err(std::io::Error::other("lost after the effect")),
        Some(Fault::CutAfter { frames }) => Ok(sse(&result, Some(frames))),
        _ if plan.sse => Ok(sse(&result, None)),
        _ => Ok(json_response(StatusCode::OK, &result)),
    }
}

/// `c<call>t<attempt>`.
pub fn parse_tag(tag: &str) -> (Option<u32>, u8) {
    let Some(rest) = tag.strip_prefix('c') else {
        return (None, 0);
    };
    let mut parts = rest.split('t');
    let call = parts.next().and_then(|c| c.parse().ok());
    let attempt = parts.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    (call, attempt)
}

/// The intent as the simulation names it: actor, tool and arguments (the scope is one).
pub fn intent_of(actor: &str, tool: Tool, message: &Value) -> String {
    let args = message
        .pointer("/params/arguments")
        .map(Value::to_string)
        .unwrap_or_default();
    format!("{actor}/{}/{args}", tool.name())
}

pub enum Started {
    Run,
    Replay(u64),
    Conflict,
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            http_body_util::Full::new(Bytes::from(body.to_string()))
                .map_err(|never: Infallible| match never {})
                .boxed(),
        )
        .expect("a valid response")
}

/// An SSE answer: a priming event, the message event, the end; cut after `cut` frames.
fn sse(result: &Value, cut: Option<u8>) -> Response<Body> {
    let frames = vec![
        Bytes::from_static(b": priming\n\n"),
        Bytes::from(format!("event: message\ndata: {result}\n\n")),
    ];
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(BoxBody::new(Frames {
            frames,
            next: 0,
            cut: cut.map(usize::from),
        }))
        .expect("a valid response")
}

struct Frames {
    frames: Vec<Bytes>,
    next: usize,
    cut: Option<usize>,
}

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.cut == Some(self.next) {
            return Poll::Ready(Some(Err(std::io::Error::other("stream cut"))));
        }
        let Some(frame) = self.frames.get(self.next).cloned() else {
            return Poll::Ready(None);
        };
        self.next += 1;
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }
}
