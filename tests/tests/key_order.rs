//! Key lanes (`order_key`): within one host, the messages of one key run one
//! at a time and in stream order while different keys run in parallel, and
//! a message retried is never overtaken by a later one of its key.
//!
//! 200 keys with 10 version-numbered updates each (2,000 messages; a key's
//! versions ten messages apart in the stream), `concurrency = 8`, the
//! `behave` guest's `version` op, which rejects a version that does not
//! follow its row's. One update in 20 retries on its first delivery (naked
//! for 200 ms), and 100 of the updates are published a second time after
//! every original. Every key ends at version 10, no message was
//! dead-lettered (the guest never saw one out of order), every copy was a
//! duplicate, and the receipts are exactly the 2,000 updates.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use std::time::Duration;

const HANDLER: &str = "versions";
const KEYS: i64 = 200;
const VERSIONS: i64 = 10;
const COPIES: i64 = 100;

fn update(key: i64, version: i64) -> String {
    serde_json::json!({
        "op": "version",
        "event_id": format!("k{key}-v{version}"),
        "key": key,
        "version": version,
        "retry_first": (key * VERSIONS + version) % 20 == 7,
    })
    .to_string()
}

async fn keys_keep_their_order(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    spec.extra
        .push_str("order_key = \"json:/key\"\nconcurrency = 8\nmax_deliver = 3\n");
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("max_connections = 4", "max_connections = 10"),
    )
    .unwrap();
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    // Blocks of ten keys: each key's next version is ten messages on.
    let mut retried = 0;
    for block in 0..KEYS / 10 {
        for version in 1..=VERSIONS {
            for key in block * 10..block * 10 + 10 {
                if (key * VERSIONS + version) % 20 == 7 {
                    retried += 1;
                }
                publish(&js, "accounts.credit", &update(key, version), &[]).await;
            }
        }
    }
    for i in 0..COPIES {
        let (key, version) = (i * 2 % KEYS, i % VERSIONS + 1);
        publish(&js, "accounts.credit", &update(key, version), &[]).await;
    }
    let total = (KEYS * VERSIONS + COPIES) as u64;
    let s = host
        .wait_for_within(
            HANDLER,
            "every message settled",
            Duration::from_secs(120),
            |s| s.processed + s.duplicates + s.dead_lettered >= total,
        )
        .await;
    assert_eq!(db.dead_letters(HANDLER).await, vec![], "{s}");
    assert_eq!(
        (s.processed, s.duplicates, s.retried, s.dead_lettered),
        ((KEYS * VERSIONS) as u64, COPIES as u64, retried, 0),
        "{s}"
    );
    for key in 0..KEYS {
        assert_eq!(db.balance(key).await, Some(VERSIONS), "key {key}");
    }
    assert_eq!(db.receipts(HANDLER).await, KEYS * VERSIONS);
    host.stop().await;
}
on_both_databases!(keys_keep_their_order, keys_keep_their_order);
