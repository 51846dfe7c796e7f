//! A CoNLL-U reader for tagger training and evaluation: sentences as (FORM, UPOS) pairs.
//!
//! Comment lines (`# ...`) are skipped, and so are multiword-token ranges (`1-2 don't`) and empty
//! nodes (`1.1`): the syntactic words under a range (`do`, `n't`) are what the tokeniser produces.

use std::path::Path;

use anyhow::{bail, Context, Result};

use super::tagger::{TaggedSentence, Upos};

/// Reads every sentence of a CoNLL-U file.
pub fn read_conllu(path: &Path) -> Result<Vec<TaggedSentence>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        let line = bytes[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1;
        anyhow::anyhow!(
            "{}:{line}: invalid UTF-8; expected a UTF-8 CoNLL-U file",
            path.display()
        )
    })?;
    parse_conllu(text).with_context(|| format!("in {}", path.display()))
}

/// Parses CoNLL-U text; errors name the line.
pub(super) fn parse_conllu(text: &str) -> Result<Vec<TaggedSentence>> {
    let mut sentences = Vec::new();
    let mut current = TaggedSentence {
        words: Vec::new(),
        tags: Vec::new(),
    };
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            if !current.words.is_empty() {
                sentences.push(std::mem::replace(
                    &mut current,
                    TaggedSentence {
                        words: Vec::new(),
                        tags: Vec::new(),
                    },
                ));
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != 10 {
            bail!(
                "line {line_no}: expected 10 tab-separated CoNLL-U fields, found {}",
                fields.len()
            );
        }
        let id = fields[0];
        if id.contains('-') || id.contains('.') {
            continue;
        }
        if id.parse::<u32>().is_err() {
            bail!("line {line_no}: expected a word index in the ID field, found {id:?}");
        }
        let tag = Upos::parse(fields[3]).with_context(|| {
            format!("line {line_no}: expected one of the 17 UD tags in the UPOS field")
        })?;
        current.words.push(fields[1].to_string());
        current.tags.push(tag);
    }
    if !current.words.is_empty() {
        sentences.push(current);
    }
    Ok(sentences)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_comments_ranges_and_empty_nodes() {
        let text = "# sent_id = 1\n# text = I don't.\n1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_\n\
                    2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n2\tdo\tdo\tAUX\tVBP\t_\t0\troot\t_\t_\n\
                    3\tn't\tnot\tPART\tRB\t_\t2\tadvmod\t_\t_\n3.1\tx\tx\tX\t_\t_\t_\t_\t_\t_\n\
                    4\t.\t.\tPUNCT\t.\t_\t2\tpunct\t_\t_\n\n1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n";
        let s = parse_conllu(text).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].words, ["I", "do", "n't", "."]);
        assert_eq!(s[0].tags, [Upos::Pron, Upos::Aux, Upos::Part, Upos::Punct]);
        assert_eq!(s[1].words, ["Hi"]);
    }

    #[test]
    fn errors_name_the_line() {
        let err = parse_conllu("1\tI\tI\tPRON\n").unwrap_err().to_string();
        assert!(
            err.contains("line 1") && err.contains("10 tab-separated"),
            "{err}"
        );
        let err = parse_conllu("\n1\tI\tI\tFOO\t_\t_\t_\t_\t_\t_\n").unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }
}
