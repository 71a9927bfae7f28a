//! Handler migrations: sqlx's migrator, recorded per handler, idempotent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
use common::raw;
use idem_test_support::{pg_url, unique};

use idem::store::{Database, migrations_table};
use std::path::Path;

async fn scalar(db: &Database, sql: String) -> i64 {
    match (db.postgres_pool(), db.sqlite_pool()) {
        (Some(p), _) => {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(p)
                .await
        }
        (None, Some(p)) => {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(p)
                .await
        }
        (None, None) => unreachable!("no backend"),
    }
    .unwrap()
}

fn write_migrations(dir: &Path, table: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("1_create.sql"),
        format!("CREATE TABLE {table} (account_id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);"),
    )
    .unwrap();
    std::fs::write(
        dir.join("2_seed.sql"),
        format!("INSERT INTO {table} VALUES (1, 100);"),
    )
    .unwrap();
}

async fn per_handler_and_idempotent(db: &Database) {
    let tmp = tempfile::tempdir().unwrap();
    let (h1, h2) = (unique("h1"), unique("h2"));
    let (t1, t2) = (unique("acc"), unique("acc"));
    write_migrations(&tmp.path().join("a"), &t1);
    write_migrations(&tmp.path().join("b"), &t2);

    db.migrate_handler(&h1, &tmp.path().join("a"))
        .await
        .unwrap();
    db.migrate_handler(&h1, &tmp.path().join("a"))
        .await
        .unwrap();
    assert_eq!(scalar(db, format!("SELECT count(*) FROM {t1}")).await, 1);
    // The second handler's versions 1 and 2 are its own: they run although h1 has 1 and 2.
    db.migrate_handler(&h2, &tmp.path().join("b"))
        .await
        .unwrap();
    assert_eq!(
        scalar(db, format!("SELECT CAST(sum(balance) AS BIGINT) FROM {t2}")).await,
        100
    );
    for h in [&h1, &h2] {
        let n = scalar(
            db,
            format!("SELECT count(*) FROM {} WHERE success", migrations_table(h)),
        )
        .await;
        assert_eq!(n, 2, "{h}");
    }

    // A changed migration that already ran is an error naming the handler.
    std::fs::write(
        tmp.path().join("a/2_seed.sql"),
        format!("INSERT INTO {t1} VALUES (2, 5);"),
    )
    .unwrap();
    let e = db
        .migrate_handler(&h1, &tmp.path().join("a"))
        .await
        .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.starts_with(&format!("migrations of handler `{h1}` in ")),
        "{msg}"
    );
    assert!(
        msg.contains("migration 2 was previously applied but has been modified"),
        "{msg}"
    );

    let e = db
        .migrate_handler(&h1, &tmp.path().join("missing"))
        .await
        .unwrap_err();
    assert!(
        format!("{e:#}").starts_with(&format!("migrations of handler `{h1}` in ")),
        "{e:#}"
    );

    for (h, t) in [(&h1, &t1), (&h2, &t2)] {
        raw(
            db,
            &format!("DROP TABLE {t}; DROP TABLE {}", migrations_table(h)),
        )
        .await;
    }
}

#[tokio::test]
async fn migrate_handler_per_handler_and_idempotent_pg() {
    per_handler_and_idempotent(&Database::connect(&pg_url(), 2).await.unwrap()).await;
}

#[tokio::test]
async fn migrate_handler_per_handler_and_idempotent_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::connect(
        &format!("sqlite://{}", dir.path().join("m.db").display()),
        2,
    )
    .await
    .unwrap();
    per_handler_and_idempotent(&db).await;
}

#[test]
fn migrations_table_names_are_safe_and_distinct() {
    assert_eq!(
        migrations_table("credit_projector"),
        "idem_migrations_credit_projector"
    );
    let hyphen = migrations_table("credit-projector");
    assert!(
        hyphen.starts_with("idem_migrations_credit_projector_"),
        "{hyphen}"
    );
    assert_ne!(hyphen, migrations_table("credit_projector"));
    assert_ne!(hyphen, migrations_table("Credit-Projector"));
    let long = migrations_table(&"x".repeat(100));
    assert_eq!(long.len(), 63);
    assert_ne!(long, migrations_table(&"x".repeat(101)));
    assert!(
        migrations_table("a\"; DROP TABLE t; --")
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
    );
}
