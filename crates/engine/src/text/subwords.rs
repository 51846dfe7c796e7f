//! fastText-style subwords: the character 2–5-grams of every whitespace-separated word wrapped in
//! `<` and `>` (`<wo`, `ord>`), identified by a 64-bit FNV-1a hash instead of their text.
//!
//! Subwords keep case and the punctuation attached to a word, so they catch what word n-grams
//! normalise away: non-words, misspellings, capitalisation and spacing or punctuation habits
//! ("home ." vs "home."). Both the audit's character baselines and AF's subword model read
//! them, so AF filters against exactly the signal the audit measures. A collision between two of
//! the few hundred thousand grams of a dataset is vanishingly unlikely (about n² / 2⁶⁵).
//!
//! Word unigrams and bigrams are hashed the same way, for the audit's word baselines.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `bytes`, continuing from `start` (pass [`FNV_OFFSET`] to begin a new hash).
fn fnv1a(bytes: impl IntoIterator<Item = u8>, start: u64) -> u64 {
    bytes
        .into_iter()
        .fold(start, |h, b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
}

/// Hashes of the unigrams and bigrams of `words` (a bigram hashes "first second").
pub fn word_gram_hashes<S: AsRef<str>>(words: &[S]) -> Vec<u64> {
    let mut out: Vec<u64> = words
        .iter()
        .map(|t| fnv1a(t.as_ref().bytes(), FNV_OFFSET))
        .collect();
    out.extend(words.windows(2).map(|p| {
        let first = fnv1a(p[0].as_ref().bytes().chain([b' ']), FNV_OFFSET);
        fnv1a(p[1].as_ref().bytes(), first)
    }));
    out
}

/// Hashes of the character 2–5-grams of every whitespace-separated `<word>` of `text`.
pub fn char_gram_hashes(text: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4];
    for word in text.split_whitespace() {
        let chars: Vec<char> = std::iter::once('<')
            .chain(word.chars())
            .chain(std::iter::once('>'))
            .collect();
        for n in 2..=5 {
            for window in chars.windows(n) {
                out.push(
                    window
                        .iter()
                        .fold(FNV_OFFSET, |h, c| fnv1a(c.encode_utf8(&mut buf).bytes(), h)),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subwords_have_boundary_markers_and_keep_case_and_punctuation() {
        let expected = [
            "<G", "Go", "o!", "!>", "<Go", "Go!", "o!>", "<Go!", "Go!>", "<Go!>",
        ];
        let hashed: Vec<u64> = expected
            .iter()
            .map(|g| fnv1a(g.bytes(), FNV_OFFSET))
            .collect();
        assert_eq!(char_gram_hashes("Go!"), hashed);
        let other = char_gram_hashes("go.");
        assert!(
            other.iter().all(|h| !hashed.contains(h)),
            "case and punctuation differ"
        );
    }
}
