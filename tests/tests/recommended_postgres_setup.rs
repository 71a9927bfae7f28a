//! docs/handlers.md's recommended PostgreSQL set-up, end to end: idem connects as a
//! non-superuser that owns the database and may create roles. It creates the
//! host tables, applies the handler's migrations, sets up the handler's role
//! (privileges on the granted tables only) and processes exactly once; it is
//! not a superuser, so the role is a boundary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use sqlx::Connection as _;

/// The login docs/handlers.md recommends (`CREATE ROLE idem LOGIN CREATEROLE`), under
/// a name of its own; roles are cluster-wide, so it is created once and kept.
const USER: &str = "idem_recommended";

#[tokio::test]
async fn a_non_superuser_owner_runs_idem_with_handler_roles() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Postgres).await;
    let database = db.pg_database().unwrap().to_string();
    {
        let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
        for sql in [
            format!(
                "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{USER}') \
                 THEN CREATE ROLE {USER} LOGIN CREATEROLE; END IF; END $$"
            ),
            format!("ALTER DATABASE {database} OWNER TO {USER}"),
            // Someone else's table in the same database: never granted.
            "CREATE TABLE secrets (v TEXT)".to_string(),
            "INSERT INTO secrets VALUES ('CANARY')".to_string(),
        ] {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut admin)
                .await
                .unwrap();
        }
    }
    let (prefix, _) = db.url.rsplit_once('@').unwrap();
    let (scheme, _) = prefix.split_once("://").unwrap();
    let url = format!("{scheme}://{USER}@{}", db.url.rsplit_once('@').unwrap().1);
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("credit", "credit")],
    );
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(&db.url, &url);
    std::fs::write(&cfg, text).unwrap();

    let host = RunningHost::start(&cfg).await;
    let js = nats.jetstream().await;
    publish(&js, "accounts.credit", &credit("e1", 1, 40), &[]).await;
    publish(&js, "accounts.credit", &credit("e1", 1, 40), &[]).await;
    publish(&js, "accounts.credit", &credit("e2", 1, 2), &[]).await;
    let s = host
        .wait_for("credit", "3 deliveries", |s| {
            s.processed + s.duplicates == 3
        })
        .await;
    assert_eq!((s.processed, s.duplicates, s.dead_lettered), (2, 1, 0));
    host.stop().await;
    assert_eq!(db.balance(1).await, Some(42));
    assert_eq!(db.receipts("credit").await, 2);

    // As the login idem uses: not a superuser; the tables are its own; the
    // handler's role holds the granted table only.
    let idem = idem::store::Database::connect(&url, 1).await.unwrap();
    assert_eq!(
        idem.session_user().await.unwrap(),
        Some((USER.to_string(), false))
    );
    let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
    let row: (String, String, bool, bool, bool) = sqlx::query_as(
        "SELECT (SELECT tableowner::text FROM pg_tables WHERE tablename = 'accounts'), \
                (SELECT tableowner::text FROM pg_tables WHERE tablename = 'idem_receipts'), \
                has_table_privilege('idem_handler_credit_bc62a3c1', 'accounts', 'UPDATE'), \
                has_table_privilege('idem_handler_credit_bc62a3c1', 'secrets', 'SELECT'), \
                has_table_privilege('idem_handler_credit_bc62a3c1', 'idem_receipts', 'SELECT')",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    assert_eq!(
        row,
        (USER.to_string(), USER.to_string(), true, false, false)
    );
    // A non-superuser cannot take another session identity back.
    let e = sqlx::raw_sql("SET SESSION AUTHORIZATION postgres")
        .execute(&mut c)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("permission denied"), "{e}");
    c.close().await.unwrap();
}
