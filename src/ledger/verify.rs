//! Verifying a file ledger as one chain: the archives its checkpoints name, oldest first, then
//! the live file, optionally against an anchored head.
//!
//! [`FileLedger::compact`](super::FileLedger::compact) moves the file to
//! `<ledger>.<seq>.archive` and starts a new one with a checkpoint whose `prev` is the
//! archived head. A checkpoint is only as good as the archive behind it, so verification follows
//! every checkpoint to its archive: a missing archive, an archive that does not end where the
//! checkpoint says (swapped, replaced, cut) or a checkpoint that does not carry the archive's
//! head (forged) is reported, never passed over.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use super::{
    LedgerError,
    chain::{self, ChainHead, ChainProblem, LineBody, Verifier, VerifyReport},
    file::{
        Piece, foreign_detail, next_line, not_a_ledger, regular_file, sibling, starts_like_a_line,
    },
};

/// Verifies the ledger file at `path` and every archive its checkpoints lead to, as one chain;
/// with `anchor`, also that the chain still holds that head (`replay-guard audit verify
/// --expect-head`). `path` may also be an archive (`<ledger>.<seq>.archive`): the archives
/// before it are followed the same way.
///
/// An error means a file could not be read; everything wrong with the chain is in the report.
//
// Longer than most functions: it walks archives, the live file and the anchor in one pass, and
// each step's findings feed the next (a checkpoint is checked against the line before it).
pub fn verify_file_anchored(
    path: &Path,
    anchor: Option<ChainHead>,
) -> Result<VerifyReport, LedgerError> {
    let base = ledger_of(path);
    // Newest first: the file, then the archive its checkpoint names, and so on. Only first
    // lines are read here; each file is read whole in its turn below.
    let mut files: Vec<PathBuf> = Vec::new();
    // What each file's checkpoint says it follows, when it starts with one.
    let mut follows: Vec<Option<(u64, ChainHead)>> = Vec::new();
    let mut current = path.to_path_buf();
    let missing = loop {
        let checkpoint = first_line(&current)?
            .and_then(|first| chain::parse_line(&first).ok())
            .and_then(|line| match line.body {
                LineBody::Checkpoint { checkpoint } => Some((line.seq, line.prev, checkpoint)),
                _ => None,
            });
        files.push(current.clone());
        follows.push(checkpoint.as_ref().map(|(seq, prev, checkpoint)| {
            let claimed = ChainHead {
                seq: checkpoint.compacted_through,
                hash: *prev,
            };
            (*seq, claimed)
        }));
        let Some((seq, _, checkpoint)) = checkpoint else {
            break None;
        };
        let archive = sibling(&base, &format!("{}.archive", checkpoint.compacted_through));
        // Each archive is older than the file that names it: anything else is a loop.
        if files.contains(&archive) {
            break Some((
                seq,
                ChainProblem::ArchiveMismatch {
                    archive: archive.display().to_string(),
                    detail: "it is not older than the file that names it".into(),
                },
            ));
        }
        match fs::symlink_metadata(&archive) {
            Ok(_) => current = archive,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                break Some((
                    seq,
                    ChainProblem::ArchiveMissing {
                        archive: archive.display().to_string(),
                    },
                ));
            }
            Err(e) => return Err(cannot_read(&archive, e)),
        }
    };
    files.reverse();
    follows.reverse();

    // Every archive was found (a missing one is reported below): the chain starts at seq 1.
    let mut verifier = Verifier::from_genesis();
    if let Some(anchor) = anchor {
        verifier = verifier.expect(anchor);
    }
    if let Some(bad) = missing {
        let mut report = verifier.finish();
        report.first_bad = Some(bad);
        report.file = files.first().cloned();
        report.files = files;
        return Ok(report);
    }
    let mut failed_in = None;
    for (i, file) in files.iter().enumerate() {
        let before = (verifier.report().head(), verifier.report().verified);
        if !verify_lines(file, &mut verifier)? {
            failed_in = Some((i, before));
            break;
        }
    }
    let mut report = verifier.finish();
    if let Some((i, (archived, verified))) = failed_in {
        report.file = Some(files[i].clone());
        // Failing at the first line of a later file, its checkpoint: a link that fails there
        // is a checkpoint that does not follow its archive.
        if i > 0
            && report.verified == verified
            && let Some((_, problem)) = &mut report.first_bad
            && matches!(
                problem,
                ChainProblem::BrokenLink | ChainProblem::Deleted { .. } | ChainProblem::Reordered
            )
        {
            *problem = ChainProblem::ArchiveMismatch {
                archive: files[i - 1].display().to_string(),
                detail: match follows[i] {
                    Some((seq, claimed)) => format!(
                        "the archive ends at {archived}; the checkpoint, at seq {seq}, says it \
                         follows {claimed}"
                    ),
                    None => format!("the archive ends at {archived}"),
                },
            };
        }
    } else if report.first_bad.is_some() {
        // An anchor that is not there: the chain ends in the live file.
        report.file = files.last().cloned();
    }
    report.files = files;
    Ok(report)
}

/// The live ledger a path belongs to: `<ledger>` for `<ledger>.<seq>.archive`, else the path.
fn ledger_of(path: &Path) -> PathBuf {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if let Some(rest) = name.strip_suffix(".archive")
        && let Some((ledger, seq)) = rest.rsplit_once('.')
        && !ledger.is_empty()
        && !seq.is_empty()
        && seq.bytes().all(|b| b.is_ascii_digit())
    {
        return path.with_file_name(ledger);
    }
    path.to_path_buf()
}

/// Opens a file of the chain, refusing what cannot be one (a device, a pipe, a directory).
fn open(path: &Path) -> Result<io::BufReader<fs::File>, LedgerError> {
    regular_file(path)?;
    let file = fs::File::open(path).map_err(|e| cannot_read(path, e))?;
    Ok(io::BufReader::new(file))
}

/// The first line that is not blank, without its newline (`None` for a file of blank lines).
/// A file whose first line is not a ledger line (or whose first bytes are not a line at all) is
/// refused: it is not a ledger, and is not read on.
fn first_line(path: &Path) -> Result<Option<String>, LedgerError> {
    let mut reader = open(path)?;
    loop {
        let line = match next_line(&mut reader).map_err(|e| cannot_read(path, e))? {
            Piece::Tail(tail) if tail.is_empty() => return Ok(None),
            Piece::Line(line) | Piece::Tail(line) => line,
            // Too long to be a line, but it starts like one: the verifier reports it.
            Piece::Foreign(start) if starts_like_a_line(&start) => return Ok(None),
            Piece::Foreign(start) => return Err(not_a_ledger(path, &start)),
        };
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        if !starts_like_a_line(&line) && chain::parse_line(&text).is_err() {
            return Err(not_a_ledger(path, &line));
        }
        return Ok(Some(text.into_owned()));
    }
}

/// Feeds the lines of `path` to `verifier`, one bounded line at a time; whether every line so
/// far verified.
fn verify_lines(path: &Path, verifier: &mut Verifier) -> Result<bool, LedgerError> {
    let mut reader = open(path)?;
    loop {
        let line = match next_line(&mut reader).map_err(|e| cannot_read(path, e))? {
            Piece::Line(line) => line,
            Piece::Tail(tail) if tail.is_empty() => return Ok(true),
            Piece::Tail(tail) => tail,
            // Not a line the chain can hold: the verifier reports it as the next line, unread.
            Piece::Foreign(start) => return Ok(verifier.unreadable(foreign_detail(&start))),
        };
        let text = String::from_utf8_lossy(&line);
        if !verifier.segment([text.as_ref()]) {
            return Ok(false);
        }
    }
}

fn cannot_read(path: &Path, error: io::Error) -> LedgerError {
    LedgerError::caused(format!("cannot read {}: {error}", path.display()), error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_archive_path_names_its_ledger() {
        let dir = Path::new("/var/lib/guard");
        for (path, ledger) in [
            ("ledger.jsonl.42.archive", "ledger.jsonl"),
            ("ledger.jsonl", "ledger.jsonl"),
            ("ledger.jsonl.x42.archive", "ledger.jsonl.x42.archive"),
            (".42.archive", ".42.archive"),
            ("ledger..archive", "ledger..archive"),
        ] {
            assert_eq!(ledger_of(&dir.join(path)), dir.join(ledger), "{path}");
        }
    }
}
