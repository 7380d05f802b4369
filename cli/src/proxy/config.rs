//! `--config FILE`: the proxy's options in a TOML file, re-read on SIGHUP.
//!
//! A top-level key is the flag of the same name (`listen = "…"` is `--listen …`, `jwt_jwks` is
//! `--jwt-jwks`; an array repeats the flag, `true` sets a switch). Flags on the command line
//! override the file; for an option that reads a `REPLAY_GUARD_*` variable, a variable that is
//! set overrides the file too. `[[route]]` entries put several upstreams behind one proxy, each
//! under a path prefix of its own, with its own policy, held credential and CA:
//!
//! ```toml
//! listen = "127.0.0.1:8081"
//! ledger = "/var/lib/replay-guard/ledger.jsonl"
//!
//! [[route]]
//! prefix = "/deploy"
//! upstream = "https://deploy.internal/mcp"
//! policy = "/etc/replay-guard/deploy-policy.toml"
//! header = ["Authorization: Bearer …"]
//! ```

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use clap::{CommandFactory, Parser};
use serde::Deserialize;

use super::ProxyArgs;

/// The largest configuration file read, in bytes.
const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The proxy's arguments on their own, as the command line and a configuration file give them.
#[derive(Debug, Parser)]
#[command(
    name = "replay-guard proxy",
    no_binary_name = true,
    args_override_self = true
)]
struct ProxyCommand {
    #[command(flatten)]
    args: ProxyArgs,
}

/// One `[[route]]` of the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteConfig {
    /// The path prefix its clients use (`/deploy` serves `/deploy` and the paths below it).
    pub(super) prefix: String,
    /// The upstream MCP endpoint.
    pub(super) upstream: String,
    /// Its policy file; the proxy's `--policy` when absent.
    pub(super) policy: Option<PathBuf>,
    /// Headers set on every upstream request of the route, `'Name: value'`.
    #[serde(default)]
    pub(super) header: Vec<String>,
    /// The CA certificates its `https://` upstream is trusted by; the platform's when absent.
    pub(super) ca_cert: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct File {
    #[serde(default)]
    route: Vec<RouteConfig>,
    #[serde(flatten)]
    options: toml::Table,
}

/// The proxy's arguments with `config` under the command line's, and the file's routes.
pub(super) fn merged(config: Option<&Path>) -> anyhow::Result<(ProxyArgs, Vec<RouteConfig>)> {
    let command_line = command_line_tail();
    let (mut argv, routes) = match config {
        Some(path) => read(path)?,
        None => (Vec::new(), Vec::new()),
    };
    argv.extend(command_line);
    let parsed = ProxyCommand::try_parse_from(argv).map_err(|error| anyhow::anyhow!("{error}"))?;
    Ok((parsed.args, routes))
}

/// Whether the file at `path` is a configuration the proxy takes: every key an option, every
/// value of its type, every route well formed (the files it names need not exist).
#[cfg(test)]
pub(crate) fn validate(path: &Path) -> anyhow::Result<()> {
    let (argv, _) = read(path)?;
    ProxyCommand::try_parse_from(argv).map_err(|error| anyhow::anyhow!("{error}"))?;
    Ok(())
}

/// The flags and routes of the file at `path`.
fn read(path: &Path) -> anyhow::Result<(Vec<OsString>, Vec<RouteConfig>)> {
    use std::io::Read;
    let shown = path.display();
    let file =
        std::fs::File::open(path).with_context(|| format!("--config {shown}: cannot open it"))?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("--config {shown}: cannot read it as text"))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        bail!("--config {shown}: larger than {MAX_FILE_BYTES} bytes");
    }
    let file: File =
        toml::from_str(&text).map_err(|error| anyhow::anyhow!("--config {shown}: {error}"))?;
    let command = ProxyCommand::command();
    let mut argv = Vec::new();
    for (key, value) in &file.options {
        let at = line_of(&text, key).map_or(String::new(), |line| format!(" line {line}"));
        let long = key.replace('_', "-");
        let Some(arg) = command
            .get_arguments()
            .find(|arg| arg.get_long() == Some(long.as_str()))
        else {
            bail!("--config {shown}{at}: `{key}` is no option of the proxy");
        };
        if long == "config" {
            bail!("--config {shown}{at}: a configuration file cannot name another");
        }
        // A variable set for this host overrides the file.
        if let Some(variable) = arg.get_env()
            && std::env::var_os(variable).is_some()
        {
            continue;
        }
        let flag = format!("--{long}");
        let values = match value {
            toml::Value::Array(values) => values.iter().collect(),
            value => vec![value],
        };
        for value in values {
            match value {
                toml::Value::Boolean(true) => argv.push(flag.clone().into()),
                toml::Value::Boolean(false) => {}
                toml::Value::String(text) => {
                    argv.push(flag.clone().into());
                    argv.push(text.into());
                }
                toml::Value::Integer(number) => {
                    argv.push(flag.clone().into());
                    argv.push(number.to_string().into());
                }
                _ => bail!("--config {shown}{at}: `{key}` takes a string, a number or a switch"),
            }
        }
    }
    let mut prefixes = std::collections::HashSet::new();
    for route in &file.route {
        if !route.prefix.starts_with('/') {
            bail!(
                "--config {shown}: route prefix {:?} does not start with /",
                route.prefix
            );
        }
        if !prefixes.insert(route.prefix.trim_end_matches('/').to_owned()) {
            bail!(
                "--config {shown}: route prefix {:?} is given twice",
                route.prefix
            );
        }
    }
    Ok((argv, file.route))
}

/// The line (from 1) where `key` is set at the top of `text`.
fn line_of(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            line.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|index| index + 1)
}

/// The proxy's arguments as the command line gave them (after `proxy`), without the command's
/// global flags (`--json`, `--log-format`).
fn command_line_tail() -> Vec<OsString> {
    let mut args = std::env::args_os().skip_while(|arg| arg != "proxy").skip(1);
    let mut tail = Vec::new();
    while let Some(arg) = args.next() {
        if arg == "--json" || arg.to_string_lossy().starts_with("--log-format=") {
            continue;
        }
        if arg == "--log-format" {
            args.next();
            continue;
        }
        tail.push(arg);
    }
    tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_on_its_line() {
        let text = "listen = \"a\"\n\n  ledger=\"b\"\n[[route]]\nprefix = \"/x\"\n";
        assert_eq!(line_of(text, "listen"), Some(1));
        assert_eq!(line_of(text, "ledger"), Some(3));
        assert_eq!(line_of(text, "led"), None);
    }
}
