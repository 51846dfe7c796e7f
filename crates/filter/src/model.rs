//! The stylistic model family of SWAG §3.4, in candle: four models that each score one option
//! (`sent2 + ending`) of a (k+1)-way choice, and an ensemble over their final representations.
//!
//! - [`MlpModel`]: LM features and lengths (and the features of any scorer models, see
//!   [`super::scorer`]) → two ReLU layers.
//! - [`BowModel`]: the mean of trainable word embeddings.
//! - [`CnnModel`]: one convolution layer per filter width (2, 3, 4, 5) over word embedding ⊕
//!   indicator embedding ("token is in `sent2`"), ReLU, max-pooled over time. The convolution is
//!   written as windows ([`super::windows`]) → linear layer (im2col), because candle's CPU conv1d
//!   backward pass goes through a naive transposed convolution that dominated training time.
//!   With afkit's CPU kernels the texts are packed end to end and only windows on real tokens
//!   are multiplied; otherwise (any device) the windows are candle ops over the padded batch.
//! - [`LstmModel`]: a bidirectional LSTM over top-word/UPOS ids ⊕ indicator, max-pooled
//!   ([`super::bilstm`]).
//! - [`SubwordModel`]: the mean of trainable embeddings of the ending's hashed character
//!   n-grams, as fastText classifies: it sees non-words, misspellings and punctuation habits that
//!   the word models map to UNK or normalise away.
//! - [`SentenceModel`]: a ReLU layer over the MiniLM embedding of `sent2 + ending`, so that AF
//!   also filters against what a sentence encoder notices (HellaSwag's adversary was BERT).
//! - The ensemble: the representations concatenated into a one-hidden-layer MLP.
//!
//! The subword and sentence models go beyond SWAG's four: without them AF left endings that a
//! character n-gram or a sentence-embedding classifier still told apart (BENCHMARKS.md, "Quality").
//!
//! Every model has its own linear scoring head, and all heads are trained jointly (the sum of
//! their softmax cross-entropy losses, as SWAG's reference code does), so each head's accuracy can
//! be reported on its own. In MLP-only iterations only the MLP and its head exist.

use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{embedding, linear, Embedding, Linear, VarBuilder};

use super::settings::ModelConfig;

use afkit_store::af::Phase;

use super::bags::bag_mean;
use super::bilstm::{BiLstm, BiLstmInput};
use super::data::MLP_FEATURES;
use super::windows::{
    max_per_text, shifted_windows, text_windows, windows_of, PackedText, TextWindows,
};

/// Filter widths of the CNN (SWAG: "filter sizes ranging from 2-5").
pub(crate) const CNN_WIDTHS: [usize; 4] = [2, 3, 4, 5];

/// Large negative added to padded positions before max-pooling.
const MASKED: f64 = -1e4;

/// What the data gives the text models: vocabulary sizes and input widths.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Inputs {
    pub words: usize,
    pub lstm_words: usize,
    /// Hash buckets of the subword ids; 0 leaves the subword model out.
    pub subword_buckets: usize,
    /// Width of the sentence vectors; 0 leaves the sentence model out.
    pub sentence_dim: usize,
    /// Features from scorer models beside the LM features (0: none).
    pub scorer_features: usize,
}

impl Inputs {
    /// What the models read from `data` (vocabulary sizes, input widths).
    pub(crate) fn of(data: &super::data::Dataset) -> Inputs {
        Inputs {
            words: data.vocab_size,
            lstm_words: data.lstm_vocab_size,
            subword_buckets: data.subword_buckets,
            sentence_dim: data.sentence_dim,
            scorer_features: data.scorer_features,
        }
    }
}

/// A padded batch of options, one row per option.
pub(crate) struct Batch {
    /// (rows, MLP_FEATURES + scorer features) the standardised MLP inputs and scorer features.
    pub lm: Tensor,
    /// Token inputs; `None` in MLP-only iterations.
    pub text: Option<TextBatch>,
}

pub(crate) struct TextBatch {
    /// (rows, len) word ids, padded with 0.
    pub words: Tensor,
    /// (rows, len) 0/1: token belongs to `sent2`.
    pub in_sent2: Tensor,
    /// (rows, len) BiLSTM ids and indicator, and the same with each row's tokens reversed
    /// (padding stays at the end) for the backward direction.
    pub lstm_ids: Tensor,
    pub lstm_ids_rev: Tensor,
    pub in_sent2_rev: Tensor,
    /// (rows, len, 1) 1.0 on real tokens.
    pub mask: Tensor,
    /// (rows, 1) number of real tokens.
    pub lengths: Tensor,
    /// The CNN's input, in the layout the model's CNN reads.
    pub cnn: CnnInput,
    /// The ending's subword ids, padded with 0, and their mask and counts; `None` without the
    /// subword model.
    pub subwords: Option<Bag>,
    /// (rows, sentence_dim) sentence vectors; `None` without the sentence model.
    pub sentence: Option<Tensor>,
}

/// How a batch lays out the CNN's input ([`StylisticModel::cnn_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CnnLayout {
    /// Windows as candle ops over the padded `words` (any device).
    Padded,
    /// Texts end to end for afkit's CPU ops.
    Packed,
}

pub(crate) enum CnnInput {
    /// Per CNN width: (rows, len - width + 1, 1) 1.0 where the window starts on a real token;
    /// the tokens are the batch's padded `words` and `in_sent2`.
    Padded { conv_masks: Vec<Tensor> },
    /// The same texts end to end without padding.
    Packed(PackedText),
}

/// Padded id sequences to be averaged.
pub(crate) struct Bag {
    /// (rows, len) ids, 0 = padding.
    pub ids: Tensor,
    /// (rows, len, 1) 1.0 on real ids.
    pub mask: Tensor,
    /// (rows, 1) number of real ids (at least 1).
    pub lengths: Tensor,
}

/// Per-row scores of every head that exists, each of shape (rows,).
pub(crate) struct HeadScores {
    pub mlp: Tensor,
    pub bow: Option<Tensor>,
    pub cnn: Option<Tensor>,
    pub lstm: Option<Tensor>,
    pub subword: Option<Tensor>,
    pub sentence: Option<Tensor>,
    pub ensemble: Option<Tensor>,
}

impl HeadScores {
    pub(crate) fn all(&self) -> Vec<&Tensor> {
        std::iter::once(&self.mlp)
            .chain(&self.bow)
            .chain(&self.cnn)
            .chain(&self.lstm)
            .chain(&self.subword)
            .chain(&self.sentence)
            .chain(&self.ensemble)
            .collect()
    }
}

/// Max over time of (rows, len, channels), ignoring positions where `mask` (rows, len, 1) is 0.
fn masked_max_over_time(xs: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let penalty = ((mask - 1.0)? * -MASKED)?;
    xs.broadcast_add(&penalty)?.max(1)
}

pub(crate) struct MlpModel {
    l1: Linear,
    l2: Linear,
}

impl MlpModel {
    fn new(inputs: usize, cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        Ok(MlpModel {
            l1: linear(inputs, cfg.mlp_hidden, vb.pp("l1"))?,
            l2: linear(cfg.mlp_hidden, cfg.mlp_hidden, vb.pp("l2"))?,
        })
    }

    fn forward(&self, lm: &Tensor) -> Result<Tensor> {
        self.l2.forward(&self.l1.forward(lm)?.relu()?)?.relu()
    }
}

pub(crate) struct BowModel {
    embed: MeanEmbedding,
}

impl BowModel {
    fn new(vocab: usize, cfg: &ModelConfig, cpu_kernels: bool, vb: VarBuilder) -> Result<Self> {
        Ok(BowModel {
            embed: MeanEmbedding::new(vocab, cfg.word_dim, cpu_kernels, vb.pp("embed"))?,
        })
    }

    fn forward(&self, text: &TextBatch) -> Result<Tensor> {
        self.embed.forward(&text.words, &text.mask, &text.lengths)
    }
}

/// An embedding table read as the mean of the embeddings of each row's real ids.
struct MeanEmbedding {
    table: Embedding,
    /// The mean from afkit's CPU op rather than candle ops.
    cpu_kernels: bool,
}

impl MeanEmbedding {
    fn new(vocab: usize, dim: usize, cpu_kernels: bool, vb: VarBuilder) -> Result<Self> {
        Ok(MeanEmbedding {
            table: embedding(vocab, dim, vb)?,
            cpu_kernels,
        })
    }

    /// `ids` (rows, len; 0 = padding), `mask` (rows, len, 1) and `lengths` (rows, 1) as in
    /// [`Bag`] → (rows, dim).
    fn forward(&self, ids: &Tensor, mask: &Tensor, lengths: &Tensor) -> Result<Tensor> {
        if self.cpu_kernels {
            return bag_mean(self.table.embeddings(), ids, lengths);
        }
        let summed = self.table.forward(ids)?.broadcast_mul(mask)?.sum(1)?;
        summed.broadcast_div(lengths)
    }
}

pub(crate) struct SubwordModel {
    embed: MeanEmbedding,
}

impl SubwordModel {
    fn new(buckets: usize, cfg: &ModelConfig, cpu_kernels: bool, vb: VarBuilder) -> Result<Self> {
        Ok(SubwordModel {
            embed: MeanEmbedding::new(buckets + 1, cfg.word_dim, cpu_kernels, vb.pp("embed"))?,
        })
    }

    fn forward(&self, bag: &Bag) -> Result<Tensor> {
        self.embed.forward(&bag.ids, &bag.mask, &bag.lengths)
    }
}

pub(crate) struct SentenceModel {
    layer: Linear,
}

impl SentenceModel {
    fn new(dim: usize, cfg: &ModelConfig, vb: VarBuilder) -> Result<Self> {
        Ok(SentenceModel {
            layer: linear(dim, cfg.mlp_hidden, vb.pp("layer"))?,
        })
    }

    fn forward(&self, sentence: &Tensor) -> Result<Tensor> {
        self.layer.forward(sentence)?.relu()
    }
}

pub(crate) struct CnnModel {
    embed: Embedding,
    indicator: Embedding,
    /// Per width w: a linear map of the w concatenated token vectors of a window to the filters.
    convs: Vec<Linear>,
    /// Packed: windows over the packed texts from afkit's CPU ops rather than candle ops.
    layout: CnnLayout,
}

impl CnnModel {
    fn new(vocab: usize, cfg: &ModelConfig, cpu_kernels: bool, vb: VarBuilder) -> Result<Self> {
        let channels = cfg.word_dim + cfg.indicator_dim;
        let convs = CNN_WIDTHS
            .iter()
            .map(|w| linear(w * channels, cfg.cnn_filters, vb.pp(format!("conv{w}"))))
            .collect::<Result<_>>()?;
        Ok(CnnModel {
            embed: embedding(vocab, cfg.word_dim, vb.pp("embed"))?,
            indicator: embedding(2, cfg.indicator_dim, vb.pp("indicator"))?,
            convs,
            layout: if cpu_kernels {
                CnnLayout::Packed
            } else {
                CnnLayout::Padded
            },
        })
    }

    /// Word ⊕ `sent2`-indicator embeddings, concatenated along the last dimension.
    fn token_vectors(&self, words: &Tensor, in_sent2: &Tensor) -> Result<Tensor> {
        let parts = [
            self.embed.forward(words)?,
            self.indicator.forward(in_sent2)?,
        ];
        Tensor::cat(&parts, D::Minus1)
    }

    fn forward(&self, text: &TextBatch) -> Result<Tensor> {
        let conv_masks = match &text.cnn {
            CnnInput::Packed(packed) => return self.forward_packed(packed),
            CnnInput::Padded { conv_masks } => conv_masks,
        };
        let xs = self.token_vectors(&text.words, &text.in_sent2)?;
        let pooled = CNN_WIDTHS
            .iter()
            .zip(&self.convs)
            .zip(conv_masks)
            .map(|((w, conv), mask)| {
                let features = conv.forward(&shifted_windows(&xs, *w)?)?.relu()?;
                masked_max_over_time(&features, mask)
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&pooled, 1)
    }

    /// The same function over the texts end to end: only windows that start on a real token
    /// are multiplied, about half as many rows as in the padded batch.
    fn forward_packed(&self, text: &PackedText) -> Result<Tensor> {
        let xs = self.token_vectors(&text.words, &text.in_sent2)?;
        let pooled = CNN_WIDTHS
            .iter()
            .zip(&self.convs)
            .zip(&text.windows)
            .map(|((w, conv), windows)| {
                let features = conv.forward(&text_windows(&xs, windows, *w)?)?.relu()?;
                max_per_text(&features, windows)
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&pooled, 1)
    }
}

pub(crate) struct LstmModel {
    bilstm: BiLstm,
}

impl LstmModel {
    fn new(vocab: usize, cfg: &ModelConfig, cpu_kernels: bool, vb: VarBuilder) -> Result<Self> {
        let (word_dim, indicator_dim, hidden) = (cfg.word_dim, cfg.indicator_dim, cfg.lstm_hidden);
        Ok(LstmModel {
            bilstm: BiLstm::new(vocab, word_dim, indicator_dim, hidden, cpu_kernels, vb)?,
        })
    }

    fn forward(&self, text: &TextBatch) -> Result<Tensor> {
        // Padding sits at the end of both the forward and the reversed rows, so each direction
        // starts on a real token; padded steps are ignored by the masked max.
        let states = self.bilstm.hidden_states(&BiLstmInput {
            ids: &text.lstm_ids,
            in_sent2: &text.in_sent2,
            ids_rev: &text.lstm_ids_rev,
            in_sent2_rev: &text.in_sent2_rev,
        })?;
        Tensor::cat(
            &[
                masked_max_over_time(&states.get(0)?, &text.mask)?,
                masked_max_over_time(&states.get(1)?, &text.mask)?,
            ],
            1,
        )
    }
}

struct TextModels {
    bow: BowModel,
    cnn: CnnModel,
    lstm: LstmModel,
    bow_head: Linear,
    cnn_head: Linear,
    lstm_head: Linear,
    subword: Option<(SubwordModel, Linear)>,
    sentence: Option<(SentenceModel, Linear)>,
    ensemble_hidden: Linear,
    ensemble_head: Linear,
}

impl TextModels {
    /// The text models with their heads, the subword and sentence models only where the data
    /// has their inputs, and the ensemble over all of them and the MLP.
    fn new(inputs: Inputs, cfg: &ModelConfig, cpu_kernels: bool, vb: &VarBuilder) -> Result<Self> {
        let cnn_dim = cfg.cnn_filters * CNN_WIDTHS.len();
        let lstm_dim = 2 * cfg.lstm_hidden;
        let subword = (inputs.subword_buckets > 0)
            .then(|| -> Result<_> {
                let buckets = inputs.subword_buckets;
                Ok((
                    SubwordModel::new(buckets, cfg, cpu_kernels, vb.pp("subword"))?,
                    linear(cfg.word_dim, 1, vb.pp("subword_head"))?,
                ))
            })
            .transpose()?;
        let sentence = (inputs.sentence_dim > 0)
            .then(|| -> Result<_> {
                Ok((
                    SentenceModel::new(inputs.sentence_dim, cfg, vb.pp("sentence"))?,
                    linear(cfg.mlp_hidden, 1, vb.pp("sentence_head"))?,
                ))
            })
            .transpose()?;
        // The ensemble reads every model's features side by side.
        let concat = cfg.mlp_hidden
            + cfg.word_dim
            + cnn_dim
            + lstm_dim
            + if subword.is_some() { cfg.word_dim } else { 0 }
            + if sentence.is_some() {
                cfg.mlp_hidden
            } else {
                0
            };
        Ok(TextModels {
            bow: BowModel::new(inputs.words, cfg, cpu_kernels, vb.pp("bow"))?,
            cnn: CnnModel::new(inputs.words, cfg, cpu_kernels, vb.pp("cnn"))?,
            lstm: LstmModel::new(inputs.lstm_words, cfg, cpu_kernels, vb.pp("bilstm"))?,
            bow_head: linear(cfg.word_dim, 1, vb.pp("bow_head"))?,
            cnn_head: linear(cnn_dim, 1, vb.pp("cnn_head"))?,
            lstm_head: linear(lstm_dim, 1, vb.pp("lstm_head"))?,
            subword,
            sentence,
            ensemble_hidden: linear(concat, cfg.ensemble_hidden, vb.pp("ensemble"))?,
            ensemble_head: linear(cfg.ensemble_hidden, 1, vb.pp("ensemble_head"))?,
        })
    }
}

/// The model family of one iteration: the MLP always, the text models and the ensemble in
/// [`Phase::Style`] and [`Phase::Ensemble`] iterations.
pub(crate) struct StylisticModel {
    mlp: MlpModel,
    mlp_head: Linear,
    text: Option<TextModels>,
}

impl StylisticModel {
    /// `cpu_kernels`: afkit's CPU ops where it has them (CPU tensors only), else candle ops.
    pub(crate) fn new(
        family: Phase,
        inputs: Inputs,
        cfg: &ModelConfig,
        cpu_kernels: bool,
        vb: VarBuilder,
    ) -> Result<Self> {
        let mlp = MlpModel::new(MLP_FEATURES + inputs.scorer_features, cfg, vb.pp("mlp"))?;
        let mlp_head = linear(cfg.mlp_hidden, 1, vb.pp("mlp_head"))?;
        let text = match family {
            Phase::Mlp => None,
            Phase::Style | Phase::Ensemble => Some(TextModels::new(inputs, cfg, cpu_kernels, &vb)?),
        };
        Ok(StylisticModel {
            mlp,
            mlp_head,
            text,
        })
    }

    /// The layout of the CNN input its batches need ([`make_batch`]).
    pub(crate) fn cnn_layout(&self) -> CnnLayout {
        self.text
            .as_ref()
            .map_or(CnnLayout::Padded, |models| models.cnn.layout)
    }

    pub(crate) fn family(&self) -> Phase {
        if self.text.is_some() {
            Phase::Ensemble
        } else {
            Phase::Mlp
        }
    }

    /// Scores every row of the batch with every head.
    pub(crate) fn forward(&self, batch: &Batch) -> Result<HeadScores> {
        let mlp_rep = self.mlp.forward(&batch.lm)?;
        let mlp = self.mlp_head.forward(&mlp_rep)?.squeeze(1)?;
        let (Some(models), Some(text)) = (&self.text, &batch.text) else {
            return Ok(HeadScores {
                mlp,
                bow: None,
                cnn: None,
                lstm: None,
                subword: None,
                sentence: None,
                ensemble: None,
            });
        };
        let bow_rep = models.bow.forward(text)?;
        let cnn_rep = models.cnn.forward(text)?;
        let lstm_rep = models.lstm.forward(text)?;
        let subword_rep = match (&models.subword, &text.subwords) {
            (Some((model, _)), Some(bag)) => Some(model.forward(bag)?),
            (None, None) => None,
            _ => candle_core::bail!("the batch's subword ids do not match the model"),
        };
        let sentence_rep = match (&models.sentence, &text.sentence) {
            (Some((model, _)), Some(vectors)) => Some(model.forward(vectors)?),
            (None, None) => None,
            _ => candle_core::bail!("the batch's sentence vectors do not match the model"),
        };
        let mut reps = vec![&mlp_rep, &bow_rep, &cnn_rep, &lstm_rep];
        reps.extend(subword_rep.as_ref());
        reps.extend(sentence_rep.as_ref());
        let joint = Tensor::cat(&reps, 1)?;
        let ensemble = models
            .ensemble_head
            .forward(&models.ensemble_hidden.forward(&joint)?.relu()?)?;
        let head = |head: &Linear, rep: &Tensor| head.forward(rep)?.squeeze(1);
        Ok(HeadScores {
            mlp,
            bow: Some(head(&models.bow_head, &bow_rep)?),
            cnn: Some(head(&models.cnn_head, &cnn_rep)?),
            lstm: Some(head(&models.lstm_head, &lstm_rep)?),
            subword: match (&models.subword, &subword_rep) {
                (Some((_, h)), Some(rep)) => Some(head(h, rep)?),
                _ => None,
            },
            sentence: match (&models.sentence, &sentence_rep) {
                (Some((_, h)), Some(rep)) => Some(head(h, rep)?),
                _ => None,
            },
            ensemble: Some(ensemble.squeeze(1)?),
        })
    }
}

/// Builds a batch from options given as (ending, tokens of `sent2` at its start); `text`: the
/// inputs of the text models, `None` for the MLP alone; `cnn`: the layout the model's CNN reads.
pub(crate) fn make_batch(
    options: &[(&super::data::EncodedEnding, usize)],
    text: Option<Inputs>,
    cnn: CnnLayout,
    device: &Device,
) -> Result<Batch> {
    let rows = options.len();
    let width = MLP_FEATURES + options.first().map_or(0, |(e, _)| e.scorer.len());
    let lm: Vec<f32> = options
        .iter()
        .flat_map(|(e, _)| e.mlp.iter().chain(e.scorer.iter()).copied())
        .collect();
    let lm = Tensor::from_vec(lm, (rows, width), device)?;
    let text = text
        .map(|inputs| text_batch(options, inputs, cnn, device))
        .transpose()?;
    Ok(Batch { lm, text })
}

/// The CNN's inputs of a batch without padding: each text's word ids and `sent2` indicators in
/// slots of their own (at least as many as the widest filter), and every width's windows.
fn packed_text(
    options: &[(&super::data::EncodedEnding, usize)],
    device: &Device,
) -> Result<PackedText> {
    let max_width = *CNN_WIDTHS.iter().max().unwrap_or(&1);
    // An empty text gets one UNK token, as in the padded batch.
    let lengths: Vec<usize> = options.iter().map(|(e, _)| e.words.len().max(1)).collect();
    let slots: Vec<usize> = lengths.iter().map(|&n| n.max(max_width)).collect();
    let total = slots.iter().sum();
    let (mut words, mut in_sent2) = (Vec::with_capacity(total), Vec::with_capacity(total));
    for (((ending, n_sent2), &n), &s) in options.iter().zip(&lengths).zip(&slots) {
        for t in 0..s {
            let real = t < n;
            words.push(if real {
                ending.words.get(t).copied().unwrap_or(super::data::UNK)
            } else {
                0
            });
            in_sent2.push(u32::from(real && t < *n_sent2));
        }
    }
    Ok(PackedText {
        words: Tensor::from_vec(words, total, device)?,
        in_sent2: Tensor::from_vec(in_sent2, total, device)?,
        windows: CNN_WIDTHS
            .iter()
            .map(|&w| TextWindows::new(&lengths, &slots, w))
            .collect(),
    })
}

/// Per CNN width, (rows, len - width + 1, 1): 1.0 where a window of the padded batch starts on
/// a real token; a text shorter than the filter (or empty, one UNK) keeps window 0.
fn conv_masks(
    options: &[(&super::data::EncodedEnding, usize)],
    len: usize,
    device: &Device,
) -> Result<Vec<Tensor>> {
    CNN_WIDTHS
        .iter()
        .map(|w| {
            let windows = len - w + 1;
            let mask: Vec<f32> = options
                .iter()
                .flat_map(|(ending, _)| {
                    let real = windows_of(ending.words.len(), *w);
                    (0..windows).map(move |t| f32::from(t < real))
                })
                .collect();
            Tensor::from_vec(mask, (options.len(), windows, 1), device)
        })
        .collect()
}

/// The text models' inputs of a batch: word and POS ids padded to the longest row (forwards and
/// backwards for the BiLSTM), masks, the CNN's input, subword bags, sentence vectors.
fn text_batch(
    options: &[(&super::data::EncodedEnding, usize)],
    inputs: Inputs,
    cnn: CnnLayout,
    device: &Device,
) -> Result<TextBatch> {
    let rows = options.len();
    // At least as long as the widest filter, so every width yields one window.
    let max_width = *CNN_WIDTHS.iter().max().unwrap_or(&1);
    let len = options
        .iter()
        .map(|(e, _)| e.words.len())
        .max()
        .unwrap_or(0)
        .max(max_width);
    let grid = TokenGrid::of(options, len);
    let ids = |v: Vec<u32>| Tensor::from_vec(v, (rows, len), device);
    let cnn = match cnn {
        CnnLayout::Packed => CnnInput::Packed(packed_text(options, device)?),
        CnnLayout::Padded => CnnInput::Padded {
            conv_masks: conv_masks(options, len, device)?,
        },
    };
    Ok(TextBatch {
        words: ids(grid.words)?,
        in_sent2: ids(grid.in_sent2)?,
        lstm_ids: ids(grid.lstm_ids)?,
        lstm_ids_rev: ids(grid.lstm_ids_rev)?,
        in_sent2_rev: ids(grid.in_sent2_rev)?,
        mask: Tensor::from_vec(grid.mask, (rows, len, 1), device)?,
        lengths: Tensor::from_vec(grid.lengths, (rows, 1), device)?,
        cnn,
        subwords: (inputs.subword_buckets > 0)
            .then(|| bag(options.iter().map(|(e, _)| &e.subwords[..]), device))
            .transpose()?,
        sentence: (inputs.sentence_dim > 0)
            .then(|| sentence_vectors(options, inputs.sentence_dim, device))
            .transpose()?,
    })
}

/// A batch's tokens padded to `len` per row, row after row: word ids, BiLSTM ids forwards and
/// backwards, whether each token is in sent2 (both directions), the mask and each row's length.
struct TokenGrid {
    words: Vec<u32>,
    in_sent2: Vec<u32>,
    lstm_ids: Vec<u32>,
    lstm_ids_rev: Vec<u32>,
    in_sent2_rev: Vec<u32>,
    mask: Vec<f32>,
    lengths: Vec<f32>,
}

impl TokenGrid {
    fn of(options: &[(&super::data::EncodedEnding, usize)], len: usize) -> TokenGrid {
        let rows = options.len();
        let mut grid = TokenGrid {
            words: vec![0u32; rows * len],
            in_sent2: vec![0u32; rows * len],
            lstm_ids: vec![0u32; rows * len],
            lstm_ids_rev: vec![0u32; rows * len],
            in_sent2_rev: vec![0u32; rows * len],
            mask: vec![0f32; rows * len],
            lengths: vec![0f32; rows],
        };
        for (r, (ending, n_sent2)) in options.iter().enumerate() {
            // An empty text still gets one (UNK) token so that every row has something to pool.
            let n = ending.words.len().max(1);
            grid.lengths[r] = n as f32;
            for t in 0..n {
                let src = n - 1 - t;
                let at = r * len + t;
                grid.words[at] = ending.words.get(t).copied().unwrap_or(super::data::UNK);
                grid.lstm_ids[at] = ending.lstm.get(t).copied().unwrap_or(super::data::UNK);
                grid.lstm_ids_rev[at] = ending.lstm.get(src).copied().unwrap_or(super::data::UNK);
                grid.in_sent2[at] = u32::from(t < *n_sent2);
                grid.in_sent2_rev[at] = u32::from(src < *n_sent2);
                grid.mask[at] = 1.0;
            }
        }
        grid
    }
}

/// The batch's sentence vectors, one row of `dim` per option.
fn sentence_vectors(
    options: &[(&super::data::EncodedEnding, usize)],
    dim: usize,
    device: &Device,
) -> Result<Tensor> {
    let data: Vec<f32> = options
        .iter()
        .flat_map(|(e, _)| e.sentence.iter().copied())
        .collect();
    Tensor::from_vec(data, (options.len(), dim), device)
}

/// Pads id lists into a [`Bag`]; an empty list keeps one padding id (which the mask ignores)
/// and counts as length 1, so its mean is the zero vector.
fn bag<'a>(
    lists: impl ExactSizeIterator<Item = &'a [u32]> + Clone,
    device: &Device,
) -> Result<Bag> {
    let rows = lists.len();
    let len = lists.clone().map(<[u32]>::len).max().unwrap_or(0).max(1);
    let mut ids = vec![0u32; rows * len];
    let mut mask = vec![0f32; rows * len];
    let mut lengths = vec![1f32; rows];
    for (r, list) in lists.enumerate() {
        ids[r * len..r * len + list.len()].copy_from_slice(list);
        mask[r * len..r * len + list.len()].fill(1.0);
        lengths[r] = list.len().max(1) as f32;
    }
    Ok(Bag {
        ids: Tensor::from_vec(ids, (rows, len), device)?,
        mask: Tensor::from_vec(mask, (rows, len, 1), device)?,
        lengths: Tensor::from_vec(lengths, (rows, 1), device)?,
    })
}

/// The dtype of every parameter.
pub(crate) const DTYPE: DType = DType::F32;
