//! The model's weight matrices as linear maps `x · W` over row-major activations.
//!
//! Every projection of the decoder (and the 49k-column output head, a fifth of the arithmetic)
//! is a product of a few hundred activation rows with a constant weight matrix. candle's f32
//! GEMM runs its AVX2 kernels here and packs the weight matrix again on every call. On CPUs
//! with AVX-512 the weights are packed once, at load time, into column panels laid out in the
//! order a 512-bit micro-kernel reads them, which doubles the arithmetic per instruction and
//! leaves only the (small) activation block to pack per call. Other CPUs keep candle's GEMM, and
//! so do other devices (the `generic` engine: candle's matmul wherever the tensor lives).
//! `AFKIT_GEMM=candle` forces candle's GEMM, to compare the two on one machine.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// A weight matrix (in × out) applied to activation rows.
pub enum Linear {
    /// candle's matmul (any CPU, any device).
    Dense(Tensor),
    /// Panels for the AVX-512 micro-kernel.
    Packed(PackedMatrix),
}

impl Linear {
    /// `w` is (in × out). Packs it when afkit's CPU kernels run the model and this CPU has the
    /// AVX-512 one.
    pub fn new(w: Tensor, cpu_kernels: bool) -> Result<Self> {
        if cpu_kernels && packed_kernel_available() {
            Ok(Linear::Packed(PackedMatrix::pack(&w)?))
        } else {
            Ok(Linear::Dense(w.contiguous()?))
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

    /// `x · W` as plain rows (rows × out), for callers that read the result element by element
    /// (the sampler over the output head's logits).
    pub fn forward_rows(&self, x: &Tensor) -> Result<Vec<f32>> {
        match self {
            Linear::Dense(w) => Ok(x.matmul(w)?.flatten_all()?.to_vec1()?),
            Linear::Packed(p) => p.apply(&x.flatten_all()?.to_vec1::<f32>()?, x.dim(0)?),
        }
    }
}

/// Whether the packed AVX-512 kernel runs here (and is not switched off by `AFKIT_GEMM=candle`).
pub fn packed_kernel_available() -> bool {
    if std::env::var("AFKIT_GEMM").is_ok_and(|v| v == "candle") {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Columns of one panel: two 16-lane registers.
const NR: usize = 32;
/// Rows of one full micro-kernel block: 12 × 2 accumulators leave room for the two weight
/// registers and a broadcast in the 32 vector registers.
const MR: usize = 12;
/// Weight bytes a thread's chunk of panels may take, so the chunk stays in its core's L2 cache
/// while every row block passes over it.
const CHUNK_BYTES: usize = 256 * 1024;

/// A weight matrix (k × n) as ⌈n / 32⌉ panels of k × 32 values, row-major inside a panel, the
/// last panel padded with zero columns.
pub struct PackedMatrix {
    k: usize,
    n: usize,
    panels: Vec<f32>,
}

impl PackedMatrix {
    pub fn pack(w: &Tensor) -> Result<Self> {
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
        Ok(PackedMatrix { k, n, panels })
    }

    /// `x · W` for `x` (rows × k, row-major); returns rows × n.
    pub fn apply(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let (k, n) = (self.k, self.n);
        if x.len() != rows * k {
            bail!("{} activations for {rows} rows of {k}", x.len());
        }
        let mut out = vec![0f32; rows * n];
        if rows == 0 {
            return Ok(out);
        }
        let blocks = RowBlocks::pack(x, rows, k);
        let n_panels = n.div_ceil(NR);
        let per_chunk = (CHUNK_BYTES / (k * NR * 4)).clamp(1, n_panels);
        let c = OutPtr(out.as_mut_ptr());
        (0..n_panels.div_ceil(per_chunk))
            .into_par_iter()
            .for_each(|chunk| {
                let panels = chunk * per_chunk..((chunk + 1) * per_chunk).min(n_panels);
                for block in &blocks.blocks {
                    for p in panels.clone() {
                        let cols = NR.min(n - p * NR);
                        let panel = &self.panels[p * k * NR..(p + 1) * k * NR];
                        // SAFETY: each (block, panel) pair writes its own rows × columns of
                        // `out`, so no two tasks write the same element; the kernel reads
                        // `k` steps of the packed block and the panel, both that long.
                        unsafe {
                            let dst = c.at(block.first_row * n + p * NR);
                            micro_kernel(block, panel, k, dst, n, cols);
                        }
                    }
                }
            });
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
    fn pack(x: &[f32], rows: usize, k: usize) -> Self {
        let blocks = (0..rows)
            .step_by(MR)
            .map(|first_row| {
                let real = MR.min(rows - first_row);
                let height = [1, 2, 4, 8, MR]
                    .into_iter()
                    .find(|&h| h >= real)
                    .unwrap_or(MR);
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
/// `dst` must be valid for writes of `block.rows` rows of `cols` values at stride `ldc`, and the
/// CPU must have AVX-512F (checked by [`packed_kernel_available`] before any matrix is packed).
unsafe fn micro_kernel(
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
        let (rows, write) = (block.rows, (dst, ldc, cols));
        match block.height {
            1 => avx512::kernel::<1>(a, b, k, rows, write),
            2 => avx512::kernel::<2>(a, b, k, rows, write),
            4 => avx512::kernel::<4>(a, b, k, rows, write),
            8 => avx512::kernel::<8>(a, b, k, rows, write),
            _ => avx512::kernel::<MR>(a, b, k, rows, write),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (block, panel, k, dst, ldc, cols);
        unreachable!("matrices are packed only on x86-64 CPUs with AVX-512");
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

    /// Every row-block height and a ragged last panel, against a plain triple loop.
    #[test]
    fn packed_product_equals_the_plain_product() {
        if !packed_kernel_available() {
            eprintln!("skipped: this CPU has no AVX-512F, the packed kernel is not used here");
            return;
        }
        let (k, n) = (37, 75);
        let w: Vec<Vec<f32>> = (0..k)
            .map(|i| {
                (0..n)
                    .map(|j| ((i * 31 + j * 7) % 13) as f32 / 7.0 - 0.9)
                    .collect()
            })
            .collect();
        let wt = Tensor::new(w.clone(), &Device::Cpu).unwrap();
        let packed = PackedMatrix::pack(&wt).unwrap();
        for rows in [1, 2, 3, 5, 8, 12, 13, 30] {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 17) % 11) as f32 / 5.0 - 1.0)
                .collect();
            let got = packed.apply(&x, rows).unwrap();
            let want = reference(&x, rows, &w);
            for (g, e) in got.iter().zip(&want) {
                assert!((g - e).abs() < 1e-4, "rows {rows}: {g} vs {e}");
            }
        }
    }

    #[test]
    fn both_paths_agree_with_candle() {
        let w = Tensor::randn(0f32, 1.0, (64, 96), &Device::Cpu).unwrap();
        let x = Tensor::randn(0f32, 1.0, (20, 64), &Device::Cpu).unwrap();
        let want: Vec<f32> = x
            .matmul(&w)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let linear = Linear::new(w, true).unwrap();
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
