//! Plotting support: PNG charts with a font shipped in the binary, so reports render the same on
//! machines without system fonts (CI boxes, containers, SSH hosts).

use std::sync::Once;

/// The font family name to use in `plotters` text styles once [`register_font`] has run.
pub const FONT: &str = "sans-serif";

static REGISTER: Once = Once::new();

/// Registers the embedded DejaVu Sans Mono as the `sans-serif` family for every style plotters
/// knows. Call before drawing any text; repeated calls are free.
pub fn register_font() {
    REGISTER.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../data/fonts/DejaVuSansMono.ttf");
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
