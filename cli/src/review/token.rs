//! The review page's token: what an operator types into the resolve form to settle an
//! execution. Given at start-up in a file (`--token-file`) or the environment
//! ([`TOKEN_VARIABLE`]); never printed, never logged, never kept as given: only its SHA-256,
//! compared in constant time with the SHA-256 of what a form sent (the digests have one length
//! whatever was typed, so neither a token's bytes nor its length leak through timing).

use std::{fmt, io::Read, path::Path};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The variable that holds the token when no `--token-file` is given.
pub(crate) const TOKEN_VARIABLE: &str = "REPLAY_GUARD_REVIEW_TOKEN";

/// The shortest token taken: anything shorter could be guessed over the wire.
const MIN_LEN: usize = 16;

/// The longest token file read.
const MAX_FILE_BYTES: u64 = 4096;

/// The token the resolve form must carry.
pub(super) struct Token {
    digest: [u8; 32],
}

impl Token {
    /// The token from `file` when given, else from [`TOKEN_VARIABLE`]; `None` when neither is
    /// there (the page is then read-only). Surrounding white space (a file's last newline) is
    /// not part of it. No error shows the token.
    pub(super) fn load(file: Option<&Path>) -> anyhow::Result<Option<Self>> {
        let (text, source) = match file {
            Some(path) => {
                let source = format!("--token-file {}", path.display());
                (read_file(path).context(source.clone())?, source)
            }
            None => match std::env::var(TOKEN_VARIABLE) {
                Ok(text) => (text, TOKEN_VARIABLE.to_owned()),
                Err(std::env::VarError::NotPresent) => return Ok(None),
                Err(std::env::VarError::NotUnicode(_)) => {
                    bail!("{TOKEN_VARIABLE} is not text (its value is not shown)")
                }
            },
        };
        Self::from_text(text.trim())
            .with_context(|| format!("the token of {source}"))
            .map(Some)
    }

    fn from_text(text: &str) -> anyhow::Result<Self> {
        if text.chars().count() < MIN_LEN {
            bail!(
                "it is shorter than {MIN_LEN} characters (its value is not shown): make one \
                 with `openssl rand -hex 32`"
            );
        }
        Ok(Self {
            digest: Sha256::digest(text.as_bytes()).into(),
        })
    }

    /// Whether `given` (what the form sent, white space around it ignored as at start-up) is
    /// the token.
    pub(super) fn matches(&self, given: &str) -> bool {
        let given: [u8; 32] = Sha256::digest(given.trim().as_bytes()).into();
        given.ct_eq(&self.digest).into()
    }
}

impl fmt::Debug for Token {
    // Not even the digest.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// A token file as text, bounded.
fn read_file(path: &Path) -> anyhow::Result<String> {
    let file = std::fs::File::open(path).context("cannot open it")?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .context("cannot read it as text")?;
    if text.len() as u64 > MAX_FILE_BYTES {
        bail!("longer than a token file ({MAX_FILE_BYTES} bytes at most)");
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_matches_and_nothing_shows_it() {
        let token = Token::from_text("s3cret-s3cret-s3cret").unwrap();
        assert!(token.matches("s3cret-s3cret-s3cret"));
        assert!(token.matches(" s3cret-s3cret-s3cret\n"));
        for wrong in [
            "",
            "s3cret",
            "s3cret-s3cret-s3creT",
            "s3cret-s3cret-s3cret-",
        ] {
            assert!(!token.matches(wrong), "{wrong:?}");
        }
        assert!(!format!("{token:?}").contains("s3cret"));
        let short = format!("{:#}", Token::from_text("s3cret").unwrap_err());
        assert!(!short.contains("s3cret"), "{short}");
    }
}
