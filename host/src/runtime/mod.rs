//! The wasm runtime: one wasmtime [`wasmtime::Engine`] with a pooling
//! allocator and epoch interruption, components compiled once
//! ([`Runtime::load`]) and instantiated fresh for every message
//! ([`Runtime::handle`]), and two linkers: one with only the `idem:handler`
//! imports (`transaction` and `log`; no WASI), for every handler by default,
//! and one that adds WASI preview 2 with an empty context, for a handler that
//! opts in with `wasi = true` because its language cannot avoid WASI imports
//! (what such a guest can see: [`wasi`]).
//!
//! # What bounds a guest
//!
//! - **Time**: a ticker thread advances the engine's epoch every
//!   [`EPOCH_TICK`]; at each tick a running guest yields to the async executor
//!   and traps once the message's [`Limits::deadline`] has passed. A statement
//!   still running at the deadline is abandoned and the guest trapped.
//! - **Memory**: growing a linear memory past [`Limits::max_memory_bytes`]
//!   traps.
//! - **Statements and rows**: past [`Limits::max_statements`] statements a
//!   message's statements are refused with a `denied` error value; a query may
//!   return at most [`Limits::max_rows`] rows, the message's queries together
//!   at most [`Limits::max_result_bytes`], and a statement may carry at most
//!   [`Limits::max_param_bytes`] of parameters. On SQLite no value or row the
//!   guest's statements create or read may exceed the larger of the two
//!   (`SQLITE_LIMIT_LENGTH`), so the database's own memory for one value is
//!   bounded too.
//! - **Log output**: at most [`Limits::max_log_bytes`] per message, `log`
//!   lines and WASI stdout/stderr together; the rest is dropped and counted.
//! - **Reach**: the SQL guard checks every statement before it runs; database
//!   errors and refusals are WIT error values, never traps.
//!
//! A guest that traps, loops or runs out of memory costs one rollback: the
//! store and its instance are dropped and the transaction is handed back.

mod bindings;
mod cache;
mod cache_files;
pub mod code_size;
pub mod component_slot;
mod guest_log;
pub mod handler_info;
mod host_impl;
mod load;
#[cfg(feature = "native-handler")]
pub mod native;
pub mod options;
pub mod rehearsal;
mod trap;
pub mod wasi;
mod world_v0_1;

pub use code_size::CompileLimits;
pub use load::{HandlerComponent, LoadError, LoadOptions};
pub use options::RuntimeOptions;

use crate::sql_guard::SqlGuard;
use crate::store::Tx;
use bindings::HandlerError;
use host_impl::{HostState, Stop};
use load::Code;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use trap::describe_trap;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline,
};

/// The WIT package handler components implement (`wit/handler.wit`), as
/// exported in `idem_handler_info`.
pub const WIT_PACKAGE: &str = "idem:handler@0.2.0";

/// The earlier package version, still served (`wit/versions/0.1.0`).
pub const WIT_PACKAGE_V0_1: &str = "idem:handler@0.1.0";

/// How often the epoch advances: the granularity of deadlines and of a
/// running guest's yields to the executor.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The longest reason a guest may return; longer ones are truncated.
pub const MAX_REASON_BYTES: usize = 4096;

/// Instances that may run at once with [`Runtime::new`].
pub const DEFAULT_CAPACITY: u32 = 128;

/// What one message's guest call may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time for instantiation plus `handle`, statements included.
    pub deadline: Duration,
    /// The most linear memory the guest may grow to, in bytes.
    pub max_memory_bytes: usize,
    /// The most statements (`execute` + `query`) one message may run.
    pub max_statements: u32,
    /// The most rows one query may return.
    pub max_rows: usize,
    /// The most bytes of values ([`crate::store::SqlValue::size`]) one
    /// message's queries may return to the guest, all statements together.
    pub max_result_bytes: usize,
    /// The most bytes of parameter values one statement may carry.
    pub max_param_bytes: usize,
    /// The most log output one message may write; the rest is dropped and counted.
    pub max_log_bytes: usize,
    /// What the message's outbox calls may reach, and their caps.
    pub outbox: Arc<crate::outbox::OutboxGrants>,
}

impl Limits {
    /// The largest single value or row a guest's statements may create or
    /// read where the database can enforce it (SQLite): the larger of
    /// [`Limits::max_result_bytes`] and [`Limits::max_param_bytes`].
    pub fn max_value_bytes(&self) -> usize {
        self.max_result_bytes.max(self.max_param_bytes).max(1)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(5),
            max_memory_bytes: 64 << 20,
            max_statements: 1000,
            max_rows: 10_000,
            max_result_bytes: 8 << 20,
            max_param_bytes: 8 << 20,
            max_log_bytes: 64 << 10,
            outbox: Arc::new(crate::outbox::OutboxGrants::default()),
        }
    }
}

/// Who is calling, for one message: the handler, the message id (for
/// log tags), the handler's SQL guard, and its limits.
#[derive(Clone)]
pub struct Invocation {
    /// The handler name (= durable consumer name).
    pub handler: Arc<str>,
    /// The message id, used to tag the guest's log lines.
    pub message_id: String,
    /// Checks every statement against the handler's granted tables.
    pub guard: Arc<SqlGuard>,
    /// What the call may use.
    pub limits: Limits,
    /// The handler's counters: the runtime adds the guest log bytes the
    /// per-message cap dropped to `log_bytes_dropped`, and the guest
    /// statements that failed on a unique constraint to `unique_violations`.
    pub stats: Arc<crate::metrics::HandlerStats>,
    /// Records what the call does (`idem invoke`, `idem test`, a shadow
    /// candidate and the live call next to it); `None` for any other
    /// delivery ([`rehearsal`]).
    pub rehearsal: Option<Arc<rehearsal::Rehearsal>>,
}

/// The message as the guest sees it (the WIT `message` record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestMessage {
    /// The message id the receipt is keyed on (the WIT record's `identity`).
    pub message_id: String,
    /// The NATS subject.
    pub subject: String,
    /// Headers in delivery order; a header with several values appears several times.
    pub headers: Vec<(String, String)>,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// The message's sequence in its stream.
    pub stream_sequence: u64,
    /// 1 on the first delivery.
    pub delivery_count: u64,
    /// When the broker stored the message, ms since the Unix epoch.
    pub published_ms: i64,
}

/// Why a guest call did not succeed. In every case the caller rolls back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerFailure {
    /// The guest returned `retry(reason)`: deliver again later.
    #[error("retry: {0}")]
    Retry(String),
    /// The guest returned `reject(reason)`: dead-letter.
    #[error("reject: {0}")]
    Reject(String),
    /// The guest trapped, ran past its deadline or its memory limit, or could
    /// not be instantiated: treat as a retry, then dead-letter.
    #[error("trap: {0}")]
    Trap(String),
}

impl HandlerFailure {
    /// The reason recorded in a dead letter and the logs:
    /// `rejected: …`, `retry: …` or `trap: …`.
    pub fn reason(&self) -> String {
        match self {
            HandlerFailure::Reject(r) => format!("rejected: {r}"),
            HandlerFailure::Retry(r) => format!("retry: {r}"),
            HandlerFailure::Trap(t) => format!("trap: {t}"),
        }
    }

    /// True for a `reject`: another delivery would fail the same way.
    pub fn is_permanent(&self) -> bool {
        matches!(self, HandlerFailure::Reject(_))
    }
}

/// The engine, the linkers and the epoch ticker. Share one per process.
pub struct Runtime {
    engine: Engine,
    linkers: load::Linkers,
    /// The compiled-component cache, when on: inspected before each load.
    cache: Option<cache::CompiledCache>,
    /// The most code one component may bring to compile.
    compile: CompileLimits,
    /// The pooling allocator's decommit batch ([`options::decommit_batch`]).
    decommit_batch: usize,
}

impl Runtime {
    /// A runtime for up to [`DEFAULT_CAPACITY`] guest calls at once.
    ///
    /// # Errors
    ///
    /// As [`Runtime::with_capacity`].
    pub fn new() -> anyhow::Result<Self> {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// A runtime whose pooling allocator holds `capacity` instances at once.
    /// A call that finds the pool full gets [`HandlerFailure::Retry`].
    ///
    /// # Errors
    ///
    /// When wasmtime cannot make the engine on this machine (for example
    /// when the pooling allocator cannot reserve its virtual memory, or
    /// cranelift does not support the CPU), when the
    /// `idem:handler` imports or WASI cannot be added to the linkers (a name
    /// defined twice: a bug, not a condition of the machine), or when the
    /// thread that advances the epoch cannot be spawned. Nothing is left
    /// running.
    pub fn with_capacity(capacity: u32) -> anyhow::Result<Self> {
        Self::with_options(&RuntimeOptions {
            capacity,
            ..RuntimeOptions::default()
        })
    }

    /// A runtime like [`Runtime::with_capacity`] that keeps compiled
    /// components in `cache_dir` (created, mode 0700, when missing): one
    /// file per component, named by the SHA-256 of its bytes under a
    /// directory named by the wasmtime version and the engine's settings,
    /// so a restart, or another host on the machine, maps a component it
    /// has compiled before instead of compiling it. `None`: no cache. Other
    /// options default ([`RuntimeOptions`]).
    ///
    /// wasmtime runs what it maps from there as machine code after checking
    /// only that this wasmtime with these settings made it, so the cache
    /// holds only what idem's user wrote: its parents must be root's or
    /// idem's user's and writable by nobody else (root's sticky `/tmp`
    /// excepted), and before each load the tree is walked: a file idem's
    /// user did not write (or others may write) is removed and compiled
    /// again, and a directory others may write makes that load skip the
    /// cache, with a warning (ARCHITECTURE.md, "Compiled-component cache").
    ///
    /// # Errors
    /// As [`Runtime::with_capacity`], and when the cache directory cannot
    /// be created, or it or one of its parents belongs to another user or
    /// is writable by other users.
    pub fn with_cache(capacity: u32, cache_dir: Option<&Path>) -> anyhow::Result<Self> {
        Self::with_options(&RuntimeOptions {
            capacity,
            cache_dir: cache_dir.map(Path::to_path_buf),
            ..RuntimeOptions::default()
        })
    }

    /// A runtime made with `options`: [`Runtime::with_cache`] plus the
    /// compile limits and the memory the decommit batch is sized on.
    ///
    /// # Errors
    /// As [`Runtime::with_cache`].
    pub fn with_options(options: &RuntimeOptions) -> anyhow::Result<Self> {
        let capacity = options.capacity.max(1);
        let decommit_batch = options::decommit_batch(
            options.largest_memory_bytes,
            options::decommit_queues(),
            options.decommit_budget_bytes,
        )
        .min(capacity as usize);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(capacity)
            .total_stacks(capacity)
            // A component holds several core instances (the guest plus
            // adapter shims), usually one memory and a few tables.
            .total_core_instances(capacity.saturating_mul(8))
            .total_memories(capacity.saturating_mul(2))
            .total_tables(capacity.saturating_mul(4))
            // Freed instances wait to be reset together (one TLB shootdown
            // per batch rather than per message), resident meanwhile: the
            // batch is sized so they stay within a budget.
            .decommit_batch_size(decommit_batch);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            // A trap names the source line when the component carries
            // DWARF (a guest built with debug info); one without has none
            // to read, and pays nothing.
            .wasm_backtrace_details(if options.trap_source_lines {
                wasmtime::WasmBacktraceDetails::Enable
            } else {
                wasmtime::WasmBacktraceDetails::Disable
            })
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let cache = match &options.cache_dir {
            Some(dir) => Some(cache::CompiledCache::open(dir)?),
            None => None,
        };
        let engine = Engine::new(&config)?;

        let mut plain = Linker::new(&engine);
        bindings::Handler::add_to_linker::<HostState, HasSelf<HostState>>(&mut plain, |s| s)?;
        bindings::v0_1::Handler::add_to_linker::<HostState, HasSelf<HostState>>(&mut plain, |s| s)?;
        let mut with_wasi = plain.clone();
        wasi::add_to_linker(&mut with_wasi)?;
        let linkers = load::Linkers {
            plain,
            wasi: with_wasi,
        };

        let weak = engine.weak();
        std::thread::Builder::new()
            .name("idem-epoch".into())
            .spawn(move || {
                // Ends when the last clone of the engine is dropped.
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })?;
        tracing::debug!(capacity, decommit_batch, cache_dir = ?cache.as_ref().map(|c| c.dir().display().to_string()), "wasm runtime ready");
        Ok(Self {
            engine,
            linkers,
            cache,
            compile: options.compile,
            decommit_batch,
        })
    }

    /// The pooling allocator's decommit batch: how many freed regions
    /// (memories and tables; per queue, [`options::decommit_queues`]) wait
    /// to be reset together.
    pub fn decommit_batch(&self) -> usize {
        self.decommit_batch
    }

    /// Reads and compiles a component once, and checks that it is a
    /// component of world `idem:handler/handler` that imports nothing the
    /// host does not provide: WASI 0.2 only with [`LoadOptions::wasi`].
    /// Errors are one line that says what is wrong and what to do.
    ///
    /// # Errors
    ///
    /// A [`LoadError`], each naming the file:
    ///
    /// - [`LoadError::Missing`], [`LoadError::Unreadable`]: the file cannot
    ///   be read;
    /// - [`LoadError::NotWasm`]: no `\0asm` header;
    /// - [`LoadError::CoreModule`]: a core module, not yet a component;
    /// - [`LoadError::Invalid`]: the component does not validate or compile;
    /// - [`LoadError::UnknownImport`]: an import the host never provides
    ///   (one outside `idem:handler` and WASI 0.2);
    /// - [`LoadError::WasiNotEnabled`]: WASI 0.2 imports without
    ///   [`LoadOptions::wasi`];
    /// - [`LoadError::ImportMismatch`]: `idem:handler` imports of another
    ///   shape (another version of `wit/handler.wit`);
    /// - [`LoadError::BadExport`]: no `handle` export of the world's type.
    pub fn load(
        &self,
        path: &Path,
        options: LoadOptions,
    ) -> Result<Arc<HandlerComponent>, LoadError> {
        let bytes = load::read(path)?;
        self.load_bytes(&bytes, path, options)
    }

    /// [`Runtime::load`] of a component's `bytes`, read from `origin` (a
    /// file, or where a deployed version came from: named in errors and
    /// reported by [`HandlerComponent::path`]). Compiling can take seconds
    /// for a large component: call it off the async workers
    /// (`spawn_blocking`). Logs whether the compiled code came from the
    /// cache.
    ///
    /// # Errors
    /// As [`Runtime::load`], except the file errors.
    pub fn load_bytes(
        &self,
        bytes: &[u8],
        origin: &Path,
        options: LoadOptions,
    ) -> Result<Arc<HandlerComponent>, LoadError> {
        let started = Instant::now();
        load::precheck(bytes, origin, &self.compile)?;
        let digest = load::digest(bytes);
        let compile = || load::compile(&self.engine, bytes, origin);
        let (compiled, cache) = match &self.cache {
            Some(c) => c.load_or_compile(&self.engine, &digest, origin, compile)?,
            None => (compile()?, "off"),
        };
        let component = load::link(
            &self.engine,
            &self.linkers,
            &compiled,
            origin,
            options,
            digest,
        )?;
        tracing::info!(module = %origin.display(), digest = %component.digest(), cache, ms = started.elapsed().as_millis() as u64, "component loaded");
        Ok(Arc::new(component))
    }

    /// A store for one guest call: `state`'s memory limiter, and an epoch
    /// callback that interrupts the guest at `deadline` (recording why).
    fn bounded_store(&self, state: HostState, deadline: Instant) -> Store<HostState> {
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| s);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |mut ctx| {
            if Instant::now() >= deadline {
                ctx.data_mut().stop = Some(Stop::Deadline);
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        store
    }

    /// Instantiates `component` once without calling `handle`, in a
    /// throwaway transaction on an in-memory SQLite database with no table
    /// granted and the default limits: whatever runs at instantiation
    /// (start functions, static initialisers) runs, so a component that
    /// traps there is found before it is deployed or swapped in.
    ///
    /// # Errors
    /// One line: the instantiation trapped (and why: deadline, memory, the
    /// guest's own trap) or could not be made.
    pub async fn check_instantiates(&self, component: &HandlerComponent) -> Result<(), String> {
        let Some(pre) = component.wasm() else {
            return Ok(());
        };
        let db = crate::store::Database::connect("sqlite::memory:", 1)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let mut tx = db.begin().await.map_err(|e| e.to_string())?;
        let limits = Limits::default();
        let deadline = Instant::now() + limits.deadline;
        // A start function's statement runs on this task (SQLite): only the
        // store's interrupt at the deadline stops it.
        tx.cap_statements(Some(deadline))
            .map_err(|e| e.to_string())?;
        let state = HostState::new(
            tx,
            Arc::from("instantiation check"),
            String::new(),
            Arc::new(SqlGuard::new(db.kind(), &[])),
            limits.clone(),
            deadline,
            Arc::new(crate::metrics::HandlerStats::default()),
        );
        let mut store = self.bounded_store(state, deadline);
        let outer = limits.deadline + Duration::from_secs(1);
        let made = tokio::time::timeout(outer, pre.instantiate_async(&mut store)).await;
        let result = match made {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!(
                "traps when instantiated: {}",
                describe_trap(&e, store.data().stop, &limits)
            )),
            Err(_) => Err(format!(
                "did not finish instantiating within {:?}",
                limits.deadline
            )),
        };
        let state = store.into_data();
        let _ = state.tx.rollback().await;
        db.close().await;
        result
    }

    /// Runs `handle` for one message in a fresh instance, with `tx` as the
    /// guest's transaction, and hands the transaction back: commit or roll it
    /// back according to the result. `Ok` carries the outbox calls the
    /// guest made (admitted against `call.limits.outbox`, in call order),
    /// for the caller to store in `tx` before it commits. Never panics and never fails the host:
    /// whatever the guest does becomes a [`HandlerFailure`].
    ///
    /// # Errors
    ///
    /// The first element of the pair (the transaction comes back either way):
    ///
    /// - [`HandlerFailure::Retry`]: the guest returned `retry` (its reason cut
    ///   to [`MAX_REASON_BYTES`]), the instance pool was full (`host at
    ///   capacity`), or `tx`'s connection could not be prepared for the guest;
    /// - [`HandlerFailure::Reject`]: the guest returned `reject` (its reason
    ///   cut to [`MAX_REASON_BYTES`]);
    /// - [`HandlerFailure::Trap`]: the guest trapped, exited through
    ///   `wasi:cli/exit`, passed its deadline or memory limit, or could not be
    ///   instantiated, or `component` was loaded by another `Runtime`.
    pub async fn handle(
        &self,
        component: &HandlerComponent,
        call: &Invocation,
        tx: Tx,
        msg: GuestMessage,
    ) -> (Result<Vec<crate::outbox::OutboxEntry>, HandlerFailure>, Tx) {
        if let Some(pre) = component.wasm()
            && !Engine::same(pre.engine(), &self.engine)
        {
            let failure =
                "the component was loaded by another Runtime; load it with the one that runs it";
            return (Err(HandlerFailure::Trap(failure.into())), tx);
        }
        let limits = call.limits.clone();
        let mut tx = tx;
        if let Err(e) = tx.bound_guest_values(limits.max_value_bytes()).await {
            let failure = format!("cannot prepare the connection for the guest: {e}");
            return (Err(HandlerFailure::Retry(failure)), tx);
        }
        let now = Instant::now();
        // A deadline too far to represent is no deadline: a day will do.
        let deadline = now
            .checked_add(limits.deadline)
            .unwrap_or_else(|| now + Duration::from_secs(86_400));
        if let Err(e) = tx.cap_statements(Some(deadline)) {
            let failure = format!("cannot prepare the connection for the guest: {e}");
            return (Err(HandlerFailure::Retry(failure)), tx);
        }
        let state = HostState::new(
            tx,
            call.handler.clone(),
            call.message_id.clone(),
            call.guard.clone(),
            limits.clone(),
            deadline,
            call.stats.clone(),
        )
        .published_at(msg.published_ms)
        .rehearsed(call.rehearsal.clone());
        let (result, state) = match &component.code {
            Code::Wasm(pre) => self.run_wasm(pre, state, deadline, msg, &limits).await,
            #[cfg(feature = "native-handler")]
            Code::Native(native) => {
                native::run(native.as_ref(), state, deadline, msg, &limits).await
            }
        };
        state.record_usage(now.elapsed());
        let dropped = state.log.lock().finish();
        call.stats
            .log_bytes_dropped
            .add(u64::try_from(dropped).unwrap_or(u64::MAX));
        if let Err(failure) = &result {
            tracing::debug!(handler = %call.handler, message_id = %call.message_id, %failure, "guest call failed");
        }
        let mut state = state;
        // The host's statements after the call (outbox rows, an undo, the
        // rollback) are bounded by the transaction's budget, not the
        // guest's deadline; a connection that cannot be told fails them.
        if let Err(e) = state.tx.cap_statements(None) {
            tracing::debug!(handler = %call.handler, error = %e, "cannot lift the guest's deadline from the transaction");
        }
        // What the guest published or called counts only if it succeeded.
        let result = result.map(|()| state.outbox.take());
        (result, state.tx)
    }

    /// Instantiates `pre` in a store bounded by `deadline` around `state`,
    /// calls `handle(msg)`, and turns what happened into the result; hands
    /// the state back.
    async fn run_wasm(
        &self,
        pre: &bindings::HandlerPre<HostState>,
        state: HostState,
        deadline: Instant,
        msg: GuestMessage,
        limits: &Limits,
    ) -> (Result<(), HandlerFailure>, HostState) {
        let now = Instant::now();
        let mut store = self.bounded_store(state, deadline);
        let msg = bindings::handler::types::Message {
            identity: msg.message_id,
            subject: msg.subject,
            headers: msg.headers,
            payload: msg.payload,
            stream_sequence: msg.stream_sequence,
            delivery_count: msg.delivery_count,
            published_ms: msg.published_ms,
        };
        // The epoch callback and the statement timeouts enforce the deadline;
        // this outer bound only guards against a call that never yields.
        let outer = deadline.saturating_duration_since(now) + Duration::from_secs(1);
        let run = tokio::time::timeout(outer, call_guest(pre, &mut store, &msg)).await;
        let result = match run {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(HandlerError::Retry(reason)))) => {
                Err(HandlerFailure::Retry(truncate(reason)))
            }
            Ok(Ok(Err(HandlerError::Reject(reason)))) => {
                Err(HandlerFailure::Reject(truncate(reason)))
            }
            Ok(Err(GuestError::Instantiate(e)))
                if e.is::<wasmtime::PoolConcurrencyLimitError>() =>
            {
                Err(HandlerFailure::Retry(format!(
                    "host at capacity: {}",
                    load::one_line(&e)
                )))
            }
            Ok(Err(GuestError::Instantiate(e) | GuestError::Call(e))) => {
                let data = store.data();
                let mut reason = describe_trap(&e, data.stop, limits);
                if let (None, Some(said)) = (data.stop, data.log.lock().last_error()) {
                    reason.push_str("; ");
                    reason.push_str(&said);
                }
                Err(HandlerFailure::Trap(truncate(reason)))
            }
            Err(_) => Err(HandlerFailure::Trap(describe_trap(
                &wasmtime::format_err!("did not return"),
                Some(Stop::Deadline),
                limits,
            ))),
        };
        (result, store.into_data())
    }
}

enum GuestError {
    Instantiate(wasmtime::Error),
    Call(wasmtime::Error),
}

async fn call_guest(
    pre: &bindings::HandlerPre<HostState>,
    store: &mut Store<HostState>,
    msg: &bindings::handler::types::Message,
) -> Result<Result<(), HandlerError>, GuestError> {
    let instance = pre
        .instantiate_async(&mut *store)
        .await
        .map_err(GuestError::Instantiate)?;
    instance
        .call_handle(&mut *store, msg)
        .await
        .map_err(GuestError::Call)
}

/// Cuts a guest's reason to [`MAX_REASON_BYTES`] on a char boundary.
fn truncate(mut reason: String) -> String {
    if reason.len() > MAX_REASON_BYTES {
        let cut = guest_log::floor_char_boundary(&reason, MAX_REASON_BYTES);
        let dropped = reason.len() - cut;
        reason.truncate(cut);
        reason.push_str(&format!("… ({dropped} more bytes)"));
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_are_truncated_on_a_char_boundary() {
        let r = truncate("é".repeat(3000));
        assert!(r.len() < MAX_REASON_BYTES + 40);
        assert!(r.ends_with("(1904 more bytes)"), "{r}");
        assert_eq!(truncate("short".into()), "short");
    }
}
