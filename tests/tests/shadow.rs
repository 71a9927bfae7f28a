//! Shadow deploys against real nats-server, PostgreSQL and SQLite, judged
//! by exact counts, the report's lines and the database's rows: a
//! candidate that differs on one kind of message (credits of 100 or more,
//! `credit-bonus`) is reported on exactly those messages, statement by
//! statement, while the live version's effects stay exact and nothing the
//! candidate did is committed; an identical candidate (the live component
//! with another digest) is reported on none, batched, with a sample;
//! `--promote` makes the candidate live and drops the shadow; `--abort`
//! drops it; a record nobody signed runs nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::deploy::heartbeat::host_id;
use idem_tests::deploy_keys::{DeployKeys, trust_in};
use idem_tests::examples::{credit_log_migrations, eventually, sha256_hex};
use idem_tests::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `idem.toml` for handler `h` running the credit component, granted
/// `accounts` and `credit_log`, trusting the test's deploy key (batched
/// when `IDEM_TEST_BATCH` says so, unless `extra` sets `batch`).
fn config(dir: &Path, nats: &Nats, db: &TestDb, extra: &str) -> PathBuf {
    let cfg = dir.join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\", \"credit_log\"]\nmigrations = \"{}\"\nretry_delay = \"100ms\"\n{}{extra}\n",
            nats.url(),
            db.url,
            guest("credit").display(),
            credit_log_migrations(dir).display(),
            test_batch_line(extra)
        ),
    )
    .unwrap();
    trust_in(&cfg, &DeployKeys::of(dir));
    cfg
}

/// `idem deploy --config cfg ARGS`, signing with the test's deploy key.
fn deploy(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["deploy", "--config", cfg.to_str().unwrap()];
    all.extend_from_slice(args);
    idem_cli(&all, &DeployKeys::of(cfg.parent().unwrap()).env())
}

/// `idem deploy h --shadow-report` once this host's report in the hosts
/// bucket shows `compared` messages compared (reports go every 3 s).
async fn report_when_compared(cfg: &Path, compared: u64) -> String {
    let want = format!(": compared {compared}, ");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, out, err) = deploy(cfg, &["h", "--shadow-report"]);
        assert_eq!(code, 0, "{err}");
        if out
            .lines()
            .any(|l| l.starts_with(&host_id()) && l.contains(&want))
        {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "no report of {compared} compared:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The statement the credit handler sends, as a report shows it.
fn credit_line(account: i64, amount: i64) -> String {
    format!(
        "execute INSERT INTO accounts (account_id, balance) VALUES ($1, $2) ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance [$1 = {account}, $2 = {amount}] → 1 row(s) affected"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_that_differs_on_big_credits_is_reported_on_exactly_those() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &nats, &db, "");
    let live = sha256_hex(&std::fs::read(guest("credit")).unwrap());
    let bonus_path = guest("credit-bonus");
    let bonus = sha256_hex(&std::fs::read(&bonus_path).unwrap());
    let host = RunningHost::start(&cfg).await;

    // A record nobody signed, put by anyone who can write the bucket: no
    // candidate runs, and the host says why.
    let js = nats.jetstream().await;
    let (code, _, err) = deploy(&cfg, &["h", "--shadow-report"]);
    assert_eq!(
        (code, err.as_str()),
        (
            1,
            "idem: `h` has no shadow deployment (`idem deploy h MODULE --shadow` makes one)\n"
        )
    );
    let unsigned = serde_json::json!({"handler": "h", "digest": bonus, "size": 1, "against": live,
        "sample_ppm": 1_000_000, "deployed_at": "2026-12-06T00:00:00Z"});
    js.get_key_value("idem-shadows")
        .await
        .unwrap()
        .put("h", unsigned.to_string().into())
        .await
        .unwrap();
    let shadow = host.shadow("h").clone();
    eventually("the unsigned record refused", || shadow.refused().is_some()).await;
    assert_eq!(
        shadow.refused().unwrap(),
        (bonus.clone(), "the shadow record is not signed (only `idem deploy --shadow --key` with a key of [deploy] trusted_keys writes records hosts run)".to_owned())
    );
    assert!(shadow.current().is_none());

    let (code, out, err) = deploy(&cfg, &["h", bonus_path.to_str().unwrap(), "--shadow"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "shadow of `h`: {bonus} runs next to {live} on 100% of messages, always rolled back (revision 2); `idem deploy h --shadow-report` shows what differs, `--promote` makes it live, `--abort` drops it\n"
        )
    );
    eventually("the candidate in place", || {
        shadow.current().is_some_and(|c| c.record.digest == bonus)
    })
    .await;

    // Ten credits, two of them big (e3, e7), and one message both versions
    // reject.
    for i in 1..=10_i64 {
        let amount = if i == 3 || i == 7 { 150 } else { i };
        publish(
            &js,
            "accounts.credit",
            &credit(&format!("e{i:02}"), i, amount),
            &[],
        )
        .await;
    }
    let bad = serde_json::json!({"event_id": "e11", "account_id": 11}).to_string();
    publish(&js, "accounts.credit", &bad, &[]).await;
    host.wait_for("h", "10 applied and 1 dead letter", |s| {
        s.processed == 10 && s.dead_lettered == 1
    })
    .await;

    // The live version's effects, exactly; nothing of the candidate's.
    let mut balances = Vec::new();
    for i in 1..=11 {
        balances.push(db.balance(i).await);
    }
    let expected: Vec<Option<i64>> = (1..=10_i64)
        .map(|i| Some(if i == 3 || i == 7 { 150 } else { i }))
        .chain([None])
        .collect();
    assert_eq!(balances, expected);
    let named_live = format!("SELECT count(*) FROM idem_receipts WHERE module_digest = '{live}'");
    assert_eq!(db.receipts("h").await, 10);
    assert_eq!(db.scalar(&named_live).await, Some(10));

    let report = shadow.report(&live).unwrap();
    assert_eq!(
        (
            report.active,
            report.compared,
            report.agreed,
            report.diverged,
            report.skipped
        ),
        (true, 11, 9, 2, 0)
    );
    let ids: Vec<&str> = report
        .divergences
        .iter()
        .map(|d| d.message_id.as_str())
        .collect();
    assert_eq!(ids, ["e03", "e07"]);

    let out = report_when_compared(&cfg, 11).await;
    let me = host_id();
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with(&format!(
            "shadow of `h`: candidate {bonus} against live {live}, sample 100%, deployed "
        )),
        "{out}"
    );
    assert_eq!(
        lines[1..],
        [
            format!("{me}: compared 11, agreed 9, diverged 2, skipped 0 (active)"),
            "total over 1 host(s): compared 11, agreed 9, diverged 2, skipped 0".to_owned(),
            "divergent messages (the first 5 per host):".to_owned(),
            format!(
                "  message e03 (stream sequence 3, subject accounts.credit, host {me}): statement 1: the parameters differ"
            ),
            "    live: ok (1 statement(s))".to_owned(),
            format!("      #1 {}", credit_line(3, 150)),
            "    candidate: ok (1 statement(s))".to_owned(),
            format!("      #1 {}", credit_line(3, 151)),
            format!(
                "  message e07 (stream sequence 7, subject accounts.credit, host {me}): statement 1: the parameters differ"
            ),
            "    live: ok (1 statement(s))".to_owned(),
            format!("      #1 {}", credit_line(7, 150)),
            "    candidate: ok (1 statement(s))".to_owned(),
            format!("      #1 {}", credit_line(7, 151)),
        ],
        "{out}"
    );

    // Promoted: the candidate is live, the shadow gone.
    let (code, out, err) = deploy(&cfg, &["h", "--promote", "--wait", "--timeout", "20s"]);
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap(),
        format!("deployed {bonus} to `h` (revision 1, previous {live})")
    );
    assert_eq!(lines.next().unwrap(), "shadow of `h` promoted and dropped");
    assert_eq!(host_slot_digest(&host, "h"), bonus);
    eventually("the shadow dropped", || shadow.current().is_none()).await;
    publish(&js, "accounts.credit", &credit("e12", 12, 200), &[]).await;
    host.wait_for("h", "e12 applied", |s| s.processed == 11)
        .await;
    assert_eq!(db.balance(12).await, Some(201));
    let (code, _, err) = deploy(&cfg, &["h", "--shadow-report"]);
    assert_eq!(code, 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_candidate_is_reported_on_no_message_batched_and_sampled() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &nats, &db, "batch = 16");
    let v1 = std::fs::read(guest("credit")).unwrap();
    let live = sha256_hex(&v1);
    let same = with_custom_section(&v1, "same code");
    let same_path = dir.path().join("same.wasm");
    std::fs::write(&same_path, &same).unwrap();
    let twin = sha256_hex(&same);
    let host = RunningHost::start(&cfg).await;
    let shadow = host.shadow("h").clone();

    // The live version itself is refused as its own shadow.
    let (code, _, err) = deploy(&cfg, &["h", guest("credit").to_str().unwrap(), "--shadow"]);
    assert_eq!(
        (code, err.as_str()),
        (
            1,
            format!(
                "idem: {live} is what `h` runs already; a shadow compares another version with it\n"
            )
            .as_str()
        )
    );
    let (code, out, err) = deploy(
        &cfg,
        &[
            "h",
            same_path.to_str().unwrap(),
            "--shadow",
            "--sample",
            "50%",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!(
            "shadow of `h`: {twin} runs next to {live} on 50% of messages"
        )),
        "{out}"
    );
    eventually("the candidate in place", || shadow.current().is_some()).await;

    let ids: Vec<String> = (1..=40).map(|i| format!("s{i:02}")).collect();
    let sampled = ids
        .iter()
        .filter(|id| idem::shadow::sampled(id, 500_000))
        .count() as u64;
    assert!((10..=30).contains(&sampled), "{sampled}");
    let js = nats.jetstream().await;
    for (i, id) in ids.iter().enumerate() {
        let account = (i % 5) as i64 + 1;
        publish(&js, "accounts.credit", &credit(id, account, 10), &[]).await;
    }
    host.wait_for("h", "40 applied", |s| s.processed == 40)
        .await;
    for account in 1..=5 {
        assert_eq!(db.balance(account).await, Some(80), "account {account}");
    }
    assert_eq!(db.receipts("h").await, 40);

    let report = shadow.report(&live).unwrap();
    assert_eq!(
        (
            report.compared,
            report.agreed,
            report.diverged,
            report.skipped
        ),
        (sampled, sampled, 0, 0)
    );
    assert!(report.divergences.is_empty());
    let out = report_when_compared(&cfg, sampled).await;
    assert_eq!(
        out.lines().skip(1).collect::<Vec<_>>(),
        [
            format!(
                "{}: compared {sampled}, agreed {sampled}, diverged 0, skipped 0 (active)",
                host_id()
            ),
            format!(
                "total over 1 host(s): compared {sampled}, agreed {sampled}, diverged 0, skipped 0"
            ),
        ],
        "{out}"
    );

    // Another version goes live: the shadow stops (it was compared with
    // the old one) and cannot be promoted over it.
    let log_path = guest("credit-log");
    let logged = sha256_hex(&std::fs::read(&log_path).unwrap());
    let (code, _, err) = deploy(
        &cfg,
        &[
            "h",
            log_path.to_str().unwrap(),
            "--wait",
            "--timeout",
            "20s",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(!shadow.report(&logged).unwrap().active);
    let (code, out, err) = deploy(&cfg, &["h", "--promote"]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert_eq!(
        err,
        format!(
            "idem: the shadow of `h` was compared with {live}, but `h` runs {logged} now: nothing was deployed; shadow the candidate against this version first (`idem deploy h MODULE --shadow`)\n"
        )
    );
    assert_eq!(host_slot_digest(&host, "h"), logged);

    // Aborted: the candidate goes, the live version stays.
    let (code, out, err) = deploy(&cfg, &["h", "--abort"]);
    assert_eq!(
        (code, out.as_str()),
        (
            0,
            format!("shadow of `h` dropped ({twin} no longer runs)\n").as_str()
        ),
        "{err}"
    );
    eventually("the shadow dropped", || shadow.current().is_none()).await;
    assert_eq!(host_slot_digest(&host, "h"), logged);
    let (code, _, err) = deploy(&cfg, &["h", "--abort"]);
    assert_eq!(
        (code, err.as_str()),
        (1, "idem: `h` has no shadow deployment to abort\n")
    );
}

fn host_slot_digest(host: &RunningHost, handler: &str) -> String {
    host.slot(handler).current().digest().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_past_its_time_is_skipped_and_counted_and_the_live_path_goes_on() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    // A quarter of the deadline is the candidates' share: 250 ms.
    let cfg = config(dir.path(), &nats, &db, "deadline = \"1s\"");
    let host = RunningHost::start(&cfg).await;
    let shadow = host.shadow("h").clone();
    // `behave` sends the credit handler's very statement for `op: credit`,
    // loops for `op: loop`, traps for `op: trap` and runs `sql` for `op:
    // sql`.
    let (code, _, err) = deploy(&cfg, &["h", guest("behave").to_str().unwrap(), "--shadow"]);
    assert_eq!(code, 0, "{err}");
    eventually("the candidate in place", || shadow.current().is_some()).await;
    let js = nats.jetstream().await;
    let ops = ["credit", "loop", "credit", "trap", "loop", "credit", "sql"];
    // `op: sql` runs a write that outlasts the candidate's time: SQLite
    // rolls the whole transaction back when a write is interrupted, so the
    // message runs again at once, without the candidate.
    let slow = "UPDATE accounts SET balance = (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000000) SELECT count(*) FROM c) WHERE account_id = 1";
    for (i, op) in ops.iter().enumerate() {
        let payload = serde_json::json!({"event_id": format!("t{i}"), "account_id": 1, "amount": 10, "op": op, "sql": slow});
        publish(&js, "accounts.credit", &payload.to_string(), &[]).await;
    }
    let stats = host.wait_for("h", "7 applied", |s| s.processed == 7).await;
    assert_eq!((stats.retried, stats.dead_lettered), (0, 0));
    assert_eq!(db.balance(1).await, Some(70));
    assert_eq!(db.receipts("h").await, 7);
    let live = host_slot_digest(&host, "h");
    let report = shadow.report(&live).unwrap();
    assert_eq!(
        (
            report.compared,
            report.agreed,
            report.diverged,
            report.skipped
        ),
        (4, 3, 1, 3)
    );
    let d = &report.divergences[0];
    assert_eq!(
        (d.message_id.as_str(), d.what.as_str()),
        ("t3", "statement 1: only the live version sent it")
    );
    assert_eq!(d.live.verdict, "ok");
    assert!(
        d.candidate.verdict.starts_with("trap: "),
        "{}",
        d.candidate.verdict
    );
    assert_eq!(d.candidate.total, 0);
}
