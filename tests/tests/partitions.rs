//! Partitions (`partitions = 8`, `order_key = "subject:2"`): idem sets the
//! stream's subject transform, which stores `accounts.<key>` under
//! `<p>.accounts.<key>`, and one durable consumer per partition with a
//! pinned-client priority group, so that JetStream serves each partition
//! to one host at a time and gives it to another when that host stops
//! pulling (`priority_timeout`).
//!
//! Three host processes on one broker and one PostgreSQL database; 200
//! keys with 10 version-numbered updates each, published to
//! `accounts.<key>` (a key's versions ten messages apart), one update in
//! 20 retried on its first delivery, and 100 copies published after every
//! original. Once 500 updates are applied the host pinned for the most
//! partitions is stopped (SIGTERM): it gives its pins back, and another
//! host is pinned at once. A fourth host starts; at 1,200 the host pinned
//! for the most partitions is SIGKILLed (its pins lapse after the
//! `priority_timeout`) and a fifth starts. The `behave`
//! guest's `version` op rejects a version that does not follow its row's
//! and a message whose subject is not the one it was published to: no
//! dead letter means no key was ever applied out of order, across the
//! kill and the hand-over of its partitions, and the guest saw the
//! published subject, not the stored one. Every key ends at version 10
//! and the receipts are exactly the 2,000 updates.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::chaos::{HostProcess, Probe};
use idem_tests::*;
use std::path::Path;
use std::time::{Duration, Instant};

const HANDLER: &str = "versions";
const KEYS: i64 = 200;
const VERSIONS: i64 = 10;
const COPIES: i64 = 100;
const PARTITIONS: u32 = 8;
/// What a host logs when JetStream pins one of its partition pulls.
const PINNED: &str = "this host is now pinned for the consumer";

fn update(key: i64, version: i64) -> String {
    serde_json::json!({
        "op": "version",
        "event_id": format!("k{key}-v{version}"),
        "key": key,
        "version": version,
        "retry_first": (key * VERSIONS + version) % 20 == 7,
        "subject": format!("accounts.{key}"),
    })
    .to_string()
}

async fn publish_workload(js: &async_nats::jetstream::Context) {
    for block in 0..KEYS / 10 {
        for version in 1..=VERSIONS {
            for key in block * 10..block * 10 + 10 {
                publish(js, &format!("accounts.{key}"), &update(key, version), &[]).await;
            }
        }
    }
    for i in 0..COPIES {
        let (key, version) = (i * 2 % KEYS, i % VERSIONS + 1);
        publish(js, &format!("accounts.{key}"), &update(key, version), &[]).await;
    }
}

fn host_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_idem-test-host"))
}

fn log_of(host: &HostProcess) -> String {
    std::fs::read_to_string(&host.log).unwrap_or_default()
}

/// How often each host has been pinned for a partition so far.
fn pins_of(hosts: &[HostProcess]) -> Vec<usize> {
    hosts
        .iter()
        .map(|h| log_of(h).matches(PINNED).count())
        .collect()
}

/// The host pinned most often.
fn most_pinned(pins: &[usize]) -> usize {
    (0..pins.len()).max_by_key(|&i| pins[i]).unwrap_or(0)
}

/// Waits until `host` says every handler is consuming.
async fn until_consuming(host: &mut HostProcess) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !log_of(host).contains("every handler is consuming") {
        assert!(
            host.exited().is_none() && Instant::now() < deadline,
            "the host did not start; log:\n{}",
            log_of(host)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `n` updates are applied (180 s at most).
async fn until_applied(probe: &Probe, hosts: &[&HostProcess], n: i64) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let applied = probe.receipts(HANDLER).await.unwrap_or(0);
        if applied >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{applied} of {n} applied; logs:\n{}",
            hosts
                .iter()
                .map(|h| log_of(h))
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_keep_each_key_in_order_across_hosts_and_a_kill() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    spec.subjects = vec!["accounts.*".into()];
    spec.extra.push_str(&format!(
        "order_key = \"subject:2\"\npartitions = {PARTITIONS}\nconcurrency = 2\nmax_deliver = 3\nack_wait = \"3s\"\ndeadline = \"1s\"\n"
    ));
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("max_connections = 4", "max_connections = 17"),
    )
    .unwrap();
    let probe = Probe::new(&db);
    let mut hosts = Vec::new();
    for name in ["h1", "h2", "h3"] {
        let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), name);
        until_consuming(&mut host).await;
        hosts.push(host);
    }
    // The stream and one consumer per partition, as idem made them.
    let js = nats.jetstream().await;
    let mut stream = js.get_stream("ACCOUNTS").await.unwrap();
    let transform = stream
        .info()
        .await
        .unwrap()
        .config
        .subject_transform
        .clone();
    assert_eq!(
        transform.map(|t| (t.source, t.destination)),
        Some((
            "accounts.*".to_string(),
            "{{partition(8,1)}}.accounts.{{wildcard(1)}}".to_string()
        ))
    );
    for p in 0..PARTITIONS {
        let c: async_nats::jetstream::consumer::PullConsumer = stream
            .get_consumer(&format!("{HANDLER}-p{p}"))
            .await
            .unwrap();
        let config = &c.cached_info().config;
        assert_eq!(config.filter_subject, format!("{p}.accounts.*"));
        assert_eq!(config.priority_groups, vec!["idem".to_string()]);
        assert_eq!(config.priority_timeout, Duration::from_secs(18));
    }
    publish_workload(&js).await;
    // A stop (SIGTERM) of the host pinned for the most partitions: what it
    // did not run goes back in stream order and its pins are given back,
    // so the others take its partitions at once, not after the 18 s
    // priority_timeout.
    until_applied(&probe, &hosts.iter().collect::<Vec<_>>(), 500).await;
    let pins = pins_of(&hosts);
    let stopping = most_pinned(&pins);
    let stopped = hosts.remove(stopping);
    let stopped_log = stopped.log.clone();
    let ended = stopped.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    let stopped_at = Instant::now();
    let log = std::fs::read_to_string(&stopped_log).unwrap();
    assert!(
        log.contains("gave back this host's pins on its partitions"),
        "the stopped host gave back no pin ({pins:?}); log:\n{log}"
    );
    let before: usize = pins.iter().sum::<usize>() - pins[stopping];
    while pins_of(&hosts).iter().sum::<usize>() <= before {
        assert!(
            stopped_at.elapsed() < Duration::from_secs(9),
            "no other host was pinned within half the priority_timeout of the stop: the partitions waited for the pins to lapse"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "stop: pins per host {pins:?}, the stopped host held {}; another host pinned {:.2}s after it exited",
        pins[stopping],
        stopped_at.elapsed().as_secs_f64()
    );
    let mut added = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "h4");
    until_consuming(&mut added).await;
    hosts.push(added);
    // A SIGKILL of the host pinned for the most partitions now: its pins
    // lapse after the priority_timeout, and what it held comes back first.
    until_applied(&probe, &hosts.iter().collect::<Vec<_>>(), 1200).await;
    let pins = pins_of(&hosts);
    let victim = most_pinned(&pins);
    assert!(pins[victim] > 0, "no host was pinned: {pins:?}");
    let applied_at_kill = probe.receipts(HANDLER).await.unwrap();
    hosts[victim].sigkill();
    let killed_at = Instant::now();
    let killed = hosts.remove(victim);
    let mut added = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "h5");
    until_consuming(&mut added).await;
    hosts.push(added);
    until_applied(&probe, &hosts.iter().collect::<Vec<_>>(), KEYS * VERSIONS).await;
    // The killed host's partitions went to the others.
    let pinned_after: usize = pins_of(&hosts).iter().sum();
    let pinned_before: usize = pins.iter().sum::<usize>() - pins[victim];
    eprintln!(
        "kill: pins per host {pins:?}; killed the host pinned {} times with {applied_at_kill} applied; the rest applied {:.1}s after the kill; pins after: {pinned_after} (the others had {pinned_before})",
        pins[victim],
        killed_at.elapsed().as_secs_f64()
    );
    assert!(
        pinned_after > pinned_before,
        "no partition was given to another host after the kill ({pins:?} before)"
    );
    assert_eq!(
        db.dead_letters(HANDLER).await,
        vec![],
        "killed host's log:\n{}",
        log_of(&killed)
    );
    for key in 0..KEYS {
        assert_eq!(db.balance(key).await, Some(VERSIONS), "key {key}");
    }
    assert_eq!(db.receipts(HANDLER).await, KEYS * VERSIONS);
    for host in hosts {
        let ended = host.terminate(Duration::from_secs(30));
        assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    }
}

/// The one-line error a host started with `extra` on the stream `ACCOUNTS`
/// (made beforehand from `stream`) stops with.
async fn start_error(
    nats: &Nats,
    dir: &Path,
    stream: async_nats::jetstream::stream::Config,
    extra: &str,
) -> String {
    let js = nats.jetstream().await;
    let _ = js.delete_stream("ACCOUNTS").await;
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "ACCOUNTS".into(),
        subjects: vec!["accounts.*".into()],
        ..stream
    })
    .await
    .unwrap();
    let db = TestDb::new(Backend::Sqlite).await;
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    spec.subjects = vec!["accounts.*".into()];
    spec.extra.push_str(extra);
    let cfg = write_config(dir, nats, &db, &[spec]);
    let config = idem::config::Config::load(&cfg).unwrap();
    match idem::service::Host::start(&config).await {
        Ok(_) => panic!(
            "a host started with `{extra}` on {:?}",
            config.handlers[0].stream
        ),
        Err(e) => format!("{e:#}"),
    }
}

/// A stream that exists without the transform `partitions` needs is
/// refused at start, in one line naming the transform it needs; and a
/// handler without partitions on a stream that transforms its subjects
/// (it would never see a message) is refused too.
#[tokio::test]
async fn a_stream_without_the_transform_is_refused() {
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let err = start_error(
        &nats,
        dir.path(),
        Default::default(),
        "order_key = \"subject:2\"\npartitions = 2\nack_wait = \"3s\"\n",
    )
    .await;
    assert!(
        err.contains(
            "handler `versions`: stream `ACCOUNTS` does not partition its messages as partitions = 2 needs (subject transform accounts.* -> {{partition(2,1)}}.accounts.{{wildcard(1)}}; it has none)"
        ),
        "{err}"
    );
    let partitioned = async_nats::jetstream::stream::Config {
        subject_transform: Some(async_nats::jetstream::stream::SubjectTransform {
            source: "accounts.*".into(),
            destination: "{{partition(2,1)}}.accounts.{{wildcard(1)}}".into(),
        }),
        ..Default::default()
    };
    let err = start_error(&nats, dir.path(), partitioned, "").await;
    assert!(
        err.contains(
            "handler `versions`: stream `ACCOUNTS` stores what is published to `accounts.*` under `{{partition(2,1)}}.accounts.{{wildcard(1)}}` (a subject transform, as for partitions), so a consumer filtering on [\"accounts.*\"] would never see a message"
        ),
        "{err}"
    );
}

/// While the database is down for longer than the `priority_timeout`, the
/// host serving the partitions keeps its pull open and so its pins: a
/// standby host does not take a partition and run later messages of a key
/// while the earlier ones wait in the first host's lanes. Two hosts, two
/// partitions, 40 keys of 5 versions; the database (a private cluster) is
/// stopped once the first two versions are applied and the other three
/// are published while it is down, for 30 s against a 17 s
/// `priority_timeout` (a standby is pinned at its next request after the
/// lapse, up to a pull expiry later). No pin moves while it is down, and afterwards every
/// key ends at its last version with no dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_longer_than_the_priority_timeout_keeps_the_pins() {
    const KEYS: i64 = 40;
    const VERSIONS: i64 = 5;
    let mut pg = idem_tests::pg_cluster::PgCluster::start();
    let db = pg.create_db("idem_partitions_outage").await;
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    spec.subjects = vec!["accounts.*".into()];
    spec.extra.push_str(
        "order_key = \"subject:2\"\npartitions = 2\nconcurrency = 2\nmax_deliver = 3\nack_wait = \"2s\"\ndeadline = \"1s\"\n",
    );
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace("max_connections = 4", "max_connections = 5"),
    )
    .unwrap();
    let probe = Probe::new(&db);
    let mut hosts = Vec::new();
    for name in ["h1", "h2"] {
        let mut host = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), name);
        until_consuming(&mut host).await;
        hosts.push(host);
    }
    let js = nats.jetstream().await;
    let publish_versions = |versions: std::ops::RangeInclusive<i64>| {
        let js = js.clone();
        async move {
            for version in versions {
                for key in 0..KEYS {
                    let update = serde_json::json!({
                        "op": "version",
                        "event_id": format!("k{key}-v{version}"),
                        "key": key,
                        "version": version,
                    });
                    publish(&js, &format!("accounts.{key}"), &update.to_string(), &[]).await;
                }
            }
        }
    };
    publish_versions(1..=2).await;
    until_applied(&probe, &hosts.iter().collect::<Vec<_>>(), 2 * KEYS).await;
    let pins = pins_of(&hosts);
    assert!(pins.iter().sum::<usize>() > 0, "no host was pinned");
    // The rest arrives while the database is down: the pinned host takes
    // messages it cannot run, and finds the database gone.
    pg.stop();
    publish_versions(3..=VERSIONS).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        pins_of(&hosts),
        pins,
        "a pin moved while the database was down; logs:\n{}",
        hosts.iter().map(log_of).collect::<Vec<_>>().join("\n---\n")
    );
    pg.start_again();
    until_applied(&probe, &hosts.iter().collect::<Vec<_>>(), KEYS * VERSIONS).await;
    assert_eq!(db.dead_letters(HANDLER).await, vec![]);
    for key in 0..KEYS {
        assert_eq!(db.balance(key).await, Some(VERSIONS), "key {key}");
    }
    for host in hosts {
        let ended = host.terminate(Duration::from_secs(30));
        assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    }
}

/// The take-over of a partition holds a later message until those given
/// back with a delay are back: key 1's first version is retried with a
/// 10 s nak delay on the pinned host and its second waits behind it when
/// that host stops (given back with a delay past the first's); a third
/// published after the stop reaches the host that takes the partition at
/// once, long before the two come back. A fixed wait of `ack_wait` would
/// have let it run first, and the guest would have refused it.
#[tokio::test]
async fn a_partition_taken_over_waits_for_those_given_back_with_a_delay() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = HandlerSpec::new(HANDLER, "behave");
    spec.subjects = vec!["accounts.*".into()];
    spec.extra =
        "order_key = \"subject:2\"\npartitions = 2\nack_wait = \"2s\"\nretry_delay = \"10s\"\n"
            .into();
    let cfg = write_config(dir.path(), &nats, &db, &[spec]);
    let mut first = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "first");
    until_consuming(&mut first).await;
    let mut second = HostProcess::spawn(host_bin(), &cfg, "", dir.path(), "second");
    until_consuming(&mut second).await;
    let js = nats.jetstream().await;
    let version = |v: i64, retry: bool| {
        serde_json::json!({"op": "version", "event_id": format!("k1-v{v}"), "key": 1, "version": v, "retry_first": retry, "subject": "accounts.1"})
            .to_string()
    };
    publish(&js, "accounts.1", &version(1, true), &[]).await;
    publish(&js, "accounts.1", &version(2, false), &[]).await;
    let until = Instant::now() + Duration::from_secs(60);
    while !log_of(&first).contains("rolled back; will retry") {
        assert!(
            first.exited().is_none() && Instant::now() < until,
            "the first host did not retry the first version; logs:\n{}\n---\n{}",
            log_of(&first),
            log_of(&second)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_log = first.log.clone();
    let ended = first.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
    let log = std::fs::read_to_string(&first_log).unwrap();
    assert!(
        log.contains("1 messages not run given back in stream order (1 after the message their key waits for)"),
        "the second version was not given back behind the first; log:\n{log}"
    );
    publish(&js, "accounts.1", &version(3, false), &[]).await;
    let probe = Probe::new(&db);
    until_applied(&probe, &[&second], 3).await;
    assert_eq!(
        db.dead_letters(HANDLER).await,
        vec![],
        "{}",
        log_of(&second)
    );
    assert_eq!(db.balance(1).await, Some(3));
    assert_eq!(db.receipts(HANDLER).await, 3);
    assert!(
        log_of(&second).contains("2 deliveries of the consumer are out and not acked"),
        "the host taking the partition did not wait for the two given back; log:\n{}",
        log_of(&second)
    );
    let ended = second.terminate(Duration::from_secs(30));
    assert_eq!(ended.status.and_then(|s| s.code()), Some(0));
}
