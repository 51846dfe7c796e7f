//! `afkit ingest --format swag-csv`'s reader on arbitrary bytes: it must return records or an
//! error, never panic, hang or exhaust memory.
#![no_main]

mod input_file;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input_file::write("input.csv", data);
    let _ = afkit_ingest::Format::SwagCsv.read(&path);
});
