//! How the relay sends one delivery (`super::relay`): its rows in call
//! order as [`plan`] steps them, publishes to one stream as one atomic
//! batch (`super::batch`), a publish awaiting its PubAck, a call its 2xx.

use super::Target;
use super::batch::{BatchSent, Step, plan, publish_batch};
use super::flight::{Outcome, Progress};
use super::relay::{Relay, SEND_TIMEOUT, Sent, delivery_id, now_ms, retry_after};
use crate::store::OutboxRow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

impl Relay {
    /// Sends one delivery's rows (in call order) as [`plan`] steps them,
    /// recording each step's outcome in `progress` as it ends. A step not
    /// started by `until` or `stop` gives its rows back; so does a step
    /// holding a row whose key an earlier failed row of this delivery
    /// holds (the claim then waits for that row's retry).
    pub(super) async fn send_delivery(
        &self,
        rows: Vec<OutboxRow>,
        stop: Option<&CancellationToken>,
        until: Instant,
        progress: Arc<Progress>,
    ) {
        let over = || Instant::now() >= until || stop.is_some_and(CancellationToken::is_cancelled);
        let mut streams = HashMap::new();
        let publishes: Vec<&str> = rows
            .iter()
            .filter_map(|r| match &r.target {
                Target::Publish(s) => Some(s.as_str()),
                Target::Call(_) => None,
            })
            .collect();
        if publishes.len() > 1 && !over() {
            for subject in publishes {
                if streams.contains_key(subject) {
                    continue;
                }
                match self.streams.facts(&self.js, subject).await {
                    Ok(Some(facts)) => {
                        streams.insert(subject.to_owned(), facts);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        // The publishes failed; the calls were not tried
                        // (a try of theirs counts toward parking) and wait
                        // with them.
                        let due = self.due_together(rows.iter());
                        progress.record(rows.into_iter().map(|row| match row.target {
                            Target::Publish(_) => Outcome::failed(row, &e, due),
                            Target::Call(_) => Outcome::given_back_until(row, due),
                        }));
                        return;
                    }
                }
            }
        }
        let steps = plan(&rows, &streams);
        let mut slots: Vec<Option<OutboxRow>> = rows.into_iter().map(Some).collect();
        // Each step's rows, with the stream when they go as one batch.
        let mut todo: std::collections::VecDeque<(Option<String>, Vec<OutboxRow>)> = steps
            .into_iter()
            .map(|step| {
                let taken: Vec<OutboxRow> = step
                    .rows()
                    .iter()
                    .filter_map(|i| slots.get_mut(*i)?.take())
                    .collect();
                match step {
                    Step::One(_) => (None, taken),
                    Step::Batch(stream, _) => (Some(stream), taken),
                }
            })
            .collect();
        let mut failed_keys: std::collections::HashSet<String> = std::collections::HashSet::new();
        while let Some((batch, taken)) = todo.pop_front() {
            let held = taken
                .iter()
                .any(|r| r.key.as_ref().is_some_and(|k| failed_keys.contains(k)));
            if held || over() {
                progress.record(taken.into_iter().map(Outcome::given_back));
                continue;
            }
            progress.start(&taken);
            let outcomes = match batch {
                None => {
                    let mut one = Vec::new();
                    for row in taken {
                        let result = self.send(&row).await;
                        one.push(Outcome::of(row, result, None));
                    }
                    one
                }
                Some(stream) => match self.send_batch(&stream, taken).await {
                    Ok(outcomes) => outcomes,
                    Err(rows) => {
                        // One by one, each a step of its own: a row after
                        // a failed one of its key waits, and none starts
                        // past `until`.
                        for row in rows.into_iter().rev() {
                            todo.push_front((None, vec![row]));
                        }
                        continue;
                    }
                },
            };
            for o in &outcomes {
                match &o.result {
                    Some(Ok(_)) => crate::pipeline::fault::after_send(),
                    Some(Err(_)) => {
                        if let Some(k) = &o.row.key {
                            failed_keys.insert(k.clone());
                        }
                    }
                    None => {}
                }
            }
            progress.record(outcomes);
        }
    }

    /// Sends `rows`, publishes to `stream`, as one atomic batch; when the
    /// stream refuses the batch as a whole for a reason single publishes
    /// do not have ([`BatchSent::OneByOne`]), gives the rows back to be
    /// published one by one (`Err`). A batch that fails makes all its rows
    /// due again at the same time, so the next claim takes them together.
    async fn send_batch(
        &self,
        stream: &str,
        rows: Vec<OutboxRow>,
    ) -> Result<Vec<Outcome>, Vec<OutboxRow>> {
        let ids: Vec<String> = rows
            .iter()
            .map(|r| delivery_id(&r.consumer, &r.message_id, r.call_index))
            .collect();
        let refs: Vec<&OutboxRow> = rows.iter().collect();
        let sent = tokio::time::timeout(SEND_TIMEOUT, publish_batch(&self.client, &refs, &ids))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no acknowledgement of a batch to stream {stream} within {SEND_TIMEOUT:?}"
                ))
            });
        match sent {
            Ok(BatchSent::Stored) => Ok(rows
                .into_iter()
                .map(|row| Outcome::of(row, Ok(Sent::Sent), None))
                .collect()),
            Ok(BatchSent::OneByOne(why)) => {
                tracing::debug!(stream, reason = %why, rows = rows.len(), "stream refused an outbox batch as a whole; publishing its rows one by one");
                for row in &rows {
                    if let Target::Publish(s) = &row.target {
                        self.streams.forget(s);
                    }
                }
                Err(rows)
            }
            Err(e) => {
                let due = self.due_together(rows.iter());
                Ok(rows
                    .into_iter()
                    .map(|row| Outcome::failed(row, &e, due))
                    .collect())
            }
        }
    }

    /// When rows that failed together are due again: after the longest
    /// wait any of them has earned.
    fn due_together<'a>(&self, rows: impl Iterator<Item = &'a OutboxRow>) -> Option<i64> {
        let attempts = rows.map(|r| r.attempts).max()?;
        let wait = i64::try_from(retry_after(attempts).as_millis()).unwrap_or(i64::MAX);
        Some(now_ms().saturating_add(wait))
    }

    /// Sends `row` once.
    async fn send(&self, row: &OutboxRow) -> Result<Sent, String> {
        let id = delivery_id(&row.consumer, &row.message_id, row.call_index);
        match &row.target {
            Target::Publish(subject) => self.publish(subject, row, &id).await,
            Target::Call(endpoint) => self.call(endpoint, row, &id).await,
        }
    }

    async fn publish(&self, subject: &str, row: &OutboxRow, id: &str) -> Result<Sent, String> {
        let mut headers = async_nats::HeaderMap::new();
        for (k, v) in &row.headers {
            headers.append(k.as_str(), v.as_str());
        }
        headers.insert("Nats-Msg-Id", id);
        let send = async {
            let ack = self
                .js
                .publish_with_headers(subject.to_owned(), headers, row.payload.clone().into())
                .await
                .map_err(|e| format!("cannot publish to {subject}: {e}"))?;
            ack.await
                .map_err(|e| format!("no acknowledgement from a stream for {subject}: {e}"))
        };
        match tokio::time::timeout(SEND_TIMEOUT, send).await {
            Ok(Ok(ack)) if ack.duplicate => Ok(Sent::Duplicate),
            Ok(Ok(_)) => Ok(Sent::Sent),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no acknowledgement within {SEND_TIMEOUT:?}")),
        }
    }

    async fn call(&self, endpoint: &str, row: &OutboxRow, id: &str) -> Result<Sent, String> {
        let Some(url) = self
            .grants
            .get(&row.consumer)
            .and_then(|g| g.endpoint(endpoint))
        else {
            return Err(format!(
                "endpoint `{endpoint}` is not in handler `{}`'s config (any more)",
                row.consumer
            ));
        };
        let mut request = self
            .http
            .post(url.clone())
            .header("Idempotency-Key", id)
            .body(row.payload.clone());
        for (k, v) in &row.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let response = request
            .send()
            .await
            // Without the URL: it may carry a credential (`?token=`), and
            // the text reaches the log and `idem_outbox.last_error`.
            .map_err(|e| format!("POST {endpoint}: {}", without_url(e)))?;
        let status = response.status();
        if status.is_success() {
            Ok(Sent::Sent)
        } else {
            Err(format!("POST {endpoint}: answered {status}"))
        }
    }
}

/// `e` and its causes, one after the other, without the request's URL.
fn without_url(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_error_says_why_without_the_url() {
        let e = reqwest::Client::new()
            .post("http://127.0.0.1:1/notify?token=secret")
            .send()
            .await
            .err()
            .into_iter()
            .map(without_url)
            .next()
            .unwrap_or_default();
        assert!(!e.contains("secret") && !e.contains("127.0.0.1"), "{e}");
        assert!(e.to_lowercase().contains("connect"), "{e}");
    }
}
