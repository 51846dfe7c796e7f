//! Small vector kernels for hot loops that are not matrix products (the logistic-regression
//! fits of AFLite, the language model's per-row attention, norms, SwiGLU and softmaxes over its
//! vocabulary).
//!
//! Release builds target plain x86-64 (SSE2), so the compiler cannot use AVX2 or fused
//! multiply-adds on its own. Callers write their loop once, generic over `FMA`, call these
//! kernels from it, and compile it twice: as is, and inside a `#[target_feature(enable =
//! "avx2,fma")]` function chosen at run time when [`avx2_fma`] says the CPU has both. Results of
//! the two builds differ in the last bits (fused rounding) and are fixed for a machine.

/// Instruction sets afkit's fast paths use, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SimdLevel {
    Avx2,
    Avx512,
    /// AVX-512 with bf16 dot products (`vdpbf16ps`).
    Avx512Bf16,
    /// AVX-512 and AMX's tiles.
    Amx,
}

/// The highest instruction set the fast paths may use: `AFKIT_SIMD=avx2`, `avx512` (no bf16 dot
/// products, no AMX: language models in f32, the sentence encoder's bf16 sums by fused
/// multiply-adds, the same bits) or `avx512bf16` (no AMX) caps them on a CPU that has more (one
/// switch for every fast path: the packed GEMM, the sentence encoder's products; the kernels of
/// this module are AVX2 already), so that one machine can measure what a CPU with less runs.
pub(crate) fn simd_ceiling() -> SimdLevel {
    static CEILING: std::sync::LazyLock<SimdLevel> =
        std::sync::LazyLock::new(|| match std::env::var("AFKIT_SIMD").as_deref() {
            Ok("avx2") => SimdLevel::Avx2,
            Ok("avx512") => SimdLevel::Avx512,
            Ok("avx512bf16") => SimdLevel::Avx512Bf16,
            _ => SimdLevel::Amx,
        });
    *CEILING
}

/// Whether this CPU runs AVX2 and FMA instructions.
#[inline]
pub fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `a·b` in sixteen independent lanes (two AVX registers), so the loop vectorises.
#[inline(always)]
pub fn dot_lanes<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let chunks = a.len() / LANES;
    for (ca, cb) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for l in 0..LANES {
            lanes[l] = if FMA {
                ca[l].mul_add(cb[l], lanes[l])
            } else {
                lanes[l] + ca[l] * cb[l]
            };
        }
    }
    let mut total: f32 = lanes.iter().sum();
    for i in chunks * LANES..a.len().min(b.len()) {
        total += a[i] * b[i];
    }
    total
}

/// The sum of `xs` in sixteen independent lanes, so the loop vectorises (an in-order sum waits
/// on each addition before the next).
#[inline(always)]
pub fn sum_lanes(xs: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            lanes[l] += c[l];
        }
    }
    let mut total: f32 = lanes.iter().sum();
    for &x in tail {
        total += x;
    }
    total
}

/// [`dot_lanes`] of `a` with four rows as long, each summed exactly as `dot_lanes` sums it (so
/// a caller's results do not depend on how it groups rows), reading `a` once for all four.
/// Like every `FMA = true` kernel here it may run only where [`avx2_fma`] holds: that build is
/// written with AVX2 intrinsics, as the compiler would not keep four rows' lanes in registers.
#[inline(always)]
pub fn dot_lanes_4<const FMA: bool>(a: &[f32], rows: [&[f32]; 4]) -> [f32; 4] {
    let n = a.len();
    assert!(
        rows.iter().all(|row| row.len() >= n),
        "rows shorter than the vector"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if FMA {
            // SAFETY: `FMA = true` builds run only on CPUs with AVX2 and FMA (see above), and
            // every row holds at least `n` values.
            return unsafe { dot_4_avx2_fma(a, rows) };
        }
    }
    rows.map(|row| dot_lanes::<FMA>(a, &row[..n]))
}

/// [`dot_lanes_4`] in AVX2 registers: lanes 0–7 and 8–15 of each row's sixteen, then the same
/// sum over the lanes and the same tail.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_4_avx2_fma(a: &[f32], rows: [&[f32]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let n = a.len();
    let whole = n / 16 * 16;
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    for start in (0..whole).step_by(16) {
        let a_lo = _mm256_loadu_ps(a.as_ptr().add(start));
        let a_hi = _mm256_loadu_ps(a.as_ptr().add(start + 8));
        for (acc, row) in acc.iter_mut().zip(rows) {
            let b = row.as_ptr().add(start);
            acc[0] = _mm256_fmadd_ps(a_lo, _mm256_loadu_ps(b), acc[0]);
            acc[1] = _mm256_fmadd_ps(a_hi, _mm256_loadu_ps(b.add(8)), acc[1]);
        }
    }
    let mut totals = [0f32; 4];
    for ((total, acc), row) in totals.iter_mut().zip(acc).zip(rows) {
        let mut lanes = [0f32; 16];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
        *total = lanes.iter().sum();
        for i in whole..n {
            *total += a[i] * row[i];
        }
    }
    totals
}

/// `y += alpha·x`.
#[inline(always)]
pub fn axpy_lanes<const FMA: bool>(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = if FMA {
            alpha.mul_add(xi, *yi)
        } else {
            *yi + alpha * xi
        };
    }
}

/// [`axpy_lanes`] with four rows and their factors in turn, `y` read and written once: every
/// element gets the same additions in the same order as from one `axpy_lanes` per row. As
/// [`dot_lanes_4`], `FMA = true` only where [`avx2_fma`] holds.
#[inline(always)]
pub fn axpy_lanes_4<const FMA: bool>(alphas: [f32; 4], rows: [&[f32]; 4], y: &mut [f32]) {
    let n = y.len();
    assert!(
        rows.iter().all(|row| row.len() >= n),
        "rows shorter than the vector"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if FMA {
            // SAFETY: as in `dot_lanes_4`.
            return unsafe { axpy_4_avx2_fma(alphas, rows, y) };
        }
    }
    for (&alpha, row) in alphas.iter().zip(rows) {
        axpy_lanes::<FMA>(alpha, &row[..n], y);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn axpy_4_avx2_fma(alphas: [f32; 4], rows: [&[f32]; 4], y: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = y.len();
    let whole = n / 8 * 8;
    let factors = alphas.map(|alpha| _mm256_set1_ps(alpha));
    for start in (0..whole).step_by(8) {
        let out = y.as_mut_ptr().add(start);
        let mut acc = _mm256_loadu_ps(out);
        for (&factor, row) in factors.iter().zip(rows) {
            acc = _mm256_fmadd_ps(factor, _mm256_loadu_ps(row.as_ptr().add(start)), acc);
        }
        _mm256_storeu_ps(out, acc);
    }
    for j in whole..n {
        for (&alpha, row) in alphas.iter().zip(rows) {
            y[j] = alpha.mul_add(row[j], y[j]);
        }
    }
}

/// `a·b`, with fused multiply-adds where the CPU has them.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_fma() {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { dot_avx2_fma(a, b) };
        }
    }
    dot_lanes::<false>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2_fma(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<true>(a, b)
}

/// The largest value of `xs` (−∞ for none; NaNs are skipped).
#[inline]
pub(crate) fn max(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_fma() {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { max_avx2_fma(xs) };
        }
    }
    max_lanes(xs)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn max_avx2_fma(xs: &[f32]) -> f32 {
    max_lanes(xs)
}

#[inline(always)]
fn max_lanes(xs: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            // A compare and select (not `f32::max`, whose NaN rule keeps the loop scalar).
            lanes[l] = if c[l] > lanes[l] { c[l] } else { lanes[l] };
        }
    }
    lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// `Σ exp(x − shift)` over `xs`, summed in f64; with `out`, each term is also appended to it.
/// With `shift` the maximum these are softmax weights relative to the most probable token, and
/// `shift + ln(sum)` is the log-normaliser. [`exp_lanes`] runs eight or sixteen at a time, which
/// the vocabulary-sized softmaxes of sampling and scoring need (libm's scalar `expf` is too slow for them).
#[inline]
pub(crate) fn sum_exp_shifted(xs: &[f32], shift: f32, out: Option<&mut Vec<f32>>) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_fma() {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { sum_exp_shifted_avx2_fma(xs, shift, out) };
        }
    }
    sum_exp_shifted_lanes::<false>(xs, shift, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_exp_shifted_avx2_fma(xs: &[f32], shift: f32, out: Option<&mut Vec<f32>>) -> f64 {
    sum_exp_shifted_lanes::<true>(xs, shift, out)
}

#[inline(always)]
fn sum_exp_shifted_lanes<const FMA: bool>(
    xs: &[f32],
    shift: f32,
    mut out: Option<&mut Vec<f32>>,
) -> f64 {
    const LANES: usize = 16;
    let mut sums = [0f64; LANES];
    let mut terms = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            terms[l] = exp_lanes::<FMA>(c[l] - shift);
            sums[l] += terms[l] as f64;
        }
        if let Some(out) = out.as_deref_mut() {
            out.extend_from_slice(&terms);
        }
    }
    let mut total: f64 = sums.iter().sum();
    for &x in tail {
        let term = exp_lanes::<FMA>(x - shift);
        total += term as f64;
        if let Some(out) = out.as_deref_mut() {
            out.push(term);
        }
    }
    total
}

/// SwiGLU of one row: `out[i] = silu(gate[i]) · up[i]`, `silu(g) = g / (1 + e^−g)`.
#[inline]
pub(crate) fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_fma() {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { swiglu_avx2_fma(gate, up, out) };
        }
    }
    swiglu_lanes::<false>(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2_fma(gate: &[f32], up: &[f32], out: &mut [f32]) {
    swiglu_lanes::<true>(gate, up, out)
}

#[inline(always)]
fn swiglu_lanes<const FMA: bool>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + exp_lanes::<FMA>(-g)) * u;
    }
}

/// RMS norm of one row: `out[i] = x[i] · weight[i] / √(mean(x²) + eps)`.
#[inline]
pub(crate) fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let scale = 1.0 / (dot(x, x) / x.len() as f32 + eps).sqrt();
    for ((o, &xi), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = xi * scale * w;
    }
}

/// `exp(x)` to within two ulp for x ≤ 88 (Cephes' `expf`: x = n·ln 2 + r, a degree-6 polynomial
/// for e^r, n added to the exponent bits), in operations that vectorise. Below −87 it returns
/// e^−87 ≈ 1.6e−38 rather than 0 or a subnormal.
#[inline(always)]
pub(crate) fn exp_lanes<const FMA: bool>(x: f32) -> f32 {
    let fma = |a: f32, b: f32, c: f32| if FMA { a.mul_add(b, c) } else { a * b + c };
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = fma(n, -0.693_359_4, x);
    let r = fma(n, 2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4;
    for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        p = fma(p, r, c);
    }
    let e_r = fma(p, r * r, r) + 1.0;
    e_r * f32::from_bits((((n as i32) + 127) << 23) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grouped rows give the bits of one call per row, with and without fused multiply-adds
    /// (the AVX2 build where the CPU has it), for lengths with and without a tail.
    #[test]
    fn grouped_dots_and_axpys_equal_one_call_per_row() {
        fn check<const FMA: bool>(len: usize) {
            let value = |i: usize| ((i * 37 % 101) as f32 / 17.0 - 2.9) * 1.001;
            let a: Vec<f32> = (0..len).map(value).collect();
            let rows: Vec<Vec<f32>> = (1..=4)
                .map(|r| (0..len).map(|i| value(i * r + 7 * r)).collect())
                .collect();
            let rows = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
            let grouped = dot_lanes_4::<FMA>(&a, rows);
            for (g, row) in grouped.iter().zip(rows) {
                assert_eq!(
                    g.to_bits(),
                    dot_lanes::<FMA>(&a, row).to_bits(),
                    "len {len}"
                );
            }
            let alphas = [0.3, -1.7, 2.2, 0.01];
            let (mut one_by_one, mut together) = (a.clone(), a.clone());
            for (&alpha, row) in alphas.iter().zip(rows) {
                axpy_lanes::<FMA>(alpha, row, &mut one_by_one);
            }
            axpy_lanes_4::<FMA>(alphas, rows, &mut together);
            assert_eq!(one_by_one, together, "len {len}");
        }
        for len in [1, 15, 16, 33, 384] {
            check::<false>(len);
            if avx2_fma() {
                check::<true>(len);
            }
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_libm() {
        let mut worst = 0f32;
        for i in -87_000..88_000 {
            let x = i as f32 * 1e-3 + 0.000_37;
            for e in [exp_lanes::<false>(x), exp_lanes::<true>(x)] {
                let want = x.exp();
                worst = worst.max((e - want).abs() / (want * f32::EPSILON));
            }
        }
        assert!(worst <= 2.0, "{worst} ulp");
        assert!(exp_lanes::<false>(-1e4) > 0.0 && exp_lanes::<false>(-1e4) < 2e-38);
    }

    #[test]
    fn softmax_sums_and_maxima_agree_with_plain_loops() {
        let xs: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32 - 70.0) * 0.9)
            .collect();
        let plain_max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(max(&xs), plain_max);
        assert_eq!(
            max(&xs[..7]),
            xs[..7].iter().copied().fold(f32::NEG_INFINITY, f32::max)
        );
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        let plain: f64 = xs.iter().map(|&x| ((x - plain_max) as f64).exp()).sum();
        let mut terms = Vec::new();
        let total = sum_exp_shifted(&xs, plain_max, Some(&mut terms));
        assert!((total - plain).abs() < 1e-6 * plain);
        assert_eq!(terms.len(), xs.len());
        assert_eq!(sum_exp_shifted(&xs, plain_max, None), total);
        for (t, &x) in terms.iter().zip(&xs) {
            assert!((t - (x - plain_max).exp()).abs() <= 2.0 * f32::EPSILON * t.max(1e-30));
        }
    }

    #[test]
    fn swiglu_and_rms_norm_agree_with_plain_loops() {
        let g: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        let u: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![0f32; 37];
        swiglu(&g, &u, &mut out);
        for ((o, &g), &u) in out.iter().zip(&g).zip(&u) {
            assert!((o - g / (1.0 + (-g).exp()) * u).abs() < 1e-6);
        }
        rms_norm(&g, &u, 1e-5, &mut out);
        let rms = (g.iter().map(|x| x * x).sum::<f32>() / 37.0 + 1e-5).sqrt();
        for ((o, &g), &u) in out.iter().zip(&g).zip(&u) {
            assert!((o - g / rms * u).abs() < 1e-5);
        }
    }

    #[test]
    fn kernels_agree_with_plain_loops() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - plain).abs() < 1e-5);
        assert!((dot_lanes::<true>(&a, &b) - plain).abs() < 1e-5);
        let mut y = b.clone();
        axpy_lanes::<false>(0.5, &a, &mut y);
        for ((yi, ai), bi) in y.iter().zip(&a).zip(&b) {
            assert!((yi - (bi + 0.5 * ai)).abs() < 1e-6);
        }
    }
}
