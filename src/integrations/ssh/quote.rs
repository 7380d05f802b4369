//! POSIX shell quoting: one argument as one single-quoted word.

/// A string that cannot travel as a shell word: it holds a NUL byte, which no argument of a
/// POSIX command can contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a shell word cannot contain a NUL byte")]
pub struct UnquotableWord;

/// Quote `word` as one single-quoted POSIX shell word.
///
/// Inside single quotes nothing is special except the single quote itself, which closes the
/// quote: each `'` becomes `'\''` (close, an escaped quote, reopen). The result reads back as
/// exactly `word` in `sh`, `bash`, `dash` and `zsh`, whatever it holds (`$`, backquotes,
/// newlines, `*`, `\`). The empty string becomes `''`, so it stays one (empty) argument.
///
/// ```
/// use mcp_replay_guard::integrations::ssh::sh_quote;
///
/// assert_eq!(sh_quote("systemctl restart x").unwrap(), "'systemctl restart x'");
/// assert_eq!(sh_quote("it's").unwrap(), r"'it'\''s'");
/// assert_eq!(sh_quote("").unwrap(), "''");
/// assert!(sh_quote("a\0b").is_err());
/// ```
pub fn sh_quote(word: &str) -> Result<String, UnquotableWord> {
    if word.contains('\0') {
        return Err(UnquotableWord);
    }
    let mut quoted = String::with_capacity(word.len() + 2);
    quoted.push('\'');
    for c in word.chars() {
        if c == '\'' {
            quoted.push_str(r"'\''");
        } else {
            quoted.push(c);
        }
    }
    quoted.push('\'');
    Ok(quoted)
}

/// Quote each word and join them with spaces: a command line of separate arguments.
pub(crate) fn sh_join<'a>(
    words: impl IntoIterator<Item = &'a str>,
) -> Result<String, UnquotableWord> {
    let mut line = String::new();
    for word in words {
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&sh_quote(word)?);
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::process::Command;

    /// What `sh` makes of the quoted word: it prints its first argument back.
    fn through_sh(word: &str) -> String {
        let line = format!("printf '%s' {}", sh_quote(word).unwrap());
        let out = Command::new("sh").arg("-c").arg(line).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn hostile_words_read_back_unchanged_in_sh() {
        for word in [
            "",
            "'",
            "''",
            "a'b",
            "$(touch /tmp/mrg-quote-pwned)",
            "`id`",
            "$HOME ${x:-y} $1",
            "a\nb\n",
            "* ? [a] ~ ~root",
            "\\ \\\\ \\'",
            "; rm -rf / #",
            "é ünïcødé ✓",
            "-n",
        ] {
            assert_eq!(through_sh(word), word);
        }
        assert!(!std::path::Path::new("/tmp/mrg-quote-pwned").exists());
    }

    #[test]
    fn joined_words_stay_separate_arguments() {
        let line = format!("printf '<%s>' {}", sh_join(["a b", "", "c'd"]).unwrap());
        let out = Command::new("sh").arg("-c").arg(line).output().unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "<a b><><c'd>");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_word_without_nul_reads_back_unchanged(word in "[^\0]{0,40}") {
            prop_assert_eq!(through_sh(&word), word);
        }
    }
}
