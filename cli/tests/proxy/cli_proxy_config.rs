//! `replay-guard proxy --config FILE` (the built binary): several upstreams behind one proxy,
//! each under its own path prefix and its own target in the ledger; flags over the file; SIGHUP
//! re-reads it, and a broken one leaves the one before in place.

use crate::support;

use std::{path::Path, time::Duration};

use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use support::*;

/// The deploy sent to `url` on a connection of its own: its status and JSON-RPC answer (or
/// the body as text for a refusal).
async fn deploy_at(url: &str, id: i64) -> (StatusCode, Value) {
    let mut client = hyper_client();
    let response = send(&mut client, deploy_request(url, id, &[]))
        .await
        .expect("an answer");
    let status = response.status();
    if status == StatusCode::OK {
        return (
            status,
            read_jsonrpc_response(response, &json!(id)).await.unwrap(),
        );
    }
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        Value::String(String::from_utf8_lossy(&body).into_owned()),
    )
}

/// Starts the proxy with `--config config` and `extra`; its stderr goes to `log`.
async fn start(config: &Path, log: &Path, extra: &[&str]) -> Proxy {
    let mut command = replay_guard_command(
        ["proxy", "--config", &config.to_string_lossy()]
            .into_iter()
            .chain(extra.iter().copied()),
    );
    command
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(log).unwrap());
    start_proxy_command(command).await
}

fn route(prefix: &str, upstream: &str) -> String {
    format!("[[route]]\nprefix = \"{prefix}\"\nupstream = \"{upstream}\"\n")
}

/// Two routes are two upstreams and two targets: the same call through each runs once at each.
/// A path no route serves is 404 and reaches no upstream.
#[tokio::test]
async fn two_routes_are_two_targets_and_a_path_no_route_serves_is_404() {
    let (deploy_server, billing_server) = (json_server().await, json_server().await);
    let dir = temp_dir("cli-proxy-config", "routes");
    let ledger = dir.join("ledger.jsonl");
    let config = dir.join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nledger = \"{}\"\n\n{}\n{}",
            ledger.display(),
            route("/deploy", &deploy_server.url),
            route("/billing/", &billing_server.url),
        ),
    )
    .unwrap();
    let proxy = start(&config, &dir.join("stderr.log"), &[]).await;
    let base = proxy.url.trim_end_matches("/mcp").to_owned();

    let (status, first) = deploy_at(&format!("{base}/deploy/mcp"), 1).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, second) = deploy_at(&format!("{base}/billing/mcp"), 2).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(deploy_server.state.side_effects("deploy_release"), 1);
    assert_eq!(billing_server.state.side_effects("deploy_release"), 1);

    let before = (
        deploy_server.state.all_requests().len(),
        billing_server.state.all_requests().len(),
    );
    for path in ["/mcp", "/deployments/mcp", "/"] {
        let (status, body) = deploy_at(&format!("{base}{path}"), 3).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let after = (
        deploy_server.state.all_requests().len(),
        billing_server.state.all_requests().len(),
    );
    assert_eq!(after, before, "a path of no route was forwarded");

    let records = ledger_list(&ledger);
    let mut targets: Vec<&str> = records
        .iter()
        .map(|r| r["target"].as_str().unwrap())
        .collect();
    targets.sort_unstable();
    targets.dedup();
    assert_eq!(targets.len(), 2, "{records:#?}");
    proxy.stop().await;
}

/// SIGHUP re-reads the file: a route added is served. A broken file (bad TOML, an unknown
/// option) is refused with its line, the one before stays, and the proxy keeps serving.
#[tokio::test]
async fn sighup_reloads_the_configuration_and_a_broken_one_leaves_the_one_before() {
    let (first_server, second_server) = (json_server().await, json_server().await);
    let dir = temp_dir("cli-proxy-config", "reload");
    let config = dir.join("proxy.toml");
    let log = dir.join("stderr.log");
    let head = "listen = \"127.0.0.1:0\"\n\n";
    std::fs::write(&config, format!("{head}{}", route("/a", &first_server.url))).unwrap();
    let proxy = start(&config, &log, &[]).await;
    let base = proxy.url.trim_end_matches("/mcp").to_owned();
    let pid = nix::unistd::Pid::from_raw(proxy.child.id().unwrap() as i32);
    let hangup = || nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    assert_eq!(
        deploy_at(&format!("{base}/b/mcp"), 1).await.0,
        StatusCode::NOT_FOUND
    );

    std::fs::write(
        &config,
        format!(
            "{head}{}\n{}",
            route("/a", &first_server.url),
            route("/b", &second_server.url)
        ),
    )
    .unwrap();
    hangup();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, answer) = deploy_at(&format!("{base}/b/mcp"), 2).await;
        if status == StatusCode::OK {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reloaded: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(second_server.state.side_effects("deploy_release"), 1);

    for (broken, says) in [
        ("listen = \"127.0.0.1:0\"\n[[route]\n", "line 2"),
        ("listen = \"127.0.0.1:0\"\n\nno_such_option = 1\n", "line 3"),
    ] {
        std::fs::write(&config, broken).unwrap();
        hangup();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log).unwrap().contains(says) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no refusal naming {says}: {}",
                std::fs::read_to_string(&log).unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The one before stays: both routes still serve.
        let (status, answer) = deploy_at(&format!("{base}/a/mcp"), 3).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let (status, answer) = deploy_at(&format!("{base}/b/mcp"), 4).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("configuration not reloaded"), "{log}");
    proxy.stop().await;
}

/// A flag overrides the file; a file that names no option of the proxy, or routes and
/// `--upstream` both, stops it at start-up with the reason.
#[tokio::test]
async fn flags_override_the_file_and_a_bad_file_stops_the_proxy_with_the_reason() {
    let server = json_server().await;
    let dir = temp_dir("cli-proxy-config", "flags");
    let config = dir.join("proxy.toml");
    // The file says port 9; the flag's port 0 picks a free one, and wins.
    std::fs::write(
        &config,
        format!("listen = \"127.0.0.1:9\"\nupstream = \"{}\"\n", server.url),
    )
    .unwrap();
    let proxy = start(
        &config,
        &dir.join("stderr.log"),
        &["--listen", "127.0.0.1:0"],
    )
    .await;
    assert!(!proxy.url.contains(":9/"), "{}", proxy.url);
    let (status, answer) = deploy_at(&proxy.url, 1).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    proxy.stop().await;

    for (text, says) in [
        (
            "listen = \"127.0.0.1:0\"\nupstreams = \"http://x/mcp\"\n",
            "line 2: `upstreams`",
        ),
        (
            &format!(
                "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\n{}",
                server.url,
                route("/a", &server.url)
            ),
            "not both",
        ),
        (
            "listen = \"127.0.0.1:0\"\n[[route]]\nprefix = \"a\"\nupstream = \"http://x/mcp\"\n",
            "does not start with /",
        ),
    ] {
        std::fs::write(&config, text).unwrap();
        let run = replay_guard(&["proxy", "--config", &config.to_string_lossy()]).await;
        assert_eq!(run.code, 2, "{text}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{text}: {}", run.stderr);
    }
}
