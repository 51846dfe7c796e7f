//! No command destroys a user's file and no keystroke acts unseen: each test is a way of losing
//! work that a new user ran into, replayed end to end through the `afkit` binary.

use crate::common;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use afkit::store::examples::NewExample;
use afkit::store::fixtures::Fixtures;
use afkit::store::Store;
use common::tmux::Tmux;
use common::{afkit, arg, fails, ok, query_i64, stderr, unverified_project, BIN};

fn af_project(dir: &Path) -> PathBuf {
    let path = dir.join("p.sqlite");
    let mut store = Store::create(&path).unwrap();
    store.synthetic_af_project(6, 9, 11).unwrap();
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

#[test]
fn import_pool_gives_no_pool_to_a_context_without_usable_endings() {
    let dir = tempfile::tempdir().unwrap();
    // Two contexts without pools.
    let fresh = dir.path().join("fresh.sqlite");
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
    drop(conn);
    let usable: Vec<String> = ids.iter().map(|(id, _)| id.clone()).collect();
    let ending_of = |id: &str| ids.iter().find(|(i, _)| i == id).unwrap().1.clone();
    let features = |text: &str| {
        serde_json::json!({"text": text, "lp_cond": -2.0, "lp_alone": -3.0,
                           "lp_final_punct": null, "n_tok": 5})
    };
    let record = |id: &str, endings: Vec<serde_json::Value>, n_tok_sent1: serde_json::Value| {
        serde_json::json!({"id": id, "endings": endings,
            "gold": {"lp_cond": -1.0, "lp_alone": -2.0, "lp_final_punct": null, "n_tok": 5},
            "context": {"ctx_logprob": -3.0, "n_tok_sent1": n_tok_sent1, "n_tok_sent2": 2}})
        .to_string()
    };
    let (a, b) = (&usable[0], &usable[1]);
    let pools = dir.path().join("pools.jsonl");
    // A count that does not fit: refused with the line, in words, nothing written.
    std::fs::write(
        &pools,
        record(
            a,
            vec![features("waves.")],
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

    // Endings all blank or equal to the found ending: no pool, and the context is named.
    let blank = vec![features("  "), features(&ending_of(a))];
    std::fs::write(
        &pools,
        format!(
            "\u{feff}{}\n{}\n",
            record(a, blank, serde_json::json!(10)),
            record(b, vec![features("waves a flag.")], serde_json::json!(10))
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
