//! `idem test`: each fixture of a [`FixtureFile`] in three runs, each in a
//! transaction of its own that is rolled back at the end, so the database
//! keeps nothing (ARCHITECTURE.md, "Rehearsals"):
//!
//! 1. **first delivery**: the messages in order, each its verdict checked;
//!    then the expected rows;
//! 2. **redelivery**: in the same transaction, every message again as a
//!    second delivery: one that committed must be a duplicate (its receipt
//!    is there), one that failed gets the same verdict again; then the
//!    expected rows again;
//! 3. **retry after a failed attempt**: from an empty transaction, each
//!    message that must succeed is first run with a failure right after
//!    its last statement (as a connection lost there: everything it did is
//!    rolled back), then delivered again; then the expected rows.
//!
//! The duplicate and retry properties are so checked for the author, not
//! assumed.

use super::fixtures::{Expect, Expected, Fixture, FixtureFile, expected_value, same_value};
use super::{NoIdentity, Workbench, print};
use crate::pipeline::rehearse::Rehearsed;
use crate::runtime::GuestMessage;
use crate::runtime::HandlerFailure;
use crate::runtime::rehearsal::Rehearsal;
use crate::sql_value::SqlValue;
use crate::store::Tx;
use std::fmt::Write as _;
use std::sync::Arc;

/// The most rows an expectation's query may return.
const MAX_ROWS: usize = 10_000;
/// The most bytes of values an expectation's query may return.
const MAX_ROW_BYTES: usize = 16 * 1024 * 1024;

/// The three runs, in order.
pub const RUNS: [&str; 3] = [
    "first delivery",
    "redelivery",
    "retry after a failed attempt",
];

/// How one fixture's runs went.
#[derive(Debug)]
pub struct FixtureReport {
    /// The fixture's name.
    pub name: String,
    /// For each of [`RUNS`] run, what went wrong (empty: it passed); a run
    /// not reached (the one before it could not run) is missing.
    pub runs: Vec<Vec<String>>,
    /// How many first attempts the third run failed after their last
    /// statement (a message with no statement has none to fail).
    pub failed_attempts: usize,
}

impl FixtureReport {
    /// Every run passed.
    pub fn passed(&self) -> bool {
        self.runs.len() == RUNS.len() && self.runs.iter().all(Vec::is_empty)
    }
}

/// Runs every fixture of `file` on `bench` (module docs).
///
/// # Errors
/// A database step failed (one line; nothing is kept).
pub async fn run(bench: &Workbench, file: &FixtureFile) -> anyhow::Result<Vec<FixtureReport>> {
    let mut reports = Vec::new();
    for fixture in &file.fixture {
        reports.push(run_one(bench, fixture).await?);
    }
    Ok(reports)
}

/// The three runs of one fixture.
async fn run_one(bench: &Workbench, fixture: &Fixture) -> anyhow::Result<FixtureReport> {
    let mut report = FixtureReport {
        name: fixture.name.clone(),
        runs: Vec::new(),
        failed_attempts: 0,
    };
    let mut messages = Vec::new();
    for (i, m) in fixture.message.iter().enumerate() {
        let input = m.input()?;
        let seq = u64::try_from(i + 1).unwrap_or(u64::MAX);
        match input.to_guest(&bench.handler, seq, 1) {
            Ok(msg) => messages.push((Ok(msg), m.outcome)),
            // The host dead-letters it without running the handler: for
            // the author, the message is rejected.
            Err(e) if e.is::<NoIdentity>() => messages.push((Err(e.to_string()), m.outcome)),
            Err(e) => anyhow::bail!(
                "fixture `{}`, message {}: {e}",
                crate::log_format::escape(&fixture.name),
                i + 1
            ),
        }
    }
    // 1 and 2, in one transaction.
    let mut first = Vec::new();
    let mut used = Vec::new();
    let mut tx = bench.prepared.begin_batch(&bench.db).await?;
    for (i, (msg, expected)) in messages.iter().enumerate() {
        let rehearsal = Arc::new(Rehearsal::new());
        let (got, back) = rehearse(bench, tx, msg, 1, rehearsal.clone()).await?;
        tx = back;
        used.push(rehearsal.recorded().statements_used);
        if let Some(p) = verdict_problem(i, *expected, &got, false) {
            first.push(p);
        }
    }
    let (problems, back) = check_rows(bench, tx, &fixture.expect).await?;
    tx = back;
    first.extend(problems);
    report.runs.push(first);
    let mut again = Vec::new();
    for (i, (msg, expected)) in messages.iter().enumerate() {
        let (got, back) = rehearse(bench, tx, msg, 2, Arc::new(Rehearsal::new())).await?;
        tx = back;
        if let Some(p) = verdict_problem(i, *expected, &got, true) {
            again.push(p);
        }
    }
    let (problems, back) = check_rows(bench, tx, &fixture.expect).await?;
    tx = back;
    again.extend(problems);
    report.runs.push(again);
    tx.rollback().await?;
    // 3, from an empty transaction.
    let mut retried = Vec::new();
    let mut tx = bench.prepared.begin_batch(&bench.db).await?;
    for (i, ((msg, expected), n)) in messages.iter().zip(&used).enumerate() {
        if *expected == Expected::Ok && *n > 0 {
            let failing = Arc::new(Rehearsal::failing_after(*n));
            let (got, back) = rehearse(bench, tx, msg, 1, failing).await?;
            tx = back;
            if matches!(got, Rehearsed::Ran(Err(HandlerFailure::Trap(_)))) {
                report.failed_attempts += 1;
            } else {
                retried.push(format!(
                    "message {}: the failure simulated after statement {n} did not stop it ({}); its statements differ from the first delivery's",
                    i + 1,
                    describe(&got)
                ));
            }
        }
        let (got, back) = rehearse(bench, tx, msg, 2, Arc::new(Rehearsal::new())).await?;
        tx = back;
        if let Some(p) = verdict_problem(i, *expected, &got, false) {
            retried.push(p);
        }
    }
    let (problems, back) = check_rows(bench, tx, &fixture.expect).await?;
    tx = back;
    retried.extend(problems);
    report.runs.push(retried);
    tx.rollback().await?;
    Ok(report)
}

/// [`crate::pipeline::step::PreparedHandler::rehearse`] of delivery
/// `delivery_count` of `msg`, its failure as one line. A message without
/// an identity (`Err`, why) is dead-lettered by the host: a reject, the
/// handler not run.
async fn rehearse(
    bench: &Workbench,
    tx: Tx,
    msg: &Result<GuestMessage, String>,
    delivery_count: u64,
    rehearsal: Arc<Rehearsal>,
) -> anyhow::Result<(Rehearsed, Tx)> {
    let msg = match msg {
        Ok(msg) => GuestMessage {
            delivery_count,
            ..msg.clone()
        },
        Err(why) => {
            let reason = format!("by the host: {why}");
            return Ok((Rehearsed::Ran(Err(HandlerFailure::Reject(reason))), tx));
        }
    };
    bench
        .prepared
        .rehearse(tx, msg, rehearsal)
        .await
        .map_err(|f| anyhow::anyhow!("{} failed: {}", f.step, f.error))
}

/// What went wrong with message `i`'s verdict `got`, if anything.
/// `redelivered`: a message that must succeed must now be a duplicate.
fn verdict_problem(
    i: usize,
    expected: Expected,
    got: &Rehearsed,
    redelivered: bool,
) -> Option<String> {
    let fine = match (expected, got) {
        (Expected::Ok, Rehearsed::Duplicate) => redelivered,
        (Expected::Ok, Rehearsed::Ran(Ok(_))) => !redelivered,
        (Expected::Reject, Rehearsed::Ran(Err(HandlerFailure::Reject(_))))
        | (Expected::Retry, Rehearsed::Ran(Err(HandlerFailure::Retry(_)))) => true,
        _ => false,
    };
    if fine {
        return None;
    }
    let wanted = match (expected, redelivered) {
        (Expected::Ok, true) => "a duplicate (its receipt committed with it)".to_owned(),
        (e, _) => e.to_string(),
    };
    Some(format!(
        "message {}: expected {wanted}, got {}",
        i + 1,
        describe(got)
    ))
}

/// A verdict in a line.
fn describe(got: &Rehearsed) -> String {
    match got {
        Rehearsed::Duplicate => "a duplicate (a receipt existed)".to_owned(),
        Rehearsed::Ran(Ok(_)) => "ok".to_owned(),
        Rehearsed::Ran(Err(f)) => crate::log_format::escape(&f.reason()).into_owned(),
    }
}

/// What of `expects` does not hold in `tx`: one entry per query, with the
/// rows that differ; and `tx` back (each query ran in a savepoint rolled
/// back after it).
///
/// # Errors
/// A savepoint could not be rolled back (the transaction is gone).
async fn check_rows(
    bench: &Workbench,
    mut tx: Tx,
    expects: &[Expect],
) -> anyhow::Result<(Vec<String>, Tx)> {
    let mut problems = Vec::new();
    for e in expects {
        let query = crate::log_format::escape(&e.query).into_owned();
        let (read, back) = bench
            .prepared
            .read_rows(tx, &e.query, MAX_ROWS, MAX_ROW_BYTES)
            .await
            .map_err(|f| anyhow::anyhow!("{} failed: {}", f.step, f.error))?;
        tx = back;
        let rows = match read {
            Ok(rows) => rows,
            Err(why) => {
                problems.push(format!(
                    "{query}\n  cannot run it: {}",
                    crate::log_format::escape(&why)
                ));
                continue;
            }
        };
        let expected: Vec<Vec<SqlValue>> = e
            .rows
            .iter()
            .map(|r| r.iter().filter_map(|v| expected_value(v).ok()).collect())
            .collect();
        if let Some(diff) = diff(&expected, &rows.rows) {
            problems.push(format!("{query}\n{diff}"));
        }
    }
    Ok((problems, tx))
}

/// `None` when `actual` is `expected` row by row; else the rows, each
/// marked ` ` (as expected), `-` (expected, not returned) or `+` (returned,
/// not expected), in order.
pub fn diff(expected: &[Vec<SqlValue>], actual: &[Vec<SqlValue>]) -> Option<String> {
    let same_row = |a: &[SqlValue], b: &[SqlValue]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_value(x, y))
    };
    if expected.len() == actual.len() && expected.iter().zip(actual).all(|(a, b)| same_row(a, b)) {
        return None;
    }
    let mut out = format!(
        "  expected {} row(s), got {}:",
        expected.len(),
        actual.len()
    );
    for i in 0..expected.len().max(actual.len()) {
        match (expected.get(i), actual.get(i)) {
            (Some(e), Some(a)) if same_row(e, a) => {
                let _ = write!(out, "\n    {}", print::row(a));
            }
            (e, a) => {
                if let Some(e) = e {
                    let _ = write!(out, "\n  - {}", print::row(e));
                }
                if let Some(a) = a {
                    let _ = write!(out, "\n  + {}", print::row(a));
                }
            }
        }
    }
    Some(out)
}

/// The report as text: per fixture, each run `ok` or `FAIL` with what went
/// wrong; then the totals.
pub fn text(reports: &[FixtureReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let _ = writeln!(out, "fixture `{}`", crate::log_format::escape(&r.name));
        for (i, (run, problems)) in RUNS.iter().zip(&r.runs).enumerate() {
            let mark = if problems.is_empty() { "ok  " } else { "FAIL" };
            if i == 2 {
                let n = r.failed_attempts;
                let _ = writeln!(
                    out,
                    "  {mark}  {run} ({n} attempt{} failed after {} last statement)",
                    if n == 1 { "" } else { "s" },
                    if n == 1 { "its" } else { "their" }
                );
            } else {
                let _ = writeln!(out, "  {mark}  {run}");
            }
            for p in problems {
                for line in p.lines() {
                    let _ = writeln!(out, "        {line}");
                }
            }
        }
    }
    let failed = reports.iter().filter(|r| !r.passed()).count();
    let _ = writeln!(
        out,
        "{} fixture(s): {} passed, {failed} failed",
        reports.len(),
        reports.len() - failed
    );
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_diff_marks_the_rows_that_differ() {
        let row = |a: &str, b: i64| vec![SqlValue::Text(a.into()), SqlValue::Integer(b)];
        assert_eq!(diff(&[row("a", 1)], &[row("a", 1)]), None);
        let d = diff(
            &[row("a", 1), row("b", 2)],
            &[row("a", 1), row("b", 4), row("c", 1)],
        )
        .unwrap();
        assert_eq!(
            d,
            "  expected 2 row(s), got 3:\n    ('a', 1)\n  - ('b', 2)\n  + ('b', 4)\n  + ('c', 1)"
        );
    }

    #[test]
    fn verdicts_are_judged_per_run() {
        let ok = Rehearsed::Ran(Ok(0));
        assert_eq!(verdict_problem(0, Expected::Ok, &ok, false), None);
        assert_eq!(
            verdict_problem(0, Expected::Ok, &Rehearsed::Duplicate, true),
            None
        );
        assert_eq!(
            verdict_problem(0, Expected::Ok, &ok, true).unwrap(),
            "message 1: expected a duplicate (its receipt committed with it), got ok"
        );
        let reject = Rehearsed::Ran(Err(HandlerFailure::Reject("bad".into())));
        assert_eq!(verdict_problem(1, Expected::Reject, &reject, true), None);
        assert_eq!(
            verdict_problem(1, Expected::Ok, &reject, false).unwrap(),
            "message 2: expected ok, got rejected: bad"
        );
    }
}
