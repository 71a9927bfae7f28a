//! Hostile guests, runtime half: guests that loop, hoard memory,
//! overflow a stack, flood the log or return a huge reason. Each runs
//! through the real host next to a well-behaved handler ([`Arena`]) on
//! PostgreSQL and SQLite: the hostile message ends in a rollback (no receipt,
//! no effect rows) with an exact reason in its dead-letter row, and the host
//! keeps serving both handlers exactly.
//! The SQL half is in `hostile_sql.rs`; module-level cases (not a component,
//! corrupt file, unknown import) are in `host/tests/runtime_load.rs` and
//! `cli.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use serde_json::{Value, json};
use std::time::Duration;

const VICTIM: i64 = Arena::VICTIM;

fn credit_then(event_id: &str, then: Value) -> Value {
    Arena::credit_then(event_id, then)
}

/// `(message_id, reason)` of a dead letter.
fn dl(id: &str, reason: &str) -> (Option<String>, String) {
    (Some(id.to_string()), reason.to_string())
}

async fn infinite_loop(backend: Backend) {
    let a = Arena::start(backend, "deadline = \"300ms\"\nmax_deliver = 2", &[]).await;
    let hostile = [credit_then("evt_loop", json!({"op": "loop"}))];
    let r = a.run(&hostile, &[], Duration::from_secs(10)).await;
    // Two deliveries, each stopped by the deadline: retry, then dead letter.
    let s = r.stats;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.retried,
            s.dead_lettered,
            s.traps
        ),
        (3, 1, 1, 1, 2),
        "{s}"
    );
    assert_eq!(
        r.dead_letters,
        [dl(
            "evt_loop",
            "trap: exceeded the 300ms deadline (delivery 2 of max_deliver 2)"
        )]
    );
    assert_eq!(a.db.balance(VICTIM).await, None);
    a.stop().await;
}
on_both_databases!(infinite_loop, infinite_loop);

/// The default 5 s deadline: on SQLite the looping guest holds the write lock
/// (taken with its receipt) until the deadline, so the well-behaved handler
/// waits for it; it must wait, not fail.
async fn infinite_loop_default_deadline(backend: Backend) {
    let a = Arena::start(backend, "max_deliver = 1", &[]).await;
    let hostile = [credit_then("evt_loop", json!({"op": "loop"}))];
    let r = a.run(&hostile, &[], Duration::from_secs(15)).await;
    let s = r.stats;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.retried,
            s.dead_lettered,
            s.traps
        ),
        (2, 1, 0, 1, 1),
        "{s}"
    );
    assert_eq!(
        r.dead_letters,
        [dl(
            "evt_loop",
            "trap: exceeded the 5s deadline (delivery 1 of max_deliver 1)"
        )]
    );
    assert_eq!(a.db.balance(VICTIM).await, None);
    a.stop().await;
}
on_both_databases!(
    infinite_loop_default_deadline,
    infinite_loop_default_deadline
);

async fn memory_bomb(backend: Backend) {
    let a = Arena::start(backend, "max_memory_mib = 16\nmax_deliver = 1", &[]).await;
    let hostile = [credit_then("evt_bomb", json!({"op": "membomb"}))];
    let r = a.run(&hostile, &[], Duration::from_secs(10)).await;
    let s = r.stats;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.retried,
            s.dead_lettered,
            s.traps
        ),
        (2, 1, 0, 1, 1),
        "{s}"
    );
    assert_eq!(r.dead_letters.len(), 1);
    let (id, reason) = &r.dead_letters[0];
    assert_eq!(id.as_deref(), Some("evt_bomb"));
    let asked = reason
        .strip_prefix("trap: exceeded the memory limit of 16777216 bytes (asked for ")
        .and_then(|r| r.strip_suffix(") (delivery 1 of max_deliver 1)"))
        .unwrap_or_else(|| panic!("reason: {reason}"));
    let asked: u64 = asked.parse().unwrap();
    assert!(asked > 16 << 20, "asked for {asked}");
    assert_eq!(a.db.balance(VICTIM).await, None);
    a.stop().await;
}
on_both_databases!(memory_bomb, memory_bomb);

async fn deep_recursion(backend: Backend) {
    let a = Arena::start(backend, "max_deliver = 1", &[]).await;
    let hostile = [
        // Only the wasm call stack grows: wasmtime's stack limit traps.
        credit_then("evt_stack", json!({"op": "recurse"})),
        // 4 KiB per call on the shadow stack in linear memory, which sits
        // below the data: it runs off the bottom of memory first.
        credit_then("evt_shadow", json!({"op": "recurse", "shadow": true})),
    ];
    let r = a.run(&hostile, &[], Duration::from_secs(10)).await;
    let s = r.stats;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.retried,
            s.dead_lettered,
            s.traps
        ),
        (3, 1, 0, 2, 2),
        "{s}"
    );
    assert_eq!(
        r.dead_letters,
        [
            dl(
                "evt_stack",
                "trap: wasm trap: call stack exhausted (delivery 1 of max_deliver 1)"
            ),
            dl(
                "evt_shadow",
                "trap: wasm trap: out of bounds memory access (delivery 1 of max_deliver 1)"
            ),
        ]
    );
    assert_eq!(a.db.balance(VICTIM).await, None);
    a.stop().await;
}
on_both_databases!(deep_recursion, deep_recursion);

async fn log_flood(backend: Backend) {
    let a = Arena::start(backend, "max_deliver = 1", &[]).await;
    let hostile = [
        // 16 MiB in 16,384 lines of 1 KiB against the 64 KiB cap per message.
        credit_then(
            "evt_flood",
            json!({"op": "log", "bytes": 1024, "lines": 16_384}),
        ),
        // One 8 MiB line.
        json!({"op": "log", "event_id": "evt_line", "bytes": 8 << 20}),
        // 100,000 empty lines: each costs its fixed part of the cap.
        json!({"op": "log", "event_id": "evt_empty", "bytes": 0, "lines": 100_000}),
    ];
    let r = a
        .run(
            &hostile,
            &["evt_empty", "evt_flood", "evt_line"],
            Duration::from_secs(20),
        )
        .await;
    // The output over the cap is dropped; the messages are not failures.
    let s = r.stats;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.retried,
            s.dead_lettered,
            s.traps
        ),
        (4, 4, 0, 0, 0),
        "{s}"
    );
    // Counted exactly (64 KiB cap; a line costs its text plus its fixed
    // part, handler and message id included, and has at most 4 KiB of
    // text): the 1 KiB flood keeps as many whole lines as fit and, when the
    // rest still holds an empty line, part of the next; the 8 MiB line
    // keeps 4 KiB; empty lines drop no bytes.
    let cap = 64 * 1024;
    let o = idem::log_format::guest_line_overhead("hostile", "evt_flood");
    let whole = cap / (o + 1024);
    let rest = cap - whole * (o + 1024);
    let part = rest.saturating_sub(o);
    let flood_dropped = (16_384 - whole) * 1024 - part;
    assert_eq!(
        s.log_bytes_dropped as usize,
        flood_dropped + ((8 << 20) - idem::log_format::MAX_FIELD_BYTES),
        "{s}"
    );
    assert!(r.dead_letters.is_empty(), "{:?}", r.dead_letters);
    assert_eq!(a.db.balance(VICTIM).await, Some(5));
    eprintln!("log flood: 3 floods + 1 credit settled in {:?}", r.elapsed);
    a.stop().await;
}
on_both_databases!(log_flood, log_flood);

async fn huge_error_string(backend: Backend) {
    let a = Arena::start(backend, "max_deliver = 1", &[]).await;
    let huge = |id: &str, fill: &str, repeat: u64, kind: &str| json!({"op": "huge-error", "event_id": id, "fill": fill, "repeat": repeat, "kind": kind});
    let hostile = [
        credit_then("evt_e1", huge("", "E", 1_000_000, "reject")),
        // 3-byte chars: 4096 is not a char boundary; the cut falls at 4095.
        huge("evt_e2", "€", 2000, "reject"),
        huge("evt_e3", "R", 100_000, "retry"),
        // Exactly at the cap: kept whole.
        huge("evt_e4", "K", 4096, "reject"),
    ];
    let r = a.run(&hostile, &[], Duration::from_secs(10)).await;
    let s = r.stats;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.retried,
            s.dead_lettered,
            s.traps
        ),
        (5, 1, 0, 4, 0),
        "{s}"
    );
    assert_eq!(
        r.dead_letters,
        [
            dl(
                "evt_e1",
                &format!("rejected: {}… (995904 more bytes)", "E".repeat(4096))
            ),
            dl(
                "evt_e2",
                &format!("rejected: {}… (1905 more bytes)", "€".repeat(1365))
            ),
            dl(
                "evt_e3",
                &format!(
                    "retry: {}… (95904 more bytes) (delivery 1 of max_deliver 1)",
                    "R".repeat(4096)
                )
            ),
            dl("evt_e4", &format!("rejected: {}", "K".repeat(4096))),
        ]
    );
    // The guest's part of every reason is at most the runtime's cap plus the
    // "… (N more bytes)" note.
    for (_, reason) in &r.dead_letters {
        let guest_part = reason.split_once(": ").unwrap().1;
        let guest_part = guest_part.split('…').next().unwrap();
        assert!(guest_part.len() <= idem::runtime::MAX_REASON_BYTES);
    }
    assert_eq!(a.db.balance(VICTIM).await, None);
    a.stop().await;
}
on_both_databases!(huge_error_string, huge_error_string);
