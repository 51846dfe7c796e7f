//! End-to-end tests of `afkit init`, `ingest`, `status` and `tagger` through the built binary.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{afkit, arg, command, ok};
use serde_json::Value;

fn init(dir: &Path) -> PathBuf {
    let project = dir.join("p.sqlite");
    ok(&["init", arg(&project)]);
    project
}

fn ingest(project: &Path, format: &str, files: &[&Path]) -> Value {
    let mut args = vec!["ingest", arg(project), "--format", format, "--json"];
    args.extend(files.iter().map(|f| arg(f)));
    serde_json::from_str(&ok(&args)).unwrap()
}

fn status(project: &Path) -> Value {
    serde_json::from_str(&ok(&["status", arg(project), "--json"])).unwrap()
}

fn dropped_total(v: &Value) -> i64 {
    v["dropped"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_i64().unwrap())
        .sum()
}

/// Every row of the ingest tables, for "the project is unchanged" checks.
fn fingerprint(project: &Path) -> String {
    let conn = rusqlite::Connection::open(project).unwrap();
    let mut out = String::new();
    for table in ["sources", "examples", "endings", "dropped"] {
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM {table} ORDER BY 1"))
            .unwrap();
        let n = stmt.column_count();
        let rows = stmt
            .query_map([], |r| {
                let vals: Vec<String> = (0..n)
                    .map(|i| format!("{:?}", r.get_ref(i).unwrap()))
                    .collect();
                Ok(vals.join("|"))
            })
            .unwrap();
        for row in rows {
            out.push_str(&row.unwrap());
            out.push('\n');
        }
    }
    out
}

/// The real corpora next to the checkout; the tests that read them are ignored when the tests
/// were built without them.
fn shared_data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data")
}

fn write(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

const CAPTIONS: &str = r#"{
 "v_one": {"duration": 30.0, "timestamps": [[0, 10], [10, 20], [20, 30]],
   "sentences": ["A man is standing in a large kitchen.", " He chops an onion on a wooden board.", " Then, he puts the onion into a hot pan."]},
 "v_two": {"sentences": ["A girl walks onto a stage in front of a crowd.", "The girl dances around the stage to loud music.", "A close up of the crowd."]}
}"#;

#[test]
fn sample_corpus_ingests_with_consistent_counts_and_is_idempotent() {
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/sample/captions.json");
    let corpus: Value = serde_json::from_slice(&std::fs::read(&sample).unwrap()).unwrap();
    let pairs: i64 = corpus
        .as_object()
        .unwrap()
        .values()
        .map(|v| v["sentences"].as_array().unwrap().len() as i64 - 1)
        .sum();
    let dir = tempfile::tempdir().unwrap();
    let project = init(dir.path());
    let summary = ingest(&project, "activitynet", &[&sample]);
    let s = status(&project);
    let examples = s["examples"].as_i64().unwrap();
    assert_eq!(examples, summary["kept"].as_i64().unwrap());
    assert_eq!(
        examples + dropped_total(&s),
        pairs,
        "every pair is kept or dropped: {s}"
    );
    assert!(examples * 10 >= pairs * 8, "the sample is clean text: {s}");
    assert_eq!(s["contexts_with_pool"], 0);

    let before = fingerprint(&project);
    let again = ingest(&project, "activitynet", &[&sample]);
    assert_eq!(again["kept"], 0);
    assert_eq!(again["already_present"].as_i64().unwrap(), examples);
    assert_eq!(fingerprint(&project), before, "re-ingest changes nothing");
}

#[test]
fn activitynet_pairs_are_split_stored_and_dropped_by_reason() {
    let dir = tempfile::tempdir().unwrap();
    let project = init(dir.path());
    let file = write(dir.path(), "c.json", CAPTIONS.as_bytes());
    let summary = ingest(&project, "activitynet", &[&file]);
    assert_eq!(summary["records"], 4);
    assert_eq!(summary["kept"], 3);
    assert_eq!(summary["dropped"]["no_verb_phrase"], 1);
    let s = status(&project);
    assert_eq!(s["examples"], 3);
    assert_eq!(s["dropped"]["no_verb_phrase"], 1);

    let store = afkit_store::Store::open(&project).unwrap();
    let got: Vec<(String, String, String, String)> = store
        .examples()
        .unwrap()
        .into_iter()
        .map(|e| (e.ext_id, e.group, e.sent2, e.ending))
        .collect();
    let want = [
        (
            "v_one#0",
            "v_one",
            "He",
            "chops an onion on a wooden board.",
        ),
        (
            "v_one#1",
            "v_one",
            "Then, he",
            "puts the onion into a hot pan.",
        ),
        (
            "v_two#0",
            "v_two",
            "The girl",
            "dances around the stage to loud music.",
        ),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        store.examples().unwrap()[0].sent1,
        "A man is standing in a large kitchen."
    );
}

#[test]
fn jsonl_and_swag_csv_ingest_and_reingest_idempotently() {
    let dir = tempfile::tempdir().unwrap();
    let project = init(dir.path());
    let jsonl = write(
        dir.path(),
        "x.jsonl",
        br#"{"id": "a", "sent1": "A woman is sitting at a piano on a stage.", "ending": "She plays a slow song for the audience."}

{"id": 7, "sent1": "A woman is sitting at a piano on a stage.", "sent2": "The crowd", "ending": "claps loudly for a long time.", "group": "g1"}
{"id": "c", "sent1": "Short one.", "ending": "She plays."}
"#,
    );
    let summary = ingest(&project, "jsonl", &[&jsonl]);
    assert_eq!(summary["kept"], 2, "{summary}");
    assert_eq!(summary["dropped"]["short_context"], 1, "{summary}");
    let store = afkit_store::Store::open(&project).unwrap();
    let ex = store.examples().unwrap();
    assert_eq!((ex[0].ext_id.as_str(), ex[0].group.as_str()), ("a", "a"));
    assert_eq!(
        (ex[0].sent2.as_str(), ex[0].ending.as_str()),
        ("She", "plays a slow song for the audience.")
    );
    assert_eq!(
        (
            ex[1].ext_id.as_str(),
            ex[1].group.as_str(),
            ex[1].sent2.as_str()
        ),
        ("7", "g1", "The crowd")
    );

    let regular = write(
        dir.path(),
        "r.csv",
        b",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n\
          0,anetv_x,7,Someone sits. Someone,Someone sits.,Someone,gold0-orig,runs.,\"stands up, then waves.\",jumps.,eats.,1\n\
          1,anetv_y,2,He eats. He,He eats.,He,gen-orig,naps.,x.,y.,z.,0\n",
    );
    let full = write(
        dir.path(),
        "f.csv",
        b"video-id,fold-ind,startphrase,sent1,sent2,gold-ending,distractor-0,distractor-1,distractor-2,distractor-3,gold-source,gold-type,distractor-0-type,distractor-1-type,distractor-2-type,distractor-3-type\n\
          anetv_x,7,Someone sits. Someone,Someone sits.,Someone,\"stands up, then waves.\",runs.,jumps.,eats.,,gold0-orig,likely,unlikely,unlikely,likely,\n",
    );
    let summary = ingest(&project, "swag-csv", &[&regular, &full]);
    assert_eq!(
        summary["kept"], 2,
        "taken as they are, unfiltered: {summary}"
    );
    assert_eq!(
        summary["already_present"], 1,
        "the full row is the regular row: {summary}"
    );
    let before = fingerprint(&project);
    let again = ingest(&project, "swag-csv", &[&full, &regular]);
    assert_eq!(
        (again["kept"].as_i64(), again["already_present"].as_i64()),
        (Some(0), Some(3))
    );
    let again = ingest(&project, "jsonl", &[&jsonl]);
    assert_eq!(again["kept"], 0);
    assert_eq!(fingerprint(&project), before);
    assert_eq!(status(&project)["examples"], 4);
}

#[test]
fn bad_input_is_reported_and_leaves_the_project_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let project = init(dir.path());
    let good = write(dir.path(), "good.json", CAPTIONS.as_bytes());
    ingest(&project, "activitynet", &[&good]);
    let before = fingerprint(&project);
    let good_jsonl = write(
        dir.path(),
        "good.jsonl",
        br#"{"id": "z", "sent1": "A man is standing in a large kitchen.", "ending": "He chops an onion on a wooden board."}"#,
    );

    let cases: &[(&str, &str, &[u8], &str)] = &[
        ("activitynet", "trunc.json", b"{\"v\": {\"sentences\": [\"A man walks.\", \"He sits", "trunc.json:1:"),
        ("activitynet", "nosent.json", b"{\"v\": {\"timestamps\": []}}", "missing field `sentences`"),
        ("activitynet", "list.json", b"[1, 2]", "expected ActivityNet"),
        ("activitynet", "empty.json", b"", "empty.json: the file is empty"),
        ("jsonl", "bad.jsonl", b"{\"id\": \"1\", \"sent1\": \"A b c d e f.\", \"ending\": \"He x y z w.\"}\n\n{\"id\": \"2\", \"sent1\": \n", "bad.jsonl:3:"),
        ("jsonl", "noend.jsonl", b"{\"id\": \"1\", \"sent1\": \"a\"}\n", "noend.jsonl:1: no \"ending\" and no \"endings\""),
        ("jsonl", "latin1.jsonl", b"{\"id\": \"1\", \"sent1\": \"caf\xe9\", \"ending\": \"x\"}\n", "latin1.jsonl:1: invalid UTF-8"),
        ("swag-csv", "short.csv", b"video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\nv,1,s,a,b,gold0-orig,w,x,y\n", "short.csv:2: expected 11 fields"),
        ("swag-csv", "nocol.csv", b"video-id,fold-ind,sent1\nv,1,a\n", "no column `startphrase`"),
        ("swag-csv", "label.csv", b"video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\nv,1,s,a,b,gold0-orig,w,x,y,z,7\n", "label \"7\""),
        ("swag-csv", "blank.csv", b"\n\n", "the file is empty"),
    ];
    for &(format, name, content, expected) in cases {
        let bad = write(dir.path(), name, content);
        // A good file before the bad one is not written either: one transaction per call.
        let first: &Path = if format == "jsonl" {
            &good_jsonl
        } else {
            &good
        };
        let format_first = if format == "swag-csv" {
            "activitynet"
        } else {
            format
        };
        let files: Vec<&Path> = if format_first == format {
            vec![first, &bad]
        } else {
            vec![&bad]
        };
        let mut args = vec!["ingest", arg(&project), "--format", format];
        args.extend(files.iter().map(|f| arg(f)));
        let out = afkit(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} must fail");
        assert!(stderr.contains(expected), "{name}: {stderr}");
        assert!(stderr.contains(name), "the error names the file: {stderr}");
        assert_eq!(fingerprint(&project), before, "{name} changed the project");
    }
    let out = afkit(&[
        "ingest",
        arg(&project),
        "--format",
        "jsonl",
        arg(&dir.path().join("missing.jsonl")),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.jsonl"));
    assert_eq!(fingerprint(&project), before);
}

#[test]
fn an_ingest_killed_midway_leaves_a_consistent_project() {
    let dir = tempfile::tempdir().unwrap();
    let project = init(dir.path());
    // Pre-split JSONL: no tagging, so the run is dominated by the write transaction.
    let n = 60_000;
    let big = dir.path().join("big.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
    for i in 0..n {
        writeln!(
            f,
            r#"{{"id": "r{i}", "sent1": "A person number {i} is standing in a large room.", "sent2": "The person", "ending": "walks slowly to the door number {i}."}}"#
        )
        .unwrap();
    }
    drop(f);
    let wal = dir.path().join("p.sqlite-wal");
    let mut child = command()
        .args([
            "ingest".as_ref(),
            project.as_os_str(),
            "--format".as_ref(),
            "jsonl".as_ref(),
            big.as_os_str(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut killed_midway = false;
    while started.elapsed() < Duration::from_secs(120) {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        // The transaction spills pages into the WAL once it outgrows SQLite's page cache.
        if std::fs::metadata(&wal)
            .map(|m| m.len() > 1 << 20)
            .unwrap_or(false)
        {
            child.kill().unwrap(); // SIGKILL
            killed_midway = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait().unwrap();
    if !killed_midway {
        eprintln!("note: the ingest finished before it could be killed mid-write");
    }
    let s = status(&project);
    let examples = s["examples"].as_i64().unwrap();
    assert!(
        examples == 0 || examples == n,
        "all or nothing, got {examples}"
    );
    if killed_midway {
        assert_eq!(examples, 0, "the uncommitted transaction is rolled back");
    }
    let summary = ingest(&project, "jsonl", &[&big]);
    assert_eq!(
        summary["kept"].as_i64().unwrap() + summary["already_present"].as_i64().unwrap(),
        n
    );
    assert_eq!(status(&project)["examples"].as_i64().unwrap(), n);
}

#[test]
#[cfg_attr(
    not(has_shared_data),
    ignore = "needs ActivityNet Captions train.json in ../shared/data/activitynet-captions/ (from captions.zip, cs.stanford.edu/people/ranjaykrishna/densevid/): absent"
)]
fn activitynet_training_set_ingests() {
    let train = shared_data().join("activitynet-captions/train.json");
    let dir = tempfile::tempdir().unwrap();
    let project = init(dir.path());
    let summary = ingest(&project, "activitynet", &[&train]);
    let s = status(&project);
    let kept = s["examples"].as_i64().unwrap();
    eprintln!(
        "ActivityNet train.json: {} records, kept {kept}, dropped {}, {:.1} s",
        summary["records"], s["dropped"], summary["seconds"]
    );
    assert_eq!(
        kept + dropped_total(&s),
        summary["records"].as_i64().unwrap()
    );
    assert!(
        kept * 10 >= summary["records"].as_i64().unwrap() * 8,
        "most caption pairs survive the filters: {s}"
    );
}

#[test]
#[cfg_attr(
    not(has_shared_data),
    ignore = "needs UD English-EWT en_ewt-ud-test.conllu in ../shared/data/ud-english-ewt/ (github.com/UniversalDependencies/UD_English-EWT): absent"
)]
fn shipped_tagger_reaches_target_accuracy_on_ewt_test() {
    let test = shared_data().join("ud-english-ewt/en_ewt-ud-test.conllu");
    let out = ok(&["tagger", "eval", "--conllu", arg(&test)]);
    let accuracy: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("accuracy: "))
        .expect("an accuracy line")
        .parse()
        .unwrap();
    eprintln!("EWT test accuracy: {accuracy}");
    assert!(accuracy >= 0.915, "accuracy {accuracy} < 0.915");
}

#[test]
fn the_format_comes_from_the_extension_when_not_given() {
    let dir = tempfile::tempdir().unwrap();
    let project = init(dir.path());
    let jsonl = write(
        dir.path(),
        "howto.jsonl",
        br#"{"id": "a", "sent1": "A woman is sitting at a piano on a stage.", "sent2": "She", "ending": "plays a slow song for the audience."}
"#,
    );
    let captions = write(dir.path(), "captions.json", CAPTIONS.as_bytes());
    let run = |files: &[&Path]| {
        let mut args = vec!["ingest", arg(&project), "--json"];
        args.extend(files.iter().map(|f| arg(f)));
        afkit(&args)
    };
    let out = run(&[&jsonl]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["kept"], 1, "{summary}");
    let out = run(&[&captions]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        summary["kept"].as_u64().unwrap() > 0,
        "read as activitynet: {summary}"
    );

    let before = fingerprint(&project);
    let text = write(dir.path(), "notes.txt", b"A man walks.\n");
    let err = String::from_utf8_lossy(&run(&[&text]).stderr).to_string();
    assert!(
        err.contains("notes.txt: cannot tell the input format") && err.contains("--format"),
        "{err}"
    );
    let err = String::from_utf8_lossy(&run(&[&jsonl, &captions]).stderr).to_string();
    assert!(err.contains("one ingest reads one format"), "{err}");
    assert_eq!(fingerprint(&project), before, "nothing written");
}
