//! The language-model engine: GGUF loading, the llama forward pass and its CPU kernels, the
//! tokenizer, token sampling, the LM features the AF perplexity MLP reads and multiple-choice
//! scoring as lm-evaluation-harness does it (`choice`). It knows nothing of
//! projects: the `generate` stage drives it.

pub mod adapt;
pub mod adapter;
mod block;
pub(crate) mod cache;
pub mod choice;
pub(crate) mod config;
pub(crate) mod family;
#[cfg(test)]
mod family_tests;
pub mod features;
#[cfg(test)]
mod gemma3_tests;
pub mod linear;
pub(crate) mod llama;
#[cfg(test)]
mod llama_cpp_tests;
pub mod local;
pub mod model;
pub mod openai;
mod packed;
#[cfg(test)]
mod peft_tests;
pub mod sampler;
mod tensor_ops;
#[cfg(test)]
mod tests;
pub mod tokenizer;
