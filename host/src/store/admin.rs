//! The operator's reads and deletes on the host tables, for `idem dlq …` and
//! `idem receipts …` (module `crate::admin`): list, show and remove dead
//! letters, take one inside a redrive's transaction, inspect and forget
//! receipts. Both databases; times come back as Unix milliseconds read on
//! the database's clock (the clock that wrote them).

use super::backend::{Pool as _, Transaction as _};
use super::{Database, DbKind, DeadLetterRow, StoreError, Tx, dispatch, one_line, sqlite};
use crate::secret::redact_url;
use std::time::Duration;

/// One stored receipt, as read back by [`Database::receipt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptRow {
    /// The durable consumer (= handler name).
    pub consumer: String,
    /// The message id.
    pub message_id: String,
    /// The stream sequence of the delivery whose effect committed.
    pub stream_sequence: u64,
    /// Hex SHA-256 of the component that produced the effect.
    pub module_digest: String,
    /// When the effect committed, in milliseconds since the Unix epoch (database clock).
    pub processed_at_ms: i64,
    /// When the broker stored the message, Unix ms (broker's clock): what
    /// the retention window measures this receipt by.
    pub published_ms: i64,
}

/// How many receipts one consumer has and the span of their messages'
/// publish times, from [`Database::receipt_summary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptSummary {
    /// Committed receipts.
    pub count: u64,
    /// The oldest `published_ms` (broker's clock, Unix ms); `None` without receipts.
    pub oldest_ms: Option<i64>,
    /// The newest `published_ms` (broker's clock, Unix ms); `None` without receipts.
    pub newest_ms: Option<i64>,
}

impl Database {
    /// [`Database::connect_with`] for an admin command, which must not create
    /// what it inspects: a SQLite file that does not exist, or a database
    /// without idem's host tables, is an error (one line naming the URL,
    /// password redacted), so a wrong `[database] url` or working directory
    /// is not mistaken for an empty dead-letter table.
    ///
    /// # Errors
    /// As [`Database::connect_with`]; also the SQLite file is missing, or the
    /// database cannot be read or has no host tables.
    pub async fn connect_existing(
        url: &str,
        max_connections: u32,
        lock_wait: Duration,
    ) -> anyhow::Result<Self> {
        if DbKind::of_url(url) == Some(DbKind::Sqlite) {
            let file = sqlite::file_of(url).map_err(|e| {
                anyhow::anyhow!(
                    "cannot connect to database {}: {}; check [database] url",
                    redact_url(url),
                    one_line(&e.to_string())
                )
            })?;
            if let Some(file) = file.filter(|f| !f.exists()) {
                anyhow::bail!(
                    "database file {} does not exist; check [database] url (a relative sqlite path is read from the working directory)",
                    file.display()
                );
            }
        }
        let db = Self::connect_with(url, max_connections, lock_wait).await?;
        let found = db.has_host_tables().await.map_err(|e| {
            anyhow::anyhow!(
                "cannot read database {}: {}",
                redact_url(url),
                one_line(&e.to_string())
            )
        })?;
        if !found {
            db.close().await;
            anyhow::bail!(
                "database {} has no idem tables (idem_receipts, idem_dead_letters): `idem run` has not used it; check [database] url",
                redact_url(url)
            );
        }
        Ok(db)
    }

    /// Whether both host tables (`idem_receipts`, `idem_dead_letters`) exist
    /// (PostgreSQL: on the connection's `search_path`).
    ///
    /// # Errors
    /// The statement fails (see [`StoreError::class`]).
    pub async fn has_host_tables(&self) -> Result<bool, StoreError> {
        Ok(dispatch!(&self.0, b => b.has_host_tables().await)?)
    }

    /// Dead letters in id order (oldest first): every consumer's, or only
    /// `consumer`'s.
    ///
    /// # Errors
    /// The statement fails (see [`StoreError::class`]).
    pub async fn list_dead_letters(
        &self,
        consumer: Option<&str>,
    ) -> Result<Vec<DeadLetterRow>, StoreError> {
        Ok(dispatch!(&self.0, b => b.list_dead_letters(consumer).await)?)
    }

    /// The dead letter with row id `id`, `None` if there is none.
    ///
    /// # Errors
    /// The statement fails (see [`StoreError::class`]).
    pub async fn dead_letter_by_id(&self, id: i64) -> Result<Option<DeadLetterRow>, StoreError> {
        Ok(dispatch!(&self.0, b => b.dead_letter_by_id(id).await)?)
    }

    /// Deletes the dead letter with row id `id` (its own transaction).
    /// `true`: deleted; `false`: there was none.
    ///
    /// # Errors
    /// The statement fails (see [`StoreError::class`]).
    pub async fn drop_dead_letter(&self, id: i64) -> Result<bool, StoreError> {
        let n = dispatch!(&self.0, b => b.drop_dead_letter(id).await)?;
        Ok(n == 1)
    }

    /// Deletes every dead letter of `consumer` (one statement); returns how many.
    ///
    /// # Errors
    /// The statement fails (see [`StoreError::class`]).
    pub async fn drop_dead_letters(&self, consumer: &str) -> Result<u64, StoreError> {
        Ok(dispatch!(&self.0, b => b.drop_dead_letters(consumer).await)?)
    }

    /// `consumer`'s receipt for `message_id`, `None` if it has none
    /// (never processed, pruned, or forgotten; uncommitted ones are not seen).
    ///
    /// # Errors
    /// The statement fails (see [`StoreError::class`]).
    pub async fn receipt(
        &self,
        consumer: &str,
        message_id: &str,
    ) -> Result<Option<ReceiptRow>, StoreError> {
        let row = dispatch!(&self.0, b => b.receipt(consumer, message_id).await)?;
        Ok(row.map(
            |(seq, module_digest, processed_at_ms, published_ms)| ReceiptRow {
                consumer: consumer.to_owned(),
                message_id: message_id.to_owned(),
                stream_sequence: u64::try_from(seq).unwrap_or(0),
                module_digest,
                processed_at_ms,
                published_ms,
            },
        ))
    }

    /// How many receipts `consumer` has (only those whose effect the
    /// component `digest` produced, when given: what a version did), and
    /// the oldest and newest `published_ms` among them (one statement, by the
    /// `(consumer, published_ms)` index).
    ///
    /// # Errors
    /// The statement fails (see [`StoreError::class`]).
    pub async fn receipt_summary(
        &self,
        consumer: &str,
        digest: Option<&str>,
    ) -> Result<ReceiptSummary, StoreError> {
        let (count, oldest_ms, newest_ms) =
            dispatch!(&self.0, b => b.receipt_summary(consumer, digest).await)?;
        Ok(ReceiptSummary {
            count: u64::try_from(count).unwrap_or(0),
            oldest_ms,
            newest_ms,
        })
    }

    /// Deletes `consumer`'s receipts for `message_ids` in one transaction;
    /// returns how many existed (ids without a receipt, and repeats, count 0).
    /// A redelivery or replay of a forgotten id runs the handler again.
    ///
    /// # Errors
    /// A statement or the commit fails; then nothing is forgotten.
    pub async fn forget_receipts(
        &self,
        consumer: &str,
        message_ids: &[String],
    ) -> Result<u64, StoreError> {
        let mut tx = self.begin().await?;
        let mut deleted = 0;
        for id in message_ids {
            deleted += dispatch!(&mut tx.0, t => t.forget_receipt(consumer, id).await)?;
        }
        tx.commit().await?;
        Ok(deleted)
    }
}

impl Tx {
    /// Deletes the dead letter with row id `id` in this transaction and
    /// returns it; `None` if there is none. On PostgreSQL the row stays
    /// locked until the transaction ends (a concurrent taker waits, then
    /// finds it gone or, after a rollback, takes it); SQLite's transaction
    /// holds the write lock already. Rolling back puts the row back.
    ///
    /// # Errors
    /// The statement fails (see [`StoreError::class`]).
    pub async fn take_dead_letter(&mut self, id: i64) -> Result<Option<DeadLetterRow>, StoreError> {
        Ok(dispatch!(&mut self.0, t => t.take_dead_letter(id).await)?)
    }
}
