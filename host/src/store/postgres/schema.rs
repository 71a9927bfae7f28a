//! PostgreSQL: the host tables, created (and upgraded from earlier
//! versions) at start.

use sqlx::{PgPool, Postgres, Transaction};

/// Where `idem_receipts` is created in [`HOST_TABLES`]: [`upgrade_receipts`]
/// runs right after it.
const RECEIPTS_DDL: usize = 0;

const HOST_TABLES: [&str; 14] = [
    "CREATE TABLE IF NOT EXISTS idem_receipts (
        consumer TEXT NOT NULL,
        message_id TEXT NOT NULL,
        stream_sequence BIGINT NOT NULL,
        module_digest TEXT NOT NULL,
        processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        published_ms BIGINT NOT NULL,
        PRIMARY KEY (consumer, message_id)
    )",
    // Pruning reads one consumer's oldest receipts by publish time (store::retention).
    "CREATE INDEX IF NOT EXISTS idem_receipts_consumer_published_ms
        ON idem_receipts (consumer, published_ms)",
    // Superseded by the index above; they only cost inserts.
    "DROP INDEX IF EXISTS idem_receipts_processed_at",
    "DROP INDEX IF EXISTS idem_receipts_consumer_processed_at",
    // The last stream sequence applied per ordering key, for handlers with
    // `refuse_out_of_order` (store::key_sequences).
    "CREATE TABLE IF NOT EXISTS idem_key_sequences (
        consumer TEXT NOT NULL,
        order_key TEXT NOT NULL,
        stream_sequence BIGINT NOT NULL,
        PRIMARY KEY (consumer, order_key)
    )",
    // Deployment high-water marks (store::deploy_marks).
    "CREATE TABLE IF NOT EXISTS idem_deploy_marks (
        handler TEXT PRIMARY KEY,
        sequence BIGINT NOT NULL,
        revision BIGINT NOT NULL,
        record TEXT NOT NULL
    )",
    // The outbox (store::outbox): rows of committed messages to send.
    "CREATE TABLE IF NOT EXISTS idem_outbox (
        id BIGSERIAL PRIMARY KEY,
        consumer TEXT NOT NULL,
        message_id TEXT NOT NULL,
        call_index BIGINT NOT NULL,
        kind TEXT NOT NULL,
        target TEXT NOT NULL,
        payload BYTEA NOT NULL,
        headers TEXT NOT NULL,
        ordering_key TEXT,
        attempts BIGINT NOT NULL DEFAULT 0,
        due_ms BIGINT NOT NULL DEFAULT 0,
        last_error TEXT,
        created_ms BIGINT NOT NULL DEFAULT 0,
        UNIQUE (consumer, message_id, call_index)
    )",
    // A table from before `created_ms` (0 for the rows it holds).
    "ALTER TABLE idem_outbox ADD COLUMN IF NOT EXISTS created_ms BIGINT NOT NULL DEFAULT 0",
    "CREATE INDEX IF NOT EXISTS idem_outbox_due ON idem_outbox (due_ms, id)",
    "CREATE TABLE IF NOT EXISTS idem_dead_letters (
        id BIGSERIAL PRIMARY KEY,
        consumer TEXT NOT NULL,
        message_id TEXT,
        stream TEXT NOT NULL,
        stream_sequence BIGINT NOT NULL,
        subject TEXT NOT NULL,
        reason TEXT NOT NULL,
        headers TEXT NOT NULL,
        payload BYTEA NOT NULL,
        failed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        published_ns BIGINT NOT NULL DEFAULT 0
    )",
    // A table from before `published_ns`: add it (0 for the rows it holds)
    // and replace the key without it, which a stream created again (its
    // sequences start over) would collide with.
    "ALTER TABLE idem_dead_letters ADD COLUMN IF NOT EXISTS published_ns BIGINT NOT NULL DEFAULT 0",
    "CREATE UNIQUE INDEX IF NOT EXISTS idem_dead_letters_delivery
        ON idem_dead_letters (consumer, stream, stream_sequence, published_ns)",
    "ALTER TABLE idem_dead_letters
        DROP CONSTRAINT IF EXISTS idem_dead_letters_consumer_stream_stream_sequence_key",
    // The claim's ordering-key rule looks up earlier rows of a key.
    "CREATE INDEX IF NOT EXISTS idem_outbox_key ON idem_outbox (consumer, ordering_key, id) WHERE ordering_key IS NOT NULL",
];

/// Creates or upgrades the host tables under a transaction-scoped advisory
/// lock, so hosts starting together do it once.
pub(super) async fn prepare_host_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(crate::store::advisory::HOST_TABLES)
        .execute(&mut *tx)
        .await?;
    for (i, ddl) in HOST_TABLES.iter().enumerate() {
        sqlx::query(*ddl).execute(&mut *tx).await?;
        if i == RECEIPTS_DDL {
            upgrade_receipts(&mut tx).await?;
        }
    }
    tx.commit().await
}

/// A receipts table from before `published_ms` gets the column, each row
/// set to its `processed_at` (never earlier than its message's publish
/// time, give or take the skew between the database's and the broker's
/// clocks, once), inside the caller's transaction. Checked in the catalog
/// first, so a current table costs no scan. A no-op on a current table.
async fn upgrade_receipts(tx: &mut Transaction<'static, Postgres>) -> Result<(), sqlx::Error> {
    let current: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                        WHERE attrelid = 'idem_receipts'::regclass
                          AND attname = 'published_ms' AND NOT attisdropped)",
    )
    .fetch_one(&mut **tx)
    .await?;
    if current {
        return Ok(());
    }
    for step in [
        "ALTER TABLE idem_receipts ADD COLUMN published_ms BIGINT NOT NULL DEFAULT 0",
        "UPDATE idem_receipts SET published_ms = (extract(epoch FROM processed_at) * 1000)::bigint",
        "ALTER TABLE idem_receipts ALTER COLUMN published_ms DROP DEFAULT",
    ] {
        sqlx::query(step).execute(&mut **tx).await?;
    }
    tracing::info!(
        "idem_receipts upgraded: receipts keep their message's publish time (published_ms), set to processed_at for the rows it held"
    );
    Ok(())
}
