//! Products in 8-bit integers with AVX512-VNNI (`vpdpbusd`: sixty-four byte products added into
//! sixteen 32-bit sums an instruction, where an f32 FMA does sixteen multiply-adds), for CPUs
//! that have VNNI but no AMX tiles. It is how llama.cpp multiplies quantized weights by
//! quantized activations: both are cut into blocks of 32 steps, each with its own scale, and
//! the integer sums of a block are scaled back to f32 and added in f32.
//!
//! A weight column's block is stored as unsigned bytes with a scale and a minimum,
//! `w ≈ d·q + m` (q in 0–255): a quarter of the error of llama.cpp's 4-bit blocks whatever
//! format the model's file holds (and for merged adapters, which no file holds). An activation
//! row's block is stored as signed bytes with a scale, `x ≈ s·p` (p in −127–127, the largest
//! magnitude mapped to 127). Then a block adds to the product
//!
//! `Σ x·w ≈ s·d·Σ p·q + m·Σ x`,
//!
//! where `Σ p·q` is exact in integers (`vpdpbusd` multiplies unsigned by signed bytes) and
//! `Σ x` is the activations' own sum in f32, so the minimum adds no rounding of its own.
//!
//! A panel of 32 columns holds, per block, eight rows of 32 words (row `i`: each column's bytes
//! for steps `4i` to `4i + 3`, as `vpdpbusd` reads a lane), then the 32 columns' scales `d`
//! and their minimums `m`: ten rows of 32 words a block.

use rayon::prelude::*;

use super::tasks::{plan_tasks, OutPtr, NR};

/// Steps of one block, with one scale per weight column and per activation row.
const STEP: usize = 32;
/// Rows of 32 words a panel holds per block: 8 of bytes, 1 of scales, 1 of minimums.
const PANEL_ROWS_PER_BLOCK: usize = STEP / 4 + 2;
/// Rows of the largest activation block: 24 accumulators (f32 and integer sums of two
/// registers each) leave room in the 32 vector registers for the panel's values.
const BLOCK_ROWS: usize = 6;
/// The heights a row block may have: a short last block runs the smallest that covers it.
const HEIGHTS: [usize; 4] = [1, 2, 4, 6];

/// Whether this CPU multiplies bytes with AVX512-VNNI.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// 32-bit words per panel column for `k` steps.
pub(super) fn words(k: usize) -> usize {
    k.div_ceil(STEP) * PANEL_ROWS_PER_BLOCK
}

/// Fills `panel` (of [`words`]`(k) · 32` words) with the panel's weights, `value(step, column)`
/// (zero past the matrix), in the order of the module's comment.
pub(super) fn pack_panel(panel: &mut [f32], value: impl Fn(usize, usize) -> f32) {
    for (block, words) in panel
        .chunks_exact_mut(PANEL_ROWS_PER_BLOCK * NR)
        .enumerate()
    {
        let (bytes, scales) = words.split_at_mut(STEP / 4 * NR);
        let (d, m) = scales.split_at_mut(NR);
        for c in 0..NR {
            let column: [f32; STEP] = std::array::from_fn(|i| value(block * STEP + i, c));
            let (q, scale, min) = quantize_unsigned(&column);
            d[c] = scale;
            m[c] = min;
            for (i, four) in q.chunks_exact(4).enumerate() {
                bytes[i * NR + c] = f32::from_bits(u32::from_le_bytes(four.try_into().unwrap()));
            }
        }
    }
}

/// `values ≈ d·q + m`, q in 0–255: `(q, d, m)`.
fn quantize_unsigned(values: &[f32; STEP]) -> ([u8; STEP], f32, f32) {
    let min = values.iter().copied().fold(f32::INFINITY, f32::min);
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 255.0;
    let q = match d > 0.0 {
        true => values.map(|v| ((v - min) / d).round().clamp(0.0, 255.0) as u8),
        false => [0; STEP],
    };
    (q, d, min)
}

/// `values ≈ s·p`, p in −127–127: `(p, s)`.
fn quantize_signed(values: &[f32]) -> ([i8; STEP], f32) {
    let largest = values.iter().fold(0f32, |a, v| a.max(v.abs()));
    let mut p = [0i8; STEP];
    if largest > 0.0 {
        let inverse = 127.0 / largest;
        for (p, &v) in p.iter_mut().zip(values) {
            *p = (v * inverse).round() as i8;
        }
    }
    (p, largest / 127.0)
}

/// Activation rows cut into blocks of up to [`BLOCK_ROWS`] rows, quantized: per step block,
/// the rows' bytes four steps a word (for each word, the block's rows side by side, as the
/// kernel broadcasts them), and per row its scale `s` and its sum `Σ x`.
struct RowBlock {
    first_row: usize,
    rows: usize,
    height: usize,
    /// Per step block: 8 words × `height`.
    bytes: Vec<i32>,
    /// Per step block: `height` scales, then `height` sums.
    scales: Vec<f32>,
}

impl RowBlock {
    fn pack(x: &[f32], k: usize, first_row: usize, rows: usize) -> Self {
        let height = HEIGHTS
            .into_iter()
            .find(|&h| h >= rows)
            .unwrap_or(BLOCK_ROWS);
        let blocks = k.div_ceil(STEP);
        let mut bytes = vec![0i32; blocks * STEP / 4 * height];
        let mut scales = vec![0f32; blocks * 2 * height];
        for r in 0..rows {
            let row = &x[(first_row + r) * k..(first_row + r + 1) * k];
            for (b, values) in row.chunks(STEP).enumerate() {
                let (p, s) = quantize_signed(values);
                scales[b * 2 * height + r] = s;
                scales[b * 2 * height + height + r] = values.iter().sum();
                for (i, four) in p.chunks_exact(4).enumerate() {
                    let word =
                        i32::from_le_bytes([four[0], four[1], four[2], four[3]].map(|v| v as u8));
                    bytes[(b * STEP / 4 + i) * height + r] = word;
                }
            }
        }
        RowBlock {
            first_row,
            rows,
            height,
            bytes,
            scales,
        }
    }
}

/// `x · W` for `x` (rows × k) and `W` packed in `panels` (k × n, see the module's comment).
pub(super) fn apply(panels: &[f32], k: usize, n: usize, x: &[f32], rows: usize) -> Vec<f32> {
    let words = words(k);
    let blocks: Vec<RowBlock> = (0..rows.div_ceil(BLOCK_ROWS))
        .into_par_iter()
        .map(|b| {
            let first_row = b * BLOCK_ROWS;
            RowBlock::pack(x, k, first_row, BLOCK_ROWS.min(rows - first_row))
        })
        .collect();
    let n_panels = n.div_ceil(NR);
    let (per_chunk, per_group) = plan_tasks(n_panels, words * NR * 4, blocks.len());
    let groups: Vec<&[RowBlock]> = blocks.chunks(per_group).collect();
    // Not zeroed first: the tasks write every element once, as in the f32 kernels.
    let mut out: Vec<f32> = Vec::with_capacity(rows * n);
    let c = OutPtr(out.as_mut_ptr());
    (0..n_panels.div_ceil(per_chunk) * groups.len())
        .into_par_iter()
        .for_each(|task| {
            let (chunk, group) = (task / groups.len(), groups[task % groups.len()]);
            let panels_of_task = chunk * per_chunk..((chunk + 1) * per_chunk).min(n_panels);
            for block in group {
                for p in panels_of_task.clone() {
                    let panel = &panels[p * words * NR..(p + 1) * words * NR];
                    let cols = NR.min(n - p * NR);
                    // SAFETY: each (block, panel) pair writes its own rows × columns of `out`;
                    // the block and the panel hold every step block the kernel reads, and
                    // `apply` runs only where `available` said the CPU has VNNI.
                    unsafe {
                        let dst = c.at(block.first_row * n + p * NR);
                        block_times_panel(block, panel, k.div_ceil(STEP), (dst, n, cols));
                    }
                }
            }
        });
    // SAFETY: every element of the first rows × n was written above.
    unsafe { out.set_len(rows * n) };
    out
}

/// # Safety
/// As [`vnni::kernel`].
unsafe fn block_times_panel(
    block: &RowBlock,
    panel: &[f32],
    step_blocks: usize,
    write: (*mut f32, usize, usize),
) {
    #[cfg(target_arch = "x86_64")]
    {
        let (a, s, b) = (block.bytes.as_ptr(), block.scales.as_ptr(), panel.as_ptr());
        let rows = block.rows;
        match block.height {
            1 => vnni::kernel::<1>(a, s, b, step_blocks, rows, write),
            2 => vnni::kernel::<2>(a, s, b, step_blocks, rows, write),
            4 => vnni::kernel::<4>(a, s, b, step_blocks, rows, write),
            _ => vnni::kernel::<6>(a, s, b, step_blocks, rows, write),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (block, panel, step_blocks, write);
        unreachable!("VNNI runs on x86-64 CPUs only");
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{PANEL_ROWS_PER_BLOCK, STEP};

    /// `H` rows × 32 columns: per step block, eight `vpdpbusd` per row and register half add
    /// the block's byte products into integer sums, which are then scaled into the f32 sums
    /// with the minimums' share; then the first `rows` rows and `cols` columns are stored.
    ///
    /// # Safety
    /// `a` and `s` must hold `blocks` step blocks of a row block of height `H`, `b` as many of a
    /// panel, `write` must be valid for `rows` rows of `cols` values, and the CPU must have
    /// AVX512-VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn kernel<const H: usize>(
        a: *const i32,
        s: *const f32,
        b: *const f32,
        blocks: usize,
        rows: usize,
        write: (*mut f32, usize, usize),
    ) {
        let b = b as *const i32;
        let mut lo = [_mm512_setzero_ps(); H];
        let mut hi = [_mm512_setzero_ps(); H];
        for block in 0..blocks {
            let panel = b.add(block * PANEL_ROWS_PER_BLOCK * 32);
            let bytes = a.add(block * STEP / 4 * H);
            let mut int_lo = [_mm512_setzero_si512(); H];
            let mut int_hi = [_mm512_setzero_si512(); H];
            for word in 0..STEP / 4 {
                let w_lo = _mm512_loadu_si512(panel.add(word * 32).cast());
                let w_hi = _mm512_loadu_si512(panel.add(word * 32 + 16).cast());
                for r in 0..H {
                    let x = _mm512_set1_epi32(*bytes.add(word * H + r));
                    int_lo[r] = _mm512_dpbusd_epi32(int_lo[r], w_lo, x);
                    int_hi[r] = _mm512_dpbusd_epi32(int_hi[r], w_hi, x);
                }
            }
            let scales = panel.add(STEP / 4 * 32) as *const f32;
            let (d_lo, d_hi) = (_mm512_loadu_ps(scales), _mm512_loadu_ps(scales.add(16)));
            let (m_lo, m_hi) = (
                _mm512_loadu_ps(scales.add(32)),
                _mm512_loadu_ps(scales.add(48)),
            );
            let row_scales = s.add(block * 2 * H);
            for r in 0..H {
                let x_scale = _mm512_set1_ps(*row_scales.add(r));
                let x_sum = _mm512_set1_ps(*row_scales.add(H + r));
                let sums_lo = _mm512_cvtepi32_ps(int_lo[r]);
                let sums_hi = _mm512_cvtepi32_ps(int_hi[r]);
                lo[r] = _mm512_fmadd_ps(sums_lo, _mm512_mul_ps(d_lo, x_scale), lo[r]);
                hi[r] = _mm512_fmadd_ps(sums_hi, _mm512_mul_ps(d_hi, x_scale), hi[r]);
                lo[r] = _mm512_fmadd_ps(m_lo, x_sum, lo[r]);
                hi[r] = _mm512_fmadd_ps(m_hi, x_sum, hi[r]);
            }
        }
        super::super::avx512::store(&lo, &hi, rows, write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The product the kernel computes, block by block in plain arithmetic: what the integer
    /// sums and the scales must give, up to the order of the f32 additions.
    fn quantized_product(x: &[f32], w: &[f32], k: usize, n: usize) -> Vec<f32> {
        let rows = x.len() / k;
        let mut out = vec![0f32; rows * n];
        for r in 0..rows {
            for c in 0..n {
                let mut sum = 0f64;
                for b in 0..k.div_ceil(STEP) {
                    let steps = b * STEP..((b + 1) * STEP).min(k);
                    let column: [f32; STEP] = std::array::from_fn(|i| {
                        let step = b * STEP + i;
                        if step < k {
                            w[step * n + c]
                        } else {
                            0.0
                        }
                    });
                    let (q, d, m) = quantize_unsigned(&column);
                    let values = &x[r * k + steps.start..r * k + steps.end];
                    let (p, s) = quantize_signed(values);
                    let ints: i64 = (0..values.len()).map(|i| p[i] as i64 * q[i] as i64).sum();
                    let x_sum: f32 = values.iter().sum();
                    sum += (s * d) as f64 * ints as f64 + (m * x_sum) as f64;
                }
                out[r * n + c] = sum as f32;
            }
        }
        out
    }

    fn pseudo_random(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn quantized_blocks_round_trip_within_half_a_step() {
        let values: [f32; STEP] = std::array::from_fn(|i| (i as f32 * 0.37).sin() * 3.0);
        let (q, d, m) = quantize_unsigned(&values);
        for (v, q) in values.iter().zip(q) {
            assert!((d * q as f32 + m - v).abs() <= d * 0.5 + 1e-6);
        }
        let (p, s) = quantize_signed(&values);
        for (v, p) in values.iter().zip(p) {
            assert!((s * p as f32 - v).abs() <= s * 0.5 + 1e-6);
        }
        assert_eq!(quantize_unsigned(&[2.5; STEP]), ([0; STEP], 0.0, 2.5));
        assert_eq!(quantize_signed(&[0.0; 5]), ([0; STEP], 0.0));
    }

    #[test]
    fn the_kernel_computes_the_blockwise_quantized_product_near_f32() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512-VNNI");
            return;
        }
        // Odd sizes: a short last step block, a short last panel, every row-block height.
        for (rows, k, n) in [(1, 32, 32), (7, 70, 45), (13, 576, 100), (4, 5, 3)] {
            let x = pseudo_random(rows * k, 1);
            let w = pseudo_random(k * n, 2);
            let n_panels = n.div_ceil(NR);
            let mut panels = vec![0f32; n_panels * words(k) * NR];
            for (p, panel) in panels.chunks_exact_mut(words(k) * NR).enumerate() {
                pack_panel(panel, |step, c| {
                    let col = p * NR + c;
                    if step < k && col < n {
                        w[step * n + col]
                    } else {
                        0.0
                    }
                });
            }
            let got = apply(&panels, k, n, &x, rows);
            let want = quantized_product(&x, &w, k, n);
            for r in 0..rows {
                for c in 0..n {
                    let exact: f32 = (0..k).map(|i| x[r * k + i] * w[i * n + c]).sum();
                    let (g, q) = (got[r * n + c], want[r * n + c]);
                    assert!((g - q).abs() <= 1e-4 * (1.0 + q.abs()), "{g} vs {q}");
                    // Each product is off by at most half a step of either operand.
                    let bound = 0.01 * (k as f32).sqrt() + 1e-3;
                    assert!(
                        (g - exact).abs() <= bound,
                        "{g} vs f32 {exact} ({rows}×{k}×{n})"
                    );
                }
            }
        }
    }
}
