//! PostgreSQL defence in depth: one role per handler and grant set that holds privileges on
//! that handler's granted tables only, switched on for the guest's part of each
//! transaction (`set_config('role', …, true)`, i.e. `SET LOCAL ROLE`).
//!
//! The role is named after the handler and its grant set
//! ([`crate::store::handler_role`]), so hosts whose configs grant one handler
//! different tables never re-grant each other's role; each role's comment
//! says which handler and tables it is for, so a host can name the others.
//!
//! The SQL guard is the first line; this role means a statement the guard
//! wrongly let through still meets PostgreSQL's own permission check
//! (SQLSTATE 42501, which the guest sees as `denied`). The receipt is
//! inserted before the switch, as the host's own user: the role has no
//! privilege on any `idem_*` table.
//!
//! This is the `backend::PoolRoles` and `backend::TxRoles` capability of
//! PostgreSQL's pool and transaction.

use super::{Pool, Tx};
use crate::store::backend::{PoolRoles, TxRoles};
use sqlx::{AssertSqlSafe, PgPool};

/// Quotes `name` as a PostgreSQL identifier. Names in config are matched the
/// way the guard matches them (unquoted, so case-folded to lower case).
fn ident(name: &str) -> String {
    format!("\"{}\"", name.to_lowercase().replace('"', "\"\""))
}

/// Creates (if missing) the NOLOGIN role `role`, makes the connecting user a
/// member so it may switch to it, and grants it exactly SELECT, INSERT,
/// UPDATE, DELETE on `tables` plus USAGE on the sequences those tables own
/// (`serial` columns). Privileges granted earlier on tables no longer listed
/// are revoked. Returns the other roles made for `handler` (with other
/// grant sets) as `role (tables)`, for the caller to warn about.
/// Errors: the connecting user lacks CREATEROLE or the grant option on a
/// table (the caller then runs without the role, and says so).
pub(super) async fn prepare(
    pool: &PgPool,
    role: &str,
    handler: &str,
    tables: &[String],
) -> Result<Vec<String>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(crate::store::advisory::ROLE_SETUP)
        .execute(&mut *tx)
        .await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
            .bind(role)
            .fetch_one(&mut *tx)
            .await?;
    let r = ident(role);
    let mut ddl = Vec::new();
    if !exists {
        ddl.push(format!("CREATE ROLE {r} NOLOGIN"));
    }
    ddl.push(format!("GRANT {r} TO CURRENT_USER"));
    let comment = role_comment(handler, tables);
    ddl.push(format!("COMMENT ON ROLE {r} IS {}", literal(&comment)));
    // Start from nothing on every table the role may hold rights on, then grant the list.
    let held: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT quote_ident(table_schema) || '.' || quote_ident(table_name) \
         FROM information_schema.role_table_grants WHERE grantee = $1",
    )
    .bind(role)
    .fetch_all(&mut *tx)
    .await?;
    for t in held {
        ddl.push(format!("REVOKE ALL ON TABLE {t} FROM {r}"));
    }
    for t in tables {
        ddl.push(format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {} TO {r}",
            ident(t)
        ));
        let sequences: Vec<String> = sqlx::query_scalar(
            "SELECT s.oid::regclass::text FROM pg_class s \
             JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid AND d.deptype IN ('a', 'i') \
             WHERE s.relkind = 'S' AND d.refobjid = to_regclass($1)",
        )
        .bind(ident(t))
        .fetch_all(&mut *tx)
        .await?;
        for s in sequences {
            ddl.push(format!("GRANT USAGE ON SEQUENCE {s} TO {r}"));
        }
    }
    for statement in ddl {
        // Identifiers quoted by `ident`, literals by `literal`, or printed by
        // PostgreSQL itself; no guest text.
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await?;
    }
    let prefix = role_comment(handler, &[]);
    let others: Vec<(String, String)> = sqlx::query_as(
        "SELECT rolname::text, shobj_description(oid, 'pg_authid') FROM pg_roles \
         WHERE rolname <> $1 AND starts_with(shobj_description(oid, 'pg_authid'), $2) \
         ORDER BY rolname",
    )
    .bind(role)
    .bind(&prefix)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(others
        .into_iter()
        .map(|(name, comment)| {
            let tables = comment.strip_prefix(&prefix).unwrap_or_default();
            format!("{name} ({tables})")
        })
        .collect())
}

/// A handler role's comment: `idem handler "<name>" tables: a, b`; with
/// no tables, the prefix every role of that handler's comment starts with.
fn role_comment(handler: &str, tables: &[String]) -> String {
    let mut names: Vec<String> = tables.iter().map(|t| t.to_lowercase()).collect();
    names.sort();
    names.dedup();
    format!(
        "idem handler {} tables: {}",
        serde_json::Value::from(handler),
        names.join(", ")
    )
}

/// `s` as a PostgreSQL escape string literal (`E'…'`, backslashes and
/// quotes doubled), which reads the same whatever
/// `standard_conforming_strings` is.
fn literal(s: &str) -> String {
    format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// The statement that switches the rest of a transaction to `role`
/// (`SET LOCAL ROLE`, quoted: a name from [`prepare`]).
pub(super) fn enter_sql(role: &str) -> String {
    format!("SET LOCAL ROLE {}", ident(role))
}

impl PoolRoles for Pool {
    /// [`prepare`]: creates or updates the handler's role; the handler's
    /// other roles (other grant sets), `role (tables)`.
    async fn prepare_role(
        &self,
        role: &str,
        handler: &str,
        tables: &[String],
    ) -> Result<Option<Vec<String>>, sqlx::Error> {
        prepare(&self.0, role, handler, tables).await.map(Some)
    }

    /// The connecting user's name, and whether it is a superuser (who can leave
    /// any role it switches to, so a handler role is no boundary for it).
    async fn session_user(&self) -> Result<Option<(String, bool)>, sqlx::Error> {
        sqlx::query_as("SELECT rolname::text, rolsuper FROM pg_roles WHERE rolname = session_user")
            .fetch_one(&self.0)
            .await
            .map(Some)
    }
}

impl TxRoles for Tx {
    /// Remembers `role` for the next guest statement or guard catalog
    /// query; sends nothing.
    async fn enter_role(&mut self, role: &str) -> Result<(), sqlx::Error> {
        self.pending_role = Some(role.to_owned());
        self.role = Some(role.to_owned());
        Ok(())
    }

    /// `SET LOCAL ROLE NONE` when the role was entered; the role is
    /// pending again for the next guest statement.
    async fn host_turn(&mut self) -> Result<(), sqlx::Error> {
        if std::mem::take(&mut self.role_entered) {
            sqlx::raw_sql(AssertSqlSafe(super::batch::LEAVE_ROLE))
                .execute(&mut *self.tx)
                .await?;
            self.pending_role = self.role.clone();
        }
        Ok(())
    }

    /// `SET LOCAL ROLE NONE` whenever a role was given, entered or not as
    /// remembered: a `ROLLBACK TO SAVEPOINT` restores the role in force
    /// when the savepoint was made (PostgreSQL, "SET": the effects of `SET
    /// LOCAL` end with the savepoint rolled back), which may not be what
    /// this transaction last sent.
    async fn reset_role(&mut self) -> Result<(), sqlx::Error> {
        if self.role.is_some() {
            sqlx::raw_sql(AssertSqlSafe(super::batch::LEAVE_ROLE))
                .execute(&mut *self.tx)
                .await?;
            self.role_entered = false;
            self.pending_role = self.role.clone();
        }
        Ok(())
    }
}

impl Tx {
    /// Enters the pending role, if any, on its own. Forgotten only once
    /// entered: after a failure the transaction is aborted (PostgreSQL
    /// refuses every later statement), so nothing runs as the host's user.
    pub(super) async fn flush_role(&mut self) -> Result<(), sqlx::Error> {
        if let Some(role) = &self.pending_role {
            let entered = sqlx::raw_sql(AssertSqlSafe(enter_sql(role)))
                .execute(&mut *self.tx)
                .await;
            if let Err(e) = entered {
                self.aborted = Some(format!("the switch to the handler's role failed: {e}"));
                return Err(e);
            }
            self.pending_role = None;
            self.role_entered = true;
        }
        Ok(())
    }
}
