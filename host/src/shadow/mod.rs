//! Shadow deploys (ARCHITECTURE.md, "Shadow deploys"): a candidate version
//! of a handler runs next to the live one on a sample of real messages,
//! inside the live transaction but in a savepoint that is always rolled
//! back, and what the two did is compared. Nothing the candidate does is
//! committed, acked or published.
//!
//! - [`record`]: the signed record `idem deploy --shadow` writes to the
//!   shadows bucket;
//! - [`follow`]: how a host puts a believed record's candidate in its
//!   handler's [`ShadowSlot`], or takes it out;
//! - [`compare`]: what the two runs are compared on;
//! - the pipeline's side is [`crate::pipeline::shadow_run`].
//!
//! Each host counts for itself; its report to the hosts bucket carries a
//! [`ShadowReport`] per handler with a shadow, and `idem deploy HANDLER
//! --shadow-report` adds them up.

pub mod compare;
pub mod follow;
pub mod record;

use crate::runtime::HandlerComponent;
use arc_swap::ArcSwapOption;
use compare::Divergence;
use record::{ALL_PPM, ShadowRecord};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex, MutexGuard};

/// The most divergent messages a host keeps per handler (the first ones).
pub const MAX_KEPT_DIVERGENCES: usize = 5;

/// The most message ids a slot remembers as spoiled ([`ShadowSlot::spoil`]).
pub const MAX_SPOILED: usize = 1024;

/// After this many lost transactions a candidate is taken out (each costs
/// the live path its share of time and a second transaction).
pub const MAX_LOST: u64 = 16;

/// The most bytes of JSON one handler's [`ShadowReport`] takes in a host's
/// report: the divergences kept last are left out of it past this (the
/// host's whole report is bounded too,
/// [`crate::deploy::heartbeat::MAX_SHADOW_BYTES`]).
pub const MAX_REPORT_BYTES: usize = 16 * 1024;

/// A candidate in place: its component and the record it came from.
pub struct Candidate {
    /// The loaded candidate.
    pub component: Arc<HandlerComponent>,
    /// Its believed record.
    pub record: ShadowRecord,
    /// The shadows bucket's revision of the record.
    pub revision: u64,
}

/// Why a sampled message was not compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The candidate would have run past the time the transaction may
    /// give it, or ran out of it ([`crate::pipeline::shadow_run`]).
    Time,
    /// A candidate or live statement lost a lock conflict with another
    /// transaction (PostgreSQL): the message runs again.
    Conflict,
}

/// What came of one sampled message, counted once its transaction's fate
/// is known ([`ShadowSlot::count`]): a message whose transaction is rolled
/// back for another message's sake and runs again is counted once.
pub enum Judged {
    /// Compared: agreed (`None`) or the divergence.
    Compared(Arc<Candidate>, Option<Box<Divergence>>),
    /// Not compared.
    Skipped(Arc<Candidate>, Skip),
}

/// One handler's shadow: the candidate in place (if any) and what came of
/// it on this host.
pub struct ShadowSlot {
    /// The handler's name (the metrics' label).
    handler: String,
    candidate: ArcSwapOption<Candidate>,
    tally: Mutex<Tally>,
    /// Messages whose transaction a candidate lost: they run without it.
    spoiled: Mutex<std::collections::VecDeque<String>>,
}

/// What a host counted for one candidate.
#[derive(Debug, Clone, Default)]
struct Tally {
    /// The record counted for: digest and revision.
    of: Option<(String, u64)>,
    compared: u64,
    agreed: u64,
    diverged: u64,
    skipped: u64,
    /// Transactions the candidate lost ([`ShadowSlot::spoil`]).
    lost: u64,
    divergences: Vec<Divergence>,
    /// A record this host would not run: its digest (or `revision N`) and
    /// why.
    refused: Option<(String, String)>,
}

impl ShadowSlot {
    /// `handler`'s slot, empty: no candidate.
    pub fn new(handler: &str) -> Self {
        ShadowSlot {
            handler: handler.to_owned(),
            candidate: ArcSwapOption::empty(),
            tally: Mutex::default(),
            spoiled: Mutex::default(),
        }
    }

    fn tally(&self) -> MutexGuard<'_, Tally> {
        // A poisoned lock only means a panic while counting: keep counting.
        self.tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The candidate in place, if any.
    pub fn current(&self) -> Option<Arc<Candidate>> {
        self.candidate.load_full()
    }

    /// The candidate to run next to `live_digest` for message `message_id`:
    /// one is in place, it was deployed against `live_digest`, and the
    /// message is in its sample ([`sampled`]).
    pub fn pick(&self, live_digest: &str, message_id: &str) -> Option<Arc<Candidate>> {
        let c = self.candidate.load();
        let c = c.as_ref()?;
        if c.record.against != live_digest || !sampled(message_id, c.record.sample_ppm) {
            return None;
        }
        let spoiled = self
            .spoiled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (!spoiled.iter().any(|id| id == message_id)).then(|| c.clone())
    }

    /// `candidate` lost the transaction of message `message_id` (SQLite
    /// rolls a whole transaction back when a write statement is
    /// interrupted, as at the candidate's deadline): counted as skipped,
    /// and the message runs without a candidate from now on (the last
    /// [`MAX_SPOILED`] such messages are remembered).
    /// After [`MAX_LOST`] of them the candidate is taken out, refused.
    pub fn spoil(&self, candidate: &Candidate, message_id: &str) {
        self.skipped(candidate, Skip::Time);
        {
            let mut t = self.tally();
            if counts_for(&t, candidate) {
                t.lost += 1;
                if t.lost >= MAX_LOST && t.refused.is_none() {
                    let reason = format!(
                        "lost {MAX_LOST} of its messages' transactions (on SQLite a write past its time takes the transaction with it); taken out: give the handler a longer deadline, or abort the shadow"
                    );
                    tracing::warn!(handler = %self.handler, candidate = %candidate.record.digest, "{reason}");
                    t.refused = Some((candidate.record.digest.clone(), reason));
                    self.candidate.store(None);
                }
            }
        }
        let mut spoiled = self
            .spoiled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if spoiled.len() >= MAX_SPOILED {
            spoiled.pop_front();
        }
        spoiled.push_back(message_id.to_owned());
    }

    /// Puts `candidate` in place; its counts start at zero unless it is the
    /// record already counted for.
    pub fn put(&self, candidate: Candidate) {
        let of = (candidate.record.digest.clone(), candidate.revision);
        let mut t = self.tally();
        if t.of.as_ref() != Some(&of) {
            *t = Tally {
                of: Some(of),
                ..Tally::default()
            };
        }
        t.refused = None;
        self.candidate.store(Some(Arc::new(candidate)));
    }

    /// Takes the candidate out and forgets its counts (the record was
    /// deleted: promoted or aborted).
    pub fn clear(&self) {
        self.candidate.store(None);
        *self.tally() = Tally::default();
    }

    /// The record `what` (a digest, or `revision N`) is not run: why. The
    /// candidate in place, if any, is taken out. Returns whether this is
    /// news (another record or reason than the last refusal).
    pub fn refuse(&self, what: &str, reason: &str) -> bool {
        self.candidate.store(None);
        let mut t = self.tally();
        let refused = Some((what.to_owned(), reason.to_owned()));
        if t.refused == refused {
            return false;
        }
        *t = Tally {
            refused,
            ..Tally::default()
        };
        true
    }

    /// The refusal remembered, if any: (digest or `revision N`, why).
    pub fn refused(&self) -> Option<(String, String)> {
        self.tally().refused.clone()
    }

    /// Counts what came of the sampled messages of a transaction whose
    /// fate is known (it committed, or its message failed for itself).
    pub fn count(&self, judged: Vec<Judged>) {
        for j in judged {
            match j {
                Judged::Compared(c, divergence) => self.compared(&c, divergence.map(|d| *d)),
                Judged::Skipped(c, why) => self.skipped(&c, why),
            }
        }
    }

    /// Counts a compared message of `candidate`: agreed when `divergence`
    /// is `None`, else diverged, and kept while fewer than
    /// [`MAX_KEPT_DIVERGENCES`] are.
    pub fn compared(&self, candidate: &Candidate, divergence: Option<Divergence>) {
        let mut t = self.tally();
        if !counts_for(&t, candidate) {
            return;
        }
        t.compared += 1;
        let result = if divergence.is_some() {
            "diverged"
        } else {
            "agreed"
        };
        crate::metrics::shadow_message(&self.handler, result);
        match divergence {
            None => t.agreed += 1,
            Some(d) => {
                t.diverged += 1;
                if t.divergences.len() < MAX_KEPT_DIVERGENCES {
                    t.divergences.push(d);
                }
            }
        }
    }

    /// Counts a sampled message of `candidate` that was not compared.
    pub fn skipped(&self, candidate: &Candidate, why: Skip) {
        let mut t = self.tally();
        if counts_for(&t, candidate) {
            t.skipped += 1;
            crate::metrics::shadow_message(&self.handler, "skipped");
            tracing::debug!(?why, "shadow run skipped");
        }
    }

    /// This host's report, `None` when there is no candidate and no
    /// refusal. `live_digest`: what the handler runs now.
    pub fn report(&self, live_digest: &str) -> Option<ShadowReport> {
        let c = self.current();
        let t = self.tally().clone();
        if c.is_none() && t.refused.is_none() {
            return None;
        }
        let (candidate, against, sample_ppm, revision) = match &c {
            Some(c) => (
                c.record.digest.clone(),
                c.record.against.clone(),
                c.record.sample_ppm,
                c.revision,
            ),
            None => (String::new(), String::new(), 0, 0),
        };
        let mut report = ShadowReport {
            active: c.is_some() && against == live_digest,
            candidate,
            against,
            sample_ppm,
            revision,
            compared: t.compared,
            agreed: t.agreed,
            diverged: t.diverged,
            skipped: t.skipped,
            refused: t.refused,
            divergences: t.divergences,
        };
        while !report.divergences.is_empty()
            && serde_json::to_vec(&report).map_or(0, |v| v.len()) > MAX_REPORT_BYTES
        {
            report.divergences.pop();
        }
        Some(report)
    }
}

fn counts_for(t: &Tally, c: &Candidate) -> bool {
    t.of.as_ref()
        .is_some_and(|(d, r)| *d == c.record.digest && *r == c.revision)
}

/// Whether message `message_id` is in a sample of `ppm` parts per million:
/// the first four bytes of its id's SHA-256, as a number, fall below that
/// share of their range. The same id is in or out on every host and on
/// every delivery.
pub fn sampled(message_id: &str, ppm: u32) -> bool {
    if ppm >= ALL_PPM {
        return true;
    }
    let h = Sha256::digest(message_id.as_bytes());
    let n = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    u64::from(n) * u64::from(ALL_PPM) < u64::from(ppm) << 32
}

/// What one host reports of one handler's shadow (part of its
/// [`crate::deploy::heartbeat::HandlerReport`], signed with it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowReport {
    /// The candidate's digest (empty when none is in place).
    pub candidate: String,
    /// The live digest the shadow was deployed against.
    pub against: String,
    /// The sample, in parts per million.
    pub sample_ppm: u32,
    /// The shadows bucket's revision of the record.
    pub revision: u64,
    /// Whether the candidate runs: it is in place and the handler runs
    /// the version it was deployed against.
    pub active: bool,
    /// Sampled messages whose two runs were compared.
    pub compared: u64,
    /// Of those, the ones on which both did the same.
    pub agreed: u64,
    /// Of those, the ones on which they did not.
    pub diverged: u64,
    /// Sampled messages not compared ([`Skip`]).
    pub skipped: u64,
    /// A shadow record this host does not run: its digest (or `revision
    /// N`) and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<(String, String)>,
    /// The first divergent messages, at most [`MAX_KEPT_DIVERGENCES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub divergences: Vec<Divergence>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_sample_takes_about_its_share_and_the_same_ids_everywhere() {
        let ids: Vec<String> = (0..20_000).map(|i| format!("msg-{i}")).collect();
        let count = |ppm| ids.iter().filter(|id| sampled(id, ppm)).count();
        assert_eq!(count(ALL_PPM), 20_000);
        assert_eq!(count(0), 0);
        let quarter = count(250_000);
        assert!((4_700..5_300).contains(&quarter), "{quarter}");
        // Deterministic: a smaller sample is a subset of a larger one.
        for id in &ids {
            if sampled(id, 100_000) {
                assert!(sampled(id, 250_000));
            }
        }
    }
}
