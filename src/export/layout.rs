//! Where each file of an export lives, relative to the export folder, and which files a
//! published export leaves out (the test split's answers).

use crate::dataset::Split;

/// afkit's split names and the names `datasets` and the evaluation harness use for them.
pub const HF_SPLITS: [(Split, &str); 3] = [
    (Split::Train, "train"),
    (Split::Val, "validation"),
    (Split::Test, "test"),
];

/// The dataset card, with the YAML header the Hugging Face Hub reads.
pub const CARD: &str = "README.md";

/// The folder of the lm-evaluation-harness task files.
pub const HARNESS_DIR: &str = "lm_eval";

/// The files of one export.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Keep the test split's labels in the folder (internal use) instead of withholding them.
    pub with_test_labels: bool,
}

impl Layout {
    /// The regular SWAG CSV of `split` (named after afkit's split name).
    pub fn regular(&self, split: Split) -> String {
        split.regular_csv()
    }

    /// The full SWAG CSV of `split`.
    pub fn full(&self, split: Split) -> String {
        split.full_csv()
    }

    /// The JSONL of `split`, in its own folder so that the CSV configurations never match it.
    pub fn jsonl(&self, split: Split) -> String {
        format!("jsonl/{split}.jsonl")
    }

    /// Whether `split`'s labels are in the folder.
    pub fn labelled(&self, split: Split) -> bool {
        split != Split::Test || self.with_test_labels
    }

    /// Whether `split` has a full CSV: it names the gold ending, so not where labels are withheld
    /// (as in the SWAG release, whose full set has no test split).
    pub fn has_full(&self, split: Split) -> bool {
        self.labelled(split)
    }
}
