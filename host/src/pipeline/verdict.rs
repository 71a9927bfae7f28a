//! What a delivery's attempt came to, and what to do about it: the
//! protocol's decision table (ARCHITECTURE.md, "The protocol"), written once
//! and free of I/O so it is tested without a broker or a database.
//!
//! ```text
//! Attempt                                   Verdict
//! no message_id / beyond the horizon       →  dead letter
//! duplicate (receipt exists)             →  ack (duplicate)
//! committed                              →  ack (processed)
//! guest rejected                         →  dead letter
//! guest retry / trap / failed DB step    →  nak after the backoff delay,
//!                                           or dead letter on delivery max_deliver
//! ```
//!
//! A database that cannot be reached is not an attempt: the pipeline holds
//! the delivery and runs it again (nothing is acked, naked or termed).

use crate::runtime::HandlerFailure;
use std::time::Duration;

/// How one run of the transaction step ended, before anything was said to
/// the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The message has no message_id under the handler's rule; why.
    NoMessageId(String),
    /// The receipt already existed: the effect is there, nothing was run.
    Duplicate,
    /// No receipt, and refused before any guest code, for the reason
    /// given: published longer ago than the retention window
    /// (`beyond-horizon: …`: it cannot be proven new), or older than a
    /// message already applied for its key (`out-of-order: …`,
    /// `refuse_out_of_order`).
    Refused(String),
    /// The guest succeeded and the transaction committed.
    Committed,
    /// The guest returned `retry` or `reject`, or trapped (deadline, limit,
    /// panic); rolled back.
    GuestFailed(HandlerFailure),
    /// A database step failed for a reason other than an outage (a
    /// constraint checked at COMMIT, say); rolled back. `step` names it.
    StoreFailed {
        /// The step that failed (`BEGIN`, `COMMIT`, …).
        step: &'static str,
        /// The database's error, one line.
        error: String,
    },
}

/// What to do with the delivery, decided by [`decide`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Ack: the receipt recognised a copy whose effect is already committed.
    Duplicate,
    /// Ack: this delivery's effect committed.
    Processed,
    /// Nak, to be delivered again after `delay`.
    Retry {
        /// Why, for the logs.
        reason: String,
        /// The nak delay.
        delay: Duration,
    },
    /// Write a durable dead letter (with the message id unless
    /// `without_message_id`), then term.
    DeadLetter {
        /// The reason stored with the dead letter.
        reason: String,
        /// The message had no usable message id: store it without one.
        without_message_id: bool,
    },
}

/// The delivery an attempt was made on, as [`decide`] needs it.
#[derive(Debug, Clone, Copy)]
pub struct DeliveryCount {
    /// JetStream's delivery count, 1-based.
    pub delivered: u64,
    /// The handler's `max_deliver`: the last delivery idem allows.
    pub max_deliver: u32,
}

/// The protocol's decision for `attempt` on a delivery counted `count`;
/// `delay` is the handler's nak delay for that delivery
/// ([`crate::config::HandlerConfig::nak_delay`]).
pub fn decide(attempt: &Attempt, count: DeliveryCount, delay: Duration) -> Verdict {
    let dead_letter = |reason: String| Verdict::DeadLetter {
        reason,
        without_message_id: false,
    };
    let retry = |reason: String| {
        if count.delivered >= u64::from(count.max_deliver) {
            // Past it JetStream would stop delivering without telling anyone.
            dead_letter(format!(
                "{reason} (delivery {} of max_deliver {})",
                count.delivered, count.max_deliver
            ))
        } else {
            Verdict::Retry { reason, delay }
        }
    };
    match attempt {
        Attempt::NoMessageId(reason) => Verdict::DeadLetter {
            reason: reason.clone(),
            without_message_id: true,
        },
        Attempt::Duplicate => Verdict::Duplicate,
        Attempt::Refused(reason) => dead_letter(reason.clone()),
        Attempt::Committed => Verdict::Processed,
        Attempt::GuestFailed(failure) if failure.is_permanent() => dead_letter(failure.reason()),
        Attempt::GuestFailed(failure) => retry(failure.reason()),
        Attempt::StoreFailed { step, error } => retry(format!("{step} failed: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: Duration = Duration::from_millis(250);

    fn on(delivered: u64, max_deliver: u32) -> DeliveryCount {
        DeliveryCount {
            delivered,
            max_deliver,
        }
    }

    fn dead(reason: &str) -> Verdict {
        Verdict::DeadLetter {
            reason: reason.into(),
            without_message_id: false,
        }
    }

    fn retry(reason: &str) -> Verdict {
        Verdict::Retry {
            reason: reason.into(),
            delay: DELAY,
        }
    }

    #[test]
    fn the_decision_table() {
        let guest = |f: HandlerFailure| Attempt::GuestFailed(f);
        let store = Attempt::StoreFailed {
            step: "COMMIT",
            error: "deferred FK".into(),
        };
        let cases: Vec<(Attempt, DeliveryCount, Verdict)> = vec![
            (Attempt::Committed, on(1, 5), Verdict::Processed),
            (Attempt::Committed, on(5, 5), Verdict::Processed),
            (Attempt::Duplicate, on(1, 5), Verdict::Duplicate),
            (Attempt::Duplicate, on(9, 5), Verdict::Duplicate),
            (
                Attempt::NoMessageId("no header Nats-Msg-Id".into()),
                on(1, 5),
                Verdict::DeadLetter {
                    reason: "no header Nats-Msg-Id".into(),
                    without_message_id: true,
                },
            ),
            (
                Attempt::Refused("beyond-horizon: published 2h ago".into()),
                on(1, 5),
                dead("beyond-horizon: published 2h ago"),
            ),
            (
                guest(HandlerFailure::Reject("bad account".into())),
                on(1, 5),
                dead("rejected: bad account"),
            ),
            (
                guest(HandlerFailure::Retry("not yet".into())),
                on(1, 5),
                retry("retry: not yet"),
            ),
            (
                guest(HandlerFailure::Retry("not yet".into())),
                on(4, 5),
                retry("retry: not yet"),
            ),
            (
                guest(HandlerFailure::Retry("not yet".into())),
                on(5, 5),
                dead("retry: not yet (delivery 5 of max_deliver 5)"),
            ),
            (
                guest(HandlerFailure::Trap("deadline".into())),
                on(1, 2),
                retry("trap: deadline"),
            ),
            (
                guest(HandlerFailure::Trap("deadline".into())),
                on(2, 2),
                dead("trap: deadline (delivery 2 of max_deliver 2)"),
            ),
            (
                guest(HandlerFailure::Trap("deadline".into())),
                on(1, 1),
                dead("trap: deadline (delivery 1 of max_deliver 1)"),
            ),
            (store.clone(), on(1, 3), retry("COMMIT failed: deferred FK")),
            (
                store,
                on(3, 3),
                dead("COMMIT failed: deferred FK (delivery 3 of max_deliver 3)"),
            ),
        ];
        for (attempt, count, want) in cases {
            assert_eq!(
                decide(&attempt, count, DELAY),
                want,
                "{attempt:?} on delivery {} of {}",
                count.delivered,
                count.max_deliver
            );
        }
    }
}
