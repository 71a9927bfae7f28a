//! SQLite: SQLite's own compiler judges the statement. The text is compiled
//! (never run) on the message's own connection while an authorizer
//! (<https://www.sqlite.org/c3ref/set_authorizer.html>) answers every
//! question SQLite asks about it; [`authorize`] denies by default. Because
//! SQLite resolves the names itself, a CTE, an alias or a subquery is never
//! mistaken for a table or the other way round, and views and triggers report
//! the tables they reach.
//!
//! Allowed: `SELECT` and recursive CTEs; reading, inserting, updating and
//! deleting in granted tables of the `main` schema; the functions of
//! [`ALLOWED_FUNCTIONS`] plus the ones SQLite calls for `LIKE`, `GLOB`,
//! `IFNULL` and `IIF`. Everything else (pragmas, attach and detach,
//! transactions and savepoints, schema changes, other functions) is refused.
//!
//! Some things SQLite does not ask its authorizer about, so the compiled
//! program is read too (`EXPLAIN`, [`FORBIDDEN_OPCODES`]): `VACUUM` (which
//! asks nothing), and a conflict resolution of `ROLLBACK` (`INSERT OR
//! ROLLBACK`, an `ON CONFLICT ROLLBACK` column, `RAISE(ROLLBACK)` in a
//! trigger), which would end the host's transaction and let later statements
//! run outside it. A statement must also have asked to read or write at least
//! once (every SELECT, INSERT, UPDATE and DELETE does).

// Guest- and message-supplied bytes are read with `get`, iterators and
// checked splits, never indexed or sliced: an offset out of range would
// panic the host (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

use super::{ALLOWED_FUNCTIONS, MAX_PLACEHOLDER, function_not_allowed, not_dml, not_granted};
use crate::sql_value::{DbError, DbErrorKind};
use crate::store::Tx;
use crate::store::sqlite_raw::{CompileError, Compiled, Request};
use libsqlite3_sys as ffi;
use std::collections::HashSet;

/// Functions SQLite itself calls for operators and shorthands (`x LIKE y` is
/// `like(y, x)`), allowed besides [`ALLOWED_FUNCTIONS`].
const SQLITE_OPERATOR_FUNCTIONS: &[&str] = &["like", "glob", "ifnull", "iif"];

/// Opcodes a guest program may not contain, and why. `Halt`/`HaltIfNull` are
/// refused only with P2 = 1 (`OE_Rollback`: the conflict rolls back the whole
/// transaction); elsewhere they end the statement normally.
pub const FORBIDDEN_OPCODES: &[&str] = &[
    "Halt",
    "HaltIfNull",
    "Vacuum",
    "AutoCommit",
    "Savepoint",
    "ParseSchema",
    "DropTable",
    "DropIndex",
    "DropTrigger",
    "VCreate",
    "VDestroy",
    "SqlExec",
    "Checkpoint",
    "JournalMode",
];

/// SQLite's `OE_Rollback` conflict resolution, as P2 of `Halt`.
const OE_ROLLBACK: i64 = 1;

/// Compiles `sql` on `tx`'s connection under [`authorize`] and returns the
/// highest `$n` placeholder.
///
/// # Errors
/// `Denied`: refused by the authorizer, several statements, a forbidden
/// conflict action or opcode, a placeholder not written `$n`; `Syntax`: SQLite
/// could not compile it; `Other`: the connection failed.
pub(crate) async fn judge(
    tx: &mut Tx,
    sql: &str,
    granted: &HashSet<String>,
) -> Result<usize, DbError> {
    let mut touched = false;
    let mut policy = |r: &Request<'_>, tables: &HashSet<String>| {
        let verdict = authorize(r, granted, tables);
        touched |= verdict.is_ok() && is_data_access(r.action);
        verdict.map_err(|e| e.message)
    };
    let compiled = tx
        .compile_judged(sql, &mut policy, FORBIDDEN_OPCODES)
        .await?;
    let compiled = compiled.map_err(|e| match e {
        CompileError::Refused(why) => DbError::denied(why),
        CompileError::Sqlite { code, message } => DbError {
            kind: DbErrorKind::Syntax,
            message: super::one_line(&format!(
                "statement does not compile: {message} (SQLite code {code})"
            )),
        },
        CompileError::Empty => DbError::denied("empty statement; send exactly one"),
        CompileError::Several => DbError::denied(
            "more than one statement in one call (or text after it); send exactly one",
        ),
    })?;
    verdict_on_program(&compiled, touched)
}

/// What the compiled program and the authorizer's log say, once SQLite
/// accepted the text.
fn verdict_on_program(compiled: &Compiled, touched: bool) -> Result<usize, DbError> {
    if compiled.is_explain {
        return Err(not_dml("EXPLAIN"));
    }
    for (opcode, p2) in &compiled.flagged {
        match opcode.as_str() {
            "Halt" | "HaltIfNull" if *p2 == OE_ROLLBACK => {
                return Err(DbError::denied(
                    "a conflict resolution of ROLLBACK would end the host's transaction; \
                     use ABORT, FAIL, IGNORE or REPLACE (or catch the error)",
                ));
            }
            "Halt" | "HaltIfNull" => {}
            "Vacuum" => return Err(not_dml("VACUUM")),
            other => {
                return Err(DbError::denied(format!(
                    "the statement compiles to `{other}`, which changes the schema, the \
                     transaction or the database file; a handler runs only SELECT, INSERT, \
                     UPDATE or DELETE in the host's transaction"
                )));
            }
        }
    }
    if !touched {
        return Err(DbError::denied(
            "this statement reads and writes no table; a handler runs only SELECT, INSERT, \
             UPDATE or DELETE in the host's transaction",
        ));
    }
    placeholders(&compiled.params)
}

/// Every parameter must be named `$n` (1 ≤ n ≤ 65535, no leading zero); the
/// highest n is returned. sqlx binds value n to the parameter named `$n`.
fn placeholders(names: &[Option<String>]) -> Result<usize, DbError> {
    let mut max = 0;
    for name in names {
        let n = name
            .as_deref()
            .and_then(|n| n.strip_prefix('$'))
            .filter(|d| {
                !d.starts_with('0') && !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
            })
            .and_then(|d| d.parse::<usize>().ok())
            .filter(|n| (1..=MAX_PLACEHOLDER).contains(n));
        match n {
            Some(n) => max = max.max(n),
            None => {
                return Err(DbError::denied(format!(
                    "placeholder `{}` is not supported; write parameters as $1..$n (at most ${MAX_PLACEHOLDER})",
                    name.as_deref().unwrap_or("?")
                )));
            }
        }
    }
    Ok(max)
}

fn is_data_access(action: i32) -> bool {
    matches!(
        action,
        ffi::SQLITE_SELECT
            | ffi::SQLITE_READ
            | ffi::SQLITE_INSERT
            | ffi::SQLITE_UPDATE
            | ffi::SQLITE_DELETE
    )
}

/// The authorizer's policy for one request; deny by default. `tables`: the
/// tables and views of `main`, lower-cased.
///
/// # Errors
/// A `Denied` error saying what is refused, for anything but the reads,
/// writes and functions described in the module documentation.
pub(crate) fn authorize(
    r: &Request<'_>,
    granted: &HashSet<String>,
    tables: &HashSet<String>,
) -> Result<(), DbError> {
    match r.action {
        // A FROM item none of whose columns is used (`SELECT count(*) FROM t`)
        // is reported as a read of column "" with no schema, whether it is a
        // table or a subquery / CTE (sqlite3.c, "null SQLITE_READ
        // authorizations"). A name that is no table or view of `main` is
        // then a subquery or CTE, which reads only what its own body was
        // judged for; a CTE named like a table is judged as that table.
        ffi::SQLITE_READ
            if r.arg2 == Some("")
                && r.database.is_none()
                && r.arg1.is_some_and(|n| {
                    !tables.contains(&n.to_ascii_lowercase()) && super::reserved_name(n).is_none()
                }) =>
        {
            Ok(())
        }
        ffi::SQLITE_SELECT | ffi::SQLITE_RECURSIVE => Ok(()),
        // arg1: table (arg2: column for READ and UPDATE).
        // `inner`: the trigger or view through which the table is reached.
        // Writing the schema table is how CREATE, DROP and ALTER begin.
        ffi::SQLITE_INSERT | ffi::SQLITE_UPDATE | ffi::SQLITE_DELETE
            if r.arg1.is_some_and(is_schema_table) =>
        {
            Err(not_dml("CREATE, DROP and ALTER"))
        }
        ffi::SQLITE_READ | ffi::SQLITE_INSERT | ffi::SQLITE_UPDATE | ffi::SQLITE_DELETE => {
            table(r.arg1, r.database, granted).map_err(|e| match r.inner {
                Some(via) => DbError::denied(format!("{} (reached through `{via}`)", e.message)),
                None => e,
            })
        }
        // arg2: the function's name.
        ffi::SQLITE_FUNCTION => {
            let name = r.arg2.unwrap_or("").to_ascii_lowercase();
            if ALLOWED_FUNCTIONS.contains(&name.as_str())
                || SQLITE_OPERATOR_FUNCTIONS.contains(&name.as_str())
            {
                Ok(())
            } else {
                Err(function_not_allowed(r.arg2.unwrap_or("?")))
            }
        }
        // arg1: BEGIN / COMMIT / ROLLBACK.
        ffi::SQLITE_TRANSACTION => Err(not_dml(r.arg1.unwrap_or("BEGIN"))),
        // arg1: BEGIN (SAVEPOINT), RELEASE or ROLLBACK (ROLLBACK TO).
        ffi::SQLITE_SAVEPOINT => Err(not_dml(match r.arg1 {
            Some("RELEASE") => "RELEASE",
            Some("ROLLBACK") => "ROLLBACK TO",
            _ => "SAVEPOINT",
        })),
        ffi::SQLITE_PRAGMA => Err(not_dml("PRAGMA")),
        ffi::SQLITE_ATTACH => Err(not_dml("ATTACH")),
        ffi::SQLITE_DETACH => Err(not_dml("DETACH")),
        ffi::SQLITE_ALTER_TABLE => Err(not_dml("ALTER")),
        ffi::SQLITE_REINDEX => Err(not_dml("REINDEX")),
        ffi::SQLITE_ANALYZE => Err(not_dml("ANALYZE")),
        ffi::SQLITE_CREATE_INDEX
        | ffi::SQLITE_CREATE_TABLE
        | ffi::SQLITE_CREATE_TEMP_INDEX
        | ffi::SQLITE_CREATE_TEMP_TABLE
        | ffi::SQLITE_CREATE_TEMP_TRIGGER
        | ffi::SQLITE_CREATE_TEMP_VIEW
        | ffi::SQLITE_CREATE_TRIGGER
        | ffi::SQLITE_CREATE_VIEW
        | ffi::SQLITE_CREATE_VTABLE => Err(not_dml("CREATE")),
        ffi::SQLITE_DROP_INDEX
        | ffi::SQLITE_DROP_TABLE
        | ffi::SQLITE_DROP_TEMP_INDEX
        | ffi::SQLITE_DROP_TEMP_TABLE
        | ffi::SQLITE_DROP_TEMP_TRIGGER
        | ffi::SQLITE_DROP_TEMP_VIEW
        | ffi::SQLITE_DROP_TRIGGER
        | ffi::SQLITE_DROP_VIEW
        | ffi::SQLITE_DROP_VTABLE => Err(not_dml("DROP")),
        other => Err(DbError::denied(format!(
            "SQLite action {other} is not allowed in handler SQL; a handler runs only SELECT, \
             INSERT, UPDATE or DELETE on its granted tables"
        ))),
    }
}

fn is_schema_table(name: &str) -> bool {
    [
        "sqlite_master",
        "sqlite_temp_master",
        "sqlite_schema",
        "sqlite_temp_schema",
    ]
    .iter()
    .any(|t| name.eq_ignore_ascii_case(t))
}

/// A table in `main` that is granted and not reserved. SQLite names no
/// schema for the table of a `count(*)`-style read (`None`): guests cannot
/// attach databases or create temporary tables, so that is `main` too.
fn table(
    name: Option<&str>,
    database: Option<&str>,
    granted: &HashSet<String>,
) -> Result<(), DbError> {
    let Some(name) = name else {
        return Err(DbError::denied(
            "a table without a readable name is not allowed",
        ));
    };
    if let Some(why) = super::reserved_name(name) {
        return Err(DbError::denied(why));
    }
    if database.is_some_and(|d| d != "main") {
        return Err(DbError::denied(format!(
            "schema `{}` is not allowed; use unqualified table names (or `main.`)",
            database.unwrap_or("?")
        )));
    }
    if granted.contains(&name.to_ascii_lowercase()) {
        Ok(())
    } else {
        Err(not_granted(name))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn granted() -> HashSet<String> {
        ["accounts".to_string()].into_iter().collect()
    }

    fn tables() -> HashSet<String> {
        ["accounts", "secrets"]
            .iter()
            .map(|t| t.to_string())
            .collect()
    }

    fn authorize(r: &Request<'_>, g: &HashSet<String>) -> Result<(), DbError> {
        super::authorize(r, g, &tables())
    }

    fn req(
        action: i32,
        arg1: Option<&'static str>,
        arg2: Option<&'static str>,
    ) -> Request<'static> {
        Request {
            action,
            arg1,
            arg2,
            database: Some("main"),
            inner: None,
        }
    }

    #[test]
    fn granted_tables_in_main_only() {
        let g = granted();
        for action in [
            ffi::SQLITE_READ,
            ffi::SQLITE_INSERT,
            ffi::SQLITE_UPDATE,
            ffi::SQLITE_DELETE,
        ] {
            assert!(authorize(&req(action, Some("accounts"), Some("balance")), &g).is_ok());
            assert!(authorize(&req(action, Some("ACCOUNTS"), None), &g).is_ok());
            let e = authorize(&req(action, Some("secrets"), Some("v")), &g).unwrap_err();
            assert_eq!(
                e.message,
                "table `secrets` is not granted to this handler; grant it in [[handler]] tables"
            );
            let e = authorize(&req(action, Some("idem_receipts"), None), &g).unwrap_err();
            assert!(e.message.contains("names a host table"), "{}", e.message);
            let e = authorize(&req(action, Some("sqlite_schema"), None), &g).unwrap_err();
            let want = if action == ffi::SQLITE_READ {
                "`sqlite_schema` names a system catalog"
            } else {
                "CREATE, DROP and ALTER statements are not allowed"
            };
            assert!(e.message.starts_with(want), "{}", e.message);
            let e = authorize(&req(action, None, None), &g).unwrap_err();
            assert_eq!(e.kind, DbErrorKind::Denied);
            let mut none = req(action, Some("accounts"), None);
            none.database = None;
            assert!(authorize(&none, &g).is_ok());
            let mut temp = req(action, Some("accounts"), None);
            temp.database = Some("temp");
            let e = authorize(&temp, &g).unwrap_err();
            assert!(
                e.message.starts_with("schema `temp` is not allowed"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn an_unused_from_item_is_a_table_only_if_main_has_it() {
        let g = granted();
        let unused = |name: &'static str| Request {
            action: ffi::SQLITE_READ,
            arg1: Some(name),
            arg2: Some(""),
            database: None,
            inner: None,
        };
        assert!(authorize(&unused("accounts"), &g).is_ok());
        assert!(authorize(&unused("r"), &g).is_ok());
        let e = authorize(&unused("sqlite_master"), &g).unwrap_err();
        assert!(e.message.contains("system catalog"), "{}", e.message);
        let e = authorize(&unused("idem_receipts"), &g).unwrap_err();
        assert!(e.message.contains("host table"), "{}", e.message);
        let e = authorize(&unused("secrets"), &g).unwrap_err();
        assert_eq!(
            e.message,
            "table `secrets` is not granted to this handler; grant it in [[handler]] tables"
        );
        let e = authorize(&unused("SECRETS"), &g).unwrap_err();
        assert!(
            e.message.starts_with("table `SECRETS` is not granted"),
            "{}",
            e.message
        );
    }

    #[test]
    fn functions_on_the_allow_list_only() {
        let g = granted();
        for f in ["abs", "COUNT", "substr", "like", "iif"] {
            assert!(
                authorize(&req(ffi::SQLITE_FUNCTION, None, Some(f)), &g).is_ok(),
                "{f}"
            );
        }
        for f in [
            "zeroblob",
            "randomblob",
            "printf",
            "load_extension",
            "sqlite_version",
            "random",
            "datetime",
            "unknown",
        ] {
            let e = authorize(&req(ffi::SQLITE_FUNCTION, None, Some(f)), &g).unwrap_err();
            assert!(
                e.message
                    .starts_with(&format!("function `{f}` is not allowed")),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn everything_else_is_refused() {
        let g = granted();
        let cases = [
            (
                ffi::SQLITE_TRANSACTION,
                Some("COMMIT"),
                "COMMIT statements are not allowed",
            ),
            (
                ffi::SQLITE_SAVEPOINT,
                Some("RELEASE"),
                "RELEASE statements are not allowed",
            ),
            (
                ffi::SQLITE_SAVEPOINT,
                Some("BEGIN"),
                "SAVEPOINT statements are not allowed",
            ),
            (
                ffi::SQLITE_PRAGMA,
                Some("writable_schema"),
                "PRAGMA statements are not allowed",
            ),
            (
                ffi::SQLITE_ATTACH,
                Some("/tmp/x.db"),
                "ATTACH statements are not allowed",
            ),
            (
                ffi::SQLITE_DETACH,
                Some("x"),
                "DETACH statements are not allowed",
            ),
            (
                ffi::SQLITE_CREATE_TEMP_TABLE,
                Some("t"),
                "CREATE statements are not allowed",
            ),
            (
                ffi::SQLITE_DROP_TABLE,
                Some("accounts"),
                "DROP statements are not allowed",
            ),
            (
                ffi::SQLITE_ALTER_TABLE,
                Some("main"),
                "ALTER statements are not allowed",
            ),
            (ffi::SQLITE_COPY, None, "SQLite action 0 is not allowed"),
        ];
        for (action, arg1, want) in cases {
            let e = authorize(&req(action, arg1, None), &g).unwrap_err();
            assert!(e.message.starts_with(want), "{action}: {}", e.message);
        }
        assert!(authorize(&req(ffi::SQLITE_SELECT, None, None), &g).is_ok());
        assert!(authorize(&req(ffi::SQLITE_RECURSIVE, None, None), &g).is_ok());
    }

    #[test]
    fn placeholders_are_dollar_numbers() {
        let names = |v: &[&str]| v.iter().map(|s| Some((*s).to_string())).collect::<Vec<_>>();
        assert_eq!(placeholders(&names(&["$2", "$1"])).unwrap(), 2);
        assert_eq!(placeholders(&[]).unwrap(), 0);
        for bad in ["?1", ":a", "@a", "$0", "$01", "$65536", "$a"] {
            let e = placeholders(&names(&[bad])).unwrap_err();
            assert!(
                e.message.starts_with(&format!("placeholder `{bad}`")),
                "{}",
                e.message
            );
        }
        let e = placeholders(&[None]).unwrap_err();
        assert!(e.message.starts_with("placeholder `?`"), "{}", e.message);
    }

    #[test]
    fn rollback_conflicts_and_schema_opcodes_are_refused() {
        let prog = |flagged: Vec<(&str, i64)>| Compiled {
            params: vec![],
            flagged: flagged
                .into_iter()
                .map(|(o, p)| (o.to_string(), p))
                .collect(),
            is_explain: false,
        };
        assert_eq!(
            verdict_on_program(&prog(vec![("Halt", 0), ("Halt", 2)]), true).unwrap(),
            0
        );
        let e = verdict_on_program(&prog(vec![("Halt", 1)]), true).unwrap_err();
        assert!(
            e.message.starts_with("a conflict resolution of ROLLBACK"),
            "{}",
            e.message
        );
        let e = verdict_on_program(&prog(vec![("HaltIfNull", 1)]), true).unwrap_err();
        assert!(
            e.message.starts_with("a conflict resolution of ROLLBACK"),
            "{}",
            e.message
        );
        let e = verdict_on_program(&prog(vec![("Vacuum", 0)]), true).unwrap_err();
        assert!(
            e.message.starts_with("VACUUM statements are not allowed"),
            "{}",
            e.message
        );
        let e = verdict_on_program(&prog(vec![("ParseSchema", 0)]), true).unwrap_err();
        assert!(
            e.message.contains("compiles to `ParseSchema`"),
            "{}",
            e.message
        );
        let e = verdict_on_program(&prog(vec![]), false).unwrap_err();
        assert!(
            e.message
                .starts_with("this statement reads and writes no table"),
            "{}",
            e.message
        );
        let mut explain = prog(vec![]);
        explain.is_explain = true;
        let e = verdict_on_program(&explain, true).unwrap_err();
        assert!(e.message.starts_with("EXPLAIN statements"), "{}", e.message);
    }
}
