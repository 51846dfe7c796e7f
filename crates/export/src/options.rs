//! What an export writes: which negatives, the seed of its shuffles, its layout and licence.

use super::layout::Layout;
use afkit_engine::seed::Seed;

/// The export's settings, as recorded and as the card reports them.
#[derive(Debug, Clone)]
pub struct Options {
    pub negatives: Negatives,
    pub seed: Seed,
    pub layout: Layout,
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
