//! `replay-guard proxy`: a Streamable HTTP reverse proxy with the whole guard inside, so that
//! an MCP client in any language gets it without a code change.
//!
//! Every request to the proxy (any path) goes to the upstream MCP endpoint: POSTs, GET streams
//! and resumes (`Last-Event-ID`), DELETEs, with their headers except the hop-by-hop ones.
//! `tools/call` POSTs are guarded: a repeat attaches to its execution instead of running again.
//! Responses stream back as they come; a cut upstream stream is cut for the client too, so the
//! client's own resume (GET + `Last-Event-ID`) comes back through the proxy.

use std::{convert::Infallible, net::SocketAddr, process::ExitCode, time::Duration};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use mcp_replay_guard::guard::{Guard, GuardRequestBody};
use tower::{ServiceBuilder, ServiceExt};

use crate::{
    mcp_http::{BoxError, describe},
    options::GuardOptions,
};

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Where to listen (`127.0.0.1:8080`; port 0 picks one and prints it).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The upstream MCP endpoint (`http://host:port/mcp`).
    #[arg(long, value_name = "URL")]
    upstream: String,
    /// How long a repeated call waits for the in-flight execution it attaches to.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    attach_timeout: Duration,
    #[command(flatten)]
    guard: GuardOptions,
}

type Upstream = Guard<Client<HttpConnector, GuardRequestBody>>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

pub async fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    let upstream: Uri = args
        .upstream
        .parse()
        .with_context(|| format!("--upstream {:?} is not a URL", args.upstream))?;
    if upstream.scheme_str() != Some("http") || upstream.authority().is_none() {
        bail!("--upstream must be http://host:port/path: this build speaks plain HTTP upstream");
    }
    let contracts = args.guard.contracts(None)?;
    let layer = args.guard.layer(contracts, args.attach_timeout)?;
    let guard: Upstream = ServiceBuilder::new()
        .layer(layer)
        .service(Client::builder(TokioExecutor::new()).build_http());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}: is the port free?", args.listen))?;
    let local = listener.local_addr()?;
    // One line on stdout a script (or a test) can wait for.
    println!("listening on http://{local} -> {upstream}");
    let shutdown = tokio::signal::ctrl_c();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let guard = guard.clone();
        let upstream = upstream.clone();
        let handler = hyper::service::service_fn(move |request| {
            forward(guard.clone(), upstream.clone(), request)
        });
        tokio::spawn(async move {
            if let Err(error) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), handler)
                .await
            {
                tracing::debug!(error = %describe(&*error), "client connection ended");
            }
        });
    }
    Ok(ExitCode::SUCCESS)
}

/// Forwards one request through the guard to the upstream endpoint.
async fn forward(
    guard: Upstream,
    upstream: Uri,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (mut parts, body) = request.into_parts();
    parts.uri = match upstream_uri(&upstream, parts.uri.query()) {
        Some(uri) => uri,
        None => {
            return Ok(error_response(
                StatusCode::BAD_REQUEST,
                "the query string is not valid",
            ));
        }
    };
    parts.version = http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    match guard.oneshot(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Ok(Response::from_parts(
                parts,
                body.map_err(Into::into).boxed_unsync(),
            ))
        }
        Err(error) => {
            tracing::warn!(error = %describe(&error), "upstream exchange failed");
            let message = format!("replay-guard proxy: {}", describe(&error));
            Ok(error_response(StatusCode::BAD_GATEWAY, &message))
        }
    }
}

/// The upstream endpoint, with the client's query string if it sent one.
fn upstream_uri(upstream: &Uri, query: Option<&str>) -> Option<Uri> {
    let Some(query) = query else {
        return Some(upstream.clone());
    };
    let mut parts = upstream.clone().into_parts();
    let path = upstream.path();
    parts.path_and_query = Some(format!("{path}?{query}").parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// Removes the headers that belong to one connection (RFC 9110 §7.6.1), including those the
/// `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

/// An answer of the proxy's own. Plain text, not a JSON-RPC error: the request's id is not
/// known here, and a JSON-RPC error without it would leave a client waiting for its answer.
fn error_response(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(message.to_owned()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
