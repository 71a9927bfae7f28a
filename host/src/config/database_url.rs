//! The query parameters of a PostgreSQL `[database] url`, checked at load:
//! only those the driver reads are accepted. The driver (sqlx) logs any
//! other parameter with its value on every connect ("ignoring unrecognized
//! connect parameter"), so a secret in one (libpq's `sslpassword`, a
//! `Password=` in the wrong case) would reach the log; such a URL is refused
//! before it gets there, with a line that names the parameter and never
//! shows its value.

use crate::log_format;

/// The parameters the PostgreSQL driver reads (sqlx 0.9's
/// `PgConnectOptions`), besides `options[NAME]`. Names are case-sensitive.
pub const POSTGRES_PARAMETERS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// Checks the parameters of `url` when it is a PostgreSQL one
/// (`postgres://`, `postgresql://`); any other URL passes (SQLite's driver
/// refuses an unknown parameter itself, naming only the parameter).
///
/// # Errors
/// One line naming the first parameter the driver does not read, what to
/// do instead, and that its value is not shown.
pub fn check(url: &str) -> Result<(), String> {
    let Ok(parsed) = url::Url::parse(url.trim()) else {
        return Ok(());
    };
    if !matches!(parsed.scheme(), "postgres" | "postgresql") {
        return Ok(());
    }
    for (name, _) in parsed.query_pairs() {
        if POSTGRES_PARAMETERS.contains(&&*name) || is_options_entry(&name) {
            continue;
        }
        return Err(unsupported(&name));
    }
    Ok(())
}

/// `options[NAME]`: one server setting (`options[search_path]=…`).
fn is_options_entry(name: &str) -> bool {
    name.strip_prefix("options[")
        .is_some_and(|rest| rest.ends_with(']'))
}

fn unsupported(name: &str) -> String {
    let (shown, _, kept) = log_format::escape_within(name, 64);
    let shown = if kept < name.len() {
        format!("{shown}…")
    } else {
        shown
    };
    let hint = if name.eq_ignore_ascii_case("sslpassword") {
        "an encrypted client key is not supported: give `sslkey` a key file without a passphrase, readable only by idem, and remove the parameter".to_owned()
    } else if let Some(known) = POSTGRES_PARAMETERS
        .iter()
        .find(|p| p.eq_ignore_ascii_case(name))
    {
        format!("parameter names are case-sensitive: write `{known}`")
    } else {
        format!(
            "remove it; the parameters read are {} and options[NAME]",
            POSTGRES_PARAMETERS.join(", ")
        )
    };
    format!(
        "parameter `{shown}` is not one idem's PostgreSQL connection reads (its value is not shown); {hint}"
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn known_parameters_pass() {
        for url in [
            "postgres://u:pw@h:5432/db",
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&sslcert=/c&sslkey=/k",
            "postgresql://h/db?password=x&application_name=idem&options[search_path]=app",
            "sqlite://idem.db?mode=rwc",
            "sqlite::memory:",
            "not a url",
        ] {
            assert_eq!(check(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn a_parameter_the_driver_ignores_is_refused_without_its_value() {
        let e = check("postgres://u@h/db?sslmode=require&sslpassword=k3y-s3cret").unwrap_err();
        assert_eq!(
            e,
            "parameter `sslpassword` is not one idem's PostgreSQL connection reads (its value is not shown); an encrypted client key is not supported: give `sslkey` a key file without a passphrase, readable only by idem, and remove the parameter"
        );
        let e = check("postgres://u@h/db?Password=s3cret").unwrap_err();
        assert_eq!(
            e,
            "parameter `Password` is not one idem's PostgreSQL connection reads (its value is not shown); parameter names are case-sensitive: write `password`"
        );
        let e = check("postgres://h/db?connect_timeout=10").unwrap_err();
        assert!(
            e.starts_with("parameter `connect_timeout` is not one idem's PostgreSQL connection reads (its value is not shown); remove it; the parameters read are sslmode, "),
            "{e}"
        );
        // A name made to break a line is escaped and cut.
        let e = check(&format!("postgres://h/db?a%0Ab{}=v", "x".repeat(100))).unwrap_err();
        assert!(
            e.starts_with(&format!("parameter `a\\nb{}…`", "x".repeat(59))),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
}
