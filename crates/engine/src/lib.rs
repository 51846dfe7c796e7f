//! afkit's engine: everything that runs a model or reads text, and nothing that knows of a
//! project. The store and the stages build on it; it can be used alone (score endings with a
//! GGUF model, embed sentences, tag words) without a project file.

// ---- Models.

// The language-model engine: GGUF loading, the llama forward pass, tokenizer, sampling.
pub mod lm;
// Sentence embeddings with all-MiniLM-L6-v2, and the same encoder as a cross-encoder.
pub mod embed;
// The model cache in `$AFKIT_HOME` and the default models' downloads.
pub mod models;
// Where candle runs a command's models (`--device`, `--engine`).
pub mod device;
// Process-wide settings made before any other thread starts.
pub mod runtime;

// ---- Text.

// Word tokenisation, afkit's UPOS tagger and the sentence splitter.
pub mod text;

// ---- Numerics.

// Small vector kernels for hot loops that are not matrix products.
pub mod simd;
// Limited-memory BFGS for the linear models of AFLite and the audit.
pub mod lbfgs;
// The one way a recorded seed becomes randomness.
pub mod seed;
// Folds by group (video): AF's held-out contexts and the audit's cross-validation.
pub mod folds;

// ---- Files and the process.

// The one rule for every file afkit writes: never over its inputs or the project, never over a
// file it did not write unless told, always through a temporary file renamed into place.
pub mod output;
// Ctrl-C: stop after the current unit of work.
pub mod interrupt;
// PNG charts with a font shipped in the binary.
pub mod plot;
// Line numbers of CSV records as an editor shows them.
pub mod csv_lines;
// Error messages of the JSON readers, with the file position in their own terms.
pub mod json_errors;

// ---- Tests.

// Models with random weights for the tests of this crate and the ones above.
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
