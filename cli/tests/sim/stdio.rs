//! An agent process as a stdio MCP host: its calls are the one client of a line stream to a
//! child the target runs, through the crate's `Relay`.
//!
//! The child is started (a connection to the target's line port) when a call needs it and none
//! lives; each child life has its relay, built from the process's `GuardLayer`, and a driver
//! that writes the relay's wire queue to the child's stdin and hands every line of its stdout
//! to the relay, until the stdout ends (`server_gone`: every call in flight gets the guard's
//! honest answer). The calls of the process write their requests through `from_client` and
//! wait for their answers by JSON-RPC id from one reader of what the relay has for the client,
//! which marks an answer `written` as it hands it to its caller: the next message of any call
//! of the process proves the client read on, as a host reading its stdout does.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    future::Future,
    pin::Pin,
    rc::Rc,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use mcp_replay_guard::{
    guard::GuardLayer,
    relay::{
        ClientQueue, Relay, WireQueue,
        lines::{Line, read_line},
    },
};
use serde_json::Value;
use tokio::{io::AsyncWriteExt, sync::oneshot};

use crate::{
    target::{self, ACTOR_META, LINE_PORT, MAX_LINE, TAG_META},
    world::Shared,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The stdio client of one life of agent process `p`: a tower service over which the
/// simulation's callers send their HTTP-shaped requests unchanged (their `x-sim-tag` and
/// `x-sim-actor` go into `params._meta`, as a stdio caller has no headers).
#[derive(Clone)]
pub struct StdioClient(Rc<Inner>);

struct Inner {
    shared: Arc<Mutex<Shared>>,
    p: usize,
    layer: GuardLayer,
    /// The relay of the child alive now, and its life's number.
    child: RefCell<Option<(Relay, u64)>>,
    lives: Cell<u64>,
    /// The plan kills the host now (an answer was just written to it): from here on it sends
    /// nothing, which would prove it read on.
    dying: Cell<bool>,
    /// The callers waiting for their answer, by JSON-RPC id (as JSON text).
    waiting: RefCell<HashMap<String, oneshot::Sender<Bytes>>>,
}

impl StdioClient {
    pub fn new(shared: Arc<Mutex<Shared>>, p: usize, layer: GuardLayer) -> Self {
        Self(Rc::new(Inner {
            shared,
            p,
            layer,
            child: RefCell::default(),
            lives: Cell::new(0),
            dying: Cell::new(false),
            waiting: RefCell::default(),
        }))
    }

    fn note(&self, text: String) {
        self.0.shared.lock().unwrap().note(text);
    }

    /// The relay of the live child, starting one if none lives. The relay takes the calls at
    /// once, as the guard over HTTP does; the child's stdin is written once it is up, and a
    /// child that cannot start takes nothing (its calls are refused unsent).
    fn relay(&self) -> Relay {
        if let Some((relay, _)) = &*self.0.child.borrow() {
            return relay.clone();
        }
        let life = self.0.lives.get() + 1;
        self.0.lives.set(life);
        let (relay, wire, answers) = Relay::new(&self.0.layer);
        *self.0.child.borrow_mut() = Some((relay.clone(), life));
        tokio::task::spawn_local(self.clone().drive(relay.clone(), wire, life));
        tokio::task::spawn_local(self.clone().read_answers(answers));
        relay
    }

    /// Starts the child, writes the wire queue to its stdin and hands its stdout's lines to
    /// the relay, until the stdout ends; then the child is gone, and the next call starts
    /// another.
    async fn drive(self, relay: Relay, mut wire: WireQueue, life: u64) {
        let p = self.0.p;
        match turmoil::net::TcpStream::connect(("target", LINE_PORT)).await {
            Ok(stream) => {
                self.note(format!("p{p}: child {life} is up (stdio)"));
                let (read, mut write) = stream.into_split();
                let mut reader = tokio::io::BufReader::new(read);
                let reading = async {
                    loop {
                        match read_line(&mut reader, MAX_LINE).await {
                            Ok(Some(Line::Message(line))) => relay.from_server(line).await,
                            Ok(Some(Line::TooLong(prefix))) => {
                                relay.server_message_too_large(&prefix, MAX_LINE)
                            }
                            Ok(None) | Err(_) => return,
                        }
                    }
                };
                let writing = write_in_order(&mut wire, &mut write);
                tokio::pin!(reading, writing);
                // A stdin that fails does not end the stdout: what the child still writes is
                // read.
                tokio::select! {
                    () = &mut reading => {}
                    _ = &mut writing => (&mut reading).await,
                }
                self.note(format!("p{p}: the stdout of child {life} ended"));
            }
            Err(error) => self.note(format!("p{p}: child {life} does not start: {error}")),
        }
        if self
            .0
            .child
            .borrow()
            .as_ref()
            .is_some_and(|(_, live)| *live == life)
        {
            self.0.child.borrow_mut().take();
        }
        // What still waits for this child's stdin is refused unwritten; what it took and did
        // not answer gets the guard's answer for an unknown outcome.
        drop(wire);
        relay.server_gone();
    }

    /// Hands each answer the relay has for the client to the caller waiting for its id, and
    /// marks it written then: the host has it. An answer whose caller stopped waiting is read
    /// by nobody, so it is never marked.
    async fn read_answers(self, mut answers: ClientQueue) {
        while let Some(answer) = answers.next().await {
            let id = serde_json::from_slice::<Value>(answer.message())
                .ok()
                .and_then(|message| message.get("id").map(Value::to_string))
                .unwrap_or_default();
            let Some(caller) = self.0.waiting.borrow_mut().remove(&id) else {
                continue;
            };
            let message = answer.message().clone();
            answer.written();
            let dies = self.0.shared.lock().unwrap().answer_written(self.0.p);
            if dies {
                self.0.dying.set(true);
                // Killed between the relay's write and the host's read: the caller never
                // reads it (the simulation carries out the crash before its next step).
                std::future::pending::<()>().await;
            }
            let _ = caller.send(message);
        }
    }

    async fn exchange(
        self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Full<Bytes>>, BoxError> {
        let (tag, actor) = (
            target::header(&request, "x-sim-tag"),
            target::header(&request, "x-sim-actor"),
        );
        let body = request.into_body().collect().await?.to_bytes();
        let mut message: Value = serde_json::from_slice(&body)?;
        if let Some(params) = message.get_mut("params").and_then(Value::as_object_mut) {
            let meta = params
                .entry("_meta")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert(TAG_META.into(), tag.into());
                meta.insert(ACTOR_META.into(), actor.into());
            }
        }
        let id = message.get("id").map(Value::to_string).unwrap_or_default();
        if self.0.dying.get() {
            std::future::pending::<()>().await;
        }
        let relay = self.relay();
        let (tx, rx) = oneshot::channel();
        self.0.waiting.borrow_mut().insert(id.clone(), tx);
        // A caller that stops waiting takes its id out: its answer is read by nobody.
        let mut unwait = Unwait {
            client: self.clone(),
            id,
            relay: relay.clone(),
            answered: false,
        };
        relay.from_client(Bytes::from(message.to_string())).await;
        let answer = rx.await.map_err(|_| "the relay ended without an answer")?;
        unwait.answered = true;
        let mut response = Response::new(Full::new(answer));
        *response.status_mut() = StatusCode::OK;
        Ok(response)
    }
}

/// Writes the wire queue to the child's stdin, each line as it comes: several requests may be
/// written and unanswered at once, and the child answers each when it is ready.
async fn write_in_order(wire: &mut WireQueue, write: &mut turmoil::net::tcp::OwnedWriteHalf) {
    while let Some(outgoing) = wire.next().await {
        let mut taken = 0;
        let written = async {
            for part in [&outgoing.message()[..], b"\n"] {
                let mut rest = part;
                while !rest.is_empty() {
                    let n = write.write(rest).await?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::WriteZero.into());
                    }
                    taken += n;
                    rest = &rest[n..];
                }
            }
            write.flush().await
        };
        let result: std::io::Result<()> = written.await;
        match result {
            Ok(()) => outgoing.written(),
            // Nothing of it taken: the child's stdin was closed before it.
            Err(error) if taken == 0 => {
                outgoing.not_written(format!("the child's stdin is closed ({error})"));
                return;
            }
            Err(error) => {
                outgoing.failed(error);
                return;
            }
        }
    }
}

/// A caller's wait for its answer: when it ends without one (the caller gave up), its id is
/// taken out, and in a plan whose host cancels, `notifications/cancelled` goes to the child
/// through the relay the request went through (as an SDK's request timeout sends it).
struct Unwait {
    client: StdioClient,
    /// The request's JSON-RPC id, as JSON text.
    id: String,
    relay: Relay,
    answered: bool,
}

impl Drop for Unwait {
    fn drop(&mut self) {
        let inner = &self.client.0;
        inner.waiting.borrow_mut().remove(&self.id);
        let cancels = inner.shared.lock().unwrap().stdio_cancels();
        if self.answered || !cancels || inner.dying.get() {
            return;
        }
        let Ok(request_id) = serde_json::from_str::<Value>(&self.id) else {
            return;
        };
        self.client.note(format!(
            "p{}: cancels {} (its caller gave up)",
            inner.p, self.id
        ));
        let cancel = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "the caller gave up waiting"}});
        let relay = self.relay.clone();
        tokio::task::spawn_local(async move {
            relay.from_client(Bytes::from(cancel.to_string())).await;
        });
    }
}

impl tower::Service<Request<Full<Bytes>>> for StdioClient {
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        Box::pin(self.clone().exchange(request))
    }
}
