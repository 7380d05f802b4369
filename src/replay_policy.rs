//! `ReplayPolicy` (in progress).
