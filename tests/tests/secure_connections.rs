//! idem against a broker and a database that demand credentials and TLS,
//! through the real binary (`idem run --drain`): a nats-server with users
//! and passwords, with NKey users, with TLS that verifies client
//! certificates (a CA and certificates generated per test), and a
//! PostgreSQL cluster that accepts TCP only over TLS. Each case processes
//! the same two credits with exact balances, and each wrong credential or
//! certificate stops the start with one line that names what to check and
//! shows no secret.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use async_nats::jetstream;
use idem_tests::pg_cluster::PgCluster;
use idem_tests::tls::Pki;
use idem_tests::*;
use std::path::{Path, PathBuf};

/// Writes `idem.toml` in `dir` for the credit handler on stream `ACCOUNTS`,
/// with `broker` as the body of `[broker]` (after `url`) and `database_url`.
fn credit_config(dir: &Path, nats_url: &str, broker: &str, database_url: &str) -> PathBuf {
    let cfg = dir.join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{nats_url}\"\n{broker}\n[database]\nurl = \"{database_url}\"\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\"]\nmigrations = \"{}\"\n",
            guest("credit").display(),
            root().join("examples/credit/migrations").display()
        ),
    )
    .unwrap();
    cfg
}

/// Creates stream `ACCOUNTS` (max_age = idem's default retention) through a
/// client connected with `options`, and publishes credits of 5 and 7 to
/// account 1.
async fn seed(url: &str, options: async_nats::ConnectOptions) {
    let js = jetstream::new(options.connect(url).await.unwrap());
    js.create_stream(jetstream::stream::Config {
        name: "ACCOUNTS".into(),
        subjects: vec!["accounts.credit".into()],
        max_age: DEFAULT_RETENTION,
        ..Default::default()
    })
    .await
    .unwrap();
    publish(&js, "accounts.credit", &credit("c1", 1, 5), &[]).await;
    publish(&js, "accounts.credit", &credit("c2", 1, 7), &[]).await;
}

/// `idem run --drain --config cfg`.
fn drain(cfg: &Path) -> (i32, String, String) {
    idem_cli(&["run", "--drain", "--config", cfg.to_str().unwrap()], &[])
}

/// Asserts the drain processed both credits: exit 0, the summary line, and
/// account 1 at 12.
async fn assert_both_credited(cfg: &Path, db: &TestDb) {
    let (code, out, err) = drain(cfg);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("handler h: delivered=2 processed=2 duplicates=0 "),
        "{out}"
    );
    assert_eq!(db.balance(1).await, Some(12));
}

/// `[broker] user` and `password_file` authenticate to a server with users;
/// a wrong password stops the start at once with one line naming the keys
/// and not the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_and_password_file_authenticate() {
    let nats = Nats::start_with_config(
        "authorization { users = [ { user: \"idem\", password: \"pw-hunter3\" } ] }\n",
    );
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nats-password"), "pw-hunter3\n").unwrap();
    let cfg = credit_config(
        dir.path(),
        &nats.url(),
        "user = \"idem\"\npassword_file = \"nats-password\"",
        &db.url,
    );
    seed(
        &nats.url(),
        async_nats::ConnectOptions::with_user_and_password("idem".into(), "pw-hunter3".into()),
    )
    .await;
    assert_both_credited(&cfg, &db).await;

    std::fs::write(dir.path().join("nats-password"), "pw-wrong4\n").unwrap();
    let started = std::time::Instant::now();
    let (code, _, err) = drain(&cfg);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "idem: NATS at {} refused idem's credentials (authorization violation); check [broker] user and password / password_file\n",
            nats.url()
        )
    );
    // Refused credentials do not wait out the 10 s connect deadline.
    assert!(started.elapsed() < std::time::Duration::from_secs(8));
}

/// `[broker] nkey_seed_file` signs the server's nonce for an NKey user; a
/// seed the server does not list is refused with one line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_seed_authenticates() {
    let user = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user();
    let nats = Nats::start_with_config(&format!(
        "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
        user.public_key()
    ));
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let user_seed = user.seed().unwrap();
    std::fs::write(dir.path().join("user.nk"), format!("{user_seed}\n")).unwrap();
    let cfg = credit_config(
        dir.path(),
        &nats.url(),
        "nkey_seed_file = \"user.nk\"",
        &db.url,
    );
    seed(
        &nats.url(),
        async_nats::ConnectOptions::with_nkey(user_seed),
    )
    .await;
    assert_both_credited(&cfg, &db).await;

    let other = stranger.seed().unwrap();
    std::fs::write(dir.path().join("user.nk"), format!("{other}\n")).unwrap();
    let (code, _, err) = drain(&cfg);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "idem: NATS at {} refused idem's credentials (authorization violation); check [broker] nkey_seed / nkey_seed_file and that the server lists its public key\n",
            nats.url()
        )
    );
    assert!(!err.contains(&other[..10]), "{err}");
}

/// A nats-server with TLS that verifies clients: idem trusts the private CA
/// (`tls_ca_file`) and presents its client certificate; without the client
/// certificate, or trusting another CA, the start stops with the TLS line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_private_ca() {
    let pki = Pki::generate();
    let nats = Nats::start_with_config(&format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 2\n}}\n",
        pki.path("server.pem").display(),
        pki.path("server-key.pem").display(),
        pki.path("ca.pem").display(),
    ));
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let tls = |ca: &str, client: bool| {
        let mut keys = format!("tls_ca_file = \"{}\"\n", pki.path(ca).display());
        if client {
            keys += &format!(
                "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
                pki.path("client.pem").display(),
                pki.path("client-key.pem").display()
            );
        }
        keys
    };
    let cfg = credit_config(dir.path(), &nats.url(), &tls("ca.pem", true), &db.url);
    seed(
        &nats.url(),
        async_nats::ConnectOptions::new()
            .require_tls(true)
            .add_root_certificates(pki.path("ca.pem"))
            .add_client_certificate(pki.path("client.pem"), pki.path("client-key.pem")),
    )
    .await;
    assert_both_credited(&cfg, &db).await;

    for (ca, client, cause) in [
        (
            "other-ca.pem",
            true,
            "invalid peer certificate: UnknownIssuer",
        ),
        ("ca.pem", false, "CertificateRequired"),
    ] {
        let cfg = credit_config(dir.path(), &nats.url(), &tls(ca, client), &db.url);
        let started = std::time::Instant::now();
        let (code, _, err) = drain(&cfg);
        assert_eq!(code, 1, "{err}");
        let prefix = format!("idem: TLS with NATS at {} failed (", nats.url());
        assert!(err.starts_with(&prefix), "{ca} {client}: {err}");
        assert!(err.contains(cause), "{ca} {client}: {err}");
        assert!(
            err.ends_with("); check [broker] tls_ca_file (the CA that signed the server's certificate), the url's host name against that certificate, and tls_cert_file / tls_key_file when the server verifies clients\n"),
            "{err}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(8));
    }
}

/// `idem config check` masks the broker password and the NKey seed.
#[test]
fn config_check_masks_the_broker_password_and_seed() {
    let dir = tempfile::tempdir().unwrap();
    let seed = nkeys::KeyPair::new_user().seed().unwrap();
    for (broker, shown) in [
        (
            "user = \"idem\"\npassword = \"pw-hunter9\"".to_owned(),
            "user = \"idem\"\npassword = \"***\"\n",
        ),
        (format!("nkey_seed = \"{seed}\""), "nkey_seed = \"***\"\n"),
    ] {
        let cfg = credit_config(
            dir.path(),
            "nats://127.0.0.1:4222",
            &broker,
            "sqlite://x.db",
        );
        let (code, out, err) =
            idem_cli(&["config", "check", "--config", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.starts_with(&format!(
                "[broker]\nurl = \"nats://127.0.0.1:4222\"\n{shown}"
            )),
            "{out}"
        );
        assert!(!out.contains("pw-hunter9") && !out.contains(&seed), "{out}");
    }
}

/// PostgreSQL over TLS through the URL: a cluster that accepts TCP only
/// over TLS, `sslmode=verify-full` with the private CA as `sslrootcert`
/// credits both messages; without TLS (`sslmode=disable`) or trusting
/// another CA the start stops with one line, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_through_the_url() {
    let pki = Pki::generate();
    let cluster = PgCluster::start_tls_only(&pki.server_cert_pem, &pki.server_key_pem);
    let nats = Nats::start();
    let dir = tempfile::tempdir().unwrap();
    let url = |query: &str| format!("{}?{query}", cluster.url());
    let verified = url(&format!(
        "sslmode=verify-full&sslrootcert={}",
        pki.path("ca.pem").display()
    ));
    let cfg = credit_config(dir.path(), &nats.url(), "", &verified);
    seed(&nats.url(), async_nats::ConnectOptions::new()).await;
    let (code, out, err) = drain(&cfg);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("handler h: delivered=2 processed=2 duplicates=0 "),
        "{out}"
    );
    let pool = sqlx::PgPool::connect(&verified).await.unwrap();
    let balance: i64 = sqlx::query_scalar("SELECT balance FROM accounts WHERE account_id = 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(balance, 12);
    let receipts: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_receipts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(receipts, 2);
    pool.close().await;

    for (query, says) in [
        ("sslmode=disable".to_owned(), "no encryption"),
        (
            format!(
                "sslmode=verify-full&sslrootcert={}",
                pki.path("other-ca.pem").display()
            ),
            "certificate",
        ),
    ] {
        let cfg = credit_config(dir.path(), &nats.url(), "", &url(&query));
        let (code, _, err) = drain(&cfg);
        assert_eq!(code, 1, "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{query}: {err}");
    }
}

/// `[broker] creds_file` against a server in operator (JWT) mode: the user
/// JWT and seed it holds authenticate; a user of an account the operator
/// never signed is refused with one line; a file that is not a `.creds`
/// file is named with what it must hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creds_file_authenticates_in_operator_mode() {
    let nats = idem_tests::nats_jwt::JwtNats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let creds_key = |path: &Path| format!("creds_file = \"{}\"", path.display());
    let cfg = credit_config(dir.path(), &nats.url(), &creds_key(&nats.creds), &db.url);
    seed(
        &nats.url(),
        async_nats::ConnectOptions::new()
            .credentials_file(&nats.creds)
            .await
            .unwrap(),
    )
    .await;
    assert_both_credited(&cfg, &db).await;

    let foreign = nats.foreign_creds();
    let cfg = credit_config(dir.path(), &nats.url(), &creds_key(&foreign), &db.url);
    let (code, _, err) = drain(&cfg);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "idem: NATS at {} refused idem's credentials (authorization violation); check [broker] creds_file and that its account is known to the server\n",
            nats.url()
        )
    );

    let garbage = dir.path().join("garbage.creds");
    std::fs::write(&garbage, "not a creds file\n").unwrap();
    let cfg = credit_config(dir.path(), &nats.url(), &creds_key(&garbage), &db.url);
    let (code, _, err) = drain(&cfg);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "idem: cannot use [broker] creds_file {}: ",
            garbage.display()
        )),
        "{err}"
    );
    assert!(
        err.ends_with(
            "; it must hold a user JWT and its NKey seed, as `nsc generate creds` writes them\n"
        ),
        "{err}"
    );
}

/// A comma-separated list of servers is a cluster: the host connects to
/// the one that answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_list_connects_to_the_live_one() {
    let nats = Nats::start();
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let list = format!("nats://127.0.0.1:{dead}, {}", nats.url());
    let cfg = credit_config(dir.path(), &list, "", &db.url);
    seed(&nats.url(), async_nats::ConnectOptions::new()).await;
    assert_both_credited(&cfg, &db).await;
}

/// A client certificate whose key is another's is refused at load, by
/// `idem config check`, naming both files; a plain server when TLS is
/// required is a TLS failure at once, not a 10 s wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatched_client_key_and_a_plain_server_are_named() {
    let pki = Pki::generate();
    let dir = tempfile::tempdir().unwrap();
    let keys = format!(
        "tls_ca_file = \"{}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
        pki.path("ca.pem").display(),
        pki.path("client.pem").display(),
        pki.path("server-key.pem").display()
    );
    let cfg = credit_config(dir.path(), "nats://127.0.0.1:4222", &keys, "sqlite://x.db");
    let (code, _, err) = idem_cli(&["config", "check", "--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "[broker] tls_key_file: {} and {} do not make a client certificate: ",
            pki.path("client.pem").display(),
            pki.path("server-key.pem").display()
        )),
        "{err}"
    );

    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let cfg = credit_config(dir.path(), &nats.url(), "tls_required = true", &db.url);
    let started = std::time::Instant::now();
    let (code, _, err) = drain(&cfg);
    assert_eq!(code, 1);
    assert!(
        err.starts_with(&format!("idem: TLS with NATS at {} failed (", nats.url())),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(8));
}
