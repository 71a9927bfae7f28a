//! What the SQL guard costs per guest statement, next to what the statement
//! itself costs (validation with the cache warm, as a
//! ratio to the statement's own execution time).
//!
//! Run: `cargo bench -p idem --bench sql_guard` (about 5 s after the build).
//! PostgreSQL: `IDEM_BENCH_PG_URL`, default `postgres://postgres@127.0.0.1:5432/test`;
//! the bench creates two uniquely named tables there (plus `idem_receipts` if
//! missing), and drops them and deletes its receipts at the end. When the
//! server cannot be reached, its rows are skipped with a note. SQLite: a WAL
//! file in a temporary directory, opened by `Database::connect` like the host.
//!
//! Four guest statements, as a handler sends them: the credit upsert of
//! `examples/credit` (`INSERT ... ON CONFLICT ... DO UPDATE`, always the
//! update branch here), a point SELECT by primary key, an UPDATE by primary
//! key, and a CTE joined to a second table (10 000 accounts, 5 ledger rows
//! each; keys spread over all accounts).
//!
//! Columns, each the median of N samples (N in the footer):
//! - `check cold`: `SqlGuard::check` on a guard that has never seen the text
//!   (PostgreSQL: parse and walk; SQLite: compile on the transaction's
//!   connection under the authorizer and read the program; then the cache
//!   insert): the first call of a handler. The checks of one round run in one
//!   open transaction (rolled back), as a handler's do.
//! - `check warm`: the same call with the verdict cached: every later call.
//! - `Tx exec`: `Tx::execute` / `Tx::query` inside one open transaction, as the
//!   guest's call runs (savepoint, statement, release, value conversion); no
//!   commit. Transactions of 250 statements are committed outside the timing.
//! - `raw exec`: the same checked text through the driver alone on the same
//!   transaction (sqlx on PostgreSQL, rusqlite on SQLite's connection; no
//!   savepoint, rows fetched but not converted).
//! - `savepoint`: `Tx exec` − `raw exec`, the cost of per-statement isolation.
//! - `full tx`: one message's database work end to end: BEGIN, receipt insert,
//!   the statement through `Tx`, COMMIT (PostgreSQL: one WAL flush; SQLite:
//!   `synchronous=FULL`, one fsync). The reference for what a message costs.
//! - `warm/exec`, `cold/exec`: the check as a percentage of `Tx exec`. The
//!   warm one is what a hot handler pays for validation on every statement.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use anyhow::{Context as _, Result, bail, ensure};
use common::{fmt_ns, median, ns_since};
use idem::sql_guard::{CheckedSql, SqlGuard};
use idem::store::{Database, Receipt, SqlValue, Tx};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const PG_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test";
const ACCOUNTS: i64 = 10_000;
const LEDGER_PER_ACCOUNT: i64 = 5;
/// Every statement is measured in each round; the counts below are per round.
const ROUNDS: usize = 4;
/// Fresh guards for the cold check, each call timed alone.
const COLD_N: usize = 150;
/// Warm checks: blocks of `WARM_BLOCK` calls, each block timed.
const WARM_BLOCKS: usize = 50;
const WARM_BLOCK: usize = 1_000;
/// Untimed statements before the rounds (sqlx statement caches, database caches).
const EXEC_WARMUP: usize = 200;
/// Timed statements: `EXEC_BATCHES` transactions of `EXEC_BATCH` iterations,
/// each iteration one `Tx` call and one raw call.
const EXEC_BATCHES: usize = 2;
const EXEC_BATCH: usize = 250;
/// Full transactions.
const FULL_N: usize = 60;
const MAX_ROWS: usize = 1_000;
/// `Tx::query`'s byte bound: the default `max_result_kib`.
const MAX_BYTES: usize = 8 << 20;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    Execute,
    Query,
}

struct Case {
    name: &'static str,
    sql: String,
    call: Call,
    /// Parameters for account `key`.
    params: fn(i64) -> Vec<i64>,
}

fn cases(accounts: &str, ledger: &str) -> Vec<Case> {
    vec![
        Case {
            name: "credit upsert",
            sql: format!(
                "INSERT INTO {accounts} (account_id, balance, owner) VALUES ($1, $2, 'new') \
                 ON CONFLICT (account_id) DO UPDATE SET balance = {accounts}.balance + excluded.balance"
            ),
            call: Call::Execute,
            params: |k| vec![k, 1],
        },
        Case {
            name: "point select",
            sql: format!("SELECT account_id, balance, owner FROM {accounts} WHERE account_id = $1"),
            call: Call::Query,
            params: |k| vec![k],
        },
        Case {
            name: "update",
            sql: format!("UPDATE {accounts} SET balance = balance - $2 WHERE account_id = $1"),
            call: Call::Execute,
            params: |k| vec![k, 1],
        },
        Case {
            name: "cte + join",
            sql: format!(
                "WITH spent AS (SELECT account_id, CAST(sum(amount) AS BIGINT) AS total, count(*) AS n \
                 FROM {ledger} WHERE account_id = $1 GROUP BY account_id) \
                 SELECT a.account_id, a.balance, a.owner, s.total, s.n \
                 FROM {accounts} AS a JOIN spent AS s ON s.account_id = a.account_id"
            ),
            call: Call::Query,
            params: |k| vec![k],
        },
    ]
}

/// Keys spread over all accounts, so no row is updated twice in a batch.
fn key(i: usize) -> i64 {
    (i as i64 * 7_919) % ACCOUNTS + 1
}

/// One output row: medians in nanoseconds.
struct Row {
    db: &'static str,
    statement: &'static str,
    cold: f64,
    warm: f64,
    tx: f64,
    raw: f64,
    full: f64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let started = Instant::now();
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() % 1_000_000_000;
    let prefix = format!("guardbench_{}_{stamp}", std::process::id());
    let mut rows = Vec::new();
    let mut notes = Vec::new();

    let pg_url = std::env::var("IDEM_BENCH_PG_URL").unwrap_or_else(|_| PG_URL_DEFAULT.into());
    eprintln!("sql_guard bench: PostgreSQL at {pg_url} ...");
    match Database::connect(&pg_url, 2).await {
        Ok(db) => {
            let result = bench_db(&db, "postgres", &prefix, &mut rows).await;
            let cleanup = cleanup_postgres(&db, &prefix).await;
            db.close().await;
            result.context("PostgreSQL bench")?;
            cleanup.context("PostgreSQL cleanup")?;
        }
        Err(e) => notes.push(format!("postgres: skipped ({e})")),
    }

    eprintln!("sql_guard bench: SQLite ...");
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let db = Database::connect(&url, 2).await?;
    let result = bench_db(&db, "sqlite", &prefix, &mut rows).await;
    db.close().await;
    result.context("SQLite bench")?;

    print_table(&rows);
    println!();
    println!(
        "medians over {ROUNDS} interleaved rounds, per statement: check cold {} calls (fresh guards), \
         check warm {} blocks of {WARM_BLOCK} calls, Tx/raw exec {} each in transactions of \
         {EXEC_BATCH} (after {EXEC_WARMUP} untimed), full tx {}.",
        ROUNDS * COLD_N,
        ROUNDS * WARM_BLOCKS,
        ROUNDS * EXEC_BATCHES * EXEC_BATCH,
        ROUNDS * FULL_N,
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "savepoint = Tx exec - raw exec. total {:.1} s; load average {} (absolute times swing with load \
         on a shared machine; compare rows of one run).",
        started.elapsed().as_secs_f64(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for note in notes {
        println!("{note}");
    }
    Ok(())
}

async fn bench_db(
    db: &Database,
    label: &'static str,
    prefix: &str,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let accounts = format!("{prefix}_accounts");
    let ledger = format!("{prefix}_ledger");
    setup(db, &accounts, &ledger).await?;
    db.prepare_host_tables().await?;
    let grants = [accounts.clone(), ledger.clone()];
    let kind = db.kind();
    let cases = cases(&accounts, &ledger);
    let mut checked = Vec::with_capacity(cases.len());
    let mut samples: Vec<Samples> = Vec::with_capacity(cases.len());
    let mut next_key = 0_usize;
    for case in &cases {
        // Every call binds integers: one type signature, one checked text.
        let mut tx = db.begin().await?;
        let c = SqlGuard::new(kind, &grants)
            .check(&mut tx, &case.sql, &values(&(case.params)(1)))
            .await?;
        tx.rollback().await?;
        warm_up(db, case, &c, &mut next_key).await?;
        checked.push(c);
        samples.push(Samples::default());
    }
    // Rounds interleave the statements, so a burst of load on a shared
    // machine spreads over all of them instead of skewing one.
    let mut sequence = 0_u64;
    for _ in 0..ROUNDS {
        for (n, case) in cases.iter().enumerate() {
            let s = &mut samples[n];
            bench_check(db, &grants, case, s).await?;
            bench_exec(db, case, &checked[n], &mut next_key, s).await?;
            bench_full(db, prefix, n, case, &checked[n], &mut sequence, s).await?;
        }
    }
    for (case, s) in cases.iter().zip(samples) {
        rows.push(Row {
            db: label,
            statement: case.name,
            cold: median(s.cold),
            warm: median(s.warm),
            tx: median(s.tx),
            raw: median(s.raw),
            full: median(s.full),
        });
    }
    Ok(())
}

/// Nanosecond samples of one statement, collected over all rounds.
#[derive(Default)]
struct Samples {
    cold: Vec<f64>,
    warm: Vec<f64>,
    tx: Vec<f64>,
    raw: Vec<f64>,
    full: Vec<f64>,
}

/// Creates and fills the two tables (setup SQL, not guest SQL: not checked).
async fn setup(db: &Database, accounts: &str, ledger: &str) -> Result<()> {
    let statements = [
        format!(
            "CREATE TABLE {accounts} (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL, owner TEXT NOT NULL)"
        ),
        format!(
            "CREATE TABLE {ledger} (entry_id BIGINT PRIMARY KEY, account_id BIGINT NOT NULL, amount BIGINT NOT NULL)"
        ),
        format!("CREATE INDEX {ledger}_account ON {ledger} (account_id)"),
        format!(
            "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < {ACCOUNTS}) \
             INSERT INTO {accounts} (account_id, balance, owner) SELECT n, 1000000, 'owner ' || n FROM s"
        ),
        format!(
            "WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n < {}) \
             INSERT INTO {ledger} (entry_id, account_id, amount) SELECT n, n % {ACCOUNTS} + 1, n % 97 FROM s",
            ACCOUNTS * LEDGER_PER_ACCOUNT - 1
        ),
        format!("ANALYZE {accounts}"),
        format!("ANALYZE {ledger}"),
    ];
    common::run_sql(db, statements).await
}

async fn cleanup_postgres(db: &Database, prefix: &str) -> Result<()> {
    let Some(pool) = db.postgres_pool() else {
        return Ok(());
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {prefix}_accounts, {prefix}_ledger"
    )))
    .execute(pool)
    .await?;
    sqlx::query("DELETE FROM idem_receipts WHERE consumer = $1")
        .bind(prefix)
        .execute(pool)
        .await?;
    Ok(())
}

/// ns per `check` call: cold (a fresh guard each call), warm (cached), all
/// in one open transaction, rolled back (the checks run nothing).
async fn bench_check(db: &Database, grants: &[String], case: &Case, s: &mut Samples) -> Result<()> {
    let kind = db.kind();
    let sql = case.sql.as_str();
    let params = values(&(case.params)(1));
    let mut tx = db.begin().await?;
    let guards: Vec<SqlGuard> = (0..COLD_N).map(|_| SqlGuard::new(kind, grants)).collect();
    for guard in &guards {
        let start = Instant::now();
        let verdict = guard.check(&mut tx, black_box(sql), &params).await;
        s.cold.push(ns_since(start));
        black_box(verdict?);
    }

    let guard = SqlGuard::new(kind, grants);
    guard.check(&mut tx, sql, &params).await?;
    for _ in 0..WARM_BLOCKS {
        let start = Instant::now();
        for _ in 0..WARM_BLOCK {
            black_box(guard.check(&mut tx, black_box(sql), &params).await?);
        }
        s.warm.push(ns_since(start) / WARM_BLOCK as f64);
    }
    tx.rollback().await?;
    Ok(())
}

fn values(params: &[i64]) -> Vec<SqlValue> {
    params.iter().map(|&p| SqlValue::Integer(p)).collect()
}

/// The statement through `Tx` (savepoint included), checking what it did.
async fn via_tx(tx: &mut Tx, case: &Case, checked: &CheckedSql, params: &[SqlValue]) -> Result<()> {
    match case.call {
        Call::Execute => {
            let n = tx.execute(checked, params).await?;
            ensure!(n == 1, "{}: {n} rows affected, expected 1", case.name);
        }
        Call::Query => {
            let rows = tx.query(checked, params, MAX_ROWS, MAX_BYTES).await?;
            ensure!(
                rows.rows.len() == 1,
                "{}: {} rows, expected 1",
                case.name,
                rows.rows.len()
            );
            black_box(rows);
        }
    }
    Ok(())
}

/// The same checked text through the driver alone on the same transaction.
async fn via_raw(tx: &mut Tx, case: &Case, sql: &Arc<str>, params: &[i64]) -> Result<()> {
    let (affected, fetched) = if let Some(t) = tx.postgres_tx() {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(sql)));
        for &p in params {
            q = q.bind(p);
        }
        match case.call {
            Call::Execute => (q.execute(&mut **t).await?.rows_affected(), 1),
            Call::Query => (1, black_box(q.fetch_all(&mut **t).await?).len()),
        }
    } else if let Some(c) = tx.sqlite_connection() {
        let mut stmt = c.prepare_cached(sql)?;
        for (i, &p) in params.iter().enumerate() {
            stmt.raw_bind_parameter(i + 1, p)?;
        }
        match case.call {
            Call::Execute => (u64::try_from(stmt.raw_execute()?)?, 1),
            Call::Query => {
                let mut rows = stmt.raw_query();
                let mut n = 0;
                while black_box(rows.next()?).is_some() {
                    n += 1;
                }
                (1, n)
            }
        }
    } else {
        bail!("no database backend");
    };
    ensure!(
        affected == 1 && fetched == 1,
        "{}: raw call did not touch one row",
        case.name
    );
    Ok(())
}

/// Untimed runs of both paths (sqlx statement caches, database caches).
async fn warm_up(db: &Database, case: &Case, checked: &CheckedSql, i: &mut usize) -> Result<()> {
    let raw_sql: Arc<str> = checked.as_str().into();
    let mut tx = db.begin().await?;
    for _ in 0..EXEC_WARMUP {
        via_tx(&mut tx, case, checked, &values(&(case.params)(key(*i)))).await?;
        via_raw(&mut tx, case, &raw_sql, &(case.params)(key(*i + 1))).await?;
        *i += 2;
    }
    tx.commit().await?;
    Ok(())
}

/// ns per statement inside an open transaction, through `Tx` and raw, in
/// `EXEC_BATCHES` transactions of `EXEC_BATCH` each (commits not timed).
async fn bench_exec(
    db: &Database,
    case: &Case,
    checked: &CheckedSql,
    i: &mut usize,
    s: &mut Samples,
) -> Result<()> {
    let raw_sql: Arc<str> = checked.as_str().into();
    for _ in 0..EXEC_BATCHES {
        let mut tx = db.begin().await?;
        for j in 0..EXEC_BATCH {
            let through_tx = values(&(case.params)(key(*i)));
            let raw = (case.params)(key(*i + 1));
            *i += 2;
            // Alternate which goes first, so neither always follows the other.
            if j % 2 == 0 {
                let start = Instant::now();
                via_tx(&mut tx, case, checked, &through_tx).await?;
                s.tx.push(ns_since(start));
                let start = Instant::now();
                via_raw(&mut tx, case, &raw_sql, &raw).await?;
                s.raw.push(ns_since(start));
            } else {
                let start = Instant::now();
                via_raw(&mut tx, case, &raw_sql, &raw).await?;
                s.raw.push(ns_since(start));
                let start = Instant::now();
                via_tx(&mut tx, case, checked, &through_tx).await?;
                s.tx.push(ns_since(start));
            }
        }
        tx.commit().await?;
    }
    Ok(())
}

/// ns of BEGIN + receipt + statement (through `Tx`) + COMMIT, `FULL_N` times.
async fn bench_full(
    db: &Database,
    consumer: &str,
    case_no: usize,
    case: &Case,
    checked: &CheckedSql,
    sequence: &mut u64,
    s: &mut Samples,
) -> Result<()> {
    for i in 0..FULL_N {
        *sequence += 1;
        let message_id = format!("{case_no}-{sequence}");
        let params = values(&(case.params)(key(i)));
        let start = Instant::now();
        let mut tx = db.begin().await?;
        let new = tx
            .insert_receipt(&Receipt {
                consumer,
                message_id: &message_id,
                stream_sequence: *sequence,
                module_digest: "bench",
                published_ms: 1_700_000_000_000,
            })
            .await?;
        via_tx(&mut tx, case, checked, &params).await?;
        tx.commit().await?;
        s.full.push(ns_since(start));
        ensure!(new, "receipt {message_id} already existed");
    }
    Ok(())
}

fn fmt_pct(part: f64, whole: f64) -> String {
    let pct = part / whole * 100.0;
    if pct < 1.0 {
        format!("{pct:.2} %")
    } else {
        format!("{pct:.1} %")
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "{:<9} {:<14} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "db",
        "statement",
        "check cold",
        "check warm",
        "Tx exec",
        "raw exec",
        "savepoint",
        "full tx",
        "warm/exec",
        "cold/exec"
    );
    for r in rows {
        println!(
            "{:<9} {:<14} {:>11} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            r.db,
            r.statement,
            fmt_ns(r.cold),
            fmt_ns(r.warm),
            fmt_ns(r.tx),
            fmt_ns(r.raw),
            fmt_ns(r.tx - r.raw),
            fmt_ns(r.full),
            fmt_pct(r.warm, r.tx),
            fmt_pct(r.cold, r.tx)
        );
    }
}
