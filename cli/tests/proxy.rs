//! `replay-guard proxy`, run as the built binary, in one test binary: transparency to rmcp's
//! client and server and to the official conformance suite's fixture (`cli_proxy`,
//! `cli_proxy_transparency`), the answers it writes (`cli_proxy_answers`), the actor of each
//! client (`cli_proxy_principals`), and how it keeps running and shuts down
//! (`cli_proxy_uptime`).

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
#[path = "proxy/cli_proxy_config.rs"]
mod cli_proxy_config;
#[path = "proxy/cli_proxy_principals.rs"]
mod cli_proxy_principals;
#[path = "proxy/cli_proxy_transparency.rs"]
mod cli_proxy_transparency;
#[path = "proxy/cli_proxy_uptime.rs"]
mod cli_proxy_uptime;
