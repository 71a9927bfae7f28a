//! The relay's claim, against real PostgreSQL and SQLite:
//! - `claims_keep_keys_in_order_and_take_no_row_twice`: four "hosts" (each
//!   its own pool) claim the same table at once through
//!   `Database::claim_outbox` while a writer stores deliveries, and send,
//!   fail, park and give back as the relay does; every claim is checked
//!   against a model: no row claimed while another claim holds it, no keyed
//!   row claimed while an earlier row of its key (not parked) exists
//!   outside its own claim and delivery, a fresh unkeyed delivery never
//!   split, the rows of one key sent in id order.
//! - `a_backlog_of_distinct_keys_is_claimed`: 5,000 due rows, one key each
//!   (`key = order id`): one claim takes the oldest 64 (its time is
//!   printed; the ordering-key rule uses the index on consumer, key, id).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::store::{Database, OutboxRow, PARKED, now_ms};
use idem_tests::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------
// The claim, against a model.

#[derive(Default)]
struct Model {
    /// Rows stored and not deleted: id -> (message, key).
    existing: BTreeMap<i64, (String, Option<String>)>,
    parked: HashSet<i64>,
    /// Claimed and not yet deleted / failed / released, by claimer.
    held: HashMap<i64, usize>,
    /// Rows claimed at least once.
    claimed_once: HashSet<i64>,
    /// Per key, the last id sent.
    last_sent: HashMap<String, i64>,
    violations: Vec<String>,
    /// Per row, what happened to it (for the report).
    history: HashMap<i64, Vec<String>>,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn bytes_literal(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "'\\x00'::bytea",
        Backend::Sqlite => "X'00'",
    }
}

async fn claim_model(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.execute("SELECT 1").await;
    let setup = Database::connect(&db.url, 2).await.unwrap();
    setup.prepare_host_tables().await.unwrap();
    let model: Arc<tokio::sync::Mutex<Model>> = Arc::default();
    let writer_done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // One writer: each delivery in one statement (as one transaction).
    let writer = {
        let model = model.clone();
        let done = writer_done.clone();
        let pool = db.pool().await;
        tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            for m in 0..800 {
                let rows = 1 + rng.below(4);
                let mut values = Vec::new();
                let mut meta = Vec::new();
                let unkeyed_message = rng.below(4) == 0;
                for i in 0..rows {
                    let key = if unkeyed_message || rng.below(3) == 0 {
                        None
                    } else {
                        Some(format!("k{}", rng.below(4)))
                    };
                    let key_sql = key.as_ref().map_or("NULL".to_owned(), |k| format!("'{k}'"));
                    values.push(format!(
                        "('h', 'm{m}', {i}, 'publish', 'x.y', {}, '[]', {key_sql}, 1)",
                        bytes_literal(backend)
                    ));
                    meta.push(key);
                }
                let sql = format!(
                    "INSERT INTO idem_outbox (consumer, message_id, call_index, kind, target, payload, headers, ordering_key, created_ms) VALUES {} RETURNING id",
                    values.join(", ")
                );
                let mut g = model.lock().await;
                // Held across the statement: a claim's check waits for it.
                let ids: Vec<i64> = {
                    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                        .fetch_all(&pool)
                        .await
                        .unwrap();
                    rows.iter()
                        .map(|r| sqlx::Row::try_get::<i64, _>(r, 0).unwrap())
                        .collect()
                };
                let mut ids = ids;
                ids.sort();
                for (id, key) in ids.into_iter().zip(meta) {
                    g.existing.insert(id, (format!("m{m}"), key));
                }
                drop(g);
                if rng.below(3) == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };

    let mut claimers = Vec::new();
    for c in 0..4usize {
        let model = model.clone();
        let url = db.url.clone();
        let done = writer_done.clone();
        claimers.push(tokio::spawn(async move {
            let store = Database::connect(&url, 2).await.unwrap();
            let mut rng = Rng(0x1234_5678 + c as u64 * 7919);
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                let limit = 1 + u32::try_from(rng.below(4)).unwrap();
                let rows = store.claim_outbox(now_ms(), 30_000, limit).await.unwrap();
                if rows.is_empty() {
                    let left = {
                        let g = model.lock().await;
                        g.existing
                            .keys()
                            .filter(|id| !g.parked.contains(id))
                            .count()
                    };
                    if (done.load(std::sync::atomic::Ordering::SeqCst) && left == 0)
                        || Instant::now() > deadline
                    {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    continue;
                }
                check_claim(&mut *model.lock().await, c, &rows);
                // Send as the relay does: a delivery in call order; a
                // failed keyed row gives back the later rows of its key.
                let mut by_msg: BTreeMap<String, Vec<OutboxRow>> = BTreeMap::new();
                for r in rows {
                    by_msg.entry(r.message_id.clone()).or_default().push(r);
                }
                for (_, mut d) in by_msg {
                    d.sort_by_key(|r| r.call_index);
                    let mut failed: HashSet<String> = HashSet::new();
                    for r in d {
                        if r.key.as_ref().is_some_and(|k| failed.contains(k)) {
                            let mut g = model.lock().await;
                            g.held.remove(&r.id);
                            let t = now_ms();
                            store.outbox_release(r.id, t, r.lease_ms).await.unwrap();
                            g.history
                                .entry(r.id)
                                .or_default()
                                .push(format!("{c} released at {t}, done {}", now_ms()));
                            continue;
                        }
                        let roll = rng.below(100);
                        if roll < 70 {
                            let mut g = model.lock().await;
                            store.outbox_sent(&[r.id]).await.unwrap();
                            g.existing.remove(&r.id);
                            g.held.remove(&r.id);
                            if let Some(k) = &r.key {
                                let last = g.last_sent.get(k).copied().unwrap_or(0);
                                if r.id < last {
                                    g.violations.push(format!(
                                        "key {k}: row {} sent after row {last}",
                                        r.id
                                    ));
                                }
                                g.last_sent.insert(k.clone(), r.id);
                            }
                        } else {
                            let park = roll >= 97;
                            let due = if park {
                                PARKED
                            } else {
                                now_ms() + i64::try_from(rng.below(20)).unwrap()
                            };
                            let mut g = model.lock().await;
                            g.held.remove(&r.id);
                            if park {
                                g.parked.insert(r.id);
                            }
                            store
                                .outbox_failed(r.id, due, "x", r.lease_ms)
                                .await
                                .unwrap();
                            g.history
                                .entry(r.id)
                                .or_default()
                                .push(format!("{c} failed, due {due}, done {}", now_ms()));
                            if let Some(k) = &r.key {
                                failed.insert(k.clone());
                            }
                        }
                    }
                }
            }
        }));
    }
    writer.await.unwrap();
    for c in claimers {
        c.await.unwrap();
    }
    let g = model.lock().await;
    let left: Vec<_> = g
        .existing
        .keys()
        .filter(|id| !g.parked.contains(id))
        .collect();
    assert!(
        g.violations.is_empty(),
        "{} violations, first: {:#?}",
        g.violations.len(),
        &g.violations[..g.violations.len().min(10)]
    );
    assert!(left.is_empty(), "rows never claimed again: {left:?}");
}

fn check_claim(g: &mut Model, claimer: usize, rows: &[OutboxRow]) {
    let ids: HashSet<i64> = rows.iter().map(|r| r.id).collect();
    for r in rows {
        if let Some(other) = g.held.get(&r.id) {
            g.violations.push(format!(
                "row {} claimed by {claimer} while claimer {other} holds it",
                r.id
            ));
        }
        if let Some(k) = &r.key {
            let blockers: Vec<i64> = g
                .existing
                .range(..r.id)
                .filter(|(id, (m, key))| {
                    key.as_deref() == Some(k.as_str())
                        && !g.parked.contains(id)
                        && !(ids.contains(id) && *m == r.message_id)
                })
                .map(|(id, _)| *id)
                .collect();
            if !blockers.is_empty() {
                let about: Vec<String> = blockers
                    .iter()
                    .chain(std::iter::once(&r.id))
                    .map(|b| {
                        format!(
                            "row {b} of {:?} held by {:?}: {:?}",
                            g.existing.get(b).map(|e| e.0.clone()),
                            g.held.get(b),
                            g.history.get(b)
                        )
                    })
                    .collect();
                g.violations.push(format!(
                    "row {} ({}, key {k}) claimed by {claimer} at {} while earlier rows {blockers:?} of its key wait; {about:#?}",
                    r.id, r.message_id, now_ms()
                ));
            }
        }
    }
    // A fresh delivery without keys is claimed whole.
    let msgs: HashSet<&str> = rows.iter().map(|r| r.message_id.as_str()).collect();
    for m in msgs {
        let of_m: Vec<(i64, bool)> = g
            .existing
            .iter()
            .filter(|(_, (mm, _))| mm == m)
            .map(|(id, (_, k))| (*id, k.is_none()))
            .collect();
        if of_m.iter().all(|(_, unkeyed)| *unkeyed)
            && of_m.iter().all(|(id, _)| !g.claimed_once.contains(id))
        {
            let missing: Vec<i64> = of_m
                .iter()
                .map(|(id, _)| *id)
                .filter(|id| !ids.contains(id))
                .collect();
            if !missing.is_empty() {
                g.violations.push(format!(
                    "fresh delivery {m} split: rows {missing:?} not in the claim"
                ));
            }
        }
    }
    for r in rows {
        g.held.insert(r.id, claimer);
        g.claimed_once.insert(r.id);
        g.history
            .entry(r.id)
            .or_default()
            .push(format!("claimed by {claimer} with {:?}", ids));
    }
}

on_both_databases!(claims_keep_keys_in_order_and_take_no_row_twice, claim_model);

// ---------------------------------------------------------------------
// A backlog of keyed rows (one key per message, as `key = order id`): one
// claim takes the oldest ones. Its time is printed (the relay bounds a
// claim by CLAIM_TIMEOUT, 2 s).

on_both_databases!(a_backlog_of_distinct_keys_is_claimed, backlog_claim);

async fn backlog_claim(backend: Backend) {
    let db = TestDb::new(backend).await;
    db.execute("SELECT 1").await;
    let store = Database::connect(&db.url, 2).await.unwrap();
    store.prepare_host_tables().await.unwrap();
    let pool = db.pool().await;
    let n = 5_000;
    for chunk in 0..(n / 500) {
        let values: Vec<String> = (0..500)
            .map(|i| {
                let m = chunk * 500 + i;
                format!(
                    "('h', 'm{m}', 0, 'publish', 'x.y', {}, '[]', 'order-{m}', 1)",
                    bytes_literal(backend)
                )
            })
            .collect();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO idem_outbox (consumer, message_id, call_index, kind, target, payload, headers, ordering_key, created_ms) VALUES {}",
            values.join(", ")
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    if backend == Backend::Postgres {
        sqlx::query("ANALYZE idem_outbox")
            .execute(&pool)
            .await
            .unwrap();
    }
    let t = Instant::now();
    let claimed = tokio::time::timeout(
        Duration::from_secs(60),
        store.claim_outbox(now_ms(), 30_000, idem::outbox::relay::CLAIM),
    )
    .await;
    let took = t.elapsed();
    eprintln!("{backend:?}: one claim over {n} keyed rows took {took:?}");
    let claimed = claimed.expect("no answer within 60 s").unwrap();
    let mut ids: Vec<String> = claimed.iter().map(|r| r.message_id.clone()).collect();
    ids.sort_by_key(|m| m[1..].parse::<u32>().unwrap());
    assert_eq!(ids, (0..64).map(|m| format!("m{m}")).collect::<Vec<_>>());
}
