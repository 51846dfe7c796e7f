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
