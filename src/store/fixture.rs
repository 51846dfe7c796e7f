//! Synthetic projects for tests and benchmarks of the stages after filtering: examples with a
//! pool of generated endings and a finished AF run (assignments and final scores), written
//! directly, so that annotation can be exercised without running the models.

use anyhow::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rusqlite::params;

use super::examples::{insert_example, upsert_source, NewExample};
use super::{now, Store};

const SUBJECTS: &[&str] = &[
    "A man",
    "The woman",
    "A young girl",
    "Two boys",
    "A chef",
    "The coach",
    "A dog",
    "Someone",
    "The players",
    "An old man",
];
const VERBS: &[&str] = &[
    "picks up", "throws", "paints", "cuts", "rides", "washes", "kicks", "holds", "folds",
    "carries", "pours", "lifts",
];
const OBJECTS: &[&str] = &[
    "the ball",
    "a bucket of water",
    "the red bicycle",
    "a stack of plates",
    "the rope",
    "a large wooden board",
    "the paint roller",
    "a kite",
    "the blue towel",
    "a loaf of bread",
];
const PLACES: &[&str] = &[
    "in the kitchen",
    "across the field",
    "on the porch",
    "next to the fence",
    "in front of the camera",
    "by the pool",
    "while smiling at the crowd",
    "and then walks slowly back to the table with it",
];

/// A deterministic pseudo-caption ending: 5 to ~25 words.
fn ending(rng: &mut ChaCha8Rng) -> String {
    let mut words = vec![
        VERBS[rng.random_range(0..VERBS.len())].to_string(),
        OBJECTS[rng.random_range(0..OBJECTS.len())].to_string(),
    ];
    for _ in 0..rng.random_range(1..4) {
        words.push(PLACES[rng.random_range(0..PLACES.len())].to_string());
    }
    format!("{}.", words.join(" "))
}

/// Fills `store` with `contexts` examples (ext ids `syn#0`, `syn#1`, ...), each with `negatives`
/// generated endings, all assigned to one finished AF run with random final scores. Returns the
/// run id.
pub fn synthetic_af_project(
    store: &mut Store,
    contexts: usize,
    negatives: usize,
    seed: u64,
) -> Result<i64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let tx = store.transaction()?;
    let source = upsert_source(
        &tx,
        "synthetic",
        "jsonl",
        &format!("synthetic-{seed}"),
        "{}",
    )?;
    tx.execute(
        "INSERT INTO af_runs(k, seed, params, started_at, finished_at, status, pool_fingerprint)
         VALUES (?1, ?2, '{\"synthetic\":true}', ?3, ?3, 'done', 'synthetic')",
        params![negatives as i64, seed as i64, now()],
    )?;
    let run = tx.last_insert_rowid();
    for i in 0..contexts {
        let subject = SUBJECTS[rng.random_range(0..SUBJECTS.len())];
        let ex = NewExample {
            ext_id: format!("syn#{i}"),
            group: format!("video{}", i / 3),
            sent1: format!(
                "Context {i}: {subject} {} {} {}.",
                VERBS[rng.random_range(0..VERBS.len())],
                OBJECTS[rng.random_range(0..OBJECTS.len())],
                PLACES[rng.random_range(0..PLACES.len())]
            ),
            sent2: SUBJECTS[rng.random_range(0..SUBJECTS.len())].to_string(),
            ending: ending(&mut rng),
            gold_source: None,
        };
        insert_example(&tx, source, &ex)?;
        let example_id: i64 = tx.query_row(
            "SELECT id FROM examples WHERE ext_id = ?1",
            [&ex.ext_id],
            |r| r.get(0),
        )?;
        let gold_id: i64 = tx.query_row(
            "SELECT id FROM endings WHERE example_id = ?1 AND is_gold = 1",
            [example_id],
            |r| r.get(0),
        )?;
        tx.execute(
            "INSERT INTO af_scores(run_id, ending_id, score) VALUES (?1, ?2, ?3)",
            params![run, gold_id, rng.random::<f64>()],
        )?;
        for slot in 0..negatives {
            let text = format!("{} (alt {slot})", ending(&mut rng).trim_end_matches('.'));
            tx.execute(
                "INSERT INTO endings(example_id, text, is_gold) VALUES (?1, ?2, 0)",
                params![example_id, format!("{text}.")],
            )?;
            let ending_id = tx.last_insert_rowid();
            tx.execute(
                "INSERT INTO af_assignments(run_id, example_id, slot, ending_id, since_iteration)
                 VALUES (?1, ?2, ?3, ?4, -1)",
                params![run, example_id, slot as i64, ending_id],
            )?;
            tx.execute(
                "INSERT INTO af_scores(run_id, ending_id, score) VALUES (?1, ?2, ?3)",
                params![run, ending_id, rng.random::<f64>()],
            )?;
        }
    }
    tx.commit()?;
    Ok(run)
}
