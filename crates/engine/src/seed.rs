//! The one way afkit turns a recorded seed into randomness.
//!
//! Every random choice of a stage (which endings a context samples, AF's splits and initial
//! models, the order tasks are handed out in, a dataset's answer positions, AFLite's partitions)
//! comes from a seed the user chose and the project or output records (`generations.seed`,
//! `af_runs.seed`, `tasks.seed` and the annotation policy, the `assemble` parameters,
//! `exports.seed`, AFLite's summary). A result is therefore reproducible from what was recorded,
//! and a stage that stops half-way resumes drawing exactly what an uninterrupted run would have.
//!
//! That works only if each use draws from a stream of its own, fixed by the seed and by what the
//! draw is for, never by how many draws happened before it in the process. Two ways of naming
//! such a stream cover every use:
//!
//! - [`Seed::derive`]: the seed of one named item, content-addressed by a key (a context's ext
//!   id, a task's example and round, a model variable's name): SHA-256 of the seed and the key.
//!   Items can be processed in any order, in parallel, or again after a resume, and each gets
//!   the same seed; the derived seed is recorded where the item's order must be reproducible
//!   (`tasks.seed`).
//! - [`Seed::stream`]: the random numbers of one numbered step of a run (an AF iteration, an
//!   AFLite phase), as ChaCha8 keyed by the seed on its own stream. Stream 0 is [`Seed::rng`].
//!
//! Changing how a stream is derived changes every result drawn from it, so the derivations here
//! never change silently; the store's module documentation lists the versions whose results
//! were drawn differently.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

/// What a derived seed is for, and which item: every key afkit derives a seed with, in one
/// place. Its text ([`Key::text`]) is what [`Seed::derive`] hashes, so a variant's format must
/// never change (the tests below pin them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key<'a> {
    /// generate: a context's sampling seed (the ext id itself, with no prefix).
    Context(&'a str),
    /// generate: a context's style primer.
    Style(&'a str),
    /// generate --grow: a context's sampling seed in growth round R.
    Growth { round: usize, ext_id: &'a str },
    /// The fold of a group when the groups are dealt into K parts (`lm adapt`).
    Fold(&'a str),
    /// `lm adapt`: the order of the training lines.
    AdaptLineOrder,
    /// `lm adapt`: fold k's initial adapter.
    AdaptInit(usize),
    /// `lm adapt`: fold k's batch order.
    AdaptOrder(usize),
    /// AF: one model variable's initial values (by its name).
    ModelInit(&'a str),
    /// AF: the order of the training batches.
    BatchOrder,
    /// AF: the deal of a phase's contexts into held-out folds for its iterations 5·round to
    /// 5·round + 4.
    HeldOutDeal { phase: &'a str, round: usize },
    /// AF: the fine-tuned adversary's training negatives.
    DiscriminatorNegatives,
    /// AF: the fine-tuned adversary's seed within an iteration or fold.
    Discriminator,
    /// AF: the fine-tuned adversary's new head.
    DiscriminatorHead,
    /// A cross-encoder's new scoring head.
    CrossEncoderHead,
    /// annotate: the shuffle of one task (context, round), recorded in `tasks.seed`.
    Task { example: i64, round: i64 },
    /// annotate: the order a run's new contexts are handed out in.
    Handout(i64),
    /// annotate: which negatives a task shows.
    ShownNegatives,
    /// assemble: the matched distractors of a context, per draw (`distractors`, `refill\0R`).
    Distractors { draw: &'a str, example: i64 },
    /// assemble: the deal of verified questions into folds for the choice among their endings
    /// judged unlikely.
    ChoiceFolds,
    /// export: a question's option order.
    Options { example: i64, generated: bool },
    /// export: a question's random negatives (the control).
    RandomNegatives { example: i64, generated: bool },
    /// review: the option order of a context's n-th review item.
    Review { example: i64, item: i64 },
    /// review: the order of the questions in a review file.
    ReviewOrder,
    /// audit: fold f of the fine-tuned baseline.
    FinetuneFold(usize),
    /// audit: the random answers of relabelled copy c, the chance a trained baseline meets.
    ChanceCopy(usize),
}

impl Key<'_> {
    /// The bytes the seed is hashed with.
    pub(crate) fn text(&self) -> String {
        match self {
            Key::Context(ext_id) => (*ext_id).to_string(),
            Key::Style(ext_id) => format!("style\u{0}{ext_id}"),
            Key::Growth { round, ext_id } => format!("grow{round}\u{0}{ext_id}"),
            Key::Fold(group) => format!("fold\u{0}{group}"),
            Key::AdaptLineOrder => "adapt\u{0}line order".into(),
            Key::AdaptInit(fold) => format!("adapt\u{0}init\u{0}{fold}"),
            Key::AdaptOrder(fold) => format!("adapt\u{0}order\u{0}{fold}"),
            Key::ModelInit(name) => format!("init\u{0}{name}"),
            Key::BatchOrder => "batch order".into(),
            Key::HeldOutDeal { phase, round } => format!("held out\u{0}{phase}\u{0}{round}"),
            Key::DiscriminatorNegatives => "discriminator negatives".into(),
            Key::Discriminator => "discriminator".into(),
            Key::DiscriminatorHead => "discriminator head".into(),
            Key::CrossEncoderHead => "cross-encoder head".into(),
            Key::Task { example, round } => format!("task\u{0}{example}\u{0}{round}"),
            Key::Handout(run) => format!("handout\u{0}{run}"),
            Key::ShownNegatives => "shown negatives".into(),
            Key::Distractors { draw, example } => format!("{draw}\u{0}{example}"),
            Key::ChoiceFolds => "choice folds".into(),
            Key::Options { example, generated } => {
                format!("options\u{0}{example}\u{0}{generated}")
            }
            Key::RandomNegatives { example, generated } => {
                format!("random negatives\u{0}{example}\u{0}{generated}")
            }
            Key::Review { example, item } => format!("review\u{0}{example}\u{0}{item}"),
            Key::ReviewOrder => "review order".into(),
            Key::FinetuneFold(fold) => format!("finetune fold {fold}"),
            Key::ChanceCopy(copy) => format!("chance copy {copy}"),
        }
    }
}

/// A seed: one a user chose (recorded with the results), or one derived from it. It reads,
/// prints and serialises as the bare number, so that `--seed 7` and the recorded settings keep
/// their form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Seed(u64);

impl std::fmt::Display for Seed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for Seed {
    type Err = std::num::ParseIntError;

    fn from_str(text: &str) -> Result<Seed, Self::Err> {
        text.parse().map(Seed)
    }
}

impl Seed {
    pub const fn new(value: u64) -> Seed {
        Seed(value)
    }

    /// The number itself, as the project records it.
    pub fn value(self) -> u64 {
        self.0
    }

    /// The seed of the item `key` names: the first 8 bytes (little-endian) of SHA-256 over the
    /// seed (8 bytes, little-endian) followed by the key's text. A key names what the seed is
    /// for and which item, e.g. `task\0{example}\0{round}`; generate's keys are the context's
    /// ext id itself, which is why no prefix is added.
    pub fn key(self, key: Key) -> Seed {
        self.derive(&key.text())
    }

    /// [`Seed::key`] for a key given as text (the tests of the derivation itself).
    fn derive(self, key: &str) -> Seed {
        let mut h = Sha256::new();
        h.update(self.0.to_le_bytes());
        h.update(key.as_bytes());
        Seed(u64::from_le_bytes(
            h.finalize()[..8].try_into().expect("8 bytes"),
        ))
    }

    /// The seed `n` numbers after this one: how the audit has always seeded its folds and its
    /// second KNN sample (a derived key would change every recorded audit's λ choices).
    pub fn plus(self, n: u64) -> Seed {
        Seed(self.0.wrapping_add(n))
    }

    /// The random numbers of step `stream` of a run: ChaCha8 keyed by the seed, on its own
    /// stream, so that any step can be re-run on its own.
    pub fn stream(self, stream: u64) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.0);
        rng.set_stream(stream);
        rng
    }

    /// The random numbers of this seed: [`Seed::stream`] 0.
    pub fn rng(self) -> ChaCha8Rng {
        self.stream(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;

    #[test]
    fn derived_seeds_are_sha256_of_the_seed_and_the_key() {
        // Values of the SHA-256 definition, computed independently; generate's sampling seeds
        // are these numbers, so they must never change.
        assert_eq!(Seed::new(1).derive("v#1").value(), 0xc847_ba8f_8a20_efcc);
        assert_eq!(
            Seed::new(0).derive("style\u{0}a#0").value(),
            0x0fc3_41bf_a525_2389
        );
    }

    /// Every key's text as the projects made so far were drawn with: a changed format would
    /// silently draw other samples, splits and orders from the same recorded seed.
    #[test]
    fn key_texts_never_change() {
        let pinned = [
            (Key::Context("v#1"), "v#1"),
            (Key::Style("a#0"), "style\u{0}a#0"),
            (
                Key::Growth {
                    round: 2,
                    ext_id: "a#0",
                },
                "grow2\u{0}a#0",
            ),
            (Key::Fold("g"), "fold\u{0}g"),
            (Key::AdaptLineOrder, "adapt\u{0}line order"),
            (Key::AdaptInit(2), "adapt\u{0}init\u{0}2"),
            (Key::AdaptOrder(2), "adapt\u{0}order\u{0}2"),
            (Key::ModelInit("mlp.l1.weight"), "init\u{0}mlp.l1.weight"),
            (Key::BatchOrder, "batch order"),
            (
                Key::HeldOutDeal {
                    phase: "ensemble",
                    round: 1,
                },
                "held out\u{0}ensemble\u{0}1",
            ),
            (Key::DiscriminatorNegatives, "discriminator negatives"),
            (Key::Discriminator, "discriminator"),
            (Key::DiscriminatorHead, "discriminator head"),
            (Key::CrossEncoderHead, "cross-encoder head"),
            (
                Key::Task {
                    example: 7,
                    round: 1,
                },
                "task\u{0}7\u{0}1",
            ),
            (Key::Handout(3), "handout\u{0}3"),
            (Key::ShownNegatives, "shown negatives"),
            (
                Key::Distractors {
                    draw: "refill\u{0}1",
                    example: 4,
                },
                "refill\u{0}1\u{0}4",
            ),
            (Key::ChoiceFolds, "choice folds"),
            (
                Key::Options {
                    example: 4,
                    generated: false,
                },
                "options\u{0}4\u{0}false",
            ),
            (
                Key::RandomNegatives {
                    example: 4,
                    generated: true,
                },
                "random negatives\u{0}4\u{0}true",
            ),
            (
                Key::Review {
                    example: 4,
                    item: 2,
                },
                "review\u{0}4\u{0}2",
            ),
            (Key::ReviewOrder, "review order"),
            (Key::FinetuneFold(0), "finetune fold 0"),
        ];
        for (key, text) in pinned {
            assert_eq!(key.text(), text, "{key:?}");
            assert_eq!(Seed::new(5).key(key), Seed::new(5).derive(text));
        }
    }

    #[test]
    fn stream_zero_is_the_seeds_own_chacha_stream_and_streams_differ() {
        let draws = |mut rng: ChaCha8Rng| (0..4).map(|_| rng.next_u64()).collect::<Vec<_>>();
        assert_eq!(
            draws(Seed::new(9).rng()),
            draws(ChaCha8Rng::seed_from_u64(9))
        );
        assert_eq!(draws(Seed::new(9).stream(3)), draws(Seed::new(9).stream(3)));
        assert_ne!(draws(Seed::new(9).stream(3)), draws(Seed::new(9).stream(4)));
        assert_ne!(
            draws(Seed::new(9).stream(0)),
            draws(Seed::new(10).stream(0))
        );
    }
}
