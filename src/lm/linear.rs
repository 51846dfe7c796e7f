//! The model's weight matrices as linear maps `x · W` over row-major activations.
//!
//! Every projection of the decoder (and the 49k-column output head, a fifth of the arithmetic)
//! is a product of a few hundred activation rows with a constant weight matrix. candle's f32
//! GEMM packs the weight matrix again on every call. On x86-64 CPUs with AVX-512, or with AVX2
//! and FMA, the weights are packed once, at load time, into column panels laid out in the order
//! afkit's micro-kernels read them, which leaves only the (small) activation block to pack per
//! call. The kernel is chosen at run time: 12 rows × 32 columns in 512-bit registers where the
//! CPU has AVX-512F, else 6 rows × 16 columns in 256-bit registers, twice per panel. Other CPUs
//! keep candle's GEMM, and so do other devices (the `generic` engine: candle's matmul wherever
//! the tensor lives). `AFKIT_GEMM=candle` forces candle's GEMM and `AFKIT_GEMM=avx2` the AVX2
//! kernel, to compare them on one machine; debug builds use candle's unless `AFKIT_GEMM=packed`
//! (see [`packed_kernel`]).

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// A weight matrix (in × out) applied to activation rows.
pub enum Linear {
    /// candle's matmul (any CPU, any device).
    Dense(Tensor),
    /// Panels for afkit's micro-kernels.
    Packed(PackedMatrix),
}

impl Linear {
    /// `w` is (in × out). Packs it when afkit's CPU kernels run the model and this CPU has one
    /// of its micro-kernels.
    pub fn new(w: Tensor, cpu_kernels: bool) -> Result<Self> {
        match packed_kernel().filter(|_| cpu_kernels) {
            Some(kernel) => Ok(Linear::Packed(PackedMatrix::pack(&w, kernel)?)),
            None => Ok(Linear::Dense(w.contiguous()?)),
        }
    }

    /// `x · W` for `x` (rows × in).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(w) => Ok(x.matmul(w)?),
            Linear::Packed(p) => {
                let out = self.forward_rows(x)?;
                Ok(Tensor::from_vec(out, (x.dim(0)?, p.n), &Device::Cpu)?)
            }
        }
    }

    /// `x · W` for `x` given as plain rows (rows × in, row-major), for models that keep their
    /// activations outside tensors (the sentence encoder).
    pub fn apply(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        match self {
            Linear::Dense(w) => {
                let x = Tensor::from_slice(x, (rows, w.dim(0)?), w.device())?;
                Ok(x.matmul(w)?.flatten_all()?.to_vec1()?)
            }
            Linear::Packed(p) => p.apply(x, rows),
        }
    }

    /// `x · W` as plain rows (rows × out), for callers that read the result element by element
    /// (the sampler over the output head's logits).
    pub fn forward_rows(&self, x: &Tensor) -> Result<Vec<f32>> {
        match self {
            Linear::Dense(w) => Ok(x.matmul(w)?.flatten_all()?.to_vec1()?),
            Linear::Packed(p) => p.apply(&x.flatten_all()?.to_vec1::<f32>()?, x.dim(0)?),
        }
    }
}

/// The micro-kernels a packed matrix can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// 12 rows × 32 columns of 512-bit accumulators.
    Avx512,
    /// 6 rows × 16 columns of 256-bit accumulators with fused multiply-adds.
    Avx2Fma,
}

impl Kernel {
    /// Every kernel this CPU can run, fastest first.
    pub fn supported() -> Vec<Kernel> {
        let mut kernels = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                kernels.push(Kernel::Avx512);
            }
            if crate::simd::avx2_fma() {
                kernels.push(Kernel::Avx2Fma);
            }
        }
        kernels
    }

    /// Rows of a full row block: as many accumulators as leave room, in the CPU's vector
    /// registers, for the panel's values and a broadcast (32 registers with AVX-512, 16 with AVX2).
    fn block_rows(self) -> usize {
        match self {
            Kernel::Avx512 => 12,
            Kernel::Avx2Fma => 6,
        }
    }

    /// The heights a row block may have: a short last block runs the smallest that covers it.
    fn heights(self) -> &'static [usize] {
        match self {
            Kernel::Avx512 => &[1, 2, 4, 8, 12],
            Kernel::Avx2Fma => &[1, 2, 4, 6],
        }
    }
}

/// The kernel packed matrices use here: the fastest this CPU has. `AFKIT_GEMM=candle` keeps
/// candle's GEMM, and so does a debug build unless `AFKIT_GEMM=packed`: there afkit's own code is
/// unoptimised while candle's (a dependency) is built optimised, and the kernels' intrinsics,
/// left as calls, would run many times slower than candle (the test suite would crawl).
/// `AFKIT_GEMM=avx2` takes the AVX2 kernel where AVX-512 is there too, so that one machine can
/// time both paths.
pub fn packed_kernel() -> Option<Kernel> {
    let supported = Kernel::supported();
    match std::env::var("AFKIT_GEMM").as_deref() {
        Ok("candle") => None,
        Ok("packed") => supported.first().copied(),
        Ok("avx2") => supported.into_iter().find(|&k| k == Kernel::Avx2Fma),
        _ if cfg!(debug_assertions) => None,
        _ => supported.first().copied(),
    }
}

/// Columns of one panel: two 16-lane registers, or four 8-lane ones.
const NR: usize = 32;
/// Weight bytes a thread's chunk of panels may take, so the chunk stays in its core's L2 cache
/// while every row block passes over it.
const CHUNK_BYTES: usize = 256 * 1024;

/// A weight matrix (k × n) as ⌈n / 32⌉ panels of k × 32 values, row-major inside a panel, the
/// last panel padded with zero columns.
pub struct PackedMatrix {
    k: usize,
    n: usize,
    panels: Vec<f32>,
    kernel: Kernel,
}

impl PackedMatrix {
    /// Packs `w` for `kernel`, which must be one of [`Kernel::supported`].
    pub fn pack(w: &Tensor, kernel: Kernel) -> Result<Self> {
        if !Kernel::supported().contains(&kernel) {
            bail!("this CPU cannot run the {kernel:?} kernel");
        }
        let (k, n) = w.dims2()?;
        let rows = w.to_vec2::<f32>()?;
        let n_panels = n.div_ceil(NR);
        let mut panels = vec![0f32; n_panels * k * NR];
        panels
            .par_chunks_mut(k * NR)
            .enumerate()
            .for_each(|(p, panel)| {
                let (c0, width) = (p * NR, NR.min(n - p * NR));
                for (row, out) in rows.iter().zip(panel.chunks_exact_mut(NR)) {
                    out[..width].copy_from_slice(&row[c0..c0 + width]);
                }
            });
        Ok(PackedMatrix {
            k,
            n,
            panels,
            kernel,
        })
    }

    /// `x · W` for `x` (rows × k, row-major); returns rows × n.
    pub fn apply(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let (k, n) = (self.k, self.n);
        if x.len() != rows * k {
            bail!("{} activations for {rows} rows of {k}", x.len());
        }
        if rows == 0 {
            return Ok(Vec::new());
        }
        // Not zeroed first: the tasks below write every element once (the row blocks cover the
        // rows, the panels the columns), and zeroing the output head's 49k columns per decode
        // step was a pass over tens of megabytes for nothing.
        let mut out: Vec<f32> = Vec::with_capacity(rows * n);
        let blocks = RowBlocks::pack(x, rows, k, self.kernel);
        let n_panels = n.div_ceil(NR);
        let per_chunk = (CHUNK_BYTES / (k * NR * 4)).clamp(1, n_panels);
        let n_chunks = n_panels.div_ceil(per_chunk);
        // A narrow matrix has few chunks (a 384-column one has 3), too few to share out evenly
        // between the threads: then the row blocks are split into groups as well, each task one
        // group × chunk. Every group streams the chunk's weights again, so only then.
        let wanted_tasks = 2 * rayon::current_num_threads();
        let per_group = blocks
            .blocks
            .len()
            .div_ceil(wanted_tasks.div_ceil(n_chunks));
        let groups: Vec<&[RowBlock]> = blocks.blocks.chunks(per_group).collect();
        let c = OutPtr(out.as_mut_ptr());
        (0..n_chunks * groups.len())
            .into_par_iter()
            .for_each(|task| {
                let (chunk, group) = (task / groups.len(), groups[task % groups.len()]);
                let panels = chunk * per_chunk..((chunk + 1) * per_chunk).min(n_panels);
                for block in group {
                    for p in panels.clone() {
                        let cols = NR.min(n - p * NR);
                        let panel = &self.panels[p * k * NR..(p + 1) * k * NR];
                        // SAFETY: each (block, panel) pair writes its own rows × columns of
                        // `out`, so no two tasks write the same element; the kernel reads
                        // `k` steps of the packed block and the panel, both that long.
                        unsafe {
                            let dst = c.at(block.first_row * n + p * NR);
                            micro_kernel(self.kernel, block, panel, k, dst, n, cols);
                        }
                    }
                }
            });
        // SAFETY: every element of the first rows × n was written above (see the comment at
        // `out`), and f32 has no invalid bit patterns.
        unsafe { out.set_len(rows * n) };
        Ok(out)
    }
}

/// The output pointer, shared by tasks that write disjoint blocks of it.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

impl OutPtr {
    /// # Safety
    /// `offset` must lie inside the output.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        self.0.add(offset)
    }
}
// SAFETY: tasks write disjoint elements (see `PackedMatrix::apply`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Activation rows regrouped for the micro-kernel: a block of `height` rows stored step-major
/// (for each of the k steps, the block's rows side by side), zero-padded to the kernel's height.
struct RowBlocks {
    blocks: Vec<RowBlock>,
}

struct RowBlock {
    first_row: usize,
    /// Real rows in the block.
    rows: usize,
    /// Rows the kernel computes: the smallest kernel height that covers `rows`.
    height: usize,
    data: Vec<f32>,
}

impl RowBlocks {
    fn pack(x: &[f32], rows: usize, k: usize, kernel: Kernel) -> Self {
        let full = kernel.block_rows();
        let blocks = (0..rows.div_ceil(full))
            .into_par_iter()
            .map(|block| {
                let first_row = block * full;
                let real = full.min(rows - first_row);
                let height = kernel
                    .heights()
                    .iter()
                    .copied()
                    .find(|&h| h >= real)
                    .unwrap_or(full);
                let mut data = vec![0f32; k * height];
                for r in 0..real {
                    let src = &x[(first_row + r) * k..(first_row + r + 1) * k];
                    for (step, &v) in src.iter().enumerate() {
                        data[step * height + r] = v;
                    }
                }
                RowBlock {
                    first_row,
                    rows: real,
                    height,
                    data,
                }
            })
            .collect();
        RowBlocks { blocks }
    }
}

/// Writes `block · panel` (block.rows × cols) at `dst` (row stride `ldc`).
///
/// # Safety
/// `dst` must be valid for writes of `block.rows` rows of `cols` values at stride `ldc`, the
/// block must have been packed for `kernel`, and the CPU must run `kernel` (checked by
/// [`PackedMatrix::pack`]).
unsafe fn micro_kernel(
    kernel: Kernel,
    block: &RowBlock,
    panel: &[f32],
    k: usize,
    dst: *mut f32,
    ldc: usize,
    cols: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let (a, b) = (block.data.as_ptr(), panel.as_ptr());
        let rows = block.rows;
        match kernel {
            Kernel::Avx512 => {
                let write = (dst, ldc, cols);
                match block.height {
                    1 => avx512::kernel::<1>(a, b, k, rows, write),
                    2 => avx512::kernel::<2>(a, b, k, rows, write),
                    4 => avx512::kernel::<4>(a, b, k, rows, write),
                    8 => avx512::kernel::<8>(a, b, k, rows, write),
                    full => {
                        debug_assert_eq!(full, Kernel::Avx512.block_rows());
                        avx512::kernel::<12>(a, b, k, rows, write)
                    }
                }
            }
            // The panel's two 16-column halves, one after the other.
            Kernel::Avx2Fma => {
                for half in 0..2 {
                    let cols = cols.saturating_sub(half * 16).min(16);
                    if cols == 0 {
                        break;
                    }
                    let (b, write) = (b.add(half * 16), (dst.add(half * 16), ldc, cols));
                    match block.height {
                        1 => avx2::kernel::<1>(a, b, k, rows, write),
                        2 => avx2::kernel::<2>(a, b, k, rows, write),
                        4 => avx2::kernel::<4>(a, b, k, rows, write),
                        full => {
                            debug_assert_eq!(full, Kernel::Avx2Fma.block_rows());
                            avx2::kernel::<6>(a, b, k, rows, write)
                        }
                    }
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, block, panel, k, dst, ldc, cols);
        unreachable!("matrices are packed only on x86-64 CPUs");
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `H` rows × 32 columns: for each of the `k` steps, two panel registers times a broadcast
    /// of each row's value, accumulated in 2·H registers; then the first `rows` rows and `cols`
    /// columns are stored.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn kernel<const H: usize>(
        a: *const f32,
        b: *const f32,
        k: usize,
        rows: usize,
        (dst, ldc, cols): (*mut f32, usize, usize),
    ) {
        let mut lo = [_mm512_setzero_ps(); H];
        let mut hi = [_mm512_setzero_ps(); H];
        for step in 0..k {
            let b_lo = _mm512_loadu_ps(b.add(step * 32));
            let b_hi = _mm512_loadu_ps(b.add(step * 32 + 16));
            let a_step = a.add(step * H);
            for r in 0..H {
                let ar = _mm512_set1_ps(*a_step.add(r));
                lo[r] = _mm512_fmadd_ps(ar, b_lo, lo[r]);
                hi[r] = _mm512_fmadd_ps(ar, b_hi, hi[r]);
            }
        }
        let mask_lo: __mmask16 = if cols >= 16 {
            0xffff
        } else {
            (1u16 << cols) - 1
        };
        let mask_hi: __mmask16 = if cols >= 32 {
            0xffff
        } else if cols > 16 {
            (1u16 << (cols - 16)) - 1
        } else {
            0
        };
        for r in 0..rows.min(H) {
            let row = dst.add(r * ldc);
            _mm512_mask_storeu_ps(row, mask_lo, lo[r]);
            _mm512_mask_storeu_ps(row.add(16), mask_hi, hi[r]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `H` rows × 16 columns of a 32-column panel (`b` points at the half's first column): for
    /// each of the `k` steps, two panel registers times a broadcast of each row's value,
    /// accumulated in 2·H registers (12 of the 16 at H = 6); then the first `rows` rows and
    /// `cols` (≤ 16) columns are stored.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn kernel<const H: usize>(
        a: *const f32,
        b: *const f32,
        k: usize,
        rows: usize,
        (dst, ldc, cols): (*mut f32, usize, usize),
    ) {
        let mut lo = [_mm256_setzero_ps(); H];
        let mut hi = [_mm256_setzero_ps(); H];
        for step in 0..k {
            let b_lo = _mm256_loadu_ps(b.add(step * 32));
            let b_hi = _mm256_loadu_ps(b.add(step * 32 + 8));
            let a_step = a.add(step * H);
            for r in 0..H {
                let ar = _mm256_broadcast_ss(&*a_step.add(r));
                lo[r] = _mm256_fmadd_ps(ar, b_lo, lo[r]);
                hi[r] = _mm256_fmadd_ps(ar, b_hi, hi[r]);
            }
        }
        for r in 0..rows.min(H) {
            let row = dst.add(r * ldc);
            if cols == 16 {
                _mm256_storeu_ps(row, lo[r]);
                _mm256_storeu_ps(row.add(8), hi[r]);
            } else {
                let mut buf = [0f32; 16];
                _mm256_storeu_ps(buf.as_mut_ptr(), lo[r]);
                _mm256_storeu_ps(buf.as_mut_ptr().add(8), hi[r]);
                std::ptr::copy_nonoverlapping(buf.as_ptr(), row, cols);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], rows: usize, w: &[Vec<f32>]) -> Vec<f32> {
        let n = w[0].len();
        let mut out = vec![0f32; rows * n];
        for r in 0..rows {
            for (step, wrow) in w.iter().enumerate() {
                let xv = x[r * w.len() + step];
                for c in 0..n {
                    out[r * n + c] += xv * wrow[c];
                }
            }
        }
        out
    }

    /// Every kernel this CPU runs, every row-block height, a ragged last panel (in either half,
    /// for AVX2) and a long inner dimension, against a plain triple loop.
    #[test]
    fn packed_product_equals_the_plain_product() {
        let kernels = Kernel::supported();
        if kernels.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2 with FMA");
            return;
        }
        for kernel in kernels {
            for (k, n) in [(37, 75), (37, 89), (600, 75)] {
                packed_product_matches(kernel, k, n);
            }
        }
    }

    fn packed_product_matches(kernel: Kernel, k: usize, n: usize) {
        let w: Vec<Vec<f32>> = (0..k)
            .map(|i| {
                (0..n)
                    .map(|j| ((i * 31 + j * 7) % 13) as f32 / 7.0 - 0.9)
                    .collect()
            })
            .collect();
        let wt = Tensor::new(w.clone(), &Device::Cpu).unwrap();
        let packed = PackedMatrix::pack(&wt, kernel).unwrap();
        for rows in [1, 2, 3, 5, 6, 7, 8, 12, 13, 30] {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 17) % 11) as f32 / 5.0 - 1.0)
                .collect();
            let got = packed.apply(&x, rows).unwrap();
            let want = reference(&x, rows, &w);
            for (g, e) in got.iter().zip(&want) {
                assert!(
                    (g - e).abs() < 1e-4 * (1.0 + e.abs()),
                    "{kernel:?}, rows {rows}: {g} vs {e}"
                );
            }
        }
    }

    /// Every path a `Linear` can take here, `forward` and `forward_rows` alike, against
    /// candle's matmul.
    #[test]
    fn every_path_agrees_with_candle() {
        let w = Tensor::randn(0f32, 1.0, (64, 96), &Device::Cpu).unwrap();
        let x = Tensor::randn(0f32, 1.0, (20, 64), &Device::Cpu).unwrap();
        let want: Vec<f32> = x
            .matmul(&w)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let packed = Kernel::supported()
            .into_iter()
            .map(|kernel| Linear::Packed(PackedMatrix::pack(&w, kernel).unwrap()));
        for linear in std::iter::once(Linear::new(w.clone(), true).unwrap()).chain(packed) {
            let got: Vec<f32> = linear
                .forward(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(linear.forward_rows(&x).unwrap(), got);
            for (g, e) in got.iter().zip(&want) {
                assert!((g - e).abs() < 1e-3, "{g} vs {e}");
            }
        }
    }
}
