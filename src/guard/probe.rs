//! `Probed`: what a status probe's answer leads to, recorded before the guard acts on it.

use bytes::Bytes;
use http::Response;

use super::{
    GuardError, ProbeOutcome, ProbeRequest, UncertainReason, answer, ledger_step::LedgerStep,
};

use crate::{
    decide::probe::AfterProbe,
    execution::{EventKind, ExecutionRecord},
};

/// What a status probe led to.
pub(super) enum Probed {
    /// Applied, recorded as resolved: hand back its result (when kept).
    Applied(ExecutionRecord, Option<Bytes>),
    /// Not applied, recorded as resolved: send again under the same key.
    NotApplied(ExecutionRecord),
    /// The guard's own answer (in progress, held for review).
    Answer(Response<Bytes>),
    /// Another attempt settled or moved the execution meanwhile: decide again.
    Moved,
}

impl Probed {
    /// Asks the tool's own status probe (its contract's) about `record`.
    pub(super) async fn ask_tool(step: LedgerStep<'_>, record: &ExecutionRecord) -> ProbeOutcome {
        match &step.intent.probe {
            Some(probe) => {
                let request = ProbeRequest {
                    execution: record,
                    arguments: step.intent.call.arguments(),
                };
                probe.clone().probe(request).await
            }
            None => ProbeOutcome::Unknown {
                reason: "no status probe".into(),
            },
        }
    }

    /// Records what `outcome` says of `record`'s attempt.
    pub(super) async fn of(
        step: LedgerStep<'_>,
        record: ExecutionRecord,
        outcome: ProbeOutcome,
    ) -> Result<Self, GuardError> {
        tracing::info!(?outcome, "status probe answered");
        let id = record.execution_id;
        let reply_id = &step.intent.call.id;
        match AfterProbe::of(outcome) {
            AfterProbe::HandBack { result } => {
                let stored = match result.as_ref().map(serde_json::to_vec) {
                    Some(Ok(bytes))
                        if step.intent.keep_results
                            && bytes.len() <= step.intent.max_result_bytes =>
                    {
                        let bytes = Bytes::from(bytes);
                        let reference = step
                            .config
                            .ledger
                            .store_result(id, bytes.clone())
                            .await
                            .map_err(GuardError::ledger)?;
                        Some((reference, bytes))
                    }
                    _ => None,
                };
                let resolved = EventKind::Resolved {
                    applied: true,
                    by: "probe".into(),
                    note: "the status probe found the action applied".into(),
                    result_reference: stored.as_ref().map(|(r, _)| r.clone()),
                    attempt: Some(record.attempts),
                    probe: None,
                };
                Ok(match step.append_moved(id, resolved).await? {
                    Some(record) => Probed::Applied(record, stored.map(|(_, result)| result)),
                    None => Probed::Moved,
                })
            }
            AfterProbe::Resend => {
                let resolved = EventKind::Resolved {
                    applied: false,
                    by: "probe".into(),
                    note: "the status probe found the action not applied; sent again under the same key".into(),
                    result_reference: None,
                    attempt: Some(record.attempts),
                    probe: None,
                };
                Ok(match step.append_moved(id, resolved).await? {
                    Some(record) => Probed::NotApplied(record),
                    None => Probed::Moved,
                })
            }
            AfterProbe::InProgress => Ok(Probed::Answer(answer::uncertain(
                reply_id,
                step.intent.era,
                &record,
                UncertainReason::InProgress,
            ))),
            AfterProbe::Review { reason } => {
                let review = EventKind::NeedsReview {
                    reason: format!("status probe: {reason}"),
                };
                Ok(match step.append_moved(id, review).await? {
                    Some(record) => Probed::Answer(answer::uncertain(
                        reply_id,
                        step.intent.era,
                        &record,
                        UncertainReason::NeedsReview,
                    )),
                    None => Probed::Moved,
                })
            }
        }
    }
}
