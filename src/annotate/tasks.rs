//! Making annotation tasks from the latest finished AF run (SWAG §3.5): each context's found
//! ending and its five hardest assigned negatives, in a shuffled order fixed by a recorded seed.

use anyhow::{bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rusqlite::Connection;

use crate::store::annotate::{self as db, NewTask, Policy, DEFAULT_POLICY, ENDINGS_PER_TASK};
use crate::store::Store;

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
    contexts.shuffle(&mut ChaCha8Rng::seed_from_u64(db::handout_seed(
        policy.seed,
        run_id,
    )));
    let first_index = db::count_round0_tasks(&tx)?;
    for (index, context) in (first_index..).zip(&contexts) {
        let seed = db::task_seed(policy.seed, context.example_id, 0);
        let mut endings = vec![context.gold_ending_id];
        endings.extend(context.negatives.iter().take(ENDINGS_PER_TASK - 1));
        db::shuffle_endings(&mut endings, seed);
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
}
