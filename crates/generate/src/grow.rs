//! Growing starved pools. AF can only pick the hardest endings a pool holds: when a context's
//! found ending outscores every candidate in the latest AF run's final pass, AF had nothing left
//! to swap in and the question gives its answer away. Such contexts get more endings (sampled
//! with the pool's own primer and a new seed per round), and the next `afkit filter` run works
//! on the grown pools. Sampling goes where AF needs it instead of a large pool for everyone.

use anyhow::Result;

use afkit_store::examples::Example;
use afkit_store::Store;

/// A pool to grow.
#[derive(Clone)]
pub(crate) struct StarvedContext {
    pub ex: Example,
    /// The pool's primer, shown again.
    pub style_examples: Vec<i64>,
    /// The pool's candidates, which its new endings must differ from.
    pub candidate_texts: Vec<String>,
    /// GrowthRequest rounds this pool has had before, plus one: part of the round's seed.
    pub round: usize,
}

/// What the latest finished AF run asks for.
pub(crate) struct GrowthRequest {
    pub af_run_id: i64,
    pub contexts: Vec<StarvedContext>,
    /// Starved pools left as they are: at `--max-pool`, or already grown for this run.
    at_cap: usize,
    already_grown: usize,
}

impl GrowthRequest {
    /// The same run's growth for only the contexts `keep` keeps.
    pub(crate) fn only(&self, keep: impl Fn(&Example) -> bool) -> GrowthRequest {
        GrowthRequest {
            af_run_id: self.af_run_id,
            contexts: self
                .contexts
                .iter()
                .filter(|c| keep(&c.ex))
                .cloned()
                .collect(),
            at_cap: self.at_cap,
            already_grown: self.already_grown,
        }
    }

    pub(crate) fn nothing_to_do(&self) -> String {
        format!(
            "AF run {} left no pool to grow ({} starved pools are at --max-pool, {} were grown \
             for this run already); run `afkit filter` on the grown pools",
            self.af_run_id, self.at_cap, self.already_grown
        )
    }
}

/// The starved pools of the latest finished AF run that may still grow, in id order (at most
/// `limit`).
pub(crate) fn starved(
    store: &Store,
    max_pool: usize,
    limit: Option<usize>,
) -> Result<GrowthRequest> {
    let Some(run) = store.latest_finished_af_run()? else {
        anyhow::bail!("--grow needs a finished AF run: run `afkit filter` first");
    };
    let mut growth = GrowthRequest {
        af_run_id: run.id,
        contexts: Vec::new(),
        at_cap: 0,
        already_grown: 0,
    };
    for pool in store.starved_pools(run.id)? {
        if pool.grown_for_run {
            growth.already_grown += 1;
        } else if pool.candidates >= max_pool {
            growth.at_cap += 1;
        } else if limit.is_none_or(|l| growth.contexts.len() < l) {
            growth.contexts.push(StarvedContext {
                ex: store
                    .example(pool.example_id)?
                    .expect("a scored pool's example exists"),
                style_examples: pool.style_examples,
                candidate_texts: store
                    .pool_candidate_texts(pool.example_id)?
                    .into_iter()
                    .map(|(_, text)| text)
                    .collect(),
                round: pool.rounds + 1,
            });
        }
    }
    Ok(growth)
}
