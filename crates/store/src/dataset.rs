//! The dataset vocabulary every stage shares: SWAG's column lists, the three splits, an
//! annotator's labels of an ending, the startphrase, and the seed derivation of per-example
//! shuffles. Readers (ingest), writers (export) and the stages between them take these from here,
//! so a file afkit writes is one it reads back.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Error, Result};

/// Column order of SWAG's regular CSV after its leading index column. The release's regular files
/// begin with an unnamed column holding the row number, and the public `swag` loader reads them by
/// position (`video-id` is field 1), so afkit writes that column too.
pub const REGULAR_COLUMNS: [&str; 11] = [
    "video-id",
    "fold-ind",
    "startphrase",
    "sent1",
    "sent2",
    "gold-source",
    "ending0",
    "ending1",
    "ending2",
    "ending3",
    "label",
];

/// The column afkit's regular CSVs add after SWAG's [`REGULAR_COLUMNS`]: 1 when a distractor
/// of the unverified question could be right too (see `crate::risk`), else 0. Last, so readers
/// that go by position still find SWAG's fields where the release has them.
pub const COULD_BE_RIGHT_COLUMN: &str = "could-be-right";

/// Column order of SWAG's full CSV, as in the release (no index column; `sent1` and `sent2` last).
pub const FULL_COLUMNS: [&str; 16] = [
    "video-id",
    "fold-ind",
    "startphrase",
    "gold-ending",
    "distractor-0",
    "distractor-1",
    "distractor-2",
    "distractor-3",
    "gold-source",
    "gold-type",
    "distractor-0-type",
    "distractor-1-type",
    "distractor-2-type",
    "distractor-3-type",
    "sent1",
    "sent2",
];

/// The split an example belongs to; every example of a group (video) is in the same one.
/// Declared in the order of [`Split::ALL`], so `split as usize` indexes per-split arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Split {
    Train,
    Val,
    Test,
}

impl Split {
    /// Every split, in the order of `--split` fractions, summaries and exported files.
    pub const ALL: [Split; 3] = [Split::Train, Split::Val, Split::Test];

    /// The name stored in the project and used in file names.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
            Split::Test => "test",
        }
    }

    /// The split's regular SWAG CSV in an export folder (`train.csv`, ...).
    pub fn regular_csv(self) -> String {
        format!("{self}.csv")
    }

    /// The split's full SWAG CSV in an export folder (`train_full.csv`, ...).
    pub fn full_csv(self) -> String {
        format!("{self}_full.csv")
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Split {
    type Err = Error;

    fn from_str(text: &str) -> Result<Split> {
        match Split::ALL.into_iter().find(|s| s.as_str() == text) {
            Some(split) => Ok(split),
            None => bail!("unknown split {text:?}: expected train, val or test"),
        }
    }
}

/// An annotator's judgement of one ending (SWAG Figure 3): what annotate records and assemble
/// counts, and the `*-type` columns of the full CSVs. Declared from most to least usable, so a
/// vote counts toward every judgement at or above it in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Judgement {
    Likely,
    Unlikely,
    Gibberish,
}

impl Judgement {
    /// The name stored in the project and written in the full CSVs.
    pub fn as_str(self) -> &'static str {
        match self {
            Judgement::Likely => "likely",
            Judgement::Unlikely => "unlikely",
            Judgement::Gibberish => "gibberish",
        }
    }

    /// Parses the stored name, case-insensitively; also accepts the UI's keys `l`, `u`, `g`.
    pub fn parse(text: &str) -> Option<Judgement> {
        match text.trim().to_ascii_lowercase().as_str() {
            "likely" | "l" => Some(Judgement::Likely),
            "unlikely" | "u" => Some(Judgement::Unlikely),
            "gibberish" | "g" => Some(Judgement::Gibberish),
            _ => None,
        }
    }
}

/// The best or second-best mark an annotator gives one ending of an item; an ending without one
/// (`None` where a rank is an `Option<Rank>`) is neither, which orders below both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rank {
    Second,
    Best,
}

impl Rank {
    /// The name stored in the project.
    pub fn as_str(self) -> &'static str {
        match self {
            Rank::Best => "best",
            Rank::Second => "second",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Rank> {
        match text {
            "best" => Some(Rank::Best),
            "second" => Some(Rank::Second),
            _ => None,
        }
    }
}

/// The full context a language model continues and a SWAG reader sees: `sent1 + " " + sent2`
/// (just `sent1` when the second sentence has no words before its ending).
pub fn startphrase(sent1: &str, sent2: &str) -> String {
    if sent2.is_empty() {
        sent1.to_string()
    } else {
        format!("{sent1} {sent2}")
    }
}

/// The fold of a group when a project's groups are dealt into `folds` parts (adapting the
/// generator: fold k's contexts are generated by the adapter that never read fold k). Fixed by
/// the seed and the group's name alone, so every stage that asks gets the same answer.
pub fn group_fold(seed: afkit_engine::seed::Seed, group: &str, folds: usize) -> usize {
    let drawn = seed.key(afkit_engine::seed::Key::Fold(group));
    (drawn.value() % folds.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_round_trip_through_their_names() {
        for split in Split::ALL {
            assert_eq!(split.as_str().parse::<Split>().unwrap(), split);
        }
        assert!("validation".parse::<Split>().is_err());
        assert_eq!(Split::Val.to_string(), "val");
    }

    #[test]
    fn split_files_are_named_after_their_split() {
        assert_eq!(Split::Val.regular_csv(), "val.csv");
        assert_eq!(Split::Test.full_csv(), "test_full.csv");
    }

    #[test]
    fn startphrase_joins_with_one_space() {
        assert_eq!(startphrase("A man waves.", "He"), "A man waves. He");
        assert_eq!(startphrase("A man waves.", ""), "A man waves.");
    }
}
