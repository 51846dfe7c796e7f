//! The orders items are handed out in. An annotator gets the item it held when its session
//! stopped, if it may still take it; else the first it may take in the session's order, which
//! puts the tasks it prefers first (`annotate --order risk`: [`riskiest_first`]) and then follows
//! the project's seeded order, the order in which [`crate::tasks::ensure_tasks`] made the tasks
//! ([`shuffle_contexts`]). What an annotator may take (not items others hold, nor items it
//! submitted or skipped, nor tasks whose replicas are filled) and the claim itself are the
//! store's ([`Store::claim_next`]).

use anyhow::Result;
use rand::seq::SliceRandom;

use afkit_engine::seed::{Key, Seed};
use afkit_store::Store;

/// Puts a run's new contexts in the order they are handed out: a permutation drawn from the
/// annotation policy's seed, with the AF run as the key.
pub(crate) fn shuffle_contexts<T>(contexts: &mut [T], policy_seed: Seed, run_id: i64) {
    contexts.shuffle(&mut policy_seed.key(Key::Handout(run_id)).rng());
}

/// The tasks that still want annotators, riskiest first: by how many of their shown negatives
/// could be right (`afkit_store::risk`), then by how close the closest comes (its likelihood margin
/// over the found ending), then in task order.
pub(crate) fn riskiest_first(store: &Store) -> Result<Vec<i64>> {
    let mut ranked: Vec<(usize, f64, i64)> = Vec::new();
    for task in store.open_tasks(true)? {
        let Some(found) = task.endings.iter().find(|e| e.is_gold) else {
            continue;
        };
        let negatives: Vec<i64> = task
            .endings
            .iter()
            .filter(|e| !e.is_gold)
            .map(|e| e.ending_id)
            .collect();
        let judged = afkit_store::risk::judge_context(store, found.ending_id, &negatives)?;
        let risky = judged.values().filter(|j| j.could_be_right()).count();
        let closest = judged
            .values()
            .map(|j| j.closeness())
            .fold(f64::NEG_INFINITY, f64::max);
        ranked.push((risky, closest, task.task_id));
    }
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)));
    Ok(ranked.into_iter().map(|(_, _, task)| task).collect())
}
