//! What one write transaction sends: the index rows column by column, and pipelined
//! statements.

use super::*;

/// The index rows of a batch, column by column (for `unnest`).
#[derive(Default)]
pub(super) struct ExecutionRows {
    pub(super) ids: Vec<String>,
    pub(super) actors: Vec<String>,
    pub(super) scopes: Vec<String>,
    pub(super) fingerprints: Vec<String>,
    pub(super) tools: Vec<String>,
    pub(super) states: Vec<String>,
    pub(super) owners: Vec<String>,
    pub(super) accepted_seqs: Vec<i64>,
    pub(super) last_seqs: Vec<i64>,
    pub(super) link_until: Vec<i64>,
    pub(super) retain_until: Vec<i64>,
    pub(super) records: Vec<String>,
    /// The chain of the intent, where a new execution's `accepted` line is.
    pub(super) chains: Vec<i32>,
}

impl ExecutionRows {
    pub(super) fn push(
        &mut self,
        record: &ExecutionRecord,
        accepted_seq: i64,
        last_seq: i64,
    ) -> Result<(), LedgerError> {
        self.records.push(record_to_json(record)?);
        self.ids.push(record.execution_id.to_string());
        self.actors.push(record.actor.to_string());
        self.scopes.push(record.intent_scope.to_string());
        self.fingerprints.push(record.fingerprint.to_string());
        self.tools.push(record.tool.clone());
        self.states.push(record.state_label().to_owned());
        self.owners.push(record.owner.clone());
        self.accepted_seqs.push(accepted_seq);
        self.last_seqs.push(last_seq);
        self.link_until.push(millis(record.link_until));
        self.retain_until.push(millis(record.retain_until));
        self.chains
            .push(i32::from(partition_of_key(&IntentKey::of_record(record))));
        Ok(())
    }

    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 13] {
        [
            &self.ids,
            &self.actors,
            &self.scopes,
            &self.fingerprints,
            &self.tools,
            &self.states,
            &self.owners,
            &self.accepted_seqs,
            &self.last_seqs,
            &self.link_until,
            &self.retain_until,
            &self.records,
            &self.chains,
        ]
    }
}

/// A boxed query future, so that different statements can be pipelined together.
pub(super) type PgFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send + 'a>>;

/// Runs the futures together and returns their outputs in order. Each is first polled in
/// order, which sends its request then: the requests leave on the connection in order, one
/// after the other, without waiting for the answers (pipelining).
pub(super) async fn pipeline(
    mut futures: Vec<PgFuture<'_>>,
) -> Vec<Result<Vec<Row>, tokio_postgres::Error>> {
    let mut outputs: Vec<Option<Result<Vec<Row>, tokio_postgres::Error>>> =
        futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(result) => *output = Some(result),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
