//! Which ledger a command works on: a file, or a database of PostgreSQL shared by every process
//! that names it. Parsed once from `--ledger` (or the positional form kept for scripts), shown
//! without a password, opened one way, with the fingerprint key it must be used with.
//!
//! # The key of a PostgreSQL ledger
//!
//! A file ledger keeps its fingerprint key beside it. A PostgreSQL ledger cannot: every process
//! that writes it is given the key (`--key-file PATH` or `REPLAY_GUARD_FINGERPRINT_KEY`, the
//! file ledger's key file form, 64 hex digits), and the ledger, bound to the first key given,
//! refuses any other. No key is ever made up for a shared ledger: a key of one process's own
//! would recognise none of the intents the others recorded. `--key-file` is refused with a
//! file ledger (its key is the file beside it) and without a ledger; the variable is read only
//! for a PostgreSQL ledger.

use std::{
    ffi::OsStr,
    fmt,
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, bail};
use clap::{Args, builder::TypedValueParser, error::ErrorKind};
use mcp_replay_guard::{
    fingerprint::FingerprintKey,
    ledger::{FileLedger, Ledger, PostgresLedger},
    tools::redact_url,
};

/// The variable that holds a PostgreSQL ledger's fingerprint key (64 hex digits).
pub const KEY_VARIABLE: &str = "REPLAY_GUARD_FINGERPRINT_KEY";

/// The longest key file read: a key is at most 256 hex digits.
const MAX_KEY_FILE_BYTES: u64 = 4096;

/// A ledger: a file, or PostgreSQL (`postgres://…` or `postgresql://…`).
#[derive(Clone)]
pub enum LedgerLocation {
    /// A ledger file.
    File(PathBuf),
    /// A PostgreSQL ledger.
    Postgres(PostgresLocation),
}

/// A PostgreSQL ledger: the connection URL and the schema its tables are in.
#[derive(Clone)]
pub struct PostgresLocation {
    /// The URL without `schema=`; it may carry a password, so it is never shown.
    url: String,
    /// `schema=NAME` of the URL's query, when given (`public` otherwise).
    schema: Option<String>,
}

impl LedgerLocation {
    /// `text` as a ledger: PostgreSQL when it starts with `postgres://` or `postgresql://`, a
    /// file otherwise. The error never repeats the text (it may carry a password).
    fn parse(text: &OsStr) -> Result<Self, String> {
        let Some(url) = text.to_str().filter(|t| is_postgres_url(t)) else {
            if text.is_empty() {
                return Err("give a ledger file or a postgres://… URL".to_owned());
            }
            return Ok(Self::File(PathBuf::from(text)));
        };
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut schema = None;
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            match pair.strip_prefix("schema=") {
                Some(_) if schema.is_some() => {
                    return Err("the URL names `schema=` twice: give it once".to_owned());
                }
                Some("") => return Err("the URL's `schema=` is empty".to_owned()),
                Some(name) => schema = Some(name.to_owned()),
                None => rest.push(pair),
            }
        }
        let url = match rest.as_slice() {
            [] => base.to_owned(),
            _ => format!("{base}?{}", rest.join("&")),
        };
        Ok(Self::Postgres(PostgresLocation { url, schema }))
    }

    /// The path of a ledger file.
    pub fn file(&self) -> Option<&Path> {
        match self {
            Self::File(path) => Some(path),
            Self::Postgres(_) => None,
        }
    }

    /// Fails unless the ledger is there to read: a file that exists. A PostgreSQL ledger is
    /// found when it is connected to.
    pub fn must_exist(&self) -> anyhow::Result<()> {
        if let Self::File(path) = self
            && !path.exists()
        {
            bail!(
                "no ledger at {}: give the path of a ledger file written by the guard",
                path.display()
            );
        }
        Ok(())
    }

    /// Opens the ledger: a file read-only (nothing written, no lock taken) or for writing
    /// (waiting at most `lock_timeout` for another process's lock), or a connection to
    /// PostgreSQL (which creates or migrates the tables and marks an execution left
    /// `dispatched` by a replica that is gone `unknown`, as every replica does on connect).
    pub async fn open(&self, access: Access) -> anyhow::Result<OpenLedger> {
        // The library's errors never carry the URL's password.
        Ok(match (self, access) {
            (Self::File(path), Access::Read) => OpenLedger::File(FileLedger::open_read_only(path)?),
            (Self::File(path), Access::Write { lock_timeout }) => {
                OpenLedger::File(FileLedger::open_with_lock_timeout(path, lock_timeout)?)
            }
            (Self::Postgres(postgres), _) => OpenLedger::Postgres(match &postgres.schema {
                Some(schema) => PostgresLedger::connect_with_schema(&postgres.url, schema).await?,
                None => PostgresLedger::connect(&postgres.url).await?,
            }),
        })
    }

    /// Opens the ledger for a guard, with the fingerprint key it uses: a file's own (kept
    /// beside it), or the key given for PostgreSQL, which the ledger is bound to (refused when
    /// it is bound to another). Without a key for PostgreSQL nothing is opened.
    pub async fn open_for_guard(
        &self,
        lock_timeout: Duration,
        given: &KeyOptions,
    ) -> anyhow::Result<(OpenLedger, FingerprintKey)> {
        match self {
            Self::File(path) => {
                given.refuse_file_ledger()?;
                let ledger = FileLedger::open_with_lock_timeout(path, lock_timeout)?;
                let key = ledger.fingerprint_key()?;
                Ok((OpenLedger::File(ledger), key))
            }
            Self::Postgres(_) => {
                let Some((key, source)) = given.postgres_key()? else {
                    bail!(
                        "a PostgreSQL ledger needs the fingerprint key every process that \
                         shares it uses: give --key-file PATH or {KEY_VARIABLE} (64 hex \
                         digits); a key made up here would recognise none of the ledger's \
                         intents, so none is"
                    );
                };
                let opened = self.open(Access::Write { lock_timeout }).await?;
                opened.bind(&key, &source).await?;
                Ok((opened, key))
            }
        }
    }

    /// Opens the ledger to settle an execution (`resolve`), which needs no key: a key given
    /// for PostgreSQL is checked as a guard's is (the ledger is bound to it).
    pub async fn open_to_settle(
        &self,
        lock_timeout: Duration,
        given: &KeyOptions,
    ) -> anyhow::Result<OpenLedger> {
        let key = match self {
            Self::File(_) => {
                given.refuse_file_ledger()?;
                None
            }
            Self::Postgres(_) => given.postgres_key()?,
        };
        let opened = self.open(Access::Write { lock_timeout }).await?;
        if let Some((key, source)) = key {
            opened.bind(&key, &source).await?;
        }
        Ok(opened)
    }
}

impl fmt::Display for LedgerLocation {
    /// A file's path; a URL without its user, password and query.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "{}", path.display()),
            Self::Postgres(postgres) => {
                write!(f, "{}", redact_url(&postgres.url))?;
                match &postgres.schema {
                    Some(schema) => write!(f, " (schema {schema})"),
                    None => Ok(()),
                }
            }
        }
    }
}

impl fmt::Debug for LedgerLocation {
    // Never the URL as given: it may carry a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LedgerLocation({self})")
    }
}

fn is_postgres_url(text: &str) -> bool {
    ["postgres://", "postgresql://"].iter().any(|scheme| {
        text.get(..scheme.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(scheme))
    })
}

/// Parses `--ledger` (and the positional ledger) for clap, with an error that never repeats
/// the value: clap's own would print it, password and all.
#[derive(Debug, Clone, Copy)]
pub struct LedgerParser;

impl TypedValueParser for LedgerParser {
    type Value = LedgerLocation;

    fn parse_ref(
        &self,
        command: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<LedgerLocation, clap::Error> {
        LedgerLocation::parse(value).map_err(|message| {
            let arg = arg.map_or_else(|| "LEDGER".to_owned(), ToString::to_string);
            clap::Error::raw(
                ErrorKind::ValueValidation,
                format!("invalid value for '{arg}': {message}\n"),
            )
            .with_cmd(command)
        })
    }
}

/// `ledger` as the command line gives it: a value of its own, or the first of `operands` (the
/// positional form), and the operands that follow it.
pub fn ledger_and_operands(
    ledger: Option<LedgerLocation>,
    mut operands: Vec<std::ffi::OsString>,
) -> anyhow::Result<(LedgerLocation, Vec<std::ffi::OsString>)> {
    match ledger {
        Some(ledger) => Ok((ledger, operands)),
        None if operands.is_empty() => {
            bail!("give the ledger: --ledger PATH (or postgres://…), or the PATH first")
        }
        None => {
            let first = operands.remove(0);
            let ledger = LedgerLocation::parse(&first).map_err(|e| anyhow::anyhow!("{e}"))?;
            Ok((ledger, operands))
        }
    }
}

/// How a ledger is opened.
#[derive(Debug, Clone, Copy)]
pub enum Access {
    /// To read only.
    Read,
    /// To write, waiting at most this long for another process's lock on a file.
    Write {
        /// The wait.
        lock_timeout: Duration,
    },
}

/// An open ledger.
#[derive(Debug, Clone)]
pub enum OpenLedger {
    /// A ledger file.
    File(FileLedger),
    /// A PostgreSQL ledger.
    Postgres(PostgresLedger),
}

impl OpenLedger {
    /// The ledger, to read or to hand to a guard.
    pub fn ledger(&self) -> Arc<dyn Ledger> {
        match self {
            Self::File(ledger) => Arc::new(ledger.clone()),
            Self::Postgres(ledger) => Arc::new(ledger.clone()),
        }
    }

    /// Binds a PostgreSQL ledger to `key`, from `source` (a file ledger keeps its own).
    async fn bind(&self, key: &FingerprintKey, source: &str) -> anyhow::Result<()> {
        if let Self::Postgres(ledger) = self {
            ledger
                .bind_fingerprint_key(key)
                .await
                .with_context(|| format!("the fingerprint key of {source}"))?;
        }
        Ok(())
    }
}

/// The fingerprint key of a PostgreSQL ledger, on the command line.
#[derive(Debug, Clone, Args)]
pub struct KeyOptions {
    /// The fingerprint key of a PostgreSQL ledger: a file holding it as 64 hex digits (the
    /// form of a file ledger's key file), the same for every process that shares the ledger.
    /// Without it, the variable REPLAY_GUARD_FINGERPRINT_KEY (64 hex digits). The ledger is
    /// bound to the first key given and refuses any other. Refused with a file ledger, which
    /// keeps its own key beside it.
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<PathBuf>,
}

impl KeyOptions {
    /// For a ledger that is not PostgreSQL (a file, or none): `--key-file` is refused.
    pub fn refuse_file_ledger(&self) -> anyhow::Result<()> {
        match &self.key_file {
            Some(_) => bail!(
                "--key-file is for a PostgreSQL ledger (--ledger postgres://…): a file ledger \
                 keeps its own key beside it (LEDGER.key), and a ledger in memory makes one"
            ),
            None => Ok(()),
        }
    }

    /// The key given for a PostgreSQL ledger and where it came from (never its value):
    /// `--key-file`, else the variable.
    fn postgres_key(&self) -> anyhow::Result<Option<(FingerprintKey, String)>> {
        if let Some(path) = &self.key_file {
            let source = format!("--key-file {}", path.display());
            return Ok(Some((read_key_file(path).context(source.clone())?, source)));
        }
        match std::env::var(KEY_VARIABLE) {
            Ok(text) => {
                let key = FingerprintKey::from_hex(&text).with_context(|| {
                    format!("{KEY_VARIABLE} is not a fingerprint key (its value is not shown)")
                })?;
                Ok(Some((key, KEY_VARIABLE.to_owned())))
            }
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                bail!("{KEY_VARIABLE} is not text: give the key as 64 hex digits")
            }
        }
    }
}

/// The key in a key file, read as the file ledger reads its own (errors never show its
/// content).
fn read_key_file(path: &Path) -> anyhow::Result<FingerprintKey> {
    let file = std::fs::File::open(path).context("cannot open it")?;
    let mut text = String::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .context("cannot read it as text")?;
    if text.len() as u64 > MAX_KEY_FILE_BYTES {
        bail!("longer than a key file ({MAX_KEY_FILE_BYTES} bytes at most)");
    }
    Ok(FingerprintKey::from_hex(&text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<LedgerLocation, String> {
        LedgerLocation::parse(OsStr::new(text))
    }

    #[test]
    fn a_url_is_postgres_anything_else_a_file_and_neither_shows_a_password() {
        assert!(matches!(parse("ledger.jsonl"), Ok(LedgerLocation::File(_))));
        assert!(matches!(
            parse("./postgres:/x"),
            Ok(LedgerLocation::File(_))
        ));
        assert!(parse("").is_err());
        for url in [
            "postgres://u:s3cret@db:5432/guard",
            "PostgreSQL://u:s3cret@db/guard?schema=replicas&sslmode=disable",
        ] {
            let location = parse(url).unwrap();
            let LedgerLocation::Postgres(postgres) = &location else {
                panic!("{url} is PostgreSQL");
            };
            assert!(!postgres.url.contains("schema="), "{}", postgres.url);
            for shown in [location.to_string(), format!("{location:?}")] {
                assert!(!shown.contains("s3cret"), "{shown}");
                assert!(shown.contains("@db"), "{shown}");
            }
        }
        let location = parse("postgres://u@db/guard?sslmode=disable&schema=replicas").unwrap();
        let LedgerLocation::Postgres(postgres) = &location else {
            panic!("PostgreSQL");
        };
        assert_eq!(postgres.url, "postgres://u@db/guard?sslmode=disable");
        assert_eq!(postgres.schema.as_deref(), Some("replicas"));
        assert!(
            location.to_string().ends_with("(schema replicas)"),
            "{location}"
        );
        for bad in [
            "postgres://u:s3cret@db/x?schema=a&schema=b",
            "postgres://u:s3cret@db/x?schema=",
        ] {
            let message = parse(bad).unwrap_err();
            assert!(!message.contains("s3cret"), "{message}");
        }
    }

    #[test]
    fn the_first_operand_is_the_ledger_unless_ledger_is_given() {
        let operands = |list: &[&str]| list.iter().map(Into::into).collect::<Vec<_>>();
        let (ledger, rest) = ledger_and_operands(None, operands(&["l.jsonl", "act_x"])).unwrap();
        assert_eq!(ledger.file(), Some(Path::new("l.jsonl")));
        assert_eq!(rest, operands(&["act_x"]));
        let given = parse("g.jsonl").unwrap();
        let (ledger, rest) = ledger_and_operands(Some(given), operands(&["act_x"])).unwrap();
        assert_eq!(ledger.file(), Some(Path::new("g.jsonl")));
        assert_eq!(rest, operands(&["act_x"]));
        assert!(ledger_and_operands(None, Vec::new()).is_err());
    }

    #[test]
    fn a_key_file_holds_hex_and_errors_never_show_it() {
        let dir = std::env::temp_dir().join(format!("mrg-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.key");
        std::fs::write(&good, format!("{}\n", "ab".repeat(32))).unwrap();
        assert_eq!(read_key_file(&good).unwrap().expose_bytes(), [0xab; 32]);
        let bad = dir.join("bad.key");
        std::fs::write(&bad, "s3cret-not-hex").unwrap();
        let message = format!("{:#}", read_key_file(&bad).unwrap_err());
        assert!(!message.contains("s3cret"), "{message}");
        assert!(read_key_file(&dir.join("missing.key")).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
