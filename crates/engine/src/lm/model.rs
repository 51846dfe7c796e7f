//! A whole language model from one GGUF file: weights, tokenizer and the document-start prefix.

use std::fs::File;
use std::io::{BufReader, Cursor, Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Content;
use sha2::{Digest, Sha256};

use super::adapter::Adapter;
use super::cache::Prefix;
use super::llama::Llama;
use super::tokenizer::GgufTokenizer;
use crate::device::Compute;

pub struct LanguageModel {
    pub(crate) llama: Llama,
    pub tokenizer: GgufTokenizer,
    pub path: PathBuf,
    /// Keys and values of the document-start token alone: the prefix for scoring endings
    /// without their context.
    pub(crate) doc_prefix: Prefix,
}

impl LanguageModel {
    /// Loads a GGUF file of one of the engine's families onto the CPU, run by afkit's kernels.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_on(path, &Compute::cpu())
    }

    /// Loads a GGUF file of one of the engine's families, dequantising its weights to f32, onto
    /// `compute`'s device.
    pub fn load_on(path: &Path, compute: &Compute) -> Result<Self> {
        Self::load_adapted(path, compute, None)
    }

    /// Loads a GGUF file with an adapter's updates merged into its weights.
    pub(crate) fn load_adapted(
        path: &Path,
        compute: &Compute,
        adapter: Option<&Adapter>,
    ) -> Result<Self> {
        let (content, tokenizer, mut reader) = read_header(path)?;
        Self::from_parts(content, tokenizer, &mut reader, path, (compute, adapter))
    }

    /// [`LanguageModel::load_adapted`] from a file already in memory: a model with one adapter
    /// per fold reads and hashes its file once, however many folds it loads.
    pub fn load_adapted_from(
        file: &ModelFile,
        compute: &Compute,
        adapter: Option<&Adapter>,
    ) -> Result<Self> {
        let mut reader = Cursor::new(file.bytes.as_slice());
        let (content, tokenizer) = read_header_from(&mut reader, &file.path, file.bytes.len())?;
        Self::from_parts(
            content,
            tokenizer,
            &mut reader,
            &file.path,
            (compute, adapter),
        )
    }

    /// Multiply-adds ×2 of one token's forward pass through the weight matrices (attention
    /// scores excluded): the yardstick for GFLOP/s figures.
    pub fn flops_per_token(&self) -> f64 {
        self.llama.cfg.flops_per_token()
    }

    /// The model from a parsed header and a reader of its file's weights.
    fn from_parts<R: Read + Seek>(
        content: Content,
        tokenizer: GgufTokenizer,
        reader: &mut R,
        path: &Path,
        (compute, adapter): (&Compute, Option<&Adapter>),
    ) -> Result<Self> {
        let llama = Llama::from_gguf(&content, reader, path, compute, adapter)
            .with_context(|| format!("cannot load the weights of {}", path.display()))?;
        if tokenizer.vocab_size() != llama.cfg.vocab {
            bail!(
                "{}: the tokenizer has {} tokens but the embedding matrix {} rows",
                path.display(),
                tokenizer.vocab_size(),
                llama.cfg.vocab
            );
        }
        let doc_prefix = llama.prefix(&[tokenizer.doc_start])?;
        Ok(LanguageModel {
            llama,
            tokenizer,
            path: path.to_path_buf(),
            doc_prefix,
        })
    }
}

/// A GGUF file read into memory, with its SHA-256: what `generate` loads every fold's model from.
pub struct ModelFile {
    pub path: PathBuf,
    bytes: Vec<u8>,
    pub sha256: String,
}

impl ModelFile {
    pub fn read(path: &Path) -> Result<ModelFile> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read model file {}", path.display()))?;
        let sha256 = crate::models::hex(&Sha256::digest(&bytes));
        Ok(ModelFile {
            path: path.to_path_buf(),
            bytes,
            sha256,
        })
    }
}

/// Reads a GGUF file's header (metadata and tensor index), checks that the file holds every
/// tensor it lists, and builds the tokenizer it describes. Returns the reader, positioned for
/// the weights.
pub fn read_header(path: &Path) -> Result<(Content, GgufTokenizer, BufReader<File>)> {
    let file =
        File::open(path).with_context(|| format!("cannot open model file {}", path.display()))?;
    let file_len = file.metadata()?.len() as usize;
    let mut reader = BufReader::new(file);
    let (content, tokenizer) = read_header_from(&mut reader, path, file_len)?;
    Ok((content, tokenizer, reader))
}

/// [`read_header`] from any reader of a file of `file_len` bytes (`path` names it in errors).
fn read_header_from<R: Read + Seek>(
    reader: &mut R,
    path: &Path,
    file_len: usize,
) -> Result<(Content, GgufTokenizer)> {
    let content = Content::read(reader).with_context(|| {
        format!(
            "{} is not a readable GGUF file (truncated or corrupt header)",
            path.display()
        )
    })?;
    check_complete(&content, path, file_len as u64)?;
    let tokenizer = GgufTokenizer::from_gguf(&content)
        .with_context(|| format!("cannot build the tokenizer of {}", path.display()))?;
    Ok((content, tokenizer))
}

/// Fails with the sizes involved when the file ends before its last tensor does.
fn check_complete(content: &Content, path: &Path, file_len: u64) -> Result<()> {
    let needed = content
        .tensor_infos
        .values()
        .map(|t| {
            let bytes = t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size();
            content.tensor_data_offset + t.offset + bytes as u64
        })
        .max()
        .unwrap_or(0);
    if file_len < needed {
        bail!(
            "{} is truncated: its tensors need {needed} bytes but the file has {file_len} \
             (re-download it, e.g. `afkit models fetch smollm2`)",
            path.display()
        );
    }
    Ok(())
}
