//! Consumption survives broker trouble (a consumer-stream error
//! never ends consumption silently; the host logs it, reconnects and keeps
//! pulling).
//!
//! - The broker restarts mid-run (same port, same store: JetStream state
//!   persists): every event published before and after the restart is
//!   processed exactly once.
//! - With a pull batch of one message, consumption never stalls.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::chaos::{Probe, Workload, consumer_info, describe_consumer};
use idem_tests::*;
use std::time::{Duration, Instant};

/// Events published before the restart.
const BEFORE: usize = 2000;
/// Events published after the restart.
const AFTER: usize = 1000;

async fn broker_restart_mid_run_loses_and_doubles_nothing(backend: Backend) {
    let started = Instant::now();
    let mut nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit-projector", "credit");
    // A pull batch of 2 (ack_wait × concurrency / (1.5 × (deadline + 1 s))):
    // a batch of 1 stalls on its own, see `pull_batch_of_one_keeps_pulling`.
    h.extra =
        "ack_wait = \"3s\"\ndeadline = \"1s\"\nconcurrency = 2\nretry_delay = \"100ms\"\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    let js = nats.jetstream().await;

    // One workload, no duplicates or poison: split into before / after.
    let w = Workload::credit(0x5EED_0001, BEFORE + AFTER, 50, 0, 0);
    let credits: Vec<&String> = w
        .messages
        .iter()
        .filter(|m| m.contains("\"event_id\""))
        .collect();
    assert_eq!(credits.len(), BEFORE + AFTER);
    let (expected, ids) = w.expected();
    let id_of = |m: &str| {
        serde_json::from_str::<serde_json::Value>(m).unwrap()["event_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    // Published before the host starts, so the restart finds most pending.
    let before: Vec<String> = credits[..BEFORE].iter().map(|m| m.to_string()).collect();
    let resent = chaos::publish_all(&js, "accounts.credit", &before, 256, deadline).await;
    assert_eq!(resent, 0, "the broker is up: no publish may fail");
    let host = RunningHost::start(&cfg).await;

    // Restart once an eighth is processed, while most are still pending.
    let s = host
        .wait_for("credit-projector", "an eighth processed", |s| {
            s.processed >= BEFORE as u64 / 8
        })
        .await;
    tokio::task::block_in_place(|| nats.restart());
    let restarted_at = Instant::now();
    println!(
        "broker restarted after {} of {BEFORE} processed",
        s.processed
    );

    for m in &credits[BEFORE..] {
        chaos::publish_with_id_retrying(&js, "accounts.credit", m, &id_of(m), deadline).await;
    }
    let published_after = restarted_at.elapsed();

    let total = (BEFORE + AFTER) as u64;
    let mut last = host.stats("credit-projector");
    // Consumption resumed: more processed than the messages already
    // buffered in the host at the restart could account for.
    let mut resumed_at = None;
    while last.processed < total {
        if resumed_at.is_none() && last.processed > s.processed + 100 {
            resumed_at = Some(restarted_at.elapsed());
        }
        assert!(
            restarted_at.elapsed() < Duration::from_secs(90),
            "consumption did not resume after the broker restart: {last}; consumer {:?}",
            consumer_info(&js, "ACCOUNTS", "credit-projector")
                .await
                .map(|i| describe_consumer(&i))
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = host.stats("credit-projector");
    }
    let done = restarted_at.elapsed();
    // Nothing left on the consumer (redeliveries of lost acks included).
    let settle = Instant::now() + Duration::from_secs(30);
    let info = loop {
        if let Some(i) = consumer_info(&js, "ACCOUNTS", "credit-projector").await
            && i.num_pending == 0
            && i.num_ack_pending == 0
        {
            break i;
        }
        assert!(Instant::now() < settle, "consumer did not settle");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let s = host.stop().await.remove(0).1;
    println!(
        "broker_restart {backend:?}: {total} events; consumption resumed {resumed_at:?} and \
         all were processed {done:?} after the restart (publishing after it took \
         {published_after:?}); host {s}; consumer {}; test took {:?}",
        describe_consumer(&info),
        started.elapsed()
    );

    assert_eq!(s.processed, total, "{s}");
    assert_eq!(s.dead_lettered, 0, "{s}");
    let probe = Probe::new(&db);
    assert_eq!(probe.balances().await.unwrap(), expected);
    assert_eq!(db.receipt_ids("credit-projector").await, ids);
    assert!(db.dead_letters("credit-projector").await.is_empty());
}
on_both_databases!(
    broker_restart_mid_run_loses_and_doubles_nothing,
    broker_restart_mid_run_loses_and_doubles_nothing
);

/// Longest time the host may go without processing while messages are pending.
const MAX_STALL: Duration = Duration::from_secs(5);

async fn pull_batch_of_one_keeps_pulling(backend: Backend) {
    const EVENTS: usize = 1000;
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit-projector", "credit");
    h.extra = "pull_batch = 1\nack_wait = \"30s\"\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    let js = nats.jetstream().await;
    let w = Workload::credit(0x5EED_0002, EVENTS, 20, 0, 0);
    let credits: Vec<String> = w
        .messages
        .iter()
        .filter(|m| m.contains("\"event_id\""))
        .cloned()
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    assert_eq!(
        chaos::publish_all(&js, "accounts.credit", &credits, 256, deadline).await,
        0
    );
    let (expected, ids) = w.expected();

    let started = Instant::now();
    let host = RunningHost::start(&cfg).await;
    let mut last = host.stats("credit-projector");
    let mut last_change = Instant::now();
    let mut longest = Duration::ZERO;
    while last.processed < EVENTS as u64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let s = host.stats("credit-projector");
        if s.processed != last.processed {
            longest = longest.max(last_change.elapsed());
            last_change = Instant::now();
            last = s;
        }
        assert!(
            last_change.elapsed() < MAX_STALL,
            "consumption stalled for {MAX_STALL:?} with messages pending: {last}; consumer {:?}",
            consumer_info(&js, "ACCOUNTS", "credit-projector")
                .await
                .map(|i| describe_consumer(&i))
        );
    }
    println!(
        "pull_batch = 1 {backend:?}: {EVENTS} events in {:?}, longest pause {longest:?}",
        started.elapsed()
    );
    let s = host.stop().await.remove(0).1;
    assert_eq!((s.processed, s.dead_lettered), (EVENTS as u64, 0), "{s}");
    assert_eq!(Probe::new(&db).balances().await.unwrap(), expected);
    assert_eq!(db.receipt_ids("credit-projector").await, ids);
}
on_both_databases!(
    pull_batch_of_one_keeps_pulling,
    pull_batch_of_one_keeps_pulling
);
