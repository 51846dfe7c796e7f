//! Style priming: before each context the generator reads a few real context + ending pairs from
//! the user's own corpus, so that a general-purpose LM writes in the corpus's register (tense,
//! punctuation, vocabulary) instead of its own. Style is what a stylistic classifier spots, so
//! endings written in the corpus's style leave adversarial filtering good candidates to choose
//! from.
//!
//! The pairs always come from *other* groups (videos): the model must never see the found ending
//! it is asked to imitate, nor its neighbours from the same video, which often paraphrase it.

use std::collections::{HashMap, HashSet};

use anyhow::Result;
use rand::Rng;

use afkit_engine::seed::Seed;
use afkit_engine::text::rules::{MAX_CONTEXT_TOKENS, MAX_ENDING_TOKENS};
use afkit_store::dataset::startphrase;
use afkit_store::Store;

/// One pair the primer can show.
struct StylePair {
    example_id: i64,
    group: String,
    /// `sent1 sent2 ending`, as one line of the primer.
    line: String,
}

/// Every example of the project, as primer material.
pub(crate) struct StyleCorpus {
    pairs: Vec<StylePair>,
    per_group: HashMap<String, usize>,
}

/// Draws from the other groups stop after this many tries per wanted pair; only a project where
/// almost every example shares the context's group gets fewer pairs than asked.
const TRIES_PER_PAIR: usize = 64;

impl StyleCorpus {
    /// Every example whose pair is no longer than a context and an ending may be (ingest drops
    /// longer ones, but a project built another way may hold them): one overlong pair in a
    /// primer would make every context it primes too long for the model.
    pub(crate) fn load(store: &Store) -> Result<Self> {
        let pairs: Vec<StylePair> = store
            .examples()?
            .into_iter()
            .filter(|ex| {
                let words = [&ex.sent1, &ex.sent2, &ex.ending]
                    .iter()
                    .map(|t| t.split_whitespace().count())
                    .sum::<usize>();
                words <= MAX_CONTEXT_TOKENS + MAX_ENDING_TOKENS
            })
            .map(|ex| StylePair {
                example_id: ex.id,
                line: format!("{} {}", startphrase(&ex.sent1, &ex.sent2), ex.ending),
                group: ex.group,
            })
            .collect();
        Ok(Self::from_pairs(pairs))
    }

    fn from_pairs(pairs: Vec<StylePair>) -> Self {
        let mut per_group = HashMap::new();
        for p in &pairs {
            *per_group.entry(p.group.clone()).or_insert(0) += 1;
        }
        StyleCorpus { pairs, per_group }
    }

    /// Up to `n` distinct examples from groups other than `own_group`, drawn uniformly with the
    /// context's own `seed` (so a resumed run primes each context as an uninterrupted one would).
    pub(crate) fn choose(&self, own_group: &str, n: usize, seed: Seed) -> Vec<i64> {
        let others = self.pairs.len() - self.per_group.get(own_group).copied().unwrap_or(0);
        let want = n.min(others);
        let mut rng = seed.rng();
        let mut chosen = Vec::with_capacity(want);
        let mut taken = HashSet::new();
        let mut tries = 0;
        while chosen.len() < want && tries < want * TRIES_PER_PAIR {
            tries += 1;
            let i = rng.random_range(0..self.pairs.len());
            if self.pairs[i].group != own_group && taken.insert(i) {
                chosen.push(i);
            }
        }
        chosen.iter().map(|&i| self.pairs[i].example_id).collect()
    }

    /// The primer text for the chosen examples: one pair per line, followed by a line break so
    /// that the context starts a line of its own.
    pub(crate) fn primer(&self, example_ids: &[i64]) -> String {
        let by_id: HashMap<i64, &str> = self
            .pairs
            .iter()
            .map(|p| (p.example_id, p.line.as_str()))
            .collect();
        example_ids
            .iter()
            .filter_map(|id| by_id.get(id))
            .map(|line| format!("{line}\n"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn corpus(groups: &[u8]) -> StyleCorpus {
        StyleCorpus::from_pairs(
            groups
                .iter()
                .enumerate()
                .map(|(i, g)| StylePair {
                    example_id: i as i64 + 1,
                    group: format!("g{g}"),
                    line: format!("Caption {i}. It ends {i}."),
                })
                .collect(),
        )
    }

    proptest! {
        #[test]
        fn primers_never_come_from_the_contexts_own_group(
            groups in prop::collection::vec(0u8..6, 1..80),
            own in 0u8..6,
            n in 0usize..20,
            seed in any::<u64>(),
        ) {
            let c = corpus(&groups);
            let own_group = format!("g{own}");
            let chosen = c.choose(&own_group, n, Seed::new(seed));
            let others = groups.iter().filter(|&&g| g != own).count();
            prop_assert!(chosen.len() <= n.min(others));
            let distinct: HashSet<_> = chosen.iter().collect();
            prop_assert_eq!(distinct.len(), chosen.len());
            for id in &chosen {
                prop_assert_ne!(&c.pairs[*id as usize - 1].group, &own_group);
            }
            prop_assert_eq!(c.choose(&own_group, n, Seed::new(seed)), chosen);
        }
    }

    #[test]
    fn a_large_enough_corpus_gives_every_pair_asked_for() {
        let groups: Vec<u8> = (0..200).map(|i| (i % 5) as u8).collect();
        let c = corpus(&groups);
        for seed in 0..50 {
            assert_eq!(c.choose("g0", 12, Seed::new(seed)).len(), 12);
        }
        let primer = c.primer(&[3, 1]);
        assert_eq!(primer, "Caption 2. It ends 2.\nCaption 0. It ends 0.\n");
    }
}
