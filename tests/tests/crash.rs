//! The host is killed after COMMIT and before the ack (a real process abort
//! at a test-only fault point): the redelivery finds the receipt, changes
//! nothing and is acked (the crash-after-commit scenario). The scenario itself is
//! `idem_tests::examples::redelivery_after_crash`, which every example in
//! every language also runs (`strategies.rs`, `languages.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::examples::{Env, redelivery_after_crash};
use idem_tests::*;
use serde_json::json;

async fn crash_after_commit_then_redelivery_is_duplicate(backend: Backend) {
    let e = Env::new("credit", backend).await;
    redelivery_after_crash(
        &e,
        json!({"event_id": "evt_8142", "account_id": 73, "amount": 500}),
        "SELECT account_id, balance FROM accounts",
        &["73|500"],
    )
    .await;
    assert_eq!(e.db.balance(73).await, Some(500));
    assert_eq!(e.db.receipt_ids("credit-projector").await, ["evt_8142"]);
}
on_both_databases!(
    crash_after_commit_then_redelivery_is_duplicate,
    crash_after_commit_then_redelivery_is_duplicate
);
