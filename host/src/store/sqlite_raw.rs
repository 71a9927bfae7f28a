//! The one place idem calls SQLite's C API itself, for what sqlx does not
//! expose: compiling a guest statement with an authorizer consulted for
//! everything it would touch, reading the compiled program, asking whether a
//! transaction is still open, and the length limit on values.
//!
//! # Why `unsafe`, and why it is sound
//!
//! sqlx gives a SQLite connection's raw `sqlite3*` through
//! `LockedSqliteHandle::as_raw_handle`; the lock keeps sqlx's worker thread
//! off the connection while the handle is held. A message transaction's
//! connection (rusqlite, `store::sqlite::direct`) gives it through
//! [`handle_of`], borrowed from the connection, which is used on one task at
//! a time. Every function here takes that handle and uses it only before
//! returning. The rules followed
//! (<https://www.sqlite.org/c3ref/intro.html>):
//! - the authorizer's user data points at a [`Ctx`] on this function's stack,
//!   and the authorizer is removed again before the function returns, on
//!   every path (a drop guard), so SQLite never calls it with a dangling
//!   pointer; a panic in the policy is caught inside the callback and denies;
//! - every statement prepared here is finalized before returning (drop guard);
//!   SQL text is passed with its byte length, so no NUL terminator is needed;
//! - strings SQLite hands back are copied before the next call that could
//!   free them.
#![allow(unsafe_code)]

use libsqlite3_sys as ffi;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::NonNull;

/// One question SQLite asks its authorizer while it compiles a statement
/// (<https://www.sqlite.org/c3ref/set_authorizer.html>): `action` is one of
/// the action codes (`SQLITE_READ`, `SQLITE_INSERT`, `SQLITE_FUNCTION`, ...);
/// `arg1`/`arg2` depend on it (table and column, function name, pragma...);
/// `database` is the schema (`main`, `temp`, an attached name); `inner` the
/// innermost trigger or view that caused the access. Text that is not UTF-8
/// arrives as `None`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub action: c_int,
    pub arg1: Option<&'a str>,
    pub arg2: Option<&'a str>,
    pub database: Option<&'a str>,
    pub inner: Option<&'a str>,
}

/// An authorizer policy that also gets the tables and views of `main`
/// (lower-cased), as [`crate::store::Tx::compile_judged`] passes them.
pub(crate) type SchemaPolicy<'a> =
    dyn FnMut(&Request<'_>, &std::collections::HashSet<String>) -> Result<(), String> + Send + 'a;

/// The raw handle of `conn`, for the functions here; `None` when the
/// connection is closed.
pub(crate) fn handle_of(conn: &rusqlite::Connection) -> Option<NonNull<ffi::sqlite3>> {
    // SAFETY: rusqlite's handle stays valid while `conn` is open; the caller
    // holds `conn` borrowed while it uses the handle, and the functions here
    // use it only before they return.
    NonNull::new(unsafe { conn.handle() })
}

/// What compiling the text showed, when SQLite accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Compiled {
    /// Each parameter's name by index (`$1`, `?`, `:a`...; `None` for a bare `?`).
    pub params: Vec<Option<String>>,
    /// The opcodes of the compiled program (triggers' sub-programs included)
    /// that the caller asked to be told about, with their P2 operand.
    pub flagged: Vec<(String, i64)>,
    /// The statement is itself an `EXPLAIN`.
    pub is_explain: bool,
}

/// Why the text did not compile to exactly one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CompileError {
    /// The authorizer refused; the first refusal's reason.
    Refused(String),
    /// SQLite refused it (syntax, unknown table, ...): its extended code and message.
    Sqlite { code: c_int, message: String },
    /// The text holds no statement (only whitespace, comments or `;`).
    Empty,
    /// The text holds more than one statement, or text after it that SQLite
    /// would try to run.
    Several,
}

struct Ctx<'f> {
    authorize: &'f mut dyn FnMut(&Request<'_>) -> Result<(), String>,
    refused: Option<String>,
}

fn text<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        None
    } else {
        // SAFETY: SQLite passes NUL-terminated strings valid for the call.
        unsafe { CStr::from_ptr(p) }.to_str().ok()
    }
}

unsafe extern "C" fn authorizer(
    user: *mut c_void,
    action: c_int,
    a1: *const c_char,
    a2: *const c_char,
    a3: *const c_char,
    a4: *const c_char,
) -> c_int {
    // SAFETY: `user` is the `Ctx` installed by `compile_judged`, alive and
    // not otherwise borrowed until the authorizer is removed.
    let ctx = unsafe { &mut *user.cast::<Ctx<'_>>() };
    let request = Request {
        action,
        arg1: text(a1),
        arg2: text(a2),
        database: text(a3),
        inner: text(a4),
    };
    let verdict =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (ctx.authorize)(&request)))
            .unwrap_or_else(|_| Err("the host's SQL check failed".to_owned()));
    match verdict {
        Ok(()) => ffi::SQLITE_OK,
        Err(why) => {
            ctx.refused.get_or_insert(why);
            ffi::SQLITE_DENY
        }
    }
}

/// Removes the authorizer when dropped.
struct AuthorizerInstalled(*mut ffi::sqlite3);

impl Drop for AuthorizerInstalled {
    fn drop(&mut self) {
        // SAFETY: the handle is valid for the whole of `compile_judged`.
        unsafe { ffi::sqlite3_set_authorizer(self.0, None, std::ptr::null_mut()) };
    }
}

/// Foreign-key enforcement switched off on the connection for as long as this
/// lives, then switched back on when it had been on.
///
/// SQLite asks the authorizer to read a parent table's key columns when it
/// compiles a write to a child table (`sqlite3FkCheck`, fkey.c), in the same
/// shape as a read the statement itself makes. That check is the schema's
/// rule, not the handler's read (PostgreSQL runs it as the table owner,
/// whatever the role), so the judge compiles with enforcement off and sees
/// only what the statement itself touches. `SQLITE_DBCONFIG_ENABLE_FKEY`
/// (<https://www.sqlite.org/c3ref/c_dbconfig_defensive.html>) works inside a
/// transaction, unlike `PRAGMA foreign_keys`; changing it expires the
/// connection's prepared statements, which SQLite prepares again on their next
/// step. The statement that later runs is prepared with enforcement on.
struct ForeignKeysOff {
    db: *mut ffi::sqlite3,
    was_on: bool,
}

impl ForeignKeysOff {
    fn new(db: *mut ffi::sqlite3) -> Self {
        let mut now: c_int = 0;
        // SAFETY: valid handle; -1 only reads the setting into `now`.
        unsafe {
            ffi::sqlite3_db_config(db, ffi::SQLITE_DBCONFIG_ENABLE_FKEY, -1 as c_int, &mut now)
        };
        let was_on = now != 0;
        if was_on {
            let mut after: c_int = 0;
            // SAFETY: as above; 0 switches enforcement off.
            unsafe {
                ffi::sqlite3_db_config(db, ffi::SQLITE_DBCONFIG_ENABLE_FKEY, 0 as c_int, &mut after)
            };
        }
        Self { db, was_on }
    }
}

impl Drop for ForeignKeysOff {
    fn drop(&mut self) {
        if self.was_on {
            let mut after: c_int = 0;
            // SAFETY: the handle is valid for the whole of `compile_judged`.
            unsafe {
                ffi::sqlite3_db_config(
                    self.db,
                    ffi::SQLITE_DBCONFIG_ENABLE_FKEY,
                    1 as c_int,
                    &mut after,
                )
            };
        }
    }
}

/// Finalizes the statement when dropped.
struct Statement(*mut ffi::sqlite3_stmt);

impl Drop for Statement {
    fn drop(&mut self) {
        // SAFETY: finalizing NULL is a no-op; otherwise the statement came
        // from sqlite3_prepare_v3 on a handle still valid here.
        unsafe { ffi::sqlite3_finalize(self.0) };
    }
}

fn last_error(db: *mut ffi::sqlite3) -> CompileError {
    // SAFETY: valid handle; the message is copied before any other call.
    let code = unsafe { ffi::sqlite3_extended_errcode(db) };
    let message = text(unsafe { ffi::sqlite3_errmsg(db) })
        .unwrap_or("unknown error")
        .to_owned();
    CompileError::Sqlite { code, message }
}

/// Prepares the statement at `sql[from..]`; returns it (NULL when only
/// whitespace, comments or `;` were there) and where the rest starts.
fn prepare(
    db: *mut ffi::sqlite3,
    sql: &str,
    from: usize,
) -> Result<(Statement, usize), CompileError> {
    let rest = &sql.as_bytes()[from..];
    let len = c_int::try_from(rest.len()).map_err(|_| CompileError::Several)?;
    let mut stmt = std::ptr::null_mut();
    let mut tail: *const c_char = std::ptr::null();
    // SAFETY: `rest` is valid for `len` bytes; SQLite sets `tail` inside it.
    let rc =
        unsafe { ffi::sqlite3_prepare_v3(db, rest.as_ptr().cast(), len, 0, &mut stmt, &mut tail) };
    let stmt = Statement(stmt);
    if rc != ffi::SQLITE_OK {
        return Err(last_error(db));
    }
    let used = if tail.is_null() {
        rest.len()
    } else {
        // SAFETY: SQLite points `tail` into `rest` (at most one past its end).
        usize::try_from(unsafe { tail.offset_from(rest.as_ptr().cast()) }).unwrap_or(rest.len())
    };
    Ok((stmt, from + used.min(rest.len())))
}

/// Compiles `sql` on `db` exactly as a later execution of the same text on
/// the same connection will (same text, same schema), with `authorize`
/// consulted for every action SQLite checks while compiling: the tables and
/// columns read or written (through views and triggers too), functions,
/// pragmas, attach, transaction and schema changes. The statement is not run.
/// Foreign-key enforcement is off while it compiles (see [`ForeignKeysOff`]),
/// so a parent table's key read by the constraint check is not asked about.
/// Text after the first statement must be only whitespace, comments or `;`
/// (sqlx would run anything else as further statements); it is compiled too,
/// with `authorize` still installed, and never run.
///
/// `flag_opcodes`: opcode names to report (with their P2 operand) from the
/// compiled program, read with `sqlite3_stmt_explain`
/// (<https://www.sqlite.org/c3ref/stmt_explain.html>); EXPLAIN lists the
/// programs of the triggers the statement fires as well.
///
/// # Errors
/// [`CompileError`]: refused by `authorize`, rejected by SQLite, no statement,
/// or more than one.
pub(crate) fn compile_judged(
    handle: NonNull<ffi::sqlite3>,
    sql: &str,
    authorize: &mut dyn FnMut(&Request<'_>) -> Result<(), String>,
    flag_opcodes: &[&str],
) -> Result<Compiled, CompileError> {
    let db = handle.as_ptr();
    // Declared before the statements so it is dropped after they are finalized.
    let _foreign_keys_off = ForeignKeysOff::new(db);
    let mut ctx = Ctx {
        authorize,
        refused: None,
    };
    // SAFETY: `ctx` outlives the installation, which the guard below ends.
    unsafe {
        ffi::sqlite3_set_authorizer(
            db,
            Some(authorizer),
            std::ptr::from_mut(&mut ctx).cast::<c_void>(),
        )
    };
    let installed = AuthorizerInstalled(db);
    let mut first: Option<Statement> = None;
    let mut at = 0;
    while at < sql.len() {
        let (stmt, next) = match prepare(db, sql, at) {
            Ok(ok) => ok,
            Err(e) => {
                drop(installed);
                return Err(match (ctx.refused.take(), &first) {
                    (Some(why), None) => CompileError::Refused(why),
                    (_, Some(_)) => CompileError::Several,
                    (None, None) => e,
                });
            }
        };
        if !stmt.0.is_null() {
            if first.is_some() {
                return Err(CompileError::Several);
            }
            first = Some(stmt);
        }
        if next <= at {
            break;
        }
        at = next;
    }
    drop(installed);
    if let Some(why) = ctx.refused {
        return Err(CompileError::Refused(why));
    }
    let Some(stmt) = first else {
        return Err(CompileError::Empty);
    };
    let s = stmt.0;
    // SAFETY: `s` is a live prepared statement until `stmt` drops.
    let count = unsafe { ffi::sqlite3_bind_parameter_count(s) };
    let params = (1..=count)
        .map(|i| text(unsafe { ffi::sqlite3_bind_parameter_name(s, i) }).map(str::to_owned))
        .collect();
    let is_explain = unsafe { ffi::sqlite3_stmt_isexplain(s) } != 0;
    let mut flagged = Vec::new();
    if !is_explain && !flag_opcodes.is_empty() {
        if unsafe { ffi::sqlite3_stmt_explain(s, 1) } != ffi::SQLITE_OK {
            return Err(last_error(db));
        }
        // EXPLAIN columns: addr, opcode, p1, p2, p3, p4, p5, comment.
        loop {
            match unsafe { ffi::sqlite3_step(s) } {
                ffi::SQLITE_ROW => {}
                ffi::SQLITE_DONE => break,
                _ => return Err(last_error(db)),
            }
            let opcode = text(unsafe { ffi::sqlite3_column_text(s, 1) }.cast()).unwrap_or("");
            if flag_opcodes.contains(&opcode) {
                let p2 = unsafe { ffi::sqlite3_column_int64(s, 3) };
                flagged.push((opcode.to_owned(), p2));
            }
        }
    }
    Ok(Compiled {
        params,
        flagged,
        is_explain,
    })
}

/// The names of the tables and views in the `main` schema (as stored), read
/// from `sqlite_schema` with no authorizer installed.
///
/// # Errors
/// SQLite's error when the schema cannot be read.
pub(crate) fn main_tables(handle: NonNull<ffi::sqlite3>) -> Result<Vec<String>, CompileError> {
    const SQL: &str = "SELECT name FROM main.sqlite_schema WHERE type IN ('table', 'view')";
    let db = handle.as_ptr();
    let (stmt, _) = prepare(db, SQL, 0)?;
    let mut names = Vec::new();
    loop {
        // SAFETY: a live statement of this connection; the text is copied at once.
        match unsafe { ffi::sqlite3_step(stmt.0) } {
            ffi::SQLITE_ROW => {
                if let Some(name) = text(unsafe { ffi::sqlite3_column_text(stmt.0, 0) }.cast()) {
                    names.push(name.to_owned());
                }
            }
            ffi::SQLITE_DONE => return Ok(names),
            _ => return Err(last_error(db)),
        }
    }
}

/// Sets the most bytes any one string, BLOB or row may have on this
/// connection (`SQLITE_LIMIT_LENGTH`; <https://www.sqlite.org/limits.html>):
/// creating or reading a larger one fails with SQLITE_TOOBIG. Returns the
/// previous limit. SQLite caps the value at its compile-time maximum.
pub(crate) fn set_length_limit(handle: NonNull<ffi::sqlite3>, bytes: usize) -> usize {
    let bytes = c_int::try_from(bytes).unwrap_or(c_int::MAX).max(1);
    // SAFETY: a valid, locked handle.
    let previous = unsafe { ffi::sqlite3_limit(handle.as_ptr(), ffi::SQLITE_LIMIT_LENGTH, bytes) };
    usize::try_from(previous).unwrap_or(0)
}

/// The length limit built in at compile time: what [`set_length_limit`]
/// restores after a guest.
pub(crate) const DEFAULT_LENGTH_LIMIT: usize = 1_000_000_000;
