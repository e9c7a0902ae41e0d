//! Progress and summary of the long operator commands (`cleanup`, `dead-letters retry --all`).
//!
//! While a command runs, a spinner with the rows done, the rate and the time taken is drawn on
//! stderr, only when stderr is a terminal. At the end, one summary line goes to stdout in every
//! case (`deleted 1234567 rows in 12.3s (100371 rows/s)`), so that scripts read the same line
//! with or without a terminal, and its first words are what the commands printed before timings
//! were added.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use outbox_relay::ops::Progress;

/// The progress of one command; the library reports to it after each committed batch.
pub struct Reporter {
    bar: Option<ProgressBar>,
    started: Instant,
    rows: u64,
}

impl Reporter {
    /// Starts timing; draws a spinner labelled `doing` (for example `deleting`) when stderr is a
    /// terminal.
    pub fn start(doing: &'static str) -> Reporter {
        let bar = std::io::stderr().is_terminal().then(|| {
            let style = ProgressStyle::with_template(
                "{spinner} {msg} {human_pos} rows ({per_sec}) {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
            let bar = ProgressBar::new_spinner().with_style(style);
            bar.set_message(doing);
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Reporter {
            bar,
            started: Instant::now(),
            rows: 0,
        }
    }

    /// A batch was committed.
    pub fn update(&mut self, progress: Progress) {
        self.rows = progress.rows;
        if let Some(bar) = &self.bar {
            bar.set_position(progress.rows);
        }
    }

    /// Clears the spinner and returns the summary: `done` followed by the time and the rate.
    pub fn finish(self, done: &str) -> String {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        summary(done, self.rows, self.started.elapsed())
    }

    /// Clears the spinner after a failure; returns the rows committed before it.
    pub fn abandon(self) -> u64 {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        self.rows
    }
}

/// `<done> in 12.3s (100371 rows/s)`.
fn summary(done: &str, rows: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 {
        (rows as f64 / secs).round() as u64
    } else {
        0
    };
    format!("{done} in {secs:.1}s ({rate} rows/s)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_line() {
        assert_eq!(
            summary(
                "deleted 1234567 rows",
                1_234_567,
                Duration::from_millis(12_300)
            ),
            "deleted 1234567 rows in 12.3s (100371 rows/s)"
        );
        assert_eq!(
            summary("deleted 0 rows", 0, Duration::ZERO),
            "deleted 0 rows in 0.0s (0 rows/s)"
        );
    }
}
