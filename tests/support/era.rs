//! Calls written once for both protocol eras, and a status probe over the test server's
//! read-only `credential_status` tool (shared by the fault matrix and the chaos soak).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use async_trait::async_trait;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use mcp_replay_guard::guard::{ProbeOutcome, ProbeRequest, StatusProbe};
use serde_json::{Value, json};

use super::{
    PROTOCOL_VERSION, STATELESS_PROTOCOL_VERSION, call_tool, call_tool_stateless, hyper_client,
    initialize, post, stateless_tool_call_body, structured, tool_call_body,
};

/// The protocol era a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2025-11-25: `initialize` handshake, `Mcp-Session-Id`, resumable SSE streams.
    Sessions,
    /// 2026-07-28: stateless, per-request `_meta`, `Mcp-Method` / `Mcp-Name`.
    Stateless,
}

impl Era {
    /// Both eras, oldest first.
    pub const ALL: [Era; 2] = [Era::Sessions, Era::Stateless];

    /// How the era is named in printed tables.
    pub fn label(self) -> &'static str {
        match self {
            Era::Sessions => "2025-11-25 (sessions)",
            Era::Stateless => "2026-07-28 (stateless)",
        }
    }

    /// The name used in a child process's task string.
    pub fn token(self) -> &'static str {
        match self {
            Era::Sessions => "sessions",
            Era::Stateless => "stateless",
        }
    }

    /// The inverse of [`Era::token`].
    pub fn from_token(token: &str) -> Option<Era> {
        Era::ALL.into_iter().find(|era| era.token() == token)
    }

    /// The session of a new client: `initialize` in the session era, none in the stateless one.
    pub async fn open_session(self, url: &str) -> Option<String> {
        match self {
            Era::Sessions => initialize(&mut hyper_client(), url)
                .await
                .expect("initialize"),
            Era::Stateless => None,
        }
    }

    /// A `tools/call` POST as a client of this era sends it.
    pub fn tool_call(
        self,
        url: &str,
        session: Option<&str>,
        id: i64,
        tool: &str,
        args: Value,
    ) -> Request<Full<Bytes>> {
        match self {
            Era::Sessions => post(
                url,
                session,
                PROTOCOL_VERSION,
                tool_call_body(id, tool, args),
            ),
            Era::Stateless => post(
                url,
                None,
                STATELESS_PROTOCOL_VERSION,
                stateless_tool_call_body(id, tool, args),
            ),
        }
    }
}

/// Asks the test server's read-only `credential_status` tool whether `rotate_credential` took
/// effect for the probed call's `name`, over a plain client (a probe is a read, never guarded).
#[derive(Debug, Clone)]
pub struct CredentialStatusProbe {
    url: String,
    era: Era,
    asked: Arc<AtomicUsize>,
}

impl CredentialStatusProbe {
    /// A probe against `url`, speaking `era`.
    pub fn new(url: &str, era: Era) -> Self {
        Self {
            url: url.to_owned(),
            era,
            asked: Arc::default(),
        }
    }

    /// How many times the guard asked.
    pub fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl StatusProbe for CredentialStatusProbe {
    async fn probe(&self, request: ProbeRequest<'_>) -> ProbeOutcome {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let name = request.arguments["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let args = json!({"name": name});
        let mut client = hyper_client();
        let status = match self.era {
            Era::Sessions => match initialize(&mut client, &self.url).await {
                Ok(session) => {
                    call_tool(
                        &mut client,
                        &self.url,
                        session.as_deref(),
                        900,
                        "credential_status",
                        args,
                    )
                    .await
                }
                Err(error) => Err(error),
            },
            Era::Stateless => {
                call_tool_stateless(&mut client, &self.url, 900, "credential_status", args).await
            }
        };
        match status
            .as_ref()
            .ok()
            .and_then(structured)
            .and_then(|s| s["rotated"].as_bool())
        {
            Some(true) => ProbeOutcome::Applied {
                result: Some(json!({
                    "content": [{"type": "text", "text": format!("rotated {name} (confirmed by status probe)")}],
                    "isError": false,
                })),
            },
            Some(false) => ProbeOutcome::NotApplied,
            None => ProbeOutcome::Unknown {
                reason: format!("status query failed: {status:?}"),
            },
        }
    }
}
