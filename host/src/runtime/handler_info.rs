//! The `idem_handler_info` series: which component each handler runs now
//! (value 1) and the one it ran before its last swap (value 0), labelled
//! `handler`, `digest` (hex SHA-256 of the component) and `wit` (the WIT
//! package version it was built for, [`crate::runtime::WIT_PACKAGE`] or an
//! earlier one).
//!
//! A handler has at most these two series, however many versions it is
//! swapped through (ARCHITECTURE.md, "Code map", `metrics.rs`). They are
//! kept here rather than in the Prometheus recorder of [`crate::metrics`],
//! which cannot remove one series of a metric, and rendered after the
//! recorder's output on `/metrics` ([`render`], called by [`crate::service::http`]).
//! [`crate::runtime::component_slot::ComponentSlot`] sets them: when it is made
//! ([`running`]) and at every swap ([`swapped`]).
//!
//! Like the `metrics` facade's recorder the registry is process-wide; a
//! process that serves no `/metrics` (an admin command, an in-process test
//! host) keeps one small entry per handler it prepared and never reads it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

/// The metric's name.
pub const NAME: &str = "idem_handler_info";

/// Its help text.
const HELP: &str = "1 per handler for the component it runs (sha256 digest, WIT package); 0 for the one it ran before its last swap.";

/// The versions of one handler that have a series.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Versions {
    /// The digest it runs now, and its WIT package.
    current: (String, &'static str),
    /// The digest it ran before the last swap, if any, and its WIT package.
    left: Option<(String, &'static str)>,
}

/// Every handler's versions, by handler name.
static SERIES: Mutex<BTreeMap<String, Versions>> = Mutex::new(BTreeMap::new());

fn with_series<R>(f: impl FnOnce(&mut BTreeMap<String, Versions>) -> R) -> R {
    // A panic while holding the lock leaves a map that is whole either way.
    let mut series = SERIES.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut series)
}

/// `handler` runs the component `digest`, built for WIT package `wit` (its
/// first version in this process): its one series reads 1, any earlier
/// ones are gone.
pub fn running(handler: &str, digest: &str, wit: &'static str) {
    with_series(|s| {
        s.insert(
            handler.to_owned(),
            Versions {
                current: (digest.to_owned(), wit),
                left: None,
            },
        );
    });
}

/// `handler` swapped from the component `from` to `to` (each a digest
/// and its WIT package): `to` reads 1, `from` reads 0, and the series of
/// any version before `from` is removed. The same digest twice changes
/// nothing.
pub fn swapped(handler: &str, from: (&str, &'static str), to: (&str, &'static str)) {
    if from.0 == to.0 {
        return;
    }
    with_series(|s| {
        s.insert(
            handler.to_owned(),
            Versions {
                current: (to.0.to_owned(), to.1),
                left: Some((from.0.to_owned(), from.1)),
            },
        );
    });
}

/// Appends the series in the Prometheus text format (version 0.0.4) to
/// `out`: a `# HELP` and `# TYPE` line, then one line per series, handlers
/// in name order, each handler's current version first. Nothing when no
/// handler has a series.
pub fn render(out: &mut String) {
    with_series(|s| {
        if s.is_empty() {
            return;
        }
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let _ = writeln!(out, "# HELP {NAME} {HELP}");
        let _ = writeln!(out, "# TYPE {NAME} gauge");
        for (handler, v) in s.iter() {
            line(out, handler, &v.current, 1);
            if let Some(left) = &v.left {
                line(out, handler, left, 0);
            }
        }
        out.push('\n');
    });
}

fn line(out: &mut String, handler: &str, (digest, wit): &(String, &'static str), value: u8) {
    let _ = writeln!(
        out,
        "{NAME}{{handler=\"{}\",digest=\"{}\",wit=\"{}\"}} {value}",
        escape(handler),
        escape(digest),
        escape(wit)
    );
}

/// A label value as the text format writes it: `\`, `"` and line feeds
/// escaped.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of [`render`] for `handler` only (other tests of this
    /// process share the registry).
    fn lines_of(handler: &str) -> Vec<String> {
        let mut out = String::new();
        render(&mut out);
        let tag = format!("handler=\"{}\"", escape(handler));
        out.lines()
            .filter(|l| l.contains(&tag))
            .map(str::to_owned)
            .collect()
    }

    const V2: &str = "idem:handler@0.2.0";
    const V1: &str = "idem:handler@0.1.0";

    fn series(handler: &str, digest: &str, value: u8) -> String {
        let wit = if digest == "d39" { V1 } else { V2 };
        format!(
            "idem_handler_info{{handler=\"{handler}\",digest=\"{digest}\",wit=\"{wit}\"}} {value}"
        )
    }

    /// The WIT package the tests give digest `d`: d39 was built for 0.1.0.
    fn v(d: &str) -> (&str, &'static str) {
        (d, if d == "d39" { V1 } else { V2 })
    }

    #[test]
    fn a_handler_has_at_most_the_current_and_the_left_version() {
        let h = "unit-swaps";
        running(h, "d0", V2);
        assert_eq!(lines_of(h), [series(h, "d0", 1)]);
        for i in 1..=40 {
            swapped(h, v(&format!("d{}", i - 1)), v(&format!("d{i}")));
        }
        assert_eq!(lines_of(h), [series(h, "d40", 1), series(h, "d39", 0)]);
        // Back to the one it left: the two swap values.
        swapped(h, v("d40"), v("d39"));
        assert_eq!(lines_of(h), [series(h, "d39", 1), series(h, "d40", 0)]);
        // The same digest again changes nothing.
        swapped(h, v("d39"), v("d39"));
        assert_eq!(lines_of(h), [series(h, "d39", 1), series(h, "d40", 0)]);
        // Made again (a new slot): one series.
        running(h, "d7", V2);
        assert_eq!(lines_of(h), [series(h, "d7", 1)]);
    }

    #[test]
    fn the_render_has_help_and_type_once_and_escapes_label_values() {
        let h = "unit \"quoted\" \\ name\nnext";
        running(h, "d", V1);
        let mut out = String::from("idem_other 1");
        render(&mut out);
        assert!(
            out.starts_with("idem_other 1\n# HELP idem_handler_info "),
            "{out}"
        );
        assert_eq!(out.matches("# TYPE idem_handler_info gauge\n").count(), 1);
        assert!(
            out.contains(
                "idem_handler_info{handler=\"unit \\\"quoted\\\" \\\\ name\\nnext\",digest=\"d\",wit=\"idem:handler@0.1.0\"} 1\n"
            ),
            "{out}"
        );
    }
}
