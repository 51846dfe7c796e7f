//! Sentence embeddings with all-MiniLM-L6-v2, computed the way sentence-transformers does it:
//! BERT word pieces truncated to 256 (the model's `max_seq_length`), the last hidden layer
//! mean-pooled over the attention mask, then L2-normalised to a 384-d unit vector.
//!
//! AFLite uses these vectors as its default features Φ, the audit stage for KNN distances and
//! its MiniLM baseline, and AF for its sentence-vector model. `cross_encoder` fine-tunes the same
//! encoder as a multiple-choice model that reads each ending with its context. Both run the one
//! BERT of `bert`: the sentence model on afkit's packed kernels, the cross-encoder on candle
//! tensors that training passes gradients through.

mod bert;
pub mod cross_encoder;
mod minilm;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::Config;
use tokenizers::{Tokenizer, TruncationParams};

use crate::models::DefaultModel;
use minilm::MiniLm;
use sha2::{Digest, Sha256};

/// sentence-transformers' `max_seq_length` for all-MiniLM-L6-v2 (its sentence_bert_config.json),
/// counted in word pieces including [CLS] and [SEP]. The shipped tokenizer.json says 128, which
/// would silently cut long inputs shorter than the reference implementation does.
pub(crate) const MAX_SEQ_LEN: usize = 256;

/// Word pieces per forward pass. Sentences are laid end to end, not padded, so a batch is
/// measured in tokens: enough rows for the GEMM kernels to run at full rate, few enough that the
/// activations (tokens × 1,536 at the widest) stay in the caches (BENCHMARKS.md has the sizes
/// tried).
const BATCH_TOKENS: usize = 1024;

/// What afkit's sentence vectors are, in words. A project stores it with each vector, AFLite's
/// summary records it, and the embedding cache hashes it into its keys, so vectors made another
/// way (an older afkit's f32 products) are never mixed with these.
pub const ENCODER: &str = "all-MiniLM-L6-v2, mean-pooled, L2-normalised, linear layers in bf16";

/// Texts embedded between two writes to the cache, so an interrupted run keeps most of its work.
const CACHE_WRITE_EVERY: usize = 8192;

pub struct SentenceEncoder {
    model: MiniLm,
    tokenizer: Tokenizer,
    dim: usize,
    dir: PathBuf,
    /// What the cache keys a vector by besides its text, computed on first use.
    identity: OnceLock<[u8; 32]>,
}

/// The folder of the embedding cache every afkit command shares by default:
/// `$AFKIT_HOME/embeddings`.
pub fn default_cache_dir() -> PathBuf {
    crate::models::afkit_home().join("embeddings")
}

/// A cache key: SHA-256 of the encoder's identity and the text.
pub type VectorKey = [u8; 32];

/// Where sentence vectors are kept between runs (the store's embedding cache). A vector is a
/// pure function of the encoder and the text, so a hit is always right.
pub trait VectorStore {
    /// The cached vector of each key, `None` where there is none or it is not `dim` wide.
    fn get_many(&self, keys: &[VectorKey], dim: usize) -> Result<Vec<Option<Vec<f32>>>>;
    /// Stores vectors, replacing any under the same key.
    fn put_many(&mut self, rows: &[(VectorKey, &[f32])]) -> Result<()>;
}

impl SentenceEncoder {
    /// The default MiniLM model, fetched into the model cache if needed.
    pub fn load_default() -> Result<Self> {
        Self::load(&DefaultModel::MiniLm.ensure()?)
    }

    /// Loads `model.safetensors`, `tokenizer.json` and `config.json` from `dir`.
    pub fn load(dir: &Path) -> Result<Self> {
        let config_path = dir.join("config.json");
        let config: Config = serde_json::from_str(
            &std::fs::read_to_string(&config_path)
                .with_context(|| format!("cannot read {}", config_path.display()))?,
        )
        .with_context(|| format!("{} is not a BERT config", config_path.display()))?;
        let dim = config.hidden_size;

        let tokenizer_path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("cannot load {}", tokenizer_path.display()))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_SEQ_LEN,
                ..Default::default()
            }))
            .map_err(anyhow::Error::msg)?;
        // No padding: a batch's sentences are laid end to end (see `bert::Packed`).
        tokenizer.with_padding(None);

        let weights = dir.join("model.safetensors");
        // SAFETY: the weights file is memory-mapped read-only and not modified while in use.
        let vb =
            unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &Device::Cpu) }
                .with_context(|| format!("cannot map {}", weights.display()))?;
        let model = MiniLm::load(vb, &config, crate::lm::linear::Precision::Bf16)
            .with_context(|| format!("{} is not a BERT model", weights.display()))?;
        Ok(Self {
            model,
            tokenizer,
            dim,
            dir: dir.to_path_buf(),
            identity: OnceLock::new(),
        })
    }

    /// SHA-256 of everything a vector depends on besides its text: the model's files and how
    /// the vector is made from the last layer.
    fn identity(&self) -> Result<[u8; 32]> {
        if let Some(id) = self.identity.get() {
            return Ok(*id);
        }
        let mut h = Sha256::new();
        h.update(format!("{ENCODER}, at most {MAX_SEQ_LEN} pieces\n"));
        for file in ["config.json", "tokenizer.json", "model.safetensors"] {
            h.update(file);
            h.update(crate::models::sha256_file(&self.dir.join(file))?);
        }
        Ok(*self.identity.get_or_init(|| h.finalize().into()))
    }

    /// [`encode_with_progress`](Self::encode_with_progress) through `cache` where there is
    /// one: every text it holds is read from it, and the vectors computed are added (every few
    /// thousand texts, so an interrupted run keeps most of its work). `progress` first hears how
    /// many texts the cache held (0 without one), then each batch embedded.
    pub fn encode_cached(
        &self,
        texts: &[&str],
        mut cache: Option<&mut dyn VectorStore>,
        mut progress: impl FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        let keys: Vec<VectorKey> = match cache {
            Some(_) => {
                let identity = self.identity()?;
                texts
                    .iter()
                    .map(|t| {
                        let key = Sha256::new().chain_update(identity).chain_update(t);
                        key.finalize().into()
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        let mut vectors = match cache.as_deref() {
            Some(cache) => cache.get_many(&keys, self.dim)?,
            None => vec![None; texts.len()],
        };
        let missing: Vec<usize> = (0..texts.len()).filter(|&i| vectors[i].is_none()).collect();
        progress(texts.len() - missing.len());
        for part in missing.chunks(CACHE_WRITE_EVERY) {
            let part_texts: Vec<&str> = part.iter().map(|&i| texts[i]).collect();
            let fresh = self.encode_with_progress(&part_texts, &mut progress)?;
            if let Some(cache) = cache.as_deref_mut() {
                let rows: Vec<(VectorKey, &[f32])> = part
                    .iter()
                    .zip(&fresh)
                    .map(|(&i, v)| (keys[i], v.as_slice()))
                    .collect();
                cache.put_many(&rows)?;
            }
            for (&i, v) in part.iter().zip(fresh) {
                vectors[i] = Some(v);
            }
        }
        Ok(vectors
            .into_iter()
            .map(|v| v.expect("every text was cached or embedded"))
            .collect())
    }

    /// Embedding width (384 for MiniLM).
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Unit-length embeddings of `texts`, in the order given.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.encode_with_progress(texts, |_| {})
    }

    /// [`encode`](Self::encode), calling `progress(done)` after each batch with the number of
    /// texts embedded in it, so callers can drive a progress bar.
    pub(crate) fn encode_with_progress(
        &self,
        texts: &[&str],
        mut progress: impl FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(anyhow::Error::msg)
            .context("cannot tokenise the texts")?;
        // Similar lengths together: a batch's sentences then share the attention's cost evenly.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].get_ids().len());

        let mut out = vec![Vec::new(); texts.len()];
        let mut rest = order.as_slice();
        while !rest.is_empty() {
            crate::interrupt::check()?;
            let mut tokens = 0;
            let take = rest
                .iter()
                .take_while(|&&i| {
                    tokens += encodings[i].get_ids().len();
                    tokens <= BATCH_TOKENS
                })
                .count()
                .max(1);
            let (batch, tail) = rest.split_at(take);
            rest = tail;
            let ids: Vec<&[u32]> = batch.iter().map(|&i| encodings[i].get_ids()).collect();
            let pooled = self.model.mean_pooled(&ids)?;
            for (&i, mean) in batch.iter().zip(pooled.chunks_exact(self.dim)) {
                out[i] = unit(mean);
            }
            progress(batch.len());
        }
        Ok(out)
    }
}

/// sentence-transformers' Normalize: x / max(‖x‖, 1e-12).
fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter().map(|x| x / norm).collect()
}
