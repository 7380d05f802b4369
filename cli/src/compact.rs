//! `replay-guard ledger compact --ledger LEDGER`: a ledger file goes to an archive
//! (`<ledger>.<seq>.archive`) and a new one starts with a checkpoint that carries the archived
//! head and the lines of the executions still inside their retention, while other processes
//! keep using it; a PostgreSQL ledger's expired executions leave its index (its chains are
//! never rewritten).

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use mcp_replay_guard::execution::Timestamp;
use serde_json::json;

use crate::{
    LOCK_TIMEOUT,
    compaction::summary,
    inspect::LedgerArg,
    ledger_location::{Access, OpenLedger},
};

#[derive(Debug, Args)]
pub(crate) struct CompactArgs {
    #[command(flatten)]
    ledger: LedgerArg,
}

pub(crate) async fn run(args: CompactArgs, json: bool) -> anyhow::Result<ExitCode> {
    let location = args.ledger.location()?;
    // A file's lock is the one every writer takes: processes serving the file wait for the
    // compaction (as long as writing what is retained takes), then write to the new file.
    let access = Access::Write {
        lock_timeout: LOCK_TIMEOUT,
    };
    let opened = location
        .open(access)
        .await
        .with_context(|| format!("cannot open the ledger {location}"))?;
    let now = Timestamp::now();
    let context = || format!("compacting {location}");
    let report = match opened {
        OpenLedger::File(ledger) => {
            let report = ledger.compact(now).await.with_context(context)?;
            if !json {
                println!("compacted {location}: {}", summary(&report));
                return Ok(ExitCode::SUCCESS);
            }
            json!({
                "ledger": location.to_string(),
                "kept_executions": report.kept_executions,
                "dropped_executions": report.dropped_executions,
                "bytes_before": report.bytes_before,
                "bytes_after": report.bytes_after,
                "archived_to": report.archived_to,
            })
        }
        OpenLedger::Postgres(ledger) => {
            let purged = ledger.purge_expired(now).await.with_context(context)?;
            if !json {
                println!("purged {purged} expired executions from {location}");
                return Ok(ExitCode::SUCCESS);
            }
            json!({
                "ledger": location.to_string(),
                "purged_executions": purged,
            })
        }
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(ExitCode::SUCCESS)
}
