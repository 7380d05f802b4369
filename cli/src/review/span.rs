//! A length of time as a person reads it on the page: its two largest units (`3 h 12 min`,
//! `1.2 s`, `40 ms`), for the gaps of a timeline and the age of a held execution.

/// `millis` milliseconds, in its two largest units.
pub(super) fn span(millis: u64) -> String {
    const SECOND: u64 = 1_000;
    const MINUTE: u64 = 60 * SECOND;
    const HOUR: u64 = 60 * MINUTE;
    const DAY: u64 = 24 * HOUR;
    match millis {
        ms if ms < SECOND => format!("{ms} ms"),
        ms if ms < 10 * SECOND => format!("{}.{} s", ms / SECOND, ms % SECOND / 100),
        ms if ms < MINUTE => format!("{} s", ms / SECOND),
        ms if ms < HOUR => format!("{} min {} s", ms / MINUTE, ms % MINUTE / SECOND),
        ms if ms < DAY => format!("{} h {} min", ms / HOUR, ms % HOUR / MINUTE),
        ms => format!("{} d {} h", ms / DAY, ms % DAY / HOUR),
    }
}

#[cfg(test)]
mod tests {
    use super::span;

    #[test]
    fn two_largest_units() {
        assert_eq!(span(0), "0 ms");
        assert_eq!(span(999), "999 ms");
        assert_eq!(span(1_250), "1.2 s");
        assert_eq!(span(42_000), "42 s");
        assert_eq!(span(3 * 60_000 + 5_000), "3 min 5 s");
        assert_eq!(span(3 * 3_600_000 + 12 * 60_000), "3 h 12 min");
        assert_eq!(span(2 * 86_400_000 + 3_600_000), "2 d 1 h");
    }
}
