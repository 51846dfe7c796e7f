//! End-to-end tests of `afkit annotate`, `afkit agreement` and `afkit crowd` on synthetic
//! projects (a finished AF run written directly): the real UI under tmux with kill -9 and resume,
//! two annotator processes on one file, crowd import validation, and agreement on known labels.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use afkit_store::Store;
use common::tmux::Tmux;
use common::{afkit, arg, assert_succeeded, command, csv_table, query_i64, BIN};
use rusqlite::Connection;

fn project(dir: &Path, contexts: usize) -> PathBuf {
    let path = dir.join("p.sqlite");
    let mut store = Store::create(&path).unwrap();
    store
        .synthetic_af_project(contexts, 9, afkit_engine::seed::Seed::new(11))
        .unwrap();
    path
}

/// Labels the item on screen completely and submits it.
const ITEM_KEYS: &[&str] = &["l", "u", "l", "u", "g", "l", "1", "b", "3", "s"];

fn claimed_sent1(db: &Path, annotator: &str) -> String {
    Connection::open(db)
        .unwrap()
        .query_row(
            "SELECT x.sent1 FROM claims c JOIN tasks t ON t.id = c.task_id
             JOIN examples x ON x.id = t.example_id WHERE c.annotator = ?1",
            [annotator],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
#[cfg_attr(not(has_tmux), ignore = "needs tmux on PATH: absent")]
fn real_terminal_labels_survive_kill_9_and_resume_at_the_same_item() {
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::new(dir.path());
    let db = project(dir.path(), 8);
    let command = format!("exec {BIN} annotate {} --annotator alice", db.display());
    tmux.start("a", &command);
    first_item_asks_for_every_label(&tmux);
    let visible = label_two_items_then_kill_mid_third(&tmux, &db);
    alice_has_two_complete_submissions(&db);

    // Restart: the item that was on screen comes back first. (The new session starts before
    // the old one goes: killing a server's last session ends the server, and a session started
    // while it shuts down fails.)
    tmux.start("b", &command);
    tmux.cmd(&["kill-session", "-t", "a"]);
    // (Waiting for all three: a timeout here means it resumed elsewhere.)
    tmux.wait_for_all(
        "b",
        &["done 2", &visible, "to do: label endings 1, 2, 3, 4, 5, 6"],
    );
    help_and_undo_work_after_the_resume(&tmux, &db);

    // SIGTERM (and SIGHUP, from a closed terminal) end the session cleanly too.
    tmux.start("c", &command);
    tmux.wait_for("c", "Enter submit");
    signal(&tmux, "c", "-TERM");
    tmux.wait_dead("c");
    let screen = tmux.screen("c");
    assert!(
        screen.contains("alice: 0 submitted this session"),
        "{screen}"
    );
}

/// Sends `signal` (`-9`, `-TERM`) to the process of tmux session `name`.
fn signal(tmux: &Tmux, name: &str, signal: &str) {
    let pid = tmux.pane_pid(name);
    assert!(Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// The first item shows every ending unlabelled, and Enter does not submit it.
fn first_item_asks_for_every_label(tmux: &Tmux) {
    let screen = tmux.wait_for_all("a", &["done 0", "Enter submit"]);
    assert!(
        screen.contains("to do: label endings 1, 2, 3, 4, 5, 6"),
        "{screen}"
    );
    for n in 1..=6 {
        assert!(
            screen.contains(&format!("{n} ·")),
            "ending {n} unlabelled:\n{screen}"
        );
    }
    tmux.keys("a", &["Enter"]);
    tmux.wait_for("a", "not yet:");
}

/// Submits two items, half-labels the third and kills the process with SIGKILL; returns the
/// start of the third item's context, as the screen showed it.
fn label_two_items_then_kill_mid_third(tmux: &Tmux, db: &Path) -> String {
    for done in 1..=2 {
        tmux.keys("a", ITEM_KEYS);
        tmux.wait_for("a", "complete: Enter to submit");
        tmux.keys("a", &["Enter"]);
        tmux.wait_for("a", &format!("done {done}"));
    }
    // Both keys go in one write, as fast typing or a paste delivers them: neither may wait for
    // a later key press.
    tmux.keys("a", &["lu"]);
    tmux.wait_for("a", "to do: label endings 3, 4, 5, 6");
    let on_screen = claimed_sent1(db, "alice");
    let visible: String = on_screen.chars().take(30).collect();
    assert!(
        tmux.screen("a").contains(&visible),
        "the claimed item is the one on screen"
    );
    signal(tmux, "a", "-9");
    tmux.wait_dead("a");
    visible
}

/// The two submitted items are stored whole, with their ranks and no rank on gibberish; the
/// half-labelled third is not.
fn alice_has_two_complete_submissions(db: &Path) {
    assert_eq!(
        query_i64(
            db,
            "SELECT COUNT(*) FROM submissions WHERE annotator = 'alice'"
        ),
        2
    );
    assert_eq!(
        query_i64(
            db,
            "SELECT COUNT(*) FROM labels l JOIN submissions s ON s.id = l.submission_id
             WHERE s.annotator = 'alice'"
        ),
        12
    );
    assert_eq!(
        query_i64(db, "SELECT COUNT(*) FROM labels WHERE rank = 'best'"),
        2
    );
    assert_eq!(
        query_i64(
            db,
            "SELECT COUNT(*) FROM labels WHERE judgement = 'gibberish'"
        ),
        2
    );
    assert_eq!(
        query_i64(
            db,
            "SELECT COUNT(*) FROM labels WHERE rank IS NOT NULL AND judgement = 'gibberish'"
        ),
        0
    );
}

/// In the resumed session "b": help opens and closes, z brings back the last submission with
/// its labels, and q restores the terminal before the summary line.
fn help_and_undo_work_after_the_resume(tmux: &Tmux, db: &Path) {
    tmux.keys("b", &["?"]);
    tmux.wait_for("b", "Instructions");
    tmux.keys("b", &["Escape"]);
    tmux.wait_for("b", "Enter submit");
    tmux.keys("b", &["z"]);
    let screen = tmux.wait_for("b", "undone");
    assert!(
        screen.contains("BEST") && screen.contains("2ND"),
        "{screen}"
    );
    assert_eq!(query_i64(db, "SELECT COUNT(*) FROM submissions"), 1);
    tmux.keys("b", &["Enter"]);
    tmux.wait_for("b", "done 2");
    tmux.keys("b", &["q"]);
    tmux.wait_dead("b");
    let screen = tmux.screen("b");
    assert!(
        screen.contains("alice: 1 submitted this session, 2 in all"),
        "{screen}"
    );
    assert!(
        !screen.contains("Enter submit"),
        "the alternate screen was left:\n{screen}"
    );
}

fn script(dir: &Path, name: &str, items: usize) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, "lulugl 1b 3s Enter\n".repeat(items)).unwrap();
    path
}

#[test]
fn two_annotators_at_once_lose_no_label() {
    let dir = tempfile::tempdir().unwrap();
    let db = project(dir.path(), 30);
    let spawn = |who: &str| {
        let keys = script(dir.path(), &format!("{who}.keys"), 40);
        let timings = dir.path().join(format!("{who}.jsonl"));
        let child = command()
            .args(["annotate", db.to_str().unwrap(), "--annotator", who])
            .args(["--agreement-items", "10", "--replicas", "2"])
            .arg("--script")
            .arg(&keys)
            .arg("--timings")
            .arg(&timings)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        (child, timings)
    };
    let (a, a_timings) = spawn("ann");
    let (b, b_timings) = spawn("bob");
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert_succeeded(&out);
    }
    let commits = |path: &Path| {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"commit\""))
            .count() as i64
    };
    let (na, nb) = (commits(&a_timings), commits(&b_timings));
    assert_eq!(
        query_i64(
            &db,
            "SELECT COUNT(*) FROM submissions WHERE annotator = 'ann'"
        ),
        na
    );
    assert_eq!(
        query_i64(
            &db,
            "SELECT COUNT(*) FROM submissions WHERE annotator = 'bob'"
        ),
        nb
    );
    // 10 agreement items × 2 + 20 items × 1: every slot filled exactly once.
    assert_eq!(na + nb, 40);
    assert_eq!(
        query_i64(
            &db,
            "SELECT COUNT(*) FROM tasks t WHERE
               (SELECT COUNT(*) FROM submissions s WHERE s.task_id = t.id) <> t.replicas"
        ),
        0
    );
    assert_eq!(
        query_i64(&db, "SELECT COUNT(*) FROM tasks WHERE replicas = 2"),
        10
    );
    assert_eq!(query_i64(&db, "SELECT COUNT(*) FROM labels"), 40 * 6);
    assert_eq!(query_i64(&db, "SELECT COUNT(*) FROM claims"), 0);
}

#[test]
fn annotate_needs_a_finished_filter_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("p.sqlite");
    Store::create(&db).unwrap();
    let out = afkit(&["annotate", db.to_str().unwrap(), "--annotator", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("afkit filter"));
}

fn write_csv(path: &Path, rows: &[Vec<&str>]) {
    let mut w = csv::Writer::from_path(path).unwrap();
    for r in rows {
        w.write_record(r).unwrap();
    }
    w.flush().unwrap();
}

/// A project of five contexts and its crowd task file, exported with `afkit crowd export`.
struct Crowd {
    dir: tempfile::TempDir,
    db: PathBuf,
    tasks: PathBuf,
    /// The first item's id in the task file.
    item: String,
}

/// The labels w1 (in afkit's columns) and m1 (in Mechanical Turk's) give the first item's six
/// endings: the hand-computed agreement below reads them.
const W1_AND_M1_LABELS: [&str; 6] = [
    "likely",
    "unlikely",
    "likely",
    "unlikely",
    "gibberish",
    "likely",
];

impl Crowd {
    fn export() -> Crowd {
        let dir = tempfile::tempdir().unwrap();
        let db = project(dir.path(), 5);
        let tasks = dir.path().join("tasks.csv");
        let out = afkit(&["crowd", "export", arg(&db), "--out", arg(&tasks)]);
        assert_succeeded(&out);
        // The workers get the rules annotate shows, beside the tasks.
        let instructions = std::fs::read_to_string(dir.path().join("tasks.instructions.md"))
            .expect("crowd export writes the instructions beside the tasks");
        assert!(instructions.contains("**gibberish**: not correct English"));
        let item = csv_table(&tasks).1[0][0].clone();
        Crowd {
            dir,
            db,
            tasks,
            item,
        }
    }

    /// `afkit crowd import` of `results`, which must succeed.
    fn import(&self, results: &Path) -> std::process::Output {
        let out = afkit(&["crowd", "import", arg(&self.db), arg(results)]);
        assert_succeeded(&out);
        out
    }

    /// Results in afkit's columns for the first item: w1's and w2's rows are valid, each other
    /// row is wrong in one way (lines 3 to 8).
    fn afkit_results(&self) -> PathBuf {
        let results = self.dir.path().join("results.csv");
        let item = self.item.as_str();
        let head = [
            "label_1", "label_2", "label_3", "label_4", "label_5", "label_6",
        ];
        let labels = W1_AND_M1_LABELS;
        let row = |worker, item, labels: [&'static str; 6], best, second| {
            [vec![worker, item], labels.to_vec(), vec![best, second]].concat()
        };
        let mut blank_third = labels;
        blank_third[2] = "";
        let mut unknown_first = labels;
        unknown_first[0] = "maybe";
        let w1_again = [
            "likely",
            "likely",
            "likely",
            "unlikely",
            "gibberish",
            "likely",
        ];
        let w2 = ["Likely", "l", "likely", "unlikely", "gibberish", "unlikely"];
        write_csv(
            &results,
            &[
                row("worker_id", "item_id", head, "best", "second"),
                row("w1", item, labels, "1", "3"),
                row("w1", "9999", labels, "1", "3"),
                row("w3", item, blank_third, "1", "3"),
                row("w4", item, labels, "1", "1"),
                row("w1", item, w1_again, "1", "2"),
                row("w5", item, unknown_first, "1", "3"),
                row("w6", item, labels, "5", "3"),
                row("w2", item, w2, "1", "2"),
            ],
        );
        results
    }

    /// Mechanical Turk batch results for the first item (Input./Answer. prefixes, the second
    /// choice as a radio group of true/false columns): m1's assignment, and m2's, rejected.
    fn mturk_results(&self) -> PathBuf {
        let mturk = self.dir.path().join("Batch_1_batch_results.csv");
        let mut head = vec![
            "HITId",
            "WorkerId",
            "AssignmentStatus",
            "WorkTimeInSeconds",
            "Input.item_id",
        ];
        let label_cols: Vec<String> = (1..=6).map(|k| format!("Answer.label_{k}")).collect();
        head.extend(label_cols.iter().map(String::as_str));
        head.push("Answer.best");
        let second_cols: Vec<String> = (1..=6).map(|k| format!("Answer.second.{k}")).collect();
        head.extend(second_cols.iter().map(String::as_str));
        let labels = W1_AND_M1_LABELS;
        let second_is_1 = ["true", "false", "false", "false", "false", "false"];
        let assignment = |worker, status, seconds| {
            let head = vec!["H1", worker, status, seconds, self.item.as_str()];
            [head, labels.to_vec(), vec!["3"], second_is_1.to_vec()].concat()
        };
        let ok = assignment("m1", "Submitted", "42");
        let rejected = assignment("m2", "Rejected", "40");
        write_csv(&mturk, &[head, ok, rejected]);
        mturk
    }
}

#[test]
fn crowd_export_lists_every_open_item_with_its_texts() {
    let crowd = Crowd::export();
    let (header, rows) = csv_table(&crowd.tasks);
    assert_eq!(
        header,
        [
            "item_id",
            "assignments",
            "context",
            "sent1",
            "sent2",
            "ending_1",
            "ending_2",
            "ending_3",
            "ending_4",
            "ending_5",
            "ending_6"
        ]
    );
    assert_eq!(rows.len(), 5);
    assert!(rows
        .iter()
        .all(|r| r[1] == "3" && r[2] == format!("{} {}", r[3], r[4])));
}

#[test]
fn crowd_export_hands_out_agreement_items_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let db = project(dir.path(), 5);
    let tasks = dir.path().join("tasks.csv");
    let out = afkit(&[
        "crowd",
        "export",
        arg(&db),
        "--out",
        arg(&tasks),
        "--agreement-items",
        "2",
        "--replicas",
        "4",
    ]);
    assert_succeeded(&out);
    let mut wanted: Vec<String> = csv_table(&tasks)
        .1
        .into_iter()
        .map(|r| r[1].clone())
        .collect();
    wanted.sort();
    assert_eq!(wanted, ["1", "1", "1", "4", "4"]);
}

#[test]
fn crowd_import_takes_the_valid_rows_and_reports_each_invalid_one_by_line() {
    let crowd = Crowd::export();
    let (db, results) = (&crowd.db, crowd.afkit_results());
    let out = afkit(&["crowd", "import", arg(db), arg(&results), "--strict"]);
    assert!(
        !out.status.success(),
        "--strict refuses a file with invalid rows"
    );
    assert_eq!(query_i64(db, "SELECT COUNT(*) FROM submissions"), 0);

    let out = crowd.import(&results);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for (line, reason) in [
        (3, "unknown item 9999"),
        (4, "label ending 3"),
        (5, "best and second must differ"),
        (6, "duplicate: worker w1 already answered item"),
        (7, "label_1 = \"maybe\""),
        (8, "best (5) is gibberish"),
    ] {
        assert!(
            stderr.contains(&format!("results.csv:{line}: ")) && stderr.contains(reason),
            "line {line} ({reason}) not reported:\n{stderr}"
        );
    }
    assert!(String::from_utf8_lossy(&out.stdout).contains("imported 2 submissions"));
    assert_eq!(
        query_i64(
            db,
            "SELECT COUNT(*) FROM submissions WHERE origin = 'crowd'"
        ),
        2
    );
    assert_eq!(query_i64(db, "SELECT COUNT(*) FROM labels"), 12);
}

#[test]
fn a_crowd_worker_flags_a_broken_item_as_the_terminal_does() {
    let crowd = Crowd::export();
    let results = crowd.dir.path().join("flags.csv");
    let item = crowd.item.as_str();
    let head = vec![
        "worker_id",
        "item_id",
        "label_1",
        "label_2",
        "label_3",
        "label_4",
        "label_5",
        "label_6",
        "best",
        "second",
        "broken",
    ];
    let empty = ["", "", "", "", "", "", "", ""];
    let flag = |worker, value| [vec![worker, item], empty.to_vec(), vec![value]].concat();
    write_csv(&results, &[head, flag("w8", "true"), flag("w9", "perhaps")]);
    let out = crowd.import(&results);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("flags.csv:3: ") && stderr.contains("broken = \"perhaps\""),
        "{stderr}"
    );
    assert_eq!(
        query_i64(
            &crowd.db,
            "SELECT COUNT(*) FROM submissions WHERE broken = 1"
        ),
        1
    );
    assert_eq!(query_i64(&crowd.db, "SELECT COUNT(*) FROM labels"), 0);
}

#[test]
fn crowd_import_reads_mechanical_turk_batch_results() {
    let crowd = Crowd::export();
    crowd.import(&crowd.afkit_results());
    let out = crowd.import(&crowd.mturk_results());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Mechanical Turk"));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":3: the assignment was rejected"));
    assert_eq!(query_i64(&crowd.db, "SELECT COUNT(*) FROM submissions"), 3);
    assert_eq!(
        query_i64(
            &crowd.db,
            "SELECT COUNT(*) FROM submissions WHERE seconds = 42"
        ),
        1
    );
}

#[test]
fn agreement_of_imported_crowd_labels_matches_the_figures_computed_by_hand() {
    let crowd = Crowd::export();
    crowd.import(&crowd.afkit_results());
    crowd.import(&crowd.mturk_results());
    // Agreement on the one item with three annotators, computed by hand (endings by position):
    //   ranks  w1 B N S N N N · w2 B S N N N N · m1 S N B N N N
    //   labels w1 L U L U G L · w2 L L L U G U · m1 L U L U G L
    // ppa_rank = (1+1+0+3+3+3)/18; α_rank = 1 − 17·7/(18² − (3²+3²+12²)) = 43/162.
    // ppa_label = (3+1+3+3+3+1)/18; α_label = 1 − 17·4/(18² − (9²+6²+3²)) = 130/198.
    let out = afkit(&["agreement", arg(&crowd.db), "--json"]);
    assert_succeeded(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let close = |key: &str, want: f64| {
        let got = json[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing: {json}"));
        assert!((got - want).abs() < 1e-9, "{key}: {got} vs {want}");
    };
    close("ppa_rank", 11.0 / 18.0);
    close("alpha_rank", 43.0 / 162.0);
    close("ppa_label", 14.0 / 18.0);
    close("alpha_label", 130.0 / 198.0);
    assert_eq!(json["items"], 1);
    assert_eq!(json["annotators"].as_array().unwrap().len(), 3);
    // Speed only from the time a row carries: w1 and w2 give none (their rows hold the
    // import's time), m1's batch gives WorkTimeInSeconds.
    for a in json["annotators"].as_array().unwrap() {
        let timed = a["annotator"] == "m1";
        assert_eq!(a["items_per_hour"].is_number(), timed, "{a}");
    }
    let found = &json["distribution"]["found"];
    assert_eq!(found["n"], 3);
    // Human accuracy: each labelled submission that ranks the found ending best, of six shown.
    let human = &json["human_accuracy"];
    assert_eq!(human["submissions"], 3);
    let best = (found["best"].as_f64().unwrap() * 3.0).round();
    assert_eq!(human["correct"].as_f64(), Some(best), "{json}");
    assert_eq!(human["endings_shown"], serde_json::json!([6, 6]));
    let text = afkit(&["agreement", arg(&crowd.db)]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("Found end") && text.contains("Gibberish"),
        "{text}"
    );
    assert!(
        text.contains("Human accuracy (found ending ranked best among 6 endings)"),
        "{text}"
    );
}

#[test]
fn order_risk_hands_out_the_items_whose_negatives_could_be_right_first() {
    let p = common::Project::new();
    let ctxs: Vec<common::Ctx> = (0..6)
        .map(|i| p.context(&format!("v{i}"), 0, 10, 8))
        .collect();
    // The fixture's found endings have a log-prob of -2.0 per token and its negatives -3.0; two
    // contexts get negatives at least as likely as their found ending, one more than the other.
    let risky = |c: &common::Ctx, n: usize| {
        for &e in &c.cands[..n] {
            afkit_store::fixtures::Fixtures::on(&p.conn)
                .set_lp_cond(e, -1.0)
                .unwrap();
        }
    };
    risky(&ctxs[4], 8);
    risky(&ctxs[2], 8);
    p.conn
        .execute(
            "UPDATE endings SET lp_cond = -1.9 WHERE id = ?1",
            [ctxs[2].cands[0]],
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let keys = script(dir.path(), "keys", 2);
    let annotate = |who: &str, order: &[&str]| {
        let out = command()
            .args(["annotate", p.p(), "--annotator", who, "--script"])
            .arg(&keys)
            .args(order)
            .output()
            .unwrap();
        assert_succeeded(&out);
    };
    annotate("ann", &["--order", "risk"]);
    let submitted = |who: &str| -> Vec<i64> {
        let mut stmt = p
            .conn
            .prepare(
                "SELECT t.example_id FROM submissions s JOIN tasks t ON t.id = s.task_id
                 WHERE s.annotator = ?1 ORDER BY s.id",
            )
            .unwrap();
        stmt.query_map([who], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    // Every shown negative of both could be right; context 4's come closer (-1.0 against the
    // -1.9 of context 2's likeliest shown one, when it is shown).
    let first_two = submitted("ann");
    assert_eq!(first_two.len(), 2);
    let mut both = first_two.clone();
    both.sort_unstable();
    let mut expected = vec![ctxs[2].example, ctxs[4].example];
    expected.sort_unstable();
    assert_eq!(both, expected, "risky items first");
    // The project's seeded order is untouched for everyone else.
    annotate("bob", &[]);
    let first_task: i64 = p
        .conn
        .query_row(
            "SELECT t.example_id FROM tasks t ORDER BY t.id LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(submitted("bob")[0], first_task);
}
