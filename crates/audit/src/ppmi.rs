//! Word–label associations by positive pointwise mutual information (the PPMI of the AFLite
//! slides, after Gururangan et al., 2018): for a word w in the endings and a label c ∈ {gold,
//! distractor}, PPMI(w, c) = max(0, ln p(w, c) / (p(w) p(c))), with probabilities over word
//! tokens. Words rarer than a minimum count are skipped (PMI overrates rare words).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::dataset::Question;
use super::ngram::words;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Association {
    pub word: String,
    /// `gold` or `distractor`.
    pub label: &'static str,
    pub ppmi: f64,
    /// Occurrences of the word in endings with this label.
    pub count: u64,
}

/// The `top` strongest associations per label, strongest first (gold first, then distractor).
pub(crate) fn top_associations(
    questions: &[&Question],
    top: usize,
    min_count: u64,
) -> Vec<Association> {
    let labels = ["gold", "distractor"];
    let mut counts: HashMap<String, [u64; 2]> = HashMap::new();
    let mut totals = [0u64; 2];
    for q in questions {
        let Some(gold) = q.label else { continue };
        for (o, ending) in q.endings.iter().enumerate() {
            let c = usize::from(o != gold);
            for w in words(ending) {
                counts.entry(w).or_default()[c] += 1;
                totals[c] += 1;
            }
        }
    }
    let total = (totals[0] + totals[1]) as f64;
    let mut out = Vec::new();
    for (c, label) in labels.iter().enumerate() {
        if totals[c] == 0 {
            continue;
        }
        let p_c = totals[c] as f64 / total;
        // BTreeMap: a fixed order before sorting, so equal scores come out the same every run.
        let mut scored: BTreeMap<&str, (f64, u64)> = BTreeMap::new();
        for (w, n) in &counts {
            let word_total = n[0] + n[1];
            if word_total < min_count || n[c] == 0 {
                continue;
            }
            let pmi = ((n[c] as f64 / total) / (p_c * word_total as f64 / total)).ln();
            if pmi > 0.0 {
                scored.insert(w, (pmi, n[c]));
            }
        }
        let mut ranked: Vec<(&str, (f64, u64))> = scored.into_iter().collect();
        ranked.sort_by(|a, b| {
            b.1 .0
                .total_cmp(&a.1 .0)
                .then(b.1 .1.cmp(&a.1 .1))
                .then(a.0.cmp(b.0))
        });
        out.extend(
            ranked
                .into_iter()
                .take(top)
                .map(|(w, (ppmi, count))| Association {
                    word: w.to_string(),
                    label,
                    ppmi,
                    count,
                }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_only_in_gold_endings_tops_the_gold_list() {
        let q: Vec<Question> = (0..20)
            .map(|i| Question {
                id: i.to_string(),
                group: None,
                sent1: String::new(),
                sent2: String::new(),
                endings: [
                    "smiles happily .",
                    "runs away .",
                    "runs off .",
                    "falls down .",
                ]
                .map(String::from),
                label: Some(0),
                could_be_right: None,
            })
            .collect();
        let refs: Vec<&Question> = q.iter().collect();
        let a = top_associations(&refs, 3, 5);
        assert_eq!(a[0].label, "gold");
        assert!(a[0].word == "smiles" || a[0].word == "happily");
        // Only-gold words have PPMI = ln(1 / p(gold)) = ln(12 tokens / 3 gold tokens).
        assert!((a[0].ppmi - 4.0f64.ln()).abs() < 1e-9);
        assert!(a
            .iter()
            .any(|x| x.label == "distractor" && x.word == "runs"));
        assert!(
            !a.iter().any(|x| x.word == "."),
            "a word spread evenly has PMI 0"
        );
    }
}
