//! Small vector kernels for hot loops that are not matrix products (the logistic-regression
//! fits of AFLite, the decode step's attention).
//!
//! Release builds target plain x86-64 (SSE2), so the compiler cannot use AVX2 or fused
//! multiply-adds on its own. Callers write their loop once, generic over `FMA`, call these
//! kernels from it, and compile it twice: as is, and inside a `#[target_feature(enable =
//! "avx2,fma")]` function chosen at run time when [`avx2_fma`] says the CPU has both. Results of
//! the two builds differ in the last bits (fused rounding) and are fixed for a machine.

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

#[cfg(test)]
mod tests {
    use super::*;

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
