//! The channels other than Streamable HTTP, in one test binary: stdio servers behind the
//! server half (`stdio_server`, feature `server`), the guard around an rmcp client transport
//! (`guarded_transport`, features `rmcp` and `server`), and remote commands over SSH against a
//! real sshd (`ssh_guard`, `ssh_marker`, feature `ssh`).

use mcp_replay_guard_test_support as support;

#[cfg(feature = "ssh")]
use support::sshd;
#[cfg(feature = "server")]
use support::stdio_example;

#[cfg(all(feature = "rmcp", feature = "server"))]
#[path = "channels/guarded_transport.rs"]
mod guarded_transport;
#[cfg(feature = "ssh")]
#[path = "channels/ssh_guard.rs"]
mod ssh_guard;
#[cfg(feature = "ssh")]
#[path = "channels/ssh_marker.rs"]
mod ssh_marker;
#[cfg(feature = "server")]
#[path = "channels/stdio_server.rs"]
mod stdio_server;
