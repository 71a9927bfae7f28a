//! `[broker]`: where the NATS server is, how idem authenticates to it
//! (token, user and password, NKey seed or `.creds` file: at most one) and
//! how the connection is encrypted (TLS with a custom CA, a client
//! certificate). Secrets are [`Secret`]s and print masked; secret files
//! and certificate files are read and checked at load, so a bad one is
//! reported by `idem config check` before anything connects.
//!
//! The authentication methods are the NATS server's own
//! (<https://docs.nats.io/running-a-nats-service/configuration/securing_nats/auth_intro>);
//! a `.creds` file is the user JWT and its NKey seed that `nsc` writes
//! (decentralized JWT authentication).

use crate::secret::Secret;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `[broker]`: the NATS server with JetStream enabled.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// `nats://host:port` (or `tls://host:port`, which requires TLS); a
    /// comma-separated list names several servers of one cluster.
    pub url: String,
    /// A NATS token to authenticate with. After [`crate::config::Config::load`]
    /// it also holds what `token_file` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// A file holding the NATS token (a trailing newline is dropped). A
    /// relative path is resolved against `$CREDENTIALS_DIRECTORY` when set,
    /// else the config file's directory (as every `*_file` key here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The user name, with `password` or `password_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The user's password. After load it also holds what `password_file` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,
    /// A file holding the user's password (a trailing newline is dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// A user NKey seed (`SU…`, 58 characters): idem signs the server's
    /// nonce with it. After load it also holds what `nkey_seed_file` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nkey_seed: Option<Secret>,
    /// A file holding the user NKey seed (as `nsc` or `nk -gen user` write it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nkey_seed_file: Option<PathBuf>,
    /// A `.creds` file: a user JWT and its NKey seed, for a server in
    /// operator (JWT) mode. Read at connect; checked readable at load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creds_file: Option<PathBuf>,
    /// PEM file of the certificate authorities that signed the server's
    /// certificate (a private CA). With it only these are trusted; without
    /// it, the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM file of idem's client certificate (with `tls_key_file`), for a
    /// server that verifies clients (`verify: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<PathBuf>,
    /// Refuse to talk to the server without TLS. Implied by a `tls://` URL
    /// or any `tls_*_file`. Default false (TLS when the server asks for it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls_required: bool,
}

/// How idem authenticates to the broker, as [`BrokerConfig::auth`] reads it
/// after load (secret files already read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerAuth<'a> {
    /// No credentials: the server lets anyone in.
    None,
    /// A token (`token` / `token_file`).
    Token(&'a Secret),
    /// `user` with `password` / `password_file`.
    UserPassword {
        /// The user name.
        user: &'a str,
        /// The password.
        password: &'a Secret,
    },
    /// A user NKey seed (`nkey_seed` / `nkey_seed_file`).
    NKey(&'a Secret),
    /// A `.creds` file (user JWT and seed).
    Creds(&'a Path),
}

impl BrokerConfig {
    /// A broker at `url`, without credentials or TLS settings (as
    /// `idem publish --broker` names one).
    pub fn at(url: &str) -> Self {
        BrokerConfig {
            url: url.to_owned(),
            ..BrokerConfig::default()
        }
    }

    /// The one authentication method configured. Load has refused a config
    /// with more than one, so the first found is the only one.
    pub fn auth(&self) -> BrokerAuth<'_> {
        if let Some(token) = &self.token {
            BrokerAuth::Token(token)
        } else if let (Some(user), Some(password)) = (&self.user, &self.password) {
            BrokerAuth::UserPassword { user, password }
        } else if let Some(seed) = &self.nkey_seed {
            BrokerAuth::NKey(seed)
        } else if let Some(creds) = &self.creds_file {
            BrokerAuth::Creds(creds)
        } else {
            BrokerAuth::None
        }
    }

    /// The server URLs of `url`: the comma-separated list, each trimmed.
    pub fn servers(&self) -> Vec<&str> {
        self.url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect()
    }

    /// Whether idem must speak TLS: `tls_required`, a `tls://` URL or any
    /// `tls_*_file` set.
    pub fn requires_tls(&self) -> bool {
        self.tls_required
            || self
                .url
                .split(',')
                .any(|u| u.trim().to_ascii_lowercase().starts_with("tls://"))
            || self.tls_ca_file.is_some()
            || self.tls_cert_file.is_some()
    }

    /// Reads the secret files into their values, resolves every file path
    /// against `secrets` (`$CREDENTIALS_DIRECTORY`, else the config file's
    /// directory) and checks what serde cannot: one value or one file per
    /// secret, at most one authentication method, a user with a password,
    /// a client certificate with its key, an NKey seed that is a user seed,
    /// PEM files that hold what they should.
    ///
    /// # Errors
    /// Every problem found as `(key, message)`, the message one line that
    /// never contains a secret.
    pub(super) fn resolve(&mut self, secrets: &Path) -> Result<(), Vec<(&'static str, String)>> {
        let mut problems = Vec::new();
        let mut note = |key: &'static str, result: Result<(), String>| {
            if let Err(message) = result {
                problems.push((key, message));
            }
        };
        note("url", check_servers(&self.servers()));
        note(
            "token_file",
            read_into(&mut self.token, &mut self.token_file, "token", secrets),
        );
        note(
            "password_file",
            read_into(
                &mut self.password,
                &mut self.password_file,
                "password",
                secrets,
            ),
        );
        note(
            "nkey_seed_file",
            read_into(
                &mut self.nkey_seed,
                &mut self.nkey_seed_file,
                "nkey_seed",
                secrets,
            ),
        );
        for (key, file) in [
            ("creds_file", &mut self.creds_file),
            ("tls_ca_file", &mut self.tls_ca_file),
            ("tls_cert_file", &mut self.tls_cert_file),
            ("tls_key_file", &mut self.tls_key_file),
        ] {
            if let Some(path) = file {
                *path = secrets.join(&*path);
                note(key, check_file(key, path));
            }
        }
        match (&self.user, &self.password) {
            (Some(_), None) => note(
                "user",
                Err("a user needs `password` or `password_file`".into()),
            ),
            (None, Some(_)) => note(
                "password",
                Err("a password needs `user` (or use `token` for a bare token)".into()),
            ),
            _ => {}
        }
        if let Some(seed) = &self.nkey_seed {
            note("nkey_seed", check_user_seed(seed));
        }
        let methods: Vec<&str> = [
            ("token", self.token.is_some()),
            (
                "user/password",
                self.user.is_some() || self.password.is_some(),
            ),
            ("nkey_seed", self.nkey_seed.is_some()),
            ("creds_file", self.creds_file.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if methods.len() > 1 {
            note(
                "auth",
                Err(format!(
                    "set one way to authenticate, not {}",
                    methods.join(" and ")
                )),
            );
        }
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(_), None) => note(
                "tls_cert_file",
                Err("a client certificate needs its key in `tls_key_file`".into()),
            ),
            (None, Some(_)) => note(
                "tls_key_file",
                Err("a client key needs its certificate in `tls_cert_file`".into()),
            ),
            _ => {}
        }
        // The pair, once each file is readable and holds what it should.
        if !problems.iter().any(|(k, _)| k.starts_with("tls_"))
            && let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file)
            && let Err(message) = check_client_pair(cert, key)
        {
            problems.push(("tls_key_file", message));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// `file` (relative to `secrets`) read into `value`, unless both are set.
fn read_into(
    value: &mut Option<Secret>,
    file: &mut Option<PathBuf>,
    value_key: &str,
    secrets: &Path,
) -> Result<(), String> {
    let Some(path) = file.as_mut() else {
        return Ok(());
    };
    if value.is_some() {
        return Err(format!(
            "set either {value_key} or {value_key}_file, not both"
        ));
    }
    *path = secrets.join(&*path);
    *value = Some(Secret::new(super::sources::read_secret(path)?));
    Ok(())
}

/// A file idem reads at connect: readable now, and for the PEM keys
/// holding a certificate (`tls_ca_file`, `tls_cert_file`) or a private key
/// (`tls_key_file`). The PEM parsing is `rustls-pki-types`', which is what
/// the NATS client loads these files with.
fn check_file(key: &str, path: &Path) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "cannot read {}: {e}; a relative path is read from $CREDENTIALS_DIRECTORY when set, else from the config file's directory",
            path.display()
        )
    })?;
    let what = match key {
        "tls_ca_file" | "tls_cert_file" => {
            let certs = CertificateDer::pem_slice_iter(&bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{} is not PEM: {e}", path.display()))?;
            (!certs.is_empty())
                .then_some(())
                .ok_or("no CERTIFICATE block")
        }
        "tls_key_file" => PrivateKeyDer::from_pem_slice(&bytes)
            .map(|_| ())
            .map_err(|_| "no PRIVATE KEY block"),
        _ => Ok(()),
    };
    what.map_err(|missing| format!("{} has {missing}", path.display()))
}

/// Each server address parses as the NATS client parses it, and carries
/// no credentials: the client does not use a URL's user, password or
/// token (they belong in `user`/`password_file` or `token_file`), and the
/// URL is printed in messages. The messages never repeat the URL.
fn check_servers(servers: &[&str]) -> Result<(), String> {
    if servers.is_empty() {
        return Err(
            "no server address; set it to nats://host:4222 (a comma-separated list for a cluster)"
                .into(),
        );
    }
    for (i, server) in servers.iter().enumerate() {
        let n = i + 1;
        let with_scheme = if server.contains("://") {
            (*server).to_owned()
        } else {
            format!("nats://{server}")
        };
        if let Ok(u) = url::Url::parse(&with_scheme)
            && (!u.username().is_empty() || u.password().is_some())
        {
            return Err(format!(
                "server {n} of the url carries credentials, which idem does not send from a url; remove them and set user with password_file, or token_file"
            ));
        }
        if let Err(e) = server.parse::<async_nats::ServerAddr>() {
            return Err(format!(
                "server {n} of the url is not a NATS server address: {e}"
            ));
        }
    }
    Ok(())
}

/// A client certificate and key rustls accepts together, as the NATS
/// client will load them: the key matches the certificate, the certificate
/// is X.509 v3, the key is not encrypted.
fn check_client_pair(cert: &Path, key: &Path) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let key_pem = std::fs::read(key).map_err(|e| format!("cannot read {}: {e}", key.display()))?;
    if key_pem
        .windows(b"ENCRYPTED PRIVATE KEY".len())
        .any(|w| w == b"ENCRYPTED PRIVATE KEY")
    {
        return Err(format!(
            "{} is an encrypted private key, which idem cannot use; decrypt it (openssl pkcs8 -in KEY -out PLAIN.pem) and keep the file readable by idem only",
            key.display()
        ));
    }
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{} is not PEM: {e}", cert.display()))?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|_| format!("{} has no PRIVATE KEY block", key.display()))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(certs, private)
        .map(|_| ())
        .map_err(|e| {
            format!(
                "{} and {} do not make a client certificate: {e} (the key must be the certificate's, and the certificate X.509 v3)",
                cert.display(),
                key.display()
            )
        })
}

/// A user NKey seed: decodes, and is a user's (`SU…`), not an account's or
/// an operator's. The message never contains the seed.
fn check_user_seed(seed: &Secret) -> Result<(), String> {
    let pair = nkeys::KeyPair::from_seed(seed.expose())
        .map_err(|_| "not an NKey seed (a user seed starts with SU and has 58 characters)")?;
    if pair.key_pair_type() != nkeys::KeyPairType::User {
        return Err(format!(
            "an NKey seed of a {:?}, not of a user (a user seed starts with SU)",
            pair.key_pair_type()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn resolved(toml_text: &str, dir: &Path) -> Result<BrokerConfig, Vec<(&'static str, String)>> {
        let mut b: BrokerConfig = toml::from_str(toml_text).unwrap();
        b.resolve(dir).map(|()| b)
    }

    #[test]
    fn one_method_at_most_and_each_complete() {
        let dir = tempfile::tempdir().unwrap();
        let seed = nkeys::KeyPair::new_user().seed().unwrap();
        let e = resolved(
            &format!("url = \"nats://h\"\ntoken = \"t\"\nnkey_seed = \"{seed}\"\n"),
            dir.path(),
        )
        .unwrap_err();
        assert_eq!(
            e,
            vec![(
                "auth",
                "set one way to authenticate, not token and nkey_seed".to_owned()
            )]
        );
        let e = resolved("url = \"nats://h\"\nuser = \"u\"\n", dir.path()).unwrap_err();
        assert_eq!(
            e,
            vec![(
                "user",
                "a user needs `password` or `password_file`".to_owned()
            )]
        );
        let b = resolved(
            "url = \"nats://h\"\nuser = \"u\"\npassword = \"p\"\n",
            dir.path(),
        )
        .unwrap();
        assert_eq!(
            b.auth(),
            BrokerAuth::UserPassword {
                user: "u",
                password: &Secret::new("p")
            }
        );
        assert!(!b.requires_tls());
        assert_eq!(
            resolved("url = \"nats://h\"\n", dir.path()).unwrap().auth(),
            BrokerAuth::None
        );
    }

    #[test]
    fn an_nkey_seed_must_be_a_users_and_is_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let account = nkeys::KeyPair::new_account().seed().unwrap();
        let e = resolved(
            &format!("url = \"nats://h\"\nnkey_seed = \"{account}\"\n"),
            dir.path(),
        )
        .unwrap_err();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, "nkey_seed");
        assert!(e[0].1.contains("not of a user"), "{}", e[0].1);
        assert!(!e[0].1.contains(&account), "{}", e[0].1);
        let e = resolved(
            "url = \"nats://h\"\nnkey_seed = \"SUnotaseed\"\n",
            dir.path(),
        )
        .unwrap_err();
        assert_eq!(
            e,
            vec![(
                "nkey_seed",
                "not an NKey seed (a user seed starts with SU and has 58 characters)".to_owned()
            )]
        );
        let user = nkeys::KeyPair::new_user().seed().unwrap();
        std::fs::write(dir.path().join("user.nk"), format!("{user}\n")).unwrap();
        let b = resolved(
            "url = \"nats://h\"\nnkey_seed_file = \"user.nk\"\n",
            dir.path(),
        )
        .unwrap();
        assert_eq!(b.auth(), BrokerAuth::NKey(&Secret::new(user)));
    }

    #[test]
    fn tls_files_are_checked_and_resolved() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), "not pem at all\n").unwrap();
        let e = resolved(
            "url = \"nats://h\"\ntls_ca_file = \"ca.pem\"\ntls_cert_file = \"missing.pem\"\n",
            dir.path(),
        )
        .unwrap_err();
        let keys: Vec<&str> = e.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["tls_ca_file", "tls_cert_file", "tls_cert_file"]);
        assert_eq!(
            e[0].1,
            format!(
                "{} has no CERTIFICATE block",
                dir.path().join("ca.pem").display()
            )
        );
        assert!(e[1].1.starts_with("cannot read "), "{}", e[1].1);
        assert_eq!(
            e[2].1,
            "a client certificate needs its key in `tls_key_file`"
        );
    }

    #[test]
    fn a_server_list_is_read_and_credentials_in_it_refused_unshown() {
        let dir = tempfile::tempdir().unwrap();
        let b = resolved(
            "url = \"nats://127.0.0.1:4222, nats://127.0.0.1:4223\"\n",
            dir.path(),
        )
        .unwrap();
        assert_eq!(
            b.servers(),
            ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"]
        );
        for url in [
            "nats://s3cr3t-tok@h:4222",
            "nats://a:4222,nats://u:s3cr3t-pw@b:4222",
        ] {
            let e = resolved(&format!("url = \"{url}\"\n"), dir.path()).unwrap_err();
            assert_eq!(e.len(), 1);
            assert_eq!(e[0].0, "url");
            assert!(e[0].1.contains("carries credentials"), "{}", e[0].1);
            assert!(!e[0].1.contains("s3cr3t"), "{}", e[0].1);
        }
        let e = resolved("url = \"nats://h:99999\"\n", dir.path()).unwrap_err();
        assert!(
            e[0].1
                .starts_with("server 1 of the url is not a NATS server address: "),
            "{}",
            e[0].1
        );
        let e = resolved("url = \" , \"\n", dir.path()).unwrap_err();
        assert!(e[0].1.starts_with("no server address"), "{}", e[0].1);
    }

    #[test]
    fn tls_is_required_by_url_or_files() {
        assert!(BrokerConfig::at("tls://127.0.0.1:4222").requires_tls());
        assert!(BrokerConfig::at("nats://a:1, TLS://b:2").requires_tls());
        assert!(!BrokerConfig::at("nats://a:1").requires_tls());
        let b = BrokerConfig {
            tls_ca_file: Some("ca.pem".into()),
            ..BrokerConfig::at("nats://a:1")
        };
        assert!(b.requires_tls());
    }
}
