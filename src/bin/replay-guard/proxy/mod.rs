//! `replay-guard proxy`: a Streamable HTTP reverse proxy with the whole guard inside, so that
//! an MCP client in any language gets it without a code change.
//!
//! Every request to the proxy (any path) goes to the upstream MCP endpoint: POSTs, GET streams
//! and resumes (`Last-Event-ID`), DELETEs, with their headers except the hop-by-hop ones.
//! `tools/call` POSTs are guarded: a repeat attaches to its execution instead of running again.
//! Responses stream back as they come; a cut upstream stream is cut for the client too, so the
//! client's own resume (GET + `Last-Event-ID`) comes back through the proxy.
//!
//! # When an answer counts as delivered
//!
//! A proxy cannot know that its client read a byte; it knows what its connection tells it. An
//! answer (JSON or SSE, the same rule) is recorded `delivered` when
//!
//! 1. the whole response, to its last byte and the end of the message, was written to the
//!    client connection (hyper took the end of the body and the connection flushed it), and
//! 2. the client then showed it was done with it: it sent its next request on that connection
//!    (recorded before that request is handled), or closed the connection cleanly (after a
//!    `Connection: close` answer the proxy waits up to 10 s for that clean close).
//!
//! A connection that breaks or is reset first leaves the answer undelivered (a client's TCP
//! stack resets a connection it closes with unread data), so the client's repeat gets the kept
//! result instead of a second execution. An answer on a connection the client keeps open and
//! idle is recorded once the client uses or closes that connection; until then a repeat gets
//! the kept result. The proxy serves HTTP/1.1, where those signals are exact.
//!
//! A client that closes its side of the connection right after its request (a half-close,
//! as `nc -N` does) still gets its answer; but its close came before the answer, so it says
//! nothing about reading it (a client that closed its socket outright looks the same until
//! its stack resets): such an answer is never recorded delivered, and a repeat gets the kept
//! result.

use std::{convert::Infallible, net::SocketAddr, process::ExitCode, sync::Arc, time::Duration};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use mcp_replay_guard::guard::{Guard, GuardRequestBody, redact_url};
use tower::{ServiceBuilder, ServiceExt};

mod delivery;
mod serve;

use delivery::{Deliveries, Written};

use crate::{
    mcp_http::{BoxError, describe},
    options::GuardOptions,
};

#[derive(Debug, Args)]
#[command(after_long_help = DELIVERY_HELP)]
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
    #[command(flatten)]
    serve: serve::ServeOptions,
}

/// `replay-guard proxy --help`: when an answer counts as delivered (the module docs say more).
const DELIVERY_HELP: &str = "\
When an answer counts as delivered: a proxy cannot know that its client read a byte. An answer \
(JSON or SSE alike) is recorded delivered once the whole response was written to the client \
connection and the client then sent its next request on that connection or closed it cleanly. \
A connection that breaks or is reset first leaves the answer undelivered, so the client's repeat \
gets the kept result instead of running the tool again. Served over HTTP/1.1.";

type Upstream = Guard<Client<HttpConnector, GuardRequestBody>>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

pub async fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    // The upstream URL may carry a credential: only its redacted form is printed.
    let shown_upstream = redact_url(&args.upstream);
    let upstream: Uri = args
        .upstream
        .parse()
        .with_context(|| format!("--upstream {shown_upstream:?} is not a URL"))?;
    let (upstream, had_userinfo) =
        crate::mcp_http::without_userinfo(upstream).context("--upstream")?;
    if had_userinfo {
        tracing::warn!("{}", crate::mcp_http::USERINFO_NOT_SENT);
    }
    if upstream.scheme_str() != Some("http") || upstream.authority().is_none() {
        bail!("--upstream must be http://host:port/path: this build speaks plain HTTP upstream");
    }
    let contracts = args.guard.contracts(None)?;
    let layer = args.guard.layer(contracts, args.attach_timeout)?;
    let guard: Upstream = ServiceBuilder::new()
        .layer(layer.clone())
        .service(Client::builder(TokioExecutor::new()).build_http());
    let signals = serve::Signals::catch().context("cannot catch SIGTERM and SIGINT")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}: is the port free?", args.listen))?;
    let local = listener.local_addr()?;
    // One line on stdout a script (or a test) can wait for.
    println!("listening on http://{local} -> {shown_upstream}");
    let handler = move |deliveries: Arc<Deliveries>| {
        let (guard, upstream) = (guard.clone(), upstream.clone());
        hyper::service::service_fn(move |request| {
            forward(guard.clone(), upstream.clone(), deliveries.clone(), request)
        })
    };
    Ok(serve::serve(listener, signals, &args.serve, &layer, handler).await)
}

/// Forwards one request through the guard to the upstream endpoint.
async fn forward(
    guard: Upstream,
    upstream: Uri,
    deliveries: Arc<Deliveries>,
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
            let (mut parts, mut body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            let delivery = body.defer_delivery();
            let body = Written::new(
                body.map_err(Into::into).boxed_unsync(),
                delivery,
                deliveries,
            );
            Ok(Response::from_parts(parts, body.boxed_unsync()))
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
