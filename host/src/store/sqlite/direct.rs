//! The SQLite connections message transactions run on, used on the calling
//! task itself (rusqlite) rather than through sqlx.
//!
//! Why: sqlx runs each SQLite connection on a thread of its own, so every
//! statement is a hop to that thread and back, two thread wake-ups, and a
//! message sends about ten (BEGIN, the time budget, the value bound, the
//! receipt, a savepoint, the guest's statement, the autocommit check,
//! COMMIT, the reset on release). On a small VM the wake-ups were most of a
//! message's CPU (ARCHITECTURE.md, "SQLite on the handler's task"). Here a
//! transaction's statements run where the guest calls them: inside a
//! `BEGIN IMMEDIATE` transaction the connection holds the write lock, so no
//! statement waits for another writer, and each is bounded by the
//! transaction's progress handler. Only what can wait runs on tokio's
//! blocking pool: opening a connection, `BEGIN IMMEDIATE` when the write
//! lock is taken (it waits up to the busy timeout; a free lock is taken on
//! the task, without waiting) and `COMMIT` (fsync, and the WAL checkpoint
//! it may run).
//!
//! SQLite lets one connection at a time hold a database's write lock, and
//! every transaction here is a write (`BEGIN IMMEDIATE`). So this pool's
//! transactions queue for a write gate, first come first served, and the
//! next one begins as soon as the one before committed or rolled back.
//! Without it they would wait in SQLite's busy handler, which sleeps 1, 2,
//! 5, 10 ms and more between its tries (`sqliteDefaultBusyCallback` in
//! SQLite's `main.c`) while a message's transaction holds the lock for a
//! fraction of a millisecond. The host's writes through sqlx's pool
//! (dead letters, pruning, deploy marks, the outbox relay's claims and
//! marks) queue at the same gate ([`Conns::writer`]), or they would
//! hardly ever find the lock free between two transactions. Writers
//! outside the gate (another process, migrations and the host tables'
//! creation at start, the availability probe) still meet SQLite's lock and
//! its busy timeout.
//!
//! The pool beside sqlx's (`super::Pool`): the same file and settings (WAL,
//! `synchronous=FULL`, busy timeout, foreign keys on), up to the same
//! number of connections. An in-memory database is opened by the name sqlx
//! gave it, with a shared cache, so both pools see one database.

use super::sqlite_raw;
use rusqlite::{Connection, OpenFlags};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Prepared statements each connection keeps (sqlx's default too).
const STATEMENT_CACHE: usize = 100;

/// How to open one connection.
#[derive(Debug, Clone)]
pub(super) struct OpenSpec {
    /// The file, or sqlx's `file:` name of an in-memory database.
    pub path: PathBuf,
    /// `path` names an in-memory database (opened with a shared cache).
    pub in_memory: bool,
    /// How long `BEGIN IMMEDIATE` waits for the write lock.
    pub busy_timeout: Duration,
    /// The URL's `vfs` parameter (sqlx opens its connections with it).
    pub vfs: Option<String>,
}

impl OpenSpec {
    /// Opens and configures one connection (blocking: file I/O).
    fn open(&self) -> rusqlite::Result<Connection> {
        let mut flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        if self.in_memory {
            flags |= OpenFlags::SQLITE_OPEN_MEMORY | OpenFlags::SQLITE_OPEN_SHARED_CACHE;
        }
        let conn = match &self.vfs {
            Some(vfs) => Connection::open_with_flags_and_vfs(&self.path, flags, vfs.as_str())?,
            None => Connection::open_with_flags(&self.path, flags)?,
        };
        conn.busy_timeout(self.busy_timeout)?;
        if !self.in_memory {
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))?;
        }
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        Ok(conn)
    }
}

/// A connection of the pool, shared only with a COMMIT on the blocking
/// pool ([`Conn`]).
type Shareable = Arc<Mutex<Connection>>;

struct Shared {
    spec: OpenSpec,
    idle: Mutex<Vec<Shareable>>,
    permits: Arc<Semaphore>,
    acquire_timeout: Duration,
    /// BEGINs that found the write lock held and waited for it
    /// ([`Conns::lock_waits`]).
    lock_waits: AtomicU64,
    /// The write gate (module docs): one permit, held by a message
    /// transaction from before `BEGIN IMMEDIATE` until it ends, or by a
    /// write through sqlx's pool while it runs ([`Conns::writer`]).
    writer: Arc<Semaphore>,
}

/// Up to `max` connections, idle ones kept for the next transaction.
#[derive(Clone)]
pub(super) struct Conns(Arc<Shared>);

impl Conns {
    /// A pool of up to `max` connections opened as `spec` says; a
    /// transaction waits `acquire_timeout` at most for a free one.
    pub fn new(spec: OpenSpec, max: u32, acquire_timeout: Duration) -> Self {
        crate::metrics::sqlite_write_lock_waits_exported();
        Conns(Arc::new(Shared {
            spec,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max.max(1) as usize)),
            acquire_timeout,
            lock_waits: AtomicU64::new(0),
            writer: Arc::new(Semaphore::new(1)),
        }))
    }

    /// How many BEGINs on an idle connection to a file found the write
    /// lock held by another connection (`SQLITE_BUSY` at once) and waited
    /// for it on the blocking pool, since the pool was made: a writer
    /// outside this pool's write gate (sqlx's pool, another process).
    /// BEGINs that open a connection, and every BEGIN in memory, wait
    /// there without being asked first, and are not counted.
    pub fn lock_waits(&self) -> u64 {
        self.0.lock_waits.load(Ordering::Relaxed)
    }

    /// A connection inside a new `BEGIN IMMEDIATE` transaction, once the
    /// write gate (module docs) let it through: it waits there for the
    /// host's other writes, then for a writer outside the gate, at most
    /// the busy timeout in all.
    ///
    /// # Errors
    /// The host's other writes held the write gate for the whole busy
    /// timeout, or the write lock was not free within what was left of it
    /// (`SQLITE_BUSY` either way), no connection is free within the acquire timeout
    /// (`sqlx::Error::PoolTimedOut`), the pool is closed (`PoolClosed`),
    /// the file cannot be opened, or `BEGIN IMMEDIATE` fails.
    pub async fn begin(&self) -> Result<Conn, sqlx::Error> {
        let shared = &self.0;
        // The gate before a connection: what waits holds none.
        let started = std::time::Instant::now();
        let writer = self.writer().await?;
        // What is left of the busy timeout for a writer outside the gate.
        let lock_wait = shared.spec.busy_timeout.saturating_sub(started.elapsed());
        let permit = tokio::time::timeout(
            shared.acquire_timeout,
            Arc::clone(&shared.permits).acquire_owned(),
        )
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)?
        .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = lock(&shared.idle).pop();
        // The write lock is usually free: an idle connection takes it here,
        // without waiting, saving the blocking pool's two thread switches;
        // only a lock held elsewhere is waited for there. Not in memory: a
        // shared cache's table lock waits through unlock-notify, which no
        // busy timeout stops.
        let (conn, begun) = match idle {
            Some(conn) if !shared.spec.in_memory => {
                let begun = begin_without_waiting(&lock(&conn), shared.spec.busy_timeout);
                match begun {
                    Err(e) if is_busy(&e) => {
                        shared.lock_waits.fetch_add(1, Ordering::Relaxed);
                        crate::metrics::sqlite_write_lock_waited();
                        begin_waiting(&shared.spec, Some(conn), lock_wait).await?
                    }
                    begun => (conn, begun),
                }
            }
            idle => begin_waiting(&shared.spec, idle, lock_wait).await?,
        };
        let conn = Conn {
            conn,
            shared: Arc::clone(shared),
            _permit: permit,
            _writer: writer,
        };
        // A failed BEGIN leaves the connection as it was: back to the pool.
        begun.map_err(super::codes::to_sqlx)?;
        Ok(conn)
    }

    /// The write gate's permit (module docs), for a write of the host's
    /// that does not go through this pool (sqlx's): held while it runs, it
    /// takes SQLite's lock between two message transactions instead of
    /// polling for it while they hand the lock on. Waits at most the busy
    /// timeout.
    ///
    /// # Errors
    /// The gate stayed taken for the whole busy timeout (`SQLITE_BUSY`),
    /// or the pool is closed (`PoolClosed`).
    pub async fn writer(&self) -> Result<OwnedSemaphorePermit, sqlx::Error> {
        let gate = &self.0.writer;
        match Arc::clone(gate).try_acquire_owned() {
            Ok(writer) => Ok(writer),
            Err(tokio::sync::TryAcquireError::Closed) => Err(sqlx::Error::PoolClosed),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                tokio::time::timeout(self.0.spec.busy_timeout, Arc::clone(gate).acquire_owned())
                    .await
                    .map_err(|_| super::codes::to_sqlx(gate_busy()))?
                    .map_err(|_| sqlx::Error::PoolClosed)
            }
        }
    }

    /// Runs `read` (a query outside any transaction) on an idle connection
    /// on the calling task, when a connection is idle, a permit is free now
    /// and the database is a file: no hop to a connection's thread and
    /// back, as a read through sqlx takes. The read runs with no busy
    /// handler, so where a WAL read would wait for the busy handler SQLite
    /// answers `SQLITE_BUSY` at once; SQLite's own short retries while a
    /// writer swaps the WAL index still sleep on the task, as a BEGIN's do
    /// ([`begin_without_waiting`]). The read is synchronous: a caller's
    /// timeout cannot cut it short, so it must be small (a lookup by
    /// primary key). `None`: nothing was run (no idle connection or free
    /// permit, or an in-memory database); `Some(Err)` with `SQLITE_BUSY`
    /// ([`is_busy`]): read through sqlx instead.
    pub fn read_now<T>(
        &self,
        read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Option<rusqlite::Result<T>> {
        let shared = &self.0;
        if shared.spec.in_memory {
            return None;
        }
        let _permit = Arc::clone(&shared.permits).try_acquire_owned().ok()?;
        let conn = lock(&shared.idle).pop()?;
        let (result, reusable) = {
            let c = lock(&conn);
            let result = c.busy_timeout(Duration::ZERO).and_then(|()| read(&c));
            let restored = c.busy_timeout(shared.spec.busy_timeout).is_ok();
            (result, restored && c.is_autocommit())
        };
        if reusable && !shared.permits.is_closed() {
            lock(&shared.idle).push(conn);
        }
        Some(result)
    }

    /// Closes the idle connections; later transactions fail (`PoolClosed`).
    pub fn close(&self) {
        self.0.permits.close();
        self.0.writer.close();
        lock(&self.0.idle).clear();
    }
}

/// `SQLITE_BUSY`, as BEGIN reports a write lock that stayed held for its
/// busy timeout: here the host's own writes held the write gate.
fn gate_busy() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
        Some("database is locked: this host's other writes held the write lock for the whole busy timeout".into()),
    )
}

/// `BEGIN IMMEDIATE` on the blocking pool, on `idle` or a connection
/// opened as `spec` says, waiting for the write lock up to `lock_wait`
/// (the connection's busy timeout is set back after); the connection comes
/// back with BEGIN's result.
///
/// # Errors
/// The blocking task failed (`WorkerCrashed`) or the connection could not
/// be opened.
async fn begin_waiting(
    spec: &OpenSpec,
    idle: Option<Shareable>,
    lock_wait: Duration,
) -> Result<(Shareable, rusqlite::Result<()>), sqlx::Error> {
    let spec = spec.clone();
    tokio::task::spawn_blocking(move || {
        let conn = match idle {
            Some(c) => c,
            None => Arc::new(Mutex::new(spec.open()?)),
        };
        let begun = {
            let c = lock(&conn);
            c.busy_timeout(lock_wait)?;
            let begun = c.execute_batch("BEGIN IMMEDIATE");
            c.busy_timeout(spec.busy_timeout)?;
            begun
        };
        Ok::<_, rusqlite::Error>((conn, begun))
    })
    .await
    .map_err(|_| sqlx::Error::WorkerCrashed)?
    .map_err(super::codes::to_sqlx)
}

/// `BEGIN IMMEDIATE` on `conn` if the write lock is free now: with no
/// busy handler SQLite answers `SQLITE_BUSY` at once instead of waiting
/// (<https://sqlite.org/c3ref/busy_timeout.html>); the connection's
/// `busy_timeout` is set again either way. In WAL mode BEGIN reads the
/// WAL index (shared memory) and, when another connection wrote since, the
/// database's first page; only rare cases do more on the task (a WAL
/// index rebuilt after another process crashed, SQLite's short sleeps
/// while a writer swaps the WAL index under heavy contention).
///
/// # Errors
/// `SQLITE_BUSY` when another connection holds the write lock (wait for
/// it on the blocking pool), or why BEGIN failed otherwise.
fn begin_without_waiting(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::ZERO)?;
    let begun = conn.execute_batch("BEGIN IMMEDIATE");
    let restored = conn.busy_timeout(busy_timeout);
    begun.and(restored)
}

/// Whether `e` is `SQLITE_BUSY` (any extended code of it).
pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DatabaseBusy)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A connection taken from [`Conns`]; dropped, it is rolled back if still
/// in a transaction, reset (no progress handler, the default length limit)
/// and given back, or closed when that fails. The mutex is never
/// contended: the connection is used by one task at a time, and shared
/// only so that COMMIT can run on the blocking pool.
pub(super) struct Conn {
    conn: Shareable,
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
    /// The write gate's permit. Fields drop in their order, after
    /// [`Drop::drop`] rolled the connection back and gave it back: the
    /// next transaction through the gate finds it idle.
    _writer: OwnedSemaphorePermit,
}

impl Conn {
    /// The connection, for statements run on the calling task (never held
    /// across an `.await`).
    pub fn get(&self) -> std::sync::MutexGuard<'_, Connection> {
        lock(&self.conn)
    }

    /// Commits on the blocking pool (COMMIT writes and syncs the WAL).
    ///
    /// # Errors
    /// COMMIT failed (the connection, rolled back, goes back to the pool).
    pub async fn commit(&mut self) -> Result<(), sqlx::Error> {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || lock(&conn).execute_batch("COMMIT"))
            .await
            .map_err(|_| sqlx::Error::WorkerCrashed)?
            .map_err(super::codes::to_sqlx)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // A COMMIT still running on the blocking pool (its caller gave up
        // waiting) holds the other reference: the connection is closed
        // when it ends, not given back.
        let Some(conn) = Arc::get_mut(&mut self.conn) else {
            return;
        };
        let conn = conn
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // ROLLBACK of a WAL transaction discards its pages; it does not sync.
        let rolled_back = conn.is_autocommit() || conn.execute_batch("ROLLBACK").is_ok();
        let reset = conn
            .progress_handler(0, None::<fn() -> bool>)
            .and_then(|()| {
                conn.set_limit(
                    rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH,
                    i32::try_from(sqlite_raw::DEFAULT_LENGTH_LIMIT).unwrap_or(i32::MAX),
                )
            })
            .is_ok();
        if rolled_back && reset && !self.shared.permits.is_closed() {
            lock(&self.shared.idle).push(Arc::clone(&self.conn));
        }
    }
}
