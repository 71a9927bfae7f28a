//! Batching (ARCHITECTURE.md, "Batching"): several deliveries in one
//! transaction, each in its own savepoint, on PostgreSQL and SQLite,
//! against a private nats-server. The other suites run again with
//! `IDEM_TEST_BATCH` (scripts/test.sh).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use serde_json::json;

const SUBJECT: &str = "accounts.credit";

fn behave(op: &str, event_id: &str, account: i64, amount: i64) -> String {
    json!({"op": op, "event_id": event_id, "account_id": account, "amount": amount}).to_string()
}

/// A private nats-server, a fresh database of `backend`, and a config
/// (in the returned directory) with one handler `name` running `guest` with
/// the `extra` TOML lines.
async fn setup(
    backend: Backend,
    name: &str,
    guest: &str,
    extra: &str,
) -> (Nats, TestDb, tempfile::TempDir, std::path::PathBuf) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new(name, guest);
    h.extra = extra.into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    (nats, db, dir, cfg)
}

/// One batch holds messages that apply, a copy of one of them, one that
/// writes then rejects, one that asks to be retried, one that writes then
/// traps at its deadline, and one without a message id. What applies
/// commits together; each failure is rolled back alone (its writes and its
/// receipt) and settled as it would be alone; the copy is a duplicate.
async fn a_batch_commits_together_and_fails_alone(backend: Backend) {
    let (nats, db, _dir, cfg) = setup(
        backend,
        "behave",
        "behave",
        "retry_delay = \"200ms\"\ndeadline = \"1s\"\nbatch = 16\nbatch_linger = \"500ms\"\n",
    )
    .await;
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    let loop_once =
        json!({"op": "credit-then-loop-once", "event_id": "e5", "account_id": 4, "amount": 5});
    let credit_then_reject = json!({"op": "credit-then", "event_id": "e3", "account_id": 1,
        "amount": 1000, "then": {"op": "reject"}});
    for payload in [
        behave("credit", "e1", 1, 100),
        behave("credit", "e2", 2, 10),
        behave("credit", "e1", 1, 100),
        credit_then_reject.to_string(),
        behave("retry-once-then-credit", "e4", 3, 7),
        loop_once.to_string(),
        json!({"op": "credit", "account_id": 9, "amount": 1}).to_string(),
        behave("credit", "e6", 1, 1),
    ] {
        publish(&js, SUBJECT, &payload, &[]).await;
    }
    let s = host
        .wait_for("behave", "every message settled", |s| {
            s.processed == 5 && s.dead_lettered == 2 && s.duplicates == 1
        })
        .await;
    assert_eq!(
        (s.delivered, s.retried, s.traps, s.db_pauses),
        (10, 2, 1, 0),
        "{s}"
    );
    // The first batch: e1, e2, e3, e4, e5, e6 (the copy of e1 and the
    // message without an id ran alone after it).
    assert!(s.batched >= 6, "{s}");
    assert_eq!(db.balance(1).await, Some(101));
    assert_eq!(db.balance(2).await, Some(10));
    assert_eq!(db.balance(3).await, Some(7));
    assert_eq!(db.balance(4).await, Some(5));
    assert_eq!(db.balance(9).await, None);
    let mut ids = db.receipt_ids("behave").await;
    ids.sort();
    assert_eq!(ids, ["e1", "e2", "e4", "e5", "e6"]);
    let dl = db.dead_letters("behave").await;
    assert_eq!(dl.len(), 2, "{dl:?}");
    assert_eq!(dl[0].0.as_deref(), Some("e3"));
    assert!(dl[0].1.starts_with("rejected: "), "{dl:?}");
    assert_eq!(dl[1].0, None);
    // Every delivery was acked or termed: the server read the batch's plain
    // acks before it answered the last one, confirmed, and the counters
    // move only after that answer.
    let info = idem_tests::chaos::consumer_info(&js, "ACCOUNTS", "behave")
        .await
        .expect("the consumer's info");
    assert_eq!(
        (info.num_pending, info.num_ack_pending),
        (0, 0),
        "{}",
        idem_tests::chaos::describe_consumer(&info)
    );
    host.stop().await;
}
on_both_databases!(
    a_batch_commits_together_and_fails_alone,
    a_batch_commits_together_and_fails_alone
);

/// Copies of the same messages in batches that run at once (four
/// transactions of up to eight messages, on three accounts in every order):
/// the receipts arbitrate every copy, so each message applies once. On
/// PostgreSQL two batches that lock the same accounts in opposite orders
/// deadlock; the loser's message runs again alone, spending no delivery
/// (nothing is retried).
async fn copies_across_concurrent_batches_apply_once(backend: Backend) {
    let (nats, db, _dir, cfg) = setup(
        backend,
        "credit-projector",
        "credit",
        "retry_delay = \"200ms\"\nconcurrency = 3\nbatch = 8\nbatch_linger = \"20ms\"\n",
    )
    .await;
    let js = nats.jetstream().await;
    let host = RunningHost::start(&cfg).await;
    let messages = 30;
    let mut want = [0i64; 3];
    for i in 0..messages {
        want[i % 3] += i as i64 + 1;
    }
    for round in 0..2 {
        for i in 0..messages {
            let id = format!("e{i}");
            publish(
                &js,
                SUBJECT,
                &credit(&id, (i % 3) as i64, i as i64 + 1),
                &[],
            )
            .await;
        }
        if round == 0 {
            // Let some batches start before the copies arrive.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    let s = host
        .wait_for("credit-projector", "every copy settled", |s| {
            s.processed + s.duplicates == 2 * messages as u64
        })
        .await;
    assert_eq!(
        (s.processed, s.duplicates, s.retried, s.dead_lettered),
        (messages as u64, messages as u64, 0, 0),
        "{s}"
    );
    for (account, want) in want.iter().enumerate() {
        assert_eq!(
            db.balance(account as i64).await,
            Some(*want),
            "account {account}"
        );
    }
    assert_eq!(db.receipts("credit-projector").await, messages as i64);
    host.stop().await;
}
on_both_databases!(
    copies_across_concurrent_batches_apply_once,
    copies_across_concurrent_batches_apply_once
);

/// A statement that takes a while but stays well within the deadline (a
/// recursive CTE the guard allows).
fn slow_sql(rows: u64) -> String {
    format!(
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < {rows}) SELECT count(*) FROM r"
    )
}

/// A batch of slow messages holds the row lock of its first message until
/// its COMMIT; a transaction stops taking messages after a quarter of the
/// deadline, so a message that meanwhile runs alone on the same row (`v`),
/// or a copy of that first message (`x`, waiting on its receipt), waits
/// for less than its deadline and spends no delivery (`max_deliver = 1`:
/// any spent delivery would be a dead letter).
async fn a_long_batch_does_not_fail_messages_that_wait_for_it(backend: Backend) {
    let (nats, db, _dir, cfg) = setup(backend, "behave", "behave", "retry_delay = \"200ms\"\ndeadline = \"2s\"\nmax_deliver = 1\nconcurrency = 2\nbatch = 32\nbatch_linger = \"300ms\"\npull_batch = 64\nack_wait = \"60s\"\n").await;
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    let x = json!({"op": "credit", "event_id": "x", "account_id": 1, "amount": 100}).to_string();
    publish(&js, SUBJECT, &x, &[]).await;
    let mates = 15;
    for i in 0..mates {
        let p = json!({"op": "credit-then", "event_id": format!("s{i:02}"),
            "account_id": 100 + i, "amount": 1,
            "then": {"op": "sql", "sql": slow_sql(400_000)}});
        publish(&js, SUBJECT, &p.to_string(), &[]).await;
    }
    // The batch has started (its linger is over) and applied `x` first.
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    publish(&js, SUBJECT, &behave("credit", "v", 1, 5), &[]).await;
    publish(&js, SUBJECT, &x, &[]).await;
    let s = host
        .wait_for_within(
            "behave",
            "every message settled",
            std::time::Duration::from_secs(90),
            |s| s.processed + s.duplicates + s.dead_lettered == mates as u64 + 3,
        )
        .await;
    let dl = db.dead_letters("behave").await;
    assert!(
        dl.is_empty(),
        "deliveries spent waiting for a batch: {dl:?}"
    );
    assert_eq!(
        (s.processed, s.duplicates, s.retried),
        (mates as u64 + 2, 1, 0),
        "{s}"
    );
    assert_eq!(db.balance(1).await, Some(105));
    host.stop().await;
}
on_both_databases!(
    a_long_batch_does_not_fail_messages_that_wait_for_it,
    a_long_batch_does_not_fail_messages_that_wait_for_it
);

/// A message that traps at its deadline in the middle of a statement costs
/// only itself: the statement is cancelled by the statement timeout, the
/// message rolled back to its savepoint (on PostgreSQL the first answer is
/// the cancelled statement's, so the rollback is tried again), and its
/// batch-mates commit in the batch.
async fn a_trap_mid_statement_costs_only_its_message(backend: Backend) {
    let (nats, db, _dir, cfg) = setup(backend, "behave", "behave", "retry_delay = \"200ms\"\ndeadline = \"1s\"\nmax_deliver = 1\nbatch = 4\nbatch_linger = \"300ms\"\n").await;
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    // The trapping message last: a transaction takes no message after a
    // quarter of the deadline.
    for p in [
        behave("credit", "a", 1, 1),
        behave("credit", "b", 3, 1),
        json!({"op": "credit-then", "event_id": "t", "account_id": 2, "amount": 1,
            "then": {"op": "sql", "sql": slow_sql(2_000_000_000)}})
        .to_string(),
    ] {
        publish(&js, SUBJECT, &p, &[]).await;
    }
    let s = host
        .wait_for_within(
            "behave",
            "settled",
            std::time::Duration::from_secs(30),
            |s| s.processed + s.dead_lettered == 3,
        )
        .await;
    assert_eq!(
        (s.processed, s.dead_lettered, s.traps, s.batched),
        (2, 1, 1, 3),
        "{s}"
    );
    assert_eq!(db.balance(1).await, Some(1));
    assert_eq!(db.balance(2).await, None);
    assert_eq!(db.balance(3).await, Some(1));
    let mut ids = db.receipt_ids("behave").await;
    ids.sort();
    assert_eq!(ids, ["a", "b"]);
    host.stop().await;
}
on_both_databases!(
    a_trap_mid_statement_costs_only_its_message,
    a_trap_mid_statement_costs_only_its_message
);

/// `batch = "auto"`: a backlog is taken in batches of what the pulls have
/// brought, and messages that arrive one at a time on an idle stream each
/// run alone, at once (no batch is formed for them).
async fn auto_batches_follow_the_backlog(backend: Backend) {
    let (nats, db, _dir, cfg) = setup(
        backend,
        "credit-projector",
        "credit",
        "batch = \"auto\"\npull_batch = 32\nack_wait = \"60s\"\ndeadline = \"1s\"\n",
    )
    .await;
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    let js = nats.jetstream().await;
    for i in 0..40 {
        publish(&js, SUBJECT, &credit(&format!("b{i}"), i % 4, 1), &[]).await;
    }
    let host = RunningHost::start(&cfg).await;
    let backlog = host
        .wait_for("credit-projector", "the backlog processed", |s| {
            s.processed == 40
        })
        .await;
    assert!(
        backlog.batched > 0,
        "no batch formed from a backlog: {backlog}"
    );
    for i in 0..5 {
        publish(&js, SUBJECT, &credit(&format!("idle{i}"), 9, 1), &[]).await;
        host.wait_for("credit-projector", "an idle message processed", |s| {
            s.processed == 41 + i
        })
        .await;
    }
    let s = host.stats("credit-projector");
    assert_eq!(
        (s.processed, s.duplicates, s.retried, s.batched),
        (45, 0, 0, backlog.batched),
        "{s}"
    );
    host.stop().await;
    for account in 0..4 {
        assert_eq!(db.balance(account).await, Some(10));
    }
    assert_eq!(db.balance(9).await, Some(5));
}
on_both_databases!(
    auto_batches_follow_the_backlog,
    auto_batches_follow_the_backlog
);

/// Holds the row of account `account` locked (PostgreSQL): a connection
/// with an open transaction that updated it; `ROLLBACK` on it releases it.
async fn lock_row(db: &TestDb, account: i64) -> sqlx::PgConnection {
    use sqlx::Connection as _;
    db.execute(&format!(
        "INSERT INTO accounts (account_id, balance) VALUES ({account}, 0)"
    ))
    .await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; UPDATE accounts SET balance = balance WHERE account_id = {account}"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    conn
}

/// Releases [`lock_row`]'s lock.
async fn unlock(mut conn: sqlx::PgConnection) {
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await.unwrap();
}

/// The batch [r, c, k]: `r` asks to be retried on its first delivery (and
/// credits account 3 on a later one), `c` credits account 1, and `k`
/// credits account 7, whose row the test holds locked, so `k` loses the
/// batch's lock wait and then waits alone after the batch's COMMIT.
async fn publish_batch_with_a_blocked_tail(js: &async_nats::jetstream::Context) {
    for p in [
        behave("retry-once-then-credit", "r", 3, 7),
        behave("credit", "c", 1, 100),
        behave("credit", "k", 7, 1),
    ] {
        publish(js, SUBJECT, &p, &[]).await;
    }
}

/// A member of a batch that was naked keeps its nak's delay while its
/// batch-mates still run: its in-progress keep-alive ended when it was
/// settled (ack_wait 3 s, a keep-alive every second, retry_delay 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_naked_member_comes_back_after_its_delay_postgres() {
    let (nats, db, _dir, cfg) = setup(Backend::Postgres, "behave", "behave", "retry_delay = \"2s\"\ndeadline = \"20s\"\nack_wait = \"3s\"\nconcurrency = 2\nbatch = 4\nbatch_linger = \"300ms\"\n").await;
    let host = RunningHost::start(&cfg).await;
    let lock = lock_row(&db, 7).await;
    let js = nats.jetstream().await;
    publish_batch_with_a_blocked_tail(&js).await;
    host.wait_for("behave", "r naked, c applied", |s| {
        s.retried == 1 && s.processed == 1
    })
    .await;
    let naked = std::time::Instant::now();
    let s = host
        .wait_for_within(
            "behave",
            "r applied",
            std::time::Duration::from_secs(6),
            |s| s.processed == 2,
        )
        .await;
    // `k` still waits for the lock: `r` came back on its own delay.
    assert_eq!((s.processed, s.retried), (2, 1), "{s}");
    assert!(naked.elapsed() < std::time::Duration::from_secs(6));
    assert_eq!(db.balance(3).await, Some(7));
    unlock(lock).await;
    let s = host
        .wait_for("behave", "k applied", |s| s.processed == 3)
        .await;
    assert_eq!((s.processed, s.retried, s.dead_lettered), (3, 1, 0), "{s}");
    assert_eq!(db.balance(7).await, Some(1));
    host.stop().await;
}

/// A stop whose grace ends while a batch's task still runs gives back only
/// the members not yet settled: `r`, naked with a 60 s delay, is not
/// delivered again at once to the next host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_gives_back_only_unsettled_members_postgres() {
    let (nats, db, _dir, cfg) = setup(
        Backend::Postgres,
        "behave",
        "behave",
        "retry_delay = \"60s\"\ndeadline = \"20s\"\nbatch = 4\nbatch_linger = \"300ms\"\n",
    )
    .await;
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("[service]\nshutdown_grace = \"1s\"\n");
    std::fs::write(&cfg, text).unwrap();
    let host = RunningHost::start(&cfg).await;
    let lock = lock_row(&db, 7).await;
    let js = nats.jetstream().await;
    publish_batch_with_a_blocked_tail(&js).await;
    host.wait_for("behave", "r naked, c applied", |s| {
        s.retried == 1 && s.processed == 1
    })
    .await;
    host.stop().await;
    unlock(lock).await;
    // The next host gets `k` (given back) at once, and `r` only after its
    // 60 s delay.
    let host = RunningHost::start(&cfg).await;
    let s = host
        .wait_for("behave", "k applied", |s| s.processed == 1)
        .await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let s2 = host.stats("behave");
    assert_eq!((s.processed, s2.processed, s2.delivered), (1, 1, 1), "{s2}");
    assert_eq!(db.balance(3).await, None);
    assert_eq!(db.balance(1).await, Some(100));
    assert_eq!(db.balance(7).await, Some(1));
    host.stop().await;
}
