//! The frame of every page: its head, its one style sheet and a header that says whether the
//! page can resolve. Every value is written through `maud`, which escapes it: text recorded by
//! agents (tool names, reasons, targets) and operators (notes, names) is shown, never run.

use std::sync::LazyLock;

use base64::Engine as _;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use sha2::{Digest, Sha256};

/// The one style sheet, inline: the Content-Security-Policy allows exactly it, by its hash.
const STYLE: &str = "\
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2530;background:#f6f7f9}\
header{background:#1d2530;color:#fff;padding:.6em 1.2em;display:flex;gap:1.5em;align-items:baseline}\
header a{color:#fff;font-weight:600;text-decoration:none}\
main{padding:1em 1.2em;max-width:78em}\
.mode{font-size:.9em;opacity:.85}\
table{border-collapse:collapse;background:#fff;width:100%}\
th,td{text-align:left;padding:.35em .6em;border-bottom:1px solid #e1e4e8;vertical-align:top}\
th{font-weight:600;background:#eef0f3}\
code,.id{font-family:ui-monospace,monospace;font-size:.92em;overflow-wrap:anywhere}\
.cols{display:flex;flex-wrap:wrap;gap:1.2em;align-items:flex-start}\
.cols>section{background:#fff;border:1px solid #e1e4e8;padding:.6em 1em;flex:1 1 28em;min-width:0}\
dl{display:grid;grid-template-columns:max-content 1fr;gap:.25em 1em;margin:.4em 0}\
dt{font-weight:600}dd{margin:0;overflow-wrap:anywhere}\
ol.answers>li{margin-bottom:.6em}ol.answers .q{font-weight:600}\
.picture{background:#fff;border:1px solid #e1e4e8;overflow-x:auto;margin:.6em 0 1em}\
svg text{font:12px system-ui,sans-serif;fill:#1d2530}\
svg .axis{stroke:#8a94a3;stroke-width:2}\
svg .gap{fill:#5b6675;font-size:11px}svg .time{fill:#5b6675;font-size:11px}\
svg .mark circle{stroke:#fff;stroke-width:2;fill:#4a6fa5}\
svg .good circle{fill:#2e8540}svg .doubt circle{fill:#d98200}svg .bad circle{fill:#c0392b}\
.state{font-weight:600}.held{color:#b36b00}.notice{background:#fff8e1;border:1px solid #f0d58c;padding:.5em .8em}\
.refused{background:#fdecea;border:1px solid #f5b7b1;padding:.5em .8em}\
form{display:grid;gap:.5em;max-width:36em}textarea{min-height:4em}\
textarea,input[type=text],input[type=password]{width:100%;box-sizing:border-box}\
input,textarea,button{font:inherit}button{justify-self:start;padding:.3em 1.2em}";

/// `'sha256-…'`: the style sheet's source in the Content-Security-Policy.
pub(super) static STYLE_SOURCE: LazyLock<String> = LazyLock::new(|| {
    let digest = Sha256::digest(STYLE.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
});

/// A page: `title`, and `body` under the header. `resolving` says whether the page was given
/// a token (without one it is read-only, and says so on every page).
pub(super) fn page(title: &str, resolving: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · replay-guard review" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    a href="/" { "Held executions" }
                    span.mode {
                        @if resolving {
                            "resolving with the token given at start-up"
                        } @else {
                            "read-only: started without a token"
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// A refusal or a failure, as a page: `heading` and what to do next.
pub(super) fn problem(heading: &str, message: &str, resolving: bool) -> Markup {
    page(
        heading,
        resolving,
        html! {
            h1 { (heading) }
            p.refused { (message) }
            p { a href="/" { "Back to the held executions" } }
        },
    )
}
