//! The fingerprint key a PostgreSQL ledger is bound to: the first key bound is the ledger's,
//! on every replica and after a restart; another key is refused, and binders that race with
//! different keys bind exactly one.

use crate::support;

use mcp_replay_guard::{
    fingerprint::FingerprintKey,
    ledger::{LedgerError, PostgresLedger},
};
use support::*;

fn key(byte: u8) -> FingerprintKey {
    FingerprintKey::from_bytes(&[byte; 32]).unwrap()
}

/// A refusal: a storage error that says why and names no key material.
fn assert_refused(result: Result<(), LedgerError>, keys: &[&FingerprintKey]) {
    let error = result.expect_err("another key is refused");
    let message = error.to_string();
    assert!(matches!(error, LedgerError::Storage(_)), "{message}");
    assert!(
        message.contains("not the key this ledger was written with"),
        "{message}"
    );
    for key in keys {
        assert!(
            !message.contains(&hex(key)),
            "the message shows a key: {message}"
        );
    }
}

fn hex(key: &FingerprintKey) -> String {
    key.expose_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) async fn the_first_key_bound_is_the_ledgers_on_every_replica_and_after_a_restart() {
    let Some(schema) = TestSchema::new("key") else {
        return;
    };
    let (first, other) = (key(1), key(2));
    let a = schema.replica().await;
    a.bind_fingerprint_key(&first).await.unwrap();
    // Binding the same key again is a no-op, on this replica and on another.
    a.bind_fingerprint_key(&first).await.unwrap();
    let b = schema.replica().await;
    b.bind_fingerprint_key(&first).await.unwrap();
    assert_refused(b.bind_fingerprint_key(&other).await, &[&first, &other]);
    drop((a, b));

    // A replica started later, with the other key, is refused too; the ledger's key still
    // binds.
    let restarted = schema.replica().await;
    assert_refused(
        restarted.bind_fingerprint_key(&other).await,
        &[&first, &other],
    );
    restarted.bind_fingerprint_key(&first).await.unwrap();
    assert_eq!(
        schema
            .query_i64s(&restarted, "SELECT count(*) FROM {s}.mrg_fingerprint_key")
            .await,
        [1]
    );
    schema.drop(&restarted).await;
}

pub(crate) async fn binders_racing_with_different_keys_bind_exactly_one() {
    const BINDERS: u8 = 8;
    let Some(schema) = TestSchema::new("keyrace") else {
        return;
    };
    // Separate replicas (separate pools), each binding a key of its own at once.
    let mut replicas: Vec<PostgresLedger> = Vec::new();
    for _ in 0..BINDERS {
        replicas.push(schema.replica().await);
    }
    let binds: Vec<_> = replicas
        .iter()
        .enumerate()
        .map(|(n, replica)| {
            let replica = replica.clone();
            tokio::spawn(async move { replica.bind_fingerprint_key(&key(n as u8 + 10)).await })
        })
        .collect();
    let mut winners = Vec::new();
    for (n, bind) in binds.into_iter().enumerate() {
        match bind.await.unwrap() {
            Ok(()) => winners.push(n),
            Err(error) => assert!(
                error.to_string().contains("not the key"),
                "a binder failed otherwise: {error}"
            ),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let winner = key(winners[0] as u8 + 10);
    // Every replica now takes the winner's key and refuses every other.
    for (n, replica) in replicas.iter().enumerate() {
        replica.bind_fingerprint_key(&winner).await.unwrap();
        if n != winners[0] {
            assert_refused(
                replica.bind_fingerprint_key(&key(n as u8 + 10)).await,
                &[&winner],
            );
        }
    }
    schema.drop(&replicas[0]).await;
}
