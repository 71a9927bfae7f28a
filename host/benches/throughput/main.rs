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
//!   (BEGIN, idem's receipt insert, the credit upsert, COMMIT), that many
//!   at a time, sent from Rust: PostgreSQL through sqlx (one round trip a
//!   statement), SQLite through its own library on threads of their own
//!   (rusqlite, no driver thread between). No broker, no wasm. **D, batch
//!   64**: the same statements for 64 messages a transaction; the batched
//!   rows' ÷ D column is over it.
//! - **native**: idem's pipeline (broker, receipt, COMMIT, confirmed ack)
//!   with the credit logic compiled into the host behind the boundary a
//!   guest's statements cross (`idem::runtime::native`).
//! - **idem**: the credit component in Rust, C, JavaScript (QuickJS) and
//!   Python.
//! - **batch 64** (native, Rust, and Rust with 50 % duplicates): the same
//!   hosts with `batch = 64` (and `pull_batch = 64`, `ack_wait = "300s"`,
//!   `deadline = "2s"`, so that a pull brings a whole batch);
//!   below the table, the batched Rust rate over the unbatched one and over
//!   B with plain acks. **batch "auto"** (Rust): `batch = "auto"` with the
//!   same pull settings; its latency row is the one to read next to the
//!   unbatched row's (an idle stream's message runs alone at once).
//!   `IDEM_BENCH_ONLY=batch` runs B, D, native, Rust and the batched rows
//!   (batch 64 and "auto") alone.
//! - **key lanes** (Rust): `order_key = "json:/account_id"` (the credits
//!   spread over 1,000 accounts), so every message goes through its
//!   account's lane.
//! - **8 partitions** (Rust): `partitions = 8`, `order_key = "subject:2"`,
//!   the credits published to `accounts.<account_id>` on a stream with the
//!   subject transform idem needs; one host serves every partition, with
//!   concurrency 1 in each (8 slots in all; on the concurrency 8 rows as
//!   many as the compared rows, on the concurrency 1 rows 8 times as many).
//!   Below the table, this row's and the key lanes row's rate over the
//!   Rust row's. `IDEM_BENCH_ONLY=lanes` runs B, D, native, Rust and these
//!   two rows alone; `IDEM_BENCH_ONLY=rust` runs B, D, native, Rust, the
//!   batched rows and the duplicates rows.
//! - **50 % duplicates** (Rust): the second half of the N messages repeats
//!   the first half's event ids; below the table, what one skipped duplicate
//!   costs next to one processed message (this row's time and the Rust
//!   row's rate).
//! - **copies after a restart** (Rust, unbatched and batch 64): one host
//!   processes the N messages, stops; the N messages are published again
//!   with the same event ids, and a host started afresh (remembering no
//!   commit) drains the copies. The row's rate is the copies'; below the
//!   table, one copy's time over one processed message's, both timed in
//!   that row. `IDEM_BENCH_ONLY=copies` runs B, D and these rows alone.
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
//!   until the receipts count N. Next to them B with confirmed acks, 8 at
//!   a time. `IDEM_BENCH_ONLY=cluster` runs this table alone on a private
//!   3-node cluster (R3 streams, `sync_interval: always`, the hosts given
//!   every server's URL).
//!
//! - **Outbox** (a third table): the `behave` test component publishing
//!   one message per message through the outbox (then its credit), next
//!   to the same component without the publish and to B, publish (a
//!   publish waiting for its PubAck, one at a time, as the relay sends);
//!   the rate runs until the target stream holds every message, the
//!   latency is from a row's storing to its PubAck
//!   (`idem_outbox_delay_seconds`; without the publish: publish to
//!   COMMIT). `IDEM_BENCH_ONLY=outbox` runs this table alone.
//!
//! Columns: msg/s; latency p50 / p99 (ms; D: one transaction); the row's
//! process peak RSS (MiB, `VmHWM`; nats-server and PostgreSQL are other
//! processes); the ratios to native, to D and to min(B confirmed, D) at the
//! same concurrency.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../common/mod.rs"]
mod common;
mod copies;
mod fleet;
mod outbox;
mod rows;

use anyhow::{Context as _, Result, bail};
use async_nats::jetstream::{self, consumer::pull, stream::SubjectTransform};
use fleet::{fleet_member, scaling_table};
use futures::StreamExt as _;
use idem::config::Config;
use idem::service::{Host, RunMode};
use idem::store::Database;
use idem_test_support::{Nats, guests_dir, root};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use rows::{
    RowDb, broker, database, host, jetstream_of, peak_rss_mib, start_host, stream_with,
    stream_with_replicas, total_balance,
};
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

/// The `batch` of the batched rows.
const BATCH: usize = 64;

/// Each host's concurrency in the scaling rows.
const FLEET_CONCURRENCY: usize = 8;

/// Accounts the credits spread over.
const ACCOUNTS: usize = 1000;

/// The partitions of the partitioned row.
const PARTITIONS: u32 = 8;

/// The credit upsert of `examples/credit`, as the credit components send it.
const CREDIT: &str = "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) \
     ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance";

/// idem's receipt insert (`store::sql::INSERT_RECEIPT`).
const RECEIPT: &str = "INSERT INTO idem_receipts (consumer, message_id, stream_sequence, module_digest, published_ms) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer, message_id) DO NOTHING";

/// The account of the `i`-th credit.
fn account(i: usize) -> usize {
    i % ACCOUNTS + 1
}

/// The `i`-th credit event (event ids repeat when `i` does).
fn credit(i: usize) -> String {
    format!(
        r#"{{"event_id":"e{i}","account_id":{},"amount":1}}"#,
        account(i)
    )
}

/// How a host row's handler keeps each account's credits in order
/// (ARCHITECTURE.md, "Key lanes" and "Partitions").
#[derive(Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
enum Order {
    /// No order kept (no `order_key`).
    #[default]
    None,
    /// Key lanes on the account (`order_key = "json:/account_id"`).
    Lanes,
    /// That many partitions on the account (`order_key = "subject:2"`, the
    /// credits published to `accounts.<account_id>`), all served by the
    /// row's host, with the row's concurrency in each.
    Partitions(u32),
}

impl Order {
    /// The handler's one subject, and its stream's, on row `row`.
    fn subjects(self, row: usize) -> String {
        match self {
            Order::Partitions(_) => "accounts.*".into(),
            _ => format!("t{row}.credit"),
        }
    }

    /// The subject the `i`-th credit is published to on row `row`.
    fn subject(self, row: usize, i: usize) -> String {
        match self {
            Order::Partitions(_) => format!("accounts.{}", account(i)),
            _ => format!("t{row}.credit"),
        }
    }

    /// The subject transform the stream needs (partitions: the account
    /// token's partition in front, as `broker/partition.rs::transform` sets
    /// it).
    fn transform(self) -> Option<SubjectTransform> {
        let Order::Partitions(n) = self else {
            return None;
        };
        Some(SubjectTransform {
            source: self.subjects(0),
            destination: format!("{{{{partition({n},1)}}}}.accounts.{{{{wildcard(1)}}}}"),
        })
    }

    /// The handler's config lines for it.
    fn config(self) -> String {
        match self {
            Order::None => String::new(),
            Order::Lanes => "order_key = \"json:/account_id\"\n".into(),
            Order::Partitions(n) => format!("order_key = \"subject:2\"\npartitions = {n}\n"),
        }
    }

    /// The host's consuming loops, each with the handler's concurrency.
    fn loops(self) -> usize {
        match self {
            Order::Partitions(n) => n as usize,
            _ => 1,
        }
    }
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
        /// How the handler keeps each account's credits in order.
        #[serde(default)]
        order: Order,
    },
    /// The Rust component over N messages, then over N copies of them on
    /// a host started afresh ([`copies::copies_after_a_restart`]).
    Copies { module: PathBuf },
    /// `behave` over N messages, each publishing one message through the
    /// outbox when `publish` (module: behave's component).
    Outbox { module: PathBuf, publish: bool },
    /// B, publish: N publishes each waiting for its PubAck.
    PublishCeiling,
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
    /// The handler's `batch` (host rows).
    batch: usize,
    /// `batch = "auto"` instead (host rows; with `batch` = 64 for the
    /// pull settings of a batched row).
    #[serde(default)]
    auto_batch: bool,
    n: usize,
    /// The broker's URL, or its servers' separated by commas.
    nats: String,
    /// Replicas of the row's stream (3 on the cluster).
    replicas: usize,
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
    /// Outbox rows: messages a second committed (the rate counts until
    /// the target stream holds them).
    #[serde(default)]
    committed_rate: Option<f64>,
    /// Copies rows: the seconds the N messages took to process, before
    /// their N copies were drained in `secs`.
    #[serde(default)]
    processed_secs: Option<f64>,
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
            order,
        } => host(&spec, module, native, duplicates, order).await,
        What::FleetMember { module, url } => fleet_member(&spec, module, &url).await,
        What::Copies { module } => copies::copies_after_a_restart(&spec, module).await,
        What::Outbox { module, publish } => outbox::outbox_host(&spec, module, publish).await,
        What::PublishCeiling => outbox::publish_ceiling(&spec).await,
    }
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

/// Runs the copies-after-a-restart row `spec` with `batch`, prints it,
/// and adds what one copy cost next to one processed message, both timed
/// in that row, to `costs`.
fn copies_row(table: &Table, mut spec: Spec, batch: usize, costs: &mut Vec<(String, usize, f64)>) {
    spec.batch = batch;
    let batched = if batch > 1 {
        format!(", batch {batch}")
    } else {
        String::new()
    };
    let (label, cs) = (spec.db.label(), spec.concurrency.to_string());
    let row = format!("idem, Rust{batched}, copies after a restart");
    match in_child(&spec) {
        Ok(m) => {
            table.line(&row, label, &cs, &m);
            if let Some(p) = m.processed_secs {
                costs.push((
                    format!("{label}{batched}, after a restart"),
                    spec.concurrency,
                    m.secs / p,
                ));
            }
        }
        Err(e) => Table::failed(&row, label, &cs, &format!("{e:#}")),
    }
}

/// What one skipped duplicate costs next to one processed message, from a
/// row of `n` messages (half of them duplicates) that took `secs`, and the
/// rate at which the same host processes messages that are all new: the
/// first half costs what processed messages cost, the rest is duplicates.
fn duplicate_cost(n: usize, processed_rate: f64, secs: f64) -> f64 {
    let half = (n / 2) as f64;
    let per_processed = 1.0 / processed_rate;
    let per_duplicate = (secs - half * per_processed) / (n as f64 - half);
    per_duplicate / per_processed
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

/// Makes the rows' specs, numbered from 1: `n` messages, the broker at
/// `nats` (URLs separated by commas), streams of `replicas`.
fn specs(
    n: usize,
    nats: String,
    replicas: usize,
    pg_admin: Option<String>,
    cache: &std::path::Path,
) -> impl FnMut(What, Db, usize) -> Spec {
    let cache = cache.to_owned();
    let mut row = 0;
    move |what, db, concurrency| {
        row += 1;
        Spec {
            row,
            what,
            db,
            concurrency,
            batch: 1,
            auto_batch: false,
            n,
            nats: nats.clone(),
            replicas,
            pg_admin: pg_admin.clone(),
            cache: cache.clone(),
        }
    }
}

async fn bench() -> Result<()> {
    let nats = Nats::start();
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
    let only = std::env::var("IDEM_BENCH_ONLY").ok();
    let only = only.as_deref();
    if only == Some("cluster") {
        if pg_admin.is_none() {
            bail!("the cluster table needs PostgreSQL");
        }
        let cluster = idem_test_support::NatsCluster::start(3).await;
        let on_cluster = specs(n, cluster.urls(), 3, pg_admin.clone(), cache.path());
        println!(
            "{n} messages per row, a 3-node cluster on this machine (R3 stream, sync_interval: always)"
        );
        return scaling_table(" on a 3-node JetStream cluster", n, on_cluster).await;
    }
    let mut spec = specs(n, nats.url(), 1, pg_admin.clone(), cache.path());
    let rust = guests_dir().join("credit.wasm");
    let copies = || What::Copies {
        module: rust.clone(),
    };

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
    let plain = in_child(&spec(What::Broker(None), Db::Sqlite, 1))?;
    none.line("B, plain ack", "-", "-", &plain);
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
    let only_outbox = only == Some("outbox");
    let skip = if only_outbox { dbs.len() } else { 0 };
    let mut duplicate_costs = Vec::new();
    let mut batch_gains = Vec::new();
    let mut order_costs = Vec::new();
    for db in dbs.iter().copied().skip(skip) {
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
            if only == Some("copies") {
                for batch in [1, BATCH] {
                    copies_row(&table, spec(copies(), db, c), batch, &mut duplicate_costs);
                }
                continue;
            }
            let host = |module: PathBuf, native, duplicates| What::Host {
                module,
                native,
                duplicates,
                order: Order::None,
            };
            match in_child(&spec(host(rust.clone(), true, false), db, c)) {
                Ok(m) => {
                    table.line("native", label, &cs, &m);
                    table.native = Some(m.rate);
                }
                Err(e) => Table::failed("native", label, &cs, &format!("{e:#}")),
            }
            let only_lanes = only == Some("lanes");
            let only_rust = only == Some("rust");
            let only_batch = only == Some("batch");
            let mut rust_rate = None;
            for (lang, file) in COMPONENTS {
                if (only_lanes || only_rust || only_batch) && file != "credit.wasm" {
                    continue;
                }
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
            if let Some(unordered) = rust_rate.filter(|_| !only_rust && !only_batch) {
                // As many slots in all as the compared rows, at least one
                // in each partition.
                let each = (c / PARTITIONS as usize).max(1);
                let partitioned = format!(
                    "idem, Rust, {PARTITIONS} partitions (concurrency {each} each, {} in all)",
                    each * PARTITIONS as usize
                );
                for (order, row, c_row) in [
                    (Order::Lanes, "idem, Rust, key lanes".to_string(), c),
                    (Order::Partitions(PARTITIONS), partitioned, each),
                ] {
                    let what = What::Host {
                        module: rust.clone(),
                        native: false,
                        duplicates: false,
                        order,
                    };
                    let m = in_child(&spec(what, db, c_row))?;
                    table.line(&row, label, &cs, &m);
                    order_costs.push((label, c, row, m.rate / unordered));
                }
            }
            if only_lanes {
                continue;
            }
            if let Some(unbatched) = rust_rate {
                // The same statements committed BATCH at a time without
                // idem: the batched rows' D.
                let mut d_spec = spec(What::Database, db, c);
                d_spec.batch = BATCH;
                let d_batched = in_child(&d_spec)?;
                table.line(&format!("D, batch {BATCH}"), label, &cs, &d_batched);
                let d_unbatched = table.d.replace(d_batched.rate);
                let mut batched = |native| {
                    let mut s = spec(host(rust.clone(), native, false), db, c);
                    s.batch = BATCH;
                    s
                };
                let (native_spec, idem_spec) = (batched(true), batched(false));
                let native_label = format!("native, batch {BATCH}");
                match in_child(&native_spec) {
                    Ok(m) => {
                        table.line(&native_label, label, &cs, &m);
                        table.native = Some(m.rate);
                    }
                    Err(e) => Table::failed(&native_label, label, &cs, &format!("{e:#}")),
                }
                let m = in_child(&idem_spec)?;
                table.line(&format!("idem, Rust, batch {BATCH}"), label, &cs, &m);
                batch_gains.push((label, c, m.rate / unbatched, m.rate / plain.rate));
                let mut auto_spec = batched(false);
                auto_spec.auto_batch = true;
                let auto = in_child(&auto_spec)?;
                table.line("idem, Rust, batch \"auto\"", label, &cs, &auto);
                if only_batch {
                    continue;
                }
                let mut dup_spec = spec(host(rust.clone(), false, true), db, c);
                dup_spec.batch = BATCH;
                let d = in_child(&dup_spec)?;
                table.native = None;
                table.line(
                    &format!("idem, Rust, batch {BATCH}, 50 % duplicates"),
                    label,
                    &cs,
                    &d,
                );
                duplicate_costs.push((
                    format!("{label}, batch {BATCH}"),
                    c,
                    duplicate_cost(n, m.rate, d.secs),
                ));
                copies_row(&table, spec(copies(), db, c), BATCH, &mut duplicate_costs);
                table.d = d_unbatched;
            }
            if let Some(processed_rate) = rust_rate {
                let m = in_child(&spec(host(rust.clone(), false, true), db, c))?;
                // Half its messages do no work: no ratio to native.
                table.native = None;
                table.line("idem, Rust, 50 % duplicates", label, &cs, &m);
                duplicate_costs.push((
                    label.to_string(),
                    c,
                    duplicate_cost(n, processed_rate, m.secs),
                ));
                copies_row(&table, spec(copies(), db, c), 1, &mut duplicate_costs);
            }
        }
    }
    println!();
    for (db, c, r) in duplicate_costs {
        println!("- {db}, concurrency {c}: a skipped duplicate costs {r:.2} × a processed message");
    }
    for (db, c, row, r) in order_costs {
        println!("- {db}, concurrency {c}: {row} runs {r:.2} × idem, Rust");
    }
    for (db, c, gain, of_b) in batch_gains {
        println!(
            "- {db}, concurrency {c}: batch {BATCH} runs {gain:.1} × the unbatched Rust rate, {of_b:.2} × B (plain ack)"
        );
    }
    if matches!(only, Some("lanes" | "rust" | "copies" | "batch")) {
        return Ok(());
    }
    let behave = guests_dir().join("behave.wasm");
    if behave.exists() {
        eprintln!("throughput: outbox ...");
        println!();
        println!(
            "Outbox: one publish per message (the behave test component: a publish, then its credit); latency: a row's storing to its PubAck (without the publish: publish to COMMIT), at half the row's rate"
        );
        println!();
        println!(
            "| row | database | concurrency | committed msg/s | sent msg/s | p50 ms | p99 ms | ÷ without publish | ÷ B, publish |"
        );
        println!("|---|---|--:|--:|--:|--:|--:|--:|--:|");
        let b = in_child(&spec(What::PublishCeiling, Db::Sqlite, 1))?;
        println!(
            "| B, publish with PubAck, 1 at a time | - | 1 | - | {:.0} | {} | {} | - | - |",
            b.rate,
            cell(b.p50, 2),
            cell(b.p99, 2)
        );
        for db in dbs.iter().copied() {
            for c in CONCURRENCY {
                let row = |publish| What::Outbox {
                    module: behave.clone(),
                    publish,
                };
                let plain = in_child(&spec(row(false), db, c))?;
                let with = in_child(&spec(row(true), db, c))?;
                for (label, m) in [("without publish", &plain), ("one publish", &with)] {
                    println!(
                        "| {label} | {} | {c} | {} | {} | {} | {} | {} | {} |",
                        db.label(),
                        cell(m.committed_rate, 0),
                        if label == "one publish" {
                            format!("{:.0}", m.rate)
                        } else {
                            "-".into()
                        },
                        cell(m.p50, 1),
                        cell(m.p99, 1),
                        ratio(m.rate, Some(plain.rate)),
                        if label == "one publish" {
                            ratio(m.rate, Some(b.rate))
                        } else {
                            "-".into()
                        },
                    );
                }
            }
        }
    } else {
        println!("\nOutbox rows left out: missing {}", behave.display());
    }
    if only_outbox {
        return Ok(());
    }
    if pg_admin.is_some() && rust.exists() {
        eprintln!("throughput: scaling ...");
        scaling_table("", n, &mut spec).await?;
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
