//! `idem::broker::PullStream` against a real nats-server: the pull requests
//! it keeps outstanding are counted so that it never waits for messages the
//! server already sent (the stall async-nats 0.51's own pull stream showed
//! with small pulls drained fast), and a request the server ends (408, with
//! what was left of it) is counted off and asked for again; a raised size
//! holds in progress what it buffers beyond the usual one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use async_nats::jetstream::{self, consumer::pull};
use idem::broker::{KeepAlive, PullError, PullSettings, PullStream, Raise, SharedPin};
use idem_tests::*;
use std::sync::Arc;
use std::time::Duration;

/// A stream `PULL` on `pull.>` with `n` messages `0..n`, and a durable
/// explicit-ack consumer `c` on it.
async fn stream_with(nats: &Nats, n: usize) -> jetstream::Context {
    stream_with_consumer(nats, n, pull::Config::default()).await
}

/// [`stream_with`], the consumer made from `config` (its name and ack
/// policy set here).
async fn stream_with_consumer(nats: &Nats, n: usize, config: pull::Config) -> jetstream::Context {
    create_stream(nats, "PULL", &["pull.>"]).await;
    let js = nats.jetstream().await;
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let mut acks = Vec::with_capacity(chunk.len());
        for i in chunk {
            acks.push(
                js.publish("pull.m".to_string(), i.to_string().into())
                    .await
                    .unwrap(),
            );
        }
        for ack in acks {
            ack.await.unwrap();
        }
    }
    js.get_stream("PULL")
        .await
        .unwrap()
        .create_consumer(pull::Config {
            durable_name: Some("c".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..config
        })
        .await
        .unwrap();
    js
}

/// Pull requests of `batch` messages, held `expires` by the server, with
/// a heartbeat every `heartbeat`.
fn settings(batch: usize, expires: Duration, heartbeat: Duration) -> PullSettings {
    PullSettings {
        size: batch,
        expires,
        heartbeat,
        pinned: false,
    }
}

/// The next item, failing the test if none comes within `within` (a
/// stream that went silent, not a timing measurement).
async fn next_item(s: &mut PullStream, within: Duration) -> Result<jetstream::Message, PullError> {
    tokio::time::timeout(within, s.next())
        .await
        .expect("no item from the pull stream")
        .expect("the pull stream ended")
}

/// Payloads of `msgs`, as numbers.
fn payloads(msgs: &[jetstream::Message]) -> Vec<usize> {
    msgs.iter()
        .map(|m| std::str::from_utf8(&m.payload).unwrap().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn a_small_pull_drained_in_batches_receives_everything_without_stalling() {
    const N: usize = 3000;
    let nats = Nats::start();
    let js = stream_with(&nats, N).await;
    let settings = settings(2, Duration::from_secs(30), Duration::from_secs(5));
    let mut s = PullStream::open(&js, "PULL", "c", settings).await.unwrap();
    let mut got = Vec::with_capacity(N);
    while got.len() < N {
        // Like a batch filling: one message waited for, then what is here.
        let mut batch = vec![next_item(&mut s, Duration::from_secs(60)).await.unwrap()];
        while batch.len() < 16 {
            match s.try_next() {
                Some(item) => batch.push(item.unwrap()),
                None => break,
            }
        }
        for m in &batch {
            m.ack().await.unwrap();
        }
        got.extend(payloads(&batch));
    }
    assert_eq!(got, (0..N).collect::<Vec<_>>());
    // Nothing more was delivered than the stream holds.
    assert!(s.try_next().is_none());
    let left = s.close();
    assert_eq!(left.len(), 0);
}

#[tokio::test]
async fn an_expired_request_is_counted_off_and_asked_for_again() {
    let nats = Nats::start();
    let js = stream_with(&nats, 3).await;
    let settings = settings(10, Duration::from_secs(1), Duration::from_millis(300));
    let mut s = PullStream::open(&js, "PULL", "c", settings).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(next_item(&mut s, Duration::from_secs(10)).await.unwrap());
    }
    assert_eq!(payloads(&got), vec![0, 1, 2]);
    // The request (10, of which 3 came) expires on the server after 1 s
    // with 7 left; a stream that kept counting those 7 as still to come
    // would ask for nothing more and go silent (a missed-heartbeat item).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for i in 3..8 {
        js.publish("pull.m".to_string(), i.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let mut more = Vec::new();
    for _ in 0..5 {
        more.push(next_item(&mut s, Duration::from_secs(10)).await.unwrap());
    }
    assert_eq!(payloads(&more), vec![3, 4, 5, 6, 7]);
    assert!(s.try_next().is_none());
}

#[tokio::test]
async fn messages_delivered_but_not_taken_are_handed_back_at_close() {
    let nats = Nats::start();
    let js = stream_with(&nats, 5).await;
    let settings = settings(4, Duration::from_secs(30), Duration::from_secs(5));
    let mut s = PullStream::open(&js, "PULL", "c", settings).await.unwrap();
    let first = next_item(&mut s, Duration::from_secs(10)).await.unwrap();
    assert_eq!(payloads(&[first]), vec![0]);
    // The first request's other three arrive; with 3 buffered (more than
    // half of 4) no second request goes out.
    let mut consumer = js
        .get_stream("PULL")
        .await
        .unwrap()
        .get_consumer::<pull::Config>("c")
        .await
        .unwrap();
    for _ in 0..200 {
        if s.buffered() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.buffered(), 3);
    let info = consumer.info().await.unwrap();
    assert_eq!(info.delivered.stream_sequence, 4);
    let left = s.close();
    assert_eq!(payloads(&left), vec![1, 2, 3]);
}

#[tokio::test]
async fn a_request_the_server_drops_is_found_by_its_silence_and_asked_again() {
    let nats = Nats::start();
    let js = stream_with_consumer(
        &nats,
        0,
        pull::Config {
            max_waiting: 1,
            ..Default::default()
        },
    )
    .await;
    let settings = settings(2, Duration::from_secs(1), Duration::from_millis(300));
    // A's request takes the one waiting slot; B's is refused while it is
    // there.
    let a = PullStream::open(&js, "PULL", "c", settings).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut b = PullStream::open(&js, "PULL", "c", settings).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(a);
    // A's last request expires on the server within 1 s; B, asking again,
    // then holds the slot and receives.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..3 {
        js.publish("pull.m".to_string(), i.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 3 {
        match next_item(&mut b, Duration::from_secs(10)).await {
            Ok(m) => got.push(m),
            // nats-server 2.15 answers a request over `max_waiting`
            // with nothing at all: B finds it lost by the silence (two
            // heartbeat intervals) and asks again, going on.
            Err(e) => assert!(matches!(e, PullError::MissingHeartbeat), "{e}"),
        }
    }
    assert_eq!(payloads(&got), vec![0, 1, 2]);
}

#[tokio::test]
async fn a_request_after_a_long_pause_is_not_taken_for_lost() {
    let nats = Nats::start();
    let js = stream_with(&nats, 2).await;
    let settings = settings(2, Duration::from_secs(30), Duration::from_millis(300));
    let mut s = PullStream::open(&js, "PULL", "c", settings).await.unwrap();
    for _ in 0..200 {
        if s.buffered() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.buffered(), 2);
    // Both messages buffered and nothing asked for: no request is out for
    // longer than the silence that would mean one was lost.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let first = next_item(&mut s, Duration::from_secs(10)).await.unwrap();
    let second = next_item(&mut s, Duration::from_secs(10)).await.unwrap();
    assert_eq!(payloads(&[first, second]), vec![0, 1]);
    // The request sent after the pause is held by the server with its
    // heartbeats: no item at all (a missed-heartbeat item would be one).
    let next = tokio::time::timeout(Duration::from_millis(1500), s.next()).await;
    assert!(
        next.is_err(),
        "unexpected item: {:?}",
        next.map(|i| i.map(|r| r.map(|_| ())))
    );
}

/// A consumer with a pinned-client priority group (a partition's): the
/// stream that gets the pin names it in its later requests, keeps it when
/// it is opened again (a reconnect, a pause), and a stream without the pin
/// waits as a standby while the pinned one is served. Without the kept
/// pin the stream opened again would be a standby too, and nothing would
/// come until `priority_timeout` (60 s here) let the old pin lapse.
#[tokio::test]
async fn a_pull_stream_opened_again_keeps_its_pin() {
    let nats = Nats::start();
    let js = stream_with_consumer(
        &nats,
        2,
        pull::Config {
            priority_policy: jetstream::consumer::PriorityPolicy::PinnedClient,
            priority_groups: vec!["idem".into()],
            priority_timeout: Duration::from_secs(60),
            ..Default::default()
        },
    )
    .await;
    let pinned = PullSettings {
        pinned: true,
        ..settings(1, Duration::from_secs(10), Duration::from_secs(2))
    };
    let liveness = std::sync::Arc::new(idem::broker::liveness::Liveness::default());
    let pin = SharedPin::default();
    let mut first = open_pinned(&js, pinned, liveness.clone(), pin.clone()).await;
    let m = next_item(&mut first, Duration::from_secs(5)).await.unwrap();
    m.ack().await.unwrap();
    let given = pin.lock().unwrap().clone();
    assert!(given.is_some(), "the first message carried no pin");
    assert_eq!(
        m.headers
            .as_ref()
            .and_then(|h| h.get("Nats-Pin-Id"))
            .map(|v| v.to_string()),
        given
    );
    drop(first);
    let mut again = open_pinned(&js, pinned, liveness.clone(), pin.clone()).await;
    let mut standby = open_pinned(&js, pinned, liveness, SharedPin::default()).await;
    let m = next_item(&mut again, Duration::from_secs(5)).await.unwrap();
    assert_eq!(payloads(std::slice::from_ref(&m)), vec![1]);
    m.ack().await.unwrap();
    js.publish("pull.m".to_string(), "2".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let m = next_item(&mut again, Duration::from_secs(5)).await.unwrap();
    assert_eq!(payloads(std::slice::from_ref(&m)), vec![2]);
    m.ack().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(2), standby.next())
            .await
            .is_err(),
        "the standby was served while another stream held the pin"
    );
    assert_eq!(*pin.lock().unwrap(), given);
}

/// A pull stream on consumer `c` of `PULL` with `settings` (pinned), its
/// pin kept in `pin`.
async fn open_pinned(
    js: &jetstream::Context,
    settings: PullSettings,
    liveness: Arc<idem::broker::liveness::Liveness>,
    pin: SharedPin,
) -> PullStream {
    PullStream::open_raised(js, "PULL", "c", settings, liveness, pin, None)
        .await
        .unwrap()
}

/// Waits until `s` holds `n` messages not yet taken (failing the test
/// after 10 s).
async fn until_buffered(s: &PullStream, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.buffered() != n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} buffered, not {n}",
            s.buffered()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn what_a_raised_size_buffers_is_held_in_progress_and_the_rest_is_not() {
    let ack_wait = Duration::from_secs(1);
    let nats = Nats::start();
    let js = stream_with_consumer(
        &nats,
        20,
        pull::Config {
            ack_wait,
            ..Default::default()
        },
    )
    .await;
    let raise = Arc::new(Raise::new(KeepAlive::new(ack_wait)));
    let long = settings(4, Duration::from_secs(30), Duration::from_secs(5));
    let mut s = PullStream::open_raised(
        &js,
        "PULL",
        "c",
        long,
        Arc::default(),
        SharedPin::default(),
        Some(raise.clone()),
    )
    .await
    .unwrap();
    // The usual request: 4 messages, none held.
    until_buffered(&s, 4).await;
    raise.set(Some(16));
    let first = next_item(&mut s, Duration::from_secs(5)).await.unwrap();
    first.ack().await.unwrap();
    // Taking one lets the task ask again, for 16: all of them held.
    until_buffered(&s, 19).await;
    raise.set(None);
    // Past ack_wait three times over, nothing taken.
    tokio::time::sleep(ack_wait * 3).await;
    // Another client's request gets what the server redelivers: the three
    // of the usual request, not the sixteen held.
    let other_settings = settings(20, Duration::from_secs(30), Duration::from_secs(5));
    let mut other = PullStream::open(&js, "PULL", "c", other_settings)
        .await
        .unwrap();
    let mut redelivered = Vec::new();
    for _ in 0..3 {
        redelivered.push(
            next_item(&mut other, Duration::from_secs(10))
                .await
                .unwrap(),
        );
    }
    assert_eq!(payloads(&redelivered), vec![1, 2, 3]);
    for m in &redelivered {
        assert_eq!(m.info().unwrap().delivered, 2);
        m.ack().await.unwrap();
    }
    // Nothing else comes while the sixteen are held (two ack_waits).
    let more = tokio::time::timeout(ack_wait * 2, other.next()).await;
    if let Ok(Some(Ok(m))) = &more {
        panic!(
            "a held message was redelivered: {:?}",
            payloads(std::slice::from_ref(m))
        );
    }
    assert!(more.is_err(), "{more:?}");
    let left = s.close();
    assert_eq!(payloads(&left), (1..20).collect::<Vec<_>>());
}
