//! What the relay has claimed and not recorded yet (`super::relay`): each
//! row's outcome, the rows whose send began, the deliveries a pass left in
//! flight; and a claim's rows grouped into deliveries.

use super::relay::{SendResult, now_ms};
use crate::store::OutboxRow;
use futures::stream::FuturesUnordered;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What became of one claimed row in a pass.
pub(super) struct Outcome {
    pub(super) row: OutboxRow,
    /// `None`: not started, given back.
    pub(super) result: Option<SendResult>,
    /// When the send ended (Unix ms).
    pub(super) at: i64,
    /// When it is due again if it failed, where that is not its own
    /// [`retry_after`].
    pub(super) due: Option<i64>,
}

impl Outcome {
    pub(super) fn of(row: OutboxRow, result: SendResult, due: Option<i64>) -> Self {
        Self {
            row,
            result: Some(result),
            at: now_ms(),
            due,
        }
    }
    pub(super) fn failed(row: OutboxRow, e: &str, due: Option<i64>) -> Self {
        Self::of(row, Err(e.to_owned()), due)
    }
    pub(super) fn given_back(row: OutboxRow) -> Self {
        Self {
            row,
            result: None,
            at: now_ms(),
            due: None,
        }
    }
    /// Given back unsent, due at `due` (at once when `None`).
    pub(super) fn given_back_until(row: OutboxRow, due: Option<i64>) -> Self {
        Self {
            due,
            ..Self::given_back(row)
        }
    }
}

/// The record deliveries in flight write to: the outcomes not recorded
/// yet and the rows whose send began (a stop keeps the lease of those in
/// flight).
#[derive(Default)]
pub(super) struct Progress {
    outcomes: std::sync::Mutex<Vec<Outcome>>,
    started: std::sync::Mutex<std::collections::HashSet<i64>>,
}

impl Progress {
    pub(super) fn start(&self, rows: &[OutboxRow]) {
        if let Ok(mut s) = self.started.lock() {
            s.extend(rows.iter().map(|r| r.id));
        }
    }
    pub(super) fn record(&self, outcomes: impl IntoIterator<Item = Outcome>) {
        if let Ok(mut o) = self.outcomes.lock() {
            o.extend(outcomes);
        }
    }
    /// The outcomes so far, taken (their rows no longer count as
    /// started), and the rows started and not ended.
    pub(super) fn drain(&self) -> (Vec<Outcome>, std::collections::HashSet<i64>) {
        let outcomes = self
            .outcomes
            .lock()
            .map(|mut o| std::mem::take(&mut *o))
            .unwrap_or_default();
        let started = match self.started.lock() {
            Ok(mut s) => {
                for o in &outcomes {
                    s.remove(&o.row.id);
                }
                s.clone()
            }
            Err(_) => std::collections::HashSet::new(),
        };
        (outcomes, started)
    }
}

/// Deliveries being sent, each recording into a [`Progress`].
pub(super) type Running<'a> =
    FuturesUnordered<std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>>;

/// What a relay has claimed and not recorded yet, across passes: the
/// deliveries a pass left in flight ([`SLOW_SEND`]) and the record they
/// all write to.
#[derive(Default)]
pub struct Flight<'a> {
    pub(super) progress: Arc<Progress>,
    /// Rows claimed and not recorded, with their lease.
    pub(super) claimed: HashMap<i64, i64>,
    /// Deliveries a pass left in flight.
    pub(super) slow: Running<'a>,
}

/// Until `stop` (never without one).
pub(super) async fn cancelled(stop: Option<&CancellationToken>) {
    match stop {
        Some(stop) => stop.cancelled().await,
        None => std::future::pending().await,
    }
}

/// `rows` as deliveries (the rows of one handler's message), each in
/// call order, the deliveries in the order of their first row.
pub(super) fn deliveries(mut rows: Vec<OutboxRow>) -> Vec<Vec<OutboxRow>> {
    rows.sort_by_key(|r| r.id);
    let mut out: Vec<Vec<OutboxRow>> = Vec::new();
    let mut at: HashMap<(String, String), usize> = HashMap::new();
    for row in rows {
        let key = (row.consumer.clone(), row.message_id.clone());
        match at.get(&key) {
            Some(&i) => {
                if let Some(d) = out.get_mut(i) {
                    d.push(row);
                }
            }
            None => {
                at.insert(key, out.len());
                out.push(vec![row]);
            }
        }
    }
    for d in &mut out {
        d.sort_by_key(|r| r.call_index);
    }
    out
}
