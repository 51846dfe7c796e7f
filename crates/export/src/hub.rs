//! The YAML header of the export's `README.md`: the metadata the Hugging Face Hub shows and the
//! configurations `datasets.load_dataset(DIR, NAME)` builds (`regular`, the default, and
//! `full`), with every column's type declared so that the schema is the same in every export and
//! every split (an empty type column loads as an empty string, not as a float NaN).
//!
//! Each configuration's `dataset_info` also identifies its content: the split sizes and a
//! SHA-256 over its data files. `datasets` keys the cache of a local folder on the folder's name
//! and this header (not on the files), so without them a re-export, or another project's export
//! in a folder of the same name, would load the rows cached from an earlier export.

use std::collections::BTreeMap;
use std::fmt::Write;

use sha2::{Digest, Sha256};

use super::layout::Layout;
use afkit_engine::models::hex;
use afkit_store::dataset::{Split, COULD_BE_RIGHT_COLUMN, FULL_COLUMNS, REGULAR_COLUMNS};

/// The tag that marks a README.md as an afkit export's card (so `export` may replace its folder).
pub(crate) const AFKIT_TAG: &str = "afkit";

/// What the header says about the dataset as a whole.
pub(crate) struct HubMeta<'a> {
    pub pretty_name: &'a str,
    pub license: &'a str,
    pub rows: usize,
    /// Examples per split, indexed like [`Split::ALL`].
    pub examples: [usize; 3],
    /// The export's files (path in the folder → contents), for the content checksums.
    pub files: &'a BTreeMap<String, Vec<u8>>,
}

/// The Hub's size class for a dataset of `rows` examples.
fn size_category(rows: usize) -> &'static str {
    match rows {
        0..1_000 => "n<1K",
        1_000..10_000 => "1K<n<10K",
        10_000..100_000 => "10K<n<100K",
        100_000..1_000_000 => "100K<n<1M",
        1_000_000..10_000_000 => "1M<n<10M",
        _ => "10M<n<100M",
    }
}

/// A YAML scalar: a JSON string is a valid YAML double-quoted scalar.
fn quoted(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

/// The header, from the opening `---` to the closing one and a blank line.
pub(crate) fn front_matter(meta: &HubMeta, layout: &Layout) -> String {
    let mut y = String::new();
    let _ = write_front_matter(&mut y, meta, layout);
    y
}

fn write_front_matter(y: &mut String, meta: &HubMeta, layout: &Layout) -> std::fmt::Result {
    writeln!(y, "---")?;
    writeln!(y, "pretty_name: {}", quoted(meta.pretty_name))?;
    writeln!(y, "license: {}", quoted(meta.license))?;
    writeln!(y, "language:\n- en")?;
    writeln!(y, "task_categories:\n- multiple-choice")?;
    writeln!(y, "task_ids:\n- multiple-choice-qa")?;
    writeln!(
        y,
        "size_categories:\n- {}",
        quoted(size_category(meta.rows))
    )?;
    writeln!(y, "tags:\n- {AFKIT_TAG}\n- swag\n- adversarial-filtering")?;
    write_configs(y, layout)?;
    write_dataset_info(y, meta, layout)?;
    writeln!(y, "---\n")
}

/// The `configs` section: which files `datasets` reads for each configuration's splits, and how
/// it reads their cells.
fn write_configs(y: &mut String, layout: &Layout) -> std::fmt::Result {
    writeln!(y, "configs:")?;
    writeln!(y, "- config_name: regular\n  default: true\n  data_files:")?;
    for (split, hf) in layout.hf_splits() {
        writeln!(y, "  - split: {hf}\n    path: {}", layout.regular(split))?;
    }
    // The leading index column is for the SWAG release's positional readers; `datasets` skips it.
    writeln!(y, "  usecols:")?;
    for column in REGULAR_COLUMNS.into_iter().chain([COULD_BE_RIGHT_COLUMN]) {
        writeln!(y, "  - {}", quoted(column))?;
    }
    // Read empty cells as empty strings and text such as "NA" as text, never as missing values.
    writeln!(y, "  keep_default_na: false")?;
    writeln!(y, "- config_name: full\n  data_files:")?;
    for (split, hf) in layout.hf_splits() {
        if layout.has_full(split) {
            writeln!(y, "  - split: {hf}\n    path: {}", layout.full(split))?;
        }
    }
    writeln!(y, "  keep_default_na: false")?;
    Ok(())
}

/// The `dataset_info` section: each configuration's content and the type of each of its columns.
fn write_dataset_info(y: &mut String, meta: &HubMeta, layout: &Layout) -> std::fmt::Result {
    writeln!(y, "dataset_info:")?;
    writeln!(y, "- config_name: regular")?;
    let regular: Vec<(Split, &str, String)> = layout
        .hf_splits()
        .map(|(split, hf)| (split, hf, layout.regular(split)))
        .collect();
    write_content(y, meta, &regular)?;
    writeln!(y, "  features:")?;
    for column in REGULAR_COLUMNS.into_iter().chain([COULD_BE_RIGHT_COLUMN]) {
        let dtype = if column == "label" || column == COULD_BE_RIGHT_COLUMN {
            "int64"
        } else {
            "string"
        };
        writeln!(y, "  - name: {}\n    dtype: {dtype}", quoted(column))?;
    }
    writeln!(y, "- config_name: full")?;
    let full: Vec<(Split, &str, String)> = layout
        .hf_splits()
        .filter(|(split, _)| layout.has_full(*split))
        .map(|(split, hf)| (split, hf, layout.full(split)))
        .collect();
    write_content(y, meta, &full)?;
    writeln!(y, "  features:")?;
    for column in FULL_COLUMNS {
        writeln!(y, "  - name: {}\n    dtype: string", quoted(column))?;
    }
    Ok(())
}

/// What identifies a configuration's content: a description carrying the SHA-256 of its data
/// files, and each split's examples and file size (`num_bytes`; `datasets` checks the examples
/// against the rows it reads).
fn write_content(
    y: &mut String,
    meta: &HubMeta,
    splits: &[(Split, &str, String)],
) -> std::fmt::Result {
    let size = |path: &str| meta.files.get(path).map_or(0, Vec::len);
    writeln!(
        y,
        "  description: {}",
        quoted(&format!(
            "afkit export; SHA-256 of the data files: {}",
            content_sha256(meta.files, splits.iter().map(|(_, _, path)| path.as_str()))
        ))
    )?;
    writeln!(y, "  splits:")?;
    for (split, hf, path) in splits {
        writeln!(
            y,
            "  - name: {hf}\n    num_bytes: {}\n    num_examples: {}",
            size(path),
            meta.examples[*split as usize]
        )?;
    }
    let total: usize = splits.iter().map(|(_, _, path)| size(path)).sum();
    writeln!(y, "  download_size: {total}")
}

/// SHA-256 over each file's path and its own SHA-256, one line each, in the order given.
fn content_sha256<'p>(
    files: &BTreeMap<String, Vec<u8>>,
    paths: impl Iterator<Item = &'p str>,
) -> String {
    let mut all = Sha256::new();
    for path in paths {
        let bytes = files.get(path).map_or(&[][..], Vec::as_slice);
        all.update(format!("{path} {}\n", hex(&Sha256::digest(bytes))));
    }
    hex(&all.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_follow_the_hub() {
        assert_eq!(size_category(0), "n<1K");
        assert_eq!(size_category(999), "n<1K");
        assert_eq!(size_category(1_000), "1K<n<10K");
        assert_eq!(size_category(113_557), "100K<n<1M");
    }

    #[test]
    fn names_are_quoted_yaml_scalars() {
        assert_eq!(quoted("a: \"b\"\n"), r#""a: \"b\"\n""#);
    }
}
