//! A PostgreSQL connection carries no session state from one use to the
//! next: whatever a statement changed (settings, role, session authorization,
//! advisory locks, listeners, temporary tables) is undone when the connection
//! returns to the pool. And the connecting user's superuser flag, which
//! decides whether handler roles are a boundary, is read correctly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_test_support::pg_url;

use idem::store::Database;

#[tokio::test]
async fn session_state_does_not_survive_release() {
    let db = Database::connect(&pg_url(), 1).await.unwrap();
    let Some(pool) = db.postgres_pool() else {
        unreachable!()
    };
    let key: i64 = 0x6964_656d_7e57;
    let (backend, default_app): (i32, String) =
        sqlx::query_as("SELECT pg_backend_pid(), current_setting('application_name')")
            .fetch_one(pool)
            .await
            .unwrap();
    {
        let mut conn = pool.acquire().await.unwrap();
        sqlx::raw_sql(
            "SET application_name = 'left-behind'; SET statement_timeout = '1h'; \
             SET ROLE pg_read_all_data; LISTEN idem_test; \
             CREATE TEMP TABLE idem_left_behind (x int)",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    // One connection in the pool: the same backend, reset.
    let row: (i32, String, String, String, i64, i64, i64) = sqlx::query_as(
        "SELECT pg_backend_pid(), current_setting('application_name'), \
         current_setting('statement_timeout'), current_user::text, \
         (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()), \
         (SELECT count(*) FROM pg_listening_channels()), \
         (SELECT count(*) FROM pg_class WHERE relname = 'idem_left_behind')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        row,
        (backend, default_app, "0".into(), "postgres".into(), 0, 0, 0)
    );
    db.close().await;
}

#[tokio::test]
async fn the_connecting_user_is_known() {
    let db = Database::connect(&pg_url(), 1).await.unwrap();
    let (user, superuser) = db.session_user().await.unwrap().unwrap();
    let Some(pool) = db.postgres_pool() else {
        unreachable!()
    };
    let (want_user, want_super): (String, bool) = sqlx::query_as(
        "SELECT session_user::text, usesuper FROM pg_user WHERE usename = session_user",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!((user, superuser), (want_user, want_super));
    db.close().await;
}

#[tokio::test]
async fn a_transaction_begins_on_a_live_connection_after_the_pooled_ones_were_terminated() {
    let db = Database::connect(&pg_url(), 2).await.unwrap();
    let Some(pool) = db.postgres_pool() else {
        unreachable!()
    };
    let pid = "SELECT pg_backend_pid()";
    let (mut a, mut b) = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
    let pids: Vec<i32> = vec![
        sqlx::query_scalar(pid).fetch_one(&mut *a).await.unwrap(),
        sqlx::query_scalar(pid).fetch_one(&mut *b).await.unwrap(),
    ];
    drop((a, b));
    while pool.num_idle() < 2 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Both idle connections' backends end (as in a server restart); the
    // pool does not ping a connection before handing it out.
    let admin = Database::connect(&pg_url(), 1).await.unwrap();
    let Some(admin_pool) = admin.postgres_pool() else {
        unreachable!()
    };
    let ended: Vec<bool> =
        sqlx::query_scalar("SELECT pg_terminate_backend(p) FROM unnest($1::int[]) AS p")
            .bind(&pids)
            .fetch_all(admin_pool)
            .await
            .unwrap();
    assert_eq!(ended, vec![true, true]);
    loop {
        let left: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)")
                .bind(&pids)
                .fetch_one(admin_pool)
                .await
                .unwrap();
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    for _ in 0..3 {
        let tx = db.begin().await.unwrap();
        tx.rollback().await.unwrap();
    }
    admin.close().await;
    db.close().await;
}
