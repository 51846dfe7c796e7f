//! The dataset card (the body of the export's README.md): what a reviewer needs to trust and
//! reproduce the export — sizes, files and how to load them, sources and their licences, the
//! generator and its SHA-256, the found-vs-generated log-prob gap, the AF run, the human
//! verification and its agreement, and every seed and parameter.
//!
//! The card holds nothing that changes between two exports of the same project with the same
//! arguments (no clock time, no output path), so exports stay byte-identical.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use anyhow::Result;

use super::harness;
use super::layout::Layout;
use super::options::{Negatives, Options};
use super::rows::Row;
use afkit_engine::text::counted;
use afkit_store::af::{AfRun, IterationRecord, Phase};
use afkit_store::assemble::AssemblyInfo;
use afkit_store::dataset::Split;
use afkit_store::export::{LabelRow, Provenance};
use afkit_store::Store;

/// Everything the card reports, read from the project.
pub(crate) struct CardInputs {
    pub project_name: String,
    pub negatives: Negatives,
    pub seed: afkit_engine::seed::Seed,
    pub layout: Layout,
    pub license: String,
    pub assemble_params: Option<String>,
    pub provenance: Provenance,
    /// The AF run the exported assembly was made from.
    pub af_run: Option<AfRun>,
    pub assembly: Option<AssemblyInfo>,
    pub iterations: Vec<IterationRecord>,
    pub left_out: Vec<String>,
}

impl CardInputs {
    /// What the card reports of the project and the export's options, its files as `layout`
    /// places them.
    pub(crate) fn read(
        store: &Store,
        options: &Options,
        layout: Layout,
        left_out: Vec<String>,
    ) -> Result<CardInputs> {
        let assembly = store.assembly_info()?;
        let af_run = match assembly {
            Some(a) => store.af_run_by_id(a.af_run)?,
            None => store.latest_finished_af_run()?,
        };
        let iterations = match &af_run {
            Some(run) => store.af_iterations(run.id)?,
            None => Vec::new(),
        };
        Ok(CardInputs {
            project_name: options.name.clone().unwrap_or_else(|| {
                store
                    .path()
                    .file_stem()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            }),
            negatives: options.negatives,
            seed: options.seed,
            layout,
            license: options.license.clone(),
            assemble_params: store.meta("assemble")?,
            provenance: store.provenance()?,
            af_run,
            assembly,
            iterations,
            left_out,
        })
    }
}

pub(crate) fn render(inputs: &CardInputs, rows: &[Row]) -> String {
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
        c.negatives.as_str(),
        if c.negatives == Negatives::Random {
            " — a control: distractors drawn at random from each context's pre-AF pool, not the AF-selected ones"
        } else {
            " — endings Adversarial Filtering assigned to each context"
        }
    )?;
    writeln!(
        md,
        "- Verified by annotators: {verified} of {} examples",
        rows.len()
    )?;
    write_could_be_right(md, rows)?;

    write_sizes(md, c, rows)?;
    write_files(md, &c.layout)?;
    write_usage(md, &c.layout)?;
    write_sources(md, c)?;
    write_generator(md, c)?;
    write_af(md, c)?;
    writeln!(md, "\n## Human verification\n")?;
    write_agreement(md, &c.provenance.labels, &c.provenance.tasks_per_round)?;
    write_seeds_and_licence(md, c)
}

/// The flagged share of the questions no annotator verified, and what the flag means.
fn write_could_be_right(md: &mut String, rows: &[Row]) -> std::fmt::Result {
    let unverified = rows
        .iter()
        .filter(|r| !r.verified || r.distractors.iter().any(|d| d.1.is_none()))
        .count();
    if unverified == 0 {
        return writeln!(md);
    }
    let flagged = rows.iter().filter(|r| r.could_be_right).count();
    writeln!(
        md,
        "- Could be right: {flagged} of {unverified} unverified examples ({:.1}%) have a \
         distractor that a language model reading the context finds at least as likely as the \
         real ending, or that restates it; they are marked (`could_be_right` in the JSONL, \
         `could-be-right` in the regular CSVs). Such a distractor may be a second right answer: \
         verify those examples, or leave them out, before trusting scores on them.\n",
        100.0 * flagged as f64 / unverified as f64
    )
}

/// Examples, groups and labels per split, and examples per gold source.
fn write_sizes(md: &mut String, c: &CardInputs, rows: &[Row]) -> std::fmt::Result {
    writeln!(md, "## Sizes\n")?;
    writeln!(
        md,
        "| split | examples | groups | label 0 | label 1 | label 2 | label 3 |"
    )?;
    writeln!(md, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")?;
    for split in Split::ALL {
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
    writeln!(
        md,
        "\nA group is the source its contexts came from (for ActivityNet Captions, one video); \
         all of a group's examples are in one split, so no split shares a source with another."
    )?;

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

    Ok(())
}

fn write_sources(md: &mut String, c: &CardInputs) -> std::fmt::Result {
    writeln!(md, "\n## Sources\n")?;
    writeln!(
        md,
        "| file | format | SHA-256 | examples kept | licence |\n| --- | --- | --- | ---: | --- |"
    )?;
    // Inputs that contributed no example (such as this export ingested back) are not its sources.
    for s in c.provenance.sources.iter().filter(|s| s.examples > 0) {
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

    Ok(())
}

/// The generation runs, and how much likelier the LM finds the found endings than its own.
fn write_generator(md: &mut String, c: &CardInputs) -> std::fmt::Result {
    writeln!(md, "\n## Generator\n")?;
    if c.provenance.generations.is_empty() {
        writeln!(md, "No generation recorded.")?;
    }
    for g in &c.provenance.generations {
        writeln!(
            md,
            "- `{}` via {} — SHA-256 `{}`; prompt `{}`; parameters `{}`; seed {}; {}, {}. Licence: {}",
            g.model,
            g.backend,
            g.model_sha256.as_deref().unwrap_or("not recorded"),
            g.prompt,
            g.params,
            g.seed,
            counted(g.contexts, "context", "contexts"),
            counted(g.candidates, "candidate ending", "candidate endings"),
            model_licence(&g.model)
        )?;
    }
    match &c.provenance.gap {
        Some(gap) => writeln!(
            md,
            "\nMean log-prob per token of the ending given its context (the LM may have seen the \
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

    Ok(())
}

/// The AF run and each model's held-out accuracy at its first and last iteration.
fn write_af(md: &mut String, c: &CardInputs) -> std::fmt::Result {
    writeln!(md, "\n## Adversarial filtering\n")?;
    match &c.af_run {
        None => writeln!(md, "No finished AF run.")?,
        Some(run) => {
            let ran = |phase: Phase| c.iterations.iter().filter(|i| i.phase == phase).count();
            writeln!(
                md,
                "Run {} with k = {}, seed {}, parameters `{}`: {} ({} MLP-only, {} style, {} \
                 ensemble).",
                run.id,
                run.k,
                run.seed,
                run.params,
                counted(c.iterations.len(), "iteration", "iterations"),
                ran(Phase::Mlp),
                ran(Phase::Style),
                ran(Phase::Ensemble)
            )?;
            if let (Some(first), Some(last)) = (c.iterations.first(), c.iterations.last()) {
                writeln!(
                    md,
                    "\n| model | first iteration ({}) | last iteration ({}) |",
                    first.iteration, last.iteration
                )?;
                writeln!(md, "| --- | ---: | ---: |")?;
                let cell = |a: Option<f64>| a.map_or_else(|| "—".into(), |a| format!("{a:.3}"));
                let heads = first
                    .accuracy
                    .named()
                    .into_iter()
                    .zip(last.accuracy.named());
                for ((name, a), (_, b)) in heads {
                    if a.is_some() || b.is_some() {
                        writeln!(md, "| {name} | {} | {} |", cell(a), cell(b))?;
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

    Ok(())
}

fn write_seeds_and_licence(md: &mut String, c: &CardInputs) -> std::fmt::Result {
    writeln!(md, "\n## Seeds and parameters\n")?;
    writeln!(md, "- afkit {}", env!("CARGO_PKG_VERSION"))?;
    let which = c.assembly.map_or_else(String::new, |a| {
        format!("assembly {} of AF run {}, ", a.number, a.af_run)
    });
    writeln!(
        md,
        "- assemble: {which}`{}`",
        c.assemble_params.as_deref().unwrap_or("not recorded")
    )?;
    writeln!(
        md,
        "- export: negatives = {}, seed = {}, test labels {}",
        c.negatives.as_str(),
        c.seed,
        if c.layout.with_test_labels {
            "kept (`--with-test-labels`: an internal export, not for publishing)"
        } else {
            "withheld"
        }
    )?;

    writeln!(md, "\n## Licences\n")?;
    writeln!(
        md,
        "Declared licence: `{}`. The dataset inherits the terms of its inputs (table above) and of the \
         generator's outputs. afkit itself is Apache-2.0; it adds no data of its own.",
        c.license
    )?;
    Ok(())
}

fn write_files(md: &mut String, layout: &Layout) -> std::fmt::Result {
    writeln!(md, "\n## Files\n")?;
    let test = if layout.with_test_labels {
        "The test split's labels are in the folder (an internal export)."
    } else {
        "The test split's labels are withheld: its `label` is -1 and there is no `test_full.csv`; \
         the maintainer keeps the answers."
    };
    writeln!(
        md,
        "- `train.csv`, `val.csv`, `test.csv` — SWAG's regular columns after an unnamed row-number \
         column (as in the SWAG release): video-id, fold-ind, startphrase, sent1, sent2, gold-source, \
         ending0..ending3, label (the gold's position, shuffled per example with a seeded generator), \
         and afkit's could-be-right (1 when a distractor of an unverified example could be a \
         second right answer; last, so readers that go by position are not disturbed). {test}\n\
         - `train_full.csv`, `val_full.csv`{} — SWAG's full columns in the release's order: video-id, \
         fold-ind, startphrase, gold-ending, distractor-0..3 (in the order assembly chose them: \
         matched to the gold endings' final scores by default, hardest first with `assemble \
         --distractors hardest`), gold-source, gold-type, \
         distractor-0-type..distractor-3-type (likely/unlikely; empty when unverified or random), \
         sent1, sent2.\n\
         - `jsonl/train.jsonl`, `jsonl/val.jsonl`, `jsonl/test.jsonl` — id, group, sent1, sent2, \
         startphrase, endings, label, gold_source, verified, could_be_right, and HellaSwag's fields: activity_label \
         (the group), ctx_a (sent1), ctx_b (sent2), ctx (the startphrase).\n\
         - `lm_eval/` — lm-evaluation-harness tasks `{}` (SWAG-style: the startphrase and \
         ending0..ending3) and `{}` (HellaSwag-style: \"activity_label: ctx\" and the endings).\n\
         - fold-ind is the context's fold in AF's final cross-fitted scoring pass.",
        if layout.has_full(Split::Test) {
            ", `test_full.csv`"
        } else {
            ""
        },
        harness::SWAG_TASK,
        harness::HELLASWAG_TASK
    )?;
    for split in Split::ALL.into_iter().filter(|s| !layout.present(*s)) {
        writeln!(
            md,
            "- The {split} split has no examples, so it has no files and no configuration entry."
        )?;
    }
    Ok(())
}

fn write_usage(md: &mut String, layout: &Layout) -> std::fmt::Result {
    let splits: Vec<&str> = layout.hf_splits().map(|(_, hf)| hf).collect();
    writeln!(md, "\n## Use\n")?;
    writeln!(
        md,
        "With Hugging Face `datasets`, from this folder (or with its path or Hub name for `.`):\n\n\
         ```python\n\
         from datasets import load_dataset\n\
         regular = load_dataset(\".\")          # splits {}\n\
         full = load_dataset(\".\", \"full\")     # gold, distractors and their types\n\
         hellaswag_style = load_dataset(\"json\", data_dir=\"jsonl\")\n\
         ```\n",
        splits.join(", ")
    )?;
    writeln!(
        md,
        "With lm-evaluation-harness, from this folder (it reports the {} split):\n\n```\n{}\n```",
        if layout.labelled(Split::Test) {
            "test"
        } else {
            "validation"
        },
        harness::command()
    )
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
        "{}, {}, {} labelled by several annotators. Tasks per round: {}.",
        counted(per_task.len(), "labelled item", "labelled items"),
        counted(annotators.len(), "annotator", "annotators"),
        counted(shared, "item", "items"),
        rounds
            .iter()
            .map(|(r, n)| format!("round {r}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    write_label_shares(md, labels)?;
    write_pairwise_agreement(md, labels)
}

fn rank_of(l: &LabelRow) -> String {
    l.rank.clone().unwrap_or_else(|| "neither".into())
}

/// How often found and generated endings got each rank and each judgement.
fn write_label_shares(md: &mut String, labels: &[LabelRow]) -> std::fmt::Result {
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
    Ok(())
}

/// Pairwise percent agreement: over every ending of a shared item and every pair of its
/// annotators.
fn write_pairwise_agreement(md: &mut String, labels: &[LabelRow]) -> std::fmt::Result {
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
