//! The deployment high-water marks (`idem_deploy_marks`): per handler, the
//! highest deployment sequence any host of this database put in place,
//! with that record, so no copy of an older record the broker is made to
//! hold again can take a host back (ARCHITECTURE.md, "Signed deploys").
//! The decision is [`crate::deploy::trust`]'s; this is the mechanism.

use super::backend::Pool as _;
use super::{Database, StoreError, dispatch};

/// `$1`'s mark: sequence, KV revision, record JSON.
pub(super) const SELECT_MARK: &str =
    "SELECT sequence, revision, record FROM idem_deploy_marks WHERE handler = $1";

/// Raises `$1`'s mark to sequence `$2` (record `$4` at revision `$3`);
/// a lower or equal sequence changes nothing (PostgreSQL's and SQLite's
/// `INSERT … ON CONFLICT … DO UPDATE … WHERE`, SQLite ≥ 3.24).
pub(super) const RAISE_MARK: &str =
    "INSERT INTO idem_deploy_marks (handler, sequence, revision, record) VALUES ($1, $2, $3, $4)
     ON CONFLICT (handler) DO UPDATE
        SET sequence = excluded.sequence, revision = excluded.revision, record = excluded.record
      WHERE idem_deploy_marks.sequence < excluded.sequence";

/// A handler's high-water mark as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployMarkRow {
    /// The highest deployment sequence put in place.
    pub sequence: u64,
    /// The KV revision its record stood at.
    pub revision: u64,
    /// The record, JSON as the deployments bucket held it.
    pub record: String,
}

impl Database {
    /// `handler`'s high-water mark; `None` when no host of this database
    /// has put a sequenced deployment of it in place (also when the table
    /// is not there yet: no host of this version has started on it).
    ///
    /// # Errors
    /// The statement fails (see [`StoreError::class`]).
    pub async fn deploy_mark(&self, handler: &str) -> Result<Option<DeployMarkRow>, StoreError> {
        let row = dispatch!(&self.0, b => b.deploy_mark(handler).await)?;
        Ok(row.map(|(sequence, revision, record)| DeployMarkRow {
            sequence: u64::try_from(sequence).unwrap_or(0),
            revision: u64::try_from(revision).unwrap_or(0),
            record,
        }))
    }

    /// Raises `handler`'s mark to `sequence` (its record `record` at KV
    /// revision `revision`) unless it is there or higher already. Returns
    /// whether it rose.
    ///
    /// # Errors
    /// `sequence` or `revision` is over `i64::MAX` (as no record idem
    /// believes carries), or the statement fails.
    pub async fn raise_deploy_mark(
        &self,
        handler: &str,
        sequence: u64,
        revision: u64,
        record: &str,
    ) -> Result<bool, StoreError> {
        let (Ok(sequence), Ok(revision)) = (i64::try_from(sequence), i64::try_from(revision))
        else {
            return Err(StoreError::from(sqlx::Error::Protocol(
                "a deployment sequence or revision over i64::MAX".into(),
            )));
        };
        let n = dispatch!(&self.0, b => b.raise_deploy_mark(handler, sequence, revision, record).await)?;
        Ok(n == 1)
    }
}
