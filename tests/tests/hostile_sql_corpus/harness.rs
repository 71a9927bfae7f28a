//! The arena: [`CorpusHost`], one host process with its broker and
//! database and everything the checks expect of them so far; the tables
//! it starts with, how a group is published and waited for, the settings
//! reader, the verdict-cache run and the host's own counters at the end.

use crate::checks::{db_files, ended_as, fingerprint, shorten, summary_stats};
use crate::outcome::{Ctx, Group, Hostile, Outcome, q};
use idem_tests::chaos::HostProcess;
use idem_tests::*;
use serde_json::{Value, json};
use sqlx::Row;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The value no guest may read or change.
pub(crate) const CANARY: &str = "CANARY-5f1c2e9a";
const HOSTILE: &str = "hostile";
pub(crate) const WELL: &str = "well-behaved";
/// The well-behaved handler's account.
const WELL_ACCOUNT: i64 = 900;
/// Case `i`'s follow-up credit goes to account `FOLLOW_UP + i`, amount `i + 1`.
const FOLLOW_UP: i64 = 100_000;
/// Account 1 starts at 10; cases that would add 1000 to it must not.
const ACCOUNT_1: i64 = 10;
/// The host's peak resident memory must stay below this.
const MEMORY_LIMIT_KIB: u64 = 1 << 20;
/// The hostile handler's deadline (a statement that never ends traps here).
pub(crate) const DEADLINE: &str = "2s";

/// A statement whose results depend on session settings, for the reader.
fn reader_sql(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => {
            "SELECT CAST(DATE '2020-01-02' AS text) AS d, CAST(CAST('\\x41' AS bytea) AS text) AS b, \
             CAST(TIMESTAMPTZ '2020-01-02 03:04:05+00' AS text) AS t, \
             CAST(INTERVAL '1 day 2 hours' AS text) AS i, CAST(CAST(0.1 AS float8) AS text) AS f, \
             CAST(CAST(12345.678 AS numeric(10, 3)) AS text) AS n"
        }
        Backend::Sqlite => "SELECT 'a' LIKE 'A' AS l, CAST(0.1 AS TEXT) AS f",
    }
}

fn setup_sql(backend: Backend) -> Vec<String> {
    let mut s: Vec<String> = vec![
        "CREATE TABLE accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)".into(),
        format!("INSERT INTO accounts (account_id, balance) VALUES (1, {ACCOUNT_1}), (500, 5000)"),
        "CREATE TABLE secrets (id BIGINT PRIMARY KEY, v TEXT NOT NULL)".into(),
        format!("INSERT INTO secrets (id, v) VALUES (1, '{CANARY}')"),
        "CREATE VIEW secrets_view AS SELECT id, v FROM secrets".into(),
        "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT NOT NULL)".into(),
    ];
    match backend {
        Backend::Postgres => s.extend([
            "CREATE TABLE ledger (id BIGINT PRIMARY KEY, amount BIGINT NOT NULL)".into(),
            "CREATE FUNCTION notes_leak() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN UPDATE secrets SET v = 'pwned by trigger'; RETURN NEW; END $$"
                .into(),
            "CREATE TRIGGER notes_leak AFTER INSERT ON notes FOR EACH ROW EXECUTE FUNCTION notes_leak()"
                .into(),
            "CREATE FUNCTION ledger_check() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF NEW.amount < 0 THEN RAISE EXCEPTION 'negative'; END IF; RETURN NEW; END $$"
                .into(),
            "CREATE TRIGGER ledger_check BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION ledger_check()"
                .into(),
        ]),
        Backend::Sqlite => s.extend([
            "CREATE TABLE ledger (id INTEGER PRIMARY KEY ON CONFLICT ROLLBACK, amount BIGINT NOT NULL)"
                .into(),
            "CREATE TRIGGER notes_leak AFTER INSERT ON notes BEGIN UPDATE secrets SET v = 'pwned by trigger'; END"
                .into(),
            "CREATE TRIGGER ledger_check BEFORE INSERT ON ledger WHEN NEW.amount < 0 \
             BEGIN SELECT RAISE(ROLLBACK, 'negative'); END"
                .into(),
        ]),
    }
    s
}

/// One host process with its broker and database, and everything the
/// checks expect of them so far.
pub(crate) struct CorpusHost {
    pub(crate) backend: Backend,
    pub(crate) host: HostProcess,
    js: async_nats::jetstream::Context,
    pub(crate) db: TestDb,
    /// The SQLite database's directory (empty on PostgreSQL).
    pub(crate) db_dir: PathBuf,
    /// A path prefix in /tmp that no file may start with.
    pub(crate) tmp: String,
    /// The config file and the host's log and output.
    dir: tempfile::TempDir,
    /// [`fingerprint`] after the warm-up.
    pub(crate) baseline: String,
    /// SQLite: the files next to the database after the warm-up.
    pub(crate) files: BTreeSet<String>,
    /// PostgreSQL: the sessions' `application_name`s after the warm-up.
    pub(crate) app_names: BTreeSet<String>,
    /// Cases published so far (case `i` is message `cNNNN`, its follow-up
    /// `fNNNN`).
    next_case: usize,
    /// The hostile handler's receipts and dead letters expected.
    pub(crate) served: BTreeSet<String>,
    pub(crate) dead: BTreeSet<String>,
    /// Dead letters that were traps.
    traps: u64,
    /// Corpus cases (not the settings readers) served and dead-lettered.
    cases_served: usize,
    cases_dead: usize,
    /// Credits published to the well-behaved handler (credit `i` adds `i`).
    pub(crate) well: i64,
    /// Every row `accounts` must hold.
    pub(crate) accounts: BTreeMap<i64, i64>,
    /// What the checks found, reported together at the end.
    problems: Vec<String>,
    /// The host's peak resident memory must stay below this (KiB).
    pub(crate) memory_limit_kib: u64,
    /// After each group the host's resident memory must be back below this
    /// (KiB): nothing a guest made the host hold is kept.
    pub(crate) resident_limit_kib: u64,
    _nats: Nats,
}

impl CorpusHost {
    /// Starts the host; the hostile handler's deadline is `deadline`;
    /// `setup` runs after [`setup_sql`].
    pub(crate) async fn start(backend: Backend, deadline: &str, setup: &[&str]) -> Self {
        let nats = Nats::start();
        let db = TestDb::new(backend).await;
        for sql in setup_sql(backend) {
            db.execute(&sql).await;
        }
        for sql in setup {
            db.execute(sql).await;
        }
        let db_dir = match backend {
            Backend::Sqlite => PathBuf::from(db.url.strip_prefix("sqlite://").unwrap())
                .parent()
                .unwrap()
                .to_path_buf(),
            Backend::Postgres => PathBuf::new(),
        };
        create_stream(&nats, "ACCOUNTS", &["accounts.>"]).await;
        let dir = tempfile::tempdir().unwrap();
        let mut hostile = HandlerSpec::new(HOSTILE, "behave");
        hostile.subjects = vec!["accounts.hostile".into()];
        hostile.tables = vec!["accounts".into(), "notes".into(), "ledger".into()];
        hostile.extra = format!(
            "max_deliver = 1\nretry_delay = \"100ms\"\ndeadline = \"{deadline}\"\nmax_statements = 5000\nmax_param_kib = 512\n"
        );
        let mut well = HandlerSpec::new(WELL, "credit");
        // Hostile statements can hold SQLite's write lock for their whole
        // deadline: small pulls and a long ack_wait keep a well-behaved
        // message from waiting in the client past ack_wait (a redelivery,
        // then counted as a duplicate), however slow the machine.
        well.extra = "ack_wait = \"120s\"\npull_batch = 2\n".into();
        let cfg = write_config(dir.path(), &nats, &db, &[hostile, well]);
        let host = HostProcess::spawn(
            Path::new(env!("CARGO_BIN_EXE_idem-test-host")),
            &cfg,
            "",
            dir.path(),
            "host",
        );
        let js = nats.jetstream().await;
        let tmp = format!(
            "/tmp/idem-corpus-{}-{}",
            std::process::id(),
            match backend {
                Backend::Postgres => "pg",
                Backend::Sqlite => "sqlite",
            }
        );
        let mut accounts = BTreeMap::new();
        accounts.insert(1, ACCOUNT_1);
        accounts.insert(500, 5000);
        let mut a = CorpusHost {
            backend,
            host,
            js,
            db,
            db_dir,
            tmp,
            dir,
            baseline: String::new(),
            files: BTreeSet::new(),
            app_names: BTreeSet::new(),
            next_case: 0,
            served: BTreeSet::new(),
            dead: BTreeSet::new(),
            traps: 0,
            cases_served: 0,
            cases_dead: 0,
            well: 0,
            accounts,
            problems: Vec::new(),
            memory_limit_kib: MEMORY_LIMIT_KIB,
            resident_limit_kib: MEMORY_LIMIT_KIB,
            _nats: nats,
        };
        // Warm up: one message on each handler, so the host has set up its
        // tables, roles and connections before the baseline is taken.
        a.run_group(&Group::new("warm-up", &a.ctx())).await;
        a.baseline = fingerprint(&a.db).await;
        if backend == Backend::Sqlite {
            a.files = db_files(&a.db_dir);
        } else {
            a.app_names = a.application_names().await;
        }
        a
    }

    pub(crate) fn ctx(&self) -> Ctx {
        Ctx {
            backend: self.backend,
            dir: self.db_dir.display().to_string(),
            tmp: self.tmp.clone(),
        }
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.host.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub(crate) async fn application_names(&self) -> BTreeSet<String> {
        let pool = self.db.pool().await;
        let rows = sqlx::query(
            "SELECT coalesce(application_name, '') FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        rows.iter().map(|r| r.get::<String, _>(0)).collect()
    }

    /// What a fresh session reads for [`reader_sql`], as the guest's reason.
    async fn fresh_reading(&self) -> Value {
        let pool = self.db.pool().await;
        let row = sqlx::query(reader_sql(self.backend))
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        let values: Vec<Value> = (0..row.len())
            .map(|i| match row.try_get::<String, _>(i) {
                Ok(s) => json!(s),
                Err(_) => json!(row.get::<i64, _>(i)),
            })
            .collect();
        json!([values])
    }

    async fn publish_hostile(&self, p: &Value) {
        publish(&self.js, "accounts.hostile", &p.to_string(), &[]).await;
    }

    /// Publishes `group`'s cases, each followed by a credit on the same
    /// handler and every fifth by a credit on the well-behaved one, waits
    /// until all are settled, then checks every case and the effects.
    pub(crate) async fn run_group(&mut self, group: &Group) {
        let filter = std::env::var("IDEM_CORPUS_CASES").unwrap_or_default();
        let mut cases: Vec<&Hostile> = group
            .cases
            .iter()
            .filter(|c| {
                filter.is_empty()
                    || c.name.contains(&filter)
                    || c.payload.to_string().contains(&filter)
            })
            .collect();
        let reader = Hostile {
            name: format!("{}/settings-reader", group.name),
            payload: q(reader_sql(self.backend)),
            outcome: Outcome::Rows(self.fresh_reading().await),
            effects: Vec::new(),
        };
        cases.push(&reader);
        let started = Instant::now();
        let mut ids = Vec::new();
        for (k, case) in cases.iter().enumerate() {
            let i = self.next_case;
            self.next_case += 1;
            let id = format!("c{i:04}");
            let mut p = case.payload.clone();
            p["event_id"] = json!(id);
            self.publish_hostile(&p).await;
            let follow = json!({"op": "credit", "event_id": format!("f{i:04}"),
                                "account_id": FOLLOW_UP + i as i64, "amount": i as i64 + 1});
            self.publish_hostile(&follow).await;
            if k % 5 == 0 {
                self.well += 1;
                let c = credit(&format!("w{:04}", self.well), WELL_ACCOUNT, self.well);
                publish(&self.js, "accounts.credit", &c, &[]).await;
            }
            ids.push((id, i, *case));
        }
        // Wait until every message is settled.
        let want_hostile = (self.served.len() + self.dead.len() + 2 * cases.len()) as i64;
        let want_well = self.well;
        // Patience is judged on progress, not on the clock: a loaded machine
        // settles slowly, a stuck host settles nothing. The group fails when
        // no message settles for `patience` (a trap can hold a message for
        // its deadline and retry delay).
        let patience =
            Duration::from_secs(60) + Duration::from_millis(2500) * self.count_traps(&cases);
        let mut last = (-1, -1);
        let mut stalled_since = Instant::now();
        loop {
            let (settled, well) = self.settled().await.unwrap_or((0, 0));
            if settled >= want_hostile && well >= want_well {
                break;
            }
            if (settled, well) != last {
                last = (settled, well);
                stalled_since = Instant::now();
            }
            if let Some(status) = self.host.exited() {
                panic!(
                    "{}: the host exited ({status}) during group {}; log:\n{}",
                    self.label(),
                    group.name,
                    self.log_tail()
                );
            }
            if stalled_since.elapsed() > patience {
                panic!(
                    "{}: group {} settled nothing for {patience:?} after {:?} ({settled} of \
                     {want_hostile} hostile, {well} of {want_well} well-behaved); log:\n{}",
                    self.label(),
                    group.name,
                    started.elapsed(),
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let elapsed = started.elapsed();
        // Each case: its own outcome.
        let receipts: BTreeSet<String> = self.db.receipt_ids(HOSTILE).await.into_iter().collect();
        let dead_letters: BTreeMap<String, String> = self
            .db
            .dead_letters(HOSTILE)
            .await
            .into_iter()
            .map(|(id, r)| (id.unwrap_or_default(), r))
            .collect();
        for (id, i, case) in &ids {
            let receipt = receipts.contains(id);
            let dead = dead_letters.get(id).map(String::as_str);
            if !ended_as(&case.outcome, receipt, dead) {
                self.problems.push(format!(
                    "{} {}: expected {:?}, got receipt={receipt} dead letter={:?}; payload {}",
                    self.label(),
                    case.name,
                    case.outcome,
                    dead.map(|r| shorten(r, 300)),
                    shorten(&case.payload.to_string(), 300)
                ));
            }
            if !case.name.ends_with("/settings-reader") {
                if receipt {
                    self.cases_served += 1;
                } else {
                    self.cases_dead += 1;
                }
            }
            if receipt {
                self.served.insert(id.clone());
                for (account, amount) in &case.effects {
                    *self.accounts.entry(*account).or_insert(0) += amount;
                }
            } else {
                self.dead.insert(id.clone());
                if dead.is_some_and(|r| r.starts_with("trap: ")) {
                    self.traps += 1;
                }
            }
            self.served.insert(format!("f{i:04}"));
            self.accounts.insert(FOLLOW_UP + *i as i64, *i as i64 + 1);
        }
        if self.well > 0 {
            self.accounts
                .insert(WELL_ACCOUNT, (1..=self.well).sum::<i64>());
        }
        self.check_effects(group.name, &receipts, &dead_letters)
            .await;
        let (hwm, rss) = process_memory_kib(self.host.pid()).unwrap_or((0, 0));
        eprintln!(
            "{} {:<10} {:>3} cases settled in {:>6.2?}; host VmHWM {} MiB, VmRSS {} MiB",
            self.label(),
            group.name,
            cases.len(),
            elapsed,
            hwm / 1024,
            rss / 1024
        );
    }

    /// Hostile messages settled (receipts plus dead letters) and
    /// well-behaved receipts; `None` until the host has made its tables.
    async fn settled(&self) -> Option<(i64, i64)> {
        let pool = self.db.pool().await;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM idem_receipts WHERE consumer = '{HOSTILE}') \
             + (SELECT count(*) FROM idem_dead_letters WHERE consumer = '{HOSTILE}'), \
             (SELECT count(*) FROM idem_receipts WHERE consumer = '{WELL}')"
        )))
        .fetch_one(&pool)
        .await;
        pool.close().await;
        let row = row.ok()?;
        Some((row.get(0), row.get(1)))
    }

    fn count_traps(&self, cases: &[&Hostile]) -> u32 {
        cases
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Trap))
            .count() as u32
    }

    pub(crate) fn label(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }

    pub(crate) fn problem(&mut self, group: &str, what: String) {
        self.problems
            .push(format!("{} after group {group}: {what}", self.label()));
    }

    /// Stops the host and checks its own counters.
    pub(crate) fn finish(mut self) {
        let label = self.label();
        let out = self.dir.path().join("host.out");
        let ended = self.host.terminate(Duration::from_secs(20));
        let hostile = summary_stats(&out, HOSTILE).unwrap_or_default();
        let well = summary_stats(&out, WELL).unwrap_or_default();
        let processed = self.served.len();
        let dead = self.dead.len();
        let want_hostile = format!(
            "processed={processed} duplicates=0 retried=0 dead_lettered={dead} traps={}",
            self.traps
        );
        if !hostile.contains(&want_hostile) {
            self.problems.push(format!(
                "{}: hostile stats `{hostile}`, want `{want_hostile}` (status {:?})",
                label, ended.status
            ));
        }
        let want_well = format!(
            "processed={} duplicates=0 retried=0 dead_lettered=0 traps=0",
            self.well
        );
        if !well.contains(&want_well) {
            self.problems.push(format!(
                "{}: well-behaved stats `{well}`, want `{want_well}`",
                label
            ));
        }
        eprintln!(
            "{label}: {} cases served, {} dead-lettered ({} traps)\n{label} hostile: {hostile}\n\
             {label} well-behaved: {well}",
            self.cases_served, self.cases_dead, self.traps
        );
        assert!(
            self.problems.is_empty(),
            "{} problem(s):\n{}",
            self.problems.len(),
            self.problems.join("\n")
        );
    }
}

impl CorpusHost {
    /// Many distinct statement texts: the guard's verdict cache is bounded
    /// (entries and bytes), so the host's memory does not grow with them.
    pub(crate) async fn verdict_cache(&mut self) {
        let filter = std::env::var("IDEM_CORPUS_CASES").unwrap_or_default();
        if !filter.is_empty() && !"verdict-cache/distinct-texts".contains(&filter) {
            return;
        }
        let (messages, per_message) = match self.backend {
            Backend::Sqlite => (100, 200),
            Backend::Postgres => (100, 200),
        };
        let pad = 16_000;
        let mut g = Group::new("verdict-cache", &self.ctx());
        for m in 0..messages {
            g.add(
                &format!("distinct-texts-{m}"),
                json!({"op": "many-texts", "count": per_message, "start": m * per_message, "pad": pad}),
                Outcome::Served,
            );
        }
        let before = process_memory_kib(self.host.pid()).expect("host memory");
        self.run_group(&g).await;
        let after = process_memory_kib(self.host.pid()).expect("host memory");
        eprintln!(
            "{} verdict cache: {} texts of {pad} bytes; VmRSS {} -> {} MiB, VmHWM {} -> {} MiB",
            self.label(),
            messages * per_message,
            before.1 / 1024,
            after.1 / 1024,
            before.0 / 1024,
            after.0 / 1024
        );
        if after.1 > before.1 + 128 * 1024 {
            self.problem(
                "verdict-cache",
                format!(
                    "host VmRSS grew from {} to {} KiB and stayed",
                    before.1, after.1
                ),
            );
        }
    }
}
