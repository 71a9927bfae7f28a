//! `idem publish` against a real nats-server: it reports exactly how many
//! lines the stream stored, and stops at the first line it cannot store
//! (not JSON, over the server's `max_payload`, over the stream's
//! `max_msg_size`, refused by the stream) with every line before it stored
//! and confirmed and nothing after it sent, naming the line and the reason
//! in one line; `--skip-bad` skips and lists such lines instead;
//! `--config` connects with the config's `[broker]` credentials.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use async_nats::jetstream::{self, stream};
use idem_tests::*;
use std::path::{Path, PathBuf};

/// `idem publish ARGS` with logging off: (exit code, stdout, stderr).
fn publish(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["publish"];
    all.extend_from_slice(args);
    idem_cli(&all, &[])
}

/// `lines` written as a JSON Lines file `name` in `dir`.
fn jsonl(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let file = dir.join(name);
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(&file, text).unwrap();
    file
}

/// A credit-like JSON line of exactly `len` bytes: `{"event_id":ID,"pad":"xx…"}`.
fn padded(event_id: &str, len: usize) -> String {
    let empty = serde_json::json!({"event_id": event_id, "pad": ""}).to_string();
    let line =
        serde_json::json!({"event_id": event_id, "pad": "x".repeat(len - empty.len())}).to_string();
    assert_eq!(line.len(), len);
    line
}

/// Bytes of the header block `idem publish` sends with `--msg-id` and an
/// id of `id_len` bytes: `NATS/1.0\r\nNats-Msg-Id: ID\r\n\r\n`.
fn msg_id_header(id_len: usize) -> usize {
    "NATS/1.0\r\nNats-Msg-Id: \r\n\r\n".len() + id_len
}

async fn messages(js: &jetstream::Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages
}

async fn payload_at(js: &jetstream::Context, stream: &str, sequence: u64) -> String {
    let m = js
        .get_stream(stream)
        .await
        .unwrap()
        .get_raw_message(sequence)
        .await
        .unwrap();
    String::from_utf8(m.payload.to_vec()).unwrap()
}

/// Line 1,000 of 1,200 is not JSON: exactly the 999 lines before it are in
/// the stream (the last of them at sequence 999), nothing after it, exit 1
/// with one line naming line 1,000; `--skip-bad` stores the other 1,199 and
/// lists line 1,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_that_is_not_json_stops_publishing_with_every_line_before_it_stored() {
    let nats = Nats::start();
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    let js = nats.jetstream().await;
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (1..=1200)
        .map(|i| match i {
            1000 => r#"{"event_id": oops}"#.to_string(),
            _ => credit(&format!("e{i}"), 1, 1),
        })
        .collect();
    let file = jsonl(dir.path(), "events.jsonl", &lines);
    let f = file.to_str().unwrap();
    let url = nats.url();
    let args = ["--broker", &url, "--subject", "accounts.credit", f];

    let (code, out, err) = publish(&args);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        out,
        format!("stored 999 messages in stream ACCOUNTS (subject accounts.credit) from {f}\n")
    );
    assert_eq!(
        err,
        format!(
            "idem: {f} line 1000 not sent: not JSON: expected value at column 14; publishing stopped there: every line before it is stored (999 messages), nothing after it was sent; fix it, or pass --skip-bad to skip such lines\n"
        )
    );
    assert_eq!(messages(&js, "ACCOUNTS").await, 999);
    assert_eq!(payload_at(&js, "ACCOUNTS", 999).await, lines[998]);

    let (code, out, err) = publish(&[
        "--broker",
        &url,
        "--subject",
        "accounts.credit",
        "--skip-bad",
        f,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "stored 1199 messages in stream ACCOUNTS (subject accounts.credit) from {f}; skipped 1 line: 1000\n"
        )
    );
    assert_eq!(
        err,
        format!("idem: {f} line 1000 skipped: not JSON: expected value at column 14\n")
    );
    assert_eq!(messages(&js, "ACCOUNTS").await, 999 + 1199);
    // Line 1,001 follows line 999 of the second run: 999 + 999 + 1.
    assert_eq!(payload_at(&js, "ACCOUNTS", 1999).await, lines[1000]);
    assert_eq!(payload_at(&js, "ACCOUNTS", 2198).await, lines[1199]);
}

/// Against a server with `max_payload: 4096`: a line of exactly 4,096
/// bytes is stored; at the first message over it (the line alone, or the
/// line and its `Nats-Msg-Id` header) publishing stops with the two lines
/// before it stored and nothing after it sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_over_max_payload_stops_publishing_with_every_line_before_it_stored() {
    let nats = Nats::start_with_config("max_payload: 4096\n");
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    let js = nats.jetstream().await;
    let dir = tempfile::tempdir().unwrap();
    let url = nats.url();

    let lines = [
        padded("a", 100),
        padded("b", 4096),
        padded("c", 4097),
        padded("d", 100),
    ];
    let plain = jsonl(dir.path(), "plain.jsonl", &lines);
    let f = plain.to_str().unwrap();
    let (code, out, err) = publish(&["--broker", &url, "--subject", "accounts.credit", f]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        out,
        format!("stored 2 messages in stream ACCOUNTS (subject accounts.credit) from {f}\n")
    );
    assert_eq!(
        err,
        format!(
            "idem: {f} line 3 not sent: max_payload exceeded: the line is over 4096 bytes, the server's max_payload; publishing stopped there: every line before it is stored (2 messages), nothing after it was sent; fix it, or pass --skip-bad to skip such lines\n"
        )
    );
    assert_eq!(messages(&js, "ACCOUNTS").await, 2);
    assert_eq!(payload_at(&js, "ACCOUNTS", 2).await, lines[1]);

    // With `--msg-id` the header counts: 4,095 bytes of line and header
    // pass, 4,097 do not.
    let fits = 4096 - msg_id_header(1);
    let lines = [
        padded("e", 100),
        padded("f", fits),
        padded("g", fits + 1),
        padded("h", 100),
    ];
    let file = jsonl(dir.path(), "with-id.jsonl", &lines);
    let f = file.to_str().unwrap();
    let (code, out, err) = publish(&[
        "--broker",
        &url,
        "--subject",
        "accounts.credit",
        "--msg-id",
        "json:/event_id",
        f,
    ]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        out,
        format!("stored 2 messages in stream ACCOUNTS (subject accounts.credit) from {f}\n")
    );
    assert_eq!(
        err,
        format!(
            "idem: {f} line 3 not sent: max_payload exceeded: the message is 4097 bytes, the server's max_payload is 4096; publishing stopped there: every line before it is stored (2 messages), nothing after it was sent; fix it, or pass --skip-bad to skip such lines\n"
        )
    );
    assert_eq!(messages(&js, "ACCOUNTS").await, 4);
    let m = js
        .get_stream("ACCOUNTS")
        .await
        .unwrap()
        .get_raw_message(4)
        .await
        .unwrap();
    assert_eq!(m.headers.get("Nats-Msg-Id").unwrap().as_str(), "f");

    // `--skip-bad` stores the others and lists line 3.
    let f = plain.to_str().unwrap();
    let (code, out, err) = publish(&[
        "--broker",
        &url,
        "--subject",
        "accounts.credit",
        "--skip-bad",
        f,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "stored 3 messages in stream ACCOUNTS (subject accounts.credit) from {f}; skipped 1 line: 3\n"
        )
    );
    assert_eq!(
        err,
        format!(
            "idem: {f} line 3 skipped: max_payload exceeded: the line is over 4096 bytes, the server's max_payload\n"
        )
    );
    assert_eq!(messages(&js, "ACCOUNTS").await, 7);
}

/// A stream with `max_msg_size` 512: a message of 512 bytes (line and
/// header) is stored, one of 513 stops publishing before it is sent, in
/// the words the server uses when it refuses one (checked here too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_over_the_streams_max_msg_size_stops_publishing_before_it_is_sent() {
    let nats = Nats::start();
    let js = nats.jetstream().await;
    js.create_stream(stream::Config {
        name: "SMALL".into(),
        subjects: vec!["small.in".into()],
        max_message_size: 512,
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fits = 512 - msg_id_header(1);
    let lines = [
        padded("a", 100),
        padded("b", fits),
        padded("c", fits + 1),
        padded("d", 100),
    ];
    let file = jsonl(dir.path(), "events.jsonl", &lines);
    let f = file.to_str().unwrap();
    let url = nats.url();
    let (code, out, err) = publish(&[
        "--broker",
        &url,
        "--subject",
        "small.in",
        "--msg-id",
        "json:/event_id",
        f,
    ]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        out,
        format!("stored 2 messages in stream SMALL (subject small.in) from {f}\n")
    );
    assert_eq!(
        err,
        format!(
            "idem: {f} line 3 not sent: message size exceeds maximum allowed: the message is 513 bytes, stream SMALL's max_msg_size is 512; publishing stopped there: every line before it is stored (2 messages), nothing after it was sent; fix it, or pass --skip-bad to skip such lines\n"
        )
    );
    assert_eq!(messages(&js, "SMALL").await, 2);

    // The server counts the header as idem does: line 3 with its header
    // is refused, in the words idem reports.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", "c");
    let refused = js
        .publish_with_headers("small.in", headers, lines[2].clone().into())
        .await
        .unwrap()
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("message size exceeds maximum allowed"),
        "{refused}"
    );
    assert_eq!(messages(&js, "SMALL").await, 2);
}

/// A stream that refuses a line when its PubAck comes back (full, with
/// `discard: new`): the three lines before it are stored, the two already
/// sent after it are counted (none stored), exit 1 naming line 4 and the
/// server's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_the_stream_refuses_stops_publishing_and_counts_what_was_in_flight() {
    let nats = Nats::start();
    let js = nats.jetstream().await;
    js.create_stream(stream::Config {
        name: "FULL".into(),
        subjects: vec!["full.in".into()],
        max_messages: 3,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (1..=6).map(|i| credit(&format!("e{i}"), 1, 1)).collect();
    let file = jsonl(dir.path(), "events.jsonl", &lines);
    let f = file.to_str().unwrap();
    let url = nats.url();
    let (code, out, err) = publish(&["--broker", &url, "--subject", "full.in", f]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        out,
        format!("stored 3 messages in stream FULL (subject full.in) from {f}\n")
    );
    assert_eq!(
        err,
        format!(
            "idem: {f} line 4 not stored: maximum messages exceeded (code 503, error code 10077); publishing stopped there: every line before it is stored (3 messages), 2 lines after it already sent, 0 of them stored (3 in all); pass --skip-bad to go on past lines the stream refuses\n"
        )
    );
    assert_eq!(messages(&js, "FULL").await, 3);
    assert_eq!(payload_at(&js, "FULL", 3).await, lines[2]);
}

/// No stream captures the subject: one line, nothing sent, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_stream_capturing_the_subject_sends_nothing() {
    let nats = Nats::start();
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = jsonl(dir.path(), "events.jsonl", &[credit("e1", 1, 5)]);
    let url = nats.url();
    let (code, out, err) = publish(&[
        "--broker",
        &url,
        "--subject",
        "nobody.listens",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(out, "");
    assert_eq!(
        err,
        "idem: no stream captures subject `nobody.listens`, so nothing was sent; create one (`idem run` creates each handler's stream at its start)\n"
    );
    assert_eq!(messages(&nats.jetstream().await, "ACCOUNTS").await, 0);
}

/// Blank lines are not messages; with `--msg-id` JetStream's duplicate
/// window drops a repeated id, and the summary says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_sends_one_message_per_line_and_counts_duplicates() {
    let nats = Nats::start();
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    let js = nats.jetstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("events.jsonl");
    std::fs::write(
        &file,
        format!(
            "{}\n\n{}\r\n{}\n",
            credit("e1", 1, 5),
            credit("e2", 1, 5),
            credit("e1", 1, 5)
        ),
    )
    .unwrap();
    let url = nats.url();
    let f = file.to_str().unwrap();
    let (code, out, err) = publish(&["--broker", &url, "--subject", "accounts.credit", f]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("stored 3 messages in stream ACCOUNTS (subject accounts.credit) from {f}\n")
    );
    assert_eq!(payload_at(&js, "ACCOUNTS", 2).await, credit("e2", 1, 5));
    let (code, out, err) = publish(&[
        "--broker",
        &url,
        "--subject",
        "accounts.credit",
        "--msg-id",
        "json:/event_id",
        f,
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!(
            "stored 3 messages in stream ACCOUNTS (subject accounts.credit) from {f}; 1 of them a duplicate the stream already held (same Nats-Msg-Id)\n"
        )
    );
    assert_eq!(err, "");
    assert_eq!(messages(&js, "ACCOUNTS").await, 5);
}

/// `--config` connects as `[broker]` says: against a token-protected
/// server it publishes with the config's token, where `--broker URL` is
/// refused; `--config` and `--broker` together are a usage error (exit 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_publishes_with_the_brokers_token() {
    let nats = Nats::start_with_config("authorization { token: \"tok-publish8\" }\n");
    let url = nats.url();
    let client = async_nats::ConnectOptions::with_token("tok-publish8".into())
        .connect(&url)
        .await
        .unwrap();
    let js = jetstream::new(client);
    js.create_stream(stream::Config {
        name: "ACCOUNTS".into(),
        subjects: vec!["accounts.credit".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"{url}\"\ntoken = \"tok-publish8\"\n[database]\nurl = \"sqlite://{}/idem.db\"\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"ACCOUNTS\"\nsubjects = [\"accounts.credit\"]\ntables = [\"accounts\"]\n",
            dir.path().display(),
            guest("credit").display()
        ),
    )
    .unwrap();
    let lines: Vec<String> = (1..=3).map(|i| credit(&format!("e{i}"), 1, 1)).collect();
    let file = jsonl(dir.path(), "events.jsonl", &lines);
    let f = file.to_str().unwrap();
    let c = cfg.to_str().unwrap();

    let (code, out, err) = publish(&["--config", c, "--subject", "accounts.credit", f]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("stored 3 messages in stream ACCOUNTS (subject accounts.credit) from {f}\n")
    );
    assert_eq!(messages(&js, "ACCOUNTS").await, 3);

    let (code, out, err) = publish(&["--broker", &url, "--subject", "accounts.credit", f]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(out, "");
    assert_eq!(
        err,
        format!(
            "idem: NATS at {url} refused idem's credentials (authorization violation); the server wants credentials: set [broker] token, user and password, nkey_seed or creds_file\n"
        )
    );

    let (code, _, err) = publish(&[
        "--config",
        c,
        "--broker",
        &url,
        "--subject",
        "accounts.credit",
        f,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with(
            "idem: the argument '--config <CONFIG>' cannot be used with '--broker <BROKER>'"
        ),
        "{err}"
    );
    assert_eq!(messages(&js, "ACCOUNTS").await, 3);
}
