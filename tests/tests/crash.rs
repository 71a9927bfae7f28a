//! The host is killed after COMMIT and before the ack (a real process abort
//! at a test-only fault point): the redelivery finds the receipt, changes
//! nothing and is acked (seed 000's opening scenario).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use std::time::{Duration, Instant};

async fn crash_after_commit_then_redelivery_is_duplicate(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit-projector", "credit");
    h.extra = "ack_wait = \"2s\"\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
        .args(["run", "--config"])
        .arg(&cfg)
        .env("IDEM_FAULT", "abort-after-commit:1")
        .env("RUST_LOG", "warn")
        .spawn()
        .unwrap();
    let js = nats.jetstream().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while js.get_stream("ACCOUNTS").await.is_err() {
        assert!(Instant::now() < deadline, "host did not create the stream");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    publish(&js, "accounts.credit", &credit("evt_8142", 73, 500), &[]).await;

    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "host did not reach the fault point"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(6),
        "expected SIGABRT at the fault point, got {status}"
    );
    // Committed, not acked.
    assert_eq!(db.balance(73).await, Some(500));
    assert_eq!(db.receipts("credit-projector").await, 1);

    // A fresh host gets the redelivery after ack_wait: a duplicate, nothing changes.
    let host = RunningHost::start(&cfg).await;
    let s = host
        .wait_for("credit-projector", "redelivered duplicate", |s| {
            s.duplicates == 1
        })
        .await;
    assert_eq!((s.delivered, s.processed, s.duplicates), (1, 0, 1));
    assert_eq!(db.balance(73).await, Some(500));
    assert_eq!(db.receipts("credit-projector").await, 1);
    host.stop().await;
}
on_both_databases!(
    crash_after_commit_then_redelivery_is_duplicate,
    crash_after_commit_then_redelivery_is_duplicate
);
