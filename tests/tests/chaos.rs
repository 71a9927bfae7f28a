//! The chaos suite. Host processes (`idem-test-host`, the `idem`
//! CLI with test-only fault points) share one config, so one durable
//! consumer, and consume a deterministic credit workload (a fixed seed):
//! events over many accounts, 10 % of them published a second time without
//! `Nats-Msg-Id` (so the broker cannot hide them from idem), a few poison
//! messages the credit handler rejects, and one message without an identity.
//!
//! While they consume, faults come at planned receipt counts (fractions of
//! the distinct events), so every run has all of them however fast the
//! hosts are: a random host is SIGKILLed and restarted at each of
//! `kills_at`, nats-server is restarted once (SIGKILL, same port and store;
//! then no kill until consumption resumed, so the hosts that lived through
//! it must resume on their own), on PostgreSQL every host's backend is
//! terminated once (`pg_terminate_backend`), and every host skips 10 % of
//! its acks after commit (`IDEM_FAULT=drop-ack:10`). The publisher holds
//! back what lies more than [`LEAD`] past the next fault until that fault
//! has happened: the count a fault waits for is sure to come, and the hosts
//! cannot finish the work before it. The run ends when every expected
//! receipt is there and the consumer has nothing pending or unacked, or
//! fails at a hard time bound with the counts so far.
//!
//! Then: every balance equals the total computed from the payloads, the
//! receipts are exactly the distinct event ids, the dead letters are exactly
//! the poison messages (by message id). One summary line prints the counts.
//!
//! PostgreSQL: 3 hosts, `concurrency = 4`, 20,000 events. SQLite: 1 host,
//! `concurrency = 3`, 10,000 events. Both keep the pull batch at 2 or more
//! (`ack_wait`, `deadline`, `concurrency`): a batch of 1 stalls, see
//! `broker_restart.rs`.
//!
//! A failed run keeps its config and host logs (the path is printed), as
//! does `IDEM_CHAOS_KEEP=1`; `IDEM_CHAOS_LOG` sets the hosts' `RUST_LOG`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::metrics::StatsSnapshot;
use idem_tests::chaos::{
    HostProcess, Probe, Rng, Workload, add_stats, consumer_info, describe_consumer, log_digest,
    publish_all,
};
use idem_tests::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// The workload's seed: one seed, one input.
const SEED: u64 = 0xC4A0_5EED_2026;
const CONSUMER: &str = "credit-projector";
const SUBJECT: &str = "accounts.credit";

/// The hosts that lived through the broker restart must be consuming again
/// within this long (no host is killed until they are).
const RESUME_AFTER_NATS_RESTART: Duration = Duration::from_secs(15);

/// The publisher stays at most this fraction of the distinct events ahead of
/// the next fault's receipt count.
const LEAD: f64 = 0.08;

/// The two chaos tests run one after the other: each wants both cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Plan {
    backend: Backend,
    hosts: usize,
    events: usize,
    accounts: u64,
    dup_percent: u64,
    poison: usize,
    /// `IDEM_FAULT` of every host.
    fault: &'static str,
    /// Extra handler config.
    extra: &'static str,
    /// `[database] max_connections` of each host (above the handler's `concurrency`).
    max_connections: u32,
    /// SIGKILL a random host (and start it again) when these fractions of
    /// the receipts are in.
    kills_at: &'static [f64],
    /// Restart nats-server once this fraction of the receipts is in.
    nats_restart_at: f64,
    /// Terminate the hosts' PostgreSQL backends once this fraction is in.
    terminate_at: Option<f64>,
    /// Hard bound for the whole run.
    bound: Duration,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_postgres() {
    let _one_at_a_time = SERIAL.lock().await;
    run(Plan {
        backend: Backend::Postgres,
        hosts: 3,
        events: 20_000,
        accounts: 200,
        dup_percent: 10,
        poison: 5,
        fault: "drop-ack:10",
        // Pull batch 2 (ack_wait × concurrency / (1.5 × (deadline + 1 s))).
        extra: "ack_wait = \"3s\"\ndeadline = \"2s\"\nretry_delay = \"100ms\"\nconcurrency = 4\n",
        max_connections: 6,
        kills_at: KILLS_AT,
        nats_restart_at: 0.3,
        terminate_at: Some(0.6),
        bound: Duration::from_secs(8 * 60),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_sqlite() {
    let _one_at_a_time = SERIAL.lock().await;
    run(Plan {
        backend: Backend::Sqlite,
        hosts: 1,
        events: 10_000,
        accounts: 100,
        dup_percent: 10,
        poison: 5,
        fault: "drop-ack:10",
        // Pull batch 2, as above; SQLite runs one writer at a time anyway.
        extra: "ack_wait = \"3s\"\ndeadline = \"2s\"\nretry_delay = \"100ms\"\nconcurrency = 3\n",
        max_connections: 4,
        kills_at: KILLS_AT,
        nats_restart_at: 0.3,
        terminate_at: None,
        bound: Duration::from_secs(5 * 60),
    })
    .await;
}

/// Where the SIGKILLs come, as fractions of the receipts: before and after
/// the broker restart (0.3) and the backend terminations (0.6).
const KILLS_AT: &[f64] = &[0.05, 0.15, 0.22, 0.4, 0.5, 0.68, 0.78, 0.88, 0.95];

/// A fault of the plan.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Kill,
    NatsRestart,
    TerminateBackends,
}

/// The plan's faults in the order they come, each with the receipt count
/// it waits for.
fn schedule(plan: &Plan, distinct: i64) -> std::collections::VecDeque<(i64, Fault)> {
    let mut faults: Vec<(f64, Fault)> = plan.kills_at.iter().map(|f| (*f, Fault::Kill)).collect();
    faults.push((plan.nats_restart_at, Fault::NatsRestart));
    if let Some(at) = plan.terminate_at {
        faults.push((at, Fault::TerminateBackends));
    }
    faults.sort_by(|a, b| a.0.total_cmp(&b.0));
    faults
        .into_iter()
        .map(|(f, fault)| ((f * distinct as f64).ceil() as i64, fault))
        .collect()
}

/// What the chaos did, for the summary and failure messages.
#[derive(Default)]
struct Chaos {
    kills: usize,
    /// Killed hosts whose log had no stats line yet (ran < 2 s).
    kills_without_stats: usize,
    nats_restarts: usize,
    /// When nats-server was restarted, and the receipts then.
    nats_restarted: Option<(Instant, i64)>,
    /// How long after the broker restart the hosts were consuming again.
    resumed_after: Option<Duration>,
    terminations: usize,
    backends_terminated: i64,
    /// Hosts that exited without being killed: (name, status, last log line).
    unexpected_exits: Vec<String>,
    /// Summed stats of hosts already gone.
    gone: StatsSnapshot,
}

async fn run(plan: Plan) {
    let started = Instant::now();
    let mut nats = Nats::start();
    let db = TestDb::new(plan.backend).await;
    // Config and host logs; kept (and named) when the run fails.
    let dir = Logs(Some(
        tempfile::Builder::new()
            .prefix("idem-chaos-")
            .tempdir()
            .unwrap(),
    ));
    let logs = dir.path();
    let mut h = HandlerSpec::new(CONSUMER, "credit");
    h.extra = plan.extra.into();
    let cfg = write_config(&logs, &nats, &db, &[h]);
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("max_connections = 4\n"));
    std::fs::write(
        &cfg,
        text.replace(
            "max_connections = 4\n",
            &format!("max_connections = {}\n", plan.max_connections),
        ),
    )
    .unwrap();
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    // One client for the whole run: it reconnects after the broker restart.
    let js = nats.jetstream().await;
    let probe = Probe::new(&db);

    let w = Workload::credit(
        SEED,
        plan.events,
        plan.accounts,
        plan.dup_percent,
        plan.poison,
    );
    let (expected, ids) = w.expected();
    let distinct = ids.len() as i64;
    assert_eq!(ids.len(), plan.events);

    let bin = Path::new(env!("CARGO_BIN_EXE_idem-test-host"));
    let mut generation = 0usize;
    let mut spawn = |slot: usize| {
        generation += 1;
        HostProcess::spawn(
            bin,
            &cfg,
            plan.fault,
            &logs,
            &format!("host{slot}-{generation:03}"),
        )
    };
    let mut hosts: Vec<(String, HostProcess)> = (0..plan.hosts)
        .map(|slot| {
            let p = spawn(slot);
            (format!("host{slot}"), p)
        })
        .collect();

    let mut faults = schedule(&plan, distinct);
    // How many messages the publisher may send: up to LEAD past the next
    // fault's receipt count, all of them once no fault is left.
    let allowed_for = |next: Option<&(i64, Fault)>| match next {
        Some((at, _)) => w.prefix_holding((*at as f64 + LEAD * distinct as f64).ceil() as usize),
        None => w.messages.len(),
    };
    let (allow, mut allowed) = tokio::sync::watch::channel(allowed_for(faults.front()));
    let mut publisher = Some({
        let js = js.clone();
        let messages = w.messages.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let (mut sent, mut resent) = (0, 0);
            while sent < messages.len() {
                let upto = *allowed.borrow_and_update();
                if upto > sent {
                    resent += publish_all(
                        &js,
                        SUBJECT,
                        &messages[sent..upto],
                        256,
                        Instant::now() + Duration::from_secs(180),
                    )
                    .await;
                    sent = upto;
                } else if allowed.changed().await.is_err() {
                    break;
                }
            }
            (resent, t.elapsed())
        })
    });
    let mut published: Option<(usize, Duration)> = None;

    let mut rng = Rng::new(SEED ^ 0x00C0_FFEE);
    let mut chaos = Chaos::default();
    let mut receipts = 0i64;
    let mut idle_readings = 0;
    let mut last_progress = Instant::now();
    let consumed = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(p) = publisher.take_if(|p| p.is_finished()) {
            published = Some(p.await.expect("publisher"));
        }
        // A host that exited on its own is a finding: record it, restart it.
        for (slot, (name, p)) in hosts.iter_mut().enumerate() {
            if let Some(status) = p.exited() {
                let log = std::fs::read_to_string(&p.log).unwrap_or_default();
                let last = log.lines().last().unwrap_or_default().to_string();
                chaos
                    .unexpected_exits
                    .push(format!("{name} ({}) {status}: {last}", p.log.display()));
                if let Some(s) = p.sigkill().stats {
                    chaos.gone = add_stats(chaos.gone, s);
                }
                *p = spawn(slot);
            }
        }
        if let Ok(n) = probe.receipts(CONSUMER).await {
            receipts = n;
        }
        // Consumption resumed after the broker restart: more receipts than
        // the deliveries already in the hosts at the restart account for.
        if let Some((at, before)) = chaos.nats_restarted
            && chaos.resumed_after.is_none()
            && receipts > before + 50
        {
            chaos.resumed_after = Some(at.elapsed());
        }
        // The next fault, once its receipt count is in (a kill after the
        // broker restart only once consumption resumed).
        if let Some(&(at, fault)) = faults.front()
            && receipts >= at
            && (fault != Fault::Kill
                || chaos.nats_restarted.is_none()
                || chaos.resumed_after.is_some())
        {
            match fault {
                Fault::Kill => {
                    let slot = rng.below(hosts.len() as u64) as usize;
                    let ended = hosts[slot].1.sigkill();
                    hosts[slot].1 = spawn(slot);
                    chaos.kills += 1;
                    match ended.stats {
                        Some(s) => chaos.gone = add_stats(chaos.gone, s),
                        None => chaos.kills_without_stats += 1,
                    }
                    println!(
                        "chaos: host{slot} SIGKILLed at {receipts}/{distinct} receipts ({:?})",
                        started.elapsed()
                    );
                    faults.pop_front();
                }
                Fault::NatsRestart => {
                    tokio::task::block_in_place(|| nats.restart());
                    chaos.nats_restarts += 1;
                    chaos.nats_restarted = Some((Instant::now(), receipts));
                    println!(
                        "chaos: nats-server restarted at {receipts}/{distinct} receipts ({:?})",
                        started.elapsed()
                    );
                    faults.pop_front();
                }
                Fault::TerminateBackends => match probe.terminate_backends(&db).await {
                    Ok(n) => {
                        chaos.terminations += 1;
                        chaos.backends_terminated = n;
                        println!(
                            "chaos: terminated {n} PostgreSQL backends at {receipts}/{distinct} receipts ({:?})",
                            started.elapsed()
                        );
                        faults.pop_front();
                    }
                    Err(e) => println!("chaos: pg_terminate_backend failed ({e}); trying again"),
                },
            }
            let _ = allow.send(allowed_for(faults.front()));
        }
        if last_progress.elapsed() >= Duration::from_secs(10) {
            last_progress = Instant::now();
            println!(
                "chaos: {:?}: receipts {receipts}/{distinct}, kills {}, consumer {}",
                started.elapsed(),
                chaos.kills,
                consumer_info(&js, "ACCOUNTS", CONSUMER)
                    .await
                    .map_or_else(|| "unavailable".into(), |i| describe_consumer(&i))
            );
        }

        // Done: every effect in and nothing left on the consumer (so every
        // dead letter written, every dropped ack redelivered and acked),
        // twice in a row. Exactness is asserted afterwards.
        let mut idle = false;
        if published.is_some()
            && receipts == distinct
            && let Some(i) = consumer_info(&js, "ACCOUNTS", CONSUMER).await
        {
            idle = i.num_pending == 0 && i.num_ack_pending == 0;
        }
        idle_readings = if idle { idle_readings + 1 } else { 0 };
        if idle_readings >= 2 {
            break started.elapsed();
        }
        if started.elapsed() > plan.bound {
            let info = consumer_info(&js, "ACCOUNTS", CONSUMER).await;
            let mut got = db.receipt_ids(CONSUMER).await;
            got.sort();
            let missing: Vec<&String> = ids
                .iter()
                .filter(|id| got.binary_search(id).is_err())
                .take(10)
                .collect();
            panic!(
                "{:?} chaos did not settle within {:?}: receipts {receipts}/{distinct} \
                 (first missing {missing:?}), dead letters {:?} of {}, published {published:?}, \
                 kills {}, nats restarts {}, terminations {}, unexpected exits {:?}, consumer {}\n\
                 host logs in {}; their warnings and errors:\n{}",
                plan.backend,
                plan.bound,
                probe.dead_letters(CONSUMER).await,
                w.poison.len(),
                chaos.kills,
                chaos.nats_restarts,
                chaos.terminations,
                chaos.unexpected_exits,
                info.map_or_else(|| "unavailable".into(), |i| describe_consumer(&i)),
                logs.display(),
                log_digest(&logs)
            );
        }
    };
    let info = consumer_info(&js, "ACCOUNTS", CONSUMER).await;
    let (resent, publish_time) = published.unwrap();

    // Clean shutdown of the survivors: their summaries complete the counts.
    let mut hosts_stats = chaos.gone;
    for (_, p) in hosts.drain(..) {
        let ended = p.terminate(Duration::from_secs(20));
        if let Some(s) = ended.stats {
            hosts_stats = add_stats(hosts_stats, s);
        }
    }
    let digest = log_digest(&logs);

    println!(
        "chaos {:?}: seed={SEED:#x} published={} (events={} duplicates={} poison={} resent={}) \
         distinct={distinct} hosts={} kills={} (without stats {}) nats_restarts={} \
         (consuming again after {:?}) backend_terminations={} (backends={}) \
         unexpected_exits={} | consumer: {} | \
         hosts (sum; a killed host counts up to its last 2 s stats line): {hosts_stats} | \
         publish {publish_time:?}, settled {consumed:?}, total {:?}",
        plan.backend,
        w.messages.len() + resent,
        w.events,
        w.duplicates,
        w.poison.len(),
        resent,
        plan.hosts,
        chaos.kills,
        chaos.kills_without_stats,
        chaos.nats_restarts,
        chaos.resumed_after,
        chaos.terminations,
        chaos.backends_terminated,
        chaos.unexpected_exits.len(),
        info.map_or_else(|| "unavailable".into(), |i| describe_consumer(&i)),
        started.elapsed()
    );
    for e in &chaos.unexpected_exits {
        println!("chaos: unexpected exit: {e}");
    }
    println!("chaos: host warnings and errors:\n{digest}");

    // The effects: exact.
    let balances = probe.balances().await.unwrap();
    let wrong: Vec<_> = expected
        .iter()
        .filter(|(a, b)| balances.get(a) != Some(b))
        .map(|(a, b)| (a, b, balances.get(a)))
        .take(10)
        .collect();
    assert!(
        wrong.is_empty() && balances.len() == expected.len(),
        "balances differ (account, expected, actual): {wrong:?}; {} accounts, {} expected",
        balances.len(),
        expected.len()
    );
    let mut got = db.receipt_ids(CONSUMER).await;
    got.sort();
    assert_eq!(got.len(), ids.len(), "receipt count");
    assert!(
        got == ids,
        "receipts are not exactly the distinct event ids"
    );
    let dead = db.dead_letters(CONSUMER).await;
    let mut dead_ids: Vec<Option<String>> = dead.iter().map(|(id, _)| id.clone()).collect();
    dead_ids.sort();
    assert_eq!(dead_ids, w.poison, "dead letters: {dead:?}");
    for (id, reason) in &dead {
        match id {
            Some(_) => assert!(
                reason.starts_with("rejected: not a credit event"),
                "{id:?}: {reason}"
            ),
            None => assert!(reason.contains("event_id"), "{reason}"),
        }
    }
    // Every planned fault happened (the publisher waited for each).
    assert_eq!(chaos.kills, plan.kills_at.len(), "SIGKILLs");
    assert_eq!(chaos.nats_restarts, 1, "broker restarts");
    assert_eq!(
        chaos.terminations,
        usize::from(plan.terminate_at.is_some()),
        "backend terminations"
    );
    assert!(
        chaos
            .resumed_after
            .is_some_and(|d| d < RESUME_AFTER_NATS_RESTART),
        "the hosts did not resume consuming within {RESUME_AFTER_NATS_RESTART:?} of the broker \
         restart (resumed after {:?})",
        chaos.resumed_after
    );
}

/// The run's directory: deleted at the end unless the test fails or
/// `IDEM_CHAOS_KEEP` is set, then kept and named.
struct Logs(Option<tempfile::TempDir>);

impl Logs {
    fn path(&self) -> std::path::PathBuf {
        self.0.as_ref().unwrap().path().to_path_buf()
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        if (std::thread::panicking() || std::env::var_os("IDEM_CHAOS_KEEP").is_some())
            && let Some(d) = self.0.take()
        {
            eprintln!("chaos: config and host logs kept in {}", d.keep().display());
        }
    }
}
