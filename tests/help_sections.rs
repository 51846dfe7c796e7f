//! The help texts: long commands group their flags under headings, most used first; `-h` is a
//! short summary and `--help` the whole text; the top-level help names the whole pipeline.

use crate::common;

use common::ok;

/// Where each of `needles` first occurs in `text`, failing on one that is missing.
fn positions(text: &str, needles: &[&str]) -> Vec<usize> {
    needles
        .iter()
        .map(|n| {
            text.find(n)
                .unwrap_or_else(|| panic!("{n:?} missing from:\n{text}"))
        })
        .collect()
}

#[test]
fn generate_groups_its_flags_under_headings_most_used_first() {
    let help = ok(&["generate", "--help"]);
    let at = positions(
        &help,
        &[
            "What to generate:",
            "\n      --n-neg",
            "\n      --limit",
            "\n      --seed",
            "Sampling:",
            "\n      --temperature",
            "Server (--backend openai):",
            "\n      --backend",
            "\n      --endpoint",
            "Output:",
            "\n      --json",
        ],
    );
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "out of order: {at:?}\n{help}"
    );
}

#[test]
fn filter_export_and_audit_have_headings() {
    for (command, headings) in [
        (
            vec!["filter", "--help"],
            vec![
                "The run:",
                "Training the classifiers:",
                "Models in the ensemble:",
                "Device:",
            ],
        ),
        (vec!["export", "--help"], vec!["Options:", "Publishing:"]),
        (
            vec!["audit", "--help"],
            vec!["Options:", "Baselines:", "Embedding cache:"],
        ),
    ] {
        let help = ok(&command);
        let at = positions(&help, &headings);
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "{command:?}: {at:?}\n{help}"
        );
    }
}

#[test]
fn short_help_is_shorter_than_long_help() {
    for command in [
        vec!["generate"],
        vec!["filter"],
        vec!["export"],
        vec!["audit"],
        vec!["assemble"],
        vec!["lm", "adapt"],
        vec!["ingest"],
        vec![],
    ] {
        let short = ok(&[command.as_slice(), &["-h"]].concat());
        let long = ok(&[command.as_slice(), &["--help"]].concat());
        assert!(
            short.len() < long.len(),
            "{command:?}: -h ({} bytes) is not shorter than --help ({} bytes)",
            short.len(),
            long.len()
        );
    }
    let short = ok(&["generate", "-h"]);
    assert!(short.contains("\n      --n-neg"), "{short}");
    assert!(
        !short.contains("\n      --endpoint"),
        "server flags belong to --help:\n{short}"
    );
}

#[test]
fn long_descriptions_reach_help() {
    for (command, text) in [
        ("ingest", "activitynet: ActivityNet Captions JSON"),
        ("export", "The folder is ready to publish"),
        ("annotate", "as SWAG's human verification did"),
    ] {
        let long = ok(&[command, "--help"]);
        assert!(
            long.contains(text),
            "{command} --help lacks {text:?}:\n{long}"
        );
        let short = ok(&[command, "-h"]);
        assert!(
            !short.contains(text),
            "{command} -h should be the summary:\n{short}"
        );
    }
}

#[test]
fn the_top_level_help_names_lm_adapt_in_the_pipeline() {
    let help = ok(&["--help"]);
    assert!(
        help.contains("ingest → lm adapt → generate"),
        "the pipeline leaves out lm adapt:\n{help}"
    );
}
