//! Sentence embeddings with all-MiniLM-L6-v2, computed the way sentence-transformers does it:
//! BERT word pieces truncated to 256 (the model's `max_seq_length`), the last hidden layer
//! mean-pooled over the attention mask, then L2-normalised to a 384-d unit vector.
//!
//! AFLite uses these vectors as its default features Φ and the audit stage for KNN distances.

use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{Tokenizer, TruncationParams};

use crate::models::DefaultModel;

/// sentence-transformers' `max_seq_length` for all-MiniLM-L6-v2 (its sentence_bert_config.json),
/// counted in word pieces including [CLS] and [SEP]. The shipped tokenizer.json says 128, which
/// would silently cut long inputs shorter than the reference implementation does.
pub const MAX_SEQ_LEN: usize = 256;

/// Sentences per forward pass. Inputs are sorted by length first, so a batch pads little.
const BATCH_SIZE: usize = 64;

pub struct SentenceEncoder {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    dim: usize,
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
        // Padding is done per batch (to the longest member), not to a fixed length.
        tokenizer.with_padding(None);

        let device = Device::Cpu;
        let weights = dir.join("model.safetensors");
        // SAFETY: the weights file is memory-mapped read-only and not modified while in use.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[&weights], DType::F32, &device) }
            .with_context(|| format!("cannot map {}", weights.display()))?;
        let model = BertModel::load(vb, &config)
            .with_context(|| format!("{} is not a BERT model", weights.display()))?;
        Ok(Self {
            model,
            tokenizer,
            device,
            dim,
        })
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
    pub fn encode_with_progress(
        &self,
        texts: &[&str],
        mut progress: impl FnMut(usize),
    ) -> Result<Vec<Vec<f32>>> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(anyhow::Error::msg)
            .context("cannot tokenise the texts")?;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].get_ids().len());

        let mut out = vec![Vec::new(); texts.len()];
        for batch in order.chunks(BATCH_SIZE) {
            crate::interrupt::check()?;
            let max_len = batch
                .iter()
                .map(|&i| encodings[i].get_ids().len())
                .max()
                .unwrap_or(0);
            let mut ids = vec![0u32; batch.len() * max_len];
            let mut mask = vec![0u32; batch.len() * max_len];
            for (row, &i) in batch.iter().enumerate() {
                let piece_ids = encodings[i].get_ids();
                ids[row * max_len..row * max_len + piece_ids.len()].copy_from_slice(piece_ids);
                mask[row * max_len..row * max_len + piece_ids.len()].fill(1);
            }
            let vectors = self.embed_padded(ids, mask, batch.len(), max_len)?;
            for (row, &i) in batch.iter().enumerate() {
                out[i] = vectors[row * self.dim..(row + 1) * self.dim].to_vec();
            }
            progress(batch.len());
        }
        Ok(out)
    }

    /// One forward pass over a padded batch; returns the pooled, normalised rows concatenated.
    fn embed_padded(
        &self,
        ids: Vec<u32>,
        mask: Vec<u32>,
        rows: usize,
        len: usize,
    ) -> Result<Vec<f32>> {
        if len == 0 {
            bail!("a text produced no word pieces");
        }
        let ids = Tensor::from_vec(ids, (rows, len), &self.device)?;
        let mask = Tensor::from_vec(mask, (rows, len), &self.device)?;
        let token_types = ids.zeros_like()?;
        let hidden = self.model.forward(&ids, &token_types, Some(&mask))?; // rows × len × dim
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // rows × len × 1
        let summed = hidden.broadcast_mul(&mask)?.sum(1)?; // rows × dim
        let counts = mask.sum(1)?; // rows × 1
        let mean = summed.broadcast_div(&counts)?;
        // sentence-transformers' Normalize: x / max(||x||, 1e-12).
        let norms = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f32::MAX)?;
        let unit = mean.broadcast_div(&norms)?;
        Ok(unit.flatten_all()?.to_vec1::<f32>()?)
    }
}
