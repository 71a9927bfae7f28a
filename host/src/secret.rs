//! Secrets in the configuration never print: [`Secret`] is a string whose
//! `Debug` and `Serialize` write [`MASK`], and [`redact_url`] masks the
//! password of a URL. Error messages, logs and `idem config check` go
//! through them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What a masked secret prints as.
pub const MASK: &str = "***";

/// A secret value (a broker token, say): read from the config, the
/// environment or a file, used when connecting, printed only as [`MASK`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the one place that hands it on (the connect call).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({MASK})")
    }
}

impl Serialize for Secret {
    /// Always [`MASK`]: a serialized config is for showing.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(MASK)
    }
}

impl<'de> Deserialize<'de> for Secret {
    /// A string, or a number or boolean taken as its text (an environment
    /// variable holding only digits reads as a number).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = Secret;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, v: &str) -> Result<Secret, E> {
                Ok(Secret::new(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Secret, E> {
                Ok(Secret::new(v.to_string()))
            }
        }
        d.deserialize_any(Text)
    }
}

/// `url` with every secret replaced by [`MASK`]: the userinfo's password,
/// and the value of every query parameter whose name says it carries one
/// ([`is_secret_parameter`]: `password`, libpq's `sslpassword`, …, in any
/// case). A URL that does not parse is masked whole (`<unparsable url>`),
/// since where its secrets are cannot be told. A URL without a secret
/// (SQLite's, say) is unchanged. A comma-separated list of URLs (NATS
/// accepts one) is masked URL by URL.
pub fn redact_url(url: &str) -> String {
    if url.contains(',') {
        return url.split(',').map(redact_one).collect::<Vec<_>>().join(",");
    }
    redact_one(url)
}

/// Whether a URL query parameter named `name` carries a secret: its name,
/// in any case, contains `password`, `passwd`, `passphrase`, `secret` or
/// `token` (`password`, `sslpassword`, `Password`, `auth_token`, …).
pub fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "passwd", "passphrase", "secret", "token"]
        .iter()
        .any(|word| name.contains(word))
}

fn redact_one(url: &str) -> String {
    const UNPARSABLE: &str = "<unparsable url>";
    let Ok(mut parsed) = url::Url::parse(url.trim()) else {
        return UNPARSABLE.to_owned();
    };
    // No authority to read a password from (`sqlite:…`, `u:pw@h`): any `@`
    // might follow one.
    if parsed.cannot_be_a_base() && url.contains('@') {
        return UNPARSABLE.to_owned();
    }
    let secret_param = parsed.query_pairs().any(|(k, _)| is_secret_parameter(&k));
    if parsed.password().is_none() && !secret_param {
        return url.to_owned();
    }
    if parsed.password().is_some() && parsed.set_password(Some(MASK)).is_err() {
        return UNPARSABLE.to_owned();
    }
    if secret_param {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(k, v)| {
                let v = if is_secret_parameter(&k) {
                    MASK.to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?password=x&sslmode=disable"),
            "postgres://u@h/db?password=***&sslmode=disable"
        );
        assert_eq!(redact_url("sqlite://idem.db"), "sqlite://idem.db");
        assert_eq!(
            redact_url("nats://u:pw@a:4222,nats://b:4222"),
            "nats://u:***@a:4222,nats://b:4222"
        );
    }

    #[test]
    fn redacts_only_what_is_a_password() {
        // No password, or a user only: unchanged.
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(
            redact_url("postgres://u@h:5432/db"),
            "postgres://u@h:5432/db"
        );
        // A percent-encoded password (with `@` and `:` in it) goes whole.
        let r = redact_url("postgresql://u:p%40ss%3Aw@h/db?sslmode=disable");
        assert_eq!(r, "postgresql://u:***@h/db?sslmode=disable");
        assert!(!r.contains("p%40ss") && !r.contains("ss%3Aw"), "{r}");
        // Both places, and the parameter in any case.
        let r = redact_url("postgres://u:a@h/db?PASSWORD=b");
        assert_eq!(r, "postgres://u:***@h/db?PASSWORD=***");
        // libpq's client-key passphrase, and any other secret parameter.
        let r = redact_url(
            "postgres://u@h/db?sslmode=verify-full&sslpassword=k3y&Password=pw&auth_token=t&sslkey=/k",
        );
        assert_eq!(
            r,
            "postgres://u@h/db?sslmode=verify-full&sslpassword=***&Password=***&auth_token=***&sslkey=%2Fk"
        );
        assert!(
            !r.contains("k3y") && !r.contains("=pw") && !r.contains("=t&"),
            "{r}"
        );
        // A percent-encoded parameter name is read decoded.
        assert_eq!(
            redact_url("postgres://h/db?ssl%70assword=k3y"),
            "postgres://h/db?sslpassword=***"
        );
        // SQLite URLs are left as they are.
        for u in [
            "sqlite::memory:",
            "sqlite:idem.db",
            "sqlite:///var/lib/idem/idem.db?mode=rwc",
        ] {
            assert_eq!(redact_url(u), u);
        }
    }

    #[test]
    fn an_unparsable_url_is_masked_whole() {
        for u in ["postgres://u:secret@[::1/db", "u:secret@h/db", ""] {
            let r = redact_url(u);
            assert!(!r.contains("secret"), "{u} -> {r}");
            assert_eq!(r, "<unparsable url>");
        }
    }

    #[test]
    fn a_secret_never_prints() {
        let s = Secret::new("tok3n");
        assert_eq!(format!("{s:?}"), "Secret(***)");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"***\"");
        assert_eq!(s.expose(), "tok3n");
        let n: Secret = serde_json::from_str("12345").unwrap();
        assert_eq!(n.expose(), "12345");
    }
}
