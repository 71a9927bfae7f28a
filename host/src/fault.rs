//! Test-only fault points, compiled in only with the `fault-injection` feature
//! (never in a release build users run). `IDEM_FAULT=abort-after-commit:N`
//! aborts the process right after the N-th commit, before its ack: the
//! "crash after commit, lost ack" case of seed 000.

/// Called by the pipeline right after a successful COMMIT and before the ack.
#[cfg(feature = "fault-injection")]
pub fn after_commit() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COMMITS: AtomicU64 = AtomicU64::new(0);
    let Ok(spec) = std::env::var("IDEM_FAULT") else {
        return;
    };
    let Some(n) = spec
        .strip_prefix("abort-after-commit:")
        .and_then(|n| n.parse::<u64>().ok())
    else {
        return;
    };
    if COMMITS.fetch_add(1, Ordering::SeqCst) + 1 == n {
        eprintln!("idem: fault point abort-after-commit:{n} reached; aborting");
        std::process::abort();
    }
}

/// Without the `fault-injection` feature this is a no-op the compiler removes.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn after_commit() {}
