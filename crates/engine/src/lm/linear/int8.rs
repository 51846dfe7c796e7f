//! 8-bit products for AVX-512 VNNI (`vpdpbusd`, 64 multiply-adds of bytes per instruction,
//! four times an f32 FMA's), as llama.cpp multiplies quantized weights by quantized
//! activations.
//!
//! Weights: each column is scaled once, at load time, by its largest magnitude to integers in
//! −127..=127, stored offset by 128 as unsigned bytes (`vpdpbusd` multiplies unsigned bytes by
//! signed ones). Activations: each row is cut into blocks of [`BLOCK_STEPS`] steps, each block
//! scaled by its own largest magnitude to −127..=127 on every call, so that one large value
//! costs precision only within its block. A block's products are summed exactly in 32-bit
//! integers and added to the f32 sum times the block's scale. The weights' offset adds 128 ×
//! the block's activation integers to each sum; those terms depend only on the row, so they are
//! taken off once at the end, and the column's scale multiplies last:
//!
//! `out[r][c] = wscale[c] · (Σ_b xscale[r][b] · Σ_{k∈b} (q_w[k][c] + 128) · q_x[r][k] − offset[r])`
//! with `offset[r] = Σ_b xscale[r][b] · 128 · Σ_{k∈b} q_x[r][k]`.
//!
//! The error of a product is that of rounding each operand to 1/254 of its column's or block's
//! largest magnitude.

use super::tasks::NR;

/// Steps a 32-bit word holds: four bytes.
pub(super) const STEPS_PER_WORD: usize = 4;
/// Steps of one activation block, which shares one scale.
pub(super) const BLOCK_STEPS: usize = 32;
/// Words of one activation block.
pub(super) const BLOCK_WORDS: usize = BLOCK_STEPS / STEPS_PER_WORD;

/// The scale that maps the largest magnitude of `values` to 127 (0 for all zeros).
pub(super) fn scale_of(values: impl Iterator<Item = f32>) -> f32 {
    values.fold(0f32, |m, v| m.max(v.abs())) / 127.0
}

/// What multiplies a value of `scale` into −127..=127 (0 for a zero scale).
fn inverse(scale: f32) -> f32 {
    match scale > 0.0 {
        true => 1.0 / scale,
        false => 0.0,
    }
}

/// `v` (times its scale's [`inverse`]) rounded to the nearest integer, ties to even: adding
/// and taking away 1.5 · 2²³ leaves no fraction bits, and compiles to plain vector adds where
/// `f32::round` would be a library call per value.
fn quantize(v: f32, inverse: f32) -> i8 {
    const ROUNDER: f32 = 12_582_912.0;
    ((v * inverse + ROUNDER) - ROUNDER).clamp(-127.0, 127.0) as i8
}

/// Four bytes as one 32-bit word held in an f32, as the packed panels and blocks hold words.
fn word(bytes: [u8; 4]) -> f32 {
    f32::from_bits(u32::from_le_bytes(bytes))
}

/// Fills an int8 panel (one row of 32 words per four steps, each word a column's four
/// steps) with `value(step, column)` (zero past the matrix) quantized by `scales` (the panel's
/// 32 column scales), offset by 128.
pub(super) fn pack_panel(panel: &mut [f32], scales: &[f32], value: impl Fn(usize, usize) -> f32) {
    let inverses: Vec<f32> = scales.iter().copied().map(inverse).collect();
    for (w, out) in panel.chunks_exact_mut(NR).enumerate() {
        for (c, out) in out.iter_mut().enumerate() {
            let byte = |j: usize| {
                let q = quantize(value(STEPS_PER_WORD * w + j, c), inverses[c]);
                (i16::from(q) + 128) as u8
            };
            *out = word([byte(0), byte(1), byte(2), byte(3)]);
        }
    }
}

/// One block of activation rows for the int8 kernel.
pub(super) struct QuantizedRows {
    /// Per word, `height` words: each row's four steps as signed bytes.
    pub(super) data: Vec<f32>,
    /// Per activation block, `height` scales.
    pub(super) scales: Vec<f32>,
    /// Per row, the weights' offset to take off (see the module's comment).
    pub(super) offsets: Vec<f32>,
}

/// The rows `rows` (each `k` values, row-major) quantized for a block of `height` rows (rows
/// past the end stay zero).
pub(super) fn quantize_rows(rows: &[&[f32]], k: usize, height: usize) -> QuantizedRows {
    let words = k.div_ceil(STEPS_PER_WORD);
    let blocks = words.div_ceil(BLOCK_WORDS);
    let mut data = vec![0f32; words * height];
    let mut scales = vec![0f32; blocks * height];
    let mut offsets = vec![0f32; height];
    for (r, row) in rows.iter().enumerate() {
        let mut offset = 0f32;
        for (b, block) in row.chunks(BLOCK_STEPS).enumerate() {
            let (scale, q, sum) = quantize_block(block);
            offset += scale * (128 * sum) as f32;
            scales[b * height + r] = scale;
            let block_words = block.len().div_ceil(STEPS_PER_WORD);
            for (w, four) in q.chunks_exact(STEPS_PER_WORD).take(block_words).enumerate() {
                data[(b * BLOCK_WORDS + w) * height + r] =
                    word([four[0] as u8, four[1] as u8, four[2] as u8, four[3] as u8]);
            }
        }
        offsets[r] = offset;
    }
    QuantizedRows {
        data,
        scales,
        offsets,
    }
}

/// A block of at most [`BLOCK_STEPS`] activations: its scale, its integers (zero past its
/// end) and their sum. With AVX-512 in vector registers, else value by value; both give the
/// same integers (the vector conversion rounds to nearest, ties to even, as [`quantize`] does).
fn quantize_block(block: &[f32]) -> (f32, [i8; BLOCK_STEPS], i32) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { quantize_block_avx512(block) };
    }
    quantize_block_scalar(block)
}

fn quantize_block_scalar(block: &[f32]) -> (f32, [i8; BLOCK_STEPS], i32) {
    let scale = scale_of(block.iter().copied());
    let inverse = inverse(scale);
    let mut q = [0i8; BLOCK_STEPS];
    for (q, &v) in q.iter_mut().zip(block) {
        *q = quantize(v, inverse);
    }
    (scale, q, q.iter().map(|&v| i32::from(v)).sum())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quantize_block_avx512(block: &[f32]) -> (f32, [i8; BLOCK_STEPS], i32) {
    use std::arch::x86_64::*;
    let load = |from: usize| {
        let n = block.len().saturating_sub(from).min(16);
        let mask = ((1u32 << n) - 1) as __mmask16;
        match n {
            0 => _mm512_setzero_ps(),
            _ => _mm512_maskz_loadu_ps(mask, block.as_ptr().add(from)),
        }
    };
    let (lo, hi) = (load(0), load(16));
    let max = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    let scale = max / 127.0;
    let times = _mm512_set1_ps(inverse(scale));
    let limit = _mm512_set1_epi32(127);
    let integers = |v: __m512| {
        let q = _mm512_cvtps_epi32(_mm512_mul_ps(v, times));
        _mm512_max_epi32(
            _mm512_min_epi32(q, limit),
            _mm512_sub_epi32(_mm512_setzero_si512(), limit),
        )
    };
    let (q_lo, q_hi) = (integers(lo), integers(hi));
    let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));
    let mut q = [0i8; BLOCK_STEPS];
    _mm_storeu_si128(q.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(q_lo));
    _mm_storeu_si128(q.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(q_hi));
    (scale, q, sum)
}

/// The int8 product written out in scalar code, in the kernel's order of operations: the
/// reference the kernel must equal bit for bit. `w` is k rows of n.
#[cfg(test)]
pub(super) fn reference(x: &[f32], rows: usize, w: &[Vec<f32>]) -> Vec<f32> {
    let (k, n) = (w.len(), w[0].len());
    let column_scales: Vec<f32> = (0..n)
        .map(|c| scale_of(w.iter().map(|row| row[c])))
        .collect();
    let mut out = vec![0f32; rows * n];
    for r in 0..rows {
        let row = &x[r * k..(r + 1) * k];
        let q = quantize_rows(&[row], k, 1);
        let step = |s: usize| -> i32 {
            let word = q.data[s / STEPS_PER_WORD].to_bits().to_le_bytes();
            i32::from(word[s % STEPS_PER_WORD] as i8)
        };
        for c in 0..n {
            let mut acc = 0f32;
            for (b, &scale) in q.scales.iter().enumerate() {
                let steps = b * BLOCK_STEPS..((b + 1) * BLOCK_STEPS).min(k);
                let sum: i32 = steps
                    .map(|s| {
                        (i32::from(quantize(w[s][c], inverse(column_scales[c]))) + 128) * step(s)
                    })
                    .sum();
                acc = (sum as f32).mul_add(scale, acc);
            }
            out[r * n + c] = (acc - q.offsets[0]) * column_scales[c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector quantizer gives the scalar one's scale, integers and sum on blocks of every
    /// length, ties included.
    #[test]
    fn both_quantizers_agree() {
        let mut blocks: Vec<Vec<f32>> = vec![vec![], vec![0.0; 32], vec![1.0, -0.5]];
        // 0.5 and 1.5 steps: ties, which both round to even.
        blocks.push((0..32).map(|i| (i as f32 - 16.0) * 0.5).collect());
        for len in 1..=32 {
            blocks.push(
                (0..len)
                    .map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.7)
                    .collect(),
            );
        }
        for block in blocks {
            assert_eq!(
                quantize_block(&block),
                quantize_block_scalar(&block),
                "{block:?}"
            );
        }
    }
}
