//! `replay-guard review`, run as the built binary over a real ledger file and read by a real
//! headless Chromium: the held queue, an execution's timeline drawn in order, text recorded by
//! agents shown as text (never run), resolving refused without the token, from another origin
//! and while the owner runs the call, and done with it; the security headers on every answer.
//! A screenshot of an execution's page is left at `target/review-page.png`.

use std::time::Duration;

use bytes::Bytes;
use fantoccini::{Client, Locator};
use http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use mcp_replay_guard::{
    ExecutionId,
    execution::{EventKind, LedgerEvent, Timestamp},
    ledger::{FileLedger, Ledger},
};

use super::{claim, support};

/// The name one held execution's tool was recorded under: an agent's to choose.
const SCRIPT_TOOL: &str = "<script>alert(1)</script>";
const TOKEN: &str = "review-token-0123456789abcdef";

/// The executions of the ledger the page reads.
struct Executions {
    /// Held, accepted three hours ago.
    older: ExecutionId,
    /// Held, accepted two hours ago, every text it recorded a piece of HTML.
    scripted: ExecutionId,
    delivered: ExecutionId,
    /// Dispatched by an owner that is alive: the ledger handle below holds it.
    live: ExecutionId,
    _live_owner: FileLedger,
}

fn at(id: ExecutionId, millis: u64, kind: EventKind) -> LedgerEvent {
    LedgerEvent {
        execution_id: id,
        at: Timestamp::from_millis(millis),
        kind,
    }
}

async fn review_ledger(path: &std::path::Path) -> Executions {
    let now = Timestamp::now().as_millis();
    let ledger = FileLedger::open(path).unwrap();
    let held = |byte, accepted: u64| {
        let mut held = claim(byte);
        held.owner = "guard:gone".into();
        held.at = Timestamp::from_millis(accepted);
        held.retention = Duration::from_secs(86_400);
        held
    };
    let dispatched = |id| support::dispatched(id, 1, Some("guard:gone"));
    let unknown = |reason: &str| EventKind::Unknown {
        target_status: None,
        reason: reason.into(),
        attempt: None,
    };

    let t = now - 3 * 3_600_000;
    let older = ledger
        .claim(held(11, t))
        .await
        .unwrap()
        .record()
        .execution_id();
    for (offset, kind) in [
        (5, EventKind::Authorized),
        (10, dispatched(older)),
        (2_010, unknown("stream cut")),
        (
            2_020,
            EventKind::NeedsReview {
                reason: "irreversible".into(),
            },
        ),
    ] {
        ledger.append(at(older, t + offset, kind)).await.unwrap();
    }

    let t = now - 2 * 3_600_000;
    let mut scripted_claim = held(12, t);
    scripted_claim.tool = SCRIPT_TOOL.into();
    scripted_claim.actor = "\"><img src=x onerror=alert(2)>".into();
    scripted_claim.target = "<svg onload=alert(3)>".into();
    scripted_claim.intent_scope = "<iframe srcdoc=\"<script>alert(4)</script>\">".into();
    let scripted = ledger
        .claim(scripted_claim)
        .await
        .unwrap()
        .record()
        .execution_id();
    // No authorization hook: dispatched with no `authorized` event.
    for (offset, kind) in [
        (1_200, dispatched(scripted)),
        (31_200, unknown("<img src=x onerror=alert(5)>")),
        (
            31_250,
            EventKind::NeedsReview {
                reason: "<b onmouseover=alert(6)>irreversible</b>".into(),
            },
        ),
    ] {
        ledger.append(at(scripted, t + offset, kind)).await.unwrap();
    }

    let delivered = ledger
        .claim(claim(13))
        .await
        .unwrap()
        .record()
        .execution_id();
    for kind in [
        EventKind::Authorized,
        support::dispatched(delivered, 1, Some("guard:cli-test")),
        EventKind::Completed {
            target_status: 200,
            is_error: false,
            result_reference: None,
        },
        EventKind::Delivered {
            jsonrpc_id: Some(1.into()),
        },
    ] {
        ledger
            .append(support::event_now(delivered, kind))
            .await
            .unwrap();
    }
    // Its owners are gone with it.
    drop(ledger);

    let live_owner = FileLedger::open(path).unwrap();
    let mut live_claim = claim(14);
    live_claim.owner = "guard:alive".into();
    let live = live_owner
        .claim(live_claim)
        .await
        .unwrap()
        .record()
        .execution_id();
    live_owner
        .append(support::event_now(
            live,
            support::dispatched(live, 1, Some("guard:alive")),
        ))
        .await
        .unwrap();
    Executions {
        older,
        scripted,
        delivered,
        live,
        _live_owner: live_owner,
    }
}

/// Starts `replay-guard review ARGS…` and waits for its start line; the process and its URL.
async fn start_review(args: &[&str]) -> (tokio::process::Child, String) {
    let mut command = support::replay_guard_command(["review"].iter().chain(args));
    command.env_remove("REPLAY_GUARD_REVIEW_TOKEN");
    let mut child = command.spawn().expect("the review page starts");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncBufReadExt::read_line(&mut tokio::io::BufReader::new(stdout), &mut line),
    )
    .await
    .expect("the review page says where it listens")
    .unwrap();
    let url = line
        .trim()
        .strip_prefix("review listening on ")
        .unwrap_or_else(|| panic!("not the start line: {line:?}"))
        .to_owned();
    (child, url)
}

/// `(status, headers, body)` of a plain HTTP request, no browser in between.
async fn http(request: Request<Full<Bytes>>) -> (StatusCode, HeaderMap, String) {
    let response = support::hyper_client()
        .request(request)
        .await
        .expect("an answer");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("a body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn post_form(
    url: &str,
    id: ExecutionId,
    form: &str,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(format!("{url}/executions/{id}/resolve"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .body(Full::new(Bytes::from(form.to_owned())))
        .unwrap()
}

fn assert_secured(headers: &HeaderMap, what: &str) {
    let csp = headers
        .get(header::CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("{what}: no Content-Security-Policy"));
    for directive in [
        "default-src 'none'",
        "style-src 'sha256-",
        "img-src 'self' data:",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ] {
        assert!(csp.contains(directive), "{what}: {directive} not in {csp}");
    }
    for (name, value) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        assert_eq!(
            headers.get(&name).map(|v| v.as_bytes()),
            Some(value.as_bytes()),
            "{what}: {name}"
        );
    }
}

/// The state `replay-guard --json ledger list` reads for `id`.
async fn state_of(ledger: &str, id: ExecutionId) -> String {
    let records = support::ledger_records(ledger).await;
    let record = records
        .iter()
        .find(|r| r["execution_id"] == id.to_string())
        .unwrap_or_else(|| panic!("{id} is not listed"));
    record["state"].as_str().unwrap().to_owned()
}

/// Nothing an agent recorded became an element, and nothing raised an alert.
async fn assert_nothing_ran(browser: &Client, svgs: usize, page: &str) {
    let injected = browser
        .find_all(Locator::Css("script, img, iframe, b"))
        .await
        .unwrap();
    assert!(
        injected.is_empty(),
        "{page}: {} injected elements",
        injected.len()
    );
    let drawn = browser.find_all(Locator::Css("svg")).await.unwrap();
    assert_eq!(drawn.len(), svgs, "{page}: the only SVG is the timeline");
    assert!(
        browser.get_alert_text().await.is_err(),
        "{page}: an alert is open"
    );
}

/// Fills the resolve form and sends it; waits for the page it leads to.
async fn resolve_in(browser: &Client, outcome: &str, note: &str, operator: &str, token: &str) {
    let radio = format!("input[name=outcome][value={outcome}]");
    browser
        .find(Locator::Css(&radio))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    for (field, value) in [
        ("textarea[name=note]", note),
        ("input[name=operator]", operator),
        ("input[name=token]", token),
    ] {
        let input = browser.find(Locator::Css(field)).await.unwrap();
        input.clear().await.unwrap();
        input.send_keys(value).await.unwrap();
    }
    let old = browser.find(Locator::Css("html")).await.unwrap();
    browser
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The answer replaces the page: wait until the old one is gone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while old.tag_name().await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the form's answer never came"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if browser.find(Locator::Css("main h1")).await.is_err() {
        panic!(
            "the form's answer is not a page: {}",
            browser.source().await.unwrap_or_default()
        );
    }
}

async fn text_of(browser: &Client, css: &str) -> String {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_review_page_shows_the_held_queue_and_resolves_only_with_the_token() {
    if support::browser_or_skip().is_none() {
        return;
    }
    let dir = support::temp_dir("cli", "review");
    let path = dir.join("ledger.jsonl");
    let executions = review_ledger(&path).await;
    let p = path.to_str().unwrap();
    let token_file = dir.join("review.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();

    // Not on a network address unless asked, and the error says why.
    let refused = support::replay_guard(&["review", "--ledger", p, "--listen", "0.0.0.0:0"]).await;
    assert_eq!(refused.code, 2, "{refused:#?}");
    assert!(
        refused.stderr.contains("not a loopback address")
            && refused.stderr.contains("--allow-remote"),
        "{}",
        refused.stderr
    );

    let (_review, url) = start_review(&[
        "--ledger",
        p,
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        token_file.to_str().unwrap(),
    ])
    .await;
    let driver = support::Chromedriver::start().await;
    let browser = driver.headless().await;

    // The queue: the two held executions, oldest first; nothing else.
    browser.goto(&format!("{url}/")).await.unwrap();
    let mut listed = Vec::new();
    for row in browser.find_all(Locator::Css("tr.held-row")).await.unwrap() {
        let id = row
            .find(Locator::Css("a.id"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let tool = row
            .find(Locator::Css("td.tool"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        listed.push((id, tool));
    }
    assert_eq!(
        listed,
        [
            (executions.older.to_string(), "deploy_release".to_owned()),
            (executions.scripted.to_string(), SCRIPT_TOOL.to_owned()),
        ]
    );
    assert_nothing_ran(&browser, 0, "the queue").await;

    // The execution's page, reached by its link: the timeline in order, every text as text.
    let link = format!("a[href='/executions/{}']", executions.scripted);
    browser
        .find(Locator::Css(&link))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait()
        .for_element(Locator::Css("svg.timeline"))
        .await
        .unwrap();
    let mut drawn = Vec::new();
    for mark in browser.find_all(Locator::Css("svg g.mark")).await.unwrap() {
        let name = mark
            .find(Locator::Css("text.name"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let x: f64 = mark
            .find(Locator::Css("circle"))
            .await
            .unwrap()
            .attr("cx")
            .await
            .unwrap()
            .unwrap()
            .parse()
            .unwrap();
        drawn.push((name, x));
    }
    let names: Vec<&str> = drawn.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["accepted", "dispatched", "unknown", "needs_review"]);
    assert!(
        drawn.windows(2).all(|w| w[0].1 < w[1].1),
        "left to right in time: {drawn:?}"
    );
    let mut gaps = Vec::new();
    for gap in browser
        .find_all(Locator::Css("svg text.gap"))
        .await
        .unwrap()
    {
        gaps.push(gap.text().await.unwrap());
    }
    assert_eq!(gaps, ["+1.2 s", "+30 s", "+50 ms"]);
    assert_eq!(text_of(&browser, "code.tool").await, SCRIPT_TOOL);
    assert_eq!(
        text_of(&browser, "dd.target").await,
        "<svg onload=alert(3)>"
    );
    assert_eq!(
        text_of(&browser, "dd.reason").await,
        "<b onmouseover=alert(6)>irreversible</b>"
    );
    let investigation = text_of(&browser, "section.investigation").await;
    for said in [
        "one (guard:gone)",
        "no authorization hook configured; dispatched at",
        "unknown (<img src=x onerror=alert(5)>)",
    ] {
        assert!(
            investigation.contains(said),
            "{said:?} not in {investigation}"
        );
    }
    assert_nothing_ran(&browser, 1, "the execution").await;
    let screenshot = support::repo_root().join("target/review-page.png");
    std::fs::write(&screenshot, browser.screenshot().await.unwrap()).unwrap();

    // Without the token, then with a wrong one: refused, nothing written.
    let held = executions.scripted;
    let note = "<script>alert(7)</script> the deploy API lists the release";
    for token in ["", "wrong-token-wrong-token"] {
        resolve_in(&browser, "applied", note, "alice", token).await;
        let refused = text_of(&browser, "p.refused").await;
        assert!(refused.contains("token is missing or wrong"), "{refused}");
        assert_eq!(state_of(p, held).await, "needs_review");
        // The form comes back as it was typed, the token left out.
        let typed = browser
            .find(Locator::Css("textarea[name=note]"))
            .await
            .unwrap()
            .prop("value")
            .await
            .unwrap();
        assert_eq!(typed.as_deref(), Some(note));
    }
    // The same form, posted without a browser: 403.
    let form = "outcome=applied&note=x&operator=mallory&token=";
    let (status, headers, _) = http(post_form(&url, held, form, &[])).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_secured(&headers, "a refused form");

    // With the right token but from another origin, or a cross-site fetch: refused.
    let form = format!("outcome=applied&note=x&operator=mallory&token={TOKEN}");
    let own = url.replace("http://", "");
    for headers in [
        &[("origin", "http://evil.example")][..],
        &[("origin", "null")],
        &[("sec-fetch-site", "cross-site")],
        &[("host", "evil.example"), ("origin", "http://evil.example")],
    ] {
        let (status, _, body) = http(post_form(&url, held, &form, headers)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{headers:?}: {body}");
    }
    // A huge body is refused before it is read.
    let huge = format!("note={}&{form}", "x".repeat(100 * 1024));
    let (status, _, _) = http(post_form(
        &url,
        held,
        &huge,
        &[("origin", &format!("http://{own}"))],
    ))
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(state_of(p, held).await, "needs_review");

    // A live owner's call: the library refuses, the page says why, nothing is written.
    browser
        .goto(&format!("{url}/executions/{}", executions.live))
        .await
        .unwrap();
    resolve_in(&browser, "not_applied", "looked", "alice", TOKEN).await;
    let refused = text_of(&browser, "p.refused").await;
    assert!(refused.contains("is still running"), "{refused}");
    assert_eq!(state_of(p, executions.live).await, "dispatched");

    // With the token: resolved, and the page it returns to says so.
    browser
        .goto(&format!("{url}/executions/{held}"))
        .await
        .unwrap();
    resolve_in(&browser, "applied", note, "alice", TOKEN).await;
    assert_eq!(
        browser.current_url().await.unwrap().path(),
        format!("/executions/{held}"),
        "redirected to the execution's page"
    );
    assert_eq!(state_of(p, held).await, "resolved_applied");
    assert_eq!(text_of(&browser, "span.state").await, "resolved_applied");
    let investigation = text_of(&browser, "section.investigation").await;
    assert!(
        investigation.contains(&format!("settled as applied by operator:alice ({note})")),
        "{investigation}"
    );
    assert_nothing_ran(&browser, 1, "the resolved execution").await;
    browser.goto(&format!("{url}/")).await.unwrap();
    assert_eq!(
        browser
            .find_all(Locator::Css("tr.held-row"))
            .await
            .unwrap()
            .len(),
        1
    );

    // Every answer carries the security headers: a page, a missing one, a foreign Host.
    for (path, host, expected) in [
        ("/", None, StatusCode::OK),
        (
            &*format!("/executions/{}", executions.delivered),
            None,
            StatusCode::OK,
        ),
        ("/nowhere", None, StatusCode::NOT_FOUND),
        ("/", Some("evil.example"), StatusCode::FORBIDDEN),
    ] {
        let mut request = Request::get(format!("{url}{path}"));
        if let Some(host) = host {
            request = request.header(header::HOST, host);
        }
        let (status, headers, _) = http(request.body(Full::new(Bytes::new())).unwrap()).await;
        assert_eq!(status, expected, "{path} {host:?}");
        assert_secured(&headers, path);
    }
    browser.close().await.unwrap();

    // Without a token the page is read-only, says so, and refuses every form.
    let (_read_only, url) = start_review(&["--ledger", p, "--listen", "127.0.0.1:0"]).await;
    let (status, _, body) = http(
        Request::get(format!("{url}/executions/{}", executions.older))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("read-only") && !body.contains("<form"),
        "{body}"
    );
    let (status, _, _) = http(post_form(&url, executions.older, &form, &[])).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(state_of(p, executions.older).await, "needs_review");
    std::fs::remove_dir_all(dir).unwrap();
}
