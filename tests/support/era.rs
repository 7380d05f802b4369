//! Calls written once for both protocol eras, and a status probe over the test server's
//! read-only `credential_status` tool (shared by the fault matrix and the chaos soak).

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use mcp_replay_guard::{
    contract::{ProbeOutcome, ProbeRequest, StatusProbe},
    guard::GuardError,
};
use serde_json::{Value, json};
use tower::Service;

use super::{
    BoxError, PROTOCOL_VERSION, STATELESS_PROTOCOL_VERSION, call_tool, call_tool_stateless,
    first_text, hyper_client, initialize, post, read_response_to_end, send,
    stateless_tool_call_body, structured, tool_call_body,
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

/// What the agent is told when the target (or the guard) answered with a tool result.
pub const TOLD_RESULT: &str = "result";
/// What the agent is told when a status probe settled the call and its result came back.
pub const TOLD_PROBE_RESULT: &str = "result from the status probe";

/// What one `tools/call` gave the agent.
#[derive(Debug)]
pub enum Told {
    /// A tool result (from the target, kept by the guard, or from a status probe).
    Result(Value),
    /// The guard's honest "uncertain" answer (`structuredContent.mcp_replay_guard`).
    Uncertain(Value),
    /// The call failed before any response: `error: not sent`, `error: outcome unknown`
    /// (both from the guard) or `transport error`.
    Error(String),
    /// A non-2xx HTTP status.
    Status(u16),
    /// A JSON-RPC error answering the call (the target's, passed on), with its code.
    JsonRpcError(i64),
    /// The response began and broke before the JSON-RPC response.
    BrokenStream,
    /// The agent read nothing, and why.
    Nothing(&'static str),
}

impl Told {
    /// A short, id-free description (the fault matrix prints it).
    pub fn render(&self) -> String {
        match self {
            Told::Result(answer)
                if first_text(answer).is_some_and(|t| t.contains("status probe")) =>
            {
                TOLD_PROBE_RESULT.to_owned()
            }
            Told::Result(_) => TOLD_RESULT.to_owned(),
            Told::Uncertain(answer) => format!(
                "uncertain: {} + execution id",
                answer["result"]["structuredContent"]["mcp_replay_guard"]["state"]
                    .as_str()
                    .unwrap_or("?")
            ),
            Told::Error(kind) => kind.clone(),
            Told::Status(code) => format!("HTTP {code}"),
            Told::JsonRpcError(code) => format!("JSON-RPC error {code}"),
            Told::BrokenStream => "stream broke before the result".to_owned(),
            Told::Nothing(why) => format!("nothing ({why})"),
        }
    }

    /// Whether the agent got a tool result.
    pub fn is_result(&self) -> bool {
        matches!(self, Told::Result(_))
    }

    /// Whether the agent got an answer it will not retry: a result or an uncertain answer.
    pub fn is_final(&self) -> bool {
        matches!(self, Told::Result(_) | Told::Uncertain(_))
    }
}

/// Sends `request` (a `tools/call` with JSON-RPC id `id`) and reads the response to its end,
/// as a client that consumes the whole stream does (the guard records `delivered` when the
/// stream ends). Panics if a tool result is a tool-level error: the test tools never fail.
pub async fn agent_call<S, RB>(svc: &mut S, request: Request<Full<Bytes>>, id: i64) -> Told
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body,
    RB::Error: Into<BoxError>,
{
    let response = match send(svc, request).await {
        Ok(response) => response,
        Err(error) => {
            return Told::Error(match error.downcast_ref::<GuardError>() {
                Some(e) if e.is_not_sent() => "error: not sent".to_owned(),
                Some(e) if e.is_unknown() => "error: outcome unknown".to_owned(),
                _ => "transport error".to_owned(),
            });
        }
    };
    if !response.status().is_success() {
        return Told::Status(response.status().as_u16());
    }
    let (head, body) = response.into_parts();
    let Ok(body) = body.collect().await else {
        return Told::BrokenStream;
    };
    let answer = read_response_to_end(Response::from_parts(head, Full::new(body.to_bytes()))).await;
    assert_eq!(answer["id"], json!(id), "{answer}");
    if let Some(code) = answer["error"]["code"].as_i64() {
        return Told::JsonRpcError(code);
    }
    if answer
        .pointer("/result/structuredContent/mcp_replay_guard")
        .is_some()
    {
        return Told::Uncertain(answer);
    }
    assert!(
        answer["result"]["isError"] != true,
        "the tool itself failed: {answer}"
    );
    Told::Result(answer)
}
