//! `afkit lm adapt` and adapted generation end to end on a tiny random model: folds by
//! group, adapters recorded with their hashes, resumable after kill -9 and reproducible from the
//! seed, and each context sampled by the adapter that never read its group.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use afkit_store::dataset::group_fold;
use common::{arg, command, jsonl_project, lm_adapt, query_i64, run_ok, tiny_gguf};
use rusqlite::Connection;

fn adapt(p: &Path, model: &Path) -> std::process::Command {
    lm_adapt(p, model, 3)
}

/// (fold, sha256) of every recorded adapter.
fn adapters(p: &Path) -> Vec<(i64, String)> {
    let conn = Connection::open(p).unwrap();
    let mut stmt = conn
        .prepare("SELECT fold, sha256 FROM adapters ORDER BY fold")
        .unwrap();
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

/// Beside afkit's adapter file, the same adapter for other engines: a PEFT folder whose config
/// and tensors describe every update (Hugging Face names, rank and alpha), and a GGUF LoRA file
/// with llama.cpp's metadata and every update's A and B.
fn assert_other_engines_formats(adapter: &Path) {
    let ours = afkit_engine::lm::adapter::Adapter::load(adapter).unwrap();
    let stem = adapter
        .to_string_lossy()
        .trim_end_matches(".safetensors")
        .to_string();
    let rank = ours.updates.values().next().unwrap().0.dims()[0];
    let peft = PathBuf::from(format!("{stem}.peft"));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(peft.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["r"], rank);
    let alpha = config["lora_alpha"].as_f64().unwrap();
    assert!((alpha / rank as f64 - f64::from(ours.scale)).abs() < 1e-6);
    let tensors = candle_core::safetensors::load(
        peft.join("adapter_model.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    assert_eq!(tensors.len(), 2 * ours.updates.len());
    assert!(tensors
        .keys()
        .all(|k| k.starts_with("base_model.model.model.layers.") && k.contains(".lora_")));

    let mut file = std::fs::File::open(format!("{stem}.lora.gguf")).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let text = |k: &str| content.metadata[k].to_string().unwrap().clone();
    assert_eq!(text("general.type"), "adapter");
    assert_eq!(text("adapter.type"), "lora");
    assert_eq!(text("general.architecture"), "llama");
    for name in ours.updates.keys() {
        assert!(
            content.tensor_infos.contains_key(&format!("{name}.lora_a")),
            "{name}"
        );
        assert!(
            content.tensor_infos.contains_key(&format!("{name}.lora_b")),
            "{name}"
        );
    }
}

#[test]
fn adapters_are_trained_per_fold_resume_after_kill_9_and_repeat_from_the_seed() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 64, 2);
    let a = dir.path().join("a");
    std::fs::create_dir(&a).unwrap();
    let p = jsonl_project(&a, 40);
    // Kill the first run once it has recorded a fold (or at once, if it is that fast).
    let mut child = adapt(&p, &model)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(10));
        if query_i64(&p, "SELECT COUNT(*) FROM adapters") >= 1 {
            break;
        }
    }
    child.kill().ok(); // SIGKILL
    child.wait().unwrap();
    // Every recorded adapter's file is whole: it is written before it is recorded.
    for (fold, sha) in adapters(&p) {
        let path = a
            .join("p.adapters")
            .read_dir()
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|f| {
                f.to_string_lossy()
                    .ends_with(&format!("fold{fold}-of-3.safetensors"))
            })
            .unwrap();
        assert_eq!(afkit_engine::models::sha256_file(&path).unwrap(), sha);
        assert_other_engines_formats(&path);
    }
    let said = run_ok(&mut adapt(&p, &model));
    assert!(said.contains("3 folds ready"), "{said}");
    assert_eq!(adapters(&p).len(), 3);
    // Same seed, uninterrupted, in a fresh project: the same adapters, bit for bit.
    let b = dir.path().join("b");
    std::fs::create_dir(&b).unwrap();
    let q = jsonl_project(&b, 40);
    run_ok(&mut adapt(&q, &model));
    assert_eq!(adapters(&p), adapters(&q));
    // A second run has nothing left to do.
    let said = run_ok(&mut adapt(&q, &model));
    assert!(said.contains("0 trained now"), "{said}");
}

/// `afkit generate` of three endings for 30 contexts of `p` with `model`, seeded, plus `extra`.
fn generate_30(p: &Path, model: &Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = command();
    cmd.args(["generate", arg(p), "--model", arg(model), "--n-neg", "3"]);
    cmd.args([
        "--max-tokens",
        "8",
        "--seed",
        "1",
        "--no-ending-rules",
        "--limit",
        "30",
    ]);
    cmd.args(extra);
    cmd
}

/// Every generated ending of the project, by context and text.
fn generated_texts(p: &Path) -> Vec<String> {
    let conn = Connection::open(p).unwrap();
    let mut stmt = conn
        .prepare("SELECT text FROM endings WHERE is_gold = 0 ORDER BY example_id, text")
        .unwrap();
    let rows = stmt.query_map([], |r| r.get(0)).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

#[test]
fn generate_adapted_samples_each_context_with_its_folds_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 64, 2);
    let p = jsonl_project(dir.path(), 40);
    let generate = |p: &Path, extra: &[&str]| generate_30(p, &model, extra);
    let said = command()
        .args(["generate", arg(&p), "--model", arg(&model), "--adapted"])
        .output()
        .unwrap();
    assert!(!said.status.success());
    assert!(String::from_utf8_lossy(&said.stderr).contains("afkit lm adapt"));
    assert_eq!(query_i64(&p, "SELECT COUNT(*) FROM generations"), 0);

    run_ok(&mut adapt(&p, &model));
    // A project that holds adapters samples with them by default.
    run_ok(&mut generate(&p, &["--style-examples", "0"]));
    assert_eq!(query_i64(&p, "SELECT COUNT(*) FROM pools"), 30);
    let conn = Connection::open(&p).unwrap();
    let params: String = conn
        .query_row("SELECT params FROM generations", [], |r| r.get(0))
        .unwrap();
    let params: serde_json::Value = serde_json::from_str(&params).unwrap();
    let recorded: Vec<String> = adapters(&p).into_iter().map(|(_, sha)| sha).collect();
    assert_eq!(params["adapters"]["sha256"], serde_json::json!(recorded));

    // The 30 contexts span every fold, and each context's pool is what the model with its own
    // fold's adapter samples: a project whose adapters are swapped samples other endings.
    let folds: std::collections::BTreeSet<usize> = (0..15)
        .map(|v| group_fold(afkit_engine::seed::Seed::new(5), &format!("v{v}"), 3))
        .collect();
    assert_eq!(folds.len(), 3);
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let q = jsonl_project(&plain, 40);
    let out = generate(&q, &["--style-examples", "0"]).output().unwrap();
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("no adapters for this model") && said.contains("afkit lm adapt"),
        "a project without adapters is told how the default recipe differs: {said}"
    );
    assert_ne!(
        generated_texts(&p),
        generated_texts(&q),
        "the adapters change what is sampled"
    );

    // A changed adapter file is refused rather than used.
    let file = std::fs::read_dir(dir.path().join("p.adapters"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|f| f.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let out = generate(&p, &["--style-examples", "0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the adapter the project recorded"));
    // Unless the model alone is asked for, which needs no reminder.
    let out = generate(&p, &["--style-examples", "0", "--no-adapters"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("no adapters for this model"));
    assert_eq!(query_i64(&p, "SELECT COUNT(*) FROM generations"), 2);
}
