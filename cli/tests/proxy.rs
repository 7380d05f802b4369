//! `replay-guard proxy`, run as the built binary, in one test binary: transparency to rmcp's
//! client and server and to the official conformance suite's fixture (`cli_proxy`,
//! `cli_proxy_transparency`), the answers it writes (`cli_proxy_answers`), the actor of each
//! client (`cli_proxy_principals`), how it keeps running and shuts down
//! (`cli_proxy_uptime`), its ledger kept small under traffic (`cli_proxy_compaction`), and
//! its metrics, traces and call lines (`cli_proxy_telemetry`).

mod support;

#[path = "proxy/cli_proxy.rs"]
mod cli_proxy;
#[cfg(feature = "server")]
#[path = "proxy/cli_proxy_admin.rs"]
mod cli_proxy_admin;
#[path = "proxy/cli_proxy_answers.rs"]
mod cli_proxy_answers;
#[path = "proxy/cli_proxy_auth.rs"]
mod cli_proxy_auth;
#[path = "proxy/cli_proxy_compaction.rs"]
mod cli_proxy_compaction;
#[path = "proxy/cli_proxy_config.rs"]
mod cli_proxy_config;
#[cfg(feature = "server")]
#[path = "proxy/cli_proxy_held.rs"]
mod cli_proxy_held;
#[path = "proxy/cli_proxy_principals.rs"]
mod cli_proxy_principals;
#[cfg(feature = "server")]
#[path = "proxy/cli_proxy_telemetry.rs"]
mod cli_proxy_telemetry;
#[path = "proxy/cli_proxy_transparency.rs"]
mod cli_proxy_transparency;
#[path = "proxy/cli_proxy_uptime.rs"]
mod cli_proxy_uptime;
