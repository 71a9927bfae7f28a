//! Write idem handlers in Rust.
//!
//! An idem handler is a WebAssembly component of the world
//! `idem:handler/handler` (`wit/handler.wit`). The host calls its `handle`
//! export once per delivered message, inside a database transaction that
//! already holds the message's receipt. Everything the handler writes goes
//! through that one transaction: when `handle` returns `Ok`, the host commits
//! the receipt and the writes together and then acks the message; when it
//! returns an error (or traps), the host rolls everything back.
//!
//! This crate holds the generated bindings ([`bindings`]) and a small API over
//! them:
//!
//! - [`Handler`] and [`export_handler!`]: the entry point;
//! - [`tx::execute`] and [`tx::query`] with [`params!`]: SQL on the host's
//!   transaction, with `$1..$n` placeholders on every database;
//! - [`Message::json`]: the payload decoded into a serde type in one call,
//!   a payload of another shape a [`HandlerError::Reject`] (feature `json`,
//!   on by default);
//! - [`Value`]: the typed SQL values, with `From` conversions;
//! - [`Rows::iter`], [`Rows::one`] and [`Row::get`]: typed reading of query
//!   results by column name (`row.get::<i64>("balance")?`), via [`FromValue`];
//! - [`DbError`] / [`DbErrorKind`]: why a statement failed, by kind;
//! - [`HandlerError`]: `retry` (transient) or `reject` (permanent, dead-letter);
//!   every [`DbError`] converts into it, so `?` works;
//! - [`debug!`], [`info!`], [`warn!`], [`error!`]: lines in the host's log,
//!   tagged with the handler and the message identity.
//!
//! # Example
//!
//! ```no_run
//! use idem_guest::{params, tx, HandlerError, Handler, Message};
//!
//! struct Credit;
//!
//! impl Handler for Credit {
//!     fn handle(msg: Message) -> Result<(), HandlerError> {
//!         // A payload that cannot be parsed never will be: reject it.
//!         let text = msg.payload_str()?;
//!         let amount: i64 = text.trim().parse().map_err(HandlerError::reject)?;
//!         tx::execute(
//!             "UPDATE accounts SET balance = balance + $1 WHERE account_id = $2",
//!             params![amount, 73],
//!         )?;
//!         idem_guest::info!("credited {amount} for {}", msg.identity);
//!         Ok(())
//!     }
//! }
//!
//! idem_guest::export_handler!(Credit);
//! ```
//!
//! # Reading rows
//!
//! ```no_run
//! use idem_guest::{params, tx, HandlerError};
//!
//! fn balance(account: i64) -> Result<Option<i64>, HandlerError> {
//!     let rows = tx::query(
//!         "SELECT balance FROM accounts WHERE account_id = $1",
//!         params![account],
//!     )?;
//!     // `?` on a wrong type or a missing column rejects the message.
//!     rows.first().map(|row| row.get::<i64>("balance")).transpose()
//! }
//! ```
//!
//! # Building
//!
//! Build the crate as a `cdylib` for `wasm32-unknown-unknown` (a guest built
//! for `wasm32-wasip2` imports WASI interfaces, which idem links only for a
//! handler configured with `wasi = true`; a guest without WASI is the
//! stronger sandbox), then wrap the core module into a component:
//!
//! ```text
//! cargo build --release --target wasm32-unknown-unknown
//! wasm-tools component new target/wasm32-unknown-unknown/release/my_handler.wasm -o my_handler.wasm
//! ```
//!
//! A panic aborts the guest (a trap; its message goes to the host's log first):
//! the host rolls back and treats it like a retry, dead-lettering the message
//! once its deliveries run out.
//!
//! # The WIT contract
//!
//! Every item here maps to one of `wit/handler.wit` (package
//! `idem:handler@0.1.0`):
//!
//! | Rust | WIT |
//! |------|-----|
//! | [`Handler::handle`], [`export_handler!`] | the world's export `handle: func(msg: message) -> result<_, handler-error>` |
//! | [`Message`] | `types.message` |
//! | [`HandlerError`] | `types.handler-error` |
//! | [`Value`], [`Rows`] | `types.value`, `types.rows` |
//! | [`DbError`], [`DbErrorKind`] | `types.db-error`, `types.db-error-kind` |
//! | [`tx::execute`], [`tx::query`] | `transaction.execute`, `transaction.query` |
//! | [`log::debug`] .. [`log::error`] and the macros | `log.log` with `level` `debug` .. `error` |
//!
//! The component imports only `idem:handler/transaction` and
//! `idem:handler/log` (and their `types`); it exports only `handle`.

#![deny(missing_docs)]

mod decode;
mod value;

pub use decode::{FromValue, Row};
pub use value::{DbError, DbErrorKind, HandlerError, Message, Rows, Value};

/// The bindings `wit-bindgen` generates for the world `idem:handler/handler`.
///
/// Prefer the API at the crate root; these are here for what it does not cover.
#[allow(missing_docs, clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "handler",
        path: "../wit",
        pub_export_macro: true,
        export_macro_name: "export",
        default_bindings_module: "idem_guest::bindings",
    });
}

/// What a handler implements: one call per delivered message.
///
/// Return `Ok(())` to commit, [`HandlerError::Retry`] to roll back and have the
/// message delivered again later, [`HandlerError::Reject`] to roll back and
/// dead-letter it. Register the type with [`export_handler!`].
///
/// The trait is the WIT world's one export, `handle: func(msg: message) ->
/// result<_, handler-error>`. It has no `self`: the host instantiates the
/// component afresh for every message, so nothing in memory survives from
/// one message to the next; whatever must be remembered goes into the
/// database through [`tx`].
pub trait Handler {
    /// Handles one message inside the host's transaction.
    ///
    /// Everything [`tx::execute`] and [`tx::query`] change during the call
    /// commits together with the message's receipt when this returns
    /// `Ok(())`, and only then is the message acked.
    ///
    /// # Errors
    ///
    /// Either error rolls back every statement of the call, receipt included:
    ///
    /// - [`HandlerError::Retry`]: transient. The host naks the message with
    ///   the handler's retry delay (`retry_delay` or `backoff`), and
    ///   dead-letters it on the last delivery `max_deliver` allows.
    /// - [`HandlerError::Reject`]: permanent. The host stores a dead letter
    ///   (`rejected: <reason>`) and terms the message; `idem dlq redrive`
    ///   runs it again once the handler is fixed.
    ///
    /// The host keeps at most 4096 bytes of a reason (cut on a char
    /// boundary). A trap (a panic, the deadline, the memory limit) is
    /// treated like a retry.
    fn handle(msg: Message) -> Result<(), HandlerError>;
}

/// Exports a [`Handler`] as the component's `handle` function.
///
/// Use it once per crate, at the top level:
///
/// ```no_run
/// struct Noop;
/// impl idem_guest::Handler for Noop {
///     fn handle(_msg: idem_guest::Message) -> Result<(), idem_guest::HandlerError> {
///         Ok(())
///     }
/// }
/// idem_guest::export_handler!(Noop);
/// ```
#[macro_export]
macro_rules! export_handler {
    ($handler:ty) => {
        const _: () = {
            struct __IdemExport;
            impl $crate::bindings::Guest for __IdemExport {
                fn handle(
                    msg: $crate::Message,
                ) -> ::core::result::Result<(), $crate::HandlerError> {
                    $crate::__private::install_panic_hook();
                    <$handler as $crate::Handler>::handle(msg)
                }
            }
    $crate::bindings::export!(__IdemExport with_types_in $crate::bindings);
        };
    };
}

#[doc(hidden)]
pub mod __private {
    /// Sends a panic's message and location to the host's log before the
    /// abort turns it into a trap (wasm32-unknown-unknown has no stderr).
    pub fn install_panic_hook() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            std::panic::set_hook(Box::new(|info| {
                let payload = info.payload();
                let msg = payload
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("(no message)");
                let at = info
                    .location()
                    .map(|l| format!(" at {}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                crate::log::error(&format!("guest panicked{at}: {msg}"));
            }));
        });
    }
}

/// Builds a `&[Value]` parameter list from anything that converts into [`Value`].
///
/// The values bind to the placeholders `$1..$n` in order (the WIT
/// `params: list<value>` of [`tx::execute`] and [`tx::query`]). `params![]`
/// is the empty list.
///
/// ```
/// use idem_guest::{params, Value};
/// let p: &[Value] = params![73, "evt_8142", 2.5, true, None::<i64>];
/// assert_eq!(p[0], Value::Integer(73));
/// assert_eq!(p[4], Value::Null);
/// ```
#[macro_export]
macro_rules! params {
    () => {
        &[] as &[$crate::Value]
    };
    ($($value:expr),+ $(,)?) => {
        &[$($crate::Value::from($value)),+] as &[$crate::Value]
    };
}

/// SQL on the host's open transaction for the current message (the WIT
/// interface `idem:handler/transaction`).
///
/// Statements use `$1..$n` placeholders on every database. The host checks
/// each statement before it runs: only single SELECT / INSERT / UPDATE /
/// DELETE statements on the tables granted to this handler pass; anything else
/// comes back as a [`DbErrorKind::Denied`] error. A handler also has a budget of
/// statements per message and of rows per query.
///
/// Each statement runs in a savepoint of the host's transaction: a statement
/// that fails is undone alone and the transaction stays usable, so a handler
/// may catch an error (say a [`DbErrorKind::UniqueViolation`]) and go on.
///
/// The per-message bounds come from the handler's config (defaults in
/// brackets): `max_statements` statements (1000), `max_rows` rows per query
/// (10,000), `max_result_kib` KiB of values returned by all queries together
/// (8192), `max_param_kib` KiB of parameter values per statement (8192), and
/// 64 KiB of SQL text per statement. A statement still running at the
/// message's `deadline` is abandoned and the guest trapped: the call never
/// returns.
pub mod tx {
    #[cfg(doc)]
    use crate::DbErrorKind;
    use crate::bindings::idem::handler::transaction;
    use crate::{DbError, Rows, Value};

    /// Runs one INSERT, UPDATE or DELETE and returns the number of rows it affected.
    ///
    /// `sql` is one statement with `$1..$n` placeholders; `params` binds to
    /// them in order (build it with [`params!`](crate::params)). The count is
    /// what the database reports: rows inserted, updated or deleted (an
    /// `INSERT .. ON CONFLICT DO NOTHING` that met a conflict counts 0). WIT:
    /// `transaction.execute: func(sql: string, params: list<value>) ->
    /// result<u64, db-error>`.
    ///
    /// # Errors
    ///
    /// A [`DbError`] whose [`kind`](DbError::kind) says why; the statement
    /// changed nothing:
    ///
    /// - [`DbErrorKind::Denied`]: the host refused the statement before it ran
    ///   (not a single SELECT / INSERT / UPDATE / DELETE, a table not granted,
    ///   a function or cast not allowed, SQL over 64 KiB or holding a NUL,
    ///   parameters over `max_param_kib`, the `max_statements` budget spent),
    ///   or the database denied it;
    /// - [`DbErrorKind::Syntax`]: the statement does not parse;
    /// - [`DbErrorKind::UniqueViolation`]: a unique or primary key was violated;
    /// - [`DbErrorKind::ConstraintViolation`]: another constraint (foreign key,
    ///   not null, check, exclusion) was violated;
    /// - [`DbErrorKind::Other`]: anything else (a type mismatch, a statement
    ///   timeout, a deadlock, a lost connection).
    ///
    /// `?` in a [`Handler`](crate::Handler) turns it into a [`HandlerError`](crate::HandlerError):
    /// `Other` retries, every other kind rejects.
    ///
    /// ```no_run
    /// use idem_guest::{params, tx, DbErrorKind};
    /// match tx::execute("INSERT INTO seen (event_id) VALUES ($1)", params!["evt_1"]) {
    ///     Ok(_) => {}
    ///     Err(e) if e.kind == DbErrorKind::UniqueViolation => { /* already applied */ }
    ///     Err(e) => return Err(e.into()),
    /// }
    /// # Ok::<(), idem_guest::HandlerError>(())
    /// ```
    pub fn execute(sql: &str, params: &[Value]) -> Result<u64, DbError> {
        transaction::execute(sql, params)
    }

    /// Runs one SELECT (or a statement with RETURNING) and returns its rows.
    ///
    /// `sql` and `params` as for [`execute`]. The result holds the column
    /// names and each row's values in column order ([`Rows`]); read it with
    /// [`Rows::iter`], [`Rows::first`] or [`Rows::one`] and
    /// [`Row::get`](crate::Row::get). Values come back by column type on
    /// PostgreSQL (`int2/4/8` as [`Value::Integer`], `float4/8` as
    /// [`Value::Float`], `text`, `varchar`, `bpchar`, `name` as
    /// [`Value::Text`], `bytea` as [`Value::Bytes`], `bool` as
    /// [`Value::Boolean`]; cast other types in SQL), by storage class on
    /// SQLite (where booleans are integers 0 and 1). With no row the column
    /// list is empty. WIT: `transaction.query: func(sql: string, params:
    /// list<value>) -> result<rows, db-error>`.
    ///
    /// # Errors
    ///
    /// As [`execute`]; also [`DbErrorKind::Other`] (and the statement is
    /// undone) when the query returns more than `max_rows` rows, when the
    /// values returned to this message pass `max_result_kib`, or when a
    /// PostgreSQL column has a type with no [`Value`] (cast it, e.g. `::text`).
    ///
    /// ```no_run
    /// use idem_guest::{params, tx};
    /// let rows = tx::query("SELECT balance FROM accounts WHERE account_id = $1", params![73])?;
    /// // Typed: `?` rejects the message on a missing column or a wrong type.
    /// let balance: i64 = match rows.first() {
    ///     Some(row) => row.get("balance")?,
    ///     None => 0,
    /// };
    /// # Ok::<(), idem_guest::HandlerError>(())
    /// ```
    pub fn query(sql: &str, params: &[Value]) -> Result<Rows, DbError> {
        transaction::query(sql, params)
    }
}

/// Messages to publish and services to call once the message's transaction
/// commits, and only then (the WIT interface `idem:handler/outbox`).
///
/// Each call is checked at once against what the handler's config grants
/// (`publish` subjects, NATS wildcards allowed; named `endpoints`) and the
/// per-message caps (`max_outbox_calls`, 16; `max_outbox_kib`, 1024); a
/// refusal is an [`OutboxError`](outbox::OutboxError) and nothing is kept. What passes is stored
/// in the host's outbox table inside the message's transaction when
/// [`Handler::handle`] returns `Ok(())`: it commits with the effects and the
/// receipt, or, when the message is retried, rejected or traps, not at all.
/// After the commit the host's relay sends it, with a `Nats-Msg-Id` (a
/// publish) or `Idempotency-Key` (a call) derived from the message and the
/// call's place among its calls, so a send repeated after a crash is the
/// same message to the broker's duplicate window or a receiver that honours
/// the key.
///
/// ```no_run
/// use idem_guest::outbox;
/// outbox::publish("orders.accepted", br#"{"order":"o-1"}"#, &[], Some("o-1"))
///     .expect("orders.accepted is granted");
/// ```
pub mod outbox {
    use crate::bindings::idem::handler::outbox as wit;

    /// Why a publish or call was refused: not granted, past a cap, or not
    /// something the host can carry (a wildcard subject, a header the host
    /// sets such as `Nats-Msg-Id`, control characters).
    pub use wit::OutboxError;

    fn owned(headers: &[(&str, &str)]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Publishes `payload` with `headers` to the literal `subject` after the
    /// commit. Messages with the same `key` leave in commit order.
    ///
    /// # Errors
    /// [`OutboxError`]: the subject is not granted, a cap is passed, or the
    /// subject, a header or the key is refused.
    pub fn publish(
        subject: &str,
        payload: &[u8],
        headers: &[(&str, &str)],
        key: Option<&str>,
    ) -> Result<(), OutboxError> {
        wit::publish(subject, payload, &owned(headers), key)
    }

    /// POSTs `body` with `headers` to the endpoint the config names
    /// `endpoint` after the commit, with an `Idempotency-Key` header. Calls
    /// with the same `key` leave in commit order.
    ///
    /// # Errors
    /// [`OutboxError`]: the endpoint is not granted, a cap is passed, or a
    /// header or the key is refused.
    pub fn call(
        endpoint: &str,
        body: &[u8],
        headers: &[(&str, &str)],
        key: Option<&str>,
    ) -> Result<(), OutboxError> {
        wit::call(endpoint, body, &owned(headers), key)
    }
}

/// Lines for the host's log (the WIT interface `idem:handler/log`). The host
/// tags each line with the handler and the message identity, and caps the
/// bytes one message may log.
///
/// The cap is the handler's `max_log_kib` (default 64 KiB) per message; each
/// line costs its bytes plus one. A line over what is left is cut on a char
/// boundary, later lines are dropped, and the host reports the dropped bytes
/// once when the message is done. Control characters (a newline too) are
/// escaped, so one call is one line of the host's log. The host logs at the
/// line's level under the tracing target `idem::guest`; its default filter
/// (`info`) hides debug lines. When the guest traps on its own (a panic, an
/// `unreachable`; not the deadline or the memory limit), the first 512 bytes
/// of its last error line are added to the trap's reason.
///
/// The macros [`debug!`], [`info!`], [`warn!`] and [`error!`] format their
/// arguments like `format!`. Logging never fails.
pub mod log {
    use crate::bindings::idem::handler::log::{Level, log};

    /// Logs a debug line (WIT level `debug`).
    pub fn debug(message: &str) {
        log(Level::Debug, message);
    }
    /// Logs an info line (WIT level `info`).
    pub fn info(message: &str) {
        log(Level::Info, message);
    }
    /// Logs a warning (WIT level `warn`).
    pub fn warn(message: &str) {
        log(Level::Warn, message);
    }
    /// Logs an error line (WIT level `error`); a trap of the guest's own that
    /// follows carries it in its reason.
    pub fn error(message: &str) {
        log(Level::Error, message);
    }
}

/// Logs a debug line, formatted like `format!`.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log::debug(&::std::format!($($arg)+)) };
}

/// Logs an info line, formatted like `format!`: `idem_guest::info!("credited {amount}")`.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log::info(&::std::format!($($arg)+)) };
}

/// Logs a warning, formatted like `format!`.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log::warn(&::std::format!($($arg)+)) };
}

/// Logs an error line, formatted like `format!`.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log::error(&::std::format!($($arg)+)) };
}
