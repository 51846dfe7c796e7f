//! Question review round trip: the assembled questions out as CSV, one row per question as a test
//! taker sees it, the reviewers' verdicts back in (see [`afkit_store::review`] for what they do).
//!
//! A question goes out while one of its distractors has passed fewer reviews of its context
//! than asked for, and no review item with its four endings has all the reviews it wants: after
//! assembly has replaced a distractor a review set aside with one no review has seen, the
//! changed question is a new item and goes out again; a question made of distractors that each
//! passed review in other questions of its context does not. Result rows are validated like
//! crowd results; the valid ones are imported in one transaction, the others reported by line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;

use afkit_engine::output::Output;
use afkit_engine::seed::{Key, Seed};
use afkit_store::assemble::AssembledExample;
use afkit_store::dataset::startphrase;
use afkit_store::review::{Flag, NewReview, ReviewItemView, ReviewTally, OPTIONS};
use afkit_store::Store;

use super::crowd::{read_records, spreadsheet_safe, submitted_at, write_task_file, TaskRow};

/// The letters that name a question's endings, in the order shown.
pub const LETTERS: [char; OPTIONS] = ['A', 'B', 'C', 'D'];

/// Columns of `afkit crowd review-export`, in order.
pub const EXPORT_COLUMNS: [&str; 9] = [
    "item_id",
    "assignments",
    "context",
    "sent1",
    "sent2",
    "ending_a",
    "ending_b",
    "ending_c",
    "ending_d",
];

/// What reviewers are told, written beside the review file.
pub const INSTRUCTIONS: &str = include_str!("../../../prompts/review_instructions.md");

/// What `export` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub rows: usize,
    /// Questions whose review items already have every review they want.
    pub reviewed: usize,
    /// Questions that cannot be reviewed: a generated ending is their answer (training only),
    /// or they have fewer than three distractors.
    pub not_reviewable: usize,
    pub instructions: PathBuf,
    pub neutralised: usize,
}

/// Writes every assembled question that still wants reviews to `out` (through `output`: never
/// over the project, a temporary file renamed into place) with the reviewers' instructions beside
/// it. A question seen for the first time becomes a review item with `reviewers` reviews wanted
/// and its endings in an order drawn from `seed`; an item that wants fewer is raised to
/// `reviewers`, so a second reviewer can be asked for after the first.
pub fn export(
    store: &mut Store,
    out: &Path,
    reviewers: i64,
    seed: Seed,
    output: &Output,
) -> Result<Exported> {
    if store.assembly_info()?.is_none() {
        bail!(
            "{} has no assembled questions: run `afkit assemble` first",
            store.path().display()
        );
    }
    let (items, reviewed, not_reviewable) =
        store.write_transaction(|store| wanted_items(store, reviewers, seed))?;
    let fingerprint = store.fingerprint()?;
    let header: Vec<String> = EXPORT_COLUMNS.iter().map(|s| s.to_string()).collect();
    let rows: Vec<TaskRow> = items
        .iter()
        .map(|view| {
            let mut texts = vec![
                startphrase(&view.sent1, &view.sent2),
                view.sent1.clone(),
                view.sent2.clone(),
            ];
            texts.extend(view.texts.iter().cloned());
            TaskRow {
                plain: vec![
                    item_id(&fingerprint, view.item.id),
                    (view.item.reviewers - view.item.reviewed).to_string(),
                ],
                texts,
            }
        })
        .collect();
    let output = output.clone().protect_project(store.path());
    let (instructions, neutralised) = write_task_file(&output, out, INSTRUCTIONS, &header, &rows)?;
    Ok(Exported {
        rows: items.len(),
        reviewed,
        not_reviewable,
        instructions,
        neutralised,
    })
}

/// The review items of every assembled question that still wants reviews (made where a question
/// has none), and the counts of questions reviewed and not reviewable.
fn wanted_items(
    store: &Store,
    reviewers: i64,
    seed: Seed,
) -> Result<(Vec<ReviewItemView>, usize, usize)> {
    let (mut items, mut reviewed, mut not_reviewable) = (Vec::new(), 0, 0);
    let passed = store.review_passed()?;
    for question in store.assembled_examples()? {
        let Some(shown) = shown_endings(&question) else {
            not_reviewable += 1;
            continue;
        };
        let passed = passed.get(&question.example_id);
        let reviews_passed = |e: &i64| passed.and_then(|p| p.get(e)).copied().unwrap_or(0);
        if shown[1..].iter().all(|e| reviews_passed(e) >= reviewers) {
            reviewed += 1;
            continue;
        }
        let earlier = store.review_items_of(question.example_id)?;
        let id = match earlier.iter().find(|item| item.shows(&shown)) {
            Some(item) if item.reviewed >= item.reviewers.max(reviewers) => {
                reviewed += 1;
                continue;
            }
            Some(item) => {
                store.want_reviews(item.id, reviewers)?;
                item.id
            }
            None => {
                let mut order = shown;
                let key = Key::Review {
                    example: question.example_id,
                    item: earlier.len() as i64,
                };
                order.shuffle(&mut seed.key(key).rng());
                store.create_review_item(question.example_id, order, reviewers)?
            }
        };
        items.push(store.review_item(id)?.context("a review item just read")?);
    }
    // A caption's context is often the caption before it whole: in assembly order, one
    // question's real ending would show in the context of the next.
    items.shuffle(&mut seed.key(Key::ReviewOrder).rng());
    Ok((items, reviewed, not_reviewable))
}

/// The four endings a question shows: its found ending and its first three distractors; `None`
/// for a question whose answer is a generation or that has fewer than three.
fn shown_endings(question: &AssembledExample) -> Option<[i64; OPTIONS]> {
    if question.gold_ending_id != question.found_ending_id || question.distractors.len() < 3 {
        return None;
    }
    let d = &question.distractors;
    Some([question.gold_ending_id, d[0].0, d[1].0, d[2].0])
}

/// A review item's id in a review file: the project's fingerprint, `r` and the item's number,
/// so that results can only be imported into the project whose questions they answer, and are
/// not mistaken for annotation results.
fn item_id(fingerprint: &str, item: i64) -> String {
    format!("{fingerprint}-r{item}")
}

/// A row that was not imported.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    /// Line in the file (the header is line 1).
    pub line: u64,
    pub reason: String,
}

/// The rows of a review results file, validated against the project, and how many of them
/// [`import`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedReviews {
    pub valid: Vec<NewReview>,
    pub imported: usize,
    pub rejected: Vec<Rejected>,
    /// The project's reviews after the import.
    pub tally: ReviewTally,
}

/// Validates every row of `file` and imports the valid ones in one transaction (none at all with
/// `strict` when any row is invalid), checked inside the write transaction so that two imports
/// of one file do not both pass the duplicate check.
pub fn import(store: &mut Store, file: &Path, strict: bool) -> Result<CheckedReviews> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    store.write_transaction(|store| {
        let mut checked = check_reviews(store, file, &bytes)?;
        // With `strict` and a rejected row nothing is written: the transaction commits empty.
        if !strict || checked.rejected.is_empty() {
            for review in &checked.valid {
                store.insert_review(review)?;
            }
            checked.imported = checked.valid.len();
        }
        checked.tally = store.review_tally()?;
        Ok(checked)
    })
}

/// Reads review results from `bytes` (the contents of `file`, which messages name): columns
/// `worker_id`, `item_id`, `pick` (a letter A-D), `also_plausible` and `broken` (letters, blank
/// for none), optionally `submitted_at` and the export's text columns, which must match the item.
pub fn check_reviews(store: &Store, file: &Path, bytes: &[u8]) -> Result<CheckedReviews> {
    let (header, records) = read_records(file, bytes)?;
    let columns: HashMap<String, usize> = header
        .iter()
        .enumerate()
        .map(|(i, h)| (h.trim().to_string(), i))
        .collect();
    for name in ["worker_id", "item_id", "pick"] {
        if !columns.contains_key(name) {
            bail!(
                "{}:1: no {name:?} column; expected review results: worker_id, item_id, pick, \
                 also_plausible, broken (the columns `afkit crowd review-export` asks for)",
                file.display()
            );
        }
    }
    let mut rows = RowChecks {
        store,
        fingerprint: store.fingerprint()?,
        fields: header.len(),
        columns,
        items: HashMap::new(),
        first_line: HashMap::new(),
        valid: Vec::new(),
        rejected: Vec::new(),
    };
    for (row, line) in &records {
        match rows.parse(row) {
            Ok(review) => rows.admit(review, *line)?,
            Err(reason) => rows.rejected.push(Rejected {
                line: *line,
                reason,
            }),
        }
    }
    Ok(CheckedReviews {
        valid: rows.valid,
        imported: 0,
        rejected: rows.rejected,
        tally: ReviewTally::default(),
    })
}

/// The state of a check over a file's rows.
struct RowChecks<'a> {
    store: &'a Store,
    fingerprint: String,
    fields: usize,
    columns: HashMap<String, usize>,
    /// Items looked up so far, with the reviews taken (in the project and on valid rows).
    items: HashMap<i64, Option<(ReviewItemView, i64)>>,
    /// Line of the first valid row of each (worker, item).
    first_line: HashMap<(String, i64), u64>,
    valid: Vec<NewReview>,
    rejected: Vec<Rejected>,
}

impl RowChecks<'_> {
    fn field<'r>(&self, row: &'r csv::StringRecord, name: &str) -> &'r str {
        self.columns
            .get(name)
            .and_then(|&i| row.get(i))
            .map_or("", str::trim)
    }

    /// The row as a review, or why it is not one.
    fn parse(&mut self, row: &csv::StringRecord) -> std::result::Result<NewReview, String> {
        if row.len() != self.fields {
            return Err(format!(
                "{} fields where the header has {}",
                row.len(),
                self.fields
            ));
        }
        let reviewer = self.field(row, "worker_id");
        if reviewer.is_empty() {
            return Err("the worker id is empty".into());
        }
        let item = self.item(self.field(row, "item_id"))?;
        self.same_texts(row, &item)?;
        let letter = |name: &str| letters(self.field(row, name), name);
        let pick = match letter("pick")?.as_slice() {
            [one] => *one,
            [] => return Err("pick is empty: expected the letter of one ending".into()),
            _ => return Err("pick names more than one ending".into()),
        };
        let mut flags = Vec::new();
        for (name, flag) in [
            ("also_plausible", Flag::Plausible),
            ("broken", Flag::Broken),
        ] {
            for k in letter(name)? {
                if !(flag == Flag::Plausible && k == pick) {
                    flags.push((item.item.endings[k], flag));
                }
            }
        }
        let cell = Some(self.field(row, "submitted_at")).filter(|v| !v.is_empty());
        let submitted_at = submitted_at(cell)?;
        Ok(NewReview {
            item_id: item.item.id,
            reviewer: reviewer.to_string(),
            pick: item.item.endings[pick],
            flags,
            submitted_at,
        })
    }

    /// The review item an item id names: one of this project's.
    fn item(&mut self, id: &str) -> std::result::Result<ReviewItemView, String> {
        let (theirs, number) = id.rsplit_once("-r").ok_or_else(|| {
            format!(
                "item id {id:?} is not a review item id (expected {}-rN)",
                self.fingerprint
            )
        })?;
        if theirs != self.fingerprint {
            return Err(format!(
                "item {id} belongs to another project (this project's review items are {}-rN)",
                self.fingerprint
            ));
        }
        let number: i64 = number
            .parse()
            .map_err(|_| format!("item id {id:?} is not a review item id"))?;
        if !self.items.contains_key(&number) {
            let view = self.store.review_item(number).map_err(|e| e.to_string())?;
            let entry = view.map(|v| {
                let taken = v.item.reviewed;
                (v, taken)
            });
            self.items.insert(number, entry);
        }
        match &self.items[&number] {
            Some((view, _)) => Ok(view.clone()),
            None => Err(format!("unknown review item {id}")),
        }
    }

    /// The export's text columns the row carries must be the item's.
    fn same_texts(
        &self,
        row: &csv::StringRecord,
        item: &ReviewItemView,
    ) -> std::result::Result<(), String> {
        let mut expected = vec![
            ("context", startphrase(&item.sent1, &item.sent2)),
            ("sent1", item.sent1.clone()),
            ("sent2", item.sent2.clone()),
        ];
        for (name, text) in EXPORT_COLUMNS[5..].iter().zip(&item.texts) {
            expected.push((name, text.clone()));
        }
        for (name, text) in expected {
            if !self.columns.contains_key(name) {
                continue;
            }
            let given = self.field(row, name);
            if given != text.trim() && given != spreadsheet_safe(text.trim()) {
                return Err(format!(
                    "{name} does not match review item {} of this project",
                    item.item.id
                ));
            }
        }
        Ok(())
    }

    /// Keeps a parsed review unless its worker already reviewed the item (on an earlier line or
    /// in the project) or the item has every review it wants.
    fn admit(&mut self, review: NewReview, line: u64) -> Result<()> {
        let key = (review.reviewer.clone(), review.item_id);
        let reason = if let Some(first) = self.first_line.get(&key) {
            format!(
                "duplicate: worker {} already reviewed item {} on line {first}",
                review.reviewer, review.item_id
            )
        } else if self.store.has_reviewed(review.item_id, &review.reviewer)? {
            format!(
                "duplicate: worker {} already has a review of item {} in the project",
                review.reviewer, review.item_id
            )
        } else {
            let (view, taken) = self
                .items
                .get_mut(&review.item_id)
                .and_then(Option::as_mut)
                .expect("a parsed row's item is known");
            if *taken >= view.item.reviewers {
                format!(
                    "item {} wants {} reviews and has them already (in the project or on \
                     earlier lines)",
                    review.item_id, view.item.reviewers
                )
            } else {
                *taken += 1;
                self.first_line.insert(key, line);
                self.valid.push(review);
                return Ok(());
            }
        };
        self.rejected.push(Rejected { line, reason });
        Ok(())
    }
}

/// The endings a field names, as indices: letters A-D (either case) separated by spaces or
/// commas, each once.
fn letters(text: &str, column: &str) -> std::result::Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in text.split([' ', ',']).filter(|p| !p.is_empty()) {
        let mut chars = part.chars();
        let k = match (chars.next(), chars.next()) {
            (Some(c), None) => LETTERS.iter().position(|l| *l == c.to_ascii_uppercase()),
            _ => None,
        }
        .ok_or_else(|| format!("{column} holds {part:?}: expected letters A to D"))?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_take_either_case_and_either_separator_and_nothing_else() {
        assert_eq!(letters("", "x"), Ok(vec![]));
        assert_eq!(letters("b", "x"), Ok(vec![1]));
        assert_eq!(letters("A c,D, a", "x"), Ok(vec![0, 2, 3]));
        assert!(letters("E", "x").unwrap_err().contains("\"E\""));
        assert!(letters("AB", "x").is_err());
        assert!(letters("1", "x").is_err());
    }
}
