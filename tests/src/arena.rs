//! The arena: a host with a hostile handler beside a well-behaved one, to
//! show that what the hostile guest does costs it alone.

use crate::*;
use idem::metrics::StatsSnapshot;
use idem::service::Summary;
use std::time::{Duration, Instant};

/// The hostile-guest arena: one host running a hostile handler and
/// a well-behaved one side by side on stream `ACCOUNTS` (`accounts.>`).
///
/// - `hostile`: the `behave` guest on `accounts.hostile`, granted `accounts`
///   only, `retry_delay = "100ms"` plus the test's extra TOML lines;
/// - `well-behaved`: the `credit` guest on `accounts.credit`, defaults.
///
/// [`Arena::run`] surrounds the hostile messages with well-behaved traffic
/// and checks that the well-behaved handler was served exactly.
pub struct Arena {
    // Dropped in this order: the host stops before its broker and database go.
    pub host: RunningHost,
    pub js: async_nats::jetstream::Context,
    pub nats: Nats,
    pub db: TestDb,
    _dir: tempfile::TempDir,
}

/// What [`Arena::run`] observed of the hostile handler.
pub struct ArenaRun {
    /// The hostile handler's counters once every hostile message was settled.
    pub stats: StatsSnapshot,
    /// (message_id, reason) of the hostile handler's dead letters, in order.
    pub dead_letters: Vec<(Option<String>, String)>,
    /// From the first hostile publish until everything was settled.
    pub elapsed: Duration,
}

impl Arena {
    /// The well-behaved handler's account.
    pub const WELL_ACCOUNT: i64 = 900;
    /// The account of the `credit` op [`Arena::run`] sends the hostile handler last.
    pub const HOSTILE_ACCOUNT: i64 = 1;
    /// The amount of that credit.
    pub const HOSTILE_AMOUNT: i64 = 7;
    /// The account a hostile message credits before it misbehaves
    /// ([`Arena::credit_then`]): its balance stays NULL when the
    /// misbehaviour rolls the message back.
    pub const VICTIM: i64 = 2;

    /// A hostile payload, message `event_id`: the `behave` guest credits 5
    /// to [`Self::VICTIM`], then behaves as `then` says.
    pub fn credit_then(event_id: &str, then: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"op": "credit-then", "event_id": event_id,
                           "account_id": Self::VICTIM, "amount": 5, "then": then})
    }

    /// Starts the arena; `setup` statements run on the fresh database first
    /// (the host's migrations create `accounts` afterwards).
    pub async fn start(backend: Backend, hostile_extra: &str, setup: &[&str]) -> Self {
        let nats = Nats::start();
        let db = TestDb::new(backend).await;
        for sql in setup {
            db.execute(sql).await;
        }
        create_stream(&nats, "ACCOUNTS", &["accounts.>"]).await;
        let dir = tempfile::tempdir().unwrap();
        let mut hostile = HandlerSpec::new("hostile", "behave");
        hostile.subjects = vec!["accounts.hostile".into()];
        hostile.extra = format!("retry_delay = \"100ms\"\n{hostile_extra}\n");
        let mut well = HandlerSpec::new("well-behaved", "credit");
        well.extra = String::new();
        let cfg = write_config(dir.path(), &nats, &db, &[hostile, well]);
        let host = RunningHost::start(&cfg).await;
        let js = nats.jetstream().await;
        Arena {
            host,
            js,
            nats,
            db,
            _dir: dir,
        }
    }

    /// Stops the host (clean shutdown), then drops the broker and database.
    pub async fn stop(self) -> Summary {
        let Arena { host, .. } = self;
        host.stop().await
    }

    async fn well_behaved(&self, from: i64, to: i64) {
        for i in from..=to {
            let p = credit(&format!("evt_w{i}"), Self::WELL_ACCOUNT, i);
            publish(&self.js, "accounts.credit", &p, &[]).await;
        }
    }

    /// Publishes 10 well-behaved credits, the `hostile` payloads (each with
    /// its own `event_id`), 10 more credits, and last a `credit` op of
    /// [`Self::HOSTILE_AMOUNT`] to [`Self::HOSTILE_ACCOUNT`] on the hostile
    /// handler. Waits (`patience` at most) until every hostile message is
    /// processed or dead-lettered, then asserts that the well-behaved handler
    /// processed exactly its 20 credits, the hostile handler's final credit
    /// committed, and the only hostile receipt is that credit's. Hostile
    /// messages that end processed are listed in `processed_ids`.
    pub async fn run(
        &self,
        hostile: &[serde_json::Value],
        processed_ids: &[&str],
        patience: Duration,
    ) -> ArenaRun {
        self.well_behaved(1, 10).await;
        let started = Instant::now();
        for p in hostile {
            publish(&self.js, "accounts.hostile", &p.to_string(), &[]).await;
        }
        self.well_behaved(11, 20).await;
        let ok = serde_json::json!({
            "op": "credit", "event_id": "evt_ok",
            "account_id": Self::HOSTILE_ACCOUNT, "amount": Self::HOSTILE_AMOUNT,
        });
        publish(&self.js, "accounts.hostile", &ok.to_string(), &[]).await;
        let settled = hostile.len() as u64 + 1;
        let deadline = Instant::now() + patience;
        let stats = loop {
            let s = self.host.stats("hostile");
            if s.processed + s.dead_lettered >= settled {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "hostile messages not settled within {patience:?}; stats {s}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let elapsed = started.elapsed();
        let well = self
            .host
            .wait_for("well-behaved", "20 credits", |s| s.processed == 20)
            .await;
        assert_eq!(
            (
                well.delivered,
                well.duplicates,
                well.retried,
                well.dead_lettered,
                well.traps
            ),
            (20, 0, 0, 0, 0),
            "well-behaved: {well}"
        );
        assert_eq!(self.db.balance(Self::WELL_ACCOUNT).await, Some(210));
        assert_eq!(self.db.receipts("well-behaved").await, 20);
        assert!(self.db.dead_letters("well-behaved").await.is_empty());
        assert_eq!(
            self.db.balance(Self::HOSTILE_ACCOUNT).await,
            Some(Self::HOSTILE_AMOUNT)
        );
        let mut ids: Vec<&str> = processed_ids.to_vec();
        ids.push("evt_ok");
        ids.sort_unstable();
        assert_eq!(self.db.receipt_ids("hostile").await, ids);
        ArenaRun {
            stats,
            dead_letters: self.db.dead_letters("hostile").await,
            elapsed,
        }
    }
}

/// What the dead-letter reason of one hostile message must be.
pub enum Reason {
    Exact(String),
    Prefix(String),
}

impl Reason {
    pub fn matches(&self, reason: &str) -> bool {
        match self {
            Reason::Exact(want) => reason == want,
            Reason::Prefix(want) => reason.starts_with(want.as_str()),
        }
    }
}

/// One hostile statement for [`Arena::refused`]: the `behave` op that runs
/// it (`sql`: execute, rejects with `"<kind>: <message>"` on an error;
/// `query`: rejects with `"rows <columns> <rows>"`), its text, and the
/// dead-letter reason expected.
pub struct Case {
    pub op: &'static str,
    pub sql: String,
    pub reason: Reason,
}

impl Case {
    pub fn exact(op: &'static str, sql: impl Into<String>, reason: impl Into<String>) -> Self {
        Case {
            op,
            sql: sql.into(),
            reason: Reason::Exact(reason.into()),
        }
    }

    pub fn prefix(op: &'static str, sql: impl Into<String>, reason: impl Into<String>) -> Self {
        Case {
            op,
            sql: sql.into(),
            reason: Reason::Prefix(reason.into()),
        }
    }

    /// Refused by the host's judge: `rejected: denied: {message}`.
    pub fn denied(op: &'static str, sql: impl Into<String>, message: &str) -> Self {
        Self::exact(op, sql, format!("rejected: denied: {message}"))
    }

    /// Refused as not SELECT / INSERT / UPDATE / DELETE; `word` names the
    /// statement as the judge does: on PostgreSQL its first keyword
    /// (`ABORT`, `START`, `PREPARE`), on SQLite the action SQLite's
    /// authorizer reports (`END` is a `COMMIT`, `ROLLBACK TO` a savepoint).
    pub fn not_dml(op: &'static str, sql: &str, word: &str) -> Self {
        Self::denied(
            op,
            sql,
            &format!(
                "{word} statements are not allowed; a handler runs only \
                 SELECT, INSERT, UPDATE or DELETE in the host's transaction"
            ),
        )
    }

    /// A query refused for calling function `name` as the judge names it:
    /// PostgreSQL's parser folds unquoted names to lower case (`PG_SLEEP` is
    /// `pg_sleep`, `"pg_sleep"` too) and keeps a schema
    /// (`pg_catalog.pg_sleep`); SQLite's authorizer names a function it
    /// knows as written. The reason lists the allowed functions.
    pub fn function(sql: &str, name: &str) -> Self {
        Self::denied(
            "query",
            sql,
            &format!(
                "function `{name}` is not allowed in handler SQL (allowed: {})",
                idem::sql_guard::ALLOWED_FUNCTIONS.join(", ")
            ),
        )
    }

    /// Refused by the database's own grammar before anything ran, with its
    /// own `message`: on PostgreSQL libpg_query's (`syntax error at or near
    /// "X"`), on SQLite its compiler's (`near "X": syntax error`, `no such
    /// table: t`, `no such function: f`), which ends with SQLite's code 1.
    pub fn syntax(backend: Backend, op: &'static str, sql: &str, message: &str) -> Self {
        let reason = match backend {
            Backend::Postgres => {
                format!("rejected: syntax: statement does not parse: {message}")
            }
            Backend::Sqlite => {
                format!("rejected: syntax: statement does not compile: {message} (SQLite code 1)")
            }
        };
        Self::exact(op, sql, reason)
    }

    /// Refused as several statements in one string. PostgreSQL's parser
    /// counts them (`n`); SQLite compiles the first and refuses any tail that
    /// is not whitespace, comments or `;`.
    pub fn several(backend: Backend, op: &'static str, sql: &str, n: usize) -> Self {
        let message = match backend {
            Backend::Postgres => format!("{n} statements in one call; send exactly one"),
            Backend::Sqlite => {
                "more than one statement in one call (or text after it); send exactly one".into()
            }
        };
        Self::denied(op, sql, &message)
    }
}

impl Arena {
    /// The tables an arena for SQL cases starts with: `accounts` with a
    /// canary row 500 (the credit migrations find the table there), and
    /// `other_accounts`, which exists but no handler is granted.
    pub const SQL_SETUP: &[&str] = &[
        "CREATE TABLE accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "INSERT INTO accounts (account_id, balance) VALUES (500, 5000)",
        "CREATE TABLE other_accounts (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
        "INSERT INTO other_accounts (account_id, balance) VALUES (1, 100), (2, 200)",
    ];

    /// Runs every case as [`Arena::credit_then`] (message `evt_NN`) through
    /// [`Arena::run`], and asserts: each is dead-lettered with its reason,
    /// in order; nothing else failed, trapped or retried; every credit was
    /// rolled back; [`Arena::intact`] with 3 rows (canary, well-behaved,
    /// the hostile handler's final credit). For arenas started with
    /// [`Arena::SQL_SETUP`].
    pub async fn refused(&self, cases: &[Case], patience: Duration) -> ArenaRun {
        let payloads: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let then = serde_json::json!({"op": c.op, "sql": c.sql});
                Self::credit_then(&format!("evt_{i:02}"), then)
            })
            .collect();
        let r = self.run(&payloads, &[], patience).await;
        let n = cases.len() as u64;
        let s = r.stats;
        assert_eq!(
            (
                s.delivered,
                s.processed,
                s.retried,
                s.dead_lettered,
                s.traps
            ),
            (n + 1, 1, 0, n, 0),
            "{s}"
        );
        assert_eq!(r.dead_letters.len(), cases.len(), "{:?}", r.dead_letters);
        let mut wrong = Vec::new();
        for (i, (c, (id, reason))) in cases.iter().zip(&r.dead_letters).enumerate() {
            assert_eq!(id.as_deref(), Some(format!("evt_{i:02}").as_str()));
            if !c.reason.matches(reason) {
                wrong.push(format!("{}: {:?} gave {reason:?}", c.op, c.sql));
            }
        }
        assert!(
            wrong.is_empty(),
            "unexpected reasons:\n{}",
            wrong.join("\n")
        );
        assert_eq!(self.db.balance(Self::VICTIM).await, None);
        self.intact(3).await;
        r
    }

    /// The canary row and `other_accounts` ([`Arena::SQL_SETUP`]) are
    /// unchanged and `accounts` holds `rows` rows.
    pub async fn intact(&self, rows: i64) {
        assert_eq!(self.db.balance(500).await, Some(5000));
        assert_eq!(
            self.db.scalar("SELECT count(*) FROM accounts").await,
            Some(rows)
        );
        assert_eq!(
            self.db
                .scalar("SELECT CAST(count(*) * 1000 + sum(balance) AS BIGINT) FROM other_accounts")
                .await,
            Some(2300)
        );
    }
}
