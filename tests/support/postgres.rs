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
