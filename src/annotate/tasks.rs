//! Making annotation tasks from the latest finished AF run (SWAG §3.5): each context's found
//! ending and its five hardest assigned negatives, in a shuffled order fixed by a recorded seed.

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rusqlite::Connection;

use crate::store::annotate::{self as db, NewTask, Policy};
use crate::store::Store;

/// Endings shown per task: the found one and five negatives, as in SWAG.
pub const ENDINGS_PER_TASK: usize = 6;

/// What [`ensure_tasks`] found or did.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    pub run_id: i64,
    pub policy: Policy,
    /// Tasks created by this call.
    pub created: usize,
    /// Contexts skipped because they have no assigned negative.
    pub without_negatives: usize,
}

/// The policy asked for on the command line; `None` fields keep the recorded (or default) value.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyRequest {
    pub agreement_items: Option<i64>,
    pub replicas: Option<i64>,
    pub seed: Option<u64>,
}

pub const DEFAULT_POLICY: Policy = Policy {
    agreement_items: 100,
    replicas: 3,
    seed: 0,
};

/// Creates the missing tasks for every context of the latest finished AF run, idempotently, and
/// records the hand-out policy. Runs in one write transaction, so concurrent annotators starting
/// together create each task once.
pub fn ensure_tasks(store: &mut Store, request: PolicyRequest) -> Result<Setup> {
    let tx = store.write_transaction()?;
    let Some(run_id) = db::latest_finished_run(&tx)? else {
        bail!(
            "{} has no finished adversarial-filtering run: run `afkit filter {}` first",
            store_path_hint(&tx),
            store_path_hint(&tx)
        );
    };
    let stored = db::stored_policy(&tx)?;
    let base = stored.unwrap_or(DEFAULT_POLICY);
    let policy = Policy {
        agreement_items: request.agreement_items.unwrap_or(base.agreement_items),
        replicas: request.replicas.unwrap_or(base.replicas),
        // The seed fixes tasks already made: it can only be chosen before the first one.
        seed: if stored.is_some() {
            base.seed
        } else {
            request.seed.unwrap_or(base.seed)
        },
    };
    if policy.agreement_items < 0 || policy.replicas < 1 {
        bail!("--agreement-items must be ≥ 0 and --replicas ≥ 1");
    }
    if let (Some(old), Some(asked)) = (stored, request.seed) {
        if asked != old.seed {
            bail!(
                "this project's tasks were shuffled with seed {}; --seed cannot change it now",
                old.seed
            );
        }
    }

    let mut contexts = db::untasked_contexts(&tx, run_id)?;
    let without_negatives = contexts.iter().filter(|c| c.negatives.is_empty()).count();
    contexts.retain(|c| !c.negatives.is_empty());
    // The hand-out order: a seeded permutation of the new contexts, appended after earlier tasks.
    contexts.shuffle(&mut ChaCha8Rng::seed_from_u64(mix(
        policy.seed,
        run_id as u64,
        0,
    )));
    let first_index = db::count_round0_tasks(&tx)?;
    for (index, context) in (first_index..).zip(&contexts) {
        let seed = task_seed(policy.seed, context.example_id, 0);
        let mut endings = vec![context.gold_ending_id];
        endings.extend(context.negatives.iter().take(ENDINGS_PER_TASK - 1));
        shuffle(&mut endings, seed);
        db::insert_task(
            &tx,
            &NewTask {
                example_id: context.example_id,
                run_id,
                round: 0,
                replicas: if index < policy.agreement_items {
                    policy.replicas
                } else {
                    1
                },
                seed,
                endings,
            },
        )?;
    }
    if stored != Some(policy) {
        db::record_policy(&tx, &policy)?;
        db::apply_replicas(&tx, &policy)?;
    }
    tx.commit()?;
    Ok(Setup {
        run_id,
        policy,
        created: contexts.len(),
        without_negatives,
    })
}

fn store_path_hint(conn: &Connection) -> String {
    conn.path()
        .map(str::to_string)
        .unwrap_or_else(|| "the project".to_string())
}

/// Queues a re-annotation of a context (SWAG fn. 6): a new task one round after its current one,
/// showing `endings` (the found ending among them, 2 to 6 distinct endings of this context) in an
/// order shuffled with a seed derived from the project's annotation seed, the context and the
/// round, and recorded in the task. The old open task is marked superseded and its claims
/// dropped. One annotator per re-annotated item, as SWAG did after its agreement sample.
/// Call it inside the caller's transaction; returns the new task id.
pub fn create_reannotation_task(
    conn: &Connection,
    example_id: i64,
    endings: &[i64],
) -> Result<i64> {
    let known = db::endings_of_example(conn, example_id)?;
    if !(2..=ENDINGS_PER_TASK).contains(&endings.len()) {
        bail!(
            "a re-annotation task of example {example_id} needs 2 to {ENDINGS_PER_TASK} endings, got {}",
            endings.len()
        );
    }
    let mut seen = std::collections::HashSet::new();
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
    let (run_id, round) = match db::open_task_of(conn, example_id)? {
        Some((_, run, _)) => (
            run,
            db::max_round(conn, example_id)?.expect("a task exists") + 1,
        ),
        None => (
            db::latest_finished_run(conn)?
                .context("no finished AF run to attach a re-annotation task to")?,
            db::max_round(conn, example_id)?.map_or(0, |r| r + 1),
        ),
    };
    let policy_seed = db::stored_policy(conn)?.unwrap_or(DEFAULT_POLICY).seed;
    let seed = task_seed(policy_seed, example_id, round);
    let mut order = endings.to_vec();
    shuffle(&mut order, seed);
    db::supersede_tasks_of(conn, example_id)?;
    db::insert_task(
        conn,
        &NewTask {
            example_id,
            run_id,
            round,
            replicas: 1,
            seed,
            endings: order,
        },
    )
}

/// The shuffle seed of one task, recorded in `tasks.seed`.
pub fn task_seed(policy_seed: u64, example_id: i64, round: i64) -> u64 {
    mix(policy_seed, example_id as u64, round as u64)
}

/// Shows `endings` in the order a task with this seed shows them.
pub fn shuffle(endings: &mut [i64], seed: u64) {
    endings.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
}

/// SplitMix64 over three words: independent, well-spread seeds from (seed, id, round).
fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut x = a;
    for word in [b, c] {
        x = x
            .wrapping_add(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(word.wrapping_mul(0xBF58_476D_1CE4_E5B9));
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fixtures::synthetic_af_project;

    fn project(contexts: usize, negatives: usize) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::create(&dir.path().join("p.sqlite")).unwrap();
        synthetic_af_project(&mut store, contexts, negatives, 7).unwrap();
        (dir, store)
    }

    #[test]
    fn tasks_show_the_found_ending_and_the_five_hardest() {
        let (_dir, mut store) = project(4, 9);
        let setup = ensure_tasks(&mut store, PolicyRequest::default()).unwrap();
        assert_eq!(setup.created, 4);
        for task in db::open_tasks(store.conn(), false).unwrap() {
            assert_eq!(task.endings.len(), 6);
            assert_eq!(task.endings.iter().filter(|e| e.is_gold).count(), 1);
            let scores: Vec<f64> = {
                let mut stmt = store
                    .conn()
                    .prepare(
                        "SELECT s.score FROM af_assignments a JOIN af_scores s
                         ON s.ending_id = a.ending_id WHERE a.example_id = ?1 ORDER BY s.score DESC",
                    )
                    .unwrap();
                stmt.query_map([task.example_id], |r| r.get(0))
                    .unwrap()
                    .map(|r| r.unwrap())
                    .collect()
            };
            let fifth_hardest = scores[4];
            for e in task.endings.iter().filter(|e| !e.is_gold) {
                let s: f64 = store
                    .conn()
                    .query_row(
                        "SELECT score FROM af_scores WHERE ending_id = ?1",
                        [e.ending_id],
                        |r| r.get(0),
                    )
                    .unwrap();
                assert!(
                    s >= fifth_hardest,
                    "a shown negative is not among the five hardest"
                );
            }
        }
    }

    #[test]
    fn creation_is_idempotent_and_order_is_seeded() {
        let (_dir, mut store) = project(12, 6);
        let first = ensure_tasks(
            &mut store,
            PolicyRequest {
                agreement_items: Some(5),
                replicas: Some(2),
                seed: Some(3),
            },
        )
        .unwrap();
        assert_eq!(first.created, 12);
        let again = ensure_tasks(&mut store, PolicyRequest::default()).unwrap();
        assert_eq!(again.created, 0);
        assert_eq!(again.policy, first.policy, "the recorded policy is kept");
        let tasks = db::open_tasks(store.conn(), false).unwrap();
        let replicas: Vec<i64> = tasks.iter().map(|t| t.replicas).collect();
        assert_eq!(replicas, [2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1]);
        let order: Vec<i64> = tasks.iter().map(|t| t.example_id).collect();
        assert_ne!(
            order,
            (1..=12).collect::<Vec<_>>(),
            "contexts are handed out shuffled"
        );
        // The same seed on a fresh copy gives the same order and the same ending positions.
        let (_d2, mut other) = project(12, 6);
        ensure_tasks(
            &mut other,
            PolicyRequest {
                agreement_items: Some(5),
                replicas: Some(2),
                seed: Some(3),
            },
        )
        .unwrap();
        assert_eq!(db::open_tasks(other.conn(), false).unwrap(), tasks);
        assert!(ensure_tasks(
            &mut store,
            PolicyRequest {
                seed: Some(4),
                ..Default::default()
            }
        )
        .is_err());
        // Changing M re-targets the replicas of existing round-0 tasks.
        ensure_tasks(
            &mut store,
            PolicyRequest {
                agreement_items: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
        let replicas: Vec<i64> = db::open_tasks(store.conn(), false)
            .unwrap()
            .iter()
            .map(|t| t.replicas)
            .collect();
        assert_eq!(replicas, [2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    }

    #[test]
    fn reannotation_supersedes_the_open_task() {
        let (_dir, mut store) = project(2, 8);
        ensure_tasks(&mut store, PolicyRequest::default()).unwrap();
        let old = db::open_tasks(store.conn(), false).unwrap()[0].clone();
        let mut endings: Vec<i64> = old.endings.iter().map(|e| e.ending_id).collect();
        endings.truncate(4);
        if !old.endings[..4].iter().any(|e| e.is_gold) {
            endings[0] = old.endings.iter().find(|e| e.is_gold).unwrap().ending_id;
        }
        let new_id = create_reannotation_task(store.conn(), old.example_id, &endings).unwrap();
        let new = db::task_view(store.conn(), new_id).unwrap().unwrap();
        assert_eq!((new.round, new.replicas, new.open), (1, 1, true));
        let mut shown: Vec<i64> = new.endings.iter().map(|e| e.ending_id).collect();
        shown.sort();
        endings.sort();
        assert_eq!(shown, endings);
        assert!(
            !db::task_view(store.conn(), old.task_id)
                .unwrap()
                .unwrap()
                .open
        );
        // Endings of another context, or no found ending, are refused.
        let other = db::open_tasks(store.conn(), false).unwrap()[0].clone();
        assert_ne!(other.example_id, old.example_id);
        let foreign: Vec<i64> = other.endings.iter().map(|e| e.ending_id).collect();
        assert!(create_reannotation_task(store.conn(), old.example_id, &foreign).is_err());
        let no_gold: Vec<i64> = new
            .endings
            .iter()
            .filter(|e| !e.is_gold)
            .map(|e| e.ending_id)
            .collect();
        assert!(create_reannotation_task(store.conn(), old.example_id, &no_gold).is_err());
    }
}
