//! Adapters for the clients Rust users already have.

#[cfg(feature = "reqwest")]
pub mod reqwest;
#[cfg(feature = "rmcp")]
pub mod rmcp;
