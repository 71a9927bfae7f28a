//! idem on a 3-node JetStream cluster (every node `sync_interval: always`),
//! against the real binary and PostgreSQL.
//!
//! The chaos run: three hosts on one durable consumer of an R3 stream idem
//! creates (`stream_replicas = 3`), `[broker] url` listing all three
//! servers, 20,000 credit events and 10 % re-published copies. Driven by the
//! receipts committed so far, the test steps the stream's leader down
//! (`$JS.API.STREAM.LEADER.STEPDOWN`), then the consumer's
//! (`$JS.API.CONSUMER.LEADER.STEPDOWN`), SIGKILLs the node that leads the
//! stream and later starts it again, then a follower node likewise,
//! terminates every host's PostgreSQL backend, and SIGKILLs a host; two
//! hosts abort themselves right after a commit and before its ack
//! (`abort-after-commit`) and every host skips 5 % of its acks
//! (`drop-ack`), and the test starts a host again whenever one is gone.
//! Every balance and receipt is exact (0 lost, 0 doubled), the one message
//! without an id is dead-lettered, no host took an election for a deleted
//! consumer, and the longest time without a new receipt after each fault is
//! printed with the hosts' counters.
//!
//! The regression test for a `409 Leadership Change` (nats.go #2063: a
//! client waited for ever): a pull held by a consumer leader that steps
//! down is ended by the server and the pull stream asks the new leader at
//! once, before its heartbeat would have found the request lost.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::broker::liveness::Liveness;
use idem::broker::{PullError, PullSettings, PullStream};
use idem::metrics::StatsSnapshot;
use idem_test_support::NatsCluster;
use idem_tests::chaos::{HostProcess, Probe, Workload, add_stats, publish_all};
use idem_tests::*;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EVENTS: usize = 20_000;
const STREAM: &str = "ACCOUNTS";
const CONSUMER: &str = "credit";

fn host_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_idem-test-host"))
}

/// The server name (`n1` …) leading `stream`, or its `consumer`.
async fn leader(
    js: &async_nats::jetstream::Context,
    stream: &str,
    consumer: Option<&str>,
) -> Option<String> {
    let mut stream = js.get_stream(stream).await.ok()?;
    if let Some(consumer) = consumer {
        let mut c: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer(consumer).await.ok()?;
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

/// The receipt count, read every 50 ms on one connection by a task of its
/// own (a read that fails, a terminated backend, is skipped), each reading
/// kept with its time.
struct Progress {
    samples: Arc<Mutex<Vec<(Instant, i64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Progress {
    fn start(db: &TestDb) -> Self {
        let samples = Arc::new(Mutex::new(vec![(Instant::now(), 0)]));
        let url = db.url.clone();
        let kept = samples.clone();
        let task = tokio::spawn(async move {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_lazy(&url)
                .unwrap();
            loop {
                let n: Result<i64, _> =
                    sqlx::query_scalar("SELECT count(*) FROM idem_receipts WHERE consumer = $1")
                        .bind(CONSUMER)
                        .fetch_one(&pool)
                        .await;
                if let Ok(n) = n {
                    kept.lock().unwrap().push((Instant::now(), n));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        Progress { samples, task }
    }

    fn latest(&self) -> usize {
        let n = self.samples.lock().unwrap().last().map_or(0, |s| s.1);
        usize::try_from(n).unwrap_or(0)
    }

    /// The longest time from `from` (or a new receipt after it) to the next
    /// new receipt, up to `until`.
    fn longest_stall(&self, from: Instant, until: Instant) -> Duration {
        let samples = self.samples.lock().unwrap();
        let mut last = samples
            .iter()
            .take_while(|(t, _)| *t <= from)
            .last()
            .map_or(0, |s| s.1);
        let (mut since, mut longest) = (from, Duration::ZERO);
        for (t, n) in samples.iter().filter(|(t, _)| *t > from && *t <= until) {
            if *n > last {
                longest = longest.max(t.duration_since(since));
                (since, last) = (*t, *n);
            }
        }
        let tail_end = samples.last().map_or(until, |(t, _)| (*t).min(until));
        longest.max(tail_end.saturating_duration_since(since))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The hosts, started again when one is gone: a host that aborted at its
/// fault point, or one the test killed.
struct Hosts {
    procs: Vec<HostProcess>,
    cfg: PathBuf,
    dir: PathBuf,
    started: usize,
    /// Hosts that aborted right after a commit, before its ack.
    aborted: usize,
    /// The counters of every host gone (SIGKILL: its last stats line).
    gone: StatsSnapshot,
    /// The logs of every host gone.
    logs: String,
}

/// What every host does wrong: skip 5 % of its acks after commit.
const DROP_ACKS: &str = "drop-ack:5";

impl Hosts {
    fn spawn(&mut self, fault: &str) -> HostProcess {
        self.started += 1;
        HostProcess::spawn(
            host_bin(),
            &self.cfg,
            fault,
            &self.dir,
            &format!("h{}", self.started),
        )
    }

    /// Starts again every host that exited; each must have aborted at its
    /// fault point.
    fn keep_up(&mut self) {
        for i in 0..self.procs.len() {
            if self.procs[i].exited().is_none() {
                continue;
            }
            let ended = self.procs[i].sigkill();
            let log = std::fs::read_to_string(&self.procs[i].log).unwrap_or_default();
            assert!(
                log.contains("fault point abort-after-commit"),
                "a host exited by itself; its log:\n{log}"
            );
            self.aborted += 1;
            self.gone = add_stats(self.gone, ended.stats.unwrap_or_default());
            self.logs.push_str(&log);
            self.procs[i] = self.spawn(DROP_ACKS);
        }
    }

    /// SIGKILLs host `i` and starts another in its place.
    fn kill(&mut self, i: usize) {
        let ended = self.procs[i].sigkill();
        self.gone = add_stats(self.gone, ended.stats.unwrap_or_default());
        self.logs
            .push_str(&std::fs::read_to_string(&self.procs[i].log).unwrap_or_default());
        self.procs[i] = self.spawn(DROP_ACKS);
    }
}

/// Waits until `at` receipts are committed (the deadline panics), keeping
/// the hosts up; the count.
async fn until_receipts(
    progress: &Progress,
    hosts: &mut Hosts,
    at: usize,
    deadline: Instant,
    what: &str,
) -> usize {
    loop {
        hosts.keep_up();
        let n = progress.latest();
        if n >= at {
            return n;
        }
        assert!(Instant::now() < deadline, "{what}: {n} receipts of {at}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Measures, from now, how long until the stream, and its consumer, have a
/// leader other than the server `gone` (asked every 100 ms, each request
/// bounded by 1 s while the cluster elects; 60 s at most).
fn elected_without(
    js: &async_nats::jetstream::Context,
    gone: String,
) -> tokio::task::JoinHandle<(Duration, Duration)> {
    let js = js.clone();
    tokio::spawn(async move {
        let from = Instant::now();
        let mut found = [None, None];
        while found.iter().any(Option::is_none) && from.elapsed() < Duration::from_secs(60) {
            for (i, consumer) in [None, Some(CONSUMER)].into_iter().enumerate() {
                if found[i].is_some() {
                    continue;
                }
                let asked =
                    tokio::time::timeout(Duration::from_secs(1), leader(&js, STREAM, consumer));
                if let Ok(Some(name)) = asked.await
                    && name != gone
                {
                    found[i] = Some(from.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let [s, c] = found.map(|f| f.expect("no leader elected within 60 s"));
        (s, c)
    })
}

/// The node that leads neither the stream nor its consumer.
async fn follower(js: &async_nats::jetstream::Context, cluster: &NatsCluster) -> usize {
    let stream = leader(js, STREAM, None).await;
    let consumer = leader(js, STREAM, Some(CONSUMER)).await;
    (0..3)
        .find(|i| {
            let name = format!("n{}", i + 1);
            Some(&name) != stream.as_ref() && Some(&name) != consumer.as_ref()
        })
        .map(|i| cluster.index_of(&format!("n{}", i + 1)).unwrap())
        .expect("three nodes, at most two leaders")
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
    let mut hosts = Hosts {
        procs: Vec::new(),
        cfg,
        dir: dir.path().to_path_buf(),
        started: 0,
        aborted: 0,
        gone: StatsSnapshot::default(),
        logs: String::new(),
    };
    // Two hosts abort right after a commit and before its ack: early
    // enough (a commit holds up to 16 messages with `batch = 16`) that each
    // surely gets there.
    for fault in ["", ",abort-after-commit:150", ",abort-after-commit:300"] {
        let host = hosts.spawn(&format!("{DROP_ACKS}{fault}"));
        hosts.procs.push(host);
    }
    let js = cluster.jetstream().await;
    let deadline = Instant::now() + Duration::from_secs(600);
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

    let workload = Workload::credit(28, EVENTS, 200, 10, 0);
    let publisher = {
        let js = js.clone();
        let messages = workload.messages.clone();
        tokio::spawn(
            async move { publish_all(&js, "accounts.credit", &messages, 64, deadline).await },
        )
    };
    let progress = Progress::start(&db);
    let probe = Probe::new(&db);
    let mut faults: Vec<(&str, Instant)> = Vec::new();
    let at = |percent: usize| EVENTS * percent / 100;

    until_receipts(&progress, &mut hosts, at(10), deadline, "stream step-down").await;
    step_down(&js, false).await;
    faults.push(("stream leader step-down", Instant::now()));

    until_receipts(
        &progress,
        &mut hosts,
        at(20),
        deadline,
        "consumer step-down",
    )
    .await;
    step_down(&js, true).await;
    faults.push(("consumer leader step-down", Instant::now()));

    until_receipts(&progress, &mut hosts, at(30), deadline, "leader node kill").await;
    let name = leader(&js, STREAM, None)
        .await
        .expect("the stream has a leader");
    let leader_node = cluster.index_of(&name).unwrap();
    cluster.kill(leader_node);
    faults.push(("SIGKILL of the stream leader's node", Instant::now()));
    let elections = elected_without(&js, name.clone());

    until_receipts(
        &progress,
        &mut hosts,
        at(40),
        deadline,
        "leader node restart",
    )
    .await;
    cluster.start_again(leader_node);
    faults.push(("restart of that node", Instant::now()));

    until_receipts(&progress, &mut hosts, at(50), deadline, "follower kill").await;
    let follower_node = follower(&js, &cluster).await;
    cluster.kill(follower_node);
    faults.push(("SIGKILL of a follower node", Instant::now()));

    until_receipts(&progress, &mut hosts, at(60), deadline, "follower restart").await;
    cluster.start_again(follower_node);
    faults.push(("restart of the follower", Instant::now()));

    until_receipts(&progress, &mut hosts, at(70), deadline, "backend kill").await;
    let terminated = probe.terminate_backends(&db).await.unwrap();
    faults.push(("termination of every database backend", Instant::now()));

    until_receipts(&progress, &mut hosts, at(80), deadline, "host kill").await;
    hosts.kill(0);
    faults.push(("SIGKILL of a host", Instant::now()));

    let resent = publisher.await.unwrap();
    until_receipts(
        &progress,
        &mut hosts,
        EVENTS,
        deadline,
        "not every event applied",
    )
    .await;
    let end = Instant::now();
    for (i, (fault, from)) in faults.iter().enumerate() {
        let until = faults.get(i + 1).map_or(end, |f| f.1);
        println!(
            "cluster: longest time without a new receipt after the {fault}: {:?}",
            progress.longest_stall(*from, until)
        );
    }
    let (stream_elected, consumer_elected) = elections.await.unwrap();
    println!(
        "cluster: after the SIGKILL of the stream leader's node, JetStream named a new stream leader in {stream_elected:?} and a consumer leader on a live node in {consumer_elected:?}"
    );
    let (balances, ids) = workload.expected();
    assert_eq!(ids.len(), EVENTS);
    assert_eq!(probe.balances().await.unwrap(), balances);
    assert_eq!(probe.receipts(CONSUMER).await.unwrap(), EVENTS as i64);
    assert!(terminated >= 3, "{terminated} backends terminated");
    assert_eq!(hosts.aborted, 2, "both hosts reached their fault point");
    // The one message without an `event_id`.
    let deadline_dl = Instant::now() + Duration::from_secs(60);
    while probe.dead_letters(CONSUMER).await.unwrap_or(0) != 1 {
        assert!(
            Instant::now() < deadline_dl,
            "the message without an id was not dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut logs = std::mem::take(&mut hosts.logs);
    let mut counted = hosts.gone;
    for (i, mut h) in std::mem::take(&mut hosts.procs).into_iter().enumerate() {
        assert!(h.exited().is_none(), "host {i} exited");
        // A host started again may still be starting (a SIGTERM before its
        // handlers consume is not a clean stop's test).
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
        logs.push_str(&std::fs::read_to_string(&h.log).unwrap_or_default());
        let ended = h.terminate(Duration::from_secs(30));
        assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
        counted = add_stats(counted, ended.stats.unwrap_or_default());
    }
    println!(
        "cluster: {EVENTS} events, 0 lost, 0 doubled; {} messages ({} copies, {resent} sent again by the publisher); {} hosts started, {} aborted after a commit, {terminated} backends terminated; hosts counted (a killed host's last stats line): processed={} duplicates={} retried={} ack_failures={}",
        workload.messages.len(),
        workload.duplicates,
        hosts.started,
        hosts.aborted,
        counted.processed,
        counted.duplicates,
        counted.retried,
        counted.ack_failures
    );
    assert!(
        !logs.contains("cannot be created again"),
        "a leader election was taken for a deleted consumer:\n{logs}"
    );
}

/// A pull held by the consumer's leader when it steps down ends with `409
/// Leadership Change`, and the pull stream asks again at once: the message
/// published after the step-down arrives, and no missed heartbeat (which
/// would have rescued a stream that waited for ever, 10 s later) comes
/// before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leadership_change_is_followed_by_a_new_pull() {
    let cluster = NatsCluster::start(3).await;
    let js = cluster.jetstream().await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "LEAD".into(),
        subjects: vec!["lead.>".into()],
        num_replicas: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let stream = js.get_stream("LEAD").await.unwrap();
    stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("c".into()),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let heartbeat = Duration::from_secs(5);
    let liveness = Arc::new(Liveness::default());
    let mut pull = PullStream::open_heard(
        &js,
        "LEAD",
        "c",
        PullSettings {
            size: 4,
            expires: Duration::from_secs(60),
            heartbeat,
            pinned: false,
        },
        liveness.clone(),
    )
    .await
    .unwrap();
    // A first message proves the request is held by the leader.
    js.publish("lead.a", "first".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let first = pull.next().await.unwrap().unwrap();
    assert_eq!(&first.payload[..], b"first");
    first.double_ack().await.unwrap();

    let subject = "$JS.API.CONSUMER.LEADER.STEPDOWN.LEAD.c";
    let before = leader(&js, "LEAD", Some("c")).await;
    let reply = js.client().request(subject, "".into()).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(v["success"], true, "{v}");
    let stepped = Instant::now();
    // A new leader, elected (the step-down's reply comes before it is).
    let elected = Instant::now() + Duration::from_secs(30);
    loop {
        let now = leader(&js, "LEAD", Some("c")).await;
        if now.is_some() && now != before {
            break;
        }
        assert!(Instant::now() < elected, "no new consumer leader");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    js.publish("lead.a", "second".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let item = tokio::time::timeout(heartbeat * 2, pull.next())
        .await
        .expect("nothing came within two heartbeats of the step-down: the pull waited on the old leader");
    match item {
        Some(Ok(m)) => assert_eq!(&m.payload[..], b"second"),
        Some(Err(PullError::MissingHeartbeat)) => {
            panic!("the request was found lost by its heartbeat, not asked again after the 409")
        }
        other => panic!("unexpected item {other:?}"),
    }
    println!(
        "cluster: the message after a consumer leader step-down arrived {:?} after it",
        stepped.elapsed()
    );
    assert!(liveness.silence() < heartbeat);
}

/// A host started while the cluster has no quorum (two of its three nodes
/// killed, so JetStream answers no API request) asks again instead of
/// exiting; once the nodes are back it makes its buckets, stream and
/// consumer and applies every message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_started_without_quorum_waits_for_it() {
    let mut cluster = NatsCluster::start(3).await;
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(CONSUMER, "credit");
    spec.extra.push_str("stream_replicas = 3\n");
    let cfg = write_config_for(dir.path(), &cluster.urls(), &db, &[spec]);
    cluster.kill(1);
    cluster.kill(2);
    let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "h1");
    // Driven by the host: the nodes come back once it has said it waits
    // for the first bucket (the first JetStream request it makes).
    until_logged(
        &mut host,
        "JetStream does not answer about KV bucket idem-deployments",
        Duration::from_secs(60),
        "the host did not wait for JetStream",
    )
    .await;
    cluster.start_again(1);
    cluster.start_again(2);

    let js = cluster.jetstream().await;
    until_logged(
        &mut host,
        "every handler is consuming",
        Duration::from_secs(120),
        "the host did not start once the cluster was back",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let workload = Workload::credit(7, 300, 20, 10, 0);
    let resent = publish_all(&js, "accounts.credit", &workload.messages, 64, deadline).await;
    let probe = Probe::new(&db);
    let (balances, ids) = workload.expected();
    while probe.receipts(CONSUMER).await.unwrap_or(0) < 300
        || probe.dead_letters(CONSUMER).await.unwrap_or(0) < 1
    {
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "{} receipts of 300; the host's log:\n{}",
            probe.receipts(CONSUMER).await.unwrap_or(0),
            std::fs::read_to_string(&host.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ids.len(), 300);
    assert_eq!(probe.balances().await.unwrap(), balances);
    assert_eq!(probe.receipts(CONSUMER).await.unwrap(), 300);
    assert_eq!(probe.dead_letters(CONSUMER).await.unwrap(), 1);
    let ended = host.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    let stats = ended.stats.unwrap();
    assert_eq!(stats.processed, 300);
    assert_eq!(stats.dead_lettered, 1);
    assert_eq!(stats.duplicates, (workload.duplicates + resent) as u64);
}

/// Waits until `host`'s log holds `text`; fails with `failure` and the log
/// if the host exits first or `within` passes.
async fn until_logged(host: &mut HostProcess, text: &str, within: Duration, failure: &str) {
    let deadline = Instant::now() + within;
    loop {
        let log = std::fs::read_to_string(&host.log).unwrap_or_default();
        if log.contains(text) {
            return;
        }
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "{failure}; its log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
