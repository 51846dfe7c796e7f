//! lm-evaluation-harness task files for the export (`lm_eval/`): a SWAG-style task on the
//! regular CSVs (the harness's `swag` task on these files) and a HellaSwag-style one on the
//! JSONL (HellaSwag's fields and its "activity label: context" prompt). Paths are relative to
//! the export folder: the harness is run from there with `--include_path lm_eval`.

use std::fmt::Write;

use super::layout::{Layout, HARNESS_DIR};
use afkit_store::dataset::Split;

/// Task names, as given to the harness's `--tasks`.
pub(crate) const SWAG_TASK: &str = "afkit_swag";
pub(crate) const HELLASWAG_TASK: &str = "afkit_hellaswag";

/// The task files: (path in the export, contents).
pub(crate) fn task_files(layout: &Layout) -> Vec<(String, String)> {
    vec![
        (format!("{HARNESS_DIR}/{SWAG_TASK}.yaml"), swag_task(layout)),
        (
            format!("{HARNESS_DIR}/{HELLASWAG_TASK}.yaml"),
            hellaswag_task(layout),
        ),
    ]
}

/// The command that runs both tasks, for the card and the files' comments.
pub(crate) fn command() -> String {
    format!(
        "lm_eval --model MODEL --model_args ARGS --include_path {HARNESS_DIR} --tasks {SWAG_TASK},{HELLASWAG_TASK}"
    )
}

/// The split the harness reports on: the test split where its labels are in the folder, else
/// the validation split (the harness uses its test split whenever one is named).
fn evaluation_splits(y: &mut String, layout: &Layout) -> std::fmt::Result {
    let named = |split: Split, hf: &str| {
        if layout.present(split) {
            hf.to_string()
        } else {
            "null".to_string()
        }
    };
    writeln!(
        y,
        "training_split: {}\nvalidation_split: {}",
        named(Split::Train, "train"),
        named(Split::Val, "validation")
    )?;
    if layout.labelled(Split::Test) && layout.present(Split::Test) {
        writeln!(y, "test_split: test")
    } else {
        writeln!(y, "test_split: null")
    }
}

fn header(y: &mut String, style: &str) -> std::fmt::Result {
    writeln!(
        y,
        "# {style} multiple-choice task on this dataset for lm-evaluation-harness, written by afkit.\n\
         # Run it from the dataset's folder (the paths below are relative to it):\n#   {}",
        command()
    )
}

fn metrics(y: &mut String) -> std::fmt::Result {
    writeln!(y, "metric_list:")?;
    for metric in ["acc", "acc_norm"] {
        writeln!(
            y,
            "  - metric: {metric}\n    aggregation: mean\n    higher_is_better: true"
        )?;
    }
    writeln!(y, "metadata:\n  version: 1.0")
}

/// The regular CSVs, the startphrase as the context and the four endings as the choices, as in
/// the harness's `swag`.
fn swag_task(layout: &Layout) -> String {
    let mut y = String::new();
    let _ = write_swag_task(&mut y, layout);
    y
}

fn write_swag_task(y: &mut String, layout: &Layout) -> std::fmt::Result {
    header(y, "SWAG-style")?;
    writeln!(y, "task: {SWAG_TASK}\ndataset_path: csv")?;
    writeln!(y, "dataset_kwargs:\n  data_files:")?;
    for (split, hf) in layout.hf_splits() {
        writeln!(y, "    {hf}: {}", layout.regular(split))?;
    }
    // Endings such as "NA" stay text.
    writeln!(y, "  keep_default_na: false")?;
    writeln!(y, "output_type: multiple_choice")?;
    evaluation_splits(y, layout)?;
    writeln!(y, "doc_to_text: startphrase\ndoc_to_target: label")?;
    writeln!(
        y,
        "doc_to_choice: \"{{{{[ending0, ending1, ending2, ending3]}}}}\""
    )?;
    metrics(y)
}

/// The JSONL files, HellaSwag's prompt ("activity label: context") and its `endings` and `label`.
fn hellaswag_task(layout: &Layout) -> String {
    let mut y = String::new();
    let _ = write_hellaswag_task(&mut y, layout);
    y
}

fn write_hellaswag_task(y: &mut String, layout: &Layout) -> std::fmt::Result {
    header(y, "HellaSwag-style")?;
    writeln!(y, "task: {HELLASWAG_TASK}\ndataset_path: json")?;
    writeln!(y, "dataset_kwargs:\n  data_files:")?;
    for (split, hf) in layout.hf_splits() {
        writeln!(y, "    {hf}: {}", layout.jsonl(split))?;
    }
    writeln!(y, "output_type: multiple_choice")?;
    evaluation_splits(y, layout)?;
    writeln!(y, "doc_to_text: \"{{{{activity_label}}}}: {{{{ctx}}}}\"")?;
    writeln!(y, "doc_to_target: label\ndoc_to_choice: endings")?;
    metrics(y)
}
