//! The tokenizer of a GGUF file, rebuilt from its metadata with the `tokenizers` crate, so that
//! one `.gguf` file is a whole model. Two kinds of vocabulary are read:
//!
//! - byte-level BPE (`tokenizer.ggml.model = "gpt2"`: SmolLM2, Llama 3, Qwen 2 and 3), below;
//! - SentencePiece BPE (`tokenizer.ggml.model = "llama"`: Gemma, Llama 2), where spaces become
//!   `▁`, no pre-tokenizer splits the text, pieces merge by their scores (the merge that makes
//!   the highest-scoring piece first, as SentencePiece does), pieces the vocabulary marks as
//!   user-defined (Gemma's runs of newlines, HTML tags) are matched whole before merging, and
//!   characters outside the vocabulary fall back to byte tokens `<0xAB>`. Gemma's files spell
//!   its runs of spaces with real spaces; they are read as the `▁` runs the text becomes.
//!
//! llama.cpp's BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) are byte-level BPE: the text is
//! split by a pre-tokenizer regex chosen by `tokenizer.ggml.pre`, each piece is mapped to
//! GPT-2's byte alphabet, and the merges are applied. The regexes below are llama.cpp's, per
//! pre-tokenizer type, so ids equal llama.cpp's (checked against its output in the tests).

use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{
    NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence,
};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// GPT-2's split: contractions, letters, numbers, other symbols, whitespace.
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's split (numbers in groups of up to three digits).
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's split (single digits).
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regexes llama.cpp applies, in order, for a `tokenizer.ggml.pre` type.
fn pre_tokenizer_regexes(pre: &str) -> Option<&'static [&'static str]> {
    Some(match pre {
        "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" => &[GPT2_REGEX],
        // Single digits first, then GPT-2's split (llama.cpp groups these types together).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            &[r"\p{N}", GPT2_REGEX]
        }
        "llama3" | "llama-v3" | "llama-bpe" | "dbrx" | "smaug-bpe" | "falcon3" => &[LLAMA3_REGEX],
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" => &[QWEN2_REGEX],
        _ => return None,
    })
}

/// A GGUF model's tokenizer plus the token facts generation needs.
pub struct GgufTokenizer {
    inner: Tokenizer,
    /// The token a document starts with (`<|endoftext|>` when the vocabulary has it, as in
    /// SmolLM2's pre-training data; otherwise the GGUF's BOS token).
    pub doc_start: u32,
    /// Tokens that end generation (EOS, end-of-turn and end-of-text tokens).
    pub end_of_generation: Vec<u32>,
    /// `ends_sentence[id]`: the token's text ends with `.`, `!` or `?`.
    pub ends_sentence: Vec<bool>,
    /// `starts_word[id]`: the token's text starts with a space (byte-level `Ġ`, SentencePiece
    /// `▁`).
    pub starts_word: Vec<bool>,
}

fn meta<'a>(content: &'a Content, key: &str) -> Result<&'a Value> {
    content
        .metadata
        .get(key)
        .ok_or_else(|| anyhow!("the GGUF metadata has no `{key}`"))
}

fn meta_u32(content: &Content, key: &str) -> Option<u32> {
    content.metadata.get(key).and_then(|v| v.to_u32().ok())
}

fn string_array(content: &Content, key: &str) -> Result<Vec<String>> {
    meta(content, key)?
        .to_vec()
        .with_context(|| format!("`{key}` is not an array"))?
        .iter()
        .map(|v| {
            Ok(v.to_string()
                .with_context(|| format!("`{key}` holds a non-string"))?
                .clone())
        })
        .collect()
}

impl GgufTokenizer {
    pub(crate) fn from_gguf(content: &Content) -> Result<Self> {
        let model = meta(content, "tokenizer.ggml.model")?.to_string()?.clone();
        let (inner, tokens, space) = match model.as_str() {
            "gpt2" => {
                let (inner, tokens) = byte_level_bpe(content)?;
                (inner, tokens, 'Ġ')
            }
            "llama" => {
                let (inner, tokens) = sentencepiece_bpe(content)?;
                (inner, tokens, SPACE)
            }
            _ => bail!(
                "tokenizer model `{model}` is not supported: afkit reads byte-level BPE \
                 (`tokenizer.ggml.model = gpt2`, as in SmolLM2, Llama 3, Qwen) and SentencePiece \
                 BPE (`llama`, as in Gemma) vocabularies"
            ),
        };
        let (doc_start, end_of_generation) = special_tokens(content, &tokens)?;
        let ends_sentence = tokens
            .iter()
            .map(|t| t.ends_with(['.', '!', '?']))
            .collect();
        let starts_word = tokens.iter().map(|t| t.starts_with(space)).collect();
        Ok(GgufTokenizer {
            inner,
            doc_start,
            end_of_generation,
            ends_sentence,
            starts_word,
        })
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.ends_sentence.len()
    }

    /// Token ids of `text`, without BOS.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| anyhow!("cannot tokenise {text:?}: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| anyhow!("cannot decode token ids: {e}"))
    }

    pub(crate) fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }
}

/// The GGUF's byte-level BPE (vocabulary, merges and the pre-tokenizer its `tokenizer.ggml.pre`
/// names) as a `tokenizers` pipeline, with the vocabulary's token strings.
fn byte_level_bpe(content: &Content) -> Result<(Tokenizer, Vec<String>)> {
    let pre = content
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.to_string().ok().cloned())
        .unwrap_or_else(|| "default".to_string());
    let regexes = pre_tokenizer_regexes(&pre).with_context(|| {
        format!("pre-tokenizer type `{pre}` (tokenizer.ggml.pre) is not supported")
    })?;
    let tokens = string_array(content, "tokenizer.ggml.tokens")?;
    let merges = string_array(content, "tokenizer.ggml.merges")?
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .with_context(|| format!("merge {i} `{m}` is not two tokens"))
        })
        .collect::<Result<Vec<_>>>()?;
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| anyhow!("cannot build the BPE tokenizer: {e}"))?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for re in regexes {
        let split = Split::new(
            SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| anyhow!("bad pre-tokenizer regex: {e}"))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let mut inner = Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(Sequence::new(steps)));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok((inner, tokens))
}

/// The document-start token and every token that ends a generation (from the metadata and the
/// chat-template names the vocabulary has).
fn special_tokens(content: &Content, tokens: &[String]) -> Result<(u32, Vec<u32>)> {
    let by_text: HashMap<&str, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    let bos = meta_u32(content, "tokenizer.ggml.bos_token_id");
    let doc_start = by_text
        .get("<|endoftext|>")
        .copied()
        .or(bos)
        .context("the GGUF names no BOS token and has no <|endoftext|> token")?;
    let mut end_of_generation: Vec<u32> = [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ]
    .iter()
    .filter_map(|k| meta_u32(content, k))
    .chain(
        [
            "<|endoftext|>",
            "<|im_end|>",
            "<|eot_id|>",
            "<|end_of_text|>",
            "</s>",
            "<end_of_turn>",
        ]
        .iter()
        .filter_map(|t| by_text.get(t).copied()),
    )
    .collect();
    end_of_generation.sort_unstable();
    end_of_generation.dedup();
    Ok((doc_start, end_of_generation))
}

/// SentencePiece's word mark: a space in the text.
const SPACE: char = '▁';

/// `tokenizer.ggml.token_type` values (llama.cpp's): ordinary pieces and pieces the user added
/// take part in merges; control, unknown, unused and byte tokens do not.
const TOKEN_NORMAL: i32 = 1;
const TOKEN_USER_DEFINED: i32 = 4;

/// The GGUF's SentencePiece BPE vocabulary as a `tokenizers` pipeline, with its token strings.
/// The file has pieces and scores but no merge list: the merges are every split of a piece
/// into two pieces, ranked by the merged piece's score, best first.
fn sentencepiece_bpe(content: &Content) -> Result<(Tokenizer, Vec<String>)> {
    let tokens: Vec<String> = string_array(content, "tokenizer.ggml.tokens")?
        .into_iter()
        .map(|t| match !t.is_empty() && t.chars().all(|c| c == ' ') {
            true => t.replace(' ', &SPACE.to_string()),
            false => t,
        })
        .collect();
    let (scores, types) = scores_and_types(content, tokens.len())?;
    let merges = merges_from_scores(&tokens, &scores, &types);
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true);
    if let Some(unk) = meta_u32(content, "tokenizer.ggml.unknown_token_id") {
        builder = builder.unk_token(tokens[unk as usize].clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| anyhow!("cannot build the SentencePiece tokenizer: {e}"))?;
    let add_space_prefix = content
        .metadata
        .get("tokenizer.ggml.add_space_prefix")
        .and_then(|v| v.to_bool().ok())
        .unwrap_or(true);
    let to_mark = Replace::new(" ", SPACE.to_string()).map_err(|e| anyhow!("{e}"))?;
    let from_mark = Replace::new(SPACE.to_string(), " ").map_err(|e| anyhow!("{e}"))?;
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    let mut decoders: Vec<DecoderWrapper> = vec![
        from_mark.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        normalizers.push(Prepend::new(SPACE.to_string()).into());
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    normalizers.push(to_mark.into());
    let mut inner = Tokenizer::new(bpe);
    inner
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(|e| anyhow!("cannot set up the SentencePiece normaliser: {e}"))?;
    inner.with_decoder(Some(DecoderSequence::new(decoders)));
    let user_defined: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|&(_, &t)| t == TOKEN_USER_DEFINED)
        .map(|(token, _)| AddedToken::from(token.clone(), false))
        .collect();
    inner
        .add_tokens(user_defined)
        .map_err(|e| anyhow!("cannot add the user-defined pieces: {e}"))?;
    Ok((inner, tokens))
}

/// Each token's score and type (every token ordinary when the file gives no types).
fn scores_and_types(content: &Content, n: usize) -> Result<(Vec<f32>, Vec<i32>)> {
    let scores: Vec<f32> = meta(content, "tokenizer.ggml.scores")?
        .to_vec()
        .context("`tokenizer.ggml.scores` is not an array")?
        .iter()
        .map(|v| {
            v.to_f32()
                .context("`tokenizer.ggml.scores` holds a non-number")
        })
        .collect::<Result<_>>()?;
    let types: Vec<i32> = match content.metadata.get("tokenizer.ggml.token_type") {
        Some(v) => v
            .to_vec()?
            .iter()
            .map(|v| {
                v.to_i32()
                    .context("`tokenizer.ggml.token_type` holds a non-integer")
            })
            .collect::<Result<_>>()?,
        None => vec![TOKEN_NORMAL; n],
    };
    if scores.len() != n || types.len() != n {
        bail!(
            "the vocabulary has {n} tokens but {} scores and {} token types",
            scores.len(),
            types.len()
        );
    }
    Ok((scores, types))
}

/// The merges that rebuild each mergeable piece from two mergeable pieces, the merge making the
/// highest-scoring piece first (ties: the lower id, then the longer left part).
fn merges_from_scores(tokens: &[String], scores: &[f32], types: &[i32]) -> Vec<(String, String)> {
    let mergeable = |i: usize| matches!(types[i], TOKEN_NORMAL | TOKEN_USER_DEFINED);
    let by_text: HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|&(i, _)| mergeable(i))
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut ranked: Vec<(f32, usize, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate().filter(|&(i, _)| mergeable(i)) {
        for (cut, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(cut);
            if by_text.contains_key(left) && by_text.contains_key(right) {
                ranked.push((scores[id], id, cut));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(b.2.cmp(&a.2)));
    ranked
        .into_iter()
        .map(|(_, id, cut)| {
            let (left, right) = tokens[id].split_at(cut);
            (left.to_string(), right.to_string())
        })
        .collect()
}
