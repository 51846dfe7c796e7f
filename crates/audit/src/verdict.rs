//! What the audit's numbers mean, in plain words: the measured rows (baselines and language
//! models) side by side with a control dataset's where one was audited with it (`--control`,
//! typically the same export with random negatives), and one verdict per family of baselines.
//!
//! Every row stands somewhere against chance (0.25): off chance when it is further away than its
//! family's bar, in either direction; otherwise at chance, or "too few questions to tell" when
//! its interval is so wide that a sizeable artifact could hide in it. The bar is two standard
//! errors for a family's only row and rises with the family's rows (Bonferroni, [`Standing::of`]):
//! on relabelled copies of a 150-question export, with nothing to find, one of the nine style
//! rows strayed beyond two standard errors in more than a quarter of them, and a verdict that
//! calls that an artifact misleads. A family's verdict leads with its best row when that is
//! above chance, and names every other row off chance: a row far below chance is as telling as
//! one above it (the real ending is the one it avoids). Fixed rules (the shortest or longest
//! ending) learn nothing, so their verdict speaks of the endings, not of what the rule learned.

use serde::Serialize;

/// Accuracy of a uniform guess among four options.
pub(crate) const CHANCE: f64 = 0.25;

/// The fine-tuned discriminator's row, wherever the cross-validation measures one.
pub(crate) const FINE_TUNED_BASELINE: &str = "finetune_minilm";

/// The prefix of a language model's rows: `lm:MODEL:acc` and `lm:MODEL:acc_norm`, and the same
/// with [`NO_CONTEXT_SUFFIX`] for the endings read alone.
pub(crate) const LM_PREFIX: &str = "lm:";

/// The suffix of a language model's rows that read the endings without their context.
pub(crate) const NO_CONTEXT_SUFFIX: &str = "_no_context";

/// Kinds of evidence a benchmark can be answered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvidenceKind {
    /// An ending's own words, characters, length or embedding.
    Style,
    /// How an ending relates to its context and to the other endings.
    Relational,
    /// A language model's likelihood of the ending, zero-shot.
    LmZeroShot,
    /// A language model's likelihood of the ending read without its context: the endings alone.
    EndingsAlone,
    /// A discriminator fine-tuned on the benchmark's own training folds.
    FineTuned,
}

impl EvidenceKind {
    pub(crate) const ALL: [EvidenceKind; 5] = [
        EvidenceKind::Style,
        EvidenceKind::Relational,
        EvidenceKind::LmZeroShot,
        EvidenceKind::EndingsAlone,
        EvidenceKind::FineTuned,
    ];

    /// The family of a row, by its name.
    pub(crate) fn of(row: &str) -> EvidenceKind {
        match row {
            "relational" => EvidenceKind::Relational,
            FINE_TUNED_BASELINE => EvidenceKind::FineTuned,
            lm if lm.starts_with(LM_PREFIX) && lm.ends_with(NO_CONTEXT_SUFFIX) => {
                EvidenceKind::EndingsAlone
            }
            lm if lm.starts_with(LM_PREFIX) => EvidenceKind::LmZeroShot,
            _ => EvidenceKind::Style,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            EvidenceKind::Style => "style",
            EvidenceKind::Relational => "relational",
            EvidenceKind::LmZeroShot => "LM zero-shot",
            EvidenceKind::EndingsAlone => "LM without the context",
            EvidenceKind::FineTuned => "fine-tuned",
        }
    }

    /// What can pick the real ending when the family is above chance.
    fn answered_by(self) -> &'static str {
        match self {
            EvidenceKind::Style => "the real ending can be picked by its style alone",
            EvidenceKind::Relational => {
                "the real ending can be picked by how it relates to its context and the other endings"
            }
            EvidenceKind::LmZeroShot => {
                "a language model that never saw the benchmark picks the real ending"
            }
            EvidenceKind::EndingsAlone => {
                "a language model that reads the endings without their context picks the real \
                 ending: the endings alone give the answer away"
            }
            EvidenceKind::FineTuned => "a discriminator trained on the other folds picks the real ending",
        }
    }

    /// How to get the family measured when it is not.
    fn how_to_measure(self) -> &'static str {
        match self {
            EvidenceKind::Style => "no style baseline ran",
            EvidenceKind::Relational => "it runs under --cv",
            EvidenceKind::LmZeroShot | EvidenceKind::EndingsAlone => {
                "add --lm smollm2 or --lm MODEL.gguf"
            }
            EvidenceKind::FineTuned => {
                "it runs under --cv unless --no-finetune or --no-embed is given or MiniLM is absent"
            }
        }
    }
}

/// Rows that apply a fixed rule rather than a model trained on the benchmark.
const FIXED_RULES: [&str; 2] = ["shortest", "longest"];

/// The widest interval (two standard errors each side) within which "at chance" is a finding:
/// a row at chance with a wider one could hide an artifact of ten points or more.
pub(crate) const WIDEST_TELLING_INTERVAL: f64 = 0.10;

/// Where a row stands against chance.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Standing {
    /// More than two standard errors above chance.
    AboveChance,
    /// More than two standard errors below chance.
    BelowChance,
    /// Within two standard errors of chance, with a narrow enough interval.
    AtChance,
    /// Within two standard errors of chance, but the interval is too wide to say so.
    TooFewToTell,
}

impl Standing {
    /// Where a row at `mean ± se` stands, one of `rows` rows of its family. Off chance takes a
    /// distance from chance whose two-sided tail, times `rows`, is under that of two standard
    /// errors (4.55%): two standard errors for one row, 2.28 for two, 2.80 for nine. So a
    /// family whose rows all have nothing to find is called off chance about as rarely as a
    /// single row at two standard errors.
    pub(crate) fn of(mean: f64, se: f64, rows: usize) -> Standing {
        let errors = (mean - CHANCE).abs() / se;
        let two_se_tail = erfc(std::f64::consts::SQRT_2);
        if rows.max(1) as f64 * erfc(errors / std::f64::consts::SQRT_2) < two_se_tail {
            if mean > CHANCE {
                Standing::AboveChance
            } else {
                Standing::BelowChance
            }
        } else if 2.0 * se > WIDEST_TELLING_INTERVAL {
            Standing::TooFewToTell
        } else {
            Standing::AtChance
        }
    }

    pub fn words(self) -> &'static str {
        match self {
            Standing::AboveChance => "above chance",
            Standing::BelowChance => "below chance",
            Standing::AtChance => "at chance",
            Standing::TooFewToTell => "too few questions to tell",
        }
    }

    fn off_chance(self) -> bool {
        matches!(self, Standing::AboveChance | Standing::BelowChance)
    }
}

/// The complementary error function, erfc(x) = 1 − erf(x), to a relative error under 1.2e-7
/// (Numerical Recipes' Chebyshev fit): the two-sided tail of a normal at x·√2 standard errors.
/// NaN stays NaN, so a row of 0 ± 0 is never off chance.
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| c + t * acc);
    let tail = t * (-z * z + poly).exp();
    if x >= 0.0 {
        tail
    } else {
        2.0 - tail
    }
}

/// A mean and its standard error.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Measure {
    pub mean: f64,
    pub se: f64,
}

/// One measured row, with the control's where there is one.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    pub name: String,
    pub mean: f64,
    pub se: f64,
    /// Where the row stands against chance.
    pub standing: Standing,
    /// The same row on the control dataset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<Measure>,
    /// mean − control mean.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference: Option<f64>,
}

impl Row {
    pub(crate) fn new(name: impl Into<String>, mean: f64, se: f64) -> Row {
        Row {
            name: name.into(),
            mean,
            se,
            standing: Standing::of(mean, se, 1),
            control: None,
            difference: None,
        }
    }
}

/// One family's verdict.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Verdict {
    pub family: &'static str,
    /// The family's best row (absent when none was measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best: Option<String>,
    /// The verdict in words.
    pub text: String,
}

/// The rows with the control's beside them (matched by name), each standing at its family's
/// bar, and the verdicts.
pub(crate) fn judge(rows: Vec<Row>, control: Option<&[Row]>) -> (Vec<Row>, Vec<Verdict>) {
    let family_rows = |name: &str| {
        let family = EvidenceKind::of(name);
        rows.iter()
            .filter(|r| EvidenceKind::of(&r.name) == family)
            .count()
    };
    let sizes: Vec<usize> = rows.iter().map(|r| family_rows(&r.name)).collect();
    let rows: Vec<Row> = rows
        .into_iter()
        .zip(sizes)
        .map(|(mut row, family_size)| {
            row.standing = Standing::of(row.mean, row.se, family_size);
            let matched = control.and_then(|c| c.iter().find(|r| r.name == row.name));
            if let Some(c) = matched {
                row.control = Some(Measure {
                    mean: c.mean,
                    se: c.se,
                });
                row.difference = Some(row.mean - c.mean);
            }
            row
        })
        .collect();
    let verdicts = EvidenceKind::ALL.map(|f| verdict(f, &rows)).to_vec();
    (rows, verdicts)
}

fn verdict(family: EvidenceKind, rows: &[Row]) -> Verdict {
    let members: Vec<&Row> = rows
        .iter()
        .filter(|r| EvidenceKind::of(&r.name) == family)
        .collect();
    let Some(best) = members
        .iter()
        .copied()
        .max_by(|a, b| a.mean.total_cmp(&b.mean))
    else {
        return Verdict {
            family: family.name(),
            best: None,
            text: format!("not measured ({})", family.how_to_measure()),
        };
    };
    let of = if members.len() > 1 {
        format!(", the best of {}", members.len())
    } else {
        String::new()
    };
    let measured = format!("{} {:.3} ± {:.3}{of}", best.name, best.mean, best.se);
    // Every row off chance is named, in either direction; the best row leads when above.
    let mut off: Vec<&Row> = members
        .iter()
        .copied()
        .filter(|r| r.standing.off_chance() && !(r.name == best.name && r.mean > CHANCE))
        .collect();
    off.sort_by(|a, b| b.mean.total_cmp(&a.mean));
    let named: Vec<String> = off.iter().map(|r| off_chance_words(r)).collect();
    Verdict {
        family: family.name(),
        best: Some(best.name.clone()),
        text: verdict_text(family, best, &measured, &named),
    }
}

/// The verdict in words from the family's best row (`measured`: its figures) and the rows off
/// chance other than a best row above it (`named`, in words): how the best row stands, every
/// other row off chance, and the control's figures beside the best row's.
fn verdict_text(family: EvidenceKind, best: &Row, measured: &str, named: &[String]) -> String {
    let mut text = match best.standing {
        Standing::AboveChance => format!(
            "{:.1} points above chance: {} ({measured})",
            (best.mean - CHANCE) * 100.0,
            family.answered_by()
        ),
        _ if !named.is_empty() => format!("below chance: {}", named.join("; ")),
        Standing::TooFewToTell => format!(
            "too few questions to tell ({measured}): not off chance, but the interval (two \
             standard errors each side) is too wide to rule out an artifact"
        ),
        _ => format!("at chance ({measured})"),
    };
    if best.standing == Standing::AboveChance {
        for words in named {
            text.push_str(&format!("; {words}"));
        }
    } else if !named.is_empty() && best.standing != Standing::BelowChance {
        text.push_str(&format!("; best row {measured}, {}", best.standing.words()));
    }
    if let Some(c) = best.control {
        text.push_str(&format!(
            "; control {:.3} ± {:.3}, {}",
            c.mean,
            c.se,
            difference_words(best.mean, best.se, c)
        ));
    }
    text
}

/// A row off chance in words: by how much, and what that says. A row below chance picks a wrong
/// ending on purpose, so the real one is the ending it avoids; a fixed rule learned nothing, so
/// it is the endings themselves that give the real one away.
fn off_chance_words(row: &Row) -> String {
    let points = (row.mean - CHANCE) * 100.0;
    let head = format!(
        "{} {:.3} ± {:.3} is {:.1} points {} chance",
        row.name,
        row.mean,
        row.se,
        points.abs(),
        if points > 0.0 { "above" } else { "below" }
    );
    let meaning = match (points > 0.0, FIXED_RULES.contains(&row.name.as_str())) {
        (true, true) => format!("the real ending is often the {} of the four", row.name),
        (false, true) => format!(
            "the real ending is rarely the {} of the four, so length alone points away from it \
             (an inverse artifact)",
            row.name
        ),
        (true, false) => "it finds the real ending".to_string(),
        (false, false) if row.name.starts_with(LM_PREFIX) => {
            "the model finds the distractors likelier than the real ending (an inverse artifact)"
                .to_string()
        }
        (false, false) => "it learned to avoid the real ending (an inverse artifact)".to_string(),
    };
    format!("{head}: {meaning}")
}

/// The difference to the control in words, and whether it is beyond two combined standard errors.
fn difference_words(mean: f64, se: f64, control: Measure) -> String {
    let d = (mean - control.mean) * 100.0;
    let noise = if (mean - control.mean).abs() <= 2.0 * se.hypot(control.se) {
        " (within noise)"
    } else {
        ""
    };
    if d < 0.0 {
        format!("{:.1} points below the control{noise}", -d)
    } else {
        format!("{d:.1} points above the control{noise}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn texts(rows: Vec<Row>) -> Vec<String> {
        judge(rows, None).1.into_iter().map(|v| v.text).collect()
    }

    #[test]
    fn families_get_plain_verdicts_with_their_control() {
        let rows = vec![
            Row::new("ngram_end", 0.26, 0.01),
            Row::new("char_end", 0.27, 0.015),
            Row::new("relational", 0.443, 0.01),
            Row::new("lm:smollm2:acc", 0.10, 0.01),
        ];
        let control = [
            Row::new("char_end", 0.30, 0.01),
            Row::new("relational", 0.486, 0.01),
        ];
        let (rows, verdicts) = judge(rows, Some(&control));
        assert_eq!(rows[0].control, None);
        assert!((rows[2].difference.unwrap() + 0.043).abs() < 1e-12);
        let text: Vec<&str> = verdicts.iter().map(|v| v.text.as_str()).collect();
        assert!(text[0].starts_with("at chance (char_end 0.270 ± 0.015, the best of 2)"));
        assert!(
            text[0].ends_with("3.0 points below the control (within noise)"),
            "{}",
            text[0]
        );
        assert!(
            text[1].starts_with("19.3 points above chance: the real ending can be picked by how")
        );
        assert!(
            text[1].ends_with("4.3 points below the control"),
            "{}",
            text[1]
        );
        assert!(
            text[2].starts_with(
                "below chance: lm:smollm2:acc 0.100 ± 0.010 is 15.0 points below chance: the model \
                 finds the distractors"
            ),
            "{}",
            text[2]
        );
        assert_eq!(verdicts[3].best, None);
        assert!(text[3].starts_with("not measured"));
        assert_eq!(
            EvidenceKind::of(FINE_TUNED_BASELINE),
            EvidenceKind::FineTuned
        );
    }

    /// The zero-prompt rows are their own family: a model far above chance without the context
    /// says the endings give the answer away, whatever the rows with the context say.
    #[test]
    fn endings_read_alone_are_their_own_family() {
        assert_eq!(EvidenceKind::of("lm:smollm2:acc"), EvidenceKind::LmZeroShot);
        assert_eq!(
            EvidenceKind::of("lm:smollm2:acc_norm_no_context"),
            EvidenceKind::EndingsAlone
        );
        let rows = vec![
            Row::new("lm:smollm2:acc", 0.26, 0.01),
            Row::new("lm:smollm2:acc_no_context", 0.45, 0.01),
        ];
        let (_, verdicts) = judge(rows, None);
        let family = |f: EvidenceKind| verdicts.iter().find(|v| v.family == f.name()).unwrap();
        assert!(family(EvidenceKind::LmZeroShot)
            .text
            .starts_with("at chance"));
        let alone = &family(EvidenceKind::EndingsAlone).text;
        assert!(
            alone.starts_with("20.0 points above chance")
                && alone.contains("the endings alone give the answer away"),
            "{alone}"
        );
    }

    /// 2.5 standard errors from chance is off chance for a family's only row, not for one of
    /// nine (their bar is 2.80), and 2.9 is off chance for either; `judge` sets each row's bar
    /// by its family's size.
    #[test]
    fn the_bar_rises_with_the_rows_of_a_family() {
        let at = |errors: f64, rows| Standing::of(CHANCE + errors * 0.02, 0.02, rows);
        assert_eq!(at(2.5, 1), Standing::AboveChance);
        assert_eq!(at(-2.5, 1), Standing::BelowChance);
        assert_eq!(at(1.99, 1), Standing::AtChance);
        assert_eq!(at(2.01, 1), Standing::AboveChance);
        assert_eq!(at(2.5, 9), Standing::AtChance);
        assert_eq!(at(2.79, 9), Standing::AtChance);
        assert_eq!(at(2.81, 9), Standing::AboveChance);
        assert_eq!(at(2.27, 2), Standing::AtChance);
        assert_eq!(at(2.29, 2), Standing::AboveChance);
        let names = ["shortest", "longest", "ngram_end", "ngram_s2", "ngram_ctx"];
        let mut rows: Vec<Row> = names.iter().map(|n| Row::new(*n, 0.25, 0.02)).collect();
        rows[2].mean = 0.30;
        rows.push(Row::new("relational", 0.30, 0.02));
        let (rows, verdicts) = judge(rows, None);
        assert_eq!(
            rows[2].standing,
            Standing::AtChance,
            "one of five style rows"
        );
        assert_eq!(
            rows[5].standing,
            Standing::AboveChance,
            "the relational row alone"
        );
        assert!(verdicts[0]
            .text
            .starts_with("at chance (ngram_end 0.300 ± 0.020, the best of 5)"));
    }

    #[test]
    fn erfc_matches_known_values() {
        let known = [
            (0.0, 1.0),
            (0.5, 0.479_500_122),
            (1.0, 0.157_299_207),
            (std::f64::consts::SQRT_2, 0.045_500_264),
            (3.0, 2.209_049_7e-5),
            (-1.0, 1.842_700_793),
        ];
        for (x, want) in known {
            assert!(
                (erfc(x) - want).abs() <= 1.2e-7 * want,
                "erfc({x}) = {}",
                erfc(x)
            );
        }
        assert!(erfc(f64::NAN).is_nan());
    }

    /// Sixteen questions: 0.562 ± 0.157 is within two standard errors of chance, but nothing
    /// under ±31 points can be told from it.
    #[test]
    fn a_wide_interval_is_too_few_questions_to_tell_not_at_chance() {
        let text = &texts(vec![Row::new("char_s2", 0.562, 0.157)])[0];
        assert!(text.starts_with("too few questions to tell"), "{text}");
        assert!(!text.contains("at chance ("), "{text}");
        assert_eq!(Standing::of(0.562, 0.157, 1), Standing::TooFewToTell);
        assert_eq!(Standing::of(0.26, 0.02, 1), Standing::AtChance);
    }

    /// The demo's rows: shortest far below chance while the best style row is at chance.
    #[test]
    fn a_fixed_rule_far_below_chance_is_flagged_without_learning() {
        let text = &texts(vec![
            Row::new("shortest", 0.069, 0.019),
            Row::new("longest", 0.31, 0.02),
            Row::new("char_s2", 0.27, 0.02),
            Row::new("ngram_end", 0.088, 0.002),
        ])[0];
        assert!(
            text.starts_with("6.0 points above chance: the real ending can be picked by its style")
                && text.contains("(longest 0.310 ± 0.020, the best of 4)"),
            "{text}"
        );
        assert!(
            text.contains(
                "shortest 0.069 ± 0.019 is 18.1 points below chance: the real ending is rarely \
                 the shortest of the four"
            ),
            "{text}"
        );
        assert!(
            text.contains("ngram_end 0.088 ± 0.002 is 16.2 points below chance: it learned"),
            "{text}"
        );
        assert!(!text.contains("shortest 0.069 ± 0.019 is 18.1 points below chance: it learned"));
        let text = &texts(vec![
            Row::new("shortest", 0.069, 0.019),
            Row::new("char_s2", 0.27, 0.02),
        ])[0];
        assert!(
            text.starts_with("below chance: shortest 0.069 ± 0.019 is 18.1 points below")
                && text.ends_with("; best row char_s2 0.270 ± 0.020, the best of 2, at chance"),
            "{text}"
        );
    }

    /// On random rows: every row off chance is named in its family's verdict, a family is "at
    /// chance" only when every row is within two narrow standard errors, and no fixed rule is
    /// said to have learned.
    #[test]
    fn every_row_off_chance_is_named_and_at_chance_means_it() {
        let names = [
            "shortest",
            "longest",
            "char_s2",
            "ngram_end",
            "relational",
            "lm:m:acc",
            "lm:m:acc_norm",
            FINE_TUNED_BASELINE,
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for _ in 0..2000 {
            let mut rows = Vec::new();
            for name in names {
                if rng.random_bool(0.8) {
                    let (mean, se) = (rng.random_range(0.0..1.0), rng.random_range(0.0..0.2));
                    rows.push(Row::new(name, mean, se));
                }
            }
            let (rows, verdicts) = judge(rows, None);
            for (family, verdict) in EvidenceKind::ALL.iter().zip(&verdicts) {
                let members: Vec<&Row> = rows
                    .iter()
                    .filter(|r| EvidenceKind::of(&r.name) == *family)
                    .collect();
                for r in &members {
                    let named = format!("{} {:.3} ± {:.3}", r.name, r.mean, r.se);
                    if r.standing.off_chance() {
                        assert!(verdict.text.contains(&named), "{named} in {}", verdict.text);
                    }
                    let learned = format!("{named} is");
                    if FIXED_RULES.contains(&r.name.as_str()) {
                        let at = verdict.text.find(&learned);
                        assert!(
                            at.is_none_or(|i| !verdict.text[i..]
                                .split(';')
                                .next()
                                .unwrap()
                                .contains("learned")),
                            "{}",
                            verdict.text
                        );
                    }
                }
                if verdict.text.starts_with("at chance") {
                    assert!(members.iter().all(|r| r.standing == Standing::AtChance
                        || r.standing == Standing::TooFewToTell));
                    assert!(!members.iter().any(|r| r.standing.off_chance()));
                }
                if verdict.text.starts_with("too few questions to tell") {
                    let best = members.iter().max_by(|a, b| a.mean.total_cmp(&b.mean));
                    assert!(best.unwrap().se * 2.0 > WIDEST_TELLING_INTERVAL);
                }
            }
        }
    }
}
