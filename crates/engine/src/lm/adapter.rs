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
    pub(crate) fn delta(&self, name: &str) -> Result<Option<Tensor>> {
        let Some((a, b)) = self.updates.get(name) else {
            return Ok(None);
        };
        Ok(Some((b.matmul(a)? * f64::from(self.scale))?))
    }

    /// Writes the adapter as a safetensors file (`NAME.lora_a`, `NAME.lora_b`, `scale`).
    pub(crate) fn save(&self, path: &Path) -> Result<()> {
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

/// What the engines that load LoRA adapters need to know of the base model: its GGUF
/// architecture, its attention heads (llama.cpp's converter reorders the query and key rows of
/// every head, which Hugging Face's layout must undo) and its name for PEFT's config.
#[derive(Debug, Clone)]
pub(crate) struct BaseModel {
    pub architecture: String,
    pub n_head: usize,
    pub n_kv_head: usize,
    /// `base_model_name_or_path` in PEFT's config (a Hub id or a local folder).
    pub name: String,
}

/// A GGUF matrix of a transformer block as PEFT names it: (layer, module path).
fn hf_module(gguf_name: &str) -> Result<(usize, &'static str)> {
    let parts: Vec<&str> = gguf_name.split('.').collect();
    let (Some(&"blk"), Some(layer), Some(matrix), Some(&"weight")) =
        (parts.first(), parts.get(1), parts.get(2), parts.get(3))
    else {
        anyhow::bail!("{gguf_name} is not a block matrix (blk.N.NAME.weight)");
    };
    let module = match *matrix {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        other => anyhow::bail!("no Hugging Face name for the matrix {other} of {gguf_name}"),
    };
    Ok((layer.parse()?, module))
}

/// The rows of `b` (out × rank) in Hugging Face's order, where `heads` heads of the GGUF's
/// query or key matrix hold each head's rotary pairs interleaved (row 2j + t of a head is row
/// t·d/2 + j in Hugging Face's layout, d the head size).
fn hf_rows(b: &Tensor, heads: usize) -> Result<Tensor> {
    let (out, rank) = b.dims2()?;
    let d = out / heads;
    let gguf = b.to_vec2::<f32>()?;
    let mut hf = vec![Vec::new(); out];
    for h in 0..heads {
        for j in 0..d / 2 {
            for t in 0..2 {
                hf[h * d + t * (d / 2) + j] = gguf[h * d + 2 * j + t].clone();
            }
        }
    }
    Ok(Tensor::from_vec(hf.concat(), (out, rank), &Device::Cpu)?)
}

impl Adapter {
    /// Writes the adapter as a PEFT LoRA adapter in `dir` (`adapter_config.json` and
    /// `adapter_model.safetensors`, Hugging Face's module names and row order): what
    /// transformers' `PeftModel` and vLLM's `--lora-modules` load.
    pub(crate) fn save_peft(&self, dir: &Path, base: &BaseModel) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut tensors: std::collections::HashMap<String, Tensor> = Default::default();
        let mut modules = std::collections::BTreeSet::new();
        let mut layers = std::collections::BTreeSet::new();
        let mut rank = 0;
        for (name, (a, b)) in &self.updates {
            let (layer, module) = hf_module(name)?;
            let b = match module {
                "self_attn.q_proj" => hf_rows(b, base.n_head)?,
                "self_attn.k_proj" => hf_rows(b, base.n_kv_head)?,
                _ => b.clone(),
            };
            rank = a.dims2()?.0;
            let key = format!("base_model.model.model.layers.{layer}.{module}");
            tensors.insert(format!("{key}.lora_A.weight"), a.clone());
            tensors.insert(format!("{key}.lora_B.weight"), b);
            modules.insert(module.rsplit('.').next().unwrap_or(module));
            layers.insert(layer);
        }
        let config = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base.name,
            "r": rank,
            "lora_alpha": self.scale * rank as f32,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
            "target_modules": modules,
            "layers_to_transform": layers,
            "layers_pattern": "layers",
        });
        std::fs::write(
            dir.join("adapter_config.json"),
            serde_json::to_string_pretty(&config)?,
        )?;
        candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors"))
            .with_context(|| format!("cannot write the PEFT adapter in {}", dir.display()))
    }

    /// Writes the adapter as a GGUF LoRA adapter (llama.cpp's `--lora`): every update's A and B
    /// under the base matrix's name with `.lora_a` / `.lora_b`, in f32, and its alpha.
    pub(crate) fn save_gguf(&self, path: &Path, base: &BaseModel) -> Result<()> {
        use candle_core::quantized::gguf_file::{self, Value};
        use candle_core::quantized::{GgmlDType, QTensor};
        let rank = self
            .updates
            .values()
            .next()
            .map_or(Ok(0), |(a, _)| a.dims2().map(|d| d.0))?;
        let metadata = [
            (
                "general.architecture",
                Value::String(base.architecture.clone()),
            ),
            ("general.type", Value::String("adapter".into())),
            ("adapter.type", Value::String("lora".into())),
            ("adapter.lora.alpha", Value::F32(self.scale * rank as f32)),
        ];
        let mut tensors = Vec::new();
        for (name, (a, b)) in &self.updates {
            tensors.push((
                format!("{name}.lora_a"),
                QTensor::quantize(a, GgmlDType::F32)?,
            ));
            tensors.push((
                format!("{name}.lora_b"),
                QTensor::quantize(b, GgmlDType::F32)?,
            ));
        }
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        );
        let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        gguf_file::write(&mut out, &meta, &refs)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's converter, Hugging Face rows → GGUF rows (`permute` in
    /// convert_hf_to_gguf.py): each head's rows as (2, d/2) swapped to (d/2, 2).
    fn converter_permute(hf: &[Vec<f32>], heads: usize) -> Vec<Vec<f32>> {
        let d = hf.len() / heads;
        let mut gguf = vec![Vec::new(); hf.len()];
        for h in 0..heads {
            for t in 0..2 {
                for j in 0..d / 2 {
                    gguf[h * d + j * 2 + t] = hf[h * d + t * (d / 2) + j].clone();
                }
            }
        }
        gguf
    }

    #[test]
    fn query_and_key_rows_go_back_to_hugging_faces_order() {
        let (heads, d, rank) = (3, 8, 2);
        let hf: Vec<Vec<f32>> = (0..heads * d)
            .map(|r| (0..rank).map(|c| (r * 10 + c) as f32).collect())
            .collect();
        let gguf = converter_permute(&hf, heads);
        assert_ne!(gguf, hf);
        let b = Tensor::from_vec(gguf.concat(), (heads * d, rank), &Device::Cpu).unwrap();
        assert_eq!(hf_rows(&b, heads).unwrap().to_vec2::<f32>().unwrap(), hf);
    }

    #[test]
    fn block_matrices_get_pefts_module_names() {
        assert_eq!(
            hf_module("blk.29.attn_q.weight").unwrap(),
            (29, "self_attn.q_proj")
        );
        assert_eq!(
            hf_module("blk.3.ffn_down.weight").unwrap(),
            (3, "mlp.down_proj")
        );
        assert!(hf_module("output.weight").is_err());
        assert!(hf_module("blk.1.attn_norm.weight").is_err());
    }
}
