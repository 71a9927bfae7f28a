//! A handler prepared to run messages, and the transaction step that runs
//! one, shared by `idem run` ([`crate::pipeline`]) and `idem dlq redrive`
//! ([`crate::admin::redrive`]) (ARCHITECTURE.md, "The protocol"):
//!
//! ```text
//! (caller) BEGIN, bounded by the statement timeout   PreparedHandler::begin
//! INSERT receipt ON CONFLICT DO NOTHING
//!   0 rows → the transaction goes back to the caller  Applied::Duplicate
//! admit? (the pipeline's horizon check)
//!   no     → ROLLBACK                                 Applied::Refused
//! SET LOCAL ROLE idem_handler_<name>_<grants> (PostgreSQL, when set up)
//! run the guest's handle(msg) in this transaction
//!   ok     → COMMIT                                   Applied::Committed (timings)
//!   failed → ROLLBACK (bounded)                       Applied::GuestFailed
//! a database step fails → rolled back                 StepFailed
//! ```
//!
//! The receipt is built from the message the guest sees and the digest of
//! the one component reference this step takes from the handler's
//! [`ComponentSlot`] at its start and runs, so the receipt always names the
//! component that produced the effect, even when a new version is swapped
//! in meanwhile (hot deploy).

use super::shadow_run::shadow_time;
use crate::config::HandlerConfig;
use crate::metrics::{CommitTimings, HandlerIdentity, HandlerStats};
use crate::runtime::component_slot::ComponentSlot;
use crate::runtime::rehearsal::Rehearsal;
use crate::runtime::{GuestMessage, HandlerComponent, HandlerFailure, Invocation, Limits, Runtime};
use crate::shadow::ShadowSlot;
use crate::sql_guard::SqlGuard;
use crate::store::{Database, Receipt, StoreError, Tx};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One handler's component, SQL guard, limits and (PostgreSQL) role, built
/// once by [`PreparedHandler::prepare`].
pub struct PreparedHandler {
    name: Arc<str>,
    slot: Arc<ComponentSlot>,
    runtime: Arc<Runtime>,
    guard: Arc<SqlGuard>,
    limits: Limits,
    /// The role the guest's statements run as, when one could be set up.
    role: Option<String>,
    /// Bound on each statement of the transaction (config `deadline` plus
    /// slack, [`HandlerConfig::statement_timeout`]).
    statement_timeout: Duration,
    stats: Arc<HandlerStats>,
    /// Woken after a COMMIT that stored outbox rows: this host's relay
    /// ([`crate::outbox::relay::Relay::waker`]).
    outbox_wake: Option<Arc<tokio::sync::Notify>>,
    /// The shadow candidate next to the live version, if one is deployed
    /// ([`crate::shadow`]); empty but for `idem run`.
    shadow: Arc<ShadowSlot>,
}

/// How [`PreparedHandler::apply`] ended when every database step worked.
pub enum Applied {
    /// The guest succeeded and the transaction committed: effect and
    /// receipt are durable together. How long the guest call and the
    /// COMMIT took.
    Committed(CommitTimings),
    /// A receipt for this message id existed: the guest did not run. The
    /// open transaction is handed back for the caller to roll back (a
    /// delivery) or commit (a redrive, whose transaction also removes the
    /// dead letter).
    Duplicate(Tx),
    /// `admit` refused the message before the guest ran (the reason it
    /// gave); rolled back.
    Refused(String),
    /// The guest failed; the transaction was rolled back, and how that
    /// rollback ended (nothing was committed in any case).
    GuestFailed(HandlerFailure, Rollback),
}

/// A database step of [`PreparedHandler::apply`] failed; nothing was
/// committed. When `step` is `"COMMIT"` the outcome is unknown: whether the
/// commit happened is for the receipt to tell on the next attempt.
#[derive(Debug)]
pub struct StepFailed {
    /// The step: `receipt insert`, `SET LOCAL ROLE` or `COMMIT`.
    pub step: &'static str,
    /// The database's error.
    pub error: StoreError,
}

/// How the rollback after a failed guest call ended. In every case nothing
/// of the transaction was committed.
#[derive(Debug)]
pub enum Rollback {
    /// Rolled back.
    Done,
    /// The rollback itself failed (the connection is discarded).
    Failed(StoreError),
    /// It did not finish within the statement timeout + 5 s; the connection
    /// was abandoned.
    TimedOut,
}

impl PreparedHandler {
    /// Prepares `cfg`'s handler around its loaded `component`: the SQL guard
    /// for its granted tables, its limits, and on PostgreSQL its own role
    /// ([`Database::prepare_handler_role`]). A role that cannot be set up is
    /// warned about once and the guard alone checks the statements.
    pub async fn prepare(
        cfg: &HandlerConfig,
        component: Arc<HandlerComponent>,
        runtime: Arc<Runtime>,
        db: &Database,
    ) -> Self {
        let role = match db.prepare_handler_role(&cfg.name, &cfg.tables).await {
            Ok(Some(role)) => {
                if !role.others.is_empty() {
                    tracing::warn!(handler = %cfg.name, role = %role.name, others = %role.others.join("; "), "this handler is also run by configs that grant it other tables; each keeps its own role and grants, but one handler name now runs with different grants: give every config the same [[handler]] tables");
                }
                Some(role.name)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(handler = %cfg.name, error = %e, "cannot set up a PostgreSQL role for this handler; its statements run as the host's user, checked by the SQL guard only (grant CREATEROLE to enable this defence)");
                None
            }
        };
        let stats = Arc::new(HandlerStats::new(HandlerIdentity {
            name: &cfg.name,
            retention: cfg.retention,
        }));
        Self {
            name: Arc::from(cfg.name.as_str()),
            slot: Arc::new(ComponentSlot::new(&cfg.name, component)),
            runtime,
            guard: Arc::new(SqlGuard::new(db.kind(), &cfg.tables)),
            limits: limits(cfg),
            role,
            statement_timeout: cfg.statement_timeout(),
            stats,
            outbox_wake: None,
            shadow: Arc::new(ShadowSlot::new(&cfg.name)),
        }
    }

    /// Wakes `relay` (a relay's [`crate::outbox::relay::Relay::waker`])
    /// after each COMMIT that stored outbox rows, so they leave at once
    /// rather than at the relay's next poll.
    pub fn wake_relay(&mut self, relay: Arc<tokio::sync::Notify>) {
        self.outbox_wake = Some(relay);
    }

    /// After a COMMIT that stored `rows` outbox rows.
    fn committed_outbox(&self, rows: usize) {
        if rows > 0
            && let Some(wake) = &self.outbox_wake
        {
            wake.notify_one();
        }
    }

    /// The handler's name (= its durable consumer's name and the receipts'
    /// `consumer`).
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The handler's counters.
    pub fn stats(&self) -> &Arc<HandlerStats> {
        &self.stats
    }

    /// Where this handler's component is kept: [`ComponentSlot::current`]
    /// is what a delivery starting now runs; a deploy swaps it.
    pub fn slot(&self) -> &Arc<ComponentSlot> {
        &self.slot
    }

    /// The role the guest's statements run as (PostgreSQL, when one could
    /// be set up).
    pub(super) fn role(&self) -> Option<&str> {
        self.role.as_deref()
    }

    /// The SQL guard for the handler's granted tables.
    pub(super) fn guard(&self) -> &SqlGuard {
        &self.guard
    }

    /// [`PreparedHandler::guard`], shared.
    pub(super) fn shared_guard(&self) -> &Arc<SqlGuard> {
        &self.guard
    }

    /// The per-message limits.
    pub(super) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Where a shadow candidate of this handler is put ([`crate::shadow`]).
    pub fn shadow(&self) -> &Arc<ShadowSlot> {
        &self.shadow
    }

    /// Bound on each statement of the transaction.
    pub(super) fn statement_timeout(&self) -> Duration {
        self.statement_timeout
    }

    /// The runtime the handler's components are loaded into (a new version
    /// must be loaded by the same one).
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// BEGIN on `db`, every statement bounded by the handler's statement
    /// timeout.
    ///
    /// # Errors
    /// The database could not start a transaction ([`StoreError`]).
    pub async fn begin(&self, db: &Database) -> Result<Tx, StoreError> {
        db.begin_bounded(self.statement_timeout).await
    }

    /// BEGIN of a batch's transaction on `db` ([`Database::begin_batch`]):
    /// every statement bounded by the handler's statement timeout, and on
    /// PostgreSQL each row lock waited for briefly.
    ///
    /// # Errors
    /// The database could not start a transaction ([`StoreError`]).
    pub async fn begin_batch(&self, db: &Database) -> Result<Tx, StoreError> {
        db.begin_batch(self.statement_timeout).await
    }

    /// The transaction step (module docs) for `msg` in `tx`: receipt, then
    /// `admit` (`Some(reason)` refuses the message before any guest code),
    /// role, guest, COMMIT. The receipt is `(name, msg.message_id)` with the
    /// message's stream sequence and publish time and the component's digest.
    ///
    /// # Errors
    /// A database step failed ([`StepFailed`]): the transaction is rolled
    /// back (or dropped with its connection); at `COMMIT` the outcome is
    /// unknown.
    pub async fn apply(
        &self,
        mut tx: Tx,
        msg: GuestMessage,
        admit: impl FnOnce() -> Option<String>,
        order_key: Option<&str>,
    ) -> Result<Applied, StepFailed> {
        // One reference for the whole step: the receipt names what runs.
        let component = self.slot.current();
        let receipt = Receipt {
            consumer: &self.name,
            message_id: &msg.message_id,
            stream_sequence: msg.stream_sequence,
            module_digest: component.digest(),
            published_ms: msg.published_ms,
        };
        match tx.insert_receipt(&receipt).await {
            Ok(true) => {}
            Ok(false) => return Ok(Applied::Duplicate(tx)),
            Err(error) => return Err(rolled_back(tx, "receipt insert", error).await),
        }
        if let Some(reason) = admit() {
            if let Err(e) = tx.rollback().await {
                tracing::warn!(error = %e, "rollback of a refused message failed (nothing was committed)");
            }
            return Ok(Applied::Refused(reason));
        }
        if let Some(key) = order_key {
            match tx
                .advance_key_sequence(&self.name, key, msg.stream_sequence)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    if let Err(e) = tx.rollback().await {
                        tracing::warn!(error = %e, "rollback of a refused message failed (nothing was committed)");
                    }
                    return Ok(Applied::Refused(format!(
                        "out-of-order: a later message of key `{}` was applied before this one (stream sequence {})",
                        crate::log_format::escape(key),
                        msg.stream_sequence
                    )));
                }
                Err(error) => return Err(rolled_back(tx, "key sequence", error).await),
            }
        }
        if let Some(role) = &self.role
            && let Err(error) = tx.enter_handler_role(role).await
        {
            return Err(rolled_back(tx, "SET LOCAL ROLE", error).await);
        }
        let mut judged = Vec::new();
        let (tx, shadow) = self
            .shadow_first(
                &component,
                tx,
                &msg,
                shadow_time(self.limits.deadline),
                &mut judged,
            )
            .await?;
        let guest_started = Instant::now();
        let live = shadow.as_ref().map(|run| run.live.clone());
        let (outcome, conflict) = self.run_guest(&component, tx, msg, live).await;
        if let Some(run) = shadow {
            let result = match &outcome {
                Ok((_, rows)) => Ok(*rows),
                Err((failure, _)) => Err(failure.clone()),
            };
            self.shadow_compare(run, &result, conflict, &mut judged);
        }
        if outcome.is_err() {
            // Final for this attempt: the message failed for itself.
            self.shadow.count(std::mem::take(&mut judged));
        }
        match outcome {
            Ok((tx, outbox_rows)) => {
                let handler = guest_started.elapsed();
                let commit_started = Instant::now();
                match tx.commit().await {
                    Ok(()) => {
                        self.shadow.count(judged);
                        self.committed_outbox(outbox_rows);
                        Ok(Applied::Committed(CommitTimings {
                            handler,
                            commit: commit_started.elapsed(),
                        }))
                    }
                    Err(error) => Err(StepFailed {
                        step: "COMMIT",
                        error,
                    }),
                }
            }
            Err((failure, rollback)) => Ok(Applied::GuestFailed(failure, rollback)),
        }
    }

    /// Runs the guest on `msg` inside `tx`, recorded in `rehearsal` if
    /// given; the `bool` says whether a statement lost a lock conflict
    /// ([`Tx::take_conflict`]). `Ok((tx, rows))`: the guest
    /// succeeded (and stored `rows` outbox rows), commit `tx`. `Err`: the guest failed and `tx` was rolled back,
    /// bounded by the statement timeout + 5 s (a statement the runtime
    /// abandoned at the deadline is cancelled by the statement timeout
    /// first); how the rollback ended is returned with the failure.
    async fn run_guest(
        &self,
        component: &HandlerComponent,
        tx: Tx,
        msg: GuestMessage,
        rehearsal: Option<Arc<Rehearsal>>,
    ) -> (Result<(Tx, usize), (HandlerFailure, Rollback)>, bool) {
        let (result, mut tx) = self.call_guest(component, tx, msg, rehearsal).await;
        let conflict = tx.take_conflict();
        let failure = match result {
            Ok(rows) => return (Ok((tx, rows)), conflict),
            Err(failure) => failure,
        };
        let bound = self.statement_timeout + Duration::from_secs(5);
        let rollback = match tokio::time::timeout(bound, tx.rollback()).await {
            Ok(Ok(())) => Rollback::Done,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "rollback failed (the connection is discarded; nothing was committed)");
                Rollback::Failed(e)
            }
            Err(_) => {
                tracing::error!(
                    "rollback did not finish within {bound:?}; connection abandoned, nothing was committed"
                );
                Rollback::TimedOut
            }
        };
        (Err((failure, rollback)), conflict)
    }
}

/// How one message of [`PreparedHandler::apply_batch`] ended, in a batch
/// whose transaction committed.
#[derive(Debug)]
pub enum BatchItem {
    /// The guest succeeded: its effect and receipt committed with the
    /// batch. How long its guest call took.
    Applied(Duration),
    /// A receipt for this message id existed: the guest did not run.
    Duplicate,
    /// `admit` refused it (the reason); its receipt was taken back.
    Refused(String),
    /// The guest failed; everything it did and its receipt were taken back.
    GuestFailed(HandlerFailure),
    /// A statement lost a lock conflict with another transaction (deadlock
    /// or serialization failure): taken back like a failure, but it says
    /// nothing about the message, which is to run again.
    Conflict,
    /// Not run: the transaction had run for its time budget (a quarter of
    /// `deadline`, [`batch_budget`]) before this message's turn. Its
    /// receipt was taken back; it is to run in another transaction.
    Deferred,
}

/// How long a batch's transaction keeps taking messages: a quarter of the
/// handler's `deadline`. It holds its rows' locks until COMMIT, so this
/// (plus one message) is about how long another transaction may wait for
/// them; the first message always runs.
pub fn batch_budget(deadline: Duration) -> Duration {
    deadline / 4
}

/// A committed batch: one [`BatchItem`] per message, in the order given,
/// and how long the COMMIT took.
#[derive(Debug)]
pub struct BatchApplied {
    /// How each message ended.
    pub items: Vec<BatchItem>,
    /// The COMMIT's duration.
    pub commit: Duration,
}

impl PreparedHandler {
    /// The transaction step for several messages in one transaction
    /// (ARCHITECTURE.md, "Batching"): their receipts in one statement
    /// ([`Tx::insert_receipts`]); then, for each message with a new receipt
    /// that `admit` lets in, in the order given, the guest inside the
    /// message's own savepoint; the receipts of the messages that did not
    /// apply taken back; COMMIT. The messages must have distinct message
    /// ids; `tx` is from [`PreparedHandler::begin_batch`]. A message's
    /// failure costs only its own savepoint; every statement is bounded as
    /// in [`PreparedHandler::apply`], and on SQLite each message gets the
    /// whole statement budget.
    ///
    /// # Errors
    /// A database step failed, or a failed message could not be rolled back
    /// to its savepoint ([`StepFailed`]): the whole transaction is rolled
    /// back (or dropped with its connection) and nothing of the batch
    /// committed; at `COMMIT` the outcome is unknown.
    pub async fn apply_batch(
        &self,
        mut tx: Tx,
        msgs: Vec<GuestMessage>,
        admit: impl Fn(&GuestMessage) -> Option<String>,
    ) -> Result<BatchApplied, StepFailed> {
        // One reference for the whole step: the receipts name what runs.
        let component = self.slot.current();
        let receipts: Vec<Receipt<'_>> = msgs
            .iter()
            .map(|m| Receipt {
                consumer: &self.name,
                message_id: &m.message_id,
                stream_sequence: m.stream_sequence,
                module_digest: component.digest(),
                published_ms: m.published_ms,
            })
            .collect();
        let new = match tx.insert_receipts(&receipts).await {
            Ok(new) => new,
            Err(error) => return Err(rolled_back(tx, "receipt insert", error).await),
        };
        drop(receipts);
        if let Some(role) = &self.role
            && let Err(error) = tx.enter_handler_role(role).await
        {
            return Err(rolled_back(tx, "SET LOCAL ROLE", error).await);
        }
        let mut items = Vec::with_capacity(msgs.len());
        let mut taken_back: Vec<String> = Vec::new();
        let mut outbox_rows = 0;
        let batch_started = Instant::now();
        let budget = batch_budget(self.limits.deadline);
        let mut shadow_left = shadow_time(self.limits.deadline);
        let mut judged = Vec::new();
        for (msg, new) in msgs.into_iter().zip(new) {
            if !new {
                items.push(BatchItem::Duplicate);
                continue;
            }
            if !items.is_empty() && batch_started.elapsed() >= budget {
                taken_back.push(msg.message_id.clone());
                items.push(BatchItem::Deferred);
                continue;
            }
            if let Some(reason) = admit(&msg) {
                taken_back.push(msg.message_id.clone());
                items.push(BatchItem::Refused(reason));
                continue;
            }
            let shadow_started = Instant::now();
            let (back, shadow) = self
                .shadow_first(&component, tx, &msg, shadow_left, &mut judged)
                .await?;
            tx = back;
            shadow_left = shadow_left.saturating_sub(shadow_started.elapsed());
            if let Err(error) = tx.begin_message(self.statement_timeout).await {
                return Err(rolled_back(tx, "SAVEPOINT", error).await);
            }
            let message_id = msg.message_id.clone();
            let started = Instant::now();
            let live = shadow.as_ref().map(|run| run.live.clone());
            let (result, mut back) = self.call_guest(&component, tx, msg, live).await;
            let conflict = back.take_conflict();
            if let Some(run) = shadow {
                self.shadow_compare(run, &result, conflict, &mut judged);
            }
            let applied = result.is_ok() && !conflict;
            tx = self.end_message(back, applied).await?;
            items.push(match result {
                _ if conflict => BatchItem::Conflict,
                Ok(rows) => {
                    outbox_rows += rows;
                    BatchItem::Applied(started.elapsed())
                }
                Err(failure) => BatchItem::GuestFailed(failure),
            });
            if !applied {
                taken_back.push(message_id);
            }
        }
        let ids: Vec<&str> = taken_back.iter().map(String::as_str).collect();
        if let Err(error) = tx.forget_receipts(&self.name, &ids).await {
            return Err(rolled_back(tx, "receipt delete", error).await);
        }
        let commit_started = Instant::now();
        match tx.commit().await {
            Ok(()) => {
                self.shadow.count(judged);
                self.committed_outbox(outbox_rows);
                Ok(BatchApplied {
                    items,
                    commit: commit_started.elapsed(),
                })
            }
            Err(error) => Err(StepFailed {
                step: "COMMIT",
                error,
            }),
        }
    }

    /// Ends the current message of a batch in `tx` ([`Tx::end_message`]),
    /// bounded by the statement timeout + 5 s. A rollback to the message's
    /// savepoint is tried twice: on PostgreSQL the first answer can be the
    /// error of a statement the runtime abandoned at the guest's deadline
    /// (cancelled by the statement timeout), not the rollback's own.
    ///
    /// # Errors
    /// The savepoint could not be rolled back or the bound passed: the
    /// transaction is rolled back whole ([`StepFailed`]).
    pub(super) async fn end_message(&self, mut tx: Tx, applied: bool) -> Result<Tx, StepFailed> {
        let bound = self.statement_timeout + Duration::from_secs(5);
        let mut tries = if applied { 1 } else { 2 };
        loop {
            tries -= 1;
            match tokio::time::timeout(bound, tx.end_message(applied)).await {
                Ok(Ok(())) => return Ok(tx),
                Ok(Err(error)) if tries == 0 => {
                    return Err(rolled_back(tx, "ROLLBACK TO SAVEPOINT", error).await);
                }
                Ok(Err(error)) => {
                    tracing::debug!(%error, "rollback to the message's savepoint failed; trying once more");
                    tx.reopen_message();
                }
                Err(_) => {
                    tracing::error!(
                        "rollback to the message's savepoint did not finish within {bound:?}; the batch's transaction is abandoned, nothing of it committed"
                    );
                    return Err(StepFailed {
                        step: "ROLLBACK TO SAVEPOINT",
                        error: StoreError::Sqlx(sqlx::Error::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("no answer within {bound:?}"),
                        ))),
                    });
                }
            }
        }
    }

    /// Calls the guest's `handle` on `msg` inside `tx` and hands `tx` back;
    /// when it succeeded, its outbox calls are stored in `tx` first, and
    /// `Ok` says how many. `rehearsal` records the call
    /// ([`crate::runtime::rehearsal`]).
    pub(super) async fn call_guest(
        &self,
        component: &HandlerComponent,
        tx: Tx,
        msg: GuestMessage,
        rehearsal: Option<Arc<Rehearsal>>,
    ) -> (Result<usize, HandlerFailure>, Tx) {
        let message_id = msg.message_id.clone();
        let call = Invocation {
            handler: self.name.clone(),
            message_id: msg.message_id.clone(),
            guard: self.guard.clone(),
            limits: self.limits.clone(),
            stats: self.stats.clone(),
            rehearsal,
        };
        let (result, mut tx) = self.runtime.handle(component, &call, tx, msg).await;
        let entries = match result {
            Ok(entries) => entries,
            Err(failure) => return (Err(failure), tx),
        };
        if entries.is_empty() {
            return (Ok(0), tx);
        }
        // In the message's transaction (and savepoint, in a batch): the rows
        // commit with its effects and receipt, or not at all.
        match tx.insert_outbox(&self.name, &message_id, &entries).await {
            Ok(()) => (Ok(entries.len()), tx),
            Err(e) => (
                Err(HandlerFailure::Retry(format!(
                    "cannot store the message's outbox rows: {e}"
                ))),
                tx,
            ),
        }
    }
}

/// Rolls `tx` back after `step` failed with `error` (a failed rollback only
/// drops the connection) and says which step failed.
pub(super) async fn rolled_back(tx: Tx, step: &'static str, error: StoreError) -> StepFailed {
    if let Err(e) = tx.rollback().await {
        tracing::debug!(%step, error = %e, "rollback after a failed step failed (nothing was committed)");
    }
    StepFailed { step, error }
}

/// The per-message limits of `cfg` (KiB and MiB turned into bytes).
pub(crate) fn limits(cfg: &HandlerConfig) -> Limits {
    Limits {
        deadline: cfg.deadline,
        max_memory_bytes: (cfg.max_memory_mib as usize).saturating_mul(1024 * 1024),
        max_statements: cfg.max_statements,
        max_rows: cfg.max_rows,
        max_result_bytes: cfg.max_result_kib.saturating_mul(1024),
        max_param_bytes: cfg.max_param_kib.saturating_mul(1024),
        max_log_bytes: cfg.max_log_kib.saturating_mul(1024),
        outbox: Arc::new(crate::outbox::OutboxGrants::of_handler(cfg)),
    }
}
