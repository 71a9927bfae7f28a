//! Harness pieces for the chaos and broker-restart tests: a deterministic
//! credit workload (with duplicate publishes and poison messages), host
//! processes that can be SIGKILLed and restarted, publishing that survives a
//! broker restart, consumer and database probes, and reading the hosts'
//! stats lines back from their output.

use crate::{Backend, TestDb};
use async_nats::jetstream;
use idem::metrics::StatsSnapshot;
use sqlx::Row;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// xorshift64: a small deterministic generator, so a seed names one run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// The messages of a credit run, in publish order, and what the input asks for.
pub struct Workload {
    /// Payloads in publish order (duplicates and poison included).
    pub messages: Vec<String>,
    /// Credit events (distinct `event_id`s).
    pub events: usize,
    /// Of `messages`, copies of an event already in the list.
    pub duplicates: usize,
    /// Message ids of the poison messages the input asks to be dead-lettered
    /// (`None`: a message with no identity at all), sorted.
    pub poison: Vec<Option<String>>,
}

impl Workload {
    /// `events` credit events `evt_NNNNNN` over accounts `1..=accounts`
    /// (amounts 1..=1000), `dup_percent` of them published a second time,
    /// plus `poison` events the credit handler rejects (`account_id` is not a
    /// number) and one message without an `event_id`; all shuffled by `seed`.
    pub fn credit(
        seed: u64,
        events: usize,
        accounts: u64,
        dup_percent: u64,
        poison: usize,
    ) -> Self {
        let mut rng = Rng::new(seed);
        let mut messages = Vec::with_capacity(events + events / 5 + poison + 1);
        for i in 0..events {
            let account = rng.between(1, accounts) as i64;
            let amount = rng.between(1, 1000) as i64;
            messages.push(crate::credit(&format!("evt_{i:06}"), account, amount));
        }
        let mut duplicates = 0;
        for i in 0..events {
            if rng.below(100) < dup_percent {
                messages.push(messages[i].clone());
                duplicates += 1;
            }
        }
        let mut ids = Vec::new();
        for k in 0..poison {
            let id = format!("poison_{k:02}");
            messages.push(
                serde_json::json!({"event_id": id, "account_id": "not-a-number", "amount": 1})
                    .to_string(),
            );
            ids.push(Some(id));
        }
        messages.push(serde_json::json!({"account_id": 1, "amount": 1}).to_string());
        ids.push(None);
        ids.sort();
        // Fisher-Yates: duplicates land anywhere, even before their original.
        for i in (1..messages.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            messages.swap(i, j);
        }
        Workload {
            messages,
            events,
            duplicates,
            poison: ids,
        }
    }

    /// How many of `messages`, from the first, it takes to hold `n`
    /// distinct credit events (an `event_id` with a numeric account and
    /// amount); all of them when there are fewer. A fault planned at `n`
    /// receipts is sure to come once this prefix is published.
    pub fn prefix_holding(&self, n: usize) -> usize {
        let mut seen = BTreeSet::new();
        for (i, m) in self.messages.iter().enumerate() {
            if seen.len() >= n {
                return i;
            }
            let v: serde_json::Value = serde_json::from_str(m).unwrap();
            if let (Some(id), Some(_), Some(_)) = (
                v["event_id"].as_str(),
                v["account_id"].as_i64(),
                v["amount"].as_i64(),
            ) {
                seen.insert(id.to_string());
            }
        }
        self.messages.len()
    }

    /// The expected state, computed from the payloads alone (not from the
    /// generator): each distinct `event_id` with a numeric account and
    /// amount credits once. Returns (balances by account, sorted event ids).
    pub fn expected(&self) -> (BTreeMap<i64, i64>, Vec<String>) {
        let mut seen = BTreeSet::new();
        let mut balances = BTreeMap::new();
        for m in &self.messages {
            let v: serde_json::Value = serde_json::from_str(m).unwrap();
            let (Some(id), Some(account), Some(amount)) = (
                v["event_id"].as_str(),
                v["account_id"].as_i64(),
                v["amount"].as_i64(),
            ) else {
                continue;
            };
            if seen.insert(id.to_string()) {
                *balances.entry(account).or_insert(0) += amount;
            }
        }
        (balances, seen.into_iter().collect())
    }
}

/// Publishes `messages` on `subject`, up to `window` unacknowledged at once,
/// without `Nats-Msg-Id` (the broker must not dedupe: idem's receipts do).
/// A publish whose ack fails (broker restarting) is sent again until
/// `deadline`; such a retry may store a second copy, which is counted and
/// returned (harmless: it is one more duplicate for the receipts).
pub async fn publish_all(
    js: &jetstream::Context,
    subject: &str,
    messages: &[String],
    window: usize,
    deadline: Instant,
) -> usize {
    let mut resent = 0;
    let mut todo: Vec<&String> = messages.iter().collect();
    while !todo.is_empty() {
        assert!(
            Instant::now() < deadline,
            "publishing did not finish: {} messages left",
            todo.len()
        );
        let mut failed = Vec::new();
        for chunk in todo.chunks(window.max(1)) {
            let mut acks = Vec::with_capacity(chunk.len());
            for m in chunk {
                acks.push((
                    *m,
                    js.publish(subject.to_string(), m.to_string().into()).await,
                ));
            }
            for (m, ack) in acks {
                let ok = match ack {
                    Ok(fut) => fut.await.is_ok(),
                    Err(_) => false,
                };
                if !ok {
                    failed.push(m);
                }
            }
        }
        if !failed.is_empty() {
            resent += failed.len();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        todo = failed;
    }
    resent
}

/// Publishes one message with `Nats-Msg-Id: msg_id`, retrying until the
/// broker acknowledges it (the stream's duplicate window drops a retry
/// whose first attempt was stored after all).
pub async fn publish_with_id_retrying(
    js: &jetstream::Context,
    subject: &str,
    payload: &str,
    msg_id: &str,
    deadline: Instant,
) {
    loop {
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", msg_id);
        let r = match js
            .publish_with_headers(subject.to_string(), h, payload.to_string().into())
            .await
        {
            Ok(fut) => fut.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match r {
            Ok(()) => return,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "publish of {msg_id} kept failing: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The durable consumer's info, or `None` while the broker does not answer.
pub async fn consumer_info(
    js: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Option<jetstream::consumer::Info> {
    let s = js.get_stream(stream).await.ok()?;
    let mut c: jetstream::consumer::Consumer<jetstream::consumer::pull::Config> =
        s.get_consumer(consumer).await.ok()?;
    c.info().await.ok().cloned()
}

/// One-line summary of a consumer's info.
pub fn describe_consumer(info: &jetstream::consumer::Info) -> String {
    format!(
        "deliveries(consumer_seq)={} last_stream_seq={} ack_floor_stream_seq={} num_pending={} num_ack_pending={} num_redelivered={} num_waiting={}",
        info.delivered.consumer_sequence,
        info.delivered.stream_sequence,
        info.ack_floor.stream_sequence,
        info.num_pending,
        info.num_ack_pending,
        info.num_redelivered,
        info.num_waiting
    )
}

/// Database probes that tolerate a failing connection (a terminated
/// backend, a busy SQLite file): a fresh connection per call, errors as `Err`.
pub struct Probe {
    url: String,
}

impl Probe {
    pub fn new(db: &TestDb) -> Self {
        sqlx::any::install_default_drivers();
        Probe {
            url: db.url.clone(),
        }
    }

    async fn pool(&self) -> Result<sqlx::AnyPool, sqlx::Error> {
        sqlx::pool::PoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&self.url)
            .await
    }

    /// One integer from `sql`.
    pub async fn scalar(&self, sql: &str) -> Result<i64, sqlx::Error> {
        let pool = self.pool().await?;
        let r = sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_one(&pool)
            .await
            .and_then(|row| row.try_get::<i64, _>(0));
        pool.close().await;
        r
    }

    /// Receipts of `consumer`.
    pub async fn receipts(&self, consumer: &str) -> Result<i64, sqlx::Error> {
        self.scalar(&format!(
            "SELECT count(*) FROM idem_receipts WHERE consumer = '{consumer}'"
        ))
        .await
    }

    /// Dead letters of `consumer`.
    pub async fn dead_letters(&self, consumer: &str) -> Result<i64, sqlx::Error> {
        self.scalar(&format!(
            "SELECT count(*) FROM idem_dead_letters WHERE consumer = '{consumer}'"
        ))
        .await
    }

    /// Every row of `accounts`, by account.
    pub async fn balances(&self) -> Result<BTreeMap<i64, i64>, sqlx::Error> {
        let pool = self.pool().await?;
        let rows = sqlx::query("SELECT account_id, balance FROM accounts ORDER BY account_id")
            .fetch_all(&pool)
            .await;
        pool.close().await;
        rows?
            .iter()
            .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<i64, _>(1)?)))
            .collect()
    }

    /// Terminates every other backend connected to this PostgreSQL
    /// database (the hosts' connections); returns how many.
    pub async fn terminate_backends(&self, db: &TestDb) -> Result<i64, sqlx::Error> {
        assert_eq!(db.backend, Backend::Postgres);
        self.scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t",
        )
        .await
    }
}

/// Sums counters of several hosts.
pub fn add_stats(a: StatsSnapshot, b: StatsSnapshot) -> StatsSnapshot {
    StatsSnapshot {
        delivered: a.delivered + b.delivered,
        processed: a.processed + b.processed,
        duplicates: a.duplicates + b.duplicates,
        retried: a.retried + b.retried,
        dead_lettered: a.dead_lettered + b.dead_lettered,
        traps: a.traps + b.traps,
        ack_failures: a.ack_failures + b.ack_failures,
        log_bytes_dropped: a.log_bytes_dropped + b.log_bytes_dropped,
        db_pauses: a.db_pauses + b.db_pauses,
        receipts_pruned: a.receipts_pruned + b.receipts_pruned,
        unique_violations: a.unique_violations + b.unique_violations,
        batched: a.batched + b.batched,
        receipt_lookups: a.receipt_lookups + b.receipt_lookups,
        duplicates_looked_up: a.duplicates_looked_up + b.duplicates_looked_up,
    }
}

/// The last stats line in `text` (the periodic `stats delivered=…` log line
/// or the `handler NAME: delivered=…` summary at shutdown), parsed.
pub fn last_stats(text: &str) -> Option<StatsSnapshot> {
    let line = text.lines().rev().find(|l| l.contains(" delivered="))?;
    let mut s = StatsSnapshot::default();
    for tok in line.split_whitespace() {
        let Some((k, v)) = tok.split_once('=') else {
            continue;
        };
        let Ok(v) = v.parse::<u64>() else { continue };
        match k {
            "delivered" => s.delivered = v,
            "processed" => s.processed = v,
            "duplicates" => s.duplicates = v,
            "retried" => s.retried = v,
            "dead_lettered" => s.dead_lettered = v,
            "traps" => s.traps = v,
            "ack_failures" => s.ack_failures = v,
            "log_bytes_dropped" => s.log_bytes_dropped = v,
            "receipts_pruned" => s.receipts_pruned = v,
            "unique_violations" => s.unique_violations = v,
            "batched" => s.batched = v,
            "receipt_lookups" => s.receipt_lookups = v,
            "duplicates_looked_up" => s.duplicates_looked_up = v,
            _ => {}
        }
    }
    Some(s)
}

/// An `idem run` process (the test host binary), its stderr and stdout in
/// files. Killed with SIGKILL when dropped, so a failing test leaves no
/// process behind.
pub struct HostProcess {
    child: Option<Child>,
    /// Its stderr (the log).
    pub log: PathBuf,
    /// Its stdout (the shutdown summary).
    pub out: PathBuf,
}

/// How a host process ended, and its last stats line, if any.
pub struct Ended {
    pub status: Option<ExitStatus>,
    /// From the shutdown summary (after SIGTERM) or the last periodic stats
    /// line (after SIGKILL: up to 2 s stale, absent if it ran < 2 s).
    pub stats: Option<StatsSnapshot>,
}

impl HostProcess {
    /// Starts `bin run --config config` with `IDEM_FAULT=fault` (if not
    /// empty); output goes to `dir/NAME.log` and `dir/NAME.out`.
    pub fn spawn(bin: &Path, config: &Path, fault: &str, dir: &Path, name: &str) -> Self {
        let fault_env = [("IDEM_FAULT", fault)];
        let env: &[(&str, &str)] = if fault.is_empty() { &[] } else { &fault_env };
        Self::spawn_with_env(bin, config, env, dir, name)
    }

    /// [`HostProcess::spawn`] with the environment variables `env` set
    /// (`IDEM_FAULT` is removed unless it is one of them).
    pub fn spawn_with_env(
        bin: &Path,
        config: &Path,
        env: &[(&str, &str)],
        dir: &Path,
        name: &str,
    ) -> Self {
        let log = dir.join(format!("{name}.log"));
        let out = dir.join(format!("{name}.out"));
        let mut cmd = Command::new(bin);
        cmd.args(["run", "--config"])
            .arg(config)
            .env(
                "RUST_LOG",
                std::env::var("IDEM_CHAOS_LOG")
                    .unwrap_or_else(|_| "info,async_nats=warn,idem::service=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&log).unwrap());
        cmd.env_remove("IDEM_FAULT");
        cmd.envs(env.iter().copied());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        HostProcess {
            child: Some(child),
            log,
            out,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// `Some(status)` if the process has exited on its own.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL, then reap; stats from the last periodic line of the log.
    pub fn sigkill(&mut self) -> Ended {
        let status = self.child.take().and_then(|mut c| {
            let _ = c.kill();
            c.wait().ok()
        });
        Ended {
            status,
            stats: last_stats(&std::fs::read_to_string(&self.log).unwrap_or_default()),
        }
    }

    /// SIGTERM (clean shutdown: messages in flight finish), waiting up to
    /// `patience`, then SIGKILL. Stats from the shutdown summary on stdout
    /// (else the last periodic line).
    pub fn terminate(self, patience: Duration) -> Ended {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        self.wait_exit(patience)
    }

    /// Waits up to `patience` for the host to exit by itself (after a
    /// signal the test sent: a second SIGTERM would make it exit at once),
    /// then SIGKILL. Stats as [`HostProcess::terminate`].
    pub fn wait_exit(mut self, patience: Duration) -> Ended {
        let mut status = None;
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + patience;
            status = loop {
                if let Ok(Some(s)) = c.try_wait() {
                    break Some(s);
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    break c.wait().ok();
                }
                std::thread::sleep(Duration::from_millis(20));
            };
        }
        let stats = last_stats(&std::fs::read_to_string(&self.out).unwrap_or_default())
            .or_else(|| last_stats(&std::fs::read_to_string(&self.log).unwrap_or_default()));
        Ended { status, stats }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The WARN and ERROR lines of every `*.log` in `dir`, grouped by their text
/// up to the first field, most frequent first (for failure reports).
pub fn log_digest(dir: &Path) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.extension().is_none_or(|e| e != "log") {
            continue;
        }
        for line in std::fs::read_to_string(&p).unwrap_or_default().lines() {
            let Some(pos) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else {
                continue;
            };
            let text: String = line[pos..]
                .split(['=', '"'])
                .next()
                .unwrap_or_default()
                .chars()
                .take(160)
                .collect();
            *counts.entry(text).or_insert(0) += 1;
        }
    }
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    v.iter()
        .take(25)
        .map(|(t, n)| format!("{n:>7} x {t}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_is_deterministic_and_expected_ignores_poison_and_duplicates() {
        let a = Workload::credit(7, 100, 5, 10, 3);
        let b = Workload::credit(7, 100, 5, 10, 3);
        assert_eq!(a.messages, b.messages);
        assert_eq!(a.messages.len(), 100 + a.duplicates + 3 + 1);
        assert_eq!(a.poison.len(), 4);
        let (balances, ids) = a.expected();
        assert_eq!(ids.len(), 100);
        assert!(balances.keys().all(|k| (1..=5).contains(k)));
    }

    #[test]
    fn stats_lines_parse() {
        let log = "2026 INFO idem::service: stats delivered=5 processed=4 duplicates=1 retried=0 dead_lettered=0 traps=0 ack_failures=0 log_bytes_dropped=0 receipts_pruned=0 handler=credit-projector\n";
        let s = last_stats(log).unwrap();
        assert_eq!((s.delivered, s.processed, s.duplicates), (5, 4, 1));
        let out = "handler credit-projector: delivered=9 processed=8 duplicates=1 retried=2 dead_lettered=1 traps=0 ack_failures=0 log_bytes_dropped=0 receipts_pruned=0\n";
        let s = last_stats(out).unwrap();
        assert_eq!((s.delivered, s.retried, s.dead_lettered), (9, 2, 1));
    }
}
