//! The guard over a message transport: stdio, or any transport that carries JSON-RPC messages
//! one at a time instead of HTTP requests.
//!
//! A [`Relay`] sits between a client and a server that exchange JSON-RPC messages (the lines
//! of a stdio server, the messages of an rmcp transport). It runs the same [`Guard`] as the
//! HTTP layer, over a [`Wire`]: every client request becomes one guarded exchange, every
//! `tools/call` is classified, fingerprinted, recorded `dispatched` (durably) before the wire
//! writes it, and every repeat is decided from the ledger exactly as over HTTP. Requests and
//! notifications reach the wire in the client's order (a `notifications/cancelled` never
//! before its call), notifications and the client's answers to server requests untouched;
//! server messages that answer no guarded request go to the client untouched. An answer the
//! driver wrote to the client is `delivered` once the client's next message comes
//! ([`Deliveries`]).
//!
//! What the relay adds for a transport without HTTP:
//!
//! - **The peer goes away.** [`Relay::server_gone`] fails every request written and not
//!   answered: each guarded call becomes `unknown`, and its client gets the guard's honest
//!   answer (the outcome is unknown, execution `act_…`, what a repeat will do), never a made-up
//!   failure and never silence.
//! - **No headers.** The execution's key travels in `params._meta` when the contract or the
//!   guard asks for it ([`GuardLayer::execution_id_in_meta`]).
//! - **Every request is answered.** A message that is not JSON, a batch (no MCP revision
//!   over stdio has them), a request whose id is already waiting: each is answered with a
//!   JSON-RPC error that says nothing was sent.
//!
//! The driver of the transport owns two queues: the [`WireQueue`] it writes to the server
//! from, and the [`ClientQueue`] of what goes to the client. `replay-guard stdio` and
//! [`integrations::rmcp::GuardedTransport`](crate::integrations) are two such drivers.

pub mod lines;
mod order;
#[cfg(test)]
mod tests;
mod wire;

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tower::ServiceExt;
use tower_layer::Layer;

use wire::TurnOnWire;
pub use wire::{Cancelled, Outgoing, PeerGone, Wire, WireQueue};

use crate::{
    ExecutionId,
    guard::{Deliveries, Delivery, Guard, GuardError, GuardLayer},
    protocol::{
        self, Era, RequestId,
        shape::{Shape, shape_of},
    },
    tools::jsonrpc_error,
};

/// The JSON-RPC error code of the relay's own refusals and failures.
pub const RELAY_ERROR: i64 = -32603;

/// The URI every relayed message is sent to inside the guard; a [`Target`](crate::Target) set
/// on the layer names the server in the ledger instead.
const RELAY_URI: &str = "http://relay.invalid/mcp";

/// How many answers wait for the client before the relay waits too.
const CLIENT_QUEUE: usize = 64;

/// One message for the client.
#[derive(Debug)]
pub struct ToClient {
    message: Bytes,
    delivery: Option<Delivery>,
    deliveries: Arc<Deliveries>,
}

impl ToClient {
    /// The message, one JSON-RPC object.
    pub fn message(&self) -> &Bytes {
        &self.message
    }

    /// The driver wrote the whole message to the client and flushed it. A guarded call's
    /// execution is recorded `delivered` once the client proves it read on: its next message
    /// through [`Relay::from_client`] ([`Deliveries`], the one rule for every channel). Not
    /// calling it, or no next message, leaves the execution completed and undelivered, so
    /// that a repeat gets the kept result.
    pub fn written(self) {
        if let Some(delivery) = self.delivery {
            self.deliveries.written(delivery);
            self.deliveries.flushed();
        }
    }
}

/// What the relay has for the client, in the order it was ready.
#[derive(Debug)]
pub struct ClientQueue(mpsc::Receiver<ToClient>);

impl ClientQueue {
    /// The next message for the client; `None` once the relay and every answer it owed are
    /// gone.
    pub async fn next(&mut self) -> Option<ToClient> {
        self.0.recv().await
    }
}

/// The guard between a client and a server that exchange JSON-RPC messages; see the
/// [module docs](self). Clones share the guard, the wire and the client queue.
#[derive(Debug, Clone)]
pub struct Relay {
    guard: Guard<Wire>,
    wire: Wire,
    to_client: mpsc::Sender<ToClient>,
    deliveries: Arc<Deliveries>,
    /// How many requests have not yet had their answer queued for the client.
    unanswered: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Relay {
    /// A relay guarded by `layer`, with the queue its transport writes to the server from and
    /// the queue of what goes to the client.
    pub fn new(layer: &GuardLayer) -> (Self, WireQueue, ClientQueue) {
        let (wire, wire_queue) = Wire::new();
        let (to_client, client_queue) = mpsc::channel(CLIENT_QUEUE);
        let relay = Self {
            guard: layer.layer(wire.clone()),
            wire,
            to_client,
            deliveries: Arc::default(),
            unanswered: Arc::new(tokio::sync::watch::Sender::new(0)),
        };
        (relay, wire_queue, ClientQueue(client_queue))
    }

    /// The guard, for what it offers beyond relaying (its ledger, `unanswered`).
    pub fn guard(&self) -> &Guard<Wire> {
        &self.guard
    }

    /// One message from the client. It first proves the client read on: every answer
    /// [written](ToClient::written) before it is recorded `delivered`. Every message then
    /// reaches the wire in the client's order. A request runs as a task of its own (its
    /// answer reaches the [`ClientQueue`] when it is ready); anything else is written to the
    /// wire before this returns. Never fails: what cannot be sent is answered.
    pub async fn from_client(&self, message: Bytes) {
        self.deliveries.confirm().await;
        match shape_of(&message) {
            Shape::Request(id) => {
                let relay = self.clone();
                let turn = TurnOnWire::new(self.wire.turn());
                self.unanswered.send_modify(|n| *n += 1);
                // In the caller's span: a request's trace goes on in its task.
                let exchange = async move {
                    let answer = relay.exchange(message, id, turn).await;
                    if let Some(answer) = answer {
                        let _ = relay.to_client.send(answer).await;
                    }
                    relay.unanswered.send_modify(|n| *n -= 1);
                };
                tokio::spawn(tracing::Instrument::in_current_span(exchange));
            }
            Shape::Notification => {
                let turn = self.wire.turn();
                if let Err(error) = self.wire.notify_in_turn(message, Some(turn)).await {
                    tracing::warn!(%error, "a notification for the server was not written");
                }
            }
            // An answer to the server's own request (an elicitation a call waits for) waits
            // for no turn: a request before it may be waiting on that very call.
            Shape::Response(_) => {
                if let Err(error) = self.wire.notify(message).await {
                    tracing::warn!(%error, "a response for the server was not written");
                }
            }
            Shape::ToolCallWithoutId => {
                tracing::warn!("a tools/call without an id was refused");
                let why = protocol::shape::TOOL_CALL_WITHOUT_ID.to_owned();
                let answer = jsonrpc_error(StatusCode::BAD_REQUEST, None, -32600, why);
                self.push(answer.into_body(), None).await;
            }
            Shape::Batch(ids) => {
                tracing::warn!(requests = ids.len(), "a JSON-RPC batch was refused");
                let why = "a JSON-RPC batch is not relayed (no MCP revision over this transport has \
                           batches); send each message on its own; nothing was sent";
                if ids.is_empty() {
                    self.refuse(None, why).await;
                }
                for id in ids {
                    self.refuse(Some(&id), why).await;
                }
            }
            Shape::Unreadable(why) => {
                tracing::warn!(%why, "a message from the client was refused");
                // A cut line still names its id when its start does.
                let id = protocol::shape::id_in_prefix(&message);
                let answer = jsonrpc_error(
                    StatusCode::BAD_REQUEST,
                    id.as_ref(),
                    -32700,
                    format!("{why}; nothing was sent"),
                );
                self.push(answer.into_body(), None).await;
            }
        }
    }

    /// One message from the server: the answer to a request the relay wrote, or something
    /// for the client (a notification, a server request, an answer to nobody's request).
    pub async fn from_server(&self, message: Bytes) {
        if let Some(message) = self.wire.route(message) {
            self.push(message, None).await;
        }
    }

    /// The server went away (its process ended, its transport closed): every request written
    /// and not answered fails, and each guarded call among them is answered with the guard's
    /// honest answer for its outcome, `unknown`.
    pub fn server_gone(&self) {
        self.wire.peer_gone();
    }

    /// Resolves once every request from the client so far has its answer queued for the
    /// client ([`ClientQueue`]).
    pub async fn answered(&self) {
        let mut unanswered = self.unanswered.subscribe();
        let _ = unanswered.wait_for(|n| *n == 0).await;
    }

    /// A message from the client over the transport's size bound, of which `prefix` is the
    /// start: refused unsent, answered for its id when the prefix names it. Like any message,
    /// it proves the client read on.
    pub async fn client_message_too_large(&self, prefix: &[u8], max: usize) {
        self.deliveries.confirm().await;
        let id = protocol::shape::id_in_prefix(prefix);
        tracing::warn!(
            max,
            "a message from the client over the size bound was refused"
        );
        let why = format!("the message is longer than the {max}-byte bound; nothing was sent");
        self.refuse(id.as_ref(), &why).await;
    }

    /// A message from the server over the transport's size bound, of which `prefix` is the
    /// start: never handed on. When it answers a request the relay wrote (its id is in the
    /// prefix), that request's answer is lost: a guarded call's outcome is `unknown`, and the
    /// client gets the guard's honest answer for it.
    pub fn server_message_too_large(&self, prefix: &[u8], max: usize) {
        self.wire.answer_too_large(prefix, max);
    }

    /// Answers the client with a JSON-RPC error for `id` (`None`: for a request that could not
    /// be read), saying why; nothing is sent to the server.
    pub async fn refuse(&self, id: Option<&RequestId>, why: &str) {
        let answer = jsonrpc_error(StatusCode::BAD_REQUEST, id, RELAY_ERROR, why.into());
        self.push(answer.into_body(), None).await;
    }

    async fn push(&self, message: Bytes, delivery: Option<Delivery>) {
        let _ = self.to_client.send(self.to_client(message, delivery)).await;
    }

    fn to_client(&self, message: Bytes, delivery: Option<Delivery>) -> ToClient {
        ToClient {
            message,
            delivery,
            deliveries: self.deliveries.clone(),
        }
    }

    /// One request through the guard and the wire; its answer, or none for an answer with no
    /// body (there is none for a request, but the guard's pass-through would give it).
    async fn exchange(&self, message: Bytes, id: RequestId, turn: TurnOnWire) -> Option<ToClient> {
        let mut request = Wire::request(RELAY_URI, message.clone());
        request.extensions_mut().insert(turn);
        let error = match self.guard.clone().oneshot(request).await {
            Ok(response) => {
                let execution = response.extensions().get::<ExecutionId>().copied();
                let mut body = response.into_body();
                let delivery = body.defer_delivery();
                match body.collect().await {
                    Ok(body) => {
                        let bytes = body.to_bytes();
                        return (!bytes.is_empty()).then(|| self.to_client(bytes, delivery));
                    }
                    // The wire's bodies are whole; a guard's own answer cannot fail either.
                    Err(error) => match execution {
                        Some(execution) => GuardError::unknown(execution, error),
                        None => GuardError::inner(error),
                    },
                }
            }
            Err(error) => error,
        };
        let answer = self.answer_failure(&message, &id, &error).await;
        Some(self.to_client(answer, None))
    }

    /// The answer to a request the guard could not answer itself: for a guarded call whose
    /// outcome is unknown, the guard's record of it; otherwise what failed, and that nothing
    /// was sent where that is so.
    async fn answer_failure(&self, message: &Bytes, id: &RequestId, error: &GuardError) -> Bytes {
        let era = protocol::classify_bytes(&http::Method::POST, &http::HeaderMap::new(), message)
            .map_or(Era::Sessions, |c| c.era());
        if let (Some(execution), false) = (error.execution_id(), error.is_not_sent()) {
            match self.guard.unanswered(execution, id, era).await {
                Ok(Some(answer)) => return answer.into_body(),
                Ok(None) => {}
                Err(ledger) => tracing::error!(error = %ledger, "the ledger could not be read"),
            }
        }
        let cause = std::iter::successors(Some(error as &(dyn std::error::Error + 'static)), |e| {
            e.source()
        })
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ");
        let text = match (error.is_not_sent(), error.execution_id()) {
            (true, Some(execution)) => {
                format!("replay-guard: {cause}; the call was not sent (execution {execution})")
            }
            (true, None) => format!("replay-guard: {cause}; nothing was sent"),
            _ => format!("replay-guard: {cause}"),
        };
        tracing::warn!(error = %text, "a request was answered with an error");
        jsonrpc_error(StatusCode::BAD_GATEWAY, Some(id), RELAY_ERROR, text).into_body()
    }
}
