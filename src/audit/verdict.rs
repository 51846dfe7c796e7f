//! What the audit's numbers mean, in plain words: the measured rows (baselines and language
//! models) side by side with a control dataset's where one was audited with it (`--control`,
//! typically the same export with random negatives), and one verdict per family of baselines.
//!
//! A family is at chance when its best row is within two standard errors of 0.25; otherwise the
//! verdict says by how many points, and what can therefore pick the real ending. The best of
//! several rows is picked after the fact, so a family with many rows leans a little high: the
//! verdict names how many rows it chose from. A row far below chance is named too: it has learned
//! to avoid the real ending, an artifact as telling as one that finds it.

use serde::Serialize;

/// Accuracy of a uniform guess among four options.
pub const CHANCE: f64 = 0.25;

/// The fine-tuned discriminator's row, wherever the cross-validation measures one.
pub const FINE_TUNED_BASELINE: &str = "finetune_minilm";

/// The prefix of a language model's rows: `lm:MODEL:acc` and `lm:MODEL:acc_norm`.
pub const LM_PREFIX: &str = "lm:";

/// Kinds of evidence a benchmark can be answered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// An ending's own words, characters, length or embedding.
    Style,
    /// How an ending relates to its context and to the other endings.
    Relational,
    /// A language model's likelihood of the ending, zero-shot.
    LmZeroShot,
    /// A discriminator fine-tuned on the benchmark's own training folds.
    FineTuned,
}

impl Family {
    pub const ALL: [Family; 4] = [
        Family::Style,
        Family::Relational,
        Family::LmZeroShot,
        Family::FineTuned,
    ];

    /// The family of a row, by its name.
    pub fn of(row: &str) -> Family {
        match row {
            "relational" => Family::Relational,
            FINE_TUNED_BASELINE => Family::FineTuned,
            lm if lm.starts_with(LM_PREFIX) => Family::LmZeroShot,
            _ => Family::Style,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Style => "style",
            Family::Relational => "relational",
            Family::LmZeroShot => "LM zero-shot",
            Family::FineTuned => "fine-tuned",
        }
    }

    /// What can pick the real ending when the family is above chance.
    fn answered_by(self) -> &'static str {
        match self {
            Family::Style => "the real ending can be picked by its style alone",
            Family::Relational => {
                "the real ending can be picked by how it relates to its context and the other endings"
            }
            Family::LmZeroShot => {
                "a language model that never saw the benchmark picks the real ending"
            }
            Family::FineTuned => "a discriminator trained on the other folds picks the real ending",
        }
    }

    /// How to get the family measured when it is not.
    fn how_to_measure(self) -> &'static str {
        match self {
            Family::Style => "no style baseline ran",
            Family::Relational => "it runs under --cv",
            Family::LmZeroShot => "add --lm smollm2 or --lm MODEL.gguf",
            Family::FineTuned => {
                "it runs under --cv unless --no-finetune or --no-embed is given or MiniLM is absent"
            }
        }
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
    /// The same row on the control dataset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<Measure>,
    /// mean − control mean.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference: Option<f64>,
}

impl Row {
    pub fn new(name: impl Into<String>, mean: f64, se: f64) -> Row {
        Row {
            name: name.into(),
            mean,
            se,
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

/// The rows with the control's beside them (matched by name), and the verdicts.
pub fn judge(rows: Vec<Row>, control: Option<&[Row]>) -> (Vec<Row>, Vec<Verdict>) {
    let rows: Vec<Row> = rows
        .into_iter()
        .map(|mut row| {
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
    let verdicts = Family::ALL.map(|f| verdict(f, &rows)).to_vec();
    (rows, verdicts)
}

fn verdict(family: Family, rows: &[Row]) -> Verdict {
    let members: Vec<&Row> = rows
        .iter()
        .filter(|r| Family::of(&r.name) == family)
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
    let points = (best.mean - CHANCE) * 100.0;
    let standing = if (best.mean - CHANCE).abs() <= 2.0 * best.se {
        "at chance".to_string()
    } else if points > 0.0 {
        format!("{points:.1} points above chance: {}", family.answered_by())
    } else {
        format!(
            "{:.1} points below chance: its signal points away from the real ending",
            -points
        )
    };
    let of = if members.len() > 1 {
        format!(", the best of {}", members.len())
    } else {
        String::new()
    };
    let mut text = format!(
        "{standing} ({} {:.3} ± {:.3}{of})",
        best.name, best.mean, best.se
    );
    // A row far below chance is a signal too: it picks a wrong ending on purpose, so the
    // real one is the ending it avoids.
    let lowest = members
        .iter()
        .copied()
        .min_by(|a, b| a.mean.total_cmp(&b.mean))
        .filter(|low| low.name != best.name && CHANCE - low.mean > 2.0 * low.se);
    if let Some(low) = lowest {
        text.push_str(&format!(
            "; but {} {:.3} ± {:.3} is {:.1} points below chance: it learned to avoid the real \
             ending (an inverse artifact)",
            low.name,
            low.mean,
            low.se,
            (CHANCE - low.mean) * 100.0
        ));
    }
    if let Some(c) = best.control {
        text.push_str(&format!(
            "; control {:.3} ± {:.3}, {}",
            c.mean,
            c.se,
            difference_words(best.mean, best.se, c)
        ));
    }
    Verdict {
        family: family.name(),
        best: Some(best.name.clone()),
        text,
    }
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
        let (_, inverse) = judge(
            vec![
                Row::new("shortest", 0.25, 0.02),
                Row::new("ngram_end", 0.088, 0.002),
            ],
            None,
        );
        assert!(
            inverse[0]
                .text
                .ends_with("but ngram_end 0.088 ± 0.002 is 16.2 points below chance: it learned to avoid the real ending (an inverse artifact)"),
            "{}",
            inverse[0].text
        );
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
            text[2].starts_with("15.0 points below chance"),
            "{}",
            text[2]
        );
        assert_eq!(verdicts[3].best, None);
        assert!(text[3].starts_with("not measured"));
        assert_eq!(Family::of(FINE_TUNED_BASELINE), Family::FineTuned);
    }
}
