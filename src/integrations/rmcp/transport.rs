//! [`GuardedTransport`]: the guard around any rmcp client transport.

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
};

use bytes::Bytes;
use rmcp::{
    RoleClient,
    model::{ClientJsonRpcMessage, ServerJsonRpcMessage},
    transport::{IntoTransport, Transport},
};
use tokio::sync::oneshot;

use crate::{
    guard::GuardLayer,
    relay::{ClientQueue, Relay, WireQueue},
};

/// The guard around any rmcp client transport: a child process over stdio
/// (`TokioChildProcess`), an in-memory duplex, a socket, rmcp's Streamable HTTP transport.
///
/// Every message rmcp sends goes through a [`Relay`]: each `tools/call` is classified,
/// fingerprinted and given an execution, recorded `dispatched` (durably, in a file or
/// PostgreSQL ledger) before the inner transport is asked to send it, and each repeat is
/// decided from the ledger, as the HTTP [`GuardLayer`] decides it: attach to the attempt in
/// flight, the kept result, a re-send under the same key for an idempotent tool, a probe, or
/// the honest "held for review" answer. When the inner transport closes with calls in flight,
/// each is recorded `unknown` and answered with the guard's uncertain result for its id;
/// rmcp's `call_tool` returns it (`is_error: true`, the execution in its structured
/// content). Over a transport without headers, put the execution ID into `params._meta` too
/// ([`GuardLayer::execution_id_in_meta`]); a server behind the crate's server half
/// ([`IdempotencyLayer::serve_lines`](crate::integrations::server::IdempotencyLayer)) honours it.
///
/// One line in an rmcp client:
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use mcp_replay_guard::{
///     contract::{ContractRegistry, ToolContract},
///     guard::GuardLayer,
///     integrations::rmcp::GuardedTransport,
///     ledger::FileLedger,
/// };
/// use rmcp::{ServiceExt, transport::TokioChildProcess};
///
/// let ledger = FileLedger::open("/var/lib/agent/ledger.jsonl")?;
/// let key = ledger.fingerprint_key()?;
/// let contracts = ContractRegistry::builder()
///     .tool("deploy_release", ToolContract::irreversible())
///     .tool("set_flag", ToolContract::idempotent())
///     .build()?;
/// let guard = GuardLayer::new(ledger, contracts, key).execution_id_in_meta(true);
/// let server = TokioChildProcess::new(tokio::process::Command::new("my-mcp-server"))?;
/// let client = ().serve(GuardedTransport::new(&guard, server)).await?;
/// # Ok(())
/// # }
/// ```
///
/// For Streamable HTTP, [`TowerHttpClient`](super::TowerHttpClient) under the guard keeps
/// what only HTTP has (`Idempotency-Key` headers, statuses, stream resumption); this wrapper
/// works over rmcp's HTTP transport too, with what any transport has.
///
/// An answer counts as delivered once rmcp took it from [`receive`](Transport::receive) and
/// then sent its next message through this transport (the rule of
/// [`Deliveries`](crate::guard::Deliveries)); an answer rmcp took last, before it closed the
/// transport, stays completed and undelivered, and a repeat gets the kept result.
///
/// A guard layer shared by two transports (a client and the one it starts after its server
/// died) shares its in-flight table and ledger: the repeat after the restart is decided from
/// what the first one recorded.
pub struct GuardedTransport {
    /// Taken by the driver when the inner transport closes: once the answers owed for what
    /// was in flight are out, [`receive`](Transport::receive) ends, as rmcp expects.
    relay: Shared,
    answers: ClientQueue,
    close: Option<oneshot::Sender<()>>,
    driver: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for GuardedTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedTransport").finish_non_exhaustive()
    }
}

type Shared = Arc<Mutex<Option<Relay>>>;

fn relay_of(shared: &Shared) -> Option<Relay> {
    shared
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Why a message could not be handed to the guard.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardedTransportError {
    /// The message could not be written as JSON.
    #[error("the message could not be written as JSON: {0}")]
    Encode(#[from] serde_json::Error),
    /// The inner transport is closed: nothing was sent.
    #[error("the transport is closed; nothing was sent")]
    Closed,
    /// The inner transport failed to close.
    #[error("the inner transport failed to close: {0}")]
    Close(String),
}

impl GuardedTransport {
    /// The guard `layer` around `transport` (anything rmcp turns into a client transport).
    /// Its driver runs on the current tokio runtime.
    pub fn new<T, E, A>(layer: &GuardLayer, transport: T) -> Self
    where
        T: IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let (relay, wire, answers) = Relay::new(layer);
        let (close, closed) = oneshot::channel();
        let shared = Arc::new(Mutex::new(Some(relay)));
        let driver = tokio::spawn(drive(
            transport.into_transport(),
            shared.clone(),
            wire,
            closed,
        ));
        Self {
            relay: shared,
            answers,
            close: Some(close),
            driver: Some(driver),
        }
    }
}

/// Owns the inner transport: writes what the wire has for it, hands what it receives to the
/// relay, until it closes (its calls in flight are then unknown) or rmcp closes this one.
async fn drive<T: Transport<RoleClient>>(
    mut transport: T,
    shared: Shared,
    mut wire: WireQueue,
    mut closed: oneshot::Receiver<()>,
) {
    let Some(relay) = relay_of(&shared) else {
        return;
    };
    loop {
        tokio::select! {
            outgoing = wire.next() => {
                let Some(outgoing) = outgoing else { break };
                let message = match serde_json::from_slice::<ClientJsonRpcMessage>(outgoing.message()) {
                    Ok(message) => message,
                    Err(error) => {
                        outgoing.not_written(format!("rmcp cannot carry the message: {error}"));
                        continue;
                    }
                };
                // The send future is rmcp's and 'static: a transport error after it began may
                // have put the message on the wire.
                match transport.send(message).await {
                    Ok(()) => outgoing.written(),
                    Err(error) => outgoing.failed(error),
                }
            }
            received = transport.receive() => match received {
                Some(message) => match serde_json::to_vec(&message) {
                    Ok(bytes) => relay.from_server(Bytes::from(bytes)).await,
                    Err(error) => tracing::warn!(%error, "a server message could not be read back"),
                },
                None => break,
            },
            _ = &mut closed => break,
        }
    }
    relay.server_gone();
    drop(wire);
    shared.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Err(error) = transport.close().await {
        tracing::warn!(%error, "closing the inner transport failed");
    }
}

impl Transport<RoleClient> for GuardedTransport {
    type Error = GuardedTransportError;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let relay = relay_of(&self.relay);
        let bytes = serde_json::to_vec(&item).map(Bytes::from);
        async move {
            let relay = relay.ok_or(GuardedTransportError::Closed)?;
            relay.from_client(bytes?).await;
            Ok(())
        }
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            let answer = self.answers.next().await?;
            match serde_json::from_slice::<ServerJsonRpcMessage>(answer.message()) {
                Ok(message) => {
                    // In rmcp's hands now; delivered once rmcp sends its next message.
                    answer.written();
                    return Some(message);
                }
                Err(error) => {
                    tracing::warn!(%error, "a message for rmcp could not be read; dropped")
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
        match self.driver.take() {
            Some(driver) => driver
                .await
                .map_err(|error| GuardedTransportError::Close(error.to_string())),
            None => Ok(()),
        }
    }
}
