//! The audit's markdown report and PNG bar charts.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::{RangedCoordf64, RangedCoordi32};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::cv::{Baseline, CvReport, CvResult};
use super::findings::{AuditReport, CouldBeRight, CvAudit, Findings, Knn};
use super::lm::LmResult;
use super::ppmi::Association;
use super::timing::Timing;
use super::verdict::{Row, Verdict};
use afkit_engine::output::{Output, Staged};
use afkit_engine::plot::font;

/// Every file an audit may write into its folder.
pub(crate) const FILES: [&str; 5] = [
    "audit.md",
    "audit.json",
    "accuracy.png",
    "ppmi.png",
    "knn.png",
];

/// The files of one report, staged through `output` and renamed into place together.
struct Files<'a> {
    output: &'a Output,
    dir: &'a Path,
    staged: Vec<Staged>,
}

impl<'a> Files<'a> {
    fn new(output: &'a Output, dir: &'a Path) -> Files<'a> {
        Files {
            output,
            dir,
            staged: Vec::new(),
        }
    }

    /// A staged file for `name`, whose temporary path a chart is drawn to.
    fn chart(&mut self, name: &str) -> Result<PathBuf> {
        let staged = self.output.stage(&self.dir.join(name))?;
        let path = staged.path().to_path_buf();
        self.staged.push(staged);
        Ok(path)
    }

    fn text(&mut self, name: &str, text: &str) -> Result<()> {
        let mut staged = self.output.stage(&self.dir.join(name))?;
        std::io::Write::write_all(staged.file(), text.as_bytes())
            .with_context(|| format!("cannot write {}", self.dir.join(name).display()))?;
        self.staged.push(staged);
        Ok(())
    }

    fn commit(self) -> Result<()> {
        self.output.commit(self.staged)
    }
}

/// Writes audit.md, audit.json, accuracy.png, ppmi.png and (when measured) knn.png into `dir`.
pub(crate) fn write(dir: &Path, r: &AuditReport, output: &Output) -> Result<()> {
    let mut files = Files::new(output, dir);
    accuracy_chart(
        &files.chart("accuracy.png")?,
        "Val accuracy ± standard error, train -> val (4-way; dashed: chance)",
        &r.findings.summary,
    )?;
    ppmi_chart(&mut files, &r.ppmi)?;
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
            &files.chart("knn.png")?,
            "Mean cosine distance to k nearest train examples",
            &labels,
            &values,
            top.max(1e-6),
            None,
        )?;
    }
    files.text("audit.json", &(serde_json::to_string_pretty(r)? + "\n"))?;
    files.text("audit.md", &markdown(r))?;
    files.commit()
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
    write_could_be_right(md, r.findings.could_be_right.as_ref())?;
    write_findings(md, &r.findings, r.control.is_some())?;
    write_ppmi(md, &r.ppmi)?;
    write_knn(md, &r.knn)?;
    write_timings(md, &r.findings.timings)
}

/// The KNN section: the distances per k in a table under the chart, or why they were not
/// measured.
fn write_knn(md: &mut String, knn: &Knn) -> std::fmt::Result {
    writeln!(md, "\n## KNN distances (MiniLM)\n")?;
    match knn {
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
fn ppmi_chart(files: &mut Files, ppmi: &[Association]) -> Result<()> {
    let gold: Vec<_> = ppmi.iter().filter(|a| a.label == "gold").collect();
    if gold.is_empty() {
        return Ok(());
    }
    bar_chart(
        &files.chart("ppmi.png")?,
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
pub(crate) fn write_cv(dir: &Path, r: &CvAudit, output: &Output) -> Result<()> {
    let mut files = Files::new(output, dir);
    accuracy_chart(
        &files.chart("accuracy.png")?,
        &format!(
            "{}-fold cross-validated accuracy ± standard error (4-way; dashed: chance)",
            r.cv.folds
        ),
        &r.findings.summary,
    )?;
    ppmi_chart(&mut files, &r.ppmi)?;
    files.text("audit.json", &(serde_json::to_string_pretty(r)? + "\n"))?;
    let mut md = String::new();
    let _ = write_cv_markdown(&mut md, r);
    files.text("audit.md", &md)?;
    files.commit()
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
         sample standard deviation of the fold accuracies / √{}. Chance ± is how far the same \
         baseline scattered on copies of the questions with their answers drawn at random.\n",
        cv.questions,
        pooled.join(", "),
        cv.groups,
        cv.folds,
        cv.seed,
        cv.fold_sizes,
        cv.folds - 1,
        cv.folds
    )?;
    write_cv_table(md, cv)?;
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
    write_could_be_right(md, r.findings.could_be_right.as_ref())?;
    write_findings(md, &r.findings, r.control.is_some())?;
    write_ppmi(md, &r.ppmi)?;
    write_timings(md, &r.findings.timings)
}

/// Seconds per baseline family and language model: where the audit's time went.
fn write_timings(md: &mut String, timings: &[Timing]) -> std::fmt::Result {
    if timings.is_empty() {
        return Ok(());
    }
    writeln!(md, "\n## Time\n\n| baseline | seconds |\n| --- | ---: |")?;
    for t in timings {
        writeln!(md, "| {} | {:.2} |", t.name.replace('|', "\\|"), t.seconds)?;
    }
    Ok(())
}

/// The export's flagged share, where it carries the flag.
fn write_could_be_right(md: &mut String, flag: Option<&CouldBeRight>) -> std::fmt::Result {
    match flag {
        Some(flag) => writeln!(
            md,
            "{}: verify them before reading the accuracies as the dataset's difficulty.\n",
            flag.sentence()
        ),
        None => Ok(()),
    }
}

/// One row per baseline: what it sees, its mean and standard error, the scatter of its
/// relabelled copies, each fold's accuracy (and the training questions where it reports them).
fn write_cv_table(md: &mut String, cv: &CvReport) -> std::fmt::Result {
    writeln!(
        md,
        "| baseline | what it sees | mean | ± se | chance ± | per fold |\n\
         | --- | --- | ---: | ---: | ---: | --- |"
    )?;
    for (baseline, result) in &cv.baselines {
        let name = baseline.name();
        match result {
            CvResult::Measured {
                mean,
                se,
                folds,
                chance,
                ..
            } => {
                let per_fold: Vec<String> = folds.iter().map(|a| format!("{a:.3}")).collect();
                let trained = result
                    .trained_on()
                    .map(|t| format!(" ({t})"))
                    .unwrap_or_default();
                let scatter = chance
                    .as_ref()
                    .map_or("—".to_string(), |c| format!("{:.3}", c.sd));
                writeln!(
                    md,
                    "| {name} | {} | {mean:.3} | {se:.3} | {scatter} | {}{trained} |",
                    baseline.description(),
                    per_fold.join(" ")
                )?;
            }
            CvResult::Skipped { skipped } => writeln!(
                md,
                "| {name} | {} | — | — | — | not measured: {skipped} |",
                baseline.description()
            )?,
        }
    }
    Ok(())
}

/// The language models' table, the side-by-side table with the control, and the verdicts.
fn write_findings(md: &mut String, findings: &Findings, with_control: bool) -> std::fmt::Result {
    if !findings.lm.is_empty() {
        write_lm_table(md, &findings.lm)?;
    }
    if with_control {
        write_control_table(md, &findings.summary)?;
    }
    write_verdicts(md, &findings.verdicts)
}

/// Each model's zero-shot accuracies, with the context and without.
fn write_lm_table(md: &mut String, lm: &[LmResult]) -> std::fmt::Result {
    writeln!(md, "## Language models, zero-shot\n")?;
    writeln!(
        md,
        "Every question is posed as lm-evaluation-harness poses this dataset's SWAG-style task \
         (the startphrase, then each ending after a space): `acc` picks the ending with the \
         highest summed log-probability of its tokens, `acc_norm` the highest per character of \
         the ending. ± is the standard error of a proportion, as the harness reports it. \
         *Without the context* poses the same endings after nothing: well above chance, the \
         endings alone give the answer away.\n"
    )?;
    writeln!(
        md,
        "| model | questions | acc | ± se | acc_norm | ± se | acc without the context | \
         acc_norm without the context | seconds |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )?;
    for r in lm {
        writeln!(
            md,
            "| {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} ± {:.3} | {:.3} ± {:.3} | {:.0} |",
            r.model,
            r.questions,
            r.acc,
            r.acc_se,
            r.acc_norm,
            r.acc_norm_se,
            r.acc_no_context,
            r.acc_no_context_se,
            r.acc_norm_no_context,
            r.acc_norm_no_context_se,
            r.seconds
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// Every row beside the control's, with the difference in points.
fn write_control_table(md: &mut String, summary: &[Row]) -> std::fmt::Result {
    writeln!(md, "## Against the control\n")?;
    writeln!(
        md,
        "The control (its own report in `control/`) is audited the same way; difference is \
         this dataset's accuracy minus the control's, in points.\n"
    )?;
    writeln!(
        md,
        "| row | this dataset | control | difference |\n| --- | ---: | ---: | ---: |"
    )?;
    for row in summary {
        let control = row.control.map_or("—".to_string(), |c| {
            format!("{:.3} ± {:.3}", c.mean, c.se)
        });
        let difference = row
            .difference
            .map_or("—".to_string(), |d| format!("{:+.1}", d * 100.0));
        writeln!(
            md,
            "| {} | {:.3} ± {:.3} | {control} | {difference} |",
            row.name, row.mean, row.se
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// The rule a row's standing follows, then one verdict per family.
fn write_verdicts(md: &mut String, verdicts: &[Verdict]) -> std::fmt::Result {
    writeln!(md, "## Verdicts\n")?;
    writeln!(
        md,
        "A row is off chance when it is further from 0.250 than its family's bar, above or below \
         (below: the real ending is the one it avoids): two standard errors for a family's only \
         row, more for a row among several (each of n rows tested at 4.55% / n: 2.80 standard \
         errors for nine). A row within the bar is at chance, or too few questions to tell when \
         two standard errors exceed {:.0} points. Under --cv the standard error here is never \
         below a proportion's at chance over all the questions, nor below the scatter of the \
         baseline's relabelled copies.\n",
        super::verdict::WIDEST_TELLING_INTERVAL * 100.0
    )?;
    for v in verdicts {
        writeln!(md, "- **{}**: {}", v.family, v.text)?;
    }
    writeln!(md)
}

/// A chart of one bar per x segment over a value axis, drawn into a PNG.
type BarAxes<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<SegmentedCoord<RangedCoordi32>, RangedCoordf64>,
>;

/// The error of drawing into a chart.
type DrawError = Box<dyn std::error::Error>;

fn bar_chart(
    path: &Path,
    title: &str,
    labels: &[String],
    values: &[f64],
    y_max: f64,
    hline: Option<f64>,
) -> Result<()> {
    let root = BitMapBackend::new(path, (chart_width(labels), 480)).into_drawing_area();
    let draw = || -> Result<(), DrawError> {
        root.fill(&WHITE)?;
        let n = labels.len() as i32;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, font(20))
            .margin(12)
            .x_label_area_size(70)
            .y_label_area_size(50)
            // `0..n - 1` holds n values: one segment per bar, none empty after the last.
            .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(labels.len())
            .x_label_formatter(&|x| segment_label(x, labels))
            .label_style(font(13))
            .y_max_light_lines(1)
            .draw()?;
        draw_bars(&mut chart, values, n)?;
        if let Some(h) = hline {
            chart.draw_series(DashedLineSeries::new(
                [(SegmentValue::Exact(0), h), (SegmentValue::Last, h)],
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

/// One bar per value out of `n` segments, in palette colours, each value centred just above its
/// bar; a value that is not finite is drawn as an empty bar.
fn draw_bars(chart: &mut BarAxes, values: &[f64], n: i32) -> Result<(), DrawError> {
    chart.draw_series(values.iter().enumerate().map(|(i, &v)| {
        let v = if v.is_finite() { v } else { 0.0 };
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i as i32), 0.0),
                (segment_end(i as i32, n), v),
            ],
            Palette99::pick(i).filled(),
        );
        bar.set_margin(0, 0, 8, 8);
        bar
    }))?;
    let value_style =
        TextStyle::from(font(13).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart.draw_series(values.iter().enumerate().map(|(i, &v)| {
        Text::new(
            format!("{v:.3}"),
            (SegmentValue::CenterOf(i as i32), v),
            value_style.clone(),
        )
    }))?;
    Ok(())
}

/// Chance for a 4-way choice.
const CHANCE: f64 = 0.25;

/// Pixels of the accuracy chart's plotting area, and of a value label above an error bar.
const PLOT_HEIGHT: f64 = 340.0;
const LABEL_HEIGHT: f64 = 18.0;

/// The top of the accuracy axis: room above the highest error bar for its value label, chance
/// always on the axis, rounded up to a multiple of 0.05.
fn accuracy_axis_top(rows: &[Row]) -> f64 {
    let top = rows
        .iter()
        .map(|r| r.mean + r.se)
        .filter(|v| v.is_finite())
        .fold(CHANCE, f64::max);
    let with_label = top / (1.0 - 1.5 * LABEL_HEIGHT / PLOT_HEIGHT);
    ((with_label / 0.05).ceil() * 0.05).min(1.1)
}

/// Where row `row`'s value label sits (bottom, top) in accuracy units on an axis up to `y_max`.
fn label_span(row: &Row, y_max: f64) -> (f64, f64) {
    let per_pixel = y_max / PLOT_HEIGHT;
    let bottom = row.mean + row.se.max(0.0) + 3.0 * per_pixel;
    (bottom, bottom + LABEL_HEIGHT * per_pixel)
}

/// Which rows let the chance line pass behind their bar: those whose value label it would
/// cross are skipped.
fn chance_passes(rows: &[Row], y_max: f64) -> Vec<bool> {
    rows.iter()
        .map(|row| {
            let (bottom, top) = label_span(row, y_max);
            !(bottom..=top).contains(&CHANCE)
        })
        .collect()
}

/// Every measured row (style, relational, language models, fine-tuned) as a bar with its mean,
/// ± one standard error as a whisker, the value above the whisker, and chance dashed behind.
fn accuracy_chart(path: &Path, title: &str, rows: &[Row]) -> Result<()> {
    let names: Vec<String> = rows.iter().map(|r| r.name.clone()).collect();
    let root = BitMapBackend::new(path, (chart_width(&names), 480)).into_drawing_area();
    let y_max = accuracy_axis_top(rows);
    let draw = || -> Result<(), DrawError> {
        root.fill(&WHITE)?;
        let n = rows.len().max(1) as i32;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, font(18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(rows.len())
            .x_label_formatter(&|x| segment_label(x, &names))
            .y_label_formatter(&|y| format!("{y:.2}"))
            .y_desc("accuracy")
            .label_style(font(13))
            .axis_desc_style(font(14))
            .y_max_light_lines(1)
            .draw()?;
        draw_chance_line(&mut chart, rows, y_max, n)?;
        draw_accuracy_bars(&mut chart, rows, y_max, n)?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))
}

/// Chance dashed behind the bars, left out where it would cross a value label.
fn draw_chance_line(
    chart: &mut BarAxes,
    rows: &[Row],
    y_max: f64,
    n: i32,
) -> Result<(), DrawError> {
    for (i, passes) in chance_passes(rows, y_max).into_iter().enumerate() {
        if passes {
            chart.draw_series(DashedLineSeries::new(
                [
                    (SegmentValue::Exact(i as i32), CHANCE),
                    (segment_end(i as i32, n), CHANCE),
                ],
                6,
                4,
                BLACK.stroke_width(1),
            ))?;
        }
    }
    Ok(())
}

/// Each row's mean as a bar out of `n` segments, ± one standard error as a whisker where there
/// is one, and the mean written above the whisker.
fn draw_accuracy_bars(
    chart: &mut BarAxes,
    rows: &[Row],
    y_max: f64,
    n: i32,
) -> Result<(), DrawError> {
    chart.draw_series(rows.iter().enumerate().map(|(i, row)| {
        let mean = if row.mean.is_finite() { row.mean } else { 0.0 };
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i as i32), 0.0),
                (segment_end(i as i32, n), mean),
            ],
            Palette99::pick(i).mix(0.75).filled(),
        );
        bar.set_margin(0, 0, 14, 14);
        bar
    }))?;
    chart.draw_series(
        rows.iter()
            .enumerate()
            .filter(|(_, r)| r.se > 0.0)
            .map(|(i, row)| {
                ErrorBar::new_vertical(
                    SegmentValue::CenterOf(i as i32),
                    (row.mean - row.se).max(0.0),
                    row.mean,
                    row.mean + row.se,
                    BLACK.stroke_width(1),
                    10,
                )
            }),
    )?;
    let value_style =
        TextStyle::from(font(13).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart.draw_series(rows.iter().enumerate().map(|(i, row)| {
        Text::new(
            format!("{:.3}", row.mean),
            (SegmentValue::CenterOf(i as i32), label_span(row, y_max).1),
            value_style.clone(),
        )
    }))?;
    Ok(())
}

/// A chart with a bar per label, each as wide as its label (14-pixel monospace, under 9 pixels
/// a character), so that labels never run together.
fn chart_width(labels: &[String]) -> u32 {
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0) as u32;
    let per_bar = (9 * longest + 20).max(90);
    (120 + per_bar * labels.len() as u32).max(640)
}

/// The label under a bar: its own at its centre, none elsewhere.
fn segment_label(x: &SegmentValue<i32>, labels: &[String]) -> String {
    match x {
        SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

/// Where bar `i` of `n` ends: the next segment's start, or the axis's end for the last bar.
fn segment_end(i: i32, n: i32) -> SegmentValue<i32> {
    if i + 1 < n {
        SegmentValue::Exact(i + 1)
    } else {
        SegmentValue::Last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, mean: f64, se: f64) -> Row {
        Row::new(name, mean, se)
    }

    #[test]
    fn the_axis_fits_the_highest_whisker_and_its_label_with_chance_on_it() {
        let rows = [
            row("shortest", 0.07, 0.02),
            row("lm:smollm2:acc", 0.41, 0.03),
        ];
        let top = accuracy_axis_top(&rows);
        assert!((0.44..=0.55).contains(&top), "{top}");
        let (_, label_top) = label_span(&rows[1], top);
        assert!(label_top <= top, "the label of the highest row fits");
        // Everything far under chance: the axis still shows chance.
        assert!(accuracy_axis_top(&[row("shortest", 0.05, 0.01)]) > CHANCE);
    }

    #[test]
    fn the_chance_line_leaves_out_the_bars_whose_label_it_would_cross() {
        let rows = [
            row("ngram_end", 0.24, 0.0),
            row("char_s2", 0.21, 0.02),
            row("lm:tiny:acc", 0.60, 0.05),
        ];
        let top = accuracy_axis_top(&rows);
        // 0.24 and 0.21 + 0.02 put their labels across 0.25; the tall bar's label is far above.
        assert_eq!(chance_passes(&rows, top), [false, false, true]);
    }
}
