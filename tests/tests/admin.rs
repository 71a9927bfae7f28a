//! The operator commands: `idem dlq list|show|redrive|drop` and
//! `idem receipts show|prune|forget`, run as the real CLI binary against
//! dead letters and receipts a real host wrote (real nats-server,
//! PostgreSQL and SQLite), asserting exact output, row counts and balances.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::store::{Database, PRUNE_LOCK_KEY};
use idem_tests::*;
use serde_json::json;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

const SUBJECT: &str = "accounts.credit";

/// Runs the idem CLI; returns (exit code, stdout, stderr).
async fn idem(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
        .args(args)
        .arg("--config")
        .arg(cfg)
        .env("RUST_LOG", "off")
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the CLI and asserts it succeeded with nothing on stderr; returns stdout.
async fn ok(cfg: &Path, args: &[&str]) -> String {
    let (code, out, err) = idem(cfg, args).await;
    assert_eq!((code, err.as_str()), (0, ""), "idem {args:?}: stdout {out}");
    out
}

/// Runs the CLI and asserts it failed (exit 1, nothing on stdout) with
/// exactly `idem: <error>` on stderr.
async fn fails(cfg: &Path, args: &[&str], error: &str) {
    let (code, out, err) = idem(cfg, args).await;
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (1, "", format!("idem: {error}\n").as_str()),
        "idem {args:?}"
    );
}

/// Seconds since the Unix epoch of an RFC 3339 UTC time `YYYY-MM-DDThh:mm:ssZ`.
fn unix_secs(t: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19)
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn is_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 20
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// `s` with every RFC 3339 time replaced by `YYYY-MM-DDThh:mm:ssZ` (same
/// width, so column alignment is kept), after asserting each one is within
/// ten minutes of now.
fn mask_recent_times(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while !rest.is_empty() {
        if rest.len() >= 20 && rest.is_char_boundary(20) && is_time(&rest[..20]) {
            let age = now_secs() - unix_secs(&rest[..20]);
            assert!(
                (-600..600).contains(&age),
                "time {} is not now",
                &rest[..20]
            );
            out.push_str("YYYY-MM-DDThh:mm:ssZ");
            rest = &rest[20..];
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// What `idem dlq list` prints for a reason longer than 100 characters.
fn short(reason: &str) -> String {
    if reason.chars().count() <= 100 {
        return reason.to_string();
    }
    let mut s: String = reason.chars().take(99).collect();
    s.push('…');
    s
}

/// The `behave` op that credits `amount` to an account that must already
/// exist: the upsert's value is NULL for a missing account, so NOT NULL
/// rejects it ("a guest that rejects when an account row is missing").
fn credit_existing(event_id: &str, account: i64, amount: i64) -> String {
    json!({
        "op": "sql",
        "event_id": event_id,
        "sql": format!(
            "INSERT INTO accounts (account_id, balance) \
             VALUES ({account}, (SELECT balance FROM accounts WHERE account_id = {account}) + {amount}) \
             ON CONFLICT (account_id) DO UPDATE SET balance = excluded.balance"
        ),
    })
    .to_string()
}

/// The dead-letter reason of [`credit_existing`] for a missing account.
fn missing_account_reason(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => {
            "rejected: constraint-violation: null value in column \"balance\" of relation \
             \"accounts\" violates not-null constraint (SQLSTATE 23502)"
        }
        Backend::Sqlite => {
            "rejected: constraint-violation: NOT NULL constraint failed: accounts.balance \
             (SQLite code 1299)"
        }
    }
}

const NO_ID: &str = "missing identity: payload has no `/event_id`";

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

impl Env {
    /// A config with one `behave` handler plus `extra` TOML lines.
    fn config(&self, extra: &str) -> std::path::PathBuf {
        let mut h = HandlerSpec::new("behave", "behave");
        h.extra = format!("retry_delay = \"100ms\"\n{extra}");
        write_config(self.dir.path(), &self.nats, &self.db, &[h])
    }

    /// Ids of `consumer`'s dead letters, in order.
    async fn dead_letter_ids(&self, consumer: &str) -> Vec<i64> {
        let pool = self.db.pool().await;
        let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT id FROM idem_dead_letters WHERE consumer = '{consumer}' ORDER BY id"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        ids
    }

    /// Host tables without running a host.
    async fn host_tables(&self) {
        let store = Database::connect(&self.db.url, 1).await.unwrap();
        store.prepare_host_tables().await.unwrap();
        store.close().await;
    }
}

/// A guest rejected a message for a reason since fixed (its account was
/// missing); redriving it before the fix fails and keeps the row, after the
/// fix applies the effect exactly once and removes the row; a second redrive
/// finds nothing. A permanent rejection fails again; a dead letter without
/// a message id is refused; drop removes what is left.
async fn redrive_applies_a_fixed_rejection_once(backend: Backend) {
    let e = env(backend).await;
    let cfg = e.config("");
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(&js, SUBJECT, &credit_existing("evt_fix", 7, 25), &[]).await;
    let bad = json!({"op": "reject", "event_id": "evt_bad", "reason": "bad event"});
    publish(&js, SUBJECT, &bad.to_string(), &[("X-Trace", "t-1")]).await;
    let no_id = json!({"op": "credit", "account_id": 3, "amount": 30});
    publish(&js, SUBJECT, &no_id.to_string(), &[]).await;
    let good = json!({"op": "credit", "event_id": "evt_ok", "account_id": 8, "amount": 10});
    publish(&js, SUBJECT, &good.to_string(), &[]).await;
    let s = host
        .wait_for("behave", "3 dead letters, 1 processed", |s| {
            s.dead_lettered == 3 && s.processed == 1
        })
        .await;
    assert_eq!((s.delivered, s.retried), (4, 0));
    host.stop().await;
    let missing = missing_account_reason(backend);

    let list = ok(&cfg, &["dlq", "list"]).await;
    assert_eq!(
        mask_recent_times(&list),
        format!(
            "ID  HANDLER  MESSAGE  SEQ  SUBJECT          DEAD-LETTERED         REASON\n\
             1   behave   evt_fix  1    accounts.credit  YYYY-MM-DDThh:mm:ssZ  {}\n\
             2   behave   evt_bad  2    accounts.credit  YYYY-MM-DDThh:mm:ssZ  rejected: bad event\n\
             3   behave   -        3    accounts.credit  YYYY-MM-DDThh:mm:ssZ  {NO_ID}\n",
            short(missing)
        )
    );
    assert_eq!(
        ok(&cfg, &["dlq", "list", "--handler", "behave"]).await,
        list
    );
    assert_eq!(
        ok(&cfg, &["dlq", "list", "--handler", "other"]).await,
        "no dead letters of handler other\n"
    );
    let show = ok(&cfg, &["dlq", "show", "2"]).await;
    assert_eq!(
        mask_recent_times(&show),
        format!(
            "id: 2\nhandler: behave\nmessage id: evt_bad\nstream: ACCOUNTS\nstream sequence: 2\n\
             subject: accounts.credit\ndead-lettered: YYYY-MM-DDThh:mm:ssZ\n\
             reason: rejected: bad event\nheaders:\n  X-Trace: t-1\n\
             payload: {} bytes, UTF-8 text:\n{bad}\n",
            bad.to_string().len()
        )
    );

    // Before the fix: fails again, rolled back, nothing changes.
    fails(
        &cfg,
        &["dlq", "redrive", "1"],
        &format!(
            "dead letter 1 (handler behave, message evt_fix) failed again: {missing}; \
             rolled back, the dead letter stays"
        ),
    )
    .await;
    assert_eq!(e.dead_letter_ids("behave").await, [1, 2, 3]);
    assert_eq!(e.db.receipt_ids("behave").await, ["evt_ok"]);
    assert_eq!(e.db.balance(7).await, None);

    // The fix: the account exists. Now the effect applies once, with its
    // receipt, and the dead letter goes, all in one transaction.
    e.db.execute("INSERT INTO accounts (account_id, balance) VALUES (7, 100)")
        .await;
    assert_eq!(
        ok(&cfg, &["dlq", "redrive", "1"]).await,
        "dead letter 1 (handler behave, message evt_fix): processed; dead letter removed\n"
    );
    assert_eq!(e.db.balance(7).await, Some(125));
    assert_eq!(e.db.receipt_ids("behave").await, ["evt_fix", "evt_ok"]);
    assert_eq!(e.dead_letter_ids("behave").await, [2, 3]);
    // The receipt names the dead letter's stream sequence.
    let receipt = ok(
        &cfg,
        &["receipts", "show", "--handler", "behave", "evt_fix"],
    )
    .await;
    assert!(
        receipt.starts_with("handler: behave\nmessage id: evt_fix\nstream sequence: 1\n"),
        "{receipt}"
    );

    // A second redrive of the same dead letter: gone, nothing runs.
    fails(
        &cfg,
        &["dlq", "redrive", "1"],
        "no dead letter with id 1; `idem dlq list` shows the ids",
    )
    .await;
    assert_eq!(e.db.balance(7).await, Some(125));
    assert_eq!(e.db.receipts("behave").await, 2);

    // A permanent rejection fails again and stays.
    fails(
        &cfg,
        &["dlq", "redrive", "2"],
        "dead letter 2 (handler behave, message evt_bad) failed again: rejected: bad event; \
         rolled back, the dead letter stays",
    )
    .await;
    // No message id: cannot be proven new.
    fails(
        &cfg,
        &["dlq", "redrive", "3"],
        &format!(
            "dead letter 3 (handler behave, message -) has no message id ({NO_ID}), so a \
             redrive cannot be proven new; drop it with `idem dlq drop 3`, or republish the \
             message with an id"
        ),
    )
    .await;
    assert_eq!(e.dead_letter_ids("behave").await, [2, 3]);
    assert_eq!(e.db.receipts("behave").await, 2);
    assert_eq!(e.db.balance(3).await, None);

    // Drop one, then the rest of the handler's.
    assert_eq!(
        ok(&cfg, &["dlq", "drop", "2"]).await,
        "dropped 1 dead letter (id 2)\n"
    );
    fails(
        &cfg,
        &["dlq", "drop", "2"],
        "no dead letter with id 2; `idem dlq list` shows the ids",
    )
    .await;
    assert_eq!(e.dead_letter_ids("behave").await, [3]);
    assert_eq!(
        ok(&cfg, &["dlq", "drop", "--handler", "behave", "--all"]).await,
        "dropped 1 dead letter of handler behave\n"
    );
    assert_eq!(ok(&cfg, &["dlq", "list"]).await, "no dead letters\n");
    // Nothing else moved.
    assert_eq!(e.db.balance(7).await, Some(125));
    assert_eq!(e.db.balance(8).await, Some(10));
    assert_eq!(e.db.receipts("behave").await, 2);
}
on_both_databases!(
    redrive_applies_a_fixed_rejection_once,
    redrive_applies_a_fixed_rejection_once
);

/// A dead letter whose message id got a receipt since (the producer
/// republished the event, fixed): the redrive commits only the removal.
async fn redrive_of_an_already_processed_message_only_removes_the_row(backend: Backend) {
    let e = env(backend).await;
    let cfg = e.config("");
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    let rejected = json!({"op": "reject", "event_id": "evt_dup", "account_id": 5, "amount": 40});
    publish(&js, SUBJECT, &rejected.to_string(), &[]).await;
    host.wait_for("behave", "dead letter", |s| s.dead_lettered == 1)
        .await;
    let fixed = json!({"op": "credit", "event_id": "evt_dup", "account_id": 5, "amount": 40});
    publish(&js, SUBJECT, &fixed.to_string(), &[]).await;
    host.wait_for("behave", "processed", |s| s.processed == 1)
        .await;
    // Redriven while the host runs.
    assert_eq!(
        ok(&cfg, &["dlq", "redrive", "1"]).await,
        "dead letter 1 (handler behave, message evt_dup): already processed; dead letter removed\n"
    );
    assert_eq!(e.dead_letter_ids("behave").await, Vec::<i64>::new());
    assert_eq!(e.db.balance(5).await, Some(40));
    assert_eq!(e.db.receipt_ids("behave").await, ["evt_dup"]);
    let s = host.stop().await;
    assert_eq!((s[0].1.processed, s[0].1.dead_lettered), (1, 1));
}
on_both_databases!(
    redrive_of_an_already_processed_message_only_removes_the_row,
    redrive_of_an_already_processed_message_only_removes_the_row
);

/// Two redrives of one dead letter at once: the row lock (PostgreSQL) or
/// the write lock (SQLite) lets one run the handler; the other finds the
/// row gone. The effect applies once.
async fn concurrent_redrives_apply_once(backend: Backend) {
    let e = env(backend).await;
    let cfg = e.config("");
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(&js, SUBJECT, &credit_existing("evt_c", 6, 15), &[]).await;
    host.wait_for("behave", "dead letter", |s| s.dead_lettered == 1)
        .await;
    host.stop().await;
    e.db.execute("INSERT INTO accounts (account_id, balance) VALUES (6, 100)")
        .await;
    let (a, b) = tokio::join!(
        idem(&cfg, &["dlq", "redrive", "1"]),
        idem(&cfg, &["dlq", "redrive", "1"])
    );
    let processed = (
        0,
        "dead letter 1 (handler behave, message evt_c): processed; dead letter removed\n"
            .to_string(),
        String::new(),
    );
    let gone = |r: &(i32, String, String)| {
        r.0 == 1
            && r.1.is_empty()
            && (r.2 == "idem: no dead letter with id 1; `idem dlq list` shows the ids\n"
                || r.2
                    == "idem: dead letter 1 (handler behave, message evt_c) is gone (dropped or redriven meanwhile)\n")
    };
    assert!(
        (a == processed && gone(&b)) || (b == processed && gone(&a)),
        "{a:?} {b:?}"
    );
    assert_eq!(e.db.balance(6).await, Some(115));
    assert_eq!(e.db.receipt_ids("behave").await, ["evt_c"]);
    assert_eq!(e.dead_letter_ids("behave").await, Vec::<i64>::new());
}
on_both_databases!(
    concurrent_redrives_apply_once,
    concurrent_redrives_apply_once
);

/// `--handler NAME --all` redrives in id order, each in its own
/// transaction, past failures, and says what stays.
async fn redrive_all_continues_past_failures(backend: Backend) {
    let e = env(backend).await;
    let cfg = e.config("max_deliver = 1\n");
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    publish(&js, SUBJECT, &credit_existing("evt_a", 7, 25), &[]).await;
    let b = json!({"op": "reject", "event_id": "evt_b"});
    publish(&js, SUBJECT, &b.to_string(), &[]).await;
    let c = json!({"op": "credit", "account_id": 7, "amount": 1000});
    publish(&js, SUBJECT, &c.to_string(), &[]).await;
    publish(&js, SUBJECT, &credit_existing("evt_d", 7, 5), &[]).await;
    // Retries on delivery 1; a redrive is delivery 1 again, so it fails again.
    let r =
        json!({"op": "retry-once-then-credit", "event_id": "evt_e", "account_id": 7, "amount": 9});
    publish(&js, SUBJECT, &r.to_string(), &[]).await;
    host.wait_for("behave", "5 dead letters", |s| s.dead_lettered == 5)
        .await;
    host.stop().await;
    e.db.execute("INSERT INTO accounts (account_id, balance) VALUES (7, 100)")
        .await;

    let (code, out, err) = idem(&cfg, &["dlq", "redrive", "--handler", "behave", "--all"]).await;
    assert_eq!(
        out,
        format!(
            "dead letter 1 (handler behave, message evt_a): processed; dead letter removed\n\
             dead letter 2 (handler behave, message evt_b) failed again: rejected: asked to; rolled back, the dead letter stays\n\
             dead letter 3 (handler behave, message -) has no message id ({NO_ID}), so a redrive cannot be proven new; drop it with `idem dlq drop 3`, or republish the message with an id\n\
             dead letter 4 (handler behave, message evt_d): processed; dead letter removed\n\
             dead letter 5 (handler behave, message evt_e) failed again: retry: first delivery; rolled back, the dead letter stays\n\
             handler behave: 2 processed, 0 already processed, 2 failed, 1 without a message id\n"
        )
    );
    assert_eq!(
        (code, err.as_str()),
        (
            1,
            "idem: 3 dead letters of handler behave not redriven (see above); they stay\n"
        )
    );
    assert_eq!(e.db.balance(7).await, Some(130));
    assert_eq!(e.db.receipt_ids("behave").await, ["evt_a", "evt_d"]);
    assert_eq!(e.dead_letter_ids("behave").await, [2, 3, 5]);

    // Again: the processed ones are gone, the rest fail the same way.
    let (code, out, _) = idem(&cfg, &["dlq", "redrive", "--handler", "behave", "--all"]).await;
    assert_eq!(code, 1);
    assert!(
        out.ends_with(
            "handler behave: 0 processed, 0 already processed, 2 failed, 1 without a message id\n"
        ),
        "{out}"
    );
    assert_eq!(e.db.balance(7).await, Some(130));
    assert_eq!(e.db.receipts("behave").await, 2);

    // Once only the empty remains: nothing to do is success.
    ok(&cfg, &["dlq", "drop", "--handler", "behave", "--all"]).await;
    assert_eq!(
        ok(&cfg, &["dlq", "redrive", "--handler", "behave", "--all"]).await,
        "no dead letters of handler behave\n"
    );
}
on_both_databases!(
    redrive_all_continues_past_failures,
    redrive_all_continues_past_failures
);

/// Forgetting a receipt is a deliberate reprocess: the same message id,
/// published again, runs again (the balance doubles exactly).
async fn forget_then_republish_runs_again(backend: Backend) {
    let e = env(backend).await;
    let cfg = e.config("");
    let host = RunningHost::start(&cfg).await;
    let js = e.nats.jetstream().await;
    let credit = json!({"op": "credit", "event_id": "evt_f", "account_id": 9, "amount": 50});
    publish(&js, SUBJECT, &credit.to_string(), &[]).await;
    publish(&js, SUBJECT, &credit.to_string(), &[]).await;
    host.wait_for("behave", "processed + duplicate", |s| {
        s.processed == 1 && s.duplicates == 1
    })
    .await;
    assert_eq!(e.db.balance(9).await, Some(50));

    let digest = std::process::Command::new("sha256sum")
        .arg(guest("behave"))
        .output()
        .unwrap();
    let digest = String::from_utf8(digest.stdout).unwrap();
    let digest = digest.split_whitespace().next().unwrap();
    let shown = ok(&cfg, &["receipts", "show", "--handler", "behave", "evt_f"]).await;
    assert_eq!(
        mask_recent_times(&shown),
        format!(
            "handler: behave\nmessage id: evt_f\nstream sequence: 1\nmodule digest: {digest}\n\
             published at: YYYY-MM-DDThh:mm:ssZ\nprocessed at: YYYY-MM-DDThh:mm:ssZ\n"
        )
    );
    let summary = ok(&cfg, &["receipts", "show", "--handler", "behave"]).await;
    assert_eq!(
        mask_recent_times(&summary),
        "handler: behave\nreceipts: 1\noldest: YYYY-MM-DDThh:mm:ssZ (published)\n\
         newest: YYYY-MM-DDThh:mm:ssZ (published)\n\
         retention: 7days (receipts of messages published earlier are pruned)\n"
    );

    let (code, out, err) = idem(
        &cfg,
        &[
            "receipts",
            "forget",
            "--handler",
            "behave",
            "evt_f",
            "evt_never",
        ],
    )
    .await;
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            0,
            "handler behave: forgot 1 receipt (2 message ids given)\n",
            "warning: a redelivery or replay of the forgotten message ids now runs handler behave again\n"
        )
    );
    assert_eq!(e.db.receipts("behave").await, 0);
    fails(
        &cfg,
        &["receipts", "show", "--handler", "behave", "evt_f"],
        "no receipt for message `evt_f` of handler `behave`: it was never processed, or its \
         receipt was pruned after the retention window (7days) or forgotten",
    )
    .await;
    // Forgetting what is not there deletes nothing and warns of nothing.
    let (code, out, err) = idem(
        &cfg,
        &["receipts", "forget", "--handler", "behave", "evt_f"],
    )
    .await;
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            0,
            "handler behave: forgot 0 receipts (1 message id given)\n",
            ""
        )
    );

    publish(&js, SUBJECT, &credit.to_string(), &[]).await;
    let s = host
        .wait_for("behave", "processed again", |s| s.processed == 2)
        .await;
    assert_eq!((s.duplicates, s.dead_lettered), (1, 0));
    assert_eq!(e.db.balance(9).await, Some(100));
    assert_eq!(e.db.receipt_ids("behave").await, ["evt_f"]);
    let shown = ok(&cfg, &["receipts", "show", "--handler", "behave", "evt_f"]).await;
    assert!(shown.contains("\nstream sequence: 3\n"), "{shown}");
    host.stop().await;
}
on_both_databases!(
    forget_then_republish_runs_again,
    forget_then_republish_runs_again
);

/// A SQL expression for Unix time `secs` in `processed_at`'s / `failed_at`'s type.
fn at(backend: Backend, secs: i64) -> String {
    match backend {
        Backend::Postgres => format!("to_timestamp({secs})"),
        Backend::Sqlite => format!("{}", secs * 1000),
    }
}

/// A receipt for a message published (and processed) at Unix time `secs`.
async fn receipt_at(db: &TestDb, consumer: &str, id: &str, seq: i64, secs: i64) {
    db.execute(&format!(
        "INSERT INTO idem_receipts
           (consumer, message_id, stream_sequence, module_digest, processed_at, published_ms)
         VALUES ('{consumer}', '{id}', {seq}, 'digest-{id}', {}, {})",
        at(db.backend, secs),
        secs * 1000
    ))
    .await;
}

/// 2023-11-14T22:13:20Z.
const T0: i64 = 1_700_000_000;
/// 2100-01-01T00:00:00Z: a receipt "from the future" never ages out.
const FUTURE: i64 = 4_102_444_800;

/// `receipts show` summarises exactly; `receipts prune` deletes exactly the
/// receipts older than each handler's retention, and reports per handler.
async fn receipts_show_and_prune(backend: Backend) {
    let e = env(backend).await;
    let behave = {
        let mut h = HandlerSpec::new("behave", "behave");
        h.extra = "retention = \"1h\"\n".into();
        h
    };
    let other = {
        let mut h = HandlerSpec::new("other", "behave");
        h.extra = "retention = \"3h\"\n".into();
        h
    };
    let cfg = write_config(e.dir.path(), &e.nats, &e.db, &[behave, other]);
    e.host_tables().await;
    // Pruning reads the broker's clock from the handlers' stream.
    create_stream(&e.nats, "ACCOUNTS", &["accounts.credit"]).await;
    let now = now_secs();
    receipt_at(&e.db, "behave", "r1", 11, T0).await;
    receipt_at(&e.db, "behave", "r2", 12, T0 + 60).await;
    receipt_at(&e.db, "behave", "r3", 13, now - 7200).await;
    receipt_at(&e.db, "behave", "r4", 14, now - 1800).await;
    receipt_at(&e.db, "behave", "r_future", 15, FUTURE).await;
    receipt_at(&e.db, "other", "o_4h", 21, now - 4 * 3600).await;
    receipt_at(&e.db, "other", "o_2h", 22, now - 2 * 3600).await;

    assert_eq!(
        ok(&cfg, &["receipts", "show", "--handler", "behave"]).await,
        "handler: behave\nreceipts: 5\noldest: 2023-11-14T22:13:20Z (published)\n\
         newest: 2100-01-01T00:00:00Z (published)\n\
         retention: 1h (receipts of messages published earlier are pruned)\n"
    );
    assert_eq!(
        ok(&cfg, &["receipts", "show", "--handler", "behave", "r2"]).await,
        "handler: behave\nmessage id: r2\nstream sequence: 12\nmodule digest: digest-r2\n\
         published at: 2023-11-14T22:14:20Z\nprocessed at: 2023-11-14T22:14:20Z\n"
    );
    fails(
        &cfg,
        &["receipts", "show", "--handler", "nobody"],
        &format!(
            "`nobody` is no handler of {} (it has behave, other) and has nothing stored under \
             it as an `idem replay --as` name; check the name or pass the config that runs it \
             with --config",
            cfg.display()
        ),
    )
    .await;

    if backend == Backend::Postgres {
        // Another host is pruning: nothing happens here, and it says so.
        use sqlx::Connection as _;
        let mut other = sqlx::PgConnection::connect(&e.db.url).await.unwrap();
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(PRUNE_LOCK_KEY)
            .fetch_one(&mut other)
            .await
            .unwrap();
        assert!(locked);
        fails(
            &cfg,
            &["receipts", "prune"],
            "another host holds the prune lock and is pruning now; nothing pruned here, run again later",
        )
        .await;
        assert_eq!(e.db.receipts("behave").await, 5);
        let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
            .bind(PRUNE_LOCK_KEY)
            .fetch_one(&mut other)
            .await
            .unwrap();
        assert!(unlocked);
        other.close().await.unwrap();
    }

    assert_eq!(
        ok(&cfg, &["receipts", "prune", "--handler", "other"]).await,
        "handler other: pruned 1 receipt older than 3h\n"
    );
    assert_eq!(e.db.receipt_ids("other").await, ["o_2h"]);
    assert_eq!(e.db.receipts("behave").await, 5);
    assert_eq!(
        ok(&cfg, &["receipts", "prune"]).await,
        "handler behave: pruned 3 receipts older than 1h\n\
         handler other: pruned 0 receipts older than 3h\n"
    );
    assert_eq!(e.db.receipt_ids("behave").await, ["r4", "r_future"]);
    assert_eq!(e.db.receipt_ids("other").await, ["o_2h"]);
    let summary = ok(&cfg, &["receipts", "show", "--handler", "behave"]).await;
    assert!(
        summary.starts_with("handler: behave\nreceipts: 2\noldest: ")
            && summary.ends_with(
                " (published)\nnewest: 2100-01-01T00:00:00Z (published)\n\
                 retention: 1h (receipts of messages published earlier are pruned)\n"
            ),
        "{summary}"
    );
    let oldest = &summary["handler: behave\nreceipts: 2\noldest: ".len()..][..20];
    let age = now_secs() - unix_secs(oldest);
    assert!((1790..1900).contains(&age), "oldest {oldest} is {age}s old");
}
on_both_databases!(receipts_show_and_prune, receipts_show_and_prune);

/// Dead letters of a handler the config no longer has, with a binary
/// payload: shown in full, listed, not redriven (one line says why), dropped.
async fn foreign_and_binary_dead_letters(backend: Backend) {
    let e = env(backend).await;
    let cfg = e.config("");
    e.host_tables().await;
    let payload = match backend {
        Backend::Postgres => "'\\x00ff1b'::bytea",
        Backend::Sqlite => "X'00ff1b'",
    };
    e.db.execute(&format!(
        "INSERT INTO idem_dead_letters
           (consumer, message_id, stream, stream_sequence, subject, reason, headers, payload, failed_at)
         VALUES ('gone', 'evt_g', 'OLD', 42, 'old.subject', 'rejected: no such thing',
                 '[[\"Nats-Msg-Id\",\"evt_g\"],[\"X-Trace\",\"a b\"]]', {payload}, {})",
        at(backend, T0)
    ))
    .await;
    assert_eq!(
        ok(&cfg, &["dlq", "show", "1"]).await,
        "id: 1\nhandler: gone\nmessage id: evt_g\nstream: OLD\nstream sequence: 42\n\
         subject: old.subject\ndead-lettered: 2023-11-14T22:13:20Z\nreason: rejected: no such thing\n\
         headers:\n  Nats-Msg-Id: evt_g\n  X-Trace: a b\npayload: 3 bytes, hex:\n00ff1b\n"
    );
    assert_eq!(
        ok(&cfg, &["dlq", "list"]).await,
        "ID  HANDLER  MESSAGE  SEQ  SUBJECT      DEAD-LETTERED         REASON\n\
         1   gone     evt_g    42   old.subject  2023-11-14T22:13:20Z  rejected: no such thing\n"
    );
    fails(
        &cfg,
        &["dlq", "redrive", "1"],
        &format!(
            "dead letter 1 (handler gone, message evt_g) belongs to handler `gone`, which is not \
             in {}; add that handler to the config (or pass its config with --config), or drop \
             the dead letter with `idem dlq drop 1`",
            cfg.display()
        ),
    )
    .await;
    fails(
        &cfg,
        &["dlq", "redrive", "--handler", "gone", "--all"],
        &format!(
            "dead letter 1 (handler gone, message evt_g) belongs to handler `gone`, which is \
             not in {}; add that handler to the config (or pass its config with --config), or \
             drop the dead letter with `idem dlq drop 1`",
            cfg.display()
        ),
    )
    .await;
    fails(
        &cfg,
        &["dlq", "show", "99"],
        "no dead letter with id 99; `idem dlq list` shows the ids",
    )
    .await;
    assert_eq!(e.dead_letter_ids("gone").await, [1]);
    assert_eq!(
        ok(&cfg, &["dlq", "drop", "--handler", "gone", "--all"]).await,
        "dropped 1 dead letter of handler gone\n"
    );
    assert_eq!(
        ok(&cfg, &["dlq", "drop", "--handler", "gone", "--all"]).await,
        "dropped 0 dead letters of handler gone\n"
    );
    assert_eq!(e.dead_letter_ids("gone").await, Vec::<i64>::new());
}
on_both_databases!(
    foreign_and_binary_dead_letters,
    foreign_and_binary_dead_letters
);

/// The admin commands never create what they inspect: a database without
/// idem's tables, or a SQLite file that does not exist, is one line.
async fn wrong_database_is_one_line(backend: Backend) {
    let e = env(backend).await;
    let cfg = e.config("");
    e.db.execute("CREATE TABLE unrelated (x BIGINT)").await;
    fails(
        &cfg,
        &["dlq", "list"],
        &format!(
            "database {} has no idem tables (idem_receipts, idem_dead_letters): `idem run` has \
             not used it; check [database] url",
            e.db.url
        ),
    )
    .await;
    assert_eq!(
        e.db.scalar("SELECT count(*) FROM unrelated").await,
        Some(0),
        "database untouched"
    );
    if backend == Backend::Sqlite {
        let missing = e.dir.path().join("missing.db");
        let toml = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace(&e.db.url, &format!("sqlite://{}", missing.display()));
        std::fs::write(&cfg, toml).unwrap();
        fails(
            &cfg,
            &["receipts", "show", "--handler", "behave"],
            &format!(
                "database file {} does not exist; check [database] url (a relative sqlite path \
                 is read from the working directory)",
                missing.display()
            ),
        )
        .await;
        assert!(!missing.exists(), "created {}", missing.display());
    }
}
on_both_databases!(wrong_database_is_one_line, wrong_database_is_one_line);

/// Usage errors are one line and exit 1, like every other error.
#[tokio::test]
async fn usage_errors_are_one_line() {
    for args in [
        &["dlq", "redrive"][..],
        &["dlq", "redrive", "1", "--all", "--handler", "h"],
        &["dlq", "drop", "--all"],
        &["receipts", "forget", "--handler", "h"],
        &["receipts", "show"],
    ] {
        let (code, out, err) = idem(Path::new("idem.toml"), args).await;
        assert_eq!((code, out.as_str()), (1, ""), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("idem: "), "{args:?}: {err}");
        assert!(err.contains(" Usage: "), "{args:?}: {err}");
    }
    let (code, out, _) = idem(Path::new("idem.toml"), &["dlq", "--help"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("redrive"), "{out}");
}
