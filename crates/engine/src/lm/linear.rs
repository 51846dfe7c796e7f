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
//! the tensor lives). `AFKIT_GEMM=candle` forces candle's GEMM and `AFKIT_SIMD=avx2` the AVX2
//! kernel, to compare them on one machine; debug builds use candle's unless `AFKIT_GEMM=packed`
//! (see [`packed_kernel`]).
//!
//! A matrix can also be packed in bfloat16 ([`Precision::Bf16`]), for the sentence encoder:
//! weights and activations are rounded to bf16 and their products, exact in f32, are added in
//! f32 two steps at a time. CPUs with AVX512-BF16 do that with `vdpbf16ps`, twice the
//! multiply-adds of an f32 FMA per instruction; other x86-64 CPUs with AVX2 and FMA run the same
//! additions in the same order with f32 FMAs, so every machine computes the same bits (short of
//! subnormal values, which `vdpbf16ps` flushes to zero).
//!
//! Language models take the fastest arithmetic the CPU has ([`Linear::fastest`]): on CPUs with
//! AMX, bf16 products on its tiles ([`Precision::Bf16Tiles`], see [`amx`]), many times the
//! multiply-adds of AVX-512 per cycle; on CPUs with AVX512-BF16 and no AMX, the bf16 kernel's
//! `vdpbf16ps`; elsewhere f32 ([`fast_bf16_kernel`]). The cross-encoder scores the same way.
//! `AFKIT_SIMD=avx512bf16` keeps AMX off, `AFKIT_SIMD=avx512` AVX512-BF16 too, as
//! `AFKIT_SIMD=avx2` keeps AVX-512 off. Asked for (`AFKIT_LM_INT8=1`, [`LmProducts::Int8`]), a
//! language model multiplies in 8 bits on CPUs with AVX-512 VNNI instead ([`int8`]: per-column
//! weight scales, per-block activation scales, `vpdpbusd`): coarser than bf16, and on CPUs
//! without bf16 instructions several times the multiply-adds of f32 per cycle.

mod amx;
mod bf16;
mod int8;
mod tasks;
pub(crate) mod trainable;

use std::sync::Arc;

use anyhow::{bail, Result};
use candle_core::Tensor;
use rayon::prelude::*;

use crate::device::{Compute, LmProducts};
use crate::simd::SimdLevel;
pub(crate) use bf16::round_to_bf16;
use bf16::{bf16_as_f32, bf16_bits, bf16_word};
use tasks::{plan_tasks, OutPtr, NR};
use trainable::PackedDense;

/// A weight matrix (in × out) applied to activation rows.
pub(crate) enum Linear {
    /// candle's matmul (any CPU, any device).
    Dense(Tensor),
    /// candle's matmul over bf16-rounded weights; the activations are rounded on every call,
    /// so the products equal the packed bf16 kernels' up to the order of the additions.
    DenseBf16(Tensor),
    /// Panels for afkit's micro-kernels.
    Packed(PackedMatrix),
    /// A fixed matrix on afkit's kernels (bf16 or f32), packed both ways round so that
    /// [`Linear::forward`] passes gradients back to its input: the base matrices and the output
    /// head of a model whose LoRA adapter trains.
    Frozen(Arc<PackedDense>),
}

impl Linear {
    /// `w` is (in × out). Packs it when afkit's CPU kernels run the model and this CPU has one
    /// of its micro-kernels.
    pub(crate) fn new(w: Tensor, cpu_kernels: bool) -> Result<Self> {
        match packed_kernel(Precision::F32).filter(|_| cpu_kernels) {
            Some(kernel) => Ok(Linear::Packed(PackedMatrix::pack(&w, kernel)?)),
            None => Ok(Linear::Dense(w.contiguous()?)),
        }
    }

    /// The matrix (in × out) whose `inputs` rows lie end to end in `w`, packed for `kernel`
    /// (for matrices built during a pass, such as a prefix's keys).
    pub(crate) fn packed_rows(w: &[f32], inputs: usize, kernel: Kernel) -> Result<Self> {
        let outputs = w.len() / inputs.max(1);
        Ok(Linear::Packed(PackedMatrix::pack_rows(
            w, inputs, outputs, kernel,
        )?))
    }

    /// `w` (in × out) in the arithmetic `compute.lm_products` asks for: with
    /// [`LmProducts::Fastest`], [`fast_bf16_kernel`]'s bf16 products where this CPU has them
    /// (a bf16 operand keeps 8 of an f32's 24 significant bits; the sums stay f32); with
    /// [`LmProducts::Int8`], 8-bit products ([`int8`]) where it has AVX-512 VNNI, else as
    /// `Fastest`; otherwise as [`Linear::new`].
    pub(crate) fn fastest(w: Tensor, compute: &Compute) -> Result<Self> {
        let kernel = match compute.lm_products {
            _ if !compute.cpu_kernels => None,
            LmProducts::F32 => None,
            LmProducts::Fastest => fast_bf16_kernel(),
            LmProducts::Int8 => lm_int8_kernel().or_else(fast_bf16_kernel),
        };
        match kernel {
            Some(kernel) => Ok(Linear::Packed(PackedMatrix::pack(&w, kernel)?)),
            None => Self::new(w, compute.cpu_kernels),
        }
    }

    /// `w` (in × out) in bf16 on AMX tiles where this CPU has them, else packed in f32 (or
    /// candle's matmul where it has no kernel).
    pub(crate) fn bf16_tiles(w: Tensor) -> Result<Self> {
        match packed_kernel(Precision::Bf16Tiles) {
            Some(kernel) => Ok(Linear::Packed(PackedMatrix::pack(&w, kernel)?)),
            None => Self::new(w, true),
        }
    }

    /// `w` (in × out) in 8-bit products ([`int8`]) where this CPU has AVX-512 VNNI, else packed
    /// in f32 (or candle's matmul where it has no kernel).
    pub(crate) fn int8(w: Tensor) -> Result<Self> {
        match packed_kernel(Precision::Int8) {
            Some(kernel) => Ok(Linear::Packed(PackedMatrix::pack(&w, kernel)?)),
            None => Self::new(w, true),
        }
    }

    /// `w` (in × out) in bf16 arithmetic (see the module's comment), packed for this CPU's
    /// bf16 kernel where it has one.
    pub(crate) fn bf16(w: Tensor) -> Result<Self> {
        match packed_kernel(Precision::Bf16) {
            Some(kernel) => Ok(Linear::Packed(PackedMatrix::pack(&w, kernel)?)),
            None => {
                let rounded: Vec<f32> = w.flatten_all()?.to_vec1()?;
                let rounded = rounded.into_iter().map(round_to_bf16).collect();
                Ok(Linear::DenseBf16(Tensor::from_vec(
                    rounded,
                    w.dims2()?,
                    w.device(),
                )?))
            }
        }
    }

    /// `w` (in × out) packed for `kernel` (one of this CPU's), as [`Linear::Frozen`].
    pub(crate) fn frozen(w: &Tensor, kernel: Kernel) -> Result<Self> {
        Ok(Linear::Frozen(Arc::new(PackedDense::new(&w.t()?, kernel)?)))
    }

    /// Whether [`Linear::forward`] passes gradients back to `x` (candle's matmul and the
    /// frozen op do; the packed forms compute plain rows).
    pub(crate) fn passes_gradients(&self) -> bool {
        matches!(self, Linear::Dense(_) | Linear::Frozen(_))
    }

    /// `x · W` for `x` (rows × in).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(w) => Ok(x.matmul(w)?),
            Linear::Frozen(p) => Ok(trainable::frozen(x, p.clone())?),
            Linear::DenseBf16(_) | Linear::Packed(_) => {
                let n = self.outputs()?;
                let out = self.forward_rows(x)?;
                Ok(Tensor::from_vec(out, (x.dim(0)?, n), x.device())?)
            }
        }
    }

    /// `x · W` for `x` given as plain rows (rows × in, row-major), for models that keep their
    /// activations outside tensors (the sentence encoder).
    pub(crate) fn apply(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        match self {
            Linear::Dense(w) => dense_apply(w, x, rows),
            Linear::DenseBf16(w) => {
                let x: Vec<f32> = x.iter().copied().map(round_to_bf16).collect();
                dense_apply(w, &x, rows)
            }
            Linear::Packed(p) => p.apply(x, rows),
            Linear::Frozen(p) => p.apply(x, rows),
        }
    }

    /// Output columns.
    fn outputs(&self) -> Result<usize> {
        match self {
            Linear::Dense(w) | Linear::DenseBf16(w) => Ok(w.dim(1)?),
            Linear::Packed(p) => Ok(p.n),
            Linear::Frozen(p) => Ok(p.outputs()),
        }
    }

    /// `x · W` as plain rows (rows × out), for callers that read the result element by element
    /// (the sampler over the output head's logits).
    pub(crate) fn forward_rows(&self, x: &Tensor) -> Result<Vec<f32>> {
        match self {
            Linear::Dense(w) => Ok(x.matmul(w)?.flatten_all()?.to_vec1()?),
            Linear::DenseBf16(_) | Linear::Packed(_) | Linear::Frozen(_) => {
                self.apply(&x.flatten_all()?.to_vec1::<f32>()?, x.dim(0)?)
            }
        }
    }
}

/// What a packed matrix rounds its operands to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Precision {
    /// f32 operands, one multiply-add per step.
    F32,
    /// bf16 operands (rounded to nearest, ties to even) and f32 sums: for each pair of steps,
    /// the odd step's product is added, then the even step's (the order of `vdpbf16ps`).
    Bf16,
    /// bf16 operands and f32 sums in the order of AMX's tile products: only CPUs with AMX
    /// compute it.
    Bf16Tiles,
    /// Signed 8-bit operands, each weight column and each block of 32 activation steps with a
    /// scale of its own ([`int8`]): only CPUs with AVX-512 VNNI compute it.
    Int8,
}

/// `x · w` with candle's matmul, for plain rows `x` (rows × in).
fn dense_apply(w: &Tensor, x: &[f32], rows: usize) -> Result<Vec<f32>> {
    let x = Tensor::from_slice(x, (rows, w.dim(0)?), w.device())?;
    Ok(x.matmul(w)?.flatten_all()?.to_vec1()?)
}

/// The AVX-512 kernels of [`Precision::Bf16`], the faster first: `vdpbf16ps` where the CPU has it
/// and runs it faster than fused multiply-adds, the same sums by fused multiply-adds elsewhere.
/// Both give the same bits, so the order changes the speed alone.
#[cfg(target_arch = "x86_64")]
fn bf16_register_kernels() -> Vec<Kernel> {
    if !std::is_x86_feature_detected!("avx512bf16") {
        return vec![Kernel::Avx512FmaBf16];
    }
    match bf16_dot_products_faster() {
        true => vec![Kernel::Avx512Bf16, Kernel::Avx512FmaBf16],
        false => vec![Kernel::Avx512FmaBf16, Kernel::Avx512Bf16],
    }
}

/// Whether AVX512-BF16's `vdpbf16ps` is faster here than the same sums by fused multiply-adds:
/// on AMD's cores, which run it at full width (Zen 4: 1.4× f32's speed); on Intel's Xeons the
/// FMAs are faster (BENCHMARKS.md, "bf16 sums by fused multiply-adds"). `AFKIT_BF16_DOT=1` or
/// `0` decides instead (the results are the same bits either way), so one machine can time both.
#[cfg(target_arch = "x86_64")]
fn bf16_dot_products_faster() -> bool {
    static FASTER: std::sync::LazyLock<bool> =
        std::sync::LazyLock::new(|| match std::env::var("AFKIT_BF16_DOT").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => cpu_vendor() == *b"AuthenticAMD",
        });
    *FASTER
}

/// The CPU's vendor string (`GenuineIntel`, `AuthenticAMD`, ...).
#[cfg(target_arch = "x86_64")]
fn cpu_vendor() -> [u8; 12] {
    let id = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    for (out, word) in vendor.chunks_exact_mut(4).zip([id.ebx, id.edx, id.ecx]) {
        out.copy_from_slice(&word.to_le_bytes());
    }
    vendor
}

/// The micro-kernels a packed matrix can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// f32: 12 rows × 32 columns of 512-bit accumulators.
    Avx512,
    /// f32: 6 rows × 16 columns of 256-bit accumulators with fused multiply-adds.
    Avx2Fma,
    /// bf16: 12 rows × 32 columns, `vdpbf16ps` on pairs of steps.
    Avx512Bf16,
    /// bf16 on CPUs without bf16 instructions: 6 rows × 16 columns, each pair of bf16 weights
    /// widened to two f32 registers and added with fused multiply-adds in `vdpbf16ps`'s order.
    Avx2FmaBf16,
    /// bf16 as `Avx2FmaBf16` in 12 rows × 32 columns of 512-bit registers: `vdpbf16ps`'s sums
    /// where it is missing or slower than fused multiply-adds (Intel's cores).
    Avx512FmaBf16,
    /// bf16 on AMX tiles: 32 rows × 32 columns of f32 sums in four tiles, 32 steps at a time.
    AmxBf16,
    /// 8-bit: 6 rows × 32 columns, `vpdpbusd` on four steps at a time (see [`int8`]).
    Avx512Vnni,
}

impl Kernel {
    /// Every kernel this CPU can run, fastest first for each precision.
    pub fn supported() -> Vec<Kernel> {
        let mut kernels = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = std::is_x86_feature_detected!("avx512f");
            if avx512 {
                kernels.push(Kernel::Avx512);
            }
            if avx512 {
                kernels.extend(bf16_register_kernels());
            }
            if avx512 && std::is_x86_feature_detected!("avx512vnni") {
                kernels.push(Kernel::Avx512Vnni);
            }
            if crate::simd::avx2_fma() {
                kernels.extend([Kernel::Avx2Fma, Kernel::Avx2FmaBf16]);
            }
            if avx512 && amx::available() {
                kernels.push(Kernel::AmxBf16);
            }
        }
        kernels
    }

    /// What the kernel rounds its operands to.
    pub(crate) fn precision(self) -> Precision {
        match self {
            Kernel::Avx512 | Kernel::Avx2Fma => Precision::F32,
            Kernel::Avx512Bf16 | Kernel::Avx2FmaBf16 | Kernel::Avx512FmaBf16 => Precision::Bf16,
            Kernel::AmxBf16 => Precision::Bf16Tiles,
            Kernel::Avx512Vnni => Precision::Int8,
        }
    }

    /// The instruction set the kernel needs, for `AFKIT_SIMD`'s ceiling.
    fn level(self) -> SimdLevel {
        match self {
            Kernel::Avx2Fma | Kernel::Avx2FmaBf16 => SimdLevel::Avx2,
            Kernel::Avx512 | Kernel::Avx512Vnni | Kernel::Avx512FmaBf16 => SimdLevel::Avx512,
            Kernel::Avx512Bf16 => SimdLevel::Avx512Bf16,
            Kernel::AmxBf16 => SimdLevel::Amx,
        }
    }

    fn is_avx2(self) -> bool {
        self.level() == SimdLevel::Avx2
    }

    /// Rows of a full row block: as many accumulators as leave room, in the CPU's vector
    /// registers, for the panel's values and a broadcast (32 registers with AVX-512, 16 with AVX2;
    /// the int8 kernel keeps integer sums beside the f32 ones).
    fn block_rows(self) -> usize {
        *self.heights().last().expect("every kernel has heights")
    }

    /// The heights a row block may have: a short last block runs the smallest that covers it.
    fn heights(self) -> &'static [usize] {
        if self.is_avx2() || self == Kernel::Avx512Vnni {
            &[1, 2, 4, 6]
        } else {
            &[1, 2, 4, 8, 12]
        }
    }

    /// 32-bit words a panel column holds for `k` steps: one f32 per step, one pair of bf16
    /// per two steps (an odd `k` padded with a zero step), or four bytes per four steps.
    fn words(self, k: usize) -> usize {
        match self.precision() {
            Precision::F32 => k,
            Precision::Bf16 => k.div_ceil(2),
            Precision::Bf16Tiles => amx::words(k),
            Precision::Int8 => k.div_ceil(int8::STEPS_PER_WORD),
        }
    }
}

/// The kernel packed matrices of `precision` use here: the fastest this CPU has.
/// `AFKIT_GEMM=candle` keeps candle's GEMM, and so does a debug build unless
/// `AFKIT_GEMM=packed`: there afkit's own code is unoptimised while candle's (a dependency) is
/// built optimised, and the kernels' intrinsics, left as calls, would run many times slower than
/// candle (the test suite would crawl). `AFKIT_SIMD=avx2` (or the older `AFKIT_GEMM=avx2`)
/// takes the AVX2 kernels where AVX-512 is there too, and `AFKIT_SIMD=avx512` the AVX-512 ones
/// where AMX is there too, so that one machine can time every path.
pub(crate) fn packed_kernel(precision: Precision) -> Option<Kernel> {
    let gemm = std::env::var("AFKIT_GEMM").ok();
    choose_kernel(&Kernel::supported(), precision, gemm.as_deref(), ceiling())
}

/// The highest instruction set the kernels may use (`AFKIT_SIMD`, or the older `AFKIT_GEMM=avx2`).
fn ceiling() -> SimdLevel {
    match std::env::var("AFKIT_GEMM").as_deref() {
        Ok("avx2") => SimdLevel::Avx2,
        _ => crate::simd::simd_ceiling(),
    }
}

/// The kernel a model's products take where reduced precision is allowed (the language models,
/// the cross-encoder's scoring): bf16 on AMX tiles, else bf16 where the CPU has AVX512-BF16,
/// else none (f32). On AMD's cores (Zen 4 on) `vdpbf16ps` runs at full width, faster than f32;
/// on Intel's the same sums by fused multiply-adds run about as fast as f32, and keep the
/// numbers those CPUs gave with `vdpbf16ps`. Without AVX512-BF16 the register kernels are no
/// faster than f32, so they are never taken for speed.
pub(crate) fn fast_bf16_kernel() -> Option<Kernel> {
    let bf16_instructions = Kernel::supported().contains(&Kernel::Avx512Bf16)
        && ceiling() >= Kernel::Avx512Bf16.level();
    let registers = packed_kernel(Precision::Bf16).filter(|_| bf16_instructions);
    packed_kernel(Precision::Bf16Tiles).or(registers)
}

/// The kernel products with gradients take (training the cross-encoder, adapting a language
/// model): [`fast_bf16_kernel`]'s, else afkit's f32 kernel, which packs each weight once per
/// step where candle's matmul packs it on every call.
pub(crate) fn fast_training_kernel() -> Option<Kernel> {
    fast_bf16_kernel().or_else(|| packed_kernel(Precision::F32))
}

/// The kernel of a language model's 8-bit products: AVX-512 VNNI's ([`int8`]) where the CPU
/// has it (within `AFKIT_SIMD`'s cap). Where it has not, says so once: the products then run
/// as they would without `AFKIT_LM_INT8`.
fn lm_int8_kernel() -> Option<Kernel> {
    static KERNEL: std::sync::LazyLock<Option<Kernel>> = std::sync::LazyLock::new(|| {
        let kernel = packed_kernel(Precision::Int8);
        if kernel.is_none() {
            eprintln!(
                "AFKIT_LM_INT8=1: this CPU has no AVX-512 VNNI (or AFKIT_SIMD keeps it off); \
                 the language models multiply as they would without it"
            );
        }
        kernel
    });
    *KERNEL
}

/// The precision of [`fast_bf16_kernel`]: f32 on a CPU that has none.
pub(crate) fn fast_precision() -> Precision {
    fast_bf16_kernel().map_or(Precision::F32, Kernel::precision)
}

/// [`packed_kernel`]'s choice among the `supported` kernels, given `AFKIT_GEMM` and the highest
/// instruction set the kernels may use.
fn choose_kernel(
    supported: &[Kernel],
    precision: Precision,
    gemm: Option<&str>,
    ceiling: SimdLevel,
) -> Option<Kernel> {
    let mut usable = supported
        .iter()
        .copied()
        .filter(|k| k.precision() == precision && k.level() <= ceiling);
    match gemm {
        Some("candle") => None,
        Some("packed" | "avx2") => usable.next(),
        _ if cfg!(debug_assertions) => None,
        _ => usable.next(),
    }
}

/// Where the AVX2 bf16 kernel keeps column `c` (of 32) among a step's 32 bf16 weights: each
/// 16-column half is one 256-bit register, ordered so that interleaving it with zeros, within
/// each 128-bit lane, gives columns 0–7 of the half from the low words and 8–15 from the high
/// ones: [0–3, 8–11 | 4–7, 12–15].
fn avx2_bf16_position(c: usize) -> usize {
    let (half, c) = (c / 16, c % 16);
    half * 16
        + match c {
            4..8 => c + 4,
            8..12 => c - 4,
            _ => c,
        }
}

/// A weight matrix (k × n) as ⌈n / 32⌉ panels of 32 columns, row-major inside a panel, the last
/// panel padded with zero columns. A panel row is one step of f32 values, or for the bf16
/// kernels two steps of bf16 held in 32 f32 words: for `vdpbf16ps` and its FMA form each word a
/// column's pair (the even step in the low half), for the AVX2 bf16 kernel the odd step's 32
/// values and then the even step's (see [`avx2_bf16_position`]).
pub struct PackedMatrix {
    k: usize,
    n: usize,
    panels: Vec<f32>,
    /// The int8 kernel's column scales, 32 per panel (zero past the matrix); empty for others.
    column_scales: Vec<f32>,
    kernel: Kernel,
}

impl PackedMatrix {
    /// Packs `w` for `kernel`, which must be one of [`Kernel::supported`].
    pub fn pack(w: &Tensor, kernel: Kernel) -> Result<Self> {
        let (k, n) = w.dims2()?;
        Self::pack_rows(&w.flatten_all()?.to_vec1::<f32>()?, k, n, kernel)
    }

    /// Packs the matrix whose `k` rows of `n` values lie end to end in `w`.
    pub(crate) fn pack_rows(w: &[f32], k: usize, n: usize, kernel: Kernel) -> Result<Self> {
        if !Kernel::supported().contains(&kernel) {
            bail!("this CPU cannot run the {kernel:?} kernel");
        }
        if w.len() != k * n {
            bail!("{} values for a {k} × {n} matrix", w.len());
        }
        let rows: Vec<&[f32]> = w.chunks_exact(n.max(1)).collect();
        let words = kernel.words(k);
        let n_panels = n.div_ceil(NR);
        let column_scales: Vec<f32> = match kernel.precision() {
            Precision::Int8 => (0..n_panels * NR)
                .map(|c| match c < n {
                    true => int8::scale_of(rows.iter().map(|row| row[c])),
                    false => 0.0,
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut panels = vec![0f32; n_panels * words * NR];
        panels
            .par_chunks_mut(words * NR)
            .enumerate()
            .for_each(|(p, panel)| {
                let (c0, width) = (p * NR, NR.min(n - p * NR));
                let columns = c0..c0 + width;
                let value = |step: usize, c: usize| match rows.get(step) {
                    Some(row) if c < width => row[c0 + c],
                    _ => 0.0,
                };
                match kernel {
                    Kernel::Avx512 | Kernel::Avx2Fma => {
                        for (out, row) in panel.chunks_exact_mut(NR).zip(&rows) {
                            out[..width].copy_from_slice(&row[columns.clone()]);
                        }
                    }
                    Kernel::AmxBf16 => amx::pack_panel(panel, value),
                    Kernel::Avx512Vnni => {
                        int8::pack_panel(panel, &column_scales[p * NR..(p + 1) * NR], value)
                    }
                    _ => pack_bf16_panel(kernel, panel, value),
                }
            });
        Ok(PackedMatrix {
            k,
            n,
            panels,
            column_scales,
            kernel,
        })
    }

    /// The kernel the matrix is packed for.
    pub(crate) fn kernel(&self) -> Kernel {
        self.kernel
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
        if self.kernel == Kernel::AmxBf16 {
            return Ok(amx::apply(&self.panels, k, n, x, rows));
        }
        let words = self.kernel.words(k);
        // Not zeroed first: the tasks below write every element once (the row blocks cover the
        // rows, the panels the columns), and zeroing the output head's 49k columns per decode
        // step was a pass over tens of megabytes for nothing.
        let mut out: Vec<f32> = Vec::with_capacity(rows * n);
        let blocks = RowBlocks::pack(x, rows, k, self.kernel);
        let n_panels = n.div_ceil(NR);
        let (per_chunk, per_group) = plan_tasks(n_panels, words * NR * 4, blocks.blocks.len());
        let n_chunks = n_panels.div_ceil(per_chunk);
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
                        let panel = Panel {
                            words: &self.panels[p * words * NR..(p + 1) * words * NR],
                            column_scales: self.column_scales.get(p * NR..(p + 1) * NR),
                        };
                        // SAFETY: each (block, panel) pair writes its own rows × columns of
                        // `out`, so no two tasks write the same element; the kernel reads
                        // `words` rows of the packed block and the panel, both that long.
                        unsafe {
                            let dst = c.at(block.first_row * n + p * NR);
                            micro_kernel(self.kernel, block, panel, words, dst, n, cols);
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

/// Fills `panel` (a row of 32 words per pair of steps, see [`PackedMatrix`]) with the panel's
/// weights, `value(step, column)` (zero past the matrix), for one of the bf16 register kernels.
fn pack_bf16_panel(kernel: Kernel, panel: &mut [f32], value: impl Fn(usize, usize) -> f32) {
    for (word, out) in panel.chunks_exact_mut(NR).enumerate() {
        match kernel {
            Kernel::Avx512Bf16 | Kernel::Avx512FmaBf16 => {
                for (c, out) in out.iter_mut().enumerate() {
                    let (even, odd) = (value(2 * word, c), value(2 * word + 1, c));
                    *out = bf16_word(bf16_bits(even), bf16_bits(odd));
                }
            }
            Kernel::Avx2FmaBf16 => {
                let mut halves = [0u16; 2 * NR];
                for c in 0..NR {
                    let (odd, even) = (value(2 * word + 1, c), value(2 * word, c));
                    let at = avx2_bf16_position(c);
                    halves[at] = bf16_bits(odd);
                    halves[NR + at] = bf16_bits(even);
                }
                for (out, two) in out.iter_mut().zip(halves.chunks_exact(2)) {
                    *out = bf16_word(two[0], two[1]);
                }
            }
            _ => unreachable!("{kernel:?} panels are not pairs of bf16 in registers"),
        }
    }
}

/// Activation rows regrouped for the micro-kernel: a block of `height` rows stored word-major
/// (for each word of the panels' columns, what the kernel broadcasts of the block's rows side by
/// side), zero-padded to the kernel's height and to whole words.
struct RowBlocks {
    blocks: Vec<RowBlock>,
}

/// One panel of a packed matrix as a micro-kernel reads it.
struct Panel<'a> {
    words: &'a [f32],
    /// The int8 kernel's 32 column scales.
    column_scales: Option<&'a [f32]>,
}

struct RowBlock {
    first_row: usize,
    /// Real rows in the block.
    rows: usize,
    /// Rows the kernel computes: the smallest kernel height that covers `rows`.
    height: usize,
    /// Per word, `height` values: f32 values for the f32 kernels, bf16 pairs (as
    /// [`PackedMatrix`]'s panels) for `vdpbf16ps`; for the bf16 FMA kernels `2·height` values,
    /// the odd step's rounded values and then the even step's, in the order they are added;
    /// for the int8 kernel each row's four steps as signed bytes.
    data: Vec<f32>,
    /// The int8 kernel's activation scales and offsets ([`int8::QuantizedRows`]); empty for
    /// the others.
    scales: Vec<f32>,
    offsets: Vec<f32>,
}

impl RowBlocks {
    fn pack(x: &[f32], rows: usize, k: usize, kernel: Kernel) -> Self {
        let full = kernel.block_rows();
        let words = kernel.words(k);
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
                let rows: Vec<&[f32]> = (first_row..first_row + real)
                    .map(|r| &x[r * k..(r + 1) * k])
                    .collect();
                let (data, scales, offsets) = match kernel.precision() {
                    Precision::Int8 => {
                        let q = int8::quantize_rows(&rows, k, height);
                        (q.data, q.scales, q.offsets)
                    }
                    _ => (
                        words_of(&rows, words, height, kernel),
                        Vec::new(),
                        Vec::new(),
                    ),
                };
                RowBlock {
                    first_row,
                    rows: real,
                    height,
                    data,
                    scales,
                    offsets,
                }
            })
            .collect();
        RowBlocks { blocks }
    }
}

/// `rows` (at most `height`) word-major for an f32 or bf16 register kernel (see
/// [`RowBlock::data`]), zero-padded to `height` rows and `words` words.
fn words_of(rows: &[&[f32]], words: usize, height: usize, kernel: Kernel) -> Vec<f32> {
    let per_word = match kernel {
        Kernel::Avx2FmaBf16 | Kernel::Avx512FmaBf16 => 2 * height,
        _ => height,
    };
    let mut data = vec![0f32; words * per_word];
    // One row's bf16, padded to whole pairs (none for the f32 kernels).
    let mut bits = match kernel.precision() {
        Precision::F32 => Vec::new(),
        Precision::Bf16 => vec![0u16; 2 * words],
        Precision::Bf16Tiles => unreachable!("AMX packs its own activations"),
        Precision::Int8 => unreachable!("int8 blocks are quantized by `int8::quantize_rows`"),
    };
    for (r, row) in rows.iter().enumerate() {
        for (b, &v) in bits.iter_mut().zip(*row) {
            *b = bf16_bits(v);
        }
        let slots = data.chunks_exact_mut(per_word);
        match kernel {
            Kernel::Avx512 | Kernel::Avx2Fma => slots.zip(*row).for_each(|(slot, &v)| slot[r] = v),
            Kernel::Avx512Bf16 => slots
                .zip(bits.chunks_exact(2))
                .for_each(|(slot, pair)| slot[r] = bf16_word(pair[0], pair[1])),
            Kernel::Avx2FmaBf16 | Kernel::Avx512FmaBf16 => {
                for (slot, pair) in slots.zip(bits.chunks_exact(2)) {
                    slot[r] = bf16_as_f32(pair[1]);
                    slot[height + r] = bf16_as_f32(pair[0]);
                }
            }
            Kernel::AmxBf16 | Kernel::Avx512Vnni => {
                unreachable!("{kernel:?} packs its activations otherwise")
            }
        }
    }
    data
}

/// Writes `block · panel` (block.rows × cols) at `dst` (row stride `ldc`), over `words` rows of
/// the panel.
///
/// # Safety
/// `dst` must be valid for writes of `block.rows` rows of `cols` values at stride `ldc`, the
/// block must have been packed for `kernel`, and the CPU must run `kernel` (checked by
/// [`PackedMatrix::pack`]).
unsafe fn micro_kernel(
    kernel: Kernel,
    block: &RowBlock,
    panel: Panel,
    words: usize,
    dst: *mut f32,
    ldc: usize,
    cols: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if kernel == Kernel::Avx512Vnni {
            micro_kernel_int8(block, panel, words, (dst, ldc, cols));
        } else if kernel.is_avx2() {
            micro_kernel_avx2(kernel, block, panel, words, (dst, ldc, cols));
        } else {
            micro_kernel_avx512(kernel, block, panel, words, (dst, ldc, cols));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (kernel, block, panel, words, dst, ldc, cols);
        unreachable!("matrices are packed only on x86-64 CPUs");
    }
}

/// [`micro_kernel`] for the AVX-512 register kernels (f32, `vdpbf16ps`, bf16 by FMAs).
///
/// # Safety
/// As [`micro_kernel`]'s.
#[cfg(target_arch = "x86_64")]
unsafe fn micro_kernel_avx512(
    kernel: Kernel,
    block: &RowBlock,
    panel: Panel,
    words: usize,
    write: (*mut f32, usize, usize),
) {
    debug_assert!(kernel.heights().contains(&block.height));
    let (a, b, rows) = (block.data.as_ptr(), panel.words.as_ptr(), block.rows);
    match (kernel, block.height) {
        (Kernel::Avx512Bf16, 1) => avx512::kernel_bf16::<1>(a, b, words, rows, write),
        (Kernel::Avx512Bf16, 2) => avx512::kernel_bf16::<2>(a, b, words, rows, write),
        (Kernel::Avx512Bf16, 4) => avx512::kernel_bf16::<4>(a, b, words, rows, write),
        (Kernel::Avx512Bf16, 8) => avx512::kernel_bf16::<8>(a, b, words, rows, write),
        (Kernel::Avx512Bf16, _) => avx512::kernel_bf16::<12>(a, b, words, rows, write),
        (Kernel::Avx512FmaBf16, 1) => avx512::kernel_bf16_fma::<1>(a, b, words, rows, write),
        (Kernel::Avx512FmaBf16, 2) => avx512::kernel_bf16_fma::<2>(a, b, words, rows, write),
        (Kernel::Avx512FmaBf16, 4) => avx512::kernel_bf16_fma::<4>(a, b, words, rows, write),
        (Kernel::Avx512FmaBf16, 8) => avx512::kernel_bf16_fma::<8>(a, b, words, rows, write),
        (Kernel::Avx512FmaBf16, _) => avx512::kernel_bf16_fma::<12>(a, b, words, rows, write),
        (_, 1) => avx512::kernel::<1>(a, b, words, rows, write),
        (_, 2) => avx512::kernel::<2>(a, b, words, rows, write),
        (_, 4) => avx512::kernel::<4>(a, b, words, rows, write),
        (_, 8) => avx512::kernel::<8>(a, b, words, rows, write),
        (_, _) => avx512::kernel::<12>(a, b, words, rows, write),
    }
}

/// [`micro_kernel`] for the AVX2 kernels: the panel's two 16-column halves, one after the
/// other.
///
/// # Safety
/// As [`micro_kernel`]'s.
#[cfg(target_arch = "x86_64")]
unsafe fn micro_kernel_avx2(
    kernel: Kernel,
    block: &RowBlock,
    panel: Panel,
    words: usize,
    (dst, ldc, cols): (*mut f32, usize, usize),
) {
    let (a, b, rows) = (block.data.as_ptr(), panel.words.as_ptr(), block.rows);
    for half in 0..2 {
        let cols = cols.saturating_sub(half * 16).min(16);
        if cols == 0 {
            break;
        }
        let bf16 = kernel == Kernel::Avx2FmaBf16;
        // A half is 16 f32 words, or 16 bf16 (8 words) of each step (see
        // `avx2_bf16_position`).
        let b = b.add(half * if bf16 { 8 } else { 16 });
        let write = (dst.add(half * 16), ldc, cols);
        match (block.height, bf16) {
            (1, false) => avx2::kernel::<1>(a, b, words, rows, write),
            (2, false) => avx2::kernel::<2>(a, b, words, rows, write),
            (4, false) => avx2::kernel::<4>(a, b, words, rows, write),
            (_, false) => avx2::kernel::<6>(a, b, words, rows, write),
            (1, true) => avx2::kernel_bf16::<1>(a, b, words, rows, write),
            (2, true) => avx2::kernel_bf16::<2>(a, b, words, rows, write),
            (4, true) => avx2::kernel_bf16::<4>(a, b, words, rows, write),
            (_, true) => avx2::kernel_bf16::<6>(a, b, words, rows, write),
        }
    }
}

/// [`micro_kernel`] for the int8 kernel.
///
/// # Safety
/// As [`micro_kernel`]'s.
#[cfg(target_arch = "x86_64")]
unsafe fn micro_kernel_int8(
    block: &RowBlock,
    panel: Panel,
    words: usize,
    write: (*mut f32, usize, usize),
) {
    let (a, b, rows) = (block.data.as_ptr(), panel.words.as_ptr(), block.rows);
    let scales = avx512::Int8Scales {
        rows: block.scales.as_ptr(),
        offsets: block.offsets.as_ptr(),
        columns: panel
            .column_scales
            .expect("int8 panels have scales")
            .as_ptr(),
    };
    match block.height {
        1 => avx512::kernel_int8::<1>(a, b, words, scales, rows, write),
        2 => avx512::kernel_int8::<2>(a, b, words, scales, rows, write),
        4 => avx512::kernel_int8::<4>(a, b, words, scales, rows, write),
        _ => avx512::kernel_int8::<6>(a, b, words, scales, rows, write),
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `H` rows × 32 columns: for each of the `k` steps, two panel registers times a broadcast
    /// of each row's value, accumulated in 2·H registers; then the first `rows` rows and `cols`
    /// columns are stored.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn kernel<const H: usize>(
        a: *const f32,
        b: *const f32,
        k: usize,
        rows: usize,
        write: (*mut f32, usize, usize),
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
        store(&lo, &hi, rows, write);
    }

    /// As [`kernel`] over `pairs` words of bf16 pairs: each `vdpbf16ps` adds two steps'
    /// products to sixteen columns.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(crate) unsafe fn kernel_bf16<const H: usize>(
        a: *const f32,
        b: *const f32,
        pairs: usize,
        rows: usize,
        write: (*mut f32, usize, usize),
    ) {
        let (a, b) = (a as *const i32, b as *const i32);
        let mut lo = [_mm512_setzero_ps(); H];
        let mut hi = [_mm512_setzero_ps(); H];
        for pair in 0..pairs {
            let b_lo: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(pair * 32).cast()));
            let b_hi: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(b.add(pair * 32 + 16).cast()));
            let a_pair = a.add(pair * H);
            for r in 0..H {
                let ar: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a_pair.add(r)));
                lo[r] = _mm512_dpbf16_ps(lo[r], ar, b_lo);
                hi[r] = _mm512_dpbf16_ps(hi[r], ar, b_hi);
            }
        }
        store(&lo, &hi, rows, write);
    }

    /// As [`kernel_bf16`] with fused multiply-adds: each word of the panel holds a column's pair
    /// (the even step in the low half), so its high half masked is the odd step's weight as an
    /// f32 and its low half shifted up the even step's; `a` holds per pair the odd step's `H`
    /// values, then the even step's. A bf16 times a bf16 is exact in f32, so each fused
    /// multiply-add rounds once, in `vdpbf16ps`'s order (odd step first): the same sums.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn kernel_bf16_fma<const H: usize>(
        a: *const f32,
        b: *const f32,
        pairs: usize,
        rows: usize,
        write: (*mut f32, usize, usize),
    ) {
        let b = b as *const i32;
        let high_half = _mm512_set1_epi32(0xffff_0000_u32 as i32);
        let mut lo = [_mm512_setzero_ps(); H];
        let mut hi = [_mm512_setzero_ps(); H];
        for pair in 0..pairs {
            let w_lo = _mm512_loadu_si512(b.add(pair * 32).cast());
            let w_hi = _mm512_loadu_si512(b.add(pair * 32 + 16).cast());
            let odd = [
                _mm512_castsi512_ps(_mm512_and_si512(w_lo, high_half)),
                _mm512_castsi512_ps(_mm512_and_si512(w_hi, high_half)),
            ];
            let even = [
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w_lo)),
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w_hi)),
            ];
            let a_pair = a.add(pair * 2 * H);
            for (step, [b_lo, b_hi]) in [odd, even].into_iter().enumerate() {
                for r in 0..H {
                    let ar = _mm512_set1_ps(*a_pair.add(step * H + r));
                    lo[r] = _mm512_fmadd_ps(ar, b_lo, lo[r]);
                    hi[r] = _mm512_fmadd_ps(ar, b_hi, hi[r]);
                }
            }
        }
        store(&lo, &hi, rows, write);
    }

    /// What the int8 kernel scales its sums by: per activation block `H` row scales, per row
    /// the weights' offset, and the panel's 32 column scales (see [`super::int8`]).
    #[derive(Clone, Copy)]
    pub(crate) struct Int8Scales {
        pub(crate) rows: *const f32,
        pub(crate) offsets: *const f32,
        pub(crate) columns: *const f32,
    }

    /// As [`kernel`] over `words` words of four 8-bit steps: the weights unsigned (offset by
    /// 128), the activations signed. Each activation block's products are summed exactly in
    /// 32-bit integers by `vpdpbusd`, then added to the f32 sums times the block's row scale;
    /// the rows' offsets come off and the column scales multiply at the end.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(crate) unsafe fn kernel_int8<const H: usize>(
        a: *const f32,
        b: *const f32,
        words: usize,
        scales: Int8Scales,
        rows: usize,
        write: (*mut f32, usize, usize),
    ) {
        use super::int8::BLOCK_WORDS;
        let (a, b) = (a as *const i32, b as *const i32);
        let mut lo = [_mm512_setzero_ps(); H];
        let mut hi = [_mm512_setzero_ps(); H];
        for (block, first) in (0..words).step_by(BLOCK_WORDS).enumerate() {
            let mut lo_sum = [_mm512_setzero_si512(); H];
            let mut hi_sum = [_mm512_setzero_si512(); H];
            for word in first..(first + BLOCK_WORDS).min(words) {
                let b_lo = _mm512_loadu_si512(b.add(word * 32).cast());
                let b_hi = _mm512_loadu_si512(b.add(word * 32 + 16).cast());
                let a_word = a.add(word * H);
                for r in 0..H {
                    let ar = _mm512_set1_epi32(*a_word.add(r));
                    lo_sum[r] = _mm512_dpbusd_epi32(lo_sum[r], b_lo, ar);
                    hi_sum[r] = _mm512_dpbusd_epi32(hi_sum[r], b_hi, ar);
                }
            }
            let row_scales = scales.rows.add(block * H);
            for r in 0..H {
                let scale = _mm512_set1_ps(*row_scales.add(r));
                lo[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo_sum[r]), scale, lo[r]);
                hi[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi_sum[r]), scale, hi[r]);
            }
        }
        let column_lo = _mm512_loadu_ps(scales.columns);
        let column_hi = _mm512_loadu_ps(scales.columns.add(16));
        for r in 0..H {
            let offset = _mm512_set1_ps(*scales.offsets.add(r));
            lo[r] = _mm512_mul_ps(_mm512_sub_ps(lo[r], offset), column_lo);
            hi[r] = _mm512_mul_ps(_mm512_sub_ps(hi[r], offset), column_hi);
        }
        store(&lo, &hi, rows, write);
    }

    /// Stores the first `rows` rows and `cols` columns of the accumulators.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn store<const H: usize>(
        lo: &[__m512; H],
        hi: &[__m512; H],
        rows: usize,
        (dst, ldc, cols): (*mut f32, usize, usize),
    ) {
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
    pub(crate) unsafe fn kernel<const H: usize>(
        a: *const f32,
        b: *const f32,
        k: usize,
        rows: usize,
        write: (*mut f32, usize, usize),
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
        store(&lo, &hi, rows, write);
    }

    /// As [`kernel`] over `pairs` rows of bf16 weights packed for this kernel (see
    /// [`avx2_bf16_position`](super::avx2_bf16_position)), in `vdpbf16ps`'s order: the odd
    /// step's weights times the odd step's values, then the even step's. Interleaving a
    /// register of 16 bf16 with zeros gives eight of them as f32 (a bf16 is an f32's high half),
    /// and a bf16 times a bf16 is exact in f32, so each fused multiply-add rounds once, as
    /// `vdpbf16ps` does.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn kernel_bf16<const H: usize>(
        a: *const f32,
        b: *const f32,
        pairs: usize,
        rows: usize,
        write: (*mut f32, usize, usize),
    ) {
        let b = b as *const __m256i;
        let zero = _mm256_setzero_si256();
        let mut lo = [_mm256_setzero_ps(); H];
        let mut hi = [_mm256_setzero_ps(); H];
        for pair in 0..pairs {
            let a_pair = a.add(pair * 2 * H);
            // A pair's row: the odd step's 32 columns (two halves of 16), then the even step's.
            for (step, weights) in [b.add(pair * 4), b.add(pair * 4 + 2)]
                .into_iter()
                .enumerate()
            {
                let w = _mm256_loadu_si256(weights);
                let w_lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, w));
                let w_hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, w));
                for r in 0..H {
                    let ar = _mm256_broadcast_ss(&*a_pair.add(step * H + r));
                    lo[r] = _mm256_fmadd_ps(ar, w_lo, lo[r]);
                    hi[r] = _mm256_fmadd_ps(ar, w_hi, hi[r]);
                }
            }
        }
        store(&lo, &hi, rows, write);
    }

    /// Stores the first `rows` rows and `cols` (≤ 16) columns of the accumulators.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store<const H: usize>(
        lo: &[__m256; H],
        hi: &[__m256; H],
        rows: usize,
        (dst, ldc, cols): (*mut f32, usize, usize),
    ) {
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
    use candle_core::Device;

    #[test]
    fn the_simd_switch_caps_every_product_at_its_instruction_set() {
        // As a CPU with every kernel, `vdpbf16ps` its fastest bf16 one, lists them (see
        // `bf16_register_kernels`).
        let all = [
            Kernel::Avx512,
            Kernel::Avx512Bf16,
            Kernel::Avx512FmaBf16,
            Kernel::Avx2Fma,
            Kernel::Avx2FmaBf16,
            Kernel::AmxBf16,
            Kernel::Avx512Vnni,
        ];
        let choose = |precision, gemm, ceiling| choose_kernel(&all, precision, gemm, ceiling);
        let packed = Some("packed");
        assert_eq!(
            choose(Precision::F32, packed, SimdLevel::Amx),
            Some(Kernel::Avx512)
        );
        assert_eq!(
            choose(Precision::F32, packed, SimdLevel::Avx2),
            Some(Kernel::Avx2Fma)
        );
        assert_eq!(
            choose(Precision::Bf16, packed, SimdLevel::Avx2),
            Some(Kernel::Avx2FmaBf16)
        );
        assert_eq!(
            choose(Precision::Bf16Tiles, packed, SimdLevel::Amx),
            Some(Kernel::AmxBf16)
        );
        assert_eq!(
            choose(Precision::Bf16Tiles, packed, SimdLevel::Avx512),
            None
        );
        assert_eq!(
            choose(Precision::Bf16, packed, SimdLevel::Avx512Bf16),
            Some(Kernel::Avx512Bf16)
        );
        assert_eq!(
            choose(Precision::Bf16, packed, SimdLevel::Avx512),
            Some(Kernel::Avx512FmaBf16)
        );
        // Intel's order: the same bf16 sums by fused multiply-adds before `vdpbf16ps`.
        let intel = [Kernel::Avx512, Kernel::Avx512FmaBf16, Kernel::Avx512Bf16];
        assert_eq!(
            choose_kernel(&intel, Precision::Bf16, packed, SimdLevel::Amx),
            Some(Kernel::Avx512FmaBf16)
        );
        assert_eq!(
            choose(Precision::Int8, packed, SimdLevel::Avx512),
            Some(Kernel::Avx512Vnni)
        );
        assert_eq!(choose(Precision::Int8, packed, SimdLevel::Avx2), None);
        assert_eq!(choose(Precision::F32, Some("candle"), SimdLevel::Amx), None);
        let avx2_machine = [Kernel::Avx2Fma, Kernel::Avx2FmaBf16];
        assert_eq!(
            choose_kernel(&avx2_machine, Precision::Bf16, packed, SimdLevel::Amx),
            Some(Kernel::Avx2FmaBf16)
        );
    }

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

    /// [`Precision::Bf16`] written out: operands rounded to bf16, and for each pair of steps one
    /// fused multiply-add for the odd step, then one for the even step.
    fn reference_bf16(x: &[f32], rows: usize, w: &[Vec<f32>]) -> Vec<f32> {
        let (k, n) = (w.len(), w[0].len());
        let term = |r: usize, c: usize, step: usize| match w.get(step) {
            Some(wrow) => {
                let round = |v: f32| half::bf16::from_f32(v).to_f32();
                (round(x[r * k + step]), round(wrow[c]))
            }
            None => (0.0, 0.0),
        };
        let mut out = vec![0f32; rows * n];
        for r in 0..rows {
            for c in 0..n {
                let mut acc = 0f32;
                for pair in 0..k.div_ceil(2) {
                    for step in [2 * pair + 1, 2 * pair] {
                        let (a, b) = term(r, c, step);
                        acc = a.mul_add(b, acc);
                    }
                }
                out[r * n + c] = acc;
            }
        }
        out
    }

    /// The branch-free rounding agrees with the `half` crate's on every class of value:
    /// ties both ways, subnormals, the largest finite values (which round to infinity), NaNs.
    #[test]
    fn bf16_rounding_agrees_with_the_half_crate() {
        let mut values = vec![0.0, -0.0, 1.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX];
        values.extend([f32::MIN_POSITIVE, 1e-40, -1e-45, f32::NAN, -f32::NAN]);
        values.extend([f32::from_bits(0x7f80_0001), f32::from_bits(0xffc0_1234)]);
        // Every pattern of the 17 bits rounding looks at, under a few exponents and both signs.
        for high in [0x3f80_u32, 0xbf80, 0x0000, 0x7f00, 0x4b00] {
            values.extend((0..1u32 << 17).map(|low| f32::from_bits(high << 16 ^ low)));
        }
        for v in values {
            let want = half::bf16::from_f32(v);
            let got = bf16_bits(v);
            if v.is_nan() {
                assert!(half::bf16::from_bits(got).is_nan(), "{:#x}", v.to_bits());
            } else {
                assert_eq!(got, want.to_bits(), "{v:e} ({:#x})", v.to_bits());
            }
        }
    }

    /// Every kernel this CPU runs, every row-block height, a ragged last panel (in either half,
    /// for AVX2), odd and long inner dimensions: the f32 kernels against a plain triple loop,
    /// the bf16 kernels bit for bit against [`reference_bf16`] (so the AVX2 kernel gives the
    /// same bits as `vdpbf16ps`).
    #[test]
    fn packed_product_equals_the_plain_product() {
        let kernels = Kernel::supported();
        if kernels.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2 with FMA");
            return;
        }
        for kernel in kernels {
            for (k, n) in [(37, 75), (37, 89), (600, 75), (64, 32), (3, 5)] {
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
        for rows in [1, 2, 3, 5, 6, 7, 8, 12, 13, 30, 33, 64, 70] {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 17) % 11) as f32 / 5.0 - 1.0)
                .collect();
            let got = packed.apply(&x, rows).unwrap();
            match kernel.precision() {
                Precision::F32 => {
                    let want = reference(&x, rows, &w);
                    for (g, e) in got.iter().zip(&want) {
                        assert!(
                            (g - e).abs() < 1e-4 * (1.0 + e.abs()),
                            "{kernel:?}, rows {rows}: {g} vs {e}"
                        );
                    }
                }
                Precision::Bf16 => {
                    let want = reference_bf16(&x, rows, &w);
                    for (g, e) in got.iter().zip(&want) {
                        assert_eq!(g.to_bits(), e.to_bits(), "{kernel:?}, rows {rows}");
                    }
                }
                Precision::Int8 => {
                    let want = int8::reference(&x, rows, &w);
                    for (g, e) in got.iter().zip(&want) {
                        assert_eq!(g.to_bits(), e.to_bits(), "{kernel:?}, rows {rows}");
                    }
                }
                Precision::Bf16Tiles => {
                    // The same products as `reference_bf16`, added in another order: apart by
                    // at most the rounding of k additions of their sizes.
                    let want = reference_bf16(&x, rows, &w);
                    let abs_x: Vec<f32> = x.iter().map(|v| v.abs()).collect();
                    let abs_w: Vec<Vec<f32>> = w
                        .iter()
                        .map(|row| row.iter().map(|v| v.abs()).collect())
                        .collect();
                    let sizes = reference_bf16(&abs_x, rows, &abs_w);
                    for ((g, e), size) in got.iter().zip(&want).zip(&sizes) {
                        let bound = size * k as f32 * f32::EPSILON;
                        assert!(
                            (g - e).abs() <= bound,
                            "{kernel:?}, rows {rows}: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }

    /// How far an int8 product may lie from the exact one: for each step, the activation's
    /// rounding (half a step of its block's scale) times the weight, plus the weight's rounding
    /// times the activation, plus both roundings' product.
    fn int8_error_bound(x: &Tensor, w: &Tensor) -> Vec<f32> {
        let x: Vec<Vec<f32>> = x.to_vec2().unwrap();
        let w: Vec<Vec<f32>> = w.to_vec2().unwrap();
        let (k, n) = (w.len(), w[0].len());
        let column_half_steps: Vec<f32> = (0..n)
            .map(|c| int8::scale_of(w.iter().map(|row| row[c])) / 2.0)
            .collect();
        let mut bounds = Vec::new();
        for row in &x {
            let half_steps: Vec<f32> = (0..k)
                .map(|s| {
                    let block = s / int8::BLOCK_STEPS * int8::BLOCK_STEPS;
                    let end = (block + int8::BLOCK_STEPS).min(k);
                    int8::scale_of(row[block..end].iter().copied()) / 2.0
                })
                .collect();
            for c in 0..n {
                let bound: f32 = (0..k)
                    .map(|s| {
                        let (dx, dw) = (half_steps[s], column_half_steps[c]);
                        dx * w[s][c].abs() + dw * row[s].abs() + dx * dw
                    })
                    .sum();
                bounds.push(bound * 1.001 + 1e-4);
            }
        }
        bounds
    }

    /// Every path a `Linear` can take here, `forward` and `forward_rows` alike: the f32 ones
    /// against candle's matmul, the bf16 ones against candle's matmul of the bf16-rounded
    /// operands (the same products, added in another order) and, loosely, against f32.
    #[test]
    fn every_path_agrees_with_candle() {
        let w = Tensor::randn(0f32, 1.0, (64, 96), &Device::Cpu).unwrap();
        let x = Tensor::randn(0f32, 1.0, (20, 64), &Device::Cpu).unwrap();
        let product = |x: &Tensor, w: &Tensor| -> Vec<f32> {
            x.matmul(w)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let rounded = |t: &Tensor| {
            let values: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
            let values = values.into_iter().map(|v| half::bf16::from_f32(v).to_f32());
            let values: Vec<f32> = values.collect();
            Tensor::from_vec(values, t.dims2().unwrap(), &Device::Cpu).unwrap()
        };
        let f32_product = product(&x, &w);
        let bf16_product = product(&rounded(&x), &rounded(&w));
        // Rounding both operands to bf16 moves each product by at most 2^-8 of its size, so a
        // sum by at most 2^-8 of the sum of the products' sizes (random data passed or failed a
        // fixed 0.1 by chance).
        let magnitudes = product(&x.abs().unwrap(), &w.abs().unwrap());
        let packed = Kernel::supported()
            .into_iter()
            .map(|kernel| Linear::Packed(PackedMatrix::pack(&w, kernel).unwrap()));
        let mut paths = vec![
            Linear::new(w.clone(), true).unwrap(),
            Linear::bf16(w.clone()).unwrap(),
            Linear::int8(w.clone()).unwrap(),
            Linear::fastest(w.clone(), &Compute::cpu()).unwrap(),
        ];
        paths.extend(packed);
        let frozen = Kernel::supported()
            .into_iter()
            .filter(|kernel| kernel.precision() != Precision::Int8)
            .map(|kernel| Linear::frozen(&w, kernel).unwrap());
        paths.extend(frozen);
        for linear in paths {
            let got: Vec<f32> = linear
                .forward(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(linear.forward_rows(&x).unwrap(), got);
            let precision = match &linear {
                Linear::Dense(_) => Precision::F32,
                Linear::DenseBf16(_) => Precision::Bf16,
                Linear::Packed(p) => p.kernel.precision(),
                Linear::Frozen(p) => p.kernel().precision(),
            };
            if precision == Precision::Int8 {
                // Each operand within 1/254 of its column's or block's largest magnitude (the
                // kernel's own arithmetic is held to `int8::reference` above).
                let err = int8_error_bound(&x, &w);
                for ((g, f), bound) in got.iter().zip(&f32_product).zip(&err) {
                    assert!((g - f).abs() <= *bound, "{g} vs {f} in f32 (bound {bound})");
                }
                continue;
            }
            let is_bf16 = precision != Precision::F32;
            let want = if is_bf16 { &bf16_product } else { &f32_product };
            for (((g, e), f), m) in got.iter().zip(want).zip(&f32_product).zip(&magnitudes) {
                assert!((g - e).abs() < 1e-3, "{g} vs {e}");
                let bound = m / 256.0 + 1e-3;
                assert!((g - f).abs() <= bound, "{g} vs {f} in f32 (bound {bound})");
            }
        }
    }
}
