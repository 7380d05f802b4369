//! The tables: migrations (and the partitioning of a ledger made before partitions), the
//! advisory lock keys, schema names, and the statements with the schema in place.

use super::*;

/// The schema used when none is named.
pub(super) const DEFAULT_SCHEMA: &str = "public";

/// The schema version this build writes.
pub(super) const SCHEMA_VERSION: i32 = 2;

/// The migrations, in order; `{s}` is the quoted schema.
pub(super) const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE IF NOT EXISTS {s}.mrg_events (
    seq BIGINT PRIMARY KEY CHECK (seq > 0),
    prev TEXT NOT NULL,
    hash TEXT NOT NULL,
    execution_id TEXT,
    line TEXT NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS mrg_events_execution ON {s}.mrg_events (execution_id, seq);
CREATE TABLE IF NOT EXISTS {s}.mrg_executions (
    execution_id TEXT PRIMARY KEY,
    actor TEXT NOT NULL,
    intent_scope TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    tool TEXT NOT NULL,
    state TEXT NOT NULL,
    owner TEXT NOT NULL,
    accepted_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    link_until_ms BIGINT NOT NULL,
    retain_until_ms BIGINT NOT NULL,
    record JSON NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS mrg_executions_intent
    ON {s}.mrg_executions (actor, intent_scope, fingerprint, accepted_seq DESC);
CREATE INDEX IF NOT EXISTS mrg_executions_retain ON {s}.mrg_executions (retain_until_ms);
CREATE INDEX IF NOT EXISTS mrg_executions_owner ON {s}.mrg_executions (owner);
CREATE TABLE IF NOT EXISTS {s}.mrg_results (
    reference TEXT PRIMARY KEY,
    execution_id TEXT NOT NULL REFERENCES {s}.mrg_executions (execution_id) ON DELETE CASCADE,
    bytes BYTEA NOT NULL,
    stored_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS mrg_results_execution ON {s}.mrg_results (execution_id);
CREATE TABLE IF NOT EXISTS {s}.mrg_owners (
    owner TEXT PRIMARY KEY,
    first_seen TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until TIMESTAMPTZ NOT NULL
);
"#,
    r#"
CREATE TABLE IF NOT EXISTS {s}.mrg_fingerprint_key (
    one_row BOOLEAN PRIMARY KEY DEFAULT true CHECK (one_row),
    key_id TEXT NOT NULL,
    bound_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
"#,
];

/// Partitions the ledger (see [Partitions](PostgresLedger#partitions)), once, in the
/// transaction of the migrations: one `seq` sequence for every chain, starting after the
/// existing lines; the chains' heads, the existing chain becoming chain 0 (its lines stay
/// as they are); and each execution's chain, 0 for the existing ones. The `chain` column has
/// no default, so that a build from before partitions, which writes the single chain under
/// its advisory lock and knows no `chain`, fails its writes (recording nothing) instead of
/// forking chain 0.
const PARTITION: &str = r#"
CREATE SEQUENCE {s}.mrg_events_seq AS BIGINT MINVALUE 1;
SELECT setval('{s}.mrg_events_seq', max(seq)) FROM {s}.mrg_events HAVING count(*) > 0;
CREATE TABLE {s}.mrg_chains (
    chain INT PRIMARY KEY CHECK (chain >= 0),
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL
);
INSERT INTO {s}.mrg_chains (chain, seq, hash)
    SELECT 0, coalesce(max(seq), 0),
        coalesce((SELECT hash FROM {s}.mrg_events ORDER BY seq DESC LIMIT 1),
            'sha256:0000000000000000000000000000000000000000000000000000000000000000')
    FROM {s}.mrg_events;
ALTER TABLE {s}.mrg_executions ADD COLUMN chain INT NOT NULL DEFAULT 0;
ALTER TABLE {s}.mrg_executions ALTER COLUMN chain DROP DEFAULT;
"#;

/// The ledger's statements, with the schema in place.
pub(super) struct Sql {
    /// Locks the head rows of some chains, in `chain` order, and reads them: the locks of a
    /// write transaction.
    pub(super) lock_chains: String,
    /// As `lock_chains`, skipping the rows another transaction holds.
    pub(super) try_lock_chains: String,
    /// Under the lock: the records a batch appends to, the latest execution of each intent
    /// it claims.
    pub(super) read: String,
    /// The next `seq`s, one per line a batch seals.
    pub(super) next_seqs: String,
    /// The sealed lines, the index rows and the chains' new heads, in one statement.
    pub(super) write: String,
    /// The intent of an execution, to find its partition.
    pub(super) intent_of: String,
    pub(super) renew_owners: String,
    pub(super) release_owners: String,
    pub(super) owner_alive: String,
    /// Every `dispatched` execution, and whether its owner's lease is unexpired.
    pub(super) dispatched: String,
    pub(super) get: String,
    pub(super) events: String,
    pub(super) list: String,
    pub(super) store_result: String,
    pub(super) load_result: String,
    pub(super) chain: String,
    pub(super) heads: String,
    /// Locks every chain (in order, as no writer waits for two): a purge waits for the
    /// writes in flight and they for it.
    pub(super) lock_all_chains: String,
    pub(super) purge_executions: String,
    pub(super) purge_owners: String,
    /// Records a key id unless one is recorded (waiting for a binder that is recording one).
    pub(super) bind_key: String,
    /// The key id recorded.
    pub(super) bound_key: String,
}

impl Sql {
    pub(super) fn new(s: &str) -> Self {
        Self {
            lock_chains: format!(
                "SELECT chain, seq, hash FROM {s}.mrg_chains WHERE chain = ANY($1::int4[]) \
                 ORDER BY chain FOR UPDATE"
            ),
            try_lock_chains: format!(
                "SELECT chain, seq, hash FROM {s}.mrg_chains WHERE chain = ANY($1::int4[]) \
                 ORDER BY chain FOR UPDATE SKIP LOCKED"
            ),
            read: format!(
                "SELECT 1, record::text FROM {s}.mrg_executions \
                     WHERE execution_id = ANY($1::text[]) \
                 UNION ALL \
                 SELECT 2, latest.record FROM \
                     unnest($2::text[], $3::text[], $4::text[]) AS k(actor, intent_scope, fingerprint) \
                     CROSS JOIN LATERAL (SELECT e.record::text AS record FROM {s}.mrg_executions e \
                         WHERE e.actor = k.actor AND e.intent_scope = k.intent_scope \
                           AND e.fingerprint = k.fingerprint \
                         ORDER BY e.accepted_seq DESC LIMIT 1) AS latest"
            ),
            next_seqs: format!(
                "SELECT nextval('{s}.mrg_events_seq') FROM generate_series(1, $1::int8)"
            ),
            write: format!(
                "WITH events AS (INSERT INTO {s}.mrg_events (seq, prev, hash, execution_id, line) \
                     SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[], $5::text[])), \
                 heads AS (UPDATE {s}.mrg_chains c SET seq = h.seq, hash = h.hash \
                     FROM unnest($19::int4[], $20::int8[], $21::text[]) AS h(chain, seq, hash) \
                     WHERE c.chain = h.chain) \
                 INSERT INTO {s}.mrg_executions (execution_id, actor, intent_scope, fingerprint, \
                     tool, state, owner, accepted_seq, last_seq, link_until_ms, retain_until_ms, record, \
                     chain) \
                 SELECT u.execution_id, u.actor, u.intent_scope, u.fingerprint, u.tool, u.state, \
                     u.owner, u.accepted_seq, u.last_seq, u.link_until_ms, u.retain_until_ms, \
                     u.record::json, u.chain \
                 FROM unnest($6::text[], $7::text[], $8::text[], $9::text[], $10::text[], \
                     $11::text[], $12::text[], $13::int8[], $14::int8[], $15::int8[], $16::int8[], \
                     $17::text[], $18::int4[]) AS u(execution_id, actor, intent_scope, fingerprint, \
                     tool, state, owner, accepted_seq, last_seq, link_until_ms, retain_until_ms, \
                     record, chain) \
                 ON CONFLICT (execution_id) DO UPDATE SET state = EXCLUDED.state, \
                     owner = EXCLUDED.owner, last_seq = EXCLUDED.last_seq, \
                     retain_until_ms = EXCLUDED.retain_until_ms, \
                     record = EXCLUDED.record, updated_at = now()"
            ),
            renew_owners: format!(
                "INSERT INTO {s}.mrg_owners (owner, lease_until) \
                 SELECT o, now() + make_interval(secs => $2::float8) FROM unnest($1::text[]) AS o \
                 ON CONFLICT (owner) DO UPDATE SET lease_until = EXCLUDED.lease_until, \
                     heartbeat_at = now()"
            ),
            release_owners: format!(
                "UPDATE {s}.mrg_owners SET lease_until = now() WHERE owner = ANY($1::text[])"
            ),
            dispatched: format!(
                "SELECT e.record::text, coalesce(o.lease_until > now(), false) \
                 FROM {s}.mrg_executions e LEFT JOIN {s}.mrg_owners o ON o.owner = e.owner \
                 WHERE e.state = 'dispatched'"
            ),
            owner_alive: format!(
                "SELECT lease_until > now() FROM {s}.mrg_owners WHERE owner = $1::text"
            ),
            intent_of: format!(
                "SELECT actor, intent_scope, fingerprint FROM {s}.mrg_executions \
                 WHERE execution_id = $1::text"
            ),
            get: format!(
                "SELECT record::text FROM {s}.mrg_executions WHERE execution_id = $1::text"
            ),
            events: format!(
                "SELECT seq, line FROM {s}.mrg_events WHERE execution_id = $1::text ORDER BY seq"
            ),
            list: format!("SELECT record::text FROM {s}.mrg_executions ORDER BY execution_id"),
            store_result: format!(
                "INSERT INTO {s}.mrg_results (reference, execution_id, bytes) \
                 SELECT $1::text, $2::text, $3::bytea \
                 WHERE EXISTS (SELECT 1 FROM {s}.mrg_executions WHERE execution_id = $2::text) \
                 ON CONFLICT (reference) DO UPDATE SET bytes = EXCLUDED.bytes, stored_at = now()"
            ),
            load_result: format!("SELECT bytes FROM {s}.mrg_results WHERE reference = $1::text"),
            chain: format!(
                "SELECT seq, prev, hash, execution_id, line FROM {s}.mrg_events ORDER BY seq"
            ),
            heads: format!("SELECT chain, seq, hash FROM {s}.mrg_chains ORDER BY chain"),
            lock_all_chains: format!("SELECT chain FROM {s}.mrg_chains ORDER BY chain FOR UPDATE"),
            // `execution::is_retained` in SQL: past its `retain_until`, an unsettled execution
            // stays while its owner may live (dispatched always; accepted, authorized, unknown
            // or needs review while the lease of its owner, or of the owner of an earlier
            // attempt still in doubt, lives).
            purge_executions: format!(
                "DELETE FROM {s}.mrg_executions e WHERE e.retain_until_ms < $1::int8 \
                 AND e.state <> 'dispatched' \
                 AND NOT (e.state IN ('accepted', 'authorized', 'unknown', 'needs_review') AND EXISTS \
                 (SELECT 1 FROM {s}.mrg_owners o WHERE o.lease_until > now() AND (o.owner = e.owner \
                     OR o.owner IN (SELECT json_array_elements_text(e.record->'earlier_owners')))))"
            ),
            bind_key: format!(
                "INSERT INTO {s}.mrg_fingerprint_key (key_id) VALUES ($1::text) \
                 ON CONFLICT (one_row) DO NOTHING"
            ),
            bound_key: format!("SELECT key_id FROM {s}.mrg_fingerprint_key"),
            purge_owners: format!(
                "DELETE FROM {s}.mrg_owners o WHERE o.lease_until < now() \
                 AND NOT EXISTS (SELECT 1 FROM {s}.mrg_executions e WHERE e.owner = o.owner)"
            ),
        }
    }
}

/// Creates or migrates the tables, under an advisory lock so concurrent connects wait for
/// each other instead of racing `CREATE`.
pub(super) async fn migrate(pool: &Pool, schema: &str, quoted: &str) -> Result<(), LedgerError> {
    let failed = |e: tokio_postgres::Error| {
        LedgerError::caused(
            format!(
                "{}; the role needs CREATE on the database (or on schema {schema}) the first time",
                describe("creating the ledger's tables", &e)
            ),
            e,
        )
    };
    let mut client = pool.get().await.map_err(|e| {
        LedgerError::caused(
            format!(
                "could not connect to PostgreSQL ({e}); check the URL, that the server is \
             reachable, and that the role may log in"
            ),
            e,
        )
    })?;
    let tx = client.transaction().await.map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(failed)?;
    let exists = tx
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
        .await
        .map_err(failed)?
        .is_some();
    if !exists {
        tx.batch_execute(&format!("CREATE SCHEMA {quoted}"))
            .await
            .map_err(failed)?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {quoted}.mrg_schema_version (\
             version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    ))
    .await
    .map_err(failed)?;
    let current: i32 = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {quoted}.mrg_schema_version"),
            &[],
        )
        .await
        .map_err(failed)?
        .get(0);
    if current > SCHEMA_VERSION {
        return Err(LedgerError::storage(format!(
            "the ledger's tables in schema {schema} are at version {current}, newer than this \
             build knows ({SCHEMA_VERSION}): upgrade mcp-replay-guard on this replica"
        )));
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = index as i32 + 1;
        tx.batch_execute(&migration.replace("{s}", quoted))
            .await
            .map_err(failed)?;
        tx.execute(
            &format!("INSERT INTO {quoted}.mrg_schema_version (version) VALUES ($1)"),
            &[&version],
        )
        .await
        .map_err(failed)?;
    }
    let partitioned = tx
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&format!("{quoted}.mrg_chains")],
        )
        .await
        .map_err(failed)?
        .get::<_, bool>(0);
    if !partitioned {
        // A build from before partitions may be writing the single chain: wait for it.
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&single_chain_lock_key(schema)],
        )
        .await
        .map_err(failed)?;
        tx.batch_execute(&PARTITION.replace("{s}", quoted))
            .await
            .map_err(failed)?;
    }
    let (chains, geneses): (Vec<i32>, Vec<String>) = (1..PostgresLedger::PARTITIONS)
        .map(|chain| (i32::from(chain), genesis(chain).to_string()))
        .unzip();
    tx.execute(
        &format!(
            "INSERT INTO {quoted}.mrg_chains (chain, seq, hash) \
             SELECT c, 0, g FROM unnest($1::int4[], $2::text[]) AS t(c, g) \
             ON CONFLICT (chain) DO NOTHING"
        ),
        &[&chains, &geneses],
    )
    .await
    .map_err(failed)?;
    let most: i32 = tx
        .query_one(
            &format!("SELECT coalesce(max(chain) + 1, 0) FROM {quoted}.mrg_chains"),
            &[],
        )
        .await
        .map_err(failed)?
        .get(0);
    if most != i32::from(PostgresLedger::PARTITIONS) {
        // Another partition count puts intents in other partitions: two builds would take
        // different locks for one intent.
        return Err(LedgerError::storage(format!(
            "the ledger in schema {schema} has {most} partitions, this build uses \
             {}: run one build on every replica",
            PostgresLedger::PARTITIONS
        )));
    }
    tx.commit().await.map_err(failed)
}

/// The advisory lock key of migrations (any schema, one database).
pub(super) const MIGRATION_LOCK: i64 = 0x6d72_675f_6d69_6772; // "mrg_migr"

/// The advisory lock key of a schema's single chain, which builds from before partitions
/// wrote under.
pub(super) fn single_chain_lock_key(schema: &str) -> i64 {
    // FNV-1a, so that every build computes the same key for the same schema.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in b"mcp-replay-guard:chain:".iter().chain(schema.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

pub(super) fn check_schema_name(schema: &str) -> Result<(), LedgerError> {
    let mut chars = schema.chars();
    let valid = schema.len() <= 63
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(LedgerError::storage(format!(
            "{schema:?} is not a schema name the ledger uses: lower-case ASCII letters, digits \
             and `_`, not starting with a digit, at most 63 bytes"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_checked_and_chain_locks_differ_by_schema() {
        assert!(check_schema_name("public").is_ok());
        assert!(check_schema_name("mrg_t_01j4").is_ok());
        for bad in [
            "",
            "Public",
            "1x",
            "a-b",
            "x\"; DROP TABLE y; --",
            &"a".repeat(64),
        ] {
            assert!(check_schema_name(bad).is_err(), "{bad}");
        }
        assert_ne!(single_chain_lock_key("a"), single_chain_lock_key("b"));
        // The key builds from before partitions take: it must not change.
        assert_eq!(
            single_chain_lock_key("public"),
            single_chain_lock_key("public")
        );
    }
}
