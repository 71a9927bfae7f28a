//! A handler compiled into the host instead of loaded as a component
//! (cargo feature `native-handler`; off in every build idem ships). It
//! exists for the throughput benchmark's `native` row: the same pipeline,
//! receipt and COMMIT, and the same boundary a guest's statements cross (the
//! `transaction` host functions on the message's host state: statement
//! budget, parameter bound, SQL guard, deadline, one savepoint per
//! statement), so what a component costs beyond it is the sandbox's own
//! share: instantiation, the component model's copies, wasm code. It is not
//! sandboxed: its code runs with the host's rights.

use super::bindings::handler::transaction::Host as _;
use super::bindings::{DbError, Value};
use super::host_impl::{HostState, Stop};
use super::{GuestMessage, HandlerFailure, Limits, describe_trap};
use crate::store::SqlValue;
use futures::future::BoxFuture;
use std::time::{Duration, Instant};

/// A handler in Rust, run in place of a component's `handle`.
pub trait NativeHandler: Send + Sync + 'static {
    /// Handles `msg` through `host` (the message's transaction, as a
    /// guest's imports reach it). `Err(Retry | Reject)` as a guest's
    /// `retry` and `reject`; `Err(Trap)` as a trap.
    fn handle<'a>(
        &'a self,
        host: &'a mut NativeHost<'_>,
        msg: &'a GuestMessage,
    ) -> BoxFuture<'a, Result<(), HandlerFailure>>;
}

/// What a native handler reaches: the `transaction` import of the WIT
/// world, on the message's host state.
pub struct NativeHost<'s> {
    state: &'s mut HostState,
}

impl NativeHost<'_> {
    /// The WIT `transaction.execute`: rows changed, or the database's
    /// error (or the guard's refusal) as a value.
    ///
    /// # Errors
    /// The outer `Err` is a trap (the deadline passed, the transaction was
    /// lost): the handler must return it as [`HandlerFailure::Trap`].
    pub async fn execute(
        &mut self,
        sql: &str,
        params: Vec<SqlValue>,
    ) -> Result<Result<u64, String>, String> {
        let params = params.into_iter().map(Value::from).collect();
        match self.state.execute(sql.to_owned(), params).await {
            Ok(Ok(n)) => Ok(Ok(n)),
            Ok(Err(DbError { message, .. })) => Ok(Err(message)),
            Err(trap) => Err(trap.to_string()),
        }
    }
}

/// Runs `native` on `msg` with `state`, bounded like a guest call (the
/// deadline, then one more second), and hands the state back.
pub(super) async fn run(
    native: &dyn NativeHandler,
    mut state: HostState,
    deadline: Instant,
    msg: GuestMessage,
    limits: &Limits,
) -> (Result<(), HandlerFailure>, HostState) {
    let outer = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
    let mut host = NativeHost { state: &mut state };
    let result = match tokio::time::timeout(outer, native.handle(&mut host, &msg)).await {
        Ok(result) => result,
        Err(_) => Err(HandlerFailure::Trap(describe_trap(
            &wasmtime::format_err!("did not return"),
            Some(Stop::Deadline),
            limits,
        ))),
    };
    (result, state)
}
