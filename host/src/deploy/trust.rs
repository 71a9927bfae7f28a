//! Which deployment records a host believes (ARCHITECTURE.md, "Signed
//! deploys"): only those signed by a key of `[deploy] trusted_keys`, for
//! the handler whose key holds them, and standing where they were signed
//! to stand.
//!
//! A record signs the KV revision it replaces (the handler's last entry
//! when `idem deploy` read it). A record is believed only when the entry
//! before it in the key's history has exactly that revision (or, for 0,
//! when nothing can be missing before it), so a signed record copied to
//! another key, or put again later, is refused; and, on a host that
//! already runs a believed record, only when it replaces that record or a
//! later entry, so even a history someone pruned cannot take a host back.
//! Above the broker's revisions, which whoever may write the bucket can cut
//! or start over, stands the record's signed sequence: a host never runs a
//! record whose sequence is below its handler's high-water mark, the
//! highest any host of its database put in place ([`Mark`],
//! [`Trust::not_below`]).
//! The decisions here are pure ([`Trust::check`], [`Chain`]); the broker
//! and database reads are [`super::store::DeployStore`]'s.

use super::keys::{self, Role};
use super::record::Deployment;
use nkeys::KeyPair;
use std::collections::HashMap;
use std::sync::Mutex;

/// Why a deployment record is refused before its component is fetched.
/// Each is a value of the `reason` label of `idem_deploy_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The value is not a deployment record.
    NotARecord,
    /// The record carries no signature.
    Unsigned,
    /// Signed by a key that is not in `[deploy] trusted_keys`.
    UntrustedKey,
    /// The signature does not verify: the record was changed after it was
    /// signed.
    BadSignature,
    /// Signed for another handler.
    OtherHandler,
    /// Not where it was signed to stand: the entry before it is not the
    /// revision it replaces, or it is older than the record this host runs.
    Replayed,
    /// Believed, but its component could not be fetched or loaded.
    Component,
}

impl Refusal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NotARecord => "not_a_record",
            Refusal::Unsigned => "unsigned",
            Refusal::UntrustedKey => "untrusted_key",
            Refusal::BadSignature => "bad_signature",
            Refusal::OtherHandler => "other_handler",
            Refusal::Replayed => "replayed",
            Refusal::Component => "component",
        }
    }
}

/// A refusal and its one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Which kind.
    pub reason: Refusal,
    /// What is wrong, one line (text from the record escaped).
    pub detail: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

fn refused(reason: Refusal, detail: impl Into<String>) -> Refused {
    Refused {
        reason,
        detail: detail.into(),
    }
}

/// What stands before a record in its key's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    /// The entry before it (of any operation) has this revision.
    Revision(u64),
    /// Nothing: it is the key's first entry, and nothing can have been
    /// dropped before it (the history is not full, entries do not expire).
    Nothing,
    /// Cannot be told: the entry before it may have been dropped.
    Unknown,
}

/// The revisions of one key's history, any operation, oldest first, and
/// whether an entry can be missing before the first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// Every revision kept, oldest first.
    pub revisions: Vec<u64>,
    /// Whether nothing before the first can have been dropped.
    pub complete: bool,
}

impl Chain {
    /// What stands before `revision`.
    pub fn before(&self, revision: u64) -> Before {
        match self.revisions.iter().position(|r| *r == revision) {
            Some(0) if self.complete => Before::Nothing,
            Some(i) if i > 0 => self
                .revisions
                .get(i - 1)
                .map_or(Before::Unknown, |r| Before::Revision(*r)),
            _ => Before::Unknown,
        }
    }
}

/// A handler's deployment high-water mark, as its hosts' database keeps
/// it: the highest sequence a host put in place, and that record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// The sequence ([`Deployment::sequence`]).
    pub sequence: u64,
    /// The KV revision the record stood at.
    pub revision: u64,
    /// The record (signature included), or why the stored text is not one.
    pub record: Result<Deployment, String>,
}

impl Mark {
    fn signature(&self) -> Option<&str> {
        self.record.as_ref().ok().map(|d| d.signature.as_str())
    }
}

/// The trusted deploy keys, and per handler what this host believed last.
#[derive(Debug, Default)]
pub struct Trust {
    keys: Vec<KeyPair>,
    state: Mutex<HashMap<String, Seen>>,
}

/// What a host last decided for one handler.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// The revision of the record whose component runs (0: none).
    running: u64,
    /// That record's sequence (0: none, or a record from before sequences).
    running_sequence: u64,
    /// The last revision checked and what came of it.
    checked: Option<(u64, Result<Deployment, Refused>)>,
    /// The highest sequence this host raised the mark to (or found it at).
    marked: u64,
}

impl Trust {
    /// Trusts the deploy keys `public_keys` (`M…`).
    ///
    /// # Errors
    /// One line naming the first key that is not a deploy key's public key.
    pub fn new(public_keys: &[String]) -> Result<Self, String> {
        let keys = public_keys
            .iter()
            .map(|k| keys::public_key(k, Role::Deploy))
            .collect::<Result<_, _>>()?;
        Ok(Trust {
            keys,
            state: Mutex::default(),
        })
    }

    /// Whether no key is trusted (the host then follows no deployments).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The trusted deploy key whose public key is `public` (`M…`), if any.
    pub fn key(&self, public: &str) -> Option<&KeyPair> {
        self.keys.iter().find(|k| k.public_key() == public)
    }

    /// Whether `value`, at `revision` under key `handler` with `before`
    /// standing before it, is a record to believe: parsed, signed by a
    /// trusted key, for `handler`, replacing what stands before it.
    ///
    /// # Errors
    /// The first check that fails, as a [`Refused`].
    pub fn check(
        &self,
        handler: &str,
        parsed: &Result<Deployment, String>,
        before: Before,
    ) -> Result<Deployment, Refused> {
        let d = self.check_signed(handler, parsed)?;
        let stands = match before {
            Before::Revision(r) => r == d.replaces,
            Before::Nothing => d.replaces == 0,
            Before::Unknown => false,
        };
        if !stands {
            let was = match before {
                Before::Revision(r) => format!("revision {r}"),
                Before::Nothing => "nothing".to_owned(),
                Before::Unknown => "not known (the history was cut)".to_owned(),
            };
            return Err(refused(
                Refusal::Replayed,
                format!(
                    "the deployment record was signed to replace revision {}, but what stands before it is {was}: a copy put again",
                    d.replaces
                ),
            ));
        }
        Ok(d)
    }

    /// [`Trust::check`] but where the record stands: parsed, signed by a
    /// trusted key, for `handler` (for a record read from elsewhere than
    /// the bucket's history, such as a [`Mark`]'s).
    ///
    /// # Errors
    /// The first check that fails, as a [`Refused`].
    pub fn check_signed(
        &self,
        handler: &str,
        parsed: &Result<Deployment, String>,
    ) -> Result<Deployment, Refused> {
        let d = parsed
            .as_ref()
            .map_err(|e| refused(Refusal::NotARecord, format!("deployment record: {e}")))?;
        if d.signature.is_empty() || d.signer.is_empty() {
            return Err(refused(
                Refusal::Unsigned,
                "the deployment record is not signed (only `idem deploy --key` with a key of [deploy] trusted_keys writes records hosts run)",
            ));
        }
        let Some(key) = self.keys.iter().find(|k| k.public_key() == d.signer) else {
            return Err(refused(
                Refusal::UntrustedKey,
                format!(
                    "the deployment record is signed by {}, which is not in [deploy] trusted_keys",
                    super::record::bounded(&d.signer)
                ),
            ));
        };
        if !keys::verifies(key, &d.signed_bytes(), &d.signature) {
            return Err(refused(
                Refusal::BadSignature,
                format!(
                    "the deployment record's signature by {} does not verify: it was changed after it was signed",
                    d.signer
                ),
            ));
        }
        if d.handler != handler {
            return Err(refused(
                Refusal::OtherHandler,
                format!(
                    "the deployment record was signed for handler `{}`, not `{handler}`",
                    super::record::bounded(&d.handler)
                ),
            ));
        }
        Ok(d.clone())
    }

    /// Whether `d` (believed) stands at or above `mark`, the handler's
    /// high-water mark: a higher sequence, or the very record the mark
    /// holds. Without a mark every record does; with one, a record without
    /// a sequence never does.
    ///
    /// # Errors
    /// [`Refusal::Replayed`].
    pub fn not_below(d: &Deployment, mark: Option<&Mark>) -> Result<(), Refused> {
        let Some(mark) = mark else { return Ok(()) };
        if d.sequence > mark.sequence
            || (d.sequence == mark.sequence && mark.signature() == Some(d.signature.as_str()))
        {
            return Ok(());
        }
        if let (true, Err(why)) = (d.sequence == mark.sequence, &mark.record) {
            return Err(refused(
                Refusal::Replayed,
                format!(
                    "the database's high-water mark at sequence {} holds a record that does not parse ({}), so a record of the same sequence cannot be matched to it; deploy again (`idem deploy`) to go above it",
                    mark.sequence,
                    super::record::escaped(why, 200)
                ),
            ));
        }
        Err(refused(
            Refusal::Replayed,
            format!(
                "the deployment record's sequence {} is not above {}, the highest this handler's hosts ran (the database's high-water mark): an older record put again",
                d.sequence, mark.sequence
            ),
        ))
    }

    /// Whether this host raised (or found) `handler`'s mark at `sequence`
    /// or higher already.
    pub fn marked(&self, handler: &str, sequence: u64) -> bool {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.get(handler).map(|s| s.marked >= sequence))
            .unwrap_or(false)
    }

    /// Notes that `handler`'s mark is at `sequence` or higher.
    pub fn mark_at(&self, handler: &str, sequence: u64) {
        if let Ok(mut state) = self.state.lock() {
            let seen = state.entry(handler.to_owned()).or_default();
            seen.marked = seen.marked.max(sequence);
        }
    }

    /// What was decided for `handler` at `revision`, if that is the
    /// revision checked last.
    pub fn remembered(&self, handler: &str, revision: u64) -> Option<Result<Deployment, Refused>> {
        let state = self.state.lock().ok()?;
        match &state.get(handler)?.checked {
            Some((r, result)) if *r == revision => Some(result.clone()),
            _ => None,
        }
    }

    /// Remembers what was decided for `handler` at `revision`.
    pub fn remember(&self, handler: &str, revision: u64, result: &Result<Deployment, Refused>) {
        if let Ok(mut state) = self.state.lock() {
            state.entry(handler.to_owned()).or_default().checked = Some((revision, result.clone()));
        }
    }

    /// `handler`'s record at `revision` (replacing `replaces`, with
    /// `sequence`) against the record this host runs. Between records with
    /// sequences the sequence decides: a lower one, or the same one at
    /// another revision, is refused, whatever the revisions (they start over
    /// when the bucket is made again). A record with a sequence is newer than
    /// one from before sequences. Otherwise revisions decide: a record older
    /// than the running one, or one that replaces an entry older than it,
    /// is refused.
    ///
    /// # Errors
    /// [`Refusal::Replayed`].
    pub fn not_behind(
        &self,
        handler: &str,
        revision: u64,
        replaces: u64,
        sequence: u64,
    ) -> Result<(), Refused> {
        let (running, running_sequence) = self.running(handler);
        if sequence > 0 && running_sequence > 0 {
            if sequence > running_sequence || (sequence == running_sequence && revision == running)
            {
                return Ok(());
            }
            return Err(refused(
                Refusal::Replayed,
                format!(
                    "the deployment record's sequence {sequence} is not above {running_sequence}, which this host runs: an older record put again"
                ),
            ));
        }
        if sequence > 0 && running_sequence == 0 {
            return Ok(());
        }
        if revision == running || (revision > running && replaces >= running) {
            return Ok(());
        }
        Err(refused(
            Refusal::Replayed,
            format!(
                "the deployment record at revision {revision} (replacing {replaces}) is older than revision {running}, which this host runs: a copy put again"
            ),
        ))
    }

    /// Notes that `handler` runs the record at `revision`, of `sequence`.
    pub fn running_now(&self, handler: &str, revision: u64, sequence: u64) {
        if let Ok(mut state) = self.state.lock() {
            let seen = state.entry(handler.to_owned()).or_default();
            seen.running = revision;
            seen.running_sequence = sequence;
        }
    }

    fn running(&self, handler: &str) -> (u64, u64) {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.get(handler).map(|s| (s.running, s.running_sequence)))
            .unwrap_or((0, 0))
    }
}

/// Signs `d` for `handler` with `key`: sets its handler, signer and
/// signature (its `replaces` must be set already).
///
/// # Errors
/// The key has no seed.
pub fn sign(key: &KeyPair, handler: &str, d: &mut Deployment) -> Result<(), String> {
    d.handler = handler.to_owned();
    d.signer = key.public_key();
    d.signature = String::new();
    d.signature = keys::sign(key, &d.signed_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn record(replaces: u64) -> Deployment {
        Deployment {
            digest: "a".repeat(64),
            previous: Some("b".repeat(64)),
            deployed_at: "2026-12-01T11:30:00Z".into(),
            note: "n".into(),
            size: 7,
            by: "ana@b".into(),
            handler: String::new(),
            replaces,
            sequence: 0,
            signer: String::new(),
            signature: String::new(),
        }
    }

    fn signed(key: &KeyPair, handler: &str, replaces: u64) -> Deployment {
        let mut d = record(replaces);
        sign(key, handler, &mut d).unwrap();
        d
    }

    fn reason(r: Result<Deployment, Refused>) -> Refusal {
        r.unwrap_err().reason
    }

    #[test]
    fn only_a_trusted_signature_for_this_handler_in_its_place_is_believed() {
        let (k1, k2, stranger) = (
            KeyPair::new_module(),
            KeyPair::new_module(),
            KeyPair::new_module(),
        );
        let trust = Trust::new(&[k1.public_key(), k2.public_key()]).unwrap();
        let at = Before::Revision(4);
        // Either key of a rotation.
        for k in [&k1, &k2] {
            let d = signed(k, "h", 4);
            assert_eq!(trust.check("h", &Ok(d.clone()), at).unwrap(), d);
        }
        assert_eq!(
            reason(trust.check("h", &Err("x".into()), at)),
            Refusal::NotARecord
        );
        assert_eq!(
            reason(trust.check("h", &Ok(record(4)), at)),
            Refusal::Unsigned
        );
        assert_eq!(
            reason(trust.check("h", &Ok(signed(&stranger, "h", 4)), at)),
            Refusal::UntrustedKey
        );
        let mut edited = signed(&k1, "h", 4);
        edited.previous = Some("c".repeat(64));
        assert_eq!(
            reason(trust.check("h", &Ok(edited), at)),
            Refusal::BadSignature
        );
        let mut moved = signed(&k1, "g", 4);
        assert_eq!(
            reason(trust.check("h", &Ok(moved.clone()), at)),
            Refusal::OtherHandler
        );
        // Relabelled for this handler: the signature no longer verifies.
        moved.handler = "h".into();
        assert_eq!(
            reason(trust.check("h", &Ok(moved), at)),
            Refusal::BadSignature
        );
        // Put again where something else stands before it.
        assert_eq!(
            reason(trust.check("h", &Ok(signed(&k1, "h", 3)), at)),
            Refusal::Replayed
        );
        assert_eq!(
            reason(trust.check("h", &Ok(signed(&k1, "h", 0)), Before::Unknown)),
            Refusal::Replayed
        );
        assert!(
            trust
                .check("h", &Ok(signed(&k1, "h", 0)), Before::Nothing)
                .is_ok()
        );
        assert_eq!(
            reason(trust.check("h", &Ok(signed(&k1, "h", 2)), Before::Nothing)),
            Refusal::Replayed
        );
        // No keys: nothing is believed.
        let none = Trust::new(&[]).unwrap();
        assert!(none.is_empty());
        assert_eq!(
            reason(none.check("h", &Ok(signed(&k1, "h", 4)), at)),
            Refusal::UntrustedKey
        );
    }

    #[test]
    fn what_stands_before_a_revision() {
        let chain = Chain {
            revisions: vec![3, 7, 9],
            complete: true,
        };
        assert_eq!(chain.before(3), Before::Nothing);
        assert_eq!(chain.before(7), Before::Revision(3));
        assert_eq!(chain.before(9), Before::Revision(7));
        assert_eq!(chain.before(8), Before::Unknown);
        let cut = Chain {
            complete: false,
            ..chain
        };
        assert_eq!(cut.before(3), Before::Unknown);
        assert_eq!(cut.before(7), Before::Revision(3));
    }

    #[test]
    fn a_host_never_goes_back_behind_what_it_runs() {
        let trust = Trust::new(&[]).unwrap();
        assert!(trust.not_behind("h", 5, 0, 0).is_ok());
        trust.running_now("h", 5, 0);
        assert!(trust.not_behind("h", 5, 3, 0).is_ok());
        assert!(trust.not_behind("h", 8, 5, 0).is_ok());
        assert!(trust.not_behind("h", 8, 6, 0).is_ok());
        assert_eq!(
            trust.not_behind("h", 8, 4, 0).unwrap_err().reason,
            Refusal::Replayed
        );
        assert_eq!(
            trust.not_behind("h", 4, 0, 0).unwrap_err().reason,
            Refusal::Replayed
        );
        // A record with a sequence is newer than one without.
        assert!(trust.not_behind("h", 1, 0, 700).is_ok());
        // Between sequenced records the sequence decides, whatever the
        // revisions: the bucket made again starts them over.
        trust.running_now("h", 9, 700);
        assert!(trust.not_behind("h", 1, 0, 701).is_ok());
        assert!(
            trust.not_behind("h", 9, 3, 700).is_ok(),
            "the record that runs"
        );
        for (revision, sequence) in [(1, 700), (10, 699), (2, 0)] {
            assert_eq!(
                trust
                    .not_behind("h", revision, 0, sequence)
                    .unwrap_err()
                    .reason,
                Refusal::Replayed,
                "revision {revision}, sequence {sequence}"
            );
        }
        // Per handler.
        assert!(trust.not_behind("g", 2, 0, 0).is_ok());
        let ok = Ok(record(1));
        trust.remember("h", 8, &ok);
        assert_eq!(trust.remembered("h", 8), Some(ok));
        assert_eq!(trust.remembered("h", 9), None);
        assert_eq!(trust.remembered("g", 8), None);
    }

    fn sequenced(key: &KeyPair, sequence: u64) -> Deployment {
        let mut d = Deployment {
            sequence,
            ..record(4)
        };
        sign(key, "h", &mut d).unwrap();
        d
    }

    fn mark_of(d: &Deployment) -> Mark {
        Mark {
            sequence: d.sequence,
            revision: 9,
            record: Ok(d.clone()),
        }
    }

    #[test]
    fn nothing_below_the_high_water_mark_is_believed() {
        let k = KeyPair::new_module();
        let (old, at, new) = (sequenced(&k, 10), sequenced(&k, 20), sequenced(&k, 30));
        let mark = mark_of(&at);
        // No mark: any sequence, and a record from before sequences.
        assert!(Trust::not_below(&old, None).is_ok());
        assert!(Trust::not_below(&record(4), None).is_ok());
        // The mark's own record, and anything above it.
        assert!(Trust::not_below(&at, Some(&mark)).is_ok());
        assert!(Trust::not_below(&new, Some(&mark)).is_ok());
        // Below it, at it with another signature, or without a sequence.
        for d in [&old, &sequenced(&KeyPair::new_module(), 20), &record(4)] {
            let e = Trust::not_below(d, Some(&mark)).unwrap_err();
            assert_eq!(e.reason, Refusal::Replayed, "{d:?}");
        }
        assert_eq!(
            Trust::not_below(&old, Some(&mark)).unwrap_err().detail,
            "the deployment record's sequence 10 is not above 20, the highest this handler's hosts ran (the database's high-water mark): an older record put again"
        );
        // A mark whose stored record is not one still bounds the sequence.
        let broken = Mark {
            record: Err("x".into()),
            ..mark.clone()
        };
        assert!(Trust::not_below(&at, Some(&broken)).is_err());
        assert!(Trust::not_below(&new, Some(&broken)).is_ok());
        // The signature check alone, without a place in a history.
        let trust = Trust::new(&[k.public_key()]).unwrap();
        assert_eq!(trust.check_signed("h", &Ok(at.clone())).unwrap(), at);
        assert_eq!(
            trust.check_signed("g", &Ok(at.clone())).unwrap_err().reason,
            Refusal::OtherHandler
        );
        // What this host raised the mark to.
        assert!(!trust.marked("h", 20));
        trust.mark_at("h", 20);
        trust.mark_at("h", 10);
        assert!(trust.marked("h", 20));
        assert!(!trust.marked("h", 21));
        assert!(!trust.marked("g", 1));
    }
}
