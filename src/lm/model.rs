//! A whole language model from one GGUF file: weights, tokenizer and the document-start prefix.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand_distr::{Distribution, Normal};

use super::adapt::Adapter;
use super::llama::{Llama, LlamaConfig, Prefix};
use super::tokenizer::GgufTokenizer;
use crate::device::Compute;
use crate::seed::Seed;

pub struct LanguageModel {
    pub llama: Llama,
    pub tokenizer: GgufTokenizer,
    pub path: PathBuf,
    /// Keys and values of the document-start token alone: the prefix for scoring endings
    /// without their context.
    pub doc_prefix: Prefix,
}

impl LanguageModel {
    /// Loads a llama-family GGUF file onto the CPU, run by afkit's kernels.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_on(path, &Compute::cpu())
    }

    /// Loads a llama-family GGUF file, dequantising its weights to f32, onto `compute`'s device.
    pub fn load_on(path: &Path, compute: &Compute) -> Result<Self> {
        Self::load_adapted(path, compute, None)
    }

    /// Loads a GGUF file with an adapter's updates merged into its weights.
    pub fn load_adapted(path: &Path, compute: &Compute, adapter: Option<&Adapter>) -> Result<Self> {
        let (content, tokenizer, mut reader) = read_header(path)?;
        let llama = Llama::from_gguf(&content, &mut reader, path, compute, adapter)
            .with_context(|| format!("cannot load the weights of {}", path.display()))?;
        if tokenizer.vocab_size() != llama.cfg.vocab {
            bail!(
                "{}: the tokenizer has {} tokens but the embedding matrix {} rows",
                path.display(),
                tokenizer.vocab_size(),
                llama.cfg.vocab
            );
        }
        let (doc_prefix, _) = llama.prefill(&[tokenizer.doc_start])?;
        Ok(LanguageModel {
            llama,
            tokenizer,
            path: path.to_path_buf(),
            doc_prefix,
        })
    }
}

/// Reads a GGUF file's header (metadata and tensor index), checks that the file holds every
/// tensor it lists, and builds the tokenizer it describes. Returns the reader, positioned for
/// the weights.
pub fn read_header(path: &Path) -> Result<(Content, GgufTokenizer, BufReader<File>)> {
    let file =
        File::open(path).with_context(|| format!("cannot open model file {}", path.display()))?;
    let mut reader = BufReader::new(file);
    let content = Content::read(&mut reader).with_context(|| {
        format!(
            "{} is not a readable GGUF file (truncated or corrupt header)",
            path.display()
        )
    })?;
    check_complete(&content, path)?;
    let tokenizer = GgufTokenizer::from_gguf(&content)
        .with_context(|| format!("cannot build the tokenizer of {}", path.display()))?;
    Ok((content, tokenizer, reader))
}

/// Fails with the sizes involved when the file ends before its last tensor does.
fn check_complete(content: &Content, path: &Path) -> Result<()> {
    let file_len = std::fs::metadata(path)?.len();
    let needed = content
        .tensor_infos
        .values()
        .map(|t| {
            let bytes = t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size();
            content.tensor_data_offset + t.offset + bytes as u64
        })
        .max()
        .unwrap_or(0);
    if file_len < needed {
        bail!(
            "{} is truncated: its tensors need {needed} bytes but the file has {file_len} \
             (re-download it, e.g. `afkit models fetch smollm2`)",
            path.display()
        );
    }
    Ok(())
}

/// Writes a small llama GGUF with random f32 weights and a byte-level vocabulary (the 256 byte
/// symbols, a few merges, `<|endoftext|>` and `<|im_end|>`). It exercises the real loading,
/// tokenising and sampling code in tests without a download; its text is noise.
#[doc(hidden)]
pub fn write_random_gguf(path: &Path, cfg: &LlamaConfig, seed: u64) -> Result<()> {
    let (tokens, merges) = random_vocabulary();
    if cfg.vocab != tokens.len() {
        bail!("a random GGUF has a vocabulary of {} tokens", tokens.len());
    }
    let metadata = random_metadata(cfg, &tokens, &merges);
    let tensors = random_weights(cfg, seed)?;
    let mut out = BufWriter::new(
        File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
    );
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut out, &meta_refs, &tensor_refs)?;
    Ok(())
}

/// The byte-level vocabulary of a random GGUF: its tokens and merges.
fn random_vocabulary() -> (Vec<String>, Vec<String>) {
    let mut tokens: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
        .into_iter()
        .collect();
    tokens.sort_unstable();
    let mut tokens: Vec<String> = tokens.into_iter().map(String::from).collect();
    // A few ordinary merges, and one "<letter>." merge per letter so that a random model ends
    // sentences often enough for sampling tests.
    let merges: Vec<String> = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "e d"]
        .iter()
        .map(|m| m.to_string())
        .chain(('a'..='z').map(|c| format!("{c} .")))
        .collect();
    for m in &merges {
        tokens.push(m.replace(' ', ""));
    }
    tokens.push("<|endoftext|>".into());
    tokens.push("<|im_end|>".into());
    (tokens, merges)
}

/// A random GGUF's metadata: llama's shape keys and the tokenizer.
fn random_metadata(
    cfg: &LlamaConfig,
    tokens: &[String],
    merges: &[String],
) -> Vec<(&'static str, Value)> {
    let n = tokens.len() as u32;
    let strings = |v: &[String]| Value::Array(v.iter().map(|s| Value::String(s.clone())).collect());
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(cfg.n_layer as u32)),
        ("llama.embedding_length", Value::U32(cfg.d_model as u32)),
        ("llama.feed_forward_length", Value::U32(cfg.d_ff as u32)),
        ("llama.attention.head_count", Value::U32(cfg.n_head as u32)),
        (
            "llama.attention.head_count_kv",
            Value::U32(cfg.n_kv_head as u32),
        ),
        ("llama.rope.freq_base", Value::F32(cfg.rope_theta)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            Value::F32(cfg.rms_eps),
        ),
        (
            "llama.rope.dimension_count",
            Value::U32(cfg.head_dim() as u32),
        ),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("smollm".into())),
        ("tokenizer.ggml.tokens", strings(tokens)),
        ("tokenizer.ggml.merges", strings(merges)),
        ("tokenizer.ggml.bos_token_id", Value::U32(n - 2)),
        ("tokenizer.ggml.eos_token_id", Value::U32(n - 1)),
    ]
}

/// Random f32 weights for every tensor of a llama of shape `cfg`, drawn in a fixed order from `seed`.
fn random_weights(cfg: &LlamaConfig, seed: u64) -> Result<Vec<(String, QTensor)>> {
    let dev = Device::Cpu;
    let mut rng = Seed::new(seed).rng();
    let (d, hd) = (cfg.d_model, cfg.head_dim());
    // Weights as llama.cpp stores them: (out × in), scaled to keep activations O(1).
    let mut mat = |rows: usize, cols: usize, scale: f32| -> Result<QTensor> {
        let normal = Normal::new(0f32, scale / (cols as f32).sqrt())?;
        let values: Vec<f32> = (0..rows * cols).map(|_| normal.sample(&mut rng)).collect();
        let t = Tensor::from_vec(values, (rows, cols), &dev)?;
        Ok(QTensor::quantize(&t, GgmlDType::F32)?)
    };
    let ones = || -> Result<QTensor> {
        Ok(QTensor::quantize(
            &Tensor::ones(d, candle_core::DType::F32, &dev)?,
            GgmlDType::F32,
        )?)
    };
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), mat(cfg.vocab, d, 1.5)?),
        ("output_norm.weight".into(), ones()?),
    ];
    for i in 0..cfg.n_layer {
        let b = |p: &str| format!("blk.{i}.{p}.weight");
        tensors.push((b("attn_norm"), ones()?));
        tensors.push((b("ffn_norm"), ones()?));
        tensors.push((b("attn_q"), mat(cfg.n_head * hd, d, 1.0)?));
        tensors.push((b("attn_k"), mat(cfg.n_kv_head * hd, d, 1.0)?));
        tensors.push((b("attn_v"), mat(cfg.n_kv_head * hd, d, 1.0)?));
        tensors.push((b("attn_output"), mat(d, cfg.n_head * hd, 1.0)?));
        tensors.push((b("ffn_gate"), mat(cfg.d_ff, d, 1.0)?));
        tensors.push((b("ffn_up"), mat(cfg.d_ff, d, 1.0)?));
        tensors.push((b("ffn_down"), mat(d, cfg.d_ff, 1.0)?));
    }
    Ok(tensors)
}

/// The vocabulary size of [`write_random_gguf`] models.
#[doc(hidden)]
pub const RANDOM_GGUF_VOCAB: usize = 256 + 6 + 26 + 2;
