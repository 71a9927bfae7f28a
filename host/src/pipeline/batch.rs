//! Several deliveries in one transaction (ARCHITECTURE.md, "Batching"):
//! the handler's `batch` setting. One COMMIT (one fsync) carries up to
//! `batch` messages; each runs in its own savepoint, so a message that
//! fails costs only itself ([`PreparedHandler::apply_batch`]).
//!
//! ```text
//! deliveries ─► message ids read; a delivery without one, without
//!               JetStream metadata, or a second copy of a message id in
//!               the batch runs alone afterwards (the receipt decides)
//! BEGIN ─► receipts ─► per message: horizon, guest in its savepoint ─► COMMIT
//!   committed ─► every ack at once (applied and duplicates), then
//!                the failed ones settled one by one as alone
//!                (nak, or durable dead letter then term)
//!   a lock conflict ─► that message runs again alone (no delivery spent)
//!   not committed (outage, failed COMMIT, lost savepoint) ─► nothing
//!                settled; every message runs again alone, which holds
//!                through an outage and lets the receipts decide after an
//!                unknown COMMIT outcome
//! ```
//!
//! Ack only after COMMIT holds as for one message (invariant 2): nothing of
//! a batch is acked before its COMMIT returned.

use super::{Delivery, Pipeline};
use crate::broker;
use crate::handler::{BatchApplied, BatchItem, StepFailed};
use crate::metrics::{CommitTimings, HandlerStats};
use crate::runtime::GuestMessage;
use crate::verdict::{self, Attempt, DeliveryCount, Verdict};
use async_nats::jetstream::Message;
use std::collections::HashSet;
use tracing::Instrument as _;

impl Pipeline {
    /// Runs the protocol for `msgs` (deliveries of this handler's consumer)
    /// as one batch (module docs), including every ack, nak and term. Fewer
    /// than two that can share a transaction run alone
    /// ([`Pipeline::process`]).
    pub async fn process_batch(&self, msgs: &[Message]) {
        let mut alone: Vec<&Message> = Vec::new();
        let mut batch: Vec<(Delivery<'_>, String)> = Vec::new();
        let mut ids = HashSet::new();
        for msg in msgs {
            let Ok(d) = Delivery::of(msg) else {
                alone.push(msg);
                continue;
            };
            match crate::message_id::extract(
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
        if batch.len() < 2 {
            for msg in msgs {
                self.process(msg).await;
            }
            return;
        }
        // Every delivery of the batch stays ours until it is settled, also
        // while one runs again alone after the batch.
        let _in_progress: Vec<broker::InProgress> = batch
            .iter()
            .map(|(d, _)| broker::InProgress::start(d.msg.clone(), self.config.ack_wait))
            .collect();
        let span = tracing::info_span!("batch", handler = %self.handler.name(), size = batch.len());
        let again = self.run_batch(&batch).instrument(span).await;
        for msg in again.into_iter().chain(alone) {
            self.process(msg).await;
        }
    }

    /// The batch's transaction, then its settlement. Returns the deliveries
    /// to run again alone: all of them when the transaction did not commit.
    async fn run_batch<'a>(&self, batch: &[(Delivery<'a>, String)]) -> Vec<&'a Message> {
        let _in_flight: Vec<_> = batch
            .iter()
            .map(|_| self.handler.stats().in_flight())
            .collect();
        let applied = match self.batch_transaction(batch).await {
            Ok(applied) => applied,
            Err(StepFailed { step, error }) => {
                tracing::warn!(%step, %error, "the batch did not commit; each of its messages runs again on its own");
                return batch.iter().map(|(d, _)| d.msg).collect();
            }
        };
        let BatchApplied { items, commit } = applied;
        let mut again = Vec::new();
        let mut acks = Vec::new();
        let mut failed = Vec::new();
        for ((d, id), item) in batch.iter().zip(items) {
            let attempt = match item {
                BatchItem::Applied(handler) => {
                    self.note_commit(d, CommitTimings { handler, commit });
                    Attempt::Committed
                }
                BatchItem::Duplicate => Attempt::Duplicate,
                BatchItem::Refused(reason) => Attempt::BeyondHorizon(reason),
                BatchItem::GuestFailed(failure) => Attempt::GuestFailed(failure),
                BatchItem::Conflict => {
                    tracing::debug!(message_id = %id, "lost a lock conflict in the batch; runs again on its own");
                    again.push(d.msg);
                    continue;
                }
            };
            let count = DeliveryCount {
                delivered: d.delivered,
                max_deliver: self.config.max_deliver,
            };
            let verdict = verdict::decide(&attempt, count, self.config.nak_delay(d.delivered));
            let settled = (d, id, attempt, verdict);
            if matches!(settled.3, Verdict::Processed | Verdict::Duplicate) {
                acks.push(settled);
            } else {
                failed.push(settled);
            }
        }
        // Every ack after the one COMMIT, sent together.
        let acked = futures::future::join_all(acks.iter().map(|(d, id, attempt, verdict)| {
            let span = self.delivery_span(d);
            span.record("message_id", id.as_str());
            self.settle(d, Some(id), attempt, verdict.clone())
                .instrument(span)
        }))
        .await;
        for ((_, _, attempt, _), outcome) in acks.iter().zip(acked) {
            HandlerStats::incr(&self.handler.stats().delivered);
            HandlerStats::incr(&self.handler.stats().batched);
            if let Ok(outcome) = outcome {
                self.count(attempt, &outcome);
            }
        }
        // The failed ones one at a time: a dead letter is a write of its own.
        for (d, id, attempt, verdict) in failed {
            let span = self.delivery_span(d);
            span.record("message_id", id.as_str());
            match self
                .settle(d, Some(id), &attempt, verdict)
                .instrument(span)
                .await
            {
                Ok(outcome) => {
                    HandlerStats::incr(&self.handler.stats().delivered);
                    HandlerStats::incr(&self.handler.stats().batched);
                    self.count(&attempt, &outcome);
                }
                // The dead letter could not be written (database
                // unavailable): its receipt was taken back, so it runs
                // again alone, held until the database answers.
                Err(_) => again.push(d.msg),
            }
        }
        again
    }

    /// BEGIN, then the handler's batch step with the horizon as its
    /// admission check.
    async fn batch_transaction(
        &self,
        batch: &[(Delivery<'_>, String)],
    ) -> Result<BatchApplied, StepFailed> {
        let tx = self
            .handler
            .begin_batch(&self.db)
            .await
            .map_err(|error| StepFailed {
                step: "BEGIN",
                error,
            })?;
        let msgs = batch.iter().map(|(d, id)| d.guest_message(id)).collect();
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
