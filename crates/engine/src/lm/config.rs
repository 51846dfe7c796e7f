//! The shape of a llama-style decoder as its GGUF file describes it, and the longest sequence
//! afkit runs through one.

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value};

use super::family::{Arch, Family, LocalLayers};

/// Longest sequence (context + ending) the rotary tables cover.
pub(crate) const MAX_POSITIONS: usize = 4096;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LlamaConfig {
    pub vocab: usize,
    pub d_model: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub d_ff: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    /// The family and what sets its forward pass apart from llama's.
    pub arch: Arch,
}

impl LlamaConfig {
    pub(crate) fn head_dim(&self) -> usize {
        self.arch.head_dim.unwrap_or(self.d_model / self.n_head)
    }

    /// Multiply-adds ×2 of one token's forward pass through the weight matrices (attention
    /// scores excluded): the yardstick for GFLOP/s figures.
    pub(crate) fn flops_per_token(&self) -> f64 {
        let hd = self.head_dim();
        let qkv = self.d_model * (self.n_head + 2 * self.n_kv_head) * hd;
        let per_layer = qkv + self.n_head * hd * self.d_model + 3 * self.d_model * self.d_ff;
        2.0 * (self.n_layer * per_layer + self.d_model * self.vocab) as f64
    }

    pub(super) fn from_gguf(content: &Content) -> Result<Self> {
        let meta = Metadata::of(content);
        let family = Family::from_architecture(meta.arch)?;
        refuse_unsupported_rope(&meta, content)?;
        let d_model = meta.usize("embedding_length")?;
        let n_head = meta.usize("attention.head_count")?;
        let head_dim = meta.usize("attention.key_length").ok();
        if let (Some(k), Ok(v)) = (head_dim, meta.usize("attention.value_length")) {
            if k != v {
                bail!("keys of {k} and values of {v} dims per head are not supported");
            }
        }
        let local_layers = match family {
            Family::Gemma3 => Some(LocalLayers {
                window: meta.usize("attention.sliding_window")?,
                period: meta.usize("attention.sliding_window_type").unwrap_or(6),
                rope_theta: meta.f32("rope.local_freq_base").unwrap_or(10_000.0),
            }),
            _ => None,
        };
        let cfg = LlamaConfig {
            vocab: content
                .tensor_infos
                .get("token_embd.weight")
                .context("the GGUF has no token_embd.weight tensor")?
                .shape
                .dims()[0],
            d_model,
            n_layer: meta.usize("block_count")?,
            n_head,
            n_kv_head: meta.usize("attention.head_count_kv").unwrap_or(n_head),
            d_ff: meta.usize("feed_forward_length")?,
            rope_theta: meta
                .f32("rope.freq_base")
                .unwrap_or(family.default_rope_theta()),
            rms_eps: meta.f32("attention.layer_norm_rms_epsilon")?,
            arch: Arch {
                family,
                head_dim: head_dim.filter(|&hd| hd != d_model / n_head),
                local_layers,
            },
        };
        cfg.check_heads(&meta)?;
        Ok(cfg)
    }

    /// Refuses shapes the forward pass does not implement: partial rotary embeddings, query
    /// heads that do not divide among the key/value heads.
    fn check_heads(&self, meta: &Metadata) -> Result<()> {
        if let Ok(rope_dim) = meta.usize("rope.dimension_count") {
            if rope_dim != self.head_dim() {
                bail!(
                    "partial rotary embeddings ({rope_dim} of {} dims) are not supported",
                    self.head_dim()
                );
            }
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            bail!(
                "{} query heads cannot share {} key/value heads",
                self.n_head,
                self.n_kv_head
            );
        }
        Ok(())
    }
}

/// A GGUF's metadata under its architecture's prefix (`llama.block_count`, …).
struct Metadata<'c> {
    content: &'c Content,
    arch: &'c str,
}

impl<'c> Metadata<'c> {
    fn of(content: &'c Content) -> Self {
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .map(String::as_str)
            .unwrap_or("llama");
        Metadata { content, arch }
    }

    fn get(&self, key: &str) -> Result<&'c Value> {
        let key = format!("{}.{key}", self.arch);
        self.content
            .metadata
            .get(&key)
            .with_context(|| format!("the GGUF metadata has no `{key}`"))
    }

    fn usize(&self, key: &str) -> Result<usize> {
        Ok(self.get(key)?.to_u32()? as usize)
    }

    fn f32(&self, key: &str) -> Result<f32> {
        Ok(self.get(key)?.to_f32()?)
    }
}

/// Refuses rotary-embedding scalings afkit's forward pass does not apply.
fn refuse_unsupported_rope(meta: &Metadata, content: &Content) -> Result<()> {
    if let Ok(kind) = meta.get("rope.scaling.type") {
        let kind = kind.to_string()?;
        if kind != "none" {
            bail!("rope scaling `{kind}` is not supported");
        }
    }
    if content.tensor_infos.contains_key("rope_freqs.weight") {
        bail!("rope frequency factors (rope_freqs.weight, Llama 3.1 style) are not supported");
    }
    Ok(())
}
