//! The audit's markdown report and PNG bar charts.

use std::fmt::Write;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;

use super::cv::{Baseline, CvResult};
use super::ppmi::Association;
use super::{AuditReport, CvAudit, Knn};
use crate::plot::{register_font, FONT};

/// Writes audit.md, audit.json, accuracy.png, ppmi.png and (when measured) knn.png into `dir`.
pub fn write(dir: &Path, r: &AuditReport) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let accuracies = r.accuracies();
    bar_chart(
        &dir.join("accuracy.png"),
        "Val accuracy by baseline (4-way; dashed: chance)",
        &accuracies
            .iter()
            .map(|a| a.0.to_string())
            .collect::<Vec<_>>(),
        &accuracies.iter().map(|a| a.1).collect::<Vec<_>>(),
        1.08,
        Some(0.25),
    )?;
    ppmi_chart(dir, &r.ppmi)?;
    if let Knn::Measured(k) = &r.knn {
        let mut labels = Vec::new();
        let mut values = Vec::new();
        for (i, &kk) in k.k.iter().enumerate() {
            labels.push(format!("val→train k={kk}"));
            values.push(k.val_to_train[i]);
            labels.push(format!("train→train k={kk}"));
            values.push(k.train_to_train[i]);
        }
        let top = values
            .iter()
            .cloned()
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
            * 1.1;
        bar_chart(
            &dir.join("knn.png"),
            "Mean cosine distance to k nearest train examples",
            &labels,
            &values,
            top.max(1e-6),
            None,
        )?;
    }
    let json = dir.join("audit.json");
    std::fs::write(&json, serde_json::to_string_pretty(r)? + "\n")
        .with_context(|| format!("cannot write {}", json.display()))?;
    std::fs::write(dir.join("audit.md"), markdown(r))
        .with_context(|| format!("cannot write {}", dir.join("audit.md").display()))?;
    Ok(())
}

fn markdown(r: &AuditReport) -> String {
    let mut md = String::new();
    let _ = write_markdown(&mut md, r);
    md
}

fn write_markdown(md: &mut String, r: &AuditReport) -> std::fmt::Result {
    writeln!(md, "# Bias audit\n")?;
    writeln!(
        md,
        "Trained on {} train questions, scored on {} val questions (4-way choice). Chance is 0.250; the \
         closer every baseline is to it, the fewer stylistic artifacts the dataset has (SWAG Table 3, \
         left columns).\n",
        r.n_train, r.n_val
    )?;
    writeln!(
        md,
        "| baseline | what it sees | val accuracy |\n| --- | --- | ---: |"
    )?;
    let what = [
        ("random", "nothing (expected accuracy of a uniform guess)"),
        ("shortest", "picks the ending with the fewest word tokens"),
        ("longest", "picks the ending with the most word tokens"),
        ("ngram_end", "1–2-gram logistic regression on the ending"),
        ("ngram_s2", "1–2-gram logistic regression on sent2 + ending"),
        (
            "ngram_ctx",
            "1–2-gram logistic regression on sent1 + sent2 + ending",
        ),
    ];
    for ((name, value), (_, seen)) in r.accuracies().iter().zip(what) {
        writeln!(md, "| {name} | {seen} | {value:.3} |")?;
    }
    writeln!(
        md,
        "\nThe n-gram models average their 1–2-grams per option (as fastText does), score each option \
         linearly, softmax over the four, and are fitted with L2-regularised L-BFGS; the strength λ \
         is chosen on a seeded 80/20 split of train (chosen: ending {:e}, sent2 {:e}, context {:e}).\n",
        r.lambda[0], r.lambda[1], r.lambda[2]
    )?;
    writeln!(md, "![accuracy](accuracy.png)\n")?;
    write_ppmi(md, &r.ppmi)?;
    writeln!(md, "\n## KNN distances (MiniLM)\n")?;
    match &r.knn {
        Knn::Skipped { skipped } => writeln!(md, "Not measured: {skipped}.")?,
        Knn::Measured(k) => {
            writeln!(
                md,
                "Mean cosine distance to the k nearest training items ({}, {} val and {} train questions).\n",
                k.model, k.n_val, k.n_train
            )?;
            write!(md, "| measure |")?;
            for kk in &k.k {
                write!(md, " top {kk} |")?;
            }
            writeln!(md)?;
            writeln!(md, "| --- |{}", " ---: |".repeat(k.k.len()))?;
            let row = |md: &mut String, name: &str, v: &[f64]| -> std::fmt::Result {
                write!(md, "| {name} |")?;
                for x in v {
                    write!(md, " {x:.4} |")?;
                }
                writeln!(md)
            };
            row(md, "val → train (context + gold)", &k.val_to_train)?;
            row(md, "train → train (baseline)", &k.train_to_train)?;
            for (name, v) in &k.by_class {
                row(md, &format!("endings: {name}"), v)?;
            }
            writeln!(md, "\n![knn](knn.png)")?;
        }
    }
    Ok(())
}

/// The bar chart of the words most associated with gold endings, when there are any.
fn ppmi_chart(dir: &Path, ppmi: &[Association]) -> Result<()> {
    let gold: Vec<_> = ppmi.iter().filter(|a| a.label == "gold").collect();
    if gold.is_empty() {
        return Ok(());
    }
    bar_chart(
        &dir.join("ppmi.png"),
        "Words most associated with gold endings (PPMI)",
        &gold.iter().map(|a| a.word.clone()).collect::<Vec<_>>(),
        &gold.iter().map(|a| a.ppmi).collect::<Vec<_>>(),
        gold.iter().map(|a| a.ppmi).fold(0.0, f64::max) * 1.1,
        None,
    )
}

fn write_ppmi(md: &mut String, ppmi: &[Association]) -> std::fmt::Result {
    writeln!(md, "## Word–label associations (PPMI)\n")?;
    writeln!(
        md,
        "| label | word | PPMI | count |\n| --- | --- | ---: | ---: |"
    )?;
    for a in ppmi {
        writeln!(
            md,
            "| {} | {} | {:.3} | {} |",
            a.label,
            a.word.replace('|', "\\|"),
            a.ppmi,
            a.count
        )?;
    }
    if ppmi.iter().any(|a| a.label == "gold") {
        writeln!(md, "\n![ppmi](ppmi.png)")?;
    }
    Ok(())
}

/// Writes the cross-validated audit: audit.md, audit.json, accuracy.png (mean fold accuracy of
/// every measured baseline) and ppmi.png into `dir`.
pub fn write_cv(dir: &Path, r: &CvAudit) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let measured: Vec<(&str, f64)> =
        r.cv.baselines
            .iter()
            .filter_map(|(baseline, result)| match result {
                CvResult::Measured { mean, .. } => Some((baseline.name(), *mean)),
                CvResult::Skipped { .. } => None,
            })
            .collect();
    bar_chart(
        &dir.join("accuracy.png"),
        &format!(
            "{}-fold cross-validated accuracy (4-way; dashed: chance)",
            r.cv.folds
        ),
        &measured.iter().map(|m| m.0.to_string()).collect::<Vec<_>>(),
        &measured.iter().map(|m| m.1).collect::<Vec<_>>(),
        1.08,
        Some(0.25),
    )?;
    ppmi_chart(dir, &r.ppmi)?;
    let json = dir.join("audit.json");
    std::fs::write(&json, serde_json::to_string_pretty(r)? + "\n")
        .with_context(|| format!("cannot write {}", json.display()))?;
    let mut md = String::new();
    let _ = write_cv_markdown(&mut md, r);
    std::fs::write(dir.join("audit.md"), md)
        .with_context(|| format!("cannot write {}", dir.join("audit.md").display()))?;
    Ok(())
}

fn write_cv_markdown(md: &mut String, r: &CvAudit) -> std::fmt::Result {
    let cv = &r.cv;
    writeln!(md, "# Bias audit ({}-fold cross-validation)\n", cv.folds)?;
    let pooled: Vec<String> = r
        .files
        .iter()
        .map(|f| match &f.skipped {
            None => format!("{} ({})", f.file, f.questions),
            Some(why) => format!("{} (skipped: {why})", f.file),
        })
        .collect();
    writeln!(
        md,
        "{} labelled questions pooled from {}, in {} groups (video ids), cut into {} folds by group \
         (seed {}; fold sizes {:?}). Every baseline is trained on {} folds and tested on the held-out \
         one, so each question is answered once by a model that never saw its video. Mean is the \
         mean fold accuracy (4-way, chance 0.250, ties split evenly); ± is its standard error, the \
         sample standard deviation of the fold accuracies / √{}.\n",
        cv.questions,
        pooled.join(", "),
        cv.groups,
        cv.folds,
        cv.seed,
        cv.fold_sizes,
        cv.folds - 1,
        cv.folds
    )?;
    writeln!(
        md,
        "| baseline | what it sees | mean | ± se | per fold |\n| --- | --- | ---: | ---: | --- |"
    )?;
    for (baseline, result) in &cv.baselines {
        let name = baseline.name();
        match result {
            CvResult::Measured {
                mean, se, folds, ..
            } => {
                let per_fold: Vec<String> = folds.iter().map(|a| format!("{a:.3}")).collect();
                let trained = result
                    .trained_on()
                    .map(|t| format!(" ({t})"))
                    .unwrap_or_default();
                writeln!(
                    md,
                    "| {name} | {} | {mean:.3} | {se:.3} | {}{trained} |",
                    baseline.description(),
                    per_fold.join(" ")
                )?;
            }
            CvResult::Skipped { skipped } => writeln!(
                md,
                "| {name} | {} | — | — | not measured: {skipped} |",
                baseline.description()
            )?,
        }
    }
    writeln!(
        md,
        "\nThe LR baselines average their features per option (as fastText does), score each option \
         linearly, softmax over the four, and are fitted with L2-regularised L-BFGS; λ is chosen \
         inside each training fold on a seeded 80/20 split. Character n-grams are the 2–5-grams of \
         every whitespace-separated word between `<` and `>`, case and punctuation kept.\n"
    )?;
    if cv
        .baselines
        .iter()
        .any(|(b, r)| *b == Baseline::FineTunedMiniLm && r.trained_on().is_some())
    {
        writeln!(
            md,
            "finetune_minilm is the MiniLM sentence encoder trained end to end in each fold as a \
             multiple-choice model: every option is read as `[CLS] sent1 sent2 [SEP] ending [SEP]`, \
             its last layer mean-pooled and scored by a linear head, with a softmax over the four \
             options. How many questions it learnt from matters as much as its accuracy: a \
             fine-tuned reader gains with more training questions, so a low accuracy on a small \
             dataset is a weaker claim than the same accuracy on a large one.\n"
        )?;
    }
    writeln!(md, "![accuracy](accuracy.png)\n")?;
    write_ppmi(md, &r.ppmi)
}

fn bar_chart(
    path: &Path,
    title: &str,
    labels: &[String],
    values: &[f64],
    y_max: f64,
    hline: Option<f64>,
) -> Result<()> {
    register_font();
    let width = (120 + 90 * labels.len() as u32).max(640);
    let root = BitMapBackend::new(path, (width, 480)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        let n = labels.len() as i32;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 20))
            .margin(12)
            .x_label_area_size(70)
            .y_label_area_size(50)
            .build_cartesian_2d((0..n).into_segmented(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(labels.len())
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .label_style((FONT, 13))
            .draw()?;
        chart.draw_series(values.iter().enumerate().map(|(i, &v)| {
            let v = if v.is_finite() { v } else { 0.0 };
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i as i32), 0.0),
                    (SegmentValue::Exact(i as i32 + 1), v),
                ],
                Palette99::pick(i).filled(),
            );
            bar.set_margin(0, 0, 8, 8);
            bar
        }))?;
        chart.draw_series(values.iter().enumerate().map(|(i, &v)| {
            Text::new(
                format!("{v:.3}"),
                (SegmentValue::CenterOf(i as i32), v),
                (FONT, 13),
            )
        }))?;
        if let Some(h) = hline {
            chart.draw_series(DashedLineSeries::new(
                [(SegmentValue::Exact(0), h), (SegmentValue::Exact(n), h)],
                6,
                4,
                BLACK.stroke_width(1),
            ))?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))
}
