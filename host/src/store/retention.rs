//! The retention window (ARCHITECTURE.md invariant 7): receipts of messages
//! published before a cutoff are deleted, in small batches, by one host at a
//! time.
//!
//! - Each batch is one `DELETE` of at most `batch` rows by primary key, chosen
//!   through the `(consumer, published_ms)` index, in its own (autocommit)
//!   transaction: no long locks, no table scan, and the message path (receipt
//!   inserts) only ever waits for one short batch.
//! - PostgreSQL: a pass runs only while its host holds the session advisory
//!   lock [`PRUNE_LOCK_KEY`] (`pg_try_advisory_lock`, not waiting): scaled-out
//!   hosts never prune side by side; a host that does not get it skips the pass.
//! - SQLite has one writer anyway: [`Database::try_prune_lock`] always succeeds.
//!
//! The cutoff is a Unix ms on the broker's clock, the clock `published_ms`
//! was stamped on; the caller computes it ([`crate::broker_clock::prune_cutoff`]).
//! Neither this host's clock nor the database's takes part.

use super::{Database, StoreError};
use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use std::time::Duration;

/// Key of the PostgreSQL session advisory lock held for a prune pass.
pub const PRUNE_LOCK_KEY: i64 = super::advisory::PRUNE;

/// Pause between two full batches, so other writers (SQLite's single write
/// lock, PostgreSQL's receipt inserts) get their turn during a long backlog.
const BATCH_PAUSE: Duration = Duration::from_millis(5);

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
pub struct PruneLock {
    conn: Option<PoolConnection<Postgres>>,
}

impl PruneLock {
    /// Releases the lock (PostgreSQL: `pg_advisory_unlock`).
    pub async fn release(mut self) -> Result<(), StoreError> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        let unlocked = sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock($1)")
            .bind(PRUNE_LOCK_KEY)
            .fetch_one(&mut *conn)
            .await;
        match unlocked {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => {
                // Unknown state: close the session rather than pool it.
                conn.close_on_drop();
                unlocked.map(|_| ()).map_err(StoreError::from)
            }
        }
    }
}

impl Drop for PruneLock {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
    }
}

impl Database {
    /// Deletes `consumer`'s receipts whose `published_ms` is below
    /// `published_before_ms` (Unix ms, the broker's clock), `batch` rows per
    /// statement (each its own short transaction) until a statement deletes
    /// fewer than `batch`. Returns how many were deleted. Takes no lock: see
    /// [`Database::prune_pass`].
    ///
    /// # Errors
    /// A database error, after the batches before it were deleted.
    pub async fn prune_receipts(
        &self,
        consumer: &str,
        published_before_ms: i64,
        batch: u32,
    ) -> Result<u64, StoreError> {
        let batch = batch.max(1);
        let mut total = 0u64;
        loop {
            let deleted = match self {
                Database::Postgres(pool) => sqlx::query(
                    "DELETE FROM idem_receipts WHERE consumer = $1 AND message_id IN (
                         SELECT message_id FROM idem_receipts
                         WHERE consumer = $1 AND published_ms < $2
                         LIMIT $3)",
                )
                .bind(consumer)
                .bind(published_before_ms)
                .bind(i64::from(batch))
                .execute(pool)
                .await?
                .rows_affected(),
                Database::Sqlite(pool) => sqlx::query(
                    "DELETE FROM idem_receipts WHERE consumer = $1 AND message_id IN (
                         SELECT message_id FROM idem_receipts
                         WHERE consumer = $1 AND published_ms < $2
                         LIMIT $3)",
                )
                .bind(consumer)
                .bind(published_before_ms)
                .bind(i64::from(batch))
                .execute(pool)
                .await?
                .rows_affected(),
            };
            total += deleted;
            if deleted < u64::from(batch) {
                return Ok(total);
            }
            tokio::time::sleep(BATCH_PAUSE).await;
        }
    }

    /// Tries to become the one pruner of this database, without waiting.
    /// `Ok(None)`: another session holds the lock (PostgreSQL only).
    pub async fn try_prune_lock(&self) -> Result<Option<PruneLock>, StoreError> {
        match self {
            Database::Sqlite(_) => Ok(Some(PruneLock { conn: None })),
            Database::Postgres(pool) => {
                let mut conn = pool.acquire().await?;
                let got = sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
                    .bind(PRUNE_LOCK_KEY)
                    .fetch_one(&mut *conn)
                    .await?;
                Ok(got.then_some(PruneLock { conn: Some(conn) }))
            }
        }
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
        batch: u32,
    ) -> Result<PrunePass, StoreError> {
        let Some(lock) = self.try_prune_lock().await? else {
            return Ok(PrunePass::Skipped);
        };
        let mut pruned = Vec::with_capacity(targets.len());
        for (consumer, published_before_ms) in targets {
            pruned.push(
                self.prune_receipts(consumer, *published_before_ms, batch)
                    .await?,
            );
        }
        lock.release().await?;
        Ok(PrunePass::Pruned(pruned))
    }
}
