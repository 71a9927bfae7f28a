//! Which stream stores a subject the relay publishes to, and whether it
//! takes atomic batches: asked of JetStream (`STREAM.NAMES` with a subject
//! filter, then `STREAM.INFO`) and remembered for [`REMEMBER`], so a
//! stream created or changed later is seen within that time. Only asked
//! for deliveries with two or more publishes (one publish is never a
//! batch).

use super::batch::StreamFacts;
use async_nats::jetstream;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an answer is used.
pub const REMEMBER: Duration = Duration::from_secs(10);
/// Subjects remembered at most; past it the memory starts again (guests
/// choose subjects, within their grants).
pub const MAX_SUBJECTS: usize = 4096;

/// The relay's memory of subjects' streams.
#[derive(Default)]
pub struct StreamFactsCache {
    known: Mutex<HashMap<String, (Instant, StreamFacts)>>,
}

impl StreamFactsCache {
    /// The stream that stores `subject`, or `None` when none does (its
    /// rows are published one by one and fail until one does).
    ///
    /// # Errors
    /// JetStream did not answer within [`super::relay::SEND_TIMEOUT`], or
    /// refused the question: the delivery waits, as a batch cannot be
    /// told from single publishes.
    pub async fn facts(
        &self,
        js: &jetstream::Context,
        subject: &str,
    ) -> Result<Option<StreamFacts>, String> {
        if let Ok(known) = self.known.lock()
            && let Some((at, facts)) = known.get(subject)
            && at.elapsed() < REMEMBER
        {
            return Ok(Some(facts.clone()));
        }
        let facts = ask(js, subject).await?;
        // Only an answer is remembered: a subject no stream stores (its
        // publishes fail and are tried again) is asked again next time.
        if let Some(f) = &facts
            && let Ok(mut known) = self.known.lock()
        {
            if known.len() >= MAX_SUBJECTS {
                known.clear();
            }
            known.insert(subject.to_owned(), (Instant::now(), f.clone()));
        }
        Ok(facts)
    }

    /// Forgets what is known of `subject` (its stream refused a batch).
    pub fn forget(&self, subject: &str) {
        if let Ok(mut known) = self.known.lock() {
            known.remove(subject);
        }
    }
}

async fn ask(js: &jetstream::Context, subject: &str) -> Result<Option<StreamFacts>, String> {
    use jetstream::context::GetStreamByNameErrorKind as Kind;
    let bound = super::relay::SEND_TIMEOUT;
    let lookup = async {
        let name = match js.stream_by_subject(subject).await {
            Ok(name) => name,
            Err(e) if matches!(e.kind(), Kind::NotFound | Kind::InvalidSubject) => {
                return Ok(None);
            }
            Err(e) => {
                return Err(format!(
                    "cannot ask JetStream which stream stores {subject}: {e}"
                ));
            }
        };
        let stream = js
            .get_stream(&name)
            .await
            .map_err(|e| format!("cannot read stream {name}: {e}"))?;
        let atomic = stream.cached_info().config.allow_atomic_publish;
        Ok(Some(StreamFacts { name, atomic }))
    };
    tokio::time::timeout(bound, lookup)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "JetStream did not say within {bound:?} which stream stores {subject}"
            ))
        })
}
