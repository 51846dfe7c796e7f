//! f32 GEMM throughput: candle's matmul and each of afkit's packed kernels this CPU runs, side by
//! side, in GFLOP/s, one line per row count. Two sets of shapes:
//!
//! - `decode`: the generator's products (rows × 576 times SmolLM2's weight matrices), the
//!   arithmetic limit the batched decode is compared with in BENCHMARKS.md;
//! - `encoder`: the sentence encoder's products (MiniLM: fused q/k/v, attention output, the two
//!   feed-forward matrices) at its batch sizes, in tokens.
//!
//! `cargo bench --bench gemm` runs both; `cargo bench --bench gemm -- encoder` one of them.

use std::time::Instant;

use afkit_engine::lm::linear::{Kernel, PackedMatrix};
use candle_core::{Device, Tensor};

const DECODE_ROWS: [usize; 5] = [8, 32, 64, 128, 256];
const DECODE_SHAPES: [(usize, usize); 5] = [
    (576, 960),
    (576, 576),
    (576, 3072),
    (1536, 576),
    (576, 49152),
];
const ENCODER_ROWS: [usize; 3] = [512, 1024, 4096];
const ENCODER_SHAPES: [(usize, usize); 4] = [(384, 1152), (384, 384), (384, 1536), (1536, 384)];

fn main() {
    // cargo passes `--bench`; any other argument names the sets to run.
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let runs = |name: &str| wanted.is_empty() || wanted.iter().any(|w| name.contains(w.as_str()));
    if runs("decode") {
        println!("decode shapes (rows × 576 by SmolLM2's weights):");
        print_gemm_throughput(&DECODE_ROWS, &DECODE_SHAPES);
    }
    if runs("encoder") {
        println!("encoder shapes (tokens × 384 by MiniLM's weights):");
        print_gemm_throughput(&ENCODER_ROWS, &ENCODER_SHAPES);
    }
}

/// GFLOP/s of candle's matmul and of every packed kernel this CPU runs, one line per row count.
fn print_gemm_throughput(row_counts: &[usize], shapes: &[(usize, usize)]) {
    let gflops = |rows: usize, k: usize, n: usize, run: &dyn Fn()| {
        run();
        let iters = (2e9 / (2.0 * (rows * k * n) as f64)).ceil() as usize;
        let t = Instant::now();
        for _ in 0..iters {
            run();
        }
        2.0 * (rows * k * n * iters) as f64 / t.elapsed().as_secs_f64() / 1e9
    };
    for &rows in row_counts {
        let mut line = format!("rows {rows:>4}:");
        for &(k, n) in shapes {
            let a = Tensor::randn(0f32, 1.0, (rows, k), &Device::Cpu).unwrap();
            let b = Tensor::randn(0f32, 1.0, (k, n), &Device::Cpu).unwrap();
            let candle = gflops(rows, k, n, &|| {
                a.matmul(&b).unwrap();
            });
            line += &format!("  {k}x{n}: candle {candle:5.1}");
            for kernel in Kernel::supported() {
                let packed = PackedMatrix::pack(&b, kernel).unwrap();
                let x: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
                let p = gflops(rows, k, n, &|| {
                    packed.apply(&x, rows).unwrap();
                });
                line += &format!(" {kernel:?} {p:5.1}");
            }
        }
        println!("{line}  GFLOP/s");
    }
}
