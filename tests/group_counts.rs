//! `assemble` and the exported dataset card count a split's groups the same way: the groups
//! with at least one example in the split, not every group the split was dealt.

use crate::common;

use common::{ok, Project};

#[test]
fn assemble_and_the_card_count_the_same_groups() {
    let p = Project::new();
    for g in 0..6 {
        for i in 0..2 {
            p.context(&format!("vid{g:02}"), i, 10, 8);
        }
    }
    // Groups whose only context has too few negatives: dealt to a split, but without examples.
    for g in 6..12 {
        p.context(&format!("vid{g:02}"), 0, 10, 2);
    }
    let summary = p.assemble(&["--unverified", "--seed", "1"]);
    assert_eq!(summary["too_few_negatives"], 6, "{summary}");
    let printed = ok(&["assemble", p.p(), "--unverified", "--seed", "1"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dataset");
    ok(&["export", p.p(), "--out", out.to_str().unwrap()]);
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();

    let mut total = 0;
    for split in ["train", "val", "test"] {
        let examples = summary["examples"][split].as_u64().unwrap_or(0);
        let groups = summary["groups"][split].as_u64().unwrap_or(0);
        let row = card
            .lines()
            .find(|l| l.starts_with(&format!("| {split} |")))
            .unwrap_or_else(|| panic!("no {split} row in the card:\n{card}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells[2], examples.to_string(), "examples in {row}");
        assert_eq!(cells[3], groups.to_string(), "groups in {row}");
        let line = printed
            .lines()
            .find(|l| l.trim_start().starts_with(split))
            .unwrap_or_else(|| panic!("no {split} line in:\n{printed}"));
        assert!(
            line.ends_with(&format!("from {groups} groups"))
                || line.ends_with(&format!("from {groups} group")),
            "{line}"
        );
        total += groups;
    }
    assert_eq!(total, 6, "only the six groups with examples count");
    assert!(card.contains("A group is"), "the card says what a group is");
}

/// One word for the input (a context) and another for the assembled four-way item (a question).
#[test]
fn status_and_assemble_call_inputs_contexts_and_items_questions() {
    let p = common::unverified_project(6);
    let printed = ok(&["assemble", p.p(), "--unverified", "--seed", "1"]);
    assert!(
        printed.contains("assembled unverified questions"),
        "{printed}"
    );
    for split in ["train", "val", "test"] {
        let line = printed
            .lines()
            .find(|l| l.trim_start().starts_with(split))
            .unwrap();
        assert!(
            line.contains(" questions from ") || line.contains(" question from "),
            "{line}"
        );
    }
    let status = ok(&["status", p.p()]);
    assert!(status.contains("\ncontexts     12\n"), "{status}");
    assert!(status.contains("assembled    12 questions"), "{status}");
    assert!(!status.contains("example"), "{status}");
}
