//! afkit's own part-of-speech tagger: a greedy left-to-right averaged perceptron over the 17
//! Universal Dependencies tags (Collins 2002; the feature set follows Honnibal's well-known
//! "good POS tagger in 200 lines", extended with prefixes, longer suffixes, word shapes and a
//! wider window because the training set is small: ~46k tokens of UD English-EWT dev + PUD).
//!
//! Features are hashed to 32 bits (no feature-string table), which keeps the weight file small
//! and makes extraction allocation-free; with a few hundred thousand features the expected
//! number of collisions is in the tens, which costs nothing measurable.
//!
//! Weight file (little-endian): magic `AFKITTAG`, u32 format version, u32 length + JSON
//! metadata (training files, epochs, seed), f32 dequantisation scale, the tag dictionary
//! (u32 count; per entry u8 length, UTF-8 word, u8 tag), then the weights: u32 feature count;
//! per feature, sorted by hash: LEB128 delta of the hash, 3-byte bit mask of the tags with a
//! non-zero weight, and one i16 per set bit.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{bail, ensure, Context, Result};
use rand::seq::SliceRandom;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::output::Output;
use crate::seed::Seed;

/// One annotated sentence: what the tagger trains and is measured on (`conllu` reads them).
#[derive(Debug, Clone, PartialEq)]
pub struct TaggedSentence {
    pub words: Vec<String>,
    pub tags: Vec<Upos>,
}

/// The 17 Universal POS tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Upos {
    Adj,
    Adp,
    Adv,
    Aux,
    Cconj,
    Det,
    Intj,
    Noun,
    Num,
    Part,
    Pron,
    Propn,
    Punct,
    Sconj,
    Sym,
    Verb,
    X,
}

const N_TAGS: usize = 17;

impl Upos {
    pub(crate) const ALL: [Upos; N_TAGS] = [
        Upos::Adj,
        Upos::Adp,
        Upos::Adv,
        Upos::Aux,
        Upos::Cconj,
        Upos::Det,
        Upos::Intj,
        Upos::Noun,
        Upos::Num,
        Upos::Part,
        Upos::Pron,
        Upos::Propn,
        Upos::Punct,
        Upos::Sconj,
        Upos::Sym,
        Upos::Verb,
        Upos::X,
    ];

    /// The UD name of the tag ("NOUN", "VERB", ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Upos::Adj => "ADJ",
            Upos::Adp => "ADP",
            Upos::Adv => "ADV",
            Upos::Aux => "AUX",
            Upos::Cconj => "CCONJ",
            Upos::Det => "DET",
            Upos::Intj => "INTJ",
            Upos::Noun => "NOUN",
            Upos::Num => "NUM",
            Upos::Part => "PART",
            Upos::Pron => "PRON",
            Upos::Propn => "PROPN",
            Upos::Punct => "PUNCT",
            Upos::Sconj => "SCONJ",
            Upos::Sym => "SYM",
            Upos::Verb => "VERB",
            Upos::X => "X",
        }
    }

    /// Parses a UD tag name.
    pub(crate) fn parse(name: &str) -> Result<Upos> {
        Upos::ALL
            .into_iter()
            .find(|t| t.as_str() == name)
            .with_context(|| format!("unknown UPOS tag {name:?}"))
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Upos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Training settings, recorded in the weight file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainOptions {
    pub epochs: usize,
    pub seed: Seed,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            epochs: 12,
            seed: Seed::default(),
        }
    }
}

/// Where a tagger came from, stored with its weights.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TaggerInfo {
    /// File names (no directories) of the training treebanks.
    pub trained_on: Vec<String>,
    pub sentences: usize,
    pub tokens: usize,
    pub epochs: usize,
    pub seed: Seed,
}

/// A trained tagger (immutable, shareable across threads).
pub struct Tagger {
    rows: HashMap<u32, u32, BuildHasherDefault<HashIsKey>>,
    /// `N_TAGS` weights per feature row.
    weights: Vec<f32>,
    tag_dict: HashMap<String, Upos>,
    pub info: TaggerInfo,
}

static SHIPPED_WEIGHTS: &[u8] = include_bytes!("../../../../data/tagger.bin");

impl Tagger {
    /// The tagger shipped with afkit (trained on UD English-EWT dev + PUD), loaded once.
    pub fn shipped() -> &'static Tagger {
        static SHIPPED: OnceLock<Tagger> = OnceLock::new();
        SHIPPED.get_or_init(|| {
            Tagger::from_bytes(SHIPPED_WEIGHTS).expect("data/tagger.bin embedded in afkit is valid")
        })
    }

    /// Tags one tokenised sentence.
    pub fn tag<S: AsRef<str>>(&self, words: &[S]) -> Vec<Upos> {
        let ctx = SentenceFeatures::new(words);
        let mut tags = Vec::with_capacity(words.len());
        let mut feats = Vec::with_capacity(N_TEMPLATES);
        let (mut prev, mut prev2) = (START_TAG, START_TAG + 1);
        for (i, word) in words.iter().enumerate() {
            let tag = match self.tag_dict.get(word.as_ref()) {
                Some(&t) => t,
                None => {
                    ctx.features(i, prev, prev2, &mut feats);
                    Upos::ALL[argmax(&self.scores(&feats))]
                }
            };
            tags.push(tag);
            prev2 = prev;
            prev = tag.index() as u8;
        }
        tags
    }

    fn scores(&self, feats: &[u32]) -> [f32; N_TAGS] {
        let mut scores = [0f32; N_TAGS];
        for f in feats {
            if let Some(&row) = self.rows.get(f) {
                let w = &self.weights[row as usize * N_TAGS..][..N_TAGS];
                for (s, w) in scores.iter_mut().zip(w) {
                    *s += w;
                }
            }
        }
        scores
    }

    /// Trains a tagger on annotated sentences.
    pub fn train(
        sentences: &[TaggedSentence],
        trained_on: Vec<String>,
        options: &TrainOptions,
        mut on_epoch: impl FnMut(usize, f64),
    ) -> Result<Tagger> {
        ensure!(!sentences.is_empty(), "no training sentences");
        let tag_dict = build_tag_dict(sentences);
        let mut model = Perceptron::default();
        let mut order: Vec<usize> = (0..sentences.len()).collect();
        let mut rng = options.seed.rng();
        let mut feats = Vec::with_capacity(N_TEMPLATES);
        for epoch in 0..options.epochs {
            order.shuffle(&mut rng);
            let (mut correct, mut total) = (0usize, 0usize);
            for &s in &order {
                let sentence = &sentences[s];
                let ctx = SentenceFeatures::new(&sentence.words);
                let (mut prev, mut prev2) = (START_TAG, START_TAG + 1);
                for (i, &truth) in sentence.tags.iter().enumerate() {
                    let guess = match tag_dict.get(&sentence.words[i]) {
                        Some(&t) => t,
                        None => {
                            ctx.features(i, prev, prev2, &mut feats);
                            let guess = Upos::ALL[argmax(&model.scores(&feats))];
                            model.update(truth.index(), guess.index(), &feats);
                            guess
                        }
                    };
                    model.tick();
                    correct += usize::from(guess == truth);
                    total += 1;
                    prev2 = prev;
                    prev = guess.index() as u8;
                }
            }
            on_epoch(epoch + 1, correct as f64 / total as f64);
        }
        let (rows, weights) = model.averaged_quantised();
        Ok(Tagger {
            rows,
            weights,
            tag_dict,
            info: TaggerInfo {
                trained_on,
                sentences: sentences.len(),
                tokens: sentences.iter().map(|s| s.words.len()).sum(),
                epochs: options.epochs,
                seed: options.seed,
            },
        })
    }

    /// Token accuracy on annotated sentences (their gold tokenisation is used).
    pub fn accuracy(&self, sentences: &[TaggedSentence]) -> (usize, usize) {
        sentences
            .par_iter()
            .map(|s| {
                let predicted = self.tag(&s.words);
                let correct = predicted
                    .iter()
                    .zip(&s.tags)
                    .filter(|(p, t)| p == t)
                    .count();
                (correct, s.words.len())
            })
            .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    pub fn save(&self, path: &Path, output: &Output) -> Result<()> {
        output.write(path, &self.to_bytes()?)
    }

    pub fn load(path: &Path) -> Result<Tagger> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Tagger::from_bytes(&bytes)
            .with_context(|| format!("{} is not a valid afkit tagger file", path.display()))
    }

    fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        let meta = serde_json::to_vec(&self.info)?;
        out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        out.extend_from_slice(&meta);

        let max = self
            .weights
            .iter()
            .fold(0f32, |m, w| m.max(w.abs()))
            .max(1e-6);
        let scale = max / i16::MAX as f32;
        out.extend_from_slice(&scale.to_le_bytes());

        let mut dict: Vec<(&String, &Upos)> = self.tag_dict.iter().collect();
        dict.sort();
        let dict: Vec<_> = dict.into_iter().filter(|(w, _)| w.len() < 256).collect();
        out.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        for (word, tag) in dict {
            out.push(word.len() as u8);
            out.extend_from_slice(word.as_bytes());
            out.push(tag.index() as u8);
        }

        let mut rows: Vec<(u32, u32)> = self.rows.iter().map(|(&h, &r)| (h, r)).collect();
        rows.sort_unstable();
        let mut encoded = Vec::new();
        let mut count = 0u32;
        let mut last = 0u32;
        for (hash, row) in rows {
            let w = &self.weights[row as usize * N_TAGS..][..N_TAGS];
            let q: Vec<i16> = w.iter().map(|&x| (x / scale).round() as i16).collect();
            let mask = q
                .iter()
                .enumerate()
                .filter(|(_, &v)| v != 0)
                .fold(0u32, |m, (i, _)| m | 1 << i);
            if mask == 0 {
                continue;
            }
            write_leb128(&mut encoded, hash - last);
            last = hash;
            encoded.extend_from_slice(&mask.to_le_bytes()[..3]);
            for v in q.iter().filter(|&&v| v != 0) {
                encoded.extend_from_slice(&v.to_le_bytes());
            }
            count += 1;
        }
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&encoded);
        Ok(out)
    }

    fn from_bytes(bytes: &[u8]) -> Result<Tagger> {
        let mut r = Reader { bytes, pos: 0 };
        if r.take(MAGIC.len())? != MAGIC {
            bail!("not an afkit tagger file (bad magic bytes)");
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            bail!("tagger file format {version}, this afkit reads {FORMAT_VERSION}");
        }
        let meta_len = r.u32()? as usize;
        let info: TaggerInfo = serde_json::from_slice(r.take(meta_len)?)?;
        let scale = f32::from_le_bytes(r.take(4)?.try_into()?);

        let n_dict = r.u32()? as usize;
        let mut tag_dict = HashMap::with_capacity(n_dict);
        for _ in 0..n_dict {
            let len = r.take(1)?[0] as usize;
            let word = std::str::from_utf8(r.take(len)?)?.to_string();
            let tag = *Upos::ALL
                .get(r.take(1)?[0] as usize)
                .context("bad tag index")?;
            tag_dict.insert(word, tag);
        }

        let n_rows = r.u32()? as usize;
        let mut rows = HashMap::with_capacity_and_hasher(n_rows, Default::default());
        let mut weights = vec![0f32; n_rows * N_TAGS];
        let mut hash = 0u32;
        for row in 0..n_rows {
            hash = hash
                .checked_add(r.leb128()?)
                .context("feature hashes out of order")?;
            let m = r.take(3)?;
            let mask = u32::from_le_bytes([m[0], m[1], m[2], 0]);
            for tag in 0..N_TAGS {
                if mask & (1 << tag) != 0 {
                    let v = i16::from_le_bytes(r.take(2)?.try_into()?);
                    weights[row * N_TAGS + tag] = v as f32 * scale;
                }
            }
            rows.insert(hash, row as u32);
        }
        ensure!(r.pos == bytes.len(), "trailing bytes after the weights");
        Ok(Tagger {
            rows,
            weights,
            tag_dict,
            info,
        })
    }
}

const MAGIC: &[u8; 8] = b"AFKITTAG";
const FORMAT_VERSION: u32 = 1;

fn argmax(scores: &[f32; N_TAGS]) -> usize {
    let mut best = 0;
    for (i, &s) in scores.iter().enumerate() {
        if s > scores[best] {
            best = i;
        }
    }
    best
}

/// Words seen at least 20 times with one tag at least 97% of the time are tagged by lookup:
/// faster, and the perceptron's capacity goes to the ambiguous words.
fn build_tag_dict(sentences: &[TaggedSentence]) -> HashMap<String, Upos> {
    let mut counts: HashMap<&str, [u32; N_TAGS]> = HashMap::new();
    for s in sentences {
        for (w, t) in s.words.iter().zip(&s.tags) {
            counts.entry(w).or_insert([0; N_TAGS])[t.index()] += 1;
        }
    }
    counts
        .into_iter()
        .filter_map(|(word, c)| {
            let total: u32 = c.iter().sum();
            let best = argmax(&c.map(|x| x as f32));
            (total >= 20 && c[best] as f64 / total as f64 >= 0.97)
                .then(|| (word.to_string(), Upos::ALL[best]))
        })
        .collect()
}

// ----- features -----

/// Pseudo-tags for the positions before the sentence start.
const START_TAG: u8 = N_TAGS as u8;

const N_TEMPLATES: usize = 30;

/// Per-token strings computed once per sentence, from which the feature hashes are built.
struct SentenceFeatures {
    /// Normalised words (lowercased, digit strings collapsed), padded with two boundary
    /// markers on each side.
    norm: Vec<String>,
    exact: Vec<String>,
    shape: Vec<String>,
    flags: Vec<u8>,
}

const PAD: usize = 2;

impl SentenceFeatures {
    fn new<S: AsRef<str>>(words: &[S]) -> SentenceFeatures {
        let n = words.len() + 2 * PAD;
        let mut norm = Vec::with_capacity(n);
        let mut exact = Vec::with_capacity(n);
        let mut shape = Vec::with_capacity(n);
        let mut flags = Vec::with_capacity(n);
        for marker in ["-START2-", "-START-"] {
            norm.push(marker.to_string());
            exact.push(marker.to_string());
            shape.push(marker.to_string());
            flags.push(0);
        }
        for (i, w) in words.iter().enumerate() {
            let w = w.as_ref();
            norm.push(normalise(w));
            exact.push(w.to_string());
            shape.push(word_shape(w));
            flags.push(word_flags(w, i == 0));
        }
        for marker in ["-END-", "-END2-"] {
            norm.push(marker.to_string());
            exact.push(marker.to_string());
            shape.push(marker.to_string());
            flags.push(0);
        }
        SentenceFeatures {
            norm,
            exact,
            shape,
            flags,
        }
    }

    /// Feature hashes of word `i` given the two previous predicted tags.
    fn features(&self, i: usize, prev: u8, prev2: u8, out: &mut Vec<u32>) {
        out.clear();
        let p = i + PAD;
        let w = self.norm[p].as_str();
        let lower = w;
        let mut f = |template: u8, parts: &[&[u8]]| out.push(feature_hash(template, parts));
        f(0, &[]);
        f(1, &[w.as_bytes()]);
        f(2, &[self.exact[p].as_bytes()]);
        for (k, t) in [(1, 3), (2, 4), (3, 5), (4, 6)] {
            f(t, &[suffix(lower, k).as_bytes()]);
        }
        for (k, t) in [(1, 7), (2, 8), (3, 9)] {
            f(t, &[prefix(lower, k).as_bytes()]);
        }
        f(10, &[self.shape[p].as_bytes()]);
        f(11, &[&[self.flags[p]]]);
        f(12, &[&[prev]]);
        f(13, &[&[prev2]]);
        f(14, &[&[prev, prev2]]);
        f(15, &[&[prev], w.as_bytes()]);
        f(16, &[self.norm[p - 1].as_bytes()]);
        f(17, &[suffix(&self.norm[p - 1], 3).as_bytes()]);
        f(18, &[self.norm[p - 2].as_bytes()]);
        f(19, &[self.norm[p + 1].as_bytes()]);
        f(20, &[suffix(&self.norm[p + 1], 3).as_bytes()]);
        f(21, &[self.norm[p + 2].as_bytes()]);
        f(22, &[self.norm[p - 1].as_bytes(), w.as_bytes()]);
        f(23, &[w.as_bytes(), self.norm[p + 1].as_bytes()]);
        f(24, &[&[prev], suffix(lower, 3).as_bytes()]);
        f(25, &[self.shape[p + 1].as_bytes()]);
        f(26, &[self.shape[p - 1].as_bytes()]);
        f(27, &[&[prev], self.norm[p + 1].as_bytes()]);
        f(
            28,
            &[
                suffix(&self.norm[p + 1], 2).as_bytes(),
                suffix(lower, 3).as_bytes(),
            ],
        );
        f(29, &[&[self.flags[p]], self.shape[p + 1].as_bytes()]);
    }
}

/// FNV-1a over the template id and the parts (separated), folded to 32 bits.
fn feature_hash(template: u8, parts: &[&[u8]]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    eat(template);
    for part in parts {
        eat(0xff);
        for &b in *part {
            eat(b);
        }
    }
    (h ^ (h >> 32)) as u32
}

fn normalise(word: &str) -> String {
    let first_digit = word.chars().next().is_some_and(|c| c.is_ascii_digit());
    if first_digit {
        if word.len() == 4 && word.bytes().all(|b| b.is_ascii_digit()) {
            return "!YEAR".into();
        }
        return "!DIGITS".into();
    }
    word.to_lowercase()
}

fn suffix(word: &str, k: usize) -> &str {
    match word.char_indices().rev().nth(k - 1) {
        Some((i, _)) => &word[i..],
        None => word,
    }
}

fn prefix(word: &str, k: usize) -> &str {
    match word.char_indices().nth(k) {
        Some((i, _)) => &word[..i],
        None => word,
    }
}

/// Compressed shape: `Xx` for "Smith", `x-x` for "e-mail", `d.d` for "3.5", runs collapsed.
fn word_shape(word: &str) -> String {
    let mut shape = String::new();
    for c in word.chars() {
        let s = if c.is_uppercase() {
            'X'
        } else if c.is_lowercase() {
            'x'
        } else if c.is_numeric() {
            'd'
        } else {
            c
        };
        if !shape.ends_with(s) {
            shape.push(s);
        }
    }
    shape
}

fn word_flags(word: &str, first: bool) -> u8 {
    let mut chars = word.chars();
    let initial_upper = chars.next().is_some_and(char::is_uppercase);
    let all_upper = word.chars().any(char::is_alphabetic)
        && word
            .chars()
            .filter(|c| c.is_alphabetic())
            .all(char::is_uppercase);
    let has_digit = word.chars().any(|c| c.is_ascii_digit());
    let has_hyphen = word.len() > 1 && word.contains('-');
    u8::from(first)
        | u8::from(initial_upper) << 1
        | u8::from(all_upper) << 2
        | u8::from(has_digit) << 3
        | u8::from(has_hyphen) << 4
}

// ----- training -----

/// Perceptron weights during training, with lazily updated sums for averaging.
#[derive(Default)]
struct Perceptron {
    rows: HashMap<u32, usize, BuildHasherDefault<HashIsKey>>,
    weights: Vec<[i32; N_TAGS]>,
    totals: Vec<[i64; N_TAGS]>,
    stamps: Vec<[u32; N_TAGS]>,
    /// Number of training tokens seen so far (the averaging clock).
    instances: u32,
}

impl Perceptron {
    fn scores(&self, feats: &[u32]) -> [f32; N_TAGS] {
        let mut scores = [0f32; N_TAGS];
        for f in feats {
            if let Some(&row) = self.rows.get(f) {
                for (s, &w) in scores.iter_mut().zip(&self.weights[row]) {
                    *s += w as f32;
                }
            }
        }
        scores
    }

    fn tick(&mut self) {
        self.instances += 1;
    }

    fn update(&mut self, truth: usize, guess: usize, feats: &[u32]) {
        if truth == guess {
            return;
        }
        for &f in feats {
            let next_row = self.weights.len();
            let row = *self.rows.entry(f).or_insert(next_row);
            if row == next_row {
                self.weights.push([0; N_TAGS]);
                self.totals.push([0; N_TAGS]);
                self.stamps.push([0; N_TAGS]);
            }
            for (tag, delta) in [(truth, 1), (guess, -1)] {
                let elapsed = (self.instances - self.stamps[row][tag]) as i64;
                self.totals[row][tag] += elapsed * self.weights[row][tag] as i64;
                self.stamps[row][tag] = self.instances;
                self.weights[row][tag] += delta;
            }
        }
    }

    /// Averaged weights, as the tagger stores them.
    fn averaged_quantised(self) -> (HashMap<u32, u32, BuildHasherDefault<HashIsKey>>, Vec<f32>) {
        let n = self.instances.max(1) as f64;
        let mut weights = Vec::with_capacity(self.weights.len() * N_TAGS);
        for row in 0..self.weights.len() {
            for tag in 0..N_TAGS {
                let elapsed = (self.instances - self.stamps[row][tag]) as i64;
                let total = self.totals[row][tag] + elapsed * self.weights[row][tag] as i64;
                weights.push((total as f64 / n) as f32);
            }
        }
        let rows = self.rows.into_iter().map(|(h, r)| (h, r as u32)).collect();
        (rows, weights)
    }
}

/// The keys are already hashes: use them as they are.
#[derive(Default)]
struct HashIsKey(u64);

impl Hasher for HashIsKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u32(&mut self, n: u32) {
        // Spread the 32 bits over the 64 so hashbrown's top-7-bit tags are well mixed.
        self.0 = (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

// ----- byte helpers -----

fn write_leb128(out: &mut Vec<u8>, mut v: u32) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.context("file is truncated")?;
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into()?))
    }

    fn leb128(&mut self) -> Result<u32> {
        let mut v = 0u32;
        for shift in (0..35).step_by(7) {
            let b = self.take(1)?[0];
            v |= ((b & 0x7f) as u32) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        bail!("bad varint")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenize;

    fn sentence(tagged: &str) -> TaggedSentence {
        let (words, tags) = tagged
            .split_whitespace()
            .map(|wt| {
                let (w, t) = wt.rsplit_once('/').unwrap();
                (w.to_string(), Upos::parse(t).unwrap())
            })
            .unzip();
        TaggedSentence { words, tags }
    }

    #[test]
    fn save_load_round_trip_tags_identically() {
        let data: Vec<_> = [
            "The/DET man/NOUN walks/VERB ./PUNCT",
            "A/DET woman/NOUN runs/VERB fast/ADV ./PUNCT",
            "She/PRON is/AUX riding/VERB a/DET horse/NOUN ./PUNCT",
            "Then/ADV the/DET dog/NOUN jumps/VERB over/ADP the/DET fence/NOUN ./PUNCT",
        ]
        .iter()
        .map(|s| sentence(s))
        .collect();
        let tagger = Tagger::train(
            &data,
            vec!["toy".into()],
            &TrainOptions::default(),
            |_, _| {},
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.bin");
        tagger.save(&path, &Output::default()).unwrap();
        let loaded = Tagger::load(&path).unwrap();
        assert_eq!(loaded.info, tagger.info);
        for s in &data {
            assert_eq!(loaded.tag(&s.words), s.tags, "{:?}", s.words);
            assert_eq!(loaded.tag(&s.words), tagger.tag(&s.words));
        }
        std::fs::write(&path, b"AFKITTAG\x01\0\0\0").unwrap();
        assert!(Tagger::load(&path).is_err(), "truncated files are rejected");
    }

    #[test]
    fn shipped_tagger_tags_obvious_sentences() {
        let tagger = Tagger::shipped();
        let tags = |s: &str| -> Vec<&str> {
            tagger
                .tag(&tokenize(s))
                .into_iter()
                .map(Upos::as_str)
                .collect()
        };
        assert_eq!(
            tags("The man walks to the door."),
            ["DET", "NOUN", "VERB", "ADP", "DET", "NOUN", "PUNCT"]
        );
        assert_eq!(
            tags("She is playing the guitar."),
            ["PRON", "AUX", "VERB", "DET", "NOUN", "PUNCT"]
        );
        assert_eq!(
            tags("Then, two men and a woman are seen talking."),
            [
                "ADV", "PUNCT", "NUM", "NOUN", "CCONJ", "DET", "NOUN", "AUX", "VERB", "VERB",
                "PUNCT"
            ]
        );
    }

    #[test]
    fn word_helpers() {
        assert_eq!(word_shape("Smith"), "Xx");
        assert_eq!(word_shape("3.5"), "d.d");
        assert_eq!(suffix("running", 3), "ing");
        assert_eq!(suffix("go", 3), "go");
        assert_eq!(prefix("über", 2), "üb");
        assert_eq!(normalise("1999"), "!YEAR");
        assert_eq!(normalise("Dog"), "dog");
    }
}
