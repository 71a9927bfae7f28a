//! One delivery's publishes to one stream leave as one JetStream atomic
//! batch (the stream allows atomic publish), against the real binary, a
//! real nats-server and PostgreSQL or SQLite:
//! - a message that publishes three times to stream BATCHED (two rows of
//!   one key, one without) is stored as one batch: one `Nats-Batch-Id`,
//!   `Nats-Batch-Sequence` 1 to 3 in call order, the commit on the last,
//!   each with its own `Nats-Msg-Id`;
//! - the host aborts right after that batch is stored and before its rows
//!   are deleted (`abort-after-send:1`); once the rows are due again (their
//!   lease run out) the next host sends the batch again, the stream refuses
//!   it as holding stored messages (10201), and the rows go one by one,
//!   each answered as a duplicate: 3 duplicates counted, nothing stored
//!   twice;
//! - a batch the stream refuses part of (one message over its
//!   `max_msg_size`) stores nothing, and its rows stay pending with the
//!   error (`idem status` and the pending gauge show them per grant,
//!   `batch.>`); once the stream takes bigger messages the
//!   whole batch lands;
//! - a batch the stream refuses as a whole because it no longer takes
//!   batches (10174, `allow_atomic` turned off while the relay still
//!   thought it on) goes one by one, and a row of it that fails holds the
//!   later rows of its key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::outbox::relay::delivery_id;
use idem_tests::chaos::HostProcess;
use idem_tests::scrape::{scrape, until_ready};
use idem_tests::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const HANDLER: &str = "orders";

fn host_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_idem-test-host"))
}

/// One `behave` handler on `orders.placed` that may publish to `batch.>`,
/// with `[service] listen` on `port`.
fn config(dir: &Path, nats: &Nats, db: &TestDb, port: u16) -> PathBuf {
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    spec.stream = "ORDERS".into();
    spec.subjects = vec!["orders.placed".into()];
    spec.extra.push_str("publish = [\"batch.>\"]\n");
    let path = write_config(dir, nats, db, &[spec]);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("[service]\nlisten = \"127.0.0.1:{port}\"\n"));
    std::fs::write(&path, text).unwrap();
    path
}

/// A stored message: subject, payload, and its `Nats-Msg-Id`,
/// `Nats-Batch-Id`, `Nats-Batch-Sequence` and `Nats-Batch-Commit`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    subject: String,
    payload: String,
    msg_id: String,
    batch: String,
    batch_seq: String,
    commit: String,
}

async fn stored(js: &async_nats::jetstream::Context) -> Vec<Stored> {
    let stream = js.get_stream("BATCHED").await.unwrap();
    let last = stream.get_info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await.unwrap();
        let header = |name: &str| {
            m.headers
                .get(name)
                .map(|v| v.as_str().to_owned())
                .unwrap_or_default()
        };
        out.push(Stored {
            subject: m.subject.to_string(),
            payload: String::from_utf8_lossy(&m.payload).to_string(),
            msg_id: header("Nats-Msg-Id"),
            batch: header("Nats-Batch-Id"),
            batch_seq: header("Nats-Batch-Sequence"),
            commit: header("Nats-Batch-Commit"),
        });
    }
    out
}

/// Waits until `check` holds for the outbox row count (60 s at most),
/// the host still running.
async fn until_rows(db: &TestDb, host: &mut HostProcess, what: &str, check: impl Fn(i64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = db.scalar("SELECT count(*) FROM idem_outbox").await.unwrap();
        if check(n) {
            return;
        }
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "{what} (rows: {n}); log:\n{}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates stream BATCHED on `batch.>`, taking atomic batches, with a
/// `max_msg_size` of 256 bytes: a batch's headers (ids, batch id,
/// sequence, commit) take about 150, so a 300-byte payload is refused.
async fn batched_stream(js: &async_nats::jetstream::Context) {
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "BATCHED".into(),
        subjects: vec!["batch.>".into()],
        max_age: DEFAULT_RETENTION,
        allow_atomic_publish: true,
        max_message_size: 256,
        ..Default::default()
    })
    .await
    .unwrap();
}

/// The handler's samples of `name` on the host's `/metrics`, added over
/// its targets (0 when not exported yet).
fn counter(port: u16, name: &str) -> f64 {
    let prefix = format!("{name}{{handler=\"{HANDLER}\",");
    scrape(port)
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(_, v)| v)
        .sum()
}

on_both_databases!(
    one_deliverys_publishes_land_together_once,
    lands_together_once
);

async fn lands_together_once(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), &nats, &db, port);
    let js = nats.jetstream().await;
    batched_stream(&js).await;

    // The batch is stored, then the host aborts before deleting its rows.
    let mut host = HostProcess::spawn(host_bin(), &cfg, "abort-after-send:1", dir.path(), "h1");
    until_ready(&mut host, port).await;
    let m1 = json!({"event_id": "m1", "op": "outbox", "calls": [
        {"publish": "batch.a", "payload": "one", "key": "k"},
        {"publish": "batch.b", "payload": "two"},
        {"publish": "batch.a", "payload": "three", "key": "k"},
    ]});
    publish(&js, "orders.placed", &m1.to_string(), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while host.exited().is_none() {
        assert!(
            Instant::now() < deadline,
            "the host did not abort after its send"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = stored(&js).await;
    let id = |m: &str, i| delivery_id(HANDLER, m, i);
    let batch = first[0].batch.clone();
    assert_eq!(batch.len(), 22, "a batch id: {first:?}");
    let expect = |rows: &[(&str, &str, &str, u32)], batch: &str| -> Vec<Stored> {
        rows.iter()
            .enumerate()
            .map(|(n, (subject, payload, m, i))| Stored {
                subject: (*subject).into(),
                payload: (*payload).into(),
                msg_id: id(m, *i),
                batch: batch.into(),
                batch_seq: (n + 1).to_string(),
                commit: if n + 1 == rows.len() {
                    "1".into()
                } else {
                    String::new()
                },
            })
            .collect()
    };
    let m1_stored = expect(
        &[
            ("batch.a", "one", "m1", 0),
            ("batch.b", "two", "m1", 1),
            ("batch.a", "three", "m1", 2),
        ],
        &batch,
    );
    assert_eq!(first, m1_stored);
    assert_eq!(db.scalar("SELECT count(*) FROM idem_outbox").await, Some(3));

    // Their lease run out, the next host sends them again: refused as a
    // batch holding stored messages, then one by one, each a duplicate.
    db.execute("UPDATE idem_outbox SET due_ms = 0").await;
    let mut host = HostProcess::spawn_with_env(
        host_bin(),
        &cfg,
        &[("RUST_LOG", "info,async_nats=warn,idem::outbox=debug")],
        dir.path(),
        "h2",
    );
    until_ready(&mut host, port).await;
    until_rows(&db, &mut host, "the batch was not sent again", |n| n == 0).await;
    assert_eq!(stored(&js).await, m1_stored);
    assert_eq!(counter(port, "idem_outbox_sent_total"), 3.0);
    assert_eq!(counter(port, "idem_outbox_duplicates_total"), 3.0);
    // Per grant, not per subject.
    let sent = "idem_outbox_sent_total{handler=\"orders\",target=\"publish:batch.>\"}";
    assert_eq!(scrape(port).get(sent).copied(), Some(3.0));
    let log = std::fs::read_to_string(&host.log).unwrap();
    assert!(
        log.contains("publishing its rows one by one") && log.contains("error 10201"),
        "{log}"
    );

    // One message over the stream's max_msg_size: nothing of the batch is
    // stored, the rows wait with the error.
    let big = "x".repeat(300);
    let m2 = json!({"event_id": "m2", "op": "outbox", "calls": [
        {"publish": "batch.a", "payload": "small"},
        {"publish": "batch.b", "payload": big},
        {"publish": "batch.a", "payload": "last"},
    ]});
    publish(&js, "orders.placed", &m2.to_string(), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while db
        .scalar("SELECT count(*) FROM idem_outbox WHERE attempts >= 2 AND last_error LIKE '%exceeds maximum%'")
        .await
        != Some(3)
    {
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "the refused batch was not tried again; log:\n{}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(stored(&js).await, m1_stored);
    assert_eq!(counter(port, "idem_outbox_sent_total"), 3.0);
    // `idem status` shows what waits, per target.
    // (Hosts report every few seconds; this one committed m2 only. The
    // aborted host's last report may still be there.)
    let me = format!("-{} ", host.pid());
    let deadline = Instant::now() + Duration::from_secs(15);
    let out = loop {
        let (code, out, err) = idem_cli(&["status", "--config", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 0, "{err}");
        if out
            .lines()
            .any(|l| l.contains(&me) && l.contains(" processed=1 "))
            || Instant::now() > deadline
        {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&me) && l.contains(" processed=1 ")),
        "{out}"
    );
    let outbox = lines.iter().position(|l| *l == "outbox:").expect(&out);
    // Per grant, as the gauges.
    assert_eq!(lines.len(), outbox + 2, "{out}");
    assert!(
        lines[outbox + 1].starts_with("  orders publish batch.>: 3 pending, 0 parked, oldest "),
        "{out}"
    );

    // The gauge counts per grant (`batch.>`), not per subject; every
    // host reads it every 5 s.
    let pending = "idem_outbox_pending{handler=\"orders\",target=\"publish:batch.>\"}";
    let deadline = Instant::now() + Duration::from_secs(15);
    while scrape(port).get(pending).copied() != Some(3.0) {
        assert!(
            Instant::now() < deadline,
            "{pending} never read 3: {:?}",
            scrape(port)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !scrape(port).keys().any(|k| k.contains("publish:batch.a")),
        "a series per subject"
    );

    // The stream takes bigger messages: the whole batch lands.
    let mut config = js
        .get_stream("BATCHED")
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    config.max_message_size = 1024;
    js.update_stream(config).await.unwrap();
    until_rows(&db, &mut host, "the batch did not land", |n| n == 0).await;
    let all = stored(&js).await;
    assert_eq!(all.len(), 6, "{all:?}");
    assert_eq!(all[..3], m1_stored[..]);
    assert_ne!(all[3].batch, batch);
    assert_eq!(
        all[3..],
        expect(
            &[
                ("batch.a", "small", "m2", 0),
                ("batch.b", &big, "m2", 1),
                ("batch.a", "last", "m2", 2)
            ],
            &all[3].batch,
        )[..]
    );
    assert_eq!(counter(port, "idem_outbox_sent_total"), 6.0);
    assert_eq!(counter(port, "idem_outbox_duplicates_total"), 3.0);
    let ended = host.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    assert_eq!(db.receipts(HANDLER).await, 2);
}

/// Message m1: three publishes of key `k` to one stream, the middle one
/// larger than the stream takes. Row 2 must not be stored while row 1
/// waits (rows of a key leave in commit order).
async fn m1_keeps_its_order(
    js: &async_nats::jetstream::Context,
    db: &TestDb,
    host: &mut HostProcess,
) -> String {
    let big = "x".repeat(300);
    let m1 = json!({"event_id": "m1", "op": "outbox", "calls": [
        {"publish": "batch.a", "payload": "one", "key": "k"},
        {"publish": "batch.a", "payload": big, "key": "k"},
        {"publish": "batch.a", "payload": "three", "key": "k"},
    ]});
    publish(js, "orders.placed", &m1.to_string(), &[]).await;
    // Until row 1 has been tried a few times.
    let deadline = Instant::now() + Duration::from_secs(20);
    while db
        .scalar("SELECT count(*) FROM idem_outbox WHERE message_id = 'm1' AND call_index = 1 AND attempts >= 3")
        .await
        != Some(1)
    {
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "row 1 was not tried; log:\n{}",
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stored: Vec<String> = stored(js).await.into_iter().map(|m| m.payload).collect();
    let log = std::fs::read_to_string(&host.log).unwrap_or_default();
    assert!(
        !stored.iter().any(|p| p == "three"),
        "row 2 of key k was stored while row 1 of key k still waits: stored {stored:?}; \
         rows: {:?}; log:\n{}",
        db.scalar("SELECT count(*) FROM idem_outbox").await,
        log.lines()
            .filter(|l| l.contains("one by one") || l.contains("outbox"))
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    log
}

on_both_databases!(
    a_batch_sent_one_by_one_after_10174_keeps_a_failed_rows_key,
    one_by_one_after_10174
);

async fn one_by_one_after_10174(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = config(dir.path(), &nats, &db, port);
    let js = nats.jetstream().await;
    batched_stream(&js).await;
    let mut host = HostProcess::spawn_with_env(
        host_bin(),
        &cfg,
        &[("RUST_LOG", "info,async_nats=warn,idem::outbox=debug")],
        dir.path(),
        "h1",
    );
    until_ready(&mut host, port).await;
    // m0 makes the relay learn (for 10 s) that the stream takes batches.
    let m0 = json!({"event_id": "m0", "op": "outbox", "calls": [
        {"publish": "batch.a", "payload": "zero-a"},
        {"publish": "batch.a", "payload": "zero-b"},
    ]});
    publish(&js, "orders.placed", &m0.to_string(), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while stored(&js).await.len() < 2 {
        assert!(Instant::now() < deadline, "m0 did not land");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The operator turns atomic publish off.
    let mut config = js
        .get_stream("BATCHED")
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    config.allow_atomic_publish = false;
    js.update_stream(config)
        .await
        .expect("allow_atomic cannot be turned off");
    let log = m1_keeps_its_order(&js, &db, &mut host).await;
    assert!(
        log.contains("error 10174"),
        "no 10174 seen: the path was not taken"
    );
}
