//! The `record` column: every field of an execution record, as JSON.

use super::*;

/// Every field of a record, as the `record` column keeps it (the JSON form that
/// [`ExecutionRecord`]'s `Serialize` writes is for people, and leaves some fields out).
#[derive(Serialize, Deserialize)]
#[serde(remote = "ExecutionRecord")]
pub(super) struct StoredRecord {
    pub(super) execution_id: ExecutionId,
    pub(super) fingerprint: Fingerprint,
    pub(super) tool: String,
    pub(super) actor: Actor,
    pub(super) intent_scope: IntentScope,
    pub(super) target: Target,
    pub(super) credential_ref: Option<CredentialRef>,
    pub(super) retry_class: RetryClass,
    pub(super) state: ExecutionState,
    pub(super) correlation: Correlation,
    pub(super) idempotency_key: Option<IdempotencyKey>,
    // Added with the server-side Idempotency-Key layer: rows written before it have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) request_fingerprint: Option<Fingerprint>,
    pub(super) accepted_at: Timestamp,
    pub(super) authorized_at: Option<Timestamp>,
    pub(super) dispatched_at: Option<Timestamp>,
    pub(super) completed_at: Option<Timestamp>,
    pub(super) delivered_at: Option<Timestamp>,
    pub(super) target_status: Option<u16>,
    pub(super) is_error: bool,
    pub(super) result_reference: Option<String>,
    pub(super) attempts: u32,
    pub(super) reason: Option<String>,
    pub(super) link_until: Timestamp,
    pub(super) retain_until: Timestamp,
    // Added when retention began to count from the last event: rows written before it have
    // none, and keep their `retain_until`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) retention_ms: u64,
    pub(super) owner: String,
    // Added when the simulator found a re-send over an unknown outcome read as `not_sent`:
    // rows written before it have none.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) earlier_attempt_unknown: bool,
    // Added when the simulator found a hold end with its last dispatcher while an earlier
    // one lived: rows written before it have none. The purge reads it from the column.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) earlier_owners: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub(super) fn record_to_json(record: &ExecutionRecord) -> Result<String, LedgerError> {
    let mut text = Vec::new();
    StoredRecord::serialize(record, &mut serde_json::Serializer::new(&mut text)).map_err(|e| {
        LedgerError::caused(
            format!("a record could not be written as JSON ({e}); this is a bug: please report it"),
            e,
        )
    })?;
    String::from_utf8(text).map_err(|e| {
        LedgerError::caused(
            format!("a record's JSON is not UTF-8 ({e}); this is a bug: please report it"),
            e,
        )
    })
}

pub(super) fn record_from_json(text: &str) -> Result<ExecutionRecord, LedgerError> {
    StoredRecord::deserialize(&mut serde_json::Deserializer::from_str(text)).map_err(|e| {
        LedgerError::caused(
            format!(
                "a stored record cannot be read ({e}); run `PostgresLedger::verify` and inspect \
             the record column of mrg_executions"
            ),
            e,
        )
    })
}
