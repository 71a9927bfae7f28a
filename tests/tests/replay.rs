//! `idem replay`, run as the real CLI binary after `idem run --drain` (or an
//! in-process host) processed a stream on a real nats-server, PostgreSQL and
//! SQLite: exact summary lines, exit codes, balances, rows, receipts and the
//! consumers left on the stream.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use futures::StreamExt as _;
use idem_tests::examples::{Env, strs};
use idem_tests::*;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SUBJECT: &str = "accounts.credit";

/// Runs the idem CLI with `--config cfg`; returns (exit code, stdout, stderr).
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

/// `idem run --drain`, which must exit 0.
async fn drain(cfg: &Path) {
    let (code, out, err) = idem(cfg, &["run", "--drain"]).await;
    assert_eq!(code, 0, "idem run --drain: {out}{err}");
}

/// Runs `idem replay ARGS`, asserts exit `code` and stderr `err`, and
/// returns the one stdout line without its ` duration=…s` (checked to be a
/// number of seconds).
async fn replay(cfg: &Path, args: &[&str], code: i32, err: &str) -> String {
    let mut all = vec!["replay"];
    all.extend_from_slice(args);
    let (got_code, out, got_err) = idem(cfg, &all).await;
    assert_eq!(
        (got_code, got_err.as_str()),
        (code, err),
        "idem {all:?}: {out}"
    );
    let line = out
        .strip_suffix('\n')
        .unwrap_or_else(|| panic!("one line: {out:?}"));
    assert!(!line.contains('\n'), "one line: {out:?}");
    match line.rsplit_once(" duration=") {
        Some((summary, secs)) => {
            let secs = secs.strip_suffix('s').unwrap();
            assert!(secs.parse::<f64>().unwrap() >= 0.0, "{line}");
            summary.to_string()
        }
        None => line.to_string(),
    }
}

/// The consumers on `stream`, sorted.
async fn consumers(nats: &Nats, stream: &str) -> Vec<String> {
    let js = nats.jetstream().await;
    let stream = js.get_stream(stream).await.unwrap();
    let mut names: Vec<String> = stream.consumer_names().map(|n| n.unwrap()).collect().await;
    names.sort();
    names
}

/// Credits `evt_1..=n`: event i credits account i with 100·i.
async fn publish_credits(nats: &Nats, range: std::ops::RangeInclusive<i64>) {
    let js = nats.jetstream().await;
    for i in range {
        publish(&js, SUBJECT, &credit(&format!("evt_{i}"), i, 100 * i), &[]).await;
    }
}

/// Every account's balance, 1..=n.
async fn balances(db: &TestDb, n: i64) -> Vec<Option<i64>> {
    let mut v = Vec::new();
    for i in 1..=n {
        v.push(db.balance(i).await);
    }
    v
}

fn credited(n: i64, twice: impl Fn(i64) -> bool) -> Vec<Option<i64>> {
    (1..=n)
        .map(|i| Some(if twice(i) { 200 * i } else { 100 * i }))
        .collect()
}

/// A processed stream, replayed from its first sequence under the
/// handler's own receipts: every message is a counted duplicate, nothing
/// changes, and the replay's ephemeral consumer is gone afterwards (only
/// the durable consumer of `idem run` is left on the stream).
async fn a_processed_range_replays_as_duplicates(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("credit", "credit")],
    );
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    publish_credits(&nats, 1..=12).await;
    drain(&cfg).await;
    assert_eq!(balances(&db, 12).await, credited(12, |_| false));

    let line = replay(&cfg, &["credit", "--from-seq", "1"], 0, "").await;
    assert_eq!(
        line,
        "handler credit: replayed stream ACCOUNTS from sequence 1 to 12: new=0 duplicates=12 dead_lettered=0 retried=0"
    );
    assert_eq!(balances(&db, 12).await, credited(12, |_| false));
    assert_eq!(db.receipts("credit").await, 12);
    assert!(db.dead_letters("credit").await.is_empty());
    assert_eq!(consumers(&nats, "ACCOUNTS").await, strs(&["credit"]));
}
on_both_databases!(
    a_processed_range_replays_as_duplicates_and_leaves_no_consumer,
    a_processed_range_replays_as_duplicates
);

/// `--to-seq M` ends the range at M: exact counts, and only those messages
/// run (under a new name, each runs again and credits its account twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to_seq_ends_the_range_at_that_sequence() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("credit", "credit")],
    );
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    publish_credits(&nats, 1..=10).await;
    drain(&cfg).await;

    let line = replay(&cfg, &["credit", "--from-seq", "1", "--to-seq", "4"], 0, "").await;
    assert_eq!(
        line,
        "handler credit: replayed stream ACCOUNTS from sequence 1 to 4: new=0 duplicates=4 dead_lettered=0 retried=0"
    );
    let line = replay(
        &cfg,
        &[
            "credit",
            "--from-seq",
            "3",
            "--to-seq",
            "6",
            "--as",
            "again",
        ],
        0,
        "",
    )
    .await;
    assert_eq!(
        line,
        "handler credit as again: replayed stream ACCOUNTS from sequence 3 to 6: new=4 duplicates=0 dead_lettered=0 retried=0"
    );
    assert_eq!(
        balances(&db, 10).await,
        credited(10, |i| (3..=6).contains(&i))
    );
    assert_eq!(db.receipts("again").await, 4);
    assert_eq!(
        db.scalar("SELECT min(stream_sequence) * 100 + max(stream_sequence) FROM idem_receipts WHERE consumer = 'again'")
            .await,
        Some(306)
    );
    // A --to-seq past the stream's last sequence ends at the last one.
    let line = replay(
        &cfg,
        &["credit", "--from-seq", "9", "--to-seq", "99"],
        0,
        "",
    )
    .await;
    assert_eq!(
        line,
        "handler credit: replayed stream ACCOUNTS from sequence 9 to 10: new=0 duplicates=2 dead_lettered=0 retried=0"
    );
    assert_eq!(consumers(&nats, "ACCOUNTS").await, strs(&["credit"]));
}

/// RFC 3339 UTC to the second, `YYYY-MM-DDThh:mm:ssZ`, of Unix seconds.
fn rfc3339(secs: i64) -> String {
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

fn now() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// `--since` selects by publish time: two batches a few seconds apart, and a
/// replay since a whole second between them takes exactly the second batch;
/// an age that reaches before both takes all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_selects_the_messages_published_from_then_on() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("credit", "credit")],
    );
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    publish_credits(&nats, 1..=4).await;
    // A whole second at least a second after the first batch, and the
    // second batch at least a second after it (the broker and this test
    // share the machine's clock).
    let between = now().as_secs() as i64 + 2;
    tokio::time::sleep(Duration::from_secs(between as u64) + Duration::from_secs(1) - now()).await;
    publish_credits(&nats, 5..=7).await;
    drain(&cfg).await;

    let since = rfc3339(between);
    let line = replay(&cfg, &["credit", "--since", &since], 0, "").await;
    assert_eq!(
        line,
        format!(
            "handler credit: replayed stream ACCOUNTS from {since} to sequence 7: new=0 duplicates=3 dead_lettered=0 retried=0"
        )
    );
    let line = replay(&cfg, &["credit", "--since", &since, "--as", "late"], 0, "").await;
    assert_eq!(
        line,
        format!(
            "handler credit as late: replayed stream ACCOUNTS from {since} to sequence 7: new=3 duplicates=0 dead_lettered=0 retried=0"
        )
    );
    assert_eq!(balances(&db, 7).await, credited(7, |i| i >= 5));
    let line = replay(&cfg, &["credit", "--since", "1h"], 0, "").await;
    assert!(
        line.starts_with("handler credit: replayed stream ACCOUNTS from ")
            && line.ends_with(" to sequence 7: new=0 duplicates=7 dead_lettered=0 retried=0"),
        "{line}"
    );
    assert_eq!(balances(&db, 7).await, credited(7, |i| i >= 5));
}

/// The projection example, run by `idem run`; its table is emptied and
/// `idem replay --as rebuild` over the whole stream builds exactly the same
/// rows under new receipts. Replayed again under that name, every message is
/// a duplicate.
async fn a_replay_as_a_new_name_rebuilds_a_projection(backend: Backend) {
    let e = Env::new("projection", backend).await;
    let events = [
        (1001, 1, "pending", 4250),
        (1001, 3, "shipped", 4250),
        (1001, 2, "paid", 4250),
        (1002, 1, "pending", 999),
        (1002, 2, "cancelled", 0),
        (1003, 1, "pending", 700),
    ];
    for (i, (order, version, status, total)) in events.iter().enumerate() {
        e.publish(&json!({
            "event_id": format!("evt_{}", i + 1),
            "order_id": order,
            "version": version,
            "status": status,
            "total_cents": total,
        }))
        .await;
    }
    let cfg = e.config("idem", &[e.name()], "");
    drain(&cfg).await;
    let sql = "SELECT order_id, version, status, total_cents FROM orders ORDER BY order_id";
    let built = e.rows(sql).await;
    assert_eq!(
        built,
        strs(&[
            "1001|3|shipped|4250",
            "1002|2|cancelled|0",
            "1003|1|pending|700"
        ])
    );

    e.db.execute("DELETE FROM orders").await;
    assert_eq!(e.rows(sql).await, strs(&[]));
    let line = replay(
        &cfg,
        &[e.name(), "--from-seq", "1", "--as", "rebuild"],
        0,
        "",
    )
    .await;
    assert_eq!(
        line,
        "handler order-projector as rebuild: replayed stream ORDERS from sequence 1 to 6: new=6 duplicates=0 dead_lettered=0 retried=0"
    );
    assert_eq!(e.rows(sql).await, built);
    assert_eq!(e.db.receipts("rebuild").await, 6);
    assert_eq!(e.db.receipts(e.name()).await, 6);

    let line = replay(
        &cfg,
        &[e.name(), "--from-seq", "1", "--as", "rebuild"],
        0,
        "",
    )
    .await;
    assert_eq!(
        line,
        "handler order-projector as rebuild: replayed stream ORDERS from sequence 1 to 6: new=0 duplicates=6 dead_lettered=0 retried=0"
    );
    assert_eq!(e.rows(sql).await, built);
    assert_eq!(consumers(&e.nats, "ORDERS").await, strs(&[e.name()]));
}
on_both_databases!(
    a_replay_as_a_new_name_rebuilds_a_projection_exactly,
    a_replay_as_a_new_name_rebuilds_a_projection
);

/// An unknown handler is one line, exit 1; an empty range (past the
/// stream's end, or since a time after its last message) is one line on
/// stdout, "nothing to replay", exit 0, and leaves no consumer behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_handler_fails_and_an_empty_range_replays_nothing() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("credit", "credit")],
    );
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    publish_credits(&nats, 1..=3).await;
    drain(&cfg).await;

    let (code, out, err) = idem(&cfg, &["replay", "nope", "--from-seq", "1"]).await;
    assert_eq!(
        (code, out.as_str(), err),
        (
            1,
            "",
            format!(
                "idem: handler `nope` is not in {} (it has credit); check the name or pass the config that runs it with --config\n",
                cfg.display()
            )
        )
    );
    let line = replay(&cfg, &["credit", "--from-seq", "4"], 0, "").await;
    assert_eq!(
        line,
        "handler credit: nothing to replay in stream ACCOUNTS from sequence 4 to 3"
    );
    let line = replay(&cfg, &["credit", "--since", "2099-01-01T00:00:00Z"], 0, "").await;
    assert_eq!(
        line,
        "handler credit: nothing to replay in stream ACCOUNTS from 2099-01-01T00:00:00Z to sequence 3"
    );
    assert_eq!(consumers(&nats, "ACCOUNTS").await, strs(&["credit"]));
    assert_eq!(balances(&db, 3).await, credited(3, |_| false));
}

/// The retention horizon in a replay. A stream kept for ever
/// (`accept_horizon_risk`), a 2 s retention, and the receipts pruned: under
/// the handler's own name every message is beyond the horizon and is
/// dead-lettered, not run (exit 1); under a fresh `--as` name, whose
/// receipts no host prunes, the horizon is lifted and every message runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_horizon_quarantines_under_the_own_name_and_not_under_a_fresh_one() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new("credit", "credit");
    spec.extra
        .push_str("retention = \"2s\"\naccept_horizon_risk = true\n");
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    create_stream_with_max_age(&nats, "ACCOUNTS", &[SUBJECT], Duration::ZERO).await;
    let host = RunningHost::start(&cfg).await;
    publish_credits(&nats, 1..=3).await;
    host.wait_for("credit", "3 processed", |s| {
        s.processed + s.dead_lettered >= 3
    })
    .await;
    let s = host.stop().await;
    assert_eq!(
        (s[0].1.processed, s[0].1.dead_lettered),
        (3, 0),
        "{}",
        s[0].1
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (code, out, err) = idem(&cfg, &["receipts", "prune", "--handler", "credit"]).await;
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, "handler credit: pruned 3 receipts older than 2s\n", "")
    );

    let line = replay(
        &cfg,
        &["credit", "--from-seq", "1"],
        1,
        "idem: 3 messages dead-lettered during the replay; see idem dlq list --handler credit\n",
    )
    .await;
    assert_eq!(
        line,
        "handler credit: replayed stream ACCOUNTS from sequence 1 to 3: new=0 duplicates=0 dead_lettered=3 retried=0"
    );
    let dead = db.dead_letters("credit").await;
    assert_eq!(dead.len(), 3);
    assert!(
        dead.iter().all(|(_, r)| r.starts_with("beyond-horizon: ")),
        "{dead:?}"
    );
    assert_eq!(balances(&db, 3).await, credited(3, |_| false));

    let line = replay(&cfg, &["credit", "--from-seq", "1", "--as", "fresh"], 0, "").await;
    assert_eq!(
        line,
        "handler credit as fresh: replayed stream ACCOUNTS from sequence 1 to 3: new=3 duplicates=0 dead_lettered=0 retried=0"
    );
    assert_eq!(balances(&db, 3).await, credited(3, |_| true));
    assert_eq!(db.receipts("fresh").await, 3);
    assert!(db.dead_letters("fresh").await.is_empty());
}
