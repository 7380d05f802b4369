//! Adapters for the clients Rust users already have, and the server half.

#[cfg(feature = "reqwest")]
pub mod reqwest;
#[cfg(feature = "rmcp")]
pub mod rmcp;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "ssh")]
pub mod ssh;
