//! Plotting support: PNG charts with a font shipped in the binary, so reports render the same on
//! machines without system fonts (CI boxes, containers, SSH hosts).

use std::sync::Once;

/// The font family name of the embedded font in `plotters` text styles.
const FONT: &str = "sans-serif";

/// The chart font at `px` pixels, made even: plotters places each glyph half a text height from
/// its anchor and truncates that to whole pixels, so at odd sizes small glyphs drift up from the
/// baseline against the digits and "0.35" reads "0·35". Registers the embedded font first, so
/// any text style a chart builds from it draws with that font.
pub fn font(px: u32) -> (&'static str, f64) {
    register_font();
    (FONT, f64::from(px + px % 2))
}

static REGISTER: Once = Once::new();

/// Registers the embedded DejaVu Sans Mono as the `sans-serif` family for every style plotters
/// knows; repeated calls are free.
fn register_font() {
    REGISTER.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../../data/fonts/DejaVuSansMono.ttf");
        for style in [
            plotters::style::FontStyle::Normal,
            plotters::style::FontStyle::Bold,
            plotters::style::FontStyle::Italic,
            plotters::style::FontStyle::Oblique,
        ] {
            // The font is valid and embedded at build time; a failure here is a build defect.
            plotters::style::register_font(FONT, style, bytes)
                .map_err(|_| ())
                .expect("embedded font parses");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::prelude::*;

    /// The lowest inked row of each run of inked columns of `text` drawn at `size`: one entry
    /// per glyph, left to right.
    fn glyph_bottoms(text: &str, size: (&str, f64)) -> Vec<u32> {
        let (w, h) = (80u32, 40u32);
        let mut buf = vec![255u8; (w * h * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
            root.draw(&Text::new(text, (2, 5), size)).unwrap();
            root.present().unwrap();
        }
        let inked = |x: u32, y: u32| buf[((y * w + x) * 3) as usize] < 128;
        let mut bottoms = Vec::new();
        let mut current: Option<u32> = None;
        for x in 0..w {
            let bottom = (0..h).rev().find(|&y| inked(x, y));
            match (bottom, current) {
                (Some(b), Some(c)) => current = Some(c.max(b)),
                (Some(b), None) => current = Some(b),
                (None, Some(c)) => {
                    bottoms.push(c);
                    current = None;
                }
                (None, None) => {}
            }
        }
        bottoms
    }

    #[test]
    fn the_decimal_point_sits_on_the_baseline_at_every_size() {
        for px in 12..=24 {
            let bottoms = glyph_bottoms("0 . 5", font(px));
            assert_eq!(bottoms.len(), 3, "three glyphs at {px} px: {bottoms:?}");
            assert!(
                bottoms.iter().all(|&b| b.abs_diff(bottoms[0]) <= 1),
                "at {px} px the point is off the baseline: {bottoms:?}"
            );
            assert!(
                bottoms[1] >= bottoms[0],
                "at {px} px the point floats: {bottoms:?}"
            );
        }
    }
}
