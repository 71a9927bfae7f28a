//! Helpers shared by the host's integration tests: where PostgreSQL is,
//! where the built guests are, unique names, raw SQL.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::store::Database;
use sqlx::AssertSqlSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The PostgreSQL the tests use: `IDEM_TEST_PG`, default
/// `postgres://postgres@127.0.0.1:5432/test` (a superuser without password).
pub fn pg_url() -> String {
    std::env::var("IDEM_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// [`pg_url`] with the user replaced by `user` (no password).
pub fn pg_url_as(user: &str) -> String {
    let url = pg_url();
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let host_and_db = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
    format!("{scheme}://{user}@{host_and_db}")
}

/// [`pg_url`] with `search_path` set to `schema` for every connection.
pub fn pg_url_in_schema(schema: &str) -> String {
    let url = pg_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set, else `target/`
/// in the workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// A file under the target directory that `scripts/build-guests.sh` builds.
pub fn built(rel: &str) -> PathBuf {
    let p = target_dir().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run scripts/build-guests.sh first",
        p.display()
    );
    p
}

/// A built guest component, `<target>/guests/NAME`.
pub fn guest(name: &str) -> PathBuf {
    built(&format!("guests/{name}"))
}

/// `prefix` made unique to this process and call (a valid SQL identifier
/// when `prefix` is one).
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `sql` (one or more statements) outside any transaction; panics
/// with the statement on error.
pub async fn raw(db: &Database, sql: &str) {
    match (db.postgres_pool(), db.sqlite_pool()) {
        (Some(p), _) => sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(p)
            .await
            .map(|_| ()),
        (None, Some(p)) => sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(p)
            .await
            .map(|_| ()),
        (None, None) => unreachable!("no backend"),
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
}
