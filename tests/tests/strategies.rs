//! One example handler per idempotency strategy of docs/strategies.md, each
//! with its own tables and migrations under `examples/`, run through idem on
//! PostgreSQL and SQLite against a private nats-server.
//!
//! For each strategy (likes: natural unique key; projection: state-based
//! update; parcel: converging upsert; counter: aggregate recording applied
//! operation ids) three tests:
//!
//! - `*_redelivery_after_crash`: the host process aborts after COMMIT and
//!   before the ack; the restarted host gets the redelivery as a duplicate
//!   (idem's receipt) and the rows stay exactly as committed;
//! - `*_replay_past_receipts`: the whole stream is consumed again by a second
//!   handler with another name (its own durable consumer and receipts, same
//!   module, same tables), so no receipt can help: the strategy alone keeps
//!   the rows exactly as they were. `credit_replay_doubles_control` runs the
//!   same replay on the credit ledger, which relies on receipts only, and
//!   watches every balance double: the replay really runs every event again;
//! - the strategy's own case (a second like for one tuple, versions out of
//!   order, one set of scans in several orders, operation ids retried under
//!   new events).
//!
//! Each strategy exists in Rust (`examples/<strategy>`) and JavaScript
//! (`examples/<strategy>-js`, same tables and migrations): every test runs
//! on both, on both databases (`in_each_language!`). The harness is
//! `idem_tests::examples`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::examples::*;
use idem_tests::*;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// `$test(example, backend)` for the strategy's example in each language
/// (`examples/<example>` in Rust, `examples/<example>-js` in JavaScript) on
/// each database: `$test::{rust,js}_{postgres,sqlite}`.
macro_rules! in_each_language {
    ($test:ident, $example:literal) => {
        mod $test {
            use idem_tests::Backend;
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rust_postgres() {
                super::$test($example, Backend::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rust_sqlite() {
                super::$test($example, Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn js_postgres() {
                super::$test(concat!($example, "-js"), Backend::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn js_sqlite() {
                super::$test(concat!($example, "-js"), Backend::Sqlite).await
            }
        }
    };
}

// ---------------------------------------------------------------------------
// Control: the credit ledger relies on idem's receipts alone, so the same
// replay credits every event a second time.

async fn credit_replay_doubles_control(backend: Backend) {
    let stream: Vec<Value> = [(1, 10, 500), (2, 10, 250), (3, 11, 70), (4, 10, -50)]
        .iter()
        .map(|(i, account, amount)| {
            json!({"event_id": format!("evt_{i}"), "account_id": account, "amount": amount})
        })
        .collect();
    replay_past_receipts(
        &Env::new("credit", backend).await,
        &stream,
        "SELECT account_id, balance FROM accounts ORDER BY account_id",
        &["10|700", "11|70"],
        &["10|1400", "11|140"],
        &[],
    )
    .await;
}
on_both_databases!(credit_replay_doubles_control, credit_replay_doubles_control);

// ---------------------------------------------------------------------------
// Natural unique key: like notifications, one per (recipient, actor, post, kind).

const NOTIFICATIONS: &str = "SELECT recipient_id, actor_id, post_id, kind, event_id \
     FROM notifications ORDER BY recipient_id, actor_id, post_id, kind";

fn like(event_id: &str, post_id: i64, author_id: i64, actor_id: i64) -> Value {
    json!({"event_id": event_id, "post_id": post_id, "author_id": author_id, "actor_id": actor_id})
}

async fn likes_redelivery_after_crash(example: &'static str, backend: Backend) {
    redelivery_after_crash(
        &Env::new(example, backend).await,
        like("evt_123", 42, 7, 9),
        NOTIFICATIONS,
        &["7|9|42|like|evt_123"],
    )
    .await;
}
in_each_language!(likes_redelivery_after_crash, "likes");

/// A second like event (new event_id, so idem's receipt lets it through) for
/// the same (recipient, actor, post) adds nothing: the notification keeps the
/// first event's id and time. A like that differs in any part of the key is
/// another notification.
async fn likes_second_like_same_tuple_adds_nothing(example: &'static str, backend: Backend) {
    let e = Env::new(example, backend).await;
    let name = e.name().to_string();
    let host = RunningHost::start(&e.config("idem", &[&name], "")).await;
    let before = now_ms();
    e.publish(&like("evt_1", 42, 7, 9)).await;
    processed(&host, &name, 1).await;
    let first = e.rows("SELECT created_at_ms FROM notifications").await;
    assert_eq!(first.len(), 1);
    let at: i64 = first[0].parse().unwrap();
    assert!(
        (before - 1000..=now_ms()).contains(&at),
        "created_at_ms {at} is not the publish time"
    );

    e.publish(&like("evt_2", 42, 7, 9)).await;
    processed(&host, &name, 2).await;
    assert_eq!(e.rows(NOTIFICATIONS).await, strs(&["7|9|42|like|evt_1"]));
    assert_eq!(
        e.rows("SELECT created_at_ms FROM notifications").await,
        first
    );
    // Both events have their receipt: the natural key, not a receipt, held.
    assert_eq!(e.db.receipt_ids(&name).await, strs(&["evt_1", "evt_2"]));

    // Another actor, another post, another recipient: three notifications.
    e.publish(&like("evt_3", 42, 7, 11)).await;
    e.publish(&like("evt_4", 43, 7, 9)).await;
    e.publish(&like("evt_5", 42, 8, 9)).await;
    processed(&host, &name, 5).await;
    assert_eq!(
        e.rows(NOTIFICATIONS).await,
        strs(&[
            "7|9|42|like|evt_1",
            "7|9|43|like|evt_4",
            "7|11|42|like|evt_3",
            "8|9|42|like|evt_5",
        ])
    );
    host.stop().await;
}
in_each_language!(likes_second_like_same_tuple_adds_nothing, "likes");

async fn likes_replay_past_receipts(example: &'static str, backend: Backend) {
    let stream = [
        like("evt_1", 42, 7, 9),
        like("evt_2", 42, 7, 11),
        like("evt_3", 42, 7, 9), // the same like again, new event
        like("evt_4", 43, 7, 9),
        like("evt_5", 50, 8, 7),
        like("evt_6", 42, 7, 11), // again
    ];
    let rows = [
        "7|9|42|like|evt_1",
        "7|9|43|like|evt_4",
        "7|11|42|like|evt_2",
        "8|7|50|like|evt_5",
    ];
    replay_past_receipts(
        &Env::new(example, backend).await,
        &stream,
        NOTIFICATIONS,
        &rows,
        &rows,
        // With the publish times: the replay must not touch them either.
        &[
            "SELECT recipient_id, actor_id, post_id, kind, created_at_ms \
           FROM notifications ORDER BY recipient_id, actor_id, post_id, kind",
        ],
    )
    .await;
}
in_each_language!(likes_replay_past_receipts, "likes");

// ---------------------------------------------------------------------------
// State-based update: an order projection that applies an event only when it
// advances the order's version.

const ORDERS: &str = "SELECT order_id, version, status, total_cents FROM orders ORDER BY order_id";

fn order(event_id: &str, order_id: i64, version: i64, status: &str, total_cents: i64) -> Value {
    json!({"event_id": event_id, "order_id": order_id, "version": version,
           "status": status, "total_cents": total_cents})
}

/// The states of one order: version 1, 2, 3.
fn order_versions(order_id: i64, first_event: i64) -> [Value; 3] {
    let e = |v: i64| format!("evt_{}", first_event + v - 1);
    [
        order(&e(1), order_id, 1, "placed", 4000),
        order(&e(2), order_id, 2, "paid", 4200),
        order(&e(3), order_id, 3, "shipped", 4250),
    ]
}

async fn projection_redelivery_after_crash(example: &'static str, backend: Backend) {
    redelivery_after_crash(
        &Env::new(example, backend).await,
        order("evt_1", 1001, 1, "placed", 4000),
        ORDERS,
        &["1001|1|placed|4000"],
    )
    .await;
}
in_each_language!(projection_redelivery_after_crash, "projection");

/// Versions 3, 1, 2 of one order, in that order, each its own new event: the
/// row is at version 3 from the first message on, and versions 1 and 2 are
/// ignored (checked after each). The same versions in order 1, 2, 3 on
/// another order end in the same state.
async fn projection_out_of_order_versions_ignored(example: &'static str, backend: Backend) {
    let e = Env::new(example, backend).await;
    let name = e.name().to_string();
    let host = RunningHost::start(&e.config("idem", &[&name], "")).await;
    let [v1, v2, v3] = order_versions(1001, 1);
    for (i, event) in [v3, v1, v2].iter().enumerate() {
        e.publish(event).await;
        processed(&host, &name, i as u64 + 1).await;
        assert_eq!(
            e.rows(ORDERS).await,
            strs(&["1001|3|shipped|4250"]),
            "after {event}"
        );
    }
    for event in order_versions(1002, 4) {
        e.publish(&event).await;
    }
    processed(&host, &name, 6).await;
    assert_eq!(
        e.rows(ORDERS).await,
        strs(&["1001|3|shipped|4250", "1002|3|shipped|4250"])
    );
    assert_eq!(e.db.receipts(&name).await, 6);
    host.stop().await;
}
in_each_language!(projection_out_of_order_versions_ignored, "projection");

async fn projection_replay_past_receipts(example: &'static str, backend: Backend) {
    let [a1, a2, a3] = order_versions(1001, 1);
    let [b1, b2, b3] = order_versions(1002, 4);
    let stream = [
        a3,
        b1,
        a1,
        b2,
        order("evt_7", 1002, 4, "delivered", 4250),
        a2,
        // Late: 1002 is at version 4.
        b3,
        // First seen at version 2.
        order("evt_8", 1003, 2, "paid", 990),
    ];
    let rows = [
        "1001|3|shipped|4250",
        "1002|4|delivered|4250",
        "1003|2|paid|990",
    ];
    replay_past_receipts(
        &Env::new(example, backend).await,
        &stream,
        ORDERS,
        &rows,
        &rows,
        &[],
    )
    .await;
}
in_each_language!(projection_replay_past_receipts, "projection");

// ---------------------------------------------------------------------------
// Upsert: the latest delivery state of a parcel, by (at, state), converges
// whatever the order.

const PARCELS: &str = "SELECT parcel_id, state, at_ms FROM parcels ORDER BY parcel_id";

/// 2023-11-14T22:13:20Z, in ms.
const T0: i64 = 1_700_000_000_000;

/// One parcel's scans, oldest first. The last two were observed in the same
/// millisecond: the tie goes to the greater state text, `delivered`.
const SCANS: [(&str, i64); 5] = [
    ("received", T0),
    ("in_transit", T0 + 3_600_000),
    ("out_for_delivery", T0 + 7_200_000),
    ("attempted", T0 + 9_000_000),
    ("delivered", T0 + 9_000_000),
];

fn scan(event_id: &str, parcel_id: &str, (state, at): (&str, i64)) -> Value {
    json!({"event_id": event_id, "parcel_id": parcel_id, "state": state, "at": at})
}

/// The scans of `parcel_id` in the order of `order` (indices into
/// [`SCANS`]), event ids `evt_<parcel>_<n>`.
fn scans(parcel_id: &str, order: &[usize]) -> Vec<Value> {
    order
        .iter()
        .enumerate()
        .map(|(n, &i)| scan(&format!("evt_{parcel_id}_{n}"), parcel_id, SCANS[i]))
        .collect()
}

async fn parcel_redelivery_after_crash(example: &'static str, backend: Backend) {
    redelivery_after_crash(
        &Env::new(example, backend).await,
        scan("evt_1", "PCL-1", SCANS[0]),
        PARCELS,
        &[&format!("PCL-1|received|{T0}")],
    )
    .await;
}
in_each_language!(parcel_redelivery_after_crash, "parcel");

/// The same five scans (two of them in one millisecond) published to four
/// parcels in four orders (oldest first, newest first, shuffled, and shuffled
/// with repeats under new event ids): the four rows are the same state.
async fn parcel_converges_whatever_the_order(example: &'static str, backend: Backend) {
    let e = Env::new(example, backend).await;
    let name = e.name().to_string();
    let host = RunningHost::start(&e.config("idem", &[&name], "")).await;
    let orders: [(&str, &[usize]); 4] = [
        ("PCL-A", &[0, 1, 2, 3, 4]),
        ("PCL-B", &[4, 3, 2, 1, 0]),
        ("PCL-C", &[2, 4, 0, 3, 1]),
        ("PCL-D", &[3, 0, 4, 4, 1, 3, 2, 0]),
    ];
    let mut n = 0;
    for (parcel, order) in orders {
        for event in scans(parcel, order) {
            e.publish(&event).await;
            n += 1;
        }
    }
    processed(&host, &name, n).await;
    let last = T0 + 9_000_000;
    assert_eq!(
        e.rows(PARCELS).await,
        ["PCL-A", "PCL-B", "PCL-C", "PCL-D"]
            .iter()
            .map(|p| format!("{p}|delivered|{last}"))
            .collect::<Vec<_>>()
    );
    assert_eq!(e.db.receipts(&name).await, n as i64);
    host.stop().await;
}
in_each_language!(parcel_converges_whatever_the_order, "parcel");

async fn parcel_replay_past_receipts(example: &'static str, backend: Backend) {
    let mut stream = scans("PCL-A", &[0, 1, 2, 3, 4]);
    stream.extend(scans("PCL-B", &[4, 2, 3, 0, 1]));
    stream.extend(scans("PCL-C", &[1, 0, 1])); // still in transit
    stream.extend(scans("PCL-D", &[3, 2])); // attempted, then an older scan
    let rows = [
        format!("PCL-A|delivered|{}", T0 + 9_000_000),
        format!("PCL-B|delivered|{}", T0 + 9_000_000),
        format!("PCL-C|in_transit|{}", T0 + 3_600_000),
        format!("PCL-D|attempted|{}", T0 + 9_000_000),
    ];
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    replay_past_receipts(
        &Env::new(example, backend).await,
        &stream,
        PARCELS,
        &rows,
        &rows,
        &[],
    )
    .await;
}
in_each_language!(parcel_replay_past_receipts, "parcel");

// ---------------------------------------------------------------------------
// Idempotent aggregate: a sharded counter that records applied operation ids.

/// The guest's shard count (`examples/counter/src/lib.rs`, `SHARDS`).
const SHARDS: u64 = 8;

/// 64-bit FNV-1a, written again here so the test checks the guest's shards
/// against an independent implementation of the documented function.
fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn shard_of(op_id: &str) -> i64 {
    (fnv1a64(op_id.as_bytes()) % SHARDS) as i64
}

#[test]
fn fnv1a64_matches_the_reference_vectors() {
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
}

const COUNTER_SHARDS: &str = "SELECT counter_key, shard, total FROM counter_shards";
const APPLIED_OPS: &str = "SELECT op_id, counter_key, shard, amount FROM applied_ops";

fn counter_op(event_id: &str, op_id: Option<&str>, key: &str, amount: i64) -> Value {
    let mut v = json!({"event_id": event_id, "key": key, "amount": amount});
    if let Some(op_id) = op_id {
        v["op_id"] = json!(op_id);
    }
    v
}

/// 60 operations on three counters, from a fixed seed: about one in five is
/// a retry of an earlier operation under a new event id (same op_id, key and
/// amount), about one in seven has no op_id (its event id is its op id);
/// amounts from -5 to 20.
fn counter_stream() -> Vec<Value> {
    const KEYS: [&str; 3] = ["cart:42", "page:about", "page:home"];
    let mut seed: u64 = 0x5eed;
    let mut next = |m: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % m
    };
    let mut ops: Vec<(String, &str, i64)> = Vec::new();
    let mut out = Vec::new();
    for i in 1..=60 {
        let event_id = format!("evt_{i:03}");
        let roll = next(100);
        if roll < 20 && !ops.is_empty() {
            let (op_id, key, amount) = ops[next(ops.len() as u64) as usize].clone();
            out.push(counter_op(&event_id, Some(&op_id), key, amount));
            continue;
        }
        let key = KEYS[next(3) as usize];
        let amount = next(26) as i64 - 5;
        if roll < 35 {
            ops.push((event_id.clone(), key, amount));
            out.push(counter_op(&event_id, None, key, amount));
        } else {
            let op_id = format!("op_{:03}", ops.len() + 1);
            ops.push((op_id.clone(), key, amount));
            out.push(counter_op(&event_id, Some(&op_id), key, amount));
        }
    }
    out
}

/// What the counter must hold after `stream`, computed from the events alone:
/// (rows of [`COUNTER_SHARDS`], rows of [`APPLIED_OPS`], total per key), each
/// sorted.
fn counter_expected(stream: &[Value]) -> (Vec<String>, Vec<String>, BTreeMap<String, i64>) {
    let mut ops: BTreeMap<String, (String, i64)> = BTreeMap::new();
    for v in stream {
        let op_id = v
            .get("op_id")
            .unwrap_or(&v["event_id"])
            .as_str()
            .unwrap()
            .to_string();
        let key = v["key"].as_str().unwrap().to_string();
        let amount = v["amount"].as_i64().unwrap();
        let first = ops.entry(op_id).or_insert((key.clone(), amount));
        assert_eq!(*first, (key, amount), "a retry must repeat its operation");
    }
    let mut shards: BTreeMap<(String, i64), i64> = BTreeMap::new();
    let mut totals: BTreeMap<String, i64> = BTreeMap::new();
    let mut applied = Vec::new();
    for (op_id, (key, amount)) in &ops {
        let shard = shard_of(op_id);
        *shards.entry((key.clone(), shard)).or_default() += amount;
        *totals.entry(key.clone()).or_default() += amount;
        applied.push(format!("{op_id}|{key}|{shard}|{amount}"));
    }
    let shards = shards
        .iter()
        .map(|((key, shard), total)| format!("{key}|{shard}|{total}"))
        .collect();
    (shards, applied, totals)
}

fn sorted(mut rows: Vec<String>) -> Vec<String> {
    rows.sort();
    rows
}

async fn counter_redelivery_after_crash(example: &'static str, backend: Backend) {
    let shard = shard_of("op_1");
    redelivery_after_crash(
        &Env::new(example, backend).await,
        counter_op("evt_1", Some("op_1"), "page:home", 5),
        "SELECT 'shard', counter_key, shard, total FROM counter_shards \
         UNION ALL SELECT op_id, counter_key, shard, amount FROM applied_ops",
        &[
            &format!("shard|page:home|{shard}|5"),
            &format!("op_1|page:home|{shard}|5"),
        ],
    )
    .await;
}
in_each_language!(counter_redelivery_after_crash, "counter");

/// The stream of [`counter_stream`], each message processed once by idem
/// (retried operations come as new events, so receipts do not catch them):
/// each counter's total equals the sum computed from the events over distinct
/// op ids, each shard row equals the sum of its operations (shard =
/// FNV-1a(op_id) % 8, computed here), `applied_ops` holds one row per
/// distinct op id, and every shard reconciles with its recorded operations.
async fn counter_totals_match_distinct_operations(example: &'static str, backend: Backend) {
    let stream = counter_stream();
    let (shards, applied, totals) = counter_expected(&stream);
    let retries = stream.len() - applied.len();
    let without_op_id = stream.iter().filter(|v| v.get("op_id").is_none()).count();
    assert!(
        retries >= 5 && without_op_id >= 5,
        "{retries} retries, {without_op_id} without op_id"
    );

    let e = Env::new(example, backend).await;
    let name = e.name().to_string();
    let host = RunningHost::start(&e.config("idem", &[&name], "")).await;
    for event in &stream {
        e.publish(event).await;
    }
    processed(&host, &name, stream.len() as u64).await;
    host.stop().await;

    let got: BTreeMap<String, i64> = e
        .rows(
            "SELECT counter_key, CAST(SUM(total) AS BIGINT) FROM counter_shards \
             GROUP BY counter_key",
        )
        .await
        .iter()
        .map(|r| {
            let (k, v) = r.split_once('|').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    assert_eq!(got, totals);
    assert_eq!(sorted(e.rows(COUNTER_SHARDS).await), sorted(shards));
    assert_eq!(sorted(e.rows(APPLIED_OPS).await), sorted(applied.clone()));
    assert_eq!(
        e.db.scalar("SELECT count(*) FROM applied_ops").await,
        Some(applied.len() as i64)
    );
    assert_eq!(
        e.rows(
            "SELECT s.counter_key, s.shard FROM counter_shards s WHERE s.total <> \
             (SELECT CAST(COALESCE(SUM(a.amount), 0) AS BIGINT) FROM applied_ops a \
              WHERE a.counter_key = s.counter_key AND a.shard = s.shard)"
        )
        .await,
        Vec::<String>::new(),
        "shards that do not reconcile with applied_ops"
    );
    assert_eq!(e.db.receipts(&name).await, stream.len() as i64);
    let keys: BTreeSet<&String> = totals.keys().collect();
    assert_eq!(keys.len(), 3);
}
in_each_language!(counter_totals_match_distinct_operations, "counter");

async fn counter_replay_past_receipts(example: &'static str, backend: Backend) {
    let stream = counter_stream();
    let (shards, _, _) = counter_expected(&stream);
    let shards: Vec<&str> = shards.iter().map(String::as_str).collect();
    replay_past_receipts(
        &Env::new(example, backend).await,
        &stream,
        "SELECT counter_key, shard, total FROM counter_shards ORDER BY counter_key, shard",
        &shards,
        &shards,
        &["SELECT op_id, counter_key, shard, amount FROM applied_ops ORDER BY op_id"],
    )
    .await;
}
in_each_language!(counter_replay_past_receipts, "counter");

// ---------------------------------------------------------------------------

/// Each strategy example, in each language, ships a config the tests can
/// run: its module is the build script's output, its migrations folder has a
/// first migration, its identity is the payload's `event_id`, and it has a
/// README.
#[test]
fn every_example_ships_a_runnable_config() {
    for example in [
        "likes",
        "projection",
        "parcel",
        "counter",
        "likes-js",
        "projection-js",
        "parcel-js",
        "counter-js",
    ] {
        let h = shipped(example);
        assert_eq!(
            h.module.file_name().unwrap().to_str(),
            Some(format!("{example}.wasm").as_str())
        );
        assert!(h.module.parent().unwrap().ends_with("target/guests"));
        assert_eq!(identity(&h.identity), "json:/event_id");
        assert!(!h.tables.is_empty());
        let migrations = h.migrations.unwrap();
        let first = std::fs::read_dir(&migrations)
            .unwrap()
            .filter_map(|f| f.ok())
            .any(|f| f.file_name().to_string_lossy().starts_with("0001_"));
        assert!(first, "{} has no 0001_*.sql", migrations.display());
        assert!(
            root()
                .join("examples")
                .join(example)
                .join("README.md")
                .is_file()
        );
        // A second language's version shares the Rust example's tables.
        if let Some(rust) = example.strip_suffix("-js") {
            let r = shipped(rust);
            assert_eq!(
                (&h.stream, &h.subjects, &h.tables),
                (&r.stream, &r.subjects, &r.tables),
                "{example}"
            );
            assert_eq!(
                migrations.canonicalize().unwrap(),
                r.migrations.unwrap().canonicalize().unwrap(),
                "{example}"
            );
        }
    }
}
