//! Setups that would lose or skip messages without a word are refused at
//! start: a new consumer whose `start` lies past the stream's next message,
//! and a database whose commits are not durable (unless
//! `[database] accept_non_durable_commit`); and the names `idem replay --as`
//! writes under are taken by `idem receipts show` and `idem dlq redrive`.
//! The real CLI binary against real nats-server, PostgreSQL and SQLite.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use serde_json::json;
use std::path::Path;

const SUBJECT: &str = "accounts.credit";

/// The idem CLI with `args` and `--config cfg`, logging at `log`
/// (`RUST_LOG`); (exit code, stdout, stderr).
fn cli(cfg: &Path, args: &[&str], log: &str) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem-test-host"))
        .args(args)
        .arg("--config")
        .arg(cfg)
        .env("RUST_LOG", log)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn with_start(start: &str) -> HandlerSpec {
    let mut h = HandlerSpec::new("credit", "credit");
    h.extra.push_str(&format!("start = \"{start}\"\n"));
    h
}

async fn has_consumer(nats: &Nats, name: &str) -> bool {
    let js = nats.jetstream().await;
    match js.get_stream("ACCOUNTS").await {
        Ok(stream) => stream.consumer_info(name).await.is_ok(),
        Err(_) => false,
    }
}

/// Stream at sequence 5, `start = "seq:20"`: the host refuses to create the
/// consumer (one line, exit 1; no consumer, nothing applied). `seq:6` (the
/// next message) is taken; once the consumer exists, `seq:20` is left
/// alone and the consumer goes on from where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_consumer_starting_past_the_stream_end_is_refused() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    let js = nats.jetstream().await;
    for i in 1..=5 {
        publish(&js, SUBJECT, &credit(&format!("p{i}"), 1, 1), &[]).await;
    }
    let cfg = write_config(dir.path(), &nats, &db, &[with_start("seq:20")]);
    let (code, out, err) = cli(&cfg, &["run", "--drain"], "off");
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            1,
            "",
            "idem: handler `credit`: start = \"seq:20\" is past the end of stream `ACCOUNTS`, whose last sequence is 5: the new durable consumer would skip messages 6 to 19 (14 messages) as they arrive; set start = \"seq:6\" (the next message) or \"new\"\n"
        )
    );
    assert!(!has_consumer(&nats, "credit").await);
    let cfg = write_config(dir.path(), &nats, &db, &[with_start("seq:7")]);
    let (code, _, err) = cli(&cfg, &["run", "--drain"], "off");
    assert_eq!(
        (code, err.as_str()),
        (
            1,
            "idem: handler `credit`: start = \"seq:7\" is past the end of stream `ACCOUNTS`, whose last sequence is 5: the new durable consumer would skip message 6 (1 message) as they arrive; set start = \"seq:6\" (the next message) or \"new\"\n"
        )
    );
    assert!(!has_consumer(&nats, "credit").await);

    let cfg = write_config(dir.path(), &nats, &db, &[with_start("seq:6")]);
    let (code, _, err) = cli(&cfg, &["run", "--drain"], "off");
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(has_consumer(&nats, "credit").await);
    assert_eq!(db.receipts("credit").await, 0);
    for i in 6..=8 {
        publish(&js, SUBJECT, &credit(&format!("p{i}"), 1, 10), &[]).await;
    }
    // The consumer exists: `start` no longer applies, it goes on at 6.
    let cfg = write_config(dir.path(), &nats, &db, &[with_start("seq:20")]);
    let (code, _, err) = cli(&cfg, &["run", "--drain"], "off");
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(db.balance(1).await, Some(30));
    assert_eq!(db.receipts("credit").await, 3);
}

/// Commits that return before they are on disk: PostgreSQL
/// `synchronous_commit = off` set on the test's own database (and, in the
/// URL's options, for the session), SQLite `synchronous = NORMAL` set by a
/// handler migration on the pool's connection. Refused by default (exit 1,
/// one line, nothing consumed); with `accept_non_durable_commit = true` the
/// host runs and warns once.
async fn non_durable_commits_are_refused_unless_accepted(backend: Backend) {
    let nats = Nats::start();
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        &nats,
        &db,
        &[HandlerSpec::new("credit", "credit")],
    );
    let expected = match backend {
        Backend::Postgres => {
            let name = db.pg_database().unwrap();
            db.execute(&format!(
                "ALTER DATABASE {name} SET synchronous_commit = off"
            ))
            .await;
            format!(
                "idem: database commits are not durable: synchronous_commit = off, set by ALTER DATABASE … SET, so a crash can lose an effect whose message was already acked and is never redelivered; ALTER DATABASE \"{name}\" RESET synchronous_commit, or set [database] accept_non_durable_commit = true to run knowingly\n"
            )
        }
        Backend::Sqlite => {
            let migrations = dir.path().join("migrations");
            std::fs::create_dir(&migrations).unwrap();
            let credit = root().join("examples/credit/migrations/0001_accounts.sql");
            std::fs::copy(credit, migrations.join("0001_accounts.sql")).unwrap();
            std::fs::write(
                migrations.join("0002_faster.sql"),
                "-- no-transaction\nPRAGMA synchronous = NORMAL;\n",
            )
            .unwrap();
            let text = std::fs::read_to_string(&cfg).unwrap();
            let shipped = root().join("examples/credit/migrations");
            let text = text.replace(
                &shipped.display().to_string(),
                &migrations.display().to_string(),
            );
            std::fs::write(&cfg, text).unwrap();
            "idem: database commits are not durable: a connection runs with PRAGMA synchronous = NORMAL (1) in journal mode wal (a migration sets it on the connection it runs on), so a crash can lose an effect whose message was already acked and is never redelivered; remove that PRAGMA from the handlers' migrations, or set [database] accept_non_durable_commit = true to run knowingly\n".to_string()
        }
    };
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    let js = nats.jetstream().await;
    let (code, out, err) = cli(&cfg, &["run", "--drain"], "off");
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (1, "", expected.as_str())
    );
    assert!(!has_consumer(&nats, "credit").await);
    publish(&js, SUBJECT, &credit("c1", 1, 5), &[]).await;

    if backend == Backend::Postgres {
        // The same setting in the session's options, from the URL.
        let text = std::fs::read_to_string(&cfg).unwrap();
        let sep = if db.url.contains('?') { '&' } else { '?' };
        let session = text.replace(
            &db.url,
            &format!("{}{sep}options=-c%20synchronous_commit%3Doff", db.url),
        );
        let name = db.pg_database().unwrap();
        db.execute(&format!("ALTER DATABASE {name} RESET synchronous_commit"))
            .await;
        std::fs::write(&cfg, &session).unwrap();
        let (code, _, err) = cli(&cfg, &["run", "--drain"], "off");
        assert_eq!(
            (code, err.as_str()),
            (
                1,
                "idem: database commits are not durable: synchronous_commit = off, set by the connection's options ([database] url options=-c …, or PGOPTIONS), so a crash can lose an effect whose message was already acked and is never redelivered; remove synchronous_commit from them, or set [database] accept_non_durable_commit = true to run knowingly\n"
            )
        );
        assert!(!has_consumer(&nats, "credit").await);
    } else {
        // The migration is applied now: take it back so it runs again.
        db.execute("DELETE FROM idem_migrations_credit WHERE version = 2")
            .await;
    }
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replace(
            "max_connections = 4\n",
            "max_connections = 4\naccept_non_durable_commit = true\n",
        ),
    )
    .unwrap();
    let (code, _, err) = cli(&cfg, &["run", "--drain"], "warn");
    assert_eq!(code, 0, "{err}");
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("database commits are not durable"))
        .collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(
        warned[0].contains("accept_non_durable_commit = true, so a crash can lose effects whose messages were already acked"),
        "{err}"
    );
    assert_eq!(db.balance(1).await, Some(5));
    assert_eq!(db.receipts("credit").await, 1);
}
on_both_databases!(
    non_durable_commits_are_refused_unless_accepted,
    non_durable_commits_are_refused_unless_accepted
);

/// The `behave` op that credits `amount` to an account that must already
/// exist (NOT NULL rejects the upsert of a missing one).
fn credit_existing(event_id: &str, account: i64, amount: i64) -> String {
    json!({
        "op": "sql",
        "event_id": event_id,
        "sql": format!(
            "INSERT INTO accounts (account_id, balance) \
             VALUES ({account}, (SELECT balance FROM accounts WHERE account_id = {account}) + {amount}) \
             ON CONFLICT (account_id) DO UPDATE SET balance = excluded.balance"
        ),
    })
    .to_string()
}

/// `idem replay --as rebuild-1` writes receipts and a dead letter under a
/// name no handler has: `idem receipts show` summarises and shows them,
/// `idem dlq redrive ID` and `--handler rebuild-1 --all` run the dead
/// letters through the handler that replayed them, under `rebuild-1`. A
/// name that is neither a handler nor holds anything is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_and_redrive_take_the_names_replay_makes() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let mut h = HandlerSpec::new("behave", "behave");
    h.extra = "retry_delay = \"100ms\"\nmax_deliver = 1\n".into();
    let cfg = write_config(dir.path(), &nats, &db, &[h]);
    create_stream(&nats, "ACCOUNTS", &[SUBJECT]).await;
    let js = nats.jetstream().await;
    let ok = json!({"op": "credit", "event_id": "evt_ok", "account_id": 8, "amount": 10});
    publish(&js, SUBJECT, &ok.to_string(), &[]).await;
    publish(&js, SUBJECT, &credit_existing("evt_a", 7, 25), &[]).await;
    publish(&js, SUBJECT, &credit_existing("evt_b", 6, 5), &[]).await;
    let (code, _, err) = cli(&cfg, &["run", "--drain"], "off");
    assert_eq!(code, 0, "{err}");
    db.execute("DELETE FROM idem_dead_letters").await;
    db.execute("DELETE FROM accounts").await;

    let (code, out, err) = cli(
        &cfg,
        &["replay", "behave", "--from-seq", "1", "--as", "rebuild-1"],
        "off",
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("new=1 duplicates=0 dead_lettered=2"), "{out}");
    assert_eq!(db.receipts("rebuild-1").await, 1);

    let (code, out, err) = cli(&cfg, &["receipts", "show", "--handler", "rebuild-1"], "off");
    assert_eq!((code, err.as_str()), (0, ""));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert_eq!(lines[0], "handler: rebuild-1");
    assert_eq!(lines[1], "receipts: 1");
    assert_eq!(
        lines[4],
        "retention: none (no handler of the config has this name, written by idem replay --as: its receipts are never pruned)"
    );
    let (code, out, err) = cli(
        &cfg,
        &["receipts", "show", "--handler", "rebuild-1", "evt_ok"],
        "off",
    );
    assert_eq!((code, err.as_str()), (0, ""));
    assert!(
        out.starts_with("handler: rebuild-1\nmessage id: evt_ok\nstream sequence: 1\n"),
        "{out}"
    );
    let (code, _, err) = cli(
        &cfg,
        &["receipts", "show", "--handler", "rebuild-1", "evt_a"],
        "off",
    );
    assert_eq!(
        (code, err.as_str()),
        (1, format!("idem: no receipt for message `evt_a` under `rebuild-1` (no handler of {}; an `idem replay --as` name): it was never processed under that name, or its receipt was forgotten\n", cfg.display()).as_str())
    );
    let (code, _, err) = cli(&cfg, &["receipts", "show", "--handler", "behvae"], "off");
    assert_eq!(
        (code, err.as_str()),
        (1, format!("idem: `behvae` is no handler of {} (it has behave) and has nothing stored under it as an `idem replay --as` name; check the name or pass the config that runs it with --config\n", cfg.display()).as_str())
    );

    // Fix what failed, then redrive one by id and the rest by name.
    db.execute("INSERT INTO accounts (account_id, balance) VALUES (7, 0), (6, 0)")
        .await;
    let ids: Vec<i64> = {
        let pool = db.pool().await;
        let ids = sqlx::query_scalar(
            "SELECT id FROM idem_dead_letters WHERE consumer = 'rebuild-1' ORDER BY id",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        pool.close().await;
        ids
    };
    assert_eq!(ids.len(), 2);
    let (code, out, err) = cli(&cfg, &["dlq", "redrive", &ids[0].to_string()], "off");
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, format!("dead letter {} (handler rebuild-1, message evt_a): processed; dead letter removed\n", ids[0]).as_str(), "")
    );
    let (code, out, err) = cli(
        &cfg,
        &["dlq", "redrive", "--handler", "rebuild-1", "--all"],
        "off",
    );
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, format!("dead letter {} (handler rebuild-1, message evt_b): processed; dead letter removed\nhandler rebuild-1: 1 processed, 0 already processed, 0 failed, 0 without a message id\n", ids[1]).as_str(), "")
    );
    assert_eq!(db.balance(7).await, Some(25));
    assert_eq!(db.balance(6).await, Some(5));
    assert_eq!(
        db.receipt_ids("rebuild-1").await,
        vec!["evt_a".to_string(), "evt_b".into(), "evt_ok".into()]
    );
    assert_eq!(db.receipts("behave").await, 1);
    let (code, _, err) = cli(
        &cfg,
        &["dlq", "redrive", "--handler", "nope!", "--all"],
        "off",
    );
    assert_eq!(
        (code, err.as_str()),
        (1, format!("idem: handler `nope!` is not in {} (it has behave); check the name or pass the config that runs it with --config\n", cfg.display()).as_str())
    );
}
