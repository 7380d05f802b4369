//! The resolve form as it was posted (`application/x-www-form-urlencoded`): the outcome, the
//! note, the operator's name and the token. Read leniently (a missing field is empty) so that
//! a refused form can be shown again as it was typed, the token left out.

use std::borrow::Cow;

/// The longest note and operator name taken, in characters.
pub(super) const MAX_NOTE: usize = 4000;
pub(super) const MAX_OPERATOR: usize = 64;

/// What the form sent.
#[derive(Debug, Default, Clone)]
pub(super) struct ResolveForm {
    /// `applied` (`Some(true)`), `not_applied` (`Some(false)`), or neither.
    pub(super) applied: Option<bool>,
    pub(super) note: String,
    pub(super) operator: String,
    /// Never shown again, never logged.
    pub(super) token: String,
}

impl ResolveForm {
    /// The form in `body`. A field given twice counts once, the first time (a second `token`
    /// cannot stand in for the first).
    pub(super) fn parse(body: &[u8]) -> Self {
        let mut form = Self::default();
        let mut seen = Vec::new();
        for (name, value) in form_urlencoded::parse(body) {
            if seen.contains(&name) {
                continue;
            }
            match name.as_ref() {
                "outcome" => {
                    form.applied = match value.as_ref() {
                        "applied" => Some(true),
                        "not_applied" => Some(false),
                        _ => None,
                    }
                }
                "note" => form.note = value.into_owned(),
                "operator" => form.operator = value.into_owned(),
                "token" => form.token = value.into_owned(),
                _ => continue,
            }
            seen.push(name);
        }
        form
    }

    /// What is missing or too long, as a sentence; `None` when the form can be recorded.
    pub(super) fn problem(&self) -> Option<Cow<'static, str>> {
        if self.applied.is_none() {
            return Some("Choose applied or not applied.".into());
        }
        if self.note.trim().is_empty() {
            return Some("Write what you checked in the note.".into());
        }
        if self.note.chars().count() > MAX_NOTE {
            return Some(format!("The note is longer than {MAX_NOTE} characters.").into());
        }
        let operator = self.operator.trim();
        if operator.is_empty() {
            return Some("Give your name as the operator.".into());
        }
        if operator.chars().count() > MAX_OPERATOR || operator.chars().any(char::is_control) {
            return Some(
                format!("The operator's name is at most {MAX_OPERATOR} characters, on one line.")
                    .into(),
            );
        }
        None
    }

    /// The form as it is shown again: without the token.
    pub(super) fn without_token(mut self) -> Self {
        self.token = String::new();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_of_each_field_counts_and_problems_are_named() {
        let form = ResolveForm::parse(
            b"outcome=applied&note=checked+the+API&operator=alice&token=t%26x&token=other&x=y",
        );
        assert_eq!(form.applied, Some(true));
        assert_eq!(form.note, "checked the API");
        assert_eq!(form.token, "t&x");
        assert!(form.problem().is_none());
        assert!(form.clone().without_token().token.is_empty());
        for (body, problem) in [
            (&b"note=n&operator=a"[..], "applied or not"),
            (b"outcome=maybe&note=n&operator=a", "applied or not"),
            (b"outcome=not_applied&note=+&operator=a", "note"),
            (b"outcome=not_applied&note=n&operator=", "operator"),
            (b"outcome=not_applied&note=n&operator=a%0Ab", "one line"),
        ] {
            let said = ResolveForm::parse(body).problem().expect("a problem");
            assert!(said.contains(problem), "{said}");
        }
    }
}
