//! When is an item's annotation complete? One rule for the terminal UI and for crowd imports:
//! every ending labelled, one best and one second best, different endings, neither gibberish.

use std::fmt;

use afkit_store::annotate::labels::EndingLabel;
use afkit_store::dataset::{Judgement, Rank};

/// Something that keeps an annotation from being submitted. Ending numbers are 1-based, as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    Unlabelled(Vec<usize>),
    NoBest,
    NoSecond,
    BestIsSecond,
    GibberishBest(usize),
    GibberishSecond(usize),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[usize]| {
            v.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Problem::Unlabelled(v) if v.len() == 1 => write!(f, "label ending {}", v[0]),
            Problem::Unlabelled(v) => write!(f, "label endings {}", list(v)),
            Problem::NoBest => write!(f, "pick the best"),
            Problem::NoSecond => write!(f, "pick the second best"),
            Problem::BestIsSecond => write!(f, "best and second must differ"),
            Problem::GibberishBest(n) => write!(f, "best ({n}) is gibberish"),
            Problem::GibberishSecond(n) => write!(f, "second ({n}) is gibberish"),
        }
    }
}

/// The problems of an annotation in progress (`judgements[i]` is ending `i + 1`'s label; `best`
/// and `second` are 0-based positions). Empty = complete.
pub(crate) fn problems(
    judgements: &[Option<Judgement>],
    best: Option<usize>,
    second: Option<usize>,
) -> Vec<Problem> {
    let mut out = Vec::new();
    let unlabelled: Vec<usize> = judgements
        .iter()
        .enumerate()
        .filter(|(_, j)| j.is_none())
        .map(|(i, _)| i + 1)
        .collect();
    if !unlabelled.is_empty() {
        out.push(Problem::Unlabelled(unlabelled));
    }
    let gibberish = |i: usize| judgements.get(i).copied().flatten() == Some(Judgement::Gibberish);
    match best {
        None => out.push(Problem::NoBest),
        Some(b) if gibberish(b) => out.push(Problem::GibberishBest(b + 1)),
        _ => {}
    }
    match second {
        None => out.push(Problem::NoSecond),
        Some(s) if gibberish(s) => out.push(Problem::GibberishSecond(s + 1)),
        _ => {}
    }
    if best.is_some() && best == second {
        out.push(Problem::BestIsSecond);
    }
    out
}

/// Renders problems as one line: "label endings 3, 5 · pick the second best".
pub(crate) fn describe(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(" · ")
}

/// The stored labels of a complete annotation; `ending_ids[i]` is the ending at position `i`.
/// Panics if the annotation has problems (check [`problems`] first).
pub(crate) fn labels(
    ending_ids: &[i64],
    judgements: &[Option<Judgement>],
    best: Option<usize>,
    second: Option<usize>,
) -> Vec<EndingLabel> {
    assert!(
        problems(judgements, best, second).is_empty(),
        "incomplete annotation"
    );
    ending_ids
        .iter()
        .zip(judgements)
        .enumerate()
        .map(|(i, (&ending_id, j))| EndingLabel {
            ending_id,
            judgement: j.expect("complete"),
            rank: if Some(i) == best {
                Some(Rank::Best)
            } else if Some(i) == second {
                Some(Rank::Second)
            } else {
                None
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Judgement::*;

    #[test]
    fn complete_annotations_have_no_problems() {
        let j = [Some(Likely), Some(Unlikely), Some(Gibberish)];
        assert!(problems(&j, Some(0), Some(1)).is_empty());
        let stored = labels(&[10, 11, 12], &j, Some(0), Some(1));
        assert_eq!(stored[0].rank, Some(Rank::Best));
        assert_eq!(stored[1].rank, Some(Rank::Second));
        assert_eq!(stored[2].rank, None);
    }

    #[test]
    fn each_rule_is_reported() {
        let j = [Some(Likely), None, Some(Gibberish), None];
        let p = problems(&j, Some(2), None);
        assert_eq!(
            p,
            [
                Problem::Unlabelled(vec![2, 4]),
                Problem::GibberishBest(3),
                Problem::NoSecond
            ]
        );
        assert_eq!(
            describe(&p),
            "label endings 2, 4 · best (3) is gibberish · pick the second best"
        );
        assert_eq!(
            problems(&[Some(Likely), Some(Likely)], Some(1), Some(1)),
            [Problem::BestIsSecond]
        );
    }
}
