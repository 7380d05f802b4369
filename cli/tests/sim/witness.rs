//! The oracle's own record of what a ledger acknowledged: every write the ledger answered as
//! done and synced (a claim that created an execution, an append, a `completed` with its
//! result), kept outside the system under test, so that a restart can check that each one
//! survived whatever crash came between. A write the ledger may lose by design (the unsynced
//! `delivered`) is not counted.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use mcp_replay_guard::{
    ExecutionId,
    execution::{Claim, Claimed, Dispatch, EventKind, ExecutionRecord, LedgerEvent},
    ledger::{Ledger, LedgerError},
};

use crate::{disk::Machine, world::now_ms};

/// One acknowledged write: the execution, its tool, the event's name, when it was asked for
/// (simulated time, the oracle's own clock, not the machine's) and whether it settles the
/// execution (`completed`, or resolved as applied). A write that settles is noted when it is
/// asked for too, not acknowledged yet: a process killed after its write reached the file
/// leaves it there, acknowledged to nobody.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    pub execution_id: ExecutionId,
    pub tool: String,
    pub event: &'static str,
    pub asked_ms: u64,
    pub settles: bool,
    pub acknowledged: bool,
    /// Not acknowledged (its process was killed during the write), but a ledger reopened
    /// after the crash held it: from then on it stands, whatever retention later purges.
    pub held_after_crash: bool,
}

/// What the ledgers of one machine acknowledged, over every life of its processes.
pub type AckedWrites = Arc<Mutex<Vec<Acked>>>;

/// A ledger that notes what it acknowledged. It forwards every method of the trait, those
/// with a default too, so the ledger's own implementation of each runs.
///
/// Over a file ledger it also checks each acknowledgement the moment it is given: the line it
/// acknowledges must be synced already (on the machine's simulated disk), not merely written,
/// so a write acknowledged before its sync is caught without waiting for a power loss to
/// take it.
#[derive(Debug)]
pub struct Witness {
    inner: Arc<dyn Ledger>,
    acked: AckedWrites,
    disk: Option<(Arc<Machine>, std::path::PathBuf)>,
}

impl Witness {
    /// `disk`: the machine and the ledger file's path, for a file ledger.
    pub fn new(
        inner: Arc<dyn Ledger>,
        acked: AckedWrites,
        disk: Option<(Arc<Machine>, std::path::PathBuf)>,
    ) -> Self {
        Self { inner, acked, disk }
    }

    /// The acknowledged line of `event` of `execution_id` is still only written, not synced.
    fn check_synced(&self, execution_id: ExecutionId, event: &str) {
        let Some((machine, path)) = &self.disk else {
            return;
        };
        let tail = machine.unsynced_tail(path);
        let (id, kind) = (
            format!("\"{execution_id}\""),
            format!("\"event\":\"{event}\""),
        );
        let unsynced = tail.split(|b| *b == b'\n').any(|line| {
            let line = String::from_utf8_lossy(line);
            line.contains(&id) && line.contains(&kind)
        });
        if unsynced {
            machine.violations.lock().unwrap().push(format!(
                "{event} of {execution_id} was acknowledged before it was synced"
            ));
        }
    }

    fn note(
        &self,
        record: &ExecutionRecord,
        events: &[&'static str],
        asked_ms: u64,
        settles: bool,
    ) {
        let mut acked = self.acked.lock().unwrap();
        for event in events {
            acked.push(Acked {
                execution_id: record.execution_id(),
                tool: record.tool().to_string(),
                event,
                asked_ms,
                settles,
                acknowledged: true,
                held_after_crash: false,
            });
        }
    }

    /// Notes a write that settles `execution_id` as asked for, before the ledger answers.
    fn asked(&self, execution_id: ExecutionId, event: &'static str, asked_ms: u64) {
        self.acked.lock().unwrap().push(Acked {
            execution_id,
            tool: String::new(),
            event,
            asked_ms,
            settles: true,
            acknowledged: false,
            held_after_crash: false,
        });
    }
}

#[async_trait]
impl Ledger for Witness {
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
        let asked = now_ms();
        let claimed = self.inner.claim(claim).await?;
        if let Claimed::New(record) = &claimed {
            self.note(record, &["accepted"], asked, false);
            self.check_synced(record.execution_id(), "accepted");
        }
        Ok(claimed)
    }

    async fn claim_dispatched(
        &self,
        claim: Claim,
        dispatch: Dispatch,
    ) -> Result<Claimed, LedgerError> {
        let asked = now_ms();
        let claimed = self.inner.claim_dispatched(claim, dispatch).await?;
        if let Claimed::New(record) = &claimed {
            self.note(record, &["accepted", "dispatched"], asked, false);
            self.check_synced(record.execution_id(), "dispatched");
        }
        Ok(claimed)
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        let (name, asked) = (event.kind.name(), now_ms());
        let settles = matches!(
            event.kind,
            EventKind::Completed { .. } | EventKind::Resolved { applied: true, .. }
        );
        if settles {
            self.asked(event.execution_id, name, asked);
        }
        let record = self.inner.append(event).await?;
        self.note(&record, &[name], asked, settles);
        self.check_synced(record.execution_id(), name);
        Ok(record)
    }

    async fn append_unsynced(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.inner.append_unsynced(event).await
    }

    async fn complete(
        &self,
        event: LedgerEvent,
        result: Option<Bytes>,
    ) -> Result<ExecutionRecord, LedgerError> {
        let asked = now_ms();
        self.asked(event.execution_id, "completed", asked);
        let record = self.inner.complete(event, result).await?;
        self.note(&record, &["completed"], asked, true);
        self.check_synced(record.execution_id(), "completed");
        Ok(record)
    }

    async fn get(&self, execution_id: ExecutionId) -> Result<Option<ExecutionRecord>, LedgerError> {
        self.inner.get(execution_id).await
    }

    async fn events(&self, execution_id: ExecutionId) -> Result<Vec<LedgerEvent>, LedgerError> {
        self.inner.events(execution_id).await
    }

    async fn list(&self) -> Result<Vec<ExecutionRecord>, LedgerError> {
        self.inner.list().await
    }

    async fn store_result(
        &self,
        execution_id: ExecutionId,
        result: Bytes,
    ) -> Result<String, LedgerError> {
        self.inner.store_result(execution_id, result).await
    }

    async fn load_result(&self, reference: &str) -> Result<Option<Bytes>, LedgerError> {
        self.inner.load_result(reference).await
    }

    async fn is_owner_alive(&self, owner: &str) -> bool {
        self.inner.is_owner_alive(owner).await
    }
}

/// Notes, of the settling writes of `acked` that were asked for and never acknowledged (a
/// crash came during them), those the reopened `ledger` holds: a restarted guard decides from
/// them, so the oracle counts them from here on, even once retention purges them.
pub async fn held_after_crash(ledger: &dyn Ledger, acked: &AckedWrites) {
    let unacknowledged: Vec<(usize, ExecutionId, &'static str)> = acked
        .lock()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, w)| w.settles && !w.acknowledged && !w.held_after_crash)
        .map(|(i, w)| (i, w.execution_id, w.event))
        .collect();
    for (i, execution_id, event) in unacknowledged {
        let held = ledger
            .events(execution_id)
            .await
            .unwrap_or_default()
            .iter()
            .any(|e| e.kind.name() == event);
        if held {
            acked.lock().unwrap()[i].held_after_crash = true;
        }
    }
}

/// The acknowledged writes of `acked` a reopened `ledger` does not hold. `kept`: whether an
/// execution of that tool is surely still in the index (its retention outlasts the schedule).
pub async fn lost(
    ledger: &dyn Ledger,
    acked: &AckedWrites,
    kept: impl Fn(&str) -> bool,
) -> Vec<String> {
    let acked = acked.lock().unwrap().clone();
    let mut lost = Vec::new();
    let mut checked: Vec<(ExecutionId, Vec<&'static str>)> = Vec::new();
    let acked: Vec<Acked> = acked.into_iter().filter(|w| w.acknowledged).collect();
    for write in acked.iter().filter(|write| kept(&write.tool)) {
        let held = match checked.iter().find(|(id, _)| *id == write.execution_id) {
            Some((_, names)) => names.clone(),
            None => {
                let names: Vec<&'static str> = ledger
                    .events(write.execution_id)
                    .await
                    .unwrap_or_default()
                    .iter()
                    .map(|event| event.kind.name())
                    .collect();
                checked.push((write.execution_id, names.clone()));
                names
            }
        };
        let acknowledged = acked
            .iter()
            .filter(|w| w.execution_id == write.execution_id && w.event == write.event)
            .count();
        let found = held.iter().filter(|name| **name == write.event).count();
        if found < acknowledged {
            let text = format!(
                "{} of {}: {acknowledged} acknowledged, {found} after the restart",
                write.event, write.execution_id
            );
            if !lost.contains(&text) {
                lost.push(text);
            }
        }
    }
    lost
}
