//! Sliding windows over time (im2col) for the CNN, as one candle op with its own backward pass.
//!
//! Built from candle ops, the windows of width w are w time-shifted slices concatenated along
//! the channels. In candle the gradient of each slice is materialised at the full size of the
//! sliced tensor and then accumulated, so the backward pass of the four CNN widths made and
//! summed fourteen full-size tensors per batch and dominated training time. Here the forward
//! pass copies each window (w consecutive tokens are one contiguous span of a row) and the
//! backward pass adds each window's gradient back onto that span. The op has a CPU kernel
//! only; on other devices the CNN uses [`shifted_windows`].

use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

/// (rows, len, channels) → (rows, len - width + 1, width · channels): window t holds tokens
/// t..t + width side by side. `len` must be at least `width`. CPU tensors only.
pub fn time_windows(xs: &Tensor, width: usize) -> Result<Tensor> {
    xs.contiguous()?.apply_op1(Windows { width })
}

/// The same windows from candle ops (shifted slices concatenated along the channels): slower
/// to train on the CPU, but it runs on any device.
pub fn shifted_windows(xs: &Tensor, width: usize) -> Result<Tensor> {
    let windows = xs.dim(1)? + 1 - width;
    let shifted = (0..width)
        .map(|i| xs.narrow(1, i, windows))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&shifted, 2)
}

struct Windows {
    width: usize,
}

/// The contiguous f32 data of a CPU tensor.
pub(super) fn f32_data<'a>(
    storage: &'a CpuStorage,
    layout: &Layout,
    op: &str,
) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        bail!("{op}: f32 tensors only")
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("{op}: contiguous tensors only")
    };
    Ok(&data[start..end])
}

impl CustomOp1 for Windows {
    fn name(&self) -> &'static str {
        "time-windows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, len, channels) = layout.shape().dims3()?;
        let xs = f32_data(storage, layout, self.name())?;
        let (width, windows) = (self.width, len + 1 - self.width);
        let span = width * channels;
        let mut out = Vec::with_capacity(rows * windows * span);
        for row in xs.chunks_exact(len * channels) {
            for t in 0..windows {
                out.extend_from_slice(&row[t * channels..t * channels + span]);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((rows, windows, span))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad_res.contiguous()?.apply_op1_no_bwd(&WindowGradSum {
            width: self.width,
            len: arg.dim(1)?,
        })?;
        Ok(Some(grad))
    }
}

/// The adjoint of [`Windows`]: (rows, windows, width · channels) → (rows, len, channels), each
/// window's values added onto the tokens it covers.
struct WindowGradSum {
    width: usize,
    len: usize,
}

impl CustomOp1 for WindowGradSum {
    fn name(&self) -> &'static str {
        "time-windows-grad"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, windows, span) = layout.shape().dims3()?;
        let grad = f32_data(storage, layout, self.name())?;
        let channels = span / self.width;
        let mut out = vec![0f32; rows * self.len * channels];
        for (dst, src) in out
            .chunks_exact_mut(self.len * channels)
            .zip(grad.chunks_exact(windows * span))
        {
            for (t, window) in src.chunks_exact(span).enumerate() {
                for (d, g) in dst[t * channels..t * channels + span]
                    .iter_mut()
                    .zip(window)
                {
                    *d += g;
                }
            }
        }
        Ok((
            CpuStorage::F32(out),
            Shape::from((rows, self.len, channels)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn equals_shifted_slices_forward_and_gradient() -> Result<()> {
        let device = Device::Cpu;
        let xs = Var::randn(0f32, 1.0, (3, 7, 4), &device)?;
        for width in [1, 2, 5, 7] {
            let ours = time_windows(&xs, width)?;
            let theirs = shifted_windows(&xs, width)?;
            assert_eq!(ours.dims(), theirs.dims());
            let diff = (&ours - &theirs)?.abs()?.flatten_all()?.max(0)?;
            assert_eq!(diff.to_scalar::<f32>()?, 0.0, "width {width}");

            let weights = Tensor::randn(0f32, 1.0, ours.shape(), &device)?;
            let g_ours = (ours * &weights)?.sum_all()?.backward()?;
            let g_theirs = (theirs * &weights)?.sum_all()?.backward()?;
            let (a, b) = (g_ours.get(&xs).unwrap(), g_theirs.get(&xs).unwrap());
            let diff = (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
            assert!(diff < 1e-5, "width {width}: gradient differs by {diff}");
        }
        Ok(())
    }
}
