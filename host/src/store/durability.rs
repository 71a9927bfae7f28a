//! Whether a COMMIT that returned is on disk: ack after commit (invariant 2)
//! keeps an effect only if the commit survives a crash. PostgreSQL with
//! `synchronous_commit = off` (settable per role, database or session) or
//! `fsync = off`, and SQLite with `synchronous` below FULL or without a
//! journal, report a commit before it is durable: a crash then loses an
//! effect whose message was acked and is never delivered again.
//!
//! [`Database::check_durable_commit`] reads the settings of the pool's
//! connections (those that will commit receipts) at start and refuses
//! them, or warns once when `[database] accept_non_durable_commit` is set.

use super::backend::Pool as _;
use super::{Database, dispatch};

/// What one connection commits under, as the database reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CommitSettings {
    /// PostgreSQL: `current_setting(...)` and `pg_settings.source`.
    Postgres {
        /// `synchronous_commit`: `on`, `off`, `local`, `remote_write`, `remote_apply`.
        synchronous_commit: String,
        /// Where it was set (`pg_settings.source`): `default`,
        /// `configuration file`, `database`, `user`, `database user`,
        /// `client`, `session`, ….
        source: String,
        /// `fsync`: `on` or `off` (server configuration only).
        fsync: String,
        /// `current_database()`, for the fix.
        database: String,
        /// `current_user`, for the fix.
        user: String,
    },
    /// SQLite: `PRAGMA synchronous` (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA) and
    /// `PRAGMA journal_mode` (lower case).
    Sqlite {
        /// The safety level, 0 to 3.
        synchronous: i64,
        /// `wal`, `delete`, `truncate`, `persist`, `memory`, `off`.
        journal_mode: String,
    },
}

/// Why a commit under `s` may not be on disk when it returns, and what
/// makes it so: `Some((what, fix))`, two phrases; `None` when it is durable.
/// PostgreSQL: every `synchronous_commit` but `off` waits for the local WAL
/// flush. SQLite: FULL and EXTRA sync the journal (WAL or rollback) on
/// commit; a journal in memory or none is not crash safe at all.
pub(super) fn not_durable(s: &CommitSettings) -> Option<(String, String)> {
    match s {
        CommitSettings::Postgres {
            synchronous_commit,
            source,
            fsync,
            database,
            user,
        } => {
            if fsync == "off" {
                return Some((
                    "the server runs with fsync = off".to_string(),
                    "set fsync = on in the server's configuration".to_string(),
                ));
            }
            if synchronous_commit != "off" {
                return None;
            }
            let (db, role) = (quoted(database), quoted(user));
            let (by, fix) = match source.as_str() {
                "database" => (
                    "ALTER DATABASE … SET".to_string(),
                    format!("ALTER DATABASE {db} RESET synchronous_commit"),
                ),
                "user" => (
                    "ALTER ROLE … SET".to_string(),
                    format!("ALTER ROLE {role} RESET synchronous_commit"),
                ),
                "database user" => (
                    "ALTER ROLE … IN DATABASE … SET".to_string(),
                    format!("ALTER ROLE {role} IN DATABASE {db} RESET synchronous_commit"),
                ),
                "client" => (
                    "the connection's options ([database] url options=-c …, or PGOPTIONS)"
                        .to_string(),
                    "remove synchronous_commit from them".to_string(),
                ),
                other => (
                    format!("the server ({})", other.escape_debug()),
                    "set synchronous_commit = on in the server's configuration".to_string(),
                ),
            };
            Some((format!("synchronous_commit = off, set by {by}"), fix))
        }
        CommitSettings::Sqlite {
            synchronous,
            journal_mode,
        } => {
            let mode = journal_mode.escape_debug();
            if matches!(journal_mode.as_str(), "off" | "memory") {
                return Some((
                    format!("a connection runs with PRAGMA journal_mode = {mode}"),
                    "remove that PRAGMA from the handlers' migrations".to_string(),
                ));
            }
            if *synchronous >= 2 {
                return None;
            }
            let level = match synchronous {
                0 => "OFF",
                1 => "NORMAL",
                _ => "?",
            };
            Some((
                format!(
                    "a connection runs with PRAGMA synchronous = {level} ({synchronous}) in journal mode {mode} (a migration sets it on the connection it runs on)"
                ),
                "remove that PRAGMA from the handlers' migrations".to_string(),
            ))
        }
    }
}

/// `name` as a PostgreSQL identifier, its control characters escaped for
/// a log line.
fn quoted(name: &str) -> String {
    let mut out = String::from("\"");
    for c in name.chars() {
        match c {
            '"' => out.push_str("\"\""),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Database {
    /// Reads what the pool's idle connections commit under (at least one
    /// connection) and refuses a commit that is not durable on return
    /// (see the module docs); with `accept` it warns once instead.
    /// Call it once the pool is ready (after migrations) and before the
    /// first receipt commits.
    ///
    /// # Errors
    /// One line: what makes commits non-durable, what to change, and the
    /// key that allows it (`[database] accept_non_durable_commit = true`);
    /// or the settings could not be read.
    pub async fn check_durable_commit(&self, accept: bool) -> anyhow::Result<()> {
        let settings = dispatch!(&self.0, b => b.commit_settings().await).map_err(|e| {
            anyhow::anyhow!(
                "cannot read the database's commit settings: {}",
                super::one_line(&e.to_string())
            )
        })?;
        let Some((what, fix)) = settings.iter().find_map(not_durable) else {
            return Ok(());
        };
        if accept {
            tracing::warn!(
                "database commits are not durable: {what}; accept_non_durable_commit = true, so a crash can lose effects whose messages were already acked"
            );
            return Ok(());
        }
        anyhow::bail!(
            "database commits are not durable: {what}, so a crash can lose an effect whose message was already acked and is never redelivered; {fix}, or set [database] accept_non_durable_commit = true to run knowingly"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(synchronous_commit: &str, source: &str, fsync: &str) -> CommitSettings {
        CommitSettings::Postgres {
            synchronous_commit: synchronous_commit.into(),
            source: source.into(),
            fsync: fsync.into(),
            database: "idem".into(),
            user: "idem".into(),
        }
    }

    fn sqlite(synchronous: i64, journal_mode: &str) -> CommitSettings {
        CommitSettings::Sqlite {
            synchronous,
            journal_mode: journal_mode.into(),
        }
    }

    #[test]
    fn postgres_commits_are_durable_unless_off() {
        for level in ["on", "local", "remote_write", "remote_apply"] {
            assert_eq!(not_durable(&pg(level, "default", "on")), None, "{level}");
        }
        assert_eq!(
            not_durable(&pg("off", "database", "on")),
            Some((
                "synchronous_commit = off, set by ALTER DATABASE … SET".to_string(),
                "ALTER DATABASE \"idem\" RESET synchronous_commit".to_string()
            ))
        );
        assert_eq!(
            not_durable(&pg("off", "user", "on")).map(|w| w.1),
            Some("ALTER ROLE \"idem\" RESET synchronous_commit".to_string())
        );
        assert_eq!(
            not_durable(&pg("off", "database user", "on")).map(|w| w.1),
            Some("ALTER ROLE \"idem\" IN DATABASE \"idem\" RESET synchronous_commit".to_string())
        );
        assert_eq!(
            not_durable(&pg("off", "client", "on")).map(|w| w.0),
            Some("synchronous_commit = off, set by the connection's options ([database] url options=-c …, or PGOPTIONS)".to_string())
        );
        assert_eq!(
            not_durable(&pg("off", "configuration file", "on")).map(|w| w.1),
            Some("set synchronous_commit = on in the server's configuration".to_string())
        );
        assert_eq!(
            not_durable(&pg("on", "default", "off")).map(|w| w.0),
            Some("the server runs with fsync = off".to_string())
        );
    }

    #[test]
    fn sqlite_commits_are_durable_from_full_with_a_journal_on_disk() {
        assert_eq!(not_durable(&sqlite(2, "wal")), None);
        assert_eq!(not_durable(&sqlite(3, "wal")), None);
        assert_eq!(not_durable(&sqlite(2, "delete")), None);
        assert_eq!(
            not_durable(&sqlite(1, "wal")).map(|w| w.0),
            Some("a connection runs with PRAGMA synchronous = NORMAL (1) in journal mode wal (a migration sets it on the connection it runs on)".to_string())
        );
        assert!(not_durable(&sqlite(0, "wal")).is_some());
        assert_eq!(
            not_durable(&sqlite(2, "memory")).map(|w| w.0),
            Some("a connection runs with PRAGMA journal_mode = memory".to_string())
        );
        assert!(not_durable(&sqlite(3, "off")).is_some());
    }

    #[test]
    fn names_from_the_database_are_quoted_and_escaped() {
        assert_eq!(quoted("a\"b\nc"), "\"a\"\"b\\nc\"");
    }
}
