//! DATASET_CARD.md: what a reviewer needs to trust and reproduce the export — sizes, sources
//! and their licences, the generator and its SHA-256, the found-vs-generated log-prob gap, the
//! AF run, the human verification and its agreement, and every seed and parameter.
//!
//! The card holds nothing that changes between two exports of the same project with the same
//! arguments (no clock time, no output path), so exports stay byte-identical.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use anyhow::Result;

use super::rows::Row;
use crate::assemble::split::SPLIT_NAMES;
use crate::store::export::{
    self as db, GenerationInfo, IterationInfo, LabelRow, LogProbGap, SourceInfo,
};
use crate::store::{assemble::AfRun, Store};

/// Everything the card reports, read from the project.
pub struct CardInputs {
    pub project_name: String,
    pub negatives: &'static str,
    pub seed: u64,
    pub assemble_params: Option<String>,
    pub sources: Vec<SourceInfo>,
    pub generations: Vec<GenerationInfo>,
    pub gap: Option<LogProbGap>,
    pub af_run: Option<AfRun>,
    pub iterations: Vec<IterationInfo>,
    pub labels: Vec<LabelRow>,
    pub rounds: BTreeMap<i64, i64>,
    pub left_out: Vec<String>,
}

impl CardInputs {
    pub fn read(
        store: &Store,
        negatives: &'static str,
        seed: u64,
        left_out: Vec<String>,
    ) -> Result<CardInputs> {
        let conn = store.conn();
        let af_run = crate::store::assemble::latest_finished_run(conn)?;
        let iterations = match &af_run {
            Some(run) => db::af_iterations(conn, run.id)?,
            None => Vec::new(),
        };
        Ok(CardInputs {
            project_name: store
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            negatives,
            seed,
            assemble_params: store.meta("assemble")?,
            sources: db::sources(conn)?,
            generations: db::generations(conn)?,
            gap: db::logprob_gap(conn)?,
            af_run,
            iterations,
            labels: db::label_rows(conn)?,
            rounds: db::tasks_per_round(conn)?,
            left_out,
        })
    }
}

pub fn render(inputs: &CardInputs, rows: &[Row]) -> String {
    let mut md = String::new();
    let _ = write_card(&mut md, inputs, rows);
    md
}

fn write_card(md: &mut String, c: &CardInputs, rows: &[Row]) -> std::fmt::Result {
    writeln!(md, "# Dataset card: {}\n", c.project_name)?;
    writeln!(
        md,
        "A SWAG-format multiple-choice dataset (a context and four endings, one correct) built with \
         afkit {} (Adversarial Filtering as in Zellers et al., 2018).\n",
        env!("CARGO_PKG_VERSION")
    )?;
    let verified = rows.iter().filter(|r| r.verified).count();
    writeln!(
        md,
        "- Negatives: **{}**{}",
        c.negatives,
        if c.negatives == "random" {
            " — a control: distractors drawn at random from each context's pre-AF pool, not the AF-selected ones"
        } else {
            " — the endings Adversarial Filtering selected, hardest first"
        }
    )?;
    writeln!(
        md,
        "- Verified by annotators: {verified} of {} examples\n",
        rows.len()
    )?;

    writeln!(md, "## Sizes\n")?;
    writeln!(
        md,
        "| split | examples | groups | label 0 | label 1 | label 2 | label 3 |"
    )?;
    writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")?;
    for split in SPLIT_NAMES {
        let in_split: Vec<&Row> = rows.iter().filter(|r| r.split == split).collect();
        let groups: std::collections::BTreeSet<&str> =
            in_split.iter().map(|r| r.group.as_str()).collect();
        let mut labels = [0usize; 4];
        for r in &in_split {
            labels[r.label] += 1;
        }
        writeln!(
            md,
            "| {split} | {} | {} | {} | {} | {} | {} |",
            in_split.len(),
            groups.len(),
            labels[0],
            labels[1],
            labels[2],
            labels[3]
        )?;
    }
    let mut sources: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for r in rows {
        *sources
            .entry((r.split.as_str(), r.gold_source.as_str()))
            .or_default() += 1;
    }
    writeln!(
        md,
        "\n| split | gold-source | examples |\n| --- | --- | ---: |"
    )?;
    for ((split, source), n) in &sources {
        writeln!(md, "| {split} | {source} | {n} |")?;
    }
    if !c.left_out.is_empty() {
        writeln!(
            md,
            "\n{} assembled examples are left out because their pool has fewer than three other endings: {}",
            c.left_out.len(),
            c.left_out.join(", ")
        )?;
    }

    writeln!(md, "\n## Files\n")?;
    writeln!(
        md,
        "- `train.csv`, `val.csv`, `test.csv` — SWAG regular columns: video-id, fold-ind, startphrase, sent1, \
         sent2, gold-source, ending0..ending3, label (the gold's position, shuffled per example with a \
         seeded generator). `test_unlabeled.csv` is `test.csv` without the label.\n\
         - `*_full.csv` — SWAG full columns: gold-ending, distractor-0..3 (hardest first), gold-source, \
         gold-type and distractor types (likely/unlikely; empty when unverified or random).\n\
         - `*.jsonl` — id, group, sent1, sent2, startphrase, endings, label, gold_source, verified.\n\
         - fold-ind is the context's fold in AF's final cross-fitted scoring pass."
    )?;

    writeln!(md, "\n## Sources\n")?;
    writeln!(
        md,
        "| file | format | SHA-256 | examples kept | licence |\n| --- | --- | --- | ---: | --- |"
    )?;
    for s in &c.sources {
        writeln!(
            md,
            "| {} | {} | `{}` | {} | {} |",
            s.path,
            s.format,
            s.sha256,
            s.examples,
            source_licence(&s.format)
        )?;
    }

    writeln!(md, "\n## Generator\n")?;
    if c.generations.is_empty() {
        writeln!(md, "No generation recorded.")?;
    }
    for g in &c.generations {
        writeln!(
            md,
            "- `{}` via {} — SHA-256 `{}`; prompt `{}`; parameters `{}`; seed {}; {} contexts, {} candidate endings. Licence: {}",
            g.model,
            g.backend,
            g.model_sha256.as_deref().unwrap_or("not recorded"),
            g.prompt,
            g.params,
            g.seed,
            g.contexts,
            g.candidates,
            model_licence(&g.model)
        )?;
    }
    match &c.gap {
        Some(gap) => writeln!(
            md,
            "\nMean log-prob per token of the ending given its context (SPEC §2; the LM may have seen the \
             found endings, SWAG fn. 3): found {:.4} (n = {}), generated {:.4} (n = {}), gap found − generated \
             = {:+.4}.",
            gap.found_mean,
            gap.found_n,
            gap.generated_mean,
            gap.generated_n,
            gap.found_mean - gap.generated_mean
        )?,
        None => writeln!(md, "\nNo LM log-probs recorded: the found-vs-generated gap is unknown.")?,
    }

    writeln!(md, "\n## Adversarial filtering\n")?;
    match &c.af_run {
        None => writeln!(md, "No finished AF run.")?,
        Some(run) => {
            let mlp = c.iterations.iter().filter(|i| i.phase == "mlp").count();
            writeln!(
                md,
                "Run {} with k = {}, seed {}, parameters `{}`: {} iterations ({} MLP-only, {} ensemble).",
                run.id,
                run.k,
                run.seed,
                run.params,
                c.iterations.len(),
                mlp,
                c.iterations.len() - mlp
            )?;
            if let (Some(first), Some(last)) = (c.iterations.first(), c.iterations.last()) {
                writeln!(
                    md,
                    "\n| model | first iteration ({}) | last iteration ({}) |",
                    first.iteration, last.iteration
                )?;
                writeln!(md, "| --- | ---: | ---: |")?;
                for name in ["mlp", "bow", "cnn", "lstm", "ensemble"] {
                    let get = |it: &IterationInfo| {
                        it.accuracy
                            .iter()
                            .find(|a| a.0 == name)
                            .map(|a| format!("{:.3}", a.1))
                            .unwrap_or_else(|| "—".into())
                    };
                    if first
                        .accuracy
                        .iter()
                        .chain(&last.accuracy)
                        .any(|a| a.0 == name)
                    {
                        writeln!(md, "| {name} | {} | {} |", get(first), get(last))?;
                    }
                }
                writeln!(
                    md,
                    "\nChance is {:.3} (a (k+1)-way choice).",
                    1.0 / (run.k as f64 + 1.0)
                )?;
            }
        }
    }

    writeln!(md, "\n## Human verification\n")?;
    write_agreement(md, &c.labels, &c.rounds)?;

    writeln!(md, "\n## Seeds and parameters\n")?;
    writeln!(md, "- afkit {}", env!("CARGO_PKG_VERSION"))?;
    writeln!(
        md,
        "- assemble: `{}`",
        c.assemble_params.as_deref().unwrap_or("not recorded")
    )?;
    writeln!(
        md,
        "- export: negatives = {}, seed = {}",
        c.negatives, c.seed
    )?;

    writeln!(md, "\n## Licences\n")?;
    writeln!(
        md,
        "The dataset inherits the terms of its inputs (table above) and of the generator's outputs. afkit \
         itself is Apache-2.0; it adds no data of its own."
    )?;
    Ok(())
}

/// The terms that come with each input format, as far as afkit can know them.
fn source_licence(format: &str) -> &'static str {
    match format {
        "activitynet" => {
            "ActivityNet Captions format: if this is the ActivityNet Captions release (Krishna et al., \
             2017), its terms of use apply; otherwise that file's own terms (afkit's sample is Apache-2.0)"
        }
        "swag-csv" => "SWAG (Zellers et al., 2018): MIT licence, if this is the SWAG release; otherwise that file's terms",
        _ => "user-supplied file: state its licence here",
    }
}

fn model_licence(model: &str) -> &'static str {
    if model.to_ascii_lowercase().contains("smollm2") {
        "SmolLM2 (Hugging Face TB) is Apache-2.0"
    } else {
        "see the model's licence"
    }
}

/// Label distribution for found vs generated endings (SWAG Table 2 layout) and pairwise percent
/// agreement on items that several annotators labelled.
fn write_agreement(
    md: &mut String,
    labels: &[LabelRow],
    rounds: &BTreeMap<i64, i64>,
) -> std::fmt::Result {
    if labels.is_empty() {
        return writeln!(md, "No labels: this export is unverified.");
    }
    let mut annotators: std::collections::BTreeSet<&str> = Default::default();
    let mut per_task: BTreeMap<i64, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for l in labels {
        annotators.insert(&l.annotator);
        per_task.entry(l.task_id).or_default().insert(&l.annotator);
    }
    let shared = per_task.values().filter(|a| a.len() > 1).count();
    writeln!(
        md,
        "{} labelled items, {} annotators, {} items labelled by several annotators. Tasks per round: {}.",
        per_task.len(),
        annotators.len(),
        shared,
        rounds.iter().map(|(r, n)| format!("round {r}: {n}")).collect::<Vec<_>>().join(", ")
    )?;
    let rank_of = |l: &LabelRow| l.rank.clone().unwrap_or_else(|| "neither".into());
    writeln!(
        md,
        "\n| label | found ending | generated ending |\n| --- | ---: | ---: |"
    )?;
    for (value, is_rank) in [
        ("best", true),
        ("second", true),
        ("neither", true),
        ("likely", false),
        ("unlikely", false),
        ("gibberish", false),
    ] {
        let share = |found: bool| {
            let group: Vec<&LabelRow> = labels.iter().filter(|l| l.is_found == found).collect();
            let hits = group
                .iter()
                .filter(|l| {
                    if is_rank {
                        rank_of(l) == value
                    } else {
                        l.judgement == value
                    }
                })
                .count();
            if group.is_empty() {
                "—".to_string()
            } else {
                format!("{:.1}%", 100.0 * hits as f64 / group.len() as f64)
            }
        };
        writeln!(md, "| {value} | {} | {} |", share(true), share(false))?;
    }
    // Pairwise percent agreement: over every ending of a shared item and every pair of its annotators.
    let mut by_ending: HashMap<(i64, i64), Vec<&LabelRow>> = HashMap::new();
    for l in labels {
        by_ending
            .entry((l.task_id, l.ending_id))
            .or_default()
            .push(l);
    }
    let (mut pairs, mut rank_agree, mut label_agree) = (0usize, 0usize, 0usize);
    for votes in by_ending.values() {
        for i in 0..votes.len() {
            for j in i + 1..votes.len() {
                pairs += 1;
                rank_agree += usize::from(rank_of(votes[i]) == rank_of(votes[j]));
                label_agree += usize::from(votes[i].judgement == votes[j].judgement);
            }
        }
    }
    if pairs > 0 {
        writeln!(
            md,
            "\nPairwise percent agreement over {pairs} annotator pairs × endings: ranking (best/second/neither) \
             {:.1}%, judgement (likely/unlikely/gibberish) {:.1}%. `afkit agreement` gives Krippendorff's α.",
            100.0 * rank_agree as f64 / pairs as f64,
            100.0 * label_agree as f64 / pairs as f64
        )?;
    }
    Ok(())
}
