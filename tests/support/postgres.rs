//! Where the PostgreSQL tests find their server.

/// The environment variable that names the test database.
pub const POSTGRES_URL_VAR: &str = "MCP_REPLAY_GUARD_POSTGRES_URL";

/// The database URL; `None` (after saying why) when a test must skip. Under CI (`CI` set) a
/// missing URL fails the test loudly instead.
pub fn postgres_url() -> Option<String> {
    match std::env::var(POSTGRES_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => panic!(
            "{POSTGRES_URL_VAR} is not set under CI: the PostgreSQL tests need a database, e.g. \
             {POSTGRES_URL_VAR}=postgres://postgres@127.0.0.1:5432/mrg_test"
        ),
        _ => {
            eprintln!(
                "skipped: {POSTGRES_URL_VAR} is not set (e.g. {POSTGRES_URL_VAR}=postgres://postgres@127.0.0.1:5432/mrg_dev)"
            );
            None
        }
    }
}

/// A schema of the test's own in the test database.
pub struct TestSchema {
    pub url: String,
    pub name: String,
}

impl TestSchema {
    /// `mrg_t_<test>_<ulid>` in the database of [`postgres_url`]; `None` when the test skips.
    pub fn new(test: &str) -> Option<Self> {
        let url = postgres_url()?;
        let name = format!(
            "mrg_t_{test}_{}",
            mcp_replay_guard::ExecutionId::new()
                .ulid()
                .to_string()
                .to_lowercase()
        );
        Some(Self { url, name })
    }

    /// A ledger of its own (its own pool): one replica.
    pub async fn replica(&self) -> mcp_replay_guard::ledger::PostgresLedger {
        mcp_replay_guard::ledger::PostgresLedger::connect_with_schema(&self.url, &self.name)
            .await
            .unwrap_or_else(|e| panic!("connecting to {POSTGRES_URL_VAR}: {e}"))
    }

    /// A replica whose connections all pass through `relay` (which the test cuts).
    pub async fn replica_through(
        &self,
        relay: &super::PgRelay,
    ) -> mcp_replay_guard::ledger::PostgresLedger {
        mcp_replay_guard::ledger::PostgresLedger::connect_with_schema(
            &relay.url(&self.url),
            &self.name,
        )
        .await
        .unwrap_or_else(|e| panic!("connecting through the relay: {e}"))
    }

    /// Runs SQL in the schema, `{s}` standing for it (the test's hand on the tables, as an
    /// attacker's would be).
    pub async fn sql(
        &self,
        ledger: &mcp_replay_guard::ledger::PostgresLedger,
        statement: &str,
    ) -> u64 {
        let client = ledger.pool().get().await.unwrap();
        let statement = statement.replace("{s}", &format!("\"{}\"", self.name));
        client.execute(statement.as_str(), &[]).await.unwrap()
    }

    /// The one row `statement` returns, as integers.
    pub async fn query_i64s(
        &self,
        ledger: &mcp_replay_guard::ledger::PostgresLedger,
        statement: &str,
    ) -> Vec<i64> {
        let client = ledger.pool().get().await.unwrap();
        let statement = statement.replace("{s}", &format!("\"{}\"", self.name));
        let row = client.query_one(statement.as_str(), &[]).await.unwrap();
        (0..row.len()).map(|i| row.get::<_, i64>(i)).collect()
    }

    /// The stored line `seq`.
    pub async fn line(
        &self,
        ledger: &mcp_replay_guard::ledger::PostgresLedger,
        seq: i64,
    ) -> String {
        let client = ledger.pool().get().await.unwrap();
        let statement = format!(
            "SELECT line FROM \"{}\".mrg_events WHERE seq = $1",
            self.name
        );
        client
            .query_one(statement.as_str(), &[&seq])
            .await
            .unwrap()
            .get(0)
    }

    /// Overwrites the stored line `seq` (and nothing else).
    pub async fn set_line(
        &self,
        ledger: &mcp_replay_guard::ledger::PostgresLedger,
        seq: i64,
        line: &str,
    ) {
        let client = ledger.pool().get().await.unwrap();
        let statement = format!(
            "UPDATE \"{}\".mrg_events SET line = $2 WHERE seq = $1",
            self.name
        );
        let updated = client
            .execute(statement.as_str(), &[&seq, &line])
            .await
            .unwrap();
        assert_eq!(updated, 1);
    }

    /// The stored lines, in `seq` order.
    pub async fn lines(&self, ledger: &mcp_replay_guard::ledger::PostgresLedger) -> Vec<String> {
        let client = ledger.pool().get().await.unwrap();
        let statement = format!("SELECT line FROM \"{}\".mrg_events ORDER BY seq", self.name);
        client
            .query(statement.as_str(), &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    /// Replaces the whole chain with `lines`, columns and all (as an attacker with write
    /// access to the table would).
    pub async fn replace_chain(
        &self,
        ledger: &mcp_replay_guard::ledger::PostgresLedger,
        lines: &[String],
    ) {
        let client = ledger.pool().get().await.unwrap();
        let s = format!("\"{}\"", self.name);
        client
            .execute(format!("DELETE FROM {s}.mrg_events").as_str(), &[])
            .await
            .unwrap();
        for text in lines {
            // The columns from the line as it is (it may not parse as a chain line any more).
            let line: serde_json::Value = serde_json::from_str(text).unwrap();
            let execution_id = line["execution_id"].as_str().map(str::to_owned);
            client
                .execute(
                    format!(
                        "INSERT INTO {s}.mrg_events (seq, prev, hash, execution_id, line) \
                         VALUES ($1, $2, $3, $4, $5)"
                    )
                    .as_str(),
                    &[
                        &line["seq"].as_i64().unwrap(),
                        &line["prev"].as_str().unwrap(),
                        &line["hash"].as_str().unwrap(),
                        &execution_id,
                        text,
                    ],
                )
                .await
                .unwrap();
        }
    }

    /// Drops the schema (only reached when the test passed).
    pub async fn drop(self, ledger: &mcp_replay_guard::ledger::PostgresLedger) {
        self.sql(ledger, "DROP SCHEMA {s} CASCADE").await;
    }
}
