//! What a line of the file is: reading one, telling a torn append from a foreign file or
//! a newer format, and whether a result fits in one.

use std::io::BufRead;

use super::*;

/// Reads one line of the file (without its newline): `None` for a blank line (as
/// [`chain::verify`] skips them), the line when it follows `head`, else what is wrong with it.
pub(super) fn read_line(
    bytes: &[u8],
    head: (u64, ChainHash),
) -> Result<Option<ChainedLine>, ChainProblem> {
    let text = std::str::from_utf8(bytes).map_err(|e| ChainProblem::Unreadable {
        detail: e.to_string(),
    })?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let line = chain::read(text)?;
    chain::check_follows(head, &line)?;
    Ok(Some(line))
}

/// How every line of the chain starts (`seq` is its first field).
pub(super) const LINE_START: &[u8] = br#"{"seq":"#;

/// The longest line the ledger writes, and so the most any read of a file takes for one line.
/// A path given as a ledger may be anything (a sparse file of 64 GiB, a log with no newline):
/// with this bound a reader holds at most one line, never the file. The longest line of a
/// working ledger keeps a result, 1 MiB by default (`ToolContract::max_result_bytes`): this
/// leaves room for results far larger, and the writer refuses to keep a result whose line would
/// pass it, so every line it writes reads back.
pub(crate) const MAX_LINE_BYTES: usize = 64 << 20;

/// How much of a line is read before judging whether it can be a ledger line at all: a file
/// that is not a ledger is refused after this much, not after [`MAX_LINE_BYTES`].
const JUDGED_AFTER: usize = 4096;

/// One line of a file, as [`next_line`] read it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// A line that ended in a newline (the newline is not kept).
    Line(Vec<u8>),
    /// Bytes after the last newline, up to the end of what was read (empty at the end).
    Tail(Vec<u8>),
    /// A line that cannot be a ledger line: its first bytes do not start like one, or it runs
    /// past [`MAX_LINE_BYTES`]. Holds what was read of it; the rest is not read.
    Foreign(Vec<u8>),
}

/// Reads the next line of `reader`, bounded by [`MAX_LINE_BYTES`], and judged after its first
/// [`JUDGED_AFTER`] bytes so that a file that is not a ledger is not read on.
pub(crate) fn next_line(reader: &mut impl io::BufRead) -> io::Result<Piece> {
    let mut bytes = Vec::new();
    let mut limit = JUDGED_AFTER;
    loop {
        let before = bytes.len();
        reader
            .by_ref()
            .take((limit - before) as u64)
            .read_until(b'\n', &mut bytes)?;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            return Ok(Piece::Line(bytes));
        }
        if bytes.len() < limit {
            return Ok(Piece::Tail(bytes));
        }
        if limit == MAX_LINE_BYTES + 1 || !could_be_torn(&bytes) {
            return Ok(Piece::Foreign(bytes));
        }
        // Starts like a line (or is blank so far): read on, up to the bound.
        limit = MAX_LINE_BYTES + 1;
    }
}

/// What is wrong with a [`Piece::Foreign`] that starts with `start`, as a reader reports it.
pub(crate) fn foreign_detail(start: &[u8]) -> String {
    if start.len() > MAX_LINE_BYTES {
        format!(
            "a line longer than any ledger line ({} MiB)",
            MAX_LINE_BYTES >> 20
        )
    } else {
        "bytes that cannot start a ledger line".to_owned()
    }
}

/// Whether a line that cannot be read is the first sign of a file that is not a ledger at all
/// (rather than a ledger line damaged): it does not start like a ledger line.
pub(crate) fn starts_like_a_line(bytes: &[u8]) -> bool {
    bytes.trim_ascii_start().starts_with(LINE_START)
}

/// The error for a file that is not a ledger, with what it looks like (`first` is its first
/// line, or what was read of it).
pub(crate) fn not_a_ledger(path: &Path, first: &[u8]) -> LedgerError {
    LedgerError::storage(format!(
        "{} is not a replay-guard ledger: it looks like {}, and does not start with a ledger \
         line. It was left untouched: give the path of a ledger the guard wrote, or of a new \
         file",
        path.display(),
        looks_like(first)
    ))
}

/// Refuses a path that exists and is not a regular file (a device such as `/dev/zero`, a pipe,
/// a directory), before it is opened: only a file can be a ledger, reading a device may never
/// end, and opening a pipe may never return.
pub(crate) fn regular_file(path: &Path) -> Result<(), LedgerError> {
    let kind = match fs::metadata(path) {
        Ok(meta) => meta.file_type(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(failed(&format!("cannot stat {}", path.display()), e)),
    };
    if kind.is_file() {
        return Ok(());
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if std::os::unix::fs::FileTypeExt::is_char_device(&kind)
        || std::os::unix::fs::FileTypeExt::is_block_device(&kind)
    {
        "a device"
    } else if std::os::unix::fs::FileTypeExt::is_fifo(&kind) {
        "a pipe"
    } else {
        "not a regular file"
    };
    Err(LedgerError::storage(format!(
        "{} is not a replay-guard ledger: it is {what}, and a ledger is a regular file. It was \
         left untouched: give the path of a ledger the guard wrote, or of a new file",
        path.display()
    )))
}

/// Whether bytes after the last newline can be an append torn by a crash: a prefix of a
/// chain line (every one starts with [`LINE_START`]), possibly followed by the zeros a file
/// system leaves in blocks it had not written, or blank space.
pub(super) fn could_be_torn(tail: &[u8]) -> bool {
    let end = tail.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let tail = &tail[..end];
    // Blank space is skipped by every reader (`str::trim`), and loses nothing when cut.
    let blank = std::str::from_utf8(tail).is_ok_and(|t| t.trim().is_empty());
    let tail = tail.trim_ascii_start();
    blank || tail.starts_with(LINE_START) || LINE_START.starts_with(tail)
}

/// What a file that is not a ledger looks like, for the error that refuses it (never its
/// content: it may be anything, secrets included).
pub(super) fn looks_like(bytes: &[u8]) -> &'static str {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return "binary data (not UTF-8 text)";
    };
    if text.contains('\0') {
        return "binary data";
    }
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    match serde_json::from_str::<serde_json::Value>(first) {
        Ok(_) => "JSON, but not ledger lines (no `seq`, `prev` and `hash`)",
        Err(_) => "text, not JSON lines",
    }
}

/// Whether a line is a chain line this build cannot read because a newer one wrote it: it
/// has `seq`, `prev` and `hash`, and an event kind (or a body) this build does not know.
/// Returns what is new about it.
pub(super) fn newer_format(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let serde_json::Value::Object(mut map) = serde_json::from_str(text).ok()? else {
        return None;
    };
    let chained = map.get("seq").is_some_and(serde_json::Value::is_u64)
        && map.get("prev").is_some_and(serde_json::Value::is_string)
        && map.get("hash").is_some_and(serde_json::Value::is_string);
    if !chained {
        return None;
    }
    for field in ["seq", "prev", "hash"] {
        map.remove(field);
    }
    if let Some(kind) = map.get("event").and_then(serde_json::Value::as_str) {
        let kind = kind.to_owned();
        return match serde_json::from_value::<LedgerEvent>(serde_json::Value::Object(map)) {
            Err(e) if e.to_string().contains("unknown variant") => {
                Some(format!("event `{kind}`, unknown to this build"))
            }
            _ => None,
        };
    }
    let known = ["checkpoint", "fingerprint_key", "result_of", "execution_id"];
    if map.keys().any(|k| known.contains(&k.as_str())) {
        return None;
    }
    let mut fields: Vec<&str> = map.keys().map(String::as_str).collect();
    fields.truncate(5);
    Some(format!("fields {fields:?}, unknown to this build"))
}

/// How deep a kept result may nest. The JSON parser refuses more than 127 nested levels, and
/// the line around a result adds levels of its own: a result that parses on its own may still
/// make a line that never reads back, so deeper ones are refused here, well short of the limit.
pub(super) const MAX_RESULT_DEPTH: usize = 100;

/// What a line that keeps a result holds besides the result (its chain fields, the execution
/// and the reference), with room to spare.
const RESULT_LINE_OVERHEAD: usize = 1024;

/// The result (`raw` is its text as received), if its line will read back: nested at most
/// [`MAX_RESULT_DEPTH`] levels, and at most [`MAX_LINE_BYTES`] long once written.
pub(super) fn fits_in_a_line(
    result: serde_json::Value,
    raw: &[u8],
) -> Result<serde_json::Value, LedgerError> {
    // The line holds the result as the writer spells it, which may be longer than it came
    // (`1E15` is written `1000000000000000.0`): counted exactly when it could matter.
    let too_long = raw.len() > MAX_LINE_BYTES / 8 && {
        let mut written = WrittenLength(0);
        serde_json::to_writer(&mut written, &result).is_err()
            || written.0 + RESULT_LINE_OVERHEAD > MAX_LINE_BYTES
    };
    if too_long {
        return Err(storage(
            "a result to keep is longer than a ledger line can hold",
            format!(
                "more than {} MiB once written; it is not kept",
                MAX_LINE_BYTES >> 20
            ),
        ));
    }
    fn depth(value: &serde_json::Value) -> usize {
        match value {
            serde_json::Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
            serde_json::Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }
    if depth(&result) > MAX_RESULT_DEPTH {
        return Err(storage(
            "a result to keep is nested deeper than a ledger line can hold",
            format!("more than {MAX_RESULT_DEPTH} levels; it is not kept"),
        ));
    }
    Ok(result)
}

/// Counts the bytes written to it.
struct WrittenLength(usize);

impl io::Write for WrittenLength {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_can_start_a_line_is_torn() {
        for torn in [
            &b""[..],
            b"{",
            b"{\"se",
            b"{\"seq\":12,\"prev\":\"sha256:ab",
            b"{\"seq\":3\0\0\0\0",
            b"\0\0\0",
            b"  \t",
            "\u{3000}".as_bytes(),
        ] {
            assert!(could_be_torn(torn), "{:?}", String::from_utf8_lossy(torn));
        }
        for foreign in [
            &b"just a note"[..],
            b"root:x:0:0",
            b"{\"a\":1}",
            b"[1,2]",
            b"\x7fELF\x02",
            b"\0\0x",
        ] {
            assert!(
                !could_be_torn(foreign),
                "{:?}",
                String::from_utf8_lossy(foreign)
            );
        }
    }

    #[test]
    fn a_foreign_file_is_described_never_quoted() {
        assert_eq!(looks_like(b"\xff\xfe\x00"), "binary data (not UTF-8 text)");
        assert_eq!(looks_like(b"a\0b"), "binary data");
        assert!(looks_like(b"password = hunter2\n").starts_with("text"));
        assert!(looks_like(b"\n{\"a\":1}\n").starts_with("JSON"));
        assert!(!looks_like(b"password = hunter2\n").contains("hunter2"));
    }

    #[test]
    fn a_newer_line_is_told_from_a_garbled_one() {
        let newer = br#"{"seq":4,"prev":"sha256:00","hash":"sha256:00","execution_id":"act_01J4K8J7DX7VQ9ZB3N5M2P6R8T","at":"2026-12-01T00:00:00.000Z","event":"teleported"}"#;
        assert_eq!(
            newer_format(newer).as_deref(),
            Some("event `teleported`, unknown to this build")
        );
        let body = br#"{"seq":4,"prev":"sha256:00","hash":"sha256:00","sealed_by":"hsm"}"#;
        assert!(newer_format(body).unwrap().contains("sealed_by"));
        // A known kind with a bad field, a line without its chain fields, text: not newer.
        let known = br#"{"seq":4,"prev":"sha256:00","hash":"sha256:00","execution_id":"act_01J4K8J7DX7VQ9ZB3N5M2P6R8T","at":"2026-12-01T00:00:00.000Z","event":"dispatched"}"#;
        assert_eq!(newer_format(known), None);
        assert_eq!(newer_format(br#"{"event":"teleported"}"#), None);
        assert_eq!(newer_format(b"hello"), None);
    }
}
