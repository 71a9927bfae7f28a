//! One delivery's rows as the relay sends them: in call order, with the
//! publishes to one stream that allows atomic publish
//! (`allow_atomic`) gathered into one JetStream atomic batch, so they are
//! stored together or not at all (ADR-50, "JetStream Batch Publishing",
//! nats-server 2.12+). [`plan`] decides the steps; [`publish_batch`]
//! sends one batch.
//!
//! A batch is a sequence of publishes carrying `Nats-Batch-Id`,
//! `Nats-Batch-Sequence` (from 1) and, on the last, `Nats-Batch-Commit: 1`;
//! the server answers each with an empty reply and the last with a PubAck
//! for the whole batch. It keeps a batch that stops arriving for 10 s,
//! then abandons it, so every attempt uses a new batch id. Each message
//! keeps its own `Nats-Msg-Id`: a batch holding a message the stream
//! stored before is refused as a whole (error 10201, nats-server
//! `server/jetstream_batching.go`), which happens when a host died after
//! the batch was stored and before its rows were deleted; the rows are
//! then published one by one, and the stream answers each stored one as a
//! duplicate.

use crate::outbox::Target;
use crate::store::OutboxRow;
use std::collections::{HashMap, HashSet};

/// The most messages a JetStream atomic batch may hold by default
/// (nats-server `streamDefaultMaxAtomicBatchSize`); a larger group is
/// published one by one.
pub const MAX_BATCH: usize = 1000;

/// What the relay knows of the stream that stores a subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFacts {
    /// The stream's name.
    pub name: String,
    /// It accepts atomic batches (`allow_atomic`).
    pub atomic: bool,
}

/// One step of a delivery: indices into its rows (in call order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// One row, sent alone.
    One(usize),
    /// Two or more publishes to the stream named, as one atomic batch.
    Batch(String, Vec<usize>),
}

impl Step {
    /// The rows of this step.
    pub fn rows(&self) -> Vec<usize> {
        match self {
            Step::One(i) => vec![*i],
            Step::Batch(_, rows) => rows.clone(),
        }
    }
}

/// A group being gathered: its stream, members, their keys, and the keys
/// of rows outside it seen since it opened.
struct Open {
    stream: String,
    members: Vec<usize>,
    member_keys: HashSet<String>,
    other_keys: HashSet<String>,
    sealed: bool,
}

/// The steps that send `rows` (one delivery, in call order): each step
/// sits where its first row is. The publishes to one stream that allows
/// atomic publish (`streams` per subject; a subject not in it is sent
/// alone) form one batch, except where that would reorder rows of one
/// ordering key: a row outside the batch whose key the batch holds, seen
/// after the batch began, closes it, and a publish to the stream with a
/// key seen outside the batch since it began starts a new one. Rows of a
/// key therefore leave in call order, as they are stored. A batch of one
/// row is a plain publish; a group over [`MAX_BATCH`] rows is split.
pub fn plan(rows: &[OutboxRow], streams: &HashMap<String, StreamFacts>) -> Vec<Step> {
    // Steps in order of their first row; a group is one step.
    let mut order: Vec<Result<usize, usize>> = Vec::new(); // Ok(row) or Err(group)
    let mut groups: Vec<Open> = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let stream = match &row.target {
            Target::Publish(subject) => streams
                .get(subject)
                .filter(|f| f.atomic)
                .map(|f| f.name.clone()),
            Target::Call(_) => None,
        };
        let joined = stream.map(|stream| {
            let open = groups.iter().position(|g| {
                !g.sealed
                    && g.stream == stream
                    && g.members.len() < MAX_BATCH
                    && row.key.as_ref().is_none_or(|k| !g.other_keys.contains(k))
            });
            match open {
                Some(g) => g,
                None => {
                    // A group of the stream this row cannot join is closed.
                    for g in groups.iter_mut().filter(|g| g.stream == stream) {
                        g.sealed = true;
                    }
                    groups.push(Open {
                        stream,
                        members: Vec::new(),
                        member_keys: HashSet::new(),
                        other_keys: HashSet::new(),
                        sealed: false,
                    });
                    order.push(Err(groups.len() - 1));
                    groups.len() - 1
                }
            }
        });
        for (n, g) in groups.iter_mut().enumerate() {
            if Some(n) == joined {
                g.members.push(i);
                if let Some(k) = &row.key {
                    g.member_keys.insert(k.clone());
                }
            } else if let Some(k) = &row.key {
                if g.member_keys.contains(k) {
                    g.sealed = true;
                }
                g.other_keys.insert(k.clone());
            }
        }
        if joined.is_none() {
            order.push(Ok(i));
        }
    }
    order
        .into_iter()
        .map(|s| match s {
            Ok(i) => Step::One(i),
            Err(g) => {
                let g = &groups[g];
                match g.members.as_slice() {
                    [one] => Step::One(*one),
                    _ => Step::Batch(g.stream.clone(), g.members.clone()),
                }
            }
        })
        .collect()
}

/// What sending one batch came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchSent {
    /// Stored, every message of it.
    Stored,
    /// Refused as a whole for a reason publishing the rows one by one
    /// does not have: it holds a message stored before (error 10201), the
    /// stream does not allow atomic publish (any more, 10174), or the
    /// batch is larger than the server allows (10199); or a message of it
    /// was stored alone (acknowledged before the commit).
    OneByOne(String),
}

/// JetStream's error codes that make a batch go out one row at a time
/// (nats-server `server/errors.json`).
const DUPLICATE_IN_BATCH: u64 = 10201;
const ATOMIC_DISABLED: u64 = 10174;
const BATCH_TOO_LARGE: u64 = 10199;

/// Sends `rows` (publishes, with their `Nats-Msg-Id`s `ids`) through
/// `client` as one atomic batch: each message as a request, so an error
/// answers the message that caused it.
///
/// # Errors
/// A message is refused for another reason, or not answered (the server
/// abandons the batch: nothing of it is stored); the text says which.
pub async fn publish_batch(
    client: &async_nats::Client,
    rows: &[&OutboxRow],
    ids: &[String],
) -> Result<BatchSent, String> {
    let batch_id = nuid::next().to_string();
    let last = rows.len();
    for (n, (row, id)) in rows.iter().zip(ids).enumerate() {
        let Target::Publish(subject) = &row.target else {
            return Err("a call cannot be part of a batch".into());
        };
        let mut headers = async_nats::HeaderMap::new();
        for (k, v) in &row.headers {
            headers.append(k.as_str(), v.as_str());
        }
        headers.insert("Nats-Msg-Id", id.as_str());
        headers.insert("Nats-Batch-Id", batch_id.as_str());
        headers.insert("Nats-Batch-Sequence", (n + 1).to_string().as_str());
        if n + 1 == last {
            headers.insert("Nats-Batch-Commit", "1");
        }
        let reply = client
            .request_with_headers(subject.clone(), headers, row.payload.clone().into())
            .await
            .map_err(|e| format!("cannot publish to {subject} in a batch: {e}"))?;
        match answer(&reply.payload) {
            Answer::Empty if n + 1 < last => {}
            Answer::Empty => {
                return Err(format!(
                    "the stream for {subject} answered a batch's commit without an acknowledgement"
                ));
            }
            // Acknowledged before the commit: the stream stored this one
            // message alone (it takes no batches, whatever it said
            // before), so the rest goes one by one, where this one is a
            // duplicate.
            Answer::Ack if n + 1 < last => {
                return Ok(BatchSent::OneByOne(format!(
                    "the stream for {subject} acknowledged a batch's message {} alone",
                    n + 1
                )));
            }
            Answer::Ack => return Ok(BatchSent::Stored),
            Answer::Error(DUPLICATE_IN_BATCH | ATOMIC_DISABLED | BATCH_TOO_LARGE, text) => {
                return Ok(BatchSent::OneByOne(text));
            }
            Answer::Error(_, text) => {
                return Err(format!("the stream for {subject} refused a batch: {text}"));
            }
        }
    }
    Err("an empty batch".into())
}

/// A server's answer to one message of a batch.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// Received, not stored yet.
    Empty,
    /// The PubAck of the whole batch.
    Ack,
    /// An error: JetStream's code and the printable text.
    Error(u64, String),
}

/// Reads an answer: empty, a PubAck (`{"stream": …, "seq": …}`) or an
/// error (`{"error": {"code": 400, "err_code": 10201, "description": …}}`,
/// JetStream's `pub_ack_response` schema). Anything else is an error
/// quoted at most 200 bytes long, escaped.
fn answer(payload: &[u8]) -> Answer {
    #[derive(serde::Deserialize)]
    struct ApiError {
        #[serde(default)]
        err_code: u64,
        #[serde(default)]
        description: String,
    }
    #[derive(serde::Deserialize)]
    struct Reply {
        stream: Option<String>,
        error: Option<ApiError>,
    }
    if payload.is_empty() {
        return Answer::Empty;
    }
    match serde_json::from_slice::<Reply>(payload) {
        Ok(Reply { error: Some(e), .. }) => Answer::Error(
            e.err_code,
            format!(
                "{} (error {})",
                crate::deploy::record::escaped(&e.description, 200),
                e.err_code
            ),
        ),
        Ok(Reply {
            stream: Some(_), ..
        }) => Answer::Ack,
        _ => Answer::Error(
            0,
            format!(
                "an answer that is no PubAck: {}",
                crate::deploy::record::escaped(&String::from_utf8_lossy(payload), 200)
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: Target, key: Option<&str>) -> OutboxRow {
        OutboxRow {
            id: 0,
            consumer: "h".into(),
            message_id: "m".into(),
            call_index: 0,
            target,
            payload: Vec::new(),
            headers: Vec::new(),
            key: key.map(str::to_owned),
            attempts: 1,
            created_ms: 0,
            lease_ms: 0,
        }
    }
    fn publish(subject: &str, key: Option<&str>) -> OutboxRow {
        row(Target::Publish(subject.into()), key)
    }
    fn call(key: Option<&str>) -> OutboxRow {
        row(Target::Call("notify".into()), key)
    }
    fn streams() -> HashMap<String, StreamFacts> {
        let facts = |name: &str, atomic| StreamFacts {
            name: name.into(),
            atomic,
        };
        [
            ("a.1".to_owned(), facts("A", true)),
            ("a.2".to_owned(), facts("A", true)),
            ("b.1".to_owned(), facts("B", true)),
            ("n.1".to_owned(), facts("N", false)),
        ]
        .into()
    }
    fn batch(stream: &str, rows: &[usize]) -> Step {
        Step::Batch(stream.into(), rows.to_vec())
    }

    #[test]
    fn publishes_to_one_atomic_stream_go_as_one_batch_where_the_first_is() {
        let rows = [
            publish("a.1", None),
            publish("b.1", None),
            call(None),
            publish("a.2", None),
            publish("a.1", None),
        ];
        assert_eq!(
            plan(&rows, &streams()),
            vec![batch("A", &[0, 3, 4]), Step::One(1), Step::One(2)]
        );
    }

    #[test]
    fn a_stream_without_atomic_publish_or_unknown_sends_one_by_one() {
        let rows = [
            publish("n.1", None),
            publish("n.1", None),
            publish("x.1", None),
            publish("x.1", None),
        ];
        assert_eq!(
            plan(&rows, &streams()),
            (0..4).map(Step::One).collect::<Vec<_>>()
        );
        // One publish to an atomic stream is a plain publish.
        assert_eq!(
            plan(&[publish("a.1", None), call(None)], &streams()),
            vec![Step::One(0), Step::One(1)]
        );
    }

    #[test]
    fn a_batch_never_moves_a_row_of_a_key_past_another_of_the_same_key() {
        // The call with key k lies between two publishes of k: the batch
        // closes at it, and the second publish starts a new one.
        let rows = [
            publish("a.1", Some("k")),
            publish("a.2", None),
            call(Some("k")),
            publish("a.1", Some("k")),
            publish("a.2", None),
        ];
        assert_eq!(
            plan(&rows, &streams()),
            vec![batch("A", &[0, 1]), Step::One(2), batch("A", &[3, 4])]
        );
        // A key first seen outside: a publish of it cannot join a batch
        // that began before that row.
        let rows = [
            publish("a.1", None),
            call(Some("k")),
            publish("a.2", Some("k")),
            publish("a.1", None),
        ];
        assert_eq!(
            plan(&rows, &streams()),
            vec![Step::One(0), Step::One(1), batch("A", &[2, 3])]
        );
        // Other keys do not close it.
        let rows = [
            publish("a.1", Some("k")),
            call(Some("j")),
            publish("a.2", Some("k")),
        ];
        assert_eq!(
            plan(&rows, &streams()),
            vec![batch("A", &[0, 2]), Step::One(1)]
        );
    }

    #[test]
    fn a_group_larger_than_a_batch_may_be_is_split() {
        let rows: Vec<OutboxRow> = (0..MAX_BATCH + 2).map(|_| publish("a.1", None)).collect();
        let steps = plan(&rows, &streams());
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].rows(), (0..MAX_BATCH).collect::<Vec<_>>());
        assert_eq!(steps[1], batch("A", &[MAX_BATCH, MAX_BATCH + 1]));
    }

    #[test]
    fn answers_are_read_as_empty_ack_or_error() {
        assert_eq!(answer(b""), Answer::Empty);
        assert_eq!(
            answer(br#"{"stream":"A","seq":7,"batch":"x","count":3}"#),
            Answer::Ack
        );
        assert_eq!(
            answer(br#"{"error":{"code":400,"err_code":10201,"description":"atomic publish batch contains duplicate message id"}}"#),
            Answer::Error(
                10201,
                "atomic publish batch contains duplicate message id (error 10201)".into()
            )
        );
        let garbled = answer(b"\x1b[31mnot json");
        assert!(
            matches!(&garbled, Answer::Error(0, text) if !text.contains('\x1b') && text.contains("not json")),
            "{garbled:?}"
        );
    }
}
