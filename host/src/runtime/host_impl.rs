//! What a guest can reach: the `transaction`, `log` and `outbox` imports,
//! bounded by the message's [`Limits`], the memory limiter, and (for a
//! module loaded with WASI) the empty WASI context, whose clocks and random
//! sources are the message's ([`super::wasi`]). One [`HostState`] per
//! message; it owns the message's transaction while the guest runs. The
//! 0.1.0 world's imports are served by these (`world_v0_1`).

// Guest- and message-supplied bytes are read with `get`, iterators and
// checked splits, never indexed or sliced: an offset out of range would
// panic the host (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

use super::Limits;
use super::bindings::{DbError, Level, OutboxError, Rows, Value, handler};
use super::guest_log::LogSink;
use super::rehearsal::{Outcome, Rehearsal, Statement};
use super::wasi::{MessageInputs, WasiState};
use crate::metrics::HandlerStats;
use crate::outbox::{OutboxCalls, Refusal};
use crate::sql_guard::SqlGuard;
use crate::store::{DbErrorKind, SqlValue, StatementError, Tx};
use std::sync::Arc;
use std::time::Instant;
use wasmtime_wasi::{WasiCtxView, WasiView};

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
    guard: Arc<SqlGuard>,
    limits: Limits,
    deadline: Instant,
    statements: u32,
    /// Bytes of values the message's queries returned so far.
    result_bytes: usize,
    /// The message's guest log: `log` lines and WASI stdout/stderr.
    pub(crate) log: LogSink,
    /// The WASI context, built on the first WASI call. Only a module loaded
    /// with WASI can make one.
    wasi: Option<Box<WasiState>>,
    /// What the message gives the WASI context (its clocks and random seed).
    wasi_inputs: MessageInputs,
    pub(crate) stop: Option<Stop>,
    /// The handler's counters (`unique_violations`).
    stats: Arc<HandlerStats>,
    /// The publishes and calls the guest made, admitted against the
    /// handler's grants; stored in the transaction if `handle` returns ok.
    pub(crate) outbox: OutboxCalls,
    /// The largest linear memory the guest asked for, in bytes.
    pub(crate) memory_peak: usize,
    /// Records what the call does (`idem invoke`, `idem test`); `None` for
    /// a delivery.
    pub(crate) rehearsal: Option<Arc<Rehearsal>>,
}

impl HostState {
    pub(crate) fn new(
        tx: Tx,
        handler: Arc<str>,
        message_id: String,
        guard: Arc<SqlGuard>,
        limits: Limits,
        deadline: Instant,
        stats: Arc<HandlerStats>,
    ) -> Self {
        let wasi_inputs = MessageInputs {
            consumer: handler.clone(),
            message_id: message_id.clone(),
            published_ms: 0,
            started: Instant::now(),
        };
        let log = LogSink::new(handler, message_id, limits.max_log_bytes);
        let outbox = OutboxCalls::new(limits.outbox.clone());
        Self {
            outbox,
            tx,
            guard,
            limits,
            deadline,
            statements: 0,
            result_bytes: 0,
            log,
            wasi: None,
            wasi_inputs,
            stop: None,
            stats,
            memory_peak: 0,
            rehearsal: None,
        }
    }

    /// Records the call in `rehearsal` (its statements, log lines and the
    /// limits used) and fails it where the rehearsal says.
    pub(crate) fn rehearsed(mut self, rehearsal: Option<Arc<Rehearsal>>) -> Self {
        if let Some(r) = &rehearsal {
            self.log.lock().keep_lines(r.clone());
        }
        self.rehearsal = rehearsal;
        self
    }

    /// What the call used of its limits, into its rehearsal (if any).
    pub(crate) fn record_usage(&self, elapsed: std::time::Duration) {
        if let Some(r) = &self.rehearsal {
            let mut rec = r.recorded();
            rec.statements_used = self.statements;
            rec.memory_peak_bytes = self.memory_peak;
            rec.result_bytes = self.result_bytes;
            rec.elapsed = elapsed;
        }
    }

    /// Records statement `call` (`sql`, `params`), which the host refused
    /// with `error` before it reached the database, when the call is
    /// rehearsed; then fails the call there if the rehearsal says so.
    fn refused(
        &self,
        call: &'static str,
        sql: &str,
        params: Option<Vec<SqlValue>>,
        error: &DbError,
    ) -> wasmtime::Result<()> {
        let Some(r) = &self.rehearsal else {
            return Ok(());
        };
        r.statement(Statement {
            call,
            sql: sql.to_owned(),
            params: params.unwrap_or_default(),
            outcome: Outcome::Failed {
                kind: error_kind(error.kind),
                message: error.message.clone(),
            },
        });
        self.simulated_failure(r)
    }

    /// The failure `r` asks for after the current statement, if any.
    fn simulated_failure(&self, r: &Rehearsal) -> wasmtime::Result<()> {
        if r.fail_after() == Some(self.statements) {
            return Err(wasmtime::format_err!(
                "simulated failure after statement {}: the connection was lost",
                self.statements
            ));
        }
        Ok(())
    }

    /// Records statement `call` (`sql`, `params`) and what it returned,
    /// when the call is rehearsed; then, if the rehearsal fails the call
    /// after this statement, stops it as a lost connection would.
    fn recorded<T>(
        &mut self,
        call: &'static str,
        sql: &str,
        params: &[SqlValue],
        result: &wasmtime::Result<Result<T, DbError>>,
        outcome: impl FnOnce(&T) -> Outcome,
    ) -> wasmtime::Result<()> {
        let Some(r) = &self.rehearsal else {
            return Ok(());
        };
        let outcome = match result {
            Ok(Ok(v)) => outcome(v),
            Ok(Err(e)) => Outcome::Failed {
                kind: error_kind(e.kind),
                message: e.message.clone(),
            },
            Err(e) => Outcome::Stopped(e.to_string()),
        };
        r.statement(Statement {
            call,
            sql: sql.to_owned(),
            params: params.to_vec(),
            outcome,
        });
        self.simulated_failure(r)
    }

    /// The message was published at `published_ms` (ms since the Unix
    /// epoch, the broker's clock): what a WASI guest's wall clock reads.
    /// Without it the wall clock reads the epoch.
    pub(crate) fn published_at(mut self, published_ms: i64) -> Self {
        self.wasi_inputs.published_ms = published_ms;
        self
    }

    /// Checks the statement budget, the parameters' size and the SQL text
    /// (judged as it will run in this message's transaction), then converts
    /// the params.
    async fn admit(
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
        let params: Vec<SqlValue> = params.into_iter().map(SqlValue::from).collect();
        let size: usize = params.iter().map(SqlValue::size).sum();
        if size > self.limits.max_param_bytes {
            return Err(DbError::denied(format!(
                "the parameters are {size} bytes; a statement may carry at most {} KiB (max_param_kib)",
                self.limits.max_param_bytes / 1024
            )));
        }
        let checked = self
            .guard
            .check(&mut self.tx, sql, &params)
            .await
            .map_err(DbError::from)?;
        Ok((checked, params))
    }
}

/// Awaits one statement, bounded by what is left of the message's deadline.
/// A deadline that runs out here is a trap, not an error value: the guest must
/// not go on; nor may it when the statement cost the host its transaction.
/// A statement that ran on this task (SQLite, `Tx::cap_statements`) cannot
/// be stopped by the timer: the store interrupts it at the deadline, and
/// whatever it returned then is the same trap.
/// A statement that failed on a unique constraint is counted in `stats`.
async fn within<T>(
    deadline: Instant,
    stop: &mut Option<Stop>,
    stats: &HandlerStats,
    statement: impl Future<Output = Result<T, StatementError>>,
) -> wasmtime::Result<Result<T, DbError>> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        *stop = Some(Stop::Deadline);
        return Err(wasmtime::format_err!(
            "deadline exceeded before a statement"
        ));
    }
    let done = tokio::time::timeout(left, statement).await;
    if done.is_ok() && Instant::now() >= deadline {
        *stop = Some(Stop::Deadline);
        return Err(wasmtime::format_err!(
            "deadline exceeded during a statement"
        ));
    }
    match done {
        Ok(Ok(v)) => Ok(Ok(v)),
        Ok(Err(StatementError::Failed(e))) => {
            if e.kind == DbErrorKind::UniqueViolation {
                HandlerStats::incr(&stats.unique_violations);
            }
            Ok(Err(DbError::from(e)))
        }
        Ok(Err(StatementError::TransactionLost(why))) => Err(wasmtime::format_err!("{why}")),
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
        text: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<u64, DbError>> {
        let given = self.rehearsal.is_some().then(|| values(&params));
        let (sql, params) = match self.admit(&text, params).await {
            Ok(ok) => ok,
            Err(e) => {
                self.refused("execute", &text, given, &e)?;
                return Ok(Err(e));
            }
        };
        let done = within(
            self.deadline,
            &mut self.stop,
            &self.stats,
            self.tx.execute(&sql, &params),
        )
        .await;
        self.recorded("execute", &text, &params, &done, |n| Outcome::Affected(*n))?;
        done
    }

    async fn query(
        &mut self,
        text: String,
        params: Vec<Value>,
    ) -> wasmtime::Result<Result<Rows, DbError>> {
        let given = self.rehearsal.is_some().then(|| values(&params));
        let (sql, params) = match self.admit(&text, params).await {
            Ok(ok) => ok,
            Err(e) => {
                self.refused("query", &text, given, &e)?;
                return Ok(Err(e));
            }
        };
        let max_rows = self.limits.max_rows;
        let left = self
            .limits
            .max_result_bytes
            .saturating_sub(self.result_bytes);
        let done = within(
            self.deadline,
            &mut self.stop,
            &self.stats,
            self.tx.query(&sql, &params, max_rows, left),
        )
        .await;
        self.recorded("query", &text, &params, &done, |r: &crate::store::Rows| {
            Outcome::Rows {
                columns: r.columns.clone(),
                rows: r.rows.clone(),
            }
        })?;
        let rows = done?;
        if let Ok(rows) = &rows {
            let size: usize = rows.rows.iter().flatten().map(SqlValue::size).sum();
            self.result_bytes = self.result_bytes.saturating_add(size);
        }
        Ok(rows.map(Rows::from))
    }
}

impl handler::log::Host for HostState {
    async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.log.lock().log(level, &message);
        Ok(())
    }
}

impl handler::outbox::Host for HostState {
    async fn publish(
        &mut self,
        subject: String,
        payload: Vec<u8>,
        headers: Vec<(String, String)>,
        key: Option<String>,
    ) -> wasmtime::Result<Result<(), OutboxError>> {
        Ok(self
            .outbox
            .publish(subject, payload, headers, key)
            .map_err(OutboxError::from))
    }

    async fn call(
        &mut self,
        endpoint: String,
        body: Vec<u8>,
        headers: Vec<(String, String)>,
        key: Option<String>,
    ) -> wasmtime::Result<Result<(), OutboxError>> {
        Ok(self
            .outbox
            .call(endpoint, body, headers, key)
            .map_err(OutboxError::from))
    }
}

impl From<Refusal> for OutboxError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::NotGranted(m) => OutboxError::NotGranted(m),
            Refusal::OverLimit(m) => OutboxError::OverLimit(m),
            Refusal::Invalid(m) => OutboxError::Invalid(m),
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let (log, inputs) = (&self.log, &self.wasi_inputs);
        self.wasi
            .get_or_insert_with(|| Box::new(WasiState::new(log, inputs)))
            .view()
    }
}

impl wasmtime::ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.memory_peak = self.memory_peak.max(desired);
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

/// The guest's parameters as the host converts them, for a rehearsal's
/// record of a statement the host refused before converting them.
fn values(params: &[Value]) -> Vec<SqlValue> {
    params.iter().cloned().map(SqlValue::from).collect()
}

/// A WIT `db-error-kind` as `idem invoke` prints it.
fn error_kind(kind: super::bindings::DbErrorKind) -> &'static str {
    use super::bindings::DbErrorKind as K;
    match kind {
        K::UniqueViolation => "unique-violation",
        K::ConstraintViolation => "constraint-violation",
        K::Denied => "denied",
        K::Syntax => "syntax",
        K::Other => "other",
    }
}

/// The most elements a guest table may grow to.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;
