//! What `idem publish` reports: the lines not stored, the counts, the
//! stdout summary and the line where publishing stopped.

use std::path::Path;

/// Bad lines `--skip-bad` lists one by one; past these it only counts them.
pub(super) const MAX_LISTED: usize = 1000;

/// One line that was not stored, and why (one line of text, escaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BadLine {
    /// 1-based line number in the file.
    pub(super) line: u64,
    /// Why, in the checker's or the broker's words.
    pub(super) reason: String,
}

/// How a line failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Failed {
    /// Refused before sending (not JSON, too large, no identity).
    NotSent,
    /// Sent, and the stream refused it.
    Refused,
    /// Sent, and no PubAck said whether it is stored.
    Unconfirmed,
}

/// The first line that could not be stored, where publishing stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Stop {
    pub(super) bad: BadLine,
    pub(super) how: Failed,
    /// Whether `--skip-bad` would have skipped it (the line's fault, not
    /// the broker's or the connection's).
    pub(super) skippable: bool,
    /// Messages stored before it (every line before it, but those
    /// `--skip-bad` skipped).
    pub(super) stored_before: u64,
    /// Lines after it already sent when its refusal came back.
    pub(super) sent_after: u64,
    /// Of those, how many the stream stored.
    pub(super) stored_after: u64,
}

/// What happened to the lines so far.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Messages the stream confirmed (PubAck), duplicates included.
    pub(super) stored: u64,
    /// Of those, PubAcks with `duplicate: true` (the stream already held a
    /// message with that `Nats-Msg-Id`).
    pub(super) duplicates: u64,
    /// Lines `--skip-bad` skipped, listed up to [`MAX_LISTED`], in line order.
    pub(super) skipped: Vec<BadLine>,
    /// Skipped lines past [`MAX_LISTED`].
    pub(super) unlisted: u64,
    /// Where publishing stopped, if it did.
    pub(super) stop: Option<Stop>,
}

impl Tally {
    /// Lists `bad` among the skipped lines, in line order (counts it past
    /// [`MAX_LISTED`]).
    pub(super) fn skip(&mut self, bad: BadLine) {
        if self.skipped.len() < MAX_LISTED {
            let at = self.skipped.partition_point(|b| b.line < bad.line);
            self.skipped.insert(at, bad);
        } else {
            self.unlisted += 1;
        }
    }
}

/// The stdout line: `stored 999 messages in stream ACCOUNTS (subject
/// accounts.credit) from events.jsonl`, then the duplicates and the skipped
/// lines when there are any.
pub(super) fn summary(tally: &Tally, stream: Option<&str>, subject: &str, file: &Path) -> String {
    let mut line = format!(
        "stored {} in stream {} (subject {subject}) from {}",
        crate::admin::count(tally.stored, "message", "messages"),
        stream.unwrap_or("?"),
        file.display()
    );
    if tally.duplicates > 0 {
        line.push_str(&match tally.duplicates {
            1 => "; 1 of them a duplicate the stream already held (same Nats-Msg-Id)".to_string(),
            n => format!("; {n} of them duplicates the stream already held (same Nats-Msg-Id)"),
        });
    }
    let skipped = tally.skipped.len() as u64 + tally.unlisted;
    if skipped > 0 {
        let shown: Vec<String> = tally
            .skipped
            .iter()
            .take(10)
            .map(|b| b.line.to_string())
            .collect();
        let more = if skipped > 10 { ", …" } else { "" };
        line.push_str(&format!(
            "; skipped {}: {}{more}",
            crate::admin::count(skipped, "line", "lines"),
            shown.join(", ")
        ));
    }
    line
}

/// The error line for where publishing stopped.
pub(super) fn stop_line(stop: &Stop, tally: &Tally, file: &Path) -> String {
    let what = match stop.how {
        Failed::NotSent => "not sent",
        Failed::Refused => "not stored",
        Failed::Unconfirmed => "not confirmed (it may or may not be stored)",
    };
    let after = match stop.sent_after {
        0 => "nothing after it was sent".to_string(),
        n => format!(
            "{} after it already sent, {} of them stored ({} in all)",
            crate::admin::count(n, "line", "lines"),
            stop.stored_after,
            tally.stored
        ),
    };
    let hint = match (stop.skippable, stop.how) {
        (false, _) => "",
        (true, Failed::NotSent) => "; fix it, or pass --skip-bad to skip such lines",
        (true, _) => "; pass --skip-bad to go on past lines the stream refuses",
    };
    let skipped = tally.skipped.len() as u64 + tally.unlisted;
    let before = match skipped {
        0 => "every line before it is stored".to_string(),
        n => format!("every line before it but the {n} skipped is stored"),
    };
    format!(
        "{} line {} {what}: {}; publishing stopped there: {before} ({}), {after}{hint}",
        file.display(),
        stop.bad.line,
        stop.bad.reason,
        crate::admin::count(stop.stored_before, "message", "messages"),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn the_stop_says_what_is_stored() {
        let tally = Tally {
            stored: 5,
            ..Tally::default()
        };
        let stop = Stop {
            bad: BadLine {
                line: 6,
                reason: "maximum messages exceeded".into(),
            },
            how: Failed::Refused,
            skippable: true,
            stored_before: 5,
            sent_after: 2,
            stored_after: 0,
        };
        assert_eq!(
            stop_line(&stop, &tally, Path::new("e.jsonl")),
            "e.jsonl line 6 not stored: maximum messages exceeded; publishing stopped there: every line before it is stored (5 messages), 2 lines after it already sent, 0 of them stored (5 in all); pass --skip-bad to go on past lines the stream refuses"
        );
        let mut tally = tally;
        tally.duplicates = 1;
        tally.skip(BadLine {
            line: 9,
            reason: String::new(),
        });
        tally.skip(BadLine {
            line: 3,
            reason: String::new(),
        });
        assert_eq!(
            summary(&tally, Some("S"), "s.x", Path::new("e.jsonl")),
            "stored 5 messages in stream S (subject s.x) from e.jsonl; 1 of them a duplicate the stream already held (same Nats-Msg-Id); skipped 2 lines: 3, 9"
        );
    }
}
