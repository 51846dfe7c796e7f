//! `--device` and `--engine`, flattened into `filter`'s and `generate`'s flags.

use anyhow::Result;

use afkit_engine::device::{Compute, DeviceChoice, Engine};

/// The flags, flattened into a command's arguments. The default is the CPU with afkit's kernels.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// Where models run: `cpu`, `cuda` or `cuda:N`.
    ///
    /// `cuda:N` is the N-th GPU. `cuda` runs on an NVIDIA GPU through candle's CUDA backend; it
    /// needs an afkit built with `--features cuda` (see docs/gpu.md).
    #[arg(long, default_value = "cpu", value_name = "cpu|cuda|cuda:N")]
    pub device: DeviceChoice,
    /// The kernels: afkit's own CPU kernels (`cpu`) or candle's ops (`generic`).
    ///
    /// `cpu`: afkit's own CPU kernels (CPU only; the default there). `generic`: candle ops
    /// only, the code a GPU runs (the default on a GPU); on the CPU it is slower and exists to
    /// check that code without a GPU. Results agree up to floating-point rounding.
    #[arg(long, value_enum, hide_short_help = true)]
    pub engine: Option<Engine>,
}

impl DeviceArgs {
    pub fn open(&self) -> Result<Compute> {
        Compute::open(self.device, self.engine)
    }
}
