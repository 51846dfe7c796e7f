//! What the integration tests share: the helpers that run the `afkit` binary, projects written
//! through the store (examples only, for the model stages; and the hand-made projects of the
//! export tests: contexts with candidate endings, AF assignments and scores written straight
//! into the project file, no model runs), a tiny random model, and a terminal (`tmux`).

pub mod tmux;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use afkit_engine::fixtures::write_tiny_llama;
use afkit_engine::seed::Seed;
use afkit_store::examples::NewExample;
use afkit_store::fixtures::Fixtures;
use afkit_store::Store;
use rusqlite::Connection;
use serde_json::Value;

/// The rows of a CSV file: header, then records.
pub fn csv_table(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut reader = csv::Reader::from_path(path).unwrap();
    let header = reader.headers().unwrap().iter().map(String::from).collect();
    let rows = reader
        .records()
        .map(|r| r.unwrap().iter().map(String::from).collect())
        .collect();
    (header, rows)
}

/// The afkit binary under test, for commands run through a shell or a terminal.
pub const BIN: &str = env!("CARGO_BIN_EXE_afkit");

/// A command running afkit with progress bars off, so that its output holds only the results.
pub fn command() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("AFKIT_NO_PROGRESS", "1");
    cmd
}

pub fn afkit(args: &[&str]) -> Output {
    command().args(args).output().expect("run afkit")
}

/// Runs afkit with `args`, expecting success; returns its standard output.
pub fn ok(args: &[&str]) -> String {
    succeeded(afkit(args))
}

/// Runs afkit with `args`, expecting failure; returns its error output.
pub fn fails(args: &[&str]) -> String {
    let out = afkit(args);
    assert!(
        !out.status.success(),
        "afkit {args:?} should have failed:\n{}",
        stdout(&out)
    );
    stderr(&out)
}

/// Runs a prepared afkit command, expecting success; returns its standard output.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run afkit");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Fails the test, showing both outputs, unless the run succeeded.
pub fn assert_succeeded(out: &Output) {
    assert!(
        out.status.success(),
        "the run failed:\n{}\n{}",
        stdout(out),
        stderr(out)
    );
}

/// The standard output of a run that must have succeeded.
pub fn succeeded(out: Output) -> String {
    assert_succeeded(&out);
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A path as a command-line argument (test paths are UTF-8).
pub fn arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// A context as the fixture built it: its example id, found ending id and candidate ending ids
/// hardest first (candidate i has AF score 100 - i; the first `k` are assigned).
pub struct Ctx {
    pub example: i64,
    pub found: i64,
    pub cands: Vec<i64>,
}

impl Ctx {
    /// The six endings of its first task: the found one and the five hardest assigned negatives.
    pub fn shown(&self) -> Vec<i64> {
        std::iter::once(self.found)
            .chain(self.cands[..5].iter().copied())
            .collect()
    }
}

pub struct Project {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    pub conn: Connection,
    pub source: i64,
    pub generation: i64,
    pub run: i64,
}

impl Project {
    pub fn new() -> Project {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sqlite");
        let store = Store::create(&path).unwrap();
        drop(store);
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "foreign_keys", true).unwrap();
        let source = Fixtures::on(&conn)
            .upsert_source("captions.json", "activitynet", "abc123", "{}")
            .unwrap();
        let generation = Fixtures::on(&conn)
            .insert_generation("SmolLM2-135M-Instruct.Q4_1.gguf", "b179c952", Seed::new(5))
            .unwrap();
        let run = Fixtures::on(&conn)
            .insert_af_run(8, Seed::new(11), true)
            .unwrap();
        Fixtures::on(&conn)
            .insert_af_iteration(run, 0, 0.61, None)
            .unwrap();
        Fixtures::on(&conn)
            .insert_af_iteration(run, 1, 0.40, Some(0.35))
            .unwrap();
        Project {
            _dir: dir,
            path,
            conn,
            source,
            generation,
            run,
        }
    }

    pub fn p(&self) -> &str {
        self.path.to_str().unwrap()
    }

    /// A context of `group` with `n` candidates of which the `k` hardest are assigned.
    pub fn context(&self, group: &str, index: usize, n: usize, k: usize) -> Ctx {
        let ext_id = format!("{group}#{index}");
        let ex = NewExample {
            ext_id: ext_id.clone(),
            group: group.into(),
            sent1: format!("A person in video {group} walks into room {index}."),
            sent2: "The person".into(),
            ending: format!("sits down at table {index}."),
            gold_source: None,
        };
        assert!(Fixtures::on(&self.conn)
            .insert_example(self.source, &ex)
            .unwrap());
        let (example, found): (i64, i64) = self
            .conn
            .query_row(
                "SELECT x.id, e.id FROM examples x JOIN endings e ON e.example_id = x.id AND e.is_gold = 1
                 WHERE x.ext_id = ?1",
                [&ext_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        Fixtures::on(&self.conn).set_lp_cond(found, -2.0).unwrap();
        let cands: Vec<i64> = (0..n)
            .map(|i| {
                Fixtures::on(&self.conn)
                    .insert_candidate(
                        example,
                        self.generation,
                        &format!("does thing {i} in {ext_id}."),
                        -3.0,
                    )
                    .unwrap()
            })
            .collect();
        Fixtures::on(&self.conn)
            .insert_pool(example, self.generation, n as i64)
            .unwrap();
        Fixtures::on(&self.conn)
            .insert_assignment(self.run, example, &cands[..k], example % 5)
            .unwrap();
        for (i, &c) in cands[..k].iter().enumerate() {
            Fixtures::on(&self.conn)
                .insert_score(self.run, c, 100.0 - i as f64)
                .unwrap();
        }
        Fixtures::on(&self.conn)
            .insert_score(self.run, found, 50.0)
            .unwrap();
        Ctx {
            example,
            found,
            cands,
        }
    }

    pub fn task(&self, ctx: &Ctx, round: i64, endings: &[i64]) -> i64 {
        Fixtures::on(&self.conn)
            .insert_task(ctx.example, self.run, round, endings)
            .unwrap()
    }

    /// Labels a first-round task: `found` for the found ending, `gens[i]` for the i-th hardest.
    pub fn label(
        &self,
        task: i64,
        ctx: &Ctx,
        annotator: &str,
        found: (&str, Option<&str>),
        gens: [(&str, Option<&str>); 5],
    ) {
        let mut labels = vec![(ctx.found, found.0, found.1)];
        labels.extend(
            gens.iter()
                .enumerate()
                .map(|(i, g)| (ctx.cands[i], g.0, g.1)),
        );
        Fixtures::on(&self.conn)
            .insert_submission(task, annotator, false, &labels)
            .unwrap();
    }

    pub fn assemble(&self, extra: &[&str]) -> Value {
        let mut args = vec!["assemble", self.p(), "--json"];
        args.extend_from_slice(extra);
        serde_json::from_str(&ok(&args)).unwrap()
    }

    /// The endings of the open (re-annotation) tasks.
    pub fn open_task_endings(&self) -> BTreeSet<i64> {
        self.conn
            .prepare(
                "SELECT ending_id FROM task_endings JOIN tasks ON tasks.id = task_id
                 WHERE status = 'open'",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    /// (gold-source, gold ending id, split, distractor ids) of every assembled example.
    pub fn assembled(&self) -> Vec<(String, i64, String, Vec<i64>)> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, gold_source, gold_ending_id, split FROM assembled ORDER BY id")
            .unwrap();
        let rows: Vec<(i64, String, i64, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows.into_iter()
            .map(|(id, source, gold, split)| {
                let mut stmt = self
                    .conn
                    .prepare("SELECT ending_id FROM assembled_distractors WHERE assembled_id = ?1 ORDER BY position")
                    .unwrap();
                let d = stmt.query_map([id], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
                (source, gold, split, d)
            })
            .collect()
    }
}

/// An example as the tests write it: (ext id, sent1, sent2, found ending). Its group is the id up
/// to a `#`, or the whole id.
pub type ExampleText = (String, String, String, String);

/// A project file `dir/p.sqlite` holding `examples`, written through the store (the tests that
/// use it are not about ingest).
pub fn examples_project(dir: &Path, examples: &[ExampleText]) -> PathBuf {
    let path = dir.join("p.sqlite");
    Store::create(&path).unwrap();
    let conn = Connection::open(&path).unwrap();
    let source = Fixtures::on(&conn)
        .upsert_source("test.jsonl", "jsonl", "test", "{}")
        .unwrap();
    for (id, sent1, sent2, ending) in examples {
        let example = NewExample {
            ext_id: id.clone(),
            group: id.split('#').next().unwrap().to_string(),
            sent1: sent1.clone(),
            sent2: sent2.clone(),
            ending: ending.clone(),
            gold_source: None,
        };
        Fixtures::on(&conn)
            .insert_example(source, &example)
            .unwrap();
    }
    path
}

/// One integer from a query on the project file (a count, an id).
pub fn query_i64(path: &Path, sql: &str) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

/// A random-weight llama in GGUF with afkit's test vocabulary: `d_model` wide, `n_layer` deep.
/// Its endings are gibberish; the tests that use it check the pipeline, not the text.
pub fn tiny_gguf(dir: &Path, d_model: usize, n_layer: usize) -> PathBuf {
    let path = dir.join("tiny.gguf");
    write_tiny_llama(&path, d_model, n_layer, Seed::new(1)).unwrap();
    path
}

pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn unverified_project(groups: usize) -> Project {
    let p = Project::new();
    for g in 0..groups {
        for i in 0..2 {
            p.context(&format!("vid{g:02}"), i, 10, 8);
        }
    }
    p.assemble(&["--unverified", "--seed", "1"]);
    p
}

/// The (group, sent1, sent2, found ending) of every example of a project.
pub fn example_texts(path: &Path) -> BTreeSet<(String, String, String, String)> {
    Store::open(path)
        .unwrap()
        .examples()
        .unwrap()
        .into_iter()
        .map(|e| (e.group, e.sent1, e.sent2, e.ending))
        .collect()
}

/// A project of `n` examples, two per group (`v0`, `v1`, ...), ingested from JSONL.
pub fn jsonl_project(dir: &Path, n: usize) -> PathBuf {
    let input = dir.join("in.jsonl");
    let lines: Vec<String> = (0..n)
        .map(|i| {
            serde_json::json!({
                "id": format!("v{}#{}", i / 2, i % 2),
                "group": format!("v{}", i / 2),
                "sent1": format!("A person number {i} walks into a large room."),
                "sent2": "The person",
                "ending": format!("sits down on chair number {i} and waits."),
            })
            .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).unwrap();
    let p = dir.join("p.sqlite");
    run_ok(command().arg("init").arg(&p));
    run_ok(command().args(["ingest", arg(&p), "--format", "jsonl", arg(&input)]));
    p
}

/// `afkit lm adapt` with small, quick settings (one adapted layer of rank 2, 16-token lines,
/// 3 epochs, seed 5) into `folds` folds.
pub fn lm_adapt(project: &Path, model: &Path, folds: usize) -> Command {
    let mut cmd = command();
    cmd.args(["lm", "adapt", arg(project), "--model", arg(model)]);
    cmd.args([
        "--layers",
        "1",
        "--rank",
        "2",
        "--seq-len",
        "16",
        "--epochs",
        "3",
    ]);
    cmd.args(["--folds", &folds.to_string(), "--seed", "5"]);
    cmd
}

/// The id `crowd export` wrote into `tasks` for the project's task `task_id` (the project's
/// fingerprint and the task's number).
pub fn crowd_item(tasks: &Path, task_id: i64) -> String {
    let suffix = format!("-{task_id}");
    let mut reader = csv::Reader::from_path(tasks).unwrap();
    reader
        .records()
        .map(|r| r.unwrap()[0].to_string())
        .find(|id| id.ends_with(&suffix))
        .unwrap_or_else(|| panic!("no item for task {task_id} in {}", tasks.display()))
}
