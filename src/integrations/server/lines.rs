//! The server half over a line transport: [`IdempotencyLayer::serve_lines`] between an MCP
//! client's newline-delimited JSON-RPC (a stdio server's stdin and stdout) and the server
//! that runs the tools.

use std::{future::Future, io, pin::pin};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::{
    io::{AsyncBufRead, AsyncWrite},
    sync::{Mutex, mpsc, oneshot},
};
use tower::ServiceExt;
use tower_layer::Layer;

use super::{Idempotency, IdempotencyLayer};
use crate::{
    BoxError,
    answer::jsonrpc_error,
    protocol::{
        RequestId,
        shape::{Shape, id_in_prefix, shape_of},
        transport::nothing_was_sent,
    },
    relay::{
        RELAY_ERROR, Wire, WireQueue,
        lines::{Line, read_line, write_line},
    },
};

/// The bound on one line from the server: rmcp's own bound on a line it reads (16 MiB). A
/// longer answer is not relayed; the call it answers has an unknown outcome.
pub const MAX_SERVER_LINE_BYTES: usize = 16 * 1024 * 1024;

/// The URI every relayed message is sent to inside the layer; [`IdempotencyLayer::target`]
/// names the server in the ledger instead.
const LINES_URI: &str = "http://stdio.invalid/mcp";

impl IdempotencyLayer {
    /// Serves an MCP client that speaks newline-delimited JSON-RPC (`client`: what it writes,
    /// what it reads; the process's stdin and stdout for a stdio server) through this layer to
    /// a server over another line transport (`server`: the server's output and input; one end
    /// of a [`tokio::io::duplex`] whose other end an rmcp server is served on, or a child
    /// process's pipes). Keys are read from `params._meta` too
    /// ([`key_from_meta(true)`](Self::key_from_meta)): a stdio client has no headers.
    ///
    /// ```no_run
    /// # async fn run(tools: impl rmcp::ServerHandler) -> Result<(), Box<dyn std::error::Error>> {
    /// use mcp_replay_guard::{
    ///     fingerprint::FingerprintKey, integrations::server::IdempotencyLayer, ledger::MemoryLedger,
    /// };
    /// use rmcp::ServiceExt;
    /// use tokio::io::{BufReader, duplex, split, stdin, stdout};
    ///
    /// let layer = IdempotencyLayer::new(MemoryLedger::new(), FingerprintKey::generate()?);
    /// // The rmcp server on one end of an in-process pipe, the layer on the other.
    /// let (server_end, relay_end) = duplex(64 * 1024);
    /// tokio::spawn(async move {
    ///     if let Ok(server) = tools.serve(server_end).await {
    ///         let _ = server.waiting().await;
    ///     }
    /// });
    /// let (from_server, to_server) = split(relay_end);
    /// let client = (BufReader::new(stdin()), stdout());
    /// layer.serve_lines(client, (BufReader::new(from_server), to_server)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # What each line gets
    ///
    /// - A request (a `tools/call`, keyed or not, and any other) runs through the layer, on a
    ///   task of its own; its answer (the server's, or a kept one re-keyed to this request's
    ///   id, or the layer's refusal) is written to the client as one line.
    /// - A notification, or the client's answer to a server request, is written to the server
    ///   in order, untouched. A server line that answers no waiting request goes to the client
    ///   untouched.
    /// - A line that is not JSON is answered with a JSON-RPC parse error (-32700, without an
    ///   id); a batch, and a line longer than [`max_body_bytes`](Self::max_body_bytes), with an
    ///   error for each id that can be found; nothing of them reaches the server. A server line
    ///   longer than [`MAX_SERVER_LINE_BYTES`] is never relayed.
    ///
    /// # When the server goes away
    ///
    /// When the server's output ends, every request written to it and not answered gets a
    /// JSON-RPC error that says its outcome is unknown (it may have run), never that it
    /// failed; a keyed call is recorded `unknown`, and a repeat of its key is refused with
    /// [`KEY_OUTCOME_UNKNOWN`](super::KEY_OUTCOME_UNKNOWN). A request not yet written is
    /// answered that nothing was sent (a keyed call among them is still recorded `unknown`:
    /// the layer takes any failure of the service below it for one). Then this returns.
    ///
    /// When the client's input ends, the answers still owed are written, the server's input is
    /// closed, and this returns. An I/O error writing to the client ends it too (after the
    /// same wait), as that error.
    pub fn serve_lines<CR, CW, SR, SW>(
        self,
        client: (CR, CW),
        server: (SR, SW),
    ) -> impl Future<Output = io::Result<()>>
    where
        CR: AsyncBufRead + Unpin,
        CW: AsyncWrite + Unpin + Send + 'static,
        SR: AsyncBufRead + Unpin,
        SW: AsyncWrite + Unpin,
    {
        let max = self.config.max_body_bytes;
        let (wire, queue) = Wire::new();
        let lines = Lines {
            service: self.key_from_meta(true).layer(wire.clone()),
            to_client: std::sync::Arc::new(ToClient {
                writer: Mutex::new(client.1),
                error: std::sync::Mutex::new(None),
            }),
        };
        serve(lines, wire, queue, client.0, server, max)
    }
}

async fn serve<CR, CW, SR, SW>(
    lines: Lines<CW>,
    wire: Wire,
    queue: WireQueue,
    client: CR,
    (from_server, to_server): (SR, SW),
    max: usize,
) -> io::Result<()>
where
    CR: AsyncBufRead + Unpin,
    CW: AsyncWrite + Unpin + Send + 'static,
    SR: AsyncBufRead + Unpin,
    SW: AsyncWrite + Unpin,
{
    // Each request task holds a clone of `owed`: when every clone is gone, every answer owed
    // to the client is written.
    let (owed, mut all_answered) = mpsc::channel::<()>(1);
    let server_result = {
        let mut server_side = pin!(server_side(&lines, &wire, queue, from_server, to_server));
        let mut client_side = pin!(client_side(&lines, &wire, client, max, owed));
        tokio::select! {
            // The client's input ended: the answers still owed come from the server. Then
            // dropping the server side closes the server's input.
            client_result = &mut client_side => tokio::select! {
                _ = all_answered.recv() => client_result,
                server_result = &mut server_side => client_result.and(server_result),
            },
            // The server is gone and every waiting request failed; the client side is dropped
            // with its hold on `owed`.
            server_result = &mut server_side => server_result,
        }
    };
    // The answers still owed (the failures of a server gone) are written.
    let _ = all_answered.recv().await;
    match lines.to_client.error.lock().map(|mut e| e.take()) {
        Ok(Some(error)) => Err(error),
        _ => server_result,
    }
}

/// The writer to the client, shared by the request tasks; and its first error.
struct ToClient<W> {
    writer: Mutex<W>,
    error: std::sync::Mutex<Option<io::Error>>,
}

impl<W: AsyncWrite + Unpin> ToClient<W> {
    /// Writes one line to the client; after a failed write, drops it (the client is gone).
    async fn write(&self, message: &[u8]) {
        let mut writer = self.writer.lock().await;
        if self.error.lock().is_ok_and(|e| e.is_some()) {
            return;
        }
        if let Err(error) = write_line(&mut *writer, message).await {
            tracing::warn!(%error, "an answer could not be written to the client");
            if let Ok(mut first) = self.error.lock() {
                first.get_or_insert(error);
            }
        }
    }
}

struct Lines<W> {
    service: Idempotency<Wire>,
    to_client: std::sync::Arc<ToClient<W>>,
}

/// Reads the client's lines until its input ends: each request on a task of its own, the rest
/// to the server in order.
async fn client_side<CR, CW>(
    lines: &Lines<CW>,
    wire: &Wire,
    mut client: CR,
    max: usize,
    owed: mpsc::Sender<()>,
) -> io::Result<()>
where
    CR: AsyncBufRead + Unpin,
    CW: AsyncWrite + Unpin + Send + 'static,
{
    while let Some(line) = read_line(&mut client, max).await? {
        let message = match line {
            Line::Message(message) => message,
            Line::TooLong(prefix) => {
                tracing::warn!(
                    max,
                    "a line from the client over the size bound was refused"
                );
                let why =
                    format!("the message is longer than the {max}-byte bound; nothing was sent");
                let answer = refusal(id_in_prefix(&prefix).as_ref(), RELAY_ERROR, why);
                lines.to_client.write(&answer).await;
                continue;
            }
        };
        match shape_of(&message) {
            Shape::Request(id) => {
                let service = lines.service.clone();
                let to_client = lines.to_client.clone();
                let owed = owed.clone();
                tokio::spawn(async move {
                    let answer = exchange(service, message, &id).await;
                    if !answer.is_empty() {
                        to_client.write(&answer).await;
                    }
                    drop(owed);
                });
            }
            Shape::Notification | Shape::Response(_) => {
                if let Err(error) = wire.notify(message).await {
                    tracing::warn!(%error, "a notification or response for the server was not written");
                }
            }
            Shape::ToolCallWithoutId => {
                tracing::warn!("a tools/call without an id was refused");
                let why = crate::protocol::shape::TOOL_CALL_WITHOUT_ID.to_owned();
                lines.to_client.write(&refusal(None, -32600, why)).await;
            }
            Shape::Batch(ids) => {
                tracing::warn!(requests = ids.len(), "a JSON-RPC batch was refused");
                let why = "a JSON-RPC batch is not relayed (no MCP revision over stdio has \
                           batches); send each message on its own; nothing was sent";
                if ids.is_empty() {
                    lines
                        .to_client
                        .write(&refusal(None, RELAY_ERROR, why.into()))
                        .await;
                }
                for id in ids {
                    let answer = refusal(Some(&id), RELAY_ERROR, why.into());
                    lines.to_client.write(&answer).await;
                }
            }
            Shape::Unreadable(why) => {
                tracing::warn!(%why, "a line from the client was refused");
                let answer = refusal(None, -32700, format!("{why}; nothing was sent"));
                lines.to_client.write(&answer).await;
            }
        }
    }
    Ok(())
}

/// Writes the wire's queue to the server and reads the server's lines, until its output ends;
/// then every request written and not answered fails (an unknown outcome).
async fn server_side<CW, SR, SW>(
    lines: &Lines<CW>,
    wire: &Wire,
    queue: WireQueue,
    mut from_server: SR,
    to_server: SW,
) -> io::Result<()>
where
    CW: AsyncWrite + Unpin + Send + 'static,
    SR: AsyncBufRead + Unpin,
    SW: AsyncWrite + Unpin,
{
    let (stop, stopped) = oneshot::channel();
    let (writer_done, writer_stopped) = oneshot::channel();
    let write = async {
        let result = write_server(queue, to_server, stopped).await;
        let _ = writer_done.send(());
        result
    };
    let read = async {
        let result = loop {
            match read_line(&mut from_server, MAX_SERVER_LINE_BYTES).await {
                Ok(Some(Line::Message(message))) => {
                    if let Some(message) = wire.route(message) {
                        lines.to_client.write(&message).await;
                    }
                }
                Ok(Some(Line::TooLong(prefix))) => {
                    wire.answer_too_large(&prefix, MAX_SERVER_LINE_BYTES);
                }
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
        };
        tracing::info!("the server's output ended");
        // The writer stops first: a request written after the waiting ones fail would wait
        // for ever. What it has not written is refused, unsent.
        let _ = stop.send(());
        let _ = writer_stopped.await;
        wire.peer_gone();
        result
    };
    let (written, read) = tokio::join!(write, read);
    if let Err(error) = written {
        tracing::warn!(%error, "writing to the server failed");
    }
    read
}

/// Writes each message of the queue to the server until told to stop or a write fails; then
/// refuses, unwritten, every message that comes after.
async fn write_server<W: AsyncWrite + Unpin>(
    mut queue: WireQueue,
    mut writer: W,
    stop: oneshot::Receiver<()>,
) -> io::Result<()> {
    let mut stop = pin!(stop);
    let result = loop {
        let next = tokio::select! {
            biased;
            _ = &mut stop => break Ok(()),
            next = queue.next() => next,
        };
        let Some(outgoing) = next else { break Ok(()) };
        match write_line(&mut writer, outgoing.message()).await {
            Ok(()) => outgoing.written(),
            Err(error) => {
                // A line written in part is no proof that the server did not act on it.
                let copy = io::Error::new(error.kind(), error.to_string());
                outgoing.failed(error);
                break Err(copy);
            }
        }
    };
    drop(writer);
    tokio::spawn(async move {
        while let Some(outgoing) = queue.next().await {
            outgoing.not_written("the server is gone");
        }
    });
    result
}

/// One request through the layer and the wire: the line to answer it with.
async fn exchange(service: Idempotency<Wire>, message: Bytes, id: &RequestId) -> Bytes {
    let error: BoxError = match service.oneshot(Wire::request(LINES_URI, message)).await {
        Ok(response) => match response.into_body().collect().await {
            Ok(body) => return body.to_bytes(),
            Err(never) => match never {},
        },
        Err(error) => error,
    };
    let cause = std::iter::successors(Some(&*error as &(dyn std::error::Error + 'static)), |e| {
        e.source()
    })
    .map(ToString::to_string)
    .collect::<Vec<_>>()
    .join(": ");
    let text = if nothing_was_sent(&*error) {
        format!("replay-guard: {cause}; the request was not sent to the server")
    } else {
        format!(
            "replay-guard: {cause}; the request was written to the server, which may have run \
             it: its outcome is unknown. Check its effect before sending it again (a repeat of \
             an Idempotency-Key is refused)"
        )
    };
    tracing::warn!(error = %text, "a request was answered with an error");
    refusal(Some(id), RELAY_ERROR, text)
}

fn refusal(id: Option<&RequestId>, code: i64, message: String) -> Bytes {
    jsonrpc_error(StatusCode::BAD_REQUEST, id, code, message).into_body()
}
