//! Ctrl-C handling: the first Ctrl-C asks the running stage to stop after its current unit of
//! work (a file, a context, an iteration), which it has committed or rolled back whole.
//! A second Ctrl-C exits at once; the SQLite transaction in flight is rolled back by SQLite.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The error a stage returns when it stopped because of Ctrl-C.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by Ctrl-C")]
pub struct Interrupted;

pub fn install_handler() {
    let _ = ctrlc::set_handler(|| {
        if REQUESTED.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\nstopping after the current step (Ctrl-C again to quit now)");
    });
}

/// Returns `Err(Interrupted)` once Ctrl-C was pressed; call between units of work.
pub fn check() -> Result<(), Interrupted> {
    if REQUESTED.load(Ordering::SeqCst) {
        Err(Interrupted)
    } else {
        Ok(())
    }
}
