//! A private `nats-server` in operator (decentralized JWT) mode with
//! JetStream, and the NATS JWTs and `.creds` files its clients authenticate
//! with.
//!
//! Trust chain, all keys fresh per [`JwtNats::start`]:
//! - an operator, whose self-signed JWT the server trusts (`operator:`);
//! - a system account `SYS` (the operator's `system_account`), without
//!   JetStream, which the server needs for its internal traffic;
//! - an account `IDEM`, issued by the operator, with JetStream enabled and
//!   unlimited (memory and disk storage, streams, consumers);
//! - a user `idem`, issued by `IDEM`, whose JWT and seed make
//!   [`JwtNats::creds`].
//!
//! Both account JWTs are preloaded into the server's `MEMORY` resolver, so an
//! account the operator never signed (see [`JwtNats::foreign_creds`]) cannot
//! be resolved and its users are refused (`Authorization Violation`).
//!
//! JWTs are NATS JWT v2: header `{"typ":"JWT","alg":"ed25519-nkey"}`; claims
//! `jti`, `iat`, `iss`, `sub`, `name` and `nats` (with `type` and
//! `version: 2`); signature ed25519 by the issuer's nkey over
//! `b64url(header).b64url(claims)`, every part unpadded base64url.

use crate::{free_port, nats_server_bin};
use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
use nkeys::KeyPair;
use serde_json::{Value, json};
use sha2::{Digest, Sha512_256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A private nats-server in operator mode with JetStream on
/// `127.0.0.1:port`, killed on drop; its config, store, log and `.creds`
/// files live in a temporary directory removed on drop.
pub struct JwtNats {
    child: Option<Child>,
    /// The loopback port the server listens on.
    pub port: u16,
    /// A `.creds` file (user JWT and user seed) of user `idem` in the
    /// JetStream-enabled account `IDEM`: the server accepts it.
    pub creds: PathBuf,
    /// The server's config file (`nats-server -c`).
    pub config: PathBuf,
    /// Public key (`O...`) of the operator the server trusts.
    pub operator_public_key: String,
    /// Public key (`A...`) of account `IDEM`, the one [`JwtNats::creds`]
    /// belongs to.
    pub account_public_key: String,
    /// Public key (`U...`) of user `idem`, the subject of [`JwtNats::creds`].
    pub user_public_key: String,
    account: KeyPair,
    dir: tempfile::TempDir,
}

impl JwtNats {
    /// Generates the keys and JWTs, writes the config and [`JwtNats::creds`],
    /// starts the server and waits until it listens (panics with the
    /// server's log if it exits first or does not listen within 10 s).
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();

        let operator = KeyPair::new_operator();
        let system = KeyPair::new_account();
        let account = KeyPair::new_account();
        let user = KeyPair::new_user();

        let operator_jwt = operator_jwt(&operator, "idem-test-operator", &system.public_key());
        let system_jwt = account_jwt(&operator, &system, "SYS", false);
        let account_jwt = account_jwt(&operator, &account, "IDEM", true);

        let creds = dir.path().join("idem.creds");
        write_user_creds(&creds, &account, &user, "idem");

        let store = dir.path().join("jetstream");
        let config = dir.path().join("nats.conf");
        std::fs::write(
            &config,
            server_config(
                port,
                &operator_jwt,
                &[
                    (system.public_key(), system_jwt),
                    (account.public_key(), account_jwt),
                ],
                &system.public_key(),
                &store,
            ),
        )
        .unwrap();

        let mut n = JwtNats {
            child: None,
            port,
            creds,
            config,
            operator_public_key: operator.public_key(),
            account_public_key: account.public_key(),
            user_public_key: user.public_key(),
            account,
            dir,
        };
        n.spawn();
        n
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("nats.log")
    }

    fn spawn(&mut self) {
        let bin = nats_server_bin();
        let log = std::fs::File::create(self.log_path()).unwrap();
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({e}); run `bash scripts/setup.sh`",
                    bin.display()
                )
            });
        let child = self.child.insert(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!(
                    "nats-server (operator mode) exited with {status}:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "nats-server (operator mode) did not listen:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the server wrote to stderr so far (its log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// A client authenticated with [`JwtNats::creds`].
    pub async fn connect(&self) -> async_nats::Client {
        async_nats::ConnectOptions::new()
            .credentials_file(&self.creds)
            .await
            .unwrap()
            .connect(self.url())
            .await
            .unwrap()
    }

    /// Writes `dir/user-NAME.creds` for a new user `NAME` of account `IDEM`
    /// (the server accepts it) and returns its path.
    pub fn user_creds(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(format!("user-{name}.creds"));
        write_user_creds(&path, &self.account, &KeyPair::new_user(), name);
        path
    }

    /// Writes `dir/foreign.creds`, well-formed creds of a user `foreign`
    /// issued by a fresh account key the operator never signed, and returns
    /// its path: the server refuses it (`Authorization Violation`).
    pub fn foreign_creds(&self) -> PathBuf {
        let path = self.dir.path().join("foreign.creds");
        write_user_creds(
            &path,
            &KeyPair::new_account(),
            &KeyPair::new_user(),
            "foreign",
        );
        path
    }
}

impl Drop for JwtNats {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Seconds since the Unix epoch, for `iat`.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Encodes and signs a NATS JWT v2 issued by `issuer` for `subject` (a
/// public key) named `name`, with `nats` as its `nats` claim (which must
/// carry `type`; `version: 2` is added). `jti` is computed as the Go library
/// does: unpadded base32 of SHA-512/256 over the JSON of the standard claims
/// without `jti` (the server does not check it, but keeps it as the id).
pub fn encode_jwt(issuer: &KeyPair, subject: &str, name: &str, mut nats: Value) -> String {
    nats["version"] = json!(2);
    let iat = now();
    let iss = issuer.public_key();
    // serde_json's map orders keys alphabetically: iat, iss, name, sub, the
    // order of the Go struct's fields.
    let standard = json!({"iat": iat, "iss": iss, "name": name, "sub": subject});
    let jti = BASE32_NOPAD.encode(&Sha512_256::digest(standard.to_string().as_bytes()));
    let claims = json!({
        "jti": jti,
        "iat": iat,
        "iss": iss,
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let header = json!({"typ": "JWT", "alg": "ed25519-nkey"});
    let signed = format!(
        "{}.{}",
        BASE64URL_NOPAD.encode(header.to_string().as_bytes()),
        BASE64URL_NOPAD.encode(claims.to_string().as_bytes()),
    );
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", BASE64URL_NOPAD.encode(&signature))
}

/// A self-signed operator JWT naming `system_account` (an account public
/// key) as the system account.
pub fn operator_jwt(operator: &KeyPair, name: &str, system_account: &str) -> String {
    encode_jwt(
        operator,
        &operator.public_key(),
        name,
        json!({"type": "operator", "system_account": system_account}),
    )
}

/// An account JWT issued by `operator` for `account`: connections, imports,
/// exports, subscriptions, data and payload unlimited (`-1`; an absent limit
/// reads as 0, i.e. none allowed); with `jetstream`, JetStream enabled with
/// memory and disk storage, streams and consumers unlimited (without it,
/// JetStream is disabled for the account, as the system account needs).
pub fn account_jwt(operator: &KeyPair, account: &KeyPair, name: &str, jetstream: bool) -> String {
    let mut limits = json!({
        "subs": -1, "data": -1, "payload": -1,
        "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
    });
    if jetstream {
        for key in ["mem_storage", "disk_storage", "streams", "consumer"] {
            limits[key] = json!(-1);
        }
    }
    encode_jwt(
        operator,
        &account.public_key(),
        name,
        json!({"type": "account", "limits": limits}),
    )
}

/// A user JWT issued by `account` for `user`: no permission restrictions,
/// subscriptions, data and payload unlimited.
pub fn user_jwt(account: &KeyPair, user: &KeyPair, name: &str) -> String {
    encode_jwt(
        account,
        &user.public_key(),
        name,
        json!({"type": "user", "subs": -1, "data": -1, "payload": -1}),
    )
}

/// The text of a `.creds` file: the user JWT and the user seed (`SU...`),
/// each between the `-----BEGIN ...-----` / `------END ...------` lines that
/// NATS clients look for.
pub fn creds_text(user_jwt: &str, user_seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n\
         {user_jwt}\n\
         ------END NATS USER JWT------\n\
         \n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\
         \n\
         -----BEGIN USER NKEY SEED-----\n\
         {user_seed}\n\
         ------END USER NKEY SEED------\n\
         \n\
         *************************************************************\n"
    )
}

/// Writes at `path` the `.creds` file of `user`, named `name`, issued by
/// `account`.
pub fn write_user_creds(path: &Path, account: &KeyPair, user: &KeyPair, name: &str) {
    let text = creds_text(&user_jwt(account, user, name), &user.seed().unwrap());
    std::fs::write(path, text).unwrap();
}

/// The server config: listen on `127.0.0.1:port`, trust `operator_jwt`,
/// system account `system_account`, `MEMORY` resolver preloaded with
/// `accounts` (public key, JWT), JetStream stored in `store`.
fn server_config(
    port: u16,
    operator_jwt: &str,
    accounts: &[(String, String)],
    system_account: &str,
    store: &Path,
) -> String {
    let preload: String = accounts
        .iter()
        .map(|(key, jwt)| format!("  {key}: \"{jwt}\"\n"))
        .collect();
    format!(
        "listen: \"127.0.0.1:{port}\"\n\
         operator: \"{operator_jwt}\"\n\
         system_account: \"{system_account}\"\n\
         resolver: MEMORY\n\
         resolver_preload: {{\n{preload}}}\n\
         jetstream {{\n  store_dir: {store}\n}}\n",
        store = json!(store.to_str().unwrap()),
    )
}
