//! Crowdsourcing round trip: tasks out as CSV (one row per item), results back in, either in
//! afkit's own result columns or in Mechanical Turk's batch-results layout. Every result row is
//! validated; the valid ones are imported in one transaction, the others reported by line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use afkit_engine::csv_lines::RecordLines;
use afkit_engine::output::Output;
use afkit_store::annotate::labels::NewSubmission;
use afkit_store::annotate::tasks::{TaskView, ENDINGS_PER_TASK};
use afkit_store::dataset::{startphrase, Judgement};
use afkit_store::Store;

use super::ui::INSTRUCTIONS;
use super::verdict;

/// Columns of `afkit crowd export`, in order (`ending_1` .. `ending_6` follow `sent2`).
pub(crate) const EXPORT_COLUMNS: [&str; 5] =
    ["item_id", "assignments", "context", "sent1", "sent2"];

/// What `export` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exported {
    pub rows: usize,
    /// The workers' instructions, written beside the tasks.
    pub instructions: PathBuf,
    /// Text cells that began like a spreadsheet formula and were written with a leading `'`.
    pub neutralised: usize,
}

/// The instructions file written beside a task file `out`: `tasks.csv` → `tasks.instructions.md`.
pub fn instructions_path(out: &Path) -> PathBuf {
    out.with_extension("instructions.md")
}

/// Writes every open item that still needs annotators (all open items with `all`) to `out`
/// through `output` (never over the project; a temporary file renamed into place), and beside it
/// the instructions the terminal UI shows, so that crowd workers judge by the same rules.
pub fn export(store: &Store, out: &Path, all: bool, output: &Output) -> Result<Exported> {
    let tasks = store.open_tasks(!all)?;
    let fingerprint = store.fingerprint()?;
    let mut header: Vec<String> = EXPORT_COLUMNS.iter().map(|s| s.to_string()).collect();
    header.extend((1..=ENDINGS_PER_TASK).map(|i| format!("ending_{i}")));
    let rows: Vec<TaskRow> = tasks
        .iter()
        .map(|task| {
            let mut texts = vec![
                startphrase(&task.sent1, &task.sent2),
                task.sent1.clone(),
                task.sent2.clone(),
            ];
            texts.extend((0..ENDINGS_PER_TASK).map(|i| {
                task.endings
                    .get(i)
                    .map_or_else(String::new, |e| e.text.clone())
            }));
            TaskRow {
                plain: vec![
                    item_id(&fingerprint, task.task_id),
                    (task.replicas - task.submitted).max(0).to_string(),
                ],
                texts,
            }
        })
        .collect();
    let output = output.clone().protect_project(store.path());
    let (instructions, neutralised) = write_task_file(&output, out, INSTRUCTIONS, &header, &rows)?;
    Ok(Exported {
        rows: tasks.len(),
        instructions,
        neutralised,
    })
}

/// One row of a task file: its plain cells (the item id, the answers still wanted), then its
/// texts, which [`write_task_file`] writes spreadsheet-safe.
pub(crate) struct TaskRow {
    pub plain: Vec<String>,
    pub texts: Vec<String>,
}

/// Writes the task file `out` (`header`, then `rows`) and `instructions` beside it
/// ([`instructions_path`]), staged and committed as one unit through `output`; returns the
/// instructions' path and how many text cells [`spreadsheet_safe`] changed.
pub(crate) fn write_task_file(
    output: &Output,
    out: &Path,
    instructions: &str,
    header: &[String],
    rows: &[TaskRow],
) -> Result<(PathBuf, usize)> {
    let instructions_file = instructions_path(out);
    let mut staged_instructions = output.stage(&instructions_file)?;
    std::io::Write::write_all(staged_instructions.file(), instructions.as_bytes())
        .with_context(|| format!("cannot write {}", instructions_file.display()))?;
    let mut staged = output.stage(out)?;
    let mut neutralised = 0;
    {
        let mut w = csv::Writer::from_writer(staged.file());
        w.write_record(header)?;
        for row in rows {
            let mut cells = row.plain.clone();
            for text in &row.texts {
                let safe = spreadsheet_safe(text);
                neutralised += usize::from(safe.len() != text.len());
                cells.push(safe);
            }
            w.write_record(&cells)?;
        }
        w.flush()?;
    }
    output.commit(vec![staged, staged_instructions])?;
    Ok((instructions_file, neutralised))
}

/// An item's id in a task file: the project's fingerprint and the task's number, so that a
/// results file can only be imported into the project whose tasks it answers.
pub(crate) fn item_id(fingerprint: &str, task_id: i64) -> String {
    format!("{fingerprint}-{task_id}")
}

/// Task files are opened in spreadsheets by requesters: a cell that begins with `=`, `+`, `-`,
/// `@` (or their fullwidth forms, which some spreadsheets read alike), a tab or a carriage
/// return would be run as a formula there (CSV injection), so it gets a leading `'`, which
/// spreadsheets take as "this is text" and do not show. Invisible characters in front (a byte
/// order mark, zero-width spaces) do not hide the prefix.
pub(crate) fn spreadsheet_safe(text: &str) -> String {
    let visible =
        text.trim_start_matches(['\u{feff}', '\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}']);
    let formula = [
        '=', '+', '-', '@', '\t', '\r', '\u{ff1d}', '\u{ff0b}', '\u{ff0d}', '\u{ff20}',
    ];
    if visible.starts_with(formula) {
        format!("'{text}")
    } else {
        text.to_string()
    }
}

/// Which result layout a file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `worker_id, item_id, label_1..label_6, best, second[, seconds, submitted_at]`
    Afkit,
    /// Mechanical Turk batch results: `WorkerId`, `Input.item_id`, `Answer.label_1`, ...,
    /// `WorkTimeInSeconds`, `AssignmentStatus`.
    MTurk,
}

/// Reads fields of one row by logical name, whatever the layout.
struct Columns {
    layout: Layout,
    index: HashMap<String, usize>,
}

impl Columns {
    fn new(header: &csv::StringRecord) -> Columns {
        let index: HashMap<String, usize> = header
            .iter()
            .enumerate()
            .map(|(i, h)| (h.trim().to_string(), i))
            .collect();
        let layout =
            if index.contains_key("WorkerId") || index.keys().any(|k| k.starts_with("Answer.")) {
                Layout::MTurk
            } else {
                Layout::Afkit
            };
        Columns { layout, index }
    }

    fn raw<'r>(&self, row: &'r csv::StringRecord, column: &str) -> Option<&'r str> {
        self.index
            .get(column)
            .and_then(|&i| row.get(i))
            .map(str::trim)
            .filter(|v| !v.is_empty())
    }

    /// An answer field: the column itself (`Answer.best` = "3"), or, as Mechanical Turk's
    /// crowd-radio-group writes it, one true/false column per choice (`Answer.best.3` = "true").
    fn answer(&self, row: &csv::StringRecord, name: &str) -> Option<String> {
        let column = match self.layout {
            Layout::Afkit => name.to_string(),
            Layout::MTurk => format!("Answer.{name}"),
        };
        if let Some(v) = self.raw(row, &column) {
            return Some(v.to_string());
        }
        let prefix = format!("{column}.");
        let mut chosen = self.index.iter().filter_map(|(h, &i)| {
            let choice = h.strip_prefix(&prefix)?;
            let v = row.get(i)?.trim().to_ascii_lowercase();
            matches!(v.as_str(), "true" | "on" | "1" | "yes").then(|| choice.to_string())
        });
        chosen.next()
    }

    /// Whether the row flags its item as broken (optional column `broken`, `Answer.broken` on
    /// Mechanical Turk), as `x` does in the terminal UI.
    fn flags_broken(&self, row: &csv::StringRecord) -> std::result::Result<bool, String> {
        let Some(value) = self.answer(row, "broken") else {
            return Ok(false);
        };
        match value.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(format!("broken = {value:?}; expected true or false")),
        }
    }

    fn worker(&self, row: &csv::StringRecord) -> Option<String> {
        let column = match self.layout {
            Layout::Afkit => "worker_id",
            Layout::MTurk => "WorkerId",
        };
        self.raw(row, column).map(str::to_string)
    }

    fn item(&self, row: &csv::StringRecord) -> Option<String> {
        match self.layout {
            Layout::Afkit => self.raw(row, "item_id"),
            Layout::MTurk => self
                .raw(row, "Input.item_id")
                .or_else(|| self.raw(row, "Answer.item_id")),
        }
        .map(str::to_string)
    }

    fn seconds<'r>(&self, row: &'r csv::StringRecord) -> Option<&'r str> {
        match self.layout {
            Layout::Afkit => self.raw(row, "seconds"),
            Layout::MTurk => self.raw(row, "WorkTimeInSeconds"),
        }
    }
}

/// A row that was not imported.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    /// Line in the file (the header is line 1).
    pub line: u64,
    pub reason: String,
    /// The project already holds this worker's answer for the item (a file imported again).
    pub already_in_project: bool,
}

/// Validates every row of `file` and imports the valid ones in one transaction (none at all with
/// `strict` when any row is invalid). The rows are checked inside the write transaction, so two
/// imports of one file at the same time do not both pass the duplicate check: the second finds
/// the first's submissions and reports its rows as duplicates.
pub fn import(store: &mut Store, file: &Path, strict: bool) -> Result<CheckedResults> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    store.write_transaction(|store| {
        let mut checked = check_results(store, file, &bytes)?;
        // With `strict` and a rejected row nothing is written: the transaction commits empty.
        if strict && !checked.rejected.is_empty() {
            return Ok(checked);
        }
        for sub in &checked.valid {
            store.import_submission(sub)?;
        }
        checked.imported = checked.valid.len();
        Ok(checked)
    })
}

/// The rows of a results file, validated against the project, and how many of them [`import`]
/// wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedResults {
    pub valid: Vec<NewSubmission>,
    /// The valid rows written to the project: none before [`import`], none with `strict` when
    /// a row is invalid.
    pub imported: usize,
    pub rejected: Vec<Rejected>,
    pub mturk_layout: bool,
}

/// Reads crowd results from `bytes` (the contents of `file`, which messages name) and checks
/// every row against the project's tasks and submissions: known open item, complete and valid
/// labels, one submission per worker and item, no more submissions than the item's replicas;
/// the item id's fingerprint and the texts the row carries. Writes nothing but the project's
/// fingerprint, the first time one is needed.
pub fn check_results(store: &Store, file: &Path, bytes: &[u8]) -> Result<CheckedResults> {
    let (header, records) = read_records(file, bytes)?;
    let columns = Columns::new(&header);
    let required: &[&str] = match columns.layout {
        Layout::Afkit => &["worker_id", "item_id"],
        Layout::MTurk => &["WorkerId"],
    };
    for name in required {
        if !columns.index.contains_key(*name) {
            bail!(
                "{}:1: no {name:?} column; expected afkit's result columns (worker_id, item_id, \
                 label_1..label_6, best, second) or Mechanical Turk batch results (WorkerId, \
                 Input.item_id, Answer.label_1, ...)",
                file.display()
            );
        }
    }
    let mut rows = RowChecks {
        store,
        fingerprint: store.fingerprint()?,
        fields: header.len(),
        columns: &columns,
        tasks: HashMap::new(),
        first_line: HashMap::new(),
        taken: HashMap::new(),
        valid: Vec::new(),
        rejected: Vec::new(),
    };
    for (row, line) in &records {
        rows.check(row, *line)?;
    }
    Ok(CheckedResults {
        valid: rows.valid,
        imported: 0,
        rejected: rows.rejected,
        mturk_layout: columns.layout == Layout::MTurk,
    })
}

/// The header and every record of a results file, each record with its line. Read flexibly: a
/// row with the wrong number of fields is the caller's to reject on its own, by line; a file
/// that is not CSV is an error that names its line.
pub(crate) fn read_records(
    file: &Path,
    bytes: &[u8],
) -> Result<(csv::StringRecord, Vec<(csv::StringRecord, u64)>)> {
    let mut lines = RecordLines::new(bytes);
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(bytes);
    let header = reader
        .headers()
        .map_err(|e| {
            let line = lines.line_of_position(e.position());
            anyhow!(
                "{}:{line}: cannot read the header line: {e}",
                file.display()
            )
        })?
        .clone();
    let mut records = Vec::new();
    for record in reader.records() {
        let row = record.map_err(|e| {
            let line = lines.line_of_position(e.position());
            anyhow!("{}:{line}: malformed CSV: {e}", file.display())
        })?;
        let line = lines.line_of_position(row.position());
        records.push((row, line));
    }
    Ok((header, records))
}

/// The state of a check over a file's rows.
struct RowChecks<'a> {
    store: &'a Store,
    fingerprint: String,
    /// Fields per row: the header's.
    fields: usize,
    columns: &'a Columns,
    tasks: HashMap<i64, Option<TaskView>>,
    /// Line of the first valid row of each (worker, item).
    first_line: HashMap<(String, i64), u64>,
    /// Submissions per item: in the project, plus the valid rows so far.
    taken: HashMap<i64, i64>,
    valid: Vec<NewSubmission>,
    rejected: Vec<Rejected>,
}

impl RowChecks<'_> {
    fn check(&mut self, row: &csv::StringRecord, line: u64) -> Result<()> {
        match self.parse(row) {
            Ok(sub) => self.admit(sub, line),
            Err(reason) => {
                self.rejected.push(Rejected {
                    line,
                    reason,
                    already_in_project: false,
                });
                Ok(())
            }
        }
    }

    /// The row as a submission, or why it is not one: a field count other than the header's, or
    /// what [`parse_row`] refuses.
    fn parse(&mut self, row: &csv::StringRecord) -> std::result::Result<NewSubmission, String> {
        if row.len() != self.fields {
            return Err(format!(
                "{} fields where the header has {}",
                row.len(),
                self.fields
            ));
        }
        let project = (self.store, self.fingerprint.as_str());
        parse_row(project, self.columns, row, &mut self.tasks)
    }

    /// Keeps a parsed row as valid unless its worker already answered its item (on an earlier
    /// line or in the project) or the item already has every annotator it wants.
    fn admit(&mut self, sub: NewSubmission, line: u64) -> Result<()> {
        let key = (sub.annotator.clone(), sub.task_id);
        let already_in_project = !self.first_line.contains_key(&key)
            && self.store.has_submitted(sub.task_id, &sub.annotator)?;
        let reason = if let Some(first) = self.first_line.get(&key) {
            format!(
                "duplicate: worker {} already answered item {} on line {first}",
                sub.annotator, sub.task_id
            )
        } else if already_in_project {
            format!(
                "duplicate: worker {} already has a submission for item {} in the project",
                sub.annotator, sub.task_id
            )
        } else {
            let task = self.tasks[&sub.task_id]
                .as_ref()
                .expect("a parsed row's item is a known task");
            let replicas = task.replicas;
            let taken = match self.taken.get(&sub.task_id) {
                Some(&n) => n,
                None => task.submitted,
            };
            if taken >= replicas {
                format!(
                    "item {} wants {replicas} annotators and has {taken} already (in the \
                     project or on earlier lines)",
                    sub.task_id
                )
            } else {
                self.taken.insert(sub.task_id, taken + 1);
                self.first_line.insert(key, line);
                self.valid.push(sub);
                return Ok(());
            }
        };
        self.rejected.push(Rejected {
            line,
            reason,
            already_in_project,
        });
        Ok(())
    }
}

fn parse_row(
    project: (&Store, &str),
    columns: &Columns,
    row: &csv::StringRecord,
    tasks: &mut HashMap<i64, Option<TaskView>>,
) -> std::result::Result<NewSubmission, String> {
    if columns.layout == Layout::MTurk {
        if let Some(status) = columns.raw(row, "AssignmentStatus") {
            if status.eq_ignore_ascii_case("Rejected") {
                return Err("the assignment was rejected on Mechanical Turk".into());
            }
        }
    }
    let worker = columns.worker(row).ok_or("the worker id is empty")?;
    let (task_id, task) = open_task(project, columns, row, tasks)?;
    let (seconds, submitted_at) = timing(columns, row)?;
    if columns.flags_broken(row)? {
        return Ok(NewSubmission {
            task_id,
            annotator: worker,
            broken: true,
            seconds,
            submitted_at,
            labels: Vec::new(),
        });
    }
    let n = task.endings.len();
    let judgements = judgements(columns, row, task_id, n)?;
    let (best, second) = (
        ranked(columns, row, "best", n)?,
        ranked(columns, row, "second", n)?,
    );
    let problems = verdict::problems(&judgements, best, second);
    if !problems.is_empty() {
        return Err(format!(
            "incomplete or invalid: {}",
            verdict::describe(&problems)
        ));
    }
    let ids: Vec<i64> = task.endings.iter().map(|e| e.ending_id).collect();
    Ok(NewSubmission {
        task_id,
        annotator: worker,
        broken: false,
        seconds,
        submitted_at,
        labels: verdict::labels(&ids, &judgements, best, second),
    })
}

/// The row's item, looked up once per file (`tasks` caches it): it must be an item of this
/// project (its id carries the project's fingerprint), match the texts the row carries, and
/// still be open.
fn open_task(
    (store, fingerprint): (&Store, &str),
    columns: &Columns,
    row: &csv::StringRecord,
    tasks: &mut HashMap<i64, Option<TaskView>>,
) -> std::result::Result<(i64, TaskView), String> {
    let item = columns.item(row).ok_or("the item id is empty")?;
    let (theirs, number) = match item.split_once('-') {
        Some((theirs, number)) => (Some(theirs), number),
        None => (None, item.as_str()),
    };
    if theirs.is_some_and(|f| f != fingerprint) {
        return Err(format!(
            "item {item} belongs to another project (this project's items are \
             {fingerprint}-N): import the results into the project whose tasks they answer"
        ));
    }
    let task_id: i64 = number.parse().map_err(|_| {
        format!("item id {item:?} is not a crowd item id (expected {fingerprint}-N)")
    })?;
    let task = match tasks.get(&task_id) {
        Some(t) => t.clone(),
        None => {
            let t = store.task_view(task_id).map_err(|e| e.to_string())?;
            tasks.insert(task_id, t.clone());
            t
        }
    }
    .ok_or_else(|| format!("unknown item {item}"))?;
    let checked = same_texts(columns, row, &task, &item)?;
    if theirs.is_none() && !checked {
        return Err(format!(
            "item id {item} has no project fingerprint (a task file from an older afkit) and \
             the row has no context and endings to check it against: export the tasks again \
             (`afkit crowd export`) and collect the results with the new file"
        ));
    }
    if !task.open {
        return Err(format!(
            "item {task_id} was replaced by a re-annotation round; export again"
        ));
    }
    Ok((task_id, task))
}

/// Compares the texts the row carries (the task file's `context`, `sent1`, `sent2` and
/// `ending_*` columns, `Input.` ones on Mechanical Turk) with the item's. Returns whether the
/// row carried the context and every ending, all matching.
fn same_texts(
    columns: &Columns,
    row: &csv::StringRecord,
    task: &TaskView,
    item: &str,
) -> std::result::Result<bool, String> {
    let prefix = match columns.layout {
        Layout::Afkit => "",
        Layout::MTurk => "Input.",
    };
    let mut expected = vec![
        ("context".to_string(), startphrase(&task.sent1, &task.sent2)),
        ("sent1".to_string(), task.sent1.clone()),
        ("sent2".to_string(), task.sent2.clone()),
    ];
    for k in 1..=ENDINGS_PER_TASK {
        let text = task
            .endings
            .get(k - 1)
            .map_or_else(String::new, |e| e.text.clone());
        expected.push((format!("ending_{k}"), text));
    }
    let mut complete = true;
    for (name, text) in &expected {
        let column = format!("{prefix}{name}");
        let Some(&i) = columns.index.get(&column) else {
            complete &= name == "sent1" || name == "sent2";
            continue;
        };
        let given = row.get(i).unwrap_or("").trim();
        let text = text.trim();
        if given != text && given != spreadsheet_safe(text) {
            return Err(format!(
                "{column} does not match item {item} of this project: the row has {}, the \
                 item {}",
                shortened(given),
                shortened(text)
            ));
        }
    }
    Ok(complete)
}

/// A text quoted for a message, cut after 60 characters.
fn shortened(text: &str) -> String {
    match text.char_indices().nth(60) {
        Some((at, _)) => format!("{:?}...", &text[..at]),
        None => format!("{text:?}"),
    }
}

/// `label_1 ..` of an item with `n` endings: empty ones are `None`; a label beyond the item's
/// endings is an error.
fn judgements(
    columns: &Columns,
    row: &csv::StringRecord,
    task_id: i64,
    n: usize,
) -> std::result::Result<Vec<Option<Judgement>>, String> {
    let mut judgements = Vec::with_capacity(n);
    for k in 1..=ENDINGS_PER_TASK {
        let value = columns.answer(row, &format!("label_{k}"));
        match (k <= n, value) {
            (true, None) => judgements.push(None),
            (true, Some(v)) => judgements.push(Some(Judgement::parse(&v).ok_or_else(|| {
                format!("label_{k} = {v:?}; expected likely, unlikely or gibberish")
            })?)),
            (false, Some(v)) => {
                return Err(format!(
                    "label_{k} = {v:?}, but item {task_id} has only {n} endings"
                ))
            }
            (false, None) => {}
        }
    }
    Ok(judgements)
}

/// The 0-based ending a rank column (`best`, `second`) names, as `3` or `ending_3`.
fn ranked(
    columns: &Columns,
    row: &csv::StringRecord,
    name: &str,
    n: usize,
) -> std::result::Result<Option<usize>, String> {
    match columns.answer(row, name) {
        None => Ok(None),
        Some(v) => match v.trim_start_matches("ending_").parse::<usize>() {
            Ok(p) if (1..=n).contains(&p) => Ok(Some(p - 1)),
            _ => Err(format!(
                "{name} = {v:?}; expected an ending number 1 to {n}"
            )),
        },
    }
}

/// The optional time spent (seconds) and submission time (RFC 3339 UTC, kept as written).
fn timing(
    columns: &Columns,
    row: &csv::StringRecord,
) -> std::result::Result<(Option<f64>, Option<String>), String> {
    let seconds = match columns.seconds(row) {
        None => None,
        Some(v) => Some(
            v.parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| format!("time {v:?} is not a number of seconds"))?,
        ),
    };
    Ok((seconds, submitted_at(columns.raw(row, "submitted_at"))?))
}

/// An optional `submitted_at` cell (RFC 3339 UTC), kept as written once it parses.
pub(crate) fn submitted_at(cell: Option<&str>) -> std::result::Result<Option<String>, String> {
    match cell {
        None => Ok(None),
        Some(v) => {
            super::agreement::parse_timestamp(v)
                .ok_or_else(|| format!("submitted_at {v:?} is not an RFC 3339 UTC time"))?;
            Ok(Some(v.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formula_prefixes_behind_invisible_characters_or_fullwidth_are_neutralised() {
        for text in [
            "\u{feff}=SUM(A1)",
            "\u{200b}+1",
            "＝HYPERLINK(\"x\")",
            "＋1",
            "－1",
            "＠A1",
        ] {
            assert_eq!(spreadsheet_safe(text), format!("'{text}"), "{text:?}");
        }
        assert_eq!(
            spreadsheet_safe("\u{200b}walks away."),
            "\u{200b}walks away."
        );
        assert_eq!(spreadsheet_safe("walks away."), "walks away.");
    }
}
