//! `afkit aflite --features FILE.npy`'s reader on arbitrary bytes: a float matrix or an error,
//! never a panic, a hang or an allocation of the size a corrupt header claims.
#![no_main]

mod input_file;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input_file::write("features.npy", data);
    let _ = afkit_aflite::features::load_vectors(&path, 4);
});
