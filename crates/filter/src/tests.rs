//! Reading a project's pools into a [`Dataset`] and storing the sentence model's vectors, on
//! projects written as `ingest` and `generate` write them.

use std::path::Path;

use afkit_engine::embed::ENCODER;
use afkit_engine::lm::features::EndingFeatures;
use afkit_engine::seed::Seed;
use afkit_store::examples::NewExample;
use afkit_store::pool::{NewGeneration, NewPool};
use afkit_store::Store;

use crate::data::{store_sentence_vectors, Dataset};
use crate::settings::EncodeConfig;

const VERBS: [&str; 6] = ["holds", "throws", "paints", "lifts", "cleans", "kicks"];
const NOUNS: [&str; 5] = ["ball", "rope", "board", "brush", "bucket"];
const PLACES: [&str; 4] = [
    "in the yard",
    "on the table",
    "near the wall",
    "by the pool",
];

/// The `j`-th distinct ending text of context `i`.
fn ending_text(i: usize, j: usize) -> String {
    let n = i * 7 + j;
    format!(
        "{} the {} {} {j}.",
        VERBS[n % VERBS.len()],
        NOUNS[(n / VERBS.len()) % NOUNS.len()],
        PLACES[i % PLACES.len()]
    )
}

/// LM features that differ from ending to ending.
fn features(i: usize, j: usize) -> EndingFeatures {
    let x = ((i * 31 + j * 17) % 23) as f64;
    EndingFeatures {
        lp_cond: -10.0 - x,
        lp_alone: Some(-14.0 - x / 2.0),
        lp_final_punct: (!j.is_multiple_of(3)).then_some(-0.5 - x / 10.0),
        n_tok: 5 + j % 4,
    }
}

/// A project of `contexts` contexts (three to a video), each with its found ending and a pool
/// of `candidates` generated ones.
fn pool_project(path: &Path, contexts: usize, candidates: usize) -> Store {
    let mut store = Store::create(path).unwrap();
    store
        .transaction(|store| {
            let source = store.upsert_source("synthetic", "jsonl", "synthetic", "{}")?;
            let generation = store.find_or_insert_generation(&NewGeneration {
                backend: "import".into(),
                model: "synthetic".into(),
                model_sha256: None,
                prompt: "none".into(),
                params_json: "{}".into(),
                seed: Seed::new(0),
            })?;
            for i in 0..contexts {
                let ext_id = format!("v{}#{i}", i / 3);
                let example = NewExample {
                    ext_id: ext_id.clone(),
                    group: format!("v{}", i / 3),
                    sent1: "A person stands outside on a sunny day.".into(),
                    sent2: ["The man", "A woman", "She"][i % 3].into(),
                    ending: ending_text(i, 0),
                    gold_source: None,
                };
                assert!(store.insert_example(source, &example)?);
                store.write_pool(&NewPool {
                    example_id: store.example_id_by_ext_id(&ext_id)?.expect("inserted"),
                    generation_id: generation,
                    requested: candidates,
                    ctx_logprob: -2.5 - (i % 5) as f64 / 10.0,
                    n_tok_sent1: 9,
                    n_tok_sent2: 2,
                    seconds: 0.0,
                    gold: features(i, 0),
                    candidates: (1..=candidates)
                        .map(|j| (ending_text(i, j), features(i, j)))
                        .collect(),
                    style_examples: Vec::new(),
                    draws: None,
                })?;
            }
            Ok(())
        })
        .unwrap();
    store
}

/// Every context of the project's pools with its generated endings' ids, as the store streams
/// them.
fn stored_candidates(store: &Store) -> Vec<(i64, i64)> {
    let mut stored = Vec::new();
    store
        .for_each_pool_context(None, &[], |c| {
            stored.extend(c.candidates.iter().map(|e| (c.example_id, e.id)));
            Ok(())
        })
        .unwrap();
    stored
}

/// The pools stream in chunks: loaded with or without the texts, the dataset holds every context
/// with its endings in id order and the same standardised LM features.
#[test]
fn dataset_streams_every_pool_whole_with_or_without_text() {
    let dir = tempfile::tempdir().unwrap();
    let (contexts, candidates) = (1100, 5);
    let store = pool_project(&dir.path().join("d.sqlite"), contexts, candidates);
    // The sentence vectors have their own test (embedding 6,600 endings here would be slow).
    let cfg = EncodeConfig {
        sentence_vectors: false,
        ..EncodeConfig::default()
    };
    let lean = Dataset::load(&store, 3, &cfg, false, &[]).unwrap();
    let full = Dataset::load(&store, 3, &cfg, true, &[]).unwrap();
    assert_eq!(lean.contexts.len(), contexts);
    assert_eq!(lean.fingerprint(), full.fingerprint());
    let stored = stored_candidates(&store);
    assert_eq!(stored.len(), contexts * candidates);
    assert!(stored.windows(2).all(|w| w[0] < w[1]), "in id order");
    let loaded: Vec<(i64, i64)> = lean
        .contexts
        .iter()
        .flat_map(|c| {
            c.candidates
                .iter()
                .map(move |e| (c.example_id, e.ending_id))
        })
        .collect();
    assert_eq!(loaded, stored);
    for (a, b) in lean.contexts.iter().zip(&full.contexts) {
        assert_eq!(a.gold.mlp, b.gold.mlp);
        assert!(a.gold.words.is_empty() && !b.gold.words.is_empty());
        assert_eq!(b.gold.words.len(), b.gold.lstm.len());
        for (x, y) in a.candidates.iter().zip(&b.candidates) {
            assert_eq!(x.mlp, y.mlp);
        }
    }
    assert!(full.vocab_size > 2 && full.with_text && !lean.with_text);
    // Too few candidates for k: every context is left out, and counted.
    let none = Dataset::load(&store, 6, &cfg, false, &[]).unwrap();
    assert_eq!((none.contexts.len(), none.excluded), (0, contexts));
}

/// The sentence model's vectors: a load that needs them and finds none says so; once stored,
/// every ending of every pool has one MiniLM vector, and storing again embeds nothing. A vector
/// another encoder made (an older afkit's f32 build) is not used: it is made again.
#[test]
fn sentence_vectors_are_stored_once_for_every_pool_ending() {
    let dir = tempfile::tempdir().unwrap();
    let (contexts, candidates) = (12, 5);
    let mut store = pool_project(&dir.path().join("v.sqlite"), contexts, candidates);
    let cfg = EncodeConfig::default();
    let err = Dataset::load(&store, 3, &cfg, true, &[]).unwrap_err();
    assert!(err.to_string().contains("no sentence vector"), "{err:#}");
    let mut embedded = 0;
    store_sentence_vectors(&mut store, None, &mut |done, _| embedded = done).unwrap();
    assert_eq!(embedded, contexts * (candidates + 1), "every pool ending");
    let missing = |store: &Store| {
        store
            .count_endings_without_sentence_vector(ENCODER)
            .unwrap()
    };
    assert_eq!(missing(&store), 0);
    let data = Dataset::load(&store, 3, &cfg, true, &[]).unwrap();
    assert_eq!(data.sentence_dim, 384);
    for c in &data.contexts {
        for e in std::iter::once(&c.gold).chain(&c.candidates) {
            assert_eq!(e.sentence.len(), 384);
            let norm: f32 = e.sentence.iter().map(|v| v * v).sum();
            assert!((norm - 1.0).abs() < 1e-3, "unit vectors");
        }
    }
    let mut again = false;
    store_sentence_vectors(&mut store, None, &mut |_, _| again = true).unwrap();
    assert!(!again, "nothing embedded again");

    // The first ending's vector replaced by zeros from the earlier encoder.
    let first = data.contexts[0].gold.ending_id;
    store
        .put_sentence_vectors("all-MiniLM-L6-v2", &[(first, vec![0.0; 384])])
        .unwrap();
    assert_eq!(
        missing(&store),
        1,
        "the older encoder's vector does not count"
    );
    store_sentence_vectors(&mut store, None, &mut |_, _| {}).unwrap();
    assert_eq!(missing(&store), 0);
    let data = Dataset::load(&store, 3, &cfg, true, &[]).unwrap();
    let first = &data.contexts[0].gold.sentence;
    assert!(
        first.iter().any(|&v| v != 0.0),
        "made again, not the stored zeros"
    );
}
