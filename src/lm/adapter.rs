//! A trained adapter: low-rank updates of some of a model's weight matrices, merged into them
//! when the model is loaded. The engine reads it; `lm adapt` ([`super::adapt`]) trains it.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};

/// Low-rank updates of some weight matrices, by GGUF tensor name (`blk.29.attn_q.weight`).
pub struct Adapter {
    pub scale: f32,
    /// (A: rank × in, B: out × rank) per adapted matrix.
    pub updates: BTreeMap<String, (Tensor, Tensor)>,
}

impl Adapter {
    /// The update of the matrix `name` (out × in), if this adapter changes it.
    pub fn delta(&self, name: &str) -> Result<Option<Tensor>> {
        let Some((a, b)) = self.updates.get(name) else {
            return Ok(None);
        };
        Ok(Some((b.matmul(a)? * f64::from(self.scale))?))
    }

    /// Writes the adapter as a safetensors file (`NAME.lora_a`, `NAME.lora_b`, `scale`).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut tensors: std::collections::HashMap<String, Tensor> = Default::default();
        for (name, (a, b)) in &self.updates {
            tensors.insert(format!("{name}.lora_a"), a.clone());
            tensors.insert(format!("{name}.lora_b"), b.clone());
        }
        tensors.insert("scale".into(), Tensor::new(&[self.scale], &Device::Cpu)?);
        candle_core::safetensors::save(&tensors, path)
            .with_context(|| format!("cannot write the adapter {}", path.display()))
    }

    pub fn load(path: &Path) -> Result<Self> {
        let mut tensors = candle_core::safetensors::load(path, &Device::Cpu)
            .with_context(|| format!("cannot read the adapter {}", path.display()))?;
        let scale = tensors
            .remove("scale")
            .with_context(|| format!("{} is not an afkit adapter (no `scale`)", path.display()))?
            .to_vec1::<f32>()?[0];
        let mut updates = BTreeMap::new();
        let names: Vec<String> = tensors
            .keys()
            .filter_map(|k| k.strip_suffix(".lora_a").map(str::to_string))
            .collect();
        for name in names {
            let a = tensors.remove(&format!("{name}.lora_a")).expect("listed");
            let b = tensors
                .remove(&format!("{name}.lora_b"))
                .with_context(|| format!("{}: `{name}` has no B matrix", path.display()))?;
            updates.insert(name, (a, b));
        }
        Ok(Adapter { scale, updates })
    }
}
