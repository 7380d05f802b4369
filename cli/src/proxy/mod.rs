//! `replay-guard proxy`: a Streamable HTTP reverse proxy with the whole guard inside, so that
//! an MCP client in any language gets it without a code change.
//!
//! Every request to the proxy (any path) goes to the upstream MCP endpoint: POSTs, GET streams
//! and resumes (`Last-Event-ID`), DELETEs, with their headers except the hop-by-hop ones. The
//! OAuth metadata paths (`/.well-known/oauth-protected-resource…`,
//! `/.well-known/oauth-authorization-server…`, `/.well-known/openid-configuration…`) go to the
//! same path on the upstream's origin, around the guard: GETs (and HEADs) that are no resume
//! (`Last-Event-ID`) only, and never a path with a dot segment, which could leave
//! `/.well-known/` at an upstream that normalises paths.
//!
//! Who acts in each call is read from the client's request (the `principals` module), so that one
//! client's kept result or held answer is never another's.
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
//!    (recorded before that request is handled), or closed the connection cleanly having taken
//!    every byte (after a `Connection: close` answer the proxy waits up to 10 s for that clean
//!    close). A client that gave up and closed while the answer was on its way sends a clean
//!    close all the same: on Linux the proxy asks its socket whether the client acknowledged
//!    everything written (`SIOCOUTQ` is zero), and a close before that confirms nothing.
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
//!
//! # When the upstream exchange fails
//!
//! A `tools/call` whose exchange failed after it may have been sent is put to the guard again
//! on the same client request (see `answers.rs`): the client gets the guard's decision (the
//! re-sent call's result, or its honest uncertain answer), never a bare `502`. A JSON answer
//! is read whole before its head goes out, so one cut after its head is such a failure too;
//! an event stream cut (or ended) before its answer with no event id to resume from ends with
//! the guard's uncertain answer as one more event. A `502` means nothing was sent, and is a
//! JSON-RPC error for the request's id.

use std::{
    convert::Infallible, io::Write as _, net::SocketAddr, path::PathBuf, pin::Pin,
    process::ExitCode, sync::Arc, time::Duration,
};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited, combinators::UnsyncBoxBody};
use hyper::rt::Executor;
use hyper_util::{client::legacy::connect::Connect, rt::TokioExecutor};
use mcp_replay_guard::{
    DEFAULT_MAX_BODY_BYTES, IntentScope,
    contract::ContractRegistry,
    fingerprint::FingerprintKey,
    guard::{Guard, GuardLayer, GuardRequestBody},
    protocol,
    tools::{jsonrpc_error, redact_url, refused_request},
};
use tokio_util::sync::CancellationToken;
use tower::{ServiceExt, util::BoxCloneSyncService};
use tracing::Instrument;

pub(crate) mod admin;
mod answers;
mod authentication;
mod client_close;
mod clients;
mod config;
#[cfg(test)]
pub(crate) use config::validate as validate_config;
mod delivery;
pub(crate) mod origins;
mod principals;
mod request_body;
mod routes;
mod serve;
mod simulated;

pub use simulated::SimulatedProxy;

use authentication::ClientCertificate;
use clients::Sessions;
use delivery::Deliveries;
use origins::Origins;
use principals::{Principals, ScopeSource};
use routes::{Route, Routes};

use crate::{
    compaction::{self, CompactionOptions},
    mcp_http::{BoxError, describe},
    options::GuardOptions,
    tls::{self, ClientTls, ListenerTls},
};

#[derive(Debug, Args)]
#[command(after_long_help = DELIVERY_HELP)]
pub struct ProxyArgs {
    /// The proxy's options in a TOML file (a key per flag, `[[route]]`s for several
    /// upstreams), re-read with the policy files on SIGHUP; flags override it.
    #[arg(long, value_name = "FILE", env = "REPLAY_GUARD_CONFIG")]
    config: Option<PathBuf>,
    /// Where to listen (`127.0.0.1:8080`; port 0 picks one and prints it). Required, here or
    /// in --config.
    #[arg(long, value_name = "ADDR", env = "REPLAY_GUARD_LISTEN")]
    listen: Option<SocketAddr>,
    /// The upstream MCP endpoint (`http://host:port/mcp` or `https://…`), for every path;
    /// or `[[route]]`s in --config.
    #[arg(long, value_name = "URL", env = "REPLAY_GUARD_UPSTREAM")]
    upstream: Option<String>,
    /// How long a repeated call waits for the in-flight execution it attaches to.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    attach_timeout: Duration,
    /// Take each client's actor from this header, which a trusted gateway in front of the
    /// proxy sets (instead of a tag of the client's credentials). A request without it is
    /// refused unsent; it is not forwarded. The way for OAuth clients, whose refreshed token
    /// would otherwise be another actor.
    #[arg(long, value_name = "NAME", conflicts_with = "actor")]
    actor_header: Option<String>,
    /// A header the upstream authenticates with, read as a credential of the client's besides
    /// `Authorization`, `Proxy-Authorization`, `Cookie`, `X-API-Key`, `Api-Key`,
    /// `X-Auth-Token` and the query string (repeatable): it enters the client's actor.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["actor", "actor_header"])]
    credential_header: Vec<String>,
    /// Take each client's intent scope from this header, which a trusted gateway in front of
    /// the proxy sets (instead of `--scope`). A request without it is refused unsent; it is not
    /// forwarded.
    #[arg(long, value_name = "NAME", conflicts_with = "scope")]
    scope_header: Option<String>,
    /// A header set on every upstream request, `'Name: value'` (repeatable), in place of the
    /// client's header of that name: a token the proxy holds (`'Authorization: Bearer …'`).
    /// The actor still comes from what the client sent. Never recorded or logged.
    #[arg(long = "header", value_name = "'K: V'")]
    headers: Vec<String>,
    /// A `Host` the proxy serves (repeatable; `name` for any port, `name:port` for one). By
    /// default, on a loopback address: `localhost`, `127.0.0.1` and `[::1]` with its port; on
    /// any other address: any. Another host is refused 403 unsent (DNS rebinding).
    #[arg(long, value_name = "HOST")]
    allowed_host: Vec<String>,
    /// An `Origin` the proxy serves (repeatable, `scheme://host:port`). By default, on a
    /// loopback address: the loopback origins of its port; on any other address: none. A
    /// request with another `Origin` (a web page elsewhere) is refused 403 unsent.
    #[arg(long, value_name = "ORIGIN")]
    allowed_origin: Vec<String>,
    /// Authenticate clients by API key: a TOML file of `[[client]]` entries, each a
    /// `principal` and the `key_sha256` of its key (hex). The key comes as
    /// `Authorization: Bearer KEY` or `X-API-Key: KEY`; the principal is the actor.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["actor", "actor_header", "credential_header"])]
    clients: Option<PathBuf>,
    /// Authenticate clients by JWT: the JWK set (a file) whose keys sign their tokens. With
    /// `--jwt-issuer` and `--jwt-audience`; the principal (the actor) is the token's `iss`
    /// and `sub`, so a refreshed token is the same actor.
    #[arg(long, value_name = "FILE", requires_all = ["jwt_issuer", "jwt_audience"], conflicts_with_all = ["actor", "actor_header", "credential_header"])]
    jwt_jwks: Option<PathBuf>,
    /// The `iss` a client's JWT must name.
    #[arg(long, value_name = "ISSUER", requires = "jwt_jwks")]
    jwt_issuer: Option<String>,
    /// The `aud` a client's JWT must name.
    #[arg(long, value_name = "AUDIENCE", requires = "jwt_jwks")]
    jwt_audience: Option<String>,
    /// Serve `/healthz` and `/readyz` on this address, apart from the clients' listener
    /// (which forwards nothing under those paths).
    #[arg(long, value_name = "ADDR", env = "REPLAY_GUARD_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,
    #[command(flatten)]
    upstream_tls: ClientTls,
    #[command(flatten)]
    listener_tls: ListenerTls,
    #[command(flatten)]
    guard: GuardOptions,
    #[command(flatten)]
    compaction: CompactionOptions,
    #[command(flatten)]
    on_held: crate::on_held::OnHeldOptions,
    #[command(flatten)]
    serve: serve::ServeOptions,
}

/// What every request shares besides its route, for the life of the process.
#[derive(Debug)]
struct Front {
    /// The `Host` and `Origin` served.
    origins: Origins,
    sessions: Sessions,
    /// Cancelled at shutdown: listen streams end.
    stopping: CancellationToken,
}

/// What a reload of the configuration replaces: a request takes it once, when it arrives, and
/// finishes under it.
pub(crate) struct Live {
    routes: Routes,
    principals: Principals,
}

/// Requests the proxy answered, by HTTP status.
const REQUESTS: &str = "replay_guard_proxy_requests_total";
/// Requests the proxy refused itself (nothing sent), by reason.
const REFUSED: &str = "replay_guard_proxy_refused_total";

/// `replay-guard proxy --help`: when an answer counts as delivered (the module docs say more).
const DELIVERY_HELP: &str = "\
When an answer counts as delivered: a proxy cannot know that its client read a byte. An answer \
(JSON or SSE alike) is recorded delivered once the whole response was written to the client \
connection and the client then sent its next request on that connection or closed it cleanly \
having taken every byte. \
A connection that breaks or is reset first leaves the answer undelivered, so the client's repeat \
gets the kept result instead of running the tool again. Served over HTTP/1.1.";

/// The upstream's HTTP client under the guard, boxed: the command's connects over TCP (and
/// TLS), the simulator's over simulated TCP, and the code between is the same.
type UpstreamClient = BoxCloneSyncService<
    Request<GuardRequestBody>,
    Response<hyper::body::Incoming>,
    hyper_util::client::legacy::Error,
>;
/// The client of the OAuth metadata requests, around the guard.
type MetadataClient = BoxCloneSyncService<
    Request<Full<Bytes>>,
    Response<hyper::body::Incoming>,
    hyper_util::client::legacy::Error,
>;
type Upstream = Guard<UpstreamClient>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// What every connection of one proxy process is served with: the routes and principals of
/// the configuration now (replaced whole by a reload), and what every request shares.
#[derive(Clone)]
struct Proxy {
    live: Arc<std::sync::RwLock<Arc<Live>>>,
    front: Arc<Front>,
}

impl Proxy {
    /// The proxy of `layer` in front of `upstream` (for every path), connecting with
    /// `connector` (and spawning the client's connection tasks on `executor`).
    fn new<C, E>(
        layer: &GuardLayer,
        upstream: Uri,
        connector: C,
        executor: E,
        origins: Origins,
        principals: Principals,
        held: HeaderMap,
    ) -> Self
    where
        C: Connect + Clone + Send + Sync + 'static,
        E: Executor<Pin<Box<dyn Future<Output = ()> + Send>>> + Clone + Send + Sync + 'static,
    {
        let route = Route::new("/", upstream, layer, connector, executor, held);
        Self::of(Routes::new(vec![route]), principals, origins)
    }

    /// The proxy of `routes`.
    fn of(routes: Routes, principals: Principals, origins: Origins) -> Self {
        let front = Arc::new(Front {
            origins,
            sessions: Sessions::default(),
            stopping: CancellationToken::new(),
        });
        let live = Arc::new(Live { routes, principals });
        Self {
            live: Arc::new(std::sync::RwLock::new(live)),
            front,
        }
    }

    /// The configuration now.
    fn live(&self) -> Arc<Live> {
        self.live
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The service of one client connection, from that connection's deliveries.
    fn handler(&self) -> impl Fn(Arc<Deliveries>) -> Connection + Send + Sync + 'static {
        let proxy = self.clone();
        move |deliveries| Connection {
            proxy: proxy.clone(),
            deliveries,
        }
    }
}

/// The service of one client connection: each request forwarded as that connection's.
struct Connection {
    proxy: Proxy,
    deliveries: Arc<Deliveries>,
}

impl hyper::service::Service<Request<request_body::RequestBody>> for Connection {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn call(&self, request: Request<request_body::RequestBody>) -> Self::Future {
        let forwarded = forward(self.proxy.clone(), self.deliveries.clone(), request);
        Box::pin(async move {
            let response = forwarded.await?;
            let status = response.status().as_u16().to_string();
            metrics::counter!(REQUESTS, "status" => status).increment(1);
            Ok(response)
        })
    }
}

/// Runs the proxy until a signal ends it; `json`: the start line as one JSON object.
pub async fn run(args: ProxyArgs, json: bool) -> anyhow::Result<ExitCode> {
    let config = args.config.clone();
    let (args, routes) = match &config {
        Some(path) => config::merged(Some(path))?,
        None => (args, Vec::new()),
    };
    let Some(listen) = args.listen else {
        bail!("--listen is required (or `listen` in --config)");
    };
    let listener_tls = args.listener_tls.listener()?;
    let contracts = args.guard.contracts(None)?;
    let (layer, key, compacted) = args
        .guard
        .layer_key_and_ledger(contracts, args.attach_timeout)
        .await?;
    let layer = args.on_held.install(layer, &args.upstream_tls)?;
    let live = build_live(&args, &routes, &layer, &key)?;
    if let Some(names) = live.principals.credential_headers() {
        let held = live.routes.iter().next().map(|route| route.held.clone());
        say_who_is_anonymous(names, &held.unwrap_or_default());
    }
    // The upstream URLs may carry a credential: only their redacted forms are printed.
    let shown_upstream = match (&args.upstream, &routes[..]) {
        (Some(upstream), []) => redact_url(upstream),
        _ => live
            .routes
            .iter()
            .map(|route| {
                format!(
                    "{} {}",
                    route.prefix(),
                    redact_url(&route.upstream.to_string())
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    };
    let signals = serve::Signals::catch().context("cannot catch SIGTERM and SIGINT")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}: is the port free?"))?;
    let local = listener.local_addr()?;
    let origins = Origins::new(
        local,
        listener_tls.scheme(),
        &args.allowed_host,
        &args.allowed_origin,
    );
    let proxy = Proxy::of(live.routes, live.principals, origins);
    // SIGHUP re-reads the configuration and the policy files (and never ends the process).
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot catch SIGHUP")?;
    tokio::spawn(reload_on_hangup(
        hangup,
        proxy.live.clone(),
        config,
        layer.clone(),
        key,
    ));
    let stopping = proxy.front.stopping.clone();
    // Bound before the line a script waits for: once it reads it, both listeners take
    // connections.
    // The metrics recorder too, so that no call goes uncounted.
    let admin = match args.admin_listen {
        Some(address) => Some((
            tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on --admin-listen {address}"))?,
            crate::telemetry::metrics()?,
        )),
        None => None,
    };
    if let Some(ledger) = compacted {
        compaction::spawn(&args.compaction, ledger);
    }
    let listening = format!("{}://{local}", listener_tls.scheme());
    let admin_url = match &admin {
        Some((admin, _)) => Some(format!("http://{}", admin.local_addr()?)),
        None => None,
    };
    // One line on stdout a script (or a test) can wait for; with --json, one JSON object.
    if json {
        println!(
            "{}",
            serde_json::json!({
                "listening": listening,
                "upstream": shown_upstream,
                "admin": admin_url,
            })
        );
    } else {
        println!("listening on {listening} -> {shown_upstream}");
        if let Some(admin_url) = &admin_url {
            // After the line a script waits for, which may have stopped reading: never a panic.
            let _ = writeln!(std::io::stdout(), "admin listening on {admin_url}");
        }
    }
    if let Some((admin, metrics)) = admin {
        let live = Some(proxy.live.clone());
        let readiness = admin::Readiness::of(&layer, args.guard.ledger.as_ref(), live, metrics);
        tokio::spawn(admin::serve(admin, readiness, stopping.clone()));
    }
    Ok(serve::serve(
        listener,
        listener_tls,
        signals,
        &args.serve,
        &layer,
        stopping,
        proxy.handler(),
    )
    .await)
}

/// The routes and principals `args` and the configuration's `routes` describe: one route for
/// every path with `--upstream`, one per `[[route]]` otherwise; each guarded by `layer` under
/// its own policy (the ledger, key and in-flight table shared).
fn build_live(
    args: &ProxyArgs,
    routes: &[config::RouteConfig],
    layer: &GuardLayer,
    key: &FingerprintKey,
) -> anyhow::Result<Live> {
    let routes = match (&args.upstream, routes) {
        (Some(_), [_, ..]) => bail!("give --upstream or [[route]]s in --config, not both"),
        (None, []) => bail!("--upstream is required (or [[route]]s in --config)"),
        (Some(upstream), []) => {
            let upstream = upstream_of(upstream, "--upstream")?;
            let connector = args.upstream_tls.connector(&upstream, "--upstream")?;
            let held = crate::mcp_http::parse_headers(&args.headers)?;
            let layer = layer.clone().contracts(args.guard.contracts(None)?);
            vec![Route::new(
                "/",
                upstream,
                &layer,
                connector,
                TokioExecutor::new(),
                held,
            )]
        }
        (None, routes) => routes
            .iter()
            .map(|route| {
                let flag = format!("route {}", route.prefix);
                let upstream = upstream_of(&route.upstream, &flag)?;
                let connector =
                    ClientTls::trusting(route.ca_cert.clone()).connector(&upstream, &flag)?;
                let held =
                    crate::mcp_http::parse_headers(&route.header).with_context(|| flag.clone())?;
                let contracts = match route.policy.as_ref().or(args.guard.policy.as_ref()) {
                    Some(path) => ContractRegistry::from_path(path)
                        .with_context(|| format!("{flag}: the policy {}", path.display()))?,
                    None => ContractRegistry::default(),
                };
                let layer = layer.clone().contracts(contracts);
                Ok(Route::new(
                    &route.prefix,
                    upstream,
                    &layer,
                    connector,
                    TokioExecutor::new(),
                    held,
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?,
    };
    Ok(Live {
        routes: Routes::new(routes),
        principals: principals_of(args, key)?,
    })
}

/// An upstream endpoint URL, without user info (never sent: a warning says so).
fn upstream_of(url: &str, flag: &str) -> anyhow::Result<Uri> {
    // The URL may carry a credential: only its redacted form is shown.
    let shown = redact_url(url);
    let upstream: Uri = url
        .parse()
        .with_context(|| format!("{flag} {shown:?} is not a URL"))?;
    let (upstream, had_userinfo) =
        crate::mcp_http::without_userinfo(upstream).context(flag.to_owned())?;
    if had_userinfo {
        tracing::warn!("{}", crate::mcp_http::USERINFO_NOT_SENT);
    }
    if upstream.authority().is_none() {
        bail!("{flag} must be http://host:port/path or https://host:port/path");
    }
    Ok(upstream)
}

/// Who acts, by the flags: a proven principal, a gateway's header, a fixed actor, or a tag of
/// the credentials a request carries.
fn principals_of(args: &ProxyArgs, key: &FingerprintKey) -> anyhow::Result<Principals> {
    let header_name = |flag: &str, name: &str| {
        HeaderName::from_bytes(name.trim().as_bytes())
            .with_context(|| format!("{flag}: {name:?} is not a header name"))
    };
    let actor_header = args
        .actor_header
        .as_deref()
        .map(|name| header_name("--actor-header", name))
        .transpose()?;
    let scope = match &args.scope_header {
        Some(name) => ScopeSource::Header(header_name("--scope-header", name)?),
        None => ScopeSource::Fixed(IntentScope::new(args.guard.scope.as_str())),
    };
    let credential_headers = args
        .credential_header
        .iter()
        .map(|name| header_name("--credential-header", name))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let authentication = authentication::Authentication::from_files(
        args.clients.as_deref(),
        args.jwt_jwks.as_deref(),
        args.jwt_issuer.as_deref(),
        args.jwt_audience.as_deref(),
        args.listener_tls.client_principal(),
    )?;
    match &authentication {
        Some(authentication) => tracing::info!(
            "clients authenticate: {}; a request that does not is answered 401 and never sent",
            authentication.describe()
        ),
        None => tracing::info!(
            "no client authentication (--clients, --jwt-jwks): the actor of a request comes from \
             the credential bytes it carries"
        ),
    }
    Ok(Principals::new(
        args.guard.actor.as_deref(),
        actor_header,
        credential_headers,
        scope,
        key,
    )
    .authenticated_by(authentication))
}

/// On every SIGHUP: the configuration (and the policy, clients and key files it names) read
/// again; a valid one replaces the routes and principals for new requests (calls in flight
/// finish under the old), an invalid one is refused with the reason and the old one stays. The
/// listeners, TLS, the ledger and the admin address take a change at the next start.
async fn reload_on_hangup(
    mut hangup: tokio::signal::unix::Signal,
    live: Arc<std::sync::RwLock<Arc<Live>>>,
    config: Option<PathBuf>,
    layer: GuardLayer,
    key: FingerprintKey,
) {
    while hangup.recv().await.is_some() {
        let reloaded = config::merged(config.as_deref())
            .and_then(|(args, routes)| build_live(&args, &routes, &layer, &key));
        match reloaded {
            Ok(new) => {
                let routes = new.routes.iter().count();
                *live
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(new);
                tracing::warn!(routes, "configuration reloaded on SIGHUP");
            }
            Err(error) => tracing::error!(
                "configuration not reloaded on SIGHUP, the one before stays: {error:#}"
            ),
        }
    }
}

/// Says once, at start-up, what a client without credentials is when the actor comes from the
/// credentials `names` (and the query string), and whether the proxy holds a credential of its
/// own (`held`), which the upstream then takes from every such client.
fn say_who_is_anonymous(names: &[HeaderName], held: &HeaderMap) {
    let names = names
        .iter()
        .map(HeaderName::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    let meaning = format!(
        "each client acts as a tag of the credentials it sends ({names}, the query string); a client that sends none acts as `anonymous`, and anonymous clients share kept results and held answers; give --actor-header (a gateway's identity) or --actor to say who acts"
    );
    match held
        .keys()
        .find(|name| names.split(", ").any(|n| n == name.as_str()))
    {
        // The proxy's own token tells the upstream nothing about who its client is.
        Some(name) => tracing::warn!(
            "--header {name}: the proxy holds a credential of the upstream's; {meaning}"
        ),
        None => tracing::warn!("{meaning}"),
    }
}

/// Forwards one request through the guard to the upstream endpoint, as its client's actor.
async fn forward(
    proxy: Proxy,
    deliveries: Arc<Deliveries>,
    request: Request<request_body::RequestBody>,
) -> Result<Response<ProxyBody>, Infallible> {
    // The configuration now: this request finishes under it, whatever a reload does meanwhile.
    let live = proxy.live();
    let front = proxy.front;
    // Before anything of the request is read: a page elsewhere never acts through the proxy.
    if let Err(foreign) = front.origins.check(request.headers(), request.uri()) {
        tracing::warn!("refused: {foreign}");
        return refused(
            "origin",
            answers::own(jsonrpc_error(
                StatusCode::FORBIDDEN,
                None,
                answers::PROXY_ERROR,
                format!("replay-guard proxy: {foreign}"),
            )),
        );
    }
    // The admin listener's paths are never forwarded (or served) here.
    if admin::is_admin_path(request.uri().path()) {
        return refused(
            "admin_path",
            error_response(
                StatusCode::NOT_FOUND,
                "replay-guard proxy: an admin path is served on --admin-listen only; nothing was sent",
            ),
        );
    }
    // A path no route serves is never forwarded.
    let Some(route) = live.routes.find(route_path(request.uri().path())) else {
        return refused(
            "no_route",
            error_response(
                StatusCode::NOT_FOUND,
                "replay-guard proxy: no route serves this path; nothing was sent",
            ),
        );
    };
    let (mut parts, body) = request.into_parts();
    // Before anything of the request is read: a client that does not prove who it is gets
    // nothing sent, nothing recorded. The credential it proved itself with stays here.
    let certificate = parts.extensions.get::<ClientCertificate>().cloned();
    let authenticated = match live
        .principals
        .authenticate(&mut parts.headers, certificate.as_ref())
    {
        Ok(authenticated) => authenticated,
        Err(unauthenticated) => {
            tracing::warn!("refused: {unauthenticated}");
            return refused(
                "unauthenticated",
                answers::unauthenticated(&unauthenticated),
            );
        }
    };
    // Read whole (as the guard would): the proxy reads who the client is from it.
    let bytes = match Limited::new(body, DEFAULT_MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return refused(
                "too_large",
                answers::own(jsonrpc_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    None,
                    -32600,
                    format!(
                        "the request body is larger than the proxy's {DEFAULT_MAX_BODY_BYTES}-byte limit; nothing was sent"
                    ),
                )),
            );
        }
        Err(error) if error.is::<request_body::TooSlow>() => {
            return refused("too_slow", request_body::too_slow(&error));
        }
        Err(error) => {
            let message = format!(
                "replay-guard proxy: the request body could not be read ({}); nothing was sent",
                describe(&*error)
            );
            return refused(
                "body_unreadable",
                error_response(StatusCode::BAD_REQUEST, &message),
            );
        }
    };
    if is_oauth_metadata(&parts) {
        if climbs(parts.uri.path()) {
            return refused(
                "metadata_path",
                error_response(
                    StatusCode::BAD_REQUEST,
                    "replay-guard proxy: a metadata path with a `.` or `..` segment is refused; nothing was sent",
                ),
            );
        }
        return Ok(metadata(&live.principals, route, parts, bytes).await);
    }
    // A relay passes on what its client sent: a 2026-07-28 request without its standard
    // headers is refused as the upstream would refuse it, never repaired.
    if let Err(error) = protocol::require_standard_headers(&parts.method, &parts.headers, &bytes) {
        let id = protocol::request_id_of(&bytes);
        return refused(
            "not_standard",
            answers::own(refused_request(&error, id.as_ref())),
        );
    }
    // Before `--header` replaces anything: the actor is who the client says it is.
    match live
        .principals
        .identify(&mut parts.headers, &parts.uri, authenticated)
    {
        Ok((actor, scope)) => {
            parts.extensions.insert(actor);
            parts.extensions.insert(scope);
        }
        Err(unidentified) => {
            let id = protocol::request_id_of(&bytes);
            let message = format!("replay-guard proxy: {unidentified}; nothing was sent");
            return refused(
                "unidentified",
                answers::own(jsonrpc_error(
                    StatusCode::BAD_REQUEST,
                    id.as_ref(),
                    -32600,
                    message,
                )),
            );
        }
    }
    let session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(client) = session.as_deref().and_then(|s| front.sessions.client(s)) {
        parts.extensions.insert(client);
    }
    let initializing = clients::initialize_client(&bytes);
    let deleting = (parts.method == http::Method::DELETE)
        .then_some(session)
        .flatten();
    parts.uri = match upstream_uri(&route.upstream, parts.uri.query()) {
        Some(uri) => uri,
        None => {
            return refused(
                "bad_query",
                error_response(StatusCode::BAD_REQUEST, "the query string is not valid"),
            );
        }
    };
    parts.version = http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    hold_headers(&route.held, &mut parts.headers);
    let guard = route.guard.clone();
    let span = crate::trace_context::request_span(&parts.headers, &bytes);
    let response = answers::answer(guard, parts, bytes, deliveries, &front.stopping)
        .instrument(span)
        .await;
    if let Some(client) = initializing
        && let Some(session) = response.headers().get("mcp-session-id")
        && let Ok(session) = session.to_str()
    {
        front.sessions.remember(session, client);
    }
    if let Some(session) = deleting
        && response.status().is_success()
    {
        front.sessions.forget(&session);
    }
    Ok(response)
}

/// A request the proxy answered itself, sending nothing: counted by `reason` (a fixed word,
/// never anything of the request's).
fn refused(
    reason: &'static str,
    response: Response<ProxyBody>,
) -> Result<Response<ProxyBody>, Infallible> {
    metrics::counter!(REFUSED, "reason" => reason).increment(1);
    Ok(response)
}

/// The path a request is routed by: its own, or for an OAuth metadata document named after its
/// resource (`/.well-known/oauth-protected-resource/deploy/mcp`), the resource's path.
fn route_path(path: &str) -> &str {
    for prefix in METADATA_PREFIXES {
        if let Some(rest) = path.strip_prefix(prefix)
            && rest.starts_with('/')
        {
            return rest;
        }
    }
    path
}

/// The paths of the OAuth metadata documents.
const METADATA_PREFIXES: [&str; 3] = [
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-authorization-server",
    "/.well-known/openid-configuration",
];

/// Whether the request asks for OAuth metadata (RFC 9728 protected resource, RFC 8414
/// authorization server, OpenID discovery), with or without a suffix: a GET (or HEAD), as those
/// documents are fetched, that is no resume (`Last-Event-ID`). Anything else goes through the
/// guard like every request: the metadata path goes around it, and an upstream may serve MCP
/// on any path.
fn is_oauth_metadata(parts: &http::request::Parts) -> bool {
    let fetch = parts.method == http::Method::GET || parts.method == http::Method::HEAD;
    if !fetch || parts.headers.contains_key(protocol::LAST_EVENT_ID) {
        return false;
    }
    let path = parts.uri.path();
    METADATA_PREFIXES.iter().any(|prefix| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// Whether `path` has a `.` or `..` segment, also percent-encoded or after a backslash, by which an
/// upstream that normalises paths would leave `/.well-known/` (for its MCP endpoint, say).
fn climbs(path: &str) -> bool {
    let decoded = path
        .to_ascii_lowercase()
        .replace("%2e", ".")
        .replace("%2f", "/")
        .replace("%5c", "/")
        .replace('\\', "/");
    decoded
        .split('/')
        .any(|segment| segment == "." || segment == "..")
}

/// An OAuth metadata request, sent to the same path on the upstream's origin (not through the
/// guard: it is no MCP message), its answer passed back as it came.
async fn metadata(
    principals: &Principals,
    route: &Route,
    mut parts: http::request::Parts,
    bytes: Bytes,
) -> Response<ProxyBody> {
    let mut uri = route.upstream.clone().into_parts();
    uri.path_and_query = parts.uri.path_and_query().cloned();
    parts.uri = match Uri::from_parts(uri) {
        Ok(uri) => uri,
        Err(_) => return error_response(StatusCode::BAD_REQUEST, "the path is not valid"),
    };
    parts.version = http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    principals.remove_gateway_headers(&mut parts.headers);
    hold_headers(&route.held, &mut parts.headers);
    match route
        .metadata
        .clone()
        .oneshot(Request::from_parts(parts, Full::new(bytes)))
        .await
    {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.map_err(Into::into).boxed_unsync())
        }
        Err(error) => {
            tracing::warn!(error = %describe(&error), "upstream metadata request failed");
            let message = format!("replay-guard proxy: {}", tls::described(&error));
            error_response(StatusCode::BAD_GATEWAY, &message)
        }
    }
}

/// Sets the `--header` headers, each in place of the client's header of that name.
fn hold_headers(held: &HeaderMap, headers: &mut HeaderMap) {
    for name in held.keys() {
        headers.remove(name);
    }
    for (name, value) in held {
        headers.append(name, value.clone());
    }
}

/// The upstream endpoint, with the client's query string, if it sent one, after the
/// upstream URL's own (which may carry a key the upstream handed out: never dropped).
fn upstream_uri(upstream: &Uri, query: Option<&str>) -> Option<Uri> {
    let Some(query) = query else {
        return Some(upstream.clone());
    };
    let mut parts = upstream.clone().into_parts();
    let path = upstream.path();
    let query = match upstream.query() {
        Some(own) => format!("{own}&{query}"),
        None => query.to_owned(),
    };
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

/// An answer of the proxy's own to a request that is not JSON-RPC (a GET stream, a DELETE):
/// plain text.
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
