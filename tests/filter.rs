//! End-to-end tests of `afkit filter` and `afkit report` on synthetic pools.
//!
//! The pools are written straight into the project file (the generate stage is not needed): each
//! context gets a gold ending and candidates, some of which carry a planted stylistic tell.

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use afkit_engine::seed::Seed;
use afkit_store::af::{HeadAccuracy, Phase};
use afkit_store::examples::NewExample;
use afkit_store::fixtures::Fixtures;
use afkit_store::Store;
use common::{afkit, arg, command, query_i64, run_ok, stderr};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rusqlite::{params, Connection};

const VERBS: [&str; 12] = [
    "holds", "throws", "paints", "lifts", "cleans", "kicks", "carries", "cuts", "pushes", "opens",
    "washes", "drops",
];
const NOUNS: [&str; 12] = [
    "ball", "rope", "board", "brush", "bucket", "knife", "door", "window", "bike", "cup", "net",
    "pan",
];
const PLACES: [&str; 6] = [
    "in the yard",
    "on the table",
    "near the wall",
    "across the room",
    "by the pool",
    "with both hands",
];
/// The planted artifact: generated endings that carry it start with this word.
const TELL: &str = "suddenly";

/// A synthetic pool: `contexts` contexts with `candidates` generated endings each, of which
/// `clean` look exactly like found endings and the rest carry the tell.
#[derive(Debug, Clone, Copy)]
struct PoolSpec {
    contexts: usize,
    candidates: usize,
    clean: usize,
    seed: Seed,
}

fn plain_ending(rng: &mut ChaCha8Rng) -> String {
    format!(
        "{} the {} {}.",
        VERBS[rng.random_range(0..VERBS.len())],
        NOUNS[rng.random_range(0..NOUNS.len())],
        PLACES[rng.random_range(0..PLACES.len())]
    )
}

/// Creates a project holding the synthetic pool; returns its path.
fn build_project(dir: &Path, name: &str, spec: PoolSpec) -> PathBuf {
    build_project_with(dir, name, spec, |rng, _| {
        let gold = plain_ending(rng);
        let mut texts = BTreeSet::new();
        texts.insert(gold.clone());
        let mut endings = Vec::new();
        while endings.len() < spec.candidates {
            let plain = plain_ending(rng);
            let text = if endings.len() < spec.clean {
                plain
            } else {
                format!("{TELL} {plain}")
            };
            if texts.insert(text.clone()) {
                endings.push(text);
            }
        }
        (gold, endings)
    })
}

/// The sent1 and sent2 of context `i` of a synthetic pool.
fn synthetic_context(i: usize) -> (String, String) {
    let subjects = [
        "The man",
        "A woman",
        "Then, the boy",
        "The girl",
        "He",
        "She",
    ];
    (
        "A person stands outside on a sunny day.".into(),
        subjects[i % subjects.len()].into(),
    )
}

/// A project whose context `i` has the gold ending and candidates `endings(rng, i)` gives.
fn build_project_with(
    dir: &Path,
    name: &str,
    spec: PoolSpec,
    mut endings_of: impl FnMut(&mut ChaCha8Rng, usize) -> (String, Vec<String>),
) -> PathBuf {
    let path = dir.join(name);
    drop(Store::create(&path).unwrap());
    let mut conn = Connection::open(&path).unwrap();
    let tx = conn.transaction().unwrap();
    let origin = synthetic_origin(&tx, spec);
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed.value());
    for i in 0..spec.contexts {
        let (gold, endings) = endings_of(&mut rng, i);
        insert_pool(&tx, origin, i, (&gold, &endings), &mut rng);
    }
    tx.commit().unwrap();
    path
}

/// Where a synthetic pool comes from: its source and its (imported) generation.
#[derive(Clone, Copy)]
struct Origin {
    source: i64,
    generation: i64,
}

fn synthetic_origin(conn: &Connection, spec: PoolSpec) -> Origin {
    let source = Fixtures::on(conn)
        .upsert_source("synthetic", "jsonl", &format!("{spec:?}"), "{}")
        .unwrap();
    conn.execute(
        "INSERT INTO generations(backend, model, prompt, params, seed, started_at)
         VALUES ('import', 'synthetic', 'none', '{}', 0, '2026-01-01T00:00:00Z')",
        [],
    )
    .unwrap();
    Origin {
        source,
        generation: conn.last_insert_rowid(),
    }
}

/// Context `i` with its gold ending and its complete pool of `endings`, each with LM features
/// drawn from `rng` around plausible values.
fn insert_pool(
    conn: &Connection,
    origin: Origin,
    i: usize,
    (gold, endings): (&str, &[String]),
    rng: &mut ChaCha8Rng,
) {
    let example_id = insert_context(conn, origin, i, gold);
    let (a, b, c, n) = lm_features(rng, gold);
    conn.execute(
        "UPDATE endings SET lp_cond = ?2, lp_alone = ?3, lp_final_punct = ?4, n_tok_ending = ?5
         WHERE example_id = ?1 AND is_gold = 1",
        params![example_id, a, b, c, n],
    )
    .unwrap();
    for text in endings {
        let (a, b, c, n) = lm_features(rng, text);
        conn.execute(
            "INSERT INTO endings(example_id, text, is_gold, generation_id, lp_cond, lp_alone,
                                 lp_final_punct, n_tok_ending)
             VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7)",
            params![example_id, text, origin.generation, a, b, c, n],
        )
        .unwrap();
    }
    conn.execute(
        "INSERT INTO pools(example_id, generation_id, requested, produced, ctx_logprob,
                           n_tok_sent1, n_tok_sent2, seconds, finished_at)
         VALUES (?1, ?2, ?3, ?3, ?4, 9, 2, 0.0, '2026-01-01T00:00:00Z')",
        params![
            example_id,
            origin.generation,
            endings.len() as i64,
            -2.5 + rng.random_range(-0.5..0.5)
        ],
    )
    .unwrap();
}

/// Ingests context `i` (three contexts to a video) with its gold ending; returns its id.
fn insert_context(conn: &Connection, origin: Origin, i: usize, gold: &str) -> i64 {
    let (sent1, sent2) = synthetic_context(i);
    let ex = NewExample {
        ext_id: format!("v{}#{i}", i / 3),
        group: format!("v{}", i / 3),
        sent1,
        sent2,
        ending: gold.to_string(),
        gold_source: None,
    };
    assert!(Fixtures::on(conn)
        .insert_example(origin.source, &ex)
        .unwrap());
    conn.query_row(
        "SELECT id FROM examples WHERE ext_id = ?1",
        [&ex.ext_id],
        |r| r.get(0),
    )
    .unwrap()
}

/// An ending's (lp_cond, lp_alone, lp_final_punct, n_tok_ending): noise around typical values.
fn lm_features(rng: &mut ChaCha8Rng, text: &str) -> (f64, f64, f64, i64) {
    let n = text.split_whitespace().count() as i64 + 1;
    (
        -3.0 + rng.random_range(-1.0..1.0),
        -4.0 + rng.random_range(-1.0..1.0),
        -0.5 + rng.random_range(-0.3..0.3),
        n,
    )
}

/// Small models and few epochs so each test takes seconds.
const SMALL: [&str; 8] = [
    "--hidden",
    "16",
    "--word-dim",
    "16",
    "--mlp-epochs",
    "5",
    "--batch-contexts",
    "16",
];

/// A quick MLP-only run (k = 4, two iterations): for tests of what a run records, not of
/// what it finds.
const MLP_ONLY: [&str; 6] = [
    "--k",
    "4",
    "--mlp-iterations",
    "2",
    "--ensemble-iterations",
    "0",
];

fn filter_args(project: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["filter".to_string(), project.display().to_string()];
    args.extend(SMALL.iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    // No default model (the scorer, the fine-tuned adversary, the fluency reader): the tests that need one
    // name a tiny one.
    if !extra.contains(&"--scorer") {
        args.push("--no-scorer".to_string());
    }
    if !extra.contains(&"--discriminator") {
        args.extend(["--discriminator".to_string(), "none".to_string()]);
    }
    if !extra.contains(&"--fluency-reader") {
        args.extend(["--fluency-reader".to_string(), "none".to_string()]);
    }
    args
}

/// Everything a run stored, minus wall-clock times.
#[derive(Debug, PartialEq)]
struct RunState {
    iterations: Vec<(usize, Phase, usize, usize, HeadAccuracy)>,
    swaps: Vec<(usize, afkit_store::af::Swap)>,
    assignment: BTreeMap<i64, Vec<i64>>,
    scores: BTreeMap<i64, f64>,
    folds: BTreeMap<i64, usize>,
    finished: bool,
}

/// The settings the latest AF run recorded (`af_runs.params`).
fn latest_run_params(project: &Path) -> serde_json::Value {
    let conn = Connection::open(project).unwrap();
    let text: String = conn
        .query_row(
            "SELECT params FROM af_runs ORDER BY id DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

fn run_state(project: &Path) -> RunState {
    let store = Store::open(project).unwrap();
    let run = store.latest_af_run().unwrap().expect("a run");
    RunState {
        iterations: store
            .af_iterations(run.id)
            .unwrap()
            .into_iter()
            .map(|r| (r.iteration, r.phase, r.swaps, r.n_test, r.accuracy))
            .collect(),
        swaps: swaps_of(project, run.id),
        assignment: store.af_assignment(run.id).unwrap(),
        scores: store.af_scores(run.id).unwrap(),
        folds: store.af_folds(run.id).unwrap(),
        finished: run.finished_at.is_some(),
    }
}

/// Every swap of AF run `run_id`, with the iteration that made it, in order.
fn swaps_of(project: &Path, run_id: i64) -> Vec<(usize, afkit_store::af::Swap)> {
    Connection::open(project)
        .unwrap()
        .prepare(
            "SELECT iteration, example_id, slot, old_ending_id, new_ending_id FROM af_swaps
             WHERE run_id = ?1 ORDER BY rowid",
        )
        .unwrap()
        .query_map([run_id], |r| {
            Ok((
                r.get::<_, i64>(0)? as usize,
                afkit_store::af::Swap {
                    example_id: r.get(1)?,
                    slot: r.get::<_, i64>(2)? as usize,
                    old_ending_id: r.get(3)?,
                    new_ending_id: r.get(4)?,
                },
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// (final scores, of which with a sentence model score, of which with a style score) of the
/// latest run.
fn sentence_scored(project: &Path) -> (i64, i64, i64) {
    let conn = Connection::open(project).unwrap();
    conn.query_row(
        "SELECT COUNT(*), COUNT(sentence_score), COUNT(style_score) FROM af_scores
         WHERE run_id = (SELECT MAX(id) FROM af_runs)",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .unwrap()
}

/// Checks the final pass's scores beside the ensemble's, `endings` of them over `contexts`: the
/// sentence model's for every ending, the word-level heads' style scores only where those heads
/// still find the real endings, above chance by two standard errors.
fn final_scores_kept(project: &Path, contexts: usize, endings: i64, chance: f64) {
    let (scored, with_sentence, with_style) = sentence_scored(project);
    assert_eq!(
        (scored, with_sentence),
        (endings, endings),
        "the final pass keeps the sentence model's score of every ending beside the ensemble's"
    );
    let heads = Store::open(project)
        .unwrap()
        .latest_af_run()
        .unwrap()
        .unwrap()
        .final_accuracy
        .unwrap();
    let words = [heads.bow, heads.cnn, heads.lstm, heads.subword].map(Option::unwrap);
    let words = words.iter().sum::<f64>() / 4.0;
    let found_style = words > chance + 2.0 * (chance * (1.0 - chance) / contexts as f64).sqrt();
    assert_eq!(
        with_style,
        if found_style { endings } else { 0 },
        "word-level heads at {words}"
    );
}

fn tell_fraction(project: &Path) -> f64 {
    let conn = Connection::open(project).unwrap();
    conn.query_row(
        "SELECT AVG(e.text LIKE 'suddenly %') FROM af_assignments a JOIN endings e ON e.id = a.ending_id
         WHERE a.run_id = (SELECT MAX(id) FROM af_runs)",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn planted_tell_is_found_at_first_and_filtered_away() {
    let dir = tempfile::tempdir().unwrap();
    let spec = PoolSpec {
        contexts: 300,
        candidates: 16,
        clean: 6,
        seed: Seed::new(11),
    };
    let project = build_project(dir.path(), "planted.sqlite", spec);
    let out = run_ok(command().args(filter_args(
        &project,
        &[
            "--k",
            "4",
            "--mlp-iterations",
            "1",
            "--ensemble-iterations",
            "12",
            "--n-easy",
            "4",
            "--ensemble-epochs",
            "4",
            "--seed",
            "3",
        ],
    )));
    assert!(out.contains("iteration    0 mlp"), "live lines: {out}");
    let report_dir = dir.path().join("report");
    let ensemble = ensemble_accuracy_in_report(&project, &report_dir);
    let chance: f64 = 1.0 / 5.0;
    final_scores_kept(&project, 300, 300 * 17, chance);
    // ~1.9 of 4 initial negatives are clean: a model that spots the tell solves about 40% of
    // contexts, twice chance.
    assert!(
        ensemble[0] > chance + 0.12,
        "the ensemble must find the tell at first: {ensemble:?}"
    );
    let last = *ensemble.last().unwrap();
    assert!(
        last < ensemble[0] - 0.08,
        "AF must lower held-out accuracy: {ensemble:?}"
    );
    let state = run_state(&project);
    assert!(state.finished);
    let store = Store::open(&project).unwrap();
    let run = store.latest_af_run().unwrap().unwrap();
    let final_acc = run.final_accuracy.unwrap().ensemble.unwrap();
    assert!(
        final_acc < chance + 0.1,
        "cross-fitted accuracy after AF should be near chance: {final_acc}"
    );
    // Initially 10 of 16 candidates carry the tell (62.5%); AF swaps them out.
    let tell = tell_fraction(&project);
    assert!(
        tell < 0.3,
        "assigned negatives still carrying the tell: {tell}"
    );
    // Every context has a fold and a score for its gold and each of its 16 pool endings.
    assert_eq!(state.folds.len(), spec.contexts);
    assert_eq!(state.scores.len(), spec.contexts * (spec.candidates + 1));

    let png = std::fs::read(report_dir.join("af_accuracy.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let md = std::fs::read_to_string(report_dir.join("report.md")).unwrap();
    assert!(md.contains("| iteration | phase |"), "{md}");
    assert!(md.contains("final cross-fitted pass"), "{md}");
}

/// Runs `afkit report --json` into `report_dir` and checks the JSON's documented shape (an MLP
/// iteration first, without text models; every ensemble iteration with each model's accuracy);
/// returns the ensemble's held-out accuracy in each ensemble iteration.
fn ensemble_accuracy_in_report(project: &Path, report_dir: &Path) -> Vec<f64> {
    let json = run_ok(command().args([
        "report",
        &project.display().to_string(),
        "--out",
        &report_dir.display().to_string(),
        "--json",
    ]));
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let iterations = value["iterations"].as_array().unwrap();
    assert_eq!(
        value.as_object().unwrap().len(),
        1,
        "exactly the documented object"
    );
    let first = &iterations[0];
    assert_eq!(first["phase"], "mlp");
    assert!(
        first["accuracy"]["cnn"].is_null(),
        "MLP-only iterations train no text model"
    );
    let keys: BTreeSet<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from(["iteration", "phase", "swaps", "seconds", "accuracy"])
    );
    let ensemble_iterations = iterations.iter().filter(|r| r["phase"] == "ensemble");
    for r in ensemble_iterations.clone() {
        for head in ["bow", "cnn", "lstm", "subword", "sentence"] {
            assert!(
                r["accuracy"][head].is_f64(),
                "every model of the ensemble reports its accuracy: {r}"
            );
        }
    }
    ensemble_iterations
        .map(|r| r["accuracy"]["ensemble"].as_f64().unwrap())
        .collect()
}

/// Starts `afkit filter` with `flags` and kills it (SIGKILL) once `iterations` are stored.
fn kill_after_iterations(project: &Path, flags: &[&str], iterations: usize) {
    let mut child = command()
        .args(filter_args(project, flags))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while count_iterations(project) < iterations && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

fn count_iterations(project: &Path) -> usize {
    let Ok(conn) = Connection::open(project) else {
        return 0;
    };
    conn.query_row("SELECT COUNT(*) FROM af_iterations", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_or(0, |n| n as usize)
}

#[test]
fn killed_run_resumes_to_the_same_final_state() {
    let dir = tempfile::tempdir().unwrap();
    let spec = PoolSpec {
        contexts: 120,
        candidates: 10,
        clean: 4,
        seed: Seed::new(5),
    };
    let flags = [
        "--k",
        "4",
        "--mlp-iterations",
        "3",
        "--ensemble-iterations",
        "4",
        "--ensemble-epochs",
        "2",
        "--seed",
        "9",
    ];
    let reference = build_project(dir.path(), "reference.sqlite", spec);
    run_ok(command().args(filter_args(&reference, &flags)));
    let expected = run_state(&reference);
    assert!(expected.finished);

    let project = build_project(dir.path(), "killed.sqlite", spec);
    kill_after_iterations(&project, &flags, 4);
    let interrupted = run_state(&project);
    assert!(
        !interrupted.finished && interrupted.iterations.len() >= 4,
        "the kill must land mid-run: {} iterations stored",
        interrupted.iterations.len()
    );
    let out = run_ok(command().args(filter_args(&project, &flags)));
    assert!(out.contains("resuming AF run 1"), "{out}");
    assert_eq!(run_state(&project), expected);

    // A finished run on unchanged pools is left alone unless a new run is asked for.
    let out = run_ok(command().args(filter_args(&project, &flags)));
    assert!(out.contains("nothing to do"), "{out}");
    // Other settings cannot silently continue an unfinished run.
    let conn = Connection::open(&project).unwrap();
    conn.execute("UPDATE af_runs SET finished_at = NULL", [])
        .unwrap();
    let out = command()
        .args(filter_args(&project, &["--k", "4", "--seed", "10"]))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("seed"));
}

/// MLP-only AF (`--ensemble-iterations 0`, what a project too big for the text models runs):
/// every iteration and the final pass use the MLP, and every pool ending gets a final score.
/// 600 contexts cross the boundary between the chunks the pools stream in.
#[test]
fn mlp_only_run_scores_every_pool_ending_with_the_mlp() {
    let dir = tempfile::tempdir().unwrap();
    let spec = PoolSpec {
        contexts: 600,
        candidates: 6,
        clean: 3,
        seed: Seed::new(21),
    };
    let project = build_project(dir.path(), "mlp.sqlite", spec);
    let out = run_ok(command().args(filter_args(&project, &MLP_ONLY)));
    assert!(
        out.contains("final cross-fitted pass (5 folds, mlp)"),
        "{out}"
    );
    assert!(
        !out.contains("texts encoded"),
        "the texts are never needed: {out}"
    );
    let state = run_state(&project);
    assert!(state.finished);
    assert!(state.iterations.iter().all(|i| i.1 == Phase::Mlp));
    let store = Store::open(&project).unwrap();
    let run = store.latest_af_run().unwrap().unwrap();
    let accuracy = run.final_accuracy.unwrap();
    assert!(accuracy.mlp.is_some() && accuracy.ensemble.is_none());
    assert_eq!(state.scores.len(), spec.contexts * (spec.candidates + 1));
    assert!(state.scores.values().all(|s| s.is_finite()));
    assert_eq!(state.folds.len(), spec.contexts);
    assert_eq!(
        sentence_scored(&project),
        (state.scores.len() as i64, 0, 0),
        "no sentence model, no sentence scores; no word-level heads, no style scores"
    );
}

/// Records a review of each of `contexts`' first three assigned negatives in AF run 1: the
/// reviewer picks the first over the found ending, names the second plausible and the third
/// broken. Returns the vetoed endings.
fn veto_three_each(project: &Path, contexts: &[i64]) -> HashSet<i64> {
    let assignment = Store::open(project).unwrap().af_assignment(1).unwrap();
    let conn = Connection::open(project).unwrap();
    let mut vetoed = HashSet::new();
    for example in contexts {
        let gold: i64 = conn
            .query_row(
                "SELECT id FROM endings WHERE example_id = ?1 AND is_gold = 1",
                [example],
                |r| r.get(0),
            )
            .unwrap();
        let [picked, plausible, broken] = assignment[example][..3] else {
            panic!("k is at least 3")
        };
        conn.execute(
            "INSERT INTO review_items (example_id, ending_a, ending_b, ending_c, ending_d,
               reviewers, created_at) VALUES (?1, ?2, ?3, ?4, ?5, 1, 'now')",
            params![example, gold, picked, plausible, broken],
        )
        .unwrap();
        let item = conn.last_insert_rowid();
        conn.execute(
            "INSERT INTO reviews (item_id, reviewer, pick, submitted_at) VALUES (?1, 'r', ?2, 'now')",
            params![item, picked],
        )
        .unwrap();
        let review = conn.last_insert_rowid();
        for (ending, flag) in [(plausible, "plausible"), (broken, "broken")] {
            conn.execute(
                "INSERT INTO review_flags (review_id, ending_id, flag) VALUES (?1, ?2, ?3)",
                params![review, ending, flag],
            )
            .unwrap();
        }
        vetoed.extend([picked, plausible, broken]);
    }
    vetoed
}

/// Endings a review vetoed (picked over the found ending, named plausible or broken) leave the
/// pools: the next `filter` says so, starts a new run, and that run neither assigns nor scores
/// them; a filter after it has nothing to do.
#[test]
fn endings_reviews_vetoed_leave_the_pools_of_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let spec = PoolSpec {
        contexts: 60,
        candidates: 8,
        clean: 5,
        seed: Seed::new(23),
    };
    let project = build_project(dir.path(), "reviewed.sqlite", spec);
    let flags = MLP_ONLY;
    run_ok(command().args(filter_args(&project, &flags)));
    let reviewed: Vec<i64> = run_state(&project)
        .assignment
        .keys()
        .take(3)
        .copied()
        .collect();
    let vetoed = veto_three_each(&project, &reviewed);
    let out = run_ok(command().args(filter_args(&project, &flags)));
    assert!(
        out.contains("9 pool endings that reviews vetoed are left out"),
        "{out}"
    );
    assert!(out.contains("starting a new run"), "{out}");
    assert_eq!(latest_run_params(&project)["n_set_aside_by_review"], 9);
    let state = run_state(&project);
    assert!(state.finished);
    assert_eq!(state.assignment.len(), spec.contexts, "no context lost");
    let assigned: HashSet<i64> = state.assignment.values().flatten().copied().collect();
    assert!(assigned.is_disjoint(&vetoed));
    assert!(vetoed.iter().all(|e| !state.scores.contains_key(e)));
    assert_eq!(
        state.scores.len(),
        spec.contexts * (spec.candidates + 1) - vetoed.len()
    );
    let again = run_ok(command().args(filter_args(&project, &flags)));
    assert!(again.contains("nothing to do"), "{again}");
}

/// `--hold-out group` keeps a video's contexts together: all of them in one fold of the final
/// pass. The run records the choice and `--replace-with`; a run with the defaults records
/// neither, so runs made before the choices existed keep their settings.
#[test]
fn hold_out_group_keeps_every_video_in_one_fold_and_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let spec = PoolSpec {
        contexts: 90,
        candidates: 8,
        clean: 4,
        seed: Seed::new(5),
    };
    let project = build_project(dir.path(), "groups.sqlite", spec);
    let flags = MLP_ONLY;
    run_ok(command().args(filter_args(&project, &flags)));
    let defaults = latest_run_params(&project);
    assert!(defaults.get("hold_out").is_none() && defaults.get("replacement").is_none());

    let grouped = [
        &flags[..],
        &["--hold-out", "group", "--replace-with", "nearest-gold"],
    ]
    .concat();
    let out = run_ok(command().args(filter_args(&project, &grouped)));
    assert!(
        out.contains("other settings (hold_out, replacement)"),
        "{out}"
    );
    let recorded = latest_run_params(&project);
    assert_eq!(recorded["hold_out"], "group");
    assert_eq!(recorded["replacement"], "nearest-gold");
    let conn = Connection::open(&project).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT x.grp, f.fold FROM af_folds f JOIN examples x ON x.id = f.example_id
             WHERE f.run_id = (SELECT MAX(id) FROM af_runs)",
        )
        .unwrap();
    let mut fold_of: HashMap<String, i64> = HashMap::new();
    let mut rows = 0;
    for row in stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .unwrap()
    {
        let (group, fold) = row.unwrap();
        assert_eq!(
            *fold_of.entry(group.clone()).or_insert(fold),
            fold,
            "{group} split"
        );
        rows += 1;
    }
    assert_eq!(rows, spec.contexts);
    assert_eq!(fold_of.len(), spec.contexts / 3);
}

/// With the shared embedding cache (`--cache-dir`), a second project with the same texts reads
/// its sentence vectors from the cache instead of embedding them; `--no-cache` embeds them again.
#[test]
fn sentence_vectors_come_from_the_shared_cache_when_it_has_them() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("cache");
    let cache_flag = cache_dir.display().to_string();
    let spec = PoolSpec {
        contexts: 10,
        candidates: 4,
        clean: 2,
        seed: Seed::new(5),
    };
    let vectors = |project: &Path| -> Vec<Vec<u8>> {
        Connection::open(project)
            .unwrap()
            .prepare("SELECT vector FROM sentence_vectors ORDER BY ending_id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    // The shortest run there is: the vectors it stores first are what is looked at.
    let filter = |name: &str, cache_flags: &[&str]| -> PathBuf {
        let project = build_project(dir.path(), name, spec);
        let mut flags = vec![
            "--k",
            "3",
            "--mlp-iterations",
            "1",
            "--ensemble-iterations",
            "1",
            "--folds",
            "2",
        ];
        flags.extend(cache_flags);
        run_ok(command().args(filter_args(&project, &flags)));
        project
    };
    let first = filter("first.sqlite", &["--cache-dir", &cache_flag]);
    let embedded = vectors(&first);
    assert_eq!(embedded.len(), spec.contexts * (spec.candidates + 1));
    // Mark every cached vector: a project that reads the cache stores the mark.
    let cache = Connection::open(cache_dir.join("minilm.sqlite")).unwrap();
    let marked: Vec<u8> = (0..384).flat_map(|_| 0.5f32.to_le_bytes()).collect();
    let cached = cache
        .execute("UPDATE embeddings SET vector = ?1", [&marked])
        .unwrap();
    assert!(cached > 0 && cached <= embedded.len(), "one row per text");
    let second = filter("second.sqlite", &["--cache-dir", &cache_flag]);
    assert!(vectors(&second).iter().all(|v| *v == marked));
    let third = filter("third.sqlite", &["--no-cache"]);
    assert_eq!(
        vectors(&third),
        embedded,
        "without the cache, embedded again"
    );
}

/// Runs AF in-process with tiny models on `project`.
fn filter_in_process(project: &Path, k: usize, seed: Seed) {
    let mut config = afkit_filter::Config {
        k,
        seed,
        mlp_iterations: 2,
        ensemble_iterations: 1,
        ..Default::default()
    };
    config.encode.min_count = 1;
    config.train.mlp_epochs = 2;
    config.train.ensemble_epochs = 1;
    config.train.batch_contexts = 8;
    config.train.model = afkit_filter::settings::ModelConfig {
        word_dim: 8,
        mlp_hidden: 8,
        ensemble_hidden: 8,
        cnn_filters: 4,
        lstm_hidden: 4,
        ..Default::default()
    };
    let mut store = Store::open(project).unwrap();
    afkit_filter::run(&mut store, &config, &mut afkit_filter::Silent).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    /// Stored assignments always hold k distinct pool endings of their own context, never the
    /// gold; every logged swap replaced an assigned ending by an unassigned one of the same pool;
    /// contexts with fewer than k candidates take no part; the same seed replays identically.
    #[test]
    fn assignments_stay_valid_and_runs_replay(
        contexts in 18usize..30,
        candidates in 3usize..9,
        k in 2usize..5,
        seed in 0u64..1000,
    ) {
        let dir = tempfile::tempdir().unwrap();
        // Contexts get `candidates` endings; every third gets fewer than k.
        let spec = PoolSpec { contexts, candidates: candidates.max(k), clean: 1, seed: Seed::new(seed) };
        let project = build_project(dir.path(), "a.sqlite", spec);
        let conn = Connection::open(&project).unwrap();
        conn.execute(
            "DELETE FROM endings WHERE is_gold = 0 AND example_id % 3 = 0 AND id IN
               (SELECT e.id FROM endings e WHERE e.example_id = endings.example_id AND e.is_gold = 0
                ORDER BY e.id LIMIT ?1)",
            [(candidates.max(k) - k + 1) as i64],
        ).unwrap();
        drop(conn); // checkpoints the WAL, so the copy below holds the deletion
        let copy = dir.path().join("b.sqlite");
        std::fs::copy(&project, &copy).unwrap();
        filter_in_process(&project, k, spec.seed);
        filter_in_process(&copy, k, spec.seed);

        let state = run_state(&project);
        prop_assert!(state.finished);
        let conn = Connection::open(&project).unwrap();
        let mut pools: BTreeMap<i64, (i64, BTreeSet<i64>)> = BTreeMap::new();
        let mut stmt = conn.prepare("SELECT example_id, id, is_gold FROM endings").unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))).unwrap();
        for row in rows {
            let (ex, id, gold) = row.unwrap();
            let entry = pools.entry(ex).or_insert((0, BTreeSet::new()));
            if gold == 1 { entry.0 = id } else { entry.1.insert(id); }
        }
        for (ex, (gold, pool)) in &pools {
            match state.assignment.get(ex) {
                None => prop_assert!(pool.len() < k, "context {ex} with {} candidates left out", pool.len()),
                Some(assigned) => {
                    prop_assert!(pool.len() >= k);
                    prop_assert_eq!(assigned.len(), k);
                    let distinct: BTreeSet<i64> = assigned.iter().copied().collect();
                    prop_assert_eq!(distinct.len(), k);
                    prop_assert!(!distinct.contains(gold), "gold assigned as a negative");
                    prop_assert!(distinct.is_subset(pool), "ending from another context");
                }
            }
        }
        // Replay the swap log backwards from the final assignment: each swap's new ending is in
        // its slot, and undoing it restores an ending that was not assigned elsewhere.
        let mut replay = state.assignment.clone();
        for (_, s) in state.swaps.iter().rev() {
            let slots = replay.get_mut(&s.example_id).unwrap();
            prop_assert_eq!(slots[s.slot], s.new_ending_id);
            prop_assert!(!slots.contains(&s.old_ending_id));
            slots[s.slot] = s.old_ending_id;
        }
        prop_assert_eq!(state, run_state(&copy), "same seed, same run");
    }
}

/// Per-character log-likelihood (what `acc_norm` ranks by) of every ending of a scorer model
/// given a context's startphrase, keyed by (sent2, ending): sent1 is the same everywhere.
type PerChar = std::collections::HashMap<(String, String), f64>;

/// The mean, over the latest run's contexts, of the gold ending's per-character log-likelihood
/// less the mean of its assigned negatives': how far the negatives are from reading as likely
/// as the real ending to the scorer.
fn scorer_margin(project: &Path, per_char: &PerChar) -> f64 {
    let conn = Connection::open(project).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT x.sent2, g.text, e.text FROM af_assignments a
             JOIN endings e ON e.id = a.ending_id JOIN examples x ON x.id = e.example_id
             JOIN endings g ON g.example_id = x.id AND g.is_gold = 1
             WHERE a.run_id = (SELECT MAX(id) FROM af_runs) ORDER BY x.id",
        )
        .unwrap();
    let mut by_context: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    let rows = stmt
        .query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?))
        })
        .unwrap();
    for row in rows {
        let (sent2, gold, negative): (String, String, String) = row.unwrap();
        by_context
            .entry((sent2.clone(), gold))
            .or_default()
            .push(per_char[&(sent2, negative)]);
    }
    let margins: Vec<f64> = by_context
        .iter()
        .map(|((sent2, gold), negatives)| {
            per_char[&(sent2.clone(), gold.clone())]
                - negatives.iter().sum::<f64>() / negatives.len() as f64
        })
        .collect();
    margins.iter().sum::<f64>() / margins.len() as f64
}

/// `--scorer`: a tell only a language model sees. Every context's real ending is, of its pool,
/// the one a small model finds likeliest per character given the context; the endings are all
/// alike in style and the generator's stored features are noise. With the model as a scorer AF
/// swaps in the negatives that model finds likeliest, and the gap to the real ending shrinks;
/// without it AF has nothing to go on and the gap stays. Every pool ending's score is stored,
/// and it is the harness-style reading of `lm::choice`.
#[test]
fn scorer_model_makes_af_pick_negatives_the_model_finds_likely() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = common::tiny_gguf(dir.path(), 64, 2);
    let spec = PoolSpec {
        contexts: 300,
        candidates: 9,
        clean: 9,
        seed: Seed::new(5),
    };
    let made = likeliest_gold_project(dir.path(), &gguf, spec);
    let plain = dir.path().join("plain.sqlite");
    std::fs::copy(&made.path, &plain).unwrap();
    let scored = dir.path().join("scored.sqlite");
    std::fs::copy(&made.path, &scored).unwrap();
    let run = |project: &Path, extra: &[&str]| {
        let mut args = vec![
            "--k",
            "4",
            "--mlp-iterations",
            "10",
            "--ensemble-iterations",
            "0",
            "--seed",
            "3",
        ];
        args.extend(extra);
        run_ok(command().args(filter_args(project, &args)));
    };
    run(&plain, &[]);
    run(&scored, &["--scorer", gguf.to_str().unwrap()]);

    let initial = made.random_margins.iter().sum::<f64>() / made.random_margins.len() as f64;
    let without = scorer_margin(&plain, &made.per_char);
    let with = scorer_margin(&scored, &made.per_char);
    assert!(initial > 0.0, "the real ending is the likeliest: {initial}");
    assert!(
        without > 0.85 * initial,
        "without the scorer AF cannot see the tell: {without} of {initial}"
    );
    assert!(
        with < 0.7 * initial,
        "with the scorer AF picks negatives the model finds likely: {with} of {initial}"
    );
    assert_scorer_scores_stored(&scored, made.gold_ll[&0]);
}

/// A project whose every real ending is, of its pool, the one the tiny model `gguf` finds
/// likeliest per character given its context, with what the model read.
struct LikeliestGold {
    path: PathBuf,
    per_char: PerChar,
    /// Context i's real ending's log-likelihood.
    gold_ll: HashMap<usize, f64>,
    /// Per context, the margin a uniformly random assignment has on average.
    random_margins: Vec<f64>,
}

fn likeliest_gold_project(dir: &Path, gguf: &Path, spec: PoolSpec) -> LikeliestGold {
    use afkit_engine::lm::choice::{ChoiceQuestion, ChoiceScorer};

    let model = afkit_engine::lm::model::LanguageModel::load(gguf).unwrap();
    let scorer = ChoiceScorer::new(&model).unwrap();
    let mut per_char = PerChar::new();
    let mut gold_ll = HashMap::new();
    let mut random_margins = Vec::new();
    let path = build_project_with(dir, "made.sqlite", spec, |rng, i| {
        let (sent1, sent2) = synthetic_context(i);
        let mut texts = BTreeSet::new();
        while texts.len() < spec.candidates + 1 {
            texts.insert(plain_ending(rng));
        }
        let texts: Vec<String> = texts.into_iter().collect();
        let context = afkit_store::dataset::startphrase(&sent1, &sent2);
        let scores = scorer
            .score_all(
                &[ChoiceQuestion {
                    context: &context,
                    options: &texts,
                }],
                &|| {},
            )
            .unwrap()
            .remove(0);
        let gold = scores.pick_per_char();
        for (j, text) in texts.iter().enumerate() {
            let pc = scores.loglikelihood[j] / scores.chars[j] as f64;
            per_char.insert((sent2.clone(), text.clone()), pc);
        }
        gold_ll.insert(i, scores.loglikelihood[gold]);
        let pcs: Vec<f64> = (0..texts.len())
            .map(|j| scores.loglikelihood[j] / scores.chars[j] as f64)
            .collect();
        let others = (pcs.iter().sum::<f64>() - pcs[gold]) / (pcs.len() - 1) as f64;
        random_margins.push(pcs[gold] - others);
        let mut candidates = texts.clone();
        let gold = candidates.remove(gold);
        (gold, candidates)
    });
    LikeliestGold {
        path,
        per_char,
        gold_ll,
        random_margins,
    }
}

/// Every pool ending of `project` is scored once by the scorer model, the first real ending's
/// score is `first_gold_ll` (the harness-style reading of `lm::choice`), and the run records
/// its scorer.
fn assert_scorer_scores_stored(project: &Path, first_gold_ll: f64) {
    let conn = Connection::open(project).unwrap();
    let (rows, endings): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM scorer_scores), (SELECT COUNT(*) FROM endings)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(rows, endings, "every pool ending is scored once");
    let first_gold: f64 = conn
        .query_row(
            "SELECT s.ll_cond FROM scorer_scores s JOIN endings e ON e.id = s.ending_id
             WHERE e.is_gold = 1 ORDER BY e.example_id LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        (first_gold - first_gold_ll).abs() < 1e-4,
        "{first_gold} vs {first_gold_ll}"
    );
    let params = latest_run_params(project);
    assert!(
        params.get("scorers").is_some(),
        "the run records its scorer: {params}"
    );
}

/// A small random BERT whose vocabulary holds every word of the synthetic pools: a stand-in for
/// MiniLM.
fn write_random_bert_of_the_pools(bert: &Path) {
    let mut words: Vec<String> = VERBS
        .iter()
        .chain(&NOUNS)
        .chain(&PLACES)
        .flat_map(|p| p.split(' '))
        .chain([
            "a", "person", "stands", "outside", "on", "sunny", "day", "man", "woman",
        ])
        .chain(["then", "boy", "girl", "he", "she", TELL, ".", ","])
        .map(str::to_string)
        .collect();
    words.sort();
    words.dedup();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    afkit_engine::fixtures::write_random_bert(bert, &words, Seed::new(4)).unwrap();
}

/// `--discriminator`: the fine-tuned cross-encoder joins the ensemble's iterations and the final
/// pass, each with its own accuracy beside the adversary AF acts on (the two together), after
/// the style iterations that run the ensemble without it; a fresh model trains in every
/// iteration from the iteration's seed, so a run killed in the ensemble phase resumes and ends
/// exactly where an uninterrupted run ends.
/// (A small random BERT stands in for MiniLM.)
#[test]
fn discriminator_joins_the_ensemble_and_a_killed_run_resumes_to_the_same_end() {
    let dir = tempfile::tempdir().unwrap();
    let bert = dir.path().join("bert");
    write_random_bert_of_the_pools(&bert);
    let spec = PoolSpec {
        contexts: 60,
        candidates: 8,
        clean: 4,
        seed: Seed::new(6),
    };
    let flags = [
        "--k",
        "4",
        "--mlp-iterations",
        "2",
        "--style-iterations",
        "2",
        "--ensemble-iterations",
        "3",
        "--ensemble-epochs",
        "1",
        "--seed",
        "2",
        "--folds",
        "2",
        "--no-sentence-model",
        "--discriminator",
        "minilm",
        "--discriminator-model",
        bert.to_str().unwrap(),
    ];
    let reference = build_project(dir.path(), "reference.sqlite", spec);
    run_ok(command().args(filter_args(&reference, &flags)));
    let expected = run_state(&reference);
    assert!(expected.finished);
    for (iteration, phase, ..) in &expected.iterations {
        let accuracy = &expected.iterations[*iteration].4;
        let joined = accuracy.minilm.is_some() && accuracy.adversary.is_some();
        assert_eq!(joined, *phase == Phase::Ensemble, "iteration {iteration}");
    }
    let phases: Vec<Phase> = expected.iterations.iter().map(|i| i.1).collect();
    assert_eq!(phases[..3], [Phase::Mlp, Phase::Mlp, Phase::Style]);
    assert_eq!(phases.last(), Some(&Phase::Ensemble));
    let store = Store::open(&reference).unwrap();
    let run = store.latest_af_run().unwrap().unwrap();
    let last = run.final_accuracy.unwrap();
    assert!(
        last.minilm.is_some() && last.adversary.is_some(),
        "{last:?}"
    );
    assert!(run.params.contains("\"discriminator\""), "{}", run.params);
    drop(store);
    assert_eq!(latest_run_params(&reference)["style_iterations"], 2);

    let project = build_project(dir.path(), "killed.sqlite", spec);
    let before_ensemble = phases.iter().filter(|&&p| p != Phase::Ensemble).count();
    kill_after_iterations(&project, &flags, before_ensemble + 1);
    let interrupted = run_state(&project);
    assert!(
        !interrupted.finished && interrupted.iterations.len() > before_ensemble,
        "the kill must land in the ensemble phase: {} iterations stored",
        interrupted.iterations.len()
    );
    let out = run_ok(command().args(filter_args(&project, &flags)));
    assert!(out.contains("resuming AF run 1"), "{out}");
    assert_eq!(run_state(&project), expected);
}

/// A phase that converges before its cap says so, with the cap, on stdout (clock-free: these
/// lines are printed whatever the progress bar shows).
#[test]
fn a_phase_that_converges_early_says_after_how_many_of_its_iterations() {
    let dir = tempfile::tempdir().unwrap();
    // Every candidate as plain as the found ending: nothing to find, the MLP stays near chance.
    let spec = PoolSpec {
        contexts: 120,
        candidates: 8,
        clean: 8,
        seed: Seed::new(5),
    };
    let project = build_project(dir.path(), "quiet.sqlite", spec);
    let out = run_ok(command().args(filter_args(
        &project,
        &[
            "--k",
            "3",
            "--mlp-iterations",
            "12",
            "--ensemble-iterations",
            "0",
            "--seed",
            "2",
        ],
    )));
    let ran = out.lines().filter(|l| l.starts_with("iteration ")).count();
    assert!(ran < 12, "the phase ran to its cap:\n{out}");
    assert!(
        out.contains(&format!(
            "mlp phase converged after {ran} of at most 12 iterations"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("finished: {ran} iterations")),
        "{out}"
    );
}

#[test]
fn a_discriminator_model_that_does_not_load_fails_before_any_run_is_marked_running() {
    let dir = tempfile::tempdir().unwrap();
    let spec = PoolSpec {
        contexts: 24,
        candidates: 6,
        clean: 3,
        seed: Seed::new(7),
    };
    let db = build_project(dir.path(), "p.sqlite", spec);
    let runs = query_i64(&db, "SELECT COUNT(*) FROM af_runs");
    let bogus = dir.path().join("not-a-model");
    std::fs::create_dir(&bogus).unwrap();
    std::fs::write(bogus.join("config.json"), "{}").unwrap();
    let out = afkit(&[
        "filter",
        arg(&db),
        "--new-run",
        "--no-scorer",
        "--fluency-reader",
        "none",
        "--no-sentence-model",
        "--k",
        "4",
        "--discriminator",
        "minilm",
        "--discriminator-model",
        arg(&bogus),
    ]);
    let said = stderr(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("cannot load the discriminator's model"),
        "{said}"
    );
    assert!(
        !said.contains("iteration"),
        "failed before the first iteration: {said}"
    );
    assert_eq!(query_i64(&db, "SELECT COUNT(*) FROM af_runs"), runs);
    assert_eq!(
        query_i64(&db, "SELECT COUNT(*) FROM af_runs WHERE status = 'running'"),
        0
    );
}

/// `--fluency-reader`: after AF a second model reads every found ending and assigned negative
/// after its context, as `lm::choice` poses a question; the negatives it finds less likely per
/// token than all but `--fluency-quantile` of the found endings are refused, and `assemble
/// --unverified` takes them only where a context has fewer than three others. Another quantile
/// reads nothing again; `--fluency-reader none` forgets the floor.
#[test]
fn fluency_floor_refuses_unlikely_negatives_and_assembly_takes_them_last() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = common::tiny_gguf(dir.path(), 64, 2);
    let spec = PoolSpec {
        contexts: 60,
        candidates: 10,
        clean: 10,
        seed: Seed::new(9),
    };
    let project = build_project(dir.path(), "p.sqlite", spec);
    let reader = gguf.to_str().unwrap();
    let filter = |quantile: &str, reader: &str| {
        let args = [
            "--k",
            "6",
            "--mlp-iterations",
            "2",
            "--ensemble-iterations",
            "0",
            "--seed",
            "3",
            "--fluency-reader",
            reader,
            "--fluency-quantile",
            quantile,
        ];
        run_ok(command().args(filter_args(&project, &args)))
    };
    let out = filter("0.5", reader);
    let conn = Connection::open(&project).unwrap();
    let scores = fluency_readings(&conn);
    let assigned: i64 = conn
        .query_row("SELECT COUNT(*) FROM af_assignments", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        scores.len() as i64,
        assigned + spec.contexts as i64,
        "gold and negatives, once"
    );
    assert_read_as_a_harness_question(&conn, &gguf, scores[0]);

    let refused = under_the_median_found_ending(&scores);
    assert!(!refused.is_empty() && (refused.len() as i64) < assigned);
    assert!(
        out.contains(&format!(
            "{} of {assigned} assigned negatives refused",
            refused.len()
        )),
        "{out}"
    );
    assert_assembly_takes_refused_negatives_last(&conn, &project, &refused);

    // Another quantile reads nothing again; `none` forgets the floor.
    filter("0.2", reader);
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(
        count("SELECT COUNT(*) FROM fluency_scores"),
        scores.len() as i64
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM af_fluency WHERE quantile = 0.2"),
        1
    );
    filter("0.2", "none");
    assert_eq!(count("SELECT COUNT(*) FROM af_fluency"), 0);
}

/// The fluency reader's stored readings, in ending order: (ending id, is gold, log-likelihood,
/// tokens).
fn fluency_readings(conn: &Connection) -> Vec<(i64, bool, f64, i64)> {
    let mut stmt = conn
        .prepare(
            "SELECT e.id, e.is_gold, f.ll_cond, f.n_tok FROM fluency_scores f
             JOIN endings e ON e.id = f.ending_id ORDER BY e.id",
        )
        .unwrap();
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)));
    rows.unwrap().map(Result::unwrap).collect()
}

/// The stored reading of an ending is the harness-style one: `lm::choice` asking the model
/// `gguf` about the ending alone after its context.
fn assert_read_as_a_harness_question(
    conn: &Connection,
    gguf: &Path,
    (id, _, ll, _): (i64, bool, f64, i64),
) {
    use afkit_engine::lm::choice::{ChoiceQuestion, ChoiceScorer};

    let (text, sent1, sent2): (String, String, String) = conn
        .query_row(
            "SELECT e.text, x.sent1, x.sent2 FROM endings e JOIN examples x ON x.id = e.example_id
             WHERE e.id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let model = afkit_engine::lm::model::LanguageModel::load(gguf).unwrap();
    let context = afkit_store::dataset::startphrase(&sent1, &sent2);
    let options = [text];
    let expected = ChoiceScorer::new(&model)
        .unwrap()
        .score_all(
            &[ChoiceQuestion {
                context: &context,
                options: &options,
            }],
            &|| {},
        )
        .unwrap()
        .remove(0);
    assert!((expected.loglikelihood[0] - ll).abs() < 1e-4);
}

/// The floor at quantile 0.5: the median found ending's per-token value; the refused, the
/// negatives under it.
fn under_the_median_found_ending(scores: &[(i64, bool, f64, i64)]) -> HashSet<i64> {
    let mut found: Vec<f64> = scores
        .iter()
        .filter(|s| s.1)
        .map(|s| s.2 / s.3 as f64)
        .collect();
    found.sort_by(f64::total_cmp);
    let threshold = found[found.len() / 2];
    scores
        .iter()
        .filter(|s| !s.1 && s.2 / (s.3 as f64) < threshold)
        .map(|s| s.0)
        .collect()
}

/// With no evidence for the could-be-right judgement (no scorer, no sentence vectors, no
/// generator likelihoods) every negative counts as safe and only the floor orders them:
/// `assemble --unverified` takes a refused negative only to make up a question's three.
fn assert_assembly_takes_refused_negatives_last(
    conn: &Connection,
    project: &Path,
    refused: &HashSet<i64>,
) {
    conn.execute_batch("UPDATE endings SET lp_cond = NULL; DELETE FROM sentence_vectors;")
        .unwrap();
    let assembled =
        run_ok(
            command()
                .args(["assemble"])
                .arg(project)
                .args(["--unverified", "--seed", "1"]),
        );
    let mut taken_under = 0;
    for (question, endings) in &distractors_per_question(conn) {
        let under = endings.iter().filter(|e| refused.contains(e)).count();
        if under > 0 {
            taken_under += 1;
            let all = assigned_negatives_of_question(conn, *question);
            let fluent = all.iter().filter(|e| !refused.contains(e)).count();
            assert!(
                fluent < 3,
                "question {question} took {under} refused with {fluent} fluent left"
            );
            assert_eq!(under, 3 - fluent, "refused negatives only to make up three");
        }
    }
    if taken_under > 0 {
        assert!(
            assembled.contains(&format!(
                "under the fluency floor (fewer than 3 above it): {taken_under}"
            )),
            "{assembled}"
        );
    }
}

/// Each assembled question's first three distractors (ending ids).
fn distractors_per_question(conn: &Connection) -> BTreeMap<i64, Vec<i64>> {
    let mut stmt = conn
        .prepare("SELECT assembled_id, ending_id FROM assembled_distractors WHERE position < 3")
        .unwrap();
    let distractors: Vec<(i64, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut per_question: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for (question, ending) in distractors {
        per_question.entry(question).or_default().push(ending);
    }
    per_question
}

/// The negatives AF assigned to the context of assembled question `question`.
fn assigned_negatives_of_question(conn: &Connection, question: i64) -> Vec<i64> {
    let mut s = conn
        .prepare(
            "SELECT a.ending_id FROM af_assignments a
             JOIN assembled s ON s.example_id = a.example_id WHERE s.id = ?1",
        )
        .unwrap();
    s.query_map([question], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// With `--turns rotating` a phase's iterations take turns: its first five hold out every
/// context exactly once, so no context has its negatives replaced in two of them, and the run
/// records the choice. By default (SWAG's random fifths, recorded as nothing) some contexts come
/// back within five iterations.
#[test]
fn rotating_turns_hold_out_every_context_once_in_five_iterations() {
    let dir = tempfile::tempdir().unwrap();
    let spec = PoolSpec {
        contexts: 90,
        candidates: 8,
        clean: 4,
        seed: Seed::new(9),
    };
    let project = build_project(dir.path(), "turns.sqlite", spec);
    let flags = [
        "--k",
        "4",
        "--mlp-iterations",
        "5",
        "--ensemble-iterations",
        "0",
    ];
    // (contexts swapped in the latest run, of them those swapped in two iterations or more)
    let swapped = |project: &Path| -> (i64, i64) {
        let conn = Connection::open(project).unwrap();
        conn.query_row(
            "SELECT COUNT(*), COALESCE(SUM(n > 1), 0) FROM (
                 SELECT example_id, COUNT(DISTINCT iteration) AS n FROM af_swaps
                 WHERE run_id = (SELECT MAX(id) FROM af_runs) GROUP BY example_id)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    let recorded_turns = |project: &Path| -> Option<String> {
        let params = latest_run_params(project);
        params.get("turns").map(|t| t.as_str().unwrap().to_string())
    };

    run_ok(command().args(filter_args(&project, &flags)));
    let (_, twice) = swapped(&project);
    assert!(twice > 0, "random fifths never came back to a context");
    assert_eq!(recorded_turns(&project), None);

    let rotating = [&flags[..], &["--turns", "rotating"]].concat();
    let out = run_ok(command().args(filter_args(&project, &rotating)));
    assert!(out.contains("other settings (turns)"), "{out}");
    let (contexts, twice) = swapped(&project);
    assert!(
        contexts > 45,
        "the rule is not idle: {contexts} contexts swapped"
    );
    assert_eq!(twice, 0, "a context held out twice within one deal");
    assert_eq!(recorded_turns(&project).as_deref(), Some("rotating"));
}
