//! A tool implementation (or an action gateway) that calls a payments API through
//! reqwest-middleware, carrying the execution's `Idempotency-Key` and retrying only what is safe.
//!
//! The example starts its own tiny payments API on 127.0.0.1. The API honours
//! `Idempotency-Key` (a repeat gets the first answer, no second charge) and loses the response
//! of the first request it receives: it applies the charge, then drops the connection. The tool
//! runs inside `with_execution(key, …)`, so its POST carries the key; the retry middleware sees
//! the key and re-sends under it; the API answers the re-send from its key store.
//!
//! Run: `cargo run --example reqwest_gateway --features reqwest`. It exits non-zero if the API
//! saw a request without the key, a different key, or more than one charge.

use std::{
    collections::HashMap,
    net::SocketAddr,
    process::ExitCode,
    sync::{Arc, Mutex},
    time::Duration,
};

use mcp_replay_guard::{
    ExecutionId, IdempotencyKey,
    integrations::reqwest::{
        IdempotencyKeyMiddleware, ReplaySafeRetryMiddleware, is_ambiguous, with_execution,
    },
    replay_policy::Backoff,
};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// What the payments API saw.
#[derive(Debug, Default)]
struct Api {
    /// The `Idempotency-Key` of every request, in arrival order.
    keys: Vec<Option<String>>,
    /// Charges applied (side effects).
    charges: u32,
    /// Answers by key, for repeats.
    answers: HashMap<String, String>,
}

async fn start_payments_api() -> std::io::Result<(SocketAddr, Arc<Mutex<Api>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let api = Arc::new(Mutex::new(Api::default()));
    let state = api.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, state.clone()));
        }
    });
    Ok((addr, api))
}

/// One request per connection: read it whole, charge (once per key), answer, except that the
/// answer to the very first request is lost.
async fn serve(mut stream: TcpStream, api: Arc<Mutex<Api>>) {
    let Some((key, body)) = read_request(&mut stream).await else {
        return;
    };
    let (answer, lose_it) = {
        let mut api = api.lock().unwrap_or_else(|e| e.into_inner());
        api.keys.push(key.clone());
        let first_request = api.keys.len() == 1;
        let repeat = key.as_ref().and_then(|k| api.answers.get(k)).cloned();
        let answer = match repeat {
            Some(answer) => answer,
            None => {
                api.charges += 1;
                let answer = format!(r#"{{"charge":"ch_{}","request":{body}}}"#, api.charges);
                if let Some(key) = key {
                    api.answers.insert(key, answer.clone());
                }
                answer
            }
        };
        (answer, first_request)
    };
    if lose_it {
        // Charged, but the caller never hears of it.
        let _ = stream.set_zero_linger();
        return;
    }
    let response = format!(
        "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
        answer.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Reads the head and the `Content-Length` body; returns the `Idempotency-Key` and the body.
async fn read_request(stream: &mut TcpStream) -> Option<(Option<String>, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length").and_then(|v| v.parse().ok())?;
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned();
    Some((header("idempotency-key"), body))
}

/// The tool: charge the customer. It knows nothing of keys or retries; the client does.
async fn create_payment(
    client: &ClientWithMiddleware,
    api: &str,
    amount: u64,
) -> Result<String, reqwest_middleware::Error> {
    let response = client
        .post(format!("{api}/charges"))
        .header("content-type", "application/json")
        .body(format!(r#"{{"amount":{amount},"currency":"EUR"}}"#))
        .send()
        .await?
        .error_for_status()?;
    Ok(response.text().await?)
}

#[tokio::main]
async fn main() -> ExitCode {
    let (addr, api) = match start_payments_api().await {
        Ok(started) => started,
        Err(error) => {
            eprintln!("cannot start the payments API: {error}");
            return ExitCode::FAILURE;
        }
    };
    // No proxy: the API is on 127.0.0.1.
    let http = match reqwest::Client::builder().no_proxy().build() {
        Ok(http) => http,
        Err(error) => {
            eprintln!("cannot build the HTTP client: {error}");
            return ExitCode::FAILURE;
        }
    };
    let client = ClientBuilder::new(http)
        // The key first, so that the retry middleware sees it.
        .with(IdempotencyKeyMiddleware::new())
        .with(
            ReplaySafeRetryMiddleware::new()
                .max_attempts(3)
                .backoff(Backoff::exponential(
                    Duration::from_millis(50),
                    Duration::from_millis(500),
                )),
        )
        .build();

    // In a real tool this is the `Idempotency-Key` of the incoming `tools/call`, which the
    // guard on the agent's side set to the execution ID.
    let execution = ExecutionId::new();
    let key = IdempotencyKey::from(execution);
    println!("tool call under execution {execution}");
    let result = with_execution(
        key.clone(),
        create_payment(&client, &format!("http://{addr}"), 500),
    )
    .await;

    match &result {
        Ok(answer) => println!("the tool got: {answer}"),
        Err(error) if is_ambiguous(error) => println!("the charge may have happened: {error}"),
        Err(error) => println!("the charge failed: {error}"),
    }
    let api = api.lock().unwrap_or_else(|e| e.into_inner());
    println!("the payments API received {} request(s):", api.keys.len());
    for (i, k) in api.keys.iter().enumerate() {
        println!(
            "  #{}: Idempotency-Key: {}",
            i + 1,
            k.as_deref().unwrap_or("(none)")
        );
    }
    println!("charges applied: {}", api.charges);

    let mut ok = result.is_ok();
    if api.keys.is_empty() || api.keys.iter().any(|k| k.as_deref() != Some(key.as_str())) {
        eprintln!("FAIL: a request reached the API without the execution's Idempotency-Key");
        ok = false;
    }
    if api.charges != 1 {
        eprintln!("FAIL: {} charges for one tool call", api.charges);
        ok = false;
    }
    if ok {
        println!("ok: one tool call, one charge, every attempt under {key}");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
