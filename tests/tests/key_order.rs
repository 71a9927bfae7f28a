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
//!
//! The same workload through a stop and a kill: a host process is stopped
//! (SIGTERM) once 500 updates are applied, the next one SIGKILLed at 1,200,
//! a third finishes. What waited in the first host's lanes is given back in
//! stream order; the host after the kill finds deliveries out and waits
//! `ack_wait` for what the killed host held to come back before it pulls
//! anything newer. Every key still ends at its last version with no dead
//! letter.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::chaos::{HostProcess, Probe};
use idem_tests::*;
use std::path::Path;
use std::time::{Duration, Instant};

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

/// Publishes the workload: blocks of ten keys, so that each key's next
/// version is ten messages on; then the copies. Returns how many updates
/// retry on their first delivery.
async fn publish_workload(js: &async_nats::jetstream::Context) -> u64 {
    let mut retried = 0;
    for block in 0..KEYS / 10 {
        for version in 1..=VERSIONS {
            for key in block * 10..block * 10 + 10 {
                if (key * VERSIONS + version) % 20 == 7 {
                    retried += 1;
                }
                publish(js, "accounts.credit", &update(key, version), &[]).await;
            }
        }
    }
    for i in 0..COPIES {
        let (key, version) = (i * 2 % KEYS, i % VERSIONS + 1);
        publish(js, "accounts.credit", &update(key, version), &[]).await;
    }
    retried
}

/// The handler with key lanes, `concurrency = 8`, and `extra` lines (which
/// may set their own `retry_delay`).
fn config(dir: &Path, nats: &Nats, db: &TestDb, extra: &str) -> std::path::PathBuf {
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    if extra.contains("retry_delay") {
        spec.extra.clear();
    }
    spec.extra.push_str(&format!(
        "order_key = \"json:/key\"\nconcurrency = 8\nmax_deliver = 3\n{extra}"
    ));
    let cfg = write_config(dir, nats, db, &[spec]);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("max_connections = 4", "max_connections = 10"),
    )
    .unwrap();
    cfg
}

async fn keys_keep_their_order(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &nats, &db, "");
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    let retried = publish_workload(&js).await;
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

fn host_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_idem-test-host"))
}

/// The durable consumer's counts, for a failure's message.
async fn consumer_state(js: &async_nats::jetstream::Context) -> String {
    let consumer: Result<async_nats::jetstream::consumer::PullConsumer, _> =
        match js.get_stream("ACCOUNTS").await {
            Ok(stream) => stream.get_consumer(HANDLER).await,
            Err(e) => return format!("no stream: {e}"),
        };
    match consumer {
        Ok(mut c) => match c.info().await {
            Ok(i) => format!(
                "ack_pending {}, pending {}, redelivered {}, waiting {}, delivered {:?}, ack_floor {:?}",
                i.num_ack_pending,
                i.num_pending,
                i.num_redelivered,
                i.num_waiting,
                i.delivered,
                i.ack_floor
            ),
            Err(e) => format!("no info: {e}"),
        },
        Err(e) => format!("no consumer: {e}"),
    }
}

/// Waits until `n` updates are applied (the host must stay up; 120 s at
/// most); else panics with what is missing, the dead letters, the
/// consumer's counts and the hosts' logs.
async fn until_applied(
    probe: &Probe,
    db: &TestDb,
    js: &async_nats::jetstream::Context,
    host: &mut HostProcess,
    n: i64,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if probe.receipts(HANDLER).await.unwrap_or(0) >= n {
            return;
        }
        if host.exited().is_some() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let applied: std::collections::BTreeSet<String> =
        db.receipt_ids(HANDLER).await.into_iter().collect();
    let missing: Vec<String> = (0..KEYS)
        .flat_map(|k| (1..=VERSIONS).map(move |v| format!("k{k}-v{v}")))
        .filter(|id| !applied.contains(id))
        .take(20)
        .collect();
    let dir = host.log.parent().unwrap().to_path_buf();
    let mut logs = String::new();
    for name in ["first", "second", "third"] {
        let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        logs.push_str(&format!("--- {name}:\n{text}\n"));
    }
    panic!(
        "not {n} applied ({} are; missing {missing:?}; dead letters {:?}; the consumer: {}); logs:\n{logs}",
        applied.len(),
        db.dead_letters(HANDLER).await,
        consumer_state(js).await,
    );
}

async fn order_holds_through_a_stop_and_a_kill(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &nats,
        &db,
        "ack_wait = \"4s\"\ndeadline = \"2s\"\n",
    );
    let probe = Probe::new(&db);
    let mut first = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "first");
    let started = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&first.log)
        .unwrap_or_default()
        .contains("every handler is consuming")
    {
        assert!(
            first.exited().is_none() && Instant::now() < started,
            "the host did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let js = nats.jetstream().await;
    publish_workload(&js).await;
    until_applied(&probe, &db, &js, &mut first, 500).await;
    let ended = first.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    let log = std::fs::read_to_string(dir.path().join("first.log")).unwrap();
    assert!(
        log.contains("messages not run given back in stream order"),
        "the stop found no message waiting in a lane; log:\n{log}"
    );
    let mut second = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "second");
    until_applied(&probe, &db, &js, &mut second, 1200).await;
    second.sigkill();
    let mut third = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "third");
    until_applied(&probe, &db, &js, &mut third, KEYS * VERSIONS).await;
    let third_log = std::fs::read_to_string(&third.log).unwrap();
    assert!(
        third_log.contains("deliveries of the consumer are out and not acked"),
        "the host after the kill did not wait for what the killed one held; log:\n{third_log}"
    );
    assert_eq!(
        db.dead_letters(HANDLER).await,
        vec![],
        "first host's log:\n{log}"
    );
    for key in 0..KEYS {
        assert_eq!(db.balance(key).await, Some(VERSIONS), "key {key}");
    }
    assert_eq!(db.receipts(HANDLER).await, KEYS * VERSIONS);
    let ended = third.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
}
on_both_databases!(
    order_holds_through_a_stop_and_a_kill,
    order_holds_through_a_stop_and_a_kill
);

/// A key's first version is retried with a 10 s nak delay and its second
/// waits behind it when the host stops: the stop gives the second back
/// with a delay past the first's. A third version published after the
/// stop reaches the next host at once, long before the two come back;
/// that host holds it until every delivery that was out at its start is
/// back (a fixed wait of `ack_wait` would have let it run first, and the
/// guest would have refused it as out of order).
async fn a_later_message_waits_for_those_given_back_with_a_delay(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &nats,
        &db,
        "ack_wait = \"2s\"\nretry_delay = \"10s\"\n",
    );
    let js = nats.jetstream().await;
    let version = |v: i64, retry: bool| {
        serde_json::json!({"op": "version", "event_id": format!("k1-v{v}"), "key": 1, "version": v, "retry_first": retry})
            .to_string()
    };
    // Both in the stream before the host's first pull, so it takes both.
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    publish(&js, "accounts.credit", &version(1, true), &[]).await;
    publish(&js, "accounts.credit", &version(2, false), &[]).await;
    let mut first = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "first");
    let until = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&first.log)
        .unwrap_or_default()
        .contains("rolled back; will retry")
    {
        assert!(
            first.exited().is_none() && Instant::now() < until,
            "the first version was not retried; log:\n{}",
            std::fs::read_to_string(&first.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ended = first.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    let log = std::fs::read_to_string(dir.path().join("first.log")).unwrap();
    assert!(
        log.contains("1 messages not run given back in stream order (1 after the message their key waits for)"),
        "the second version was not given back behind the first; log:\n{log}"
    );
    publish(&js, "accounts.credit", &version(3, false), &[]).await;
    let mut second = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "second");
    let probe = Probe::new(&db);
    until_applied(&probe, &db, &js, &mut second, 3).await;
    assert_eq!(db.dead_letters(HANDLER).await, vec![]);
    assert_eq!(db.balance(1).await, Some(3));
    assert_eq!(db.receipts(HANDLER).await, 3);
    let log = std::fs::read_to_string(&second.log).unwrap();
    assert!(
        log.contains("2 deliveries of the consumer are out and not acked"),
        "the second host did not wait for the two given back; log:\n{log}"
    );
    let ended = second.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
}
on_both_databases!(
    a_later_message_waits_for_those_given_back_with_a_delay,
    a_later_message_waits_for_those_given_back_with_a_delay
);

/// With one slot, a message its lane lets go once the message before it
/// came back and settled runs at once, the stream idle: the slot goes to
/// it before the loop waits for anything new (`ack_wait` is 30 s, so a
/// message left waiting for a slot would show as a stall past the wait).
async fn a_message_let_go_takes_the_free_slot(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    spec.extra
        .push_str("order_key = \"json:/key\"\nconcurrency = 1\nack_wait = \"30s\"\n");
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    let first = serde_json::json!({"op": "version", "event_id": "a1", "key": 1, "version": 1, "retry_first": true});
    let second = serde_json::json!({"op": "version", "event_id": "a2", "key": 1, "version": 2});
    publish(&js, "accounts.credit", &first.to_string(), &[]).await;
    publish(&js, "accounts.credit", &second.to_string(), &[]).await;
    let s = host
        .wait_for(HANDLER, "both versions applied", |s| s.processed == 2)
        .await;
    assert_eq!((s.processed, s.retried, s.dead_lettered), (2, 1, 0), "{s}");
    assert_eq!(db.balance(1).await, Some(2));
    host.stop().await;
}
on_both_databases!(
    a_message_let_go_takes_the_free_slot,
    a_message_let_go_takes_the_free_slot
);

/// `refuse_out_of_order`: each applied message records its stream sequence
/// as its key's last, in its own transaction, and a message whose sequence
/// is not above its key's last is refused before the guest runs, as a
/// dead letter (`out-of-order: …`). Another host applying a later message
/// of the key first (a partition changing hands) is played by raising the
/// recorded sequence of key 1 by hand.
async fn a_message_older_than_its_keys_last_is_refused(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    spec.extra
        .push_str("order_key = \"json:/key\"\nrefuse_out_of_order = true\n");
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    let sequence_of = |key: i64| {
        format!(
            "SELECT stream_sequence FROM idem_key_sequences WHERE consumer = '{HANDLER}' AND order_key = '{key}'"
        )
    };
    let version = |key: i64, v: i64| {
        serde_json::json!({"op": "version", "event_id": format!("k{key}-v{v}"), "key": key, "version": v})
            .to_string()
    };
    publish(&js, "accounts.credit", &version(1, 1), &[]).await;
    host.wait_for(HANDLER, "key 1 at version 1", |s| s.processed == 1)
        .await;
    assert_eq!(db.scalar(&sequence_of(1)).await, Some(1));
    db.execute(&format!(
        "UPDATE idem_key_sequences SET stream_sequence = 1000 WHERE consumer = '{HANDLER}' AND order_key = '1'"
    ))
    .await;
    publish(&js, "accounts.credit", &version(1, 2), &[]).await;
    publish(&js, "accounts.credit", &version(2, 1), &[]).await;
    let s = host
        .wait_for(HANDLER, "both settled", |s| {
            s.processed + s.dead_lettered == 3
        })
        .await;
    assert_eq!((s.processed, s.dead_lettered), (2, 1), "{s}");
    assert_eq!(
        db.dead_letters(HANDLER).await,
        vec![(
            Some("k1-v2".to_string()),
            "out-of-order: a later message of key `1` was applied before this one (stream sequence 2)"
                .to_string()
        )]
    );
    // The guest never ran for it; the other key went on.
    assert_eq!(db.balance(1).await, Some(1));
    assert_eq!(db.balance(2).await, Some(1));
    assert_eq!(db.scalar(&sequence_of(1)).await, Some(1000));
    assert_eq!(db.scalar(&sequence_of(2)).await, Some(3));
    // The refused message's receipt was rolled back with it.
    assert_eq!(db.receipts(HANDLER).await, 2);
    host.stop().await;
}
on_both_databases!(
    a_message_older_than_its_keys_last_is_refused,
    a_message_older_than_its_keys_last_is_refused
);
