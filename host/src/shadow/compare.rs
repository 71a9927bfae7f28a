//! What a shadow run is judged on: the live version's and the candidate's
//! calls on the same message, statement by statement (the call, the SQL
//! text as sent, the parameters, what came back) and then the verdict
//! (ok with its number of outbox messages, retry, reject, trap). Log lines,
//! time and memory are not compared. The first difference is kept as a
//! [`Divergence`], in text already escaped and cut, for the host's report.

use crate::authoring::print;
use crate::runtime::HandlerFailure;
use crate::runtime::rehearsal::{Outcome, Statement};
use serde::{Deserialize, Serialize};

/// The most statements of each side a divergence shows, from the one
/// before the first that differs.
pub const MAX_SHOWN_STATEMENTS: usize = 6;
/// The most characters of a statement's SQL a divergence shows.
const MAX_SHOWN_SQL: usize = 300;
/// The most bytes of one statement's line.
const MAX_SHOWN_LINE: usize = 400;
/// The most characters of a reason, an error or a message id shown.
const MAX_SHOWN_TEXT: usize = 200;
/// The most rows of a query's answer shown.
const MAX_SHOWN_ROWS: usize = 3;

/// How a guest call ended, as compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It succeeded and asked for this many outbox messages.
    Ok {
        /// Outbox messages it asked for.
        outbox: usize,
    },
    /// `retry(reason)`.
    Retry(String),
    /// `reject(reason)`.
    Reject(String),
    /// A trap (the reason).
    Trap(String),
}

impl Verdict {
    /// The verdict of a call that returned `result` (`Ok(n)`: succeeded
    /// with `n` outbox messages).
    pub fn of(result: &Result<usize, HandlerFailure>) -> Self {
        match result {
            Ok(outbox) => Verdict::Ok { outbox: *outbox },
            Err(HandlerFailure::Retry(r)) => Verdict::Retry(r.clone()),
            Err(HandlerFailure::Reject(r)) => Verdict::Reject(r.clone()),
            Err(HandlerFailure::Trap(r)) => Verdict::Trap(r.clone()),
        }
    }

    /// Whether two verdicts count as the same: the same kind, and for `ok`
    /// the same number of outbox messages (reasons are not compared: a
    /// trap's names code addresses, which differ between builds).
    pub fn same(&self, other: &Verdict) -> bool {
        match (self, other) {
            (Verdict::Ok { outbox: a }, Verdict::Ok { outbox: b }) => a == b,
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }

    /// One line: `ok`, `ok, 2 outbox messages`, `retry: …`, `reject: …`,
    /// `trap: …` (reasons escaped and cut).
    pub fn text(&self) -> String {
        match self {
            Verdict::Ok { outbox: 0 } => "ok".into(),
            Verdict::Ok { outbox } => format!("ok, {outbox} outbox message(s)"),
            Verdict::Retry(r) => format!("retry: {}", shown(r, MAX_SHOWN_TEXT)),
            Verdict::Reject(r) => format!("reject: {}", shown(r, MAX_SHOWN_TEXT)),
            Verdict::Trap(r) => format!("trap: {}", shown(r, MAX_SHOWN_TEXT)),
        }
    }
}

/// One side of a comparison: what a version did with the message.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// Its statements, in order, as recorded (at most
    /// [`crate::runtime::rehearsal::MAX_RECORDED_STATEMENTS`]).
    pub statements: Vec<Statement>,
    /// How many statements it sent in all.
    pub statements_used: u32,
    /// How its call ended.
    pub verdict: Verdict,
}

/// Where two runs first differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The 0-based index of the first statement that differs; `None` when
    /// every statement matched and the verdicts differ.
    pub statement: Option<usize>,
    /// One line: what differs.
    pub what: String,
}

/// The first difference between `live` and `candidate`, or `None` when
/// they agree.
pub fn first_difference(live: &Observed, candidate: &Observed) -> Option<Difference> {
    let n = live.statements.len().max(candidate.statements.len());
    for i in 0..n {
        let what = match (live.statements.get(i), candidate.statements.get(i)) {
            (Some(a), Some(b)) if a == b => continue,
            (Some(a), Some(b)) if a.call != b.call || a.sql != b.sql => "the SQL differs",
            (Some(a), Some(b)) if a.params != b.params => "the parameters differ",
            (Some(_), Some(_)) => "what came back differs",
            (Some(_), None) => "only the live version sent it",
            (None, Some(_)) => "only the candidate sent it",
            (None, None) => continue,
        };
        return Some(Difference {
            statement: Some(i),
            what: format!("statement {}: {what}", i + 1),
        });
    }
    if live.statements_used != candidate.statements_used {
        return Some(Difference {
            statement: None,
            what: format!(
                "the number of statements differs: live {}, candidate {}",
                live.statements_used, candidate.statements_used
            ),
        });
    }
    if live.verdict.same(&candidate.verdict) {
        return None;
    }
    Some(Difference {
        statement: None,
        what: format!(
            "the verdict differs: live {}, candidate {}",
            kind(&live.verdict),
            kind(&candidate.verdict)
        ),
    })
}

fn kind(v: &Verdict) -> String {
    match v {
        Verdict::Ok { outbox: 0 } => "ok".into(),
        Verdict::Ok { outbox } => format!("ok with {outbox} outbox message(s)"),
        Verdict::Retry(_) => "retry".into(),
        Verdict::Reject(_) => "reject".into(),
        Verdict::Trap(_) => "trap".into(),
    }
}

/// A message on which the candidate did not do what the live version did,
/// as a host reports it (every text escaped and cut).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// The message id (its receipt's key).
    pub message_id: String,
    /// Its subject.
    pub subject: String,
    /// Its stream sequence.
    pub stream_sequence: u64,
    /// What differs first ([`Difference::what`]).
    pub what: String,
    /// What the live version did.
    pub live: Side,
    /// What the candidate did.
    pub candidate: Side,
}

/// One version's side of a [`Divergence`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Side {
    /// Its verdict ([`Verdict::text`]).
    pub verdict: String,
    /// The number (1-based) of the first statement in `statements`.
    pub first: usize,
    /// At most [`MAX_SHOWN_STATEMENTS`] statements, one line each:
    /// `execute UPDATE … [$1 = 7] → 1 row(s) affected`.
    pub statements: Vec<String>,
    /// How many statements it sent in all.
    pub total: usize,
}

impl Divergence {
    /// The divergence of `live` and `candidate` on a message, shown from
    /// the statement before `difference`'s.
    pub fn new(
        message_id: &str,
        subject: &str,
        stream_sequence: u64,
        difference: &Difference,
        live: &Observed,
        candidate: &Observed,
    ) -> Self {
        let from = match difference.statement {
            Some(i) => i.saturating_sub(1),
            None => live
                .statements
                .len()
                .max(candidate.statements.len())
                .saturating_sub(MAX_SHOWN_STATEMENTS),
        };
        Divergence {
            message_id: shown(message_id, MAX_SHOWN_TEXT),
            subject: shown(subject, MAX_SHOWN_TEXT),
            stream_sequence,
            what: difference.what.clone(),
            live: Side::of(live, from),
            candidate: Side::of(candidate, from),
        }
    }
}

impl Side {
    fn of(o: &Observed, from: usize) -> Self {
        Side {
            verdict: o.verdict.text(),
            first: from + 1,
            statements: o
                .statements
                .iter()
                .skip(from)
                .take(MAX_SHOWN_STATEMENTS)
                .map(line)
                .collect(),
            total: o.statements.len(),
        }
    }
}

/// One statement in one line: the call, the SQL (cut), the parameters and
/// what came back.
fn line(s: &Statement) -> String {
    let params: Vec<String> = s
        .params
        .iter()
        .enumerate()
        .map(|(i, v)| format!("${} = {}", i + 1, cut(&print::value(v), MAX_SHOWN_TEXT)))
        .collect();
    let outcome = match &s.outcome {
        Outcome::Affected(n) => format!("{n} row(s) affected"),
        Outcome::Rows { rows, .. } => {
            let shown: Vec<String> = rows
                .iter()
                .take(MAX_SHOWN_ROWS)
                .map(|r| cut(&print::row(r), MAX_SHOWN_TEXT))
                .collect();
            let more = if rows.len() > MAX_SHOWN_ROWS {
                ", …"
            } else {
                ""
            };
            format!("{} row(s): {}{more}", rows.len(), shown.join(", "))
        }
        Outcome::Failed { kind, message } => {
            format!("error {kind}: {}", shown(message, MAX_SHOWN_TEXT))
        }
        Outcome::Stopped(why) => format!("stopped: {}", shown(why, MAX_SHOWN_TEXT)),
    };
    let line = format!(
        "{} {} [{}] → {outcome}",
        s.call,
        shown(&s.sql, MAX_SHOWN_SQL),
        params.join(", ")
    );
    cut_bytes(&line, MAX_SHOWN_LINE)
}

/// `s` cut to at most `max` bytes on a character boundary (then `…`).
fn cut_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    format!("{}…", s.get(..at).unwrap_or_default())
}

/// `s` escaped (one line, no control characters) and cut to `max`
/// characters.
fn shown(s: &str, max: usize) -> String {
    cut(&crate::log_format::escape(s), max)
}

fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", s.get(..at).unwrap_or_default()),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::sql_value::SqlValue;

    fn update(amount: i64, affected: u64) -> Statement {
        Statement {
            call: "execute",
            sql: "UPDATE a SET b = b + $2 WHERE id = $1".into(),
            params: vec![SqlValue::Integer(7), SqlValue::Integer(amount)],
            outcome: Outcome::Affected(affected),
        }
    }

    fn ok(statements: Vec<Statement>) -> Observed {
        Observed {
            statements_used: u32::try_from(statements.len()).unwrap(),
            statements,
            verdict: Verdict::Ok { outbox: 0 },
        }
    }

    #[test]
    fn identical_runs_agree_and_reasons_are_not_compared() {
        assert_eq!(
            first_difference(&ok(vec![update(5, 1)]), &ok(vec![update(5, 1)])),
            None
        );
        let trap = |r: &str| Observed {
            statements: vec![update(5, 1)],
            statements_used: 1,
            verdict: Verdict::Trap(r.into()),
        };
        assert_eq!(first_difference(&trap("at 0x10"), &trap("at 0x20")), None);
    }

    #[test]
    fn the_first_difference_is_named() {
        let d = |a: Observed, b: Observed| first_difference(&a, &b).unwrap();
        assert_eq!(
            d(ok(vec![update(5, 1)]), ok(vec![update(6, 1)])),
            Difference {
                statement: Some(0),
                what: "statement 1: the parameters differ".into()
            }
        );
        assert_eq!(
            d(ok(vec![update(5, 1)]), ok(vec![update(5, 0)])).what,
            "statement 1: what came back differs"
        );
        let mut other = update(5, 1);
        other.sql.push(' ');
        assert_eq!(
            d(
                ok(vec![update(5, 1), update(1, 1)]),
                ok(vec![update(5, 1), other])
            )
            .what,
            "statement 2: the SQL differs"
        );
        assert_eq!(
            d(ok(vec![update(5, 1)]), ok(vec![update(5, 1), update(5, 1)])),
            Difference {
                statement: Some(1),
                what: "statement 2: only the candidate sent it".into()
            }
        );
        assert_eq!(
            d(ok(vec![update(5, 1)]), ok(vec![])).what,
            "statement 1: only the live version sent it"
        );
        let rejected = Observed {
            statements: vec![update(5, 1)],
            statements_used: 1,
            verdict: Verdict::Reject("no".into()),
        };
        assert_eq!(
            d(ok(vec![update(5, 1)]), rejected),
            Difference {
                statement: None,
                what: "the verdict differs: live ok, candidate reject".into()
            }
        );
        let outbox = Observed {
            statements: vec![],
            statements_used: 0,
            verdict: Verdict::Ok { outbox: 1 },
        };
        // Past the statements recorded, the count still tells.
        let mut more = ok(vec![update(5, 1)]);
        more.statements_used = 1001;
        assert_eq!(
            d(ok(vec![update(5, 1)]), more).what,
            "the number of statements differs: live 1, candidate 1001"
        );
        assert_eq!(
            d(ok(vec![]), outbox).what,
            "the verdict differs: live ok, candidate ok with 1 outbox message(s)"
        );
    }

    #[test]
    fn a_divergence_shows_escaped_bounded_lines_from_the_statement_before() {
        let live = ok((0..20).map(|i| update(i, 1)).collect());
        let mut cand = live.clone();
        cand.statements[12] = update(99, 1);
        cand.statements[12].sql = format!("UPDATE\n{}", "x".repeat(1000));
        let diff = first_difference(&live, &cand).unwrap();
        let d = Divergence::new("id\u{1b}[2J", "s", 4, &diff, &live, &cand);
        assert_eq!(d.message_id, "id\\u{1b}[2J");
        assert_eq!(d.live.first, 12);
        assert_eq!(d.live.total, 20);
        assert_eq!(d.live.statements.len(), MAX_SHOWN_STATEMENTS);
        assert_eq!(
            d.live.statements[1],
            "execute UPDATE a SET b = b + $2 WHERE id = $1 [$1 = 7, $2 = 12] → 1 row(s) affected"
        );
        let shown = &d.candidate.statements[1];
        assert!(shown.starts_with("execute UPDATE\\nxxx"), "{shown}");
        assert!(!shown.contains('\n'));
        assert!(shown.len() < 400, "{}", shown.len());
        assert_eq!(d.what, "statement 13: the SQL differs");
    }
}
