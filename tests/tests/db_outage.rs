//! The database goes away while the host runs.
//!
//! - Unreachable (server stopped or crashed, sessions terminated): nothing is
//!   acked that was not committed, the handler holds its message and fetches
//!   nothing new, no JetStream delivery count is spent (`max_deliver = 2`
//!   would dead-letter or strand messages otherwise), and work resumes by
//!   itself when the database answers again; every message is applied
//!   exactly once. The host runs as a real process (`idem-test-host run`),
//!   so "still alive" and its counters (the stats lines and the shutdown
//!   summary, incl. `db_pauses`) are what an operator would see.
//! - Reachable but COMMIT fails (a `DEFERRABLE INITIALLY DEFERRED` foreign
//!   key violated by a statement that itself succeeded): a failed
//!   transaction, naked with the handler's delay, dead-lettered on the last
//!   delivery with a reason that starts with the failed step, never acked.
//!
//! The outage tests use a private cluster ([`PgCluster`]); the terminated
//! backends test and the COMMIT tests use a fresh database on the machine's
//! PostgreSQL (only that database's sessions are terminated) or SQLite.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use async_nats::jetstream;
use idem_tests::pg_cluster::PgCluster;
use idem_tests::*;
use sqlx::Connection as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SUBJECT: &str = "accounts.credit";
const HANDLER: &str = "credit-projector";
/// Accounts the credit events are spread over.
const ACCOUNTS: i64 = 10;

// ---------------------------------------------------------------- helpers

/// `idem-test-host run --config …` as a child process; stdout and stderr go
/// to files in the test's directory. Killed on drop.
struct HostProcess {
    child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
}

/// Counters by name, as printed by the host (`delivered=3 processed=2 …`).
type Counters = BTreeMap<String, u64>;

fn parse_counters(line: &str) -> Counters {
    line.split_whitespace()
        .filter_map(|t| {
            let (k, v) = t.split_once('=')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn counter(c: &Counters, name: &str) -> u64 {
    *c.get(name)
        .unwrap_or_else(|| panic!("the host prints no counter `{name}`: {c:?}"))
}

impl HostProcess {
    fn start(config: &Path, dir: &Path) -> Self {
        let out = dir.join("host.stdout");
        let err = dir.join("host.stderr");
        let child = Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
            .args(["run", "--config"])
            .arg(config)
            // The periodic stats line is at debug.
            .env("RUST_LOG", "info,async_nats=warn,idem::service=debug")
            .env_remove("IDEM_FAULT")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        HostProcess {
            child: Some(child),
            out,
            err,
        }
    }

    fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// Everything the host logged so far (stderr).
    fn log(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// The last `n` lines of the log, for assertion messages.
    fn tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// How many log lines contain `needle`.
    fn log_count(&self, needle: &str) -> usize {
        self.log().lines().filter(|l| l.contains(needle)).count()
    }

    /// The counters of `handler`'s latest periodic stats line (every 2 s).
    fn last_stats(&self, handler: &str) -> Option<Counters> {
        let tag = format!("handler={handler}");
        self.log()
            .lines()
            .rev()
            .find(|l| l.contains(" stats ") && l.split_whitespace().any(|t| t == tag))
            .map(parse_counters)
    }

    /// SIGTERM, waits for a clean exit (30 s at most) and returns `handler`'s
    /// final counters from the shutdown summary on stdout.
    fn stop(mut self, handler: &str) -> Counters {
        let mut child = self.child.take().unwrap();
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "host did not exit within 30 s of SIGTERM:\n{}",
                    self.tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            status.success(),
            "host exited with {status}:\n{}",
            self.tail(40)
        );
        let out = std::fs::read_to_string(&self.out).unwrap();
        let prefix = format!("handler {handler}: ");
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no summary for {handler} on stdout: {out:?}"));
        parse_counters(line)
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn consumer_info(js: &jetstream::Context) -> jetstream::consumer::Info {
    let mut c: jetstream::consumer::PullConsumer = js
        .get_stream("ACCOUNTS")
        .await
        .unwrap()
        .get_consumer(HANDLER)
        .await
        .unwrap();
    c.info().await.unwrap().clone()
}

fn describe(i: &jetstream::consumer::Info) -> String {
    format!(
        "last delivered stream seq {}, deliveries {}, ack floor stream seq {}, num_pending {}, num_ack_pending {}, num_redelivered {}",
        i.delivered.stream_sequence,
        i.delivered.consumer_sequence,
        i.ack_floor.stream_sequence,
        i.num_pending,
        i.num_ack_pending,
        i.num_redelivered
    )
}

/// Waits until the host has created the stream and its durable consumer.
async fn wait_for_consumer(js: &jetstream::Context, host: &mut HostProcess) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = js.get_stream("ACCOUNTS").await
            && s.get_consumer::<jetstream::consumer::pull::Config>(HANDLER)
                .await
                .is_ok()
        {
            return;
        }
        assert!(host.alive(), "host exited at start:\n{}", host.tail(40));
        assert!(
            Instant::now() < deadline,
            "host did not create its consumer:\n{}",
            host.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (`patience` at most) until the consumer has nothing pending and
/// nothing unacked, and returns its info.
async fn wait_drained(
    js: &jetstream::Context,
    host: &HostProcess,
    patience: Duration,
) -> jetstream::consumer::Info {
    let deadline = Instant::now() + patience;
    loop {
        let i = consumer_info(js).await;
        if i.num_pending == 0 && i.num_ack_pending == 0 {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "consumer not drained within {patience:?}: {}\nhost log:\n{}",
            describe(&i),
            host.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `i`-th credit event (0-based): `evt_0000`…, account `i % 10`, amount `i + 1`.
fn event(i: i64) -> String {
    credit(&format!("evt_{i:04}"), i % ACCOUNTS, i + 1)
}

async fn publish_events(js: &jetstream::Context, range: std::ops::Range<i64>) {
    for i in range {
        publish(js, SUBJECT, &event(i), &[]).await;
    }
}

/// Asserts the database holds exactly events `0..n` applied once each:
/// every account's balance, the receipt ids, and no dead letter.
async fn assert_exactly_once(db: &TestDb, n: i64, evidence: &dyn Fn() -> String) {
    for a in 0..ACCOUNTS {
        let want: i64 = (0..n).filter(|i| i % ACCOUNTS == a).map(|i| i + 1).sum();
        assert_eq!(
            db.balance(a).await,
            Some(want),
            "balance of account {a}\n{}",
            evidence()
        );
    }
    let want_ids: Vec<String> = (0..n).map(|i| format!("evt_{i:04}")).collect();
    let ids = db.receipt_ids(HANDLER).await;
    assert_eq!(ids.len(), want_ids.len(), "receipts\n{}", evidence());
    assert_eq!(ids, want_ids);
    let dl = db.dead_letters(HANDLER).await;
    assert!(dl.is_empty(), "dead letters: {dl:?}\n{}", evidence());
}

/// Polls `db`'s receipt count until it reaches `n` (`patience` at most).
async fn wait_receipts(db: &TestDb, n: i64, patience: Duration, evidence: &dyn Fn() -> String) {
    let deadline = Instant::now() + patience;
    loop {
        let got = db.receipts(HANDLER).await;
        if got >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{got} of {n} receipts after {patience:?}\n{}",
            evidence()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The credit handlers' `ack_wait`: short, so an outage of a few seconds
/// outlasts it several times over.
const ACK_WAIT: Duration = Duration::from_secs(1);

fn credit_handler() -> HandlerSpec {
    let mut h = HandlerSpec::new(HANDLER, "credit");
    // max_deliver = 2: a design that naked per failed attempt would strand
    // or dead-letter messages after two attempts during an outage.
    h.extra = format!(
        "max_deliver = 2\nack_wait = \"{}ms\"\nretry_delay = \"200ms\"\n",
        ACK_WAIT.as_millis()
    );
    h
}

/// Waits (`patience` at most) until the host has logged `needle`.
async fn wait_for_log(host: &mut HostProcess, needle: &str, patience: Duration) -> Duration {
    let started = Instant::now();
    while host.log_count(needle) == 0 {
        assert!(host.alive(), "host died:\n{}", host.tail(40));
        assert!(
            started.elapsed() < patience,
            "no `{needle}` line within {patience:?}:\n{}",
            host.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

fn tail_of(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---------------------------------------------------------------- (a) outage

/// 100 events processed; the cluster stops (fast shutdown); 100 more are
/// published while it is down. Once the host has noticed (its pool gives up
/// on a refused connection after its acquire timeout), it must hold out
/// 3 × ack_wait + 1 s more: alive, nothing past the first 100 acked, nothing
/// new fetched. The cluster starts again and all 200 are applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_pauses_then_resumes_by_itself() {
    let t0 = Instant::now();
    let mut pg = PgCluster::start();
    let db = pg.create_db("idem_outage").await;
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &nats, &db, &[credit_handler()]);
    let mut host = HostProcess::start(&cfg, dir.path());
    let js = nats.jetstream().await;
    wait_for_consumer(&js, &mut host).await;

    publish_events(&js, 0..100).await;
    wait_receipts(&db, 100, Duration::from_secs(30), &|| host.tail(40)).await;
    let before = wait_drained(&js, &host, Duration::from_secs(10)).await;
    assert_eq!(
        before.ack_floor.stream_sequence,
        100,
        "{}",
        describe(&before)
    );

    pg.stop();
    let down = Instant::now();
    publish_events(&js, 100..200).await;
    let noticed = wait_for_log(&mut host, "database unavailable", Duration::from_secs(30)).await;
    let early = consumer_info(&js).await;
    tokio::time::sleep(3 * ACK_WAIT + Duration::from_secs(1)).await;
    let late = consumer_info(&js).await;
    let outage = down.elapsed();
    assert!(
        host.alive(),
        "host died while the database was down:\n{}",
        host.tail(40)
    );
    // Nothing acked (or termed) that was not committed: the first 100 were,
    // and every one of the second 100 is still pending or unacked.
    assert_eq!(
        (
            late.ack_floor.stream_sequence,
            late.num_pending + late.num_ack_pending as u64
        ),
        (100, 100),
        "while down: {}\nhost log:\n{}",
        describe(&late),
        host.tail(40)
    );
    // Fetching paused: nothing newer was taken from the stream meanwhile.
    assert_eq!(
        late.delivered.stream_sequence,
        early.delivered.stream_sequence,
        "the handler kept fetching while the database was down: when noticed {}, {:?} later {}",
        describe(&early),
        3 * ACK_WAIT + Duration::from_secs(1),
        describe(&late)
    );
    let stats_while_down = host.last_stats(HANDLER);

    pg.start_again();
    let up = Instant::now();
    let evidence = || {
        format!(
            "{}\npostgres log:\n{}",
            host.tail(40),
            tail_of(&pg.log(), 10)
        )
    };
    wait_receipts(&db, 200, Duration::from_secs(30), &evidence).await;
    let resumed_in = up.elapsed();
    let after = wait_drained(&js, &host, Duration::from_secs(15)).await;
    assert_exactly_once(&db, 200, &evidence).await;
    assert!(host.alive());
    assert!(
        host.log_count("database available again") >= 1,
        "no `database available again` line:\n{}",
        host.tail(40)
    );
    let unavailable_lines = host.log_count("database unavailable");
    let c = host.stop(HANDLER);
    eprintln!(
        "outage test: host noticed the outage after {noticed:?}, outage {outage:?}, all 200 \
         applied {resumed_in:?} after the restart, total {:?}; stats while down \
         {stats_while_down:?}; final {c:?}; consumer {}; `database unavailable` lines: \
         {unavailable_lines}",
        t0.elapsed(),
        describe(&after)
    );
    let pauses = counter(&c, "db_pauses");
    assert!(pauses >= 1, "db_pauses {pauses}: {c:?}");
    // Logged once per paused delivery, not once per probe.
    assert!(
        unavailable_lines as u64 <= pauses,
        "{unavailable_lines} `database unavailable` lines for {pauses} paused deliveries"
    );
    // No commit was in flight when the database went away: each event was
    // committed exactly once by this host; an outage is not a retry.
    assert_eq!(
        (
            counter(&c, "processed"),
            counter(&c, "retried"),
            counter(&c, "dead_lettered"),
            counter(&c, "traps")
        ),
        (200, 0, 0, 0),
        "{c:?}"
    );
}

/// 1000 events are waiting when the host starts; once 200 are committed the
/// cluster crashes (immediate shutdown: in-flight transactions die with an
/// unknown outcome for the host). 3 × ack_wait + 1 s after the host noticed:
/// host alive, and no more messages acked than were committed before the
/// crash. Restarted: all 1000 exactly once, nothing dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_mid_run_loses_and_repeats_nothing() {
    const N: i64 = 1000;
    let t0 = Instant::now();
    let mut pg = PgCluster::start();
    let db = pg.create_db("idem_crash").await;
    let nats = Nats::start();
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    let js = nats.jetstream().await;
    publish_events(&js, 0..N).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &nats, &db, &[credit_handler()]);
    let mut host = HostProcess::start(&cfg, dir.path());
    wait_for_consumer(&js, &mut host).await;
    wait_receipts(&db, 200, Duration::from_secs(30), &|| host.tail(40)).await;

    pg.crash();
    let down = Instant::now();
    let noticed = wait_for_log(&mut host, "database unavailable", Duration::from_secs(30)).await;
    tokio::time::sleep(3 * ACK_WAIT + Duration::from_secs(1)).await;
    let while_down = consumer_info(&js).await;
    assert!(
        host.alive(),
        "host died while the database was down:\n{}",
        host.tail(40)
    );
    let acked = N as u64 - while_down.num_pending - while_down.num_ack_pending as u64;
    assert!(
        acked < N as u64,
        "the crash came too late to be mid-run: {}",
        describe(&while_down)
    );

    pg.start_again();
    let outage = down.elapsed();
    // Receipts committed before the crash: their transactions began before
    // this start of the server (processed_at is the transaction's start).
    let committed_before_crash = db
        .scalar(
            "SELECT count(*) FROM idem_receipts WHERE processed_at < pg_postmaster_start_time()",
        )
        .await
        .unwrap() as u64;
    assert!(
        acked <= committed_before_crash,
        "{acked} messages acked but only {committed_before_crash} committed before the crash: {}",
        describe(&while_down)
    );
    let evidence = || {
        format!(
            "{}\npostgres log:\n{}",
            host.tail(40),
            tail_of(&pg.log(), 10)
        )
    };
    wait_receipts(&db, N, Duration::from_secs(60), &evidence).await;
    let after = wait_drained(&js, &host, Duration::from_secs(15)).await;
    assert_exactly_once(&db, N, &evidence).await;
    let c = host.stop(HANDLER);
    eprintln!(
        "crash test: crashed after {committed_before_crash} commits ({acked} acked), noticed after \
         {noticed:?}, outage {outage:?}, \
         total {:?}; final {c:?}; consumer {}",
        t0.elapsed(),
        describe(&after)
    );
    assert!(counter(&c, "db_pauses") >= 1, "{c:?}");
    assert_eq!(counter(&c, "dead_lettered"), 0, "{c:?}");
    // A commit whose outcome the host could not learn is not counted as
    // processed; its redelivery finds the receipt (a duplicate).
    let (processed, duplicates) = (counter(&c, "processed"), counter(&c, "duplicates"));
    assert!(processed <= N as u64, "{c:?}");
    assert!(processed + duplicates >= N as u64, "{c:?}");
}

// ---------------------------------------------------- (b) terminated sessions

/// On the machine's PostgreSQL: while the host works through 1000 events,
/// every 100 ms all sessions of the test's database (except the killer's
/// own) are terminated (`pg_terminate_backend`, SQLSTATE 57P01). Every event
/// is applied exactly once, nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_sessions_mid_run_lose_and_repeat_nothing() {
    const N: i64 = 1000;
    let t0 = Instant::now();
    let db = TestDb::new(Backend::Postgres).await;
    let nats = Nats::start();
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    let js = nats.jetstream().await;
    publish_events(&js, 0..N).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), &nats, &db, &[credit_handler()]);
    let mut host = HostProcess::start(&cfg, dir.path());
    wait_for_consumer(&js, &mut host).await;

    // One session of our own, to count receipts and terminate the others.
    let mut killer = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut rounds, mut rounds_mid_run, mut terminated) = (0u32, 0u32, 0i64);
    loop {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_receipts")
            .fetch_one(&mut killer)
            .await
            .unwrap();
        if done >= N {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {N} receipts after 90 s\n{}",
            host.tail(40)
        );
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()) s WHERE t",
        )
        .fetch_one(&mut killer)
        .await
        .unwrap();
        rounds += 1;
        terminated += n;
        if n > 0 && done > 0 {
            rounds_mid_run += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    killer.close().await.unwrap();
    let worked = t0.elapsed();
    assert!(
        rounds_mid_run >= 3,
        "only {rounds_mid_run} rounds terminated sessions while the host worked: the test did not disturb it"
    );
    let after = wait_drained(&js, &host, Duration::from_secs(15)).await;
    assert_exactly_once(&db, N, &|| host.tail(40)).await;
    assert!(host.alive());
    let c = host.stop(HANDLER);
    eprintln!(
        "terminate test: {rounds} rounds ({rounds_mid_run} mid-run), {terminated} sessions terminated, \
         all applied after {worked:?}; final {c:?}; consumer {}",
        describe(&after)
    );
    assert_eq!(counter(&c, "dead_lettered"), 0, "{c:?}");
    let (processed, duplicates) = (counter(&c, "processed"), counter(&c, "duplicates"));
    assert!(processed <= N as u64, "{c:?}");
    assert!(processed + duplicates >= N as u64, "{c:?}");
}

// ------------------------------------------------------ (c) COMMIT failures

/// A statement that breaks a `DEFERRABLE INITIALLY DEFERRED` foreign key
/// succeeds; the COMMIT fails. With `max_deliver = 3`: naked twice, then one
/// dead letter whose reason starts with COMMIT, termed, never acked, nothing
/// written. A valid message in the same run is processed once.
async fn deferred_constraint_fails_at_commit(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    db.execute("CREATE TABLE parents (id BIGINT PRIMARY KEY)")
        .await;
    db.execute(
        "CREATE TABLE children (id BIGINT PRIMARY KEY, parent_id BIGINT NOT NULL \
         REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .await;
    db.execute("INSERT INTO parents (id) VALUES (1)").await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("behave", "behave");
    h.tables = vec!["accounts".into(), "children".into()];
    h.extra = "retry_delay = \"100ms\"\nmax_deliver = 3\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;

    let orphan = serde_json::json!({
        "op": "sql", "event_id": "evt_orphan",
        "sql": "INSERT INTO children (id, parent_id) VALUES (10, 999)",
    });
    publish(&js, SUBJECT, &orphan.to_string(), &[]).await;
    let ok = serde_json::json!({
        "op": "credit", "event_id": "evt_ok", "account_id": 5, "amount": 50,
    });
    publish(&js, SUBJECT, &ok.to_string(), &[]).await;

    let s = host
        .wait_for(
            "behave",
            "the orphan dead-lettered and the credit processed",
            |s| s.dead_lettered == 1 && s.processed == 1,
        )
        .await;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.retried,
            s.dead_lettered,
            s.duplicates,
            s.traps
        ),
        (4, 1, 2, 1, 0, 0),
        "{s}"
    );
    let dl = db.dead_letters("behave").await;
    assert_eq!(dl.len(), 1, "{dl:?}");
    assert_eq!(dl[0].0.as_deref(), Some("evt_orphan"));
    let reason = &dl[0].1;
    assert!(reason.starts_with("COMMIT"), "reason: {reason}");
    assert!(
        reason.to_lowercase().contains("foreign key"),
        "reason: {reason}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM children").await, Some(0));
    assert_eq!(db.receipt_ids("behave").await, vec!["evt_ok".to_string()]);
    assert_eq!(db.balance(5).await, Some(50));
    // Termed after the dead letter: JetStream does not deliver it again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = host.stats("behave");
    assert_eq!((s.delivered, s.dead_lettered), (4, 1), "{s}");
    host.stop().await;
}
on_both_databases!(
    deferred_constraint_fails_at_commit,
    deferred_constraint_fails_at_commit
);
