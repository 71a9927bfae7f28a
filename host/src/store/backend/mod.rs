//! The seam between the store and one database: what a backend's pool,
//! transaction and prune lock do. The required methods are the dialect:
//! every piece of SQL only one database reads, every driver type and every
//! error code lives behind them, in the backend's module (`postgres/`,
//! `sqlite/`). The provided methods are the host's own queries written once
//! over a few required primitives ([`Pool::run`], [`Pool::fetch_all`],
//! [`Transaction::run`], …), with the SQL both dialects read alike
//! (`store::sql`; both take `$n` placeholders) and the few statements that
//! differ as associated constants. `store/mod.rs` holds one value per
//! backend and calls these methods on whichever it is (`dispatch!`);
//! ARCHITECTURE.md, "Adding a database", lists what a new backend brings.
//!
//! `pool.rs` has the pool's traits (`Pool`, `PruneLock`, `PoolRoles`),
//! `transaction.rs` the transaction's (`Transaction`, `Batch`, `TxRoles`,
//! `RowFunctions`, `CompileHook`); this file the values both bind and read.
//!
//! Optional capabilities are traits of their own whose provided methods
//! are the "absent" answer: role switching ([`PoolRoles`], [`TxRoles`]) and
//! the SQL guard's catalog question ([`RowFunctions`]), PostgreSQL's; the
//! compile hook ([`CompileHook`]), SQLite's. Every backend writes an `impl`
//! of each (an empty one takes the absent answer): the store calls them on
//! every backend, so a backend that forgets one does not compile.
//!
//! Units: times are Unix milliseconds unless a name says otherwise;
//! counts are rows. Every fallible method fails with the driver's
//! [`sqlx::Error`] (the store reads its class, `StoreError::class`) unless
//! its doc says otherwise.

mod pool;
mod transaction;

pub(super) use pool::{Pool, PoolRoles, PruneLock, existing_receipts_fetched, ids_json};
pub(super) use transaction::{Batch, CompileHook, RowFunctions, Transaction, TxRoles};

use super::DeadLetterRow;
use sqlx::query::Query;
use sqlx::{ColumnIndex, Decode, Encode, Type};

/// A value a host statement binds to one of its `$n`, in order (the host's
/// own SQL; a guest's values are bound by each backend's `values`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Param<'a> {
    /// `BIGINT` / `INTEGER`.
    Int(i64),
    /// `TEXT`.
    Text(&'a str),
    /// `TEXT`, or NULL for `None` (typed as text on PostgreSQL).
    OptText(Option<&'a str>),
    /// `BYTEA` / `BLOB`.
    Bytes(&'a [u8]),
}

/// `q` with `params` bound in order; every backend's primitives bind
/// through it.
pub(super) fn bind_params<'q, DB>(
    mut q: Query<'q, DB, DB::Arguments>,
    params: &[Param<'_>],
) -> Query<'q, DB, DB::Arguments>
where
    DB: sqlx::Database,
    i64: for<'a> Encode<'a, DB> + Type<DB>,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> Option<&'a str>: Encode<'a, DB> + Type<DB>,
    for<'a> &'a [u8]: Encode<'a, DB> + Type<DB>,
{
    for p in params {
        q = match *p {
            Param::Int(i) => q.bind(i),
            Param::Text(s) => q.bind(s),
            Param::OptText(s) => q.bind(s),
            Param::Bytes(b) => q.bind(b),
        };
    }
    q
}

/// A row a host query read, decoded by column: what the provided methods
/// need of a backend's row type (any sqlx row of a driver that decodes
/// these types has it).
pub(super) trait HostRow: Send + 'static {
    /// Column `i` as a BIGINT.
    ///
    /// # Errors
    /// The column is missing, NULL or of another type.
    fn int(&self, i: usize) -> Result<i64, sqlx::Error>;

    /// Column `i` as a BIGINT or NULL.
    ///
    /// # Errors
    /// The column is missing or of another type.
    fn opt_int(&self, i: usize) -> Result<Option<i64>, sqlx::Error>;

    /// Column `i` as text.
    ///
    /// # Errors
    /// The column is missing, NULL or of another type.
    fn text(&self, i: usize) -> Result<String, sqlx::Error>;

    /// Column `i` as text, `None` for NULL.
    ///
    /// # Errors
    /// The column is missing or of another type.
    fn opt_text(&self, i: usize) -> Result<Option<String>, sqlx::Error>;

    /// Column `i` as bytes.
    ///
    /// # Errors
    /// The column is missing, NULL or of another type.
    fn bytes(&self, i: usize) -> Result<Vec<u8>, sqlx::Error>;

    /// The row as a dead letter: the columns `id, consumer, message_id,
    /// stream, stream_sequence, subject, reason, headers, payload,
    /// failed_at_ms, published_ns` by name (`failed_at_ms` Unix ms,
    /// `published_ns` Unix ns, `headers` the stored JSON).
    ///
    /// # Errors
    /// A column is missing or of another type, or the headers are no JSON
    /// array of pairs.
    fn dead_letter(&self) -> Result<DeadLetterRow, sqlx::Error>;
}

impl<R> HostRow for R
where
    R: sqlx::Row,
    usize: ColumnIndex<R>,
    for<'a> &'a str: ColumnIndex<R>,
    i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    String: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    for<'r> &'r str: Decode<'r, R::Database> + Type<R::Database>,
{
    fn int(&self, i: usize) -> Result<i64, sqlx::Error> {
        self.try_get(i)
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(i)
    }

    fn text(&self, i: usize) -> Result<String, sqlx::Error> {
        self.try_get(i)
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>, sqlx::Error> {
        self.try_get(i)
    }

    fn bytes(&self, i: usize) -> Result<Vec<u8>, sqlx::Error> {
        self.try_get(i)
    }

    fn dead_letter(&self) -> Result<DeadLetterRow, sqlx::Error> {
        Ok(DeadLetterRow {
            id: self.try_get("id")?,
            consumer: self.try_get("consumer")?,
            message_id: self.try_get("message_id")?,
            stream: self.try_get("stream")?,
            stream_sequence: u64::try_from(self.try_get::<i64, _>("stream_sequence")?).unwrap_or(0),
            subject: self.try_get("subject")?,
            reason: self.try_get("reason")?,
            headers: super::dead_letters::decode_headers(self.try_get("headers")?)?,
            payload: self.try_get("payload")?,
            failed_at_ms: self.try_get("failed_at_ms")?,
            published_ns: self.try_get("published_ns")?,
        })
    }
}
