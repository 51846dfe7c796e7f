//! The exported rows: each assembled example as a 4-way question with shuffled ending
//! positions, and their encodings: the SWAG release's CSVs (regular and full, in the release's
//! column order, so readers that go by position read the right fields) and JSONL with both
//! afkit's and HellaSwag's field names.

use anyhow::Result;
use rand::seq::SliceRandom;
use serde::Serialize;

use afkit_engine::seed::{Key, Seed};
use afkit_store::assemble::AssembledExample;
use afkit_store::dataset::{
    startphrase, Split, COULD_BE_RIGHT_COLUMN, FULL_COLUMNS, REGULAR_COLUMNS,
};

/// The label written where the answers are withheld (the test split of a published export): the
/// convention of Hugging Face datasets for unlabelled splits, so every split has the same schema.
pub(crate) const HIDDEN_LABEL: i64 = -1;

/// A question as exported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub id: String,
    pub group: String,
    pub fold: Option<i64>,
    pub sent1: String,
    pub sent2: String,
    pub split: Split,
    pub gold: String,
    pub gold_source: String,
    pub gold_type: Option<String>,
    pub verified: bool,
    /// Distractors with their types, in the order assembly chose them (three or four); the
    /// regular files take the first three.
    pub distractors: Vec<(String, Option<String>)>,
    /// The four options in shuffled order and the gold's position among them.
    pub endings: [String; 4],
    pub label: usize,
    /// An unverified question with a distractor that could be right too (see `afkit_store::risk`);
    /// never set on verified ones. [`build`] leaves it false: the export sets it.
    pub could_be_right: bool,
}

/// Builds the rows of `examples`, shuffling each example's four options with its own seeded
/// generator (derived from `seed` and the example), so every position is equally likely to hold
/// the gold and each example's order is independent of the others.
pub(crate) fn build(examples: &[AssembledExample], seed: Seed) -> Vec<Row> {
    examples
        .iter()
        .map(|ex| {
            let generated = ex.gold_ending_id != ex.found_ending_id;
            let mut options: Vec<(bool, String)> = std::iter::once((true, ex.gold.clone()))
                .chain(ex.distractors.iter().take(3).map(|d| (false, d.1.clone())))
                .collect();
            let mut rng = seed
                .key(Key::Options {
                    example: ex.example_id,
                    generated,
                })
                .rng();
            options.shuffle(&mut rng);
            let label = options
                .iter()
                .position(|o| o.0)
                .expect("gold is among the options");
            let endings: [String; 4] = std::array::from_fn(|i| options[i].1.clone());
            Row {
                id: if generated {
                    format!("{}:gen", ex.ext_id)
                } else {
                    ex.ext_id.clone()
                },
                group: ex.group.clone(),
                fold: ex.fold,
                sent1: ex.sent1.clone(),
                sent2: ex.sent2.clone(),
                split: ex.split,
                gold: ex.gold.clone(),
                gold_source: ex.gold_source.clone(),
                gold_type: ex.gold_type.clone(),
                verified: ex.verified,
                distractors: ex
                    .distractors
                    .iter()
                    .map(|d| (d.1.clone(), d.2.clone()))
                    .collect(),
                endings,
                label,
                could_be_right: false,
            }
        })
        .collect()
}

/// Replaces every example's distractors by endings drawn at random from its context's pre-AF
/// pool (`pool`: example id → candidate ending ids with their texts, read one context at a time),
/// excluding the gold and the found ending. Examples whose pool has fewer than three such endings
/// are left out; their ids are returned.
pub(crate) fn randomise(
    examples: &mut Vec<AssembledExample>,
    mut pool: impl FnMut(i64) -> anyhow::Result<Vec<(i64, String)>>,
    seed: Seed,
) -> anyhow::Result<Vec<String>> {
    let mut left_out = Vec::new();
    let mut kept = Vec::with_capacity(examples.len());
    for mut ex in examples.drain(..) {
        let generated = ex.gold_ending_id != ex.found_ending_id;
        let mut candidates: Vec<(i64, String)> = pool(ex.example_id)?
            .into_iter()
            .filter(|(id, _)| *id != ex.gold_ending_id && *id != ex.found_ending_id)
            .collect();
        if candidates.len() < 3 {
            left_out.push(ex.ext_id.clone());
            continue;
        }
        let mut rng = seed
            .key(Key::RandomNegatives {
                example: ex.example_id,
                generated,
            })
            .rng();
        candidates.shuffle(&mut rng);
        ex.distractors = candidates
            .into_iter()
            .take(4)
            .map(|(id, text)| (id, text, None))
            .collect();
        kept.push(ex);
    }
    *examples = kept;
    Ok(left_out)
}

fn fold_text(fold: Option<i64>) -> String {
    fold.map(|f| f.to_string()).unwrap_or_default()
}

fn writer(out: &mut Vec<u8>) -> csv::Writer<&mut Vec<u8>> {
    csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(out)
}

/// The label as exported: the gold's position, or [`HIDDEN_LABEL`] when the answers are withheld.
fn exported_label(row: &Row, with_labels: bool) -> i64 {
    if with_labels {
        row.label as i64
    } else {
        HIDDEN_LABEL
    }
}

/// SWAG regular CSV: the unnamed index column (0-based row number), then [`REGULAR_COLUMNS`],
/// then afkit's [`COULD_BE_RIGHT_COLUMN`].
pub(crate) fn regular_csv(rows: &[&Row], with_labels: bool) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    {
        let mut w = writer(&mut out);
        w.write_record(
            std::iter::once("")
                .chain(REGULAR_COLUMNS)
                .chain([COULD_BE_RIGHT_COLUMN]),
        )?;
        for (index, r) in rows.iter().enumerate() {
            let mut record = vec![
                index.to_string(),
                r.group.clone(),
                fold_text(r.fold),
                startphrase(&r.sent1, &r.sent2),
                r.sent1.clone(),
                r.sent2.clone(),
                r.gold_source.clone(),
            ];
            record.extend(r.endings.iter().cloned());
            record.push(exported_label(r, with_labels).to_string());
            record.push(u8::from(r.could_be_right).to_string());
            w.write_record(&record)?;
        }
        w.flush()?;
    }
    Ok(out)
}

/// SWAG full CSV: gold and distractors in their own columns (in assembly's order), with types (empty
/// when unknown: unverified or random distractors, or a missing fourth distractor).
pub(crate) fn full_csv(rows: &[&Row]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    {
        let mut w = writer(&mut out);
        w.write_record(FULL_COLUMNS)?;
        for r in rows {
            let distractor = |i: usize| {
                r.distractors
                    .get(i)
                    .map(|d| d.0.clone())
                    .unwrap_or_default()
            };
            let kind = |i: usize| {
                r.distractors
                    .get(i)
                    .and_then(|d| d.1.clone())
                    .unwrap_or_default()
            };
            let mut record = vec![
                r.group.clone(),
                fold_text(r.fold),
                startphrase(&r.sent1, &r.sent2),
                r.gold.clone(),
            ];
            record.extend((0..4).map(distractor));
            record.push(r.gold_source.clone());
            record.push(r.gold_type.clone().unwrap_or_default());
            record.extend((0..4).map(kind));
            record.push(r.sent1.clone());
            record.push(r.sent2.clone());
            w.write_record(&record)?;
        }
        w.flush()?;
    }
    Ok(out)
}

/// A JSONL line: afkit's fields, then HellaSwag's (`ctx_a`, `ctx_b`, `ctx`, `activity_label`;
/// `endings` and `label` are shared), so HellaSwag-style evaluation code reads it unchanged.
#[derive(Serialize)]
struct JsonRow<'a> {
    id: &'a str,
    group: &'a str,
    sent1: &'a str,
    sent2: &'a str,
    startphrase: &'a str,
    endings: &'a [String; 4],
    label: i64,
    gold_source: &'a str,
    verified: bool,
    could_be_right: bool,
    activity_label: &'a str,
    ctx_a: &'a str,
    ctx_b: &'a str,
    ctx: &'a str,
}

/// One JSON object per line. `activity_label` is the group: afkit keeps no label for a group.
pub(crate) fn jsonl(rows: &[&Row], with_labels: bool) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for r in rows {
        let context = startphrase(&r.sent1, &r.sent2);
        serde_json::to_writer(
            &mut out,
            &JsonRow {
                id: &r.id,
                group: &r.group,
                sent1: &r.sent1,
                sent2: &r.sent2,
                startphrase: &context,
                endings: &r.endings,
                label: exported_label(r, with_labels),
                gold_source: &r.gold_source,
                verified: r.verified,
                could_be_right: r.could_be_right,
                activity_label: &r.group,
                ctx_a: &r.sent1,
                ctx_b: &r.sent2,
                ctx: &context,
            },
        )?;
        out.push(b'\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn example(i: i64) -> AssembledExample {
        AssembledExample {
            id: i,
            example_id: i,
            ext_id: format!("v{i}#0"),
            group: format!("v{i}"),
            sent1: "A man walks in.".into(),
            sent2: "He".into(),
            split: Split::Train,
            gold_ending_id: 1000 + i,
            gold: format!("gold {i}."),
            gold_source: "unverified".into(),
            gold_type: None,
            verified: false,
            fold: Some(1),
            distractors: (0..4)
                .map(|d| (d, format!("wrong {d}, \"quoted\"."), None))
                .collect(),
            found_ending_id: 1000 + i,
        }
    }

    #[test]
    fn gold_positions_are_uniform_and_reproducible() {
        let examples: Vec<_> = (0..4000).map(example).collect();
        let rows = build(&examples, Seed::new(3));
        assert_eq!(rows, build(&examples, Seed::new(3)));
        let mut counts = [0usize; 4];
        for r in &rows {
            assert_eq!(r.endings[r.label], r.gold);
            counts[r.label] += 1;
        }
        for c in counts {
            assert!((900..1100).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn csv_columns_follow_swag() {
        let rows = build(&[example(1)], Seed::new(0));
        let refs: Vec<&Row> = rows.iter().collect();
        let text = String::from_utf8(regular_csv(&refs, true).unwrap()).unwrap();
        assert!(text.starts_with(
            ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label,could-be-right\n"
        ));
        assert!(text.contains("\n0,v1,1,A man walks in. He,A man walks in.,He,unverified,"));
        assert!(text.ends_with(&format!(",{},0\n", rows[0].label)));
        let unlabeled = String::from_utf8(regular_csv(&refs, false).unwrap()).unwrap();
        assert!(unlabeled.ends_with(",-1,0\n"), "{unlabeled}");
        let full = String::from_utf8(full_csv(&refs).unwrap()).unwrap();
        assert!(full.starts_with(
            "video-id,fold-ind,startphrase,gold-ending,distractor-0,distractor-1,distractor-2,distractor-3,\
             gold-source,gold-type,distractor-0-type,distractor-1-type,distractor-2-type,distractor-3-type,sent1,sent2\n"
        ));
        assert!(full.contains("gold 1.,\"wrong 0, \"\"quoted\"\".\""));
        assert!(full.ends_with(",,,,,,A man walks in.,He\n"), "{full}");
    }

    #[test]
    fn random_negatives_skip_gold_and_found() {
        let mut examples = vec![example(1), example(2)];
        let mut pool = BTreeMap::new();
        pool.insert(
            1,
            (0..10)
                .map(|i| (i, format!("pool {i}.")))
                .chain([(1001, "gold 1.".to_string())])
                .collect(),
        );
        pool.insert(
            2,
            vec![
                (5, "a.".to_string()),
                (1002, "gold 2.".to_string()),
                (6, "b.".to_string()),
            ],
        );
        let left_out = randomise(
            &mut examples,
            |id| Ok(pool.get(&id).cloned().unwrap_or_default()),
            Seed::new(9),
        )
        .unwrap();
        assert_eq!(left_out, vec!["v2#0".to_string()]);
        assert_eq!(examples.len(), 1);
        assert_eq!(examples[0].distractors.len(), 4);
        assert!(examples[0].distractors.iter().all(|d| d.0 < 10));
    }
}
