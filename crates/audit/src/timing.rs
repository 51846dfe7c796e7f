//! How long each baseline family (and each `--lm` model) of an audit took. Shown in the report
//! and kept in `audit.json` under `timings`; the only part of an audit that differs between two
//! runs on the same data.

use std::time::Instant;

use serde::Serialize;

/// Seconds one baseline family or language model took (`lm:NAME` for a model).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Timing {
    pub name: String,
    pub seconds: f64,
}

/// Runs `work`, adding its seconds to `timings` under `name` (summed with an earlier entry of
/// that name).
pub(crate) fn timed<T>(timings: &mut Vec<Timing>, name: &str, work: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = work();
    add(timings, name, started.elapsed().as_secs_f64());
    out
}

/// Adds `seconds` to the entry `name`, or appends one.
pub(crate) fn add(timings: &mut Vec<Timing>, name: &str, seconds: f64) {
    match timings.iter_mut().find(|t| t.name == name) {
        Some(t) => t.seconds += seconds,
        None => timings.push(Timing {
            name: name.to_string(),
            seconds,
        }),
    }
}
