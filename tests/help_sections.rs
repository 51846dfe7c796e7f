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

/// The subcommands a help text lists under "Commands:" (`help` left out).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(String::from)
        .collect()
}

/// Every command path, the top level first: `[]`, `["init"]`, ..., `["lm", "adapt"]`, ...
fn every_command() -> Vec<Vec<String>> {
    let mut found = vec![vec![]];
    let mut next = 0;
    while next < found.len() {
        let path = found[next].clone();
        next += 1;
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        for name in subcommands(&ok(&args)) {
            let mut child = path.clone();
            child.push(name);
            found.push(child);
        }
    }
    found
}

/// What a benchmark figure in prose looks like: a range of accuracies, a speed or a duration on
/// some machine. Defaults (`[default: 0.003]`) do not match.
fn carries_a_measurement(line: &str) -> bool {
    let accuracy_range = line
        .split(|c: char| c.is_whitespace() || c == '(' || c == ',')
        .any(|word| {
            let parts: Vec<&str> = word.split(['-', '–']).collect();
            parts.len() == 2
                && parts
                    .iter()
                    .all(|p| p.starts_with("0.") && p[2..].chars().all(|c| c.is_ascii_digit()))
                && parts.iter().all(|p| p.len() > 2)
        });
    accuracy_range
        || [
            "endings a second",
            "minutes an iteration",
            " on 2 cores",
            " GB for ",
        ]
        .iter()
        .any(|figure| line.contains(figure))
}

#[test]
fn every_help_fits_a_screen_with_short_lines_and_no_figures() {
    let commands = every_command();
    for expected in [
        vec!["lm", "adapt"],
        vec!["crowd", "export"],
        vec!["models", "fetch"],
    ] {
        assert!(
            commands.contains(&expected.iter().map(|s| s.to_string()).collect()),
            "{expected:?} not found among {commands:?}"
        );
    }
    let mut problems = Vec::new();
    for command in &commands {
        let args: Vec<&str> = command.iter().map(String::as_str).collect();
        for flag in ["-h", "--help"] {
            let help = ok(&[args.as_slice(), &[flag]].concat());
            let lines = help.lines().count();
            if flag == "-h" && lines > 25 {
                problems.push(format!("afkit {} -h: {lines} lines", command.join(" ")));
            }
            for line in help.lines() {
                let chars = line.chars().count();
                if chars > 200 {
                    problems.push(format!(
                        "afkit {} {flag}: a line of {chars} characters: {line}",
                        command.join(" ")
                    ));
                }
                if carries_a_measurement(line) {
                    problems.push(format!(
                        "afkit {} {flag}: a measurement: {line}",
                        command.join(" ")
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_measurement_pattern_finds_figures_and_passes_defaults() {
    assert!(carries_a_measurement(
        "random distractors: 0.33-0.39 for style classifiers"
    ));
    assert!(carries_a_measurement("from 0.21–0.22 to 0.24–0.28"));
    assert!(carries_a_measurement(
        "with SmolLM2 on 2 cores about 30 endings a second"
    ));
    assert!(!carries_a_measurement(
        "AdamW learning rate [default: 0.003]"
    ));
    assert!(!carries_a_measurement(
        "Train,val,test fractions [default: 0.8,0.1,0.1]"
    ));
}

#[test]
fn audit_help_and_output_put_cv_first_as_the_figure_to_trust() {
    let long = ok(&["audit", "--help"]);
    let options = long.find("Options:").expect("an Options heading");
    let first_flag = long[options..]
        .lines()
        .nth(1)
        .expect("a first option")
        .trim_start();
    assert!(
        first_flag.starts_with("--cv"),
        "first option: {first_flag}\n{long}"
    );
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words(&long[..options]).contains("`--cv K` gives the figure to trust"),
        "{long}"
    );
    assert!(
        !long.contains("{\"cv\""),
        "the JSON layout belongs in docs/audit.md:\n{long}"
    );
    assert!(long.contains("docs/audit.md"), "{long}");
    let short = ok(&["audit", "-h"]);
    assert!(words(&short).contains("the figure to trust"), "{short}");
}
