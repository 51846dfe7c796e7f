//! The model families the engine runs and what sets each one's forward pass apart from llama's.
//!
//! One forward pass serves them all ([`super::llama`]); a family only switches parts of it on:
//!
//! | family | rotary pairs | extras |
//! |--------|--------------|--------|
//! | llama  | adjacent (llama.cpp permutes Q and K) | — |
//! | qwen2  | halves | biases on Q, K and V |
//! | qwen3  | halves | RMS norms of each query and key head |
//! | gemma3 | halves | embeddings scaled by √d, Q/K head norms, norms after attention and after the feed-forward, GELU (tanh) gate, local layers with a sliding window and their own rotary base |
//!
//! llama.cpp's converter stores Gemma's norm weights as `1 + w`, so every family's norm is the
//! plain `x / rms(x) · w` here.

use anyhow::{bail, Result};

/// A model family, as `general.architecture` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Family {
    #[default]
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
}

impl Family {
    pub(crate) fn from_architecture(arch: &str) -> Result<Self> {
        Ok(match arch {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma3" => Family::Gemma3,
            _ => bail!(
                "architecture `{arch}` is not supported: afkit runs llama, qwen2, qwen3 and gemma3 \
                 GGUF models (general.architecture)"
            ),
        })
    }

    /// The `general.architecture` value, also the prefix of the family's metadata keys.
    pub(crate) fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Gemma3 => "gemma3",
        }
    }

    /// Rotary base when the file names none.
    pub(crate) fn default_rope_theta(self) -> f32 {
        match self {
            Family::Gemma3 => 1_000_000.0,
            _ => 10_000.0,
        }
    }
}

/// Where the two members of a rotary pair sit in a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeLayout {
    /// Dimensions 2i and 2i+1 (llama files, whose Q and K rows the converter permuted).
    Adjacent,
    /// Dimensions i and i + head_dim/2 (GPT-NeoX's layout).
    Halves,
}

/// The nonlinearity of the gated feed-forward: `act(gate) ⊙ up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
}

/// Gemma 3's local layers: each attends only to the last `window` positions (its own included)
/// and rotates with its own base. Every `period`-th layer (1-based) is global; the others are
/// local.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LocalLayers {
    pub window: usize,
    pub period: usize,
    pub rope_theta: f32,
}

/// A model's family and the facts of its shape that llama's keys do not give.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Arch {
    pub family: Family,
    /// Width of one attention head when it is not `d_model / n_head` (`*.attention.key_length`).
    pub head_dim: Option<usize>,
    pub local_layers: Option<LocalLayers>,
}

impl Arch {
    pub(crate) fn rope_layout(&self) -> RopeLayout {
        match self.family {
            Family::Llama => RopeLayout::Adjacent,
            _ => RopeLayout::Halves,
        }
    }

    pub(crate) fn qkv_bias(&self) -> bool {
        self.family == Family::Qwen2
    }

    /// RMS norms over each query and key head before the rotation.
    pub(crate) fn qk_norm(&self) -> bool {
        matches!(self.family, Family::Qwen3 | Family::Gemma3)
    }

    /// RMS norms of the attention output and of the feed-forward output before each is added
    /// to the residual stream.
    pub(crate) fn post_norms(&self) -> bool {
        self.family == Family::Gemma3
    }

    /// The factor the token embeddings are multiplied by.
    pub(crate) fn embed_scale(&self, d_model: usize) -> f32 {
        match self.family {
            Family::Gemma3 => (d_model as f32).sqrt(),
            _ => 1.0,
        }
    }

    pub(crate) fn activation(&self) -> Activation {
        match self.family {
            Family::Gemma3 => Activation::GeluTanh,
            _ => Activation::Silu,
        }
    }

    /// The sliding window of layer `layer` (0-based), if it is a local layer.
    pub(crate) fn window(&self, layer: usize) -> Option<usize> {
        self.local_layers
            .as_ref()
            .filter(|l| !(layer + 1).is_multiple_of(l.period))
            .map(|l| l.window)
    }
}
