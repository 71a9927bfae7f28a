//! Test-only fault points, compiled in only with the `fault-injection` feature
//! (never in a release build users run). `IDEM_FAULT` is a comma-separated
//! list of:
//!
//! - `abort-after-commit:N`: abort the process right after the N-th commit,
//!   before its ack (the "crash after commit, lost ack" case);
//! - `drop-ack:P`: skip the ack after a commit for P percent (0–100) of
//!   commits, chosen deterministically by commit number (a lost ack: the
//!   broker redelivers after `ack_wait` and the receipt absorbs it);
//! - `abort-after-send:N`: abort right after the relay's N-th successful
//!   outbox send, before its row is deleted (the "sent, not marked" case:
//!   the row is sent again after its lease, with the same id).

/// What the pipeline does after a successful COMMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCommit {
    /// Ack as usual.
    Ack,
    /// Skip the ack (fault `drop-ack`).
    DropAck,
}

/// Called by the pipeline right after a successful COMMIT and before the ack.
#[cfg(feature = "fault-injection")]
pub fn after_commit() -> AfterCommit {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COMMITS: AtomicU64 = AtomicU64::new(0);
    let Ok(spec) = std::env::var("IDEM_FAULT") else {
        return AfterCommit::Ack;
    };
    let n = COMMITS.fetch_add(1, Ordering::SeqCst) + 1;
    let mut outcome = AfterCommit::Ack;
    for item in spec.split(',').map(str::trim) {
        if let Some(at) = item
            .strip_prefix("abort-after-commit:")
            .and_then(|v| v.parse::<u64>().ok())
            && n == at
        {
            eprintln!("idem: fault point abort-after-commit:{at} reached; aborting");
            std::process::abort();
        }
        if let Some(percent) = item
            .strip_prefix("drop-ack:")
            .and_then(|v| v.parse::<u64>().ok())
        {
            // Spread the dropped acks over the commits (a multiplicative hash
            // of the commit number), the same for every run.
            let bucket = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
            if bucket % 100 < percent {
                outcome = AfterCommit::DropAck;
            }
        }
    }
    outcome
}

/// Without the `fault-injection` feature this is a constant the compiler folds.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn after_commit() -> AfterCommit {
    AfterCommit::Ack
}

/// Called by the outbox relay right after a send succeeded and before its
/// row is deleted.
#[cfg(feature = "fault-injection")]
pub fn after_send() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SENDS: AtomicU64 = AtomicU64::new(0);
    let Ok(spec) = std::env::var("IDEM_FAULT") else {
        return;
    };
    let n = SENDS.fetch_add(1, Ordering::SeqCst) + 1;
    for item in spec.split(',').map(str::trim) {
        if let Some(at) = item
            .strip_prefix("abort-after-send:")
            .and_then(|v| v.parse::<u64>().ok())
            && n == at
        {
            eprintln!("idem: fault point abort-after-send:{at} reached; aborting");
            std::process::abort();
        }
    }
}

/// Without the `fault-injection` feature this does nothing.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn after_send() {}
