//! `afkit report`: the latest AF run as SWAG's Figure 2 on the user's data (`af_accuracy.png`),
//! a markdown summary (`report.md`) and, with `--json`, the per-iteration record.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use afkit_engine::output::Output;
use afkit_store::af::{AfRun, HeadAccuracy, IterationRecord, Phase};
use afkit_store::Store;

/// The files `report` wrote, and the iterations they show.
pub struct Report {
    pub png: PathBuf,
    pub markdown: PathBuf,
    pub iterations: Vec<IterationRecord>,
}

/// Writes `af_accuracy.png` and `report.md` for the latest AF run into `out`, through `output`
/// (never over the project).
pub fn report(store: &Store, out: &Path, output: &Output) -> Result<Report> {
    let output = output.clone().protect_project(store.path());
    let png = out.join("af_accuracy.png");
    let md = out.join("report.md");
    output.check(&png)?;
    output.check(&md)?;
    let project = store.path().display();
    let run = store.latest_af_run()?.ok_or_else(|| {
        anyhow!("{project} has no AF run yet: run `afkit filter {project}` first")
    })?;
    let iterations = store.af_iterations(run.id)?;
    let chart = output.stage(&png)?;
    plot(&run, &iterations, chart.path())?;
    let mut text = output.stage(&md)?;
    std::io::Write::write_all(text.file(), markdown(&run, &iterations, store)?.as_bytes())
        .with_context(|| format!("cannot write {}", md.display()))?;
    output.commit(vec![chart, text])?;
    Ok(Report {
        png,
        markdown: md,
        iterations,
    })
}

/// The models in plotting order with their colours; the ensemble, which decides, last.
const MODELS: [(&str, RGBColor); 9] = [
    ("MLP (LM features)", RGBColor(31, 119, 180)),
    ("bag of words", RGBColor(44, 160, 44)),
    ("CNN", RGBColor(255, 127, 14)),
    ("BiLSTM (POS)", RGBColor(148, 103, 189)),
    ("subwords", RGBColor(140, 86, 75)),
    ("sentence (MiniLM)", RGBColor(23, 190, 207)),
    ("ensemble", RGBColor(214, 39, 40)),
    ("fine-tuned MiniLM", RGBColor(127, 127, 127)),
    ("adversary (ensemble + MiniLM)", RGBColor(0, 0, 0)),
];

/// Whether model `m` decides what AF swaps (drawn bold, on top), rather than being one member
/// of the ensemble (drawn thin and light, behind): the MLP (in its own phase; a member after
/// it), the ensemble, the fine-tuned adversary and the two together.
fn decides(m: usize) -> bool {
    matches!(m, 0 | 6 | 7 | 8)
}

/// Model `m`'s line: bold and in full colour when it decides, thin and light when a member
/// (`in_ensemble_phase`: the MLP is one there).
fn line_style(m: usize, in_ensemble_phase: bool) -> ShapeStyle {
    let (_, colour) = MODELS[m];
    if decides(m) && !(m == 0 && in_ensemble_phase) {
        colour.stroke_width(3)
    } else {
        colour.mix(0.55).stroke_width(1)
    }
}

fn head(a: &HeadAccuracy, model: usize) -> Option<f64> {
    a.named()[model].1
}

/// Below this many held-out contexts per iteration, the chart says its points are noisy.
const FEW_HELD_OUT: usize = 200;

/// Accuracy by iteration, one line per model (each a little apart from the others, with its
/// own marker, so that equal accuracies do not hide a line), the MLP-only phase shaded, chance
/// dashed; the legend beside the plot, where it covers nothing.
fn plot(run: &AfRun, iterations: &[IterationRecord], path: &Path) -> Result<()> {
    let chance = 1.0 / (run.k as f64 + 1.0);
    let last = iterations.last().map_or(1, |r| r.iteration.max(1));
    let top = iterations
        .iter()
        .flat_map(|r| (0..MODELS.len()).filter_map(|m| head(&r.accuracy, m)))
        .fold(chance * 2.0, f64::max);
    // Headroom above the highest point for the phase labels.
    let y_max = (top * 1.15).min(1.05).max(chance * 1.5);
    let mlp_end = iterations
        .iter()
        .filter(|r| r.phase == Phase::Mlp)
        .map(|r| r.iteration)
        .max();

    let root = BitMapBackend::new(path, (1200, 650)).into_drawing_area();
    let draw_err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e:?}", path.display());
    root.fill(&WHITE).map_err(draw_err)?;
    let (plot_area, legend_area) = root.split_horizontally(920);
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(
            format!(
                "Held-out accuracy by AF iteration (k = {}, run {})",
                run.k, run.id
            ),
            afkit_engine::plot::font(24),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..last as f64 + 0.5, 0f64..y_max)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("AF iteration")
        .x_labels((last + 2).min(12))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .x_max_light_lines(1)
        .y_max_light_lines(1)
        .y_desc("accuracy on the held-out 20%")
        .axis_desc_style(afkit_engine::plot::font(18))
        .label_style(afkit_engine::plot::font(15))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(draw_err)?;

    if let Some(end) = mlp_end {
        let later = later_phases_label(iterations);
        shade_mlp_phase(&mut chart, end as f64 + 0.5, y_max, later).map_err(draw_err)?;
    }
    draw_chance(&mut chart, chance, last as f64 + 0.5).map_err(draw_err)?;
    let drawn = draw_models(&mut chart, iterations).map_err(draw_err)?;
    draw_legend(&legend_area, &drawn, chance, iterations).map_err(draw_err)?;
    root.present().map_err(draw_err)?;
    Ok(())
}

type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;
type DrawResult<T = ()> = std::result::Result<
    T,
    DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>,
>;

/// The name of the phases after the MLP-only one, if any ran.
fn later_phases_label(iterations: &[IterationRecord]) -> Option<&'static str> {
    let ran = |phase: Phase| iterations.iter().any(|r| r.phase == phase);
    match (ran(Phase::Style), ran(Phase::Ensemble)) {
        (true, true) => Some("style, then ensemble phase"),
        (true, false) => Some("style phase"),
        (false, true) => Some("ensemble phase"),
        (false, false) => None,
    }
}

/// The MLP-only phase as a shaded band up to `boundary`, its name at the top, with the later
/// phases' name after it when there are some.
fn shade_mlp_phase(
    chart: &mut Chart,
    boundary: f64,
    y_max: f64,
    later_phases: Option<&str>,
) -> DrawResult {
    chart.draw_series(std::iter::once(Rectangle::new(
        [(-0.5, 0.0), (boundary, y_max)],
        RGBColor(200, 215, 240).mix(0.3).filled(),
    )))?;
    let label_style =
        TextStyle::from(afkit_engine::plot::font(16).into_font()).color(&RGBColor(90, 90, 90));
    let at_top = y_max * 0.99;
    let mut labels = vec![Text::new(
        "MLP only".to_string(),
        (-0.4, at_top),
        label_style.clone(),
    )];
    if let Some(later) = later_phases {
        labels.push(Text::new(
            later.to_string(),
            (boundary + 0.1, at_top),
            label_style,
        ));
    }
    chart.draw_series(labels)?;
    chart.draw_series(DashedLineSeries::new(
        [(boundary, 0.0), (boundary, y_max)],
        5,
        5,
        RGBColor(120, 120, 120).stroke_width(1),
    ))?;
    Ok(())
}

fn draw_chance(chart: &mut Chart, chance: f64, x_end: f64) -> DrawResult {
    chart.draw_series(DashedLineSeries::new(
        [(-0.5, chance), (x_end, chance)],
        8,
        6,
        BLACK.stroke_width(2),
    ))?;
    Ok(())
}

/// Model `m`'s marker at `at`: a shape of its own among neighbours (circle, triangle, cross,
/// square), larger for the models that decide.
fn marker<DB: DrawingBackend>(m: usize, at: (i32, i32)) -> DynElement<'static, DB, (i32, i32)> {
    let (_, colour) = MODELS[m];
    let (size, style) = if decides(m) {
        (5, colour.filled())
    } else {
        (3, colour.mix(0.7).filled())
    };
    match m % 4 {
        0 => Circle::new(at, size, style).into_dyn(),
        1 => TriangleMarker::new(at, size + 2, style).into_dyn(),
        2 => Cross::new(at, size + 1, style.stroke_width(2)).into_dyn(),
        _ => Rectangle::new(
            [(at.0 - size, at.1 - size), (at.0 + size, at.1 + size)],
            style,
        )
        .into_dyn(),
    }
}

/// One line with markers per model that has accuracies: the ensemble's members thin and light
/// behind, the deciding models bold on top; each model's points shifted a little sideways.
/// The models drawn, as indices into `MODELS`.
fn draw_models(chart: &mut Chart, iterations: &[IterationRecord]) -> DrawResult<Vec<usize>> {
    let drawn: Vec<usize> = (0..MODELS.len())
        .filter(|&m| iterations.iter().any(|r| head(&r.accuracy, m).is_some()))
        .collect();
    let members = drawn.iter().filter(|&&m| !decides(m));
    for &m in members.chain(drawn.iter().filter(|&&m| decides(m))) {
        let points: Vec<(f64, f64, bool)> = iterations
            .iter()
            .filter_map(|r| {
                let x = r.iteration as f64 + sideways(&r.accuracy, m);
                head(&r.accuracy, m).map(|a| (x, a, r.phase != Phase::Mlp))
            })
            .collect();
        // Segment by segment: a line's style may change with the phase.
        for pair in points.windows(2) {
            chart.draw_series(LineSeries::new(
                pair.iter().map(|&(x, a, _)| (x, a)),
                line_style(m, pair[1].2),
            ))?;
        }
        chart.draw_series(
            points
                .iter()
                .map(|&(x, a, _)| EmptyElement::at((x, a)) + marker(m, (0, 0))),
        )?;
    }
    Ok(drawn)
}

/// How far model `m`'s point of an iteration sits beside the iteration: the models measured
/// in it spread evenly around it, 0.06 apart; a lone model sits on it.
fn sideways(accuracy: &HeadAccuracy, m: usize) -> f64 {
    let present: Vec<usize> = (0..MODELS.len())
        .filter(|&i| head(accuracy, i).is_some())
        .collect();
    let slot = present.iter().position(|&i| i == m).unwrap_or(0);
    (slot as f64 - (present.len().max(1) - 1) as f64 / 2.0) * 0.06
}

/// The legend in its own panel: each drawn model's line and marker, chance, and how many
/// held-out contexts each point rests on when they are few.
fn draw_legend(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    drawn: &[usize],
    chance: f64,
    iterations: &[IterationRecord],
) -> DrawResult {
    let text = TextStyle::from(afkit_engine::plot::font(15).into_font());
    let heading =
        TextStyle::from(afkit_engine::plot::font(14).into_font()).color(&RGBColor(90, 90, 90));
    let mut y = 60;
    for (title, group) in [("deciding", true), ("members of the ensemble", false)] {
        let models: Vec<usize> = drawn
            .iter()
            .copied()
            .filter(|&m| decides(m) == group)
            .collect();
        if models.is_empty() {
            continue;
        }
        area.draw(&Text::new(title, (8, y - 8), heading.clone()))?;
        y += 24;
        for m in models {
            area.draw(&PathElement::new([(8, y), (40, y)], line_style(m, !group)))?;
            area.draw(&(EmptyElement::at((24, y)) + marker(m, (0, 0))))?;
            area.draw(&Text::new(MODELS[m].0, (48, y - 8), text.clone()))?;
            y += 26;
        }
        y += 8;
    }
    area.draw(&PathElement::new([(8, y), (18, y)], BLACK.stroke_width(2)))?;
    area.draw(&PathElement::new([(28, y), (40, y)], BLACK.stroke_width(2)))?;
    area.draw(&Text::new(
        format!("chance = {chance:.2}"),
        (48, y - 8),
        text.clone(),
    ))?;
    if let Some(few) = iterations.iter().map(|r| r.n_test).min() {
        if few < FEW_HELD_OUT {
            let note = TextStyle::from(afkit_engine::plot::font(14).into_font())
                .color(&RGBColor(150, 30, 30));
            y += 44;
            let most = iterations.iter().map(|r| r.n_test).max().unwrap_or(few);
            let count = if most == few {
                few.to_string()
            } else {
                format!("{few} to {most}")
            };
            for line in [
                format!("Each point: {count}"),
                "held-out contexts, so".to_string(),
                format!("±{:.2} is noise", standard_error(0.5, few)),
                "(standard error).".to_string(),
            ] {
                area.draw(&Text::new(line, (8, y), note.clone()))?;
                y += 19;
            }
        }
    }
    Ok(())
}

/// The standard error of an accuracy near `p` measured on `n` contexts.
fn standard_error(p: f64, n: usize) -> f64 {
    (p * (1.0 - p) / n.max(1) as f64).sqrt()
}

fn fmt_acc(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.3}"))
}

fn markdown(run: &AfRun, iterations: &[IterationRecord], store: &Store) -> Result<String> {
    let chance = 1.0 / (run.k as f64 + 1.0);
    let mut md = String::new();
    writeln!(md, "# Adversarial filtering report: run {}\n", run.id)?;
    writeln!(
        md,
        "![accuracy by iteration](af_accuracy.png)\n\nStarted {}; {}. k = {} negatives per \
         context, chance = {chance:.3}, seed {}.\n",
        run.started_at,
        run.finished_at.as_ref().map_or(
            "not finished (the final cross-fitted pass is not stored yet)".to_string(),
            |f| { format!("finished {f}") }
        ),
        run.k,
        run.seed
    )?;
    summary(&mut md, iterations)?;
    if let Some(acc) = &run.final_accuracy {
        final_pass_summary(&mut md, acc, store, run.id)?;
    }
    iteration_table(&mut md, iterations)?;
    writeln!(md, "\n## Parameters\n")?;
    let params: serde_json::Value = serde_json::from_str(&run.params)?;
    writeln!(
        md,
        "```json\n{}\n```",
        serde_json::to_string_pretty(&params)?
    )?;
    Ok(md)
}

/// Iterations, swaps and time per phase, and how each model's accuracy moved in each phase.
fn summary(md: &mut String, iterations: &[IterationRecord]) -> Result<()> {
    let phase = |family: Phase| -> Vec<&IterationRecord> {
        iterations.iter().filter(|r| r.phase == family).collect()
    };
    let (mlp, style, ens) = (
        phase(Phase::Mlp),
        phase(Phase::Style),
        phase(Phase::Ensemble),
    );
    let total_swaps: usize = iterations.iter().map(|r| r.swaps).sum();
    writeln!(md, "## Summary\n")?;
    writeln!(
        md,
        "- iterations: {} ({} MLP-only, {} style, {} ensemble)",
        iterations.len(),
        mlp.len(),
        style.len(),
        ens.len()
    )?;
    writeln!(
        md,
        "- swaps: {total_swaps} in all (an easy negative replaced by a harder one from the pool)"
    )?;
    held_out_sizes(md, iterations)?;
    time_per_phase(md, iterations, [&mlp, &style, &ens])?;
    for (label, phase) in [
        ("MLP-only phase", &mlp),
        ("style phase", &style),
        ("ensemble phase", &ens),
    ] {
        accuracy_moves(md, label, phase)?;
    }
    Ok(())
}

/// How many contexts the iterations held out, and how much noise that size allows.
fn held_out_sizes(md: &mut String, iterations: &[IterationRecord]) -> Result<()> {
    let held_out = iterations.iter().map(|r| r.n_test);
    let (Some(few), Some(most)) = (held_out.clone().min(), held_out.max()) else {
        return Ok(());
    };
    let range = if few == most {
        few.to_string()
    } else {
        format!("{few} to {most}")
    };
    writeln!(
        md,
        "- held-out contexts per iteration: {range}; an accuracy measured on {few} contexts \
         has a standard error of up to ±{:.3}{}",
        standard_error(0.5, few),
        if few < FEW_HELD_OUT {
            ", so at this size most of the ups and downs of the curve are noise"
        } else {
            ""
        }
    )?;
    Ok(())
}

/// The iterations' time in all and their mean per phase.
fn time_per_phase(
    md: &mut String,
    iterations: &[IterationRecord],
    [mlp, style, ens]: [&[&IterationRecord]; 3],
) -> Result<()> {
    let total_seconds: f64 = iterations.iter().map(|r| r.seconds).sum();
    let mean = |rs: &[&IterationRecord]| {
        if rs.is_empty() {
            "–".to_string()
        } else {
            format!(
                "{:.1} s",
                rs.iter().map(|r| r.seconds).sum::<f64>() / rs.len() as f64
            )
        }
    };
    writeln!(
        md,
        "- time: {total_seconds:.0} s of iterations (mean {} per MLP-only, {} per style, {} per \
         ensemble iteration)",
        mean(mlp),
        mean(style),
        mean(ens)
    )?;
    Ok(())
}

/// Each model's accuracy at the first and the last iteration of a phase (nothing for a phase
/// that did not run).
fn accuracy_moves(md: &mut String, label: &str, phase: &[&IterationRecord]) -> Result<()> {
    let (Some(first), Some(last)) = (phase.first(), phase.last()) else {
        return Ok(());
    };
    writeln!(
        md,
        "- {label}: iteration {} → {}: {}",
        first.iteration,
        last.iteration,
        (0..MODELS.len())
            .filter_map(|m| {
                let (a, b) = (head(&first.accuracy, m), head(&last.accuracy, m));
                a.map(|_| format!("{} {} → {}", MODELS[m].0, fmt_acc(a), fmt_acc(b)))
            })
            .collect::<Vec<_>>()
            .join("; ")
    )?;
    Ok(())
}

/// The final cross-fitted pass's accuracies and where the final negatives came from.
fn final_pass_summary(
    md: &mut String,
    acc: &HeadAccuracy,
    store: &Store,
    run_id: i64,
) -> Result<()> {
    writeln!(
        md,
        "- final cross-fitted pass (every context scored by an ensemble that did not train on \
         it): mlp {}, bag of words {}, CNN {}, BiLSTM {}, subwords {}, sentence {}, \
         ensemble {}",
        fmt_acc(acc.mlp),
        fmt_acc(acc.bow),
        fmt_acc(acc.cnn),
        fmt_acc(acc.lstm),
        fmt_acc(acc.subword),
        fmt_acc(acc.sentence),
        fmt_acc(acc.ensemble)
    )?;
    if acc.minilm.is_some() {
        writeln!(
            md,
            "- with the fine-tuned adversary: MiniLM cross-encoder {}, ensemble and MiniLM \
             together (what AF acted on) {}",
            fmt_acc(acc.minilm),
            fmt_acc(acc.adversary)
        )?;
    }
    let origins = store.af_assignment_origins(run_id)?;
    let initial = origins.values().filter(|&&i| i < 0).count();
    writeln!(
        md,
        "- final assignment: {} of {} negatives brought in by AF swaps, {} from the initial \
         random draw",
        origins.len() - initial,
        origins.len(),
        initial
    )?;
    Ok(())
}

fn iteration_table(md: &mut String, iterations: &[IterationRecord]) -> Result<()> {
    writeln!(md, "\n## Per iteration\n")?;
    writeln!(
        md,
        "Accuracy = fraction of held-out contexts whose found ending outscores all k assigned \
         negatives, measured before the iteration's swaps.\n"
    )?;
    // The stylistic heads always; the fine-tuned adversary's where the run had one.
    let shown: Vec<usize> = (0..MODELS.len())
        .filter(|&m| m < 7 || iterations.iter().any(|r| head(&r.accuracy, m).is_some()))
        .collect();
    let names = HeadAccuracy::default().named();
    let header: String = shown
        .iter()
        .map(|&m| format!(" {} |", names[m].0))
        .collect();
    writeln!(
        md,
        "| iteration | phase |{header} swaps | held out | seconds |"
    )?;
    writeln!(
        md,
        "|---:|---|{}---:|---:|---:|",
        "---:|".repeat(shown.len())
    )?;
    for r in iterations {
        let cells: String = shown
            .iter()
            .map(|&m| format!(" {} |", fmt_acc(head(&r.accuracy, m))))
            .collect();
        writeln!(
            md,
            "| {} | {} |{cells} {} | {} | {:.1} |",
            r.iteration,
            r.phase.name(),
            r.swaps,
            r.n_test,
            r.seconds
        )?;
    }
    Ok(())
}
