//! What one guest call did, recorded for `idem invoke` and `idem test`
//! (ARCHITECTURE.md, "Rehearsals"): every statement with its parameters and
//! what came back, the guest's log lines, and the limits it used. A
//! [`Rehearsal`] is given to a call through [`super::Invocation`]; a
//! delivery records only when its message is in a shadow candidate's
//! sample ([`crate::pipeline::shadow_run`]: both versions' calls).
//!
//! A rehearsal can also make the call fail as a lost connection would
//! after a given statement ([`Rehearsal::failing_after`]): the statement
//! runs, then the guest is stopped and the transaction rolled back, which
//! is how `idem test` tries a retry after a failed first attempt.

use crate::sql_value::SqlValue;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The most statements one rehearsal keeps; later ones are counted in
/// [`Recorded::statements_used`] only.
pub const MAX_RECORDED_STATEMENTS: usize = 1000;

/// The most bytes of a statement's SQL text kept (the rest is replaced by
/// `… (N bytes)`): a refused statement's text is not bounded otherwise.
pub const MAX_RECORDED_SQL_BYTES: usize = 16 * 1024;

/// The most bytes of one text or bytes parameter kept (text cut the same
/// way; bytes cut with their length in the text of a marker).
pub const MAX_RECORDED_VALUE_BYTES: usize = 1024;

/// What came back from one statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `execute`: the rows affected.
    Affected(u64),
    /// `query`: the column names and the rows returned.
    Rows {
        /// Column names, in order.
        columns: Vec<String>,
        /// The rows, each as many values as `columns`.
        rows: Vec<Vec<SqlValue>>,
    },
    /// The statement failed, or the host refused it (`kind` `denied`); the
    /// guest got this error.
    Failed {
        /// `unique-violation`, `constraint-violation`, `denied`, `syntax`
        /// or `other` (the WIT `db-error-kind`).
        kind: &'static str,
        /// The database's or the host's message, as the guest got it.
        message: String,
    },
    /// The call was stopped during the statement (its deadline, or the
    /// transaction lost); the guest got no answer.
    Stopped(String),
}

/// One statement the guest sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// `execute` or `query`.
    pub call: &'static str,
    /// The SQL text as the guest sent it.
    pub sql: String,
    /// The parameters, in order (`$1`… on PostgreSQL, `?` on SQLite).
    pub params: Vec<SqlValue>,
    /// What came back.
    pub outcome: Outcome,
}

/// One line of guest output: a `log` call, or a line written to WASI
/// stdout or stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// `debug`, `info`, `warn`, `error`, `stdout` or `stderr`.
    pub level: &'static str,
    /// The line, escaped and cut to the per-message log cap as the host
    /// logs it.
    pub text: String,
}

/// What a rehearsed call did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recorded {
    /// The statements in the order sent, at most [`MAX_RECORDED_STATEMENTS`].
    pub statements: Vec<Statement>,
    /// Statements the guest sent, counted against `max_statements`
    /// (refused ones included).
    pub statements_used: u32,
    /// The guest's output lines, in order.
    pub log: Vec<LogLine>,
    /// The largest linear memory the guest asked for, in bytes (0 when it
    /// never grew one).
    pub memory_peak_bytes: usize,
    /// Bytes of values its queries returned.
    pub result_bytes: usize,
    /// How long the guest call took, statements included.
    pub elapsed: Duration,
}

/// A recorder given to one guest call (see the module docs).
#[derive(Debug, Default)]
pub struct Rehearsal {
    recorded: Mutex<Recorded>,
    fail_after: Option<u32>,
    quiet: bool,
}

impl Rehearsal {
    /// Records only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records, and fails the call as a lost connection would right after
    /// its `n`th statement (1-based) has run.
    pub fn failing_after(n: u32) -> Self {
        Self {
            fail_after: Some(n),
            ..Self::default()
        }
    }

    /// Records, and keeps the guest's output lines out of the host's log
    /// (a shadow candidate's: [`crate::shadow`]).
    pub fn quiet() -> Self {
        Self {
            quiet: true,
            ..Self::default()
        }
    }

    /// Whether the guest's output lines stay out of the host's log.
    pub(crate) fn is_quiet(&self) -> bool {
        self.quiet
    }

    /// The statement after which the call is made to fail, if any.
    pub(crate) fn fail_after(&self) -> Option<u32> {
        self.fail_after
    }

    /// What was recorded so far.
    pub fn recorded(&self) -> MutexGuard<'_, Recorded> {
        // A poisoned lock only means a panic while recording: keep what is there.
        self.recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a statement (dropped past [`MAX_RECORDED_STATEMENTS`]), its
    /// text cut to [`MAX_RECORDED_SQL_BYTES`] and each parameter to
    /// [`MAX_RECORDED_VALUE_BYTES`].
    pub(crate) fn statement(&self, mut statement: Statement) {
        let mut r = self.recorded();
        if r.statements.len() < MAX_RECORDED_STATEMENTS {
            statement.sql = clip(statement.sql, MAX_RECORDED_SQL_BYTES);
            for p in &mut statement.params {
                match p {
                    SqlValue::Text(t) if t.len() > MAX_RECORDED_VALUE_BYTES => {
                        *t = clip(std::mem::take(t), MAX_RECORDED_VALUE_BYTES);
                    }
                    SqlValue::Bytes(b) if b.len() > MAX_RECORDED_VALUE_BYTES => {
                        *p = SqlValue::Text(format!("<{} bytes, {}>", b.len(), fingerprint(b)));
                    }
                    _ => {}
                }
            }
            r.statements.push(statement);
        }
    }

    /// Adds a guest output line.
    pub(crate) fn line(&self, level: &'static str, text: &str) {
        self.recorded().log.push(LogLine {
            level,
            text: text.to_owned(),
        });
    }
}

/// `text` cut to at most `max` bytes on a char boundary, followed by
/// `… (N bytes, sha256:…)` (N its whole length, [`fingerprint`]) when cut.
fn clip(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let whole = text.len();
    let print = fingerprint(text.as_bytes());
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text.push_str(&format!("… ({whole} bytes, {print})"));
    text
}

/// What stands for a value cut from a record: `sha256:` and the first 8
/// bytes of its SHA-256, so two values cut to the same text still compare
/// unequal ([`crate::shadow::compare`]).
fn fingerprint(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(bytes);
    format!(
        "sha256:{}",
        hex::encode(digest.get(..8).unwrap_or_default())
    )
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )]
    use super::*;

    #[test]
    fn recorded_statements_are_bounded() {
        let r = Rehearsal::new();
        r.statement(Statement {
            call: "execute",
            sql: "x".repeat(MAX_RECORDED_SQL_BYTES + 10),
            params: vec![
                SqlValue::Text("é".repeat(MAX_RECORDED_VALUE_BYTES)),
                SqlValue::Bytes(vec![0; MAX_RECORDED_VALUE_BYTES + 1]),
                SqlValue::Integer(5),
            ],
            outcome: Outcome::Affected(1),
        });
        let rec = r.recorded();
        let s = &rec.statements[0];
        let sql_print = fingerprint("x".repeat(MAX_RECORDED_SQL_BYTES + 10).as_bytes());
        let marker = format!("… (16394 bytes, {sql_print})");
        assert_eq!(s.sql.len(), MAX_RECORDED_SQL_BYTES + marker.len());
        assert!(s.sql.ends_with(&marker));
        assert_eq!(sql_print.len(), "sha256:".len() + 16);
        let SqlValue::Text(t) = &s.params[0] else {
            panic!()
        };
        let text_print = fingerprint("é".repeat(MAX_RECORDED_VALUE_BYTES).as_bytes());
        assert!(t.ends_with(&format!("… (2048 bytes, {text_print})")), "{t}");
        assert_eq!(
            s.params[1],
            SqlValue::Text(format!(
                "<1025 bytes, {}>",
                fingerprint(&[0; MAX_RECORDED_VALUE_BYTES + 1])
            ))
        );
        assert_eq!(s.params[2], SqlValue::Integer(5));
    }
}
