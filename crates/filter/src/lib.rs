//! Adversarial Filtering (SWAG Algorithm 1) with the stylistic ensemble.
//!
//! Data flow: `Store::for_each_pool_context` (contexts with complete pools, streamed) →
//! [`data::Dataset`] (standardised LM features; tokens, tags and vocabularies when the run has an
//! ensemble phase) → per iteration
//! [`run`]: split, [`train::train`] a fresh [`model::StylisticModel`], score the held-out pools,
//! [`algorithm::choose_swaps`], commit → final cross-fitted pass → `af_folds`, `af_scores`.
//! [`report`] reads the stored iterations back for the plot, the markdown and the JSON.

mod adamw;
mod algorithm;
mod bags;
mod bilstm;
mod data;
mod discriminator;
pub mod fluency;
mod gates;
mod model;
pub mod report;
mod run;
mod scorer;
pub mod settings;
#[cfg(test)]
mod tests;
mod train;
mod windows;

pub use run::{
    config::{Config, HeldOutTurns, HoldOut},
    observer::{Observer, Silent, Timings},
    run, Summary,
};
