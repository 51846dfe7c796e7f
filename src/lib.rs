//! afkit: build adversarial multiple-choice benchmarks, SWAG-style.
//!
//! Three layers, each naming only the ones below it (tests/layering.rs checks it): the command
//! line, one module per pipeline stage (stages hand data to each other only through the project
//! file), and the base modules the stages share, with [`store`] owning the project's SQLite
//! schema. See ARCHITECTURE.md for the data that flows between them.

// ---- The command line: flags, printing, progress bars and `--json`.

// One subcommand per stage: turns flags into a stage's config and prints its summary.
pub mod cli;

// ---- The pipeline stages, in the order a project runs them, then the two standalone tools.

// Load contexts with their found endings into the project (`ingest`).
pub mod ingest;
// Train one adapter of the generator per fold of the project's groups (`lm adapt`).
pub mod adapt;
// Sample candidate endings per context and store them with their LM features (`generate`).
pub mod generate;
// Adversarial Filtering with the stylistic ensemble (`filter`, `report`).
pub mod af;
// Human verification: the terminal UI, item assignment, agreement, crowd files (`annotate`).
pub mod annotate;
// Turn verified (or unverified) candidates into final examples and splits (`assemble`).
pub mod assemble;
// Write the assembled splits as a dataset folder (`export`).
pub mod export;
// Artifact baselines on any SWAG-format dataset, and grading of predictions (`audit`, `score`).
pub mod audit;
// Lightweight adversarial filtering of an existing labelled dataset (`aflite`).
pub mod aflite;

// ---- Base modules: what two stages share.

// The project store: one SQLite file, its schema, migrations and every query.
pub mod store;
// The dataset vocabulary: SWAG's columns, splits, annotation labels, the startphrase.
pub mod dataset;
// Which of a context's assigned negatives become its distractors (annotate and assemble).
pub mod distractors;
// "Could be right": which negatives a strong reader rates as likely as the found ending.
pub mod risk;
// The language-model engine: GGUF loading, the llama forward pass, tokenizer, sampling.
pub mod lm;
// Sentence embeddings with all-MiniLM-L6-v2.
pub mod embed;
// Word tokenisation, afkit's UPOS tagger and the sentence splitter.
pub mod text;
// The model cache in `$AFKIT_HOME` and the default models' downloads.
pub mod models;
// Where candle runs a command's models (`--device`, `--engine`).
pub mod device;
// Process-wide settings made before any other thread starts.
pub mod runtime;
// The one way a recorded seed becomes randomness.
pub mod seed;
// Folds by group (video): AF's held-out contexts and the audit's cross-validation.
pub mod folds;
// The one rule for every file afkit writes: never over its inputs or the project, never over a
// file it did not write unless told, always through a temporary file renamed into place.
pub mod output;
// Ctrl-C: stop after the current unit of work.
pub mod interrupt;
// PNG charts with a font shipped in the binary.
pub mod plot;
// Limited-memory BFGS for the linear models of AFLite and the audit.
pub mod lbfgs;
// Small vector kernels for hot loops that are not matrix products.
pub mod simd;
// Line numbers of CSV records as an editor shows them.
pub mod csv_lines;
// Error messages of the JSON readers, with the file position in their own terms.
pub mod json_errors;
