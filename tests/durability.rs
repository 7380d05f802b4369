//! What the file ledger makes durable, and when, under a real guard: a hyper client stacked with
//! `GuardLayer` against rmcp's own Streamable HTTP server on 127.0.0.1, the ledger writing
//! through a disk that counts its writes and syncs (feature `simulation`). The count taken as
//! the request leaves the guard is the proof of "one sync before the request leaves".

use mcp_replay_guard_test_support as support;

use std::{
    fs::File,
    io::{self, Write},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    guard::{Authorization, AuthorizationRequest, Authorize, GuardLayer, GuardRequestBody},
    ledger::{Disk, FileLedger, Ledger},
};
use serde_json::json;
use support::*;
use tower::{Layer, util::MapRequestLayer};

/// The operating system's disk, counted.
#[derive(Debug, Default)]
struct CountingDisk {
    writes: AtomicUsize,
    syncs: AtomicUsize,
    /// The directories synced, in order.
    dir_syncs: Mutex<Vec<std::path::PathBuf>>,
}

impl CountingDisk {
    fn counts(&self) -> (usize, usize) {
        (
            self.writes.load(Ordering::SeqCst),
            self.syncs.load(Ordering::SeqCst),
        )
    }
}

impl Disk for CountingDisk {
    fn write(&self, mut file: &File, bytes: &[u8]) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        file.write_all(bytes)
    }

    fn sync(&self, file: &File) -> io::Result<()> {
        self.syncs.fetch_add(1, Ordering::SeqCst);
        file.sync_data()
    }

    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        file.set_len(len).and_then(|()| file.sync_all())
    }

    fn sync_dir(&self, dir: &std::path::Path) -> io::Result<()> {
        self.dir_syncs.lock().unwrap().push(dir.to_path_buf());
        File::open(dir)?.sync_all()
    }
}

#[derive(Debug)]
struct AllowAll;

#[async_trait::async_trait]
impl Authorize for AllowAll {
    async fn authorize(&self, _: AuthorizationRequest<'_>) -> Authorization {
        Authorization::Allow
    }
}

struct Run {
    /// (writes, syncs) of the ledger each time a request left the guard.
    at_send: Vec<(usize, usize)>,
    /// (writes, syncs) once every answer was read to its end.
    after: (usize, usize),
    /// (writes, syncs) once the ledger was dropped.
    dropped: (usize, usize),
    /// The events of the last execution, by name.
    events: Vec<&'static str>,
    side_effects: usize,
}

/// Runs `calls` new executions of an irreversible tool, one after the other, through a guard
/// over a counted file ledger.
async fn run(calls: u64, authorizer: bool) -> Run {
    let server = TestServer::start().await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let dir = temp_dir("durability", "ledger");
    let path = dir.join("ledger.jsonl");
    let disk = Arc::new(CountingDisk::default());
    let ledger = FileLedger::open_on(&path, disk.clone()).unwrap();
    let (opened_writes, opened_syncs) = disk.counts();
    let registry = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()
        .unwrap();
    let mut layer = GuardLayer::new(
        ledger.clone(),
        registry,
        FingerprintKey::from_bytes(&[9; 32]).unwrap(),
    )
    .actor(Actor::from("signed-process:com.example.agent"))
    .intent_scope(IntentScope::from("run:durability"));
    if authorizer {
        layer = layer.authorizer(AllowAll);
    }
    let at_send = Arc::new(Mutex::new(Vec::new()));
    let counted = {
        let (disk, at_send) = (disk.clone(), at_send.clone());
        MapRequestLayer::new(move |request: http::Request<GuardRequestBody>| {
            let (writes, syncs) = disk.counts();
            at_send
                .lock()
                .unwrap()
                .push((writes - opened_writes, syncs - opened_syncs));
            request
        })
    };
    let mut client = layer.layer(counted.layer(hyper_client_with_body::<GuardRequestBody>()));
    let mut last = None;
    for n in 0..calls {
        let args = json!({"service": "catalog", "version": format!("2026.12.{n}")});
        let request = post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(n as i64 + 1, "deploy_release", args),
        );
        // Read to its end: that is when the answer counts as delivered.
        let response = read_response_to_end(send(&mut client, request).await.unwrap()).await;
        assert!(response.get("result").is_some(), "{response}");
        let id = only_latest(&ledger).await;
        delivered(&ledger, id).await;
        last = Some(id);
    }
    let (writes, syncs) = disk.counts();
    let after = (writes - opened_writes, syncs - opened_syncs);
    let last = last.unwrap();
    let events = ledger
        .events(last)
        .await
        .unwrap()
        .iter()
        .map(|e| e.kind.name())
        .collect();
    drop(client);
    drop(layer);
    drop(ledger);
    let (writes, syncs) = disk.counts();
    let run = Run {
        at_send: at_send.lock().unwrap().clone(),
        after,
        dropped: (writes - opened_writes, syncs - opened_syncs),
        events,
        side_effects: server.state.side_effects("deploy_release"),
    };
    // Reopened from the file: every line written, `delivered` included, is there (in the
    // kernel's page cache, which is what a process crash leaves).
    let reopened = FileLedger::open(&path).unwrap();
    let events = reopened.events(last).await.unwrap();
    assert_eq!(
        events.last().map(|e| e.kind.name()),
        Some("delivered"),
        "the last execution's `delivered` was not in the file after the ledger was dropped"
    );
    run
}

/// Waits (bounded) for `delivered`: it is recorded by a task of its own once the caller has
/// read the answer to its end, so it may land just after the call returns.
async fn delivered(ledger: &FileLedger, id: mcp_replay_guard::ExecutionId) {
    for _ in 0..500 {
        let record = ledger.get(id).await.unwrap().unwrap();
        if record.delivered_at().is_some() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{id} was never recorded delivered");
}

/// The execution most recently accepted.
async fn only_latest(ledger: &FileLedger) -> mcp_replay_guard::ExecutionId {
    let mut records = ledger.list().await.unwrap();
    records.sort_by_key(|r| r.accepted_at());
    records.last().unwrap().execution_id()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sync_before_the_request_leaves_and_two_per_execution() {
    let run = run(1, false).await;
    assert_eq!(run.side_effects, 1);
    assert_eq!(
        run.events,
        ["accepted", "dispatched", "completed", "delivered"]
    );
    // `accepted` and `dispatched` went in one write, synced once, before the request left.
    assert_eq!(run.at_send, [(1, 1)]);
    // Then `completed` (synced) and `delivered` (written, synced with the next write).
    assert_eq!(run.after, (3, 2));
    // Not even dropping the ledger syncs `delivered` on its own: the kernel has it.
    assert_eq!(run.dropped, (3, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_execution_syncs_the_last_delivered() {
    let run = run(3, false).await;
    assert_eq!(run.side_effects, 3);
    assert_eq!(run.at_send.len(), 3);
    for (n, &(writes, syncs)) in run.at_send.iter().enumerate() {
        assert_eq!(
            (writes, syncs),
            (3 * n + 1, 2 * n + 1),
            "execution {n}: one write and one sync before its request left"
        );
    }
    assert_eq!(run.after, (9, 6), "two syncs per execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_hook_records_authorized_before_the_dispatch() {
    let run = run(1, true).await;
    assert_eq!(run.side_effects, 1);
    assert_eq!(
        run.events,
        [
            "accepted",
            "authorized",
            "dispatched",
            "completed",
            "delivered"
        ]
    );
    // The hook is asked between the claim and the dispatch, so those are three writes.
    assert_eq!(run.at_send, [(3, 3)]);
}

/// A power loss right after a new ledger's first synced `dispatched` must not lose the file:
/// its name is made durable (its directory synced) once, when it is created, and so is its
/// key file's; a reopen creates nothing and syncs no directory.
#[test]
fn a_ledger_and_its_key_file_sync_their_directory_at_creation_and_every_writing_open() {
    let dir = temp_dir("durability", "dir-sync");
    let path = dir.join("ledger.jsonl");
    let disk = Arc::new(CountingDisk::default());
    let ledger = FileLedger::open_on(&path, disk.clone()).unwrap();
    assert_eq!(
        *disk.dir_syncs.lock().unwrap(),
        vec![dir.clone()],
        "the new file"
    );
    ledger.fingerprint_key().unwrap();
    assert_eq!(
        *disk.dir_syncs.lock().unwrap(),
        [dir.clone(), dir.clone()],
        "the new key file"
    );
    drop(ledger);
    // A writer syncs the directory before it appends: the name it opened may have been put in
    // place by a process killed before its own directory sync (a compaction's rename), and a
    // power loss would take it back with every write acknowledged under it.
    let reopened = FileLedger::open_on(&path, disk.clone()).unwrap();
    reopened.fingerprint_key().unwrap();
    assert_eq!(
        *disk.dir_syncs.lock().unwrap(),
        [dir.clone(), dir.clone(), dir.clone()],
        "the reopened ledger's name; the key file is not new"
    );
    drop(reopened);
    std::fs::remove_dir_all(dir).unwrap();
}
