//! A deployment as the deployments bucket records it: the value of the
//! handler's key, JSON.
//!
//! ```json
//! {"digest":"9f2c…","previous":"41aa…","deployed_at":"2026-12-01T11:30:00Z",
//!  "note":"fix rounding","size":151220,"by":"ana@build-3"}
//! ```

use serde::{Deserialize, Serialize};

/// One deployment of a handler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    /// Hex SHA-256 of the component's bytes: also its object's name in the
    /// modules bucket.
    pub digest: String,
    /// The digest deployed before this one (what `--rollback` returns to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// When it was deployed, RFC 3339 UTC (the deploying machine's clock).
    pub deployed_at: String,
    /// Free text from `--note`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// The component's size in bytes.
    pub size: u64,
    /// Who deployed it: `user@host` of the deploying command.
    #[serde(default)]
    pub by: String,
}

impl Deployment {
    /// Reads a deployment from a KV value.
    ///
    /// # Errors
    /// One line: the value is not this JSON, or its digest is not 64
    /// lowercase hex digits (as anything but `idem deploy` might write).
    pub fn parse(value: &[u8]) -> Result<Self, String> {
        let d: Deployment =
            serde_json::from_slice(value).map_err(|e| format!("not a deployment record ({e})"))?;
        if !is_digest(&d.digest) {
            return Err(format!(
                "digest `{}` is not 64 lowercase hex digits",
                d.digest.escape_debug()
            ));
        }
        Ok(d)
    }

    /// The JSON value stored for it.
    pub fn to_value(&self) -> Vec<u8> {
        // A struct of strings and a number always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Whether `s` is a hex SHA-256 as idem writes it.
pub fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_record_round_trips_and_bad_ones_are_named() {
        let d = Deployment {
            digest: "a".repeat(64),
            previous: None,
            deployed_at: "2026-12-01T11:30:00Z".into(),
            note: String::new(),
            size: 7,
            by: "ana@b".into(),
        };
        let v = d.to_value();
        assert_eq!(
            String::from_utf8(v.clone()).unwrap(),
            format!(
                "{{\"digest\":\"{}\",\"deployed_at\":\"2026-12-01T11:30:00Z\",\"size\":7,\"by\":\"ana@b\"}}",
                "a".repeat(64)
            )
        );
        assert_eq!(Deployment::parse(&v).unwrap(), d);
        assert_eq!(
            Deployment::parse(b"{\"digest\":\"ABC\",\"deployed_at\":\"x\",\"size\":1}")
                .unwrap_err(),
            "digest `ABC` is not 64 lowercase hex digits"
        );
        assert!(
            Deployment::parse(b"nope")
                .unwrap_err()
                .starts_with("not a deployment record (")
        );
    }
}
