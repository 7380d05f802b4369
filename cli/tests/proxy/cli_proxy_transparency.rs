//! `replay-guard proxy` (the built binary) is the server its clients talk to: it checks `Host`
//! and `Origin` itself (DNS rebinding), refuses a 2026-07-28 request without its standard
//! headers as a server must (never repairing it), and passes on the upstream's answer to a
//! protocol revision it does not speak. Against rmcp's own server; its side-effect counters
//! and request log are the ground truth.

use crate::support;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::json;
use support::*;

fn with_header(mut request: Request<Full<Bytes>>, name: &str, value: &str) -> Request<Full<Bytes>> {
    request.headers_mut().insert(
        http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
        value.parse().unwrap(),
    );
    request
}

/// A page on another site that a rebinding DNS name points at the proxy sends its Host, or
/// its Origin: refused 403 before anything is sent or recorded. The loopback names of the
/// proxy's port, and a loopback origin, are served; `--allowed-host` / `--allowed-origin` name
/// others. (Before, the proxy sent the upstream its own authority and relayed the Origin, so
/// the call ran and was recorded.)
#[tokio::test]
async fn a_foreign_host_or_origin_is_refused_before_anything_is_sent() {
    let server = json_server().await;
    let dir = temp_dir("cli-proxy-transparency", "rebinding");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;
    let port = proxy
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/mcp")
        .to_owned();

    let mut client = hyper_client();
    for (name, value) in [
        ("host", "evil.example.com".to_owned()),
        ("host", format!("evil.example.com:{port}")),
        ("origin", "http://evil.example.com".to_owned()),
        ("origin", "null".to_owned()),
    ] {
        let request = with_header(deploy_request(&proxy.url, 1, &[]), name, &value);
        let response = send(&mut client, request).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{name}: {value}");
        let refusal = read_response_to_end(response).await;
        let says = if name == "host" { "Host" } else { "Origin" };
        let message = refusal["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{refusal}");
    }
    assert_eq!(server.state.all_requests().len(), 0);
    assert_eq!(server.state.side_effects("deploy_release"), 0);
    assert!(!ledger.exists() || ledger_list(&ledger).is_empty());

    // The proxy's own names pass.
    let host = format!("localhost:{port}");
    let origin = format!("http://127.0.0.1:{port}");
    let request = with_header(
        with_header(deploy_request(&proxy.url, 2, &[]), "host", &host),
        "origin",
        &origin,
    );
    let response = send(&mut client, request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let answer = read_jsonrpc_response(response, &json!(2)).await.unwrap();
    assert!(answer.get("result").is_some(), "{answer}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    // Flags name the hosts and origins served.
    let named = start_proxy(
        &server.url,
        &[
            "--allowed-host",
            "mcp.example.com",
            "--allowed-origin",
            "https://app.example.com",
        ],
    )
    .await;
    let allowed = with_header(
        with_header(
            deploy_request(&named.url, 3, &[]),
            "host",
            "mcp.example.com",
        ),
        "origin",
        "https://app.example.com",
    );
    let response = send(&mut hyper_client(), allowed).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    let loopback_now_foreign = with_header(deploy_request(&named.url, 4, &[]), "host", &host);
    let response = send(&mut hyper_client(), loopback_now_foreign)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    let _ = std::fs::remove_dir_all(dir);
}

/// A 2026-07-28 request without `Mcp-Method` or `Mcp-Name` is refused 400 with -32020 and
/// nothing sent, as the specification asks of a server; one whose header disagrees with its
/// body too, with the era's -32020 (not -32600). (Before, the proxy filled the missing headers
/// in from the body and the call ran: 200.)
#[tokio::test]
async fn a_request_without_its_standard_headers_is_refused_never_repaired() {
    let server = json_server().await;
    let proxy = start_proxy(&server.url, &[]).await;
    let mut client = hyper_client();
    type Change = fn(Request<Full<Bytes>>) -> Request<Full<Bytes>>;
    let cases: [(&str, Change); 3] = [
        ("no Mcp-Method", |mut request| {
            request.headers_mut().remove("mcp-method");
            request
        }),
        ("no Mcp-Name", |mut request| {
            request.headers_mut().remove("mcp-name");
            request
        }),
        ("another Mcp-Name", |request| {
            with_header(request, "mcp-name", "other_tool")
        }),
    ];
    for (id, (case, change)) in (1..).zip(cases) {
        let response = send(&mut client, change(deploy_request(&proxy.url, id, &[])))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{case}");
        let refusal = read_response_to_end(response).await;
        assert_eq!(refusal["id"], id, "{case}: {refusal}");
        assert_eq!(refusal["error"]["code"], -32020, "{case}: {refusal}");
    }
    assert_eq!(server.state.all_requests().len(), 0);
    assert_eq!(server.state.side_effects("deploy_release"), 0);

    // A request with its headers goes on as it came.
    let response = send(&mut client, deploy_request(&proxy.url, 9, &[]))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.state.side_effects("deploy_release"), 1);
}

/// A revision the proxy does not speak: a request that cannot call a tool goes to the
/// upstream, and the client gets the upstream's own answer (its -32022 names the revisions it
/// speaks, so a client can fall back); a `tools/call` in it is refused unsent with -32022 and
/// the revisions the proxy speaks. (Before, the proxy answered both itself: -32600, no
/// `data.supported`.)
#[tokio::test]
async fn an_unsupported_revision_gets_the_upstreams_answer() {
    const FUTURE: &str = "2099-01-01";
    let server = json_server().await;
    let proxy = start_proxy(&server.url, &[]).await;
    let mut meta = stateless_meta();
    meta["io.modelcontextprotocol/protocolVersion"] = json!(FUTURE);
    let discover =
        json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}});

    let direct = send(
        &mut hyper_client(),
        post(&server.url, None, FUTURE, discover.clone()),
    )
    .await
    .unwrap();
    let direct_status = direct.status();
    let direct = read_response_to_end(direct).await;
    assert_eq!(direct["error"]["code"], -32022, "{direct}");
    assert!(direct["error"]["data"]["supported"].is_array(), "{direct}");

    let proxied = send(
        &mut hyper_client(),
        post(&proxy.url, None, FUTURE, discover),
    )
    .await
    .unwrap();
    assert_eq!(proxied.status(), direct_status);
    let proxied = read_response_to_end(proxied).await;
    assert_eq!(proxied, direct);

    let mut call = stateless_tool_call_body(2, "deploy_release", deploy_args());
    call["params"]["_meta"] = meta;
    let response = send(&mut hyper_client(), post(&proxy.url, None, FUTURE, call))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let refusal = read_response_to_end(response).await;
    assert_eq!(refusal["id"], 2, "{refusal}");
    assert_eq!(refusal["error"]["code"], -32022, "{refusal}");
    assert_eq!(refusal["error"]["data"]["requested"], FUTURE, "{refusal}");
    let supported = refusal["error"]["data"]["supported"].as_array().unwrap();
    assert!(
        supported.contains(&json!(STATELESS_PROTOCOL_VERSION)),
        "{refusal}"
    );
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 0);
    assert_eq!(server.state.side_effects("deploy_release"), 0);
}
