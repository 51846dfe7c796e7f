//! What the "could be right" judgement (`crate::risk`) reads about an ending: every stored
//! likelihood of it after its context and its sentence vector. Nothing here is written: the
//! judgement is computed from what `generate` and `filter` already stored.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use rusqlite::{params, OptionalExtension};

use super::Store;

/// One ending's evidence.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Evidence {
    /// Per scorer model (its GGUF's SHA-256): the mean log-likelihood per token of the ending
    /// after its context (`scorer_scores`: `ll_cond / n_tok`).
    pub scorers: BTreeMap<String, f64>,
    /// The generator's mean log-probability per token of the ending after its context
    /// (`endings.lp_cond`); absent for imported pools without features.
    pub generator: Option<f64>,
    /// The ending's sentence vector with the encoder that made it (`sentence_vectors`).
    pub vector: Option<(String, Vec<f32>)>,
}

impl Store {
    /// The evidence of each of `ending_ids` (an ending the project does not hold gets none).
    pub(crate) fn risk_evidence(&self, ending_ids: &[i64]) -> Result<HashMap<i64, Evidence>> {
        let mut scorer = self.conn.prepare_cached(
            "SELECT model, ll_cond, n_tok FROM scorer_scores WHERE ending_id = ?1 AND n_tok > 0",
        )?;
        let mut generator = self
            .conn
            .prepare_cached("SELECT lp_cond FROM endings WHERE id = ?1")?;
        let mut vector = self
            .conn
            .prepare_cached("SELECT model, vector FROM sentence_vectors WHERE ending_id = ?1")?;
        let mut out = HashMap::with_capacity(ending_ids.len());
        for &id in ending_ids {
            let scorers = scorer
                .query_map([id], |r| {
                    let ll: f64 = r.get(1)?;
                    let n: i64 = r.get(2)?;
                    Ok((r.get::<_, String>(0)?, ll / n as f64))
                })?
                .collect::<rusqlite::Result<_>>()?;
            let generator: Option<f64> = generator
                .query_row([id], |r| r.get(0))
                .optional()?
                .flatten();
            let vector = vector
                .query_row(params![id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
                })
                .optional()?
                .map(|(model, bytes)| {
                    let v = bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    (model, v)
                });
            out.insert(
                id,
                Evidence {
                    scorers,
                    generator,
                    vector,
                },
            );
        }
        Ok(out)
    }
}
