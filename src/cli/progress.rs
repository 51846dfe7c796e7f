//! Progress for long stages, on stderr: the stages report through their observers and the
//! command line draws it here. A bar when stderr is a terminal; otherwise (a log file,
//! a pipe, CI) a plain line every few seconds with done/total, rate, ETA and elapsed time, so
//! that a log shows the work going on. `AFKIT_NO_PROGRESS` turns both off;
//! `AFKIT_PROGRESS_EVERY` sets the seconds between plain lines (default 10).

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{
    HumanDuration, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle, TermLike,
};

/// Seconds between plain progress lines when `AFKIT_PROGRESS_EVERY` does not say.
const DEFAULT_EVERY_SECONDS: f64 = 10.0;

/// A bar counting `len` units of `unit` (e.g. "contexts"), with rate and ETA.
pub fn bar(len: u64, unit: &str) -> ProgressBar {
    bar_from(len, Since::default(), unit).0
}

/// Where a bar's rate is measured from: `done` units and `elapsed` time on its clock. Units an
/// earlier run did (a resumed stage), or work of another pace, do not count.
#[derive(Debug, Clone, Copy, Default)]
pub struct Since {
    pub done: u64,
    pub elapsed: Duration,
}

/// A bar that starts at `since`: its count at `since.done` and its clock at `since.elapsed`;
/// with the unit its rate is shown in.
fn bar_from(len: u64, since: Since, unit: &str) -> (ProgressBar, RateUnit) {
    let rate_unit = RateUnit::default();
    if std::env::var_os("AFKIT_NO_PROGRESS").is_some() {
        return (ProgressBar::hidden(), rate_unit);
    }
    if std::io::stderr().is_terminal() {
        let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
            .with_position(since.done)
            .with_elapsed(since.elapsed);
        pb.set_style(style(&format!(
            "{{spinner}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{rate}}, {{left}}) {{msg}}"
        ), since, &rate_unit));
        return (pb, rate_unit);
    }
    let every = plain_interval();
    // Redraws are cheap: the lines themselves are spaced by `every`.
    let target = ProgressDrawTarget::term_like_with_hz(Box::new(PlainLines::new(every)), 20);
    let pb = ProgressBar::with_draw_target(Some(len), target)
        .with_position(since.done)
        .with_elapsed(since.elapsed);
    pb.set_style(style(
        &format!("{{pos}}/{{len}} {unit} ({{rate}}, {{left}}, {{elapsed}} so far) {{msg}}"),
        since,
        &rate_unit,
    ));
    // Ticks keep the lines coming while the count stands still (a long first batch).
    pb.enable_steady_tick(every);
    (pb, rate_unit)
}

/// How a bar shows its rate: units per second, or seconds per unit for slow work. Chosen at
/// the first rate the bar knows and kept, so that one bar never changes unit.
#[derive(Debug, Clone, Default)]
struct RateUnit(Arc<OnceLock<bool>>);

impl RateUnit {
    /// `rate` (units per second) in the bar's unit.
    fn show(&self, rate: f64) -> String {
        let seconds_each = *self.0.get_or_init(|| rate < 1.0);
        if seconds_each {
            format!("{} s each", significant(1.0 / rate))
        } else {
            format!("{}/s", significant(rate))
        }
    }
}

/// `x` with two significant digits at most, and no decimals from 10 up.
fn significant(x: f64) -> String {
    match x {
        x if x >= 10.0 => format!("{x:.0}"),
        x if x >= 1.0 => format!("{x:.1}"),
        x if x >= 0.1 => format!("{x:.2}"),
        x => format!("{x:.3}"),
    }
}

/// The template with `{rate}` and `{left}`: the mean rate since `since` and the ETA from it.
/// indicatif's own `{per_sec}` and `{eta}` follow a recent-rate estimate that swings
/// several-fold between slow steps (and print four decimals, or an ETA of 0s before the first
/// unit is done).
fn style(template: &str, since: Since, unit: &RateUnit) -> ProgressStyle {
    rate_keys(
        ProgressStyle::with_template(template).expect("valid template"),
        since,
        unit,
    )
}

/// `style` with its `{rate}` and `{left}` keys measuring from `since`, the rate in `unit`.
fn rate_keys(style: ProgressStyle, since: Since, unit: &RateUnit) -> ProgressStyle {
    let unit = unit.clone();
    style
        .with_key(
            "rate",
            move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = match mean_rate(state, since) {
                    None => write!(w, "rate not known yet"),
                    Some(rate) => write!(w, "{}", unit.show(rate)),
                };
            },
        )
        .with_key(
            "left",
            move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let left = state.len().unwrap_or(0).saturating_sub(state.pos());
                let _ = match mean_rate(state, since) {
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

/// Units per second since `since`; none before its first unit.
fn mean_rate(state: &ProgressState, since: Since) -> Option<f64> {
    let seconds = state.elapsed().saturating_sub(since.elapsed).as_secs_f64();
    let counted = state.pos().saturating_sub(since.done);
    (counted > 0 && seconds > 0.0).then(|| counted as f64 / seconds)
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
    /// The rate's unit of the current bar, kept when its rate is measured again.
    rate_unit: RateUnit,
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
        self.start_from(total, Since::default(), unit)
    }

    /// Replaces the bar with a new one of `total` units that starts at `since`.
    pub fn start_from(&mut self, total: usize, since: Since, unit: &str) -> &ProgressBar {
        self.clear();
        let (bar, rate_unit) = bar_from(total as u64, since, unit);
        self.rate_unit = rate_unit;
        self.bar.insert(bar)
    }

    /// Measures the rate and ETA again from here, where the work's pace changes (the filter's
    /// ensemble iterations take minutes where its MLP-only ones took seconds); the bar, its
    /// count, clock and message stay.
    pub fn restart_rate(&self) {
        if let Some(bar) = &self.bar {
            let since = Since {
                done: bar.position(),
                elapsed: bar.elapsed(),
            };
            bar.set_style(rate_keys(bar.style(), since, &self.rate_unit));
        }
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

impl afkit_assemble::Observer for Notes {
    fn note(&mut self, message: &str) {
        eprintln!("{message}");
    }
}

impl afkit_export::Observer for Notes {
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

    /// A terminal that keeps what indicatif drew.
    #[derive(Debug, Default, Clone)]
    struct Screen(std::sync::Arc<Mutex<String>>);

    impl TermLike for Screen {
        fn width(&self) -> u16 {
            200
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
            self.write_str(s)
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What a bar at `pos` of 46, its clock at 100 s, shows when its rate counts from `since`
    /// (re-keyed, as when the pace changes), its rate in `unit`.
    fn drawn_in(pos: u64, since: Since, unit: &RateUnit) -> String {
        let screen = Screen::default();
        let pb = ProgressBar::with_draw_target(
            Some(46),
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
        )
        .with_position(pos)
        .with_elapsed(Duration::from_secs(100));
        // Keyed afresh as `Lines::restart_rate` does: the last keys count.
        pb.set_style(style(
            "{pos}/{len} ({rate}, {left})",
            Since::default(),
            unit,
        ));
        pb.set_style(rate_keys(pb.style(), since, unit));
        // Abandoning draws at once and keeps the position.
        pb.abandon();
        let line = screen.0.lock().unwrap().trim().to_string();
        line
    }

    /// `drawn_in` on a bar of its own.
    fn drawn(pos: u64, since: Since) -> String {
        drawn_in(pos, since, &RateUnit::default())
    }

    #[test]
    fn a_resumed_bar_counts_only_its_own_units_in_the_rate() {
        assert_eq!(drawn(36, Since::default()), "36/46 (2.8 s each, ETA 28s)");
        let resumed = Since {
            done: 26,
            elapsed: Duration::ZERO,
        };
        assert_eq!(drawn(36, resumed), "36/46 (10 s each, ETA 2m)");
        assert_eq!(
            drawn(26, resumed),
            "26/46 (rate not known yet, ETA not known yet)"
        );
        // A pace that changed at 60 s and 30 units: 6 units in the last 40 s.
        let new_pace = Since {
            done: 30,
            elapsed: Duration::from_secs(60),
        };
        assert_eq!(drawn(36, new_pace), "36/46 (6.7 s each, ETA 67s)");
    }

    #[test]
    fn one_bar_keeps_the_unit_of_its_first_rate() {
        let fast = RateUnit::default();
        assert_eq!(fast.show(2.5), "2.5/s");
        assert_eq!(fast.show(0.25), "0.25/s", "slower, still per second");
        let slow = RateUnit::default();
        assert_eq!(slow.show(0.1), "10 s each");
        assert_eq!(slow.show(4.0), "0.25 s each", "faster, still seconds each");
        // The pace changes at 60 s and 30 units: the bar keeps its unit.
        let unit = RateUnit::default();
        assert_eq!(
            drawn_in(36, Since::default(), &unit),
            "36/46 (2.8 s each, ETA 28s)"
        );
        let new_pace = Since {
            done: 30,
            elapsed: Duration::from_secs(60),
        };
        assert_eq!(drawn_in(36, new_pace, &unit), "36/46 (6.7 s each, ETA 67s)");
    }
}
