//! The transactional outbox against real nats-server, PostgreSQL and SQLite,
//! judged by what arrives: the messages stored in the target stream (with
//! their `Nats-Msg-Id`) and the requests a loopback HTTP receiver got (with
//! their `Idempotency-Key`). A message that commits sends each publish and
//! call once; one that rejects, or whose call is not granted or carries a
//! header the host sets, sends nothing; a copy of a committed message sends
//! nothing more; a row sent again (as after a crash between the send and
//! its delete) is dropped by the stream as a duplicate; a call answered 500
//! is tried again with the same key; a parked call does not hold up the
//! next row of its key. A component built for the 0.1.0 world runs beside
//! the 0.2.0 one. `idem outbox list|retry|drop` show and change the rows
//! that wait. On PostgreSQL a transaction that stored rows notifies
//! `idem_outbox` when it commits, and only then. A host refuses to start
//! when a stream that stores a granted subject keeps message ids for less
//! than the relay's resend horizon.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::outbox::relay::delivery_id;
use idem_tests::examples::credit_log_migrations;
use idem_tests::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One request the receiver got: path, `Idempotency-Key`, body.
type Request = (String, String, String);

/// An HTTP receiver on loopback that answers 500 to its first request and
/// 200 after, and keeps every request.
async fn receiver() -> (u16, Arc<Mutex<Vec<Request>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let got: Arc<Mutex<Vec<Request>>> = Arc::default();
    let kept = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head, body_len) = loop {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_string();
                        let len = head
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        buf.drain(..end + 4);
                        break (head, len);
                    }
                };
                while buf.len() < body_len {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let path = head
                    .lines()
                    .next()
                    .and_then(|l| l.split(' ').nth(1))
                    .unwrap_or("")
                    .to_owned();
                let key = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("idempotency-key")
                            .then(|| v.trim().to_owned())
                    })
                    .unwrap_or_default();
                let first = {
                    let mut got = kept.lock().unwrap();
                    got.push((path, key, String::from_utf8_lossy(&buf).to_string()));
                    got.len() == 1
                };
                let status = if first {
                    "500 Internal Server Error"
                } else {
                    "200 OK"
                };
                let answer =
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (port, got)
}

fn config(dir: &Path, nats: &Nats, db: &TestDb, port: u16) -> PathBuf {
    let migrations = credit_log_migrations(dir);
    let cfg = dir.join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 6\n\
             [[handler]]\nname = \"orders\"\nmodule = \"{}\"\nstream = \"ORDERS\"\nsubjects = [\"orders.placed\"]\n\
             identity = \"json:/event_id\"\ntables = [\"accounts\"]\nmigrations = \"{}\"\n\
             publish = [\"orders.accepted\", \"audit.>\"]\n\
             endpoints = {{ notify = \"http://127.0.0.1:{port}/notify\" }}\n{}\n\
             [[handler]]\nname = \"legacy\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\n\
             identity = \"json:/event_id\"\ntables = [\"accounts\"]\nmigrations = \"{}\"\n{}\n",
            nats.url(),
            db.url,
            guest("behave").display(),
            migrations.display(),
            test_batch_line(""),
            guest("credit-v0-1").display(),
            migrations.display(),
            test_batch_line(""),
        ),
    )
    .unwrap();
    cfg
}

/// The messages stored in stream ACCEPTED: subject, payload, `Nats-Msg-Id`,
/// `X-Trace`.
async fn accepted(js: &async_nats::jetstream::Context) -> Vec<(String, String, String, String)> {
    let stream = js.get_stream("ACCEPTED").await.unwrap();
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
        out.push((
            m.subject.to_string(),
            String::from_utf8_lossy(&m.payload).to_string(),
            header("Nats-Msg-Id"),
            header("X-Trace"),
        ));
    }
    out
}

/// Waits until the outbox holds no row, then for the relay's pass to end.
async fn outbox_empty(db: &TestDb) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.scalar("SELECT count(*) FROM idem_outbox").await != Some(0) {
        assert!(Instant::now() < deadline, "the outbox did not empty");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

on_both_databases!(a_committed_message_sends_each_call_once, sends_once);

async fn sends_once(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let (port, requests) = receiver().await;
    let cfg = config(dir.path(), &nats, &db, port);
    create_stream(&nats, "ACCEPTED", &["orders.accepted", "audit.>"]).await;
    let js = nats.jetstream().await;
    let host = RunningHost::start(&cfg).await;

    let m1 = json!({"event_id": "m1", "op": "outbox", "calls": [
        {"publish": "orders.accepted", "payload": "a1", "key": "o1", "headers": [["X-Trace", "t1"]]},
        {"publish": "audit.orders", "payload": "audit-m1"},
        {"call": "notify", "payload": "{\"order\":\"o1\"}", "key": "o1"},
    ], "then": {"op": "credit", "account_id": 1, "amount": 5}});
    publish(&js, "orders.placed", &m1.to_string(), &[]).await;
    // Rolled back: nothing it published leaves.
    let m2 = json!({"event_id": "m2", "op": "outbox",
        "calls": [{"publish": "orders.accepted", "payload": "a2"}], "then": {"op": "reject"}});
    publish(&js, "orders.placed", &m2.to_string(), &[]).await;
    // Not granted; a header the host sets: refused at the call.
    let m3 = json!({"event_id": "m3", "op": "outbox",
        "calls": [{"publish": "orders.rejected", "payload": "a3"}]});
    publish(&js, "orders.placed", &m3.to_string(), &[]).await;
    let m4 = json!({"event_id": "m4", "op": "outbox", "calls": [
        {"publish": "orders.accepted", "payload": "a4", "headers": [["Nats-Msg-Id", "mine"]]}]});
    publish(&js, "orders.placed", &m4.to_string(), &[]).await;
    // The 0.1.0 component beside it.
    publish(&js, "accounts.credit", &credit("c1", 2, 7), &[]).await;
    host.wait_for("orders", "m1 processed, m2-m4 dead-lettered", |s| {
        s.processed == 1 && s.dead_lettered == 3
    })
    .await;
    host.wait_for("legacy", "c1 processed", |s| s.processed == 1)
        .await;
    outbox_empty(&db).await;

    let id = |i| delivery_id("orders", "m1", i);
    assert_eq!(
        accepted(&js).await,
        vec![
            ("orders.accepted".into(), "a1".into(), id(0), "t1".into()),
            (
                "audit.orders".into(),
                "audit-m1".into(),
                id(1),
                String::new()
            ),
        ]
    );
    // Answered 500 once, then 200: two requests, one key.
    let deadline = Instant::now() + Duration::from_secs(30);
    while requests.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "the call was not tried again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let call = ("/notify".to_owned(), id(2), "{\"order\":\"o1\"}".to_owned());
    assert_eq!(*requests.lock().unwrap(), vec![call.clone(), call.clone()]);
    let mut reasons: Vec<(Option<String>, String)> = db.dead_letters("orders").await;
    reasons.sort();
    assert_eq!(
        reasons,
        vec![
            (Some("m2".into()), "rejected: asked to".into()),
            (
                Some("m3".into()),
                "rejected: outbox 0: not-granted: subject `orders.rejected` is not granted to this handler (`publish` in its config)".into()
            ),
            (
                Some("m4".into()),
                "rejected: outbox 0: invalid: header `Nats-Msg-Id` is set by the host, not by a handler".into()
            ),
        ]
    );

    // A copy of m1: a duplicate, nothing sent again.
    publish(&js, "orders.placed", &m1.to_string(), &[]).await;
    host.wait_for("orders", "the copy of m1", |s| s.duplicates == 1)
        .await;
    // m1's first row stored again, as a host that died between sending
    // it and deleting it leaves it: sent again with the same id, the
    // stream drops the copy.
    let payload = match backend {
        Backend::Postgres => "'\\x6131'::bytea",
        Backend::Sqlite => "X'6131'",
    };
    db.execute(&format!(
        "INSERT INTO idem_outbox (consumer, message_id, call_index, kind, target, payload, headers, ordering_key) \
         VALUES ('orders', 'm1', 0, 'publish', 'orders.accepted', {payload}, '[[\"X-Trace\",\"t1\"]]', 'o1')"
    ))
    .await;
    outbox_empty(&db).await;
    assert_eq!(accepted(&js).await.len(), 2);

    // A call parked after its last try holds its key no longer: the next
    // row of the key leaves.
    db.execute(&format!(
        "INSERT INTO idem_outbox (consumer, message_id, call_index, kind, target, payload, headers, ordering_key, due_ms) \
         VALUES ('orders', 'm8', 0, 'call', 'notify', {payload}, '[]', 'o9', 9223372036854775807)"
    ))
    .await;
    db.execute(&format!(
        "INSERT INTO idem_outbox (consumer, message_id, call_index, kind, target, payload, headers, ordering_key) \
         VALUES ('orders', 'm9', 0, 'publish', 'orders.accepted', {payload}, '[]', 'o9')"
    ))
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while db
        .scalar("SELECT count(*) FROM idem_outbox WHERE due_ms < 9223372036854775807")
        .await
        != Some(0)
    {
        assert!(
            Instant::now() < deadline,
            "the row after a parked one did not leave"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(db.scalar("SELECT count(*) FROM idem_outbox").await, Some(1));
    host.stop().await;
    let stored = accepted(&js).await;
    assert_eq!(stored.len(), 3);
    assert_eq!(
        stored[2],
        (
            "orders.accepted".into(),
            "a1".into(),
            delivery_id("orders", "m9", 0),
            String::new()
        )
    );
    assert_eq!(requests.lock().unwrap().len(), 2);
    assert_eq!(db.balance(1).await, Some(5));
    assert_eq!(db.balance(2).await, Some(7));
    assert_eq!(db.receipts("orders").await, 1);
    assert_eq!(db.receipts("legacy").await, 1);

    // The operator's commands on the parked row left.
    let parked = db.scalar("SELECT id FROM idem_outbox").await.unwrap();
    let cfg_arg = cfg.to_str().unwrap();
    let (code, out, err) = idem_cli(&["outbox", "list", "--config", cfg_arg], &[]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "orders call notify: 0 pending, 1 parked");
    assert_eq!(lines.len(), 4, "{out}");
    let row: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(
        row[..8],
        [
            parked.to_string().as_str(),
            "orders",
            "m8",
            "0",
            "call",
            "notify",
            "o9",
            "0"
        ]
    );
    assert_eq!(row[8], "parked");
    let (code, _, err) = idem_cli(
        &[
            "outbox",
            "retry",
            &(parked + 100).to_string(),
            "--config",
            cfg_arg,
        ],
        &[],
    );
    assert_eq!((code, err.trim()), (1, format!("idem: no outbox row with id {} (sent already, or dropped); `idem outbox list` shows the ids", parked + 100).as_str()));
    let (code, out, err) = idem_cli(
        &["outbox", "retry", &parked.to_string(), "--config", cfg_arg],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        format!("outbox row {parked} is due again; a running host's relay sends it")
    );
    assert_eq!(db.scalar("SELECT due_ms FROM idem_outbox").await, Some(0));
    let (code, _, err) = idem_cli(
        &["outbox", "retry", &parked.to_string(), "--config", cfg_arg],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.contains("is not parked"), "{err}");
    let (code, out, err) = idem_cli(
        &[
            "outbox",
            "drop",
            "--handler",
            "orders",
            "--all",
            "--config",
            cfg_arg,
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "dropped 1 outbox row of handler orders; they are not sent"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM idem_outbox").await, Some(0));
    let (code, out, _) = idem_cli(&["outbox", "list", "--config", cfg_arg], &[]);
    assert_eq!((code, out.as_str()), (0, "the outbox is empty\n"));
    // A handler name the config does not know, with no rows: a typo.
    let (code, _, err) = idem_cli(
        &[
            "outbox",
            "retry",
            "--handler",
            "order",
            "--all",
            "--config",
            cfg_arg,
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        err.starts_with("idem: handler `order` is not in ")
            && err.contains("(it has orders, legacy)"),
        "{err}"
    );
}

/// PostgreSQL: the message's transaction notifies `idem_outbox` when it
/// stored rows and commits; a rolled-back one and one without rows do
/// not.
#[tokio::test]
async fn a_commit_that_stored_rows_notifies_every_host() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let (port, _requests) = receiver().await;
    let cfg = config(dir.path(), &nats, &db, port);
    create_stream(&nats, "ACCEPTED", &["orders.accepted", "audit.>"]).await;
    let js = nats.jetstream().await;
    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await.unwrap();
    listener.listen(idem::store::NOTIFY_CHANNEL).await.unwrap();
    let host = RunningHost::start(&cfg).await;
    let rejected = json!({"event_id": "r1", "op": "outbox",
        "calls": [{"publish": "orders.accepted", "payload": "x"}], "then": {"op": "reject"}});
    publish(&js, "orders.placed", &rejected.to_string(), &[]).await;
    publish(&js, "accounts.credit", &credit("c1", 2, 7), &[]).await;
    host.wait_for("orders", "r1 dead-lettered", |s| s.dead_lettered == 1)
        .await;
    host.wait_for("legacy", "c1 processed", |s| s.processed == 1)
        .await;
    let none = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(
        none.is_err(),
        "a notification without stored rows: {none:?}"
    );
    let sent = json!({"event_id": "s1", "op": "outbox", "calls": [
        {"publish": "orders.accepted", "payload": "a"},
        {"publish": "audit.x", "payload": "b"}]});
    publish(&js, "orders.placed", &sent.to_string(), &[]).await;
    let got = tokio::time::timeout(Duration::from_secs(30), listener.recv())
        .await
        .expect("no notification after the commit")
        .unwrap();
    assert_eq!(got.channel(), "idem_outbox");
    host.wait_for("orders", "s1 processed", |s| s.processed == 1)
        .await;
    outbox_empty(&db).await;
    let more = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(more.is_err(), "one transaction, one notification: {more:?}");
    host.stop().await;
    assert_eq!(accepted(&js).await.len(), 2);
}

/// A stream storing a granted subject whose `duplicate_window` is shorter
/// than the relay's resend horizon: the host does not start, and says
/// which stream and what to set.
#[tokio::test]
async fn a_target_stream_that_forgets_ids_too_soon_is_refused() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &nats, &db, 9);
    nats.jetstream()
        .await
        .create_stream(async_nats::jetstream::stream::Config {
            name: "AUDIT".into(),
            subjects: vec!["audit.orders.*".into()],
            duplicate_window: Duration::from_secs(10),
            ..Default::default()
        })
        .await
        .unwrap();
    let (code, _, err) = idem_cli(&["run", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1);
    assert_eq!(
        err.trim(),
        "idem: handler `orders` may publish to \"audit.>\", which stream `AUDIT` stores with a duplicate_window of 10s; \
         the outbox relay may send a message again up to 41s later, so raise the stream's duplicate_window to at least that \
         (`nats stream edit AUDIT --dupe-window 41s`)"
    );
}

/// The orders example's `orders` handler in Rust, JavaScript, Python and C:
/// the same rows and the same stored messages (subject, payload,
/// `Nats-Msg-Id`, `Content-Type`) for the same input; a copy and an order
/// taken before publish nothing; a payload that is not an order publishes
/// nothing and is dead-lettered.
async fn orders_in(component: &str, backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\n\
             [[handler]]\nname = \"orders\"\nmodule = \"{}\"\nstream = \"ORDERS\"\nsubjects = [\"orders.placed\"]\n\
             identity = \"json:/order_id\"\ntables = [\"orders\"]\nmigrations = \"{}\"\n\
             publish = [\"orders.accepted\"]\n{}\n",
            nats.url(),
            db.url,
            guest(component).display(),
            root().join("examples/orders/orders/migrations").display(),
            test_batch_line(""),
        ),
    )
    .unwrap();
    create_stream(&nats, "ACCEPTED", &["orders.accepted"]).await;
    let js = nats.jetstream().await;
    let host = RunningHost::start(&cfg).await;
    let o1 = r#"{"order_id": "o-1", "sku": "sku-3", "qty": 2}"#;
    publish(&js, "orders.placed", o1, &[]).await;
    publish(
        &js,
        "orders.placed",
        r#"{"order_id": "o-2", "sku": "sku-1", "qty": 1}"#,
        &[],
    )
    .await;
    publish(&js, "orders.placed", o1, &[]).await;
    publish(
        &js,
        "orders.placed",
        r#"{"order_id": "o-3", "sku": "sku-1", "qty": 0}"#,
        &[],
    )
    .await;
    host.wait_for("orders", "2 taken, 1 copy, 1 refused", |s| {
        s.processed == 2 && s.duplicates == 1 && s.dead_lettered == 1
    })
    .await;
    outbox_empty(&db).await;
    host.stop().await;
    let stream = js.get_stream("ACCEPTED").await.unwrap();
    let last = stream.get_info().await.unwrap().state.last_sequence;
    let mut stored = Vec::new();
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await.unwrap();
        let header = |name: &str| m.headers.get(name).map(|v| v.as_str().to_owned());
        stored.push((
            String::from_utf8_lossy(&m.payload).to_string(),
            header("Nats-Msg-Id"),
            header("Content-Type"),
        ));
    }
    let json = Some("application/json".to_owned());
    assert_eq!(
        stored,
        vec![
            (
                r#"{"order_id":"o-1","sku":"sku-3","qty":2}"#.to_owned(),
                Some(delivery_id("orders", "o-1", 0)),
                json.clone()
            ),
            (
                r#"{"order_id":"o-2","sku":"sku-1","qty":1}"#.to_owned(),
                Some(delivery_id("orders", "o-2", 0)),
                json
            ),
        ],
        "{component}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM orders").await, Some(2));
    assert_eq!(
        db.scalar("SELECT CAST(sum(qty) AS BIGINT) FROM orders")
            .await,
        Some(3)
    );
    let dead = db.dead_letters("orders").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0.as_deref(), Some("o-3"));
    assert!(
        dead[0]
            .1
            .contains("needs an order id, a SKU and a quantity of at least 1"),
        "{component}: {}",
        dead[0].1
    );
}

async fn orders_rust(backend: Backend) {
    orders_in("orders", backend).await;
}
on_both_databases!(the_orders_handler_in_rust_publishes_once, orders_rust);

async fn orders_js(backend: Backend) {
    orders_in("orders-js", backend).await;
}
on_both_databases!(
    the_orders_handler_in_javascript_publishes_as_rust_does,
    orders_js
);

async fn orders_python(backend: Backend) {
    orders_in("orders-python", backend).await;
}
on_both_databases!(
    the_orders_handler_in_python_publishes_as_rust_does,
    orders_python
);

async fn orders_c(backend: Backend) {
    orders_in("orders-c", backend).await;
}
on_both_databases!(the_orders_handler_in_c_publishes_as_rust_does, orders_c);

/// A stopping host deletes what it sent: calls answered 2xx in a pass
/// whose other call hangs are not sent again by the next host; only the
/// call in flight is (after its lease, with the same key). And one key's
/// rows leave one after the other without waiting for the poll between
/// them, in commit order.
#[tokio::test]
async fn a_stop_keeps_what_was_sent_and_one_keys_rows_do_not_wait_for_the_poll() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let hang = delivery_id("orders", "h1", 0);
    let receiver =
        idem_test_support::HttpReceiver::start(move |key, _| if key == hang { 0 } else { 200 })
            .await;
    let cfg = config(dir.path(), &nats, &db, receiver.port());
    create_stream(&nats, "ACCEPTED", &["orders.accepted", "audit.>"]).await;
    let js = nats.jetstream().await;
    let host = RunningHost::start(&cfg).await;
    let mut calls = vec![json!({"call": "notify", "payload": "hang"})];
    calls.extend((0..5).map(|i| json!({"call": "notify", "payload": format!("ok{i}")})));
    let m = json!({"event_id": "h1", "op": "outbox", "calls": calls});
    publish(&js, "orders.placed", &m.to_string(), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while receiver.count() < 6 {
        assert!(Instant::now() < deadline, "the calls did not arrive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    host.stop().await;
    // The five answered calls are deleted; the hanging one keeps its lease.
    assert_eq!(db.scalar("SELECT count(*) FROM idem_outbox").await, Some(1));
    assert_eq!(
        db.scalar("SELECT call_index FROM idem_outbox").await,
        Some(0)
    );

    // 40 rows of one key: each leaves once the one before it is deleted.
    db.execute("DELETE FROM idem_outbox").await;
    let payload = "'\\x6b'::bytea";
    for i in 0..40 {
        db.execute(&format!(
            "INSERT INTO idem_outbox (consumer, message_id, call_index, kind, target, payload, headers, ordering_key) \
             VALUES ('orders', 'k{i:02}', 0, 'publish', 'orders.accepted', {payload}, '[]', 'one-key')"
        ))
        .await;
    }
    let host = RunningHost::start(&cfg).await;
    // At one row a poll (1 s) this would take 40 s.
    outbox_empty(&db).await;
    host.stop().await;
    let ids: Vec<String> = accepted(&js)
        .await
        .into_iter()
        .map(|(_, _, id, _)| id)
        .collect();
    let want: Vec<String> = (0..40)
        .map(|i| delivery_id("orders", &format!("k{i:02}"), 0))
        .collect();
    assert_eq!(ids, want);
}
