//! The items to verify: tasks made from the filter stage's results, the views the UI and crowd
//! files show, the recorded hand-out policy, and the re-annotation tasks assemble queues.

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rusqlite::{params, OptionalExtension};

use crate::{get_meta, now, set_meta, SqlSeed, Store};
use afkit_engine::seed::{Key, Seed};

/// How items are handed out: the first `agreement_items` round-0 tasks go to `replicas`
/// annotators each, the rest to one; `seed` fixes the order of contexts and every shuffle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub agreement_items: i64,
    pub replicas: i64,
    pub seed: Seed,
}

impl Policy {
    const KEYS: [&'static str; 3] = [
        "annotate.agreement_items",
        "annotate.replicas",
        "annotate.seed",
    ];
}

/// The policy of a project that has recorded none (no task made yet).
impl Default for Policy {
    fn default() -> Policy {
        Policy {
            agreement_items: 100,
            replicas: 3,
            seed: Seed::new(0),
        }
    }
}

impl Store {
    /// The policy recorded in the project, if tasks were made before.
    pub fn stored_policy(&self) -> Result<Option<Policy>> {
        let conn = &self.conn;
        let mut values = Vec::new();
        for key in Policy::KEYS {
            match get_meta(conn, key)? {
                Some(v) => values.push(v),
                None => return Ok(None),
            }
        }
        let parse = |i: usize| -> Result<i64> {
            values[i].parse().with_context(|| {
                format!(
                    "meta {} = {:?} is not an integer",
                    Policy::KEYS[i],
                    values[i]
                )
            })
        };
        Ok(Some(Policy {
            agreement_items: parse(0)?,
            replicas: parse(1)?,
            seed: Seed::new(parse(2)? as u64),
        }))
    }

    /// Records the policy and sets `replicas` of every round-0 task from it: R for the first M
    /// by id, else 1.
    fn record_policy(&self, policy: &Policy) -> Result<()> {
        let conn = &self.conn;
        set_meta(conn, Policy::KEYS[0], &policy.agreement_items.to_string())?;
        set_meta(conn, Policy::KEYS[1], &policy.replicas.to_string())?;
        set_meta(
            conn,
            Policy::KEYS[2],
            &(policy.seed.value() as i64).to_string(),
        )?;
        conn.execute(
            "UPDATE tasks SET replicas = CASE WHEN id IN
            (SELECT id FROM tasks WHERE round = 0 ORDER BY id LIMIT ?1) THEN ?2 ELSE 1 END
         WHERE round = 0",
            params![policy.agreement_items, policy.replicas],
        )?;
        Ok(())
    }
}

/// A context of an AF run that has no task yet, with its candidates for one.
#[derive(Debug, Clone, PartialEq)]
pub struct UntaskedContext {
    pub example_id: i64,
    pub gold_ending_id: i64,
    /// The assigned negatives, hardest (highest final ensemble score) first; endings without a
    /// score come last, in id order.
    pub negatives: Vec<i64>,
}

impl Store {
    /// Whether some context of `run_id` has assigned negatives but no task yet.
    pub fn has_untasked_contexts(&self, run_id: i64) -> Result<bool> {
        Ok(self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM af_assignments a WHERE a.run_id = ?1
               AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.example_id = a.example_id))",
            [run_id],
            |r| r.get(0),
        )?)
    }

    /// Contexts of `run_id` that no task (of any run or round) shows yet, in example id order.
    pub fn untasked_contexts(&self, run_id: i64) -> Result<Vec<UntaskedContext>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
            "SELECT a.example_id, g.id, a.ending_id
         FROM af_assignments a
         JOIN endings g ON g.example_id = a.example_id AND g.is_gold = 1
         LEFT JOIN af_scores s ON s.run_id = a.run_id AND s.ending_id = a.ending_id
         WHERE a.run_id = ?1
           AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.example_id = a.example_id)
         ORDER BY a.example_id, s.score IS NULL, s.score DESC, a.ending_id",
        )?;
        let mut out: Vec<UntaskedContext> = Vec::new();
        let mut rows = stmt.query([run_id])?;
        while let Some(r) = rows.next()? {
            let (example_id, gold, ending): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            match out.last_mut() {
                Some(last) if last.example_id == example_id => last.negatives.push(ending),
                _ => out.push(UntaskedContext {
                    example_id,
                    gold_ending_id: gold,
                    negatives: vec![ending],
                }),
            }
        }
        Ok(out)
    }
}

/// Endings shown per task: the found one and five negatives, as in SWAG.
pub const ENDINGS_PER_TASK: usize = 6;

/// A task to store. Its `endings` are shown in the order its `seed` fixes, whatever their order
/// here, so that the order can be reproduced from the recorded seed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NewTask {
    pub example_id: i64,
    pub run_id: i64,
    pub round: i64,
    pub replicas: i64,
    pub seed: Seed,
    pub endings: Vec<i64>,
}

impl Store {
    /// Stores a round-0 task of AF run `run_id` for each of `contexts`, in their order after the
    /// tasks already made: for the policy's `replicas` annotators while within its first
    /// `agreement_items`, else for one. Each task gets its seed (derived from the policy's seed
    /// and the context, recorded with it) and shows the endings `shown` chooses for the context
    /// with that seed, in the seed's order. Then records `policy` if the project holds another (which
    /// re-targets the replicas of every round-0 task).
    pub fn add_round0_tasks(
        &self,
        run_id: i64,
        policy: &Policy,
        contexts: &[UntaskedContext],
        mut shown: impl FnMut(&UntaskedContext, Seed) -> Vec<i64>,
    ) -> Result<()> {
        let first_index = self.count_round0_tasks()?;
        for (index, context) in (first_index..).zip(contexts) {
            let seed = task_seed(policy.seed, context.example_id, 0);
            self.insert_task(&NewTask {
                example_id: context.example_id,
                run_id,
                round: 0,
                replicas: if index < policy.agreement_items {
                    policy.replicas
                } else {
                    1
                },
                seed,
                endings: shown(context, seed),
            })?;
        }
        if self.stored_policy()? != Some(*policy) {
            self.record_policy(policy)?;
        }
        Ok(())
    }

    pub(crate) fn insert_task(&self, task: &NewTask) -> Result<i64> {
        let conn = &self.conn;
        let mut endings = task.endings.clone();
        shuffle_endings(&mut endings, task.seed);
        conn.execute(
            "INSERT INTO tasks(example_id, run_id, round, replicas, seed, status, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'open', ?6)",
            params![
                task.example_id,
                task.run_id,
                task.round,
                task.replicas,
                SqlSeed(task.seed),
                now()
            ],
        )?;
        let task_id = conn.last_insert_rowid();
        let mut stmt = conn.prepare(
            "INSERT INTO task_endings(task_id, position, ending_id) VALUES (?1, ?2, ?3)",
        )?;
        for (position, ending) in endings.iter().enumerate() {
            stmt.execute(params![task_id, position as i64, ending])?;
        }
        Ok(task_id)
    }

    fn count_round0_tasks(&self) -> Result<i64> {
        let conn = &self.conn;
        Ok(
            conn.query_row("SELECT COUNT(*) FROM tasks WHERE round = 0", [], |r| {
                r.get(0)
            })?,
        )
    }

    /// The open task of a context (its latest round), if any: `(task_id, run_id, round)`.
    fn open_task_of(&self, example_id: i64) -> Result<Option<(i64, i64, i64)>> {
        let conn = &self.conn;
        Ok(conn
            .query_row(
                "SELECT id, run_id, round FROM tasks WHERE example_id = ?1 AND status = 'open'
             ORDER BY round DESC LIMIT 1",
                [example_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }

    fn max_round(&self, example_id: i64) -> Result<Option<i64>> {
        let conn = &self.conn;
        Ok(conn.query_row(
            "SELECT MAX(round) FROM tasks WHERE example_id = ?1",
            [example_id],
            |r| r.get(0),
        )?)
    }

    /// Marks every open task of a context superseded and drops claims on them.
    fn supersede_tasks_of(&self, example_id: i64) -> Result<()> {
        let conn = &self.conn;
        conn.execute(
            "DELETE FROM claims WHERE task_id IN
           (SELECT id FROM tasks WHERE example_id = ?1 AND status = 'open')",
            [example_id],
        )?;
        conn.execute(
            "UPDATE tasks SET status = 'superseded' WHERE example_id = ?1 AND status = 'open'",
            [example_id],
        )?;
        Ok(())
    }

    /// Endings of a context that the caller may show: `(ending_id, is_gold)` of every ending row.
    fn endings_of_example(&self, example_id: i64) -> Result<HashMap<i64, bool>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare("SELECT id, is_gold FROM endings WHERE example_id = ?1")?;
        let rows = stmt.query_map([example_id], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? != 0)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

// ----- re-annotation: the hand-off from assemble -----

impl Store {
    /// Queues a re-annotation of a context (SWAG fn. 6): a new task one round after its current one,
    /// showing `endings` (the found ending among them, 2 to 6 distinct endings of this context) in an
    /// order shuffled with a seed derived from the project's annotation seed, the context and the
    /// round, and recorded in the task. The old open task is marked superseded and its claims
    /// dropped. One annotator per re-annotated item, as SWAG did after its agreement sample.
    /// Assemble calls it inside its own transaction, so that the assembly and the tasks it queues
    /// are committed together; returns the new task id.
    pub(crate) fn create_reannotation_task(&self, example_id: i64, endings: &[i64]) -> Result<i64> {
        self.check_reannotation_endings(example_id, endings)?;
        let (run_id, round) = self.next_round(example_id)?;
        let policy_seed = self.stored_policy()?.unwrap_or_default().seed;
        let seed = task_seed(policy_seed, example_id, round);
        self.supersede_tasks_of(example_id)?;
        self.insert_task(&NewTask {
            example_id,
            run_id,
            round,
            replicas: 1,
            seed,
            endings: endings.to_vec(),
        })
    }

    /// A re-annotation shows 2 to [`ENDINGS_PER_TASK`] distinct endings of the context, its found
    /// ending among them.
    fn check_reannotation_endings(&self, example_id: i64, endings: &[i64]) -> Result<()> {
        let known = self.endings_of_example(example_id)?;
        if !(2..=ENDINGS_PER_TASK).contains(&endings.len()) {
            bail!(
                "a re-annotation task of example {example_id} needs 2 to {ENDINGS_PER_TASK} endings, got {}",
                endings.len()
            );
        }
        let mut seen = HashSet::new();
        for id in endings {
            if !known.contains_key(id) {
                bail!("ending {id} does not belong to example {example_id}");
            }
            if !seen.insert(id) {
                bail!("ending {id} is listed twice for example {example_id}");
            }
        }
        if !endings.iter().any(|id| known[id]) {
            bail!("a re-annotation task of example {example_id} must show its found ending");
        }
        Ok(())
    }

    /// The AF run and round of a context's next task: its open task's run, one round later; else
    /// the latest finished run, after any closed rounds.
    fn next_round(&self, example_id: i64) -> Result<(i64, i64)> {
        Ok(match self.open_task_of(example_id)? {
            Some((_, run, _)) => (run, self.max_round(example_id)?.expect("a task exists") + 1),
            None => (
                self.latest_finished_af_run()?
                    .context("no finished AF run to attach a re-annotation task to")?
                    .id,
                self.max_round(example_id)?.map_or(0, |r| r + 1),
            ),
        })
    }
}

// ----- task seeds: recorded in `tasks.seed`, so a task's order can be reproduced -----

/// The shuffle seed of one task, recorded in `tasks.seed`: derived from the annotation policy's
/// seed with the context and the round as the key.
fn task_seed(policy_seed: Seed, example_id: i64, round: i64) -> Seed {
    policy_seed.key(Key::Task {
        example: example_id,
        round,
    })
}

/// Puts `endings` in the order a task with this seed shows them.
fn shuffle_endings(endings: &mut [i64], seed: Seed) {
    endings.shuffle(&mut seed.rng());
}

/// One ending as a task shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEnding {
    pub ending_id: i64,
    pub text: String,
    pub is_gold: bool,
}

/// Everything a task shows (the found ending is among `endings`; the UI never says which).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    pub task_id: i64,
    pub example_id: i64,
    pub ext_id: String,
    pub round: i64,
    pub replicas: i64,
    /// Submissions so far, by any annotator.
    pub submitted: i64,
    pub open: bool,
    pub sent1: String,
    pub sent2: String,
    /// In display order (position 0 is "1" on screen).
    pub endings: Vec<TaskEnding>,
}

impl Store {
    pub fn task_view(&self, task_id: i64) -> Result<Option<TaskView>> {
        let conn = &self.conn;
        let head = conn
        .query_row(
            "SELECT t.id, t.example_id, x.ext_id, t.round, t.replicas, t.submitted, t.status = 'open',
                    x.sent1, x.sent2
             FROM tasks t JOIN examples x ON x.id = t.example_id WHERE t.id = ?1",
            [task_id],
            |r| {
                Ok(TaskView {
                    task_id: r.get(0)?,
                    example_id: r.get(1)?,
                    ext_id: r.get(2)?,
                    round: r.get(3)?,
                    replicas: r.get(4)?,
                    submitted: r.get(5)?,
                    open: r.get(6)?,
                    sent1: r.get(7)?,
                    sent2: r.get(8)?,
                    endings: Vec::new(),
                })
            },
        )
        .optional()?;
        let Some(mut view) = head else {
            return Ok(None);
        };
        let mut stmt = conn.prepare_cached(
        "SELECT e.id, e.text, e.is_gold FROM task_endings te JOIN endings e ON e.id = te.ending_id
         WHERE te.task_id = ?1 ORDER BY te.position",
    )?;
        let rows = stmt.query_map([task_id], |r| {
            Ok(TaskEnding {
                ending_id: r.get(0)?,
                text: r.get(1)?,
                is_gold: r.get::<_, i64>(2)? != 0,
            })
        })?;
        view.endings = rows.collect::<rusqlite::Result<_>>()?;
        Ok(Some(view))
    }

    /// Open tasks in hand-out order; with `unfinished_only`, only those still short of annotators.
    pub fn open_tasks(&self, unfinished_only: bool) -> Result<Vec<TaskView>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
            "SELECT t.id FROM tasks t WHERE t.status = 'open' AND (?1 = 0 OR t.submitted < t.replicas)
         ORDER BY t.id",
        )?;
        let ids: Vec<i64> = stmt
            .query_map([unfinished_only as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        ids.into_iter()
            .map(|id| Ok(self.task_view(id)?.expect("task listed above exists")))
            .collect()
    }
}
