//! A Penn-Treebank-style word tokeniser that cuts text the way UD English-EWT does, so the
//! tagger sees at run time the same kind of tokens it was trained on.
//!
//! Rules, applied to each whitespace-separated chunk:
//! - opening quotes and brackets are split off the front, closing punctuation off the back
//!   (`.`, `,`, `;`, `:`, `!`, `?`, quotes, brackets, `...`), except the final period of an
//!   abbreviation (`Mr.`, `U.S.`, `e.g.`);
//! - clitics are split off: `n't` (`don't` → `do n't`, `can't` → `ca n't`), `'s`, `'re`, `'ve`,
//!   `'ll`, `'d`, `'m`, and the bare `'` of a plural possessive (`players'`); `cannot`, `gonna`,
//!   `gotta`, `wanna` split as in EWT;
//! - a comma or semicolon glued between words (`room,then`) is split, one between digits
//!   (`5,000`) is not; `3.5`, `$` (split from its number), `%`, hyphenated words (`e-mail`,
//!   `twenty-one`), URLs and e-mail addresses stay whole.
//!
//! Tokens are returned with their byte spans so callers can cut the original text at a token
//! boundary (the splitter does this to give natural `sent2` and ending strings).

/// A word token: its text and its byte range in the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token<'a> {
    pub text: &'a str,
    pub start: usize,
    pub end: usize,
}

/// Tokenises `text` into PTB-style word tokens.
pub fn tokenize(text: &str) -> Vec<String> {
    token_spans(text)
        .into_iter()
        .map(|t| t.text.to_string())
        .collect()
}

/// Tokenises `text`, keeping each token's byte span.
pub fn token_spans(text: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    let mut chunk_start = None;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = chunk_start.take() {
                split_chunk(text, s, i, &mut out);
            }
        } else if chunk_start.is_none() {
            chunk_start = Some(i);
        }
    }
    if let Some(s) = chunk_start {
        split_chunk(text, s, text.len(), &mut out);
    }
    out
}

const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "vs", "etc", "inc", "co", "ltd", "corp",
    "mt", "ft", "approx", "dept", "jan", "feb", "mar", "apr", "aug", "sep", "sept", "oct", "nov",
    "dec",
];

fn is_opening(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | '`' | '(' | '[' | '{' | '<' | '“' | '‘' | '«' | '¿' | '¡'
    )
}

fn is_closing(c: char) -> bool {
    matches!(
        c,
        '"' | '\''
            | ')'
            | ']'
            | '}'
            | '>'
            | '”'
            | '’'
            | '»'
            | '.'
            | ','
            | ';'
            | ':'
            | '!'
            | '?'
            | '…'
    )
}

fn is_apostrophe(c: char) -> bool {
    c == '\'' || c == '’'
}

/// Splits one whitespace-free chunk `text[start..end]` into tokens.
fn split_chunk<'a>(text: &'a str, start: usize, end: usize, out: &mut Vec<Token<'a>>) {
    let start = split_leading(text, start, end, out);
    let (end, trailing) = trailing_spans(text, start, end);
    split_core(text, start, end, out);
    for (s, e) in trailing.into_iter().rev() {
        push_span(text, out, s, e);
    }
}

/// `text[s..e]` as a token, unless it is empty.
fn push_span<'a>(text: &'a str, out: &mut Vec<Token<'a>>, s: usize, e: usize) {
    if s < e {
        out.push(Token {
            text: &text[s..e],
            start: s,
            end: e,
        })
    }
}

/// Splits off the leading punctuation of `text[start..end]` (opening quotes and brackets,
/// currency, dashes) as tokens; returns where the rest starts.
fn split_leading<'a>(
    text: &'a str,
    mut start: usize,
    end: usize,
    out: &mut Vec<Token<'a>>,
) -> usize {
    while start < end {
        let c = text[start..end].chars().next().unwrap();
        let rest = &text[start + c.len_utf8()..end];
        let splits = is_opening(c)
            || (matches!(c, '$' | '£' | '€' | '#') && !rest.is_empty())
            || (c == '-' && rest.starts_with('-'));
        if !splits || rest.is_empty() {
            break;
        }
        if c == '-' {
            let n = text[start..end].chars().take_while(|&c| c == '-').count();
            push_span(text, out, start, start + n);
            start += n;
            continue;
        }
        // A leading apostrophe that begins a clitic-like word ('em, '90s) stays attached.
        if is_apostrophe(c) && rest.chars().next().is_some_and(|c| c.is_alphanumeric()) {
            let word: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric())
                .collect::<String>()
                .to_lowercase();
            let decade = word.starts_with(|c: char| c.is_ascii_digit());
            if matches!(word.as_str(), "em" | "cause" | "til") || decade {
                break;
            }
        }
        push_span(text, out, start, start + c.len_utf8());
        start += c.len_utf8();
    }
    start
}

/// The trailing punctuation of `text[start..end]`, back to front, as spans; returns where the
/// rest ends, and the spans.
fn trailing_spans(text: &str, start: usize, mut end: usize) -> (usize, Vec<(usize, usize)>) {
    let mut trailing = Vec::new();
    while start < end {
        let chunk = &text[start..end];
        if chunk.ends_with("...") && chunk.len() > 3 {
            let n = chunk.bytes().rev().take_while(|&b| b == b'.').count();
            trailing.push((end - n, end));
            end -= n;
            continue;
        }
        let c = chunk.chars().next_back().unwrap();
        let c_start = end - c.len_utf8();
        if c_start == start {
            break;
        }
        if c == '%' {
            trailing.push((c_start, end));
            end = c_start;
            continue;
        }
        if !is_closing(c) {
            break;
        }
        if c == '.' && is_abbreviation(&text[start..end]) {
            break;
        }
        if is_apostrophe(c) && is_plural_possessive(&text[start..c_start]) {
            trailing.push((c_start, end));
            end = c_start;
            break;
        }
        trailing.push((c_start, end));
        end = c_start;
    }
    (end, trailing)
}

/// `U.S.`, `e.g.`, `Mr.`: a final period that belongs to the word.
fn is_abbreviation(word: &str) -> bool {
    let stem = &word[..word.len() - 1];
    if stem.is_empty() {
        return false;
    }
    // Letter-period sequences (U.S., e.g., a.m.) and initials (J.), but not a sentence-final
    // lowercase word like "a.".
    let parts: Vec<&str> = stem.split('.').collect();
    let letters = parts
        .iter()
        .all(|part| part.chars().count() == 1 && part.chars().all(char::is_alphabetic));
    if letters && (parts.len() > 1 || stem.chars().all(char::is_uppercase)) {
        return true;
    }
    ABBREVIATIONS.contains(&stem.to_lowercase().as_str())
}

fn is_plural_possessive(word: &str) -> bool {
    let lower = word.to_lowercase();
    lower.len() > 2 && lower.ends_with('s') && lower.chars().all(|c| c.is_alphabetic())
}

/// Splits the chunk core (outer punctuation removed) at clitics and glued commas.
fn split_core<'a>(text: &'a str, start: usize, end: usize, out: &mut Vec<Token<'a>>) {
    if start >= end {
        return;
    }
    let word = &text[start..end];
    if word.contains("://") || word.contains('@') || word.starts_with("www.") {
        out.push(Token {
            text: word,
            start,
            end,
        });
        return;
    }
    // A comma/semicolon/colon between non-digits (`room,then`), or a `!`/`?` inside a word.
    let chars: Vec<(usize, char)> = word.char_indices().collect();
    for k in 1..chars.len().saturating_sub(1) {
        let (i, c) = chars[k];
        let prev = chars[k - 1].1;
        let next = chars[k + 1].1;
        let glued = match c {
            ',' | ';' => !(prev.is_ascii_digit() && next.is_ascii_digit()),
            '!' | '?' => true,
            _ => false,
        };
        if glued {
            split_core(text, start, start + i, out);
            out.push(Token {
                text: &text[start + i..start + i + 1],
                start: start + i,
                end: start + i + 1,
            });
            split_core(text, start + i + 1, end, out);
            return;
        }
    }
    let split_at = clitic_split(word);
    match split_at {
        Some(k) if k > 0 && k < word.len() => {
            split_core(text, start, start + k, out);
            out.push(Token {
                text: &text[start + k..end],
                start: start + k,
                end,
            });
        }
        _ => out.push(Token {
            text: word,
            start,
            end,
        }),
    }
}

/// Byte offset where a clitic begins in `word`, if it ends in one.
fn clitic_split(word: &str) -> Option<usize> {
    // One char of `normalised` per char of `word`, so char counts carry over.
    let normalised: String = word
        .chars()
        .map(|c| {
            if c == '’' {
                '\''
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect();
    let offset = clitic_offset(&normalised)?;
    let n_chars = normalised[..offset].chars().count();
    word.char_indices().nth(n_chars).map(|(i, _)| i)
}

/// Offset of a clitic in an ASCII-lowercased word with straight apostrophes.
fn clitic_offset(lower: &str) -> Option<usize> {
    for special in ["cannot", "gonna", "gotta", "wanna"] {
        if lower == special {
            return Some(3);
        }
    }
    if lower.ends_with("n't") && lower.len() > 3 {
        return Some(lower.len() - 3);
    }
    for clitic in ["'s", "'re", "'ve", "'ll", "'d", "'m"] {
        if lower.ends_with(clitic) && lower.len() > clitic.len() {
            return Some(lower.len() - clitic.len());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<String> {
        tokenize(s)
    }

    #[test]
    fn splits_final_punctuation_and_commas() {
        assert_eq!(
            toks("Then, the man dances around the room."),
            ["Then", ",", "the", "man", "dances", "around", "the", "room", "."]
        );
        assert_eq!(toks("Wow!"), ["Wow", "!"]);
        assert_eq!(
            toks("the room,then left"),
            ["the", "room", ",", "then", "left"]
        );
        assert_eq!(
            toks("He said \"yes.\""),
            ["He", "said", "\"", "yes", ".", "\""]
        );
        assert_eq!(toks("(a test)"), ["(", "a", "test", ")"]);
        assert_eq!(toks("Wait..."), ["Wait", "..."]);
        assert_eq!(toks("He says no."), ["He", "says", "no", "."]);
        assert_eq!(toks("plan a."), ["plan", "a", "."]);
        assert_eq!(
            toks("'Hello,' she said"),
            ["'", "Hello", ",", "'", "she", "said"]
        );
        assert_eq!(toks("the '90s"), ["the", "'90s"]);
    }

    #[test]
    fn splits_clitics_like_ewt() {
        assert_eq!(toks("don't"), ["do", "n't"]);
        assert_eq!(toks("Can't"), ["Ca", "n't"]);
        assert_eq!(toks("won't"), ["wo", "n't"]);
        assert_eq!(toks("cannot"), ["can", "not"]);
        assert_eq!(toks("gonna"), ["gon", "na"]);
        assert_eq!(toks("the company's car"), ["the", "company", "'s", "car"]);
        assert_eq!(toks("they're"), ["they", "'re"]);
        assert_eq!(toks("I'm"), ["I", "'m"]);
        assert_eq!(toks("we'll"), ["we", "'ll"]);
        assert_eq!(toks("the players' bags"), ["the", "players", "'", "bags"]);
        assert_eq!(toks("It’s"), ["It", "’s"]);
    }

    #[test]
    fn keeps_numbers_hyphens_abbreviations_urls_whole() {
        assert_eq!(toks("3.5 miles"), ["3.5", "miles"]);
        assert_eq!(toks("5,000 people"), ["5,000", "people"]);
        assert_eq!(toks("a well-known e-mail"), ["a", "well-known", "e-mail"]);
        assert_eq!(
            toks("Mr. Smith in the U.S."),
            ["Mr.", "Smith", "in", "the", "U.S."]
        );
        assert_eq!(
            toks("costs $5 or 50%."),
            ["costs", "$", "5", "or", "50", "%", "."]
        );
        assert_eq!(toks("see http://x.org/a."), ["see", "http://x.org/a", "."]);
        assert_eq!(toks("mail bob@x.com,"), ["mail", "bob@x.com", ","]);
        assert_eq!(toks("yes -- no"), ["yes", "--", "no"]);
    }

    #[test]
    fn spans_point_into_the_input() {
        let text = "  The man's  dog, then.";
        for t in token_spans(text) {
            assert_eq!(&text[t.start..t.end], t.text);
        }
        assert!(tokenize("   ").is_empty());
    }
}
