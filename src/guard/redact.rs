//! `redact_url`: a URL as it may be recorded, logged or printed.

/// A URL as it may be recorded, logged or printed: scheme, host, port and path, without the
/// userinfo (`user:secret@`), the query (`?token=…`) and the fragment, any of which may carry a
/// credential. Works on text that does not parse as a URL too (what a user typed), so an error
/// about a bad URL never repeats its secret.
///
/// ```
/// use mcp_replay_guard::tools::redact_url;
///
/// assert_eq!(
///     redact_url("http://agent:s3cr3t@127.0.0.1:8000/mcp?token=t0k"),
///     "http://…@127.0.0.1:8000/mcp?…"
/// );
/// assert_eq!(redact_url("http://127.0.0.1:8000/mcp"), "http://127.0.0.1:8000/mcp");
/// assert_eq!(redact_url("agent:s3cr3t@bad host/mcp"), "…@bad host/mcp");
/// // Without `//` no authority can be told apart: nothing up to an `@` is shown.
/// assert_eq!(redact_url("http:/\\agent:s3cr3t@host/mcp"), "http:/…@host/mcp");
/// ```
pub fn redact_url(url: &str) -> String {
    let url = url.trim();
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let had_query = rest.contains(['?', '#']);
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let host = authority.rsplit('@').next().unwrap_or("");
    // An `@` after the authority (a URL typed without `//`, a `\` for a `/`) may still end
    // a userinfo: whatever comes before it is not shown.
    let (path, path_cut) = match path.rfind('@') {
        Some(at) => (&path[at + 1..], true),
        None => (path, false),
    };
    let mut out = String::new();
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    if host.len() < authority.len() {
        out.push_str("…@");
    }
    out.push_str(host);
    if path_cut {
        out.push_str("/…@");
    }
    out.push_str(path);
    if had_query {
        out.push_str("?…");
    }
    out
}
