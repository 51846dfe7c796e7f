//! The audit against language models and a control (`afkit audit DIR --lm MODEL --control
//! DIR2`): the zero-shot rows equal the engine's own multiple-choice scoring of the same
//! questions, the control sits beside every row with the difference, the report says a verdict
//! per family; and, where lm-evaluation-harness is installed, afkit's `acc` equals the harness's
//! on the same export and model, question by question.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use afkit_engine::lm::choice::{ChoiceQuestion, ChoiceScorer, OptionScores};
use afkit_engine::lm::model::LanguageModel;
use afkit_store::dataset::startphrase;
use common::{command, ok, run_ok, tiny_gguf, unverified_project};
use serde_json::Value;

const PEOPLE: [&str; 4] = ["A man", "The girl", "Two kids", "A woman"];
const ACTS: [&str; 5] = [
    "paints a fence",
    "rides a bike",
    "plays the drums",
    "throws a ball",
    "washes a car",
];

/// A SWAG-format directory: `n` questions, two to a video, in train.csv and val.csv. In the
/// control, the three wrong endings come from other questions' acts at random.
fn write_dataset(dir: &Path, n: usize, control: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let row = |i: usize| -> Vec<String> {
        let person = PEOPLE[i % 4];
        let act = ACTS[i % 5];
        let label = i % 4;
        let endings: Vec<String> = (0..4)
            .map(|o| {
                if o == label {
                    format!("{} again and smiles.", act.split(' ').next().unwrap())
                } else if control {
                    format!("{} in the rain.", ACTS[(i * 7 + o * 3) % 5])
                } else {
                    format!("{} slowly.", ACTS[(i + o) % 5])
                }
            })
            .collect();
        let (sent1, sent2) = (format!("{person} {act}."), "Then the person".to_string());
        let mut r = vec![
            format!("vid{}", i / 2),
            startphrase(&sent1, &sent2),
            sent1,
            sent2,
        ];
        r.extend(endings);
        r.push(label.to_string());
        r
    };
    for (file, range) in [("train.csv", 0..n / 2), ("val.csv", n / 2..n)] {
        let mut w = csv::Writer::from_path(dir.join(file)).unwrap();
        w.write_record([
            "video-id",
            "startphrase",
            "sent1",
            "sent2",
            "ending0",
            "ending1",
            "ending2",
            "ending3",
            "label",
        ])
        .unwrap();
        for i in range {
            w.write_record(row(i)).unwrap();
        }
    }
}

/// What a model reads before each ending.
#[derive(Clone, Copy)]
enum Posed {
    /// The startphrase, as the harness poses the export's SWAG-style task.
    WithContext,
    /// Nothing: the zero-prompt check.
    EndingsAlone,
}

/// The engine's own scores of a labelled split's questions (read from the CSV by column name),
/// posed as the harness poses them or with the endings alone, and the labels.
fn engine_scores(model: &Path, split: &Path, posed: Posed) -> (Vec<OptionScores>, Vec<usize>) {
    let mut reader = csv::Reader::from_path(split).unwrap();
    let headers = reader.headers().unwrap().clone();
    let (mut contexts, mut endings, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    for record in reader.records() {
        let record = record.unwrap();
        let field = |name: &str| {
            let column = headers.iter().position(|h| h == name).unwrap();
            record[column].to_string()
        };
        contexts.push(match posed {
            Posed::WithContext => startphrase(&field("sent1"), &field("sent2")),
            Posed::EndingsAlone => String::new(),
        });
        endings.push(["ending0", "ending1", "ending2", "ending3"].map(field));
        labels.push(field("label").parse().unwrap());
    }
    let questions: Vec<ChoiceQuestion> = contexts
        .iter()
        .zip(&endings)
        .map(|(context, options)| ChoiceQuestion { context, options })
        .collect();
    let model = LanguageModel::load(model).unwrap();
    let scorer = ChoiceScorer::new(&model).unwrap();
    (scorer.score_all(&questions, &|| ()).unwrap(), labels)
}

/// The engine's `acc` and `acc_norm` over the train and val questions of `dir`.
fn engine_accuracies(model: &Path, dir: &Path, posed: Posed) -> (f64, f64) {
    let mut scores = engine_scores(model, &dir.join("train.csv"), posed);
    let val = engine_scores(model, &dir.join("val.csv"), posed);
    scores.0.extend(val.0);
    scores.1.extend(val.1);
    (
        share(scores.0.iter().map(OptionScores::pick), &scores.1),
        share(scores.0.iter().map(OptionScores::pick_per_char), &scores.1),
    )
}

fn share(picks: impl Iterator<Item = usize>, labels: &[usize]) -> f64 {
    picks.zip(labels).filter(|(p, l)| p == *l).count() as f64 / labels.len() as f64
}

/// The zero-shot row of the tiny model on the dataset at `af`: every labelled question (train
/// and val pooled), scored as the engine scores it, with and without the context.
fn check_lm_row(lm: &Value, model: &Path, af: &Path) {
    assert_eq!(
        (lm["model"].as_str(), lm["questions"].as_u64()),
        (Some("tiny"), Some(24))
    );
    let (acc, acc_norm) = engine_accuracies(model, af, Posed::WithContext);
    assert_eq!(lm["acc"].as_f64(), Some(acc));
    assert_eq!(lm["acc_norm"].as_f64(), Some(acc_norm));
    // The zero-prompt check: the same endings read after nothing.
    let (alone, alone_norm) = engine_accuracies(model, af, Posed::EndingsAlone);
    assert_eq!(lm["acc_no_context"].as_f64(), Some(alone));
    assert_eq!(lm["acc_norm_no_context"].as_f64(), Some(alone_norm));
    let se = (acc * (1.0 - acc) / 23.0).sqrt();
    assert!((lm["acc_se"].as_f64().unwrap() - se).abs() < 1e-12);
}

/// Every measured row of a `--cv --lm --control` audit has the control's beside it, and the
/// difference; the control has its own LM row, and every family gets a verdict.
fn check_control_and_verdicts(json: &Value) {
    let summary = json["summary"].as_array().unwrap();
    let names: Vec<&str> = summary
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for name in [
        "ngram_end",
        "relational",
        "lm:tiny:acc",
        "lm:tiny:acc_norm",
        "lm:tiny:acc_no_context",
        "lm:tiny:acc_norm_no_context",
    ] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    for row in summary {
        let (mean, ctl) = (row["mean"].as_f64().unwrap(), &row["control"]["mean"]);
        let diff = mean - ctl.as_f64().unwrap();
        assert!(
            (row["difference"].as_f64().unwrap() - diff).abs() < 1e-12,
            "{row}"
        );
    }
    assert_eq!(json["control"]["lm"][0]["questions"], 24);
    let families: Vec<&str> = json["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["family"].as_str().unwrap())
        .collect();
    assert_eq!(
        families,
        [
            "style",
            "relational",
            "LM zero-shot",
            "LM without the context",
            "fine-tuned"
        ]
    );
}

#[test]
fn cli_reports_zero_shot_rows_the_control_beside_them_and_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let (af, control) = (dir.path().join("af"), dir.path().join("control"));
    write_dataset(&af, 24, false);
    write_dataset(&control, 24, true);
    let model = tiny_gguf(dir.path(), 32, 1);
    let m = model.to_str().unwrap();
    let (a, c) = (af.to_str().unwrap(), control.to_str().unwrap());
    let audit = [
        "audit",
        a,
        "--cv",
        "3",
        "--no-embed",
        "--lm",
        m,
        "--control",
        c,
    ];
    let json: Value = serde_json::from_str(&ok(&[&audit[..], &["--json"]].concat())).unwrap();
    check_lm_row(&json["lm"][0], &model, &af);
    check_control_and_verdicts(&json);
    let md = std::fs::read_to_string(af.join("audit/audit.md")).unwrap();
    for part in [
        "## Language models, zero-shot",
        "## Against the control",
        "## Verdicts",
        "| lm:tiny:acc |",
        "| acc without the context |",
    ] {
        assert!(md.contains(part), "audit.md has no {part:?}:\n{md}");
    }
    assert!(af.join("audit/control/audit.json").exists());
    // The printed table: both columns, the difference, the verdicts.
    let text = ok(&audit);
    assert!(
        text.contains("control") && text.contains("lm:tiny:acc_norm"),
        "{text}"
    );
    assert!(text.contains("verdicts:\n  style: "), "{text}");
}

#[test]
fn holdout_audit_scores_val_with_the_model_and_names_bad_models() {
    let dir = tempfile::tempdir().unwrap();
    let af = dir.path().join("af");
    write_dataset(&af, 16, false);
    let model = tiny_gguf(dir.path(), 32, 1);
    let json: Value = serde_json::from_str(&ok(&[
        "audit",
        af.to_str().unwrap(),
        "--no-knn",
        "--lm",
        model.to_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    let (scores, labels) = engine_scores(&model, &af.join("val.csv"), Posed::WithContext);
    assert_eq!(json["lm"][0]["questions"], 8);
    let acc = share(scores.iter().map(OptionScores::pick), &labels);
    assert_eq!(json["lm"][0]["acc"].as_f64(), Some(acc));
    assert_eq!(
        json["verdicts"][1]["text"],
        "not measured (it runs under --cv)"
    );
    // The printed table says which figure to trust.
    let text = ok(&["audit", af.to_str().unwrap(), "--no-knn"]);
    assert!(
        text.contains(&format!(
            "`afkit audit {} --cv 5` gives the figure to trust",
            af.display()
        )),
        "{text}"
    );
    let missing = dir.path().join("no-such.gguf");
    let err = common::fails(&[
        "audit",
        af.to_str().unwrap(),
        "--lm",
        missing.to_str().unwrap(),
    ]);
    assert!(
        err.contains("--lm") && err.contains("no-such.gguf"),
        "{err}"
    );
}

/// The python that has lm-evaluation-harness with its Hugging Face backend, from
/// `AFKIT_LM_EVAL_PYTHON`.
fn harness_python() -> PathBuf {
    let python = std::env::var_os("AFKIT_LM_EVAL_PYTHON")
        .expect("set AFKIT_LM_EVAL_PYTHON to a python with lm-eval, transformers, torch and gguf");
    let has = Command::new(&python)
        .args(["-c", "import lm_eval, transformers, torch, gguf"])
        .output();
    assert!(
        has.is_ok_and(|o| o.status.success()),
        "{python:?} cannot import lm_eval, transformers, torch and gguf"
    );
    PathBuf::from(python)
}

/// The harness's per-question log-likelihoods of the four endings, by doc_id.
fn harness_loglikelihoods(samples: &Path) -> Vec<Vec<f64>> {
    let text = std::fs::read_to_string(samples).unwrap();
    let mut rows: Vec<(u64, Vec<f64>)> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let lls = v["filtered_resps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| match &r[0] {
                    Value::String(s) => s.parse().unwrap(),
                    n => n.as_f64().unwrap(),
                })
                .collect();
            (v["doc_id"].as_u64().unwrap(), lls)
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    rows.into_iter().map(|r| r.1).collect()
}

fn find_samples(dir: &Path) -> PathBuf {
    for entry in walk(dir) {
        let name = entry.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("samples_afkit_swag") && name.ends_with(".jsonl") {
            return entry;
        }
    }
    panic!(
        "the harness wrote no samples_afkit_swag_*.jsonl under {}",
        dir.display()
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Runs the harness's `hf` backend on `model` with the export's `afkit_swag` task, offline,
/// its files under `work`; the per-question log-likelihoods it logged.
fn run_harness(python: &Path, model: &Path, export: &Path, work: &Path) -> Vec<Vec<f64>> {
    let out = work.join("harness");
    let model_args = format!(
        "pretrained={},gguf_file={},dtype=float32",
        model.parent().unwrap().display(),
        model.file_name().unwrap().to_string_lossy()
    );
    let run = Command::new(python)
        .current_dir(export)
        .args([
            "-m",
            "lm_eval",
            "--model",
            "hf",
            "--model_args",
            &model_args,
        ])
        .args([
            "--include_path",
            "lm_eval",
            "--tasks",
            "afkit_swag",
            "--device",
            "cpu",
        ])
        .args(["--batch_size", "4", "--log_samples", "--output_path"])
        .arg(&out)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HOME", work.join("hf"))
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "lm_eval failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    harness_loglikelihoods(&find_samples(&out))
}

/// The harness's `hf` backend loads the same GGUF (dequantised to f32, as afkit's engine does)
/// and runs the export's `afkit_swag` task; afkit's predictions must be the harness's on every
/// question. Log-likelihoods agree to 2e-3 nats per ending: the two sides add the same f32
/// products in different orders (afkit's packed kernels, torch's BLAS). The export is a small
/// project's, or the dataset folder in `AFKIT_LM_EVAL_DATASET` (train.csv, a labelled val.csv
/// and lm_eval/afkit_swag.yaml evaluating val).
#[test]
#[ignore = "needs lm-evaluation-harness: AFKIT_LM_EVAL_PYTHON=PYTHON cargo test --release -- --ignored acc_equals_the_harness"]
fn acc_equals_the_harness_on_the_same_export_and_model() {
    let python = harness_python();
    afkit_engine::models::DefaultModel::SmolLm2
        .ensure()
        .expect("fetch SmolLM2");
    let model = afkit_engine::models::DefaultModel::smollm2_gguf();
    let dir = tempfile::tempdir().unwrap();
    let export = match std::env::var_os("AFKIT_LM_EVAL_DATASET") {
        Some(given) => PathBuf::from(given),
        None => {
            let p = unverified_project(12);
            let export = dir.path().join("export");
            ok(&["export", p.p(), "--out", export.to_str().unwrap()]);
            export
        }
    };
    let harness = run_harness(&python, &model, &export, dir.path());
    // No test labels in the export: the harness evaluates the validation split.
    let (ours, labels) = engine_scores(&model, &export.join("val.csv"), Posed::WithContext);
    assert_eq!(harness.len(), ours.len());
    assert!(!ours.is_empty());
    let mut largest = 0f64;
    for (q, (theirs, mine)) in harness.iter().zip(&ours).enumerate() {
        for (a, b) in theirs.iter().zip(&mine.loglikelihood) {
            assert!(
                (a - b).abs() < 2e-3,
                "question {q}: harness {theirs:?}, afkit {mine:?}"
            );
            largest = largest.max((a - b).abs());
        }
        assert_eq!(
            first_max_of(theirs),
            mine.pick(),
            "question {q}: {theirs:?} vs {mine:?}"
        );
    }
    // And the audit's acc is the harness's acc on that split.
    let audited: Value = serde_json::from_str(&run_ok(
        command()
            .args([
                "audit",
                export.to_str().unwrap(),
                "--no-knn",
                "--json",
                "--lm",
            ])
            .arg(&model),
    ))
    .unwrap();
    let harness_acc = share(harness.iter().map(|v| first_max_of(v)), &labels);
    assert_eq!(audited["lm"][0]["acc"].as_f64(), Some(harness_acc));
    eprintln!(
        "{} questions: the same prediction on each, acc {harness_acc:.4}; largest \
         log-likelihood difference {largest:.2e}",
        ours.len()
    );
}

/// The first largest value's index, as numpy's argmax gives it.
fn first_max_of(v: &[f64]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}
