//! The broker's own permissions as the first wall, against a real
//! nats-server whose users get exactly the permission sets of
//! `deploy/nats-permissions.conf` (the file docs/deploying.md's "Broker
//! permissions" documents, included as it is): a host (`idem run` as user `host`)
//! processes messages and reports itself, a deployer (`idem deploy`, `idem
//! status` as user `deployer`) creates the buckets, stores components,
//! records deployments the host follows, and replaces a damaged component;
//! and every write outside a role is refused by the server with a
//! permissions violation and changes nothing: a publisher (a plain NATS
//! client) cannot write any bucket, delete the consumer or the stream, or
//! read idem's replies; a host cannot create the buckets or deploy. And
//! docs/deploying.md shows the sets as the file has them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use async_nats::jetstream;
use futures::TryStreamExt as _;
use idem::deploy::Deployment;
use idem_tests::deploy_keys::DeployKeys;
use idem_tests::examples::{credit_log_migrations, eventually, sha256_hex};
use idem_tests::*;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The handler of the permission file: the credit example's.
const HANDLER: &str = "credit-projector";

/// The server's config: the permission file included, one user per role
/// and `admin` (no permissions: everything), with which the test looks.
const SERVER_CONFIG: &str = r#"include ./idem-permissions.conf
authorization { users = [
  { user: host, password: "host-pw", permissions: $IDEM_HOST }
  { user: deployer, password: "deployer-pw", permissions: $IDEM_DEPLOYER }
  { user: publisher, password: "publisher-pw", permissions: $IDEM_PUBLISHER }
  { user: admin, password: "admin-pw" }
] }
"#;

/// A nats-server whose users have `deploy/nats-permissions.conf`'s sets.
fn permissioned_nats() -> Nats {
    let permissions = std::fs::read_to_string(root().join("deploy/nats-permissions.conf")).unwrap();
    Nats::start_with_config_and_files(
        SERVER_CONFIG,
        &[("idem-permissions.conf", permissions.as_str())],
    )
}

/// `<role>.toml` in `dir`: the credit example's handler (v1: the credit
/// component), granted `accounts` and `credit_log`, connecting as `role`,
/// trusting the test's deploy and host keys (`DeployKeys::of(dir)`).
fn config(dir: &Path, nats: &Nats, db: &TestDb, role: &str) -> PathBuf {
    let cfg = dir.join(format!("{role}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "{}[broker]\nurl = \"{}\"\nuser = \"{role}\"\npassword = \"{role}-pw\"\n[database]\nurl = \"{}\"\nmax_connections = 4\n[[handler]]\nname = \"{HANDLER}\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\nidentity = \"json:/event_id\"\ntables = [\"accounts\", \"credit_log\"]\nmigrations = \"{}\"\nretry_delay = \"100ms\"\n",
            DeployKeys::of(dir).section(),
            nats.url(),
            db.url,
            guest("credit").display(),
            credit_log_migrations(dir).display()
        ),
    )
    .unwrap();
    cfg
}

/// `idem <args> --config cfg`, with the test's deploy key to sign with.
fn idem(args: &[&str], cfg: &Path) -> (i32, String, String) {
    let mut all = args.to_vec();
    all.extend(["--config", cfg.to_str().unwrap()]);
    let keys = DeployKeys::of(cfg.parent().unwrap());
    idem_cli(&all, &keys.env())
}

/// `idem <args>` as the deployer, which must succeed without the server
/// refusing it anything (idem logs each error the server sends, at warn):
/// its stdout.
fn as_deployer(args: &[&str], cfg: &Path) -> String {
    let mut all = args.to_vec();
    all.extend(["--config", cfg.to_str().unwrap()]);
    let keys = DeployKeys::of(cfg.parent().unwrap());
    let (code, out, err) = idem_cli(&all, &[keys.env()[0], ("RUST_LOG", "warn")]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("Permissions Violation"), "{err}");
    out
}

/// A plain NATS client as `user`, whose JetStream requests and publish acks
/// give up after 1 s, and which keeps every error the server sends it.
struct Client {
    js: jetstream::Context,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Client {
    async fn connect(nats: &Nats, user: &str, inbox_prefix: &str) -> Self {
        let errors = Arc::new(Mutex::new(Vec::new()));
        let seen = errors.clone();
        let client =
            async_nats::ConnectOptions::with_user_and_password(user.into(), format!("{user}-pw"))
                .custom_inbox_prefix(inbox_prefix)
                .event_callback(move |event| {
                    let seen = seen.clone();
                    async move {
                        if let async_nats::Event::ServerError(e) = event {
                            seen.lock().unwrap().push(e.to_string());
                        }
                    }
                })
                .connect(nats.url())
                .await
                .unwrap();
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(1))
            .build(client);
        Client { js, errors }
    }

    /// Asserts that `outcome` failed and that the server refused `what`
    /// (`Publish to "<subject>"` or `Subscription to "<subject>"`) with a
    /// permissions violation.
    async fn assert_refused<T, E: std::fmt::Debug>(&self, outcome: Result<T, E>, what: &str) {
        assert!(outcome.is_err(), "{what} was not refused");
        let line = format!("nats: Permissions Violation for {what}");
        eventually(&line, || self.errors.lock().unwrap().contains(&line)).await;
    }

    /// Publishes `payload` to `subject` as a JetStream publish: the stream's
    /// ack, or the error when none comes.
    async fn js_publish(&self, subject: &str, payload: &str) -> Result<(), String> {
        let ack = self
            .js
            .publish(subject.to_owned(), payload.to_owned().into())
            .await
            .map_err(|e| e.to_string())?;
        ack.await.map(|_| ()).map_err(|e| e.to_string())
    }
}

/// What the buckets and the handler's stream hold, as `admin` reads them.
#[derive(Debug, PartialEq, Eq)]
struct BrokerState {
    /// The handler's deployments (revision, digest, previous), oldest first.
    deployments: Vec<(u64, String, Option<String>)>,
    /// The names in the modules bucket, sorted.
    modules: Vec<String>,
    /// The keys of the hosts bucket, sorted.
    hosts: Vec<String>,
    /// Messages in stream ACCOUNTS.
    messages: u64,
    /// The handler's durable consumer is there.
    consumer: bool,
}

async fn broker_state(admin: &jetstream::Context) -> BrokerState {
    let deployments_kv = admin.get_key_value("idem-deployments").await.unwrap();
    let deployments = deployments_kv
        .history(HANDLER)
        .await
        .unwrap()
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            let d = Deployment::parse(&e.value).unwrap();
            (e.revision, d.digest, d.previous)
        })
        .collect();
    let modules_store = admin.get_object_store("idem-modules").await.unwrap();
    let mut modules: Vec<String> = modules_store
        .list()
        .await
        .unwrap()
        .map_ok(|o| o.name)
        .try_collect()
        .await
        .unwrap();
    modules.sort();
    let hosts_kv = admin.get_key_value("idem-hosts").await.unwrap();
    let mut hosts: Vec<String> = hosts_kv.keys().await.unwrap().try_collect().await.unwrap();
    hosts.sort();
    let mut stream = admin.get_stream("ACCOUNTS").await.unwrap();
    let messages = stream.info().await.unwrap().state.messages;
    let consumer = stream.consumer_info(HANDLER).await.is_ok();
    BrokerState {
        deployments,
        modules,
        hosts,
        messages,
        consumer,
    }
}

/// The component `name` in the modules bucket, as `admin` reads it.
async fn stored_module(admin: &jetstream::Context, name: &str) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let store = admin.get_object_store("idem-modules").await.unwrap();
    let mut bytes = Vec::new();
    store
        .get(name)
        .await
        .unwrap()
        .read_to_end(&mut bytes)
        .await
        .unwrap();
    bytes
}

/// `idem status` as the deployer, polled until it shows the host with
/// `processed` effects (reports come every 3 s): that one line.
fn status_line_once_processed(deployer: &Path, processed: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let out = as_deployer(&["status"], deployer);
        if out.contains(&format!(" processed={processed} ")) {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "status never showed {processed}: {out}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_does_its_job_and_nothing_else() {
    let nats = permissioned_nats();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let host_cfg = config(dir.path(), &nats, &db, "host");
    let deployer_cfg = config(dir.path(), &nats, &db, "deployer");
    let admin = Client::connect(&nats, "admin", "_INBOX_admin").await.js;
    let v1 = std::fs::read(guest("credit")).unwrap();
    let v2_path = guest("credit-log");
    let (d1, d2) = (
        sha256_hex(&v1),
        sha256_hex(&std::fs::read(&v2_path).unwrap()),
    );

    // A host cannot create the buckets: the deployer's first command does.
    // The server drops the request and says why, and the host stops on
    // that word instead of asking again as it would through an election.
    let keys = DeployKeys::of(host_cfg.parent().unwrap());
    let (code, _, err) = idem_cli(
        &["run", "--drain", "--config", host_cfg.to_str().unwrap()],
        &[keys.env()[0], ("RUST_LOG", "warn")],
    );
    assert_eq!(code, 1);
    let said = err
        .lines()
        .find(|l| l.starts_with("idem: "))
        .unwrap_or_default();
    assert!(
        said.starts_with("idem: cannot open or create KV bucket idem-deployments: ")
            && said.ends_with("; check that the broker runs JetStream and allows idem to create buckets, or set [deploy] follow = false"),
        "{err}"
    );
    assert!(err.contains("Permissions Violation"), "{err}");
    assert!(!err.contains("JetStream does not answer"), "{err}");
    assert!(admin.get_key_value("idem-deployments").await.is_err());
    assert_eq!(as_deployer(&["status"], &deployer_cfg), "no live hosts\n");

    // The host makes its stream and consumer, and processes what the
    // publisher publishes.
    let host = RunningHost::start(&host_cfg).await;
    let slot = host.slot(HANDLER).clone();
    assert_eq!(slot.current().digest(), d1);
    let publisher = Client::connect(&nats, "publisher", "_INBOX_publisher").await;
    for (id, amount) in [("e1", 5), ("e2", 7)] {
        publisher
            .js_publish("accounts.credit", &credit(id, 1, amount))
            .await
            .unwrap();
    }
    host.wait_for(HANDLER, "e1, e2", |s| s.processed == 2).await;
    assert_eq!(db.balance(1).await, Some(12));
    assert_eq!(db.receipt_ids(HANDLER).await, vec!["e1", "e2"]);
    let host_id = idem::deploy::heartbeat::host_id();
    let line = status_line_once_processed(&deployer_cfg, 2);
    assert!(
        line.starts_with(&format!(
            "{host_id} {HANDLER} {d1} in_flight=0 processed=2 duplicates=0 dead_lettered=0 since "
        )) && line.lines().count() == 1,
        "{line}"
    );

    // The deployer stores v2 and records it; the host swaps it in.
    let out = as_deployer(
        &[
            "deploy",
            HANDLER,
            v2_path.to_str().unwrap(),
            "--wait",
            "--timeout",
            "20s",
        ],
        &deployer_cfg,
    );
    assert_eq!(
        out,
        format!(
            "deployed {d2} to `{HANDLER}` (revision 1, previous {d1})\nevery live host runs {d2}: {host_id}\n"
        )
    );
    assert_eq!(slot.current().digest(), d2);
    publisher
        .js_publish("accounts.credit", &credit("e3", 1, 4))
        .await
        .unwrap();
    host.wait_for(HANDLER, "e3", |s| s.processed == 3).await;
    assert_eq!(db.credit_log().await, vec![("e3".into(), "v2".into())]);
    let mut sorted = vec![d1.clone(), d2.clone()];
    sorted.sort();
    let before = BrokerState {
        deployments: vec![(1, d2.clone(), Some(d1.clone()))],
        modules: sorted.clone(),
        hosts: vec![host_id.clone()],
        messages: 3,
        consumer: true,
    };
    assert_eq!(broker_state(&admin).await, before);

    // The publisher writes nothing but its events.
    // A record as the deployments bucket holds them, naming a component
    // that is not there.
    let fake = format!(
        r#"{{"digest":"{}","deployed_at":"2026-01-01T00:00:00Z","note":"forged","size":4,"by":"publisher"}}"#,
        "0".repeat(64)
    );
    let refusals = [
        (format!("$KV.idem-deployments.{HANDLER}"), fake.clone()),
        ("$O.idem-modules.C.forged".to_owned(), "wasm".to_owned()),
        (
            "$O.idem-modules.M.Zm9yZ2Vk".to_owned(),
            r#"{"name":"forged","bucket":"idem-modules","nuid":"forged","size":4,"chunks":1}"#
                .to_owned(),
        ),
        (
            "$KV.idem-hosts.forged-1".to_owned(),
            r#"{"host":"forged-1","started_at":"","reported_at":"","handlers":[]}"#.to_owned(),
        ),
    ];
    for (subject, payload) in &refusals {
        publisher
            .assert_refused(
                publisher.js_publish(subject, payload).await,
                &format!("Publish to \"{subject}\""),
            )
            .await;
    }
    publisher
        .assert_refused(
            publisher
                .js
                .delete_consumer_from_stream(HANDLER, "ACCOUNTS")
                .await,
            &format!("Publish to \"$JS.API.CONSUMER.DELETE.ACCOUNTS.{HANDLER}\""),
        )
        .await;
    publisher
        .assert_refused(
            publisher.js.delete_stream("ACCOUNTS").await,
            "Publish to \"$JS.API.STREAM.DELETE.ACCOUNTS\"",
        )
        .await;
    // Nor can it read the replies idem gets (deliveries, records, components).
    let _eavesdrop = publisher.js.client().subscribe("_INBOX.>").await.unwrap();
    publisher
        .assert_refused(Err::<(), _>(()), "Subscription to \"_INBOX.>\"")
        .await;
    assert_eq!(broker_state(&admin).await, before);
    publisher
        .js_publish("accounts.credit", &credit("e4", 1, 8))
        .await
        .unwrap();
    host.wait_for(HANDLER, "e4", |s| s.processed == 4).await;
    assert_eq!(db.balance(1).await, Some(24));

    // A host (say, a compromised one) cannot deploy: neither by hand nor
    // with `idem deploy` (v1 is stored already, so only the record is tried).
    let as_host = Client::connect(&nats, "host", "_INBOX").await;
    for (subject, payload) in &refusals[..2] {
        as_host
            .assert_refused(
                as_host.js_publish(subject, payload).await,
                &format!("Publish to \"{subject}\""),
            )
            .await;
    }
    let v1_path = guest("credit");
    let (code, _, err) = idem(&["deploy", HANDLER, v1_path.to_str().unwrap()], &host_cfg);
    assert_eq!(code, 1);
    assert!(
        err.starts_with(&format!(
            "idem: cannot record the deployment of `{HANDLER}` in bucket idem-deployments: "
        )),
        "{err}"
    );
    let after = BrokerState {
        messages: 4,
        ..before
    };
    assert_eq!(broker_state(&admin).await, after);

    // The deployer replaces a damaged component (its old chunks purged)
    // and records it; the host fetches the repaired bytes and swaps back.
    let admin_modules = admin.get_object_store("idem-modules").await.unwrap();
    let damaged = vec![0u8; v1.len()];
    admin_modules
        .put(d1.as_str(), &mut damaged.as_slice())
        .await
        .unwrap();
    let out = as_deployer(
        &[
            "deploy",
            HANDLER,
            v1_path.to_str().unwrap(),
            "--wait",
            "--timeout",
            "20s",
        ],
        &deployer_cfg,
    );
    assert_eq!(
        out,
        format!(
            "deployed {d1} to `{HANDLER}` (revision 2, previous {d2})\nevery live host runs {d1}: {host_id}\n"
        )
    );
    assert_eq!(slot.current().digest(), d1);
    assert_eq!(sha256_hex(&stored_module(&admin, &d1).await), d1);
    let out = as_deployer(&["deploy", HANDLER, "--history"], &deployer_cfg);
    let revisions: Vec<&str> = out.lines().map(|l| l.split("  ").next().unwrap()).collect();
    assert_eq!(revisions, vec!["revision 1", "revision 2"], "{out}");
    publisher
        .js_publish("accounts.credit", &credit("e5", 1, 16))
        .await
        .unwrap();
    host.wait_for(HANDLER, "e5", |s| s.processed == 5).await;
    let summary = host.stop().await;
    assert_eq!(summary[0].1.dead_lettered, 0);
    assert_eq!(db.balance(1).await, Some(40));
    assert_eq!(
        db.credit_log().await,
        vec![("e3".into(), "v2".into()), ("e4".into(), "v2".into())]
    );
    let state = broker_state(&admin).await;
    assert_eq!(
        state.deployments,
        vec![(1, d2.clone(), Some(d1.clone())), (2, d1.clone(), Some(d2))]
    );
    assert_eq!(state.modules, sorted);
}

/// docs/deploying.md's "Broker permissions" shows the sets exactly as the
/// file the other test runs idem under has them.
#[test]
fn the_docs_show_the_permission_file_as_it_is() {
    let file = std::fs::read_to_string(root().join("deploy/nats-permissions.conf")).unwrap();
    let sets = &file[file.find("IDEM_HOST = {").unwrap()..];
    let docs = std::fs::read_to_string(root().join("docs/deploying.md")).unwrap();
    assert!(
        docs.contains(&format!(
            "The sets, as the file has them:\n\n```\n{sets}```\n"
        )),
        "docs/deploying.md's \"Broker permissions\" differs from deploy/nats-permissions.conf: copy the file's sets into it"
    );
}
