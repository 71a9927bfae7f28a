//! What a credit handler costs per message in each guest language, next to
//! the same work done natively and to the database's own floor:
//! component size, compile time, per-message instantiate + handle.
//!
//! Run: `cargo bench -p idem --bench handler_cost` (a few minutes after the
//! build, most of it compiling the large Python and JavaScript components).
//! The components are read from `target/guests` (`$CARGO_TARGET_DIR/guests`):
//! `credit.wasm` from `scripts/build-guests.sh`, the others from
//! `scripts/build-lang-guests.sh`; a missing one gets a row that says so.
//! Each is loaded without WASI first and, only if it imports WASI, again with
//! `wasi = true` (column `wasi`).
//!
//! SQLite: a WAL file in a temporary directory, opened by `Database::connect`
//! like the host (`synchronous=FULL`). PostgreSQL: `IDEM_BENCH_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; the bench creates a uniquely
//! named database there (the handlers' SQL names the table `accounts`) and
//! drops it at the end. When the server cannot be reached, or the user may not
//! create databases, its columns are left out with a note. Both hold 10 000
//! accounts; every credit updates an existing one (keys spread over all of
//! them), with `Limits::default()` (64 MiB, 5 s) like a handler's defaults.
//!
//! Rows: one per component, plus two references done without wasm:
//! - `native`: what a handler compiled into the host would do: parse the JSON
//!   event (serde), `SqlGuard::check` the upsert (cached verdict, as every
//!   guest statement) and run it with `Tx::execute` (savepoint included).
//! - `receipt only`: the protocol with no handler at all (the receipt insert;
//!   in `full tx` also BEGIN and COMMIT): the database's own floor.
//!
//! Columns, times the median of N samples (N in the footer):
//! - `KiB`: the component file's size.
//! - `compile`: `Runtime::load`: read, hash, validate and compile the
//!   component with cranelift (wasmtime's parallel compilation, all cores),
//!   and type-check it against the world. Once per component per host start.
//! - `in tx`: one message inside an already open transaction: the receipt
//!   insert, then `Runtime::handle` (a fresh instance, `handle`, the guest's
//!   one upsert through the guard and `Tx`). No BEGIN or COMMIT: messages run
//!   in transactions of a few hundred, committed outside the timing. This is
//!   what the language adds; `×` divides it by `native`'s.
//!   Every statement is a round trip to the database: over loopback to
//!   PostgreSQL, to sqlx's worker thread for SQLite (which costs 20 to 100 µs
//!   on a small VM, depending on whether that thread is awake). So the rows
//!   run interleaved, message by message in a shuffled order, and each sees
//!   the same machine; run one after the other, the native row's median
//!   flipped between those two costs from run to run.
//! - `full tx`: one message end to end as the pipeline runs it: BEGIN with the
//!   statement bound (`begin_bounded`, the deadline + 1 s), receipt, handler,
//!   COMMIT (PostgreSQL: one WAL flush; SQLite: one fsync). `×` divides it by
//!   `native`'s: what a message costs in that language, all told.
//!
//! Not here: the broker (fetch and ack, the same for every row), the
//! PostgreSQL handler role (`SET LOCAL ROLE`, one more statement in every row
//! alike), the guests' memory, and the time to build each component, which
//! `scripts/build-lang-guests.sh` measures and prints.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use anyhow::{Context as _, Result, bail, ensure};
use common::{fmt_ns, median, ns_since};
use idem::runtime::{
    GuestMessage, HandlerComponent, Invocation, Limits, LoadError, LoadOptions, Runtime,
};
use idem::sql_guard::SqlGuard;
use idem::store::{Database, Receipt, SqlValue, Tx};
use idem_test_support::guests_dir;
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PG_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The components, in the order of the table: file in `target/guests`, and
/// the language when the name does not say it.
const COMPONENTS: &[(&str, &str)] = &[
    ("credit.wasm", "Rust"),
    ("credit-c.wasm", ""),
    ("credit-js.wasm", "default JS"),
    ("credit-js-quickjs.wasm", ""),
    ("credit-js-starlingmonkey.wasm", ""),
    ("credit-python.wasm", ""),
];

/// The credit upsert of `examples/credit`, as every credit component sends it.
const CREDIT: &str = "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) \
     ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance";
const ACCOUNTS: i64 = 10_000;
const INITIAL_BALANCE: i64 = 1_000_000;

/// `Runtime::load` calls per component (the first decides `wasi`).
const LOAD_N: usize = 3;
/// Untimed messages per subject and database before the rounds (committed).
const WARMUP: usize = 50;
/// Rounds of `in tx` cycles then `full tx` cycles. In every cycle each row
/// (worker) runs one message, in a shuffled order, so a burst of load on a
/// shared machine spreads over all of them instead of skewing one.
const ROUNDS: usize = 4;
/// `in tx` cycles per round, and how many share one transaction.
const IN_TX_CYCLES: usize = 500;
const COMMIT_EVERY: usize = 50;
/// `full tx` cycles per round, one transaction per message.
const FULL_CYCLES: usize = 60;

/// What the native handler reads from the payload, as the guests do.
#[derive(Deserialize)]
struct CreditEvent {
    account_id: i64,
    amount: i64,
}

/// A component that loaded, with what it took.
struct Loaded {
    module: Arc<HandlerComponent>,
    compile_ns: f64,
}

/// One component's row before the per-message runs.
struct Component {
    file: &'static str,
    lang: &'static str,
    /// `None`: the file is missing.
    size: Option<u64>,
    /// `Err`: it did not load (the reason).
    loaded: Option<std::result::Result<Loaded, String>>,
}

/// Who does the work for one message.
#[derive(Clone, Copy)]
enum Worker<'a> {
    ReceiptOnly,
    Native,
    Guest(&'a HandlerComponent),
}

/// Medians of one subject on one database, or why it stopped.
type Cell = std::result::Result<(f64, f64), String>;

struct DbRun {
    label: &'static str,
    /// Per subject: receipt only, native, then the loaded components in order.
    cells: Vec<Cell>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let started = Instant::now();
    let runtime = Runtime::new()?;
    let dir = guests_dir();
    let mut notes = Vec::new();

    let mut components = Vec::new();
    for &(file, lang) in COMPONENTS {
        let path = dir.join(file);
        let size = std::fs::metadata(&path).ok().map(|m| m.len());
        let loaded = match size {
            None => None,
            Some(_) => {
                eprintln!("handler_cost bench: compiling {file} ({LOAD_N}×) ...");
                Some(load(&runtime, &path))
            }
        };
        components.push(Component {
            file,
            lang,
            size,
            loaded,
        });
    }
    let modules: Vec<&HandlerComponent> = components
        .iter()
        .filter_map(|c| match &c.loaded {
            Some(Ok(l)) => Some(&*l.module),
            _ => None,
        })
        .collect();
    let mut workers = vec![Worker::ReceiptOnly, Worker::Native];
    workers.extend(modules.iter().copied().map(Worker::Guest));

    let mut runs = Vec::new();
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() % 1_000_000_000;
    let prefix = format!("handlercost_{}_{stamp}", std::process::id());

    eprintln!("handler_cost bench: SQLite ...");
    let tmp = tempfile::tempdir()?;
    let url = format!("sqlite://{}", tmp.path().join("bench.db").display());
    let db = Database::connect(&url, 2).await?;
    let run = bench_db(&runtime, &db, "SQLite", &workers).await;
    db.close().await;
    runs.push(run.context("SQLite bench")?);

    let pg_url = std::env::var("IDEM_BENCH_PG_URL").unwrap_or_else(|_| PG_URL_DEFAULT.into());
    eprintln!("handler_cost bench: PostgreSQL at {pg_url} ...");
    match bench_postgres(&runtime, &pg_url, &prefix, &workers).await {
        Ok(run) => runs.push(run),
        Err(e) => notes.push(format!("PostgreSQL: skipped ({e:#})")),
    }

    // Two files with the same bytes (the default JS engine is one of the
    // named ones): their rows differ only by the run's noise.
    for (i, a) in modules.iter().enumerate() {
        for b in &modules[i + 1..] {
            if a.digest() == b.digest() {
                notes.push(format!(
                    "{} and {} are the same bytes: the difference between their rows is this run's noise.",
                    file_name(a),
                    file_name(b)
                ));
            }
        }
    }

    print_table(&components, &runs);
    println!();
    println!(
        "medians: compile {LOAD_N} loads; in tx {} messages per row (after {WARMUP} untimed; \
         transactions of {COMMIT_EVERY} messages per row); full tx {} messages per row. Rows \
         interleaved message by message in shuffled order. × = the row's time / native's, same column.",
        ROUNDS * IN_TX_CYCLES,
        ROUNDS * FULL_CYCLES,
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    println!(
        "{} cores ({cpu}); load average {}; SQLite file in {}; total {:.0} s (absolute times swing \
         with load on a shared machine; compare rows of one run).",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        std::env::temp_dir().display(),
        started.elapsed().as_secs_f64(),
    );
    println!(
        "Build time of each language's toolchain and component: printed by \
         scripts/build-lang-guests.sh, not measured here."
    );
    for note in notes {
        println!("{note}");
    }
    Ok(())
}

fn file_name(m: &HandlerComponent) -> String {
    m.path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `LOAD_N` loads; the first without WASI, again with it only if the
/// component imports WASI. Returns the last module.
fn load(runtime: &Runtime, path: &Path) -> std::result::Result<Loaded, String> {
    let mut options = LoadOptions { wasi: false };
    let mut samples = Vec::with_capacity(LOAD_N);
    let mut module = None;
    for _ in 0..LOAD_N {
        let start = Instant::now();
        let result = match runtime.load(path, options) {
            Err(LoadError::WasiNotEnabled { .. }) if !options.wasi => {
                options.wasi = true;
                // Timed from here: the refused load is not what the host pays.
                let start = Instant::now();
                let m = runtime.load(path, options);
                samples.push(ns_since(start));
                m
            }
            other => {
                samples.push(ns_since(start));
                other
            }
        };
        // Drop the previous module before keeping this one.
        drop(module.take());
        module = Some(result.map_err(|e| e.to_string())?);
    }
    let module = module.ok_or("no load")?;
    Ok(Loaded {
        module,
        compile_ns: median(samples),
    })
}

/// Creates a uniquely named database next to the one `admin_url` names, runs
/// the bench there, and drops it.
async fn bench_postgres(
    runtime: &Runtime,
    admin_url: &str,
    name: &str,
    workers: &[Worker<'_>],
) -> Result<DbRun> {
    let admin = Database::connect(admin_url, 1).await?;
    let Some(admin_pool) = admin.postgres_pool() else {
        bail!("{admin_url} is not a PostgreSQL URL");
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(admin_pool)
        .await
        .context("CREATE DATABASE")?;
    let result = async {
        let db =
            Database::connect(&idem_test_support::pg_url_with_database(admin_url, name), 2).await?;
        let run = bench_db(runtime, &db, "PostgreSQL", workers).await;
        db.close().await;
        run
    }
    .await;
    let dropped = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(admin_pool)
    .await;
    admin.close().await;
    let run = result?;
    dropped.context("DROP DATABASE")?;
    Ok(run)
}

/// The per-message runs of every worker on one database.
async fn bench_db(
    runtime: &Runtime,
    db: &Database,
    label: &'static str,
    workers: &[Worker<'_>],
) -> Result<DbRun> {
    setup(db).await?;
    let guard = Arc::new(SqlGuard::new(db.kind(), &["accounts".to_string()]));
    let mut bench = Bench {
        runtime,
        db,
        guard,
        limits: Limits::default(),
        sequence: 0,
        credits: 0,
        rng: 0x9E37_79B9_7F4A_7C15,
    };
    let mut in_tx: Vec<Vec<f64>> = vec![Vec::new(); workers.len()];
    let mut full: Vec<Vec<f64>> = vec![Vec::new(); workers.len()];
    let mut failed: Vec<Option<String>> = vec![None; workers.len()];

    for (n, &w) in workers.iter().enumerate() {
        if let Err(e) = bench.warm_up(w, n, WARMUP).await {
            failed[n] = Some(format!("{e:#}"));
        }
    }
    let mut order: Vec<usize> = (0..workers.len()).collect();
    for round in 0..ROUNDS {
        eprintln!(
            "handler_cost bench: {label} round {} of {ROUNDS}",
            round + 1
        );
        bench
            .interleaved_in_tx(workers, &mut order, &mut failed, &mut in_tx)
            .await?;
        bench
            .interleaved_full(workers, &mut order, &mut failed, &mut full)
            .await?;
    }
    bench.verify().await?;
    let cells = failed
        .into_iter()
        .zip(in_tx.into_iter().zip(full))
        .map(|(failed, (t, f))| match failed {
            Some(reason) => Err(reason),
            None => Ok((median(t), median(f))),
        })
        .collect();
    Ok(DbRun { label, cells })
}

/// The accounts table (setup SQL, not guest SQL: not checked) and idem's tables.
async fn setup(db: &Database) -> Result<()> {
    db.prepare_host_tables().await?;
    let statements = [
        "CREATE TABLE accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)"
            .to_string(),
        format!(
            "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {ACCOUNTS}) \
             INSERT INTO accounts (account_id, balance) SELECT n, {INITIAL_BALANCE} FROM s"
        ),
        "ANALYZE accounts".to_string(),
    ];
    common::run_sql(db, statements).await
}

struct Bench<'a> {
    runtime: &'a Runtime,
    db: &'a Database,
    guard: Arc<SqlGuard>,
    limits: Limits,
    /// Messages so far on this database: stream sequence and event id.
    sequence: u64,
    /// Credits committed (each of amount 1), checked against the balances.
    credits: i64,
    /// xorshift state for the interleaving orders.
    rng: u64,
}

/// The receipts' consumer of worker `n`.
fn consumer(n: usize) -> String {
    format!("bench_{n}")
}

/// The credits one message of `w` adds (each of amount 1).
fn credit(w: Worker<'_>) -> i64 {
    match w {
        Worker::ReceiptOnly => 0,
        Worker::Native | Worker::Guest(_) => 1,
    }
}

/// One message as it comes from the broker.
struct Msg {
    id: String,
    sequence: u64,
    payload: Vec<u8>,
}

impl Bench<'_> {
    fn next(&mut self) -> Msg {
        self.sequence += 1;
        let id = format!("evt_{}", self.sequence);
        // Keys spread over all accounts, so no row is updated twice in a batch.
        let account = (self.sequence as i64 * 7_919) % ACCOUNTS + 1;
        let payload = serde_json::json!({"event_id": id, "account_id": account, "amount": 1});
        Msg {
            id,
            sequence: self.sequence,
            payload: payload.to_string().into_bytes(),
        }
    }

    /// The timed work for one message in `tx`: the receipt, then the worker.
    async fn step(&self, w: Worker<'_>, consumer: &str, mut tx: Tx, m: Msg) -> Result<Tx> {
        let digest = match w {
            Worker::Guest(module) => module.digest(),
            _ => "native",
        };
        let new = tx
            .insert_receipt(&Receipt {
                consumer,
                message_id: &m.id,
                stream_sequence: m.sequence,
                module_digest: digest,
                published_ms: 1_700_000_000_000,
            })
            .await?;
        ensure!(new, "receipt {} already existed", m.id);
        match w {
            Worker::ReceiptOnly => {}
            Worker::Native => {
                let event: CreditEvent = serde_json::from_slice(&m.payload)?;
                let params = [
                    SqlValue::Integer(event.account_id),
                    SqlValue::Integer(event.amount),
                ];
                let checked = self.guard.check(&mut tx, CREDIT, &params).await?;
                let n = tx.execute(&checked, &params).await?;
                ensure!(n == 1, "native: {n} rows affected, expected 1");
            }
            Worker::Guest(module) => {
                let call = Invocation {
                    handler: Arc::from(consumer),
                    message_id: m.id.clone(),
                    guard: self.guard.clone(),
                    limits: self.limits.clone(),
                    stats: Arc::default(),
                    rehearsal: None,
                };
                let msg = GuestMessage {
                    message_id: m.id,
                    subject: "accounts.credit".into(),
                    headers: Vec::new(),
                    payload: m.payload,
                    stream_sequence: m.sequence,
                    delivery_count: 1,
                    published_ms: 1_700_000_000_000,
                };
                let (result, back) = self.runtime.handle(module, &call, tx, msg).await;
                tx = back;
                if let Err(failure) = result {
                    bail!("{}", failure.reason());
                }
            }
        }
        Ok(tx)
    }

    /// `IN_TX_CYCLES` cycles; in each, every worker that has not failed
    /// runs one message, in a fresh shuffled order, inside a transaction
    /// committed every `COMMIT_EVERY` cycles (not timed). Interleaving
    /// message by message lets every row see the same machine: on SQLite a
    /// statement's round trip to sqlx's worker thread costs 20 µs or 100 µs
    /// depending on whether that thread is awake, and the machine switches
    /// between the two for seconds at a time.
    async fn interleaved_in_tx(
        &mut self,
        workers: &[Worker<'_>],
        order: &mut [usize],
        failed: &mut [Option<String>],
        samples: &mut [Vec<f64>],
    ) -> Result<()> {
        let mut cycles = 0;
        while cycles < IN_TX_CYCLES {
            let chunk = COMMIT_EVERY.min(IN_TX_CYCLES - cycles);
            let mut tx = Some(self.db.begin().await?);
            let mut pending = 0;
            for _ in 0..chunk {
                self.shuffle(order);
                for &n in order.iter() {
                    if failed[n].is_some() {
                        continue;
                    }
                    let m = self.next();
                    let open = match tx.take() {
                        Some(t) => t,
                        None => self.db.begin().await?,
                    };
                    let start = Instant::now();
                    match self.step(workers[n], &consumer(n), open, m).await {
                        Ok(t) => {
                            samples[n].push(ns_since(start));
                            tx = Some(t);
                            pending += credit(workers[n]);
                        }
                        // The transaction is gone (rolled back) with the
                        // other workers' credits in it: start another.
                        Err(e) => {
                            failed[n] = Some(format!("{e:#}"));
                            pending = 0;
                        }
                    }
                }
            }
            if let Some(t) = tx {
                t.commit().await?;
                self.credits += pending;
            }
            cycles += chunk;
        }
        Ok(())
    }

    /// `FULL_CYCLES` cycles; in each, every worker that has not failed runs
    /// one message in its own transaction (BEGIN bounded, step, COMMIT, all
    /// timed), in a fresh shuffled order.
    async fn interleaved_full(
        &mut self,
        workers: &[Worker<'_>],
        order: &mut [usize],
        failed: &mut [Option<String>],
        samples: &mut [Vec<f64>],
    ) -> Result<()> {
        let statement_timeout = self.limits.deadline + Duration::from_secs(1);
        for _ in 0..FULL_CYCLES {
            self.shuffle(order);
            for &n in order.iter() {
                if failed[n].is_some() {
                    continue;
                }
                let m = self.next();
                let start = Instant::now();
                let result = async {
                    let tx = self.db.begin_bounded(statement_timeout).await?;
                    let tx = self.step(workers[n], &consumer(n), tx, m).await?;
                    tx.commit().await?;
                    anyhow::Ok(())
                }
                .await;
                match result {
                    Ok(()) => {
                        samples[n].push(ns_since(start));
                        self.credits += credit(workers[n]);
                    }
                    Err(e) => failed[n] = Some(format!("{e:#}")),
                }
            }
        }
        Ok(())
    }

    /// Fisher-Yates with a fixed-seed xorshift: the same orders every run.
    fn shuffle(&mut self, order: &mut [usize]) {
        for i in (1..order.len()).rev() {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            order.swap(i, (self.rng % (i as u64 + 1)) as usize);
        }
    }

    /// `count` untimed messages of one worker in one transaction, committed.
    async fn warm_up(&mut self, w: Worker<'_>, worker_no: usize, count: usize) -> Result<()> {
        let consumer = consumer(worker_no);
        let mut tx = self.db.begin().await?;
        for _ in 0..count {
            let m = self.next();
            tx = self.step(w, &consumer, tx, m).await?;
        }
        tx.commit().await?;
        self.credits += credit(w) * count as i64;
        Ok(())
    }

    /// Every committed credit is in the balances, once.
    async fn verify(&self) -> Result<()> {
        let sql = "SELECT CAST(SUM(balance) AS BIGINT) FROM accounts";
        let total: i64 = match (self.db.postgres_pool(), self.db.sqlite_pool()) {
            (Some(pool), _) => sqlx::query_scalar(sql).fetch_one(pool).await?,
            (None, Some(pool)) => sqlx::query_scalar(sql).fetch_one(pool).await?,
            (None, None) => bail!("no database backend"),
        };
        let expected = ACCOUNTS * INITIAL_BALANCE + self.credits;
        ensure!(
            total == expected,
            "balances sum to {total}, expected {expected}: a credit was lost or doubled"
        );
        Ok(())
    }
}

fn fmt_ratio(x: f64, native: f64) -> String {
    let r = x / native;
    if r < 10.0 {
        format!("{r:.2}×")
    } else if r < 100.0 {
        format!("{r:.1}×")
    } else {
        format!("{r:.0}×")
    }
}

const NAME_W: usize = 30;

fn print_table(components: &[Component], runs: &[DbRun]) {
    // Group header, then column header.
    let mut line = format!("{:<NAME_W$} {:>7} {:>5} {:>9}", "", "", "", "");
    for run in runs {
        line.push_str(&format!(" │ {:<34}", run.label));
    }
    println!("{}", line.trim_end());
    let mut line = format!(
        "{:<NAME_W$} {:>7} {:>5} {:>9}",
        "handler", "KiB", "wasi", "compile"
    );
    for _ in runs {
        line.push_str(&format!(
            " │ {:>9} {:>6} {:>10} {:>6}",
            "in tx", "×", "full tx", "×"
        ));
    }
    println!("{line}");

    let natives: Vec<Option<(f64, f64)>> = runs.iter().map(|r| r.cells[1].clone().ok()).collect();
    let cells_line = |subject: usize| {
        let mut line = String::new();
        for (run, native) in runs.iter().zip(&natives) {
            match (&run.cells[subject], native) {
                (Ok((t, f)), Some((nt, nf))) => line.push_str(&format!(
                    " │ {:>9} {:>6} {:>10} {:>6}",
                    fmt_ns(*t),
                    fmt_ratio(*t, *nt),
                    fmt_ns(*f),
                    fmt_ratio(*f, *nf)
                )),
                (Ok((t, f)), None) => line.push_str(&format!(
                    " │ {:>9} {:>6} {:>10} {:>6}",
                    fmt_ns(*t),
                    "",
                    fmt_ns(*f),
                    ""
                )),
                (Err(reason), _) => line.push_str(&format!(" │ failed: {reason}")),
            }
        }
        line
    };

    let blank = format!("{:>7} {:>5} {:>9}", "—", "", "—");
    println!(
        "{:<NAME_W$} {blank}{}",
        "receipt only (no handler)",
        cells_line(0)
    );
    println!(
        "{:<NAME_W$} {blank}{}",
        "native (Rust in the host)",
        cells_line(1)
    );

    let mut subject = 2;
    for c in components {
        let name = if c.lang.is_empty() {
            c.file.to_string()
        } else {
            format!("{} ({})", c.file, c.lang)
        };
        let Some(size) = c.size else {
            println!("{name:<NAME_W$} missing (build with scripts/build-lang-guests.sh)");
            continue;
        };
        let kib = format!("{:.0}", size as f64 / 1024.0);
        match &c.loaded {
            Some(Ok(l)) => {
                println!(
                    "{name:<NAME_W$} {kib:>7} {:>5} {:>9}{}",
                    if l.module.wasi() { "yes" } else { "no" },
                    fmt_ns(l.compile_ns),
                    cells_line(subject)
                );
                subject += 1;
            }
            Some(Err(reason)) => println!("{name:<NAME_W$} {kib:>7} load failed: {reason}"),
            None => println!("{name:<NAME_W$} {kib:>7} not loaded"),
        }
    }
}
