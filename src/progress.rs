//! Progress bars for long stages, drawn on stderr only when it is a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar counting `len` units of `unit` (e.g. "contexts"), with rate and ETA.
pub fn bar(len: u64, unit: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{{spinner}} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} ({{per_sec}}, ETA {{eta}}) {{msg}}"
        ))
        .expect("valid template"),
    );
    if std::env::var_os("AFKIT_NO_PROGRESS").is_some() {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb
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
