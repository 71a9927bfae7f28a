//! A deployment as the deployments bucket records it: the value of the
//! handler's key, JSON, signed by a deploy key ([`super::trust`]).
//!
//! ```json
//! {"digest":"9f2c…","previous":"41aa…","deployed_at":"2026-12-01T11:30:00Z",
//!  "note":"fix rounding","size":151220,"by":"ana@build-3",
//!  "handler":"credit-projector","replaces":41,"sequence":1764588600000,
//!  "signer":"MB…","signature":"9a0c…"}
//! ```

use serde::{Deserialize, Serialize};

/// The largest deployment record a host reads (bytes of JSON).
pub const MAX_RECORD_BYTES: usize = 16 * 1024;
/// The longest `note` a record may carry (bytes).
pub const MAX_NOTE_BYTES: usize = 1024;
/// The longest `by` a record may carry (bytes).
pub const MAX_BY_BYTES: usize = 256;
/// What a deployment's signature is made over, first: a signature made for
/// anything else (a host's report, say) never reads as a deployment's.
/// A record without a sequence (written before sequences) is signed
/// under the first context, one with a sequence under the second.
const SIGNED_CONTEXT: &str = "idem-deployment/1";
/// [`SIGNED_CONTEXT`] for a record that carries a sequence.
const SIGNED_CONTEXT_SEQUENCED: &str = "idem-deployment/2";

/// One deployment of a handler.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    /// Hex SHA-256 of the component's bytes: also its object's name in the
    /// modules bucket.
    pub digest: String,
    /// The digest deployed before this one (what `--rollback` returns to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// When it was deployed, RFC 3339 UTC (the deploying machine's clock).
    pub deployed_at: String,
    /// Free text from `--note`, at most [`MAX_NOTE_BYTES`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// The component's size in bytes.
    pub size: u64,
    /// Who deployed it: `user@host` of the deploying command, at most
    /// [`MAX_BY_BYTES`].
    #[serde(default)]
    pub by: String,
    /// The handler it was signed for (the key it belongs under).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub handler: String,
    /// The KV revision of the handler's key this record replaces (its last
    /// entry when `idem deploy` read it, of any operation; 0: the key had
    /// none). `idem deploy` records with a compare-and-set on it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replaces: u64,
    /// The handler's deployment sequence: larger than that of every
    /// deployment of the handler before it, whatever the broker keeps
    /// (`idem deploy` takes the larger of the last signed sequence + 1 and
    /// its clock in Unix milliseconds). Hosts keep the highest they ran in
    /// their database and never run a lower one (ARCHITECTURE.md, "Signed
    /// deploys"). 0: a record from before sequences.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sequence: u64,
    /// The public key of the deploy key that signed it (`M…`), empty when
    /// unsigned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signer: String,
    /// Hex ed25519 signature of [`Deployment::signed_bytes`] by `signer`,
    /// empty when unsigned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub signature: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Deployment {
    /// Reads a deployment from a KV value.
    ///
    /// # Errors
    /// One line: the value is over [`MAX_RECORD_BYTES`], not this JSON, its
    /// digest (or previous) is not 64 lowercase hex digits (as anything but
    /// `idem deploy` might write), its sequence is over `i64::MAX` (what a
    /// database column holds), or its note or `by` is too long.
    pub fn parse(value: &[u8]) -> Result<Self, String> {
        if value.len() > MAX_RECORD_BYTES {
            return Err(format!(
                "not a deployment record ({} bytes, over {MAX_RECORD_BYTES})",
                value.len()
            ));
        }
        let d: Deployment = serde_json::from_slice(value)
            .map_err(|e| format!("not a deployment record ({})", bounded(&e.to_string())))?;
        for digest in std::iter::once(&d.digest).chain(&d.previous) {
            if !is_digest(digest) {
                return Err(format!(
                    "digest `{}` is not 64 lowercase hex digits",
                    bounded(digest)
                ));
            }
        }
        if i64::try_from(d.sequence).is_err() {
            return Err(format!(
                "not a deployment record (sequence {} over {})",
                d.sequence,
                i64::MAX
            ));
        }
        if d.note.len() > MAX_NOTE_BYTES || d.by.len() > MAX_BY_BYTES {
            return Err(format!(
                "not a deployment record (note over {MAX_NOTE_BYTES} or by over {MAX_BY_BYTES} bytes)"
            ));
        }
        Ok(d)
    }

    /// The JSON value stored for it.
    pub fn to_value(&self) -> Vec<u8> {
        // A struct of strings and numbers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// What the signature is made over: every field but the signature, with
    /// the handler, in a fixed order (a JSON array), after a context string
    /// of its own (one for records with a sequence, one for those without).
    pub fn signed_bytes(&self) -> Vec<u8> {
        if self.sequence != 0 {
            return serde_json::to_vec(&(
                SIGNED_CONTEXT_SEQUENCED,
                &self.handler,
                &self.digest,
                self.size,
                self.replaces,
                self.sequence,
                &self.previous,
                &self.deployed_at,
                &self.note,
                &self.by,
                &self.signer,
            ))
            .unwrap_or_default();
        }
        serde_json::to_vec(&(
            SIGNED_CONTEXT,
            &self.handler,
            &self.digest,
            self.size,
            self.replaces,
            &self.previous,
            &self.deployed_at,
            &self.note,
            &self.by,
            &self.signer,
        ))
        .unwrap_or_default()
    }
}

/// Whether `s` is a hex SHA-256 as idem writes it.
pub fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `s` escaped and cut to 80 characters, for a message about text from
/// outside the config.
pub fn bounded(s: &str) -> String {
    escaped(s, 80)
}

/// `s` cut to `max` characters (then `…`), its control characters
/// escaped (`\n`, `\u{1b}`): one line, no terminal escapes.
pub fn escaped(s: &str, max: usize) -> String {
    let mut out = String::new();
    for c in s.chars().take(max) {
        if c.is_control() || is_invisible_format(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if s.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// Unicode format characters that reorder or hide text on a terminal
/// (bidirectional embeddings, overrides and isolates, zero-width marks and
/// joiners, the byte order mark): category Cf of the Unicode Character
/// Database, as far as a terminal is concerned.
pub fn is_invisible_format(c: char) -> bool {
    matches!(c,
        '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn escaped_text_cannot_steer_a_terminal() {
        assert_eq!(escaped("a\u{1b}[2Jb\n", 80), "a\\u{1b}[2Jb\\n");
        assert_eq!(
            escaped("host\u{202E}lanimret\u{200B}", 80),
            "host\\u{202e}lanimret\\u{200b}"
        );
        assert_eq!(escaped("héllo", 3), "hél…");
    }

    fn record() -> Deployment {
        Deployment {
            digest: "a".repeat(64),
            previous: None,
            deployed_at: "2026-12-01T11:30:00Z".into(),
            note: String::new(),
            size: 7,
            by: "ana@b".into(),
            handler: String::new(),
            replaces: 0,
            sequence: 0,
            signer: String::new(),
            signature: String::new(),
        }
    }

    #[test]
    fn a_record_round_trips_and_bad_ones_are_named() {
        let d = record();
        let v = d.to_value();
        assert_eq!(
            String::from_utf8(v.clone()).unwrap(),
            format!(
                "{{\"digest\":\"{}\",\"deployed_at\":\"2026-12-01T11:30:00Z\",\"size\":7,\"by\":\"ana@b\"}}",
                "a".repeat(64)
            )
        );
        assert_eq!(Deployment::parse(&v).unwrap(), d);
        let signed = Deployment {
            handler: "h".into(),
            replaces: 41,
            sequence: 1_764_588_600_000,
            signer: "MX".into(),
            signature: "00".into(),
            ..d.clone()
        };
        assert_eq!(Deployment::parse(&signed.to_value()).unwrap(), signed);
        assert_eq!(
            Deployment::parse(b"{\"digest\":\"ABC\",\"deployed_at\":\"x\",\"size\":1}")
                .unwrap_err(),
            "digest `ABC` is not 64 lowercase hex digits"
        );
        let bad_previous = format!(
            "{{\"digest\":\"{}\",\"previous\":\"x\\n\",\"deployed_at\":\"x\",\"size\":1}}",
            "a".repeat(64)
        );
        assert_eq!(
            Deployment::parse(bad_previous.as_bytes()).unwrap_err(),
            "digest `x\\n` is not 64 lowercase hex digits"
        );
        assert!(
            Deployment::parse(b"nope")
                .unwrap_err()
                .starts_with("not a deployment record (")
        );
        let long = Deployment {
            note: "n".repeat(MAX_NOTE_BYTES + 1),
            ..d.clone()
        };
        assert!(Deployment::parse(&long.to_value()).is_err());
        assert_eq!(
            Deployment::parse(&vec![b' '; MAX_RECORD_BYTES + 1]).unwrap_err(),
            format!(
                "not a deployment record ({} bytes, over {MAX_RECORD_BYTES})",
                MAX_RECORD_BYTES + 1
            )
        );
    }

    #[test]
    fn every_field_but_the_signature_is_signed() {
        let d = Deployment {
            handler: "h".into(),
            replaces: 3,
            signer: "MX".into(),
            ..record()
        };
        let base = d.signed_bytes();
        let changed = [
            Deployment {
                handler: "g".into(),
                ..d.clone()
            },
            Deployment {
                digest: "b".repeat(64),
                ..d.clone()
            },
            Deployment {
                size: 8,
                ..d.clone()
            },
            Deployment {
                replaces: 4,
                ..d.clone()
            },
            Deployment {
                sequence: 1,
                ..d.clone()
            },
            Deployment {
                previous: Some("c".repeat(64)),
                ..d.clone()
            },
            Deployment {
                deployed_at: "2026-12-02T11:30:00Z".into(),
                ..d.clone()
            },
            Deployment {
                note: "x".into(),
                ..d.clone()
            },
            Deployment {
                by: "eve@b".into(),
                ..d.clone()
            },
            Deployment {
                signer: "MY".into(),
                ..d.clone()
            },
        ];
        for c in &changed {
            assert_ne!(c.signed_bytes(), base, "{c:?}");
        }
        // Text moved between fields changes the bytes too.
        let a = Deployment {
            note: "a\",\"b".into(),
            by: String::new(),
            ..d.clone()
        };
        let b = Deployment {
            note: "a".into(),
            by: "b".into(),
            ..d.clone()
        };
        assert_ne!(a.signed_bytes(), b.signed_bytes());
        let signed = Deployment {
            signature: "ff".into(),
            ..d.clone()
        };
        assert_eq!(signed.signed_bytes(), base);
        // With a sequence: another context, and the sequence is signed.
        let sequenced = Deployment {
            sequence: 7,
            ..d.clone()
        };
        let bytes = String::from_utf8(sequenced.signed_bytes()).unwrap();
        assert!(
            bytes.starts_with("[\"idem-deployment/2\",\"h\","),
            "{bytes}"
        );
        assert!(
            String::from_utf8(base)
                .unwrap()
                .starts_with("[\"idem-deployment/1\",")
        );
        assert_ne!(
            Deployment {
                sequence: 8,
                ..sequenced.clone()
            }
            .signed_bytes(),
            sequenced.signed_bytes()
        );
    }
}
