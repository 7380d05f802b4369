//! This test binary's log, captured: a global subscriber at info and above whose output the
//! tests read back, e.g. for the ledger head lines.

use std::{
    io::Write,
    sync::{Arc, Mutex, OnceLock},
};

/// Log output, collected.
#[derive(Clone, Default)]
pub struct Captured(pub Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything logged at info and above in this test binary (installed on first use as the
/// global subscriber).
pub fn captured_log() -> &'static Captured {
    static LOG: OnceLock<Captured> = OnceLock::new();
    LOG.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .with_writer(move || writer.clone())
                .finish(),
        )
        .unwrap();
        captured
    })
}

/// The `ledger head` lines logged so far for the ledger whose `ledger=` field is `ledger`.
pub fn head_log_lines(ledger: &str) -> Vec<String> {
    let text = String::from_utf8(captured_log().0.lock().unwrap().clone()).unwrap();
    let field = format!("ledger={ledger}");
    text.lines()
        .filter(|l| l.contains("ledger head") && l.split_whitespace().any(|w| w == field))
        .map(str::to_owned)
        .collect()
}

/// The value of the `name=` field of a log line.
pub fn log_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let prefix = format!("{name}=");
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(prefix.as_str()))
}
