//! bfloat16 values as the packed kernels hold them: an f32's high half, rounded to nearest
//! (ties to even), two of them to a 32-bit word.

/// `x` rounded to the nearest bf16 (ties to even), as an f32.
pub(crate) fn round_to_bf16(x: f32) -> f32 {
    bf16_as_f32(bf16_bits(x))
}

/// The bits of `x` rounded to the nearest bf16, ties to even; a NaN stays a NaN. Without
/// branches, so that the loops packing activations over it vectorise (rounding one value at a
/// time took a fifth of the encoder's narrow products).
pub(super) fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x40;
    (if x.is_nan() { quiet_nan } else { rounded }) as u16
}

/// A bf16 is an f32's high half.
pub(super) fn bf16_as_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Two bf16 as one 32-bit word, `low` in the low half (the even step, as `vdpbf16ps` reads
/// pairs), held in an f32 as the packed panels and blocks hold words.
pub(super) fn bf16_word(low: u16, high: u16) -> f32 {
    f32::from_bits(u32::from(low) | u32::from(high) << 16)
}
