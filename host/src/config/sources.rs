//! Where the configuration comes from, layered with figment: the config file
//! ([`Toml`]) and over it the environment variables
//! `IDEM_<SECTION>__<KEY>` of the sections in [`ENV_SECTIONS`] ([`Env`]);
//! the environment wins. Other `IDEM_*` variables are not config and are
//! left alone.
//!
//! Every problem is reported, not only the first: each section and each
//! `[[handler]]` is read on its own, and a key that fails is set aside and
//! the rest read again. Secrets named by `*_file` keys are read here too,
//! relative to `$CREDENTIALS_DIRECTORY` (systemd's `LoadCredential=`) when
//! it is set, else to the config file's directory.

use super::{
    BrokerConfig, Config, ConfigError, DatabaseConfig, DeployConfig, HandlerConfig, RuntimeConfig,
    ServiceConfig,
};
use crate::secret::redact_url;
use figment::Figment;
use figment::error::{Actual, Kind};
use figment::providers::{Env, Format as _, Serialized, Toml};
use figment::value::{Dict, Value};
use serde::de::DeserializeOwned;
use std::fmt;
use std::path::{Path, PathBuf};

/// The prefix of every config environment variable.
pub const ENV_PREFIX: &str = "IDEM_";
/// The sections the environment may set (`[[handler]]` tables come from the
/// file only).
pub const ENV_SECTIONS: [&str; 5] = ["broker", "database", "service", "runtime", "deploy"];
/// Between the section and the key in a variable's name.
const ENV_SEPARATOR: &str = "__";
/// The keys of text and path values: their variables are taken as the text
/// they hold, whatever it looks like. figment reads a variable as TOML would
/// (`0123456789` as the number 123456789, `31337.25` as a float), which
/// would change a token or a password on its way in, or fail and print it.
const VERBATIM_KEYS: [&str; 21] = [
    "broker.url",
    "broker.token",
    "broker.token_file",
    "broker.user",
    "broker.password",
    "broker.password_file",
    "broker.nkey_seed",
    "broker.nkey_seed_file",
    "broker.creds_file",
    "broker.tls_ca_file",
    "broker.tls_cert_file",
    "broker.tls_key_file",
    "database.url",
    "database.password_file",
    "runtime.cache_dir",
    "deploy.modules_bucket",
    "deploy.deployments_bucket",
    "deploy.hosts_bucket",
    "deploy.shadows_bucket",
    "deploy.host_key",
    "service.listen",
];
/// The top-level keys of the file.
const SECTIONS: [&str; 6] = [
    "broker", "database", "service", "runtime", "deploy", "handler",
];

/// One problem with the configuration, one line: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// In the config file, or found by [`Config::validate`].
    File {
        /// The config file.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// In an environment variable.
    Env {
        /// The variable, e.g. `IDEM_DATABASE__URL`.
        var: String,
        /// What is wrong and what to do.
        message: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::File { path, message } => {
                write!(f, "invalid config {}: {message}", path.display())
            }
            Problem::Env { var, message } => {
                write!(f, "invalid environment variable {var}: {message}")
            }
        }
    }
}

/// The config environment variables: `IDEM_` then one of [`ENV_SECTIONS`]
/// then `__`; the key path is split at each `__` (`database.url`).
fn config_env() -> Env {
    Env::prefixed(ENV_PREFIX)
        .filter(|key| {
            let key = key.as_str().to_ascii_lowercase();
            key.split_once(ENV_SEPARATOR)
                .is_some_and(|(section, _)| ENV_SECTIONS.contains(&section))
        })
        .split(ENV_SEPARATOR)
}

/// The config file and over it the environment: the variables of
/// [`VERBATIM_KEYS`] as text, the others as figment reads them.
fn layered(text: &str, env: &Env) -> Figment {
    // Filters added after `split` see the dotted key.
    let parsed = env
        .clone()
        .filter(|key| !VERBATIM_KEYS.contains(&key.as_str()));
    let mut figment = Figment::new().merge(Toml::string(text)).merge(parsed);
    for (key, value) in env.iter() {
        if VERBATIM_KEYS.contains(&key.as_str()) {
            figment = figment.merge(Serialized::default(key.as_str(), value));
        }
    }
    figment
}

/// The variable that sets `key` (a dotted path, `database.url`).
fn var_name(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.replace('.', ENV_SEPARATOR).to_ascii_uppercase()
    )
}

/// See [`Config::load`]; `credentials` is `$CREDENTIALS_DIRECTORY`.
pub(super) fn load(path: &Path, credentials: Option<&Path>) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let env = config_env();
    let mut reader = Reader {
        path: path.to_path_buf(),
        env_keys: env.iter().map(|(k, _)| k.as_str().to_owned()).collect(),
        problems: misnamed_vars(),
    };
    let figment = layered(&text, &env);
    let root = match figment.extract::<Dict>() {
        Ok(root) => root,
        Err(e) => {
            reader.file(one_line(&e.kind.to_string()));
            return Err(reader.into_error());
        }
    };
    for key in root.keys().filter(|k| !SECTIONS.contains(&k.as_str())) {
        reader.file(format!(
            "unknown field `{key}`, expected one of `broker`, `database`, `service`, `runtime`, `deploy`, `handler`"
        ));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let secrets = credentials.unwrap_or(base);
    let mut broker = reader.section::<BrokerConfig>(&root, "broker");
    if let Some(b) = &mut broker {
        reader.resolve_broker(b, secrets);
    }
    let mut database = reader.section::<DatabaseConfig>(&root, "database");
    if let Some(d) = &mut database {
        reader.read_password(d, secrets);
        if let Err(message) = super::database_url::check(&d.url) {
            reader.key_problem("database", "url", message);
        }
    }
    let service = reader.section::<ServiceConfig>(&root, "service");
    let mut runtime = reader.section::<RuntimeConfig>(&root, "runtime");
    if let Some(RuntimeConfig {
        cache_dir: Some(dir),
        ..
    }) = &mut runtime
        && dir.is_relative()
    {
        *dir = base.join(&*dir);
    }
    let mut deploy = reader.section::<DeployConfig>(&root, "deploy");
    if let Some(d) = &mut deploy
        && let Err(problems) = d.resolve(secrets)
    {
        for (key, message) in problems {
            reader.key_problem("deploy", key, message);
        }
    }
    let handlers = reader.handlers(&root);
    let (
        Some(broker),
        Some(database),
        Some(service),
        Some(runtime),
        Some(deploy),
        Some(mut handlers),
    ) = (broker, database, service, runtime, deploy, handlers)
    else {
        return Err(reader.into_error());
    };
    for h in &mut handlers {
        if h.module.is_relative() {
            h.module = base.join(&h.module);
        }
        if let Some(m) = &h.migrations
            && m.is_relative()
        {
            h.migrations = Some(base.join(m));
        }
    }
    let config = Config {
        broker,
        database,
        service,
        runtime,
        deploy,
        handlers,
    };
    // Validation reads whole values; after a problem above some are missing
    // or defaults standing in for them, and would mislead.
    if reader.problems.is_empty()
        && let Err(problems) = config.validate()
    {
        for message in problems {
            reader.file(message);
        }
    }
    if reader.problems.is_empty() {
        Ok(config)
    } else {
        Err(reader.into_error())
    }
}

/// `IDEM_*` variables that look meant as config but are not read: a
/// section joined to its key by one underscore, or a `[[handler]]` key.
fn misnamed_vars() -> Vec<Problem> {
    let mut problems = Vec::new();
    for (key, _) in Env::prefixed(ENV_PREFIX).iter() {
        let key = key.as_str();
        let var = var_name(key);
        if key.starts_with("handler__") {
            problems.push(Problem::Env {
                var,
                message: "[[handler]] tables are read from the config file only; unset it"
                    .to_owned(),
            });
            continue;
        }
        for section in SECTIONS {
            if let Some(rest) = key.strip_prefix(section).and_then(|r| r.strip_prefix('_'))
                && !rest.starts_with('_')
            {
                problems.push(Problem::Env {
                    message: format!(
                        "not read: a section and its key are separated by two underscores, as in {}",
                        var_name(&format!("{section}.{rest}"))
                    ),
                    var: var.clone(),
                });
            }
        }
    }
    problems
}

/// Reads sections and collects problems.
struct Reader {
    path: PathBuf,
    /// The key paths the environment sets (`database.url`).
    env_keys: Vec<String>,
    problems: Vec<Problem>,
}

impl Reader {
    fn into_error(self) -> ConfigError {
        ConfigError::Invalid {
            problems: self.problems,
        }
    }

    fn file(&mut self, message: String) {
        self.problems.push(Problem::File {
            path: self.path.clone(),
            message,
        });
    }

    /// The variable that set `section.key`, if the environment did.
    fn env_var(&self, section: &str, key: &str) -> Option<String> {
        let path = format!("{section}.{key}");
        let nested = format!("{path}.");
        self.env_keys
            .iter()
            .find(|k| **k == path || k.starts_with(&nested))
            .map(|k| var_name(k))
    }

    /// A problem with `section`'s `key`: the environment's when a variable
    /// set it, else the file's.
    fn key_problem(&mut self, section: &str, key: &str, message: String) {
        match self.env_var(section, key) {
            Some(var) => self.problems.push(Problem::Env { var, message }),
            None => self.file(format!("[{section}] {key}: {message}")),
        }
    }

    /// `[name]` from the merged file and environment; an absent section reads
    /// as an empty one (its defaults).
    fn section<T: DeserializeOwned>(&mut self, root: &Dict, name: &str) -> Option<T> {
        let mut value = root
            .get(name)
            .cloned()
            .unwrap_or_else(|| Value::from(Dict::new()));
        self.read(&mut value, Some(name), &format!("[{name}]"))
    }

    /// Every `[[handler]]`, each read on its own; `None` if any has a problem.
    fn handlers(&mut self, root: &Dict) -> Option<Vec<HandlerConfig>> {
        let items = match root.get("handler") {
            None => return Some(Vec::new()),
            Some(Value::Array(_, items)) => items,
            Some(_) => {
                self.file("`handler` must be [[handler]] tables".to_owned());
                return None;
            }
        };
        let mut handlers = Vec::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let label = match item.find_ref("name").and_then(Value::as_str) {
                Some(name) => format!("[[handler]] `{name}`"),
                None => format!("[[handler]] #{}", i + 1),
            };
            match self.read::<HandlerConfig>(&mut item.clone(), None, &label) {
                Some(h) => handlers.push(h),
                None => ok = false,
            }
        }
        ok.then_some(handlers)
    }

    /// Deserializes `value`; on an error reports it, sets the key aside and
    /// tries again, so every bad key is reported. `Some` only when nothing
    /// failed. `section` names an environment-settable section.
    fn read<T: DeserializeOwned>(
        &mut self,
        value: &mut Value,
        section: Option<&str>,
        label: &str,
    ) -> Option<T> {
        let mut set_aside: Vec<String> = Vec::new();
        loop {
            let e = match value.deserialize::<T>() {
                Ok(t) => return set_aside.is_empty().then_some(t),
                Err(e) => e,
            };
            if let Kind::MissingField(field) = &e.kind {
                // A required key set aside above is reported already.
                if !set_aside.iter().any(|k| k == field) {
                    let hint = section
                        .map(|s| format!(" or with {}", var_name(&format!("{s}.{field}"))))
                        .unwrap_or_default();
                    self.file(format!(
                        "{label} {field} is missing; set it in the file{hint}"
                    ));
                }
                return None;
            }
            let key = e.path.first().cloned().or_else(|| match &e.kind {
                Kind::UnknownField(k, _) => Some(k.clone()),
                _ => None,
            });
            let Some(key) = key else {
                self.file(format!("{label}: {}", describe(&e.kind)));
                return None;
            };
            match (
                &e.kind,
                section.and_then(|s| Some((s, self.env_var(s, &key)?))),
            ) {
                (Kind::UnknownField(k, expected), Some((s, var))) => {
                    let known: Vec<String> = expected
                        .iter()
                        .map(|f| var_name(&format!("{s}.{f}")))
                        .collect();
                    self.problems.push(Problem::Env {
                        var,
                        message: format!(
                            "[{s}] has no key `{k}`; unset it or use one of {}",
                            known.join(", ")
                        ),
                    });
                }
                (_, Some((_, var))) => self.problems.push(Problem::Env {
                    var,
                    message: format!("{label} {key}: {}", describe(&e.kind)),
                }),
                (Kind::UnknownField(k, expected), None) => {
                    let known: Vec<String> = expected.iter().map(|f| format!("`{f}`")).collect();
                    self.file(format!(
                        "{label}: unknown field `{k}`, expected one of {}",
                        known.join(", ")
                    ));
                }
                (_, None) => self.file(format!("{label} {key}: {}", describe(&e.kind))),
            }
            let removed = match value {
                Value::Dict(_, dict) => dict.remove(&key).is_some(),
                _ => false,
            };
            if !removed {
                return None;
            }
            set_aside.push(key);
        }
    }

    /// `[broker]`'s secret files read and its files checked
    /// ([`BrokerConfig::resolve`]).
    fn resolve_broker(&mut self, broker: &mut BrokerConfig, secrets: &Path) {
        if let Err(problems) = broker.resolve(secrets) {
            for (key, message) in problems {
                self.key_problem("broker", key, message);
            }
        }
    }

    /// `[database] password_file` read into `url`.
    fn read_password(&mut self, database: &mut DatabaseConfig, secrets: &Path) {
        let Some(file) = database.password_file.clone() else {
            return;
        };
        let file = secrets.join(file);
        let url = read_secret(&file).and_then(|password| with_password(&database.url, &password));
        match url {
            Ok(url) => database.url = url,
            Err(message) => self.key_problem("database", "password_file", message),
        }
        database.password_file = Some(file);
    }
}

/// The content of a secret file without its trailing newline.
///
/// # Errors
/// One line: the file cannot be read (and where relative paths are read
/// from), or it is empty.
pub(super) fn read_secret(file: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        format!(
            "cannot read {}: {e}; a relative path is read from $CREDENTIALS_DIRECTORY when set, else from the config file's directory",
            file.display()
        )
    })?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(format!("{} is empty", file.display()));
    }
    Ok(secret.to_owned())
}

/// `url` (PostgreSQL's) with `password` as its password, percent-encoded.
fn with_password(url: &str, password: &str) -> Result<String, String> {
    let mut parsed = url::Url::parse(url)
        .ok()
        .filter(|u| matches!(u.scheme(), "postgres" | "postgresql"))
        .ok_or_else(|| {
            format!(
                "a password file needs a postgres:// [database] url, not {}",
                redact_url(url)
            )
        })?;
    let in_query = parsed
        .query_pairs()
        .any(|(k, _)| k.eq_ignore_ascii_case("password"));
    if parsed.password().is_some() || in_query {
        return Err(
            "[database] url has a password already; keep it there or in the file, not both"
                .to_owned(),
        );
    }
    parsed
        .set_password(Some(password))
        .map_err(|()| format!("cannot put a password into {}", redact_url(url)))?;
    Ok(parsed.to_string())
}

/// A deserialization error's message, a string value's password masked.
fn describe(kind: &Kind) -> String {
    let actual = |a: &Actual| match a {
        Actual::Str(s) if s.contains('@') || s.contains("://") => {
            format!("string {:?}", redact_url(s))
        }
        other => other.to_string(),
    };
    match kind {
        Kind::InvalidType(a, expected) => format!("expected {expected}, found {}", actual(a)),
        Kind::InvalidValue(a, expected) => format!("expected {expected}, found {}", actual(a)),
        other => one_line(&other.to_string()),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    const HANDLER: &str =
        "[[handler]]\nname = \"h\"\nmodule = \"h.wasm\"\nstream = \"S\"\nsubjects = [\"s\"]\n";

    /// Loads `toml` from a fresh directory, with `secrets` as the
    /// credentials directory. The tests set no `IDEM_BROKER__*` or
    /// `IDEM_DATABASE__*` variables, so only the file counts.
    fn load_toml(
        toml: &str,
        secrets: Option<&Path>,
    ) -> (tempfile::TempDir, Result<Config, Vec<String>>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.toml");
        std::fs::write(&path, toml).unwrap();
        let result = load(&path, secrets).map_err(|e| match e {
            ConfigError::Invalid { problems } => problems.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        });
        (dir, result)
    }

    #[test]
    fn a_password_file_goes_into_the_url_percent_encoded() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pg-password"), "p@ss:w/rd\n").unwrap();
        let toml = format!(
            "[broker]\nurl = \"nats://127.0.0.1:4222\"\n[database]\nurl = \"postgres://idem@db.internal:5432/app?sslmode=require\"\npassword_file = \"pg-password\"\n{HANDLER}"
        );
        let (_cfg, c) = load_toml(&toml, Some(dir.path()));
        let c = c.unwrap();
        assert_eq!(
            c.database.url,
            "postgres://idem:p%40ss%3Aw%2Frd@db.internal:5432/app?sslmode=require"
        );
        assert_eq!(
            c.database.password_file,
            Some(dir.path().join("pg-password"))
        );
        let shown = c.to_masked_toml();
        assert!(
            shown.contains("url = \"postgres://idem:***@db.internal:5432/app?sslmode=require\""),
            "{shown}"
        );
        assert!(!shown.contains("p%40ss"), "{shown}");
    }

    #[test]
    fn a_token_file_is_read_next_to_the_config_and_never_shown() {
        let toml = format!(
            "[broker]\nurl = \"nats://127.0.0.1:4222\"\ntoken_file = \"nats-token\"\n{HANDLER}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.toml");
        std::fs::write(&path, &toml).unwrap();
        std::fs::write(dir.path().join("nats-token"), "s3cr3t-t0ken\r\n").unwrap();
        let c = load(&path, None).unwrap();
        assert_eq!(c.broker.token.as_ref().unwrap().expose(), "s3cr3t-t0ken");
        let shown = c.to_masked_toml();
        assert!(shown.contains("token = \"***\""), "{shown}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }

    #[test]
    fn secret_file_problems_are_one_line_each() {
        let toml = format!(
            "[broker]\nurl = \"nats://127.0.0.1:4222\"\ntoken = \"t\"\ntoken_file = \"t\"\n[database]\npassword_file = \"missing\"\n{HANDLER}"
        );
        let (dir, result) = load_toml(&toml, None);
        let path = dir.path().join("idem.toml");
        assert_eq!(
            result.unwrap_err(),
            vec![
                format!(
                    "invalid config {}: [broker] token_file: set either token or token_file, not both",
                    path.display()
                ),
                format!(
                    "invalid config {}: [database] password_file: cannot read {}: No such file or directory (os error 2); a relative path is read from $CREDENTIALS_DIRECTORY when set, else from the config file's directory",
                    path.display(),
                    dir.path().join("missing").display()
                ),
            ]
        );
        assert_eq!(
            with_password("sqlite://idem.db", "x").unwrap_err(),
            "a password file needs a postgres:// [database] url, not sqlite://idem.db"
        );
        assert_eq!(
            with_password("postgres://u:old@h/db", "x").unwrap_err(),
            "[database] url has a password already; keep it there or in the file, not both"
        );
    }

    #[test]
    fn every_problem_in_the_file_is_reported() {
        let toml = format!(
            "[broker]\nurl = 3\n[service]\nshutdown_grace = \"soon\"\nlisten = \"nowhere\"\n{HANDLER}tabels = []\nmax_deliver = -1\n[[handler]]\nname = \"h\"\nstream = \"S\"\nsubjects = [\"s\"]\n"
        );
        let (dir, result) = load_toml(&toml, None);
        let p = dir.path().join("idem.toml");
        let p = p.display();
        assert_eq!(
            result.unwrap_err(),
            vec![
                // The bad url set aside is not reported missing as well.
                format!(
                    "invalid config {p}: [broker] url: expected a string, found signed int `3`"
                ),
                format!("invalid config {p}: [service] listen: invalid socket address syntax"),
                format!(
                    "invalid config {p}: [service] shutdown_grace: expected a duration, found string \"soon\""
                ),
                format!(
                    "invalid config {p}: [[handler]] `h` max_deliver: expected u32, found signed int `-1`"
                ),
                format!(
                    "invalid config {p}: [[handler]] `h`: unknown field `tabels`, expected one of `name`, `module`, `stream`, `subjects`, `stream_replicas`, `identity`, `tables`, `publish`, `endpoints`, `migrations`, `max_deliver`, `ack_wait`, `retry_delay`, `backoff`, `deadline`, `concurrency`, `batch`, `batch_linger`, `order_key`, `partitions`, `priority_timeout`, `refuse_out_of_order`, `pull_batch`, `statement_timeout`, `max_statements`, `max_rows`, `max_result_kib`, `max_param_kib`, `max_log_kib`, `max_outbox_calls`, `max_outbox_kib`, `wasi`, `watch`, `max_memory_mib`, `retention`, `accept_horizon_risk`, `start`"
                ),
                format!(
                    "invalid config {p}: [[handler]] `h` module is missing; set it in the file"
                ),
            ]
        );
    }

    #[test]
    fn validation_reports_every_problem() {
        let toml = format!(
            "[broker]\nurl = \"nats://127.0.0.1:4222\"\n{HANDLER}max_deliver = 0\ntables = [\"idem_receipts\"]\n{}",
            HANDLER.replace("\"S\"", "\"bad.stream\"")
        );
        let (dir, result) = load_toml(&toml, None);
        let p = dir.path().join("idem.toml");
        let p = p.display();
        assert_eq!(
            result.unwrap_err(),
            vec![
                format!("invalid config {p}: handler `h`: max_deliver must be at least 1"),
                format!(
                    "invalid config {p}: handler `h`: table `idem_receipts` belongs to idem and cannot be granted"
                ),
                format!("invalid config {p}: handler name `h` appears twice"),
                format!(
                    "invalid config {p}: handler `h`: stream `bad.stream` may use only letters, digits, `-` and `_`"
                ),
            ]
        );
    }

    #[test]
    fn masked_strings_in_messages() {
        assert_eq!(
            describe(&Kind::InvalidType(
                Actual::Str("postgres://u:pw@h/db".into()),
                "u32".into()
            )),
            "expected u32, found string \"postgres://u:***@h/db\""
        );
    }
}
