//! Progress for long stages, on stderr: the stages report through their observers and the
//! command line draws it here. A bar when stderr is a terminal; otherwise (a log file,
//! a pipe, CI) a plain line every few seconds with done/total, rate, ETA and elapsed time, so
//! that a log shows the work going on. `AFKIT_NO_PROGRESS` turns both off;
//! `AFKIT_PROGRESS_EVERY` sets the seconds between plain lines (default 10).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{
    HumanDuration, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle, TermLike,
};

/// Seconds between plain progress lines when `AFKIT_PROGRESS_EVERY` does not say.
const DEFAULT_EVERY_SECONDS: f64 = 10.0;

/// A bar counting `len` units of `unit` (e.g. "contexts"), with rate and ETA.
pub fn bar(len: u64, unit: &str) -> ProgressBar {
    if std::env::var_os("AFKIT_NO_PROGRESS").is_some() {
        return ProgressBar::hidden();
    }
    if std::io::stderr().is_terminal() {
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        pb.set_style(style(&format!(
            "{{spinner}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{rate}}, {{left}}) {{msg}}"
        )));
        return pb;
    }
    let every = plain_interval();
    // Redraws are cheap: the lines themselves are spaced by `every`.
    let target = ProgressDrawTarget::term_like_with_hz(Box::new(PlainLines::new(every)), 20);
    let pb = ProgressBar::with_draw_target(Some(len), target);
    pb.set_style(style(&format!(
        "{{pos}}/{{len}} {unit} ({{rate}}, {{left}}, {{elapsed}} so far) {{msg}}"
    )));
    // Ticks keep the lines coming while the count stands still (a long first batch).
    pb.enable_steady_tick(every);
    pb
}

/// The template with `{rate}` and `{left}`: the mean rate since the bar started and the ETA
/// from it. indicatif's own `{per_sec}` and `{eta}` follow a recent-rate estimate that swings
/// several-fold between slow steps (and print four decimals, or an ETA of 0s before the first
/// unit is done).
fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .expect("valid template")
        .with_key(
            "rate",
            |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = match mean_rate(state) {
                    None => write!(w, "rate not known yet"),
                    Some(rate) if rate >= 10.0 => write!(w, "{rate:.0}/s"),
                    Some(rate) if rate >= 0.1 => write!(w, "{rate:.1}/s"),
                    Some(rate) => write!(w, "{:.0} s each", 1.0 / rate),
                };
            },
        )
        .with_key(
            "left",
            |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let left = state.len().unwrap_or(0).saturating_sub(state.pos());
                let _ = match mean_rate(state) {
                    None => write!(w, "ETA not known yet"),
                    Some(rate) => write!(
                        w,
                        "ETA {:#}",
                        HumanDuration(Duration::from_secs_f64(left as f64 / rate))
                    ),
                };
            },
        )
}

/// Units per second since the bar started; none before the first unit.
fn mean_rate(state: &ProgressState) -> Option<f64> {
    let seconds = state.elapsed().as_secs_f64();
    (state.pos() > 0 && seconds > 0.0).then(|| state.pos() as f64 / seconds)
}

fn plain_interval() -> Duration {
    std::env::var("AFKIT_PROGRESS_EVERY")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(Duration::from_secs_f64(DEFAULT_EVERY_SECONDS), |s| {
            Duration::from_secs_f64(s)
        })
}

/// A pretend terminal for indicatif that turns its redraws into plain lines on stderr, one per
/// interval at most: cursor moves and line clearing mean nothing in a file.
#[derive(Debug)]
struct PlainLines {
    every: Duration,
    state: Mutex<PlainState>,
}

#[derive(Debug)]
struct PlainState {
    /// What the current redraw has written so far.
    pending: String,
    /// When the last line was printed (or the bar started).
    last_line: Instant,
}

impl PlainLines {
    /// The first line comes `every` after the bar starts: a step done sooner prints none.
    fn new(every: Duration) -> PlainLines {
        PlainLines {
            every,
            state: Mutex::new(PlainState {
                pending: String::new(),
                last_line: Instant::now(),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PlainState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl TermLike for PlainLines {
    fn width(&self) -> u16 {
        // Wide enough that indicatif never wraps a line; the padding it adds is trimmed.
        400
    }

    fn move_cursor_up(&self, _n: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn move_cursor_down(&self, _n: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn move_cursor_right(&self, _n: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn move_cursor_left(&self, _n: usize) -> std::io::Result<()> {
        Ok(())
    }

    fn write_line(&self, s: &str) -> std::io::Result<()> {
        let mut state = self.state();
        state.pending.push_str(s);
        state.pending.push('\n');
        Ok(())
    }

    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.state().pending.push_str(s.trim_start_matches('\r'));
        Ok(())
    }

    fn clear_line(&self) -> std::io::Result<()> {
        self.state().pending.clear();
        Ok(())
    }

    /// The end of a redraw: its text becomes a line if the last one is old enough.
    fn flush(&self) -> std::io::Result<()> {
        let mut state = self.state();
        let text = std::mem::take(&mut state.pending);
        let text = text.trim();
        // A little early is on time: the steady tick comes every `every`, give or take.
        if text.is_empty() || state.last_line.elapsed() < self.every.mul_f64(0.95) {
            return Ok(());
        }
        state.last_line = Instant::now();
        let mut err = std::io::stderr().lock();
        // A closed stderr must not stop the stage: the line is only news.
        let _ = writeln!(err, "{text}");
        Ok(())
    }
}

/// One bar at a time, with lines printed above it: what a command's observer draws while a
/// stage works (`generate`, `filter`).
#[derive(Default)]
pub struct Lines {
    bar: Option<ProgressBar>,
}

impl Lines {
    /// Prints `line` above the bar, on stdout or stderr.
    pub fn say(&self, line: &str, on_stdout: bool) {
        let print = || {
            if on_stdout {
                println!("{line}");
            } else {
                eprintln!("{line}");
            }
        };
        match &self.bar {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }

    /// Replaces the bar with a new one of `total` units.
    pub fn start(&mut self, total: usize, unit: &str) -> &ProgressBar {
        self.clear();
        self.bar.insert(bar(total as u64, unit))
    }

    /// Follows a count a stage reports as `done` of `total`: a new bar when the count starts
    /// (or none is shown), its position after that, and no bar once the count is complete.
    pub fn track(&mut self, done: usize, total: usize, unit: &str) {
        match &self.bar {
            Some(bar) if done > 0 => bar.set_position(done as u64),
            _ => self.start(total, unit).set_position(done as u64),
        }
        if done == total {
            self.clear();
        }
    }

    /// The current bar, if any.
    pub fn bar(&self) -> Option<&ProgressBar> {
        self.bar.as_ref()
    }

    pub fn clear(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// The observer of the stages whose only reports are notes (assemble, export): on stderr, apart
/// from the summary on stdout.
pub struct Notes;

impl crate::assemble::Observer for Notes {
    fn note(&mut self, message: &str) {
        eprintln!("{message}");
    }
}

impl crate::export::Observer for Notes {
    fn note(&mut self, message: &str) {
        eprintln!("{message}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_lines_wait_their_interval_and_keep_only_the_last_redraw() {
        let lines = PlainLines::new(Duration::from_millis(50));
        let started = lines.state().last_line;
        lines.clear_line().unwrap();
        lines.write_str("0/4 contexts   ").unwrap();
        lines.flush().unwrap();
        assert_eq!(
            lines.state().last_line,
            started,
            "no line before the interval"
        );
        std::thread::sleep(Duration::from_millis(60));
        lines.clear_line().unwrap();
        lines.write_str("1/4 contexts   ").unwrap();
        lines.flush().unwrap();
        assert!(
            lines.state().last_line > started,
            "a line once the interval is over"
        );
        assert!(lines.state().pending.is_empty());
    }
}
