//! Prompt templates: the text the LM continues for a context. Built-in templates live in
//! `prompts/` and are compiled in; `--prompt FILE` reads any other.

use std::path::Path;

use anyhow::{bail, Context, Result};

const BUILT_IN: &[(&str, &str)] = &[(
    "continuation",
    include_str!("../../../prompts/continuation.txt"),
)];

/// A prompt template with `{startphrase}`, `{sent1}` and `{sent2}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTemplate {
    /// The built-in name or the file path (recorded with the generation).
    pub name: String,
    text: String,
}

impl PromptTemplate {
    /// A built-in template by name, else the template in the file `name_or_path`.
    pub fn load(name_or_path: &str) -> Result<Self> {
        let text = match BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            Some((_, text)) => text.to_string(),
            None => {
                let path = Path::new(name_or_path);
                if !path.exists() {
                    let names: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
                    bail!(
                        "prompt `{name_or_path}` is neither a built-in template ({}) nor a file",
                        names.join(", ")
                    );
                }
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read prompt template {}", path.display()))?
            }
        };
        let text = text.trim_end().to_string();
        if !["{startphrase}", "{sent2}"]
            .iter()
            .any(|p| text.ends_with(p))
        {
            bail!(
                "prompt template {name_or_path} must end with {{startphrase}} or {{sent2}}: the LM continues the \
                 context, so the ending has to come right after it"
            );
        }
        Ok(PromptTemplate {
            name: name_or_path.to_string(),
            text,
        })
    }

    pub(crate) fn render(&self, sent1: &str, sent2: &str) -> String {
        self.text
            .replace(
                "{startphrase}",
                &afkit_store::dataset::startphrase(sent1, sent2),
            )
            .replace("{sent1}", sent1)
            .replace("{sent2}", sent2)
            .trim_end()
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_fill_and_must_end_with_the_context() {
        let t = PromptTemplate::load("continuation").unwrap();
        assert_eq!(t.render("A man sits.", "He"), "A man sits. He");
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.txt");
        std::fs::write(&good, "Video caption: {sent1} {sent2}\n").unwrap();
        let t = PromptTemplate::load(good.to_str().unwrap()).unwrap();
        assert_eq!(
            t.render("A man sits.", "He"),
            "Video caption: A man sits. He"
        );
        let bad = dir.path().join("bad.txt");
        std::fs::write(&bad, "{startphrase} and then").unwrap();
        assert!(PromptTemplate::load(bad.to_str().unwrap()).is_err());
        assert!(PromptTemplate::load("no-such-template").is_err());
    }
}
