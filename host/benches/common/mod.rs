//! What the benches share besides `idem-test-support` (paths, the private
//! nats-server, PostgreSQL URLs): medians of samples in nanoseconds, their
//! printing, and setting up their tables.

// Each bench uses a part of what is here.
#![allow(dead_code)]

use idem::store::Database;
use std::time::Instant;

/// The median of `v` (NaN when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Nanoseconds since `start`.
pub fn ns_since(start: Instant) -> f64 {
    start.elapsed().as_nanos() as f64
}

/// `ns` with a unit that keeps three significant digits or so.
pub fn fmt_ns(ns: f64) -> String {
    let abs = ns.abs();
    if abs < 1_000.0 {
        format!("{ns:.0} ns")
    } else if abs < 1_000_000.0 {
        format!("{:.1} µs", ns / 1e3)
    } else if abs < 1_000_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Runs each of `statements` (setup SQL written by the bench itself, not a
/// guest's) on `db`, outside any transaction, stopping at the first error.
pub async fn run_sql(
    db: &Database,
    statements: impl IntoIterator<Item = String>,
) -> anyhow::Result<()> {
    for sql in statements {
        let sql = sqlx::AssertSqlSafe(sql);
        match (db.postgres_pool(), db.sqlite_pool()) {
            (Some(pool), _) => {
                sqlx::raw_sql(sql).execute(pool).await?;
            }
            (None, Some(pool)) => {
                sqlx::raw_sql(sql).execute(pool).await?;
            }
            (None, None) => anyhow::bail!("no database backend"),
        }
    }
    Ok(())
}
