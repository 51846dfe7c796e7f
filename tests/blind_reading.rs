//! The blind-reading protocol (`scripts/blind_sheet.py`, `scripts/blind_score.py`,
//! `scripts/blind_signals.py`) on real exports of one project: the AF export and its
//! random-negative control.

use std::path::Path;
use std::process::Command;

use crate::common::{csv_table, ok, unverified_project, Project};

fn python(script: &str, args: &[&str]) -> (bool, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("scripts").join(script))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn write(path: &Path, text: &str) -> String {
    std::fs::write(path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// The answers of a reader who always finds the real ending, marks one AF question's wrong
/// ending as also plausible and one control question's wrong ending as broken, with how many
/// of each were marked.
fn reader_answers(questions: &[serde_json::Value]) -> (String, usize, usize) {
    let mut answers = String::from("question,pick,also_plausible,ungrammatical\n");
    let (mut marked_af, mut marked_control) = (false, false);
    let (mut second, mut broken) = (0, 0);
    for q in questions {
        let real = q["answer"].as_str().unwrap();
        let wrong = ["A", "B", "C", "D"]
            .into_iter()
            .find(|l| *l != real)
            .unwrap();
        let (also, bad) = match q["source"].as_str().unwrap() {
            "af" if !marked_af => {
                marked_af = true;
                second += 1;
                (wrong, "")
            }
            "control" if !marked_control => {
                marked_control = true;
                broken += 1;
                ("", wrong)
            }
            _ => ("", ""),
        };
        answers.push_str(&format!("{},{real},{also},{bad}\n", q["question"]));
    }
    (answers, second, broken)
}

/// A project's AF export and control in `dir` (`af`, `control`) and a sheet of 6 + 6 of their
/// questions at `dir/blind`: (project, af, control, prefix, the key's questions).
fn exported_sheet(dir: &Path) -> (Project, String, String, String, Vec<serde_json::Value>) {
    let p = unverified_project(12);
    let path = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let (af, control, prefix) = (path("af"), path("control"), path("blind"));
    ok(&["export", p.p(), "--out", &af]);
    ok(&["export", p.p(), "--out", &control, "--negatives", "random"]);
    let (done, text) = python("blind_sheet.py", &[&af, &control, &prefix, "--n", "13"]);
    assert!(
        !done && text.contains("share 24 labelled contexts; 26 are needed"),
        "{text}"
    );
    let (done, text) = python("blind_sheet.py", &[&af, &control, &prefix, "--n", "6"]);
    assert!(done, "{text}");
    let key: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{prefix}.key.json")).unwrap())
            .unwrap();
    let questions = key["questions"].as_array().unwrap().clone();
    (p, af, control, prefix, questions)
}

#[test]
#[cfg_attr(not(has_python3), ignore = "needs python3 on PATH")]
fn a_mixed_sheet_keeps_the_key_apart_and_scores_a_reader() {
    let dir = tempfile::tempdir().unwrap();
    let (_project, _, _, prefix, questions) = exported_sheet(dir.path());
    let questions = &questions;
    let sheet = std::fs::read_to_string(format!("{prefix}.sheet.md")).unwrap();
    assert_eq!(questions.len(), 12);
    let from_af = questions.iter().filter(|q| q["source"] == "af").count();
    assert_eq!(from_af, 6, "half from each export");
    assert!(!sheet.contains("\"af\"") && !sheet.contains("control") && !sheet.contains("label"));
    // Each context once: a context shown from both exports would give its real ending away.
    let contexts: Vec<&str> = sheet.lines().filter(|l| l.ends_with(" …")).collect();
    let distinct: std::collections::BTreeSet<&&str> = contexts.iter().collect();
    assert_eq!((contexts.len(), distinct.len()), (12, 12), "{sheet}");

    let (answers, second, broken) = reader_answers(questions);
    let answers = write(&dir.path().join("answers.csv"), &answers);
    let key_path = format!("{prefix}.key.json");
    let (done, table) = python("blind_score.py", &[&key_path, &answers]);
    assert!(done, "{table}");
    assert!(table.contains("| reader's accuracy | 6/6 (100%"), "{table}");
    assert_eq!((second, broken), (1, 1));
    assert!(
        table.contains("| a second plausible ending | 1/6 (17%"),
        "{table}"
    );
    assert!(
        table.contains("wrong ending | 0/6 (0%") && table.contains("| 1/6 (17%"),
        "{table}"
    );
    // Each export has one question with a flaw: the one to drop.
    assert!(
        table.contains("| a question to drop (any of the three) | 1/6 (17%, 3–56%) | 1/6 (17%"),
        "{table}"
    );

    // A letter outside A-D is refused with its line.
    let bad = write(
        &dir.path().join("bad.csv"),
        "question,pick,also_plausible,ungrammatical\n1,E,,\n",
    );
    let (done, text) = python("blind_score.py", &[&key_path, &bad]);
    assert!(!done && text.contains("bad.csv:2: pick holds E"), "{text}");
}

/// The reader's marks joined to the project's stored signals: every wrong ending on the sheet,
/// counted per export and together, and the judged questions written out for a scoring model.
#[test]
#[cfg_attr(not(has_python3), ignore = "needs python3 on PATH")]
fn a_reading_is_joined_to_the_stored_signals() {
    let dir = tempfile::tempdir().unwrap();
    let (project, af, control, prefix, questions) = exported_sheet(dir.path());
    let (answers, _, _) = reader_answers(&questions);
    write(Path::new(&format!("{prefix}.answers.csv")), &answers);

    let (done, text) = python("blind_signals.py", &[&prefix]);
    assert!(!done && text.contains("cannot tell its project"), "{text}");

    let scoring = dir.path().join("scoring.json");
    let (af_project, control_project) = (
        format!("--project={af}={}", project.p()),
        format!("--project={control}={}", project.p()),
    );
    let args = [
        prefix.as_str(),
        &af_project,
        &control_project,
        "--scoring-input",
        scoring.to_str().unwrap(),
    ];
    let (done, report) = python("blind_signals.py", &args);
    assert!(done, "{report}");
    assert!(
        report.contains(&format!(
            "## {af}: 18 judged wrong endings, 0 broken, 1 plausible"
        )),
        "{report}"
    );
    assert!(
        report.contains(&format!(
            "## {control}: 18 judged wrong endings, 1 broken, 0 plausible"
        )),
        "{report}"
    );
    assert!(
        report.contains("## every export together: 36 judged wrong endings, 1 broken, 1 plausible"),
        "{report}"
    );
    // The fixtures store one log-probability per ending, the same for every candidate: no
    // information. Nothing else is stored, so no other signal is listed.
    assert!(report.contains("| gen_cond | – | 0.50 |"), "{report}");
    assert!(!report.contains("scorer_cond"), "{report}");

    let items: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&scoring).unwrap()).unwrap();
    assert_eq!(items.len(), 12, "one per context on the sheet");
    for item in &items {
        let options = item["options"].as_array().unwrap();
        assert_eq!(options.len(), 4, "{item}");
        assert!(options[0]
            .as_str()
            .unwrap()
            .starts_with("sits down at table"));
    }
}

/// `export_subset.py` cuts an export to the contexts of another, or by gold-source, split by
/// split and with each _full.csv row for row; a ragged file is refused and nothing is written.
#[test]
#[cfg_attr(not(has_python3), ignore = "needs python3 on PATH")]
fn an_export_is_cut_to_the_contexts_of_another() {
    let dir = tempfile::tempdir().unwrap();
    let p = unverified_project(12);
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (af, control) = (path("af"), path("control"));
    ok(&["export", p.p(), "--out", &af, "--with-test-labels"]);
    ok(&["export", p.p(), "--out", &control, "--negatives", "random"]);
    let (done, text) = python(
        "export_subset.py",
        &[&af, &path("all"), "--gold-source", "^unverified$"],
    );
    assert!(done && text.contains("wrote 24 questions"), "{text}");
    let (done, text) = python(
        "export_subset.py",
        &[&af, &path("none"), "--gold-source", "reannot"],
    );
    assert!(done && text.contains("wrote 0 questions"), "{text}");
    assert!(
        csv_table(&dir.path().join("none/train_full.csv"))
            .1
            .is_empty(),
        "the header alone"
    );

    // One context in `one`: the control cut like it keeps that context's question only.
    let (header, train) = csv_table(&dir.path().join("af/train.csv"));
    std::fs::create_dir(path("one")).unwrap();
    for split in ["train", "val", "test"] {
        let mut writer =
            csv::Writer::from_path(dir.path().join(format!("one/{split}.csv"))).unwrap();
        writer.write_record(&header).unwrap();
        if split == "train" {
            writer.write_record(&train[0]).unwrap();
        }
    }
    let (done, text) = python(
        "export_subset.py",
        &[&control, &path("like"), "--like", &path("one")],
    );
    assert!(done && text.contains("wrote 1 questions"), "{text}");
    let kept: Vec<(Vec<String>, Vec<String>)> = ["train", "val", "test"]
        .iter()
        .flat_map(|s| {
            let (header, rows) = csv_table(&dir.path().join(format!("like/{s}.csv")));
            rows.into_iter().map(move |row| (header.clone(), row))
        })
        .collect();
    let context = |header: &[String], row: &[String]| {
        let at = |name: &str| row[header.iter().position(|h| h == name).unwrap()].clone();
        (at("sent1"), at("sent2"))
    };
    assert_eq!(kept.len(), 1);
    assert_eq!(context(&kept[0].0, &kept[0].1), context(&header, &train[0]));

    // A ragged row: its file and line, and no folder.
    let mut ragged = std::fs::read_to_string(dir.path().join("af/val.csv")).unwrap();
    ragged.push_str("1,2\n");
    std::fs::write(dir.path().join("af/val.csv"), &ragged).unwrap();
    let (done, text) = python("export_subset.py", &[&af, &path("bad"), "--like", &control]);
    let line = ragged.lines().count();
    assert!(
        !done && text.contains(&format!("val.csv:{line}: 2 fields")),
        "{text}"
    );
    assert!(!dir.path().join("bad").exists());
}

/// Two readings of one export's questions, compared question by question: every shared
/// question has the same four endings, and each side's marks are counted apart.
#[test]
#[cfg_attr(not(has_python3), ignore = "needs python3 on PATH")]
fn two_readings_are_compared_on_the_questions_they_share() {
    let dir = tempfile::tempdir().unwrap();
    let (_project, af, control, first, questions) = exported_sheet(dir.path());
    let second = dir.path().join("again").to_str().unwrap().to_string();
    let (done, text) = python(
        "blind_sheet.py",
        &[&af, &control, &second, "--n", "6", "--seed", "2"],
    );
    assert!(done, "{text}");
    // The first reader marks a wrong ending of every question plausible, the second none.
    let mut strict = String::from("question,pick,also_plausible,ungrammatical\n");
    for q in &questions {
        let real = q["answer"].as_str().unwrap();
        let wrong = ["A", "B", "C", "D"]
            .into_iter()
            .find(|l| *l != real)
            .unwrap();
        strict.push_str(&format!("{},{real},{wrong},\n", q["question"]));
    }
    write(&dir.path().join("strict.csv"), &strict);
    let key: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{second}.key.json")).unwrap())
            .unwrap();
    let mut lenient = String::from("question,pick,also_plausible,ungrammatical\n");
    for q in key["questions"].as_array().unwrap() {
        lenient.push_str(&format!(
            "{},{},,\n",
            q["question"],
            q["answer"].as_str().unwrap()
        ));
    }
    write(&dir.path().join("lenient.csv"), &lenient);
    let a = format!("{first}:{}", dir.path().join("strict.csv").display());
    let b = format!("{second}:{}", dir.path().join("lenient.csv").display());
    let (done, text) = python("blind_paired.py", &["--a", &a, "--b", &b]);
    assert!(done, "{text}");
    let shared = |line: &str| -> usize {
        line.split(": ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let same = text.lines().next().unwrap();
    let n = shared(same);
    assert!(n > 0, "{text}");
    assert!(
        same.ends_with(&format!("found by A's reader {n}, by B's reader 0")),
        "{text}"
    );
    assert!(text.contains("other wrong answers: 0 pairs"), "{text}");
}
