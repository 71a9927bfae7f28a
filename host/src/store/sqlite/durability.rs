//! What a SQLite connection commits under (`store::durability`). idem opens
//! every connection with `synchronous = FULL` in WAL mode and the URL cannot
//! change it (sqlx refuses any other URL parameter); a migration that runs
//! `PRAGMA synchronous` (outside a transaction) changes the pooled
//! connection it ran on.

use crate::store::durability::CommitSettings;
use sqlx::{Row as _, SqlitePool};

/// `PRAGMA synchronous` and `PRAGMA journal_mode` on as many connections
/// at once as `pool` holds at most, so every one it has is read (one still
/// being released is waited for). Call it while nothing else holds a
/// connection.
pub(super) async fn commit_settings(pool: &SqlitePool) -> Result<Vec<CommitSettings>, sqlx::Error> {
    let mut held = Vec::new();
    let mut found = Vec::new();
    for _ in 0..pool.options().get_max_connections().max(1) {
        let mut conn = pool.acquire().await?;
        let synchronous: i64 = sqlx::query("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await?
            .try_get(0)?;
        let journal_mode: String = sqlx::query("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await?
            .try_get(0)?;
        found.push(CommitSettings::Sqlite {
            synchronous,
            journal_mode: journal_mode.to_ascii_lowercase(),
        });
        held.push(conn);
    }
    Ok(found)
}
