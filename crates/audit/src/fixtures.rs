//! Test support (the crate's tests and its `fixtures` feature): synthetic questions with or
//! without a planted tell, so the cross-validation's unit tests and the end-to-end tests of
//! `audit --cv` read the same data.

use afkit_engine::seed::Seed;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const VERBS: [&str; 8] = [
    "walks", "jumps", "talks", "waves", "sits", "runs", "laughs", "turns",
];
const THINGS: [&str; 6] = [
    "a ball", "the rope", "a bike", "the dog", "a cup", "the kite",
];
const PLACES: [&str; 5] = [
    "outside",
    "in the park",
    "at home",
    "on stage",
    "by the lake",
];

/// One synthetic question: its video, context, four endings and where the found one is.
pub struct PlantedQuestion {
    pub group: String,
    pub sent1: String,
    pub sent2: String,
    pub endings: [String; 4],
    pub label: usize,
}

/// A random ending; every part drawn from the same lists, so endings carry no signal of their own.
fn ending(rng: &mut ChaCha8Rng) -> String {
    format!(
        "{} with {} {}.",
        VERBS.choose(rng).unwrap(),
        THINGS.choose(rng).unwrap(),
        PLACES.choose(rng).unwrap()
    )
}

/// `n` questions, `per_video` to a video. With `tell`, the gold ending ends in "!" after the word
/// "happily" (a marker word for word n-grams, a punctuation habit for character n-grams) and the
/// label is where the gold is; without it the four endings are exchangeable and the label random.
pub fn planted_questions(
    n: usize,
    per_video: usize,
    tell: bool,
    seed: Seed,
) -> Vec<PlantedQuestion> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.value());
    (0..n)
        .map(|i| {
            let mut endings: [String; 4] = std::array::from_fn(|_| ending(&mut rng));
            let label = rng.random_range(0..4);
            if tell {
                endings[label] = endings[label].replace('.', " happily!");
            }
            PlantedQuestion {
                group: format!("v{}", i / per_video),
                sent1: format!("Someone is seen in clip {}.", i / per_video),
                sent2: ["They", "The man", "A girl"][i % 3].to_string(),
                endings,
                label,
            }
        })
        .collect()
}
