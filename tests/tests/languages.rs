//! The credit handler in every language idem ships an example for
//! runs the same redelivery test, on PostgreSQL and SQLite:
//!
//! 1. a real host process commits the first event and aborts before its ack
//!    (`IDEM_FAULT=abort-after-commit:1`): exactly that credit is in the
//!    table, with its receipt;
//! 2. a fresh host receives the redelivery after `ack_wait`: a duplicate,
//!    nothing changes;
//! 3. the same event published again (a second delivery of one event under
//!    a new stream sequence) is a duplicate too; two new events are credited
//!    and three that are not credit events are rejected by the handler's own
//!    validation and dead-lettered at once (a string id, and two the host's
//!    JSON identity rule lets through: `-0`, which serde_json reads as a
//!    float, and a fractional amount);
//! 4. the final rows are exact: balances, receipt ids, the dead letters.
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
    let rejected = ["evt_bad", "evt_neg0", "evt_float"];
    e.publish(&json!({"event_id": rejected[0], "account_id": "73", "amount": 1}))
        .await;
    // `json!` would write -0 as 0: the payload is written out.
    publish(
        &e.js,
        &e.handler.subjects[0],
        r#"{"event_id": "evt_neg0", "account_id": -0, "amount": 1}"#,
        &[],
    )
    .await;
    e.publish(&json!({"event_id": rejected[2], "account_id": 74, "amount": 1.5}))
        .await;
    let s = host
        .wait_for(&name, "six messages", |s| {
            s.processed + s.duplicates + s.dead_lettered >= 6
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
        (6, 2, 1, 3, 0, 0),
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
        "{example}: a rejected event leaves no receipt"
    );
    let dead = e.db.dead_letters(&name).await;
    let ids: Vec<&str> = dead.iter().filter_map(|(id, _)| id.as_deref()).collect();
    assert_eq!(ids, rejected, "{example}: {dead:?}");
    for (id, reason) in &dead {
        assert!(
            reason.starts_with("rejected: not a credit event"),
            "{example}: {id:?}: {reason}"
        );
    }
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
