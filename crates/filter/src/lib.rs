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
    config::{Config, HoldOut},
    observer::{Observer, Silent, Timings},
    run, Summary,
};

/// Runs candle's CPU ops on the calling thread unless `CANDLE_NUM_THREADS` is set. The
/// ensemble's tensors are small (a few hundred rows by tens of channels), and candle hands every
/// elementwise op above a few thousand elements to a spin-waiting worker pool: on two cores the
/// hand-offs cost more than the arithmetic, several times more when other processes compete for
/// the cores (one ensemble iteration: 8.8 s on one thread, 65 s on two, under load). Training
/// uses the second core by running each batch as two halves on rayon's threads instead. Results
/// do not depend on the thread count. Call it from the command line's main thread before any
/// candle op, since candle sizes its pool once, on first use.
pub fn use_one_candle_thread() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}
