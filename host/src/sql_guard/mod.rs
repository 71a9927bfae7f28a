//! Judges guest SQL before it runs: a guest touches nothing but the tables
//! it was granted, through the host's transaction (ARCHITECTURE.md, "The SQL
//! sandbox").
//!
//! The database's own grammar decides, so quoting, escapes and comments are
//! read exactly as the database reads them:
//! - **PostgreSQL**: the text is parsed by PostgreSQL's parser (libpg_query,
//!   through the `pg_query` crate) and the tree judged deny-by-default
//!   (module `postgres`);
//! - **SQLite**: the text is compiled by SQLite itself on the message's own
//!   connection with an authorizer consulted for every table, column,
//!   function, pragma, attach and transaction action; deny by default
//!   (module `sqlite`).
//!
//! Either way the text that runs is exactly the text that was judged, never
//! a re-print, and it is exactly one statement: one Parse message on
//! PostgreSQL's extended protocol, an empty tail on SQLite.
//!
//! Verdicts are cached per handler by exact text, bounded by
//! [`CACHE_ENTRIES`] entries and [`CACHE_BYTES`] bytes.

// Guest- and message-supplied bytes are read with `get`, iterators and
// checked splits, never indexed or sliced: an offset out of range would
// panic the host (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

mod postgres;
mod sqlite;

pub use crate::sql_value::CheckedSql;
use crate::sql_value::{DbError, DbErrorKind, SqlValue, type_letters};
use crate::store::{DbKind, Tx};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// Functions a guest statement may call (matched case-insensitively, never
/// schema-qualified except as PostgreSQL's own SQL-syntax expansions).
/// Deliberately small: pure value functions and aggregates. Clock functions,
/// randomness, sleeps, sequences, settings, locks, large objects and
/// anything touching files, sessions or other databases are absent.
pub const ALLOWED_FUNCTIONS: &[&str] = &[
    "abs",
    "avg",
    "coalesce",
    "count",
    "greatest",
    "least",
    "length",
    "lower",
    "ltrim",
    "max",
    "min",
    "nullif",
    "replace",
    "round",
    "rtrim",
    "substr",
    "substring",
    "sum",
    "trim",
    "upper",
];

/// Statements longer than this many bytes are refused before parsing.
pub const MAX_SQL_BYTES: usize = 64 * 1024;

/// How many verdicts one guard keeps before it starts over.
pub const CACHE_ENTRIES: usize = 1024;

/// How many bytes of statement text and verdicts one guard keeps before it
/// starts over (with [`MAX_SQL_BYTES`] statements, 64 of them).
pub const CACHE_BYTES: usize = 4 << 20;

/// The highest placeholder number accepted (`$65535`, PostgreSQL's limit).
pub const MAX_PLACEHOLDER: usize = 65_535;

type Verdict = Result<CheckedSql, DbError>;

#[derive(Default)]
struct Cache {
    verdicts: HashMap<Arc<str>, Verdict>,
    bytes: usize,
}

/// Judges one handler's statements against its granted tables, caching each
/// verdict (allowed, or the error) by the exact text that runs.
pub struct SqlGuard {
    kind: DbKind,
    granted: Arc<HashSet<String>>,
    cache: Mutex<Cache>,
}

impl SqlGuard {
    /// A guard for `kind` and the handler's `tables` grant list (names as in
    /// `[[handler]] tables`, matched like unquoted SQL identifiers: lower case).
    pub fn new(kind: DbKind, granted_tables: &[String]) -> Self {
        Self {
            kind,
            granted: Arc::new(
                granted_tables
                    .iter()
                    .map(|t| t.to_ascii_lowercase())
                    .collect(),
            ),
            cache: Mutex::new(Cache::default()),
        }
    }

    /// Judges `sql` as it will run in `tx` with `params`, and returns the
    /// exact text to run. On PostgreSQL that text ends with a comment naming
    /// the parameter types (`\n-- idem:itn`: integer, text, null): sqlx caches
    /// prepared statements by text and reuses the parameter types of the first
    /// preparation, so each type signature gets its own; the comment is part
    /// of what is judged. On SQLite the statement is compiled on `tx`'s
    /// connection (nothing runs).
    ///
    /// # Errors
    /// [`DbErrorKind::Syntax`] when the database's grammar rejects the text;
    /// [`DbErrorKind::Denied`] with one line saying what is refused and what
    /// to do instead. A failure of `tx`'s connection while compiling:
    /// [`DbErrorKind::Other`].
    pub async fn check(&self, tx: &mut Tx, sql: &str, params: &[SqlValue]) -> Verdict {
        let (text, types) = match self.kind {
            DbKind::Postgres => (typed_text(sql, params), Some(type_letters(params).into())),
            DbKind::Sqlite => (sql.to_owned(), None),
        };
        if let Some(verdict) = self.lock_cache().verdicts.get(text.as_str()) {
            return verdict.clone();
        }
        let text: Arc<str> = text.into();
        let verdict = match precheck(sql) {
            Err(e) => Err(e),
            Ok(()) => match self.kind {
                DbKind::Postgres => {
                    match judge_postgres(text.clone(), self.granted.clone()).await {
                        Ok(judged) if judged.fields.is_empty() => Ok(judged.params),
                        Ok(judged) => self.no_row_functions(tx, &judged).await,
                        Err(e) => Err(e),
                    }
                }
                DbKind::Sqlite => sqlite::judge(tx, &text, &self.granted).await,
            }
            .map(|params| CheckedSql::judged(text.clone(), params, types)),
        };
        // A connection failure says nothing about the text: not cached.
        if !matches!(&verdict, Err(e) if e.kind == DbErrorKind::Other) {
            self.remember(text, verdict.clone());
        }
        verdict
    }

    /// Refuses a statement that selects a field PostgreSQL would resolve as
    /// a function call on the row (`a.f` as `f(a)`), outside the allowed
    /// functions; asks the catalogs in `tx`. Judged once per text (the
    /// verdict is cached): a function created while the host runs is seen by
    /// statements judged after it.
    async fn no_row_functions(
        &self,
        tx: &mut Tx,
        judged: &postgres::Judged,
    ) -> Result<usize, DbError> {
        let tables: Vec<String> = self.granted.iter().cloned().collect();
        let calls = tx.row_functions(&judged.fields, &tables).await?;
        match calls.first() {
            None => Ok(judged.params),
            Some(f) => Err(DbError::denied(format!(
                "`.{f}` is no column of a granted table, so PostgreSQL would call function `{f}` on the row (attribute notation); handlers call only the allowed functions ({}); if `{f}` is a column of a subquery or CTE, name it otherwise",
                ALLOWED_FUNCTIONS.join(", ")
            ))),
        }
    }

    /// How many verdicts the cache holds now (for tests and benchmarks).
    pub fn cached(&self) -> usize {
        self.lock_cache().verdicts.len()
    }

    fn remember(&self, text: Arc<str>, verdict: Verdict) {
        let size = text.len()
            + match &verdict {
                Ok(c) => c.as_str().len(),
                Err(e) => e.message.len(),
            };
        let mut cache = self.lock_cache();
        if cache.verdicts.len() >= CACHE_ENTRIES || cache.bytes + size > CACHE_BYTES {
            *cache = Cache::default();
        }
        if size <= CACHE_BYTES && cache.verdicts.insert(text, verdict).is_none() {
            cache.bytes += size;
        }
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        // A panic while holding the lock cannot leave the map inconsistent.
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// [`postgres::judge`] on a blocking-pool thread: PostgreSQL's parser is C
/// that recurses with the statement's nesting, and a guest's host call runs
/// on a small fiber stack; a thread of its own keeps a deep statement from
/// ever reaching that stack's end, and the parse off the async workers.
async fn judge_postgres(
    text: Arc<str>,
    granted: Arc<HashSet<String>>,
) -> Result<postgres::Judged, DbError> {
    tokio::task::spawn_blocking(move || postgres::judge(&text, &granted))
        .await
        .unwrap_or_else(|_| {
            Err(DbError::denied(
                "the host's SQL check failed on this statement",
            ))
        })
}

/// `sql` followed by `\n-- idem:` and [`type_letters`] (nothing when there
/// are no parameters).
fn typed_text(sql: &str, params: &[SqlValue]) -> String {
    if params.is_empty() {
        sql.to_owned()
    } else {
        format!("{sql}\n-- idem:{}", type_letters(params))
    }
}

/// What is refused before either database sees the text: too long, or a NUL
/// (both databases end the text there, and what follows would be unjudged).
fn precheck(sql: &str) -> Result<(), DbError> {
    if sql.len() > MAX_SQL_BYTES {
        return Err(DbError::denied(format!(
            "statement is {} bytes; the limit is {MAX_SQL_BYTES}",
            sql.len()
        )));
    }
    if sql.contains('\0') {
        return Err(DbError::denied(
            "statement contains a NUL character; pass such text as a parameter",
        ));
    }
    Ok(())
}

/// Why a name is never reachable, whatever the grant list says: host tables
/// (`idem_*`, `_idem_*`) and system catalogs. `None` for other names.
pub(crate) fn reserved_name(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("idem_") || lower.starts_with("_idem_") {
        Some(format!(
            "`{name}` names a host table; idem_* tables are never reachable from a handler"
        ))
    } else if RESERVED_NAMES.contains(&lower.as_str()) {
        Some(format!(
            "`{name}` names a system catalog; handlers cannot read catalogs"
        ))
    } else if lower.starts_with("pg_") || lower.starts_with("sqlite_") {
        Some(format!(
            "`{name}` is a system table; handlers cannot read it"
        ))
    } else {
        None
    }
}

/// Catalog names refused wherever they appear (lower-cased comparison).
const RESERVED_NAMES: &[&str] = &[
    "pg_catalog",
    "information_schema",
    "sqlite_master",
    "sqlite_schema",
    "sqlite_temp_master",
    "sqlite_temp_schema",
];

/// The refusal for a table that is not in the grant list.
pub(crate) fn not_granted(name: &str) -> DbError {
    DbError::denied(format!(
        "table `{name}` is not granted to this handler; grant it in [[handler]] tables"
    ))
}

/// The refusal for a statement that is not SELECT, INSERT, UPDATE or DELETE;
/// `word` names it (`SET`, `COMMIT`, `PRAGMA`, ...).
pub(crate) fn not_dml(word: &str) -> DbError {
    DbError::denied(format!(
        "{word} statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction"
    ))
}

/// The refusal for a function outside [`ALLOWED_FUNCTIONS`].
pub(crate) fn function_not_allowed(name: &str) -> DbError {
    DbError::denied(format!(
        "function `{name}` is not allowed in handler SQL (allowed: {})",
        ALLOWED_FUNCTIONS.join(", ")
    ))
}

/// `s` on one line (newlines become spaces, blank lines dropped).
pub(crate) fn one_line(s: &str) -> String {
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
    fn typed_text_names_each_parameter_type() {
        let p = [
            SqlValue::Integer(1),
            SqlValue::Text("a".into()),
            SqlValue::Null,
            SqlValue::Float(1.5),
            SqlValue::Bytes(vec![1]),
            SqlValue::Boolean(true),
        ];
        assert_eq!(typed_text("SELECT 1", &p), "SELECT 1\n-- idem:itnfbo");
        assert_eq!(typed_text("SELECT 1", &[]), "SELECT 1");
    }

    #[test]
    fn too_long_and_nul_are_refused_before_parsing() {
        let long = format!("SELECT {}", "1+".repeat(MAX_SQL_BYTES));
        let e = precheck(&long).unwrap_err();
        assert_eq!(e.kind, DbErrorKind::Denied);
        assert!(e.message.ends_with("the limit is 65536"), "{}", e.message);
        let e = precheck("SELECT 1\0; DELETE FROM accounts").unwrap_err();
        assert_eq!(
            e.message,
            "statement contains a NUL character; pass such text as a parameter"
        );
        assert!(precheck("SELECT 'é'").is_ok());
    }

    #[test]
    fn reserved_names() {
        assert_eq!(
            reserved_name("IDEM_receipts").unwrap(),
            "`IDEM_receipts` names a host table; idem_* tables are never reachable from a handler"
        );
        assert!(reserved_name("_idem_x").is_some());
        assert_eq!(
            reserved_name("information_schema").unwrap(),
            "`information_schema` names a system catalog; handlers cannot read catalogs"
        );
        assert_eq!(
            reserved_name("pg_class").unwrap(),
            "`pg_class` is a system table; handlers cannot read it"
        );
        assert!(reserved_name("sqlite_sequence").is_some());
        assert_eq!(reserved_name("accounts"), None);
        assert_eq!(reserved_name("ideM"), None);
    }

    #[test]
    fn cache_is_bounded_by_entries_and_bytes() {
        let g = SqlGuard::new(DbKind::Postgres, &[]);
        for i in 0..CACHE_ENTRIES + 10 {
            let text: Arc<str> = format!("SELECT {i}").into();
            g.remember(text, Err(DbError::denied("x")));
        }
        assert_eq!(g.cached(), 10);
        let g = SqlGuard::new(DbKind::Postgres, &[]);
        let big = "x".repeat(MAX_SQL_BYTES);
        for i in 0..100 {
            let text: Arc<str> = format!("{big}{i}").into();
            g.remember(text, Err(DbError::denied("x")));
            let c = g.lock_cache();
            assert!(c.bytes <= CACHE_BYTES, "{}", c.bytes);
            assert_eq!(
                c.bytes,
                c.verdicts.keys().map(|k| k.len() + 1).sum::<usize>()
            );
        }
        assert_eq!(g.cached(), 100 % (CACHE_BYTES / (MAX_SQL_BYTES + 3)));
    }
}
