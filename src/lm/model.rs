//! A whole language model from one GGUF file: weights, tokenizer and the document-start prefix.

use std::fs::File;
use std::io::{BufReader, BufWriter, Cursor, Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use sha2::{Digest, Sha256};

use super::adapter::Adapter;
use super::family::Family;
use super::llama::{Llama, LlamaConfig, Prefix, MAX_POSITIONS};
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
    /// Loads a GGUF file of one of the engine's families onto the CPU, run by afkit's kernels.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_on(path, &Compute::cpu())
    }

    /// Loads a GGUF file of one of the engine's families, dequantising its weights to f32, onto
    /// `compute`'s device.
    pub fn load_on(path: &Path, compute: &Compute) -> Result<Self> {
        Self::load_adapted(path, compute, None)
    }

    /// Loads a GGUF file with an adapter's updates merged into its weights.
    pub fn load_adapted(path: &Path, compute: &Compute, adapter: Option<&Adapter>) -> Result<Self> {
        let (content, tokenizer, mut reader) = read_header(path)?;
        Self::from_parts(content, tokenizer, &mut reader, path, (compute, adapter))
    }

    /// [`LanguageModel::load_adapted`] from a file already in memory: a model with one adapter
    /// per fold reads and hashes its file once, however many folds it loads.
    pub fn load_adapted_from(
        file: &ModelFile,
        compute: &Compute,
        adapter: Option<&Adapter>,
    ) -> Result<Self> {
        let mut reader = Cursor::new(file.bytes.as_slice());
        let (content, tokenizer) = read_header_from(&mut reader, &file.path, file.bytes.len())?;
        Self::from_parts(
            content,
            tokenizer,
            &mut reader,
            &file.path,
            (compute, adapter),
        )
    }

    /// The model from a parsed header and a reader of its file's weights.
    fn from_parts<R: Read + Seek>(
        content: Content,
        tokenizer: GgufTokenizer,
        reader: &mut R,
        path: &Path,
        (compute, adapter): (&Compute, Option<&Adapter>),
    ) -> Result<Self> {
        let llama = Llama::from_gguf(&content, reader, path, compute, adapter)
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

/// A GGUF file read into memory, with its SHA-256: what `generate` loads every fold's model from.
pub struct ModelFile {
    pub path: PathBuf,
    bytes: Vec<u8>,
    pub sha256: String,
}

impl ModelFile {
    pub fn read(path: &Path) -> Result<ModelFile> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read model file {}", path.display()))?;
        let sha256 = crate::models::hex(&Sha256::digest(&bytes));
        Ok(ModelFile {
            path: path.to_path_buf(),
            bytes,
            sha256,
        })
    }
}

/// Reads a GGUF file's header (metadata and tensor index), checks that the file holds every
/// tensor it lists, and builds the tokenizer it describes. Returns the reader, positioned for
/// the weights.
pub fn read_header(path: &Path) -> Result<(Content, GgufTokenizer, BufReader<File>)> {
    let file =
        File::open(path).with_context(|| format!("cannot open model file {}", path.display()))?;
    let file_len = file.metadata()?.len() as usize;
    let mut reader = BufReader::new(file);
    let (content, tokenizer) = read_header_from(&mut reader, path, file_len)?;
    Ok((content, tokenizer, reader))
}

/// [`read_header`] from any reader of a file of `file_len` bytes (`path` names it in errors).
fn read_header_from<R: Read + Seek>(
    reader: &mut R,
    path: &Path,
    file_len: usize,
) -> Result<(Content, GgufTokenizer)> {
    let content = Content::read(reader).with_context(|| {
        format!(
            "{} is not a readable GGUF file (truncated or corrupt header)",
            path.display()
        )
    })?;
    check_complete(&content, path, file_len as u64)?;
    let tokenizer = GgufTokenizer::from_gguf(&content)
        .with_context(|| format!("cannot build the tokenizer of {}", path.display()))?;
    Ok((content, tokenizer))
}

/// Fails with the sizes involved when the file ends before its last tensor does.
fn check_complete(content: &Content, path: &Path, file_len: u64) -> Result<()> {
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

/// Writes a small GGUF of `cfg`'s family with random f32 weights and a small vocabulary (for
/// llama and Qwen the 256 byte symbols, a few merges, `<|endoftext|>` and `<|im_end|>`; for
/// Gemma a SentencePiece vocabulary with byte fallback). It exercises the real loading,
/// tokenising and sampling code in tests without a download; its text is noise.
#[doc(hidden)]
pub fn write_random_gguf(path: &Path, cfg: &LlamaConfig, seed: u64) -> Result<()> {
    if cfg.vocab != RANDOM_GGUF_VOCAB {
        bail!("a random GGUF has a vocabulary of {RANDOM_GGUF_VOCAB} tokens");
    }
    let mut metadata = random_shape_metadata(cfg);
    metadata.extend(match cfg.arch.family {
        Family::Gemma3 => sentencepiece_metadata(),
        family => {
            let (tokens, merges) = random_vocabulary();
            let pre = if family == Family::Llama {
                "smollm"
            } else {
                "qwen2"
            };
            byte_level_metadata(&tokens, &merges, pre)
        }
    });
    let tensors = random_weights(cfg, seed)?;
    let mut out = BufWriter::new(
        File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
    );
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
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

/// A random GGUF's shape keys, under its family's prefix.
fn random_shape_metadata(cfg: &LlamaConfig) -> Vec<(String, Value)> {
    let arch = cfg.arch.family.architecture();
    let u = |k: &str, v: usize| (format!("{arch}.{k}"), Value::U32(v as u32));
    let f = |k: &str, v: f32| (format!("{arch}.{k}"), Value::F32(v));
    let mut keys = vec![
        (
            "general.architecture".to_string(),
            Value::String(arch.into()),
        ),
        u("block_count", cfg.n_layer),
        u("context_length", MAX_POSITIONS),
        u("embedding_length", cfg.d_model),
        u("feed_forward_length", cfg.d_ff),
        u("attention.head_count", cfg.n_head),
        u("attention.head_count_kv", cfg.n_kv_head),
        u("attention.key_length", cfg.head_dim()),
        u("attention.value_length", cfg.head_dim()),
        f("rope.freq_base", cfg.rope_theta),
        f("attention.layer_norm_rms_epsilon", cfg.rms_eps),
        u("rope.dimension_count", cfg.head_dim()),
    ];
    if let Some(local) = &cfg.arch.local_layers {
        keys.push(u("attention.sliding_window", local.window));
        keys.push(u("attention.sliding_window_type", local.period));
        keys.push(f("rope.local_freq_base", local.rope_theta));
    }
    keys
}

fn strings(v: &[String]) -> Value {
    Value::Array(v.iter().map(|s| Value::String(s.clone())).collect())
}

/// A byte-level BPE vocabulary's keys; BOS and EOS are its last two tokens.
fn byte_level_metadata(tokens: &[String], merges: &[String], pre: &str) -> Vec<(String, Value)> {
    let n = tokens.len() as u32;
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), strings(tokens)),
        ("tokenizer.ggml.merges".into(), strings(merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(n - 2)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(n - 1)),
    ]
}

/// A SentencePiece vocabulary laid out as Gemma's: `<pad>`, `<eos>`, `<bos>`, `<unk>`, the 256
/// byte tokens, then pieces (`▁`, the letters, `▁t`, `he`, `▁the`), earlier pieces scoring
/// higher.
fn sentencepiece_metadata() -> Vec<(String, Value)> {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![3, 3, 3, 2];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend([6; 256]);
    let pieces = std::iter::once("▁".to_string())
        .chain(('a'..='z').map(String::from))
        .chain(["▁t", "he", "▁the"].map(String::from));
    for piece in pieces {
        tokens.push(piece);
        types.push(1);
    }
    let scores = (0..tokens.len()).map(|i| Value::F32(-(i as f32))).collect();
    vec![
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        ("tokenizer.ggml.tokens".into(), strings(&tokens)),
        ("tokenizer.ggml.scores".into(), Value::Array(scores)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(2)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.unknown_token_id".into(), Value::U32(3)),
        ("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false)),
    ]
}

/// Random f32 weights for every tensor of a model of shape `cfg`, drawn in a fixed order from
/// `seed`: llama's tensors first (norms all ones), then per block the family's extras (norms
/// near one, biases near zero).
fn random_weights(cfg: &LlamaConfig, seed: u64) -> Result<Vec<(String, QTensor)>> {
    let rng = &mut Seed::new(seed).rng();
    let (d, hd) = (cfg.d_model, cfg.head_dim());
    // Weights as llama.cpp stores them: (out × in), scaled to keep activations O(1).
    let mat = |rng: &mut ChaCha8Rng, rows: usize, cols: usize| -> Result<QTensor> {
        f32_tensor(
            normal(rng, rows * cols, 0.0, 1.0 / (cols as f32).sqrt())?,
            &[rows, cols],
        )
    };
    let ones = |n: usize| f32_tensor(vec![1.0; n], &[n]);
    let embed = f32_tensor(
        normal(rng, cfg.vocab * d, 0.0, 1.5 / (d as f32).sqrt())?,
        &[cfg.vocab, d],
    )?;
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), embed),
        ("output_norm.weight".into(), ones(d)?),
    ];
    let arch = &cfg.arch;
    for i in 0..cfg.n_layer {
        let b = |p: &str| format!("blk.{i}.{p}.weight");
        tensors.push((b("attn_norm"), ones(d)?));
        tensors.push((b("ffn_norm"), ones(d)?));
        tensors.push((b("attn_q"), mat(rng, cfg.n_head * hd, d)?));
        tensors.push((b("attn_k"), mat(rng, cfg.n_kv_head * hd, d)?));
        tensors.push((b("attn_v"), mat(rng, cfg.n_kv_head * hd, d)?));
        tensors.push((b("attn_output"), mat(rng, d, cfg.n_head * hd)?));
        tensors.push((b("ffn_gate"), mat(rng, cfg.d_ff, d)?));
        tensors.push((b("ffn_up"), mat(rng, cfg.d_ff, d)?));
        tensors.push((b("ffn_down"), mat(rng, d, cfg.d_ff)?));
        let mut extras: Vec<(String, usize, f32)> = Vec::new();
        if arch.qkv_bias() {
            let bias = |p: &str| format!("blk.{i}.{p}.bias");
            extras.push((bias("attn_q"), cfg.n_head * hd, 0.0));
            extras.push((bias("attn_k"), cfg.n_kv_head * hd, 0.0));
            extras.push((bias("attn_v"), cfg.n_kv_head * hd, 0.0));
        }
        if arch.qk_norm() {
            extras.push((b("attn_q_norm"), hd, 1.0));
            extras.push((b("attn_k_norm"), hd, 1.0));
        }
        if arch.post_norms() {
            extras.push((b("post_attention_norm"), d, 1.0));
            extras.push((b("post_ffw_norm"), d, 1.0));
        }
        for (name, len, mean) in extras {
            tensors.push((name, f32_tensor(normal(rng, len, mean, 0.1)?, &[len])?));
        }
    }
    Ok(tensors)
}

/// `len` draws from N(mean, sd²).
fn normal(rng: &mut ChaCha8Rng, len: usize, mean: f32, sd: f32) -> Result<Vec<f32>> {
    let normal = Normal::new(mean, sd)?;
    Ok((0..len).map(|_| normal.sample(rng)).collect())
}

fn f32_tensor(values: Vec<f32>, shape: &[usize]) -> Result<QTensor> {
    let t = Tensor::from_vec(values, shape, &Device::Cpu)?;
    Ok(QTensor::quantize(&t, GgmlDType::F32)?)
}

/// The vocabulary size of [`write_random_gguf`] models.
#[doc(hidden)]
pub const RANDOM_GGUF_VOCAB: usize = 256 + 6 + 26 + 2;
