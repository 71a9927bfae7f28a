//! One receipt lookup for several deliveries before any transaction
//! (ARCHITECTURE.md, "Duplicates found before the transaction"): a
//! delivery whose receipt is committed is acked as a duplicate with no
//! BEGIN, receipt insert or ROLLBACK. The lookup only says which
//! deliveries to ack at once; for every other one the receipt insert in
//! its transaction decides, as always.
//!
//! Deliveries are looked up only when they are likely copies
//! ([`worth_a_lookup`]): a batch when one of its members is, a delivery
//! that runs alone when it is, and then, in the unbatched loop, together
//! with what its pull stream has buffered. A new message costs no extra
//! query.

use super::verdict::Attempt;
use super::{Outcome, Pipeline, Unsettled};
use crate::broker;
use crate::metrics::HandlerStats;
use async_nats::jetstream::Message;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

/// The longest a lookup may take, at most: past it (or a quarter of
/// `ack_wait`, when that is shorter) the deliveries run the protocol as
/// if nothing was found (the lookup is only a shortcut).
pub const LOOKUP_WAIT: Duration = Duration::from_secs(1);

/// Whether copies are arriving now: a duplicate turned up (found by a
/// transaction's receipt insert or by a lookup), and no lookup has found
/// none since. Copies come in runs: a
/// redelivery after a crash, a producer sending a range again, a consumer
/// reset.
#[derive(Debug, Default)]
pub struct CopiesArriving(AtomicBool);

impl CopiesArriving {
    /// A duplicate turned up without a lookup (a transaction's receipt
    /// insert found the receipt).
    pub fn found_without_lookup(&self) {
        self.0.store(true, Relaxed);
    }

    /// A lookup ran and found `found` of the deliveries it looked up; a
    /// lookup that failed counts as one that found none (so a failing
    /// database is not asked again for every pull).
    pub fn looked_up(&self, found: usize) {
        self.0.store(found > 0, Relaxed);
    }

    /// Whether copies are arriving (type docs).
    pub fn now(&self) -> bool {
        self.0.load(Relaxed)
    }
}

/// Whether a delivery is worth a receipt lookup: it is a redelivery
/// (`delivered` above 1: its first delivery may have committed, its ack
/// lost), this host saw its receipt committed lately (`remembered`), or
/// copies are arriving ([`CopiesArriving`]).
pub fn worth_a_lookup(delivered: u64, remembered: bool, copies_arriving: bool) -> bool {
    delivered > 1 || remembered || copies_arriving
}

impl Pipeline {
    /// Whether `msg` is worth a receipt lookup by the signs that need
    /// neither its payload nor its message id ([`worth_a_lookup`] without
    /// `remembered`): what the unbatched loop asks of each pull's first
    /// delivery before it takes the rest of the pull in.
    pub fn likely_duplicate(&self, msg: &Message) -> bool {
        let delivered = msg
            .info()
            .map_or(1, |i| u64::try_from(i.delivered).unwrap_or(1));
        worth_a_lookup(delivered, false, self.copies.now())
    }

    /// The pull size while copies are arriving ([`CopiesArriving`]): the
    /// handler's `pull_batch`, when that is above its usual pull size
    /// ([`crate::config::HandlerConfig::pull_size`]); `None` otherwise.
    /// What the pull stream buffers beyond the usual size meanwhile is
    /// held in progress ([`broker::Raise`]).
    pub fn raised_pull_size(&self) -> Option<usize> {
        let (usual, most) = (self.config.pull_size(), self.config.pull_batch);
        (self.copies.now() && most > usual).then_some(most)
    }

    /// The most deliveries one receipt lookup of the unbatched loop takes
    /// from the pull stream: the raised pull size while copies arrive, the
    /// usual one otherwise.
    pub fn lookup_size(&self) -> usize {
        self.raised_pull_size()
            .unwrap_or_else(|| self.config.pull_size())
    }

    /// A [`broker::Raise`] holding with this handler's keep-alive: what
    /// the unbatched loop raises its pull size through.
    pub fn raise(&self) -> std::sync::Arc<broker::Raise> {
        std::sync::Arc::new(broker::Raise::new(self.keep_alive.clone()))
    }

    /// Whether a delivery counted `delivered` with `message_id` is worth a
    /// receipt lookup ([`worth_a_lookup`]).
    pub(super) fn worth_a_lookup(&self, delivered: u64, message_id: &str) -> bool {
        worth_a_lookup(
            delivered,
            self.committed.contains(message_id),
            self.copies.now(),
        )
    }

    /// Looks up the receipts of `msgs` (deliveries of this handler's
    /// consumer) in one query and splits them into the copies whose
    /// receipts are committed, with their message ids (for
    /// [`Pipeline::ack_duplicates`]), and the rest, in their order. A
    /// delivery without JetStream metadata or without a message id is in
    /// the rest (the protocol deals with it); so is every delivery when the
    /// lookup fails or takes longer than [`Pipeline::lookup_wait`].
    pub async fn split_duplicates(
        &self,
        msgs: Vec<Message>,
    ) -> (Vec<(Message, String)>, Vec<Message>) {
        let ids: Vec<Option<String>> = msgs
            .iter()
            .map(|m| {
                m.info().ok()?;
                crate::pipeline::message_id::extract(
                    &self.config.identity,
                    m.headers.as_ref(),
                    &m.payload,
                )
                .ok()
            })
            .collect();
        let found = self.lookup(ids.iter().flatten().map(String::as_str)).await;
        let (mut dups, mut rest) = (Vec::new(), Vec::new());
        for (msg, id) in msgs.into_iter().zip(ids) {
            match id {
                Some(id) if found.contains(&id) => dups.push((msg, id)),
                _ => rest.push(msg),
            }
        }
        (dups, rest)
    }

    /// The message ids among `ids` whose receipts are committed, in one
    /// query (empty when it fails or takes longer than
    /// [`Pipeline::lookup_wait`]). Counted (`idem_receipt_lookups_total`),
    /// and noted in [`CopiesArriving`].
    pub(super) async fn lookup<'a>(&self, ids: impl Iterator<Item = &'a str>) -> HashSet<String> {
        let ids: Vec<&str> = ids.collect();
        if ids.is_empty() {
            return HashSet::new();
        }
        HandlerStats::incr(&self.handler.stats().receipt_lookups);
        let wait = self.lookup_wait();
        let lookup = self.db.existing_receipts(self.name(), &ids);
        let found = match tokio::time::timeout(wait, lookup).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                tracing::debug!(handler = %self.name(), error = %e, "receipt lookup failed; the transactions decide");
                HashSet::new()
            }
            Err(_) => {
                tracing::debug!(handler = %self.name(), "receipt lookup took longer than {wait:?}; the transactions decide");
                HashSet::new()
            }
        };
        self.copies.looked_up(found.len());
        found
    }

    /// How long a lookup may take: [`LOOKUP_WAIT`], or a quarter of
    /// `ack_wait` when that is shorter (the deliveries it holds up have
    /// their `ack_wait` running).
    pub fn lookup_wait(&self) -> Duration {
        LOOKUP_WAIT.min(self.config.ack_wait / 4)
    }

    /// Acks `dups` (copies a lookup found committed receipts for) together
    /// ([`broker::ack_together`]: plain acks, the last confirmed): each is counted
    /// as a delivery, a duplicate and one found by a lookup, and crossed
    /// off `unsettled`.
    pub async fn ack_duplicates(&self, dups: &[(Message, String)], unsettled: &Unsettled) {
        let stats = self.handler.stats();
        for (_, id) in dups {
            HandlerStats::incr(&stats.delivered);
            tracing::debug!(handler = %self.handler.name(), message_id = %id, "receipt found by the lookup; a duplicate without a transaction");
        }
        let copies: Vec<&Message> = dups.iter().map(|(msg, _)| msg).collect();
        if let Err(e) = broker::ack_together(&copies).await {
            for _ in dups {
                HandlerStats::incr(&stats.ack_failures);
            }
            tracing::warn!(handler = %self.handler.name(), copies = dups.len(), error = %e, "acking copies failed; their receipts will absorb the redeliveries");
        }
        for (msg, _) in dups {
            HandlerStats::incr(&stats.duplicates_looked_up);
            self.count(&Attempt::Duplicate, &Outcome::Duplicate);
            unsettled.settled(msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_is_looked_up_only_when_likely_a_copy() {
        assert!(!worth_a_lookup(1, false, false));
        assert!(worth_a_lookup(2, false, false));
        assert!(worth_a_lookup(1, true, false));
        assert!(worth_a_lookup(1, false, true));
    }

    #[test]
    fn copies_arrive_from_a_duplicate_until_a_lookup_finds_none() {
        let c = CopiesArriving::default();
        assert!(!c.now());
        c.found_without_lookup();
        assert!(c.now());
        c.looked_up(3);
        assert!(c.now());
        c.looked_up(0);
        assert!(!c.now());
        // A lookup that finds copies starts a run too.
        c.looked_up(1);
        assert!(c.now());
    }
}
