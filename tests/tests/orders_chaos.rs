//! The orders example (`examples/orders`) under chaos: two handlers chained
//! through the transactional outbox (ARCHITECTURE.md, "The outbox"), run as
//! host processes (`idem-test-host`, the `idem` CLI with test-only fault
//! points) on one config made from the example's own `idem.toml` (modules,
//! streams, subjects, identities, tables, migrations, grants; the test's
//! broker, database and receiver). `orders` takes each placed order in and
//! publishes `orders.accepted`; `stock`, whose identity is the relay's
//! `Nats-Msg-Id`, reserves stock for it and calls `notify`, an HTTP receiver
//! in this test that answers 500 to the first request of a fixed fifth of
//! the keys (chosen by a hash of the key), so those calls are tried again.
//!
//! The input is deterministic (a fixed seed): orders over eight SKUs, 10 %
//! of them published a second time without `Nats-Msg-Id` (the broker cannot
//! hide them from idem). While the hosts consume, faults come at planned
//! counts of receipts (of both handlers together), so every run has all of
//! them however fast the hosts are:
//!
//! - a random host is SIGKILLed and started again at each of `kills_at`
//!   (what its relay had claimed waits out the 30 s lease);
//! - a host aborts at `abort-after-commit:N` (after its N-th commit, before
//!   the ack) and one at `abort-after-send:N` (after its relay's N-th send,
//!   before the row's delete: the row is sent again after its lease, with
//!   the same id, and the stream or the receiver sees a copy); a host that
//!   aborted is started again without that fault point;
//! - nats-server is restarted once (SIGKILL, same port and store; then no
//!   kill until consumption resumed);
//! - on PostgreSQL every host's backend is terminated once
//!   (`pg_terminate_backend`);
//! - every host skips 5 % of its acks after commit (`drop-ack:5`).
//!
//! The publisher holds back what lies more than [`LEAD`] past the next
//! fault until that fault has happened. The run ends when every expected
//! receipt of both handlers is there, both consumers have nothing pending
//! or unacked, the outbox is empty and the receiver has answered 2xx to
//! every expected key; or fails at a hard bound with the counts so far.
//!
//! Then, exactly: the `orders` rows are the distinct orders; stream
//! `ORDERS_ACCEPTED` holds one message per order (the relay's copies
//! dropped inside the 2-minute duplicate window), each with the id the
//! relay derives and the order as payload; the reservations are the
//! orders; each SKU's stock is its initial 10,000 less the quantities
//! computed from the payloads; the receiver answered 2xx to exactly one key
//! per order, each with its order as body, and 500 to exactly the keys the
//! hash picks; the outbox is empty; the receipts are exactly the expected
//! ids; nothing is dead-lettered; every planned fault happened. One summary
//! line prints the counts.
//!
//! PostgreSQL: 3 hosts, 2,000 orders. SQLite: 1 host, 1,000 orders. Each
//! handler keeps the pull batch at 2 (`ack_wait`, `deadline`,
//! `concurrency`), as `chaos.rs` does.
//!
//! A failed run keeps its config and host logs (the path is printed), as
//! does `IDEM_CHAOS_KEEP=1`; `IDEM_CHAOS_LOG` sets the hosts' `RUST_LOG`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::config::{Config, HandlerConfig};
use idem::metrics::StatsSnapshot;
use idem::outbox::relay::delivery_id;
use idem_test_support::{HttpReceiver, RunDir};
use idem_tests::chaos::{
    HostProcess, Probe, Rng, add_stats, consumer_info, describe_consumer, last_stats, log_digest,
    publish_all,
};
use idem_tests::examples::identity;
use idem_tests::*;
use sqlx::Row;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The workload's seed: one seed, one input.
const SEED: u64 = 0x0D0E_25EE_D026;
/// The example's handlers, as its `idem.toml` names them.
const ORDERS: &str = "orders";
const STOCK: &str = "stock";
/// The SKUs `stock/migrations/0001_stock.sql` stocks, and with how much.
const SKUS: u64 = 8;
const INITIAL_STOCK: i64 = 10_000;

/// The hosts that lived through the broker restart must be consuming again
/// within this long (no host is killed until they are).
const RESUME_AFTER_NATS_RESTART: Duration = Duration::from_secs(15);

/// The publisher stays at most this fraction of the distinct orders ahead
/// of what the next fault's receipt count needs.
const LEAD: f64 = 0.08;

/// The receiver answers 500 to the first request of a key when the key's
/// hash falls in this percentage.
const FAIL_FIRST_PERCENT: u64 = 20;

/// Every host's `IDEM_FAULT`, besides its abort point.
const BASE_FAULT: &str = "drop-ack:5";

/// The two tests run one after the other: each wants both cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Plan {
    backend: Backend,
    hosts: usize,
    orders: usize,
    dup_percent: u64,
    /// Extra lines of each handler's config.
    extra: &'static str,
    /// `[database] max_connections` of each host.
    max_connections: u32,
    /// SIGKILL a random host (and start it again) when these fractions of
    /// all receipts (both handlers, 2 × orders) are in.
    kills_at: &'static [f64],
    /// Abort points (`IDEM_FAULT` items) per host slot, in order: a slot's
    /// process runs with the first of its list until it aborts there, then
    /// with the next (a SIGKILLed process is started again with the same).
    aborts: &'static [&'static [&'static str]],
    /// Restart nats-server once this fraction of the receipts is in.
    nats_restart_at: f64,
    /// Terminate the hosts' PostgreSQL backends once this fraction is in.
    terminate_at: Option<f64>,
    /// Hard bound for the whole run.
    bound: Duration,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_chaos_postgres() {
    let _one_at_a_time = SERIAL.lock().await;
    run(Plan {
        backend: Backend::Postgres,
        hosts: 3,
        orders: 2_000,
        dup_percent: 10,
        // Pull batch 2 (ack_wait × concurrency / (1.5 × (deadline + 1 s))).
        extra: "ack_wait = \"3s\"\ndeadline = \"2s\"\nretry_delay = \"100ms\"\nconcurrency = 3\n",
        max_connections: 8,
        kills_at: &[0.1, 0.3, 0.5, 0.7, 0.85],
        aborts: &[&["abort-after-commit:200"], &["abort-after-send:200"], &[]],
        nats_restart_at: 0.4,
        terminate_at: Some(0.6),
        bound: Duration::from_secs(150),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_chaos_sqlite() {
    let _one_at_a_time = SERIAL.lock().await;
    run(Plan {
        backend: Backend::Sqlite,
        hosts: 1,
        orders: 1_000,
        dup_percent: 10,
        // Pull batch 2, as above; SQLite runs one writer at a time anyway.
        extra: "ack_wait = \"3s\"\ndeadline = \"2s\"\nretry_delay = \"100ms\"\nconcurrency = 2\n",
        max_connections: 6,
        kills_at: &[0.15, 0.55, 0.85],
        aborts: &[&["abort-after-commit:250", "abort-after-send:250"]],
        nats_restart_at: 0.4,
        terminate_at: None,
        bound: Duration::from_secs(120),
    })
    .await;
}

/// The placed orders of a run, in publish order, and what they ask for.
struct Workload {
    /// Payloads in publish order (copies included).
    messages: Vec<String>,
    /// Of `messages`, copies of an order already in the list.
    duplicates: usize,
}

impl Workload {
    /// `orders` orders `o-NNNNNN` over `sku-1..=sku-8` (quantities 1..=5),
    /// `dup_percent` of them published a second time; shuffled by `seed`.
    fn new(seed: u64, orders: usize, dup_percent: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut messages = Vec::with_capacity(orders + orders / 5);
        for i in 0..orders {
            let sku = rng.between(1, SKUS);
            let qty = rng.between(1, 5);
            messages.push(
                serde_json::json!({"order_id": format!("o-{i:06}"), "sku": format!("sku-{sku}"), "qty": qty})
                    .to_string(),
            );
        }
        let mut duplicates = 0;
        for i in 0..orders {
            if rng.below(100) < dup_percent {
                messages.push(messages[i].clone());
                duplicates += 1;
            }
        }
        // Fisher-Yates: copies land anywhere, even before their original.
        for i in (1..messages.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            messages.swap(i, j);
        }
        Workload {
            messages,
            duplicates,
        }
    }

    /// The order a payload carries: (order id, sku, qty).
    fn parse(m: &str) -> (String, String, i64) {
        let v: serde_json::Value = serde_json::from_str(m).unwrap();
        (
            v["order_id"].as_str().unwrap().to_owned(),
            v["sku"].as_str().unwrap().to_owned(),
            v["qty"].as_i64().unwrap(),
        )
    }

    /// How many of `messages`, from the first, it takes to hold `n`
    /// distinct orders; all of them when there are fewer.
    fn prefix_holding(&self, n: usize) -> usize {
        let mut seen = BTreeSet::new();
        for (i, m) in self.messages.iter().enumerate() {
            if seen.len() >= n {
                return i;
            }
            seen.insert(Self::parse(m).0);
        }
        self.messages.len()
    }

    /// The distinct orders, computed from the payloads alone (not from the
    /// generator): order id → (sku, qty).
    fn expected(&self) -> BTreeMap<String, (String, i64)> {
        let mut orders = BTreeMap::new();
        for m in &self.messages {
            let (id, sku, qty) = Self::parse(m);
            orders.entry(id).or_insert((sku, qty));
        }
        orders
    }
}

/// The receiver's answer: 500 to the first request of a key whose FNV-1a
/// hash falls in [`FAIL_FIRST_PERCENT`], 200 to everything else.
fn answer(key: &str, before: usize) -> u16 {
    if before == 0 && fails_first(key) {
        500
    } else {
        200
    }
}

fn fails_first(key: &str) -> bool {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h % 100 < FAIL_FIRST_PERCENT
}

/// The `[[handler]]` tables of `examples/orders/idem.toml`, paths resolved,
/// checked against what the test expects of them.
fn shipped() -> Vec<HandlerConfig> {
    let path = root().join("examples/orders/idem.toml");
    let config = Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let names: Vec<&str> = config.handlers.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, [ORDERS, STOCK]);
    for h in &config.handlers {
        assert_eq!(
            h.module.canonicalize().unwrap(),
            guest(&h.name).canonicalize().unwrap(),
            "examples/orders/idem.toml does not load the build output of {}",
            h.name
        );
    }
    let (orders, stock) = (&config.handlers[0], &config.handlers[1]);
    assert_eq!(identity(&orders.identity), "json:/order_id");
    assert_eq!(identity(&stock.identity), "header:Nats-Msg-Id");
    assert_eq!(orders.publish, ["orders.accepted"]);
    assert_eq!(stock.subjects, ["orders.accepted"]);
    assert_eq!(
        stock.endpoints,
        BTreeMap::from([("notify".into(), "http://127.0.0.1:8088/notify".into())])
    );
    config.handlers
}

/// Writes `dir/idem.toml`: the shipped handlers with `extra`, the test's
/// broker and database, and `notify` at the receiver.
fn write_config(
    dir: &Path,
    nats: &Nats,
    db: &TestDb,
    handlers: &[HandlerConfig],
    receiver: &HttpReceiver,
    plan: &Plan,
) -> PathBuf {
    let mut s = format!(
        "[broker]\nurl = \"{}\"\n[database]\nurl = \"{}\"\nmax_connections = {}\n",
        nats.url(),
        db.url,
        plan.max_connections
    );
    for h in handlers {
        s.push_str(&format!(
            "[[handler]]\nname = \"{}\"\nmodule = \"{}\"\nstream = \"{}\"\nsubjects = {:?}\n\
             identity = \"{}\"\ntables = {:?}\nmigrations = \"{}\"\npublish = {:?}\n",
            h.name,
            h.module.display(),
            h.stream,
            h.subjects,
            identity(&h.identity),
            h.tables,
            h.migrations.as_ref().unwrap().display(),
            h.publish,
        ));
        if !h.endpoints.is_empty() {
            let endpoints: Vec<String> = h
                .endpoints
                .keys()
                .map(|name| format!("{name} = \"{}\"", receiver.url(&format!("/{name}"))))
                .collect();
            s.push_str(&format!("endpoints = {{ {} }}\n", endpoints.join(", ")));
        }
        s.push_str(plan.extra);
        s.push_str(&test_batch_line(plan.extra));
    }
    let path = dir.join("idem.toml");
    std::fs::write(&path, s).unwrap();
    path
}

/// A fault of the plan.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Kill,
    NatsRestart,
    TerminateBackends,
}

/// The plan's faults in the order they come, each with the receipt count
/// (both handlers together) it waits for.
fn schedule(plan: &Plan, total: i64) -> VecDeque<(i64, Fault)> {
    let mut faults: Vec<(f64, Fault)> = plan.kills_at.iter().map(|f| (*f, Fault::Kill)).collect();
    faults.push((plan.nats_restart_at, Fault::NatsRestart));
    if let Some(at) = plan.terminate_at {
        faults.push((at, Fault::TerminateBackends));
    }
    faults.sort_by(|a, b| a.0.total_cmp(&b.0));
    faults
        .into_iter()
        .map(|(f, fault)| ((f * total as f64).ceil() as i64, fault))
        .collect()
}

/// What the chaos did, for the summary and failure messages.
#[derive(Default)]
struct Chaos {
    kills: usize,
    /// Abort points reached: (slot, fault point, receipts then).
    aborts: Vec<(usize, String, i64)>,
    nats_restarts: usize,
    /// When nats-server was restarted, and the receipts then.
    nats_restarted: Option<(Instant, i64)>,
    /// How long after the broker restart the hosts were consuming again.
    resumed_after: Option<Duration>,
    terminations: usize,
    backends_terminated: i64,
    /// Hosts that exited without being killed or reaching their abort
    /// point: (name, status, last log line).
    unexpected_exits: Vec<String>,
}

/// One host slot: its process and the abort points it has still to reach.
struct Slot {
    process: HostProcess,
    aborts: VecDeque<&'static str>,
}

/// The counts the run watches.
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    orders: i64,
    stock: i64,
    outbox: i64,
}

impl Progress {
    fn receipts(&self) -> i64 {
        self.orders + self.stock
    }
}

async fn run(plan: Plan) {
    let started = Instant::now();
    let mut nats = Nats::start();
    let db = TestDb::new(plan.backend).await;
    // Config and host logs; kept (and named) when the run fails.
    let dir = RunDir::new("idem-orders-chaos-", "IDEM_CHAOS_KEEP");
    let logs = dir.path_buf();
    let receiver = HttpReceiver::start(answer).await;
    let handlers = shipped();
    let cfg = write_config(&logs, &nats, &db, &handlers, &receiver, &plan);
    for h in &handlers {
        let subjects: Vec<&str> = h.subjects.iter().map(String::as_str).collect();
        create_stream(&nats, &h.stream, &subjects).await;
    }
    let accepted_stream = handlers[1].stream.clone();
    // One client for the whole run: it reconnects after the broker restart.
    let js = nats.jetstream().await;
    // The server's default duplicate window, which drops a row sent again
    // after its lease (ARCHITECTURE.md, "The outbox").
    let window = js
        .get_stream(&accepted_stream)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .config
        .duplicate_window;
    assert_eq!(window, Duration::from_secs(120));
    let probe = Probe::new(&db);

    let w = Workload::new(SEED, plan.orders, plan.dup_percent);
    let expected = w.expected();
    assert_eq!(expected.len(), plan.orders);
    let n = plan.orders as i64;
    let total = 2 * n;
    // What the relay sends for each order: the accepted message's id (the
    // `stock` message's identity) and the notify call's key.
    let accepted_ids: BTreeMap<String, String> = expected
        .keys()
        .map(|id| (delivery_id(ORDERS, id, 0), id.clone()))
        .collect();
    let notify_keys: BTreeMap<String, String> = accepted_ids
        .iter()
        .map(|(msg_id, order)| (delivery_id(STOCK, msg_id, 0), order.clone()))
        .collect();
    assert_eq!(notify_keys.len(), plan.orders);
    let failing_first = notify_keys.keys().filter(|k| fails_first(k)).count();

    let bin = Path::new(env!("CARGO_BIN_EXE_idem-test-host"));
    let mut generation = 0usize;
    // Every process's (log, stdout), for the stats at the end.
    let mut outputs: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut spawn = |slot: usize, abort: Option<&str>| {
        generation += 1;
        let fault = match abort {
            Some(a) => format!("{BASE_FAULT},{a}"),
            None => BASE_FAULT.to_owned(),
        };
        let p = HostProcess::spawn(
            bin,
            &cfg,
            &fault,
            &logs,
            &format!("host{slot}-{generation:03}"),
        );
        outputs.push((p.log.clone(), p.out.clone()));
        p
    };
    let mut hosts: Vec<Slot> = (0..plan.hosts)
        .map(|slot| {
            let aborts: VecDeque<&'static str> = plan
                .aborts
                .get(slot)
                .map(|a| a.iter().copied().collect())
                .unwrap_or_default();
            Slot {
                process: spawn(slot, aborts.front().copied()),
                aborts,
            }
        })
        .collect();
    let planned_aborts: Vec<&str> = plan.aborts.iter().flat_map(|a| a.iter().copied()).collect();

    let mut faults = schedule(&plan, total);
    // How many messages the publisher may send: enough distinct orders for
    // the next fault's receipt count (each order makes two receipts) plus
    // LEAD, all of them once no fault is left.
    let allowed_for = |next: Option<&(i64, Fault)>| match next {
        Some((at, _)) => w.prefix_holding(((*at as f64 / 2.0) + LEAD * n as f64).ceil() as usize),
        None => w.messages.len(),
    };
    let (allow, mut allowed) = tokio::sync::watch::channel(allowed_for(faults.front()));
    let placed = handlers[0].subjects[0].clone();
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
                        &placed,
                        &messages[sent..upto],
                        256,
                        Instant::now() + Duration::from_secs(120),
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
    let mut progress = Progress::default();
    let mut idle_readings = 0;
    let mut last_report = Instant::now();
    let settled = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(p) = publisher.take_if(|p| p.is_finished()) {
            published = Some(p.await.expect("publisher"));
        }
        // A host that exited on its own: at its abort point (then started
        // again with the next one), or a finding (recorded, started again).
        for (slot, s) in hosts.iter_mut().enumerate() {
            let Some(status) = s.process.exited() else {
                continue;
            };
            let log = std::fs::read_to_string(&s.process.log).unwrap_or_default();
            let reached = s
                .aborts
                .front()
                .is_some_and(|a| log.contains(&format!("fault point {a} reached")));
            if reached {
                let a = s.aborts.pop_front().unwrap();
                chaos.aborts.push((slot, a.to_owned(), progress.receipts()));
                println!(
                    "chaos: host{slot} aborted at {a} at {}/{total} receipts ({:?})",
                    progress.receipts(),
                    started.elapsed()
                );
            } else {
                let last = log.lines().last().unwrap_or_default().to_string();
                chaos.unexpected_exits.push(format!(
                    "host{slot} ({}) {status}: {last}",
                    s.process.log.display()
                ));
            }
            s.process.sigkill();
            s.process = spawn(slot, s.aborts.front().copied());
        }
        if let (Ok(orders), Ok(stock), Ok(outbox)) = (
            probe.receipts(ORDERS).await,
            probe.receipts(STOCK).await,
            probe.scalar("SELECT count(*) FROM idem_outbox").await,
        ) {
            progress = Progress {
                orders,
                stock,
                outbox,
            };
        }
        let receipts = progress.receipts();
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
                    let s = &mut hosts[slot];
                    s.process.sigkill();
                    s.process = spawn(slot, s.aborts.front().copied());
                    chaos.kills += 1;
                    println!(
                        "chaos: host{slot} SIGKILLed at {receipts}/{total} receipts ({:?})",
                        started.elapsed()
                    );
                    faults.pop_front();
                }
                Fault::NatsRestart => {
                    tokio::task::block_in_place(|| nats.restart());
                    chaos.nats_restarts += 1;
                    chaos.nats_restarted = Some((Instant::now(), receipts));
                    println!(
                        "chaos: nats-server restarted at {receipts}/{total} receipts ({:?})",
                        started.elapsed()
                    );
                    faults.pop_front();
                }
                Fault::TerminateBackends => match probe.terminate_backends(&db).await {
                    Ok(k) => {
                        chaos.terminations += 1;
                        chaos.backends_terminated = k;
                        println!(
                            "chaos: terminated {k} PostgreSQL backends at {receipts}/{total} receipts ({:?})",
                            started.elapsed()
                        );
                        faults.pop_front();
                    }
                    Err(e) => println!("chaos: pg_terminate_backend failed ({e}); trying again"),
                },
            }
            let _ = allow.send(allowed_for(faults.front()));
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            println!(
                "chaos: {:?}: receipts orders {}/{n} stock {}/{n}, outbox {}, notify keys {}, kills {}",
                started.elapsed(),
                progress.orders,
                progress.stock,
                progress.outbox,
                receiver.done_keys().len(),
                chaos.kills,
            );
        }

        // Done: every effect in, nothing left on either consumer (every
        // dropped ack redelivered and acked) nor in the outbox, every call
        // answered 2xx; twice in a row. Exactness is asserted afterwards.
        let mut idle = false;
        if published.is_some()
            && progress.orders == n
            && progress.stock == n
            && progress.outbox == 0
            && receiver.done_keys().len() == plan.orders
        {
            idle = true;
            for h in &handlers {
                idle &= consumer_info(&js, &h.stream, &h.name)
                    .await
                    .is_some_and(|i| i.num_pending == 0 && i.num_ack_pending == 0);
            }
        }
        idle_readings = if idle { idle_readings + 1 } else { 0 };
        if idle_readings >= 2 {
            break started.elapsed();
        }
        if started.elapsed() > plan.bound {
            let mut consumers = Vec::new();
            for h in &handlers {
                consumers.push(format!(
                    "{}: {}",
                    h.name,
                    consumer_info(&js, &h.stream, &h.name)
                        .await
                        .map_or_else(|| "unavailable".into(), |i| describe_consumer(&i))
                ));
            }
            panic!(
                "{:?} chaos did not settle within {:?}: receipts orders {}/{n} stock {}/{n}, \
                 outbox rows {} ({:?}), notify keys done {}/{n} (requests {}), \
                 dead letters orders {:?} stock {:?}, published {published:?}, kills {}, \
                 aborts {:?} of {planned_aborts:?}, nats restarts {}, terminations {}, \
                 unexpected exits {:?}, consumers {consumers:?}\n\
                 host logs in {}; their warnings and errors:\n{}",
                plan.backend,
                plan.bound,
                progress.orders,
                progress.stock,
                progress.outbox,
                outbox_rows(&db).await,
                receiver.done_keys().len(),
                receiver.count(),
                probe.dead_letters(ORDERS).await,
                probe.dead_letters(STOCK).await,
                chaos.kills,
                chaos.aborts,
                chaos.nats_restarts,
                chaos.terminations,
                chaos.unexpected_exits,
                logs.display(),
                log_digest(&logs)
            );
        }
    };
    let (resent, publish_time) = published.unwrap();

    // Clean shutdown of the survivors: their summaries complete the counts.
    for s in hosts.drain(..) {
        s.process.terminate(Duration::from_secs(20));
    }
    let stats = |handler: &str| {
        outputs
            .iter()
            .filter_map(|(log, out)| {
                handler_stats(handler, out).or_else(|| handler_stats(handler, log))
            })
            .fold(StatsSnapshot::default(), add_stats)
    };
    let (orders_stats, stock_stats) = (stats(ORDERS), stats(STOCK));
    let digest = log_digest(&logs);

    // What the receiver saw.
    let requests = receiver.requests();
    let answered_500 = requests.iter().filter(|r| r.status == 500).count();
    let done = receiver.done_keys();
    // Requests for a key already answered 2xx: calls sent again (a host
    // that died between the send and the delete), absorbed by the key.
    let mut answered_ok = BTreeSet::new();
    let mut repeated = 0;
    for r in &requests {
        if r.status == 200 && !answered_ok.insert(r.key.clone()) {
            repeated += 1;
        }
    }
    let accepted = stream_messages(&js, &accepted_stream).await;

    println!(
        "orders chaos {:?}: seed={SEED:#x} published={} (orders={} copies={} resent={}) \
         hosts={} kills={} aborts={:?} nats_restarts={} (consuming again after {:?}) \
         backend_terminations={} (backends={}) unexpected_exits={} | \
         stream {accepted_stream}: {} messages | notify: requests={} distinct_keys={} \
         answered_500={answered_500} duplicates_absorbed={repeated} | \
         receipt duplicates absorbed: orders={} stock={} (hosts' stats; a killed host counts up \
         to its last 2 s stats line) | orders: {orders_stats} | stock: {stock_stats} | \
         publish {publish_time:?}, settled {settled:?}, total {:?}",
        plan.backend,
        w.messages.len() + resent,
        plan.orders,
        w.duplicates,
        resent,
        plan.hosts,
        chaos.kills,
        chaos.aborts,
        chaos.nats_restarts,
        chaos.resumed_after,
        chaos.terminations,
        chaos.backends_terminated,
        chaos.unexpected_exits.len(),
        accepted.len(),
        requests.len(),
        done.len(),
        orders_stats.duplicates,
        stock_stats.duplicates,
        started.elapsed()
    );
    for e in &chaos.unexpected_exits {
        println!("chaos: unexpected exit: {e}");
    }
    println!("chaos: host warnings and errors:\n{digest}");

    // The effects: exact.
    let pool = db.pool().await;
    let orders_rows: BTreeMap<String, (String, i64)> =
        sqlx::query("SELECT order_id, sku, qty FROM orders")
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
    let orders_count = db.scalar("SELECT count(*) FROM orders").await;
    assert_eq!(orders_count, Some(n), "orders rows");
    assert!(
        orders_rows == expected,
        "orders rows differ from the orders placed (order, expected, actual): {:?}",
        differences(&expected, &orders_rows)
    );

    // One accepted message per order, with the relay's id and the order.
    assert_eq!(accepted.len(), plan.orders, "messages in {accepted_stream}");
    let info = js
        .get_stream(&accepted_stream)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .state;
    assert_eq!((info.messages, info.last_sequence), (n as u64, n as u64));
    let expected_accepted: BTreeMap<String, String> = accepted_ids
        .iter()
        .map(|(msg_id, order)| (msg_id.clone(), accepted_payload(order, &expected[order])))
        .collect();
    let got_accepted: BTreeMap<String, String> = accepted.into_iter().collect();
    assert_eq!(got_accepted.len(), plan.orders, "distinct Nats-Msg-Id");
    assert!(
        got_accepted == expected_accepted,
        "the accepted messages differ from one per order with the relay's id \
         (Nats-Msg-Id, expected, actual): {:?}",
        differences(&expected_accepted, &got_accepted)
    );

    let reservations: BTreeMap<String, (String, i64)> =
        sqlx::query("SELECT order_id, sku, qty FROM reservations")
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect();
    assert_eq!(reservations.len(), plan.orders, "reservations");
    assert!(
        reservations == expected,
        "reservations differ from the orders (order, expected, actual): {:?}",
        differences(&expected, &reservations)
    );

    let mut expected_stock: BTreeMap<String, i64> = (1..=SKUS)
        .map(|k| (format!("sku-{k}"), INITIAL_STOCK))
        .collect();
    for (sku, qty) in expected.values() {
        *expected_stock.get_mut(sku).unwrap() -= qty;
    }
    let stock: BTreeMap<String, i64> = sqlx::query("SELECT sku, available FROM stock")
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(stock, expected_stock, "stock per SKU");
    pool.close().await;

    // The calls: one key per order, each answered 2xx with its order; 500
    // to exactly the keys the hash picks, once each.
    assert_eq!(done.len(), plan.orders, "distinct notify keys answered 2xx");
    let expected_calls: BTreeMap<String, String> = notify_keys
        .iter()
        .map(|(key, order)| (key.clone(), accepted_payload(order, &expected[order])))
        .collect();
    let got_calls: BTreeMap<String, String> = done.into_iter().collect();
    assert!(
        got_calls == expected_calls,
        "the notify calls differ from one per order with the relay's key \
         (Idempotency-Key, expected, actual): {:?}",
        differences(&expected_calls, &got_calls)
    );
    assert_eq!(answered_500, failing_first, "requests answered 500");
    let distinct_requested: BTreeSet<&str> = requests.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(
        distinct_requested.len(),
        plan.orders,
        "distinct keys requested"
    );
    assert!(requests.iter().all(|r| r.path == "/notify"));
    assert_eq!(
        requests.len(),
        plan.orders + failing_first + repeated,
        "requests: one per order, one more per 500, the copies"
    );

    assert_eq!(db.scalar("SELECT count(*) FROM idem_outbox").await, Some(0));
    // The receipts: `orders`' are the order ids, `stock`'s the relay's ids
    // (both maps iterate sorted, as `receipt_ids` returns them).
    let got = db.receipt_ids(ORDERS).await;
    assert_eq!(got.len(), plan.orders, "orders receipts");
    assert!(
        got.iter().eq(expected.keys()),
        "orders receipts are not the order ids"
    );
    let got = db.receipt_ids(STOCK).await;
    assert_eq!(got.len(), plan.orders, "stock receipts");
    assert!(
        got.iter().eq(accepted_ids.keys()),
        "stock receipts are not the accepted messages' ids"
    );
    assert_eq!(db.dead_letters(ORDERS).await, vec![]);
    assert_eq!(db.dead_letters(STOCK).await, vec![]);

    // Every planned fault happened (the publisher waited for each).
    assert_eq!(chaos.kills, plan.kills_at.len(), "SIGKILLs");
    let mut reached: Vec<&str> = chaos.aborts.iter().map(|(_, a, _)| a.as_str()).collect();
    let mut planned = planned_aborts.clone();
    reached.sort();
    planned.sort();
    assert_eq!(reached, planned, "abort points reached");
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
    assert!(
        chaos.unexpected_exits.is_empty(),
        "hosts exited on their own: {:?}",
        chaos.unexpected_exits
    );
}

/// The payload `orders` publishes and `stock` sends for an order.
/// The guests serialize its fields in this order; ids and SKUs need no
/// escaping.
fn accepted_payload(order: &str, (sku, qty): &(String, i64)) -> String {
    format!(r#"{{"order_id":"{order}","sku":"{sku}","qty":{qty}}}"#)
}

/// The first few entries where two maps differ: (key, expected, actual).
fn differences<'a, V: PartialEq>(
    expected: &'a BTreeMap<String, V>,
    actual: &'a BTreeMap<String, V>,
) -> Vec<(&'a str, Option<&'a V>, Option<&'a V>)> {
    expected
        .keys()
        .chain(actual.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|k| expected.get(*k) != actual.get(*k))
        .take(5)
        .map(|k| (k.as_str(), expected.get(k), actual.get(k)))
        .collect()
}

/// `handler`'s last stats line in the file at `path` (the shutdown summary
/// `handler NAME: …` or the periodic `stats … handler=NAME`).
fn handler_stats(handler: &str, path: &Path) -> Option<StatsSnapshot> {
    let text = std::fs::read_to_string(path).ok()?;
    let (summary, periodic) = (format!("handler {handler}: "), format!("handler={handler}"));
    let mine: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&summary) || l.contains(&periodic))
        .collect();
    last_stats(&mine.join("\n"))
}

/// Every message of `stream` as (`Nats-Msg-Id`, payload), by sequence.
async fn stream_messages(
    js: &async_nats::jetstream::Context,
    stream: &str,
) -> Vec<(String, String)> {
    let stream = js.get_stream(stream).await.unwrap();
    let last = stream.get_info().await.unwrap().state.last_sequence;
    let mut out = Vec::new();
    for seq in 1..=last {
        let m = stream.get_raw_message(seq).await.unwrap();
        let id = m
            .headers
            .get("Nats-Msg-Id")
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default();
        out.push((id, String::from_utf8_lossy(&m.payload).to_string()));
    }
    out
}

/// The first outbox rows, for a failure message.
async fn outbox_rows(db: &TestDb) -> Vec<String> {
    let pool = db.pool().await;
    let rows = sqlx::query(
        "SELECT consumer, message_id, kind, target, attempts, last_error FROM idem_outbox \
         ORDER BY id LIMIT 5",
    )
    .fetch_all(&pool)
    .await
    .unwrap_or_default();
    pool.close().await;
    rows.iter()
        .map(|r| {
            format!(
                "{} {} {} {} attempts={} {:?}",
                r.get::<String, _>(0),
                r.get::<String, _>(1),
                r.get::<String, _>(2),
                r.get::<String, _>(3),
                r.get::<i64, _>(4),
                r.try_get::<Option<String>, _>(5).ok().flatten()
            )
        })
        .collect()
}
