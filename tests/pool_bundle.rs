//! `afkit pool export` / `afkit pool import`: a bundle round-trips bit for bit through a freshly
//! ingested project, AF on the imported pools chooses what it chooses on the original ones, and
//! a bundle that does not fit the project is refused whole, or imported without the contexts
//! that do not fit when the user asks for that.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use afkit_store::Store;
use common::{afkit, arg, command, query_i64, read, run_ok, stderr, tiny_gguf};
use rusqlite::types::Value;
use rusqlite::Connection;

/// A filter run of a few seconds (tiny models, one iteration of each phase, no fine-tuned
/// adversary, no fluency reader); the scorer is the tiny model, so that the pools carry scorer scores.
fn tiny_filter(project: &Path, scorer: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["filter", arg(project), "--scorer", arg(scorer)]
        .map(String::from)
        .to_vec();
    args.extend(
        [
            "--discriminator",
            "none",
            "--fluency-reader",
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
        ]
        .map(String::from),
    );
    args
}

/// A project `dir/NAME/p.sqlite` ingested from `n` JSONL records (two per group); `change`
/// gives record `i` another found ending.
fn ingested(dir: &Path, name: &str, n: usize, change: Option<usize>) -> PathBuf {
    ingested_records(dir, name, 0..n, change)
}

/// A project `dir/NAME/p.sqlite` ingested from the JSONL records numbered `records`, record `i`
/// of group `v{i / 2}`; `change` gives record `i` another found ending.
fn ingested_records(
    dir: &Path,
    name: &str,
    records: impl Iterator<Item = usize>,
    change: Option<usize>,
) -> PathBuf {
    let sub = dir.join(name);
    std::fs::create_dir(&sub).unwrap();
    let input = sub.join("in.jsonl");
    let lines: Vec<String> = records
        .map(|i| {
            let ending = if change == Some(i) {
                format!("stands up from chair number {i} and leaves.")
            } else {
                format!("sits down on chair number {i} and waits.")
            };
            serde_json::json!({
                "id": format!("v{}#{}", i / 2, i % 2),
                "group": format!("v{}", i / 2),
                "sent1": format!("A person number {i} walks into a large room."),
                "sent2": "The person",
                "ending": ending,
            })
            .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let p = sub.join("p.sqlite");
    run_ok(command().arg("init").arg(&p));
    run_ok(command().args(["ingest", arg(&p), "--format", "jsonl", arg(&input)]));
    p
}

/// A project with everything a bundle carries: pools sampled with style priming, scorer scores,
/// growth rounds after a filter run, and a context a generation job could not use.
fn source(dir: &Path, model: &Path) -> PathBuf {
    let p = ingested(dir, "source", 30, None);
    let generate = |extra: &[&str]| {
        let mut cmd = command();
        cmd.args(["generate", arg(&p), "--model", arg(model)]);
        cmd.args(["--n-neg", "5", "--max-tokens", "12", "--seed", "3"]);
        cmd.args([
            "--no-ending-rules",
            "--style-examples",
            "2",
            "--limit",
            "28",
        ]);
        cmd.args(extra);
        run_ok(&mut cmd);
    };
    generate(&[]);
    run_ok(command().args(tiny_filter(&p, model)));
    generate(&["--grow", "2"]);
    assert!(query_i64(&p, "SELECT COUNT(*) FROM pool_growth") > 0);
    let store = Store::open(&p).unwrap();
    let last = store.example_id_by_ext_id("v14#1").unwrap().unwrap();
    let generation = query_i64(&p, "SELECT MIN(id) FROM generations");
    store
        .record_unusable_context(last, generation, "too long for the model")
        .unwrap();
    p
}

/// Rows of a query, every value as SQLite gives it (floats bit for bit).
fn rows(project: &Path, sql: &str) -> Vec<Vec<Value>> {
    let conn = Connection::open(project).unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    let n = stmt.column_count();
    stmt.query_map([], |r| (0..n).map(|i| r.get::<_, Value>(i)).collect())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Everything generate and the scorers stored, keyed by context id and ending text (ids of
/// rows differ between projects).
fn stored(project: &Path) -> Vec<Vec<Vec<Value>>> {
    [
        "SELECT x.ext_id, e.text, e.is_gold, e.lp_cond, e.lp_alone, e.lp_final_punct,
                e.n_tok_ending, g.model, g.params, g.seed, g.started_at
         FROM endings e JOIN examples x ON x.id = e.example_id
         LEFT JOIN generations g ON g.id = e.generation_id
         WHERE e.example_id IN (SELECT example_id FROM pools) ORDER BY x.ext_id, e.text",
        "SELECT x.ext_id, e.text, s.model, s.ll_cond, s.ll_alone, s.n_tok
         FROM scorer_scores s JOIN endings e ON e.id = s.ending_id
         JOIN examples x ON x.id = e.example_id ORDER BY x.ext_id, e.text, s.model",
        "SELECT x.ext_id, p.requested, p.produced, p.ctx_logprob, p.n_tok_sent1, p.n_tok_sent2,
                p.seconds, p.finished_at, p.draws, p.rejected,
                (SELECT group_concat(y.ext_id) FROM json_each(p.style_examples) j
                 JOIN examples y ON y.id = j.value)
         FROM pools p JOIN examples x ON x.id = p.example_id ORDER BY x.ext_id",
        "SELECT x.ext_id, COALESCE(g.af_run_id, g.bundle_af_run), g.requested, g.produced,
                g.draws, g.rejected, g.seconds, g.finished_at
         FROM pool_growth g JOIN examples x ON x.id = g.example_id ORDER BY x.ext_id",
        "SELECT x.ext_id, u.reason, u.recorded_at FROM unusable_contexts u
         JOIN examples x ON x.id = u.example_id ORDER BY x.ext_id",
    ]
    .iter()
    .map(|sql| rows(project, sql))
    .collect()
}

/// The latest AF run's assignment and final scores, by context id and ending text.
fn af_choices(project: &Path) -> (BTreeMap<String, Vec<String>>, Vec<Vec<Value>>) {
    let mut assignment: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in rows(
        project,
        "SELECT x.ext_id, e.text FROM af_assignments a JOIN examples x ON x.id = a.example_id
         JOIN endings e ON e.id = a.ending_id
         WHERE a.run_id = (SELECT MAX(id) FROM af_runs) ORDER BY x.ext_id, a.slot",
    ) {
        let [Value::Text(ext), Value::Text(text)] = &row[..] else {
            panic!("{row:?}")
        };
        assignment
            .entry(ext.clone())
            .or_default()
            .push(text.clone());
    }
    let scores = rows(
        project,
        "SELECT x.ext_id, e.text, s.score FROM af_scores s JOIN endings e ON e.id = s.ending_id
         JOIN examples x ON x.id = e.example_id
         WHERE s.run_id = (SELECT MAX(id) FROM af_runs) ORDER BY x.ext_id, e.text",
    );
    (assignment, scores)
}

fn export(project: &Path, file: &Path) -> String {
    run_ok(command().args(["pool", "export", arg(project), arg(file)]))
}

fn import(project: &Path, file: &Path) -> std::process::Output {
    afkit(&["pool", "import", arg(project), arg(file)])
}

#[test]
fn a_bundle_round_trips_bit_for_bit_and_filters_as_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let a = source(dir.path(), &model);
    let first = dir.path().join("pools.afpool.zip");
    let out = export(&a, &first);
    assert!(out.contains("29 contexts, 28 of them with a pool"), "{out}");

    let b = ingested(dir.path(), "fresh", 30, None);
    let imported = import(&b, &first);
    assert!(imported.status.success(), "{}", stderr(&imported));
    let all = stored(&a);
    assert!(all.iter().all(|rows| !rows.is_empty()), "{all:?}");
    assert_eq!(stored(&b), all);
    let second = dir.path().join("again.afpool.zip");
    export(&b, &second);
    assert!(
        read(&first) == read(&second),
        "the bundle changed on its way"
    );
    assert_eq!(query_i64(&b, "SELECT COUNT(*) FROM sentence_vectors"), 0);

    // The same filter on the same pools makes the same choices (a's second run: the pools grew
    // after its first).
    run_ok(command().args(tiny_filter(&a, &model)));
    let out = run_ok(command().args(tiny_filter(&b, &model)));
    assert!(
        out.contains("time: ") && out.contains("MLP iterations") && out.contains("final pass"),
        "{out}"
    );
    let (assignment, scores) = af_choices(&a);
    assert_eq!(assignment.len(), 28);
    assert!(scores.len() > 28 * 3);
    assert_eq!(af_choices(&b), (assignment, scores));

    // Generated without the ending-alone pass, the pools leave the MLP no such input once the
    // scorer is off too, and filter says so.
    let mut args = tiny_filter(&b, &model);
    let at = args.iter().position(|a| a == "--scorer").unwrap();
    args.splice(
        at..at + 2,
        ["--no-scorer".to_string(), "--new-run".to_string()],
    );
    let out = run_ok(command().args(&args));
    assert!(out.contains("no ending-alone scores"), "{out}");

    // Imported again, every context already has its pool: refused, nothing written.
    let again = import(&b, &first);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("context v0#0: it already has a pool"),
        "{}",
        stderr(&again)
    );
}

#[test]
fn a_bundle_that_does_not_fit_the_project_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let a = ingested(dir.path(), "source", 12, None);
    run_ok(
        command()
            .args(["generate", arg(&a), "--model", arg(&model)])
            .args([
                "--n-neg",
                "3",
                "--max-tokens",
                "8",
                "--no-ending-rules",
                "--style-examples",
                "0",
            ]),
    );
    let bundle = dir.path().join("pools.afpool.zip");
    export(&a, &bundle);
    let pools = |p: &Path| query_i64(p, "SELECT COUNT(*) FROM pools");

    // A found ending that differs.
    let changed = ingested(dir.path(), "changed", 12, Some(5));
    let out = import(&changed, &bundle);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("context v2#1: its text in this project") && err.contains("differs"),
        "{err}"
    );
    assert_eq!(pools(&changed), 0);

    // Contexts the project never ingested.
    let fewer = ingested(dir.path(), "fewer", 10, None);
    let out = import(&fewer, &bundle);
    let err = stderr(&out);
    assert!(
        err.contains("context v5#0: it is not in this project")
            && err.contains("context v5#1: it is not in this project"),
        "{err}"
    );
    assert_eq!(pools(&fewer), 0);

    // A bundle cut off, and one whose archive is whole but whose lines stop early.
    let bytes = read(&bundle);
    let cut = dir.path().join("cut.afpool.zip");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let fresh = ingested(dir.path(), "fresh", 12, None);
    let err = stderr(&import(&fresh, &cut));
    assert!(err.contains("cut off or damaged"), "{err}");
    let short = dir.path().join("short.afpool.zip");
    let text = String::from_utf8(unzip(&bytes)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    rezip(&short, &lines[..lines.len() - 2].join("\n"));
    let err = stderr(&import(&fresh, &short));
    assert!(err.contains("without its closing line"), "{err}");
    assert_eq!(pools(&fresh), 0);

    // The whole bundle goes in at once.
    assert!(import(&fresh, &bundle).status.success());
    assert_eq!(pools(&fresh), pools(&a));
}

/// A project that lacks a group of the bundle's contexts (as a corpus ingested by a later afkit
/// can): told to, import takes every context that fits, names the others with their reasons, and
/// stores what the source project stores for the contexts it took.
#[test]
fn told_to_it_imports_the_contexts_that_fit_and_names_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let a = source(dir.path(), &model);
    let bundle = dir.path().join("pools.afpool.zip");
    export(&a, &bundle);
    // Left out: v13's pooled contexts, and every pool primed with one of them.
    let unfit = "SELECT x.ext_id FROM pools p JOIN examples x ON x.id = p.example_id
                 WHERE x.grp = 'v13' OR EXISTS (
                     SELECT 1 FROM json_each(p.style_examples) j
                     JOIN examples y ON y.id = j.value WHERE y.grp = 'v13')";
    let unfit: Vec<String> = rows(&a, unfit)
        .into_iter()
        .map(|row| match &row[0] {
            Value::Text(id) => id.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(unfit.len() > 2, "no pool was primed with v13: {unfit:?}");

    let b = ingested_records(
        dir.path(),
        "without-v13",
        (0..30).filter(|i| i / 2 != 13),
        None,
    );
    let refused = import(&b, &bundle);
    assert!(
        stderr(&refused).contains("--leave-out-unfit"),
        "{}",
        stderr(&refused)
    );
    let out =
        run_ok(command().args(["pool", "import", arg(&b), arg(&bundle), "--leave-out-unfit"]));
    assert!(
        out.contains(&format!("left out {} contexts", unfit.len()))
            && out.contains("v13#0: it is not in this project"),
        "{out}"
    );
    let taken = |tables: Vec<Vec<Vec<Value>>>| -> Vec<Vec<Vec<Value>>> {
        let keep = |row: &Vec<Value>| !matches!(&row[0], Value::Text(id) if unfit.contains(id));
        tables
            .into_iter()
            .map(|t| t.into_iter().filter(keep).collect())
            .collect()
    };
    assert_eq!(stored(&b), taken(stored(&a)));
}

/// A bundle written before the scorer stopped reading endings alone (format version 1, where
/// every score has its reading alone) still imports, those readings with it, and the filter
/// reads them: the same pools and seed without them score the endings otherwise. Once some
/// endings are read without it (a pool grown since), the filter leaves it out and says so.
#[test]
fn a_version_1_bundle_imports_with_its_scorer_readings_alone() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let a = source(dir.path(), &model);
    // The scorer reads the endings grown after the source's filter run.
    run_ok(command().args(tiny_filter(&a, &model)));
    let bundle = dir.path().join("pools.afpool.zip");
    export(&a, &bundle);
    let text = String::from_utf8(unzip(&read(&bundle))).unwrap();
    let old: Vec<String> = text.lines().map(as_version_1).collect();
    let v1 = dir.path().join("v1.afpool.zip");
    rezip(&v1, &old.join("\n"));

    let without = ingested(dir.path(), "without", 30, None);
    let with = ingested(dir.path(), "with", 30, None);
    assert!(import(&without, &bundle).status.success());
    let imported = import(&with, &v1);
    assert!(imported.status.success(), "{}", stderr(&imported));
    let scores = "SELECT COUNT(*) FROM scorer_scores";
    assert!(query_i64(&with, scores) > 0);
    assert_eq!(
        query_i64(&with, &format!("{scores} WHERE ll_alone = ll_cond - 1.0")),
        query_i64(&with, scores)
    );
    assert_eq!(
        query_i64(&without, &format!("{scores} WHERE ll_alone IS NULL")),
        query_i64(&without, scores)
    );
    run_ok(command().args(tiny_filter(&without, &model)));
    let out = run_ok(command().args(tiny_filter(&with, &model)));
    let dropped = "leaves that reading out";
    assert!(!out.contains(dropped), "{out}");
    assert_ne!(af_choices(&with).1, af_choices(&without).1);

    Connection::open(&with)
        .unwrap()
        .execute(
            "UPDATE scorer_scores SET ll_alone = NULL
             WHERE ending_id IN (SELECT id FROM endings WHERE is_gold = 0 LIMIT 5)",
            [],
        )
        .unwrap();
    let mut args = tiny_filter(&with, &model);
    args.push("--new-run".into());
    let out = run_ok(command().args(&args));
    assert!(out.contains(dropped), "{out}");
}

/// A line of a bundle as format version 1 has it: the header's version 1, and every scorer score
/// with a reading alone (here its reading after the context less one).
fn as_version_1(line: &str) -> String {
    let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
    if value.get("format").is_some() {
        value["version"] = 1.into();
    }
    if let Some(endings) = value.pointer_mut("/context/endings") {
        for ending in endings.as_array_mut().unwrap() {
            for score in ending["scores"].as_array_mut().unwrap() {
                assert!(score[2].is_null(), "{score}");
                score[2] = (score[1].as_f64().unwrap() - 1.0).into();
            }
        }
    }
    value.to_string()
}

fn unzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut out = Vec::new();
    archive
        .by_name("pools.jsonl")
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn rezip(path: &Path, text: &str) {
    use std::io::Write;
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    zip.start_file("pools.jsonl", zip::write::SimpleFileOptions::default())
        .unwrap();
    zip.write_all(text.as_bytes()).unwrap();
    zip.finish().unwrap();
}
