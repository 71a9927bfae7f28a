//! Config changes reach the broker at start: the durable consumer always
//! matches the config (every setting idem sets), and a subject the stream
//! does not capture is added to a stream idem created, or stops the start
//! with one line on any other. Real nats-server, SQLite.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use async_nats::jetstream::consumer::{self, AckPolicy};
use idem_tests::*;
use std::time::Duration;

fn spec(subjects: &[&str]) -> HandlerSpec {
    let mut h = HandlerSpec::new("credit", "credit");
    h.stream = "A".into();
    h.subjects = subjects.iter().map(|s| s.to_string()).collect();
    h
}

async fn consumer_config(nats: &Nats) -> consumer::Config {
    let js = nats.jetstream().await;
    let mut c: consumer::PullConsumer = js
        .get_stream("A")
        .await
        .unwrap()
        .get_consumer("credit")
        .await
        .unwrap();
    c.info().await.unwrap().config.clone()
}

fn filters(c: &consumer::Config) -> Vec<String> {
    let mut f = c.filter_subjects.clone();
    if !c.filter_subject.is_empty() {
        f.push(c.filter_subject.clone());
    }
    f.sort();
    f
}

/// Narrowing `subjects` narrows the consumer's filter, with nothing else
/// changed: a message on the dropped subject is not credited.
#[tokio::test]
async fn narrowed_subjects_narrow_the_consumer() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let js = nats.jetstream().await;
    let cfg = write_config(dir.path(), &nats, &db, &[spec(&["a.credit", "a.debit"])]);
    let host = RunningHost::start(&cfg).await;
    publish(&js, "a.debit", &credit("d1", 1, 5), &[]).await;
    host.wait_for("credit", "d1", |s| s.processed == 1).await;
    host.stop().await;

    let cfg = write_config(dir.path(), &nats, &db, &[spec(&["a.credit"])]);
    let host = RunningHost::start(&cfg).await;
    assert_eq!(filters(&consumer_config(&nats).await), vec!["a.credit"]);
    publish(&js, "a.debit", &credit("d2", 1, 100), &[]).await;
    publish(&js, "a.credit", &credit("c1", 1, 10), &[]).await;
    let s = host.wait_for("credit", "c1", |s| s.processed == 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let s2 = host.stats("credit");
    assert_eq!((s.delivered, s2.delivered, s2.processed), (1, 1, 1), "{s2}");
    assert_eq!(db.balance(1).await, Some(15));
    host.stop().await;
}

/// A subject added to the config that the stream (idem created it) does not
/// capture is added to the stream, and its messages are stored and credited.
#[tokio::test]
async fn an_added_subject_is_added_to_an_idem_stream() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let js = nats.jetstream().await;
    let cfg = write_config(dir.path(), &nats, &db, &[spec(&["a.credit"])]);
    RunningHost::start(&cfg).await.stop().await;

    let cfg = write_config(dir.path(), &nats, &db, &[spec(&["a.credit", "b.credit"])]);
    let host = RunningHost::start(&cfg).await;
    let mut subjects = js
        .get_stream("A")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .subjects
        .clone();
    subjects.sort();
    assert_eq!(subjects, vec!["a.credit", "b.credit"]);
    assert_eq!(
        filters(&consumer_config(&nats).await),
        vec!["a.credit", "b.credit"]
    );
    publish(&js, "b.credit", &credit("b1", 2, 7), &[]).await;
    host.wait_for("credit", "b1", |s| s.processed == 1).await;
    assert_eq!(db.balance(2).await, Some(7));
    host.stop().await;
}

/// A stream someone else made that does not capture a handler subject stops
/// the start with one line, and the stream is left as it was.
#[tokio::test]
async fn a_subject_a_foreign_stream_does_not_capture_stops_the_start() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    create_stream(&nats, "A", &["a.credit"]).await;
    let cfg = write_config(dir.path(), &nats, &db, &[spec(&["a.credit", "b.credit"])]);
    let config = idem::config::Config::load(&cfg).unwrap();
    let err = match idem::service::Host::start(&config).await {
        Ok(_) => panic!("the host started"),
        Err(e) => format!("{e:#}"),
    };
    assert_eq!(
        err,
        "handler `credit`: stream `A` captures [\"a.credit\"], not [\"b.credit\"], and idem did not create it; add the subjects to the stream (nats stream edit A --subjects ...) or change the handler's subjects"
    );
    let js = nats.jetstream().await;
    let info = js
        .get_stream("A")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .config
        .clone();
    assert_eq!(info.subjects, vec!["a.credit"]);
}

/// A consumer made by hand with other settings is brought in line with every
/// setting idem sets.
#[tokio::test]
async fn a_consumer_made_by_hand_is_brought_in_line() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    create_stream(&nats, "A", &["a.*"]).await;
    let js = nats.jetstream().await;
    js.get_stream("A")
        .await
        .unwrap()
        .create_consumer(consumer::pull::Config {
            durable_name: Some("credit".into()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(5),
            max_deliver: 3,
            max_ack_pending: 20,
            filter_subject: "a.other".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut h = spec(&["a.credit", "a.debit"]);
    h.extra.push_str("ack_wait = \"45s\"\n");
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    let host = RunningHost::start(&cfg).await;
    let c = consumer_config(&nats).await;
    assert_eq!(
        (
            c.ack_policy,
            c.ack_wait,
            c.max_deliver,
            c.max_ack_pending,
            filters(&c)
        ),
        (
            AckPolicy::Explicit,
            Duration::from_secs(45),
            -1,
            1000,
            vec!["a.credit".to_string(), "a.debit".to_string()]
        )
    );
    publish(&js, "a.debit", &credit("d1", 3, 4), &[]).await;
    host.wait_for("credit", "d1", |s| s.processed == 1).await;
    assert_eq!(db.balance(3).await, Some(4));
    host.stop().await;
}

/// `start` places a new consumer: `new` skips what the stream holds, `seq:N`
/// starts at sequence N; an existing consumer keeps its place when `start`
/// changes.
#[tokio::test]
async fn start_places_a_new_consumer_only() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    create_stream(&nats, "A", &["a.credit"]).await;
    let js = nats.jetstream().await;
    for (i, amount) in [1, 10, 100].iter().enumerate() {
        publish(&js, "a.credit", &credit(&format!("p{i}"), 1, *amount), &[]).await;
    }
    let mut fresh = spec(&["a.credit"]);
    fresh.name = "fresh".into();
    fresh.extra.push_str("start = \"new\"\n");
    let mut from_two = spec(&["a.credit"]);
    from_two.name = "from-two".into();
    from_two.extra.push_str("start = \"seq:2\"\n");
    from_two.tables = vec!["accounts".into()];
    let cfg = write_config(dir.path(), &nats, &db, &[fresh, from_two]);
    let host = RunningHost::start(&cfg).await;
    host.wait_for("from-two", "seq 2 and 3", |s| s.processed == 2)
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(host.stats("fresh").delivered, 0);
    publish(&js, "a.credit", &credit("p3", 2, 1000), &[]).await;
    host.wait_for("fresh", "p3", |s| s.processed == 1).await;
    host.wait_for("from-two", "p3", |s| s.processed == 3).await;
    assert_eq!(db.balance(1).await, Some(110));
    assert_eq!(db.balance(2).await, Some(2000));
    host.stop().await;
    // `start` changed for an existing consumer: it goes on where it was.
    let mut fresh = spec(&["a.credit"]);
    fresh.name = "fresh".into();
    fresh.extra.push_str("start = \"all\"\n");
    let cfg = write_config(dir.path(), &nats, &db, &[fresh]);
    let host = RunningHost::start(&cfg).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(host.stats("fresh").delivered, 0);
    let c = js
        .get_stream("A")
        .await
        .unwrap()
        .consumer_info("fresh")
        .await
        .unwrap();
    assert_eq!(c.config.deliver_policy, consumer::DeliverPolicy::New);
    host.stop().await;
}

/// `idem run --drain` on `config`; (exit code, stderr).
fn drain(config: &std::path::Path) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
        .args(["run", "--drain", "--config", config.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A renamed handler (a new consumer) about to replay stored messages into
/// tables that already have rows is named at start, once; with
/// `start = "new"` nothing is replayed and nothing said.
#[tokio::test]
async fn a_new_consumer_replaying_into_filled_tables_is_named() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let js = nats.jetstream().await;
    let cfg = write_config(dir.path(), &nats, &db, &[spec(&["a.credit"])]);
    let host = RunningHost::start(&cfg).await;
    publish(&js, "a.credit", &credit("r1", 1, 5), &[]).await;
    publish(&js, "a.credit", &credit("r2", 1, 5), &[]).await;
    host.wait_for("credit", "both", |s| s.processed == 2).await;
    host.stop().await;

    let mut quiet = spec(&["a.credit"]);
    quiet.name = "renamed-new".into();
    quiet.extra.push_str("start = \"new\"\n");
    let cfg = write_config(dir.path(), &nats, &db, &[quiet]);
    let (code, err) = drain(&cfg);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("about to process"), "{err}");
    assert_eq!(db.balance(1).await, Some(10));

    let mut renamed = spec(&["a.credit"]);
    renamed.name = "renamed".into();
    let cfg = write_config(dir.path(), &nats, &db, &[renamed]);
    let (code, err) = drain(&cfg);
    assert_eq!(code, 0, "{err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("about to process"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains(
            "new durable consumer `renamed` is about to process 2 messages already in stream `A` into tables that already have rows (accounts)"
        ),
        "{err}"
    );
    // What the warning is about: the replay applied both again.
    assert_eq!(db.balance(1).await, Some(20));
}
