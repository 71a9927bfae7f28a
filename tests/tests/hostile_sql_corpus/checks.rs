//! What must hold after each group: each case ended as expected, the
//! canary unread and unchanged, receipts, dead letters and balances exact,
//! no new objects or files, no session state left, the host alive and its
//! memory bounded.

use crate::harness::{CANARY, CorpusHost, WELL};
use crate::outcome::Outcome;
use idem_tests::*;
use serde_json::Value;
use sqlx::Row;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

/// What the database's objects and session state look like, compared
/// before and after each group.
pub(crate) async fn fingerprint(db: &TestDb) -> String {
    let sql = match db.backend {
        Backend::Postgres => {
            "SELECT concat_ws(' ', \
              'class', (SELECT count(*) FROM pg_class), \
              'proc', (SELECT count(*) FROM pg_proc), \
              'largeobjects', (SELECT count(*) FROM pg_largeobject_metadata), \
              'namespaces', (SELECT count(*) FROM pg_namespace), \
              'triggers', (SELECT count(*) FROM pg_trigger), \
              'rules', (SELECT count(*) FROM pg_rewrite), \
              'types', (SELECT count(*) FROM pg_type), \
              'attributes', (SELECT count(*) FROM pg_attribute), \
              'policies', (SELECT count(*) FROM pg_policy), \
              'extensions', (SELECT count(*) FROM pg_extension), \
              'event_triggers', (SELECT count(*) FROM pg_event_trigger), \
              'descriptions', (SELECT count(*) FROM pg_description), \
              'default_acl', (SELECT count(*) FROM pg_default_acl), \
              'publications', (SELECT count(*) FROM pg_publication), \
              'servers', (SELECT count(*) FROM pg_foreign_server), \
              'temp', (SELECT count(*) FROM pg_class WHERE relpersistence = 't'), \
              'relations', (SELECT md5(string_agg(relname || ':' || relkind::text || ':' || relowner::text || ':' \
                 || coalesce(relacl::text, '') || ':' || relhastriggers::text || ':' || relrowsecurity::text, \
                 ',' ORDER BY relname)) FROM pg_class WHERE relnamespace = 'public'::regnamespace), \
              'schemas', (SELECT md5(string_agg(nspname || ':' || coalesce(nspacl::text, ''), ',' ORDER BY nspname)) \
                 FROM pg_namespace), \
              'database', (SELECT coalesce(datacl::text, '') || datallowconn::text FROM pg_database \
                 WHERE datname = current_database()), \
              'role_settings', (SELECT count(*) FROM pg_db_role_setting WHERE setdatabase = \
                 (SELECT oid FROM pg_database WHERE datname = current_database()) OR setrole IN (0, \
                 (SELECT oid FROM pg_roles WHERE rolname = session_user), \
                 (SELECT oid FROM pg_roles WHERE rolname = 'idem_handler_hostile_12dbf8f3'))), \
              'evil_roles', (SELECT count(*) FROM pg_roles WHERE rolname LIKE 'evil%'), \
              'evil_databases', (SELECT count(*) FROM pg_database WHERE datname LIKE 'evil%'), \
              'handler_role', (SELECT string_agg(rolsuper::text || rolcreaterole::text || rolcreatedb::text \
                 || rolbypassrls::text || rolcanlogin::text, ',') FROM pg_roles WHERE rolname = 'idem_handler_hostile_12dbf8f3'), \
              'handler_memberships', (SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member \
                 WHERE r.rolname = 'idem_handler_hostile_12dbf8f3'), \
              'prepared_xacts', (SELECT count(*) FROM pg_prepared_xacts), \
              'triggers_enabled', (SELECT string_agg(tgname || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger \
                 WHERE NOT tgisinternal))"
        }
        Backend::Sqlite => {
            "SELECT (SELECT group_concat(entry, char(10)) FROM (SELECT type || ':' || name || ':' \
               || tbl_name || ':' || coalesce(sql, '') AS entry FROM sqlite_schema ORDER BY name)) \
               || ' user_version=' || (SELECT user_version FROM pragma_user_version) \
               || ' application_id=' || (SELECT application_id FROM pragma_application_id) \
               || ' schema_version=' || (SELECT schema_version FROM pragma_schema_version) \
               || ' journal_mode=' || (SELECT journal_mode FROM pragma_journal_mode) \
               || ' databases=' || (SELECT count(*) FROM pragma_database_list)"
        }
    };
    let pool = db.pool().await;
    let s: String = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    pool.close().await;
    s
}

/// Files next to the SQLite database (its own journal files aside).
pub(crate) fn db_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !["idem.db-wal", "idem.db-shm", "idem.db-journal"].contains(&n.as_str()))
        .collect()
}

/// Files in /tmp whose path starts with `prefix`.
fn tmp_files(prefix: &str) -> Vec<String> {
    let name = Path::new(prefix)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&name))
        .collect()
}

/// Whether `reason` shows the canary in any spelling a query could give it.
fn shows_canary(reason: &str) -> bool {
    let lower = reason.to_ascii_lowercase();
    let canary = CANARY.to_ascii_lowercase();
    let hex: String = CANARY.bytes().map(|b| format!("{b:02x}")).collect();
    let reversed: String = canary.chars().rev().collect();
    lower.contains(&canary)
        || lower.contains("5f1c2e9a")
        || lower.contains(&hex)
        || lower.contains(&reversed)
        || lower.contains("pwned")
}

/// `s` cut to `max` characters.
pub(crate) fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        format!("{}...", s.chars().take(max).collect::<String>())
    }
}

/// The rows of a `query` op's reason (`rejected: rows <columns> <rows>`).
fn rows_of(reason: &str) -> Option<Value> {
    let rest = reason.strip_prefix("rejected: rows ")?;
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
    values.next()?.ok()?;
    values.next()?.ok()
}

pub(crate) fn ended_as(outcome: &Outcome, receipt: bool, dead: Option<&str>) -> bool {
    let refused = |r: &str| {
        r.starts_with("rejected: ")
            && !r.starts_with("rejected: rows ")
            && !r.starts_with("rejected: steps ")
    };
    match (outcome, receipt, dead) {
        (Outcome::Served, true, None) => true,
        (_, false, Some(r)) => match outcome {
            Outcome::Served => false,
            Outcome::Refused => refused(r),
            Outcome::RefusedAt(i) => r.starts_with(&format!("rejected: step {i}: ")),
            Outcome::Rows(want) => rows_of(r).as_ref() == Some(want),
            Outcome::Reason(want) => r == want,
            Outcome::Trap => r.starts_with("trap: "),
            Outcome::Failed => r.starts_with("trap: ") || refused(r),
        },
        _ => false,
    }
}

/// The host's counters for one handler from its shutdown summary.
pub(crate) fn summary_stats(out: &Path, handler: &str) -> Option<String> {
    let text = std::fs::read_to_string(out).ok()?;
    let prefix = format!("handler {handler}: ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
}

impl CorpusHost {
    pub(crate) async fn check_effects(
        &mut self,
        group: &str,
        receipts: &BTreeSet<String>,
        dead_letters: &BTreeMap<String, String>,
    ) {
        // The host is alive and its memory bounded.
        if let Some(status) = self.host.exited() {
            panic!(
                "{}: the host exited ({status}) after group {group}; log:\n{}",
                self.label(),
                self.log_tail()
            );
        }
        let (hwm, rss) = process_memory_kib(self.host.pid()).expect("host memory");
        if hwm >= self.memory_limit_kib {
            self.problem(
                group,
                format!("host VmHWM {hwm} KiB passed {} KiB", self.memory_limit_kib),
            );
        }
        if rss >= self.resident_limit_kib {
            self.problem(
                group,
                format!(
                    "host VmRSS {rss} KiB stayed above {} KiB",
                    self.resident_limit_kib
                ),
            );
        }
        // The canary: unread, unchanged.
        for (id, reason) in dead_letters {
            if shows_canary(reason) {
                self.problem(
                    group,
                    format!("dead letter {id} shows the canary: {reason}"),
                );
            }
        }
        let pool = self.db.pool().await;
        let secrets: Vec<(i64, String)> = sqlx::query("SELECT id, v FROM secrets ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        if secrets != [(1, CANARY.to_owned())] {
            self.problem(group, format!("secrets changed: {secrets:?}"));
        }
        // Receipts and dead letters: exactly the expected ones.
        if *receipts != self.served {
            let extra: Vec<_> = receipts.difference(&self.served).collect();
            let missing: Vec<_> = self.served.difference(receipts).collect();
            self.problem(
                group,
                format!("hostile receipts differ: extra {extra:?}, missing {missing:?}"),
            );
        }
        let dead: BTreeSet<String> = dead_letters.keys().cloned().collect();
        if dead != self.dead {
            self.problem(
                group,
                format!("hostile dead letters differ: {dead:?} vs {:?}", self.dead),
            );
        }
        let totals: (i64, i64) = sqlx::query(
            "SELECT (SELECT count(*) FROM idem_receipts), (SELECT count(*) FROM idem_dead_letters)",
        )
        .fetch_one(&pool)
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
        let want = (
            (self.served.len() as i64) + self.well,
            self.dead.len() as i64,
        );
        if totals != want {
            self.problem(
                group,
                format!("idem_receipts / idem_dead_letters hold {totals:?} rows, want {want:?}"),
            );
        }
        let well_ids = self.db.receipt_ids(WELL).await;
        let want_well: Vec<String> = (1..=self.well).map(|i| format!("w{i:04}")).collect();
        if well_ids != want_well {
            self.problem(group, format!("well-behaved receipts {well_ids:?}"));
        }
        // Every balance exact: follow-ups applied once, effects as declared.
        let accounts: BTreeMap<i64, i64> =
            sqlx::query("SELECT account_id, balance FROM accounts ORDER BY account_id")
                .fetch_all(&pool)
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
        if accounts != self.accounts {
            let diff: Vec<String> = accounts
                .keys()
                .chain(self.accounts.keys())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter(|k| accounts.get(k) != self.accounts.get(k))
                .map(|k| format!("{k}: {:?} want {:?}", accounts.get(k), self.accounts.get(k)))
                .collect();
            self.problem(group, format!("accounts differ: {diff:?}"));
        }
        let others: (i64, i64) =
            sqlx::query("SELECT (SELECT count(*) FROM notes), (SELECT count(*) FROM ledger)")
                .fetch_one(&pool)
                .await
                .map(|r| (r.get(0), r.get(1)))
                .unwrap();
        if others != (0, 0) {
            self.problem(group, format!("notes / ledger rows: {others:?}"));
        }
        pool.close().await;
        // No new objects.
        let now = fingerprint(&self.db).await;
        if !self.baseline.is_empty() && now != self.baseline {
            self.problem(
                group,
                format!(
                    "objects changed:\n  before {}\n  after  {now}",
                    self.baseline
                ),
            );
        }
        let stray = tmp_files(&self.tmp);
        if !stray.is_empty() {
            self.problem(group, format!("files in /tmp: {stray:?}"));
        }
        match self.backend {
            Backend::Sqlite => {
                let files = db_files(&self.db_dir);
                if !self.files.is_empty() && files != self.files {
                    self.problem(
                        group,
                        format!(
                            "files next to the database: {files:?}, were {:?}",
                            self.files
                        ),
                    );
                }
            }
            Backend::Postgres => self.check_sessions(group).await,
        }
    }

    /// No advisory lock, no busy backend, no renamed session. The host's
    /// own housekeeping (receipt pruning, under a transaction advisory lock)
    /// may be caught in passing, so locks and busy backends count only when
    /// every one of three samples, 150 ms apart, shows the same ones.
    async fn check_sessions(&mut self, group: &str) {
        let pool = self.db.pool().await;
        let mut lasting: Option<(BTreeSet<String>, BTreeSet<String>)> = None;
        for sample in 0..3 {
            if sample > 0 {
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            let locks: BTreeSet<String> = sqlx::query(
                "SELECT pid::text || ' ' || mode || ' ' || coalesce(classid::text, '') || ':' \
                 || coalesce(objid::text, '') FROM pg_locks WHERE locktype = 'advisory' \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
            let busy: BTreeSet<String> = sqlx::query(
                "SELECT pid::text || ' ' || state || ' since ' || coalesce(query_start::text, '') \
                 || ': ' || left(query, 120) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid() \
                 AND state IS NOT NULL AND state <> 'idle'",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
            lasting = Some(match lasting {
                None => (locks, busy),
                Some((l, b)) => (
                    l.intersection(&locks).cloned().collect(),
                    b.intersection(&busy).cloned().collect(),
                ),
            });
        }
        pool.close().await;
        let (locks, busy) = lasting.unwrap();
        if !locks.is_empty() {
            self.problem(group, format!("advisory locks held: {locks:?}"));
        }
        if !busy.is_empty() {
            self.problem(group, format!("backends still busy: {busy:?}"));
        }
        let names = self.application_names().await;
        let odd: Vec<_> = names
            .iter()
            .filter(|n| !n.is_empty() && !self.app_names.contains(*n))
            .collect();
        if !odd.is_empty() {
            self.problem(group, format!("sessions renamed: {odd:?}"));
        }
    }
}
