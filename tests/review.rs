//! End-to-end tests of question review (`afkit crowd review-export` / `review-import`) and what assembly does
//! with the verdicts, through the `afkit` binary on hand-made projects.

use crate::common;

use std::path::Path;

use common::{arg, csv_table, fails, ok, unverified_project, Project};

const L: &str = "likely";
const U: &str = "unlikely";
const BEST: Option<&str> = Some("best");
const SECOND: Option<&str> = Some("second");

/// The ending ids of review item `item`, in the order shown (A to D).
fn item_endings(p: &Project, item: i64) -> [i64; 4] {
    p.conn
        .query_row(
            "SELECT ending_a, ending_b, ending_c, ending_d FROM review_items WHERE id = ?1",
            [item],
            |r| Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?]),
        )
        .unwrap()
}

/// The letter under which review item `item` shows `ending`.
fn letter_of(p: &Project, item: i64, ending: i64) -> &'static str {
    let at = item_endings(p, item).iter().position(|&e| e == ending);
    ["A", "B", "C", "D"][at.expect("the item shows the ending")]
}

/// The found ending of the context review item `item` asks about.
fn found_of_item(p: &Project, item: i64) -> i64 {
    p.conn
        .query_row(
            "SELECT e.id FROM review_items i
             JOIN endings e ON e.example_id = i.example_id AND e.is_gold = 1 WHERE i.id = ?1",
            [item],
            |r| r.get(0),
        )
        .unwrap()
}

/// The item number of a review file's item id (`<fingerprint>-r<N>`).
fn item_number(item_id: &str) -> i64 {
    item_id.rsplit_once("-r").unwrap().1.parse().unwrap()
}

fn write_results(path: &Path, rows: &[[&str; 5]]) {
    let mut text = String::from("worker_id,item_id,pick,also_plausible,broken\n");
    for row in rows {
        text.push_str(&row.join(","));
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// A first review round of a 20-question unverified project: the first question's reviewer picks
/// the found ending and names one distractor plausible and another broken, the others pass.
/// Returns the project and the two named endings.
fn first_round(dir: &Path) -> (Project, i64, i64) {
    let p = unverified_project(10);
    let out = dir.join("r1.csv");
    let printed = ok(&["crowd", "review-export", p.p(), "--out", arg(&out)]);
    assert!(printed.contains("wrote 20 questions"), "{printed}");
    assert!(dir.join("r1.instructions.md").exists());
    let (header, rows) = csv_table(&out);
    assert_eq!(header[..3], ["item_id", "assignments", "context"]);
    assert!(rows.iter().all(|r| r[1] == "1"));
    let first = item_number(&rows[0][0]);
    let found = found_of_item(&p, first);
    let assembled = p.assembled();
    let question = assembled.iter().find(|q| q.1 == found).unwrap();
    let (plausible, broken) = (question.3[0], question.3[2]);
    let mut results = vec![[
        "ann",
        rows[0][0].as_str(),
        letter_of(&p, first, found),
        letter_of(&p, first, plausible),
        letter_of(&p, first, broken),
    ]];
    for row in &rows[1..] {
        let item = item_number(&row[0]);
        let pick = letter_of(&p, item, found_of_item(&p, item));
        results.push(["ann", row[0].as_str(), pick, "", ""]);
    }
    let file = dir.join("r1.results.csv");
    write_results(&file, &results);
    let printed = ok(&["crowd", "review-import", p.p(), arg(&file)]);
    assert!(printed.contains("imported 20 reviews"), "{printed}");
    assert!(
        printed.contains("picked the real ending in 20 (100.0%)"),
        "{printed}"
    );
    assert!(printed.contains("1 also plausible, 1 broken"), "{printed}");
    (p, plausible, broken)
}

#[test]
fn a_flagged_distractor_is_replaced_and_only_the_changed_question_goes_out_again() {
    let dir = tempfile::tempdir().unwrap();
    let (p, plausible, broken) = first_round(dir.path());
    let before = p.assembled();
    let s = p.assemble(&["--unverified", "--seed", "1"]);
    assert_eq!(s["review_set_aside"], 2);
    let after = p.assembled();
    let changed: Vec<usize> = (0..after.len())
        .filter(|&i| after[i] != before[i])
        .collect();
    assert_eq!(changed.len(), 1, "only the reviewed question changes");
    let (_, found, _, kept) = &after[changed[0]];
    assert!(
        !kept.contains(&plausible) && !kept.contains(&broken),
        "{kept:?}"
    );

    let again = dir.path().join("r2.csv");
    let printed = ok(&["crowd", "review-export", p.p(), "--out", arg(&again)]);
    assert!(printed.contains("wrote 1 question"), "{printed}");
    assert!(printed.contains("19 reviewed already"), "{printed}");
    let status = ok(&["status", p.p()]);
    assert!(
        status.contains("reviews      20 (21 questions as shown to reviewers, 1 still wanting"),
        "{status}"
    );
    let (_, rows) = csv_table(&again);
    let shown = item_endings(&p, item_number(&rows[0][0]));
    assert!(shown.contains(found) && kept[..3].iter().all(|d| shown.contains(d)));
}

/// Stores one review of a question of `found`'s context showing `found` and `wrong`: the
/// reviewer picks the found ending and names each of `flags` (ending, `plausible` or `broken`).
fn review_of(p: &Project, found: i64, wrong: [i64; 3], flags: &[(i64, &str)]) {
    p.conn
        .execute(
            "INSERT INTO review_items (example_id, ending_a, ending_b, ending_c, ending_d,
               reviewers, created_at)
             SELECT example_id, ?1, ?2, ?3, ?4, 1, 'now' FROM endings WHERE id = ?1",
            [found, wrong[0], wrong[1], wrong[2]],
        )
        .unwrap();
    let item = p.conn.last_insert_rowid();
    p.conn
        .execute(
            "INSERT INTO reviews (item_id, reviewer, pick, submitted_at) VALUES (?1, 'r', ?2, 'now')",
            [item, found],
        )
        .unwrap();
    let review = p.conn.last_insert_rowid();
    for (ending, flag) in flags {
        p.conn
            .execute(
                "INSERT INTO review_flags (review_id, ending_id, flag) VALUES (?1, ?2, ?3)",
                rusqlite::params![review, ending, flag],
            )
            .unwrap();
    }
}

/// A verdict is on one ending of one context: a question made only of candidates that passed
/// review in other questions of its context does not go out for review again, and the export
/// does not flag it as could-be-right whatever the language model says of its distractors.
#[test]
fn a_question_of_endings_that_passed_review_needs_no_new_review() {
    let p = unverified_project(10);
    let (_, found, _, shown) = p.assembled().swap_remove(0);
    let assigned: Vec<i64> = p
        .conn
        .prepare("SELECT ending_id FROM af_assignments a JOIN endings e ON e.id = a.ending_id WHERE e.example_id = (SELECT example_id FROM endings WHERE id = ?1) ORDER BY slot")
        .unwrap()
        .query_map([found], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let unseen: Vec<i64> = assigned
        .into_iter()
        .filter(|e| !shown.contains(e))
        .collect();
    assert_eq!(unseen.len(), 4, "{unseen:?}");
    // Five candidates pass (shown 1 and 2, unseen 0 to 2), three are set aside.
    review_of(
        &p,
        found,
        [shown[0], shown[1], shown[2]],
        &[(shown[0], "plausible")],
    );
    review_of(&p, found, [unseen[0], unseen[1], unseen[2]], &[]);
    review_of(
        &p,
        found,
        [shown[3], unseen[3], shown[1]],
        &[(shown[3], "broken"), (unseen[3], "broken")],
    );

    let s = p.assemble(&["--unverified", "--seed", "1"]);
    assert_eq!(s["review_set_aside"], 3);
    let (_, _, _, now) = p.assembled().swap_remove(0);
    let passed = [shown[1], shown[2], unseen[0], unseen[1], unseen[2]];
    assert!(now[..3].iter().all(|d| passed.contains(d)), "{now:?}");

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.csv");
    let printed = ok(&["crowd", "review-export", p.p(), "--out", arg(&out)]);
    assert!(printed.contains("wrote 19 questions"), "{printed}");
    assert!(printed.contains("1 reviewed already"), "{printed}");

    // A person's verdict outweighs the machine's: with every candidate as likely as its found
    // ending, the export flags each question as could-be-right but the reviewed one.
    p.conn
        .execute("UPDATE endings SET lp_cond = -1.0 WHERE is_gold = 0", [])
        .unwrap();
    let export = dir.path().join("export");
    ok(&["export", p.p(), "--out", arg(&export), "--with-test-labels"]);
    let reviewed: String = p
        .conn
        .query_row(
            "SELECT x.ext_id FROM examples x JOIN endings e ON e.example_id = x.id WHERE e.id = ?1",
            [found],
            |r| r.get(0),
        )
        .unwrap();
    let mut unflagged = Vec::new();
    for split in ["train", "val", "test"] {
        let Ok(text) = std::fs::read_to_string(export.join(format!("jsonl/{split}.jsonl"))) else {
            continue;
        };
        for line in text.lines() {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            if !row["could_be_right"].as_bool().unwrap() {
                unflagged.push(row["id"].as_str().unwrap().to_string());
            }
        }
    }
    assert_eq!(unflagged, vec![reviewed]);
}

#[test]
fn a_second_reviewer_can_be_asked_for_after_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, _) = first_round(dir.path());
    p.assemble(&["--unverified", "--seed", "1"]);
    // The reviewed questions want one more review, the changed one (never reviewed) two.
    let second = dir.path().join("r2.csv");
    let printed = ok(&[
        "crowd",
        "review-export",
        p.p(),
        "--out",
        arg(&second),
        "--reviewers",
        "2",
    ]);
    assert!(printed.contains("wrote 20 questions"), "{printed}");
    let (_, rows) = csv_table(&second);
    let wanted: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(
        wanted.iter().filter(|w| **w == "1").count(),
        19,
        "{wanted:?}"
    );
    assert_eq!(
        wanted.iter().filter(|w| **w == "2").count(),
        1,
        "{wanted:?}"
    );
}

#[test]
fn review_import_reports_each_invalid_row_by_line_and_imports_the_rest() {
    let p = unverified_project(10);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r1.csv");
    ok(&["crowd", "review-export", p.p(), "--out", arg(&out)]);
    let (_, rows) = csv_table(&out);
    let (a, b) = (rows[0][0].as_str(), rows[1][0].as_str());
    let other_project = format!("0123456789ab-r{}", item_number(a));
    let unknown = format!("{}-r999", a.rsplit_once("-r").unwrap().0);
    let file = dir.path().join("results.csv");
    write_results(
        &file,
        &[
            ["w1", a, "A", "B", ""],             // line 2: valid
            ["w1", a, "B", "", ""],              // line 3: the same worker again
            ["w2", a, "C", "", ""],              // line 4: the item wants one review
            ["w3", b, "E", "", ""],              // line 5: no such letter
            ["w3", b, "", "A", ""],              // line 6: no pick
            ["w3", &other_project, "A", "", ""], // line 7: another project's item
            ["w3", &unknown, "A", "", ""],       // line 8: no such item
            ["w3", b, "A B", "", ""],            // line 9: two picks
        ],
    );
    let strict = fails(&["crowd", "review-import", p.p(), arg(&file), "--strict"]);
    assert!(strict.contains("nothing imported (--strict)"), "{strict}");
    assert_eq!(
        common::query_i64(&p.path, "SELECT COUNT(*) FROM reviews"),
        0
    );

    let out = common::afkit(&["crowd", "review-import", p.p(), arg(&file)]);
    common::assert_succeeded(&out);
    let stderr = common::stderr(&out);
    for (line, reason) in [
        (3, "already reviewed item"),
        (4, "wants 1 reviews"),
        (5, "expected letters A to D"),
        (6, "pick is empty"),
        (7, "belongs to another project"),
        (8, "unknown review item"),
        (9, "more than one ending"),
    ] {
        let expected = format!("results.csv:{line}: ");
        let found = stderr
            .lines()
            .find(|l| l.contains(&expected))
            .unwrap_or_else(|| panic!("no line {line} in {stderr}"));
        assert!(found.contains(reason), "{found}");
    }
    assert!(!stderr.contains("results.csv:2:"), "{stderr}");
    assert!(common::stdout(&out).contains("imported 1 review"));
    assert_eq!(
        common::query_i64(&p.path, "SELECT COUNT(*) FROM reviews"),
        1
    );
}

#[test]
fn a_verified_question_left_with_too_few_distractors_asks_for_a_spare_round() {
    let p = Project::new();
    let c = p.context("v1", 0, 12, 11);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, BEST),
        [(U, None), (U, None), (U, SECOND), (L, None), (U, None)],
    );
    // Four candidates judged unlikely, so no spare round yet.
    let args = [
        "--distractors",
        "hardest",
        "--split",
        "1,0,0",
        "--choose-from",
        "4",
    ];
    let s = p.assemble(&args);
    assert_eq!(s["spare_rounds_queued"], 0);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r1.csv");
    ok(&["crowd", "review-export", p.p(), "--out", arg(&out)]);
    let (_, rows) = csv_table(&out);
    let item = item_number(&rows[0][0]);
    let shown = item_endings(&p, item);
    let distractors: Vec<i64> = shown.iter().copied().filter(|&e| e != c.found).collect();
    // The reviewer picks a distractor and names another plausible: two of four candidates go.
    let file = dir.path().join("r1.results.csv");
    write_results(
        &file,
        &[[
            "rev",
            rows[0][0].as_str(),
            letter_of(&p, item, distractors[0]),
            letter_of(&p, item, distractors[1]),
            "",
        ]],
    );
    ok(&["crowd", "review-import", p.p(), arg(&file)]);
    let s = p.assemble(&args);
    assert_eq!(s["review_set_aside"], 2);
    assert_eq!(s["review_too_few"], 1);
    assert_eq!(s["spare_rounds_queued"], 1);
    assert!(p.assembled().is_empty());
    let spare = p.open_task_endings();
    assert!(spare.contains(&c.found));
    assert!(!spare.contains(&distractors[0]) && !spare.contains(&distractors[1]));
}

#[test]
fn review_export_needs_an_assembly() {
    let p = Project::new();
    p.context("v1", 0, 6, 4);
    let dir = tempfile::tempdir().unwrap();
    let err = fails(&[
        "crowd",
        "review-export",
        p.p(),
        "--out",
        arg(&dir.path().join("r.csv")),
    ]);
    assert!(err.contains("run `afkit assemble` first"), "{err}");
    assert!(!dir.path().join("r.csv").exists());
}
