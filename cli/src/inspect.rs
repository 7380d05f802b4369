//! The commands that read and settle a ledger: `audit verify`, `audit head`, `audit show`,
//! `ledger list` and `resolve`. Each names its ledger with `--ledger` (a file, or PostgreSQL
//! for all but `audit head`), or first among its operands, the form scripts used before
//! `--ledger`.

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use mcp_replay_guard::{
    ExecutionId,
    execution::ExecutionState,
    guard::resolve_after_probe,
    ledger::{Ledger, audit, chain::ChainHead, verify_file, verify_file_anchored},
};

use crate::{
    LOCK_TIMEOUT,
    ledger_location::{
        Access, KeyOptions, LedgerLocation, LedgerParser, OpenLedger, ledger_and_operands,
    },
    queue::Filter,
};

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Verify the hash chain of a ledger: a file, through the archives its compactions left
    /// (`<ledger>.<seq>.archive`), and optionally that it still holds an anchored head; or every
    /// chain of a PostgreSQL ledger.
    ///
    /// Without an anchor the chain cannot show a tail that was cut, or a file rewritten and
    /// re-sealed as a whole: keep the head (`audit head`, or the `ledger head` lines the guard
    /// logs at info level) somewhere else and check it with `--expect-head`.
    Verify {
        #[command(flatten)]
        ledger: LedgerArg,
        /// A head recorded earlier (`SEQ:sha256:HEX`, as `audit head` prints it): line SEQ must
        /// still have that hash, and the chain must verify through it (a ledger file only).
        #[arg(long, value_name = "SEQ:HASH")]
        expect_head: Option<ChainHead>,
    },
    /// Print the head of a ledger file that verifies (`SEQ:sha256:HEX`), to keep as an anchor.
    Head {
        #[command(flatten)]
        ledger: LedgerFile,
    },
    /// The investigation timeline of one execution, or of every execution.
    Show(ShowArgs),
}

/// The ledger a command reads: `--ledger`, or the positional LEDGER.
#[derive(Debug, Args)]
pub(crate) struct LedgerArg {
    /// The ledger (the same as --ledger).
    #[arg(required_unless_present = "ledger", value_name = "LEDGER", value_parser = LedgerParser)]
    path: Option<LedgerLocation>,
    /// The ledger: a file, or postgres://user@host/db (`?schema=NAME` for another schema than
    /// `public`).
    #[arg(long = "ledger", value_name = "LEDGER", value_parser = LedgerParser, conflicts_with = "path")]
    ledger: Option<LedgerLocation>,
}

impl LedgerArg {
    /// The ledger, which must exist.
    pub(crate) fn location(self) -> anyhow::Result<LedgerLocation> {
        let location = self
            .ledger
            .or(self.path)
            .context("give the ledger (LEDGER or --ledger LEDGER)")?;
        location.must_exist()?;
        Ok(location)
    }
}

/// The ledger file a command that works on files only reads: `--ledger`, or the positional
/// LEDGER. A PostgreSQL ledger is refused with what to use instead.
#[derive(Debug, Args)]
pub(crate) struct LedgerFile {
    #[command(flatten)]
    ledger: LedgerArg,
}

impl LedgerFile {
    /// The path of the ledger file, which must exist.
    pub(crate) fn path(self) -> anyhow::Result<PathBuf> {
        match self.ledger.location()? {
            LedgerLocation::File(path) => Ok(path),
            postgres @ LedgerLocation::Postgres(_) => bail!(
                "{postgres} is a PostgreSQL ledger, and this command works on a ledger file: a \
                 PostgreSQL ledger has a chain per partition, each logging its head on connect \
                 (`ledger=postgres:<schema>/<chain>`), checked by `audit verify --ledger \
                 postgres://…`, and it purges expired executions itself"
            ),
        }
    }
}

/// `audit show`.
#[derive(Debug, Args)]
#[command(
    override_usage = "replay-guard audit show [OPTIONS] [--ledger LEDGER | LEDGER] [EXECUTION]"
)]
pub(crate) struct ShowArgs {
    /// The ledger: a file, or postgres://user@host/db (`?schema=NAME` for another schema than
    /// `public`).
    #[arg(long = "ledger", value_name = "LEDGER", value_parser = LedgerParser)]
    ledger: Option<LedgerLocation>,
    /// The ledger (unless --ledger names it), then the execution (`act_…`; every execution
    /// without it).
    #[arg(value_names = ["LEDGER", "EXECUTION"], num_args = 0..=2)]
    operands: Vec<OsString>,
}

/// `ledger list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    ledger: LedgerArg,
    #[command(flatten)]
    filter: Filter,
    /// Keep reading the ledger and print each execution that comes to be shown (with
    /// `--held`: each one that becomes held), until interrupted.
    #[arg(long)]
    watch: bool,
}

/// `resolve`.
#[derive(Debug, Args)]
#[command(
    override_usage = "replay-guard resolve [OPTIONS] [--ledger LEDGER | LEDGER] EXECUTION [--probe [--policy FILE | --url URL | --ssh-host H --ssh-user U --ssh-key PATH]] [(--applied | --not-applied) --note <NOTE>]"
)]
pub(crate) struct ResolveArgs {
    /// The ledger: a file, or postgres://user@host/db (`?schema=NAME` for another schema than
    /// `public`). PostgreSQL settles the execution for every process that shares the database.
    #[arg(long = "ledger", value_name = "LEDGER", value_parser = LedgerParser)]
    ledger: Option<LedgerLocation>,
    #[command(flatten)]
    key: KeyOptions,
    /// The ledger (unless --ledger names it), then the execution (`act_…`).
    #[arg(value_names = ["LEDGER", "EXECUTION"], num_args = 1..=2, required = true)]
    operands: Vec<OsString>,
    /// The action took effect.
    #[arg(
        long,
        conflicts_with = "not_applied",
        required_unless_present_any = ["not_applied", "probe"],
        requires = "note"
    )]
    applied: bool,
    /// The action did not take effect (a repeat of the intent may run it).
    #[arg(long, requires = "note")]
    not_applied: bool,
    /// First ask whether it took effect, and show the answer: `tasks/get` when the execution
    /// became an MCP task, the marker on the host when its target is an SSH host key, else the
    /// status command the policy names for the tool (`status_command`). Alone, nothing is
    /// settled; with --applied or --not-applied, the answer is kept in the resolving event
    /// with the note and the operator.
    #[arg(long)]
    probe: bool,
    #[command(flatten)]
    probe_with: crate::probe::ProbeArgs,
    /// What the operator checked.
    #[arg(long)]
    note: Option<String>,
    /// Who resolves it (default: the user this command runs as).
    #[arg(long)]
    operator: Option<String>,
}

/// The execution among `operands`: exactly one when `required`, at most one otherwise.
fn execution(operands: &[OsString], required: bool) -> anyhow::Result<Option<ExecutionId>> {
    match operands {
        [] if required => bail!("give the execution (`act_…`) after the ledger"),
        [] => Ok(None),
        [id] => {
            let id = id
                .to_str()
                .context("the execution is not text: give its id, `act_…`")?;
            let id = id.parse().map_err(|e| {
                anyhow::anyhow!(
                    "{:?} is not an execution id ({e}): give the `act_…` that `replay-guard \
                     ledger list` shows",
                    audit::printable(id)
                )
            })?;
            Ok(Some(id))
        }
        _ => bail!(
            "too many operands: give the ledger once (LEDGER or --ledger), then the execution"
        ),
    }
}

/// The ledger at `location`, read only, with what failed when it cannot be opened.
async fn read(location: &LedgerLocation) -> anyhow::Result<OpenLedger> {
    location
        .open(Access::Read)
        .await
        .with_context(|| format!("cannot open the ledger {location}"))
}

pub(crate) async fn verify(
    ledger: LedgerArg,
    expect_head: Option<ChainHead>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let location = ledger.location()?;
    let verifying = || format!("verifying {location}");
    let report = match &location {
        LedgerLocation::File(path) => {
            verify_file_anchored(path, expect_head).with_context(verifying)?
        }
        LedgerLocation::Postgres(_) if expect_head.is_some() => bail!(
            "--expect-head checks the head of a ledger file; a PostgreSQL ledger has a chain per \
             partition, each logging its own head (`ledger=postgres:<schema>/<chain>`)"
        ),
        LedgerLocation::Postgres(_) => match read(&location).await? {
            OpenLedger::Postgres(ledger) => ledger.verify().await.with_context(verifying)?,
            OpenLedger::File(ledger) => ledger.verify().with_context(verifying)?,
        },
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", audit::printable(&report.to_string()));
    }
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub(crate) fn head(ledger: LedgerFile, json: bool) -> anyhow::Result<ExitCode> {
    let path = ledger.path()?;
    let report = verify_file(&path).with_context(|| format!("verifying {}", path.display()))?;
    if !report.is_ok() {
        eprintln!(
            "error: {} does not verify, so it has no head to anchor: {}",
            path.display(),
            audit::printable(&report.to_string())
        );
        return Ok(ExitCode::from(1));
    }
    let head = report.head();
    if json {
        let json = serde_json::json!({
            "head": head,
            "seq": head.seq,
            "hash": head.hash,
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        println!("{head}");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn show(args: ShowArgs, json: bool) -> anyhow::Result<ExitCode> {
    let (location, operands) = ledger_and_operands(args.ledger, args.operands)?;
    let execution = execution(&operands, false)?;
    location.must_exist()?;
    let ledger = read(&location).await?.ledger();
    let ids = match execution {
        Some(id) => vec![id],
        None => ledger
            .list()
            .await?
            .into_iter()
            .map(|r| r.execution_id())
            .collect(),
    };
    for id in ids {
        let events = ledger.events(id).await?;
        if events.is_empty() {
            bail!(
                "no execution {id} in the ledger {location}: `replay-guard ledger list` shows \
                 the ones there are"
            );
        }
        let timeline = audit::Timeline::of(id, events);
        if json {
            // The same five answers as the text, as data, beside every field they come from.
            let mut shown = serde_json::to_value(&timeline)?;
            shown["answers"] = serde_json::to_value(timeline.answers())?;
            println!("{}", serde_json::to_string_pretty(&shown)?);
        } else {
            println!("{timeline}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn list(args: ListArgs, json: bool) -> anyhow::Result<ExitCode> {
    let location = args.ledger.location()?;
    let ledger = read(&location).await?.ledger();
    let records = args.filter.select(ledger.list().await?);
    if args.watch {
        return watch(&location, &args.filter, records, json).await;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(ExitCode::SUCCESS);
    }
    for record in &records {
        print_line(&*ledger, record).await;
    }
    Ok(ExitCode::SUCCESS)
}

/// How often `ledger list --watch` reads the ledger again.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// `ledger list --watch`: what is shown now, then each execution that comes to be shown (one
/// line, or one JSON object per line), until SIGINT or SIGTERM.
async fn watch(
    location: &LedgerLocation,
    filter: &Filter,
    now: Vec<mcp_replay_guard::execution::ExecutionRecord>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut shown = std::collections::HashSet::new();
    let mut batch = now;
    let mut stop = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        // A fresh read each time: a read-only ledger shows the file as it was when opened.
        let ledger = read(location).await?.ledger();
        for record in batch {
            if !shown.insert(record.execution_id()) {
                continue;
            }
            if json {
                println!("{}", serde_json::to_string(&record)?);
            } else {
                print_line(&*ledger, &record).await;
            }
        }
        // Interrupted: it was asked for, so it is no error.
        tokio::select! {
            () = tokio::time::sleep(WATCH_EVERY) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            _ = stop.recv() => return Ok(ExitCode::SUCCESS),
        }
        batch = filter.select(read(location).await?.ledger().list().await?);
    }
}

/// One execution's line in `ledger list`.
async fn print_line(ledger: &dyn Ledger, r: &mcp_replay_guard::execution::ExecutionRecord) {
    // Read-only: an orphaned dispatch is not marked `unknown` here (the next process that
    // writes does it); say so rather than hide it.
    let label =
        if r.state() == ExecutionState::Dispatched && !ledger.is_owner_alive(r.owner()).await {
            "dispatched (owner gone)".to_owned()
        } else {
            r.state_label().to_string()
        };
    println!(
        "{}  {:<32} {:<14} {:<20} accepted {}",
        r.execution_id(),
        label,
        r.retry_class(),
        audit::printable(r.tool()),
        r.accepted_at()
    );
}

pub(crate) async fn settle(args: ResolveArgs, json: bool) -> anyhow::Result<ExitCode> {
    let (location, operands) = ledger_and_operands(args.ledger, args.operands)?;
    let execution = execution(&operands, true)?.context("give the execution (`act_…`)")?;
    location.must_exist()?;
    let opened = location
        .open_to_settle(LOCK_TIMEOUT, &args.key)
        .await
        .with_context(|| format!("cannot open the ledger {location}"))?;
    let operator = match args.operator {
        Some(operator) => operator,
        None => os_user().context(
            "the user this command runs as has no name: give --operator NAME (who resolves it)",
        )?,
    };
    let by = format!("operator:{operator}");
    let ledger = opened.ledger();
    let probed = if args.probe {
        let record = ledger
            .get(execution)
            .await?
            .with_context(|| format!("no execution {execution} in the ledger {location}"))?;
        let crate::probe::Answer { by, answer } =
            crate::probe::ask(&args.probe_with, &record).await?;
        if json {
            println!(
                "{}",
                serde_json::json!({"probe": answer.verdict, "by": by, "said": answer.said})
            );
        } else {
            println!("{by} answered: {}", audit::printable(&answer.said));
        }
        Some(answer)
    } else {
        None
    };
    // Probed only: the operator has seen the answer, and nothing is settled.
    let Some(note) = args.note.filter(|_| args.applied || args.not_applied) else {
        return Ok(ExitCode::SUCCESS);
    };
    let said = probed.as_ref().map(|answer| answer.said.as_str());
    let record = resolve_after_probe(&*ledger, execution, args.applied, &by, &note, said)
        .await
        .with_context(|| {
            format!(
                "resolving {execution} (only an execution that is unknown or needs review can \
                 be resolved; `replay-guard audit show` tells where it stands)"
            )
        })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        println!("{} is now {}", record.execution_id(), record.state_label());
    }
    Ok(ExitCode::SUCCESS)
}

/// The name of the user this process runs as: the account's, else `$USER` or `$LOGNAME`.
fn os_user() -> Option<String> {
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|user| user.name)
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .filter(|name| !name.is_empty())
}
