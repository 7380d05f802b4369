//! A proxy that compacts its own ledger while thousands of calls go through it
//! (`--compact-above`): the file stays within its bound, the chain verifies through every
//! archive the compactions left, and every result kept for a repeat is still handed back after
//! them. The proxy's resident memory is printed as it goes (and not asserted: it is the
//! operating system's figure).

use crate::support;

use std::path::Path;

use serde_json::{Value, json};
use support::*;

/// Calls through the proxy (`MRG_COMPACTION_SOAK_CALLS` for a longer run).
const CALLS: usize = 6_000;
/// Callers at once, each on a connection of its own.
const CALLERS: usize = 16;
/// `--compact-above`.
const ABOVE: u64 = 512 * 1024;
/// The largest the file may be: the bound and what can be appended between two looks at its
/// size (200 ms at this machine's rate, about 2,000 executions a second of 1.7 KB each, is
/// about 700 KB).
const BOUND: u64 = 3 * ABOVE;

/// The bulk of the calls leave their retention at once; the payments kept for a repeat stay.
const POLICY: &str = r#"
[tools.deploy_release]
class = "irreversible"
link_window = "100ms"
retention = "100ms"

[tools.create_payment]
class = "irreversible"
link_window = "10m"
retention = "10m"
"#;

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn archives(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|entry| {
            let name = entry.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".archive")
        })
        .count()
}

/// A payment of `amount` through the proxy on `client`'s connection.
async fn pay(client: &mut HyperClient, url: &str, id: i64, amount: i64) -> Value {
    let body = stateless_tool_call_body(
        id,
        "create_payment",
        json!({"amount": amount, "currency": "eur"}),
    );
    let request = post(url, None, STATELESS_PROTOCOL_VERSION, body);
    let response = send(client, request).await.expect("the proxy answers");
    read_jsonrpc_response(response, &json!(id)).await.unwrap()
}

/// One caller's share of the deploys, each a new intent, on one kept-alive connection (each
/// answer is delivered by the next request).
async fn deploys(url: String, caller: usize, first: usize, n: usize) {
    let mut client = hyper_client();
    for call in first..first + n {
        let version = format!("{caller}.{call}");
        let body = stateless_tool_call_body(
            call as i64,
            "deploy_release",
            json!({"service": "catalog", "version": version}),
        );
        let request = post(&url, None, STATELESS_PROTOCOL_VERSION, body);
        let response = send(&mut client, request).await.expect("the proxy answers");
        let answer = read_jsonrpc_response(response, &json!(call)).await.unwrap();
        assert!(
            answer["result"]["structuredContent"]["deployment"].is_u64(),
            "{answer}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_compacts_under_traffic_stays_small_and_keeps_every_result() {
    let calls: usize = std::env::var("MRG_COMPACTION_SOAK_CALLS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CALLS);
    let dir = shm_temp_dir("cli-proxy", "compaction-soak");
    let ledger = dir.join("ledger.jsonl");
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let server = json_server().await;
    let proxy = start_proxy_logged(
        &server.url,
        &[
            "--ledger",
            &ledger.to_string_lossy(),
            "--policy",
            &policy.to_string_lossy(),
            "--actor",
            "soak",
            "--compact-above",
            "512KiB",
        ],
        "warn,replay_guard::compaction=info",
    )
    .await;
    let pid = proxy.child.id().unwrap();
    let started = std::time::Instant::now();
    // The file's length, looked at every few milliseconds while the calls go on.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (ledger, done) = (ledger.clone(), done.clone());
        std::thread::spawn(move || {
            let mut largest = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                largest = largest.max(std::fs::metadata(&ledger).map_or(0, |m| m.len()));
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            largest
        })
    };

    // Rounds of deploys from every caller at once; in each, one payment whose answer stays
    // undelivered (its connection held open), so a repeat is handed the kept result.
    let rounds = 30;
    let per_caller = calls / rounds / CALLERS;
    let mut held = Vec::new();
    let mut rss = Vec::new();
    for round in 0..rounds {
        let tasks: Vec<_> = (0..CALLERS)
            .map(|caller| {
                let first = (round * CALLERS + caller) * per_caller;
                tokio::spawn(deploys(proxy.url.clone(), caller, first, per_caller))
            })
            .collect();
        let mut client = hyper_client();
        let amount = 100 + round as i64;
        let paid = pay(&mut client, &proxy.url, -(round as i64) - 1, amount).await;
        let payment = paid["result"]["structuredContent"]["payment"].clone();
        assert!(payment.is_u64(), "{paid}");
        held.push((client, amount, payment));
        for task in tasks {
            task.await.unwrap();
        }
        rss.push(vm_rss_kib(pid));
    }
    let elapsed = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let largest = sampler.join().unwrap();
    assert!(largest <= BOUND, "the ledger reached {largest} bytes");

    // Every payment is handed its kept result again, from another connection, without a
    // second payment; compactions came between each and its repeat.
    for (n, (_client, amount, payment)) in held.iter().enumerate() {
        let again = pay(&mut hyper_client(), &proxy.url, 10_000 + n as i64, *amount).await;
        assert_eq!(
            again["result"]["structuredContent"]["payment"], *payment,
            "{again}"
        );
    }
    assert_eq!(server.state.side_effects("create_payment"), rounds);
    assert_eq!(
        server.state.side_effects("deploy_release"),
        rounds * CALLERS * per_caller
    );
    let stderr = proxy.stop().await;
    let compactions = stderr.matches("compacted the ledger").count();
    let archived = archives(&dir);
    assert!(
        archived >= 2,
        "{archived} archives; the proxy said:\n{stderr}"
    );
    assert!(!stderr.contains("was not compacted"), "{stderr}");

    let verify = replay_guard(&["audit", "verify", &ledger.to_string_lossy()]).await;
    assert_eq!(verify.code, 0, "{verify:?}");
    let warm = rss[rss.len() / 5];
    println!(
        "{} calls in {:.1} s; {compactions} compactions, {archived} archives; the ledger at most \
         {largest} bytes (bound {BOUND}, --compact-above {ABOVE}), {} at the end; VmRSS after \
         a fifth {warm} KiB, at most {} KiB, at the end {} KiB",
        rounds * (CALLERS * per_caller + 2),
        elapsed.as_secs_f64(),
        std::fs::metadata(&ledger).unwrap().len(),
        rss.iter().max().unwrap(),
        rss.last().unwrap()
    );
    let _ = std::fs::remove_dir_all(dir);
}
