//! The MCP clients behind the proxy, as they named themselves: in the session era a session's
//! `clientInfo` is in the `initialize` that opened it, so the proxy remembers it (bounded) by
//! the `Mcp-Session-Id` the upstream answered with, until the session is deleted. (A
//! 2026-07-28 request names its client in its own `_meta`: the guard reads that itself.)

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
};

use mcp_replay_guard::execution::ClientInfo;
use serde::Deserialize;

/// How many sessions' clients are remembered; the oldest is forgotten first.
const MAX_SESSIONS: usize = 10_000;

/// Session id → the client that opened it.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    inner: Mutex<Remembered>,
}

#[derive(Debug, Default)]
struct Remembered {
    clients: HashMap<String, ClientInfo>,
    /// Oldest first.
    order: VecDeque<String>,
}

impl Sessions {
    fn remembered(&self) -> std::sync::MutexGuard<'_, Remembered> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn remember(&self, session: &str, client: ClientInfo) {
        let mut remembered = self.remembered();
        if remembered
            .clients
            .insert(session.to_owned(), client)
            .is_none()
        {
            remembered.order.push_back(session.to_owned());
        }
        while remembered.clients.len() > MAX_SESSIONS {
            let Some(oldest) = remembered.order.pop_front() else {
                break;
            };
            remembered.clients.remove(&oldest);
        }
    }

    pub(super) fn client(&self, session: &str) -> Option<ClientInfo> {
        self.remembered().clients.get(session).cloned()
    }

    pub(super) fn forget(&self, session: &str) {
        let mut remembered = self.remembered();
        if remembered.clients.remove(session).is_some() {
            remembered.order.retain(|s| s != session);
        }
    }
}

/// The `clientInfo` of an `initialize` request body; `None` for any other body.
pub(super) fn initialize_client(body: &[u8]) -> Option<ClientInfo> {
    #[derive(Deserialize)]
    struct Initialize {
        method: String,
        params: Params,
    }
    #[derive(Deserialize)]
    struct Params {
        #[serde(rename = "clientInfo")]
        client_info: serde_json::Value,
    }
    let message: Initialize = serde_json::from_slice(body).ok()?;
    if message.method != "initialize" {
        return None;
    }
    ClientInfo::from_json(&message.params.client_info)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(name: &str) -> ClientInfo {
        ClientInfo::new(name, None)
    }

    #[test]
    fn sessions_are_bounded_oldest_first_and_forgotten_on_delete() {
        let sessions = Sessions::default();
        for n in 0..=MAX_SESSIONS {
            sessions.remember(&format!("s{n}"), client(&format!("c{n}")));
        }
        assert_eq!(sessions.client("s0"), None);
        assert_eq!(sessions.client("s1"), Some(client("c1")));
        let last = format!("s{MAX_SESSIONS}");
        sessions.forget(&last);
        assert_eq!(sessions.client(&last), None);
    }

    #[test]
    fn only_an_initialize_names_a_client_and_its_fields_are_bounded() {
        let long = "n".repeat(ClientInfo::MAX_LEN * 2);
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"clientInfo": {"name": long, "version": "1.2", "title": "ignored"}},
        });
        let info = initialize_client(body.to_string().as_bytes()).unwrap();
        assert_eq!(info.name.len(), ClientInfo::MAX_LEN);
        assert_eq!(info.version.as_deref(), Some("1.2"));
        let call = serde_json::json!({
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"clientInfo": {"name": "x"}},
        });
        assert_eq!(initialize_client(call.to_string().as_bytes()), None);
        assert_eq!(initialize_client(b"not json"), None);
    }
}
