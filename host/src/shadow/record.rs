//! A shadow deployment as the shadows bucket records it: the value of the
//! handler's key, JSON, signed by a deploy key like a deployment
//! ([`crate::deploy::trust`]), under a signing context of its own, so
//! neither signature can be passed off as the other.
//!
//! ```json
//! {"handler":"credit","digest":"9f2c…","size":151220,"against":"41aa…",
//!  "sample_ppm":250000,"deployed_at":"2026-12-06T15:30:00Z","by":"ana@build-3",
//!  "signer":"MB…","signature":"9a0c…"}
//! ```
//!
//! `against` is the digest that was live when the shadow was deployed: a
//! host runs the candidate only next to that version, so a record put
//! back after the live version changed (or copied from another time) runs
//! nothing.

use crate::deploy::keys;
use crate::deploy::record::{MAX_BY_BYTES, MAX_RECORD_BYTES, bounded, is_digest};
use crate::deploy::trust::Trust;
use serde::{Deserialize, Serialize};

/// What a shadow record's signature is made over, first.
const SIGNED_CONTEXT: &str = "idem-shadow/1";

/// One million: `sample_ppm` of a shadow that runs for every message.
pub const ALL_PPM: u32 = 1_000_000;

/// One shadow deployment of a handler.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowRecord {
    /// The handler it was signed for (its key in the bucket).
    pub handler: String,
    /// Hex SHA-256 of the candidate component: its object's name in the
    /// modules bucket.
    pub digest: String,
    /// The candidate's size in bytes.
    pub size: u64,
    /// The digest that was live when the shadow was deployed; the candidate
    /// runs only next to it.
    pub against: String,
    /// The share of messages the candidate also runs for, in parts per
    /// million (1 to [`ALL_PPM`]); which messages is decided by their id
    /// ([`super::sampled`]), the same on every host.
    pub sample_ppm: u32,
    /// When it was deployed, RFC 3339 UTC (the deploying machine's clock).
    pub deployed_at: String,
    /// Who deployed it: `user@host`, at most [`MAX_BY_BYTES`].
    #[serde(default)]
    pub by: String,
    /// The public key of the deploy key that signed it (`M…`).
    #[serde(default)]
    pub signer: String,
    /// Hex ed25519 signature of [`ShadowRecord::signed_bytes`] by `signer`.
    #[serde(default)]
    pub signature: String,
}

impl ShadowRecord {
    /// Reads a record from a KV value.
    ///
    /// # Errors
    /// One line: over [`MAX_RECORD_BYTES`], not this JSON, a digest that is
    /// not 64 lowercase hex digits, a sample outside 1..=[`ALL_PPM`], or a
    /// `by` over [`MAX_BY_BYTES`].
    pub fn parse(value: &[u8]) -> Result<Self, String> {
        if value.len() > MAX_RECORD_BYTES {
            return Err(format!(
                "not a shadow record ({} bytes, over {MAX_RECORD_BYTES})",
                value.len()
            ));
        }
        let r: ShadowRecord = serde_json::from_slice(value)
            .map_err(|e| format!("not a shadow record ({})", bounded(&e.to_string())))?;
        for digest in [&r.digest, &r.against] {
            if !is_digest(digest) {
                return Err(format!(
                    "shadow record: digest `{}` is not 64 lowercase hex digits",
                    bounded(digest)
                ));
            }
        }
        if r.sample_ppm == 0 || r.sample_ppm > ALL_PPM {
            return Err(format!(
                "shadow record: sample {} ppm is not between 1 and {ALL_PPM}",
                r.sample_ppm
            ));
        }
        if r.by.len() > MAX_BY_BYTES {
            return Err(format!("shadow record: by is over {MAX_BY_BYTES} bytes"));
        }
        Ok(r)
    }

    /// The JSON value stored for it.
    pub fn to_value(&self) -> Vec<u8> {
        // A struct of strings and numbers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// What the signature covers: every field but the signature, in a fixed
    /// order (a JSON array), after the context `idem-shadow/1`.
    pub fn signed_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&(
            SIGNED_CONTEXT,
            &self.handler,
            &self.digest,
            self.size,
            &self.against,
            self.sample_ppm,
            &self.deployed_at,
            &self.by,
            &self.signer,
        ))
        .unwrap_or_default()
    }

    /// Signs the record for `handler` with `key` (a deploy key): sets its
    /// handler, signer and signature.
    ///
    /// # Errors
    /// The key has no seed.
    pub fn sign(&mut self, key: &nkeys::KeyPair, handler: &str) -> Result<(), String> {
        self.handler = handler.to_owned();
        self.signer = key.public_key();
        self.signature = String::new();
        self.signature = keys::sign(key, &self.signed_bytes())?;
        Ok(())
    }

    /// Whether the record, read under key `handler`, is one to run: signed
    /// by a key `trust` holds, unchanged since, for `handler`.
    ///
    /// # Errors
    /// One line saying which check failed.
    pub fn believed(&self, handler: &str, trust: &Trust) -> Result<(), String> {
        if self.signature.is_empty() || self.signer.is_empty() {
            return Err(
                "the shadow record is not signed (only `idem deploy --shadow --key` with a key of [deploy] trusted_keys writes records hosts run)".into(),
            );
        }
        let Some(key) = trust.key(&self.signer) else {
            return Err(format!(
                "the shadow record is signed by {}, which is not in [deploy] trusted_keys",
                bounded(&self.signer)
            ));
        };
        if !keys::verifies(key, &self.signed_bytes(), &self.signature) {
            return Err(format!(
                "the shadow record's signature by {} does not verify: it was changed after it was signed",
                bounded(&self.signer)
            ));
        }
        if self.handler != handler {
            return Err(format!(
                "the shadow record was signed for handler `{}`, not `{handler}`",
                bounded(&self.handler)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn record() -> ShadowRecord {
        ShadowRecord {
            handler: String::new(),
            digest: "a".repeat(64),
            size: 10,
            against: "b".repeat(64),
            sample_ppm: ALL_PPM,
            deployed_at: "2026-12-06T00:00:00Z".into(),
            by: "ops@build".into(),
            signer: String::new(),
            signature: String::new(),
        }
    }

    #[test]
    fn only_a_record_signed_by_a_trusted_key_for_its_handler_is_believed() {
        let key = nkeys::KeyPair::new_module();
        let trust = Trust::new(&[key.public_key()]).unwrap();
        let unsigned = record();
        assert!(
            unsigned
                .believed("h", &trust)
                .unwrap_err()
                .contains("not signed")
        );
        let mut r = record();
        r.sign(&key, "h").unwrap();
        let r = ShadowRecord::parse(&r.to_value()).unwrap();
        assert_eq!(r.believed("h", &trust), Ok(()));
        assert_eq!(
            r.believed("g", &trust).unwrap_err(),
            "the shadow record was signed for handler `h`, not `g`"
        );
        let mut edited = r.clone();
        edited.sample_ppm = 1;
        assert!(
            edited
                .believed("h", &trust)
                .unwrap_err()
                .contains("does not verify")
        );
        let mut edited = r.clone();
        edited.against = "c".repeat(64);
        assert!(
            edited
                .believed("h", &trust)
                .unwrap_err()
                .contains("does not verify")
        );
        let stranger = Trust::new(&[nkeys::KeyPair::new_module().public_key()]).unwrap();
        assert!(
            r.believed("h", &stranger)
                .unwrap_err()
                .contains("not in [deploy] trusted_keys")
        );
    }

    #[test]
    fn a_deployment_signature_does_not_verify_as_a_shadow_record() {
        let key = nkeys::KeyPair::new_module();
        let trust = Trust::new(&[key.public_key()]).unwrap();
        let mut d = crate::deploy::Deployment {
            digest: "a".repeat(64),
            deployed_at: "2026-12-06T00:00:00Z".into(),
            size: 10,
            ..Default::default()
        };
        crate::deploy::trust::sign(&key, "h", &mut d).unwrap();
        let mut r = record();
        r.handler = "h".into();
        r.signer = d.signer.clone();
        r.signature = d.signature.clone();
        assert!(
            r.believed("h", &trust)
                .unwrap_err()
                .contains("does not verify")
        );
    }

    #[test]
    fn bad_values_are_refused_in_one_line() {
        assert!(
            ShadowRecord::parse(b"{}")
                .unwrap_err()
                .starts_with("not a shadow record")
        );
        let mut r = record();
        r.sample_ppm = 0;
        assert_eq!(
            ShadowRecord::parse(&r.to_value()).unwrap_err(),
            "shadow record: sample 0 ppm is not between 1 and 1000000"
        );
        let mut r = record();
        r.against = "X".repeat(64);
        assert!(
            ShadowRecord::parse(&r.to_value())
                .unwrap_err()
                .contains("is not 64 lowercase")
        );
        assert!(ShadowRecord::parse(&vec![b' '; MAX_RECORD_BYTES + 1]).is_err());
    }
}
