//! `HeldHook`: who is told when an execution becomes held, once per attempt, from the one
//! place every recorded outcome passes (the guard's metered ledger).

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, RwLock},
};

use crate::{ExecutionId, execution::ExecutionRecord};

/// What a held execution is handed to. It runs on the recording task: it must return at once
/// (queue the work elsewhere), and it is never given arguments or credentials (a record holds
/// neither).
pub type OnHeld = Arc<dyn Fn(&ExecutionRecord) + Send + Sync>;

/// How many (execution, attempt) pairs are remembered as told, before the memory starts over
/// (a pair told again after that is told twice, never not at all).
const REMEMBERED: usize = 16_384;

/// The hook of a layer and of every guard it builds, and the attempts already told.
#[derive(Default)]
pub(super) struct HeldHook {
    hook: RwLock<Option<OnHeld>>,
    told: Mutex<HashSet<(ExecutionId, u32)>>,
}

impl HeldHook {
    pub(super) fn set(&self, hook: OnHeld) {
        *self.hook.write().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    /// `record` was just written: tells the hook when it is held and this attempt was not
    /// told before (`unknown` then `needs_review` is one becoming held).
    pub(super) fn written(&self, record: &ExecutionRecord) {
        if !record.state.is_held() {
            return;
        }
        let Some(hook) = self.hook.read().unwrap_or_else(|p| p.into_inner()).clone() else {
            return;
        };
        {
            let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
            if told.len() >= REMEMBERED {
                told.clear();
            }
            if !told.insert((record.execution_id, record.attempts)) {
                return;
            }
        }
        hook(record);
    }
}

impl std::fmt::Debug for HeldHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldHook").finish_non_exhaustive()
    }
}

/// Shared by a layer's [`Metered`](super::metered::Metered) ledger and its configuration.
pub(super) type SharedHeldHook = Arc<HeldHook>;
