//! The fault suite: what a careless or hostile user can do to afkit, and what afkit must do
//! then. Each test is one failure that afkit once had: an annotator process that outlived its
//! terminal, one overlong context that stopped `generate` for good, CSV line numbers that were
//! off, formulas in crowd task files, and concurrent or malformed input that ended in raw SQLite
//! errors or was silently accepted.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use afkit_store::Store;
use common::tmux::Tmux;
use common::{
    afkit, arg, command, crowd_item, examples_project, fails, ok, query_i64, stderr, succeeded,
    tiny_gguf, BIN,
};
use rusqlite::Connection;
use serde_json::Value;

/// A project with a finished AF run over `contexts` synthetic contexts (9 negatives each).
fn af_project(dir: &Path, contexts: usize) -> PathBuf {
    let path = dir.join("af.sqlite");
    let mut store = Store::create(&path).unwrap();
    store
        .synthetic_af_project(contexts, 9, afkit_engine::seed::Seed::new(11))
        .unwrap();
    path
}

fn short_examples(n: usize) -> Vec<(String, String, String, String)> {
    (0..n)
        .map(|i| {
            (
                format!("v{i}"),
                format!("A person number {i} walks into a large room."),
                "The person".to_string(),
                format!("sits down on chair {i}."),
            )
        })
        .collect()
}

/// `generate` with two short endings per context from a tiny model.
fn tiny_generate(db: &Path, model: &Path) -> Output {
    afkit(&[
        "generate",
        arg(db),
        "--model",
        arg(model),
        "--n-neg",
        "2",
        "--max-tokens",
        "6",
    ])
}

fn words(n: usize) -> String {
    vec!["word"; n].join(" ")
}

// ----- annotate and its terminal -----

/// The pid holding `annotator`'s claim, once the session has claimed an item.
fn claim_pid(db: &Path, annotator: &str) -> u32 {
    let started = Instant::now();
    loop {
        let pid: Option<u32> = Connection::open(db)
            .unwrap()
            .query_row(
                "SELECT pid FROM claims WHERE annotator = ?1",
                [annotator],
                |r| r.get(0),
            )
            .unwrap_or(None);
        if let Some(pid) = pid {
            return pid;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the session never claimed an item"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether a process runs (a zombie waiting to be reaped has ended).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|s| !s.starts_with(" Z"))
    })
}

/// Waits at most `limit` for the process to end and its claim to be released.
fn ends_and_releases(db: &Path, annotator: &str, pid: u32, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        let held = query_i64(
            db,
            &format!(
                "SELECT COUNT(*) FROM claims WHERE annotator = '{annotator}' AND pid IS NOT NULL"
            ),
        );
        if !running(pid) && held == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn annotate_command(db: &Path, annotator: &str) -> String {
    format!(
        "AFKIT_NO_PROGRESS=1 exec {BIN} annotate {} --annotator {annotator}",
        db.display()
    )
}

#[test]
#[cfg_attr(not(has_tmux), ignore = "needs tmux on PATH: absent")]
fn annotate_exits_and_frees_its_item_when_its_terminal_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::new(dir.path());
    let db = af_project(dir.path(), 4);
    let session = annotate_command(&db, "dave");
    tmux.start("t", &session);
    let pid = claim_pid(&db, "dave");
    tmux.cmd(&["kill-session", "-t", "t"]);
    assert!(
        ends_and_releases(&db, "dave", pid, Duration::from_secs(2)),
        "annotate (pid {pid}) still runs or holds its claim 2 s after its terminal went away"
    );
    // The item is free for someone else at once, and still dave's first when he comes back.
    let task: i64 = query_i64(&db, "SELECT task_id FROM claims WHERE annotator = 'dave'");
    assert_eq!(
        query_i64(
            &db,
            &format!("SELECT COUNT(*) FROM claims WHERE task_id = {task} AND pid IS NOT NULL")
        ),
        0
    );
}

#[test]
#[cfg_attr(not(has_tmux), ignore = "needs tmux on PATH: absent")]
fn annotate_ends_cleanly_on_sigterm_and_restores_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::new(dir.path());
    let db = af_project(dir.path(), 4);
    let session = annotate_command(&db, "erin");
    tmux.start("t", &session);
    let pid = claim_pid(&db, "erin");
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(
        ends_and_releases(&db, "erin", pid, Duration::from_secs(1)),
        "annotate did not end within 1 s of SIGTERM"
    );
    // Out of the alternate screen: the summary line is on the normal screen.
    let summary = "erin: 0 submitted this session";
    let started = Instant::now();
    let mut screen = String::new();
    while !screen.contains(summary) && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        screen = tmux.screen("t");
    }
    assert!(screen.contains(summary), "{screen}");
}

// ----- overlong contexts -----

#[test]
fn ingest_drops_an_overlong_context_as_long_context() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("p.sqlite");
    ok(&["init", arg(&project)]);
    let input = dir.path().join("in.jsonl");
    let record = |id: &str, sent1: &str| {
        serde_json::json!({"id": id, "sent1": sent1, "sent2": "The man",
                           "ending": "walks slowly to the door."})
        .to_string()
    };
    let lines = [
        record("long", &format!("{}.", words(5000))),
        record("fine", "A man stands in a large kitchen."),
    ];
    std::fs::write(&input, lines.join("\n")).unwrap();
    let summary: Value = serde_json::from_str(&ok(&[
        "ingest",
        arg(&project),
        "--format",
        "jsonl",
        "--json",
        arg(&input),
    ]))
    .unwrap();
    assert_eq!(summary["kept"], 1, "{summary}");
    assert_eq!(summary["dropped"]["long_context"], 1, "{summary}");
}

#[test]
fn generate_records_a_context_too_long_for_the_model_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let mut examples = short_examples(3);
    examples[1].1 = format!("{}.", words(5000));
    let db = examples_project(dir.path(), &examples);
    let generate = || tiny_generate(&db, &model);
    let first = generate();
    let said = stderr(&first);
    succeeded(first);
    assert!(said.contains("skipping v1: its prompt has"), "{said}");
    assert_eq!(query_i64(&db, "SELECT COUNT(*) FROM pools"), 2);
    assert_eq!(
        query_i64(
            &db,
            "SELECT COUNT(*) FROM unusable_contexts u JOIN examples x ON x.id = u.example_id
             WHERE x.ext_id = 'v1' AND u.reason LIKE '%does not fit%'"
        ),
        1
    );
    // A second run does not fail on it either, and status counts it.
    succeeded(generate());
    let status: Value = serde_json::from_str(&ok(&["status", arg(&db), "--json"])).unwrap();
    assert_eq!(status["unusable_contexts"], 1, "{status}");
    assert_eq!(status["contexts_without_pool"], 1, "{status}");
}

// ----- CSV line numbers -----

/// `rows` joined with CRLF, with a blank line after the first two rows.
fn crlf_with_blank_line(rows: &[String]) -> String {
    let mut text = String::new();
    for (i, row) in rows.iter().enumerate() {
        text.push_str(row);
        text.push_str("\r\n");
        if i == 1 {
            text.push_str("\r\n");
        }
    }
    text
}

#[test]
fn crowd_import_names_the_line_of_a_bad_row_in_a_crlf_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = af_project(dir.path(), 3);
    let tasks = dir.path().join("tasks.csv");
    ok(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
    let head = "worker_id,item_id,label_1,label_2,label_3,label_4,label_5,label_6,best,second";
    let item = crowd_item(&tasks, 1);
    let good =
        |worker: &str| format!("{worker},{item},likely,unlikely,likely,unlikely,likely,likely,1,3");
    // Line 1 header, line 2 a good row, line 3 blank, line 4 good, line 5 bad.
    let rows = [
        head.to_string(),
        good("w1"),
        good("w2"),
        format!("w3,{item},likely,maybe,likely,unlikely,likely,likely,1,3"),
    ];
    let results = dir.path().join("results.csv");
    std::fs::write(&results, crlf_with_blank_line(&rows)).unwrap();
    let out = afkit(&["crowd", "import", arg(&db), arg(&results)]);
    let said = stderr(&out);
    succeeded(out);
    assert!(
        said.contains("results.csv:5: label_2 = \"maybe\""),
        "{said}"
    );
}

#[test]
fn swag_csv_and_aflite_csv_errors_name_the_line_in_a_crlf_file() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("p.sqlite");
    ok(&["init", arg(&project)]);
    let head = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label";
    let row = |label: &str| {
        format!("v1,0,A man walks. He,A man walks.,He,gold,sits.,runs.,eats.,waves.,{label}")
    };
    let swag = dir.path().join("swag.csv");
    std::fs::write(
        &swag,
        crlf_with_blank_line(&[head.into(), row("0"), row("1"), row("7")]),
    )
    .unwrap();
    let said = fails(&["ingest", arg(&project), "--format", "swag-csv", arg(&swag)]);
    assert!(said.contains("swag.csv:5: label \"7\""), "{said}");

    let data = dir.path().join("data.csv");
    std::fs::write(
        &data,
        crlf_with_blank_line(&[
            "id,text,label".into(),
            "a,one text,x".into(),
            "b,two text,y".into(),
            "c,three text,".into(),
        ]),
    )
    .unwrap();
    let out_file = dir.path().join("kept.csv");
    let said = fails(&["aflite", "--input", arg(&data), "--out", arg(&out_file)]);
    assert!(said.contains("data.csv:5"), "{said}");
}

// ----- crowd task files -----

#[test]
fn crowd_task_files_neutralise_formulas() {
    let dir = tempfile::tempdir().unwrap();
    let db = af_project(dir.path(), 2);
    let conn = Connection::open(&db).unwrap();
    for (i, prefix) in ["=", "+", "-", "@"].iter().cycle().take(9).enumerate() {
        conn.execute(
            "UPDATE endings SET text = ?1 WHERE id = (SELECT id FROM endings
               WHERE example_id = 1 AND is_gold = 0 ORDER BY id LIMIT 1 OFFSET ?2)",
            rusqlite::params![format!("{prefix}HYPERLINK(\"http://x\",\"{i}\")"), i as i64],
        )
        .unwrap();
    }
    drop(conn);
    let tasks = dir.path().join("tasks.csv");
    let said = ok(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
    assert!(said.contains("leading '"), "{said}");
    let mut reader = csv::Reader::from_path(&tasks).unwrap();
    let mut neutralised = 0;
    for record in reader.records() {
        for cell in record.unwrap().iter() {
            assert!(!cell.starts_with(['=', '+', '-', '@']), "{cell}");
            neutralised += usize::from(cell.starts_with("'"));
        }
    }
    assert!(
        neutralised >= 5,
        "the item's five AF negatives are formulas"
    );
}

// ----- concurrent duplicates -----

#[test]
fn two_imports_of_one_crowd_file_at_once_give_plain_duplicate_messages() {
    let dir = tempfile::tempdir().unwrap();
    let db = af_project(dir.path(), 40);
    let tasks = dir.path().join("tasks.csv");
    ok(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
    let mut text =
        "worker_id,item_id,label_1,label_2,label_3,label_4,label_5,label_6,best,second\n"
            .to_string();
    for task in 1..=40 {
        let item = crowd_item(&tasks, task);
        for worker in ["w1", "w2", "w3"] {
            text.push_str(&format!(
                "{worker},{item},likely,unlikely,likely,unlikely,likely,likely,1,3\n"
            ));
        }
    }
    let results = dir.path().join("results.csv");
    std::fs::write(&results, text).unwrap();
    for _ in 0..3 {
        let spawn = || {
            command()
                .args(["crowd", "import"])
                .arg(&db)
                .arg(&results)
                .output()
        };
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(spawn);
            let b = s.spawn(spawn);
            (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
        });
        for out in [&a, &b] {
            assert!(out.status.success(), "{}", stderr(out));
            assert!(!stderr(out).contains("constraint"), "{}", stderr(out));
        }
        assert_eq!(query_i64(&db, "SELECT COUNT(*) FROM submissions"), 120);
        Connection::open(&db)
            .unwrap()
            .execute_batch("DELETE FROM labels; DELETE FROM submissions;")
            .unwrap();
    }
}

#[test]
fn two_generates_on_one_project_at_once_give_a_plain_message() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let db = examples_project(dir.path(), &short_examples(12));
    let run = || tiny_generate(&db, &model);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(run);
        let b = s.spawn(run);
        (a.join().unwrap(), b.join().unwrap())
    });
    for out in [&a, &b] {
        let said = stderr(out);
        assert!(!said.contains("constraint"), "{said}");
        assert!(
            out.status.success() || said.contains("already has a pool"),
            "{said}"
        );
    }
    succeeded(run());
    assert_eq!(query_i64(&db, "SELECT COUNT(*) FROM pools"), 12);
}

// ----- input that was accepted and should not be -----

#[test]
fn import_pool_rejects_an_empty_pool() {
    let dir = tempfile::tempdir().unwrap();
    let db = examples_project(dir.path(), &short_examples(2));
    let file = dir.path().join("pools.jsonl");
    std::fs::write(
        &file,
        "{\"id\": \"v0\", \"endings\": [\"runs.\"]}\n{\"id\": \"v1\", \"endings\": []}\n",
    )
    .unwrap();
    let model = tiny_gguf(dir.path(), 32, 1);
    let said = fails(&["import-pool", arg(&db), arg(&file), "--model", arg(&model)]);
    assert!(
        said.contains("pools.jsonl:2: \"endings\" is empty"),
        "{said}"
    );
    assert_eq!(query_i64(&db, "SELECT COUNT(*) FROM pools"), 0);
}

#[test]
fn crowd_import_takes_no_more_submissions_than_an_item_wants() {
    let dir = tempfile::tempdir().unwrap();
    let db = af_project(dir.path(), 2);
    let tasks = dir.path().join("tasks.csv");
    ok(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
    let wanted = query_i64(&db, "SELECT replicas FROM tasks WHERE id = 1");
    let mut text =
        "worker_id,item_id,label_1,label_2,label_3,label_4,label_5,label_6,best,second\n"
            .to_string();
    let item = crowd_item(&tasks, 1);
    for worker in 0..100 {
        text.push_str(&format!(
            "w{worker},{item},likely,unlikely,likely,unlikely,likely,likely,1,3\n"
        ));
    }
    let results = dir.path().join("results.csv");
    std::fs::write(&results, text).unwrap();
    let out = afkit(&["crowd", "import", arg(&db), arg(&results)]);
    let said = stderr(&out);
    succeeded(out);
    assert_eq!(
        query_i64(&db, "SELECT COUNT(*) FROM submissions WHERE task_id = 1"),
        wanted
    );
    assert!(
        said.contains(&format!("item 1 wants {wanted} annotators")),
        "{said}"
    );
}

#[test]
fn aflite_refuses_to_write_over_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.jsonl");
    let text = "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\", \"label\": \"y\"}\n";
    std::fs::write(&data, text).unwrap();
    let said = fails(&["aflite", "--input", arg(&data), "--out", arg(&data)]);
    assert!(said.contains("is an input"), "{said}");
    assert_eq!(std::fs::read_to_string(&data).unwrap(), text);
}

#[test]
fn commands_leave_foreign_empty_and_read_only_files_alone() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("other.sqlite");
    Connection::open(&foreign)
        .unwrap()
        .execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    let before = std::fs::read(&foreign).unwrap();
    let said = fails(&["status", arg(&foreign)]);
    assert!(said.contains("not an afkit project"), "{said}");
    assert_eq!(std::fs::read(&foreign).unwrap(), before, "file changed");
    assert!(!dir.path().join("other.sqlite-wal").exists());

    let empty = dir.path().join("empty.sqlite");
    std::fs::write(&empty, b"").unwrap();
    let said = fails(&["status", arg(&empty)]);
    assert!(said.contains("empty.sqlite is empty"), "{said}");
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0);

    let project = dir.path().join("p.sqlite");
    ok(&["init", arg(&project)]);
    let mut permissions = std::fs::metadata(&project).unwrap().permissions();
    permissions.set_readonly(true);
    std::fs::set_permissions(&project, permissions).unwrap();
    let said = fails(&["status", arg(&project)]);
    assert!(said.contains("p.sqlite is read-only"), "{said}");
}

#[test]
fn ingest_of_an_empty_activitynet_object_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("p.sqlite");
    ok(&["init", arg(&project)]);
    let input = dir.path().join("empty.json");
    std::fs::write(&input, "{}").unwrap();
    let said = fails(&[
        "ingest",
        arg(&project),
        "--format",
        "activitynet",
        arg(&input),
    ]);
    assert!(said.contains("empty.json: no video"), "{said}");
    assert_eq!(query_i64(&project, "SELECT COUNT(*) FROM sources"), 0);
}

#[test]
fn jsonl_errors_give_the_file_position_once() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("p.sqlite");
    ok(&["init", arg(&project)]);
    let input = dir.path().join("in.jsonl");
    let good =
        r#"{"id": "a", "sent1": "A man stands in a room.", "ending": "He walks to the door."}"#;
    std::fs::write(&input, format!("{good}\n\n{{oops}}\n")).unwrap();
    let said = fails(&["ingest", arg(&project), "--format", "jsonl", arg(&input)]);
    assert!(
        said.contains("in.jsonl:3:2: key must be a string;"),
        "{said}"
    );
    assert!(!said.contains("at line 1"), "{said}");
}

/// `afkit ... | head -1`: a reader that stops reading ends afkit quietly with status 0 (so a
/// `set -o pipefail` script goes on), instead of a panic with a backtrace; what the command did
/// before printing is kept.
#[test]
fn a_closed_stdout_pipe_ends_afkit_quietly_and_keeps_what_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.sqlite");
    ok(&["init", arg(&db)]);
    let captions = dir.path().join("captions.json");
    std::fs::write(
        &captions,
        r#"{"v1": {"sentences": ["A man stands in a field.", "He throws a ball to the dog."]}}"#,
    )
    .unwrap();
    // The pipe's read end is closed before afkit starts: its first print meets a closed pipe.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = command()
        .args([
            "ingest",
            arg(&db),
            "--format",
            "activitynet",
            arg(&captions),
        ])
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "stderr: {err}");
    assert!(
        out.status.success(),
        "status {:?}, stderr: {err}",
        out.status
    );
    assert_eq!(query_i64(&db, "SELECT COUNT(*) FROM examples"), 1);
}
