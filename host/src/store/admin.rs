//! The operator's reads and deletes on the host tables, for `idem dlq …` and
//! `idem receipts …` (module `crate::admin`): list, show and remove dead
//! letters, take one inside a redrive's transaction, inspect and forget
//! receipts. Both databases; times come back as Unix milliseconds read on
//! the database's clock (the clock that wrote them).

use super::{Database, DeadLetterRow, StoreError, Tx, decode_headers, one_line, redact_url};
use sqlx::Row as _;
use std::time::Duration;

/// One stored receipt, as read back by [`Database::receipt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptRow {
    /// The durable consumer (= handler name).
    pub consumer: String,
    /// The message identity.
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

/// `failed_at` as Unix milliseconds, per dialect.
macro_rules! dead_letter_columns {
    (postgres) => {
        "id, consumer, message_id, stream, stream_sequence, subject, reason, headers, payload, \
         (extract(epoch FROM failed_at) * 1000)::bigint AS failed_at_ms, published_ns"
    };
    (sqlite) => {
        "id, consumer, message_id, stream, stream_sequence, subject, reason, headers, payload, \
         failed_at AS failed_at_ms, published_ns"
    };
}

/// `processed_at` as Unix milliseconds, per dialect (`$c` is the column or an aggregate of it).
macro_rules! millis {
    (postgres, $c:literal) => {
        concat!("(extract(epoch FROM ", $c, ") * 1000)::bigint")
    };
    (sqlite, $c:literal) => {
        $c
    };
}

/// Decodes one row selected with `dead_letter_columns!`.
macro_rules! decode_dead_letter {
    ($row:expr) => {{
        let row = $row;
        Ok::<_, sqlx::Error>(DeadLetterRow {
            id: row.try_get("id")?,
            consumer: row.try_get("consumer")?,
            message_id: row.try_get("message_id")?,
            stream: row.try_get("stream")?,
            stream_sequence: u64::try_from(row.try_get::<i64, _>("stream_sequence")?).unwrap_or(0),
            subject: row.try_get("subject")?,
            reason: row.try_get("reason")?,
            headers: decode_headers(row.try_get("headers")?)?,
            payload: row.try_get("payload")?,
            failed_at_ms: row.try_get("failed_at_ms")?,
            published_ns: row.try_get("published_ns")?,
        })
    }};
}

impl Database {
    /// [`Database::connect_with`] for an admin command, which must not create
    /// what it inspects: a SQLite file that does not exist, or a database
    /// without idem's host tables, is an error (one line naming the URL,
    /// password redacted), so a wrong `[database] url` or working directory
    /// is not mistaken for an empty dead-letter table.
    pub async fn connect_existing(
        url: &str,
        max_connections: u32,
        lock_wait: Duration,
    ) -> anyhow::Result<Self> {
        if url.starts_with("sqlite:") && !url.contains(":memory:") && !url.contains("mode=memory") {
            let options = <sqlx::sqlite::SqliteConnectOptions as std::str::FromStr>::from_str(url)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot connect to database {}: {}; check [database] url",
                        redact_url(url),
                        one_line(&e.to_string())
                    )
                })?;
            let file = options.get_filename();
            if !file.exists() {
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
    pub async fn has_host_tables(&self) -> Result<bool, StoreError> {
        Ok(match self {
            Database::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT to_regclass('idem_receipts') IS NOT NULL
                        AND to_regclass('idem_dead_letters') IS NOT NULL",
                )
                .fetch_one(pool)
                .await?
            }
            Database::Sqlite(pool) => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table'
                       AND name IN ('idem_receipts', 'idem_dead_letters')",
                )
                .fetch_one(pool)
                .await?;
                n == 2
            }
        })
    }

    /// Dead letters in id order (oldest first): every consumer's, or only
    /// `consumer`'s.
    pub async fn list_dead_letters(
        &self,
        consumer: Option<&str>,
    ) -> Result<Vec<DeadLetterRow>, StoreError> {
        let rows = match self {
            Database::Postgres(pool) => sqlx::query(concat!(
                "SELECT ",
                dead_letter_columns!(postgres),
                " FROM idem_dead_letters WHERE $1::text IS NULL OR consumer = $1 ORDER BY id"
            ))
            .bind(consumer)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| decode_dead_letter!(row))
            .collect::<Result<Vec<_>, _>>()?,
            Database::Sqlite(pool) => sqlx::query(concat!(
                "SELECT ",
                dead_letter_columns!(sqlite),
                " FROM idem_dead_letters WHERE $1 IS NULL OR consumer = $1 ORDER BY id"
            ))
            .bind(consumer)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| decode_dead_letter!(row))
            .collect::<Result<Vec<_>, _>>()?,
        };
        Ok(rows)
    }

    /// The dead letter with row id `id`, `None` if there is none.
    pub async fn dead_letter_by_id(&self, id: i64) -> Result<Option<DeadLetterRow>, StoreError> {
        Ok(match self {
            Database::Postgres(pool) => sqlx::query(concat!(
                "SELECT ",
                dead_letter_columns!(postgres),
                " FROM idem_dead_letters WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?
            .map(|row| decode_dead_letter!(&row))
            .transpose()?,
            Database::Sqlite(pool) => sqlx::query(concat!(
                "SELECT ",
                dead_letter_columns!(sqlite),
                " FROM idem_dead_letters WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await?
            .map(|row| decode_dead_letter!(&row))
            .transpose()?,
        })
    }

    /// Deletes the dead letter with row id `id` (its own transaction).
    /// `true`: deleted; `false`: there was none.
    pub async fn drop_dead_letter(&self, id: i64) -> Result<bool, StoreError> {
        let n = match self {
            Database::Postgres(pool) => sqlx::query("DELETE FROM idem_dead_letters WHERE id = $1")
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected(),
            Database::Sqlite(pool) => sqlx::query("DELETE FROM idem_dead_letters WHERE id = $1")
                .bind(id)
                .execute(pool)
                .await?
                .rows_affected(),
        };
        Ok(n == 1)
    }

    /// Deletes every dead letter of `consumer` (one statement); returns how many.
    pub async fn drop_dead_letters(&self, consumer: &str) -> Result<u64, StoreError> {
        Ok(match self {
            Database::Postgres(pool) => {
                sqlx::query("DELETE FROM idem_dead_letters WHERE consumer = $1")
                    .bind(consumer)
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
            Database::Sqlite(pool) => {
                sqlx::query("DELETE FROM idem_dead_letters WHERE consumer = $1")
                    .bind(consumer)
                    .execute(pool)
                    .await?
                    .rows_affected()
            }
        })
    }

    /// `consumer`'s receipt for `message_id`, `None` if it has none
    /// (never processed, pruned, or forgotten; uncommitted ones are not seen).
    pub async fn receipt(
        &self,
        consumer: &str,
        message_id: &str,
    ) -> Result<Option<ReceiptRow>, StoreError> {
        let row: Option<(i64, String, i64, i64)> = match self {
            Database::Postgres(pool) => {
                sqlx::query_as(concat!(
                    "SELECT stream_sequence, module_digest, ",
                    millis!(postgres, "processed_at"),
                    ", published_ms FROM idem_receipts WHERE consumer = $1 AND message_id = $2"
                ))
                .bind(consumer)
                .bind(message_id)
                .fetch_optional(pool)
                .await?
            }
            Database::Sqlite(pool) => {
                sqlx::query_as(concat!(
                    "SELECT stream_sequence, module_digest, ",
                    millis!(sqlite, "processed_at"),
                    ", published_ms FROM idem_receipts WHERE consumer = $1 AND message_id = $2"
                ))
                .bind(consumer)
                .bind(message_id)
                .fetch_optional(pool)
                .await?
            }
        };
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

    /// How many receipts `consumer` has, and the oldest and newest
    /// `published_ms` among them (one statement, by the
    /// `(consumer, published_ms)` index).
    pub async fn receipt_summary(&self, consumer: &str) -> Result<ReceiptSummary, StoreError> {
        const SUMMARY: &str = "SELECT count(*), min(published_ms), max(published_ms)
                               FROM idem_receipts WHERE consumer = $1";
        let (count, oldest_ms, newest_ms): (i64, Option<i64>, Option<i64>) = match self {
            Database::Postgres(pool) => {
                sqlx::query_as(SUMMARY)
                    .bind(consumer)
                    .fetch_one(pool)
                    .await?
            }
            Database::Sqlite(pool) => {
                sqlx::query_as(SUMMARY)
                    .bind(consumer)
                    .fetch_one(pool)
                    .await?
            }
        };
        Ok(ReceiptSummary {
            count: u64::try_from(count).unwrap_or(0),
            oldest_ms,
            newest_ms,
        })
    }

    /// Deletes `consumer`'s receipts for `message_ids` in one transaction;
    /// returns how many existed (ids without a receipt, and repeats, count 0).
    /// A redelivery or replay of a forgotten id runs the handler again.
    pub async fn forget_receipts(
        &self,
        consumer: &str,
        message_ids: &[String],
    ) -> Result<u64, StoreError> {
        const SQL: &str = "DELETE FROM idem_receipts WHERE consumer = $1 AND message_id = $2";
        let mut deleted = 0;
        match self.begin().await? {
            Tx::Postgres(mut tx) => {
                for id in message_ids {
                    let done = sqlx::query(SQL)
                        .bind(consumer)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    deleted += done.rows_affected();
                }
                tx.commit().await?;
            }
            Tx::Sqlite(mut tx) => {
                for id in message_ids {
                    let done = sqlx::query(SQL)
                        .bind(consumer)
                        .bind(id)
                        .execute(&mut *tx)
                        .await?;
                    deleted += done.rows_affected();
                }
                tx.commit().await?;
            }
        }
        Ok(deleted)
    }
}

impl Tx {
    /// Deletes the dead letter with row id `id` in this transaction and
    /// returns it; `None` if there is none. On PostgreSQL the row stays
    /// locked until the transaction ends (a concurrent taker waits, then
    /// finds it gone or, after a rollback, takes it); SQLite's transaction
    /// holds the write lock already. Rolling back puts the row back.
    pub async fn take_dead_letter(&mut self, id: i64) -> Result<Option<DeadLetterRow>, StoreError> {
        Ok(match self {
            Tx::Postgres(tx) => sqlx::query(concat!(
                "DELETE FROM idem_dead_letters WHERE id = $1 RETURNING ",
                dead_letter_columns!(postgres)
            ))
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?
            .map(|row| decode_dead_letter!(&row))
            .transpose()?,
            Tx::Sqlite(tx) => sqlx::query(concat!(
                "DELETE FROM idem_dead_letters WHERE id = $1 RETURNING ",
                dead_letter_columns!(sqlite)
            ))
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?
            .map(|row| decode_dead_letter!(&row))
            .transpose()?,
        })
    }
}
