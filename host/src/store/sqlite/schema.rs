//! SQLite: the host tables, created (and upgraded from earlier versions)
//! at start.

use sqlx::{AssertSqlSafe, Sqlite, SqlitePool, Transaction};

/// The current time in Unix milliseconds, computed by SQLite (any version).
macro_rules! now_ms {
    () => {
        "(CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))"
    };
}

const HOST_TABLES: [&str; 11] = [
    concat!(
        "CREATE TABLE IF NOT EXISTS idem_receipts (
        consumer TEXT NOT NULL,
        message_id TEXT NOT NULL,
        stream_sequence INTEGER NOT NULL,
        module_digest TEXT NOT NULL,
        processed_at INTEGER NOT NULL DEFAULT ",
        now_ms!(),
        ",
        published_ms INTEGER NOT NULL,
        PRIMARY KEY (consumer, message_id)
    ) WITHOUT ROWID"
    ),
    // Pruning reads one consumer's oldest receipts by publish time (store::retention).
    "CREATE INDEX IF NOT EXISTS idem_receipts_consumer_published_ms
        ON idem_receipts (consumer, published_ms)",
    // Superseded by the index above; they only cost inserts.
    "DROP INDEX IF EXISTS idem_receipts_processed_at",
    "DROP INDEX IF EXISTS idem_receipts_consumer_processed_at",
    concat!(
        "CREATE TABLE IF NOT EXISTS idem_dead_letters (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        consumer TEXT NOT NULL,
        message_id TEXT,
        stream TEXT NOT NULL,
        stream_sequence INTEGER NOT NULL,
        subject TEXT NOT NULL,
        reason TEXT NOT NULL,
        headers TEXT NOT NULL,
        payload BLOB NOT NULL,
        failed_at INTEGER NOT NULL DEFAULT ",
        now_ms!(),
        ",
        published_ns INTEGER NOT NULL DEFAULT 0
    )"
    ),
    "CREATE UNIQUE INDEX IF NOT EXISTS idem_dead_letters_delivery
        ON idem_dead_letters (consumer, stream, stream_sequence, published_ns)",
    // The last stream sequence applied per ordering key, for handlers with
    // `refuse_out_of_order` (store::key_sequences).
    "CREATE TABLE IF NOT EXISTS idem_key_sequences (
        consumer TEXT NOT NULL,
        order_key TEXT NOT NULL,
        stream_sequence INTEGER NOT NULL,
        PRIMARY KEY (consumer, order_key)
    ) WITHOUT ROWID",
    // Deployment high-water marks (store::deploy_marks).
    "CREATE TABLE IF NOT EXISTS idem_deploy_marks (
        handler TEXT PRIMARY KEY,
        sequence INTEGER NOT NULL,
        revision INTEGER NOT NULL,
        record TEXT NOT NULL
    )",
    // The outbox (store::outbox): rows of committed messages to send.
    "CREATE TABLE IF NOT EXISTS idem_outbox (
        id INTEGER PRIMARY KEY,
        consumer TEXT NOT NULL,
        message_id TEXT NOT NULL,
        call_index INTEGER NOT NULL,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        payload BLOB NOT NULL,
        headers TEXT NOT NULL,
        ordering_key TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        due_ms INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        created_ms INTEGER NOT NULL DEFAULT 0,
        UNIQUE (consumer, message_id, call_index)
    )",
    "CREATE INDEX IF NOT EXISTS idem_outbox_due ON idem_outbox (due_ms, id)",
    // The claim's ordering-key rule looks up earlier rows of a key.
    "CREATE INDEX IF NOT EXISTS idem_outbox_key ON idem_outbox (consumer, ordering_key, id) WHERE ordering_key IS NOT NULL",
];

/// Where `idem_dead_letters` is created in [`HOST_TABLES`].
const DEAD_LETTERS_DDL: usize = 4;

/// Columns of `idem_dead_letters` before `published_ns`, copied as they are
/// when [`upgrade_dead_letters`] rebuilds the table.
const DEAD_LETTER_COLUMNS_V1: &str = "id, consumer, message_id, stream, stream_sequence, subject, reason, headers, payload, failed_at";

/// A dead-letter table from before `published_ns` has the key
/// `UNIQUE (consumer, stream, stream_sequence)`, which a stream created
/// again (its sequences start over) collides with. SQLite cannot drop a
/// table constraint, so the table is rebuilt (the procedure of
/// <https://www.sqlite.org/lang_altertable.html#otheralter>): a new table,
/// every row copied with `published_ns = 0`, the old one dropped, the new one
/// renamed, inside the caller's transaction (SQLite's DDL is
/// transactional). A no-op on a current table or none.
async fn upgrade_dead_letters(tx: &mut Transaction<'static, Sqlite>) -> Result<(), sqlx::Error> {
    let current: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pragma_table_info('idem_dead_letters') WHERE name = 'published_ns'",
    )
    .fetch_one(&mut **tx)
    .await?;
    let exists: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'idem_dead_letters'",
    )
    .fetch_one(&mut **tx)
    .await?;
    if current == 1 || exists == 0 {
        return Ok(());
    }
    let create = HOST_TABLES[DEAD_LETTERS_DDL].replace(
        "CREATE TABLE IF NOT EXISTS idem_dead_letters (",
        "CREATE TABLE idem_dead_letters_v2 (",
    );
    for step in [
        create,
        format!(
            "INSERT INTO idem_dead_letters_v2 ({DEAD_LETTER_COLUMNS_V1}, published_ns)
             SELECT {DEAD_LETTER_COLUMNS_V1}, 0 FROM idem_dead_letters"
        ),
        "DROP TABLE idem_dead_letters".to_string(),
        "ALTER TABLE idem_dead_letters_v2 RENAME TO idem_dead_letters".to_string(),
    ] {
        sqlx::query(AssertSqlSafe(step)).execute(&mut **tx).await?;
    }
    tracing::info!(
        "idem_dead_letters upgraded: its key now includes the publish time (published_ns)"
    );
    Ok(())
}

/// A receipts table from before `published_ms` gets the column, each row
/// set to its `processed_at` (never earlier than its message's publish
/// time, give or take the skew between the database's and the broker's
/// clocks, once), inside the caller's transaction. A no-op on a current
/// table or none.
async fn upgrade_receipts(tx: &mut Transaction<'static, Sqlite>) -> Result<(), sqlx::Error> {
    let (exists, current): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'idem_receipts'),
                (SELECT count(*) FROM pragma_table_info('idem_receipts') WHERE name = 'published_ms')",
    )
    .fetch_one(&mut **tx)
    .await?;
    if current == 1 || exists == 0 {
        return Ok(());
    }
    for step in [
        "ALTER TABLE idem_receipts ADD COLUMN published_ms INTEGER NOT NULL DEFAULT 0",
        "UPDATE idem_receipts SET published_ms = processed_at",
    ] {
        sqlx::query(step).execute(&mut **tx).await?;
    }
    tracing::info!(
        "idem_receipts upgraded: receipts keep their message's publish time (published_ms), set to processed_at for the rows it held"
    );
    Ok(())
}

/// An outbox table from before `created_ms` gets the column (0 for the
/// rows it holds: their age is not known). A no-op on a current table or
/// none.
async fn upgrade_outbox(tx: &mut Transaction<'static, Sqlite>) -> Result<(), sqlx::Error> {
    let (exists, current): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'idem_outbox'),
                (SELECT count(*) FROM pragma_table_info('idem_outbox') WHERE name = 'created_ms')",
    )
    .fetch_one(&mut **tx)
    .await?;
    if current == 1 || exists == 0 {
        return Ok(());
    }
    sqlx::query("ALTER TABLE idem_outbox ADD COLUMN created_ms INTEGER NOT NULL DEFAULT 0")
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Creates or upgrades the host tables under `BEGIN IMMEDIATE` (the write
/// lock), so hosts starting together do it once.
pub(super) async fn prepare_host_tables(pool: &SqlitePool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    upgrade_dead_letters(&mut tx).await?;
    upgrade_receipts(&mut tx).await?;
    upgrade_outbox(&mut tx).await?;
    for ddl in HOST_TABLES {
        sqlx::query(ddl).execute(&mut *tx).await?;
    }
    tx.commit().await
}
