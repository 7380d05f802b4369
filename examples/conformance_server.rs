//! The fixture server of `tests/conformance/run.sh`: rmcp's Streamable HTTP server offering the
//! tools, resources and prompts that the official MCP conformance suite
//! (`@modelcontextprotocol/conformance`) asks a server for, so the suite can be run against it
//! directly and through `replay-guard proxy`.
//!
//! `cargo run --example conformance_server -- [--stateless] [PORT]` prints
//! `listening on http://127.0.0.1:PORT/mcp` once it accepts (port 0, the default, picks one).
//! `--stateless` serves without sessions (the 2026-07-28 era); the default keeps sessions (the
//! 2025 era), with an in-memory event store so that streams can be resumed.
//!
//! The elicitation tools are not offered (rmcp's `elicitation` feature is not built here), so
//! the suite's elicitation scenarios fail directly and through the proxy alike.

// Logging and sampling, which the suite exercises, are deprecated in rmcp.
#![allow(deprecated)]

// The test support's in-memory event store: a stream stays resumable after its request ended.
#[allow(dead_code)]
#[path = "../tests/support/event_store.rs"]
mod event_store;

use std::{sync::Arc, time::Duration};

use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, CompleteRequestParams,
        CompleteResult, GetPromptRequestParams, GetPromptResponse, GetPromptResult,
        ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
        PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
        ReadResourceResult, ServerCapabilities, ServerConfig, SetLevelRequestParams,
        SubscribeRequestParams, UnsubscribeRequestParams,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
        session::{local::LocalSessionManager, never::NeverSessionManager},
    },
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A 1×1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg==";
/// A WAV header with no samples.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEARKwAAIhYAQACABAAZGF0YQAAAAA=";

/// An rmcp type from its JSON form (the fixture speaks the wire format the suite checks).
fn from_json<T: DeserializeOwned>(value: Value) -> Result<T, ErrorData> {
    serde_json::from_value(value)
        .map_err(|error| ErrorData::internal_error(error.to_string(), None))
}

/// A complete result from its JSON form; `resultType`, which the 2026-07-28 revision requires
/// (rmcp drops it for older peers), is added.
fn result<T: DeserializeOwned>(mut value: Value) -> Result<T, ErrorData> {
    if let Some(object) = value.as_object_mut() {
        object.insert("resultType".into(), json!("complete"));
    }
    from_json(value)
}

fn text_result(text: &str) -> Result<CallToolResponse, ErrorData> {
    let answer: CallToolResult = result(json!({"content": [{"type": "text", "text": text}]}))?;
    Ok(answer.into())
}

#[derive(Clone, Default)]
struct Fixture;

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_prompts()
                .enable_logging()
                .enable_completions()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let empty = json!({"type": "object", "properties": {}});
        let mut tools: Vec<Value> = [
            "test_simple_text",
            "test_image_content",
            "test_audio_content",
            "test_embedded_resource",
            "test_multiple_content_types",
            "test_tool_with_logging",
            "test_tool_with_progress",
            "test_error_handling",
            "test_reconnection",
        ]
        .iter()
        .map(|name| json!({"name": name, "description": name, "inputSchema": empty}))
        .collect();
        tools.push(json!({"name": "test_sampling", "description": "asks the client to sample",
            "inputSchema": {"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}}));
        tools.push(json!({"name": "json_schema_2020_12_tool", "description": "a 2020-12 schema",
            "inputSchema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
                "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
                "additionalProperties": false
            }}));
        result(json!({ "tools": tools }))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        let content = |content: Value| -> Result<CallToolResponse, ErrorData> {
            let answer: CallToolResult = result(json!({ "content": content }))?;
            Ok(answer.into())
        };
        match request.name.as_ref() {
            "test_simple_text" => text_result("This is a simple text response for testing."),
            "test_image_content" => {
                content(json!([{"type": "image", "data": PNG, "mimeType": "image/png"}]))
            }
            "test_audio_content" => {
                content(json!([{"type": "audio", "data": WAV, "mimeType": "audio/wav"}]))
            }
            "test_embedded_resource" => content(json!([{"type": "resource", "resource": {
                "uri": "test://embedded-resource", "mimeType": "text/plain",
                "text": "This is an embedded resource content."}}])),
            "test_multiple_content_types" => content(json!([
                {"type": "text", "text": "Multiple content types test:"},
                {"type": "image", "data": PNG, "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "test://mixed-content-resource",
                    "mimeType": "application/json", "text": "{\"test\":\"data\",\"value\":123}"}}
            ])),
            "test_tool_with_logging" => {
                for message in [
                    "Tool execution started",
                    "Tool processing data",
                    "Tool execution completed",
                ] {
                    let note = from_json(
                        json!({"level": "info", "logger": "conformance", "data": message}),
                    )?;
                    let _ = context.peer.notify_logging_message(note).await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                text_result("Logging test completed")
            }
            "test_tool_with_progress" => {
                let token = context.meta.get_progress_token();
                for progress in [0, 50, 100] {
                    if let Some(token) = &token {
                        let note = from_json(
                            json!({"progressToken": token, "progress": progress, "total": 100}),
                        )?;
                        let _ = context.peer.notify_progress(note).await;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                text_result("Progress test completed")
            }
            "test_error_handling" => {
                let answer: CallToolResult = result(json!({"isError": true, "content": [
                    {"type": "text", "text": "This tool intentionally returns an error for testing"}]}))?;
                Ok(answer.into())
            }
            "test_sampling" => {
                let prompt = args
                    .get("prompt")
                    .and_then(Value::as_str)
                    .unwrap_or("Hello");
                let ask = from_json(json!({"messages": [{"role": "user",
                    "content": {"type": "text", "text": prompt}}], "maxTokens": 100}))?;
                match context.peer.create_message(ask).await {
                    Ok(answer) => {
                        let answer = serde_json::to_value(answer).unwrap_or_default();
                        let text = answer["content"]["text"].as_str().unwrap_or("").to_owned();
                        text_result(&format!("LLM response: {text}"))
                    }
                    Err(error) => text_result(&format!("Sampling error: {error}")),
                }
            }
            "json_schema_2020_12_tool" => {
                let name = args.get("name").and_then(Value::as_str).unwrap_or("world");
                text_result(&format!("Hello, {name}!"))
            }
            "test_reconnection" => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                text_result("Reconnection test completed")
            }
            other => Err(ErrorData::invalid_params(
                format!("Unknown tool: {other}"),
                None,
            )),
        }
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        result(json!({"resources": [
            {"uri": "test://static-text", "name": "static-text", "mimeType": "text/plain"},
            {"uri": "test://static-binary", "name": "static-binary", "mimeType": "image/png"},
            {"uri": "test://watched-resource", "name": "watched-resource", "mimeType": "text/plain"}
        ]}))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        result(json!({"resourceTemplates": [
            {"uriTemplate": "test://template/{id}/data", "name": "template", "mimeType": "application/json"}
        ]}))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri.as_str();
        let contents = match uri {
            "test://static-text" | "test://watched-resource" => json!({"uri": uri,
                "mimeType": "text/plain", "text": "This is the content of the static text resource."}),
            "test://static-binary" => json!({"uri": uri, "mimeType": "image/png", "blob": PNG}),
            _ => match uri
                .strip_prefix("test://template/")
                .and_then(|rest| rest.strip_suffix("/data"))
            {
                Some(id) => json!({"uri": uri, "mimeType": "application/json",
                    "text": json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")}).to_string()}),
                None => {
                    return Err(ErrorData::resource_not_found(
                        format!("Resource not found: {uri}"),
                        Some(json!({"uri": uri})),
                    ));
                }
            },
        };
        let read: ReadResourceResult = result(json!({ "contents": [contents] }))?;
        Ok(read.into())
    }

    async fn subscribe(
        &self,
        _request: SubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn unsubscribe(
        &self,
        _request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        result(json!({"prompts": [
            {"name": "test_simple_prompt", "description": "a prompt without arguments"},
            {"name": "test_prompt_with_arguments", "description": "a prompt with arguments",
                "arguments": [{"name": "arg1", "required": true}, {"name": "arg2", "required": false}]},
            {"name": "test_prompt_with_embedded_resource", "description": "a prompt with a resource",
                "arguments": [{"name": "resourceUri", "required": true}]},
            {"name": "test_prompt_with_image", "description": "a prompt with an image"}
        ]}))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let args = request.arguments.clone().unwrap_or_default();
        let arg = |name: &str| {
            args.get(name)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let messages = match request.name.as_str() {
            "test_simple_prompt" => json!([{"role": "user",
                "content": {"type": "text", "text": "This is a simple prompt for testing."}}]),
            "test_prompt_with_arguments" => json!([{"role": "user", "content": {"type": "text",
                "text": format!("Prompt with arguments: arg1='{}', arg2='{}'", arg("arg1"), arg("arg2"))}}]),
            "test_prompt_with_embedded_resource" => {
                let uri = match arg("resourceUri") {
                    uri if uri.is_empty() => "test://static-text".to_owned(),
                    uri => uri,
                };
                json!([
                    {"role": "user", "content": {"type": "resource", "resource": {"uri": uri,
                        "mimeType": "text/plain", "text": "Embedded resource content for testing."}}},
                    {"role": "user", "content": {"type": "text", "text": "Please process the embedded resource above."}}
                ])
            }
            "test_prompt_with_image" => json!([
                {"role": "user", "content": {"type": "image", "data": PNG, "mimeType": "image/png"}},
                {"role": "user", "content": {"type": "text", "text": "Please analyze the image above."}}
            ]),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("Unknown prompt: {other}"),
                    None,
                ));
            }
        };
        let prompt: GetPromptResult = result(json!({ "messages": messages }))?;
        Ok(prompt.into())
    }

    async fn complete(
        &self,
        _request: CompleteRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        result(
            json!({"completion": {"values": ["paris", "park", "party"], "total": 3, "hasMore": false}}),
        )
    }

    async fn set_level(
        &self,
        _request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut stateless = false;
    let mut port = 0u16;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--stateless" => stateless = true,
            other => port = other.parse()?,
        }
    }
    let config = StreamableHttpServerConfig::default().with_legacy_session_mode(!stateless);
    let events = Arc::new(event_store::InMemoryEventStore::default());
    let service = if stateless {
        let manager = NeverSessionManager::default().with_event_store(events.clone());
        tower::util::Either::Left(StreamableHttpService::new(
            || Ok(Fixture),
            Arc::new(manager),
            config,
        ))
    } else {
        let manager = LocalSessionManager::default().with_event_store(events);
        tower::util::Either::Right(StreamableHttpService::new(
            || Ok(Fixture),
            Arc::new(manager),
            config,
        ))
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let service = TowerToHyperService::new(service.clone());
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
