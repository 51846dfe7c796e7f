//! Agreement and quality statistics (SWAG Table 2 and §3.5): Krippendorff's α (nominal) and
//! pairwise percent agreement for the ranking {best, second, neither} and for the labels
//! {likely, unlikely, gibberish}; label distributions of found vs generated endings; the
//! annotators' accuracy (the human figure a benchmark paper prints beside its models');
//! per-annotator progress and quality with a flag for annotators far below the rest.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use serde::Serialize;

use afkit_store::annotate::labels::SubmissionRecord;
use afkit_store::dataset::{Judgement, Rank};

/// Krippendorff's α for nominal data. `units` holds, per unit, the values the coders gave it;
/// units with fewer than two values cannot be paired and are ignored. `None` when no unit is
/// pairable or when every value is the same category (expected disagreement 0: α undefined).
///
/// α = 1 − D_o / D_e with the coincidence matrix: α = 1 − (n − 1) · Σ_u (m_u² − Σ_c n_uc²) / (m_u − 1)
/// ÷ (n² − Σ_c n_c²), where n_uc counts value c in unit u, m_u = Σ_c n_uc, n_c = Σ_u n_uc and
/// n = Σ_c n_c over pairable units (Krippendorff 2011, "Computing Krippendorff's alpha").
pub(crate) fn krippendorff_alpha_nominal<T: Eq + Hash + Copy>(units: &[Vec<T>]) -> Option<f64> {
    let mut totals: HashMap<T, f64> = HashMap::new();
    let mut observed = 0.0;
    let mut n = 0.0;
    for values in units.iter().filter(|v| v.len() >= 2) {
        let m = values.len() as f64;
        let counts = count(values);
        let same: f64 = counts.values().map(|&c| c * c).sum();
        observed += (m * m - same) / (m - 1.0);
        n += m;
        for (value, c) in counts {
            *totals.entry(value).or_default() += c;
        }
    }
    let expected = n * n - totals.values().map(|&c| c * c).sum::<f64>();
    if n < 2.0 || expected <= 0.0 {
        return None;
    }
    Some(1.0 - (n - 1.0) * observed / expected)
}

/// Pairwise percent agreement: of all pairs of coders that coded the same unit, the fraction
/// that gave the same value (pooled over units). `None` when no unit has two values.
pub(crate) fn pairwise_percent_agreement<T: Eq + Hash + Copy>(units: &[Vec<T>]) -> Option<f64> {
    let (mut agree, mut pairs) = (0.0, 0.0);
    for values in units.iter().filter(|v| v.len() >= 2) {
        let m = values.len() as f64;
        pairs += m * (m - 1.0) / 2.0;
        agree += count(values)
            .values()
            .map(|&c| c * (c - 1.0) / 2.0)
            .sum::<f64>();
    }
    (pairs > 0.0).then(|| agree / pairs)
}

fn count<T: Eq + Hash + Copy>(values: &[T]) -> HashMap<T, f64> {
    let mut counts = HashMap::new();
    for &v in values {
        *counts.entry(v).or_insert(0.0) += 1.0;
    }
    counts
}

/// The ranking category of one ending in one submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RankCategory {
    Best,
    Second,
    Neither,
}

fn rank_category(rank: Option<Rank>) -> RankCategory {
    match rank {
        Some(Rank::Best) => RankCategory::Best,
        Some(Rank::Second) => RankCategory::Second,
        None => RankCategory::Neither,
    }
}

/// Fractions of labels per category (SWAG Table 2, one column).
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub(crate) struct Distribution {
    /// Labels counted (one per ending per non-broken submission).
    pub(crate) n: usize,
    pub(crate) best: f64,
    pub(crate) second: f64,
    pub(crate) neither: f64,
    pub(crate) likely: f64,
    pub(crate) unlikely: f64,
    pub(crate) gibberish: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Distributions {
    pub(crate) found: Distribution,
    pub(crate) generated: Distribution,
}

/// One annotator's progress and quality.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct AnnotatorStats {
    pub(crate) annotator: String,
    /// Submissions, broken flags included.
    pub(crate) items: usize,
    pub(crate) broken: usize,
    pub(crate) items_per_hour: Option<f64>,
    /// Fraction of their labelled items where the found ending is best or second best.
    pub(crate) found_top2_rate: Option<f64>,
    /// Fraction of their labelled items where they ranked the found ending best.
    pub(crate) accuracy: Option<f64>,
    /// Items they share with at least one other annotator.
    pub(crate) shared_items: usize,
    /// Agreement with the others on shared items (pairs of this annotator with another).
    pub(crate) ppa_rank_with_others: Option<f64>,
    pub(crate) ppa_label_with_others: Option<f64>,
    pub(crate) flagged: bool,
    pub(crate) flag_reasons: Vec<String>,
}

/// Everything `afkit agreement` reports; the JSON keys are a stable interface that scripts read.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    pub(crate) alpha_rank: Option<f64>,
    pub(crate) ppa_rank: Option<f64>,
    pub(crate) alpha_label: Option<f64>,
    pub(crate) ppa_label: Option<f64>,
    /// Items (tasks) with at least two labelled submissions: the agreement sample.
    pub(crate) items: usize,
    pub(crate) submissions: usize,
    pub(crate) broken: usize,
    pub(crate) found_top2_rate: Option<f64>,
    /// How often an annotator ranked the found ending best; `None` without labelled submissions.
    pub(crate) human_accuracy: Option<HumanAccuracy>,
    pub(crate) distribution: Distributions,
    pub(crate) annotators: Vec<AnnotatorStats>,
    pub(crate) flag_rule: String,
}

/// The annotators' accuracy: a labelled submission answers its question correctly when it ranks
/// the found ending best among the endings shown. Pooled over submissions (an item labelled by
/// three annotators counts three times), with a 95% Wilson score interval, which stays inside
/// [0, 1] and honest for small counts and accuracies near 1, where the normal interval is not.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct HumanAccuracy {
    pub(crate) correct: usize,
    pub(crate) submissions: usize,
    pub(crate) accuracy: f64,
    pub(crate) low: f64,
    pub(crate) high: f64,
    /// The fewest and most endings a counted submission ranked (chance is one over these).
    pub(crate) endings_shown: (usize, usize),
}

impl HumanAccuracy {
    fn of(labelled: &[&SubmissionRecord]) -> Option<HumanAccuracy> {
        let answered: Vec<(bool, usize)> = labelled
            .iter()
            .filter_map(|s| found_ranked_best(s).map(|best| (best, s.labels.len())))
            .collect();
        let n = answered.len();
        if n == 0 {
            return None;
        }
        let correct = answered.iter().filter(|(best, _)| *best).count();
        let (low, high) = wilson_interval(correct, n);
        let shown = answered.iter().map(|&(_, endings)| endings);
        Some(HumanAccuracy {
            correct,
            submissions: n,
            accuracy: correct as f64 / n as f64,
            low,
            high,
            endings_shown: (shown.clone().min()?, shown.max()?),
        })
    }
}

/// The 95% Wilson score interval of `k` successes in `n` trials (`n > 0`).
pub(crate) fn wilson_interval(k: usize, n: usize) -> (f64, f64) {
    const Z: f64 = 1.959_963_984_540_054;
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let denominator = 1.0 + Z * Z / n;
    let centre = (p + Z * Z / (2.0 * n)) / denominator;
    let half = Z * (p * (1.0 - p) / n + Z * Z / (4.0 * n * n)).sqrt() / denominator;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Annotators with fewer items are not compared with the rest.
pub(crate) const FLAG_MIN_ITEMS: usize = 10;
/// Flag when the found-in-top-two rate is this far below the median annotator's.
pub(crate) const FLAG_TOP2_MARGIN: f64 = 0.20;
/// Flag when agreement with the others is this far below the median annotator's (rank or label).
pub(crate) const FLAG_AGREEMENT_MARGIN: f64 = 0.15;
/// Agreement with others is compared only with at least this many shared items.
pub(crate) const FLAG_MIN_SHARED: usize = 5;

pub(crate) fn flag_rule() -> String {
    format!(
        "among annotators with ≥{FLAG_MIN_ITEMS} items (when there are at least two): flagged if \
         their found-in-top-two rate is more than {:.0} points below the median annotator's, or, \
         with ≥{FLAG_MIN_SHARED} shared items, their rank or label agreement with the others is \
         more than {:.0} points below the median",
        FLAG_TOP2_MARGIN * 100.0,
        FLAG_AGREEMENT_MARGIN * 100.0
    )
}

pub fn report(submissions: &[SubmissionRecord]) -> Report {
    let labelled: Vec<&SubmissionRecord> = submissions.iter().filter(|s| !s.broken).collect();
    // Units: (task, ending) → [(annotator, label, rank)].
    let mut by_task: BTreeMap<i64, Vec<&SubmissionRecord>> = BTreeMap::new();
    for &s in &labelled {
        by_task.entry(s.task_id).or_default().push(s);
    }
    let shared: Vec<&Vec<&SubmissionRecord>> =
        by_task.values().filter(|subs| subs.len() >= 2).collect();
    let mut rank_units = Vec::new();
    let mut label_units = Vec::new();
    for subs in &shared {
        let mut by_ending: BTreeMap<i64, (Vec<RankCategory>, Vec<Judgement>)> = BTreeMap::new();
        for s in subs.iter() {
            for (l, _) in &s.labels {
                let unit = by_ending.entry(l.ending_id).or_default();
                unit.0.push(rank_category(l.rank));
                unit.1.push(l.judgement);
            }
        }
        for (_, (ranks, labels)) in by_ending {
            rank_units.push(ranks);
            label_units.push(labels);
        }
    }

    let annotators = annotator_stats(submissions, &by_task);
    let top2: Vec<bool> = labelled.iter().filter_map(|s| found_in_top2(s)).collect();
    Report {
        alpha_rank: krippendorff_alpha_nominal(&rank_units),
        ppa_rank: pairwise_percent_agreement(&rank_units),
        alpha_label: krippendorff_alpha_nominal(&label_units),
        ppa_label: pairwise_percent_agreement(&label_units),
        items: shared.len(),
        submissions: submissions.len(),
        broken: submissions.len() - labelled.len(),
        found_top2_rate: fraction(&top2),
        human_accuracy: HumanAccuracy::of(&labelled),
        distribution: Distributions {
            found: distribution(&labelled, true),
            generated: distribution(&labelled, false),
        },
        annotators,
        flag_rule: flag_rule(),
    }
}

fn fraction(flags: &[bool]) -> Option<f64> {
    (!flags.is_empty()).then(|| flags.iter().filter(|&&b| b).count() as f64 / flags.len() as f64)
}

/// Whether the found ending is ranked best; `None` for a submission without labels.
fn found_ranked_best(s: &SubmissionRecord) -> Option<bool> {
    s.labels
        .iter()
        .find(|(_, is_gold)| *is_gold)
        .map(|(l, _)| l.rank == Some(Rank::Best))
}

/// Whether the found ending is ranked best or second; `None` for a submission without labels.
fn found_in_top2(s: &SubmissionRecord) -> Option<bool> {
    s.labels
        .iter()
        .find(|(_, is_gold)| *is_gold)
        .map(|(l, _)| l.rank.is_some())
}

fn distribution(labelled: &[&SubmissionRecord], gold: bool) -> Distribution {
    let mut d = Distribution::default();
    for s in labelled {
        for (l, is_gold) in &s.labels {
            if *is_gold != gold {
                continue;
            }
            d.n += 1;
            match l.rank {
                Some(Rank::Best) => d.best += 1.0,
                Some(Rank::Second) => d.second += 1.0,
                None => d.neither += 1.0,
            }
            match l.judgement {
                Judgement::Likely => d.likely += 1.0,
                Judgement::Unlikely => d.unlikely += 1.0,
                Judgement::Gibberish => d.gibberish += 1.0,
            }
        }
    }
    if d.n > 0 {
        let n = d.n as f64;
        for v in [
            &mut d.best,
            &mut d.second,
            &mut d.neither,
            &mut d.likely,
            &mut d.unlikely,
            &mut d.gibberish,
        ] {
            *v /= n;
        }
    }
    d
}

fn annotator_stats(
    submissions: &[SubmissionRecord],
    by_task: &BTreeMap<i64, Vec<&SubmissionRecord>>,
) -> Vec<AnnotatorStats> {
    let mut names: Vec<&str> = submissions.iter().map(|s| s.annotator.as_str()).collect();
    names.sort();
    names.dedup();
    let mut stats: Vec<AnnotatorStats> = names
        .into_iter()
        .map(|name| stats_of(name, submissions, by_task))
        .collect();
    flag_outliers(&mut stats);
    stats
}

/// One annotator's figures, not yet flagged.
fn stats_of(
    name: &str,
    submissions: &[SubmissionRecord],
    by_task: &BTreeMap<i64, Vec<&SubmissionRecord>>,
) -> AnnotatorStats {
    let mine: Vec<&SubmissionRecord> = submissions.iter().filter(|s| s.annotator == name).collect();
    let labelled = mine.iter().filter(|s| !s.broken);
    let top2: Vec<bool> = labelled.clone().filter_map(|s| found_in_top2(s)).collect();
    let best: Vec<bool> = labelled.filter_map(|s| found_ranked_best(s)).collect();
    let shared = agreement_with_others(name, by_task);
    let ratio = |(a, n): (usize, usize)| (n > 0).then(|| a as f64 / n as f64);
    // An imported crowd row without its seconds has the import's time, not the worker's.
    let times: Vec<(String, Option<f64>)> = mine
        .iter()
        .filter(|s| s.in_terminal || s.seconds.is_some())
        .map(|s| (s.submitted_at.clone(), s.seconds))
        .collect();
    AnnotatorStats {
        annotator: name.to_string(),
        items: mine.len(),
        broken: mine.iter().filter(|s| s.broken).count(),
        items_per_hour: items_per_hour(&times),
        found_top2_rate: fraction(&top2),
        accuracy: fraction(&best),
        shared_items: shared.items,
        ppa_rank_with_others: ratio(shared.rank_pairs),
        ppa_label_with_others: ratio(shared.label_pairs),
        flagged: false,
        flag_reasons: Vec::new(),
    }
}

/// How one annotator's labels compare with those of others on the same items.
struct SharedAgreement {
    /// Items that at least one other annotator labelled too.
    items: usize,
    /// (pairs with the same rank, pairs compared) over every ending both labelled.
    rank_pairs: (usize, usize),
    /// (pairs with the same judgement, pairs compared) over the same endings.
    label_pairs: (usize, usize),
}

fn agreement_with_others(
    name: &str,
    by_task: &BTreeMap<i64, Vec<&SubmissionRecord>>,
) -> SharedAgreement {
    let mut shared = SharedAgreement {
        items: 0,
        rank_pairs: (0, 0),
        label_pairs: (0, 0),
    };
    for subs in by_task.values() {
        let Some(me) = subs.iter().find(|s| s.annotator == name) else {
            continue;
        };
        let others: Vec<&&SubmissionRecord> = subs.iter().filter(|s| s.annotator != name).collect();
        if others.is_empty() {
            continue;
        }
        shared.items += 1;
        for (l, _) in &me.labels {
            for other in &others {
                if let Some((o, _)) = other
                    .labels
                    .iter()
                    .find(|(o, _)| o.ending_id == l.ending_id)
                {
                    shared.rank_pairs.1 += 1;
                    shared.label_pairs.1 += 1;
                    shared.rank_pairs.0 += usize::from(o.rank == l.rank);
                    shared.label_pairs.0 += usize::from(o.judgement == l.judgement);
                }
            }
        }
    }
    shared
}

/// Applies [`flag_rule`].
fn flag_outliers(stats: &mut [AnnotatorStats]) {
    let qualified = |s: &AnnotatorStats| s.items >= FLAG_MIN_ITEMS;
    let median_of = |f: &dyn Fn(&AnnotatorStats) -> Option<f64>| -> Option<f64> {
        let mut v: Vec<f64> = stats
            .iter()
            .filter(|s| qualified(s))
            .filter_map(f)
            .collect();
        if v.len() < 2 {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        Some(if v.len().is_multiple_of(2) {
            (v[mid - 1] + v[mid]) / 2.0
        } else {
            v[mid]
        })
    };
    let shared =
        |s: &AnnotatorStats, v: Option<f64>| v.filter(|_| s.shared_items >= FLAG_MIN_SHARED);
    let top2_median = median_of(&|s| s.found_top2_rate);
    let rank_median = median_of(&|s| shared(s, s.ppa_rank_with_others));
    let label_median = median_of(&|s| shared(s, s.ppa_label_with_others));
    for s in stats.iter_mut().filter(|s| s.items >= FLAG_MIN_ITEMS) {
        let checks = [
            (
                "found ending in top two",
                s.found_top2_rate,
                top2_median,
                FLAG_TOP2_MARGIN,
            ),
            (
                "rank agreement",
                shared(s, s.ppa_rank_with_others),
                rank_median,
                FLAG_AGREEMENT_MARGIN,
            ),
            (
                "label agreement",
                shared(s, s.ppa_label_with_others),
                label_median,
                FLAG_AGREEMENT_MARGIN,
            ),
        ];
        for (what, value, median, margin) in checks {
            if let (Some(v), Some(m)) = (value, median) {
                if v < m - margin {
                    s.flag_reasons.push(format!(
                        "{what} {:.0}% vs median {:.0}%",
                        v * 100.0,
                        m * 100.0
                    ));
                }
            }
        }
        s.flagged = !s.flag_reasons.is_empty();
    }
}

/// Longest time one item may count: a longer gap is a break, not work.
const MAX_ITEM_SECONDS: f64 = 600.0;

/// Items per hour of work: each submission counts the time spent on it (the recorded `seconds`,
/// else the gap since the previous submission), capped at 10 minutes so that breaks do not
/// count; `None` without at least one measurable item. `items` are `(submitted_at, seconds)`.
pub(crate) fn items_per_hour(items: &[(String, Option<f64>)]) -> Option<f64> {
    let mut sorted: Vec<(f64, Option<f64>)> = items
        .iter()
        .filter_map(|(at, secs)| parse_timestamp(at).map(|t| (t, *secs)))
        .collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut counted, mut seconds) = (0usize, 0.0);
    for (i, (at, secs)) in sorted.iter().enumerate() {
        let spent = secs.or_else(|| (i > 0).then(|| at - sorted[i - 1].0));
        if let Some(s) = spent {
            counted += 1;
            seconds += s.clamp(0.0, MAX_ITEM_SECONDS);
        }
    }
    (counted > 0 && seconds > 0.0).then(|| counted as f64 * 3600.0 / seconds)
}

/// Parses the store's RFC 3339 UTC timestamps (`2026-11-22T02:21:36.500Z`, fraction optional)
/// into Unix seconds.
pub(crate) fn parse_timestamp(text: &str) -> Option<f64> {
    let text = text
        .trim()
        .strip_suffix('Z')
        .or_else(|| text.trim().strip_suffix("+00:00"))?;
    let (date, time) = text.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':');
    let (h, min) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let sec: f64 = t.next()?.parse().ok()?;
    if !(1..=12).contains(&m)
        || !(1..=31).contains(&day)
        || h > 23
        || min > 59
        || !(0.0..61.0).contains(&sec)
    {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm), the inverse of the store's formatter.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + min * 60) as f64 + sec)
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{:.1}%", v * 100.0))
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.digits$}"))
}

/// The human-readable report, laid out like SWAG Table 2 plus the annotator table.
impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&render(self))
    }
}

fn render(r: &Report) -> String {
    let mut out = String::new();
    let annotators = r.annotators.len();
    out.push_str(&format!(
        "{} submissions by {annotators} annotator{} ({} flagged as broken); agreement over {} item{} with ≥2 annotators\n\n",
        r.submissions,
        if annotators == 1 { "" } else { "s" },
        r.broken,
        r.items,
        if r.items == 1 { "" } else { "s" },
    ));
    label_table(&mut out, r);
    annotator_table(&mut out, r);
    out.push_str(&format!("\nFlag rule: {}.\n", r.flag_rule));
    out
}

/// SWAG Table 2: label shares of found and generated endings, with agreement per label group.
fn label_table(out: &mut String, r: &Report) {
    let (f, g) = (&r.distribution.found, &r.distribution.generated);
    out.push_str(&format!(
        "{:<14}{:>11}{:>11}{:>10}{:>8}\n",
        "Labels", "Found end", "Gen. end", "α", "ppa"
    ));
    let rows = [
        ("Best", f.best, g.best, None),
        (
            "Second best",
            f.second,
            g.second,
            Some((r.alpha_rank, r.ppa_rank)),
        ),
        ("Neither", f.neither, g.neither, None),
        ("Likely", f.likely, g.likely, None),
        (
            "Unlikely",
            f.unlikely,
            g.unlikely,
            Some((r.alpha_label, r.ppa_label)),
        ),
        ("Gibberish", f.gibberish, g.gibberish, None),
    ];
    for (name, found, generated, agreement) in rows {
        let (a, p) = agreement.map_or((String::new(), String::new()), |(a, p)| {
            (
                num(a, 2),
                p.map_or("–".into(), |p| format!("{:.0}%", p * 100.0)),
            )
        });
        let share = |n: usize, v: f64| {
            if n == 0 {
                "–".to_string()
            } else {
                format!("{:.1}%", v * 100.0)
            }
        };
        out.push_str(&format!(
            "{name:<14}{:>11}{:>11}{a:>10}{p:>8}\n",
            share(f.n, found),
            share(g.n, generated)
        ));
    }
    out.push_str(&format!(
        "\n({} found and {} generated ending labels; α and ppa per group: ranking {{best, second, neither}}, labels {{likely, unlikely, gibberish}})\n",
        f.n, g.n
    ));
    out.push_str(&format!(
        "Found ending ranked best or second: {} of labelled submissions (SWAG: 73.7%)\n",
        pct(r.found_top2_rate)
    ));
    out.push_str(&human_accuracy_line(r.human_accuracy.as_ref()));
    out.push('\n');
}

/// The human figure beside a benchmark's model rows, with the question format it was measured on.
fn human_accuracy_line(accuracy: Option<&HumanAccuracy>) -> String {
    let Some(h) = accuracy else {
        return "Human accuracy (found ending ranked best): – (no labelled submissions)\n".into();
    };
    let shown = match h.endings_shown {
        (low, high) if low == high => format!("{low}"),
        (low, high) => format!("{low}–{high}"),
    };
    format!(
        "Human accuracy (found ending ranked best among {shown} endings): {:.1}% \
         (95% interval {:.1}–{:.1}%, {} of {} labelled submissions)\n",
        h.accuracy * 100.0,
        h.low * 100.0,
        h.high * 100.0,
        h.correct,
        h.submissions
    )
}

/// One row per annotator: volume, speed, found-in-top-two rate, agreement with the others, flag.
fn annotator_table(out: &mut String, r: &Report) {
    out.push_str(&format!(
        "{:<16} {:>5} {:>7} {:>8} {:>9} {:>11} {:>7} {:>9} {:>10}  {}\n",
        "annotator",
        "items",
        "broken",
        "items/h",
        "accuracy",
        "found top2",
        "shared",
        "ppa rank",
        "ppa label",
        "flag"
    ));
    for a in &r.annotators {
        out.push_str(&format!(
            "{:<16} {:>5} {:>7} {:>8} {:>9} {:>11} {:>7} {:>9} {:>10}  {}\n",
            a.annotator,
            a.items,
            a.broken,
            num(a.items_per_hour, 1),
            pct(a.accuracy),
            pct(a.found_top2_rate),
            a.shared_items,
            pct(a.ppa_rank_with_others),
            pct(a.ppa_label_with_others),
            if a.flagged {
                format!("FLAG: {}", a.flag_reasons.join("; "))
            } else {
                String::new()
            }
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use afkit_store::annotate::labels::EndingLabel;

    /// Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: four
    /// observers, twelve units, missing values; nominal α = 0.743.
    #[test]
    fn krippendorffs_own_nominal_example() {
        let table: [[Option<u8>; 12]; 4] = [
            [
                Some(1),
                Some(2),
                Some(3),
                Some(3),
                Some(2),
                Some(1),
                Some(4),
                Some(1),
                Some(2),
                None,
                None,
                None,
            ],
            [
                Some(1),
                Some(2),
                Some(3),
                Some(3),
                Some(2),
                Some(2),
                Some(4),
                Some(1),
                Some(2),
                Some(5),
                None,
                Some(3),
            ],
            [
                None,
                Some(3),
                Some(3),
                Some(3),
                Some(2),
                Some(3),
                Some(4),
                Some(2),
                Some(2),
                Some(5),
                Some(1),
                None,
            ],
            [
                Some(1),
                Some(2),
                Some(3),
                Some(3),
                Some(2),
                Some(4),
                Some(4),
                Some(1),
                Some(2),
                Some(5),
                Some(1),
                None,
            ],
        ];
        let units: Vec<Vec<u8>> = (0..12)
            .map(|u| table.iter().filter_map(|row| row[u]).collect())
            .collect();
        let alpha = krippendorff_alpha_nominal(&units).unwrap();
        assert!((alpha - 0.743).abs() < 0.0005, "α = {alpha}");
    }

    /// Two coders, five units, by hand: values (a,a) (a,b) (b,b) (b,b) (a,a).
    /// Coincidences: o_aa = 4, o_bb = 4, o_ab = o_ba = 1; n_a = n_b = 5, n = 10.
    /// D_o ∝ 2, D_e ∝ 2·5·5 / 9 → α = 1 − 9·2 / 50 = 0.64. Pairs agreeing: 4 of 5 → ppa 0.8.
    #[test]
    fn hand_computed_two_coder_example() {
        let units = vec![
            vec!['a', 'a'],
            vec!['a', 'b'],
            vec!['b', 'b'],
            vec!['b', 'b'],
            vec!['a', 'a'],
        ];
        assert!((krippendorff_alpha_nominal(&units).unwrap() - 0.64).abs() < 1e-12);
        assert!((pairwise_percent_agreement(&units).unwrap() - 0.8).abs() < 1e-12);
    }

    /// Three coders on one unit (x,x,y) and two on another (y,y): pairs 1 of 3 and 1 of 1 agree →
    /// ppa = 2/4. Coincidences: unit 1 gives o_xx = 1, o_xy = o_yx = 1; unit 2 gives o_yy = 2.
    /// n_x = 2, n_y = 3, n = 5 → α = 1 − 4·2 / (2·2·3) = 1/3.
    #[test]
    fn hand_computed_unequal_coders() {
        let units = vec![vec!['x', 'x', 'y'], vec!['y', 'y'], vec!['x']];
        assert!((krippendorff_alpha_nominal(&units).unwrap() - 1.0 / 3.0).abs() < 1e-12);
        assert!((pairwise_percent_agreement(&units).unwrap() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn undefined_cases() {
        assert_eq!(krippendorff_alpha_nominal::<u8>(&[]), None);
        assert_eq!(krippendorff_alpha_nominal(&[vec![1], vec![2]]), None);
        assert_eq!(krippendorff_alpha_nominal(&[vec![1, 1], vec![1, 1]]), None);
        assert_eq!(pairwise_percent_agreement(&[vec![1, 1]]), Some(1.0));
        let perfect = vec![vec![1, 1], vec![2, 2], vec![3, 3]];
        assert_eq!(krippendorff_alpha_nominal(&perfect), Some(1.0));
    }

    #[test]
    fn timestamps_round_trip_with_the_store_format() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00.000Z"), Some(0.0));
        assert_eq!(
            parse_timestamp("2026-11-22T02:21:36.500Z"),
            Some(1_795_314_096.5)
        );
        assert_eq!(parse_timestamp("2000-02-29T00:00:00Z"), Some(951_782_400.0));
        assert_eq!(parse_timestamp("2000-02-29 00:00:00"), None);
        let now = afkit_store::now();
        let t = parse_timestamp(&now).unwrap();
        assert!(t > 1.7e9);
    }

    #[test]
    fn rate_counts_time_on_items_and_skips_breaks() {
        let at = |s: &str| format!("2026-01-01T10:{s}.000Z");
        // Gaps: 30 s, 30 s, then a one-hour break (capped at 10 minutes).
        let items = vec![
            (at("00:00"), None),
            (at("00:30"), None),
            (at("01:00"), None),
        ];
        assert_eq!(items_per_hour(&items), Some(2.0 * 3600.0 / 60.0));
        let with_seconds = vec![(at("00:00"), Some(20.0)), (at("00:30"), Some(40.0))];
        assert_eq!(items_per_hour(&with_seconds), Some(2.0 * 3600.0 / 60.0));
        assert_eq!(items_per_hour(&[(at("00:00"), None)]), None);
    }

    fn submission(
        task: i64,
        who: &str,
        ranks: [Option<Rank>; 3],
        labels: [Judgement; 3],
    ) -> SubmissionRecord {
        SubmissionRecord {
            submission_id: 0,
            task_id: task,
            example_id: task,
            annotator: who.into(),
            broken: false,
            seconds: Some(30.0),
            submitted_at: "2026-01-01T10:00:00.000Z".into(),
            in_terminal: true,
            labels: (0..3)
                .map(|i| {
                    (
                        EndingLabel {
                            ending_id: task * 10 + i as i64,
                            judgement: labels[i],
                            rank: ranks[i],
                        },
                        i == 0,
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn report_on_a_small_fixture() {
        use Judgement::*;
        let (b, s) = (Some(Rank::Best), Some(Rank::Second));
        let subs = vec![
            submission(1, "ann", [b, s, None], [Likely, Likely, Gibberish]),
            submission(1, "bob", [b, None, s], [Likely, Unlikely, Likely]),
            submission(2, "ann", [None, b, s], [Unlikely, Likely, Likely]),
        ];
        let r = report(&subs);
        assert_eq!(r.items, 1);
        // Task 1 units: rank (B,B) (S,N) (N,S): 1 of 3 pairs agree; labels (L,L) (L,U) (G,L): 1 of 3.
        assert!((r.ppa_rank.unwrap() - 1.0 / 3.0).abs() < 1e-12);
        assert!((r.ppa_label.unwrap() - 1.0 / 3.0).abs() < 1e-12);
        // Found endings (position 0): B, B, N → best 2/3, neither 1/3; likely 2/3, unlikely 1/3.
        assert_eq!(r.distribution.found.n, 3);
        assert!((r.distribution.found.best - 2.0 / 3.0).abs() < 1e-12);
        assert!((r.distribution.generated.gibberish - 1.0 / 6.0).abs() < 1e-12);
        assert!((r.found_top2_rate.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        let ann = &r.annotators[0];
        assert_eq!(
            (ann.annotator.as_str(), ann.items, ann.shared_items),
            ("ann", 2, 1)
        );
        assert_eq!(ann.found_top2_rate, Some(0.5));
        // The found ending ranked best in 2 of 3 submissions; "ann" got 1 of 2 right.
        let human = r.human_accuracy.as_ref().unwrap();
        assert_eq!((human.correct, human.submissions), (2, 3));
        assert_eq!(human.endings_shown, (3, 3));
        assert!(human.low < 2.0 / 3.0 && 2.0 / 3.0 < human.high);
        assert_eq!(ann.accuracy, Some(0.5));
        let text = render(&r);
        assert!(text.contains("Second best"), "{text}");
        assert!(
            text.contains("Human accuracy (found ending ranked best among 3 endings): 66.7%"),
            "{text}"
        );
    }

    #[test]
    fn no_labelled_submission_has_no_human_accuracy() {
        let mut broken = submission(1, "ann", [None; 3], [Judgement::Likely; 3]);
        (broken.broken, broken.labels) = (true, Vec::new());
        let r = report(&[broken]);
        assert_eq!(r.human_accuracy, None);
        assert!(render(&r).contains("Human accuracy (found ending ranked best): –"));
    }

    /// Reference values worked out separately from Wilson's (1927) closed form, to four places.
    #[test]
    fn wilson_interval_matches_the_reference() {
        let close = |(a, b): (f64, f64), (x, y): (f64, f64)| {
            assert!((a - x).abs() < 5e-5 && (b - y).abs() < 5e-5, "{a} {b}");
        };
        close(wilson_interval(28, 30), (0.7868, 0.9815));
        close(wilson_interval(0, 10), (0.0, 0.2775));
        close(wilson_interval(10, 10), (0.7225, 1.0));
        close(wilson_interval(5, 10), (0.2366, 0.7634));
    }

    #[test]
    fn an_annotator_far_below_the_rest_is_flagged() {
        use Judgement::*;
        let (b, s) = (Some(Rank::Best), Some(Rank::Second));
        let mut subs = Vec::new();
        for task in 0..12 {
            for who in ["a", "b", "c"] {
                subs.push(submission(
                    task,
                    who,
                    [b, s, None],
                    [Likely, Likely, Unlikely],
                ));
            }
            // "d" never puts the found ending in the top two and disagrees on ranks.
            subs.push(submission(
                task,
                "d",
                [None, b, s],
                [Likely, Likely, Unlikely],
            ));
        }
        let r = report(&subs);
        let flagged: Vec<&str> = r
            .annotators
            .iter()
            .filter(|a| a.flagged)
            .map(|a| a.annotator.as_str())
            .collect();
        assert_eq!(flagged, ["d"]);
        let d = r.annotators.iter().find(|a| a.annotator == "d").unwrap();
        assert!(d
            .flag_reasons
            .iter()
            .any(|r| r.starts_with("found ending in top two")));
        assert!(d
            .flag_reasons
            .iter()
            .any(|r| r.starts_with("rank agreement")));
        assert!(!d
            .flag_reasons
            .iter()
            .any(|r| r.starts_with("label agreement")));
    }
}
