//! The sentence model all-MiniLM-L6-v2 (a BERT of 6 layers, 384 wide, 12 heads) as
//! sentence-transformers runs it: the last layer's token vectors mean-pooled per sentence.
//!
//! The BERT runs on afkit's packed kernels over ragged batches (`bert::Packed`). What it
//! computes is Hugging Face's `BertModel` with an all-ones attention mask followed by
//! sentence-transformers' mean pooling, except that afkit multiplies in bf16: the vectors stay
//! within a cosine of 0.9999 of sentence-transformers' f32 ones (BENCHMARKS.md, "AFLite").

use anyhow::Result;
use candle_nn::VarBuilder;
use candle_transformers::models::bert::Config;

use super::bert::packed::{Packed, Spans};
use super::bert::Bert;
use crate::lm::linear::Precision;

pub(crate) struct MiniLm {
    bert: Bert<Packed>,
    width: usize,
}

impl MiniLm {
    /// The encoder's weights from `vb` (the model's safetensors), described by `config`, with
    /// linear layers that multiply in `precision` (afkit embeds in bf16; f32 is the reference
    /// the tests hold it to).
    pub(crate) fn load(vb: VarBuilder, config: &Config, precision: Precision) -> Result<Self> {
        Ok(Self {
            bert: Bert::pack(&Bert::load(vb, config)?, precision)?,
            width: config.hidden_size,
        })
    }

    /// The mean of the last layer's token vectors for each sentence (sentences × width), where a
    /// sentence is its word-piece ids, [CLS] and [SEP] included.
    pub(crate) fn mean_pooled(&self, sentences: &[&[u32]]) -> Result<Vec<f32>> {
        let width = self.width;
        if sentences.is_empty() {
            return Ok(Vec::new());
        }
        let spans = Spans::new(sentences);
        let x = self.bert.embeddings.forward(sentences, None, &spans)?;
        let x = self
            .bert
            .encode(&Packed, 0..self.bert.layers.len(), x, &spans)?;
        let mut pooled = vec![0f32; sentences.len() * width];
        for (out, span) in pooled.chunks_exact_mut(width).zip(&spans.ranges) {
            for token in x[span.start * width..span.end * width].chunks_exact(width) {
                for (o, v) in out.iter_mut().zip(token) {
                    *o += v;
                }
            }
            let n = span.len() as f32;
            out.iter_mut().for_each(|o| *o /= n);
        }
        Ok(pooled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};
    use candle_transformers::models::bert::BertModel;
    use std::collections::HashMap;

    /// Heads of 8 (all columns in the attention's one-by-one tail) by default.
    fn tiny_config() -> Config {
        config_with(32, 4)
    }

    fn config_with(width: usize, heads: usize) -> Config {
        serde_json::from_value(serde_json::json!({
            "vocab_size": 50, "hidden_size": width, "num_hidden_layers": 2,
            "num_attention_heads": heads, "intermediate_size": 2 * width, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0, "max_position_embeddings": 16, "type_vocab_size": 2,
            "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
            "model_type": "bert"
        }))
        .unwrap()
    }

    /// A BERT with random weights, every tensor `BertModel` and `MiniLm` read.
    fn random_weights(config: &Config) -> HashMap<String, Tensor> {
        let (w, inner) = (config.hidden_size, config.intermediate_size);
        let mut shapes: Vec<(String, Vec<usize>)> = vec![
            (
                "embeddings.word_embeddings.weight".into(),
                vec![config.vocab_size, w],
            ),
            (
                "embeddings.position_embeddings.weight".into(),
                vec![config.max_position_embeddings, w],
            ),
            (
                "embeddings.token_type_embeddings.weight".into(),
                vec![config.type_vocab_size, w],
            ),
            ("embeddings.LayerNorm.weight".into(), vec![w]),
            ("embeddings.LayerNorm.bias".into(), vec![w]),
        ];
        for l in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            for name in ["query", "key", "value"] {
                shapes.push((format!("{p}.attention.self.{name}.weight"), vec![w, w]));
                shapes.push((format!("{p}.attention.self.{name}.bias"), vec![w]));
            }
            shapes.push((format!("{p}.attention.output.dense.weight"), vec![w, w]));
            shapes.push((format!("{p}.attention.output.dense.bias"), vec![w]));
            shapes.push((format!("{p}.intermediate.dense.weight"), vec![inner, w]));
            shapes.push((format!("{p}.intermediate.dense.bias"), vec![inner]));
            shapes.push((format!("{p}.output.dense.weight"), vec![w, inner]));
            shapes.push((format!("{p}.output.dense.bias"), vec![w]));
            for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
                shapes.push((format!("{p}.{norm}.weight"), vec![w]));
                shapes.push((format!("{p}.{norm}.bias"), vec![w]));
            }
        }
        shapes
            .into_iter()
            .map(|(name, shape)| {
                let t = Tensor::randn(0f32, 0.5, shape, &Device::Cpu).unwrap();
                (name, t)
            })
            .collect()
    }

    /// Sentences of different lengths in one ragged batch, the longest over two blocks of keys,
    /// give in f32 what candle's `BertModel` gives each of them alone, mean-pooled; in bf16 they
    /// stay within a cosine of 0.9999 of that. Heads of 8 (the attention's one-by-one tail), 32
    /// (two blocks of 16 columns) and 40 (both).
    #[test]
    fn matches_candle_bert_sentence_by_sentence() {
        let sentences: Vec<Vec<u32>> = vec![
            vec![1, 7, 9, 2],
            vec![1, 3, 2],
            (1..34).chain([2]).collect(),
            vec![1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 2],
            vec![1, 2],
        ];
        let refs: Vec<&[u32]> = sentences.iter().map(|s| s.as_slice()).collect();
        for (width, heads) in [(32, 4), (64, 2), (80, 2)] {
            let mut config = config_with(width, heads);
            config.max_position_embeddings = 40;
            let vb = VarBuilder::from_tensors(random_weights(&config), DType::F32, &Device::Cpu);
            let theirs = BertModel::load(vb.clone(), &config).unwrap();
            let f32_pooled = MiniLm::load(vb.clone(), &config, Precision::F32)
                .unwrap()
                .mean_pooled(&refs)
                .unwrap();
            let bf16_pooled = MiniLm::load(vb, &config, Precision::Bf16)
                .unwrap()
                .mean_pooled(&refs)
                .unwrap();
            for (i, ids) in sentences.iter().enumerate() {
                let t = Tensor::new(ids.as_slice(), &Device::Cpu)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let hidden = theirs.forward(&t, &t.zeros_like().unwrap(), None).unwrap();
                let want: Vec<f32> = hidden
                    .mean(1)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let row = |pooled: &[f32]| pooled[i * width..(i + 1) * width].to_vec();
                for (g, w) in row(&f32_pooled).iter().zip(&want) {
                    assert!(
                        (g - w).abs() < 1e-4,
                        "width {width}, sentence {i}: {g} vs {w}"
                    );
                }
                let cosine = cosine(&row(&bf16_pooled), &want);
                assert!(
                    cosine > 0.9999,
                    "width {width}, sentence {i}: cosine {cosine}"
                );
            }
        }
    }

    fn cosine(a: &[f32], b: &[f32]) -> f64 {
        let dot =
            |a: &[f32], b: &[f32]| -> f64 { a.iter().zip(b).map(|(x, y)| (x * y) as f64).sum() };
        dot(a, b) / (dot(a, a) * dot(b, b)).sqrt()
    }

    #[test]
    fn refuses_ids_outside_the_vocabulary_and_overlong_sentences() {
        let config = tiny_config();
        let vb = VarBuilder::from_tensors(random_weights(&config), DType::F32, &Device::Cpu);
        let model = MiniLm::load(vb, &config, Precision::Bf16).unwrap();
        let err = model.mean_pooled(&[&[1, 50, 2]]).unwrap_err();
        assert!(err.to_string().contains("outside the vocabulary"), "{err}");
        let long = vec![1u32; 17];
        let err = model.mean_pooled(&[&long]).unwrap_err();
        assert!(err.to_string().contains("16 positions"), "{err}");
    }
}
