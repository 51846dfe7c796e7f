//! The cross-validated audit (`afkit audit DIR --cv K`) end to end: it finds planted artifacts,
//! keeps every video in one fold, and reads a dataset directory the way an export writes it (an
//! unlabelled test.csv is skipped with a note). `cross_validate` itself is tested in its module.

use crate::common;

use std::path::Path;

use afkit_audit::fixtures::{planted_questions, PlantedQuestion};
use afkit_engine::seed::Seed;
use afkit_store::dataset::REGULAR_COLUMNS;
use common::afkit;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

/// Writes `qs` as a SWAG regular CSV; `labelled: false` leaves the label column empty, as an
/// export with a hidden test split does.
fn write_split(path: &Path, qs: &[PlantedQuestion], labelled: bool) {
    let mut w = csv::Writer::from_path(path).unwrap();
    w.write_record(REGULAR_COLUMNS).unwrap();
    for q in qs {
        let label = if labelled {
            q.label.to_string()
        } else {
            String::new()
        };
        let startphrase = format!("{} {}", q.sent1, q.sent2);
        let mut rec = vec![q.group.clone(), "0".into(), startphrase, q.sent1.clone()];
        rec.extend([q.sent2.clone(), "gold0-orig".into()]);
        rec.extend(q.endings.iter().cloned());
        rec.push(label);
        w.write_record(&rec).unwrap();
    }
    w.flush().unwrap();
}

#[test]
fn cli_cross_validates_the_labelled_splits_and_skips_an_unlabelled_test() {
    let dir = tempfile::tempdir().unwrap();
    let mut qs = planted_questions(90, 3, true, Seed::new(5));
    qs.shuffle(&mut ChaCha8Rng::seed_from_u64(6));
    write_split(&dir.path().join("train.csv"), &qs[..60], true);
    write_split(&dir.path().join("val.csv"), &qs[60..75], true);
    write_split(&dir.path().join("test.csv"), &qs[75..], false);
    let run = || {
        let d = dir.path().to_str().unwrap();
        let out = afkit(&[
            "audit",
            d,
            "--cv",
            "3",
            "--no-embed",
            "--json",
            "--seed",
            "9",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        (
            serde_json::from_slice::<Value>(&out.stdout).unwrap(),
            stderr,
        )
    };
    let (a, stderr) = run();
    assert!(stderr.contains("test.csv skipped"), "{stderr}");
    let cv = &a["cv"];
    assert_eq!(
        (cv["folds"].as_u64(), cv["questions"].as_u64()),
        (Some(3), Some(75))
    );
    assert_eq!(cv["fold_sizes"].as_array().unwrap().len(), 3);
    assert_eq!(a["files"][2]["skipped"], "no labels");
    assert_eq!(a["files"][1]["questions"], 15);
    let baselines = cv["baselines"].as_object().unwrap();
    for name in [
        "shortest",
        "longest",
        "ngram_s2",
        "ngram_ctx",
        "char_s2",
        "char_ctx",
    ] {
        let b = &baselines[name];
        let folds = b["folds"].as_array().unwrap();
        assert_eq!(folds.len(), 3, "{name}");
        let m = b["mean"].as_f64().unwrap();
        assert!(
            (0.0..=1.0).contains(&m) && b["se"].as_f64().unwrap() >= 0.0,
            "{name}: {b}"
        );
    }
    for name in ["ngram_end", "char_end"] {
        assert_eq!(baselines[name]["mean"], 1.0, "{name}");
        assert_eq!(baselines[name]["se"], 0.0, "{name}");
    }
    assert_eq!(baselines["minilm_s2"]["skipped"], "--no-embed");
    assert_eq!(baselines["finetune_minilm"]["skipped"], "--no-embed");
    for f in ["audit.md", "audit.json", "accuracy.png"] {
        assert!(dir.path().join("audit").join(f).exists(), "{f} missing");
    }
    let md = std::fs::read_to_string(dir.path().join("audit/audit.md")).unwrap();
    assert!(md.contains("| char_end |") && md.contains("test.csv (skipped: no labels)"));
    let timeless = |mut v: Value| {
        v.as_object_mut()
            .unwrap()
            .remove("timings")
            .expect("timings");
        v
    };
    assert_eq!(
        timeless(run().0),
        timeless(a),
        "same data and seed, same report"
    );
}

#[test]
fn cli_refuses_fewer_groups_than_folds() {
    let dir = tempfile::tempdir().unwrap();
    write_split(
        &dir.path().join("train.csv"),
        &planted_questions(6, 3, true, Seed::new(8)),
        true,
    );
    let out = afkit(&[
        "audit",
        dir.path().to_str().unwrap(),
        "--cv",
        "3",
        "--no-embed",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cv 3") && err.contains("train.csv") && err.contains("at least 3 groups"),
        "{err}"
    );
    assert!(err.contains("found 2 in 6 questions"), "{err}");
    assert!(
        err.contains("use --cv 2"),
        "the error names the folds that work: {err}"
    );
}

/// Audits `qs` as one labelled train split with `audit --cv 2`; returns the JSON report.
fn cv_audit(qs: &[PlantedQuestion]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    write_split(&dir.path().join("train.csv"), qs, true);
    let d = dir.path().to_str().unwrap();
    let out = afkit(&["audit", d, "--cv", "2", "--no-embed", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn verdict(report: &Value, family: &str) -> String {
    let verdicts = report["verdicts"].as_array().unwrap();
    let v = verdicts.iter().find(|v| v["family"] == family).unwrap();
    v["text"].as_str().unwrap().to_string()
}

#[test]
fn sixteen_questions_are_too_few_to_tell_not_at_chance() {
    let report = cv_audit(&planted_questions(16, 2, false, Seed::new(3)));
    for family in ["style", "relational"] {
        let text = verdict(&report, family);
        assert!(
            text.starts_with("too few questions to tell"),
            "{family}: {text}"
        );
    }
    for row in report["summary"].as_array().unwrap() {
        let off = (row["mean"].as_f64().unwrap() - 0.25).abs() > 2.0 * row["se"].as_f64().unwrap();
        assert_eq!(row["standing"] == "too_few_to_tell", !off, "{row}");
    }
}

#[test]
fn a_fixed_rule_far_below_chance_is_flagged_and_never_said_to_learn() {
    // The real ending is never the shortest: it carries one more word than it would.
    let mut qs = planted_questions(120, 3, false, Seed::new(4));
    for q in &mut qs {
        let label = q.label;
        let longest = q.endings.iter().map(String::len).max().unwrap();
        while q.endings[label].len() <= longest {
            q.endings[label] = q.endings[label].replace('.', " again.");
        }
    }
    let report = cv_audit(&qs);
    let text = verdict(&report, "style");
    let flagged = text
        .split("; ")
        .find(|part| part.starts_with("shortest "))
        .unwrap_or_else(|| panic!("shortest is not flagged: {text}"));
    assert!(
        flagged.contains("points below chance: the real ending is rarely the shortest")
            && !flagged.contains("learned"),
        "{flagged}"
    );
    let shortest = report["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "shortest")
        .unwrap();
    assert_eq!(shortest["standing"], "below_chance");
}
