//! Direct writers for the generate, filter and annotate tables, so that tests of the later
//! stages (annotate, assemble, export) can build an exact project state by hand — a label
//! fixture per assembly rule, or a whole synthetic filtered project — without running a
//! language model, AF or a terminal UI.

use anyhow::Result;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rusqlite::{params, Connection, TransactionBehavior};

use super::examples::{self, NewExample};
use super::{now, SqlSeed, Store};
use afkit_engine::seed::Seed;

/// The fixture writers, on a test's own connection to a project file (or a transaction on it):
/// tests that build a project row by row also read it back with SQL of their own.
pub struct Fixtures<'c> {
    conn: &'c Connection,
}

impl<'c> Fixtures<'c> {
    pub fn on(conn: &'c Connection) -> Fixtures<'c> {
        Fixtures { conn }
    }

    /// Sets a current project back to schema 5, as an afkit from before the submission counts
    /// left it: for the upgrade's test and for benchmarks against such a build.
    pub fn back_to_schema_5(&self) -> Result<()> {
        self.conn.execute_batch(
            "DROP TRIGGER submissions_counted; DROP TRIGGER submissions_uncounted;
             DROP INDEX tasks_wanting; ALTER TABLE tasks DROP COLUMN submitted;
             ALTER TABLE af_scores DROP COLUMN sentence_score;
             ALTER TABLE af_scores DROP COLUMN style_score;
             DROP TABLE scorer_scores; DROP TABLE fluency_scores; DROP TABLE af_fluency;
             ALTER TABLE af_iterations DROP COLUMN acc_minilm;
             ALTER TABLE af_iterations DROP COLUMN acc_adversary;
             DROP TABLE review_flags; DROP TABLE reviews; DROP TABLE review_items;
             PRAGMA user_version = 5;",
        )?;
        Ok(())
    }

    /// [`Store::upsert_source`], on this connection.
    pub fn upsert_source(
        &self,
        path: &str,
        format: &str,
        sha256: &str,
        options_json: &str,
    ) -> Result<i64> {
        examples::upsert_source(self.conn, path, format, sha256, options_json)
    }

    /// [`Store::insert_example`], on this connection.
    pub fn insert_example(&self, source_id: i64, ex: &NewExample) -> Result<bool> {
        examples::insert_example(self.conn, source_id, ex)
    }
}

impl Fixtures<'_> {
    /// A generation job row; returns its id.
    pub fn insert_generation(&self, model: &str, model_sha256: &str, seed: Seed) -> Result<i64> {
        let conn = self.conn;
        conn.execute(
        "INSERT INTO generations(backend, model, model_sha256, prompt, params, seed, started_at)
         VALUES ('local', ?1, ?2, 'continuation', '{\"n_neg\":8}', ?3, ?4)",
        params![model, model_sha256, SqlSeed(seed), now()],
    )?;
        Ok(conn.last_insert_rowid())
    }

    /// A generated candidate ending with its conditional log-prob; returns the ending id.
    pub fn insert_candidate(
        &self,
        example_id: i64,
        generation_id: i64,
        text: &str,
        lp_cond: f64,
    ) -> Result<i64> {
        let conn = self.conn;
        conn.execute(
        "INSERT INTO endings(example_id, text, is_gold, generation_id, lp_cond) VALUES (?1, ?2, 0, ?3, ?4)",
        params![example_id, text, generation_id, lp_cond],
    )?;
        Ok(conn.last_insert_rowid())
    }

    /// Sets the conditional log-prob of an ending (the found one gets it from the LM stage).
    pub fn set_lp_cond(&self, ending_id: i64, lp_cond: f64) -> Result<()> {
        let conn = self.conn;
        conn.execute(
            "UPDATE endings SET lp_cond = ?2 WHERE id = ?1",
            params![ending_id, lp_cond],
        )?;
        Ok(())
    }

    /// Marks a context's pool complete.
    pub fn insert_pool(&self, example_id: i64, generation_id: i64, produced: i64) -> Result<()> {
        let conn = self.conn;
        conn.execute(
        "INSERT INTO pools(example_id, generation_id, requested, produced, seconds, finished_at)
         VALUES (?1, ?2, ?3, ?3, 0.0, ?4)",
        params![example_id, generation_id, produced, now()],
    )?;
        Ok(())
    }

    /// An AF run (finished or not); returns its id.
    pub fn insert_af_run(&self, k: i64, seed: Seed, finished: bool) -> Result<i64> {
        let conn = self.conn;
        let at = now();
        conn.execute(
        "INSERT INTO af_runs(k, seed, params, started_at, finished_at, status, pool_fingerprint) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'synthetic')",
        params![
            k,
            SqlSeed(seed),
            format!("{{\"k\":{k}}}"),
            at,
            finished.then_some(&at),
            if finished { "done" } else { "running" }
        ],
    )?;
        Ok(conn.last_insert_rowid())
    }

    /// One AF iteration's held-out accuracies (ensemble-phase style when `ensemble` is given).
    pub fn insert_af_iteration(
        &self,
        run_id: i64,
        iteration: i64,
        acc_mlp: f64,
        acc_ensemble: Option<f64>,
    ) -> Result<()> {
        let conn = self.conn;
        conn.execute(
        "INSERT INTO af_iterations(run_id, iteration, phase, swaps, seconds, n_test, acc_mlp, acc_ensemble, finished_at)
         VALUES (?1, ?2, ?3, 0, 0.1, 10, ?4, ?5, ?6)",
        params![
            run_id,
            iteration,
            if acc_ensemble.is_some() { "ensemble" } else { "mlp" },
            acc_mlp,
            acc_ensemble,
            now()
        ],
    )?;
        Ok(())
    }

    /// Assigns `endings` (slots in order) to a context and stores its fold.
    pub fn insert_assignment(
        &self,
        run_id: i64,
        example_id: i64,
        endings: &[i64],
        fold: i64,
    ) -> Result<()> {
        let conn = self.conn;
        for (slot, ending) in endings.iter().enumerate() {
            conn.execute(
                "INSERT INTO af_assignments(run_id, example_id, slot, ending_id, since_iteration)
             VALUES (?1, ?2, ?3, ?4, -1)",
                params![run_id, example_id, slot as i64, ending],
            )?;
        }
        conn.execute(
            "INSERT INTO af_folds(run_id, example_id, fold) VALUES (?1, ?2, ?3)",
            params![run_id, example_id, fold],
        )?;
        Ok(())
    }

    /// The final ensemble score of an ending.
    pub fn insert_score(&self, run_id: i64, ending_id: i64, score: f64) -> Result<()> {
        let conn = self.conn;
        conn.execute(
            "INSERT INTO af_scores(run_id, ending_id, score) VALUES (?1, ?2, ?3)",
            params![run_id, ending_id, score],
        )?;
        Ok(())
    }

    /// An open annotation task showing `endings` in order; returns the task id.
    pub fn insert_task(
        &self,
        example_id: i64,
        run_id: i64,
        round: i64,
        endings: &[i64],
    ) -> Result<i64> {
        let conn = self.conn;
        conn.execute(
            "INSERT INTO tasks(example_id, run_id, round, replicas, seed, status, created_at)
         VALUES (?1, ?2, ?3, 1, 0, 'open', ?4)",
            params![example_id, run_id, round, now()],
        )?;
        let task = conn.last_insert_rowid();
        for (position, ending) in endings.iter().enumerate() {
            conn.execute(
                "INSERT INTO task_endings(task_id, position, ending_id) VALUES (?1, ?2, ?3)",
                params![task, position as i64, ending],
            )?;
        }
        Ok(task)
    }

    /// A submission with one `(ending, judgement, rank)` label per ending; rank is `best`,
    /// `second` or `None`.
    pub fn insert_submission(
        &self,
        task_id: i64,
        annotator: &str,
        broken: bool,
        labels: &[(i64, &str, Option<&str>)],
    ) -> Result<i64> {
        let conn = self.conn;
        conn.execute(
        "INSERT INTO submissions(task_id, annotator, origin, broken, submitted_at) VALUES (?1, ?2, 'tui', ?3, ?4)",
        params![task_id, annotator, broken, now()],
    )?;
        let submission = conn.last_insert_rowid();
        for (ending, judgement, rank) in labels {
            conn.execute(
            "INSERT INTO labels(submission_id, ending_id, judgement, rank) VALUES (?1, ?2, ?3, ?4)",
            params![submission, ending, judgement, rank],
        )?;
        }
        Ok(submission)
    }
}

const SUBJECTS: &[&str] = &[
    "A man",
    "The woman",
    "A young girl",
    "Two boys",
    "A chef",
    "The coach",
    "A dog",
    "Someone",
    "The players",
    "An old man",
];
const VERBS: &[&str] = &[
    "picks up", "throws", "paints", "cuts", "rides", "washes", "kicks", "holds", "folds",
    "carries", "pours", "lifts",
];
const OBJECTS: &[&str] = &[
    "the ball",
    "a bucket of water",
    "the red bicycle",
    "a stack of plates",
    "the rope",
    "a large wooden board",
    "the paint roller",
    "a kite",
    "the blue towel",
    "a loaf of bread",
];
const PLACES: &[&str] = &[
    "in the kitchen",
    "across the field",
    "on the porch",
    "next to the fence",
    "in front of the camera",
    "by the pool",
    "while smiling at the crowd",
    "and then walks slowly back to the table with it",
];

/// A deterministic pseudo-caption ending: 5 to ~25 words.
fn ending(rng: &mut ChaCha8Rng) -> String {
    let mut words = vec![
        VERBS[rng.random_range(0..VERBS.len())].to_string(),
        OBJECTS[rng.random_range(0..OBJECTS.len())].to_string(),
    ];
    for _ in 0..rng.random_range(1..4) {
        words.push(PLACES[rng.random_range(0..PLACES.len())].to_string());
    }
    format!("{}.", words.join(" "))
}

impl Store {
    /// Fills the store with `contexts` examples (ext ids `syn#0`, `syn#1`, ...), each with
    /// `negatives` generated endings, all assigned to one finished AF run with random final
    /// scores. Returns the run id.
    pub fn synthetic_af_project(
        &mut self,
        contexts: usize,
        negatives: usize,
        seed: Seed,
    ) -> Result<i64> {
        let mut rng = seed.rng();
        let tx = self.begin(TransactionBehavior::Deferred)?;
        let fx = Fixtures::on(&tx);
        let generation = fx.insert_generation("synthetic", "synthetic", seed)?;
        let source = fx.upsert_source("synthetic", "jsonl", &format!("synthetic-{seed}"), "{}")?;
        let run = fx.insert_af_run(negatives as i64, seed, true)?;
        for i in 0..contexts {
            let subject = SUBJECTS[rng.random_range(0..SUBJECTS.len())];
            let ex = NewExample {
                ext_id: format!("syn#{i}"),
                group: format!("video{}", i / 3),
                sent1: format!(
                    "Context {i}: {subject} {} {} {}.",
                    VERBS[rng.random_range(0..VERBS.len())],
                    OBJECTS[rng.random_range(0..OBJECTS.len())],
                    PLACES[rng.random_range(0..PLACES.len())]
                ),
                sent2: SUBJECTS[rng.random_range(0..SUBJECTS.len())].to_string(),
                ending: ending(&mut rng),
                gold_source: None,
            };
            fx.insert_example(source, &ex)?;
            let example_id: i64 = tx.query_row(
                "SELECT id FROM examples WHERE ext_id = ?1",
                [&ex.ext_id],
                |r| r.get(0),
            )?;
            let gold_id: i64 = tx.query_row(
                "SELECT id FROM endings WHERE example_id = ?1 AND is_gold = 1",
                [example_id],
                |r| r.get(0),
            )?;
            fx.insert_score(run, gold_id, rng.random::<f64>())?;
            let mut assigned = Vec::with_capacity(negatives);
            for slot in 0..negatives {
                let text = format!("{} (alt {slot})", ending(&mut rng).trim_end_matches('.'));
                let ending_id =
                    fx.insert_candidate(example_id, generation, &format!("{text}."), 0.0)?;
                fx.insert_score(run, ending_id, rng.random::<f64>())?;
                assigned.push(ending_id);
            }
            fx.insert_assignment(run, example_id, &assigned, 0)?;
        }
        tx.commit()?;
        Ok(run)
    }

    /// Replaces the final ensemble scores of the given endings in `run`; `None` removes one, as
    /// in runs that never scored it.
    pub fn set_final_scores(&mut self, run: i64, scores: &[(i64, Option<f64>)]) -> Result<()> {
        let tx = self.begin(TransactionBehavior::Deferred)?;
        for &(ending, score) in scores {
            match score {
                Some(score) => tx.execute(
                    "UPDATE af_scores SET score = ?3 WHERE run_id = ?1 AND ending_id = ?2",
                    params![run, ending, score],
                )?,
                None => tx.execute(
                    "DELETE FROM af_scores WHERE run_id = ?1 AND ending_id = ?2",
                    params![run, ending],
                )?,
            };
        }
        tx.commit()?;
        Ok(())
    }
}
