//! The protocol of ARCHITECTURE.md, one test per invariant it
//! names, on PostgreSQL and SQLite, against a private nats-server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use serde_json::json;

const SUBJECT: &str = "accounts.credit";

struct Env {
    nats: Nats,
    db: TestDb,
    dir: tempfile::TempDir,
}

async fn env(backend: Backend) -> Env {
    Env {
        nats: Nats::start(),
        db: TestDb::new(backend).await,
        dir: tempfile::tempdir().unwrap(),
    }
}

fn behave(op: &str, event_id: &str, account: i64, amount: i64) -> String {
    json!({"op": op, "event_id": event_id, "account_id": account, "amount": amount}).to_string()
}

async fn same_event_twice_applies_once(backend: Backend) {
    let e = env(backend).await;
    let cfg = write_config(
        e.dir.path(),
        &e.nats,
        &e.db,
        &[HandlerSpec::new("credit-projector", "credit")],
    );
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    // Two separate messages, same event_id, no broker dedup header.
    publish(&js, SUBJECT, &credit("evt_8142", 73, 500), &[]).await;
    publish(&js, SUBJECT, &credit("evt_8142", 73, 500), &[]).await;
    let s = host
        .wait_for("credit-projector", "2 deliveries", |s| {
            s.processed + s.duplicates == 2
        })
        .await;
    assert_eq!(
        (s.processed, s.duplicates, s.retried, s.dead_lettered),
        (1, 1, 0, 0)
    );
    assert_eq!(e.db.balance(73).await, Some(500));
    assert_eq!(e.db.receipts("credit-projector").await, 1);
    host.stop().await;
}
on_both_databases!(same_event_twice_applies_once, same_event_twice_applies_once);

async fn two_consumers_both_apply(backend: Backend) {
    let e = env(backend).await;
    let cfg = write_config(
        e.dir.path(),
        &e.nats,
        &e.db,
        &[
            HandlerSpec::new("credit-a", "credit"),
            HandlerSpec::new("credit-b", "credit"),
        ],
    );
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(&js, SUBJECT, &credit("evt_1", 7, 300), &[]).await;
    host.wait_for("credit-a", "a processed", |s| s.processed == 1)
        .await;
    host.wait_for("credit-b", "b processed", |s| s.processed == 1)
        .await;
    assert_eq!(e.db.balance(7).await, Some(600));
    assert_eq!(e.db.receipts("credit-a").await, 1);
    assert_eq!(e.db.receipts("credit-b").await, 1);
    host.stop().await;
}
on_both_databases!(two_consumers_both_apply, two_consumers_both_apply);

async fn equal_values_are_two_events(backend: Backend) {
    let e = env(backend).await;
    let cfg = write_config(
        e.dir.path(),
        &e.nats,
        &e.db,
        &[HandlerSpec::new("credit-projector", "credit")],
    );
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(&js, SUBJECT, &credit("evt_a", 5, 250), &[]).await;
    publish(&js, SUBJECT, &credit("evt_b", 5, 250), &[]).await;
    let s = host
        .wait_for("credit-projector", "2 processed", |s| s.processed == 2)
        .await;
    assert_eq!(s.duplicates, 0);
    assert_eq!(e.db.balance(5).await, Some(500));
    assert_eq!(e.db.receipts("credit-projector").await, 2);
    host.stop().await;
}
on_both_databases!(equal_values_are_two_events, equal_values_are_two_events);

async fn retry_leaves_nothing_then_succeeds_once(backend: Backend) {
    let e = env(backend).await;
    let mut h = HandlerSpec::new("behave", "behave");
    h.extra = "retry_delay = \"1s\"\n".into();
    let cfg = write_config(e.dir.path(), &e.nats, &e.db, &[h]);
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(
        &js,
        SUBJECT,
        &behave("retry-once-then-credit", "evt_r", 9, 40),
        &[],
    )
    .await;
    // After the first delivery's retry: rolled back, no receipt, no effect.
    host.wait_for("behave", "first retry", |s| s.retried == 1)
        .await;
    assert_eq!(e.db.receipts("behave").await, 0);
    assert_eq!(e.db.balance(9).await, None);
    let s = host
        .wait_for("behave", "processed", |s| s.processed == 1)
        .await;
    assert_eq!(
        (s.delivered, s.retried, s.duplicates, s.dead_lettered),
        (2, 1, 0, 0)
    );
    assert_eq!(e.db.balance(9).await, Some(40));
    assert_eq!(e.db.receipts("behave").await, 1);
    host.stop().await;
}
on_both_databases!(
    retry_leaves_nothing_then_succeeds_once,
    retry_leaves_nothing_then_succeeds_once
);

async fn trap_rolls_back_and_host_keeps_serving(backend: Backend) {
    let e = env(backend).await;
    let mut h = HandlerSpec::new("behave", "behave");
    h.extra = "retry_delay = \"100ms\"\nmax_deliver = 2\n".into();
    let cfg = write_config(e.dir.path(), &e.nats, &e.db, &[h]);
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(&js, SUBJECT, &behave("trap", "evt_trap", 1, 10), &[]).await;
    publish(&js, SUBJECT, &behave("credit", "evt_ok", 2, 20), &[]).await;
    let s = host
        .wait_for("behave", "trap dead-lettered and credit processed", |s| {
            s.dead_lettered == 1 && s.processed == 1
        })
        .await;
    assert_eq!((s.traps, s.retried, s.delivered), (2, 1, 3));
    assert_eq!(e.db.balance(1).await, None);
    assert_eq!(e.db.balance(2).await, Some(20));
    assert_eq!(e.db.receipts("behave").await, 1);
    let dl = e.db.dead_letters("behave").await;
    assert_eq!(dl.len(), 1);
    assert_eq!(dl[0].0.as_deref(), Some("evt_trap"));
    assert!(dl[0].1.starts_with("trap: "), "reason: {}", dl[0].1);
    assert!(
        dl[0].1.contains("delivery 2 of max_deliver 2"),
        "reason: {}",
        dl[0].1
    );
    host.stop().await;
}
on_both_databases!(
    trap_rolls_back_and_host_keeps_serving,
    trap_rolls_back_and_host_keeps_serving
);

async fn reject_and_missing_identity_are_dead_lettered(backend: Backend) {
    let e = env(backend).await;
    let cfg = write_config(
        e.dir.path(),
        &e.nats,
        &e.db,
        &[HandlerSpec::new("behave", "behave")],
    );
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(&js, SUBJECT, &behave("reject", "evt_bad", 3, 30), &[]).await;
    publish(
        &js,
        SUBJECT,
        &json!({"op": "credit", "account_id": 3, "amount": 30}).to_string(),
        &[],
    )
    .await;
    let s = host
        .wait_for("behave", "2 dead letters", |s| s.dead_lettered == 2)
        .await;
    assert_eq!((s.processed, s.retried, s.delivered), (0, 0, 2));
    assert_eq!(e.db.balance(3).await, None);
    assert_eq!(e.db.receipts("behave").await, 0);
    let dl = e.db.dead_letters("behave").await;
    assert_eq!(dl.len(), 2);
    assert_eq!(dl[0].0.as_deref(), Some("evt_bad"));
    assert!(dl[0].1.starts_with("rejected: "), "reason: {}", dl[0].1);
    assert_eq!(dl[1].0, None);
    assert_eq!(dl[1].1, "missing identity: payload has no `/event_id`");
    // Termed: JetStream will not deliver them again.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(host.stats("behave").delivered, 2);
    host.stop().await;
}
on_both_databases!(
    reject_and_missing_identity_are_dead_lettered,
    reject_and_missing_identity_are_dead_lettered
);

async fn denied_statements_roll_back(backend: Backend) {
    let e = env(backend).await;
    // It exists, so it is refused for not being granted (on SQLite a missing
    // table would be SQLite's own compile error instead).
    e.db.execute("CREATE TABLE not_granted (id BIGINT PRIMARY KEY)")
        .await;
    let cfg = write_config(
        e.dir.path(),
        &e.nats,
        &e.db,
        &[HandlerSpec::new("behave", "behave")],
    );
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    let host_table = |name: &str| {
        format!(
            "rejected: denied: `{name}` names a host table; idem_* tables are never reachable from a handler"
        )
    };
    let statements = [
        ("DELETE FROM idem_receipts", host_table("idem_receipts")),
        (
            "INSERT INTO idem_dead_letters (consumer) VALUES ('x')",
            host_table("idem_dead_letters"),
        ),
        (
            "SELECT * FROM not_granted",
            "rejected: denied: table `not_granted` is not granted to this handler; grant it in [[handler]] tables"
                .to_string(),
        ),
    ];
    for (i, (sql, _)) in statements.iter().enumerate() {
        let p = json!({"op": "sql", "event_id": format!("evt_sql_{i}"), "sql": sql}).to_string();
        publish(&js, SUBJECT, &p, &[]).await;
    }
    let s = host
        .wait_for("behave", "3 dead letters", |s| s.dead_lettered == 3)
        .await;
    assert_eq!(s.processed, 0);
    assert_eq!(e.db.receipts("behave").await, 0);
    let mut dl = e.db.dead_letters("behave").await;
    dl.sort();
    let want: Vec<_> = statements
        .iter()
        .enumerate()
        .map(|(i, (_, reason))| (Some(format!("evt_sql_{i}")), reason.clone()))
        .collect();
    assert_eq!(dl, want);
    host.stop().await;
}
on_both_databases!(denied_statements_roll_back, denied_statements_roll_back);

async fn nak_delay_follows_the_backoff_list(backend: Backend) {
    let e = env(backend).await;
    let mut h = HandlerSpec::new("behave", "behave");
    h.extra = "backoff = [\"200ms\", \"30s\"]\nmax_deliver = 5\n".into();
    let cfg = write_config(e.dir.path(), &e.nats, &e.db, &[h]);
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(&js, SUBJECT, &behave("retry", "evt_b", 4, 10), &[]).await;
    // First failure: naked for 200 ms, so the second delivery comes quickly.
    host.wait_for("behave", "second delivery failed", |s| s.retried == 2)
        .await;
    // Second failure: naked for 30 s, so nothing more arrives meanwhile.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let s = host.stats("behave");
    assert_eq!(
        (s.delivered, s.retried, s.processed, s.dead_lettered),
        (2, 2, 0, 0)
    );
    assert_eq!(e.db.receipts("behave").await, 0);
    assert_eq!(e.db.balance(4).await, None);
    host.stop().await;
}
on_both_databases!(
    nak_delay_follows_the_backoff_list,
    nak_delay_follows_the_backoff_list
);

/// The identity rule (docs/semantics.md, "The protocol"), both sides, end to end: a JSON
/// integer and the string of its digits are one message; a JSON string is
/// exact (a leading space makes another message); a header value loses the
/// whitespace around it.
async fn identity_is_text_compared_byte_for_byte(backend: Backend) {
    let e = env(backend).await;
    let mut by_header = HandlerSpec::new("by-header", "behave");
    by_header.stream = "HDR".into();
    by_header.subjects = vec!["hdr.credit".into()];
    by_header.identity = "header:Event-Id".into();
    let cfg = write_config(
        e.dir.path(),
        &e.nats,
        &e.db,
        &[HandlerSpec::new("by-json", "behave"), by_header],
    );
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    for id in [json!(42), json!("42"), json!(" 42")] {
        let p = json!({"op": "credit", "event_id": id, "account_id": 1, "amount": 10});
        publish(&js, SUBJECT, &p.to_string(), &[]).await;
    }
    let s = host
        .wait_for("by-json", "3 deliveries", |s| {
            s.processed + s.duplicates == 3
        })
        .await;
    assert_eq!((s.processed, s.duplicates, s.dead_lettered), (2, 1, 0));
    assert_eq!(e.db.balance(1).await, Some(20));
    let mut ids = e.db.receipt_ids("by-json").await;
    ids.sort();
    assert_eq!(ids, vec![" 42".to_string(), "42".to_string()]);
    for id in ["m1", " m1\t", "m 1"] {
        let p = json!({"op": "credit", "account_id": 2, "amount": 5});
        publish(&js, "hdr.credit", &p.to_string(), &[("Event-Id", id)]).await;
    }
    let s = host
        .wait_for("by-header", "3 deliveries", |s| {
            s.processed + s.duplicates == 3
        })
        .await;
    assert_eq!((s.processed, s.duplicates, s.dead_lettered), (2, 1, 0));
    assert_eq!(e.db.balance(2).await, Some(10));
    let mut ids = e.db.receipt_ids("by-header").await;
    ids.sort();
    assert_eq!(ids, vec!["m 1".to_string(), "m1".to_string()]);
    host.stop().await;
}
on_both_databases!(
    identity_is_text_compared_byte_for_byte,
    identity_is_text_compared_byte_for_byte
);

/// A stream deleted and created again starts its sequences over: a dead
/// letter at a sequence an earlier one holds is a new row, never dropped.
async fn dead_letter_after_the_stream_is_created_again(backend: Backend) {
    let e = env(backend).await;
    let cfg = write_config(
        e.dir.path(),
        &e.nats,
        &e.db,
        &[HandlerSpec::new("behave", "behave")],
    );
    let js = e.nats.jetstream().await;
    let reject = |id: &str| json!({"op": "reject", "event_id": id, "reason": id}).to_string();
    let host = RunningHost::start(&cfg).await;
    publish(&js, SUBJECT, &reject("p1"), &[]).await;
    host.wait_for("behave", "p1 dead-lettered", |s| s.dead_lettered == 1)
        .await;
    host.stop().await;
    js.delete_stream("ACCOUNTS").await.unwrap();
    let host = RunningHost::start(&cfg).await;
    publish(&js, SUBJECT, &reject("p2"), &[]).await;
    let s = host
        .wait_for("behave", "p2 dead-lettered", |s| s.dead_lettered == 1)
        .await;
    assert_eq!((s.delivered, s.dead_lettered, s.processed), (1, 1, 0));
    host.stop().await;
    let mut dl = e.db.dead_letters("behave").await;
    dl.sort();
    assert_eq!(
        dl,
        vec![
            (Some("p1".to_string()), "rejected: p1".to_string()),
            (Some("p2".to_string()), "rejected: p2".to_string()),
        ]
    );
    let seqs = e
        .db
        .scalar("SELECT count(*) FROM idem_dead_letters WHERE consumer = 'behave' AND stream_sequence = 1")
        .await;
    assert_eq!(seqs, Some(2));
}
on_both_databases!(
    dead_letter_after_the_stream_is_created_again,
    dead_letter_after_the_stream_is_created_again
);

/// A copy of a message this host saw committed is acked as a duplicate
/// after one read of its receipt, without a transaction (ARCHITECTURE.md,
/// "Duplicates this host committed"): it goes through while another
/// session keeps every writer out, where a new message waits.
async fn a_copy_this_host_committed_is_acked_without_a_transaction(backend: Backend) {
    let e = env(backend).await;
    let cfg = write_config(
        e.dir.path(),
        &e.nats,
        &e.db,
        &[HandlerSpec::new("credit-projector", "credit")],
    );
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(&js, SUBJECT, &credit("evt_1", 7, 100), &[]).await;
    host.wait_for("credit-projector", "evt_1", |s| s.processed == 1)
        .await;
    // Another session holds the write lock (SQLite) or locks the receipts
    // table against every writer (PostgreSQL): no receipt can be inserted;
    // reading one still works.
    let pool = e.db.pool().await;
    let mut locker = pool.acquire().await.unwrap();
    let lock = match backend {
        Backend::Sqlite => "BEGIN IMMEDIATE",
        Backend::Postgres => "BEGIN; LOCK TABLE idem_receipts IN EXCLUSIVE MODE",
    };
    sqlx::raw_sql(lock).execute(&mut *locker).await.unwrap();
    publish(&js, SUBJECT, &credit("evt_1", 7, 100), &[]).await;
    publish(&js, SUBJECT, &credit("evt_2", 7, 5), &[]).await;
    let s = host
        .wait_for("credit-projector", "the copy of evt_1", |s| {
            s.duplicates == 1
        })
        .await;
    assert_eq!(s.processed, 1);
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *locker)
        .await
        .unwrap();
    drop(locker);
    pool.close().await;
    let s = host
        .wait_for_within(
            "credit-projector",
            "evt_2",
            std::time::Duration::from_secs(30),
            |s| s.processed == 2,
        )
        .await;
    assert_eq!(
        (s.processed, s.duplicates, s.retried, s.dead_lettered),
        (2, 1, 0, 0)
    );
    assert_eq!(e.db.balance(7).await, Some(105));
    assert_eq!(
        e.db.receipt_ids("credit-projector").await,
        vec!["evt_1".to_string(), "evt_2".to_string()]
    );
    host.stop().await;
}
on_both_databases!(
    a_copy_this_host_committed_is_acked_without_a_transaction,
    a_copy_this_host_committed_is_acked_without_a_transaction
);
