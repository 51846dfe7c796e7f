//! afkit: build adversarial multiple-choice benchmarks, SWAG-style.
//!
//! One module per pipeline stage over the [`store`] module that owns the project's SQLite schema.
//! See ARCHITECTURE.md for the data that flows between them.

pub mod adapt;
pub mod af;
pub mod aflite;
pub mod annotate;
pub mod assemble;
pub mod audit;
pub mod cli;
pub mod csv_lines;
pub mod dataset;
pub mod device;
pub mod distractors;
pub mod embed;
pub mod export;
pub mod generate;
pub mod ingest;
pub mod interrupt;
pub mod json_errors;
pub mod lbfgs;
pub mod lm;
pub mod models;
pub mod output;
pub mod plot;
pub mod progress;
pub mod runtime;
pub mod seed;
pub mod simd;
pub mod store;
pub mod text;
