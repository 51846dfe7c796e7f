//! Where each file of an export lives, relative to the export folder, and which files a
//! published export leaves out (the test split's answers).

use afkit_store::dataset::Split;

/// afkit's split names and the names `datasets` and the evaluation harness use for them.
pub(crate) const HF_SPLITS: [(Split, &str); 3] = [
    (Split::Train, "train"),
    (Split::Val, "validation"),
    (Split::Test, "test"),
];

/// The dataset card, with the YAML header the Hugging Face Hub reads.
pub(crate) const CARD: &str = "README.md";

/// The folder of the lm-evaluation-harness task files.
pub(crate) const HARNESS_DIR: &str = "lm_eval";

/// The files of one export.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Keep the test split's labels in the folder (internal use) instead of withholding them.
    pub(crate) with_test_labels: bool,
    /// Which splits hold examples, indexed like [`Split::ALL`]: an empty split gets no files and
    /// no place in the card's configurations (a header-only file makes `load_dataset` fail).
    pub(crate) present: [bool; 3],
}

impl Layout {
    /// Every split present; [`Layout::with_present`] narrows it to the splits with examples.
    pub(crate) fn new(with_test_labels: bool) -> Layout {
        Layout {
            with_test_labels,
            present: [true; 3],
        }
    }

    /// This layout with only the splits for which `has_examples` holds.
    pub(crate) fn with_present(self, has_examples: impl Fn(Split) -> bool) -> Layout {
        Layout {
            present: Split::ALL.map(has_examples),
            ..self
        }
    }

    /// Whether `split` has files in the export.
    pub(crate) fn present(&self, split: Split) -> bool {
        self.present[split as usize]
    }

    /// The splits with files, with the names `datasets` and the harness use for them.
    pub(crate) fn hf_splits(&self) -> impl Iterator<Item = (Split, &'static str)> + '_ {
        HF_SPLITS
            .into_iter()
            .filter(|(split, _)| self.present(*split))
    }

    /// The regular SWAG CSV of `split` (named after afkit's split name).
    pub(crate) fn regular(&self, split: Split) -> String {
        split.regular_csv()
    }

    /// The full SWAG CSV of `split`.
    pub(crate) fn full(&self, split: Split) -> String {
        split.full_csv()
    }

    /// The JSONL of `split`, in its own folder so that the CSV configurations never match it.
    pub(crate) fn jsonl(&self, split: Split) -> String {
        format!("jsonl/{split}.jsonl")
    }

    /// Whether `split`'s labels are in the folder.
    pub(crate) fn labelled(&self, split: Split) -> bool {
        split != Split::Test || self.with_test_labels
    }

    /// Whether `split` has a full CSV: it names the gold ending, so not where labels are withheld
    /// (as in the SWAG release, whose full set has no test split).
    pub(crate) fn has_full(&self, split: Split) -> bool {
        self.labelled(split) && self.present(split)
    }
}
