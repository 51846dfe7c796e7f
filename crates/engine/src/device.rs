//! Where candle runs a command's models (`--device`, `--engine`, shared by `filter` and
//! `generate`), and whether afkit's own CPU kernels run them.
//!
//! afkit's fastest CPU code is its own: the packed GEMM, per-row attention and continuous
//! batching of the local generator, and the CNN's window op in the AF ensemble. Those kernels
//! read and write CPU memory, so they cannot run on a GPU. The `generic` engine computes the
//! same models with candle ops alone, which candle runs on any device (CUDA through the `cuda`
//! cargo feature). It is also selectable on the CPU, which is how the path a GPU runs is tested
//! where no GPU is.

use std::str::FromStr;

use anyhow::{bail, Context, Result};
use candle_core::Device;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    #[default]
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| format!("`{s}` is not a device: use cpu, cuda or cuda:N")),
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Cpu,
    Generic,
}

/// An opened device and the engine that runs the models on it.
#[derive(Debug, Clone)]
pub struct Compute {
    pub device: Device,
    /// afkit's own CPU kernels run the models; otherwise candle ops alone.
    pub cpu_kernels: bool,
    /// How a language model's weight products run on afkit's kernels.
    pub lm_products: LmProducts,
}

/// A language model's weight products on afkit's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LmProducts {
    /// In f32: what the checks against reference implementations hold to a tight tolerance.
    F32,
    /// In bf16 on AMX tiles where the CPU has them, else with AVX512-BF16's dot products where
    /// it has those (and `AFKIT_SIMD` allows): faster than f32, each operand rounded to 8
    /// significant bits, the sums kept in f32. Elsewhere in f32.
    Fastest,
    /// In 8 bits with AVX-512 VNNI's dot products where the CPU has them (and `AFKIT_SIMD`
    /// allows), else as [`LmProducts::Fastest`]: each weight rounded to 1/254 of its column's
    /// largest magnitude and each activation to 1/254 of its block of 32's. What
    /// `AFKIT_LM_INT8=1` asks for.
    Int8,
}

impl LmProducts {
    /// What a command runs with: [`LmProducts::Int8`] where `AFKIT_LM_INT8=1`, else
    /// [`LmProducts::Fastest`].
    pub fn from_env() -> Self {
        match std::env::var("AFKIT_LM_INT8").as_deref() {
            Ok("1") => LmProducts::Int8,
            _ => LmProducts::Fastest,
        }
    }
}

impl Compute {
    /// The CPU with afkit's kernels: what runs without `--device` and `--engine`.
    pub fn cpu() -> Self {
        Compute {
            device: Device::Cpu,
            cpu_kernels: true,
            lm_products: LmProducts::from_env(),
        }
    }

    /// afkit's kernels with every product in f32 on any CPU: what the checks against reference
    /// implementations hold to a tight tolerance.
    pub fn cpu_f32() -> Self {
        Compute {
            lm_products: LmProducts::F32,
            ..Compute::cpu()
        }
    }
}

impl Compute {
    /// Opens the device, or fails at once with what to do: before any work, so that a wrong
    /// `--device` costs nothing. `engine`: `None` picks afkit's kernels on the CPU and candle
    /// ops elsewhere.
    pub fn open(choice: DeviceChoice, engine: Option<Engine>) -> Result<Compute> {
        let device = match choice {
            DeviceChoice::Cpu => Device::Cpu,
            DeviceChoice::Cuda(ordinal) => {
                // Whether candle, and so this build, has the `cuda` feature.
                if !candle_core::utils::cuda_is_available() {
                    bail!(
                        "--device cuda: this afkit was built without CUDA support. Build it with \
                         `cargo build --release --features cuda` (needs a CUDA toolkit; \
                         `bash scripts/build_cuda.sh` fetches one if there is none) and run that \
                         binary"
                    );
                }
                Device::new_cuda(ordinal)
                    .with_context(|| format!("cannot open CUDA device {ordinal}"))?
            }
        };
        let cpu_kernels = match (engine, device.is_cpu()) {
            (None, on_cpu) => on_cpu,
            (Some(Engine::Generic), _) => false,
            (Some(Engine::Cpu), true) => true,
            (Some(Engine::Cpu), false) => {
                bail!("--engine cpu runs on the CPU only; leave --engine out with --device cuda")
            }
        };
        Ok(Compute {
            device,
            cpu_kernels,
            lm_products: match cpu_kernels {
                true => LmProducts::from_env(),
                false => LmProducts::F32,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_the_engine_follows_the_device() {
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceChoice::Cuda(0)));
        assert_eq!("cuda:2".parse(), Ok(DeviceChoice::Cuda(2)));
        assert!("gpu".parse::<DeviceChoice>().is_err());
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
        let open = |engine| {
            Compute::open(DeviceChoice::Cpu, engine)
                .unwrap()
                .cpu_kernels
        };
        assert!(open(None));
        assert!(open(Some(Engine::Cpu)));
        assert!(!open(Some(Engine::Generic)));
    }
}
