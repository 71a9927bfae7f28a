//! What a [`super::Runtime`] is made with, and the one engine setting
//! derived from it that bounds memory: how many freed regions (memories
//! and tables) the pooling allocator may keep resident before resetting
//! them together
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
    /// The most bytes of freed guest memory that may stay resident while
    /// they wait to be reset together ([`decommit_batch`]). Default
    /// [`DECOMMIT_BUDGET_BYTES`].
    pub decommit_budget_bytes: usize,
    /// The most code one component may bring to compile.
    pub compile: CompileLimits,
    /// Whether traps name their source line from the component's DWARF
    /// (`[runtime] trap_source_lines`). Default true.
    pub trap_source_lines: bool,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            capacity: super::DEFAULT_CAPACITY,
            cache_dir: None,
            largest_memory_bytes: super::Limits::default().max_memory_bytes,
            decommit_budget_bytes: DECOMMIT_BUDGET_BYTES,
            compile: CompileLimits::default(),
            trap_source_lines: true,
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
            decommit_budget_bytes: (config.runtime.freed_memory_mib as usize)
                .saturating_mul(1 << 20),
            compile: config.runtime.compile_limits(),
            trap_source_lines: config.runtime.trap_source_lines,
        }
    }
}

/// The most bytes of freed guest memory the pooling allocator may keep
/// resident while it waits to reset them in one batch, by default
/// (`[runtime] freed_memory_mib`): 256 MiB.
pub const DECOMMIT_BUDGET_BYTES: usize = 256 << 20;

/// The largest decommit batch: past 32, one reset per batch saves nothing
/// measurable (docs/benchmarks.md, "Throughput").
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
/// freed memories waiting in every queue stay within `budget_bytes`. A
/// queue holds at most `batch - 1` freed regions (the one that fills it
/// resets them all), and a region is at most one memory (wasmtime counts
/// each freed memory and each freed table as a region), so what waits is
/// at most `queues × (batch - 1) × largest_memory_bytes`.
pub fn decommit_batch(largest_memory_bytes: usize, queues: usize, budget_bytes: usize) -> usize {
    let per_slot = largest_memory_bytes.max(1).saturating_mul(queues.max(1));
    (budget_bytes / per_slot)
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
        let budget = DECOMMIT_BUDGET_BYTES;
        assert_eq!(decommit_batch(64 * MIB, 2, budget), 3);
        assert_eq!(decommit_batch(64 * MIB, 1, budget), 5);
        assert_eq!(decommit_batch(64 * MIB, 2, 1024 * MIB), 9);
        // No budget: every freed memory is reset at once.
        assert_eq!(decommit_batch(64 * MIB, 2, 0), 1);
        // Small guests keep the full batch.
        assert_eq!(decommit_batch(MIB, 2, budget), MAX_DECOMMIT_BATCH);
        // Large guests, many CPUs: every freed memory is reset at once.
        assert_eq!(decommit_batch(1024 * MIB, 16, budget), 1);
        assert_eq!(decommit_batch(usize::MAX, 16, budget), 1);
        assert_eq!(decommit_batch(0, 0, budget), MAX_DECOMMIT_BATCH);
        for budget in [0, MIB, 256 * MIB, 4096 * MIB] {
            for mib in [1, 8, 33, 64, 100, 128, 256, 4096] {
                for queues in 1..=16 {
                    let batch = decommit_batch(mib * MIB, queues, budget);
                    assert!((1..=MAX_DECOMMIT_BATCH).contains(&batch));
                    assert!(
                        queues * (batch - 1) * mib * MIB <= budget,
                        "{mib} MiB, {queues} queues: batch {batch}"
                    );
                    // And it is the largest such batch (up to the cap).
                    if batch < MAX_DECOMMIT_BATCH {
                        assert!(queues * batch * mib * MIB > budget);
                    }
                }
            }
        }
    }
}
