//! The guard: the decision of DESIGN §4 and the tower layer that applies it.

mod decision;

pub use decision::{Decision, Facts, UncertainReason, decide};
