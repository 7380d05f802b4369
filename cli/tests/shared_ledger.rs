//! One PostgreSQL ledger shared by processes of the command: two proxies on one database and
//! schema with one key file, `resolve` from a third process, and what is refused (another key,
//! no key, a key file for a file ledger) without ever showing a password or a key.
//!
//! The server comes from `MCP_REPLAY_GUARD_POSTGRES_URL` (for example
//! `postgres://postgres@127.0.0.1:5432/mrg_dev`); unset, the tests that need it return at once
//! after saying so, except under CI (`CI` set), where they fail. Each works in a schema of its
//! own (`?schema=` of the ledger's URL), dropped when it passes.

mod support;

use std::path::{Path, PathBuf};

use http::StatusCode;
use serde_json::{Value, json};
use support::*;

const ALICE: &str = "Bearer alice-token";
const BOB: &str = "Bearer bob-token";

/// The URL of the test's schema, as `--ledger` takes it.
fn ledger_url(schema: &TestSchema) -> String {
    let separator = if schema.url.contains('?') { '&' } else { '?' };
    format!("{}{separator}schema={}", schema.url, schema.name)
}

/// A key file (64 hex digits of `byte`) in `dir`, mode 0600 as the file ledger writes its own.
fn key_file(dir: &Path, byte: u8) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("key-{byte}"));
    std::fs::write(&path, format!("{}\n", hex(byte))).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn hex(byte: u8) -> String {
    format!("{byte:02x}").repeat(32)
}

/// The deploy sent through `proxy` by the client with `authorization`, read to its answer.
async fn deploy(proxy: &Proxy, id: i64, authorization: &str) -> Value {
    let (_client, response) = deploy_as(&proxy.url, id, &[("authorization", authorization)]).await;
    assert_eq!(response.status(), StatusCode::OK);
    read_jsonrpc_response(response, &json!(id)).await.unwrap()
}

/// What the guard says of an answer it gave itself: its `mcp_replay_guard` block.
fn guard_says(answer: &Value) -> &Value {
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    &structured(answer).unwrap_or_else(|| panic!("no structured content: {answer}"))["mcp_replay_guard"]
}

/// `replay-guard --json resolve --ledger URL --key-file KEY ID FLAG --note …`, from a process
/// of its own; the record it prints.
async fn resolve(url: &str, key: &Path, id: &str, flag: &str) -> Value {
    let key = key.to_string_lossy();
    let run = replay_guard(&[
        "--json",
        "resolve",
        "--ledger",
        url,
        "--key-file",
        &key,
        id,
        flag,
        "--note",
        "checked the deploy API",
        "--operator",
        "alice",
    ])
    .await;
    assert_eq!(run.code, 0, "{run:#?}");
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run:#?}"))
}

/// Alice's answer is lost behind proxy A: her repeat through proxy B, another process on the
/// same database, is held (one effect), because both proxies fingerprint and tag her alike
/// with the shared key. `resolve --applied` from a third process settles it for both: her
/// next repeat through either is answered from the ledger, never run. Bob's lost answer,
/// resolved not applied, runs again on his next repeat. The ledger lists, shows and verifies
/// from yet another process.
#[tokio::test]
async fn a_lost_answer_is_held_by_every_proxy_on_one_database_until_resolve_settles_it() {
    let Some(schema) = TestSchema::new("cli_shared") else {
        return;
    };
    let url = ledger_url(&schema);
    let dir = temp_dir("cli-shared-ledger", "held");
    let key = key_file(&dir, 7);
    let server = json_server().await;
    let shared = ["--ledger", &url, "--key-file", &key.to_string_lossy()].map(str::to_owned);
    let shared: Vec<&str> = shared.iter().map(String::as_str).collect();
    let a = start_proxy(&server.url, &shared).await;
    let b = start_proxy(&server.url, &shared).await;

    // Alice: the tool runs, its answer is lost on the way to proxy A; A answers honestly.
    server.state.lose_next_response("deploy_release");
    let first = deploy(&a, 1, ALICE).await;
    let held = guard_says(&first).clone();
    assert_eq!(held["state"], "needs_review", "{first}");
    let alices = held["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    // Her repeat through proxy B: the same execution, held, not run again.
    let repeat = deploy(&b, 2, ALICE).await;
    assert_eq!(
        guard_says(&repeat)["execution_id"],
        alices.as_str(),
        "{repeat}"
    );
    assert_eq!(guard_says(&repeat)["state"], "needs_review", "{repeat}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);

    // An operator settles it from a third process: it was applied.
    let record = resolve(&url, &key, &alices, "--applied").await;
    assert_eq!(record["state"], "resolved_applied", "{record:#}");
    for (proxy, id) in [(&a, 3), (&b, 4)] {
        let settled = deploy(proxy, id, ALICE).await;
        assert_eq!(
            guard_says(&settled)["execution_id"],
            alices.as_str(),
            "{settled}"
        );
        assert_eq!(
            guard_says(&settled)["state"],
            "resolved_applied",
            "{settled}"
        );
    }
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);

    // Bob: lost behind proxy B, held behind A, resolved not applied: his next repeat runs.
    server.state.lose_next_response("deploy_release");
    let bobs = guard_says(&deploy(&b, 5, BOB).await)["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(bobs, alices);
    let repeat = deploy(&a, 6, BOB).await;
    assert_eq!(guard_says(&repeat)["state"], "needs_review", "{repeat}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    let record = resolve(&url, &key, &bobs, "--not-applied").await;
    assert_eq!(record["state"], "resolved_not_applied", "{record:#}");
    let ran = deploy(&a, 7, BOB).await;
    assert_eq!(ran["result"]["isError"], false, "{ran}");
    assert_eq!(structured(&ran).unwrap()["deployment"], 3, "{ran}");
    assert_eq!(server.state.side_effects("deploy_release"), 3);

    // The reading commands on the same database, with --ledger and without a key.
    let list = replay_guard(&["--json", "ledger", "list", "--ledger", &url]).await;
    assert_eq!(list.code, 0, "{list:#?}");
    let records: Vec<Value> = serde_json::from_str(&list.stdout).unwrap();
    assert_eq!(records.len(), 3, "{records:#?}");
    let show = replay_guard(&["audit", "show", "--ledger", &url, &alices]).await;
    assert_eq!(show.code, 0, "{show:#?}");
    assert!(show.stdout.contains("checked the deploy API"), "{show:#?}");
    let verify = replay_guard(&["audit", "verify", "--ledger", &url]).await;
    assert_eq!(verify.code, 0, "{verify:#?}");
    assert!(verify.stdout.starts_with("ok: "), "{verify:#?}");
    // The positional form too.
    let verify = replay_guard(&["audit", "verify", &url]).await;
    assert_eq!(verify.code, 0, "{verify:#?}");

    drop((a, b));
    let ledger = schema.replica().await;
    schema.drop(&ledger).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A key that is not the one the ledger is bound to is refused before anything is sent (exit
/// 2, with what to do), by `call`, `proxy` and `resolve`; so is a PostgreSQL ledger without a
/// key, a key file that is not a key, and `--key-file` with a file ledger. The variable gives
/// the key as the file does. No message shows the key.
#[tokio::test]
async fn a_wrong_or_missing_key_is_refused_and_never_shown() {
    let Some(schema) = TestSchema::new("cli_key") else {
        return;
    };
    let url = ledger_url(&schema);
    let dir = temp_dir("cli-shared-ledger", "key");
    let (right, wrong) = (key_file(&dir, 7), key_file(&dir, 8));
    let (right, wrong) = (right.to_string_lossy(), wrong.to_string_lossy());
    let server = json_server().await;
    let args = deploy_args().to_string();
    let call_with = |extra: &[&str]| {
        let mut argv = call_argv(&server.url, "deploy_release", &args, &["--ledger", &url]);
        argv.extend(extra.iter().map(|a| (*a).to_owned()));
        argv
    };

    // The first key given binds the ledger.
    let bound = run(&call_with(&["--key-file", &right])).await;
    assert_eq!(bound.code, 0, "{bound:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    let refused = run(&call_with(&["--key-file", &wrong])).await;
    assert_refused(&refused, "not the key this ledger was written with");
    let missing = run(&call_with(&[])).await;
    assert_refused(&missing, "--key-file");
    assert_refused(&missing, "REPLAY_GUARD_FINGERPRINT_KEY");
    let not_hex = dir.join("not-hex");
    std::fs::write(&not_hex, "s3cret-not-a-key").unwrap();
    let garbled = run(&call_with(&["--key-file", &not_hex.to_string_lossy()])).await;
    assert_refused(&garbled, "hex");
    assert!(!garbled.stderr.contains("s3cret"), "{garbled:#?}");
    let proxy = run(&proxy_argv(
        &server.url,
        &["--ledger", &url, "--key-file", &wrong],
    ))
    .await;
    assert_refused(&proxy, "not the key this ledger was written with");
    let resolve = replay_guard(&[
        "resolve",
        "--ledger",
        &url,
        "--key-file",
        &wrong,
        &bound.execution_id(),
        "--not-applied",
        "--note",
        "x",
    ])
    .await;
    assert_refused(&resolve, "not the key this ledger was written with");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    for run in [&refused, &missing, &garbled, &proxy, &resolve] {
        for key in [hex(7), hex(8)] {
            assert!(
                !run.stderr.contains(&key) && !run.stdout.contains(&key),
                "{run:#?}"
            );
        }
    }

    // The variable: the wrong key is refused, the right one is the ledger's (the call was
    // delivered, so the same call again is a new execution, and runs).
    let from_variable = |byte: u8| {
        let mut command = replay_guard_command(call_with(&[]));
        command.env("REPLAY_GUARD_FINGERPRINT_KEY", hex(byte));
        command
    };
    let output = from_variable(8).output().await.unwrap();
    assert_refused(
        &Run::from_output(&output),
        "not the key this ledger was written with",
    );
    let output = from_variable(7).output().await.unwrap();
    let again = Run::from_output(&output);
    assert_eq!(again.code, 0, "{again:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);

    // A file ledger keeps its own key: --key-file is refused, nothing is sent.
    let file = dir.join("ledger.jsonl");
    let argv = call_argv(
        &server.url,
        "deploy_release",
        &args,
        &["--ledger", &file.to_string_lossy(), "--key-file", &right],
    );
    assert_refused(&run(&argv).await, "a file ledger keeps its own key");
    assert_eq!(server.state.side_effects("deploy_release"), 2);

    let ledger = schema.replica().await;
    schema.drop(&ledger).await;
    let _ = std::fs::remove_dir_all(dir);
}

/// A PostgreSQL URL with a password is never shown: not when the server refuses the
/// connection, not when the URL or its schema is malformed, not by a command that reads files
/// only. Each is exit 2 with the reason. (Needs no PostgreSQL server.)
#[tokio::test]
async fn a_password_in_the_ledger_url_is_never_shown() {
    const SECRET: &str = "s3cret-pw";
    let dir = temp_dir("cli-shared-ledger", "password");
    let key = key_file(&dir, 7);
    let key = key.to_string_lossy();
    let refused = format!("postgres://u:{SECRET}@127.0.0.1:1/db");
    let twice = format!("postgresql://u:{SECRET}@127.0.0.1:1/db?schema=a&schema=b");
    let bad_schema = format!("postgres://u:{SECRET}@127.0.0.1:1/db?schema=Bad-Name");
    let garbled = format!("postgres://u:{SECRET}@127.0.0.1:port/db");
    let call = |ledger: &str| {
        call_argv(
            "http://127.0.0.1:1/mcp",
            "deploy_release",
            "{}",
            &["--ledger", ledger, "--key-file", &key],
        )
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (call(&refused), "127.0.0.1:1"),
        (call(&twice), "twice"),
        (call(&bad_schema), "schema name"),
        (call(&garbled), "URL"),
        (
            proxy_argv(
                "http://127.0.0.1:1/mcp",
                &["--ledger", &refused, "--key-file", &key],
            ),
            "127.0.0.1:1",
        ),
        (
            strings(&["ledger", "list", "--ledger", &refused]),
            "127.0.0.1:1",
        ),
        (strings(&["audit", "verify", &refused]), "127.0.0.1:1"),
        (
            strings(&["audit", "show", "--ledger", &refused]),
            "127.0.0.1:1",
        ),
        (
            strings(&["audit", "head", "--ledger", &refused]),
            "ledger file",
        ),
        (
            strings(&[
                "resolve",
                &refused,
                "act_01J00000000000000000000000",
                "--applied",
                "--note",
                "x",
            ]),
            "127.0.0.1:1",
        ),
    ];
    for (argv, reason) in cases {
        let run = run(&argv).await;
        assert_refused(&run, reason);
        assert!(
            !run.stderr.contains(SECRET) && !run.stdout.contains(SECRET),
            "{argv:?} shows the password: {run:#?}"
        );
    }
    let help = replay_guard(&["call", "--help"]).await;
    assert!(help.stdout.contains("postgres://"), "{help:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

fn strings(argv: &[&str]) -> Vec<String> {
    argv.iter().map(|a| (*a).to_owned()).collect()
}

/// `replay-guard proxy --listen 127.0.0.1:0 --upstream UPSTREAM EXTRA…`.
fn proxy_argv(upstream: &str, extra: &[&str]) -> Vec<String> {
    proxy_args(upstream, extra)
}

/// `replay-guard ARGV…` to its end; a run that does not end within a minute (a proxy that
/// started when it should have refused) fails the test.
async fn run(argv: &[String]) -> Run {
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    replay_guard_within(&argv, std::time::Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("{argv:?} did not end"))
        .0
}

/// Exit 2, an error on stderr that says `reason`, nothing on stdout.
fn assert_refused(run: &Run, reason: &str) {
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains(reason), "expected {reason:?}: {run:#?}");
    assert!(
        run.stdout.trim().is_empty() || run.stdout.contains("\"exit_code\""),
        "{run:#?}"
    );
}
