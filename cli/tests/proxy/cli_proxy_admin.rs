//! The admin listener of `replay-guard proxy` (the built binary): health and readiness apart
//! from the clients' listener, which forwards none of its paths.

use crate::support;

use http::StatusCode;
use support::*;

/// `--admin-listen`: `/healthz` answers while the process serves; `/readyz` is ready while the
/// ledger takes appends and the upstream answers, and says which is not. The clients' listener
/// answers those paths 404 and forwards nothing.
#[tokio::test]
async fn the_admin_listener_says_healthy_and_ready_and_the_clients_listener_forwards_none_of_it() {
    let server = json_server().await;
    let dir = temp_dir("cli-proxy-auth", "admin");
    let ledger = dir.join("ledger.jsonl");
    let port = free_port();
    let admin = format!("127.0.0.1:{port}");
    let proxy = start_proxy(
        &server.url,
        &[
            "--ledger",
            &ledger.to_string_lossy(),
            "--admin-listen",
            &admin,
        ],
    )
    .await;
    let admin = format!("http://{admin}");
    assert_eq!(
        get_text(&format!("{admin}/healthz")).await,
        (StatusCode::OK, "ok\n".into())
    );
    let (status, body) = get_text(&format!("{admin}/readyz")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = get_text(&format!("{admin}/mcp")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let before = server.state.all_requests().len();
    let base = proxy.url.trim_end_matches("/mcp").to_owned();
    for path in ["/healthz", "/readyz", "/metrics", "/readyz/"] {
        let (status, _) = get_text(&format!("{base}{path}")).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{path} on the clients' listener"
        );
    }
    assert_eq!(
        server.state.all_requests().len(),
        before,
        "an admin path was forwarded"
    );

    // The ledger file gone from its directory: appends would reach no file. Not ready.
    std::fs::remove_file(&ledger).unwrap();
    let (status, body) = get_text(&format!("{admin}/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("ledger file"), "{body}");
    proxy.stop().await;

    // An upstream that is not there: not ready, and it says so.
    let port = free_port();
    let admin = format!("127.0.0.1:{port}");
    let dead = format!("http://127.0.0.1:{}/mcp", free_port());
    let proxy = start_proxy(&dead, &["--admin-listen", &admin]).await;
    let (status, body) = get_text(&format!("http://{admin}/readyz")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("upstream"), "{body}");
    assert_eq!(
        get_text(&format!("http://{admin}/healthz")).await.0,
        StatusCode::OK
    );
    proxy.stop().await;
}
