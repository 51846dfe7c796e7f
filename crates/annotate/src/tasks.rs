//! Making annotation tasks from the latest finished AF run (SWAG §3.5): each context's found
//! ending and five of its assigned negatives, in a shuffled order fixed by a recorded seed.
//!
//! The five are matched to the found endings' final scores (see [`afkit_store::distractors`]), not the
//! five hardest: the hardest look more real than real endings to a style classifier, so a
//! dataset built from them would carry that inverse tell however the annotators judged them.
//! Runs that kept no scores for the found endings fall back to the hardest.

use std::collections::HashMap;

use anyhow::{bail, Result};

use afkit_engine::seed::{Key, Seed};
use afkit_store::annotate::tasks::{Policy, UntaskedContext, ENDINGS_PER_TASK};
use afkit_store::distractors::Matching;
use afkit_store::Store;

use super::handout;

/// What [`ensure_tasks`] found or did.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    pub run_id: i64,
    pub policy: Policy,
    /// Tasks created by this call.
    pub created: usize,
    /// Contexts skipped because they have no assigned negative.
    pub without_negatives: usize,
    /// Tasks created by this call that show the five hardest negatives, because the run kept
    /// no found-ending score to match them to.
    pub hardest_shown: usize,
}

/// The policy asked for on the command line; `None` fields keep the recorded (or default) value.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyRequest {
    pub agreement_items: Option<i64>,
    pub replicas: Option<i64>,
    pub seed: Option<Seed>,
}

/// Creates the missing tasks for every context of the latest finished AF run, idempotently, and
/// records the hand-out policy. Runs in one write transaction, so concurrent annotators starting
/// together create each task once; but only when there is something to write: finding that out
/// reads every assignment of the run, and an annotator joining a large project under way would
/// otherwise hold the write lock, and every other annotator's next commit, for that long.
pub fn ensure_tasks(store: &mut Store, request: PolicyRequest) -> Result<Setup> {
    let up_to_date = store.transaction(|store| {
        let (run_id, stored, policy) = run_and_policy(store, request)?;
        let unchanged = stored == Some(policy) && !store.has_untasked_contexts(run_id)?;
        Ok(unchanged.then_some(Setup {
            run_id,
            policy,
            created: 0,
            without_negatives: 0,
            hardest_shown: 0,
        }))
    })?;
    if let Some(setup) = up_to_date {
        return Ok(setup);
    }
    store.write_transaction(|store| {
        let (run_id, _, policy) = run_and_policy(store, request)?;
        let mut contexts = store.untasked_contexts(run_id)?;
        let without_negatives = contexts.iter().filter(|c| c.negatives.is_empty()).count();
        contexts.retain(|c| !c.negatives.is_empty());
        // The hand-out order: a seeded permutation of the new contexts, appended after earlier
        // tasks.
        handout::shuffle_contexts(&mut contexts, policy.seed, run_id);
        let hardest_shown = insert_round0_tasks(store, run_id, &policy, &contexts)?;
        Ok(Setup {
            run_id,
            policy,
            created: contexts.len(),
            without_negatives,
            hardest_shown,
        })
    })
}

/// Stores a round-0 task for each of `contexts`, in their order after the tasks already made,
/// showing its found ending and the negatives [`shown_negatives`] picks with the task's seed,
/// and records the policy. Returns how many show the five hardest negatives.
fn insert_round0_tasks(
    store: &Store,
    run_id: i64,
    policy: &Policy,
    contexts: &[UntaskedContext],
) -> Result<usize> {
    let matching = if contexts.is_empty() {
        None
    } else {
        Matching::load(store, run_id)?
    };
    let mut hardest_shown = 0;
    store.add_round0_tasks(run_id, policy, contexts, |context, seed| {
        let (negatives, matched) = shown_negatives(context, matching.as_ref(), seed);
        hardest_shown += usize::from(!matched);
        [vec![context.gold_ending_id], negatives].concat()
    })?;
    Ok(hardest_shown)
}

/// The negatives a context's task shows: five matched to the found endings of its fold, drawn
/// from the task's seed; the five hardest when the run has nothing to match them to. The flag
/// says which.
fn shown_negatives(
    context: &UntaskedContext,
    matching: Option<&Matching>,
    task_seed: Seed,
) -> (Vec<i64>, bool) {
    let wanted = ENDINGS_PER_TASK - 1;
    let matched = matching.and_then(|matching| {
        let mut rng = task_seed.key(Key::ShownNegatives).rng();
        let negatives = &context.negatives;
        matching.choose(
            context.example_id,
            negatives,
            &HashMap::new(),
            wanted,
            &mut rng,
        )
    });
    match matched {
        Some(negatives) => (negatives, true),
        None => (
            context.negatives.iter().copied().take(wanted).collect(),
            false,
        ),
    }
}

/// The run whose assignments become tasks (the latest finished one), the recorded policy and the
/// policy to use.
fn run_and_policy(store: &Store, request: PolicyRequest) -> Result<(i64, Option<Policy>, Policy)> {
    let Some(run_id) = store.latest_finished_af_run()?.map(|run| run.id) else {
        bail!(
            "{} has no finished adversarial-filtering run: run `afkit filter {}` first",
            store.path().display(),
            store.path().display()
        );
    };
    let stored = store.stored_policy()?;
    Ok((run_id, stored, resolve_policy(stored, request)?))
}

/// The policy to use: the recorded one (or the default) with the request's changes; the seed
/// fixes tasks already made, so it can only be chosen before the first one.
fn resolve_policy(stored: Option<Policy>, request: PolicyRequest) -> Result<Policy> {
    let base = stored.unwrap_or_default();
    let policy = Policy {
        agreement_items: request.agreement_items.unwrap_or(base.agreement_items),
        replicas: request.replicas.unwrap_or(base.replicas),
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
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(contexts: usize, negatives: usize) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::create(&dir.path().join("p.sqlite")).unwrap();
        store
            .synthetic_af_project(contexts, negatives, afkit_engine::seed::Seed::new(7))
            .unwrap();
        (dir, store)
    }

    /// Found endings score 0.50–0.55; negative slot j of every context scores j / 8.
    fn scored_like_real_data(store: &mut Store, run: i64) {
        let mut scores: Vec<(i64, Option<f64>)> = Vec::new();
        for (i, ex) in store.examples().unwrap().iter().enumerate() {
            scores.push((ex.gold_ending_id, Some(0.5 + 0.01 * i as f64)));
        }
        for negatives in store.af_decisions(run).unwrap().assignments.values() {
            for (slot, &ending) in negatives.iter().enumerate() {
                scores.push((ending, Some(slot as f64 / 8.0)));
            }
        }
        store.set_final_scores(run, &scores).unwrap();
    }

    /// Every open task's example and the slots (in the AF assignment) of the five negatives it
    /// shows, sorted; each task shows the found ending once, beside them.
    fn shown_slots(store: &Store, run: i64) -> Vec<(i64, Vec<usize>)> {
        let assigned = store.af_decisions(run).unwrap().assignments;
        let tasks = store.open_tasks(false).unwrap();
        tasks
            .iter()
            .map(|task| {
                assert_eq!(task.endings.iter().filter(|e| e.is_gold).count(), 1);
                let negatives = &assigned[&task.example_id];
                let mut slots: Vec<usize> = task
                    .endings
                    .iter()
                    .filter(|e| !e.is_gold)
                    .map(|e| negatives.iter().position(|&n| n == e.ending_id).unwrap())
                    .collect();
                slots.sort_unstable();
                (task.example_id, slots)
            })
            .collect()
    }

    #[test]
    fn tasks_show_the_negatives_nearest_the_found_endings_scores_not_the_hardest() {
        let (_dir, mut store) = project(6, 9);
        let run = store.latest_finished_af_run().unwrap().unwrap().id;
        scored_like_real_data(&mut store, run);
        ensure_tasks(&mut store, PolicyRequest::default()).unwrap();
        let shown = shown_slots(&store, run);
        assert_eq!(shown.len(), 6, "one task per context");
        for (example, slots) in shown {
            // Slots 2–6 (0.25–0.75) surround the found endings' 0.50–0.55; the five hardest
            // would be slots 4–8.
            assert_eq!(slots, [2, 3, 4, 5, 6], "task of example {example}");
        }
    }

    #[test]
    fn without_found_ending_scores_tasks_show_the_five_hardest() {
        let (_dir, mut store) = project(4, 9);
        let run = store.latest_finished_af_run().unwrap().unwrap().id;
        scored_like_real_data(&mut store, run);
        let found: Vec<(i64, Option<f64>)> = store
            .examples()
            .unwrap()
            .iter()
            .map(|ex| (ex.gold_ending_id, None))
            .collect();
        store.set_final_scores(run, &found).unwrap();
        let setup = ensure_tasks(&mut store, PolicyRequest::default()).unwrap();
        assert_eq!(setup.hardest_shown, 4);
        let shown = shown_slots(&store, run);
        assert_eq!(shown.len(), 4, "one task per context");
        for (_, slots) in shown {
            assert_eq!(slots, [4, 5, 6, 7, 8]);
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
                seed: Some(Seed::new(3)),
            },
        )
        .unwrap();
        assert_eq!(first.created, 12);
        let again = ensure_tasks(&mut store, PolicyRequest::default()).unwrap();
        assert_eq!(again.created, 0);
        assert_eq!(again.policy, first.policy, "the recorded policy is kept");
        let tasks = store.open_tasks(false).unwrap();
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
                seed: Some(Seed::new(3)),
            },
        )
        .unwrap();
        assert_eq!(other.open_tasks(false).unwrap(), tasks);
        assert!(ensure_tasks(
            &mut store,
            PolicyRequest {
                seed: Some(Seed::new(4)),
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
        let replicas: Vec<i64> = store
            .open_tasks(false)
            .unwrap()
            .iter()
            .map(|t| t.replicas)
            .collect();
        assert_eq!(replicas, [2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    }
}
