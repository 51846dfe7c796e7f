//! A model file's header and tokenizer, as `afkit generate --model FILE.gguf` reads them before
//! any weight: arbitrary bytes must give a tokenizer or an error, never a panic, a hang or an
//! allocation of the sizes a corrupt header claims. A tokenizer that loads must encode and
//! decode text.
#![no_main]

mod input_file;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = input_file::write("model.gguf", data);
    if let Ok((_, tokenizer, _)) = afkit_engine::lm::model::read_header(&path) {
        if let Ok(ids) = tokenizer.encode("A man is seen speaking to the camera.") {
            let _ = tokenizer.decode(&ids);
        }
    }
});
