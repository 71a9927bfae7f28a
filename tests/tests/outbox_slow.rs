//! An endpoint that never answers holds up nothing else the relay sends:
//! while a call to it waits for its answer (its first try, up to the 10 s
//! send timeout), the publishes of later messages are stored and their
//! rows deleted. A host that stops with that call in flight leaves its row
//! leased, to be tried again after the lease, with the same key. Against
//! real nats-server, PostgreSQL and SQLite.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_test_support::HttpReceiver;
use idem_tests::*;
use serde_json::json;
use std::time::{Duration, Instant};

on_both_databases!(a_hanging_endpoint_holds_up_no_publish, hanging_endpoint);

async fn hanging_endpoint(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    // 0: never answer.
    let receiver = HttpReceiver::start(|_, _| 0).await;
    let mut spec = HandlerSpec::new("orders", "behave");
    spec.stream = "ORDERS".into();
    spec.subjects = vec!["orders.placed".into()];
    spec.extra.push_str(&format!(
        "publish = [\"pub.>\"]\nendpoints = {{ hang = \"{}\" }}\n",
        receiver.url("/hang")
    ));
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    create_stream(&nats, "PUB", &["pub.>"]).await;
    let js = nats.jetstream().await;
    let host = RunningHost::start(&cfg).await;

    let m1 = json!({"event_id": "m1", "op": "outbox", "calls": [{"call": "hang", "payload": "x"}]});
    publish(&js, "orders.placed", &m1.to_string(), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.count() < 1 {
        assert!(Instant::now() < deadline, "the call was not made");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 2..=5 {
        let m = json!({"event_id": format!("m{i}"), "op": "outbox",
            "calls": [{"publish": "pub.a", "payload": format!("p{i}")}]});
        publish(&js, "orders.placed", &m.to_string(), &[]).await;
    }
    // The four publishes are stored and their rows deleted while the call
    // is still in its first try (no error recorded: its send has not
    // ended).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stored = js
            .get_stream("PUB")
            .await
            .unwrap()
            .get_info()
            .await
            .unwrap()
            .state
            .messages;
        let rows = db.scalar("SELECT count(*) FROM idem_outbox").await;
        if stored == 4 && rows == Some(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stored {stored}, outbox rows {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_try = "SELECT count(*) FROM idem_outbox \
         WHERE message_id = 'm1' AND attempts = 1 AND last_error IS NULL";
    assert_eq!(db.scalar(first_try).await, Some(1));
    assert_eq!(receiver.count(), 1);

    // Stopping with the call in flight: its row keeps its lease.
    let stopped_at = idem::store::now_ms();
    host.stop().await;
    assert_eq!(db.scalar(first_try).await, Some(1));
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM idem_outbox WHERE due_ms > {stopped_at}"
        ))
        .await,
        Some(1)
    );
    assert_eq!(db.receipts("orders").await, 5);
}
