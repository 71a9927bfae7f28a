//! The retention window (ARCHITECTURE.md invariant 7): receipts of messages
//! published before a cutoff are deleted, in small chunks, by one host at a
//! time.
//!
//! - Each chunk is one `DELETE` of at most `chunk` rows by primary key, chosen
//!   through the `(consumer, published_ms)` index, in its own (autocommit)
//!   transaction: no long locks, no table scan, and the message path (receipt
//!   inserts) only ever waits for one short chunk.
//! - PostgreSQL: a pass runs only while its host holds the session advisory
//!   lock [`PRUNE_LOCK_KEY`] (`pg_try_advisory_lock`, not waiting): scaled-out
//!   hosts never prune side by side; a host that does not get it skips the pass.
//! - SQLite has one writer anyway: [`Database::try_prune_lock`] always succeeds.
//!
//! The cutoff is a Unix ms on the broker's clock, the clock `published_ms`
//! was stamped on; the caller computes it ([`crate::broker::clock::prune_cutoff`]).
//! Neither this host's clock nor the database's takes part.

use super::backend::{Pool as _, PruneLock as _};
use super::{Backend, Database, StoreError, dispatch, postgres, sqlite};
use std::time::Duration;

/// Key of the PostgreSQL session advisory lock held for a prune pass.
pub const PRUNE_LOCK_KEY: i64 = super::advisory::PRUNE;

/// Pause between two full chunks, so other writers (SQLite's single write
/// lock, PostgreSQL's receipt inserts) get their turn during a long backlog.
const CHUNK_PAUSE: Duration = Duration::from_millis(5);

/// What one [`Database::prune_pass`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrunePass {
    /// Another session (another host) holds [`PRUNE_LOCK_KEY`]: nothing deleted.
    Skipped,
    /// Receipts deleted, one count per target, in the targets' order.
    Pruned(Vec<u64>),
}

/// The right to prune, from [`Database::try_prune_lock`]. On PostgreSQL it
/// holds a pooled session that owns the advisory lock; [`PruneLock::release`]
/// unlocks and returns it to the pool. Dropped unreleased (e.g. a task
/// aborted mid-pass), the session is closed, which also releases the lock:
/// a connection holding it never goes back to the pool.
pub struct PruneLock(pub(super) Backend<postgres::PruneLock, sqlite::PruneLock>);

impl PruneLock {
    /// Releases the lock (PostgreSQL: `pg_advisory_unlock`; an unknown
    /// outcome closes the session rather than pooling it).
    ///
    /// # Errors
    /// The unlock failed (the session is closed, which releases the lock).
    pub async fn release(self) -> Result<(), StoreError> {
        Ok(dispatch!(self.0, l => l.release().await)?)
    }
}

impl Database {
    /// Deletes `consumer`'s receipts whose `published_ms` is below
    /// `published_before_ms` (Unix ms, the broker's clock), `chunk` rows per
    /// statement (each its own short transaction) until a statement deletes
    /// fewer than `chunk`. Returns how many were deleted. Takes no lock: see
    /// [`Database::prune_pass`].
    ///
    /// # Errors
    /// A database error, after the chunks before it were deleted.
    pub async fn prune_receipts(
        &self,
        consumer: &str,
        published_before_ms: i64,
        chunk: u32,
    ) -> Result<u64, StoreError> {
        self.prune_receipts_counted(consumer, published_before_ms, chunk, &mut |_| {})
            .await
    }

    /// [`Database::prune_receipts`], calling `deleted` with the running total
    /// after every chunk (progress for `idem receipts prune`).
    ///
    /// # Errors
    /// A database error, after the chunks before it were deleted.
    pub async fn prune_receipts_counted(
        &self,
        consumer: &str,
        published_before_ms: i64,
        chunk: u32,
        deleted: &mut (dyn FnMut(u64) + Send),
    ) -> Result<u64, StoreError> {
        let chunk = chunk.max(1);
        let mut total = 0u64;
        loop {
            let n =
                dispatch!(&self.0, b => b.prune_chunk(consumer, published_before_ms, chunk).await)?;
            total += n;
            deleted(total);
            if n < u64::from(chunk) {
                return Ok(total);
            }
            tokio::time::sleep(CHUNK_PAUSE).await;
        }
    }

    /// Tries to become the one pruner of this database, without waiting.
    /// `Ok(None)`: another session holds the lock (PostgreSQL only).
    ///
    /// # Errors
    /// No connection, or the lock query fails.
    pub async fn try_prune_lock(&self) -> Result<Option<PruneLock>, StoreError> {
        Ok(dispatch!(&self.0, b, wrap => b.try_prune_lock().await?.map(|l| PruneLock(wrap(l)))))
    }

    /// One pruning pass: under [`Database::try_prune_lock`] (skipped when
    /// another host holds it), [`Database::prune_receipts`] for every
    /// `(consumer, published_before_ms)` target.
    ///
    /// # Errors
    /// A database error; the lock is released when the pass ends either way.
    pub async fn prune_pass(
        &self,
        targets: &[(&str, i64)],
        chunk: u32,
    ) -> Result<PrunePass, StoreError> {
        self.prune_pass_counted(targets, chunk, &mut |_, _| {})
            .await
    }

    /// [`Database::prune_pass`], calling `deleted` with the target's index
    /// and its running total after every chunk.
    ///
    /// # Errors
    /// As [`Database::prune_pass`].
    pub async fn prune_pass_counted(
        &self,
        targets: &[(&str, i64)],
        chunk: u32,
        deleted: &mut (dyn FnMut(usize, u64) + Send),
    ) -> Result<PrunePass, StoreError> {
        let Some(lock) = self.try_prune_lock().await? else {
            return Ok(PrunePass::Skipped);
        };
        let mut pruned = Vec::with_capacity(targets.len());
        for (i, (consumer, published_before_ms)) in targets.iter().enumerate() {
            pruned.push(
                self.prune_receipts_counted(consumer, *published_before_ms, chunk, &mut |n| {
                    deleted(i, n)
                })
                .await?,
            );
        }
        lock.release().await?;
        Ok(PrunePass::Pruned(pruned))
    }
}
