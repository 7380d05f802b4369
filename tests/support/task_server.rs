//! A minimal MCP endpoint for the Tasks extension (rmcp's test server has no tasks): it loses
//! every `tools/call` response (the connection closes after the request was read) and answers
//! `tasks/get` with a task in the given status (`completed` carries a result). A client that
//! opens a connection first gets the handshake of the era the endpoint speaks: `initialize`
//! (with a session) in 2025-11-25, `server/discover` in 2026-07-28.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// The methods the endpoint was asked, in order.
pub type SeenMethods = Arc<Mutex<Vec<String>>>;

/// Starts the endpoint on 127.0.0.1; returns its URL and the methods it is asked.
pub async fn task_server(status: &'static str) -> (String, SeenMethods) {
    task_server_speaking("2025-11-25", status).await
}

/// [`task_server`], answering the handshake of the revision `version` (`2025-11-25`: a
/// session-era server, which knows no `server/discover`; `2026-07-28`: stateless).
pub async fn task_server_speaking(
    version: &'static str,
    status: &'static str,
) -> (String, SeenMethods) {
    let seen = SeenMethods::default();
    let log = seen.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let log = log.clone();
                        async move {
                            // A DELETE that ends a session has no body.
                            let body: Value = serde_json::from_slice(
                                &request.into_body().collect().await.unwrap().to_bytes(),
                            )
                            .unwrap_or_default();
                            let method = body["method"].as_str().unwrap_or_default().to_owned();
                            log.lock().unwrap().push(method.clone());
                            let id = body["id"].clone();
                            let answer = |message: Value| {
                                Response::builder()
                                    .header("content-type", "application/json")
                                    .header("mcp-session-id", "s-1")
                                    .body(Full::new(Bytes::from(message.to_string())))
                                    .unwrap()
                            };
                            let stateless = version == "2026-07-28";
                            match method.as_str() {
                                "tasks/get" => {}
                                "server/discover" if stateless => {
                                    return Ok(answer(json!({"jsonrpc": "2.0", "id": id,
                                        "result": {"supportedVersions": [version]}})));
                                }
                                "server/discover" => {
                                    return Ok(answer(json!({"jsonrpc": "2.0", "id": id,
                                        "error": {"code": -32601, "message": "no such method"}})));
                                }
                                "initialize" if !stateless => {
                                    return Ok(answer(json!({"jsonrpc": "2.0", "id": id,
                                        "result": {"protocolVersion": version, "capabilities":
                                        {"tasks": {}}, "serverInfo": {"name": "tasks",
                                        "version": "1"}}})));
                                }
                                "notifications/initialized" => {
                                    return Ok(Response::builder()
                                        .status(202)
                                        .body(Full::new(Bytes::new()))
                                        .unwrap());
                                }
                                _ => return Err(std::io::Error::other("response lost")),
                            }
                            let mut task = json!({
                                "resultType": "complete", "taskId": body["params"]["taskId"],
                                "status": status, "createdAt": "2026-11-29T00:00:00Z",
                                "lastUpdatedAt": "2026-11-29T00:00:01Z", "ttlMs": null,
                            });
                            if status == "completed" {
                                task["result"] = json!({"content": [{"type": "text",
                                    "text": "deployed by task t-1"}], "isError": false});
                            }
                            let answer =
                                json!({"jsonrpc": "2.0", "id": body["id"], "result": task});
                            let response = Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(answer.to_string())))
                                .unwrap();
                            Ok::<_, std::io::Error>(response)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, seen)
}
