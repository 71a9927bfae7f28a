//! The pipeline's side of a shadow deploy (ARCHITECTURE.md, "Shadow
//! deploys"): for a message in the candidate's sample, after the receipt
//! and before the live version runs, in the live transaction:
//!
//! ```text
//! SAVEPOINT (PostgreSQL: at once, with statement_timeout = its time and
//!            lock_timeout <= 200 ms set inside it; SQLite: with the
//!            candidate's first statement, its statements' budget its time)
//! run the candidate's handle(msg), recorded; its outbox calls are counted,
//!   never stored; its log lines kept out of the host's log
//! ROLLBACK TO SAVEPOINT                      always: nothing of it stays
//! SET LOCAL ROLE NONE (PostgreSQL)           the role as the host expects it
//! run the live version, recorded; compare    ShadowSlot::compared
//! ```
//!
//! Both versions see the same rows: the candidate runs first and is
//! undone, so the live version's statements and their results are what
//! they would have been without it (running it after the live version
//! would show it the live version's writes, and an identical candidate
//! would differ on every insert-if-absent). What a rollback cannot undo
//! is not undone: a PostgreSQL sequence the candidate advances stays
//! advanced.
//!
//! The candidates of one transaction share [`shadow_time`] of the
//! handler's `deadline` (one message's transaction, or a whole batch's):
//! a candidate gets what is left of it, is not run when less than
//! [`MIN_SHADOW_TIME`] is, and is stopped when it runs out. Either way the
//! message counts as skipped, and the live path waits at most that long
//! per transaction.

use super::step::{PreparedHandler, StepFailed, rolled_back};
use crate::runtime::rehearsal::Rehearsal;
use crate::runtime::{GuestMessage, HandlerComponent, HandlerFailure, Invocation};
use crate::shadow::compare::{Divergence, Observed, Verdict, first_difference};
use crate::shadow::{Candidate, Judged, Skip};
use crate::store::Tx;
use std::sync::Arc;
use std::time::Duration;

/// The most time a candidate may take of a transaction: a quarter of the
/// handler's `deadline` (what a batch's transaction keeps taking messages
/// for, [`super::step::batch_budget`]).
pub fn shadow_time(deadline: Duration) -> Duration {
    deadline / 4
}

/// The step a [`StepFailed`] names when the candidate lost the message's
/// transaction (its savepoint could not be rolled back, or the role or
/// budget after it could not be set): the transaction was rolled back
/// whole, and the message is to run again at once, without the candidate
/// ([`crate::shadow::ShadowSlot::spoil`]).
pub const SHADOW_LOST: &str = "the shadow candidate's savepoint";

/// Less than this left of [`shadow_time`]: the candidate is not run.
pub const MIN_SHADOW_TIME: Duration = Duration::from_millis(1);

/// A candidate's run on one message, waiting for the live version's.
pub(super) struct ShadowRun {
    candidate: Arc<Candidate>,
    observed: Observed,
    /// Records the live version's call.
    pub(super) live: Arc<Rehearsal>,
    message_id: String,
    subject: String,
    stream_sequence: u64,
}

impl PreparedHandler {
    /// Runs the shadow candidate on `msg` in `tx` as the module docs show,
    /// when one is in place next to `live` and `msg` is in its sample, for
    /// at most `room` (what is left of the transaction's [`shadow_time`]).
    /// `Some`: the candidate ran;
    /// record the live call with [`ShadowRun::live`], then
    /// [`PreparedHandler::shadow_compare`].
    ///
    /// # Errors
    /// The candidate's savepoint could not be rolled back, or the role
    /// reset failed ([`StepFailed`]): `tx` was rolled back whole.
    pub(super) async fn shadow_first(
        &self,
        live: &HandlerComponent,
        tx: Tx,
        msg: &GuestMessage,
        room: Duration,
        judged: &mut Vec<Judged>,
    ) -> Result<(Tx, Option<ShadowRun>), StepFailed> {
        let Some(candidate) = self.shadow().pick(live.digest(), &msg.message_id) else {
            return Ok((tx, None));
        };
        let bound = room;
        if room < MIN_SHADOW_TIME {
            judged.push(Judged::Skipped(candidate, Skip::Time));
            return Ok((tx, None));
        }
        let lost = |failed: StepFailed| {
            tracing::warn!(message_id = %msg.message_id, step = %failed.step, error = %failed.error, "the shadow candidate lost the message's transaction; the message runs again at once without it");
            self.shadow().spoil(&candidate, &msg.message_id);
            StepFailed {
                step: SHADOW_LOST,
                error: failed.error,
            }
        };
        let mut tx = tx;
        if let Err(error) = tx.begin_bounded_message(bound).await {
            return Err(lost(rolled_back(tx, "SAVEPOINT", error).await));
        }
        let recorder = Arc::new(Rehearsal::quiet());
        let mut limits = self.limits().clone();
        limits.deadline = bound;
        let call = Invocation {
            handler: self.name().clone(),
            message_id: msg.message_id.clone(),
            guard: self.shared_guard().clone(),
            limits,
            stats: self.stats().clone(),
            rehearsal: Some(recorder.clone()),
        };
        // The outbox calls are counted, never stored.
        let (result, mut back) = self
            .runtime()
            .handle(&candidate.component, &call, tx, msg.clone())
            .await;
        let conflict = back.take_conflict();
        let mut tx = self.end_message(back, false).await.map_err(lost)?;
        if let Err(error) = tx.reset_role().await {
            return Err(lost(rolled_back(tx, "SET LOCAL ROLE NONE", error).await));
        }
        // On SQLite the live version's statements get their whole budget.
        if let Err(error) = tx.renew_budget(self.statement_timeout()).await {
            return Err(lost(rolled_back(tx, "SAVEPOINT", error).await));
        }
        let recorded = recorder.recorded().clone();
        let result = result.map(|entries| entries.len());
        // A candidate that used all its time was stopped (a trap at its
        // deadline, or a statement the server cancelled at its
        // `statement_timeout`): not comparable, whatever it returned.
        let skip = if conflict {
            Some(Skip::Conflict)
        } else if recorded.elapsed >= bound {
            Some(Skip::Time)
        } else {
            None
        };
        if let Some(why) = skip {
            judged.push(Judged::Skipped(candidate, why));
            return Ok((tx, None));
        }
        let run = ShadowRun {
            candidate,
            observed: Observed {
                statements_used: recorded.statements_used,
                statements: recorded.statements,
                verdict: Verdict::of(&result),
            },
            live: Arc::new(Rehearsal::new()),
            message_id: msg.message_id.clone(),
            subject: msg.subject.clone(),
            stream_sequence: msg.stream_sequence,
        };
        Ok((tx, Some(run)))
    }

    /// Compares `run`'s candidate with the live call it recorded, which
    /// ended with `live` (`Ok(n)`: succeeded with `n` outbox rows), and
    /// counts the outcome. `conflict`: a live statement lost a lock
    /// conflict (nothing is judged: the message runs again in a batch, or
    /// is retried alone). What came of
    /// it goes to `judged`, to be counted once the transaction's fate is
    /// known.
    pub(super) fn shadow_compare(
        &self,
        run: ShadowRun,
        live: &Result<usize, HandlerFailure>,
        conflict: bool,
        judged: &mut Vec<Judged>,
    ) {
        if conflict {
            // The message runs again (and is judged then).
            return;
        }
        let recorded = run.live.recorded().clone();
        let live = Observed {
            statements: recorded.statements,
            statements_used: recorded.statements_used,
            verdict: Verdict::of(live),
        };
        let divergence = first_difference(&live, &run.observed).map(|d| {
            tracing::debug!(message_id = %run.message_id, what = %d.what, "shadow candidate diverged");
            Box::new(Divergence::new(
                &run.message_id,
                &run.subject,
                run.stream_sequence,
                &d,
                &live,
                &run.observed,
            ))
        });
        judged.push(Judged::Compared(run.candidate, divergence));
    }
}
