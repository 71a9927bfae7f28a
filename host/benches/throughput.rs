//! Messages a second through one host, end to end, next to the ceilings of
//! the broker and of the database and to a native handler, all measured in
//! the same run, so the ratios hold on a noisy machine.
//!
//! Run: `cargo bench -p idem --features native-handler --bench throughput`
//! (without the feature the `native` rows say so). It needs what
//! `cold_start` needs (`nats-server` from `scripts/setup.sh`; the components
//! from `scripts/build-guests.sh` and `scripts/build-lang-guests.sh`, a
//! missing one gets a row that says so) and PostgreSQL at
//! `IDEM_BENCH_PG_URL`, default `postgres://postgres@127.0.0.1:5432/test`,
//! where it creates and drops one database per row (unreachable, its rows
//! are left out). `IDEM_BENCH_N` sets the messages per row (default 4000).
//!
//! Every row runs in a process of its own (this program, started again with
//! the row in `IDEM_THROUGHPUT_ROW`), so its peak RSS is its own, against a
//! stream and a database of its own (SQLite in WAL mode with
//! `synchronous=FULL`, as the host opens it), and drains N credit messages
//! published beforehand:
//! - **B**, the broker's ceiling: a durable pull consumer of async-nats
//!   takes the N messages and acks each, with a plain ack (no reply) and
//!   with a confirmed ack (`double_ack`, the ack idem sends after COMMIT),
//!   that many at a time. No database, no wasm.
//! - **D**, the database's ceiling: the transaction idem commits per message
//!   (BEGIN, idem's receipt insert, the credit upsert, COMMIT) sent from
//!   Rust with sqlx, that many at a time. No broker, no wasm.
//! - **native**: idem's pipeline (broker, receipt, COMMIT, confirmed ack)
//!   with the credit logic compiled into the host behind the boundary a
//!   guest's statements cross (`idem::runtime::native`).
//! - **idem**: the credit component in Rust, C, JavaScript (QuickJS) and
//!   Python.
//! - **50 % duplicates** (Rust): the second half of the N messages repeats
//!   the first half's event ids; below the table, what one skipped duplicate
//!   costs next to one processed message (this row's time and the Rust
//!   row's rate).
//!
//! A host row times `Host::run` from its start until the host's counters
//! show every message settled (read every 2 ms), after `Host::start`
//! (connect, tables, migrations, compile or cache). Then the same host takes
//! messages published at half that rate for the latency: p50 and p99 of
//! publish to COMMIT as the host records it for
//! `idem_publish_to_commit_seconds` (its clock minus the broker's publish
//! time, whole milliseconds), read from an in-process metrics recorder.
//!
//! - **Scaling** (a second table): 1, 2 and 3 host processes with the Rust
//!   component, concurrency 8 each, share one durable consumer and one
//!   PostgreSQL database; the time runs from when every host has started
//!   until the receipts count N.
//!
//! Columns: msg/s; latency p50 / p99 (ms; D: one transaction); the row's
//! process peak RSS (MiB, `VmHWM`; nats-server and PostgreSQL are other
//! processes); the ratios to native, to D and to min(B confirmed, D) at the
//! same concurrency.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::{self, consumer::pull};
use common::nats::{Nats, guests_dir, root};
use futures::StreamExt as _;
use idem::config::Config;
use idem::service::{Host, RunMode};
use idem::store::Database;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const PG_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The environment variable that carries a row to its process.
const ROW_ENV: &str = "IDEM_THROUGHPUT_ROW";

/// The credit components, in the order of the table: label and file in
/// `guests`.
const COMPONENTS: [(&str, &str); 4] = [
    ("Rust", "credit.wasm"),
    ("C", "credit-c.wasm"),
    ("JavaScript (QuickJS)", "credit-js-quickjs.wasm"),
    ("Python", "credit-python.wasm"),
];

/// The handler concurrencies compared.
const CONCURRENCY: [usize; 2] = [1, 8];

/// Each host's concurrency in the scaling rows.
const FLEET_CONCURRENCY: usize = 8;

/// Accounts the credits spread over.
const ACCOUNTS: usize = 1000;

/// The credit upsert of `examples/credit`, as the credit components send it.
const CREDIT: &str = "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) \
     ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance";

/// idem's receipt insert (`store::sql::INSERT_RECEIPT`).
const RECEIPT: &str = "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer, message_id) DO NOTHING";

/// The `i`-th credit event (event ids repeat when `i` does).
fn credit(i: usize) -> String {
    format!(
        r#"{{"event_id":"e{i}","account_id":{},"amount":1}}"#,
        i % ACCOUNTS + 1
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Db {
    Sqlite,
    Postgres,
}

impl Db {
    fn label(self) -> &'static str {
        match self {
            Db::Sqlite => "SQLite",
            Db::Postgres => "PostgreSQL",
        }
    }
}

/// What a row measures.
#[derive(Clone, Serialize, Deserialize)]
enum What {
    /// B: plain acks (`None`) or confirmed acks, that many at a time.
    Broker(Option<usize>),
    /// D at the row's concurrency.
    Database,
    /// A host with this component (`native`: swapped for the native credit
    /// handler after the start), over N messages (half of them repeats
    /// with `duplicates`).
    Host {
        module: PathBuf,
        native: bool,
        duplicates: bool,
    },
    /// One of several hosts sharing the durable consumer of stream
    /// `T<row>` and the database at `url` (made by the parent): starts,
    /// says `ready`, runs from `go` on stdin until stdin closes.
    FleetMember { module: PathBuf, url: String },
}

/// One row, handed to its process.
#[derive(Clone, Serialize, Deserialize)]
struct Spec {
    row: usize,
    what: What,
    db: Db,
    concurrency: usize,
    n: usize,
    nats: String,
    pg_admin: Option<String>,
    cache: PathBuf,
}

/// What one row measured.
#[derive(Default, Clone, Serialize, Deserialize)]
struct Measured {
    rate: f64,
    secs: f64,
    p50: Option<f64>,
    p99: Option<f64>,
    rss_mib: Option<f64>,
    /// CPU seconds the process used (user + system), scaling rows only.
    #[serde(default)]
    cpu_s: Option<f64>,
    /// How busy the machine's CPUs were during the row (0 to 1), scaling
    /// rows only.
    #[serde(default)]
    busy: Option<f64>,
}

/// A fresh database for one row: dropped (PostgreSQL) or deleted with its
/// directory (SQLite) at the end.
struct RowDb {
    url: String,
    _dir: tempfile::TempDir,
    pg: Option<(String, String)>,
}

impl RowDb {
    async fn new(spec: &Spec) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        match spec.db {
            Db::Sqlite => Ok(RowDb {
                url: format!("sqlite://{}", dir.path().join("idem.db").display()),
                _dir: dir,
                pg: None,
            }),
            Db::Postgres => {
                let admin = spec.pg_admin.clone().context("no PostgreSQL")?;
                let name = format!("idem_throughput_{}_{}", std::process::id(), spec.row);
                let a = Database::connect(&admin, 1).await?;
                let pool = a.postgres_pool().context("not PostgreSQL")?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(pool)
                    .await
                    .context("CREATE DATABASE")?;
                a.close().await;
                Ok(RowDb {
                    url: common::with_database(&admin, &name),
                    _dir: dir,
                    pg: Some((admin, name)),
                })
            }
        }
    }

    async fn drop_it(self) -> Result<()> {
        if let Some((admin, name)) = self.pg {
            let db = Database::connect(&admin, 1).await?;
            let pool = db.postgres_pool().context("not PostgreSQL")?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(pool)
            .await?;
            db.close().await;
        }
        Ok(())
    }
}

/// A stream `T<row>` on `t<row>.credit` holding `payloads`, published
/// without `Nats-Msg-Id` (the broker keeps repeats); returns the subject.
async fn stream_with(js: &jetstream::Context, row: usize, payloads: &[String]) -> Result<String> {
    let subject = format!("t{row}.credit");
    js.create_stream(jetstream::stream::Config {
        name: format!("T{row}"),
        subjects: vec![subject.clone()],
        max_age: Duration::from_secs(7 * 24 * 3600),
        ..Default::default()
    })
    .await?;
    let acks: Vec<_> = futures::stream::iter(payloads.iter().cloned())
        .map(|p| {
            let (js, subject) = (js.clone(), subject.clone());
            async move {
                js.publish(subject, p.into())
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))
            }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    for ack in acks {
        ack?;
    }
    Ok(subject)
}

/// Runs one row in this process (the child's side).
async fn run_row(spec: Spec) -> Result<Measured> {
    match spec.what.clone() {
        What::Broker(concurrency) => broker(&spec, concurrency).await,
        What::Database => database(&spec).await,
        What::Host {
            module,
            native,
            duplicates,
        } => host(&spec, module, native, duplicates).await,
        What::FleetMember { module, url } => fleet_member(&spec, module, &url).await,
    }
}

/// **B**: a durable pull consumer takes the row's N messages, acking each
/// plainly (`concurrency` None) or with a confirmed ack, that many at a time.
async fn broker(spec: &Spec, concurrency: Option<usize>) -> Result<Measured> {
    let js = jetstream::new(async_nats::connect(&spec.nats).await?);
    let payloads: Vec<String> = (0..spec.n).map(credit).collect();
    stream_with(&js, spec.row, &payloads).await?;
    let stream = js.get_stream(format!("T{}", spec.row)).await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(format!("b{}", spec.row)),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let started = Instant::now();
    let messages = consumer.messages().await?.take(spec.n);
    let failed = Arc::new(AtomicUsize::new(0));
    messages
        .for_each_concurrent(concurrency.unwrap_or(1), |m| {
            let failed = failed.clone();
            async move {
                let ok = match (m, concurrency) {
                    (Ok(m), None) => m.ack().await.is_ok(),
                    (Ok(m), Some(_)) => m.double_ack().await.is_ok(),
                    (Err(_), _) => false,
                };
                if !ok {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await;
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} acks failed");
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(Measured {
        rate: spec.n as f64 / secs,
        secs,
        rss_mib: peak_rss_mib(),
        ..Default::default()
    })
}

/// **D**: N transactions of receipt insert + credit upsert, `concurrency`
/// at a time, straight to the database.
async fn database(spec: &Spec) -> Result<Measured> {
    let row_db = RowDb::new(spec).await?;
    let c = spec.concurrency;
    let db = Arc::new(Database::connect(&row_db.url, c as u32).await?);
    db.prepare_host_tables().await?;
    common::run_sql(
        &db,
        [
            "CREATE TABLE accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)"
                .to_owned(),
        ],
    )
    .await?;
    let (next, n) = (Arc::new(AtomicUsize::new(0)), spec.n);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..c {
        let (next, db) = (next.clone(), db.clone());
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(took);
                }
                let t = Instant::now();
                one_transaction(&db, i).await?;
                took.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }));
    }
    let mut took = Vec::new();
    for t in tasks {
        took.extend(t.await??);
    }
    let secs = started.elapsed().as_secs_f64();
    let balance_total = total_balance(&db).await?;
    db.close().await;
    row_db.drop_it().await?;
    if balance_total != n as i64 {
        bail!("the accounts hold {balance_total}, not {n}");
    }
    let (p50, p99) = percentiles(took);
    Ok(Measured {
        rate: n as f64 / secs,
        secs,
        p50,
        p99,
        rss_mib: peak_rss_mib(),
        ..Default::default()
    })
}

/// The sum of every balance (each credit adds 1).
async fn total_balance(db: &Database) -> Result<i64> {
    const SUM: &str = "SELECT CAST(COALESCE(SUM(balance), 0) AS BIGINT) FROM accounts";
    Ok(match (db.postgres_pool(), db.sqlite_pool()) {
        (Some(pool), _) => sqlx::query_scalar(SUM).fetch_one(pool).await?,
        (None, Some(pool)) => sqlx::query_scalar(SUM).fetch_one(pool).await?,
        (None, None) => bail!("no database backend"),
    })
}

/// One message's transaction as idem commits it, without the guest.
async fn one_transaction(db: &Database, i: usize) -> Result<()> {
    let id = format!("e{i}");
    let account = (i % ACCOUNTS + 1) as i64;
    macro_rules! transaction {
        ($pool:expr) => {{
            let mut tx = $pool.begin().await?;
            sqlx::query(RECEIPT)
                .bind("d")
                .bind(&id)
                .bind(i as i64)
                .bind("none")
                .bind(0_i64)
                .execute(&mut *tx)
                .await?;
            sqlx::query(CREDIT)
                .bind(account)
                .bind(1_i64)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }};
    }
    match (db.postgres_pool(), db.sqlite_pool()) {
        (Some(pool), _) => transaction!(pool),
        (None, Some(pool)) => transaction!(pool),
        (None, None) => bail!("no database backend"),
    }
    Ok(())
}

/// **native** and **idem**: a host with `concurrency` over the row's
/// messages, then over messages published at half its rate for the latency.
async fn host(spec: &Spec, module: PathBuf, native: bool, duplicates: bool) -> Result<Measured> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .map_err(|_| anyhow::anyhow!("a metrics recorder is installed already"))?;
    let (row, n) = (spec.row, spec.n);
    let js = jetstream::new(async_nats::connect(&spec.nats).await?);
    let payloads: Vec<String> = if duplicates {
        (0..n).map(|i| credit(i % (n / 2).max(1))).collect()
    } else {
        (0..n).map(credit).collect()
    };
    let distinct = if duplicates { (n / 2).max(1) } else { n };
    let row_db = RowDb::new(spec).await?;
    let subject = stream_with(&js, row, &payloads).await?;
    let name = format!("h{row}");
    let host = start_host(spec, &module, &row_db.url).await?;
    if native {
        put_native_in_place(&host)?;
    }
    let (_, stats) = host.stats().into_iter().next().context("no handler")?;
    let settled = |s: &idem::metrics::StatsSnapshot| s.processed + s.duplicates + s.dead_lettered;
    let token = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(host.run(RunMode::Forever, token.clone()));
    while settled(&stats.snapshot()) < n as u64 {
        if running.is_finished() {
            bail!("the host stopped before the messages were processed");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let rate = n as f64 / secs;
    let s = stats.snapshot();
    if (s.processed, s.duplicates, s.dead_lettered, s.retried)
        != (distinct as u64, (n - distinct) as u64, 0, 0)
    {
        bail!(
            "not a clean run: {} processed, {} duplicates, {} dead-lettered, {} retried",
            s.processed,
            s.duplicates,
            s.dead_lettered,
            s.retried
        );
    }

    // Latency: messages at half the rate, after the backlog's samples are
    // taken out of the recorder.
    let _ = publish_to_commit(&snapshotter, &name);
    let paced = (rate.min(2000.0) as usize).max(100);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(2.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    for i in 0..paced {
        tick.tick().await;
        js.publish(subject.clone(), credit(1_000_000 + i).into())
            .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while settled(&stats.snapshot()) < (n + paced) as u64 {
        if Instant::now() > deadline {
            bail!("the paced messages were not processed within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (p50, p99) = percentiles(publish_to_commit(&snapshotter, &name));
    let rss_mib = peak_rss_mib();
    token.cancel();
    let _ = running.await;
    let db = Database::connect(&row_db.url, 1).await?;
    let total = total_balance(&db).await?;
    db.close().await;
    row_db.drop_it().await?;
    if total != (distinct + paced) as i64 {
        bail!("the accounts hold {total}, not {}", distinct + paced);
    }
    Ok(Measured {
        rate,
        secs,
        p50,
        p99,
        rss_mib,
        ..Default::default()
    })
}

/// `Host::start` for handler `h<row>` on stream `T<row>` with `module`,
/// the row's concurrency, and the database at `url`.
async fn start_host(spec: &Spec, module: &std::path::Path, url: &str) -> Result<Host> {
    let (row, c) = (spec.row, spec.concurrency);
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{}\"\n[database]\nurl = \"{url}\"\nmax_connections = {}\n[runtime]\ncache_dir = \"{}\"\n[[handler]]\nname = \"h{row}\"\nmodule = \"{}\"\nstream = \"T{row}\"\nsubjects = [\"t{row}.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\"]\nmigrations = \"{}\"\nconcurrency = {c}\n",
            spec.nats,
            c + 2,
            spec.cache.display(),
            module.display(),
            root().join("examples/credit/migrations").display()
        ),
    )?;
    let config = Config::load(&cfg)?;
    Host::start(&config).await
}

/// One host of a fleet row (the child's side of [`fleet`]).
async fn fleet_member(spec: &Spec, module: PathBuf, url: &str) -> Result<Measured> {
    use tokio::io::AsyncBufReadExt as _;
    let host = start_host(spec, &module, url).await?;
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    println!("ready");
    anyhow::ensure!(
        stdin.next_line().await?.as_deref() == Some("go"),
        "no go from the bench"
    );
    let cpu_at_go = cpu_seconds();
    let token = CancellationToken::new();
    let running = tokio::spawn(host.run(RunMode::Forever, token.clone()));
    while stdin.next_line().await?.is_some() {}
    let cpu_s = cpu_seconds().zip(cpu_at_go).map(|(end, go)| end - go);
    token.cancel();
    let _ = running.await;
    Ok(Measured {
        rss_mib: peak_rss_mib(),
        cpu_s,
        ..Default::default()
    })
}

/// **Scaling**: `hosts` host processes share one durable consumer and one
/// PostgreSQL database over the row's N messages; the time runs from `go`
/// (every host started) until the receipts count N. RSS: the largest host.
async fn fleet(spec: &Spec, hosts: usize) -> Result<Measured> {
    use std::io::{BufRead as _, Write as _};
    let js = jetstream::new(async_nats::connect(&spec.nats).await?);
    let payloads: Vec<String> = (0..spec.n).map(credit).collect();
    let row_db = RowDb::new(spec).await?;
    stream_with(&js, spec.row, &payloads).await?;
    let member = Spec {
        what: What::FleetMember {
            module: guests_dir().join("credit.wasm"),
            url: row_db.url.clone(),
        },
        ..spec.clone()
    };
    let mut children = Vec::new();
    for _ in 0..hosts {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .env(ROW_ENV, serde_json::to_string(&member)?)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()?;
        let mut out = std::io::BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "ready", "a host did not start: {line}");
        children.push((child, out));
    }
    let db = Database::connect(&row_db.url, 1).await?;
    let consumer = format!("h{}", spec.row);
    let ticks = machine_ticks();
    let started = Instant::now();
    for (child, _) in &mut children {
        writeln!(child.stdin.as_mut().context("stdin")?, "go")?;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while db.receipt_count(&consumer).await? < spec.n as u64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the fleet did not finish in 600 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let busy = match (ticks, machine_ticks()) {
        (Some((busy0, all0)), Some((busy1, all1))) if all1 > all0 => {
            Some((busy1 - busy0) as f64 / (all1 - all0) as f64)
        }
        _ => None,
    };
    // Tell the hosts to stop first: what they used is measured when they
    // see stdin close, right after the last receipt.
    for (child, _) in &mut children {
        drop(child.stdin.take());
    }
    let total = total_balance(&db).await?;
    db.close().await;
    let mut rss: Option<f64> = None;
    let mut cpu = 0.0;
    for (mut child, mut out) in children {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest)?;
        anyhow::ensure!(child.wait()?.success(), "a host failed: {rest}");
        let m: Measured = serde_json::from_str(
            rest.lines()
                .last()
                .and_then(|l| l.strip_prefix("row: "))
                .context("no measurement from a host")?,
        )?;
        cpu += m.cpu_s.unwrap_or(0.0);
        rss = match (rss, m.rss_mib) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    row_db.drop_it().await?;
    anyhow::ensure!(
        total == spec.n as i64,
        "the accounts hold {total}, not {}",
        spec.n
    );
    Ok(Measured {
        rate: spec.n as f64 / secs,
        secs,
        rss_mib: rss,
        cpu_s: Some(cpu),
        busy,
        ..Default::default()
    })
}

/// This process's CPU time, user + system, in seconds (`/proc/self/stat`
/// fields 14 and 15, in clock ticks of 1/100 s, `USER_HZ` on Linux: proc(5)).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// The machine's busy and total CPU ticks so far (`/proc/stat`, line
/// `cpu`: busy = all but idle and iowait).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let all: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((all - idle, all))
}

#[cfg(feature = "native-handler")]
fn put_native_in_place(host: &Host) -> Result<()> {
    use idem::runtime::HandlerComponent;
    use idem::runtime::native::{NativeHandler, NativeHost};
    use idem::runtime::{GuestMessage, HandlerFailure};
    use idem::store::SqlValue;

    /// `examples/credit` compiled into the host.
    struct NativeCredit;

    #[derive(Deserialize)]
    struct CreditEvent {
        account_id: i64,
        amount: i64,
    }

    impl NativeHandler for NativeCredit {
        fn handle<'a>(
            &'a self,
            host: &'a mut NativeHost<'_>,
            msg: &'a GuestMessage,
        ) -> futures::future::BoxFuture<'a, Result<(), HandlerFailure>> {
            Box::pin(async move {
                let event: CreditEvent = serde_json::from_slice(&msg.payload)
                    .map_err(|e| HandlerFailure::Reject(format!("not a credit event: {e}")))?;
                let params = vec![
                    SqlValue::Integer(event.account_id),
                    SqlValue::Integer(event.amount),
                ];
                match host.execute(CREDIT, params).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(HandlerFailure::Retry(e)),
                    Err(trap) => Err(HandlerFailure::Trap(trap)),
                }
            })
        }
    }

    for (_, slot) in host.slots() {
        slot.swap(HandlerComponent::native("credit", Arc::new(NativeCredit)));
    }
    Ok(())
}

#[cfg(not(feature = "native-handler"))]
fn put_native_in_place(_: &Host) -> Result<()> {
    bail!("built without --features native-handler")
}

/// The `idem_publish_to_commit_seconds` samples of `handler` since the
/// last call (the recorder hands each sample out once), in milliseconds.
fn publish_to_commit(snapshotter: &Snapshotter, handler: &str) -> Vec<f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, _, _, _)| {
            let key = key.key();
            key.name() == "idem_publish_to_commit_seconds"
                && key
                    .labels()
                    .any(|l| l.key() == "handler" && l.value() == handler)
        })
        .flat_map(|(_, _, _, value)| match value {
            DebugValue::Histogram(v) => v.into_iter().map(|x| x.into_inner() * 1000.0).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// p50 and p99 of `samples`.
fn percentiles(mut samples: Vec<f64>) -> (Option<f64>, Option<f64>) {
    if samples.is_empty() {
        return (None, None);
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (Some(at(0.5)), Some(at(0.99)))
}

/// This process's peak RSS (`VmHWM` in `/proc/self/status`), MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Runs `spec` in a new process of this program; its last stdout line is
/// the measurement.
fn in_child(spec: &Spec) -> Result<Measured> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .env(ROW_ENV, serde_json::to_string(spec)?)
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last().and_then(|l| l.strip_prefix("row: ")) {
        Some(json) if out.status.success() => Ok(serde_json::from_str(json)?),
        _ => bail!("row {} failed ({}): {stdout}", spec.row, out.status),
    }
}

fn cell(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn ratio(a: f64, b: Option<f64>) -> String {
    match b {
        Some(b) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

/// The table: what ran, then the ratios.
struct Table {
    native: Option<f64>,
    d: Option<f64>,
    b: Option<f64>,
}

impl Table {
    fn header() {
        println!(
            "| row | database | concurrency | msg/s | p50 ms | p99 ms | peak RSS MiB | ÷ native | ÷ D | ÷ min(B, D) |"
        );
        println!("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    }

    fn line(&self, what: &str, db: &str, c: &str, m: &Measured) {
        let floor = match (self.d, self.b) {
            (Some(d), Some(b)) => Some(d.min(b)),
            (d, None) => d,
            (None, b) => b,
        };
        println!(
            "| {what} | {db} | {c} | {:.0} | {} | {} | {} | {} | {} | {} |",
            m.rate,
            cell(m.p50, 1),
            cell(m.p99, 1),
            cell(m.rss_mib, 0),
            ratio(m.rate, self.native),
            ratio(m.rate, self.d),
            ratio(m.rate, floor),
        );
    }

    fn failed(what: &str, db: &str, c: &str, why: &str) {
        println!("| {what} | {db} | {c} | {why} | | | | | | |");
    }
}

async fn bench() -> Result<()> {
    let nats = Nats::start()?;
    let pg = std::env::var("IDEM_BENCH_PG_URL").unwrap_or_else(|_| PG_URL_DEFAULT.into());
    let pg_admin = match Database::connect(&pg, 1).await {
        Ok(db) => {
            db.close().await;
            Some(pg)
        }
        Err(e) => {
            eprintln!("throughput: PostgreSQL rows left out: {e:#}");
            None
        }
    };
    let n = std::env::var("IDEM_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(4000);
    let cache = tempfile::tempdir()?;
    let mut row = 0;
    let mut spec = |what: What, db: Db, concurrency: usize| {
        row += 1;
        Spec {
            row,
            what,
            db,
            concurrency,
            n,
            nats: nats.url(),
            pg_admin: pg_admin.clone(),
            cache: cache.path().to_owned(),
        }
    };
    let rust = guests_dir().join("credit.wasm");

    println!(
        "{n} messages per row, {} cores; latency: p50 / p99 in ms (D: one transaction; native and idem: publish to COMMIT at half the row's rate)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    Table::header();
    let none = Table {
        native: None,
        d: None,
        b: None,
    };
    eprintln!("throughput: B ...");
    none.line(
        "B, plain ack",
        "-",
        "-",
        &in_child(&spec(What::Broker(None), Db::Sqlite, 1))?,
    );
    let mut confirmed = Vec::new();
    for c in CONCURRENCY {
        let b = in_child(&spec(What::Broker(Some(c)), Db::Sqlite, c))?;
        none.line("B, confirmed ack", "-", &c.to_string(), &b);
        confirmed.push(b.rate);
    }
    let mut dbs = vec![Db::Sqlite];
    if pg_admin.is_some() {
        dbs.push(Db::Postgres);
    }
    let mut duplicate_costs = Vec::new();
    for db in dbs {
        for (c, b) in CONCURRENCY.into_iter().zip(confirmed.iter().copied()) {
            let (label, cs) = (db.label(), c.to_string());
            eprintln!("throughput: {label}, concurrency {c} ...");
            let d = in_child(&spec(What::Database, db, c))?;
            let mut table = Table {
                native: None,
                d: Some(d.rate),
                b: Some(b),
            };
            table.line("D", label, &cs, &d);
            let host = |module: PathBuf, native, duplicates| What::Host {
                module,
                native,
                duplicates,
            };
            match in_child(&spec(host(rust.clone(), true, false), db, c)) {
                Ok(m) => {
                    table.line("native", label, &cs, &m);
                    table.native = Some(m.rate);
                }
                Err(e) => Table::failed("native", label, &cs, &format!("{e:#}")),
            }
            let mut rust_rate = None;
            for (lang, file) in COMPONENTS {
                let module = guests_dir().join(file);
                if !module.exists() {
                    Table::failed(
                        &format!("idem, {lang}"),
                        label,
                        &cs,
                        &format!("missing: {}", module.display()),
                    );
                    continue;
                }
                let m = in_child(&spec(host(module, false, false), db, c))?;
                if file == "credit.wasm" {
                    rust_rate = Some(m.rate);
                }
                table.line(&format!("idem, {lang}"), label, &cs, &m);
            }
            if let Some(processed_rate) = rust_rate {
                let m = in_child(&spec(host(rust.clone(), false, true), db, c))?;
                // Half its messages do no work: no ratio to native.
                table.native = None;
                table.line("idem, Rust, 50 % duplicates", label, &cs, &m);
                // Half the messages processed at the Rust row's rate, the rest duplicates.
                let half = (n / 2) as f64;
                let per_processed = 1.0 / processed_rate;
                let per_duplicate = (m.secs - half * per_processed) / (n as f64 - half);
                duplicate_costs.push((label, c, per_duplicate / per_processed));
            }
        }
    }
    println!();
    for (db, c, r) in duplicate_costs {
        println!("- {db}, concurrency {c}: a skipped duplicate costs {r:.2} × a processed message");
    }
    if pg_admin.is_some() && rust.exists() {
        eprintln!("throughput: scaling ...");
        println!();
        println!(
            "Scaling: host processes sharing one durable consumer, PostgreSQL, the Rust component, concurrency {FLEET_CONCURRENCY} each"
        );
        println!();
        println!(
            "| hosts | msg/s | ÷ 1 host | machine CPU busy | hosts' CPU ms per message | largest host RSS MiB |"
        );
        println!("|--:|--:|--:|--:|--:|--:|");
        let mut one = None;
        for hosts in 1..=3 {
            let s = spec(What::Database, Db::Postgres, FLEET_CONCURRENCY);
            let m = fleet(&s, hosts).await?;
            let base = *one.get_or_insert(m.rate);
            println!(
                "| {hosts} | {:.0} | {} | {} | {} | {} |",
                m.rate,
                ratio(m.rate, Some(base)),
                m.busy.map_or("-".into(), |b| format!("{:.0} %", b * 100.0)),
                cell(m.cpu_s.map(|c| c * 1000.0 / n as f64), 2),
                cell(m.rss_mib, 0)
            );
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match std::env::var(ROW_ENV) {
        Ok(spec) => {
            let spec: Spec = serde_json::from_str(&spec)?;
            let measured = runtime.block_on(run_row(spec))?;
            println!("row: {}", serde_json::to_string(&measured)?);
            Ok(())
        }
        Err(_) => runtime.block_on(bench()),
    }
}
