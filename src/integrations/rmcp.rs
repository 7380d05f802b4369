//! rmcp integration (in progress).
