//! A `wasi = true` handler sees the message, not the host: its wall clock
//! reads the message's publish time and its random sources are seeded from
//! the receipt's key (consumer, message id), so a message that runs again
//! (here: its receipt forgotten, then `idem replay`) writes the same row.
//! Against real nats-server, PostgreSQL and SQLite, with the `wasi-probe`
//! guest's `record` op.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use chacha20::ChaCha20Rng;
use chacha20::rand_core::{Rng as _, SeedableRng as _};
use idem_tests::examples::processed;
use idem_tests::*;
use sha2::Digest as _;
use sqlx::Row as _;

const HANDLER: &str = "probe";
const SUBJECT: &str = "accounts.credit";

/// One row of `wasi_seen`: message id, wall clock (ns since the epoch),
/// random bytes (hex), insecure random bytes (hex), insecure seed
/// (`<low>:<high>`).
type Seen = (String, i64, String, String, String);

async fn seen(db: &TestDb) -> Vec<Seen> {
    let pool = db.pool().await;
    let rows = sqlx::query(
        "SELECT message_id, wall_ns, random, insecure, insecure_seed FROM wasi_seen ORDER BY message_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 16 bytes as wasmtime-wasi draws them from a generator: the low byte of
/// each next 32-bit word.
fn sixteen(rng: &mut ChaCha20Rng) -> String {
    let bytes: Vec<u8> = (0..16).map(|_| rng.next_u32() as u8).collect();
    hex(&bytes)
}

/// What the guest must record for `message_id` published at `published_ns`
/// (docs/handlers.md, "What a handler can and cannot do"): the publish time to the
/// millisecond; ChaCha20 keyed with SHA-256(consumer, 0, message id),
/// stream 0 for `random`, 1 for `insecure`, and stream 2's first two words
/// pairs (`u64`s, low first) for the insecure seed.
fn expected(message_id: &str, published_ns: i128) -> Seen {
    let mut h = sha2::Sha256::new();
    h.update(HANDLER.as_bytes());
    h.update([0u8]);
    h.update(message_id.as_bytes());
    let seed: [u8; 32] = h.finalize().into();
    let mut random = ChaCha20Rng::from_seed(seed);
    let mut insecure = ChaCha20Rng::from_seed(seed);
    insecure.set_stream(1);
    let mut seeder = ChaCha20Rng::from_seed(seed);
    seeder.set_stream(2);
    let (lo, hi) = (seeder.next_u64(), seeder.next_u64());
    let wall_ns = i64::try_from(published_ns.div_euclid(1_000_000) * 1_000_000).unwrap();
    (
        message_id.to_string(),
        wall_ns,
        sixteen(&mut random),
        sixteen(&mut insecure),
        format!("{lo}:{hi}"),
    )
}

/// Two messages run once, then the first again after its receipt is
/// forgotten (`idem replay` over the whole stream: the second is a
/// duplicate). The first message's two rows are identical and equal to
/// what its publish time and its receipt key give; the second's random
/// values differ.
async fn a_message_that_runs_again_writes_the_same_row(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    db.execute(
        "CREATE TABLE wasi_seen (message_id TEXT NOT NULL, wall_ns BIGINT NOT NULL, random TEXT NOT NULL, insecure TEXT NOT NULL, insecure_seed TEXT NOT NULL)",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(HANDLER, "wasi-probe");
    spec.tables = vec!["wasi_seen".into()];
    spec.extra.push_str("wasi = true\n");
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);

    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    for id in ["m1", "m2"] {
        let payload = serde_json::json!({"op": "record", "event_id": id}).to_string();
        publish(&js, SUBJECT, &payload, &[]).await;
    }
    processed(&host, HANDLER, 2).await;
    let summary = host.stop().await;
    assert_eq!(summary[0].1.dead_lettered, 0);

    let stream = js.get_stream("ACCOUNTS").await.unwrap();
    let mut want = Vec::new();
    for (seq, id) in [(1, "m1"), (2, "m2")] {
        let msg = stream.get_raw_message(seq).await.unwrap();
        want.push(expected(id, msg.time.unix_timestamp_nanos()));
    }
    let first = seen(&db).await;
    assert_eq!(first, want);
    // Two message ids: other random values, from every source.
    let (a, b) = (&first[0], &first[1]);
    assert_ne!((&a.2, &a.3, &a.4), (&b.2, &b.3, &b.4));
    assert!(a.2 != b.2 && a.3 != b.3 && a.4 != b.4, "{first:?}");
    // The three sources of one message differ from each other.
    assert_ne!(a.2, a.3);

    let cfg_arg = cfg.to_str().unwrap();
    let (code, out, err) = idem_cli(
        &[
            "receipts",
            "forget",
            "--config",
            cfg_arg,
            "--handler",
            HANDLER,
            "m1",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = idem_cli(
        &["replay", "--config", cfg_arg, HANDLER, "--from-seq", "1"],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(db.receipts(HANDLER).await, 2);
    let again = seen(&db).await;
    assert_eq!(
        again,
        vec![want[0].clone(), want[0].clone(), want[1].clone()]
    );
}
on_both_databases!(
    runs_again_alike,
    a_message_that_runs_again_writes_the_same_row
);
