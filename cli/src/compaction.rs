//! Keeping the ledger small while `proxy` or `stdio` serves: a task beside the traffic that
//! compacts a file ledger when it grows past `--compact-above` or its last compaction is older
//! than `--compact-every` (and purges a PostgreSQL ledger's expired executions that often),
//! and what `ledger compact` prints of a compaction.
//!
//! # Several processes on one file
//!
//! The library's compaction runs under the file's exclusive lock, the one every write takes,
//! so processes sharing a file compact one at a time and no write falls between the archive
//! and the new file. The task asks for a compaction only "if the file is still larger than …"
//! ([`FileLedger::compact_if_larger`]), answered under that lock: of several processes that
//! find the file too long at once, the first compacts and the others find it short.
//!
//! # What a call waits for
//!
//! Nothing of the task runs on a call's way: it looks at the file's size (a `stat`) and hands
//! the compaction to the ledger's writer. While the writer writes the retained executions into
//! the new file, the appends of this process queue behind it (and other processes wait for
//! the lock), then go on in the new file. A compaction that fails leaves the file as it was
//! (the library takes the archive and swaps the new file in only once it is whole and synced)
//! and is tried again later; nothing it did is lost.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use clap::Args;
use mcp_replay_guard::{
    execution::Timestamp,
    ledger::{CompactReport, FileLedger, PostgresLedger},
};

use crate::ledger_location::OpenLedger;

/// When the ledger is compacted, on the command line of `proxy` and `stdio`.
#[derive(Debug, Clone, Args)]
pub struct CompactionOptions {
    /// Compact a file ledger once it is larger than this (`64MiB`, `512KiB`, `1GB`, or bytes);
    /// `off`: never by size. The executions still inside their retention stay, the rest of the
    /// file goes to an archive (`<ledger>.<seq>.archive`) that `audit verify` follows. When
    /// what is retained alone is larger, the next compaction waits until the file doubled.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub compact_above: Limit<u64>,
    /// Also compact a file ledger whose last compaction is older than this (if it changed
    /// since), and purge a PostgreSQL ledger's expired executions this often (`30m`, `1h`,
    /// `1d`); `off`: never by time.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_every)]
    pub compact_every: Limit<Duration>,
}

/// A bound, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit<T>(pub Option<T>);

/// How often the file's size is looked at: a `stat`, nothing read. The file can outgrow
/// `--compact-above` by what is appended in this time.
const CHECK_EVERY: Duration = Duration::from_millis(200);

/// How long after a failed compaction the next is tried, at first; it doubles to
/// [`RETRY_AT_MOST`] while they keep failing.
const RETRY_AFTER: Duration = Duration::from_secs(5);
const RETRY_AT_MOST: Duration = Duration::from_secs(300);

/// `64MiB`, `512 KiB`, `1GB`, `4096`: a size in bytes, binary (KiB, MiB, GiB) or decimal (KB,
/// MB, GB) units; `off`.
fn parse_size(text: &str) -> Result<Limit<u64>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(Limit(None));
    }
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().map_err(|_| {
        format!("{text:?} is not a size: give bytes, or a number and a unit (64MiB)")
    })?;
    let unit = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        other => {
            return Err(format!(
                "{other:?} is not a unit: B, KiB, MiB, GiB (1024) or KB, MB, GB (1000)"
            ));
        }
    };
    match number.checked_mul(unit) {
        Some(0) => Err("a size of 0 would compact all the time: give `off` for never".into()),
        Some(bytes) => Ok(Limit(Some(bytes))),
        None => Err(format!("{text:?} is too large")),
    }
}

/// A humantime duration (`30m`, `1h`), or `off`.
fn parse_every(text: &str) -> Result<Limit<Duration>, String> {
    if text.trim().eq_ignore_ascii_case("off") {
        return Ok(Limit(None));
    }
    match humantime::parse_duration(text) {
        Ok(every) if every.is_zero() => Err("give a duration above zero, or `off`".into()),
        Ok(every) => Ok(Limit(Some(every))),
        Err(error) => Err(format!("{text:?}: {error}")),
    }
}

/// A size for people: `12.3 MiB`.
pub fn shown_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// What a compaction did, in one line.
pub fn summary(report: &CompactReport) -> String {
    format!(
        "kept {} executions, dropped {}; {} -> {}; the previous file is {}",
        report.kept_executions,
        report.dropped_executions,
        shown_bytes(report.bytes_before),
        shown_bytes(report.bytes_after),
        report.archived_to.display()
    )
}

/// Starts the task that keeps `ledger` small as `options` say (a file by size and by time, a
/// PostgreSQL ledger by time); it runs until the runtime ends.
pub fn spawn(options: &CompactionOptions, ledger: OpenLedger) {
    match ledger {
        OpenLedger::File(ledger)
            if options.compact_above.0.is_some() || options.compact_every.0.is_some() =>
        {
            tokio::spawn(keep_file_small(ledger, options.clone()));
        }
        OpenLedger::Postgres(ledger) => {
            if let Some(every) = options.compact_every.0 {
                tokio::spawn(purge_every(ledger, every));
            }
        }
        OpenLedger::File(_) => {}
    }
}

/// Every `every`: the executions whose retention ended leave a PostgreSQL ledger's index
/// (the ledger also does it every 1024 claims; this is for one that takes few). Their lines
/// stay in the chains, which are never rewritten.
async fn purge_every(ledger: PostgresLedger, every: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match ledger.purge_expired(Timestamp::now()).await {
            Ok(0) => tracing::debug!("no expired execution to purge from the ledger"),
            Ok(purged) => tracing::info!(
                schema = ledger.schema(),
                "purged {purged} expired executions from the ledger"
            ),
            Err(error) => tracing::warn!(
                "the ledger's expired executions were not purged, tried again in {}: {error}",
                humantime::format_duration(every)
            ),
        }
    }
}

/// What the task remembers between two looks at the file.
#[derive(Debug, Default)]
struct Watch {
    /// The file now at the path, as this process first saw it.
    file: Option<Seen>,
    /// After a failure: not before then.
    retry_at: Option<tokio::time::Instant>,
    retry_after: Option<Duration>,
    /// Said once: what is retained alone is over `--compact-above`.
    said_over: bool,
}

/// A file at the ledger's path, as this process first saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    ino: u64,
    /// When this process first saw it: its birth where the file system does not say.
    at: SystemTime,
    /// Its length right after the compaction that made it (this process's, or another's
    /// seen within a look of it; not the file found at start): the size rule waits for twice
    /// that when it is over the bound (what is retained alone is), in every process.
    left: Option<u64>,
    /// Its length when first seen: by time, a file nobody wrote to since is left alone.
    len: u64,
}

impl Watch {
    /// Takes in a look at the file: a new inode is a compaction (by any process) since the
    /// last look, unless it is the first look.
    fn saw(&mut self, len: u64, ino: u64) -> Seen {
        match self.file {
            Some(seen) if seen.ino == ino => seen,
            before => *self.file.insert(Seen {
                ino,
                at: SystemTime::now(),
                left: before.map(|_| len),
                len,
            }),
        }
    }

    /// After this process compacted: the new file is `left` bytes long.
    fn compacted(&mut self, left: u64, ino: u64) {
        self.file = Some(Seen {
            ino,
            at: SystemTime::now(),
            left: Some(left),
            len: left,
        });
    }
}

/// The file's length, inode and when it was made (its last compaction, or its creation):
/// `None` while there is no file. A `stat`, short enough to make on the runtime's thread.
fn look(path: &Path) -> Option<(u64, u64, Option<SystemTime>)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.ino(), meta.created().ok()))
}

/// The bytes above which the file `seen` is compacted, if it is to be by size.
fn size_rule(options: &CompactionOptions, seen: Seen) -> Option<u64> {
    let above = options.compact_above.0?;
    Some(match seen.left {
        Some(left) if left >= above => left.saturating_mul(2),
        _ => above,
    })
}

/// Whether the file `seen`, `len` bytes long and made at `made` (when the file system says),
/// is due by time: made longer ago than `--compact-every`, and written to since.
fn due_by_time(
    options: &CompactionOptions,
    seen: Seen,
    len: u64,
    made: Option<SystemTime>,
) -> bool {
    let Some(every) = options.compact_every.0 else {
        return false;
    };
    let old = SystemTime::now()
        .duration_since(made.unwrap_or(seen.at))
        .is_ok_and(|age| age >= every);
    old && len != seen.len
}

async fn keep_file_small(ledger: FileLedger, options: CompactionOptions) {
    let path: PathBuf = ledger.path().to_path_buf();
    let mut watch = Watch::default();
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if watch
            .retry_at
            .is_some_and(|at| tokio::time::Instant::now() < at)
        {
            continue;
        }
        let Some((len, ino, made)) = look(&path) else {
            continue;
        };
        let seen = watch.saw(len, ino);
        // By size: the bound, answered under the lock. By time: larger than it is now, so a
        // process that compacted it meanwhile (it is shorter then) is not followed by another.
        let bound = match size_rule(&options, seen) {
            Some(bound) if len > bound => bound,
            _ if due_by_time(&options, seen, len, made) => len.saturating_sub(1),
            _ => continue,
        };
        match ledger.compact_if_larger(Timestamp::now(), bound).await {
            Ok(Some(report)) => {
                tracing::info!(ledger = %path.display(), "compacted the ledger: {}", summary(&report));
                let ino = look(&path).map_or(0, |(_, ino, _)| ino);
                watch.compacted(report.bytes_after, ino);
                watch.retry_at = None;
                watch.retry_after = None;
                match options.compact_above.0 {
                    Some(above) if report.bytes_after >= above && !watch.said_over => {
                        watch.said_over = true;
                        tracing::warn!(
                            ledger = %path.display(),
                            "the executions still retained take {}, more than --compact-above {}: the next compaction waits until the file is twice that (shorter retention in the policy keeps it smaller)",
                            shown_bytes(report.bytes_after),
                            shown_bytes(above)
                        );
                    }
                    _ => {}
                }
            }
            // Another process compacted it first.
            Ok(None) => {}
            Err(error) => {
                let after = watch
                    .retry_after
                    .map_or(RETRY_AFTER, |after| (after * 2).min(RETRY_AT_MOST));
                watch.retry_after = Some(after);
                watch.retry_at = Some(tokio::time::Instant::now() + after);
                tracing::warn!(
                    ledger = %path.display(),
                    "the ledger was not compacted, tried again in {}: {error} (every record stays in the file as it was)",
                    humantime::format_duration(after)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_with_their_units_and_off() {
        let size = |text| parse_size(text).map(|limit| limit.0);
        assert_eq!(size("64MiB"), Ok(Some(64 << 20)));
        assert_eq!(size("512 KiB"), Ok(Some(512 << 10)));
        assert_eq!(size("1GB"), Ok(Some(1_000_000_000)));
        assert_eq!(size("4096"), Ok(Some(4096)));
        assert_eq!(size("2m"), Ok(Some(2 << 20)));
        assert_eq!(size("off"), Ok(None));
        for wrong in ["", "MiB", "12 parsecs", "0", "-1MiB", "99999999999GiB"] {
            assert!(size(wrong).is_err(), "{wrong:?}");
        }
        assert_eq!(
            parse_every("1h").map(|l| l.0),
            Ok(Some(Duration::from_secs(3600)))
        );
        assert_eq!(parse_every("OFF").map(|l| l.0), Ok(None));
        assert!(parse_every("0s").is_err());
    }

    #[test]
    fn sizes_are_shown_in_binary_units() {
        assert_eq!(shown_bytes(512), "512 B");
        assert_eq!(shown_bytes(1536), "1.5 KiB");
        assert_eq!(shown_bytes(64 << 20), "64.0 MiB");
    }

    /// Over the bound after a compaction (what is retained alone is): the next one waits for
    /// twice that, so a full ledger is not compacted on every look.
    #[test]
    fn a_ledger_whose_retained_executions_fill_the_bound_is_compacted_when_it_doubled() {
        let options = CompactionOptions {
            compact_above: Limit(Some(1000)),
            compact_every: Limit(None),
        };
        let mut watch = Watch::default();
        // The file found at start is compacted by the bound, however long it is.
        let found = watch.saw(5000, 1);
        assert_eq!(size_rule(&options, found), Some(1000));
        watch.compacted(400, 2);
        assert_eq!(size_rule(&options, watch.saw(900, 2)), Some(1000));
        watch.compacted(1500, 3);
        assert_eq!(size_rule(&options, watch.saw(1600, 3)), Some(3000));
        // Another process's compaction, seen as a new file: the same rule.
        assert_eq!(size_rule(&options, watch.saw(1400, 4)), Some(2800));
        assert_eq!(size_rule(&options, watch.saw(200, 5)), Some(1000));
    }

    #[test]
    fn by_time_a_file_is_due_once_old_enough_and_written_to_since_it_was_first_seen() {
        let options = CompactionOptions {
            compact_above: Limit(None),
            compact_every: Limit(Some(Duration::from_secs(60))),
        };
        let now = SystemTime::now();
        let old = now - Duration::from_secs(61);
        let mut watch = Watch::default();
        let seen = watch.saw(10, 1);
        assert!(due_by_time(&options, seen, 11, Some(old)));
        assert!(!due_by_time(&options, seen, 11, Some(now)));
        // Nobody wrote to it since this process first saw it: nothing to do.
        assert!(!due_by_time(&options, seen, 10, Some(old)));
        // No birth time from the file system: when this process first saw it.
        assert!(!due_by_time(&options, seen, 11, None));
        let first_seen_long_ago = Seen { at: old, ..seen };
        assert!(due_by_time(&options, first_seen_long_ago, 11, None));
    }
}
