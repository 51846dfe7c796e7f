//! Progress when stderr is not a terminal (a log file, a pipe, CI): plain lines with done/total,
//! rate and ETA, every `AFKIT_PROGRESS_EVERY` seconds, from the steps that take long.

use crate::common;

use std::process::Command;

use common::{arg, command, jsonl_project, stderr, tiny_gguf};

/// afkit with progress on, its stderr a pipe, a line at every redraw.
fn with_progress_lines() -> Command {
    let mut cmd = command();
    cmd.env_remove("AFKIT_NO_PROGRESS")
        .env("AFKIT_PROGRESS_EVERY", "0.001");
    cmd
}

/// The plain progress lines of `err` about `unit`: "DONE/TOTAL UNIT (RATE, ETA ..., ... so far)".
fn progress_lines<'a>(err: &'a str, unit: &str) -> Vec<&'a str> {
    err.lines()
        .filter(|l| {
            l.split_once(' ').is_some_and(|(count, rest)| {
                count.split_once('/').is_some_and(|(done, total)| {
                    done.parse::<u64>().is_ok() && total.parse::<u64>().is_ok()
                }) && rest.starts_with(&format!("{unit} ("))
            }) && l.contains("ETA")
                && l.contains("so far")
        })
        .collect()
}

#[test]
fn lm_adapt_and_generate_print_progress_lines_to_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 2);
    let p = jsonl_project(dir.path(), 12);

    let out = with_progress_lines()
        .args(["lm", "adapt", arg(&p), "--model", arg(&model)])
        .args(["--layers", "1", "--rank", "2", "--seq-len", "16"])
        .args(["--epochs", "2", "--folds", "2", "--seed", "1"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let steps = progress_lines(&err, "steps");
    assert!(!steps.is_empty(), "no progress lines for the steps:\n{err}");
    // Which epochs show depends on the clock: redraws are rate-limited, and a fast machine
    // trains the whole second epoch between two of them.
    assert!(
        steps
            .iter()
            .any(|l| l.contains("epoch 1/2, training loss")
                || l.contains("epoch 2/2, training loss")),
        "the epoch is not shown:\n{err}"
    );
    assert!(!err.contains('\r'), "terminal control in a pipe:\n{err:?}");

    let out = with_progress_lines()
        .args(["generate", arg(&p), "--model", arg(&model), "--no-adapters"])
        .args(["--n-neg", "4", "--max-tokens", "12", "--seed", "3"])
        .arg("--no-ending-rules")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let endings = progress_lines(&err, "endings");
    assert!(
        endings.iter().any(|l| l.contains("/48 endings")),
        "no progress lines over 12 contexts × 4 endings:\n{err}"
    );
    assert!(endings.iter().any(|l| l.contains("contexts done")), "{err}");
    // Whichever lines the clock let through: the bar is full only with every context done.
    for line in &endings {
        if line.starts_with("48/48 endings") {
            assert!(line.contains("12/12 contexts done"), "{line}");
        }
    }
    assert_one_rate_unit(&endings);
}

/// The lines of one bar (lm adapt draws one per fold) give its rate in one unit: per second or seconds each, never both.
fn assert_one_rate_unit(lines: &[&str]) {
    let per_second = lines.iter().filter(|l| l.contains("/s, ")).count();
    let seconds_each = lines.iter().filter(|l| l.contains(" s each, ")).count();
    assert!(
        per_second == 0 || seconds_each == 0,
        "two rate units in one bar:\n{}",
        lines.join("\n")
    );
}

#[test]
fn no_progress_lines_when_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let p = jsonl_project(dir.path(), 12);
    let out = command()
        .env("AFKIT_PROGRESS_EVERY", "0.001")
        .args(["generate", arg(&p), "--model", arg(&model), "--no-adapters"])
        .args(["--n-neg", "2", "--max-tokens", "8", "--no-ending-rules"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(progress_lines(&err, "endings").is_empty(), "{err}");
}
