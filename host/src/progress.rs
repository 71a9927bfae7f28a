//! Progress of a long command (`idem replay`, `idem publish`, `idem receipts
//! prune`) on stderr: a bar drawn by `indicatif` when stderr is a terminal,
//! otherwise a plain line at most every [`LINE_EVERY`] (none at all for a
//! command that ends sooner, so scripts and logs see only the result).
//!
//! The command's result is never here: it goes to stdout, after
//! [`Progress::finish`] has cleared the bar.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

/// Least time between two plain progress lines (stderr not a terminal).
pub const LINE_EVERY: Duration = Duration::from_secs(10);

/// What a position counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes (shown as KiB, MiB, …).
    Bytes,
    /// Things, named by the plural noun (`"receipts"`, `"sequences"`).
    Items(&'static str),
}

/// One command's progress: a bar, or plain lines (see the module docs).
pub struct Progress {
    label: String,
    total: Option<u64>,
    unit: Unit,
    position: u64,
    message: String,
    sink: Sink,
}

enum Sink {
    Bar(ProgressBar),
    /// Plain lines; when the last one was printed (or the start).
    Lines(Instant),
}

impl Progress {
    /// Progress labelled `label` (e.g. `replay credit`) toward `total`
    /// (`None`: unknown, a spinner and a count), drawn as a bar when stderr
    /// is a terminal, else as plain lines.
    pub fn new(label: &str, total: Option<u64>, unit: Unit) -> Self {
        let sink = if std::io::stderr().is_terminal() {
            Sink::Bar(bar(label, total, unit))
        } else {
            Sink::Lines(Instant::now())
        };
        Self {
            label: label.to_owned(),
            total,
            unit,
            position: 0,
            message: String::new(),
            sink,
        }
    }

    /// Sets the total once it is known (`None`: unknown).
    pub fn set_total(&mut self, total: Option<u64>) {
        self.total = total;
        if let Sink::Bar(b) = &self.sink {
            match total {
                Some(t) => b.set_length(t),
                None => b.unset_length(),
            }
        }
    }

    /// Sets how far the work is (in [`Unit`]s), and the short text after it
    /// (counts so far, say).
    pub fn update(&mut self, position: u64, message: &str) {
        self.position = position;
        if self.message != message {
            message.clone_into(&mut self.message);
        }
        match &mut self.sink {
            Sink::Bar(b) => {
                b.set_position(position);
                b.set_message(self.message.clone());
            }
            Sink::Lines(last) => {
                if last.elapsed() >= LINE_EVERY {
                    *last = Instant::now();
                    eprintln!(
                        "{}",
                        line(&self.label, position, self.total, self.unit, &self.message)
                    );
                }
            }
        }
    }

    /// Clears the bar (plain lines print nothing more): the command prints
    /// its result next. Dropping it does the same (an error ends a command
    /// early).
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Sink::Bar(b) = &self.sink {
            b.finish_and_clear();
        }
    }
}

/// A bar (known total) or a spinner (unknown) on stderr.
fn bar(label: &str, total: Option<u64>, unit: Unit) -> ProgressBar {
    let amount = match (unit, total) {
        (Unit::Bytes, Some(_)) => "{bytes}/{total_bytes}".to_string(),
        (Unit::Bytes, None) => "{bytes}".to_string(),
        (Unit::Items(noun), Some(_)) => format!("{{pos}}/{{len}} {noun}"),
        (Unit::Items(noun), None) => format!("{{pos}} {noun}"),
    };
    let template = match total {
        Some(_) => format!("{{prefix}} [{{elapsed_precise}}] {{wide_bar}} {amount} {{msg}}"),
        None => format!("{{prefix}} [{{elapsed_precise}}] {{spinner}} {amount} {{msg}}"),
    };
    let style =
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar());
    let b = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    b.set_style(style);
    b.set_prefix(label.to_owned());
    b.enable_steady_tick(Duration::from_millis(200));
    b
}

/// One plain progress line: `replay credit: 450/1000 sequences new=3 …`.
pub fn line(label: &str, position: u64, total: Option<u64>, unit: Unit, message: &str) -> String {
    let amount = match (unit, total) {
        (Unit::Bytes, Some(t)) => format!(
            "{} of {}",
            indicatif::HumanBytes(position),
            indicatif::HumanBytes(t)
        ),
        (Unit::Bytes, None) => indicatif::HumanBytes(position).to_string(),
        (Unit::Items(noun), Some(t)) => format!("{position}/{t} {noun}"),
        (Unit::Items(noun), None) => format!("{position} {noun}"),
    };
    if message.is_empty() {
        format!("{label}: {amount}")
    } else {
        format!("{label}: {amount} {message}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_say_how_far_of_what() {
        assert_eq!(
            line(
                "replay credit",
                450,
                Some(1000),
                Unit::Items("sequences"),
                "new=3"
            ),
            "replay credit: 450/1000 sequences new=3"
        );
        assert_eq!(
            line("prune credit", 2000, None, Unit::Items("receipts"), ""),
            "prune credit: 2000 receipts"
        );
        assert_eq!(
            line(
                "publish",
                1536,
                Some(1024 * 1024),
                Unit::Bytes,
                "12 messages"
            ),
            "publish: 1.50 KiB of 1.00 MiB 12 messages"
        );
    }
}
