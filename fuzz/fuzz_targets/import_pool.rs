//! `afkit import-pool`'s line reader on arbitrary bytes: every line parsed and checked (well-formed
//! JSON, at least one ending, scored fully or not at all) or an error naming the line.
#![no_main]

mod input_file;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input_file::write("pools.jsonl", data);
    let _ = afkit_generate::check_import_lines(&path);
});
