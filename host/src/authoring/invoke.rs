//! `idem invoke`: one message through a handler on the configured
//! database, without a broker, in a transaction rolled back unless asked
//! to commit; what the guest did, statement by statement
//! ([`crate::runtime::rehearsal`]).

use super::print;
use super::{MessageInput, Workbench};
use crate::pipeline::rehearse::Rehearsed;
use crate::runtime::HandlerFailure;
use crate::runtime::rehearsal::{Outcome, Recorded, Rehearsal};
use crate::store::DbKind;
use std::fmt::Write as _;
use std::sync::Arc;

/// How the message ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The handler returned ok.
    Ok,
    /// A receipt for the message id existed: the handler did not run.
    Duplicate,
    /// The handler failed: `retry: …`, `rejected: …` or `trap: …`
    /// ([`HandlerFailure::reason`]).
    Failed(HandlerFailure),
}

/// What happened to the transaction at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Committed (`--commit`, and the handler returned ok).
    Committed,
    /// Rolled back: nothing stays.
    RolledBack,
}

/// What one invocation did: everything `idem invoke` prints.
#[derive(Debug)]
pub struct Report {
    /// The handler's name.
    pub handler: String,
    /// The component's digest (hex SHA-256).
    pub digest: String,
    /// The database.
    pub database: DbKind,
    /// The message id (by the handler's `identity` rule).
    pub message_id: String,
    /// The subject.
    pub subject: String,
    /// Payload size, bytes.
    pub payload_bytes: usize,
    /// The verdict.
    pub verdict: Verdict,
    /// What the guest did (empty for a duplicate).
    pub recorded: Recorded,
    /// Outbox rows stored (ok only).
    pub outbox_rows: usize,
    /// Commit or rollback.
    pub ended: Ended,
    /// The handler's limits: deadline (ms), statements, memory, result
    /// bytes.
    pub limits: crate::runtime::Limits,
}

/// Runs `input` through `bench`'s handler (see the module docs): as
/// delivery 1 of stream sequence 1; committed only when `commit` and the
/// handler returned ok.
///
/// # Errors
/// `commit` for a handler with an `order_key`, the message cannot be built
/// (no subject, no identity: one line), or a database step failed (nothing
/// committed, or at COMMIT unknown).
pub async fn invoke(
    bench: &Workbench,
    input: &MessageInput,
    commit: bool,
) -> anyhow::Result<Report> {
    let msg = input.to_guest(&bench.handler, 1, 1)?;
    let (message_id, subject, payload_bytes) = (
        msg.message_id.clone(),
        msg.subject.clone(),
        msg.payload.len(),
    );
    let rehearsal = Arc::new(Rehearsal::new());
    let tx = bench.prepared.begin_batch(&bench.db).await?;
    let (rehearsed, tx) = bench
        .prepared
        .rehearse(tx, msg, rehearsal.clone())
        .await
        .map_err(|f| anyhow::anyhow!("{} failed: {}", f.step, f.error))?;
    let (verdict, outbox_rows) = match rehearsed {
        Rehearsed::Duplicate => (Verdict::Duplicate, 0),
        Rehearsed::Ran(Ok(rows)) => (Verdict::Ok, rows),
        Rehearsed::Ran(Err(failure)) => (Verdict::Failed(failure), 0),
    };
    let ended = if commit && verdict == Verdict::Ok {
        tx.commit().await.map_err(|e| {
            anyhow::anyhow!("COMMIT failed, so whether it happened is unknown: {e}")
        })?;
        Ended::Committed
    } else {
        tx.rollback().await?;
        Ended::RolledBack
    };
    let recorded = rehearsal.recorded().clone();
    Ok(Report {
        handler: bench.handler.name.clone(),
        digest: bench.prepared.slot().current().digest().to_owned(),
        database: bench.db.kind(),
        message_id,
        subject,
        payload_bytes,
        verdict,
        recorded,
        outbox_rows,
        ended,
        limits: crate::pipeline::step::limits(&bench.handler),
    })
}

impl Report {
    /// 0 when the handler returned ok or the message was a duplicate, 2
    /// when it failed.
    pub fn exit_code(&self) -> i32 {
        match self.verdict {
            Verdict::Ok | Verdict::Duplicate => 0,
            Verdict::Failed(_) => 2,
        }
    }

    /// The report as text, one fact per line; every value from the message,
    /// the guest or the database escaped.
    pub fn text(&self) -> String {
        let esc = |s: &str| crate::log_format::escape(s).into_owned();
        let mut out = String::new();
        let _ = writeln!(out, "handler    {}", self.handler);
        let _ = writeln!(out, "component  {}", self.digest);
        let _ = writeln!(out, "database   {}", self.database.name());
        let _ = writeln!(
            out,
            "message    {} · {} · {} bytes · delivery 1",
            esc(&self.message_id),
            esc(&self.subject),
            self.payload_bytes
        );
        if self.verdict == Verdict::Duplicate {
            let _ = writeln!(
                out,
                "receipt    exists: a delivery of this message is acked as a duplicate; the handler does not run"
            );
        } else {
            let _ = writeln!(out, "receipt    none: the message is new");
        }
        for (n, s) in self.recorded.statements.iter().enumerate() {
            let _ = writeln!(out, "#{} {:<7} {}", n + 1, s.call, esc(&s.sql));
            for (i, p) in s.params.iter().enumerate() {
                let _ = writeln!(out, "   ${} = {}", i + 1, print::value(p));
            }
            match &s.outcome {
                Outcome::Affected(rows) => {
                    let _ = writeln!(out, "   → {rows} row{} affected", plural(*rows));
                }
                Outcome::Rows { columns, rows } => {
                    let names: Vec<String> = columns.iter().map(|c| esc(c)).collect();
                    let _ = writeln!(
                        out,
                        "   → {} row{} ({})",
                        rows.len(),
                        plural(rows.len() as u64),
                        names.join(", ")
                    );
                    for row in rows {
                        let _ = writeln!(out, "     {}", print::row(row));
                    }
                }
                Outcome::Failed { kind, message } => {
                    let _ = writeln!(out, "   → error {kind}: {}", esc(message));
                }
                Outcome::Stopped(why) => {
                    let _ = writeln!(out, "   → stopped: {}", esc(why));
                }
            }
        }
        let dropped = self.recorded.statements_used as usize
            - self
                .recorded
                .statements
                .len()
                .min(self.recorded.statements_used as usize);
        if dropped > 0 {
            let _ = writeln!(out, "…  {dropped} more statements not shown");
        }
        for line in &self.recorded.log {
            let _ = writeln!(out, "log        {}: {}", line.level, line.text);
        }
        let verdict = match &self.verdict {
            Verdict::Ok => "ok".to_owned(),
            Verdict::Duplicate => "duplicate".to_owned(),
            Verdict::Failed(f) => esc(&f.reason()),
        };
        let _ = writeln!(out, "verdict    {verdict}");
        let _ = writeln!(
            out,
            "outbox     {} message{}",
            self.outbox_rows,
            plural(self.outbox_rows as u64)
        );
        let _ = writeln!(
            out,
            "limits     statements {} of {} · memory {} of {} · results {} of {}",
            self.recorded.statements_used,
            self.limits.max_statements,
            print::bytes(self.recorded.memory_peak_bytes),
            print::bytes(self.limits.max_memory_bytes),
            print::bytes(self.recorded.result_bytes),
            print::bytes(self.limits.max_result_bytes),
        );
        let _ = writeln!(
            out,
            "time       {:.3} ms of {} ms",
            self.recorded.elapsed.as_secs_f64() * 1000.0,
            self.limits.deadline.as_millis()
        );
        let _ = writeln!(
            out,
            "ended      {}",
            match self.ended {
                Ended::Committed => "committed",
                Ended::RolledBack => "rolled back (--commit keeps what an ok handler did)",
            }
        );
        out
    }

    /// The report as one JSON object (`--json`).
    pub fn json(&self) -> serde_json::Value {
        let statements: Vec<serde_json::Value> = self
            .recorded
            .statements
            .iter()
            .map(|s| {
                let outcome = match &s.outcome {
                    Outcome::Affected(n) => serde_json::json!({ "rows_affected": n }),
                    Outcome::Rows { columns, rows } => serde_json::json!({
                        "columns": columns,
                        "rows": rows.iter().map(|r| r.iter().map(print::json).collect::<Vec<_>>()).collect::<Vec<_>>(),
                    }),
                    Outcome::Failed { kind, message } => {
                        serde_json::json!({ "error": { "kind": kind, "message": message } })
                    }
                    Outcome::Stopped(why) => serde_json::json!({ "stopped": why }),
                };
                serde_json::json!({
                    "call": s.call,
                    "sql": s.sql,
                    "params": s.params.iter().map(print::json).collect::<Vec<_>>(),
                    "result": outcome,
                })
            })
            .collect();
        let (verdict, reason) = match &self.verdict {
            Verdict::Ok => ("ok", None),
            Verdict::Duplicate => ("duplicate", None),
            Verdict::Failed(HandlerFailure::Retry(r)) => ("retry", Some(r)),
            Verdict::Failed(HandlerFailure::Reject(r)) => ("reject", Some(r)),
            Verdict::Failed(HandlerFailure::Trap(r)) => ("trap", Some(r)),
        };
        serde_json::json!({
            "handler": self.handler,
            "component": self.digest,
            "database": self.database.name(),
            "message": {
                "id": self.message_id,
                "subject": self.subject,
                "payload_bytes": self.payload_bytes,
                "delivery": 1,
            },
            "receipt_existed": self.verdict == Verdict::Duplicate,
            "statements": statements,
            "log": self.recorded.log.iter().map(|l| serde_json::json!({ "level": l.level, "text": l.text })).collect::<Vec<_>>(),
            "verdict": verdict,
            "reason": reason,
            "outbox_rows": self.outbox_rows,
            "limits": {
                "statements": { "used": self.recorded.statements_used, "max": self.limits.max_statements },
                "memory_bytes": { "peak": self.recorded.memory_peak_bytes, "max": self.limits.max_memory_bytes },
                "result_bytes": { "used": self.recorded.result_bytes, "max": self.limits.max_result_bytes },
                "time_ms": { "used": self.recorded.elapsed.as_secs_f64() * 1000.0, "max": self.limits.deadline.as_millis() },
            },
            "ended": match self.ended { Ended::Committed => "committed", Ended::RolledBack => "rolled back" },
        })
    }
}

/// `s` when `n` is not 1.
fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
