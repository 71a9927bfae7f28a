//! Issue 5: the credit handler in every language idem ships an example for
//! runs the same redelivery test, on PostgreSQL and SQLite:
//!
//! 1. a real host process commits the first event and aborts before its ack
//!    (`IDEM_FAULT=abort-after-commit:1`): exactly that credit is in the
//!    table, with its receipt;
//! 2. a fresh host receives the redelivery after `ack_wait`: a duplicate,
//!    nothing changes;
//! 3. the same event published again (a second delivery of one event under
//!    a new stream sequence) is a duplicate too; two new events are credited
//!    and a malformed one is rejected by the handler's own validation and
//!    dead-lettered at once;
//! 4. the final rows are exact: balances, receipt ids, the dead letter.
//!
//! Components: `examples/credit` (Rust, guest SDK), `examples/credit-c`
//! (C: wit-bindgen + zig cc), `examples/credit-js` built with QuickJS (the
//! default) and with StarlingMonkey, `examples/credit-python`
//! (componentize-py). `scripts/test.sh` builds them all
//! (`scripts/build-guests.sh`, `scripts/build-lang-guests.sh`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::examples::*;
use idem_tests::*;
use serde_json::json;

const ACCOUNTS: &str = "SELECT account_id, balance FROM accounts ORDER BY account_id";

/// The test above for `examples/<example>`, loading `target/guests/<build>.wasm`
/// when `build` is given (another engine for the same source).
async fn credit_in(example: &'static str, build: Option<&str>, backend: Backend) {
    let mut e = Env::new(example, backend).await;
    if let Some(build) = build {
        e = e.with_module(build);
    }
    let name = e.name().to_string();
    let first = json!({"event_id": "evt_1", "account_id": 73, "amount": 500});
    let cfg = redelivery_after_crash(&e, first.clone(), ACCOUNTS, &["73|500"]).await;

    let host = RunningHost::start(&cfg).await;
    e.publish(&first).await;
    e.publish(&json!({"event_id": "evt_2", "account_id": 73, "amount": -120}))
        .await;
    e.publish(&json!({"event_id": "evt_3", "account_id": 74, "amount": 9}))
        .await;
    e.publish(&json!({"event_id": "evt_bad", "account_id": "73", "amount": 1}))
        .await;
    let s = host
        .wait_for(&name, "four messages", |s| {
            s.processed + s.duplicates + s.dead_lettered >= 4
        })
        .await;
    assert_eq!(
        (
            s.delivered,
            s.processed,
            s.duplicates,
            s.dead_lettered,
            s.retried,
            s.traps
        ),
        (4, 2, 1, 1, 0, 0),
        "{example}: {s}"
    );
    host.stop().await;

    assert_eq!(
        e.rows(ACCOUNTS).await,
        strs(&["73|380", "74|9"]),
        "{example}"
    );
    assert_eq!(
        e.db.receipt_ids(&name).await,
        strs(&["evt_1", "evt_2", "evt_3"]),
        "{example}: evt_bad must leave no receipt"
    );
    let dead = e.db.dead_letters(&name).await;
    assert_eq!(dead.len(), 1, "{example}: {dead:?}");
    assert_eq!(dead[0].0.as_deref(), Some("evt_bad"), "{example}");
    assert!(
        dead[0].1.starts_with("rejected: not a credit event"),
        "{example}: {}",
        dead[0].1
    );
}

async fn rust(backend: Backend) {
    credit_in("credit", None, backend).await
}
on_both_databases!(rust, rust);

async fn c(backend: Backend) {
    credit_in("credit-c", None, backend).await
}
on_both_databases!(c, c);

async fn js_quickjs(backend: Backend) {
    credit_in("credit-js", Some("credit-js-quickjs"), backend).await
}
on_both_databases!(js_quickjs, js_quickjs);

async fn js_starlingmonkey(backend: Backend) {
    credit_in("credit-js", Some("credit-js-starlingmonkey"), backend).await
}
on_both_databases!(js_starlingmonkey, js_starlingmonkey);

async fn python(backend: Backend) {
    credit_in("credit-python", None, backend).await
}
on_both_databases!(python, python);
