//! The PostgreSQL the tests use, and the URLs derived from it.

/// The default of [`pg_url`]: a superuser without a password on the local
/// server, over plain TCP. Plain TCP because sqlx 0.9.0 does not set
/// TCP_NODELAY, so every new TLS connection waits out delayed ACKs (about
/// 90 ms on loopback), which the tests that open and terminate sessions in
/// a loop would spend their time on; TLS has its own tests
/// (`tests/tests/secure_connections.rs`, a TLS-only cluster).
pub const PG_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable";

/// The PostgreSQL the tests use, as an admin URL (a role that may create
/// databases, schemas and roles): `IDEM_TEST_PG` when set, else
/// [`PG_URL_DEFAULT`].
pub fn pg_url() -> String {
    std::env::var("IDEM_TEST_PG").unwrap_or_else(|_| PG_URL_DEFAULT.into())
}

/// [`pg_url`] with the user replaced by `user` (no password); host,
/// database and query kept.
///
/// # Panics
/// When [`pg_url`] has no `scheme://`.
pub fn pg_url_as(user: &str) -> String {
    let url = pg_url();
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let host_and_db = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
    format!("{scheme}://{user}@{host_and_db}")
}

/// [`pg_url`] with `search_path` set to `schema` for every connection
/// (an `options=-c search_path=…` query parameter).
pub fn pg_url_in_schema(schema: &str) -> String {
    let url = pg_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-c%20search_path%3D{schema}")
}

/// `url` (any `postgres://` URL) with its database name replaced by `name`,
/// or added when it has none; user, host and query kept.
pub fn pg_url_with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let host_part = match base[authority_start..].find('/') {
        Some(i) => &base[..authority_start + i],
        None => base,
    };
    format!("{host_part}/{name}{query}")
}

#[cfg(test)]
mod tests {
    use super::pg_url_with_database;

    #[test]
    fn the_database_name_is_replaced_and_the_query_kept() {
        assert_eq!(
            pg_url_with_database("postgres://u@h:5432/test?sslmode=disable", "d1"),
            "postgres://u@h:5432/d1?sslmode=disable"
        );
        assert_eq!(
            pg_url_with_database("postgres://u@h:5432/test", "d1"),
            "postgres://u@h:5432/d1"
        );
        assert_eq!(
            pg_url_with_database("postgres://h", "d1"),
            "postgres://h/d1"
        );
    }
}
