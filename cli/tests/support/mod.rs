//! The test support crate of both packages (`tests/support`), as it is, plus what only this
//! package has: the built `replay-guard` binary run as a child process (`bin`).
#![allow(dead_code)]
#![allow(unused_imports)]

mod bin;
mod browser;
mod deploys;
mod listeners;

pub use bin::{
    BIN, Proxy, Run, call, call_argv, call_text, concurrently, ledger_list, ledger_records,
    proxy_args, replay_guard, replay_guard_blocking, replay_guard_command, replay_guard_parts,
    replay_guard_within, spawn_proxy, spawn_replay_guard, start_proxy, start_proxy_command,
    start_proxy_logged,
};
pub use browser::{Chromedriver, browser_or_skip};
pub use deploys::{
    HyperClient, deploy_args, deploy_as, deploy_request, json_server, json_server_with_bearer,
};
pub use listeners::{Posted, free_port, get_text, post_receiver};
pub use mcp_replay_guard_test_support::*;
