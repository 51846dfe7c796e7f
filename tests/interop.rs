//! An export loads where people load benchmarks and comes back in: Hugging Face `datasets` and
//! lm-evaluation-harness read it (with the real libraries, in a virtual environment made once
//! per target directory; skipped with the reason when Python or the package index is out of
//! reach), `ingest` reads its JSONL and HellaSwag's, and `score` reads the harness's samples and
//! Hugging Face-style predictions.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{afkit, example_texts, ok, read, unverified_project};
use serde_json::Value;

/// Pinned, so the checks run against the versions they were written for.
const DATASETS: &str = "datasets==5.2.0";
const LM_EVAL: &str = "lm-eval==0.4.13";
/// What the harness imports to build task requests. It is installed without its dependencies,
/// which pull in torch and the model backends (gigabytes) that building requests never uses.
const LM_EVAL_IMPORTS: [&str; 4] = ["jinja2", "sacrebleu", "pyyaml", "requests"];

fn export(project: &str, out: &Path, extra: &[&str]) {
    let mut args = vec!["export", project, "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    ok(&args);
}

/// Runs `python -m pip install ARGS` in the environment; Err carries pip's last words.
fn pip(python: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--retries", "1", "--timeout", "30"])
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
    Err(format!(
        "pip install {}: {}",
        args.join(" "),
        tail.join(" | ")
    ))
}

/// The environment's Python, made on first use. The tests that need it are ignored when the tests
/// were built without python3's venv or with AFKIT_TEST_OFFLINE set; any other failure fails.
fn python() -> PathBuf {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("interop-python");
            let python = venv.join("bin").join("python");
            let ready = venv.join("installed.txt");
            let wanted = format!("{DATASETS} {LM_EVAL} {}", LM_EVAL_IMPORTS.join(" "));
            if std::fs::read_to_string(&ready).is_ok_and(|s| s == wanted) {
                return Ok(python);
            }
            let made = Command::new("python3")
                .args(["-m", "venv", "--clear"])
                .arg(&venv)
                .output();
            if !made.is_ok_and(|o| o.status.success()) {
                return Err("`python3 -m venv` failed".into());
            }
            let installed = pip(&python, &[DATASETS])
                .and_then(|_| pip(&python, &["--no-deps", LM_EVAL]))
                .and_then(|_| pip(&python, &LM_EVAL_IMPORTS));
            installed.map(|()| {
                std::fs::write(&ready, wanted).unwrap();
                python
            })
        })
        .clone()
        .unwrap_or_else(|why| {
            panic!("cannot install the Python packages ({why}); set AFKIT_TEST_OFFLINE=1 to skip")
        })
}

/// Runs a check script of tests/python on an export folder, offline, with its own caches.
fn run_check(python: &Path, script: &str, folder: &Path) {
    let cache = tempfile::tempdir().unwrap();
    run_check_in(python, script, folder, cache.path());
}

/// Runs a check script of tests/python on an export folder, offline, with the caches in `cache`
/// (shared between calls, as a user's are).
fn run_check_in(python: &Path, script: &str, folder: &Path, cache: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let out = Command::new(python)
        .arg(&script)
        .arg(folder)
        .env("HF_HOME", cache)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} on {}:\n{stdout}\n{}",
        script.display(),
        folder.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{stdout}");
}

#[test]
#[cfg_attr(
    any(not(has_python_venv), offline),
    ignore = "needs python3 with venv and downloads from pip (not allowed by AFKIT_TEST_OFFLINE)"
)]
fn datasets_loads_every_configuration_row_by_row() {
    let p = unverified_project(12);
    let dir = tempfile::tempdir().unwrap();
    let (published, internal) = (dir.path().join("pub"), dir.path().join("int"));
    export(p.p(), &published, &[]);
    export(p.p(), &internal, &["--with-test-labels"]);
    let python = python();
    run_check(&python, "check_datasets.py", &published);
    run_check(&python, "check_datasets.py", &internal);
}

/// What a user meets: export, load, assemble differently and export again into the same folder,
/// load again with the same cache; then another project's export in a folder of the same name.
/// Each load must give the rows of the files on disk, never a cached earlier export.
#[test]
#[cfg_attr(
    any(not(has_python_venv), offline),
    ignore = "needs python3 with venv and downloads from pip (not allowed by AFKIT_TEST_OFFLINE)"
)]
fn datasets_never_loads_a_previous_export_from_its_cache() {
    let p = unverified_project(12);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hf-cache");
    let out = dir.path().join("first").join("dataset");
    let python = python();
    export(p.p(), &out, &[]);
    run_check_in(&python, "check_datasets.py", &out, &cache);
    p.assemble(&["--unverified", "--seed", "2", "--split", "0.6,0.2,0.2"]);
    export(p.p(), &out, &[]);
    run_check_in(&python, "check_datasets.py", &out, &cache);
    export(p.p(), &out, &["--seed", "3"]);
    run_check_in(&python, "check_datasets.py", &out, &cache);
    let other = unverified_project(9);
    let other_out = dir.path().join("second").join("dataset");
    export(other.p(), &other_out, &[]);
    run_check_in(&python, "check_datasets.py", &other_out, &cache);
}

/// A split the user asked to be empty (`--split 0.9,0.1,0`) has no files, and the folder loads.
#[test]
#[cfg_attr(
    any(not(has_python_venv), offline),
    ignore = "needs python3 with venv and downloads from pip (not allowed by AFKIT_TEST_OFFLINE)"
)]
fn datasets_loads_an_export_without_a_test_split() {
    let p = unverified_project(8);
    p.assemble(&["--unverified", "--seed", "1", "--split", "0.8,0.2,0"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dataset");
    export(p.p(), &out, &["--with-test-labels"]);
    assert!(!out.join("test.csv").exists());
    run_check(&python(), "check_datasets.py", &out);
}

#[test]
#[cfg_attr(
    any(not(has_python_venv), offline),
    ignore = "needs python3 with venv and downloads from pip (not allowed by AFKIT_TEST_OFFLINE)"
)]
fn lm_eval_builds_every_request_of_both_tasks() {
    let p = unverified_project(12);
    let dir = tempfile::tempdir().unwrap();
    let (published, internal) = (dir.path().join("pub"), dir.path().join("int"));
    export(p.p(), &published, &[]);
    export(p.p(), &internal, &["--with-test-labels"]);
    let swag = String::from_utf8(read(&published.join("lm_eval/afkit_swag.yaml"))).unwrap();
    assert!(swag.contains("test_split: null\n"), "{swag}");
    let swag = String::from_utf8(read(&internal.join("lm_eval/afkit_swag.yaml"))).unwrap();
    assert!(swag.contains("test_split: test\n"), "{swag}");
    let python = python();
    run_check(&python, "check_lm_eval.py", &published);
    run_check(&python, "check_lm_eval.py", &internal);
}

/// Every file of an export folder, by path relative to it.
fn folder_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let name = path.strip_prefix(dir).unwrap().display().to_string();
                files.push((name, read(&path)));
            }
        }
    }
    files.sort();
    files
}

fn ext_ids(path: &Path) -> Vec<String> {
    let mut ids: Vec<String> = afkit_store::Store::open(path)
        .unwrap()
        .examples()
        .unwrap()
        .into_iter()
        .map(|e| e.ext_id)
        .collect();
    ids.sort();
    ids
}

#[test]
fn jsonl_export_ingests_back_and_re_exports_byte_identical() {
    let p = unverified_project(12);
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first");
    export(p.p(), &first, &["--with-test-labels"]);
    let jsonl: Vec<String> = ["train", "val", "test"]
        .iter()
        .map(|s| first.join(format!("jsonl/{s}.jsonl")).display().to_string())
        .collect();
    let ingest = |project: &str| {
        let mut args = vec!["ingest", project, "--format", "jsonl", "--json"];
        args.extend(jsonl.iter().map(String::as_str));
        serde_json::from_str::<Value>(&ok(&args)).unwrap()
    };
    // Into a new project: the same examples under the same ids.
    let back = dir.path().join("back.sqlite");
    ok(&["init", back.to_str().unwrap()]);
    let summary = ingest(back.to_str().unwrap());
    assert_eq!(summary["kept"], 24, "{summary}");
    assert_eq!(example_texts(&back), example_texts(&p.path));
    assert_eq!(ext_ids(&back), ext_ids(&p.path));
    // Into its own project: nothing new, and the next export is the same, byte for byte.
    let summary = ingest(p.p());
    assert_eq!(summary["already_present"], 24, "{summary}");
    let second = dir.path().join("second");
    export(p.p(), &second, &["--with-test-labels"]);
    assert_eq!(folder_files(&first), folder_files(&second));
}

#[test]
fn a_published_test_split_does_not_ingest_and_says_where_the_answers_are() {
    let p = unverified_project(6);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pub");
    export(p.p(), &out, &[]);
    let back = dir.path().join("back.sqlite");
    ok(&["init", back.to_str().unwrap()]);
    let test = out.join("jsonl/test.jsonl");
    let run = afkit(&[
        "ingest",
        back.to_str().unwrap(),
        "--format",
        "jsonl",
        test.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("test.jsonl:1: the label is withheld") && stderr.contains("test-answers"),
        "{stderr}"
    );
    assert!(example_texts(&back).is_empty());
    let answers = dir.path().join("pub-test-answers.csv");
    ok(&[
        "ingest",
        back.to_str().unwrap(),
        "--format",
        "swag-csv",
        answers.to_str().unwrap(),
    ]);
    assert!(!example_texts(&back).is_empty());
}

#[test]
fn hellaswag_jsonl_ingests_with_its_own_field_names() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hellaswag_val.jsonl");
    let line = |ind: u32, label: &str| {
        serde_json::json!({
            "ind": ind,
            "activity_label": "Removing ice from car",
            "ctx_a": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles.",
            "ctx_b": "then",
            "ctx": "Then, the man writes over the snow covering the window of a car, and a woman wearing winter clothes smiles. then",
            "endings": [", the man adds wax to the windshield and cuts it.", ", a person board a ski lift, while two men supporting the head of the person wearing winter clothes snow as the we girls sled.", ", the man puts on a christmas coat, knitted with netting.", ", the man continues removing the snow on his car."],
            "source_id": "activitynet~v_-1IBHYS3L-Y",
            "split": "val",
            "split_type": "indomain",
            "label": label
        })
        .to_string()
    };
    std::fs::write(&file, format!("{}\n{}\n", line(24, "3"), line(25, ""))).unwrap();
    let project = dir.path().join("p.sqlite");
    ok(&["init", project.to_str().unwrap()]);
    let ingest = |path: &Path| {
        afkit(&[
            "ingest",
            project.to_str().unwrap(),
            "--format",
            "jsonl",
            path.to_str().unwrap(),
        ])
    };
    let run = ingest(&file);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("hellaswag_val.jsonl:2: the label is withheld"),
        "{stderr}"
    );
    assert!(example_texts(&project).is_empty(), "nothing half-written");
    std::fs::write(&file, format!("{}\n", line(24, "3"))).unwrap();
    assert!(ingest(&file).status.success());
    let examples = afkit_store::Store::open(&project)
        .unwrap()
        .examples()
        .unwrap();
    assert_eq!(examples.len(), 1);
    let e = &examples[0];
    assert_eq!(e.ext_id, "24");
    assert_eq!(e.group, "activitynet~v_-1IBHYS3L-Y");
    assert!(e.sent1.starts_with("Then, the man writes"));
    assert_eq!(e.sent2, "then");
    assert_eq!(
        e.ending,
        ", the man continues removing the snow on his car."
    );
}

/// A labelled split of four questions with endings of different lengths, as afkit writes it.
fn labelled_split(dir: &Path) -> PathBuf {
    let split = dir.join("val.csv");
    std::fs::write(
        &split,
        ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n\
         0,a,0,x y,x,y,unverified,a,bbbb,cc,dddddddd,0\n\
         1,b,0,x y,x,y,unverified,a,bbbb,cc,dddddddd,3\n\
         2,c,0,x y,x,y,unverified,a,bbbb,cc,dddddddd,1\n\
         3,d,0,x y,x,y,unverified,a,bbbb,cc,dddddddd,2\n",
    )
    .unwrap();
    split
}

fn accuracy(split: &Path, predictions: &Path, extra: &[&str]) -> f64 {
    let mut args = vec![
        "score",
        split.to_str().unwrap(),
        predictions.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let s: Value = serde_json::from_str(&ok(&args)).unwrap();
    s["accuracy"].as_f64().unwrap()
}

/// One harness sample line for row `doc_id` of [`labelled_split`], as `--log_samples` writes it.
fn harness_sample(doc_id: usize, label: usize, lls: [f64; 4]) -> String {
    let endings = ["a", "bbbb", "cc", "dddddddd"];
    serde_json::json!({
        "doc_id": doc_id,
        "doc": {"startphrase": "x y", "ending0": endings[0], "ending1": endings[1],
                "ending2": endings[2], "ending3": endings[3], "label": label},
        "target": label,
        "arguments": endings.iter().map(|e| ["x y".to_string(), format!(" {e}")]).collect::<Vec<_>>(),
        "resps": lls.iter().map(|l| [[l.to_string(), "False".to_string()]]).collect::<Vec<_>>(),
        "filtered_resps": lls.iter().map(|l| [l.to_string(), "False".to_string()]).collect::<Vec<_>>(),
        "filter": "none",
        "metrics": ["acc", "acc_norm"],
    })
    .to_string()
}

#[test]
fn score_reads_harness_samples_and_hugging_face_predictions() {
    let dir = tempfile::tempdir().unwrap();
    let split = labelled_split(dir.path());
    let file = dir.path().join("preds");
    // Harness samples, out of order. By total log-likelihood rows 0, 1 and 2 are right; per
    // character of the ending (lengths 1, 4, 2, 8) rows 1 and 3.
    let samples = [
        harness_sample(3, 2, [-3.0, -20.0, -4.0, -30.0]),
        harness_sample(0, 0, [-1.0, -2.0, -9.0, -20.0]),
        harness_sample(1, 3, [-9.0, -9.0, -9.0, -3.0]),
        harness_sample(2, 1, [-9.0, -2.0, -9.0, -3.0]),
    ];
    std::fs::write(&file, samples.join("\n")).unwrap();
    assert_eq!(accuracy(&split, &file, &[]), 0.75);
    assert_eq!(accuracy(&split, &file, &["--norm"]), 0.5);
    // Samples of another split are refused.
    let other = samples[1].replace("\"ending0\":\"a\"", "\"ending0\":\"z\"");
    std::fs::write(
        &file,
        [other.as_str(), &samples[0], &samples[2], &samples[3]].join("\n"),
    )
    .unwrap();
    let run = afkit(&["score", split.to_str().unwrap(), file.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&run.stderr).contains("line 1: the endings of doc_id 0 differ"));
    // Hugging Face Trainer.predict output: labels or logits, in order.
    std::fs::write(
        &file,
        r#"{"predictions": [[0.9, 0.1, 0.0, 0.0], 3, "1", [0, 0, 0, 1]]}"#,
    )
    .unwrap();
    assert_eq!(accuracy(&split, &file, &[]), 0.75);
    // JSON Lines with idx and prediction; a plain file with a header.
    std::fs::write(
        &file,
        "{\"idx\": 2, \"prediction\": 1}\n{\"idx\": 0, \"prediction\": 0}\n{\"idx\": 3, \"prediction\": 2}\n{\"idx\": 1, \"prediction\": 0}\n",
    )
    .unwrap();
    assert_eq!(accuracy(&split, &file, &[]), 0.75);
    std::fs::write(&file, "pred\n0\n3\n1\n1\n").unwrap();
    assert_eq!(accuracy(&split, &file, &[]), 0.75);
    let run = afkit(&[
        "score",
        split.to_str().unwrap(),
        file.to_str().unwrap(),
        "--norm",
    ]);
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("--norm needs lm-evaluation-harness samples")
    );
}
