//! Dead letters: messages the host gave up on, each written durably in its
//! own transaction before the message is termed (ARCHITECTURE.md, "The
//! protocol", invariant 2). The operator's reads are in `admin`.

use super::backend::Pool as _;
use super::receipts::to_i64;
use super::{Database, StoreError, dispatch};

/// A message the host gave up on, with the reason. Written in its own
/// transaction before the message is termed.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// The durable consumer (= handler name).
    pub consumer: &'a str,
    /// `None` when the message had no message_id (that is then the reason).
    pub message_id: Option<&'a str>,
    /// The JetStream stream the message came from.
    pub stream: &'a str,
    /// The message's sequence in `stream`.
    pub stream_sequence: u64,
    /// When the broker stored the message (JetStream's `published` metadata),
    /// in nanoseconds since the Unix epoch. With `consumer`, `stream` and
    /// `stream_sequence` the row's unique key: a stream deleted and created
    /// again starts its sequences over, so a sequence alone does not name
    /// one message, while a second dead letter of the same delivery (its
    /// term was lost) writes no second row.
    pub published_ns: i64,
    /// The subject the message was published on.
    pub subject: &'a str,
    /// One line for a person: why the host gave up.
    pub reason: &'a str,
    /// The message headers in order (stored as a JSON array of `[name, value]` pairs).
    pub headers: &'a [(String, String)],
    /// The payload bytes, unchanged.
    pub payload: &'a [u8],
}

/// One stored dead letter, as read back by [`Database::list_dead_letters`].
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterRow {
    /// Row id, increasing in insertion order.
    pub id: i64,
    /// The durable consumer (= handler name).
    pub consumer: String,
    /// The message id, `None` when the message had none.
    pub message_id: Option<String>,
    /// The JetStream stream.
    pub stream: String,
    /// The message's sequence in `stream`.
    pub stream_sequence: u64,
    /// The subject the message was published on.
    pub subject: String,
    /// Why the host gave up.
    pub reason: String,
    /// The message headers in order.
    pub headers: Vec<(String, String)>,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// When the row was written, in milliseconds since the Unix epoch (database clock).
    pub failed_at_ms: i64,
    /// When the broker stored the message, ns since the Unix epoch (broker's
    /// clock); 0 for a row written before idem recorded it.
    pub published_ns: i64,
}

impl Database {
    /// Writes a dead letter in its own transaction, durable when this
    /// returns. A second call for the same `(consumer, stream,
    /// stream_sequence, published_ns)` (the same stored message) writes
    /// nothing and succeeds. NUL in `subject` and `reason` is stored
    /// as `\0` on every database: PostgreSQL `text` cannot hold it (SQLSTATE
    /// 22021), and a reason may quote anything a guest returned.
    ///
    /// # Errors
    /// The headers cannot be encoded, the sequence does not fit a BIGINT, or
    /// the insert fails.
    pub async fn dead_letter(&self, dl: &DeadLetter<'_>) -> Result<(), StoreError> {
        let headers =
            serde_json::to_string(dl.headers).map_err(|e| sqlx::Error::Encode(e.into()))?;
        let seq = to_i64(dl.stream_sequence)?;
        let (subject, reason) = (without_nul(dl.subject), without_nul(dl.reason));
        let dl = DeadLetter {
            subject: &subject,
            reason: &reason,
            ..dl.clone()
        };
        dispatch!(&self.0, b => b.dead_letter(&dl, seq, &headers).await)?;
        Ok(())
    }

    /// `consumer`'s dead letters, oldest first
    /// ([`Database::list_dead_letters`] for one consumer).
    ///
    /// # Errors
    /// As [`Database::list_dead_letters`].
    pub async fn dead_letters(&self, consumer: &str) -> Result<Vec<DeadLetterRow>, StoreError> {
        self.list_dead_letters(Some(consumer)).await
    }
}

/// `s` with NUL written as `\0` (borrowed when there is none).
fn without_nul(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\\0"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// The stored headers (a JSON array of `[name, value]` pairs).
pub(super) fn decode_headers(json: &str) -> Result<Vec<(String, String)>, sqlx::Error> {
    serde_json::from_str(json).map_err(|e| sqlx::Error::Decode(e.into()))
}
