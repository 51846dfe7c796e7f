//! What a completions server answers (`generate --backend openai`) on arbitrary bytes: a sampling
//! response parsed into completions, each ending recovered under one and under three stop
//! strings, and an echo response read for prompts of the lengths its first bytes give. Every
//! answer is a value or an error, never a panic.
#![no_main]

use afkit_engine::lm::openai::{echo::parse_echo, parse_completions, recover_ending};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(body) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(completions) = parse_completions(body) {
        let one = vec![".".to_string()];
        let three: Vec<String> = [".", "!", "?"].map(String::from).to_vec();
        for c in &completions {
            let _ = recover_ending(c, &one);
            let _ = recover_ending(c, &three);
        }
    }
    let lengths: Vec<usize> = data.iter().take(3).map(|&b| (b % 8) as usize).collect();
    let _ = parse_echo(body, &lengths);
});
