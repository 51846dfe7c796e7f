//! What an export writes: which negatives, the seed of its shuffles, whether the test answers
//! stay in the folder, and its licence.

use afkit_engine::seed::Seed;

/// The export's settings, as recorded and as the card reports them.
#[derive(Debug, Clone)]
pub struct Options {
    pub negatives: Negatives,
    pub seed: Seed,
    /// Keep the test split's labels in the folder (internal use) instead of withholding them.
    pub with_test_labels: bool,
    pub license: String,
    /// The dataset's name in the card; absent, the project file's name without its extension.
    pub name: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Negatives {
    Adversarial,
    Random,
}

impl Negatives {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Negatives::Adversarial => "adversarial",
            Negatives::Random => "random",
        }
    }
}
