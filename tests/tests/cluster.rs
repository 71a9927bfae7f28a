//! idem on a 3-node JetStream cluster (every node `sync_interval: always`),
//! against the real binary and PostgreSQL: two hosts on one durable
//! consumer of an R3 stream idem creates (`stream_replicas = 3`), `[broker]
//! url` listing all three servers. While credit events and re-published
//! copies go in, the test, driven by the receipts committed so far, steps
//! the stream's leader down (`$JS.API.STREAM.LEADER.STEPDOWN`), then the
//! consumer's (`$JS.API.CONSUMER.LEADER.STEPDOWN`), SIGKILLs the node that
//! leads the stream and later starts it again, and SIGKILLs a host and
//! starts it again. Every balance and receipt is exact, the one message
//! without an id is dead-lettered, no host took an election for a deleted
//! consumer, and the longest time without a new receipt after each fault
//! is printed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_test_support::NatsCluster;
use idem_tests::chaos::{HostProcess, Probe, Workload, publish_all};
use idem_tests::*;
use std::path::Path;
use std::time::{Duration, Instant};

const EVENTS: usize = 2000;
const STREAM: &str = "ACCOUNTS";
const CONSUMER: &str = "credit";

fn host_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_idem-test-host"))
}

/// The server name (`n1` …) leading the stream, or its consumer.
async fn leader(js: &async_nats::jetstream::Context, consumer: bool) -> Option<String> {
    let mut stream = js.get_stream(STREAM).await.ok()?;
    if consumer {
        let mut c: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer(CONSUMER).await.ok()?;
        c.info().await.ok()?.cluster.clone()?.leader
    } else {
        stream.info().await.ok()?.cluster.clone()?.leader
    }
}

/// Asks the leader of the stream, or of its consumer, to step down; tries
/// again (a leader may be being elected) for 30 s.
async fn step_down(js: &async_nats::jetstream::Context, consumer: bool) {
    let subject = if consumer {
        format!("$JS.API.CONSUMER.LEADER.STEPDOWN.{STREAM}.{CONSUMER}")
    } else {
        format!("$JS.API.STREAM.LEADER.STEPDOWN.{STREAM}")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(reply) = js.client().request(subject.clone(), "".into()).await
            && serde_json::from_slice::<serde_json::Value>(&reply.payload)
                .is_ok_and(|v| v["success"] == true)
        {
            return;
        }
        assert!(Instant::now() < deadline, "{subject} did not succeed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls the receipts every 20 ms until they pass `at` (the deadline
/// panics); the count.
async fn until_receipts(probe: &Probe, at: usize, deadline: Instant, what: &str) -> usize {
    loop {
        let n = usize::try_from(probe.receipts(CONSUMER).await.unwrap_or(0)).unwrap_or(0);
        if n >= at {
            return n;
        }
        assert!(Instant::now() < deadline, "{what}: {n} receipts of {at}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for the first receipt after `n`; how long it took.
async fn stall_after(probe: &Probe, n: usize, deadline: Instant) -> Duration {
    let from = Instant::now();
    until_receipts(probe, n + 1, deadline, "no progress after a fault").await;
    from.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_through_leader_changes_on_a_three_node_cluster() {
    let mut cluster = NatsCluster::start(3).await;
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(CONSUMER, "credit");
    spec.extra
        .push_str("stream_replicas = 3\nack_wait = \"5s\"\ndeadline = \"4s\"\nconcurrency = 2\n");
    let cfg = write_config_for(dir.path(), &cluster.urls(), &db, &[spec]);
    let mut hosts = vec![
        HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "h1"),
        HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "h2"),
    ];
    let js = cluster.jetstream().await;
    let deadline = Instant::now() + Duration::from_secs(300);
    // The first host makes the stream with three replicas.
    loop {
        if let Ok(mut s) = js.get_stream(STREAM).await
            && s.info().await.is_ok_and(|i| i.config.num_replicas == 3)
        {
            break;
        }
        assert!(Instant::now() < deadline, "no R3 stream");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let workload = Workload::credit(28, EVENTS, 50, 10, 0);
    let publisher = {
        let js = js.clone();
        let messages = workload.messages.clone();
        tokio::spawn(
            async move { publish_all(&js, "accounts.credit", &messages, 32, deadline).await },
        )
    };
    let probe = Probe::new(&db);
    let mut stalls = Vec::new();

    let n = until_receipts(
        &probe,
        EVENTS * 15 / 100,
        deadline,
        "before the stream step-down",
    )
    .await;
    step_down(&js, false).await;
    stalls.push((
        "stream leader step-down",
        stall_after(&probe, n, deadline).await,
    ));

    let n = until_receipts(
        &probe,
        EVENTS * 35 / 100,
        deadline,
        "before the consumer step-down",
    )
    .await;
    step_down(&js, true).await;
    stalls.push((
        "consumer leader step-down",
        stall_after(&probe, n, deadline).await,
    ));

    let n = until_receipts(
        &probe,
        EVENTS * 55 / 100,
        deadline,
        "before the leader node kill",
    )
    .await;
    let name = leader(&js, false).await.expect("the stream has a leader");
    let node = cluster.index_of(&name).unwrap();
    cluster.kill(node);
    stalls.push((
        "stream leader's node SIGKILLed",
        stall_after(&probe, n, deadline).await,
    ));

    until_receipts(
        &probe,
        EVENTS * 70 / 100,
        deadline,
        "before the node restart",
    )
    .await;
    cluster.start_again(node);

    let n = until_receipts(&probe, EVENTS * 80 / 100, deadline, "before the host kill").await;
    hosts[0].sigkill();
    let mut logs = std::fs::read_to_string(&hosts[0].log).unwrap_or_default();
    stalls.push(("kill of a host", stall_after(&probe, n, deadline).await));
    hosts[0] = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "h1-again");

    let resent = publisher.await.unwrap();
    until_receipts(&probe, EVENTS, deadline, "not every event applied").await;
    for (fault, stall) in &stalls {
        println!("cluster: wait for the next receipt after the {fault}: {stall:?}");
    }
    let (balances, ids) = workload.expected();
    assert_eq!(ids.len(), EVENTS);
    assert_eq!(probe.balances().await.unwrap(), balances);
    assert_eq!(probe.receipts(CONSUMER).await.unwrap(), EVENTS as i64);
    // The one message without an `event_id`.
    let deadline_dl = Instant::now() + Duration::from_secs(60);
    while probe.dead_letters(CONSUMER).await.unwrap_or(0) != 1 {
        assert!(
            Instant::now() < deadline_dl,
            "the message without an id was not dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "cluster: {} messages ({} copies, {resent} sent again by the publisher)",
        workload.messages.len(),
        workload.duplicates
    );
    for (i, mut h) in hosts.into_iter().enumerate() {
        assert!(h.exited().is_none(), "host {i} exited");
        // The host started again may still be starting (a SIGTERM before
        // its handlers consume is not a clean stop's test).
        let consuming = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&h.log)
            .unwrap_or_default()
            .contains("every handler is consuming")
        {
            assert!(
                h.exited().is_none() && Instant::now() < consuming,
                "host {i} did not start consuming; its log:\n{}",
                std::fs::read_to_string(&h.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let log = std::fs::read_to_string(&h.log).unwrap_or_default();
        logs.push_str(&log);
        let ended = h.terminate(Duration::from_secs(30));
        assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    }
    assert!(
        !logs.contains("cannot be created again"),
        "a leader election was taken for a deleted consumer:\n{logs}"
    );
}
