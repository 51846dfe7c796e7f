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

/// A seed: one a user chose (recorded with the results), or one derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seed(u64);

impl Seed {
    pub fn new(value: u64) -> Seed {
        Seed(value)
    }

    /// The number itself, as the project records it.
    pub fn value(self) -> u64 {
        self.0
    }

    /// The seed of the item named `key`: the first 8 bytes (little-endian) of SHA-256 over the
    /// seed (8 bytes, little-endian) followed by the key's bytes. A key names what the seed is
    /// for and which item, e.g. `task\0{example}\0{round}`; generate's keys are the context's
    /// ext id itself, which is why no prefix is added here.
    pub fn derive(self, key: &str) -> Seed {
        let mut h = Sha256::new();
        h.update(self.0.to_le_bytes());
        h.update(key.as_bytes());
        Seed(u64::from_le_bytes(
            h.finalize()[..8].try_into().expect("8 bytes"),
        ))
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
