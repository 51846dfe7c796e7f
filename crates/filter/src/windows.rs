//! Sliding windows (im2col) for the CNN and the max over each text's windows, as CPU ops with
//! their own backward passes, over texts packed end to end.
//!
//! Built from candle ops, the windows of width w are w time-shifted slices of a padded
//! (rows, len, channels) batch concatenated along the channels, and the max over time ignores
//! the windows that start on padding by adding a large negative to them. That pays for padding
//! twice: the rows of a batch are texts of 5–40 words padded to the longest, so about half of the
//! windows' rows in the convolution's product were padding, and in candle the gradient of each
//! slice is materialised at the full size of the sliced tensor. Here the texts lie end to end
//! ([`PackedText`]), [`text_windows`] copies only the windows that start on a real token (w
//! consecutive tokens are one contiguous span), and [`max_per_text`] takes the max over each
//! text's own windows. The backward passes add each window's gradient back onto its span and
//! send each max's gradient to the windows that hold it (all of them on a tie, as candle's `max`
//! does). The ops have CPU kernels only; on other devices the CNN uses [`shifted_windows`] and a
//! masked max over the padded batch, which computes the same function.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

/// A batch's texts end to end, for the CNN on the CPU. Each text takes at least as many slots
/// as the widest filter (the extra slots hold the padding id), so that a text shorter than a
/// filter still has one window, the one a padded batch gives it.
pub(crate) struct PackedText {
    /// (slots,) word ids.
    pub words: Tensor,
    /// (slots,) 1 where the token belongs to `sent2`.
    pub in_sent2: Tensor,
    /// The windows of each CNN filter width, in the CNN's order of widths.
    pub windows: Vec<TextWindows>,
}

/// The windows of one width: where each starts, and which belong to which text.
#[derive(Clone)]
pub(crate) struct TextWindows {
    /// The slot each window starts at, text by text.
    pub starts: Arc<Vec<u32>>,
    /// texts + 1 offsets into `starts`: text r's windows are `offsets[r]..offsets[r + 1]`.
    pub offsets: Arc<Vec<u32>>,
}

/// The windows of `width` a text of `length` real tokens gets: those that start on a real token
/// and end inside the text, and window 0 for a text shorter than the filter.
pub(crate) fn windows_of(length: usize, width: usize) -> usize {
    length.saturating_sub(width - 1).max(1)
}

impl TextWindows {
    /// The windows of `width` over texts of `lengths` real tokens laid out in slots of
    /// `slots[r]` (≥ width): those starting on a real token and ending inside the text's
    /// slots, and window 0 for a text shorter than the filter.
    pub(crate) fn new(lengths: &[usize], slots: &[usize], width: usize) -> Self {
        let mut starts = Vec::new();
        let mut offsets = Vec::with_capacity(lengths.len() + 1);
        offsets.push(0);
        let mut first = 0;
        for (&n, &s) in lengths.iter().zip(slots) {
            let count = windows_of(n, width);
            starts.extend((first..first + count).map(|t| t as u32));
            offsets.push(starts.len() as u32);
            first += s;
        }
        TextWindows {
            starts: Arc::new(starts),
            offsets: Arc::new(offsets),
        }
    }
}

/// (slots, channels) → (windows, width · channels): window i holds the `width` slots from
/// `windows.starts[i]` side by side. CPU tensors only.
pub(crate) fn text_windows(xs: &Tensor, windows: &TextWindows, width: usize) -> Result<Tensor> {
    xs.contiguous()?.apply_op1(Windows {
        starts: windows.starts.clone(),
        width,
    })
}

/// (windows, features) → (texts, features): the max over each text's windows. CPU tensors only.
pub(crate) fn max_per_text(xs: &Tensor, windows: &TextWindows) -> Result<Tensor> {
    xs.contiguous()?.apply_op1(MaxPerText {
        offsets: windows.offsets.clone(),
    })
}

/// The same windows from candle ops over a padded (rows, len, channels) batch (shifted slices
/// concatenated along the channels): slower to train on the CPU, but it runs on any device.
pub(crate) fn shifted_windows(xs: &Tensor, width: usize) -> Result<Tensor> {
    let windows = xs.dim(1)? + 1 - width;
    let shifted = (0..width)
        .map(|i| xs.narrow(1, i, windows))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&shifted, 2)
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

struct Windows {
    starts: Arc<Vec<u32>>,
    width: usize,
}

impl CustomOp1 for Windows {
    fn name(&self) -> &'static str {
        "text-windows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (slots, channels) = layout.shape().dims2()?;
        let xs = f32_data(storage, layout, self.name())?;
        if self.starts.iter().any(|&s| s as usize + self.width > slots) {
            bail!("{}: a window runs past the {slots} slots", self.name())
        }
        let span = self.width * channels;
        let mut out = Vec::with_capacity(self.starts.len() * span);
        for &s in self.starts.iter() {
            let at = s as usize * channels;
            out.extend_from_slice(&xs[at..at + span]);
        }
        Ok((CpuStorage::F32(out), Shape::from((self.starts.len(), span))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad_res.contiguous()?.apply_op1_no_bwd(&WindowGradSum {
            starts: self.starts.clone(),
            width: self.width,
            slots: arg.dim(0)?,
        })?;
        Ok(Some(grad))
    }
}

/// The adjoint of [`Windows`]: (windows, width · channels) → (slots, channels), each window's
/// values added onto the slots it covers.
struct WindowGradSum {
    starts: Arc<Vec<u32>>,
    width: usize,
    slots: usize,
}

impl CustomOp1 for WindowGradSum {
    fn name(&self) -> &'static str {
        "text-windows-grad"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, span) = layout.shape().dims2()?;
        let grad = f32_data(storage, layout, self.name())?;
        let channels = span / self.width;
        let mut out = vec![0f32; self.slots * channels];
        for (&s, window) in self.starts.iter().zip(grad.chunks_exact(span)) {
            let at = s as usize * channels;
            for (d, g) in out[at..at + span].iter_mut().zip(window) {
                *d += g;
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((self.slots, channels))))
    }
}

struct MaxPerText {
    offsets: Arc<Vec<u32>>,
}

impl MaxPerText {
    /// Text r's windows as a range of rows.
    fn text(&self, r: usize) -> std::ops::Range<usize> {
        self.offsets[r] as usize..self.offsets[r + 1] as usize
    }

    fn texts(&self) -> usize {
        self.offsets.len() - 1
    }
}

impl CustomOp1 for MaxPerText {
    fn name(&self) -> &'static str {
        "max-per-text"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (windows, features) = layout.shape().dims2()?;
        let xs = f32_data(storage, layout, self.name())?;
        if self.offsets.last().map(|&o| o as usize) != Some(windows) {
            bail!(
                "{}: offsets do not cover the {windows} windows",
                self.name()
            )
        }
        let mut out = vec![f32::NEG_INFINITY; self.texts() * features];
        for (r, max) in out.chunks_exact_mut(features).enumerate() {
            for window in self.text(r) {
                for (m, &x) in max.iter_mut().zip(&xs[window * features..][..features]) {
                    *m = m.max(x);
                }
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((self.texts(), features))))
    }

    fn bwd(&self, arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let (windows, features) = arg.dims2()?;
        let xs = arg.flatten_all()?.to_vec1::<f32>()?;
        let maxes = res.flatten_all()?.to_vec1::<f32>()?;
        let grad = grad_res.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; windows * features];
        for r in 0..self.texts() {
            let (max, g) = (
                &maxes[r * features..][..features],
                &grad[r * features..][..features],
            );
            for window in self.text(r) {
                let at = window * features;
                for f in 0..features {
                    if xs[at + f] == max[f] {
                        out[at + f] = g[f];
                    }
                }
            }
        }
        Ok(Some(Tensor::from_vec(
            out,
            (windows, features),
            arg.device(),
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var, D};

    /// Texts of these lengths, padded to `len` ≥ every width, and the same texts packed.
    fn layouts(
        lengths: &[usize],
        len: usize,
        channels: usize,
    ) -> Result<(Var, Tensor, Vec<usize>)> {
        let device = Device::Cpu;
        let padded = Var::randn(0f32, 1.0, (lengths.len(), len, channels), &device)?;
        let slots: Vec<usize> = lengths.iter().map(|&n| n.max(5)).collect();
        let rows = (0..lengths.len())
            .map(|r| padded.get(r)?.narrow(0, 0, slots[r]))
            .collect::<Result<Vec<_>>>()?;
        Ok((padded, Tensor::cat(&rows, 0)?, slots))
    }

    #[test]
    fn packed_windows_and_max_equal_the_padded_batch_forward_and_gradient() -> Result<()> {
        let device = Device::Cpu;
        // Longer than every filter, as long as the longest, shorter than some filters, one token.
        let lengths = [9usize, 12, 3, 1, 5];
        let (len, channels) = (12, 4);
        for width in [2usize, 3, 4, 5] {
            let (padded, packed, slots) = layouts(&lengths, len, channels)?;
            let packed = Var::from_tensor(&packed)?;
            let filters = Tensor::randn(0f32, 1.0, (width * channels, 6), &device)?;

            let windows = TextWindows::new(&lengths, &slots, width);
            let ours = max_per_text(
                &text_windows(&packed, &windows, width)?.matmul(&filters)?,
                &windows,
            )?;

            let n_windows = len + 1 - width;
            let mask: Vec<f32> = lengths
                .iter()
                .flat_map(|&n| {
                    (0..n_windows).map(move |t| f32::from(t < n.saturating_sub(width - 1).max(1)))
                })
                .collect();
            let mask = Tensor::from_vec(mask, (lengths.len(), n_windows, 1), &device)?;
            let theirs = shifted_windows(&padded, width)?
                .broadcast_matmul(&filters)?
                .broadcast_add(&((mask - 1.0)? * 1e4)?)?
                .max(1)?;
            let diff = (&ours - &theirs)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f32>()?;
            assert!(diff < 1e-5, "width {width}: forward differs by {diff}");

            let weights = Tensor::randn(0f32, 1.0, ours.shape(), &device)?;
            let g_ours = (ours * &weights)?.sum_all()?.backward()?;
            let g_theirs = (theirs * &weights)?.sum_all()?.backward()?;
            let g_packed = g_ours.get(&packed).expect("packed gradient");
            let g_padded = g_theirs.get(&padded).expect("padded gradient");
            let mut at = 0;
            for (r, &s) in slots.iter().enumerate() {
                let a = g_packed.narrow(0, at, s)?;
                let b = g_padded.get(r)?.narrow(0, 0, s)?;
                let diff = (a - b)?.abs()?.max(D::Minus1)?.max(0)?.to_scalar::<f32>()?;
                assert!(
                    diff < 1e-5,
                    "width {width}, text {r}: gradient differs by {diff}"
                );
                let rest = g_padded.get(r)?.narrow(0, s, len - s)?.abs()?.sum_all()?;
                assert_eq!(
                    rest.to_scalar::<f32>()?,
                    0.0,
                    "padding beyond the slots got a gradient"
                );
                at += s;
            }
        }
        Ok(())
    }

    #[test]
    fn windows_past_the_slots_and_offsets_that_miss_windows_are_errors() -> Result<()> {
        let xs = Tensor::zeros((4, 2), candle_core::DType::F32, &Device::Cpu)?;
        let past = TextWindows {
            starts: Arc::new(vec![0, 3]),
            offsets: Arc::new(vec![0, 2]),
        };
        assert!(text_windows(&xs, &past, 2).is_err());
        let short = TextWindows {
            starts: Arc::new(vec![0]),
            offsets: Arc::new(vec![0, 1]),
        };
        assert!(max_per_text(&xs, &short).is_err());
        Ok(())
    }
}
