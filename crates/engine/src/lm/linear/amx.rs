//! Products on AMX tiles (Intel Xeon CPUs since Sapphire Rapids): one `tdpbf16ps` multiplies a
//! 16 × 32 block of bf16 activations by 32 × 16 bf16 weights into 16 × 16 f32 sums, 8,192
//! multiply-adds an instruction where an AVX-512 FMA does 16. The language model's products are
//! a few hundred rows against matrices of 576 to 49,152 columns: tiles fit them well.
//!
//! A panel of 32 columns holds, for each 32 steps, two weight tiles (its first 16 columns, then
//! its last 16) of 16 rows: row `i` of a tile holds, per column, the bf16 pair of steps `2i` and
//! `2i + 1` (the even step in the low half), as `tdpbf16ps` reads them. The activations are
//! rounded to bf16 rows, padded to whole tiles with zeros.
//!
//! Linux hands the tile registers to a process only when it asks (`arch_prctl`), which
//! [`available`] does once. Rust has no stable AMX intrinsics, so the few instructions are inline
//! assembly; the compiler never allocates tile registers, so they keep their values from one
//! statement to the next.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use std::arch::asm;

use rayon::prelude::*;

use super::bf16::{bf16_bits, bf16_word};
use super::tasks::{plan_tasks, OutPtr, NR};

/// Steps (values of an activation row) one tile multiply covers.
const STEP: usize = 32;
/// Rows (and f32 columns) of an accumulator tile.
const TILE: usize = 16;
/// Activation rows one pass over a panel computes: two tiles' worth.
const BLOCK_ROWS: usize = 2 * TILE;

/// Whether this CPU has AMX with bf16 and the kernel lets this process use its tiles.
pub(super) fn available() -> bool {
    static AVAILABLE: std::sync::LazyLock<bool> =
        std::sync::LazyLock::new(|| cpu_has_amx_bf16() && request_tile_data());
    *AVAILABLE
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn cpu_has_amx_bf16() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // CPUID leaf 7, sub-leaf 0: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    let edx = __cpuid_count(7, 0).edx;
    __cpuid_count(0, 0).eax >= 7 && edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn cpu_has_amx_bf16() -> bool {
    false
}

/// Asks Linux for the tile data state (its permission covers every thread of the process).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with this request only changes the process's permissions.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tile_data() -> bool {
    false
}

/// 32-bit words per panel column for `k` steps: two tiles of 16 × 16 words per 32 steps, over
/// the panel's 32 columns.
pub(super) fn words(k: usize) -> usize {
    k.div_ceil(STEP) * 2 * TILE * TILE / NR
}

/// Fills `panel` (of [`words`]`(k) · 32` words) with the panel's weights, `value(step, column)`
/// (zero past the matrix), in the tile order of the module's comment.
pub(super) fn pack_panel(panel: &mut [f32], value: impl Fn(usize, usize) -> f32) {
    for (tile, words) in panel.chunks_exact_mut(TILE * TILE).enumerate() {
        let (step0, col0) = (tile / 2 * STEP, tile % 2 * TILE);
        for (i, row) in words.chunks_exact_mut(TILE).enumerate() {
            for (c, word) in row.iter_mut().enumerate() {
                let even = value(step0 + 2 * i, col0 + c);
                let odd = value(step0 + 2 * i + 1, col0 + c);
                *word = bf16_word(bf16_bits(even), bf16_bits(odd));
            }
        }
    }
}

/// `x · W` for `x` (rows × k) and `W` packed in `panels` (k × n, see the module's comment).
pub(super) fn apply(panels: &[f32], k: usize, n: usize, x: &[f32], rows: usize) -> Vec<f32> {
    let words = words(k);
    let activations = Activations::pack(x, rows, k);
    let n_panels = n.div_ceil(NR);
    let n_blocks = rows.div_ceil(BLOCK_ROWS);
    let (per_chunk, per_group) = plan_tasks(n_panels, words * NR * 4, n_blocks);
    let n_groups = n_blocks.div_ceil(per_group);
    let mut out: Vec<f32> = Vec::with_capacity(rows * n);
    let c = OutPtr(out.as_mut_ptr());
    (0..n_panels.div_ceil(per_chunk) * n_groups)
        .into_par_iter()
        .for_each(|task| {
            let (chunk, group) = (task / n_groups, task % n_groups);
            let panels_of_task = chunk * per_chunk..((chunk + 1) * per_chunk).min(n_panels);
            let blocks = group * per_group..((group + 1) * per_group).min(n_blocks);
            let _tiles = Tiles::configure();
            for block in blocks {
                let first_row = block * BLOCK_ROWS;
                let block_rows = BLOCK_ROWS.min(rows - first_row);
                for p in panels_of_task.clone() {
                    let panel = &panels[p * words * NR..(p + 1) * words * NR];
                    let cols = NR.min(n - p * NR);
                    // SAFETY: each (block, panel) pair writes its own rows × columns of `out`;
                    // the activations and the panel hold the whole tiles the kernel reads.
                    unsafe {
                        let dst = c.at(first_row * n + p * NR);
                        let a = activations.block(first_row);
                        block_times_panel(a, activations.stride, panel, block_rows, (dst, n, cols));
                    }
                }
            }
        });
    // SAFETY: the tasks cover every row block and panel, so every element was written.
    unsafe { out.set_len(rows * n) };
    out
}

/// The activation rows rounded to bf16, each padded with zeros to whole steps of 32, and zero
/// rows up to whole blocks of 32 rows.
struct Activations {
    values: Vec<u16>,
    /// Values per row.
    stride: usize,
}

impl Activations {
    fn pack(x: &[f32], rows: usize, k: usize) -> Self {
        let stride = k.div_ceil(STEP) * STEP;
        let mut values = vec![0u16; rows.div_ceil(BLOCK_ROWS) * BLOCK_ROWS * stride];
        values
            .par_chunks_mut(stride)
            .zip(x.par_chunks(k.max(1)))
            .for_each(|(out, row)| {
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = bf16_bits(v);
                }
            });
        Activations { values, stride }
    }

    /// The block of rows starting at `first_row`.
    fn block(&self, first_row: usize) -> &[u16] {
        &self.values[first_row * self.stride..(first_row + BLOCK_ROWS) * self.stride]
    }
}

/// The tile registers configured as 16 rows of 64 bytes each, for as long as this lives on
/// this thread; released when dropped, so that the operating system does not save them on
/// every switch.
struct Tiles;

impl Tiles {
    fn configure() -> Tiles {
        // Palette 1; bytes per row of tiles 0–7 at offset 16 (two bytes each), rows at 48.
        #[repr(C, align(64))]
        struct Config([u8; 64]);
        let mut config = Config([0; 64]);
        config.0[0] = 1;
        for tile in 0..8 {
            config.0[16 + 2 * tile] = 64;
            config.0[48 + tile] = TILE as u8;
        }
        // SAFETY: the configuration is valid for palette 1, and `available` held before any
        // panel was packed for this kernel.
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly));
        }
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: releasing the tiles only returns them to their initial state.
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        unsafe {
            asm!("tilerelease", options(nostack, nomem));
        }
    }
}

/// Writes `a · panel` for the `rows` (≤ 32) real rows of the block `a` and `cols` (≤ 32)
/// columns at `dst` (row stride `ldc`). Tiles 0–3 accumulate the block's four 16 × 16 quarters,
/// 4–5 hold its two row tiles and 6–7 the panel's two column tiles of the step; a block of at
/// most 16 real rows skips its second row tile.
///
/// # Safety
/// The tiles must be configured ([`Tiles`]); `a` and `panel` must hold a whole block and panel;
/// `dst` must be valid for writes of `rows` rows of `cols` values at stride `ldc`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn block_times_panel(
    a: &[u16],
    a_stride: usize,
    panel: &[f32],
    rows: usize,
    (dst, ldc, cols): (*mut f32, usize, usize),
) {
    let steps = a_stride / STEP;
    debug_assert!(a.len() >= BLOCK_ROWS * a_stride && panel.len() >= steps * 2 * TILE * TILE);
    let tall = rows > TILE;
    let a_bytes = a_stride * 2;
    asm!(
        "tilezero tmm0",
        "tilezero tmm1",
        "tilezero tmm2",
        "tilezero tmm3",
        options(nostack, nomem)
    );
    for step in 0..steps {
        let top = a.as_ptr().add(step * STEP);
        let weights = panel.as_ptr().add(step * 2 * TILE * TILE);
        asm!(
            "tileloadd tmm4, [{top} + {a_bytes}*1]",
            "tileloadd tmm6, [{left} + {w_bytes}*1]",
            "tileloadd tmm7, [{right} + {w_bytes}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            top = in(reg) top,
            a_bytes = in(reg) a_bytes,
            left = in(reg) weights,
            right = in(reg) weights.add(TILE * TILE),
            w_bytes = in(reg) TILE * 4,
            options(nostack, readonly)
        );
        if tall {
            asm!(
                "tileloadd tmm5, [{bottom} + {a_bytes}*1]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                bottom = in(reg) top.add(TILE * a_stride),
                a_bytes = in(reg) a_bytes,
                options(nostack, readonly)
            );
        }
    }
    if rows == BLOCK_ROWS && cols == NR {
        store_quarters(dst, ldc * 4, tall);
    } else {
        let mut sums = [0f32; BLOCK_ROWS * NR];
        store_quarters(sums.as_mut_ptr(), NR * 4, tall);
        for r in 0..rows {
            std::ptr::copy_nonoverlapping(sums.as_ptr().add(r * NR), dst.add(r * ldc), cols);
        }
    }
}

/// Stores accumulator tiles 0–1 (and 2–3 when `tall`) as a 16- (32-) row block at `dst`, rows
/// `row_bytes` apart.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn store_quarters(dst: *mut f32, row_bytes: usize, tall: bool) {
    asm!(
        "tilestored [{left} + {row_bytes}*1], tmm0",
        "tilestored [{right} + {row_bytes}*1], tmm1",
        left = in(reg) dst,
        right = in(reg) dst.add(TILE),
        row_bytes = in(reg) row_bytes,
        options(nostack)
    );
    if tall {
        let lower = dst.add(TILE * row_bytes / 4);
        asm!(
            "tilestored [{left} + {row_bytes}*1], tmm2",
            "tilestored [{right} + {row_bytes}*1], tmm3",
            left = in(reg) lower,
            right = in(reg) lower.add(TILE),
            row_bytes = in(reg) row_bytes,
            options(nostack)
        );
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
unsafe fn block_times_panel(_: &[u16], _: usize, _: &[f32], _: usize, _: (*mut f32, usize, usize)) {
    unreachable!("AMX tiles exist only on x86-64 Linux here");
}
