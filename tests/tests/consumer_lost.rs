//! A durable consumer or stream deleted on the broker under a running host:
//! the host creates again what it owns and goes on, exactly once; when it
//! cannot, it says so and exits non-zero after
//! `idem::broker::CONSUMER_LOST_GRACE`, never looping silently.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SUBJECT: &str = "accounts.credit";

/// Waits (30 s at most) until the host has created stream ACCOUNTS, with
/// the handler's subject, and its `credit` consumer again.
async fn wait_until_created_again(js: &async_nats::jetstream::Context) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(mut s) = js.get_stream("ACCOUNTS").await
            && s.info().await.unwrap().config.subjects == vec![SUBJECT.to_string()]
            && s.consumer_info("credit").await.is_ok()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the stream was not created again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deleted consumer: created again; the credit published after applies,
/// the one applied before is delivered again and skipped by its receipt.
async fn a_deleted_consumer_is_created_again(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("credit", "credit")],
    );
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    publish(&js, SUBJECT, &credit("c1", 1, 10), &[]).await;
    host.wait_for("credit", "c1", |s| s.processed == 1).await;
    js.get_stream("ACCOUNTS")
        .await
        .unwrap()
        .delete_consumer("credit")
        .await
        .unwrap();
    publish(&js, SUBJECT, &credit("c2", 1, 5), &[]).await;
    let s = host
        .wait_for_within(
            "credit",
            "c2 after the consumer was deleted",
            Duration::from_secs(30),
            |s| s.processed == 2 && s.duplicates == 1,
        )
        .await;
    assert_eq!(
        (s.delivered, s.processed, s.duplicates, s.dead_lettered),
        (3, 2, 1, 0)
    );
    assert_eq!(db.balance(1).await, Some(15));
    assert_eq!(db.receipts("credit").await, 2);
    host.stop().await;
}
on_both_databases!(
    a_deleted_consumer_is_created_again,
    a_deleted_consumer_is_created_again
);

/// Deleted stream (and with it the consumer): created again with the
/// handler's subjects; a credit published once it is back applies once.
#[tokio::test]
async fn a_deleted_stream_is_created_again() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("credit", "credit")],
    );
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    publish(&js, SUBJECT, &credit("c1", 1, 10), &[]).await;
    host.wait_for("credit", "c1", |s| s.processed == 1).await;
    js.delete_stream("ACCOUNTS").await.unwrap();
    wait_until_created_again(&js).await;
    publish(&js, SUBJECT, &credit("c2", 1, 5), &[]).await;
    let s = host
        .wait_for_within(
            "credit",
            "c2 after the stream was created again",
            Duration::from_secs(30),
            |s| s.processed == 2,
        )
        .await;
    assert_eq!((s.processed, s.duplicates, s.dead_lettered), (2, 0, 0));
    assert_eq!(db.balance(1).await, Some(15));
    host.stop().await;
}

/// `start = "new"`: a consumer deleted while messages are still pending is
/// created again right after its last acknowledged message, not at "new"
/// (which would skip everything published before the re-creation): all 220
/// credits apply exactly once, none is dead-lettered.
async fn a_consumer_created_again_skips_nothing_whatever_its_start(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit", "credit");
    h.extra = "start = \"new\"\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    for i in 0..200 {
        publish(&js, SUBJECT, &credit(&format!("a{i}"), 2, 1), &[]).await;
    }
    js.get_stream("ACCOUNTS")
        .await
        .unwrap()
        .delete_consumer("credit")
        .await
        .unwrap();
    for i in 200..220 {
        publish(&js, SUBJECT, &credit(&format!("a{i}"), 2, 1), &[]).await;
    }
    let s = host
        .wait_for_within(
            "credit",
            "220 credits after the consumer was deleted",
            Duration::from_secs(60),
            |s| s.processed == 220,
        )
        .await;
    assert_eq!((s.processed, s.dead_lettered), (220, 0));
    assert_eq!(s.delivered, s.processed + s.duplicates);
    assert_eq!(db.balance(2).await, Some(220));
    assert_eq!(db.receipts("credit").await, 220);
    host.stop().await;
}
on_both_databases!(
    a_consumer_created_again_skips_nothing_whatever_its_start,
    a_consumer_created_again_skips_nothing_whatever_its_start
);

/// `start = "seq:3"` on a stream that is deleted and created again: the new
/// stream's sequences start over and every message in it is new, so its
/// consumer starts at the first one (not at 3, which would skip two).
#[tokio::test]
async fn a_stream_created_again_is_read_from_its_first_message() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("credit", "credit");
    h.extra = "start = \"seq:3\"\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    // Published first: a start past the stream's next message is refused.
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    let js = nats.jetstream().await;
    for i in 0..5 {
        publish(&js, SUBJECT, &credit(&format!("p{i}"), 1, 1), &[]).await;
    }
    let host = RunningHost::start(&cfg).await;
    host.wait_for("credit", "p2..p4", |s| s.processed == 3)
        .await;
    assert_eq!(db.balance(1).await, Some(3));
    js.delete_stream("ACCOUNTS").await.unwrap();
    wait_until_created_again(&js).await;
    for i in 0..5 {
        publish(&js, SUBJECT, &credit(&format!("q{i}"), 2, 1), &[]).await;
    }
    let s = host
        .wait_for_within(
            "credit",
            "q0..q4 in the stream created again",
            Duration::from_secs(30),
            |s| s.processed == 8,
        )
        .await;
    assert_eq!((s.processed, s.duplicates, s.dead_lettered), (8, 0, 0));
    assert_eq!(db.balance(2).await, Some(5));
    host.stop().await;
}

/// The stream is deleted and another stream takes its subjects, so idem
/// cannot create its own again: the host logs why, and `idem run` exits
/// non-zero with one line after the grace period.
#[tokio::test]
async fn a_consumer_that_cannot_be_created_again_stops_the_host() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("credit", "credit")],
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
        .args(["run", "--config", cfg.to_str().unwrap()])
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let js = nats.jetstream().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    // The host creates the stream, then the consumer: wait for both.
    loop {
        if let Ok(stream) = js.get_stream("ACCOUNTS").await
            && stream.consumer_info("credit").await.is_ok()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the host did not create its stream and consumer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    js.delete_stream("ACCOUNTS").await.unwrap();
    create_stream(&nats, "SQUATTER", &["accounts.>"]).await;
    let started = Instant::now();
    let grace = idem::broker::CONSUMER_LOST_GRACE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < grace + Duration::from_secs(60),
            "the host is still running {:?} after the consumer was lost",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        started.elapsed() >= grace,
        "exited after {:?}",
        started.elapsed()
    );
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("idem: handler `credit`: cannot get or create stream `ACCOUNTS`"),
        "{err}"
    );
    // Said once while trying, not once per attempt.
    let said = err
        .lines()
        .filter(|l| l.contains("cannot be created again; trying for"))
        .count();
    assert_eq!(said, 1, "{err}");
}
