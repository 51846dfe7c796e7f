//! `afkit pool import`'s bundle reader on arbitrary bytes: the zip archive, the header, every
//! context line checked on its own and the closing counts, or an error naming the place.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = afkit_generate::bundle::check_bundle_bytes(data);
});
