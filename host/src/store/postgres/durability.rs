//! What a PostgreSQL connection commits under (`store::durability`).

use crate::store::durability::CommitSettings;
use sqlx::{PgPool, Row as _};

/// The settings that decide whether a COMMIT is flushed before it returns,
/// and the names the fix needs.
const COMMIT_SETTINGS: &str = "SELECT current_setting('synchronous_commit'), \
     coalesce((SELECT source FROM pg_settings WHERE name = 'synchronous_commit'), ''), \
     current_setting('fsync'), current_database()::text, current_user::text";

/// [`COMMIT_SETTINGS`] on each idle connection of `pool` at once (at least
/// one): a session setting a connection carries is seen.
pub(super) async fn commit_settings(pool: &PgPool) -> Result<Vec<CommitSettings>, sqlx::Error> {
    let mut held = Vec::new();
    let mut found = Vec::new();
    for _ in 0..pool.num_idle().max(1) {
        let mut conn = pool.acquire().await?;
        let row = sqlx::query(COMMIT_SETTINGS).fetch_one(&mut *conn).await?;
        found.push(CommitSettings::Postgres {
            synchronous_commit: row.try_get(0)?,
            source: row.try_get(1)?,
            fsync: row.try_get(2)?,
            database: row.try_get(3)?,
            user: row.try_get(4)?,
        });
        held.push(conn);
    }
    Ok(found)
}
