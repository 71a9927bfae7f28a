//! Transactions, receipts and dead letters: one implementation per database
//! (`postgres`, `sqlite`) behind one seam, so the pipeline is written once.
//!
//! The seam is a set of traits (`backend`): a backend's pool
//! (`backend::Pool`), transaction (`backend::Transaction`, with its batch
//! side `backend::Batch`) and prune lock (`backend::PruneLock`), plus the
//! optional capabilities with an "absent" default (role switching,
//! PostgreSQL's catalog question, SQLite's compile hook). The dialect is the
//! required methods; the operator's queries (dead letters, receipts, prune
//! chunks, deployment marks) are provided methods written once over a few
//! required primitives. [`Database`], [`Tx`] and [`PruneLock`] each hold one
//! backend's value (a `Backend`), and `dispatch!` calls the trait method on
//! whichever it is. [`SCHEMES`] is the one table that maps a URL to its
//! database ([`DbKind`]).
//!
//! Every piece of dialect SQL, every SQLSTATE and SQLite result code and
//! every pool, connection and transaction type of the driver lives in the
//! backend's module (`postgres/`, `sqlite/`); SQL that both dialects read
//! alike is in `sql`. This module and `admin`, `retention`, `receipts`,
//! `dead_letters`, `transaction`, `statement` and `error` hold only what is
//! the same on every database. ARCHITECTURE.md, "Adding a database", lists
//! what a new backend brings.
//!
//! Host tables (created at start by [`Database::prepare_host_tables`], never
//! reachable from a guest: the SQL guard refuses every `idem_*` name):
//! - `idem_receipts(consumer, message_id, stream_sequence, module_digest, processed_at,
//!   published_ms)`, primary key `(consumer, message_id)`: the processed-message
//!   marker. `published_ms` is the message's publish time on the broker's
//!   clock (Unix ms), indexed by `(consumer, published_ms)` for pruning (module
//!   `retention`, [`crate::broker::clock`]); `processed_at` is informational, set by
//!   the database (`timestamptz` on PostgreSQL, Unix ms `INTEGER` on SQLite).
//! - `idem_dead_letters(id, consumer, message_id NULL, stream, stream_sequence, subject,
//!   reason, headers (JSON text), payload, failed_at, published_ns)`, unique
//!   `(consumer, stream, stream_sequence, published_ns)` so that dead-lettering
//!   one delivery twice writes one row, and a stream created again (sequences
//!   start over) never collides with an earlier one's rows.
//! - `idem_deploy_marks(handler, sequence, revision, record)`, primary key
//!   `handler`: the highest deployment sequence a host put in place and
//!   its record (module `deploy_marks`); it only rises.
//! - `idem_outbox(id, consumer, message_id, call_index, kind, target, payload,
//!   headers, ordering_key, attempts, due_ms, last_error, created_ms)`, unique
//!   `(consumer, message_id, call_index)`: what committed messages published
//!   or called, until the relay sent it (module `outbox`). `id` numbers one
//!   key's rows in commit order; `due_ms` is the next try or a claim's lease.
//! - `idem_migrations_<handler>`: sqlx's migration record, one table per handler.
//!
//! Guest statements run inside a savepoint (`idem_stmt`) of the message's
//! transaction. A failing statement is rolled back alone and the transaction
//! stays usable on both databases, so a handler may catch a unique violation
//! and carry on (on PostgreSQL an error would otherwise abort the whole
//! transaction, and a later `COMMIT` would silently roll back).

mod admin;
pub mod advisory;
mod backend;
mod batch;
mod dead_letters;
pub(crate) mod deploy_marks;
mod durability;
mod error;
mod key_sequences;
mod outbox;
mod outbox_admin;
mod postgres;
mod receipts;
mod retention;
mod sql;
mod sqlite;
pub(crate) mod sqlite_raw;
mod statement;
mod transaction;

pub use admin::{ReceiptRow, ReceiptSummary};
pub use batch::BATCH_LOCK_WAIT;
pub use dead_letters::{DeadLetter, DeadLetterRow};
pub use error::{ErrorClass, ProbeFailure, StoreError};
pub use outbox::{NOTIFY_CHANNEL, OutboxRow, PARKED, now_ms};
pub use outbox_admin::{OutboxListed, OutboxSummary, RowChange};
pub use receipts::{LOOKUP_IDS, Receipt, ReceiptGauges};
pub use retention::{PRUNE_LOCK_KEY, PruneLock, PrunePass};
pub use transaction::HandlerRole;

pub use crate::sql_value::{DbError, DbErrorKind, Rows, SqlValue, StatementError};

use crate::secret::redact_url;
use anyhow::Context as _;
use backend::Pool as _;
use sha2::Digest as _;
use std::path::Path;
use std::time::Duration;

/// SQLite busy timeout used by [`Database::connect`].
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(5);

/// Which database a URL names ([`SCHEMES`]); also picks the SQL dialect the
/// guard parses with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    /// PostgreSQL (`postgres://` or `postgresql://`).
    Postgres,
    /// SQLite (`sqlite://path` or `sqlite::memory:`).
    Sqlite,
}

/// The URL schemes idem connects to and the database each names: the one
/// table that [`Database::connect_with`], and whatever else reads a URL's
/// scheme, chooses a backend by. A URL names the database of the first
/// prefix it starts with ([`DbKind::of_url`]).
pub const SCHEMES: &[(&str, DbKind)] = &[
    ("postgres://", DbKind::Postgres),
    ("postgresql://", DbKind::Postgres),
    ("sqlite:", DbKind::Sqlite),
];

impl DbKind {
    /// The database `url` names by its scheme ([`SCHEMES`]); `None` for a
    /// scheme idem does not connect to.
    pub fn of_url(url: &str) -> Option<DbKind> {
        SCHEMES
            .iter()
            .find(|(prefix, _)| url.starts_with(prefix))
            .map(|&(_, kind)| kind)
    }

    /// The database's name, for messages: `PostgreSQL`, `SQLite`.
    pub fn name(self) -> &'static str {
        match self {
            DbKind::Postgres => "PostgreSQL",
            DbKind::Sqlite => "SQLite",
        }
    }
}

/// One value per backend: `P` on PostgreSQL, `S` on SQLite. [`Database`],
/// [`Tx`] and [`PruneLock`] each hold one; `dispatch!` runs the same code on
/// whichever it is.
enum Backend<P, S> {
    Postgres(P),
    Sqlite(S),
}

/// `$body` with `$b` bound to the backend value inside `$on` (a [`Backend`],
/// by value or by reference). `$body` calls the `backend` traits' methods,
/// so it is written once and type-checked once per backend. In the second
/// form `$wrap` is the variant's constructor, to put a value of the
/// backend's own type (a transaction, a lock) back into a `Backend`.
macro_rules! dispatch {
    ($on:expr, $b:ident => $body:expr) => {
        match $on {
            $crate::store::Backend::Postgres($b) => $body,
            $crate::store::Backend::Sqlite($b) => $body,
        }
    };
    ($on:expr, $b:ident, $wrap:ident => $body:expr) => {
        match $on {
            $crate::store::Backend::Postgres($b) => {
                let $wrap = $crate::store::Backend::Postgres;
                $body
            }
            $crate::store::Backend::Sqlite($b) => {
                let $wrap = $crate::store::Backend::Sqlite;
                $body
            }
        }
    };
}
use dispatch;

/// Which database the transaction `_t` is on (inside [`dispatch!`], where
/// the backend's type is only known as `t`'s).
fn kind_of<T: backend::Transaction>(_t: &T) -> DbKind {
    T::KIND
}

/// A connection pool to the one database idem writes receipts and effects to:
/// PostgreSQL, or SQLite (WAL, `synchronous=FULL`, busy timeout, foreign keys on).
pub struct Database(Backend<postgres::Pool, sqlite::Pool>);

/// One open transaction: the receipt and every guest statement go through it.
/// On PostgreSQL `BEGIN` (read committed); on SQLite `BEGIN IMMEDIATE` (holds
/// the write lock). Dropping it without [`Tx::commit`] rolls it back.
/// The second field: which of the host's savepoints are open
/// (`statement`, `batch`).
pub struct Tx(Backend<postgres::Tx, sqlite::Tx>, Savepoints);

/// The host's savepoints in a transaction: a guest statement's
/// (`idem_stmt`, module `statement`) and, when the transaction carries a
/// batch of messages, the current message's (`idem_msg`, module `batch`).
/// Both are opened lazily, with the next statement's round trip.
#[derive(Debug, Default, Clone, Copy)]
struct Savepoints {
    /// `idem_stmt` is open (the last guest statement's).
    statement: bool,
    /// Where the current message's savepoint is.
    message: MessageSavepoint,
    /// A message that succeeded left `idem_msg` open; the next round trip
    /// that opens a savepoint (or COMMIT) releases it.
    release_message: bool,
}

/// The current message's savepoint in a batch transaction.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum MessageSavepoint {
    /// Not a batch message (or between messages).
    #[default]
    None,
    /// A message started; `idem_msg` is opened with its first statement.
    Pending,
    /// `idem_msg` is open.
    Open,
}

impl Database {
    /// [`Database::connect_with`] with a 5 s SQLite lock wait.
    ///
    /// # Errors
    /// As [`Database::connect_with`].
    pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        Self::connect_with(url, max_connections, DEFAULT_LOCK_WAIT).await
    }

    /// Opens a pool of up to `max_connections` to `url` ([`SCHEMES`]):
    /// `postgres://…` / `postgresql://…`, or `sqlite://path` (the file is created if missing;
    /// WAL journal, busy timeout `lock_wait`, `synchronous=FULL`, foreign keys on).
    /// `sqlite::memory:` uses one connection that is never closed.
    ///
    /// `lock_wait` must exceed the longest time a transaction may hold
    /// SQLite's single write lock (a handler's deadline), or other handlers'
    /// `BEGIN IMMEDIATE` give up with "database is locked" instead of waiting.
    ///
    /// # Errors
    /// One line, `cannot connect to database <url without password>:
    /// <cause>; check [database] url`.
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        lock_wait: Duration,
    ) -> anyhow::Result<Self> {
        let result = match DbKind::of_url(url) {
            Some(DbKind::Postgres) => postgres::Pool::connect(url, max_connections, lock_wait)
                .await
                .map(Backend::Postgres),
            Some(DbKind::Sqlite) => sqlite::Pool::connect(url, max_connections, lock_wait)
                .await
                .map(Backend::Sqlite),
            None => anyhow::bail!(
                "cannot connect to database {}: unsupported scheme (use postgres://… or sqlite://…); check [database] url",
                redact_url(url)
            ),
        };
        result.map(Database).map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to database {}: {}; check [database] url",
                redact_url(url),
                one_line(&e.to_string())
            )
        })
    }

    /// Which database this is.
    pub fn kind(&self) -> DbKind {
        dispatch!(&self.0, b => b.kind())
    }

    /// Creates the host tables and their index if they do not exist.
    /// Idempotent and safe when several hosts start at once (PostgreSQL: under
    /// a transaction-scoped advisory lock; SQLite: under `BEGIN IMMEDIATE`).
    ///
    /// # Errors
    /// One line, `cannot create idem's host tables: <cause>`.
    pub async fn prepare_host_tables(&self) -> anyhow::Result<()> {
        dispatch!(&self.0, b => b.prepare_host_tables().await).map_err(|e| {
            anyhow::anyhow!(
                "cannot create idem's host tables: {}",
                one_line(&e.to_string())
            )
        })
    }

    /// Applies `handler`'s SQL migrations from `dir` (sqlx's migrator layout:
    /// `<version>_<description>.sql`), recorded in the handler's own table
    /// [`migrations_table`]: handlers never see each other's versions.
    /// Idempotent; a changed, already applied migration is an error.
    ///
    /// # Errors
    /// One line naming the handler and `dir`, then the cause.
    pub async fn migrate_handler(&self, handler: &str, dir: &Path) -> anyhow::Result<()> {
        let context = || {
            format!(
                "migrations of handler `{handler}` in {} failed",
                dir.display()
            )
        };
        let mut migrator = sqlx::migrate::Migrator::new(dir)
            .await
            .map_err(|e| anyhow::anyhow!(one_line(&e.to_string())))
            .with_context(context)?;
        migrator.dangerous_set_table_name(migrations_table(handler));
        dispatch!(&self.0, b => b.migrate(&migrator).await)
            .map_err(|e| anyhow::anyhow!(one_line(&e.to_string())))
            .with_context(context)
    }

    /// Whether the database can take a message's transaction again, asked
    /// once and given up after `timeout`: PostgreSQL `SELECT 1` on a pooled
    /// connection (the pool tests a connection before handing it out, so a
    /// dead one left from before an outage is replaced); SQLite `BEGIN
    /// IMMEDIATE` then `ROLLBACK`, so a file that can be read but not written
    /// (read-only, disk full) is still "down". The availability gate
    /// ([`crate::pipeline::db_gate`]) asks this while the database is down.
    ///
    /// # Errors
    /// [`ProbeFailure::Failed`] with the driver's error, or
    /// [`ProbeFailure::TimedOut`].
    pub async fn probe(&self, timeout: Duration) -> Result<(), ProbeFailure> {
        match tokio::time::timeout(timeout, async { dispatch!(&self.0, b => b.probe().await) })
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ProbeFailure::Failed(e)),
            Err(_) => Err(ProbeFailure::TimedOut),
        }
    }

    /// Which of `tables` hold at least one row (names as in `[[handler]]
    /// tables`, read as unquoted identifiers: lower case). A table that
    /// cannot be read (missing, say) is left out.
    pub async fn tables_with_rows(&self, tables: &[String]) -> Vec<String> {
        let mut filled = Vec::new();
        for t in tables {
            let sql = sql::any_row(t);
            if let Ok(true) = dispatch!(&self.0, b => b.has_rows(sql).await) {
                filled.push(t.clone());
            }
        }
        filled
    }

    /// Closes the pool, waiting for connections to be returned.
    pub async fn close(&self) {
        dispatch!(&self.0, b => b.close().await)
    }
}

/// The name of the table that records `handler`'s migrations:
/// `idem_migrations_<name>` with the name lower-cased and every character
/// outside `[a-z0-9_]` replaced by `_`; when that changed the name or it is
/// longer than 38 bytes (cut to 38), the first 8 hex digits of its SHA-256 are
/// appended, so distinct handlers never share a table and the name fits 63 bytes.
pub fn migrations_table(handler: &str) -> String {
    handler_ident("idem_migrations_", handler)
}

/// The PostgreSQL role `handler`'s statements run as when it is granted
/// `tables`: `idem_handler_<name>_<grants>`, `<grants>` the first 8 hex
/// digits of the SHA-256 of the table names (lower-cased, sorted, one a
/// line), `<name>` as in [`migrations_table`] (cut to 32 bytes, so the whole
/// fits PostgreSQL's 63). One role per grant set: hosts whose configs grant
/// one handler different tables each keep their own grants, where a shared
/// role would be re-granted by whichever host started last.
pub fn handler_role(handler: &str, tables: &[String]) -> String {
    let mut names: Vec<String> = tables.iter().map(|t| t.to_lowercase()).collect();
    names.sort();
    names.dedup();
    let grants = hex::encode(sha2::Sha256::digest(names.join("\n").as_bytes()));
    // `_` + 8 hex digits of grants after the name: the name gets 63 - 9 bytes.
    let name = handler_ident_within("idem_handler_", handler, 63 - 9);
    format!("{name}_{}", &grants[..8])
}

/// `prefix` + `handler` as a PostgreSQL identifier of at most 63 bytes; see
/// [`migrations_table`] for the rule.
fn handler_ident(prefix: &str, handler: &str) -> String {
    handler_ident_within(prefix, handler, 63)
}

/// [`handler_ident`] within `max` bytes instead of 63.
fn handler_ident_within(prefix: &str, handler: &str, max: usize) -> String {
    let clean: String = handler
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    // PostgreSQL truncates identifiers past 63 bytes: prefix + clean + '_' + 8 hex.
    let max_clean = max - prefix.len() - 9;
    if clean == handler && clean.len() <= max_clean {
        format!("{prefix}{clean}")
    } else {
        let digest = hex::encode(sha2::Sha256::digest(handler.as_bytes()));
        let short: String = clean.chars().take(max_clean).collect();
        format!("{prefix}{short}_{}", &digest[..8])
    }
}

/// `s` on one line: lines trimmed and joined with a space.
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn schemes_name_the_database() {
        assert_eq!(DbKind::of_url("postgres://u@h/db"), Some(DbKind::Postgres));
        assert_eq!(DbKind::of_url("postgresql://h/db"), Some(DbKind::Postgres));
        assert_eq!(DbKind::of_url("sqlite://idem.db"), Some(DbKind::Sqlite));
        assert_eq!(DbKind::of_url("sqlite::memory:"), Some(DbKind::Sqlite));
        assert_eq!(DbKind::of_url("mysql://h/db"), None);
        assert_eq!(DbKind::of_url("Postgres://h/db"), None);
    }

    #[test]
    fn migrations_table_names() {
        assert_eq!(
            migrations_table("credit_projector"),
            "idem_migrations_credit_projector"
        );
        let a = migrations_table("credit-projector");
        assert!(
            a.starts_with("idem_migrations_credit_projector_") && a.len() == 16 + 16 + 1 + 8,
            "{a}"
        );
        assert_ne!(a, migrations_table("credit_projector"));
    }

    #[test]
    fn handler_role_names_the_handler_and_its_grant_set() {
        let t = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        // The tests that query the role by name rely on these two values.
        assert_eq!(
            handler_role("hostile", &t(&["accounts", "notes", "ledger"])),
            "idem_handler_hostile_12dbf8f3"
        );
        assert_eq!(
            handler_role("credit", &t(&["accounts"])),
            "idem_handler_credit_bc62a3c1"
        );
        // Order, case and repeats do not make another grant set.
        assert_eq!(
            handler_role("credit", &t(&["Notes", "accounts", "notes"])),
            handler_role("credit", &t(&["accounts", "notes"]))
        );
        assert_ne!(
            handler_role("credit", &t(&["accounts", "credit_log"])),
            handler_role("credit", &t(&["accounts"]))
        );
        let long = handler_role(&"x-".repeat(40), &t(&["accounts"]));
        assert!(
            long.len() <= 63 && long.starts_with("idem_handler_x_x_"),
            "{long}"
        );
    }
}
