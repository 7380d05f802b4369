//! reqwest-middleware integration (in progress).
