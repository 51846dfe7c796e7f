//! Adversarial filtering's tables: runs, per-iteration records, the current assignment, the swap
//! history and the final cross-fitted scores (schema section "filter").
//!
//! Contract for later stages: read the latest run with `finished_at IS NOT NULL`
//! ([`Store::latest_finished_af_run`]); its `af_assignments` are the k negatives of every filtered
//! context, and `af_scores` holds the final ensemble score of the gold ending and of every pool
//! ending of those contexts (higher = harder; compare scores within one fold only), with the
//! sentence model's score beside it when the run had one.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, ValueRef};
use rusqlite::{params, Connection, OptionalExtension, Row, ToSql, TransactionBehavior};
use serde::{Deserialize, Serialize};

use super::scorer::ScorerScore;
use super::{now, SqlSeed, Store};
use afkit_engine::seed::Seed;

/// One ending's scores from the final cross-fitted pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FinalScore {
    pub ending_id: i64,
    /// The deciding model's score (the ensemble, or the MLP in an MLP-only run).
    pub ensemble: f32,
    /// The sentence model's own head, when the run had a sentence model.
    pub sentence: Option<f32>,
    /// The word-level heads' scores, standardised on the found endings of the ending's fold and
    /// averaged, when the run had those heads and they found the real endings above chance.
    pub style: Option<f32>,
}

/// One ending of a pool with the generate stage's LM features of it (`None` where it stored
/// NULL) and the readings of it a visit asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolEnding {
    pub id: i64,
    pub text: String,
    pub lp_cond: Option<f64>,
    pub lp_alone: Option<f64>,
    pub lp_final_punct: Option<f64>,
    pub n_tok_ending: Option<i64>,
    /// Its stored sentence vector from the encoder asked for (`None`: none asked for or none
    /// stored).
    pub sentence: Option<Vec<f32>>,
    /// Its stored score from each scorer model asked for, in their order (`None`: not scored).
    pub scores: Vec<Option<ScorerScore>>,
}

/// A context whose pool is complete: its gold ending and its generated candidates.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolContext {
    pub example_id: i64,
    /// The group (video) the context was ingested with.
    pub group: String,
    pub sent1: String,
    pub sent2: String,
    pub ctx_logprob: Option<f64>,
    pub n_tok_sent1: Option<i64>,
    pub n_tok_sent2: Option<i64>,
    pub gold: PoolEnding,
    /// Generated endings (`is_gold = 0`), in id order.
    pub candidates: Vec<PoolEnding>,
}

/// Held-out accuracy per model head; `None` for heads not trained (MLP-only iterations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct HeadAccuracy {
    pub mlp: Option<f64>,
    pub bow: Option<f64>,
    pub cnn: Option<f64>,
    pub lstm: Option<f64>,
    #[serde(default)]
    pub subword: Option<f64>,
    #[serde(default)]
    pub sentence: Option<f64>,
    pub ensemble: Option<f64>,
    /// The fine-tuned MiniLM cross-encoder (`--discriminator minilm`).
    #[serde(default)]
    pub minilm: Option<f64>,
    /// The ensemble and the cross-encoder together, which AF then acts on.
    #[serde(default)]
    pub adversary: Option<f64>,
}

impl HeadAccuracy {
    /// Every head with its accuracy, in the order reports list them.
    pub fn named(&self) -> [(&'static str, Option<f64>); 9] {
        [
            ("mlp", self.mlp),
            ("bow", self.bow),
            ("cnn", self.cnn),
            ("lstm", self.lstm),
            ("subword", self.subword),
            ("sentence", self.sentence),
            ("ensemble", self.ensemble),
            ("minilm", self.minilm),
            ("adversary", self.adversary),
        ]
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct AfRun {
    pub id: i64,
    pub k: usize,
    pub seed: Seed,
    /// JSON object with every hyper-parameter of the run.
    pub params: String,
    pub pool_fingerprint: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub final_accuracy: Option<HeadAccuracy>,
}

/// Which models are trained in an iteration: the phase an iteration belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The cheap perplexity MLP alone (SWAG's first 100 iterations).
    Mlp,
    /// The stylistic models and the ensemble, before the fine-tuned adversary joins: cheap
    /// iterations that take the style out of the negatives, so the adversary's costly ones need
    /// not.
    Style,
    /// All the stylistic models and the ensemble, with the fine-tuned adversary if the run has
    /// one.
    Ensemble,
}

impl Phase {
    /// The name stored in `af_iterations.phase` and shown in reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Mlp => "mlp",
            Phase::Style => "style",
            Phase::Ensemble => "ensemble",
        }
    }
}

/// Stored as its name in `af_iterations.phase`; an unknown name is a read error.
impl ToSql for Phase {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(self.name().into())
    }
}

impl FromSql for Phase {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Phase> {
        match value.as_str()? {
            "mlp" => Ok(Phase::Mlp),
            "style" => Ok(Phase::Style),
            "ensemble" => Ok(Phase::Ensemble),
            other => Err(FromSqlError::Other(
                format!("unknown AF phase {other:?}").into(),
            )),
        }
    }
}

/// One finished AF iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct IterationRecord {
    pub iteration: usize,
    pub phase: Phase,
    pub swaps: usize,
    pub seconds: f64,
    /// Contexts in the held-out 20%.
    pub n_test: usize,
    /// Accuracy on the held-out contexts under the assignment before this iteration's swaps.
    pub accuracy: HeadAccuracy,
}

/// One replaced negative: `slot` of `example_id` went from `old_ending_id` to `new_ending_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swap {
    pub example_id: i64,
    pub slot: usize,
    pub old_ending_id: i64,
    pub new_ending_id: i64,
}

/// The current assignment: per context (example id), the assigned ending ids by slot.
pub type Assignment = BTreeMap<i64, Vec<i64>>;

impl Store {
    /// Visits every context with a complete pool, in example order, with its gold ending and its
    /// candidates (in id order), each with its stored vector from the sentence encoder
    /// `sentence_model` and its stored scores from the scorer models keyed `scorers`. One context
    /// is in memory at a time, so a pool far larger than memory can be read: the endings come
    /// from one scan of the `endings_example` index.
    pub fn for_each_pool_context(
        &self,
        sentence_model: Option<&str>,
        scorers: &[String],
        mut visit: impl FnMut(PoolContext) -> Result<()>,
    ) -> Result<()> {
        let mut contexts_stmt = self.conn.prepare(
            "SELECT x.id, x.sent1, x.sent2, p.ctx_logprob, p.n_tok_sent1, p.n_tok_sent2, x.grp
             FROM examples x JOIN pools p ON p.example_id = x.id ORDER BY x.id",
        )?;
        let contexts = contexts_stmt.query_map([], pool_context_from_row)?;
        // Candidates (is_gold = 0) before the gold ending, each group in id order: the index's
        // own order, so SQLite streams the rows without sorting them.
        let mut endings_stmt = self.conn.prepare(
            "SELECT e.example_id, e.id, e.text, e.is_gold, e.lp_cond, e.lp_alone,
                    e.lp_final_punct, e.n_tok_ending
             FROM endings e INDEXED BY endings_example
             WHERE e.example_id IN (SELECT example_id FROM pools)
             ORDER BY e.example_id, e.is_gold, e.id",
        )?;
        let mut endings = endings_stmt.query_map([], pool_ending_from_row)?.peekable();
        for context in contexts {
            let mut context = context?;
            // This context's rows (an error is taken too, to be returned).
            while let Some(row) = endings.next_if(|row| {
                row.as_ref()
                    .map_or(true, |(example_id, ..)| *example_id == context.example_id)
            }) {
                let (_, is_gold, ending) = row?;
                if is_gold {
                    context.gold = ending;
                } else {
                    context.candidates.push(ending);
                }
            }
            if context.gold.id < 0 {
                bail!(
                    "{}: example {} has a pool but no gold ending row in `endings`",
                    self.path().display(),
                    context.example_id
                );
            }
            for ending in std::iter::once(&mut context.gold).chain(&mut context.candidates) {
                if let Some(model) = sentence_model {
                    ending.sentence = self.sentence_vector(model, ending.id)?;
                }
                ending.scores = scorers
                    .iter()
                    .map(|key| self.scorer_score(key, ending.id))
                    .collect::<Result<_>>()?;
            }
            visit(context)?;
        }
        Ok(())
    }

    /// The most recent AF run, finished or not.
    pub fn latest_af_run(&self) -> Result<Option<AfRun>> {
        Ok(self
            .conn
            .query_row(
                &format!("{RUN_COLUMNS} ORDER BY id DESC LIMIT 1"),
                [],
                run_from_row,
            )
            .optional()?)
    }

    /// The AF run `id`, finished or not.
    pub fn af_run_by_id(&self, id: i64) -> Result<Option<AfRun>> {
        Ok(self
            .conn
            .query_row(&format!("{RUN_COLUMNS} WHERE id = ?1"), [id], run_from_row)
            .optional()?)
    }

    /// The most recent run whose final cross-fitted pass is stored: what later stages read.
    pub fn latest_finished_af_run(&self) -> Result<Option<AfRun>> {
        Ok(self
            .conn
            .query_row(
                &format!("{RUN_COLUMNS} WHERE finished_at IS NOT NULL ORDER BY id DESC LIMIT 1"),
                [],
                run_from_row,
            )
            .optional()?)
    }

    /// Claims the project's AF runs for this process until the returned guard is dropped (or the
    /// process ends, kill -9 included): two `afkit filter` calls on one project would otherwise
    /// both resume the same run and collide on its iterations. The claim is an advisory `flock`
    /// on the project file, which SQLite's own (`fcntl`) locks on Linux do not see.
    pub fn claim_af_runs(&self) -> Result<AfClaim> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(self.path())?;
        // SAFETY: a valid open descriptor, owned by `file` for the whole call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                bail!(
                    "another `afkit filter` is working on {}: wait for it to finish (or stop it \
                     with Ctrl-C; its run resumes when you run filter again)",
                    self.path().display()
                );
            }
            return Err(err.into());
        }
        Ok(AfClaim { _file: file })
    }

    /// Starts a run: abandons the latest run if it is unfinished (its rows stay for the record)
    /// and creates the new one with its initial assignment (recorded with
    /// `since_iteration = -1`), in one transaction.
    pub fn start_af_run(
        &mut self,
        k: usize,
        seed: Seed,
        params_json: &str,
        pool_fingerprint: &str,
        initial: &Assignment,
    ) -> Result<AfRun> {
        let tx = self.begin(TransactionBehavior::Deferred)?;
        tx.execute(
            "UPDATE af_runs SET status = 'abandoned'
             WHERE id = (SELECT MAX(id) FROM af_runs) AND finished_at IS NULL",
            [],
        )?;
        tx.execute(
            "INSERT INTO af_runs(k, seed, params, pool_fingerprint, started_at, status)
             VALUES (?1, ?2, ?3, ?4, ?5, 'running')",
            params![
                k as i64,
                SqlSeed(seed),
                params_json,
                pool_fingerprint,
                now()
            ],
        )?;
        let run_id = tx.last_insert_rowid();
        {
            let mut insert = tx.prepare(
                "INSERT INTO af_assignments(run_id, example_id, slot, ending_id, since_iteration)
                 VALUES (?1, ?2, ?3, ?4, -1)",
            )?;
            for (example_id, endings) in initial {
                for (slot, ending_id) in endings.iter().enumerate() {
                    insert.execute(params![run_id, example_id, slot as i64, ending_id])?;
                }
            }
        }
        let run = tx.query_row(
            &format!("{RUN_COLUMNS} WHERE id = ?1"),
            [run_id],
            run_from_row,
        )?;
        tx.commit()?;
        Ok(run)
    }

    /// The current assignment of a run.
    pub fn af_assignment(&self, run_id: i64) -> Result<Assignment> {
        let mut stmt = self.conn.prepare(
            "SELECT example_id, ending_id FROM af_assignments WHERE run_id = ?1
             ORDER BY example_id, slot",
        )?;
        let mut out = Assignment::new();
        let rows = stmt.query_map([run_id], |r| Ok((r.get::<_, i64>(0)?, r.get(1)?)))?;
        for row in rows {
            let (example_id, ending_id) = row?;
            out.entry(example_id).or_default().push(ending_id);
        }
        Ok(out)
    }

    /// For each assigned ending of a run: the iteration that brought it in (-1 = initial draw).
    pub fn af_assignment_origins(&self, run_id: i64) -> Result<BTreeMap<i64, i64>> {
        let mut stmt = self
            .conn
            .prepare("SELECT ending_id, since_iteration FROM af_assignments WHERE run_id = ?1")?;
        let rows = stmt.query_map([run_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The finished iterations of a run, in order.
    pub fn af_iterations(&self, run_id: i64) -> Result<Vec<IterationRecord>> {
        let mut stmt = self.conn.prepare(
            "SELECT iteration, phase, swaps, seconds, n_test, acc_mlp, acc_bow, acc_cnn, acc_lstm,
                    acc_ensemble, acc_subword, acc_sentence, acc_minilm, acc_adversary
             FROM af_iterations WHERE run_id = ?1 ORDER BY iteration",
        )?;
        let rows = stmt.query_map([run_id], |r| {
            Ok(IterationRecord {
                iteration: r.get::<_, i64>(0)? as usize,
                phase: r.get(1)?,
                swaps: r.get::<_, i64>(2)? as usize,
                seconds: r.get(3)?,
                n_test: r.get::<_, i64>(4)? as usize,
                accuracy: HeadAccuracy {
                    mlp: r.get(5)?,
                    bow: r.get(6)?,
                    cnn: r.get(7)?,
                    lstm: r.get(8)?,
                    subword: r.get(10)?,
                    sentence: r.get(11)?,
                    ensemble: r.get(9)?,
                    minilm: r.get(12)?,
                    adversary: r.get(13)?,
                },
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Stores one iteration: its record, its swaps and the updated assignment, in one transaction,
    /// so an interrupted `afkit filter` resumes from the last iteration stored here.
    pub fn commit_af_iteration(
        &mut self,
        run_id: i64,
        record: &IterationRecord,
        swaps: &[Swap],
    ) -> Result<()> {
        let tx = self.begin(TransactionBehavior::Deferred)?;
        insert_iteration(&tx, run_id, record)?;
        apply_swaps(&tx, run_id, record.iteration, swaps)?;
        tx.commit()?;
        Ok(())
    }

    /// Stores the final cross-fitted pass and marks the run finished, atomically.
    /// `folds`: (example id, fold); `scores`: (ending id, final ensemble score).
    pub fn finish_af_run(
        &mut self,
        run_id: i64,
        folds: &[(i64, usize)],
        scores: &[FinalScore],
        final_accuracy: &HeadAccuracy,
    ) -> Result<()> {
        let tx = self.begin(TransactionBehavior::Deferred)?;
        tx.execute("DELETE FROM af_folds WHERE run_id = ?1", [run_id])?;
        tx.execute("DELETE FROM af_scores WHERE run_id = ?1", [run_id])?;
        {
            let mut fold_stmt =
                tx.prepare("INSERT INTO af_folds(run_id, example_id, fold) VALUES (?1, ?2, ?3)")?;
            for (example_id, fold) in folds {
                fold_stmt.execute(params![run_id, example_id, *fold as i64])?;
            }
            let mut score_stmt = tx.prepare(
                "INSERT INTO af_scores(run_id, ending_id, score, sentence_score, style_score)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for s in scores {
                score_stmt.execute(params![
                    run_id,
                    s.ending_id,
                    s.ensemble as f64,
                    s.sentence.map(f64::from),
                    s.style.map(f64::from)
                ])?;
            }
        }
        tx.execute(
            "UPDATE af_runs SET finished_at = ?2, final_accuracy = ?3, status = 'done' WHERE id = ?1",
            params![run_id, now(), serde_json::to_string(final_accuracy)?],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Final ensemble scores of a run: ending id → score.
    pub fn af_scores(&self, run_id: i64) -> Result<BTreeMap<i64, f64>> {
        let mut stmt = self
            .conn
            .prepare("SELECT ending_id, score FROM af_scores WHERE run_id = ?1")?;
        let rows = stmt.query_map([run_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Cross-fitting fold of every context of a run: example id → fold.
    pub fn af_folds(&self, run_id: i64) -> Result<BTreeMap<i64, usize>> {
        let mut stmt = self
            .conn
            .prepare("SELECT example_id, fold FROM af_folds WHERE run_id = ?1")?;
        let rows = stmt.query_map([run_id], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as usize)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

/// Adds an iteration's record to `af_iterations`.
fn insert_iteration(conn: &Connection, run_id: i64, record: &IterationRecord) -> Result<()> {
    let a = &record.accuracy;
    conn.execute(
        "INSERT INTO af_iterations(run_id, iteration, phase, swaps, seconds, n_test, acc_mlp,
                                   acc_bow, acc_cnn, acc_lstm, acc_ensemble, finished_at,
                                   acc_subword, acc_sentence, acc_minilm, acc_adversary)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
        params![
            run_id,
            record.iteration as i64,
            record.phase,
            record.swaps as i64,
            record.seconds,
            record.n_test as i64,
            a.mlp,
            a.bow,
            a.cnn,
            a.lstm,
            a.ensemble,
            now(),
            a.subword,
            a.sentence,
            a.minilm,
            a.adversary
        ],
    )?;
    Ok(())
}

/// Logs iteration `iteration`'s swaps in `af_swaps` and makes them in `af_assignments`; a swap
/// whose slot no longer holds its old ending is an error.
fn apply_swaps(conn: &Connection, run_id: i64, iteration: usize, swaps: &[Swap]) -> Result<()> {
    let mut log = conn.prepare(
        "INSERT INTO af_swaps(run_id, iteration, example_id, slot, old_ending_id, new_ending_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let mut update = conn.prepare(
        "UPDATE af_assignments SET ending_id = ?4, since_iteration = ?5
         WHERE run_id = ?1 AND example_id = ?2 AND slot = ?3 AND ending_id = ?6",
    )?;
    for s in swaps {
        log.execute(params![
            run_id,
            iteration as i64,
            s.example_id,
            s.slot as i64,
            s.old_ending_id,
            s.new_ending_id
        ])?;
        let changed = update.execute(params![
            run_id,
            s.example_id,
            s.slot as i64,
            s.new_ending_id,
            iteration as i64,
            s.old_ending_id
        ])?;
        if changed != 1 {
            bail!(
                "AF run {run_id}: slot {} of example {} does not hold ending {}",
                s.slot,
                s.example_id,
                s.old_ending_id
            );
        }
    }
    Ok(())
}

/// This process's claim on a project's AF runs ([`Store::claim_af_runs`]); released when dropped.
pub struct AfClaim {
    _file: std::fs::File,
}

/// A pool's context without its endings yet (the gold's id is -1 until its row is read).
fn pool_context_from_row(r: &Row<'_>) -> rusqlite::Result<PoolContext> {
    Ok(PoolContext {
        example_id: r.get(0)?,
        group: r.get(6)?,
        sent1: r.get(1)?,
        sent2: r.get(2)?,
        ctx_logprob: r.get(3)?,
        n_tok_sent1: r.get(4)?,
        n_tok_sent2: r.get(5)?,
        gold: PoolEnding {
            id: -1,
            ..PoolEnding::default()
        },
        candidates: Vec::new(),
    })
}

/// One ending of a pool as (example id, whether it is the gold, the ending).
fn pool_ending_from_row(r: &Row<'_>) -> rusqlite::Result<(i64, bool, PoolEnding)> {
    let ending = PoolEnding {
        id: r.get(1)?,
        text: r.get(2)?,
        lp_cond: r.get(4)?,
        lp_alone: r.get(5)?,
        lp_final_punct: r.get(6)?,
        n_tok_ending: r.get(7)?,
        ..PoolEnding::default()
    };
    Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(3)? != 0, ending))
}

const RUN_COLUMNS: &str = "SELECT id, k, seed, params, pool_fingerprint, started_at, finished_at,
        final_accuracy FROM af_runs";

fn run_from_row(r: &Row<'_>) -> rusqlite::Result<AfRun> {
    let final_accuracy: Option<String> = r.get(7)?;
    Ok(AfRun {
        id: r.get(0)?,
        k: r.get::<_, i64>(1)? as usize,
        seed: r.get::<_, SqlSeed>(2)?.0,
        params: r.get(3)?,
        pool_fingerprint: r.get(4)?,
        started_at: r.get(5)?,
        finished_at: r.get(6)?,
        final_accuracy: final_accuracy.and_then(|s| serde_json::from_str(&s).ok()),
    })
}

/// Endings of pools (found and generated) without a vector from the encoder named `?1` (one
/// made by another encoder, or an earlier build of it, does not count: it is made again and
/// replaces the old one).
const WITHOUT_SENTENCE_VECTOR: &str = "e.example_id IN (SELECT example_id FROM pools)
    AND e.id NOT IN (SELECT ending_id FROM sentence_vectors WHERE model = ?1)";

/// The sentence model's vectors, stored per ending so that a resumed or repeated `afkit filter`
/// embeds each ending once.
impl Store {
    /// Endings of pools (found and generated) that have no sentence vector yet, as
    /// (ending id, `sent2 + " " + ending`), in id order, at most `limit`.
    pub fn endings_without_sentence_vector(
        &self,
        model: &str,
        limit: usize,
    ) -> Result<Vec<(i64, String)>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT e.id, x.sent2 || ' ' || e.text FROM endings e
             JOIN examples x ON x.id = e.example_id
             WHERE {WITHOUT_SENTENCE_VECTOR} ORDER BY e.id LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![model, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// How many endings of pools have no sentence vector from `model` yet.
    pub fn count_endings_without_sentence_vector(&self, model: &str) -> Result<usize> {
        let n: i64 = self.conn.query_row(
            &format!("SELECT COUNT(*) FROM endings e WHERE {WITHOUT_SENTENCE_VECTOR}"),
            [model],
            |r| r.get(0),
        )?;
        Ok(n as usize)
    }

    /// Stores vectors made by `model`, in one transaction.
    pub fn put_sentence_vectors(&mut self, model: &str, rows: &[(i64, Vec<f32>)]) -> Result<()> {
        let tx = self.begin(TransactionBehavior::Deferred)?;
        {
            let mut stmt = tx.prepare(
                "INSERT OR REPLACE INTO sentence_vectors(ending_id, model, vector) VALUES (?1, ?2, ?3)",
            )?;
            for (id, vector) in rows {
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                stmt.execute(params![id, model, bytes])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The stored vector of an ending from `model`, if any.
    fn sentence_vector(&self, model: &str, ending_id: i64) -> Result<Option<Vec<f32>>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT vector FROM sentence_vectors WHERE ending_id = ?1 AND model = ?2",
        )?;
        let bytes: Option<Vec<u8>> = stmt
            .query_row(params![ending_id, model], |r| r.get(0))
            .optional()?;
        Ok(bytes.map(|b| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        }))
    }
}
