//! What a guest can reach: the `transaction` and `log` imports, bounded by the
//! message's [`Limits`], and the memory limiter. One [`HostState`] per message;
//! it owns the message's transaction while the guest runs.

use super::Limits;
use super::bindings::{DbError, Level, Rows, Value, idem::handler};
use crate::sql_guard::SqlGuard;
use crate::store::{SqlValue, Tx};
use std::sync::Arc;
use std::time::Instant;

/// Why the host stopped a guest, recorded where it happens so the failure can
/// be told apart from a guest's own trap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The message's deadline ran out (in guest code or in a statement).
    Deadline,
    /// The guest asked for more linear memory than the limit allows.
    Memory { desired: usize },
}

/// The data of one message's `Store`.
pub(crate) struct HostState {
    pub(crate) tx: Tx,
    handler: Arc<str>,
    identity: String,
    guard: Arc<SqlGuard>,
    limits: Limits,
    deadline: Instant,
    statements: u32,
    log_bytes: usize,
    log_dropped_bytes: usize,
    log_dropped_lines: usize,
    /// The last error-level line the guest logged (a Rust guest's panic
    /// message, say), to explain a trap that follows it.
    pub(crate) last_error_line: Option<String>,
    pub(crate) stop: Option<Stop>,
}

impl HostState {
    pub(crate) fn new(
        tx: Tx,
        handler: Arc<str>,
        identity: String,
        guard: Arc<SqlGuard>,
        limits: Limits,
        deadline: Instant,
    ) -> Self {
        Self {
            tx,
            handler,
            identity,
            guard,
            limits,
            deadline,
            statements: 0,
            log_bytes: 0,
            log_dropped_bytes: 0,
            log_dropped_lines: 0,
            last_error_line: None,
            stop: None,
        }
    }

    /// Logs, once, how much guest output the per-message cap dropped.
    pub(crate) fn report_dropped_logs(&self) {
        if self.log_dropped_bytes > 0 {
            tracing::warn!(
                target: "idem::guest",
                handler = %self.handler,
                identity = %self.identity,
                dropped_bytes = self.log_dropped_bytes,
                dropped_lines = self.log_dropped_lines,
                cap_bytes = self.limits.max_log_bytes,
                "guest log output over the per-message cap was dropped"
            );
        }
    }

    /// Checks the statement budget and the SQL text, then converts the params.
    fn admit(
        &mut self,
        sql: &str,
        params: Vec<Value>,
    ) -> Result<(crate::sql_guard::CheckedSql, Vec<SqlValue>), DbError> {
        self.statements = self.statements.saturating_add(1);
        if self.statements > self.limits.max_statements {
            return Err(DbError::denied(format!(
                "statement budget exhausted: at most {} statements per message",
                self.limits.max_statements
            )));
        }
        let checked = self.guard.check(sql).map_err(DbError::from)?;
        Ok((checked, params.into_iter().map(SqlValue::from).collect()))
    }
}

/// Awaits one statement, bounded by what is left of the message's deadline.
/// A deadline that runs out here is a trap, not an error value: the guest must
/// not go on.
async fn within<T>(
    deadline: Instant,
    stop: &mut Option<Stop>,
    statement: impl Future<Output = Result<T, crate::store::DbError>>,
) -> wasmtime::Result<Result<T, DbError>> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        *stop = Some(Stop::Deadline);
        return Err(wasmtime::format_err!(
            "deadline exceeded before a statement"
        ));
    }
    match tokio::time::timeout(left, statement).await {
        Ok(r) => Ok(r.map_err(DbError::from)),
        Err(_) => {
            *stop = Some(Stop::Deadline);
            Err(wasmtime::format_err!(
                "deadline exceeded during a statement"
            ))
        }
    }
}

impl handler::types::Host for HostState {}

impl handler::transaction::Host for HostState {
    async fn execute(
        &mut self,
        sql: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<u64, DbError>> {
        let (sql, params) = match self.admit(&sql, params) {
            Ok(ok) => ok,
            Err(e) => return Ok(Err(e)),
        };
        within(
            self.deadline,
            &mut self.stop,
            self.tx.execute(&sql, &params),
        )
        .await
    }

    async fn query(
        &mut self,
        sql: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<Rows, DbError>> {
        let (sql, params) = match self.admit(&sql, params) {
            Ok(ok) => ok,
            Err(e) => return Ok(Err(e)),
        };
        let max_rows = self.limits.max_rows;
        let rows = within(
            self.deadline,
            &mut self.stop,
            self.tx.query(&sql, &params, max_rows),
        )
        .await?;
        Ok(rows.map(Rows::from))
    }
}

impl handler::log::Host for HostState {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        if level == Level::Error {
            let cut = floor_char_boundary(&message, MAX_REMEMBERED_ERROR_BYTES);
            let kept = message.get(..cut).unwrap_or_default();
            self.last_error_line = Some(one_line(kept).into_owned());
        }
        let budget = self.limits.max_log_bytes.saturating_sub(self.log_bytes);
        let (line, dropped, charged) = fit(&message, budget);
        self.log_bytes += charged;
        if dropped > 0 || charged == 0 {
            self.log_dropped_bytes += dropped;
            self.log_dropped_lines += 1;
            if line.is_empty() {
                return Ok(());
            }
        }
        let line = one_line(line);
        let (handler, identity) = (&*self.handler, self.identity.as_str());
        match level {
            Level::Debug => {
                tracing::debug!(target: "idem::guest", handler, identity, truncated = dropped > 0, "{line}")
            }
            Level::Info => {
                tracing::info!(target: "idem::guest", handler, identity, truncated = dropped > 0, "{line}")
            }
            Level::Warn => {
                tracing::warn!(target: "idem::guest", handler, identity, truncated = dropped > 0, "{line}")
            }
            Level::Error => {
                tracing::error!(target: "idem::guest", handler, identity, truncated = dropped > 0, "{line}")
            }
        }
        Ok(())
    }
}

impl wasmtime::ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limits.max_memory_bytes {
            self.stop = Some(Stop::Memory { desired });
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes exceeded ({desired} bytes requested)",
                self.limits.max_memory_bytes
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; no sane guest needs more.
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

/// How much of the last error line is kept to explain a trap.
const MAX_REMEMBERED_ERROR_BYTES: usize = 512;

/// The most elements a guest table may grow to.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// How much of a log line fits what is left of the budget: the kept prefix,
/// the bytes dropped, and the bytes charged. Each line costs its bytes plus
/// one (its newline), so a flood of empty lines is capped too.
fn fit(message: &str, budget: usize) -> (&str, usize, usize) {
    if budget == 0 {
        return ("", message.len(), 0);
    }
    let cut = floor_char_boundary(message, budget - 1);
    let kept = message.get(..cut).unwrap_or_default();
    (kept, message.len() - kept.len(), kept.len() + 1)
}

/// The largest index `<= at` that is on a char boundary of `s`.
pub(crate) fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    (0..=at).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0)
}

/// Escapes control characters so one guest line stays one log line.
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(char::is_control) {
        std::borrow::Cow::Owned(
            s.chars()
                .map(|c| {
                    if c.is_control() {
                        c.escape_default().to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect(),
        )
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_boundary_never_splits_a_char() {
        let s = "aé€";
        assert_eq!(floor_char_boundary(s, 2), 1);
        assert_eq!(floor_char_boundary(s, 3), 3);
        assert_eq!(floor_char_boundary(s, 100), s.len());
        assert_eq!(floor_char_boundary(s, 0), 0);
    }

    #[test]
    fn log_lines_fit_the_budget() {
        assert_eq!(fit("hello", 100), ("hello", 0, 6));
        assert_eq!(fit("hello", 6), ("hello", 0, 6));
        assert_eq!(fit("hello", 4), ("hel", 2, 4));
        assert_eq!(fit("", 3), ("", 0, 1));
        assert_eq!(fit("hello", 0), ("", 5, 0));
        assert_eq!(fit("é", 2), ("", 2, 1));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(one_line("a\nb\tc"), "a\\nb\\tc");
        assert_eq!(one_line("plain"), "plain");
    }
}
