//! `afkit generate` / `import-pool` end to end, `--device` / `--engine`, and the real SmolLM2
//! model against llama.cpp's reference outputs (fixtures in ../shared; those tests skip when it
//! is absent).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use afkit_engine::device::Compute;
use afkit_engine::lm::features::features;
use afkit_engine::lm::local::LocalLm;
use afkit_engine::lm::model::LanguageModel;
use afkit_engine::lm::sampler::{
    acceptable_ending, EndingSampler, SampleRequest, SampledEnding, SamplingParams,
};
use afkit_engine::models::DefaultModel;
use afkit_engine::seed::Seed;
use afkit_store::Store;
use common::{command, examples_project as project, query_i64, run_ok, tiny_gguf};
use serde_json::Value;

/// The real corpora and reference outputs next to the checkout; the tests that read it are
/// ignored when the tests were built without it.
fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

fn synthetic_examples(n: usize) -> Vec<(String, String, String, String)> {
    (0..n)
        .map(|i| {
            (
                format!("v{}#{}", i / 3, i % 3),
                format!("A person number {i} walks into a large room."),
                "The person".to_string(),
                format!("sits down on chair {i}."),
            )
        })
        .collect()
}

/// Every context's candidates (ext id, text, lp_cond, lp_alone if scored), in a canonical order.
fn pools(path: &Path) -> Vec<(String, String, f64, Option<f64>)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT x.ext_id, e.text, e.lp_cond, e.lp_alone FROM endings e
             JOIN examples x ON x.id = e.example_id WHERE e.is_gold = 0 ORDER BY x.ext_id, e.text",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

#[test]
fn generate_writes_whole_pools_and_resumes_after_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 64, 2);
    let examples = synthetic_examples(60);
    let args = |p: &Path| {
        let mut cmd = command();
        cmd.arg("generate").arg(p).arg("--model").arg(&model);
        cmd.args(["--n-neg", "6", "--max-tokens", "16", "--seed", "7"]);
        // The random model's token soup never meets the found endings' rules.
        cmd.args(["--no-ending-rules", "--alone-scores"]);
        cmd
    };
    let first = dir.path().join("a");
    std::fs::create_dir(&first).unwrap();
    let p = project(&first, &examples);
    let mut child = args(&p)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut at_kill = 0;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        at_kill = query_i64(&p, "SELECT COUNT(*) FROM pools");
        if at_kill >= 3 {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let at_kill = query_i64(&p, "SELECT COUNT(*) FROM pools").max(at_kill);
    assert!((3..60).contains(&at_kill), "kill landed at {at_kill} pools");
    // No candidates of a context without a pool: the context in flight left nothing behind.
    assert_eq!(
        query_i64(
            &p,
            "SELECT COUNT(*) FROM endings e WHERE e.is_gold = 0
             AND NOT EXISTS (SELECT 1 FROM pools p WHERE p.example_id = e.example_id)"
        ),
        0
    );
    run_ok(&mut args(&p));
    assert_eq!(query_i64(&p, "SELECT COUNT(*) FROM pools"), 60);
    assert_eq!(
        query_i64(&p, "SELECT COUNT(*) FROM generations"),
        1,
        "a resumed run reuses its job"
    );
    // Same seed, uninterrupted, in a fresh project: the same pools.
    let second = dir.path().join("b");
    std::fs::create_dir(&second).unwrap();
    let q = project(&second, &examples);
    run_ok(&mut args(&q));
    assert_eq!(pools(&p), pools(&q));
    // Every candidate and every gold ending has its features; shortfalls are recorded.
    assert_eq!(
        query_i64(
            &p,
            "SELECT COUNT(*) FROM endings WHERE lp_cond IS NULL OR lp_alone IS NULL"
        ),
        0
    );
    assert_eq!(
        query_i64(&p, "SELECT COUNT(*) FROM pools p WHERE produced != (SELECT COUNT(*) FROM endings e WHERE e.example_id = p.example_id AND e.is_gold = 0)"),
        0
    );
    let status: Value =
        serde_json::from_str(&run_ok(command().args(["status", "--json"]).arg(&p))).unwrap();
    assert_eq!(status["contexts_with_pool"], 60);
    assert_eq!(
        status["candidates"],
        query_i64(&p, "SELECT COUNT(*) FROM endings WHERE is_gold = 0")
    );
}

#[test]
fn generate_respects_limit_and_reports_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let p = project(dir.path(), &synthetic_examples(6));
    let out = run_ok(
        command()
            .arg("generate")
            .arg(&p)
            .arg("--model")
            .arg(&model)
            .args([
                "--n-neg",
                "5",
                "--limit",
                "2",
                "--json",
                "--max-tokens",
                "12",
            ]),
    );
    let summary: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["contexts"], 2);
    assert_eq!(query_i64(&p, "SELECT COUNT(*) FROM pools"), 2);
    let produced = query_i64(&p, "SELECT SUM(produced) FROM pools");
    assert_eq!(summary["endings"].as_i64().unwrap(), produced);
    assert_eq!(summary["shortfall"].as_i64().unwrap(), 10 - produced);
    let recorded = query_i64(&p, "SELECT seed FROM generations");
    assert_eq!(recorded, 0);
    // Without --alone-scores every ending is scored after its context and none alone.
    let scored = "SELECT COUNT(*) FROM endings e JOIN pools p ON p.example_id = e.example_id
                  WHERE e.lp_cond IS NOT NULL AND e.lp_alone IS NULL";
    assert_eq!(query_i64(&p, scored), produced + 2);
}

#[test]
fn generate_primes_each_context_with_other_groups_and_accounts_for_every_draw() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let p = project(dir.path(), &synthetic_examples(30));
    run_ok(
        command()
            .arg("generate")
            .arg(&p)
            .arg("--model")
            .arg(&model)
            .args([
                "--n-neg",
                "4",
                "--max-tokens",
                "12",
                "--style-examples",
                "5",
            ]),
    );
    let conn = rusqlite::Connection::open(&p).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT x.grp, p.style_examples, p.draws, p.produced, p.rejected
             FROM pools p JOIN examples x ON x.id = p.example_id",
        )
        .unwrap();
    let rows: Vec<(String, String, i64, i64, String)> = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(rows.len(), 30);
    let mut primers = std::collections::HashSet::new();
    for (group, style, draws, produced, rejected) in rows {
        let ids: Vec<i64> = serde_json::from_str(&style).unwrap();
        assert_eq!(ids.len(), 5, "{style}");
        for id in &ids {
            let other: String = conn
                .query_row("SELECT grp FROM examples WHERE id = ?1", [id], |r| r.get(0))
                .unwrap();
            assert_ne!(other, group, "a primer pair from the context's own video");
        }
        primers.insert(ids);
        let rejected: std::collections::BTreeMap<String, i64> =
            serde_json::from_str(&rejected).unwrap();
        assert_eq!(draws, produced + rejected.values().sum::<i64>());
    }
    assert!(primers.len() > 20, "primers differ between contexts");
}

/// Pools whose found ending outscored every candidate in the latest finished AF run.
fn starved_count(p: &Path) -> i64 {
    query_i64(
        p,
        "SELECT COUNT(*) FROM (SELECT e.example_id FROM af_scores s JOIN endings e ON e.id = s.ending_id
         WHERE s.run_id = (SELECT MAX(id) FROM af_runs WHERE finished_at IS NOT NULL)
         GROUP BY e.example_id
         HAVING MAX(CASE WHEN e.is_gold = 1 THEN s.score END) > MAX(CASE WHEN e.is_gold = 0 THEN s.score END))",
    )
}

/// A filter run of a few seconds: tiny models, one iteration of each phase, neither default
/// model (the scorer, the fine-tuned adversary, the fluency reader).
const TINY_FILTER: [&str; 23] = [
    "--no-scorer",
    "--fluency-reader",
    "none",
    "--discriminator",
    "none",
    "--k",
    "2",
    "--hidden",
    "8",
    "--word-dim",
    "8",
    "--mlp-epochs",
    "2",
    "--ensemble-epochs",
    "1",
    "--mlp-iterations",
    "1",
    "--ensemble-iterations",
    "1",
    "--batch-contexts",
    "8",
    "--seed",
    "1",
];

#[test]
fn grow_samples_more_for_starved_pools_and_resumes_after_kill_9_to_the_same_pools() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let examples = synthetic_examples(60);
    let generate = |p: &Path, extra: &[&str]| {
        let mut cmd = command();
        cmd.arg("generate").arg(p).arg("--model").arg(&model);
        cmd.args(["--n-neg", "4", "--max-tokens", "12", "--seed", "3"]);
        cmd.args(["--no-ending-rules", "--style-examples", "2"]);
        cmd.args(extra);
        cmd
    };
    let build = |name: &str| {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        let p = project(&sub, &examples);
        run_ok(&mut generate(&p, &[]));
        run_ok(command().arg("filter").arg(&p).args(TINY_FILTER));
        p
    };
    let a = build("a");
    let starved = starved_count(&a);
    assert!(
        starved > 0,
        "the tiny model's endings are easy to tell from the found ones"
    );
    let before = query_i64(&a, "SELECT SUM(produced) FROM pools");
    run_ok(&mut generate(&a, &["--grow", "3"]));
    assert_eq!(query_i64(&a, "SELECT COUNT(*) FROM pool_growth"), starved);
    let grown = query_i64(&a, "SELECT SUM(produced) FROM pool_growth");
    assert!(grown > 0);
    assert_eq!(
        query_i64(&a, "SELECT SUM(produced) FROM pools"),
        before + grown
    );
    assert_eq!(
        query_i64(&a, "SELECT SUM(produced) FROM pools"),
        query_i64(&a, "SELECT COUNT(*) FROM endings WHERE is_gold = 0")
    );
    // Asked again for the same AF run, nothing more is sampled.
    run_ok(&mut generate(&a, &["--grow", "3"]));
    assert_eq!(
        query_i64(&a, "SELECT SUM(produced) FROM pool_growth"),
        grown
    );
    // A growth interrupted by kill -9 resumes to what an uninterrupted one stored.
    let b = build("b");
    let mut child = generate(&b, &["--grow", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && query_i64(&b, "SELECT COUNT(*) FROM pool_growth") == 0 {
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    run_ok(&mut generate(&b, &["--grow", "3"]));
    assert_eq!(pools(&a), pools(&b));
    // The next filter run works on the grown pools.
    let out = run_ok(command().arg("filter").arg(&a).args(TINY_FILTER));
    assert!(out.contains("AF run 2"), "{out}");
}

#[test]
fn corrupt_or_truncated_gguf_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let p = project(dir.path(), &synthetic_examples(1));
    let bytes = std::fs::read(&model).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a gguf file, just some bytes").unwrap();
    for (file, expected) in [(&truncated, "truncated"), (&garbage, "not a readable GGUF")] {
        let out = command()
            .arg("generate")
            .arg(&p)
            .arg("--model")
            .arg(file)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(expected) && stderr.contains(file.to_str().unwrap()),
            "{stderr}"
        );
    }
    assert_eq!(query_i64(&p, "SELECT COUNT(*) FROM pools"), 0);
}

#[test]
fn import_pool_scores_endings_and_rejects_bad_lines_whole() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let p = project(dir.path(), &synthetic_examples(3));
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"id\": \"v0#0\", \"endings\": [\"runs.\"]}\n{\"id\": \"v0#1\", \"endings\": 3}\n",
    )
    .unwrap();
    let out = command()
        .arg("import-pool")
        .arg(&p)
        .arg(&bad)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.jsonl:2"));
    assert_eq!(
        query_i64(&p, "SELECT COUNT(*) FROM pools"),
        0,
        "nothing written from a bad file"
    );
    let good = dir.path().join("good.jsonl");
    std::fs::write(
        &good,
        "{\"id\": \"v0#0\", \"endings\": [\"runs  away.\", \"runs away.\", \"sits down on chair 0.\", \"jumps!\"]}\n\
         {\"id\": \"v0#2\", \"endings\": [\"falls.\"]}\n",
    )
    .unwrap();
    run_ok(
        command()
            .arg("import-pool")
            .arg(&p)
            .arg(&good)
            .arg("--model")
            .arg(&model),
    );
    // Duplicates (after whitespace normalisation) and the gold ending are dropped.
    assert_eq!(
        query_i64(&p, "SELECT produced FROM pools WHERE example_id = 1"),
        2
    );
    assert_eq!(
        query_i64(&p, "SELECT requested FROM pools WHERE example_id = 1"),
        4
    );
    assert_eq!(
        query_i64(
            &p,
            "SELECT COUNT(*) FROM endings WHERE lp_cond IS NULL AND example_id IN (1, 3)"
        ),
        0
    );
    assert_eq!(
        query_i64(
            &p,
            "SELECT COUNT(*) FROM endings WHERE lp_final_punct IS NULL AND example_id IN (1, 3)"
        ),
        0
    );
    // Importing again skips contexts that have a pool.
    let out = run_ok(
        command()
            .arg("import-pool")
            .arg(&p)
            .arg(&good)
            .arg("--model")
            .arg(&model),
    );
    assert!(out.contains("2 contexts skipped"), "{out}");
}

/// A line of a scored pools file: the context `id` with its `endings` (JSON objects), the found
/// ending's and the context's features.
fn scored_line(id: &str, endings: &str) -> String {
    format!(
        "{{\"id\": \"{id}\", \"endings\": [{endings}], \
         \"gold\": {{\"lp_cond\": -1.5, \"lp_alone\": -2.5, \"lp_final_punct\": -0.25, \"n_tok\": 6}}, \
         \"context\": {{\"ctx_logprob\": -3.25, \"n_tok_sent1\": 11, \"n_tok_sent2\": 2}}}}\n"
    )
}

/// A scored ending of a pools file, `lp` its log-probability after the context.
fn scored_ending(text: &str, lp: f64) -> String {
    format!(
        "{{\"text\": \"{text}\", \"lp_cond\": {lp}, \"lp_alone\": -4.0, \"lp_final_punct\": null, \"n_tok\": 5}}"
    )
}

/// The features of the scored pools file imported into `p` are stored as the file gives them:
/// the endings', the found ending's and the context's, under a generation of imported features.
fn check_imported_features(p: &Path) {
    let conn = rusqlite::Connection::open(p).unwrap();
    let stored: Vec<(String, f64, Option<f64>, i64)> = conn
        .prepare(
            "SELECT text, lp_cond, lp_final_punct, n_tok_ending FROM endings
             WHERE example_id = 1 ORDER BY is_gold, id",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        stored,
        vec![
            ("runs away.".to_string(), -2.0, None, 5),
            ("jumps!".to_string(), -1.75, None, 5),
            ("sits down on chair 0.".to_string(), -1.5, Some(-0.25), 6),
        ]
    );
    let (ctx, n1, n2): (f64, i64, i64) = conn
        .query_row(
            "SELECT ctx_logprob, n_tok_sent1, n_tok_sent2 FROM pools WHERE example_id = 2",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((ctx, n1, n2), (-3.25, 11, 2));
    let model: String = conn
        .query_row("SELECT model FROM generations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(model, "features imported");
}

#[test]
fn import_pool_takes_scored_pools_without_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let p = project(dir.path(), &synthetic_examples(3));
    // A line whose endings are only partly scored is rejected with its line number, whole.
    let mixed = dir.path().join("mixed.jsonl");
    std::fs::write(
        &mixed,
        scored_line("v0#0", &scored_ending("runs away.", -2.0))
            + &scored_line(
                "v0#1",
                &format!("{}, \"jumps.\"", scored_ending("waves.", -2.0)),
            ),
    )
    .unwrap();
    // No --model and no cached model: a scored file must not need one.
    let out = command()
        .env("AFKIT_HOME", dir.path().join("empty-home"))
        .arg("import-pool")
        .arg(&p)
        .arg(&mixed)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mixed.jsonl:2") && err.contains("some endings"),
        "{err}"
    );
    assert_eq!(query_i64(&p, "SELECT COUNT(*) FROM pools"), 0);

    let good = dir.path().join("scored.jsonl");
    std::fs::write(
        &good,
        scored_line(
            "v0#0",
            &[
                scored_ending("runs away.", -2.0),
                scored_ending("runs  away.", -9.0),
                scored_ending("jumps!", -1.75),
            ]
            .join(", "),
        ) + &scored_line("v0#1", &scored_ending("waves.", -2.5)),
    )
    .unwrap();
    let out = run_ok(
        command()
            .env("AFKIT_HOME", dir.path().join("empty-home"))
            .arg("import-pool")
            .arg(&p)
            .arg(&good),
    );
    assert!(
        out.contains("2 contexts came with their own LM features"),
        "{out}"
    );
    assert_eq!(
        query_i64(&p, "SELECT produced FROM pools WHERE example_id = 1"),
        2,
        "the duplicate after normalisation is dropped, with its features"
    );
    check_imported_features(&p);
}

/// `kill -9` in the middle of a scored import leaves whole pools only; running it again finishes
/// the file and skips what was stored.
#[test]
fn import_pool_resumes_after_kill_9_with_whole_pools_only() {
    const CONTEXTS: usize = 4000;
    const ENDINGS: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.sqlite");
    run_ok(command().arg("init").arg(&p));
    let examples: String = synthetic_examples(CONTEXTS)
        .iter()
        .map(|(id, s1, s2, ending)| {
            serde_json::json!({"id": id, "sent1": s1, "sent2": s2, "ending": ending}).to_string()
                + "\n"
        })
        .collect();
    std::fs::write(dir.path().join("examples.jsonl"), examples).unwrap();
    run_ok(
        command()
            .args(["ingest", "--format", "jsonl"])
            .arg(&p)
            .arg(dir.path().join("examples.jsonl")),
    );
    let pools: String = synthetic_examples(CONTEXTS)
        .iter()
        .map(|(id, ..)| {
            let endings: Vec<Value> = (0..ENDINGS)
                .map(|j| {
                    serde_json::json!({"text": format!("waves flag number {j} twice."),
                        "lp_cond": -2.0, "lp_alone": -3.0, "lp_final_punct": -0.5, "n_tok": 6})
                })
                .collect();
            serde_json::json!({"id": id, "endings": endings,
                "gold": {"lp_cond": -1.0, "lp_alone": -2.0, "lp_final_punct": -0.5, "n_tok": 6},
                "context": {"ctx_logprob": -3.0, "n_tok_sent1": 12, "n_tok_sent2": 2}})
            .to_string()
                + "\n"
        })
        .collect();
    let file = dir.path().join("pools.jsonl");
    std::fs::write(&file, pools).unwrap();
    let mut child = command()
        .arg("import-pool")
        .arg(&p)
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && query_i64(&p, "SELECT COUNT(*) FROM pools") == 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let at_kill = query_i64(&p, "SELECT COUNT(*) FROM pools");
    assert!(
        (1..CONTEXTS as i64).contains(&at_kill),
        "kill landed at {at_kill} pools"
    );
    let whole_pools_only = "SELECT COUNT(*) FROM examples x WHERE
        (SELECT COUNT(*) FROM endings e WHERE e.example_id = x.id AND e.is_gold = 0)
        != IFNULL((SELECT produced FROM pools p WHERE p.example_id = x.id), 0)";
    assert_eq!(query_i64(&p, whole_pools_only), 0);
    let out = run_ok(command().arg("import-pool").arg(&p).arg(&file));
    assert!(
        out.contains(&format!("{at_kill} contexts skipped")),
        "{out}"
    );
    assert_eq!(query_i64(&p, "SELECT COUNT(*) FROM pools"), CONTEXTS as i64);
    assert_eq!(query_i64(&p, whole_pools_only), 0);
    assert_eq!(
        query_i64(&p, "SELECT COUNT(*) FROM endings WHERE is_gold = 0"),
        (CONTEXTS * ENDINGS) as i64
    );
}

// ---------- the real model (SmolLM2-135M-Instruct Q4_1) ----------

fn smollm2() -> &'static LocalLm {
    static LM: OnceLock<LocalLm> = OnceLock::new();
    LM.get_or_init(|| {
        DefaultModel::SmolLm2.ensure().expect("fetch SmolLM2");
        let model = LanguageModel::load(&DefaultModel::smollm2_gguf()).unwrap();
        LocalLm::new(model, SamplingParams::default(), None)
    })
}

/// (sent1, second sentence) of consecutive captions of the first videos in the shared data.
fn activitynet_pairs(n: usize) -> Vec<(String, String)> {
    let path = shared().join("data/activitynet-captions/train.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let data: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
    let mut pairs = Vec::new();
    for video in data.values() {
        let s: Vec<&str> = video["sentences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().trim())
            .collect();
        if s.len() >= 2 && pairs.len() < n {
            pairs.push((s[0].to_string(), s[1].to_string()));
        }
    }
    pairs
}

#[test]
#[cfg_attr(
    not(has_shared_data),
    ignore = "needs ActivityNet Captions train.json in ../shared/data/activitynet-captions/ (from captions.zip, cs.stanford.edu/people/ranjaykrishna/densevid/): absent"
)]
fn smollm2_found_ending_is_likelier_after_its_own_context() {
    let pairs = activitynet_pairs(20);
    let lm = smollm2();
    let (mut own, mut shuffled) = (0.0, 0.0);
    for (i, (sent1, second)) in pairs.iter().enumerate() {
        // sent2 = the first word of the second sentence; the ending is the rest.
        let (sent2, ending) = second.split_once(' ').unwrap();
        let other = &pairs[(i + 7) % pairs.len()].0;
        let real_prompt = format!("{sent1} {sent2}");
        let real = features(
            lm,
            &real_prompt,
            &real_prompt,
            (sent1, sent2),
            ending,
            &[],
            true,
        )
        .unwrap();
        let fake_prompt = format!("{other} {sent2}");
        let fake = features(
            lm,
            &fake_prompt,
            &fake_prompt,
            (other, sent2),
            ending,
            &[],
            true,
        )
        .unwrap();
        assert_eq!(
            real.gold.lp_alone, fake.gold.lp_alone,
            "context-free score depends on the context"
        );
        own += real.gold.lp_cond / pairs.len() as f64;
        shuffled += fake.gold.lp_cond / pairs.len() as f64;
    }
    assert!(
        own > shuffled + 0.1,
        "mean lp_cond {own} with the real context vs {shuffled} shuffled"
    );
}

#[test]
#[cfg_attr(
    not(has_shared_data),
    ignore = "needs ActivityNet Captions train.json in ../shared/data/activitynet-captions/ (from captions.zip, cs.stanford.edu/people/ranjaykrishna/densevid/): absent"
)]
fn smollm2_generate_end_to_end() {
    let pairs = activitynet_pairs(2);
    let dir = tempfile::tempdir().unwrap();
    let examples: Vec<_> = pairs
        .iter()
        .enumerate()
        .map(|(i, (s1, s2))| {
            let (sent2, ending) = s2.split_once(' ').unwrap();
            (
                format!("v{i}#0"),
                s1.clone(),
                sent2.to_string(),
                ending.to_string(),
            )
        })
        .collect();
    let p = project(dir.path(), &examples);
    DefaultModel::SmolLm2.ensure().unwrap();
    run_ok(command().arg("generate").arg(&p).args([
        "--n-neg",
        "6",
        "--seed",
        "1",
        "--alone-scores",
    ]));
    assert_eq!(query_i64(&p, "SELECT COUNT(*) FROM pools"), 2);
    assert!(query_i64(&p, "SELECT SUM(produced) FROM pools") >= 10);
    let conn = rusqlite::Connection::open(&p).unwrap();
    let mut stmt = conn
        .prepare("SELECT text, lp_cond, lp_alone, n_tok_ending FROM endings WHERE is_gold = 0")
        .unwrap();
    let rows: Vec<(String, f64, f64, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for (text, cond, alone, n) in rows {
        assert!(
            text.ends_with(['.', '!', '?']) && text.split_whitespace().count() <= 25,
            "{text:?}"
        );
        assert!(cond < 0.0 && alone < 0.0 && n > 0 && n <= 40, "{text:?}");
    }
    assert_eq!(
        query_i64(
            &p,
            "SELECT COUNT(*) FROM generations WHERE model_sha256 IS NOT NULL"
        ),
        1
    );
}

// ---------- --device and --engine ----------
//
// Without the `cuda` feature, `--device cuda` fails at once and says how to build afkit with it;
// `--engine generic` (candle ops only: the code a GPU runs) generates and filters on the CPU like
// afkit's own kernels, on a tiny random model from the command line and on SmolLM2 in process.

#[cfg(not(feature = "cuda"))]
#[test]
fn device_cuda_without_the_feature_fails_at_once_and_says_how_to_build() {
    // The project does not exist: the device is checked before anything else is touched.
    for stage in ["generate", "filter"] {
        let out = command()
            .args([stage, "no-such-project.sqlite", "--device", "cuda"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("built without CUDA support")
                && err.contains("cargo build --release --features cuda"),
            "{stage}: {err}"
        );
    }
    let out = command()
        .args(["filter", "p.sqlite", "--device", "gpu"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("use cpu, cuda or cuda:N"));
}

#[test]
fn generic_engine_generates_and_filters_like_the_cpu_kernels() {
    generates_and_filters_like_the_cpu_kernels(&["--engine", "generic"]);
}

/// The same on the first GPU, in a build with the `cuda` feature.
#[cfg(feature = "cuda")]
#[test]
fn cuda_generates_and_filters_like_the_cpu_kernels() {
    generates_and_filters_like_the_cpu_kernels(&["--device", "cuda"]);
}

/// Generates and filters one project with afkit's CPU kernels and another with `flags`.
fn generates_and_filters_like_the_cpu_kernels(flags: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 2);
    let [kernels, generic] = ["k", "g"].map(|name| {
        let sub = dir.path().join(name);
        std::fs::create_dir(&sub).unwrap();
        project(&sub, &synthetic_examples(24))
    });
    // The kernels in f32, as the other engines compute: AMX's bf16 tiles, where the CPU has
    // them, round each operand to 8 bits by design.
    generate_eight(&kernels, &model, &[], Some(("AFKIT_SIMD", "avx512")));
    generate_eight(&generic, &model, flags, None);
    check_same_pools(&kernels, &generic);

    // AF on one pool both ways: results agree up to rounding (which may move a held-out
    // context across the decision boundary, but hardly any).
    let copy = dir.path().join("c.sqlite");
    std::fs::copy(&kernels, &copy).unwrap();
    filter_small(&kernels, &[]);
    filter_small(&copy, flags);
    check_same_af_iterations(&kernels, &copy);
}

/// Eight seeded endings per context of `project` with `model`, plus `flags` (and `env`).
fn generate_eight(project: &Path, model: &Path, flags: &[&str], env: Option<(&str, &str)>) {
    let mut generate = command();
    generate.envs(env);
    run_ok(
        generate
            .arg("generate")
            .arg(project)
            .arg("--model")
            .arg(model)
            .args(["--n-neg", "8", "--seed", "3"])
            // The random model's token soup never meets the found endings' rules.
            .args(["--no-ending-rules", "--alone-scores"])
            .args(flags),
    );
}

/// The pools generated in `other` are those of `kernels` (afkit's CPU kernels) up to a rare
/// token, with the same features, and every ending of `other` is complete and scored.
fn check_same_pools(kernels: &Path, other: &Path) {
    let (a, b) = (pools(kernels), pools(other));
    assert!(a.len() >= 24 * 6, "{} endings", a.len());
    for (_, text, cond, alone) in &b {
        assert!(text.ends_with(['.', '!', '?']), "{text:?}");
        assert!(*cond < 0.0 && alone.is_some_and(|a| a < 0.0), "{text:?}");
    }
    // Same seeds, same per-row generators: the same endings up to a rare token flipped by the
    // rounding of the logits, with the same features.
    let common: Vec<_> = a
        .iter()
        .filter_map(|x| {
            b.iter()
                .find(|y| (&y.0, &y.1) == (&x.0, &x.1))
                .map(|y| (x, y))
        })
        .collect();
    assert!(
        common.len() * 10 >= a.len() * 9,
        "{} of {} endings in common",
        common.len(),
        a.len()
    );
    for (x, y) in common {
        let alone = (x.3.unwrap() - y.3.unwrap()).abs();
        assert!((x.2 - y.2).abs() < 1e-3 && alone < 1e-3, "{x:?} vs {y:?}");
    }
}

/// AF on `project`, one MLP iteration and one ensemble iteration of small models, without the
/// scorer, the discriminator or the fluency reader, plus `flags`.
fn filter_small(project: &Path, flags: &[&str]) {
    run_ok(
        command()
            .arg("filter")
            .arg(project)
            .args([
                "--k",
                "3",
                "--mlp-iterations",
                "1",
                "--ensemble-iterations",
                "1",
            ])
            .args(["--hidden", "16", "--word-dim", "16", "--min-count", "1"])
            .args([
                "--no-scorer",
                "--discriminator",
                "none",
                "--fluency-reader",
                "none",
            ])
            .args(flags),
    );
}

/// The latest AF runs of `kernels` and `other` have two iterations each, whose accuracies agree
/// within 0.05 (each model measured in both or in neither), and `other`'s second ran an ensemble.
fn check_same_af_iterations(kernels: &Path, other: &Path) {
    let records = |project: &Path| {
        let store = Store::open(project).unwrap();
        let run = store
            .latest_finished_af_run()
            .unwrap()
            .expect("a finished run");
        store.af_iterations(run.id).unwrap()
    };
    let (a, b) = (records(kernels), records(other));
    assert_eq!(a.len(), 2);
    assert_eq!(b.len(), 2);
    for (x, y) in a.iter().zip(&b) {
        let (p, q) = (x.accuracy, y.accuracy);
        for (p, q) in [
            (p.mlp, q.mlp),
            (p.bow, q.bow),
            (p.cnn, q.cnn),
            (p.lstm, q.lstm),
            (p.ensemble, q.ensemble),
        ] {
            assert_eq!(p.is_some(), q.is_some());
            if let (Some(p), Some(q)) = (p, q) {
                assert!((p - q).abs() < 0.05, "{x:?} vs {y:?}");
            }
        }
    }
    assert!(
        b[1].accuracy.ensemble.is_some(),
        "an ensemble iteration ran"
    );
}

/// SmolLM2 on the generic engine: valid, unique endings, and the same LM features as
/// afkit's CPU kernels compute for them from scratch. (That both engines sample the same tokens
/// from the same seeds is tested on a tiny model: afkit's own kernels are slow in a debug build.)
#[test]
fn smollm2_generic_engine_samples_valid_endings_and_scores_like_the_cpu_kernels() {
    DefaultModel::SmolLm2.ensure().expect("fetch SmolLM2");
    let load = |compute: &Compute| {
        let model = LanguageModel::load_on(&DefaultModel::smollm2_gguf(), compute).unwrap();
        LocalLm::new(model, SamplingParams::default(), None)
    };
    // The kernels in f32, as the generic engine computes (not on AMX's bf16 tiles).
    let kernels = &load(&Compute::cpu_f32());
    let generic = load(&Compute {
        cpu_kernels: false,
        ..Compute::cpu()
    });
    let contexts = [
        (
            "A man is standing on a ladder next to a house.",
            "He",
            "paints the wall white.",
        ),
        (
            "Two girls sit on a couch with a small dog.",
            "The dog",
            "jumps onto the floor.",
        ),
    ];
    for (i, (sent1, sent2, gold)) in contexts.into_iter().enumerate() {
        let request = SampleRequest {
            prompt: format!("{sent1} {sent2}"),
            exclude: vec![gold.to_string()],
            n: 8,
            seed: Seed::new(i as u64),
            rule: Default::default(),
        };
        let ours = generic.sample(&request).unwrap();
        assert!(ours.endings.len() >= 6, "{} endings", ours.endings.len());
        let mut seen = std::collections::HashSet::new();
        for e in &ours.endings {
            assert!(
                acceptable_ending(&e.text, 25) && e.text != gold,
                "{:?}",
                e.text
            );
            assert!(seen.insert(&e.text), "duplicate {:?}", e.text);
        }
        let plain: Vec<SampledEnding> = ours
            .endings
            .iter()
            .map(|e| SampledEnding {
                text: e.text.clone(),
                tokens: None,
            })
            .collect();
        let prompt = request.prompt.as_str();
        let scored = |lm: &LocalLm, endings: &[SampledEnding]| {
            features(lm, prompt, prompt, (sent1, sent2), gold, endings, true).unwrap()
        };
        let (f, g) = (scored(&generic, &ours.endings), scored(kernels, &plain));
        assert!((f.ctx_logprob - g.ctx_logprob).abs() < 1e-3);
        assert_eq!(
            (f.n_tok_sent1, f.n_tok_sent2),
            (g.n_tok_sent1, g.n_tok_sent2)
        );
        for (x, y) in std::iter::once((&f.gold, &g.gold)).chain(f.endings.iter().zip(&g.endings)) {
            assert!((x.lp_cond - y.lp_cond).abs() < 1e-3, "{x:?} vs {y:?}");
            let alone = (x.lp_alone.unwrap() - y.lp_alone.unwrap()).abs();
            assert!(alone < 1e-3, "{x:?} vs {y:?}");
            match (x.lp_final_punct, y.lp_final_punct) {
                (Some(p), Some(q)) => assert!((p - q).abs() < 5e-3, "{x:?} vs {y:?}"),
                (p, q) => assert_eq!(p, q),
            }
            assert_eq!(x.n_tok, y.n_tok);
        }
    }
}
