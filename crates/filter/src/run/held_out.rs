//! A model trained on some contexts and asked about the others: the training choices under the
//! current assignment, every head's scores of the held-out pools, and its held-out accuracy.
//! AF's iterations and the final pass both work this way.

use anyhow::Result;

use crate::algorithm::solved;
use crate::data::{Dataset, EncodedContext, EncodedEnding};
use crate::train::{Choice, Scores, Trained};
use afkit_store::af::{Assignment, FinalScore, HeadAccuracy};

/// The choices of the contexts `ids` under `assignment`, to train on.
pub(crate) fn training_choices<'a>(
    data: &'a Dataset,
    ids: &[usize],
    assignment: &Assignment,
) -> Vec<Choice<'a>> {
    ids.iter()
        .map(|&i| choice(&data.contexts[i], &assignment[&data.contexts[i].example_id]))
        .collect()
}

/// The options of a context under the current assignment: gold first, then the k negatives.
fn choice<'a>(context: &'a EncodedContext, assigned: &[i64]) -> Choice<'a> {
    let mut options = Vec::with_capacity(assigned.len() + 1);
    options.push(&context.gold);
    options.extend(assigned.iter().map(|id| {
        context
            .candidate(*id)
            .expect("assigned endings come from the context's pool")
    }));
    Choice {
        options,
        n_sent2: context.n_sent2,
    }
}

/// A held-out context's scores: position 0 is the gold, position i + 1 the context's i-th
/// candidate, per head (in [`named_heads`]' order).
pub(crate) struct HeldOut<'a> {
    pub context: &'a EncodedContext,
    pub heads: Vec<(&'static str, Vec<f32>)>,
}

impl HeldOut<'_> {
    /// The scores AF acts on (the last head: the ensemble, or the MLP in MLP-only iterations).
    pub(crate) fn decisive(&self) -> &[f32] {
        &self.heads.last().expect("at least the MLP head").1
    }

    fn head(&self, name: &str) -> Option<&[f32]> {
        self.heads
            .iter()
            .find(|(head, _)| *head == name)
            .map(|(_, scores)| scores.as_slice())
    }

    /// The final pass's record of position `i`: the decisive score, the sentence head's, and
    /// the word-level heads' on `style`'s scales.
    pub(crate) fn final_score(&self, i: usize, ending_id: i64, style: &StyleScales) -> FinalScore {
        FinalScore {
            ending_id,
            ensemble: self.decisive()[i],
            sentence: self.head("sentence").map(|s| s[i]),
            style: style.score(self, i),
        }
    }

    /// The position of the pool ending `ending_id` in every head's scores.
    pub(crate) fn position(&self, ending_id: i64) -> usize {
        1 + self
            .context
            .candidates
            .iter()
            .position(|e| e.ending_id == ending_id)
            .expect("assigned endings come from the context's pool")
    }
}

/// The heads that read an ending's words and characters, as the audit's n-gram classifiers do.
const WORD_LEVEL_HEADS: [&str; 4] = ["bow", "cnn", "lstm", "subword"];

/// Each word-level head's (mean, standard deviation) over the found endings of one fold's
/// held-out contexts: a head's logits have a scale of their own, and on these scales the heads
/// average into one style score per ending, where a found ending's is about 0.
pub(crate) struct StyleScales(Vec<(&'static str, f32, f32)>);

impl StyleScales {
    pub(crate) fn of_found(held_out: &[HeldOut]) -> StyleScales {
        let scale = |head: &'static str| {
            let found: Vec<f32> = held_out
                .iter()
                .filter_map(|h| Some(h.head(head)?[0]))
                .collect();
            if found.is_empty() {
                return None;
            }
            let (mean, sd) = mean_and_spread(&found);
            Some((head, mean, sd))
        };
        StyleScales(WORD_LEVEL_HEADS.into_iter().filter_map(scale).collect())
    }

    /// Position `i`'s standardised score averaged over the heads; `None` without such heads.
    fn score(&self, h: &HeldOut, i: usize) -> Option<f32> {
        let standardised = self
            .0
            .iter()
            .filter_map(|&(head, mean, sd)| Some(f64::from((h.head(head)?[i] - mean) / sd)));
        mean_of_read(standardised).map(|m| m as f32)
    }
}

/// The mean and standard deviation of `values`, the deviation 1 where they are all equal (so
/// that standardising on it only shifts them).
pub(crate) fn mean_and_spread(values: &[f32]) -> (f32, f32) {
    let n = values.len().max(1) as f32;
    let mean = values.iter().sum::<f32>() / n;
    let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / n).sqrt();
    (mean, if sd > 0.0 { sd } else { 1.0 })
}

/// The mean of the values read (heads that were trained), `None` when none was.
pub(crate) fn mean_of_read(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values
        .into_iter()
        .fold((0.0, 0usize), |(sum, n), v| (sum + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// Scores the gold and every pool ending of the given contexts in one batched pass.
pub(crate) fn score_held_out<'a>(
    model: &Trained,
    data: &'a Dataset,
    ids: &[usize],
) -> Result<Vec<HeldOut<'a>>> {
    let mut rows: Vec<(&EncodedEnding, usize)> = Vec::new();
    for &i in ids {
        let c = &data.contexts[i];
        rows.push((&c.gold, c.n_sent2));
        rows.extend(c.candidates.iter().map(|e| (e, c.n_sent2)));
    }
    let scores = model.score(&rows)?;
    let heads = named_heads(&scores);
    let mut out = Vec::with_capacity(ids.len());
    let mut offset = 0;
    for &i in ids {
        let c = &data.contexts[i];
        let n = c.candidates.len() + 1;
        out.push(HeldOut {
            context: c,
            heads: heads
                .iter()
                .map(|(name, s)| (*name, s[offset..offset + n].to_vec()))
                .collect(),
        });
        offset += n;
    }
    Ok(out)
}

/// The heads that exist, in the order mlp, bow, cnn, lstm, subword, sentence, ensemble (the
/// decisive head last).
fn named_heads(scores: &Scores) -> Vec<(&'static str, &[f32])> {
    let mut heads = vec![("mlp", scores.mlp.as_slice())];
    for (name, s) in [
        ("bow", &scores.bow),
        ("cnn", &scores.cnn),
        ("lstm", &scores.lstm),
        ("subword", &scores.subword),
        ("sentence", &scores.sentence),
        ("ensemble", &scores.ensemble),
    ] {
        if let Some(s) = s {
            heads.push((name, s.as_slice()));
        }
    }
    heads
}

/// Per head: the fraction of held-out contexts whose gold outscores all k assigned negatives.
pub(crate) fn accuracy(held_out: &[HeldOut], assignment: &Assignment) -> HeadAccuracy {
    let mut acc = HeadAccuracy::default();
    if held_out.is_empty() {
        return acc;
    }
    for head in 0..held_out[0].heads.len() {
        let correct = held_out
            .iter()
            .filter(|h| {
                let scores = &h.heads[head].1;
                let assigned: Vec<f32> = assignment[&h.context.example_id]
                    .iter()
                    .map(|id| scores[h.position(*id)])
                    .collect();
                solved(scores[0], &assigned)
            })
            .count();
        let value = Some(correct as f64 / held_out.len() as f64);
        match held_out[0].heads[head].0 {
            "mlp" => acc.mlp = value,
            "bow" => acc.bow = value,
            "cnn" => acc.cnn = value,
            "lstm" => acc.lstm = value,
            "subword" => acc.subword = value,
            "sentence" => acc.sentence = value,
            "minilm" => acc.minilm = value,
            "adversary" => acc.adversary = value,
            _ => acc.ensemble = value,
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::MLP_FEATURES;

    fn context() -> EncodedContext {
        let ending = |ending_id| EncodedEnding {
            ending_id,
            mlp: [0.0; MLP_FEATURES],
            scorer: Box::default(),
            words: Box::default(),
            lstm: Box::default(),
            subwords: Box::default(),
            sentence: Box::default(),
        };
        EncodedContext {
            example_id: 1,
            group: "v".into(),
            n_sent2: 0,
            gold: ending(1),
            candidates: vec![ending(2)],
        }
    }

    #[test]
    fn style_scores_put_the_found_endings_at_zero_and_each_head_on_their_spread() {
        let c = context();
        // Two held-out contexts, (found, candidate) each: the bag of words' logits spread ten
        // times wider than the CNN's; the MLP and ensemble are not word-level heads.
        let held = |bow: [f32; 2], cnn: [f32; 2]| HeldOut {
            context: &c,
            heads: vec![
                ("mlp", vec![50.0, -50.0]),
                ("bow", bow.to_vec()),
                ("cnn", cnn.to_vec()),
                ("ensemble", vec![9.0, 9.0]),
            ],
        };
        let held_out = [
            held([10.0, 30.0], [1.0, 0.0]),
            held([-10.0, 0.0], [-1.0, 2.0]),
        ];
        let style = StyleScales::of_found(&held_out);
        let scores: Vec<f32> = held_out
            .iter()
            .flat_map(|h| [0, 1].map(|i| style.score(h, i).unwrap()))
            .collect();
        // bow: mean 0, sd 10; cnn: mean 0, sd 1.
        assert_eq!(scores, vec![1.0, 1.5, -1.0, 1.0]);
        let found_mean = (scores[0] + scores[2]) / 2.0;
        assert_eq!(found_mean, 0.0);
    }

    #[test]
    fn a_run_without_word_level_heads_has_no_style_score() {
        let c = context();
        let held_out = [HeldOut {
            context: &c,
            heads: vec![("mlp", vec![1.0, 0.0])],
        }];
        let style = StyleScales::of_found(&held_out);
        assert_eq!(style.score(&held_out[0], 1), None);
        assert_eq!(held_out[0].final_score(1, 2, &style).style, None);
    }
}
