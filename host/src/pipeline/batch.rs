//! Several deliveries in one transaction (ARCHITECTURE.md, "Batching"):
//! the handler's `batch` setting. One COMMIT (one fsync) carries up to
//! `batch` messages; each runs in its own savepoint, so a message that
//! fails costs only itself ([`PreparedHandler::apply_batch`]).
//!
//! ```text
//! deliveries ─► message ids read; a delivery without one, without
//!               JetStream metadata, or a second copy of a message id in
//!               the batch runs alone afterwards (the receipt decides)
//!   one receipt lookup for the rest when one is likely a copy ─►
//!               those whose receipts are committed acked at once,
//!               without a transaction (`pipeline/lookup.rs`)
//! BEGIN ─► receipts ─► per message: horizon, guest in its savepoint ─► COMMIT
//!   committed ─► every ack at once (applied and duplicates), then
//!                the failed ones settled one by one as alone
//!                (nak, or durable dead letter then term)
//!   a lock conflict ─► that message runs again alone (no delivery spent)
//!   not run (the transaction's time budget ran out) ─► the next transaction
//!   not committed (outage, failed COMMIT, lost savepoint) ─► nothing
//!                settled; every message runs again alone, which holds
//!                through an outage and lets the receipts decide after an
//!                unknown COMMIT outcome
//! ```
//!
//! Ack only after COMMIT holds as for one message (invariant 2): nothing of
//! a batch is acked before its COMMIT returned, but the copies the lookup
//! found, whose receipts (and effects) committed before.

use super::Unsettled;
use super::{Delivery, Outcome, Pipeline};
use crate::broker;
use crate::metrics::{CommitTimings, HandlerStats};
use crate::pipeline::fault;
use crate::pipeline::step::{BatchApplied, BatchItem, StepFailed};
use crate::pipeline::verdict::{self, Attempt, DeliveryCount, Verdict};
use crate::runtime::GuestMessage;
use async_nats::jetstream::Message;
use std::collections::HashSet;
use tracing::Instrument as _;

impl Pipeline {
    /// Runs the protocol for `msgs` (deliveries of this handler's consumer)
    /// as one batch (module docs), including every ack, nak and term. Fewer
    /// than two that can share a transaction run alone
    /// ([`Pipeline::process`]). Each delivery settled is crossed off
    /// `unsettled` (what a stop gives back if it abandons the batch).
    pub async fn process_batch(&self, msgs: &[Message], unsettled: &Unsettled) {
        let mut alone: Vec<&Message> = Vec::new();
        let mut batch: Vec<(Delivery<'_>, String)> = Vec::new();
        let mut ids = HashSet::new();
        for msg in msgs {
            let Ok(d) = Delivery::of(msg, self.config.partitions.is_some()) else {
                alone.push(msg);
                continue;
            };
            match crate::pipeline::message_id::extract(
                &self.config.identity,
                msg.headers.as_ref(),
                &msg.payload,
            ) {
                Ok(id) if ids.insert(id.clone()) => batch.push((d, id)),
                // No message id (dead-lettered alone), or a second copy of
                // one: it runs after the batch, where the receipt decides.
                _ => alone.push(msg),
            }
        }
        // One lookup for the whole batch when one of its members is likely
        // a copy: the copies whose receipts are committed are acked
        // together, before (and without) the transaction.
        let mut acked: Vec<&Message> = Vec::new();
        let looked_up = batch.len() >= 2
            && batch
                .iter()
                .any(|(d, id)| self.worth_a_lookup(d.delivered, id));
        // Every delivery of the batch stays ours until it is settled (its
        // keep-alive ends then, so a nak's delay holds), from before its
        // lookup (which may take a quarter of `ack_wait`), also while it
        // waits to run again alone after the batch.
        let mut keep: Vec<Option<broker::InProgress>> = batch
            .iter()
            .map(|(d, _)| Some(self.keep_in_progress(d.msg)))
            .collect();
        if looked_up {
            let found = self.lookup(batch.iter().map(|(_, id)| id.as_str())).await;
            if !found.is_empty() {
                let (dups, rest): (Vec<_>, Vec<_>) = batch
                    .into_iter()
                    .zip(keep)
                    .partition(|((_, id), _)| found.contains(id));
                acked = dups.iter().map(|((d, _), _)| d.msg).collect();
                let dups: Vec<(Message, String)> = dups
                    .into_iter()
                    .map(|((d, id), _)| (d.msg.clone(), id))
                    .collect();
                self.ack_duplicates(&dups, unsettled).await;
                (batch, keep) = rest.into_iter().unzip();
            }
        }
        if batch.len() < 2 {
            drop(keep);
            for msg in msgs {
                if acked.iter().any(|a| std::ptr::eq(*a, msg)) {
                    continue;
                }
                // A member the lookup found new is not looked up again.
                let member = batch.iter().any(|(d, _)| std::ptr::eq(d.msg, msg));
                self.process_alone(msg, unsettled, looked_up && member)
                    .await;
            }
            return;
        }
        let mut again = Vec::new();
        let mut pending: Vec<usize> = (0..batch.len()).collect();
        // Messages a transaction deferred (its time budget ran out) go on
        // in the next one.
        while pending.len() >= 2 {
            let span =
                tracing::info_span!("batch", handler = %self.handler.name(), size = pending.len());
            let (alone_again, deferred) = self
                .run_batch(&batch, &pending, &mut keep, unsettled)
                .instrument(span)
                .await;
            again.extend(alone_again);
            pending = deferred;
        }
        again.extend(pending);
        for i in again {
            keep[i] = None;
            self.process_alone(batch[i].0.msg, unsettled, false).await;
        }
        for msg in alone {
            self.process_alone(msg, unsettled, false).await;
        }
    }

    /// [`Pipeline::process`] (or, when a lookup has just found it new,
    /// [`Pipeline::process_looked_up`]), then `msg` crossed off `unsettled`
    /// unless it was left unsettled.
    async fn process_alone(&self, msg: &Message, unsettled: &Unsettled, looked_up: bool) {
        if !matches!(
            self.process_delivery(msg, looked_up).await,
            Outcome::Unsettled(_)
        ) {
            unsettled.settled(msg);
        }
    }

    /// One transaction over the members `pending` of `batch`, then their
    /// settlement; the keep-alive of each member settled is dropped from
    /// `keep`. Returns the members to run again alone (all of them when
    /// the transaction did not commit) and those it deferred to the next
    /// transaction.
    async fn run_batch(
        &self,
        batch: &[(Delivery<'_>, String)],
        pending: &[usize],
        keep: &mut [Option<broker::InProgress>],
        unsettled: &Unsettled,
    ) -> (Vec<usize>, Vec<usize>) {
        let _in_flight: Vec<_> = pending
            .iter()
            .map(|_| self.handler.stats().in_flight())
            .collect();
        let applied = match self.batch_transaction(batch, pending).await {
            Ok(applied) => applied,
            Err(StepFailed { step, error }) => {
                tracing::warn!(%step, %error, "the batch did not commit; each of its messages runs again on its own");
                return (pending.to_vec(), Vec::new());
            }
        };
        let BatchApplied { items, commit } = applied;
        let mut again = Vec::new();
        let mut deferred = Vec::new();
        let mut acks: Vec<(usize, Attempt)> = Vec::new();
        let mut failed = Vec::new();
        for (&i, item) in pending.iter().zip(items) {
            let (d, id) = &batch[i];
            let attempt = match item {
                BatchItem::Applied(handler) => {
                    self.note_commit(d, CommitTimings { handler, commit });
                    self.committed.insert(id);
                    Attempt::Committed
                }
                BatchItem::Duplicate => {
                    self.committed.insert(id);
                    self.copies.found_without_lookup();
                    Attempt::Duplicate
                }
                BatchItem::Refused(reason) => Attempt::Refused(reason),
                BatchItem::GuestFailed(failure) => Attempt::GuestFailed(failure),
                BatchItem::Conflict => {
                    tracing::debug!(message_id = %id, "lost a lock conflict in the batch; runs again on its own");
                    again.push(i);
                    continue;
                }
                BatchItem::Deferred => {
                    deferred.push(i);
                    continue;
                }
            };
            let count = DeliveryCount {
                delivered: d.delivered,
                max_deliver: self.config.max_deliver,
            };
            let verdict = verdict::decide(&attempt, count, self.config.nak_delay(d.delivered));
            if matches!(verdict, Verdict::Processed | Verdict::Duplicate) {
                acks.push((i, attempt));
            } else {
                failed.push((i, attempt, verdict));
            }
        }
        // Every ack after the one COMMIT, sent together: one round trip.
        self.ack_committed(batch, &acks, keep, unsettled).await;
        // The failed ones one at a time: a dead letter is a write of its own.
        for (i, attempt, verdict) in failed {
            let (d, id) = &batch[i];
            let span = self.delivery_span(d);
            span.record("message_id", id.as_str());
            match self
                .settle(d, Some(id), &attempt, verdict)
                .instrument(span)
                .await
            {
                Ok(outcome) => {
                    self.settled_in_batch(d.msg, &mut keep[i], unsettled, &attempt, &outcome);
                }
                // The dead letter could not be written (database
                // unavailable): its receipt was taken back, so it runs
                // again alone, held until the database answers.
                Err(_) => again.push(i),
            }
        }
        (again, deferred)
    }

    /// Acks the members `acks` of a committed batch (processed, or found
    /// duplicate by their receipts) with [`broker::ack_together`]: plain
    /// acks and the last confirmed. A processed member passes the
    /// after-commit fault point first, as alone. Each is then settled: its
    /// keep-alive ends, it is counted. An ack that fails is counted and
    /// left to the receipt, as alone.
    async fn ack_committed(
        &self,
        batch: &[(Delivery<'_>, String)],
        acks: &[(usize, Attempt)],
        keep: &mut [Option<broker::InProgress>],
        unsettled: &Unsettled,
    ) {
        let sent: Vec<&Message> = acks
            .iter()
            .filter(|(_, attempt)| {
                matches!(attempt, Attempt::Duplicate)
                    || fault::after_commit() == fault::AfterCommit::Ack
            })
            .map(|(i, _)| batch[*i].0.msg)
            .collect();
        if let Err(e) = broker::ack_together(&sent).await {
            let stats = self.handler.stats();
            for _ in &sent {
                HandlerStats::incr(&stats.ack_failures);
            }
            tracing::warn!(handler = %self.handler.name(), acks = sent.len(), error = %e, "ack after the batch's commit failed; the receipts will absorb the redeliveries");
        }
        for (i, attempt) in acks {
            let outcome = match attempt {
                Attempt::Duplicate => {
                    tracing::debug!(handler = %self.handler.name(), message_id = %batch[*i].1, "duplicate in the batch: receipt exists; acked");
                    Outcome::Duplicate
                }
                _ => Outcome::Processed,
            };
            self.settled_in_batch(batch[*i].0.msg, &mut keep[*i], unsettled, attempt, &outcome);
        }
    }

    /// A member of a committed batch was settled: its keep-alive ends, a
    /// stop no longer gives it back, and it is counted.
    fn settled_in_batch(
        &self,
        msg: &Message,
        keep: &mut Option<broker::InProgress>,
        unsettled: &Unsettled,
        attempt: &Attempt,
        outcome: &Outcome,
    ) {
        *keep = None;
        unsettled.settled(msg);
        HandlerStats::incr(&self.handler.stats().delivered);
        HandlerStats::incr(&self.handler.stats().batched);
        self.count(attempt, outcome);
    }

    /// BEGIN, then the handler's batch step with the horizon as its
    /// admission check.
    async fn batch_transaction(
        &self,
        batch: &[(Delivery<'_>, String)],
        pending: &[usize],
    ) -> Result<BatchApplied, StepFailed> {
        let tx = self
            .handler
            .begin_batch(&self.db)
            .await
            .map_err(|error| StepFailed {
                step: "BEGIN",
                error,
            })?;
        let msgs = pending
            .iter()
            .map(|&i| batch[i].0.guest_message(&batch[i].1))
            .collect();
        // As for one message: judged after the receipt insert
        // (ARCHITECTURE.md invariant 7).
        let admit = |m: &GuestMessage| {
            self.horizon
                .then(|| self.beyond_horizon(m.published_ms))
                .flatten()
        };
        self.handler.apply_batch(tx, msgs, admit).await
    }
}
