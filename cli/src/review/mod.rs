//! `replay-guard review`: a small web page over a ledger, for the people who settle held
//! executions. Server-rendered HTML, no script: the held queue (`queue`), a page per execution
//! with its timeline drawn (`execution`, `picture`), and a form that resolves it (`resolve`)
//! with the token given at start-up (`token`). It reads the same ledger the guards write,
//! live: a file opened read-only (the resolve form opens it to write, as `replay-guard
//! resolve` does), or PostgreSQL.
//!
//! # Where it listens
//!
//! On a loopback address unless `--allow-remote` says otherwise: the page shows what agents
//! did and settles what they may do again, and over plain HTTP the token typed into it would
//! cross the network in clear. Every request's `Host` must be one the page serves (DNS
//! rebinding), as the proxy's is (`proxy::origins`); every answer carries the headers of
//! `answer`.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc};

use anyhow::{Context, bail};
use clap::Args;

use crate::{
    inspect::LedgerArg,
    ledger_location::{Access, KeyOptions},
    proxy::origins::Origins,
};

mod answer;
mod execution;
mod form;
mod layout;
mod picture;
mod queue;
mod resolve;
mod serve;
mod site;
mod span;
mod token;

use site::Site;
use token::{TOKEN_VARIABLE, Token};

/// `review`.
#[derive(Debug, Args)]
pub(crate) struct ReviewArgs {
    #[command(flatten)]
    ledger: LedgerArg,
    /// Where to serve the page (port 0 picks one and prints it). A loopback address unless
    /// --allow-remote is given.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Listen on an address that is not loopback. The page is plain HTTP: put it behind a
    /// TLS-terminating proxy, and name its host and origin (--allowed-host, --allowed-origin).
    #[arg(long)]
    allow_remote: bool,
    /// The token the resolve form must carry: a file that holds it (at least 16 characters;
    /// `openssl rand -hex 32` makes one). Without it, the variable REPLAY_GUARD_REVIEW_TOKEN;
    /// without either, the page is read-only. Never printed.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// A `Host` the page serves (repeatable; `name` for any port, `name:port` for one). By
    /// default, on a loopback address: `localhost`, `127.0.0.1` and `[::1]` with its port; on
    /// any other address: any. Another host is refused 403 (DNS rebinding).
    #[arg(long, value_name = "HOST")]
    allowed_host: Vec<String>,
    /// An `Origin` the page's form may post from (repeatable, `scheme://host:port`): the
    /// page's own address as the browser sees it. By default, on a loopback address: the
    /// loopback origins of its port; on any other address: none (nothing can be resolved
    /// from a browser until it is given).
    #[arg(long, value_name = "ORIGIN")]
    allowed_origin: Vec<String>,
    #[command(flatten)]
    key: KeyOptions,
}

/// Serves the review page until SIGTERM or SIGINT.
pub(crate) async fn run(args: ReviewArgs, json: bool) -> anyhow::Result<ExitCode> {
    may_listen_on(args.listen, args.allow_remote)?;
    let token = Token::load(args.token_file.as_deref())?;
    let location = args.ledger.location()?;
    if location.file().is_some() {
        args.key.refuse_file_ledger()?;
    }
    let ledger = location
        .open(Access::Read)
        .await
        .with_context(|| format!("cannot open the ledger {location}"))?
        .ledger();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}: is the port free?", args.listen))?;
    let local = listener.local_addr()?;
    let origins = Origins::new(local, "http", &args.allowed_host, &args.allowed_origin);
    let read_only = token.is_none();
    let site = Arc::new(Site {
        ledger,
        location,
        key: args.key,
        token,
        origins,
    });
    let url = format!("http://{local}");
    // One line on stdout a script (or a test) can wait for; with --json, one JSON object.
    if json {
        println!(
            "{}",
            serde_json::json!({ "listening": url, "read_only": read_only })
        );
    } else {
        println!("review listening on {url}");
    }
    if read_only {
        eprintln!(
            "the review page is read-only: give --token-file PATH or {TOKEN_VARIABLE} to \
             resolve from it"
        );
    }
    Ok(serve::serve(listener, site).await?)
}

/// Refuses an address that is not loopback unless `allow_remote`, saying why.
fn may_listen_on(listen: SocketAddr, allow_remote: bool) -> anyhow::Result<()> {
    if listen.ip().is_loopback() || allow_remote {
        return Ok(());
    }
    bail!(
        "refusing to serve the review page on {listen}, which is not a loopback address: the \
         page shows what agents did and settles held calls, and it speaks plain HTTP, so the \
         token typed into it would cross the network in clear. Listen on 127.0.0.1 (and reach \
         it through an SSH tunnel), or put it behind a TLS-terminating proxy and give \
         --allow-remote with --allowed-host and --allowed-origin"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_unless_remote_is_allowed() {
        for local in ["127.0.0.1:8080", "[::1]:0", "127.0.0.2:9"] {
            assert!(
                may_listen_on(local.parse().unwrap(), false).is_ok(),
                "{local}"
            );
        }
        for remote in ["0.0.0.0:8080", "[::]:8080", "192.0.2.1:80"] {
            let error = may_listen_on(remote.parse().unwrap(), false).unwrap_err();
            assert!(error.to_string().contains("--allow-remote"), "{error}");
            assert!(may_listen_on(remote.parse().unwrap(), true).is_ok());
        }
    }
}
