//! The WASI opt-in (`wasi = true`): a guest built for wasm32-wasip2 runs in an
//! empty WASI context against a real SQLite file: no environment, arguments,
//! files, stdin or network; stdout/stderr go to the guest log under the
//! per-message cap, tagged with the handler and message id; the wall clock
//! reads the message's publish time and the random sources are seeded from
//! (handler, message id).
//!
//! Needs the guests built: `scripts/build-guests.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_test_support::guest;

use idem::runtime::{
    GuestMessage, HandlerComponent, HandlerFailure, Invocation, Limits, LoadOptions, Runtime,
};
use idem::sql_guard::SqlGuard;
use idem::store::{Database, DbKind, Receipt};
use serde_json::{Value as Json, json};
use sqlx::Row;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

static RUNTIME: LazyLock<Runtime> = LazyLock::new(|| Runtime::new().expect("runtime starts"));

const WASI: LoadOptions = LoadOptions { wasi: true };

static PROBE: LazyLock<Arc<HandlerComponent>> = LazyLock::new(|| {
    RUNTIME
        .load(&guest("wasi-probe"), WASI)
        .unwrap_or_else(|e| panic!("{e}"))
});

/// A real SQLite file with idem's host tables and the credit example's schema.
struct Db {
    _dir: tempfile::TempDir,
    db: Database,
}

async fn db() -> Db {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let db = Database::connect(&url, 2).await.unwrap();
    db.prepare_host_tables().await.unwrap();
    let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/credit/migrations");
    db.migrate_handler("credit", &migrations).await.unwrap();
    Db { _dir: dir, db }
}

impl Db {
    async fn scalar(&self, sql: &'static str) -> i64 {
        let Some(pool) = self.db.sqlite_pool() else {
            panic!("sqlite")
        };
        sqlx::query(sql)
            .fetch_one(pool)
            .await
            .unwrap()
            .get::<i64, _>(0)
    }
}

fn invocation(handler: &str, message_id: &str, limits: Limits) -> Invocation {
    Invocation {
        handler: Arc::from(handler),
        message_id: message_id.into(),
        guard: Arc::new(SqlGuard::new(DbKind::Sqlite, &["accounts".to_string()])),
        limits,
        stats: Arc::default(),
        rehearsal: None,
    }
}

/// When [`message`]'s messages were published (ms since the epoch).
const PUBLISHED_MS: i64 = 1_700_000_000_123;

fn message(message_id: &str, payload: &Json) -> GuestMessage {
    GuestMessage {
        message_id: message_id.into(),
        subject: "accounts.credit".into(),
        headers: vec![],
        payload: payload.to_string().into_bytes(),
        stream_sequence: 1,
        delivery_count: 1,
        published_ms: PUBLISHED_MS,
    }
}

/// What the probe reports of its random sources for `message_id` under
/// `handler`: 16 bytes of ChaCha20 keyed with SHA-256(handler, 0, message
/// id) on stream 0 (`random`) and 1 (`insecure`), each byte the low byte of
/// a 32-bit word as wasmtime-wasi draws them, and stream 2's first two
/// `u64`s as the insecure seed.
fn seeded(handler: &str, message_id: &str) -> Json {
    use chacha20::ChaCha20Rng;
    use chacha20::rand_core::{Rng as _, SeedableRng as _};
    use sha2::{Digest as _, Sha256};
    let seed: [u8; 32] = Sha256::new()
        .chain_update(handler)
        .chain_update([0u8])
        .chain_update(message_id)
        .finalize()
        .into();
    let sixteen = |rng: &mut ChaCha20Rng| -> String {
        (0..16)
            .map(|_| format!("{:02x}", rng.next_u32() as u8))
            .collect()
    };
    let mut random = ChaCha20Rng::from_seed(seed);
    let mut insecure = ChaCha20Rng::from_seed(seed);
    insecure.set_stream(1);
    let mut seeder = ChaCha20Rng::from_seed(seed);
    seeder.set_stream(2);
    let (lo, hi) = (seeder.next_u64(), seeder.next_u64());
    json!({
        "random": sixteen(&mut random),
        "insecure": sixteen(&mut insecure),
        "insecure_seed": format!("{lo}:{hi}"),
    })
}

/// One message as the pipeline runs it: BEGIN, receipt first (a duplicate
/// rolls back at once), the guest, then COMMIT on success, ROLLBACK otherwise.
/// `None` for a duplicate.
async fn process(
    db: &Db,
    module: &HandlerComponent,
    call: &Invocation,
    payload: &Json,
) -> Option<Result<(), HandlerFailure>> {
    let mut tx = db.db.begin().await.unwrap();
    let receipt = Receipt {
        consumer: &call.handler,
        message_id: &call.message_id,
        stream_sequence: 1,
        module_digest: module.digest(),
        published_ms: PUBLISHED_MS,
    };
    if !tx.insert_receipt(&receipt).await.unwrap() {
        tx.rollback().await.unwrap();
        return None;
    }
    let (result, tx) = RUNTIME
        .handle(module, call, tx, message(&call.message_id, payload))
        .await;
    if result.is_ok() {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    Some(result.map(drop))
}

/// Runs the probe for one message with the default limits, outside any
/// receipt: what it returns.
async fn probe(db: &Db, limits: Limits, payload: Json) -> Result<(), HandlerFailure> {
    probe_as(db, "wasi-probe", message("evt-1", &payload), limits).await
}

/// [`probe`] of `msg` under handler `handler`.
async fn probe_as(
    db: &Db,
    handler: &str,
    msg: GuestMessage,
    limits: Limits,
) -> Result<(), HandlerFailure> {
    let call = invocation(handler, &msg.message_id, limits);
    let tx = db.db.begin().await.unwrap();
    let (result, tx) = RUNTIME.handle(&PROBE, &call, tx, msg).await;
    tx.rollback().await.unwrap();
    result.map(drop)
}

/// The probe's report for `msg` under `handler`.
async fn report(db: &Db, handler: &str, msg: GuestMessage) -> Json {
    match probe_as(db, handler, msg, Limits::default()).await {
        Err(HandlerFailure::Reject(r)) => serde_json::from_str(&r).unwrap(),
        other => panic!("expected the probe's report, got {other:?}"),
    }
}

/// Captures this thread's `idem::guest` log lines (no time, no colours) while
/// the returned guard lives. Tests run on their own threads, so each sees its
/// own lines only.
fn capture() -> (tracing::subscriber::DefaultGuard, Arc<Mutex<Vec<u8>>>) {
    #[derive(Clone)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(Mutex::new(Vec::new()));
    let writer = Buf(buf.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("idem::guest=trace"))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .without_time()
        .finish();
    (tracing::subscriber::set_default(subscriber), buf)
}

fn lines(buf: &Mutex<Vec<u8>>) -> Vec<String> {
    String::from_utf8(buf.lock().unwrap().clone())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn credit_built_for_wasip2_commits_with_wasi() {
    let credit = RUNTIME
        .load(&guest("credit-wasip2"), WASI)
        .unwrap_or_else(|e| panic!("{e}"));
    let db = db().await;
    let events = [
        (
            "evt_1",
            json!({"event_id": "evt_1", "account_id": 73, "amount": 500}),
        ),
        (
            "evt_2",
            json!({"event_id": "evt_2", "account_id": 73, "amount": -20}),
        ),
        (
            "evt_1",
            json!({"event_id": "evt_1", "account_id": 73, "amount": 500}),
        ),
        (
            "evt_3",
            json!({"event_id": "evt_3", "account_id": 9, "amount": 7}),
        ),
        ("evt_4", json!({"event_id": "evt_4", "account_id": "nine"})),
    ];
    let mut outcomes = Vec::new();
    for (id, payload) in &events {
        let call = invocation("credit", id, Limits::default());
        outcomes.push(match process(&db, &credit, &call, payload).await {
            None => "duplicate".to_string(),
            Some(Ok(())) => "ok".to_string(),
            Some(Err(HandlerFailure::Reject(r))) => format!("reject: {}", &r[..18]),
            Some(Err(other)) => panic!("{id}: {other}"),
        });
    }
    assert_eq!(
        outcomes,
        ["ok", "ok", "duplicate", "ok", "reject: not a credit event"]
    );
    assert_eq!(db.db.receipt_count("credit").await.unwrap(), 3);
    assert_eq!(
        db.scalar("SELECT balance FROM accounts WHERE account_id = 73")
            .await,
        480
    );
    assert_eq!(
        db.scalar("SELECT balance FROM accounts WHERE account_id = 9")
            .await,
        7
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM accounts").await, 2);
}

#[tokio::test]
async fn the_context_is_empty() {
    let db = db().await;
    let seen = report(&db, "wasi-probe", message("evt-1", &json!({"op": "probe"}))).await;
    let random = seeded("wasi-probe", "evt-1");
    assert_eq!(
        seen,
        json!({
            "env": 0,
            "args": 0,
            // wasi-libc's default; no directory is behind it.
            "cwd": {"ok": "/"},
            "read_etc_passwd": {"err": "NotFound"},
            "read_relative": {"err": "NotFound"},
            "read_dir_root": {"err": "NotFound"},
            "write_tmp": {"err": "NotFound"},
            "stdin": {"ok": 0},
            "tcp_connect": {"err": "PermissionDenied"},
            "udp_bind": {"err": "PermissionDenied"},
            "dns": {"err": "Uncategorized"},
            // The publish time, to the millisecond.
            "wall_clock_ns": 1_700_000_000_123_000_000_u64,
            "random": random["random"],
            "insecure": random["insecure"],
            "insecure_seed": random["insecure_seed"],
        })
    );
}

/// The clock and the random sources are a function of the message: the
/// same message under the same handler reports the same values; another
/// message id or another handler other random values; another publish
/// time another wall clock.
#[tokio::test]
async fn clocks_and_random_are_the_messages() {
    let db = db().await;
    let probe = json!({"op": "probe"});
    let keys = ["wall_clock_ns", "random", "insecure", "insecure_seed"];
    let pick = |j: &Json| -> Vec<Json> { keys.iter().map(|k| j[k].clone()).collect() };
    let first = pick(&report(&db, "h", message("m-1", &probe)).await);
    let again = pick(&report(&db, "h", message("m-1", &probe)).await);
    assert_eq!(first, again);
    let s = seeded("h", "m-1");
    assert_eq!(
        first,
        [
            json!(1_700_000_000_123_000_000_u64),
            s["random"].clone(),
            s["insecure"].clone(),
            s["insecure_seed"].clone()
        ]
    );
    // Another message id, another handler: every random source differs.
    for (handler, id) in [("h", "m-2"), ("h2", "m-1")] {
        let other = pick(&report(&db, handler, message(id, &probe)).await);
        assert_eq!(other[0], first[0]);
        for i in 1..4 {
            assert_ne!(other[i], first[i], "{handler} {id}: {}", keys[i]);
        }
        assert_eq!(other[1..], pick(&seeded(handler, id))[1..]);
    }
    // Another publish time: that wall clock, the same random values.
    let mut later = message("m-1", &probe);
    later.published_ms = 1_800_000_000_000;
    let later = pick(&report(&db, "h", later).await);
    assert_eq!(later[0], json!(1_800_000_000_000_000_000_u64));
    assert_eq!(later[1..], first[1..]);
}

#[tokio::test]
async fn stdout_and_stderr_reach_the_guest_log_tagged() {
    let db = db().await;
    LazyLock::force(&PROBE);
    let (_guard, buf) = capture();
    let r = probe(
        &db,
        Limits::default(),
        json!({"op": "print", "stdout": "hello from stdout", "stderr": "hello from stderr", "log": "via log"}),
    )
    .await;
    assert_eq!(r, Ok(()));
    assert_eq!(
        lines(&buf),
        [
            r#" INFO idem::guest: via log handler="wasi-probe" message_id="evt-1" truncated=false"#,
            r#" INFO idem::guest: hello from stdout handler="wasi-probe" message_id="evt-1" stream="stdout" truncated=false"#,
            r#" WARN idem::guest: hello from stderr handler="wasi-probe" message_id="evt-1" stream="stderr" truncated=false"#,
        ]
    );
}

#[tokio::test]
async fn stdout_shares_the_log_cap_and_drops_are_counted() {
    let db = db().await;
    LazyLock::force(&PROBE);
    let (_guard, buf) = capture();
    // Each line costs its fixed part (timestamp, level, target, the tags)
    // and its text: room for the log line, two stdout lines of 40 bytes and
    // 7 bytes of the third; 113 bytes are dropped (the rest of the third
    // line, the fourth and the fifth: 3 lines).
    let o = idem::log_format::guest_line_overhead("wasi-probe", "evt-1");
    let cap = (o + 10) + 2 * (o + 40) + (o + 7);
    let limits = Limits {
        max_log_bytes: cap,
        ..Limits::default()
    };
    let x = "x".repeat(40);
    let r = probe(
        &db,
        limits,
        json!({"op": "print", "stdout": x, "lines": 5, "log": "0123456789"}),
    )
    .await;
    assert_eq!(r, Ok(()));
    let tags = r#"handler="wasi-probe" message_id="evt-1""#;
    assert_eq!(
        lines(&buf),
        [
            format!(" INFO idem::guest: 0123456789 {tags} truncated=false"),
            format!(" INFO idem::guest: {x} {tags} stream=\"stdout\" truncated=false"),
            format!(" INFO idem::guest: {x} {tags} stream=\"stdout\" truncated=false"),
            format!(" INFO idem::guest: xxxxxxx {tags} stream=\"stdout\" truncated=true"),
            format!(
                " WARN idem::guest: guest log output over the per-message cap (max_log_kib) was dropped \
                 handler=wasi-probe message_id=evt-1 dropped_bytes=113 dropped_lines=3 cap_bytes={cap}"
            ),
        ]
    );
}

#[tokio::test]
async fn a_sleeping_guest_is_stopped_by_the_deadline() {
    let db = db().await;
    LazyLock::force(&PROBE);
    let limits = Limits {
        deadline: Duration::from_millis(300),
        ..Limits::default()
    };
    let start = Instant::now();
    let r = probe(&db, limits, json!({"op": "sleep", "ms": 60_000})).await;
    let took = start.elapsed();
    assert_eq!(
        r,
        Err(HandlerFailure::Trap("exceeded the 300ms deadline".into()))
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// Sleeping on the monotonic clock (which starts at the call) still waits
/// as long as asked.
#[tokio::test]
async fn a_short_sleep_returns_after_its_time() {
    let db = db().await;
    LazyLock::force(&PROBE);
    let start = Instant::now();
    let r = probe(&db, Limits::default(), json!({"op": "sleep", "ms": 200})).await;
    let took = start.elapsed();
    assert_eq!(r, Ok(()));
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(3),
        "took {took:?}"
    );
}

#[tokio::test]
async fn exit_and_abort_are_traps_explained_by_stderr() {
    let db = db().await;
    // WASI 0.2's exit carries ok or error only: any non-zero code is 1.
    let r = probe(&db, Limits::default(), json!({"op": "exit", "code": 3})).await;
    assert_eq!(
        r,
        Err(HandlerFailure::Trap(
            "the guest exited with status 1 (wasi:cli/exit)".into()
        ))
    );
    let r = probe(
        &db,
        Limits::default(),
        json!({"op": "abort", "stderr": "fatal: the ledger is on fire"}),
    )
    .await;
    assert_eq!(
        r,
        Err(HandlerFailure::Trap(
            "wasm trap: wasm `unreachable` instruction executed; \
             the guest last wrote to stderr: fatal: the ledger is on fire"
                .into()
        ))
    );
    // The host goes on: the next message runs.
    let r = probe(&db, Limits::default(), json!({"op": "print"})).await;
    assert_eq!(r, Ok(()));
}
