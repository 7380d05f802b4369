//! The stateless server and the deploy call most proxy tests send: rmcp's own server answering
//! with JSON, and the 2026-07-28 `tools/call` of `deploy_release` on a connection of its own.

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use serde_json::{Value, json};

use super::{
    STATELESS_PROTOCOL_VERSION, ServerOptions, TestServer, hyper_client, post, send,
    stateless_tool_call_body,
};

/// A plain hyper client (one connection pool: hold it to keep an answer undelivered).
pub type HyperClient = Client<HttpConnector, Full<Bytes>>;

/// The arguments every deploy sends.
pub fn deploy_args() -> Value {
    json!({"service": "catalog", "version": "2026.07.22"})
}

/// A stateless server that answers with JSON.
pub async fn json_server() -> TestServer {
    json_server_with_bearer(None).await
}

/// [`json_server`], requiring `Authorization: Bearer <token>` when given.
pub async fn json_server_with_bearer(bearer_token: Option<&str>) -> TestServer {
    TestServer::start_with(ServerOptions {
        json_response: true,
        bearer_token: bearer_token.map(str::to_owned),
        ..ServerOptions::stateless()
    })
    .await
}

/// The 2026-07-28 `tools/call` of `deploy_release` with `id` and `headers`.
pub fn deploy_request(url: &str, id: i64, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut request = post(
        url,
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(id, "deploy_release", deploy_args()),
    );
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).expect("a header name");
        request
            .headers_mut()
            .append(name, value.parse().expect("a header value"));
    }
    request
}

/// A new client (its own connection: hold it to keep the answer undelivered) sends the deploy
/// with `headers`.
pub async fn deploy_as(
    url: &str,
    id: i64,
    headers: &[(&str, &str)],
) -> (HyperClient, Response<hyper::body::Incoming>) {
    let mut client = hyper_client();
    let response = send(&mut client, deploy_request(url, id, headers))
        .await
        .expect("the proxy answers");
    (client, response)
}
