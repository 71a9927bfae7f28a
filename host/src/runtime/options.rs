//! What a [`super::Runtime`] is made with, and the one engine setting
//! derived from it that bounds memory: how many freed instances the pooling
//! allocator may keep resident before resetting them together
//! (ARCHITECTURE.md, "Memory of guests").

use super::code_size::CompileLimits;
use std::path::PathBuf;

/// How to make a [`super::Runtime`] ([`super::Runtime::with_options`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Guest calls that may run at once (the pooling allocator's instances).
    /// Default [`super::DEFAULT_CAPACITY`]; at least 1.
    pub capacity: u32,
    /// wasmtime's compiled-code cache directory, checked as
    /// [`super::Runtime::with_cache`] says. Default `None`: no cache.
    pub cache_dir: Option<PathBuf>,
    /// The largest linear memory any guest of this runtime may grow to, in
    /// bytes (the largest handler's `max_memory_mib`): what the decommit
    /// batch is sized on ([`decommit_batch`]). Default 64 MiB, the
    /// handlers' default.
    pub largest_memory_bytes: usize,
    /// The most code one component may bring to compile.
    pub compile: CompileLimits,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            capacity: super::DEFAULT_CAPACITY,
            cache_dir: None,
            largest_memory_bytes: super::Limits::default().max_memory_bytes,
            compile: CompileLimits::default(),
        }
    }
}

impl RuntimeOptions {
    /// The options of `config`: its `[runtime]` cache and compile limits,
    /// and its handlers' largest `max_memory_mib`, for a runtime of
    /// `capacity` instances.
    pub fn of(config: &crate::config::Config, capacity: u32) -> Self {
        let largest_mib = config
            .handlers
            .iter()
            .map(|h| h.max_memory_mib)
            .max()
            .unwrap_or(64);
        Self {
            capacity,
            cache_dir: config.runtime.effective_cache_dir(),
            largest_memory_bytes: (largest_mib as usize).saturating_mul(1 << 20),
            compile: config.runtime.compile_limits(),
        }
    }
}

/// The most bytes of freed guest memory the pooling allocator may keep
/// resident while it waits to reset them in one batch: 256 MiB.
pub const DECOMMIT_BUDGET_BYTES: usize = 256 << 20;

/// The largest decommit batch: past 32, one reset per batch saves nothing
/// measurable (README, "Throughput").
pub const MAX_DECOMMIT_BATCH: usize = 32;

/// How many queues wasmtime's pooling allocator keeps freed instances in
/// (one per CPU, at most 16; each fills its batch on its own): the number
/// of CPUs this process may use, at most 16.
pub fn decommit_queues() -> usize {
    std::thread::available_parallelism()
        .map(std::num::NonZero::get)
        .unwrap_or(1)
        .min(16)
}

/// The pooling allocator's `decommit_batch_size` for guests whose memories
/// are at most `largest_memory_bytes`, with `queues` queues: the largest
/// batch, at most [`MAX_DECOMMIT_BATCH`] and at least 1, for which the
/// freed memories waiting in every queue stay within
/// [`DECOMMIT_BUDGET_BYTES`]. A queue holds at most `batch - 1` freed
/// memories (the one that fills it resets them all), so what waits is at
/// most `queues × (batch - 1) × largest_memory_bytes`.
pub fn decommit_batch(largest_memory_bytes: usize, queues: usize) -> usize {
    let per_slot = largest_memory_bytes.max(1).saturating_mul(queues.max(1));
    (DECOMMIT_BUDGET_BYTES / per_slot)
        .saturating_add(1)
        .clamp(1, MAX_DECOMMIT_BATCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn the_batch_keeps_what_waits_within_the_budget() {
        // Two CPUs, 64 MiB guests: 2 waiting per queue, 256 MiB in all.
        assert_eq!(decommit_batch(64 * MIB, 2), 3);
        assert_eq!(decommit_batch(64 * MIB, 1), 5);
        // Small guests keep the full batch.
        assert_eq!(decommit_batch(MIB, 2), MAX_DECOMMIT_BATCH);
        // Large guests, many CPUs: every freed memory is reset at once.
        assert_eq!(decommit_batch(1024 * MIB, 16), 1);
        assert_eq!(decommit_batch(usize::MAX, 16), 1);
        assert_eq!(decommit_batch(0, 0), MAX_DECOMMIT_BATCH);
        for mib in [1, 8, 33, 64, 100, 128, 256, 4096] {
            for queues in 1..=16 {
                let batch = decommit_batch(mib * MIB, queues);
                assert!((1..=MAX_DECOMMIT_BATCH).contains(&batch));
                assert!(
                    queues * (batch - 1) * mib * MIB <= DECOMMIT_BUDGET_BYTES,
                    "{mib} MiB, {queues} queues: batch {batch}"
                );
                // And it is the largest such batch (up to the cap).
                if batch < MAX_DECOMMIT_BATCH {
                    assert!(queues * batch * mib * MIB > DECOMMIT_BUDGET_BYTES);
                }
            }
        }
    }
}
