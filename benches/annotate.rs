//! Annotation latency: time from the submitting key press to the durable commit, time to claim
//! the next item, and redraw time, with 1 and with 8 annotator processes on one project file,
//! each in its own 80×24 tmux terminal (headless 80×24 buffers when tmux is missing).
//!
//! Each process replays a key script (the hidden `--script` mode: label six endings, pick best
//! and second, Enter) as fast as it can, which is far harsher than people typing: every process
//! is writing or redrawing nearly all the time, and eight of them keep two cores busy. Run with
//! `bash scripts/bench-annotate [ITEMS_PER_ANNOTATOR] [--backlog DONE] [--peer OLDER_AFKIT]
//! [--key-delay MS]`: `--backlog` first marks that many items done by earlier annotators (a
//! project well under way: the next item lies past all of them); with a peer (an afkit binary
//! built from another commit) every scenario runs with both binaries in turn, so the two are
//! compared on the same machine in the same run; `--key-delay` pauses that long before each key
//! (typing speed rather than replay speed: 50 ms is 20 keys a second).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use afkit_store::fixtures::Fixtures;
use afkit_store::Store;

const BIN: &str = env!("CARGO_BIN_EXE_afkit");

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

struct Run {
    processes: usize,
    wall: Duration,
    commit: Vec<f64>,
    claim: Vec<f64>,
    draw: Vec<f64>,
    submissions: i64,
}

fn tmux_available() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Makes the project `bin` can open: a peer built before schema 6 gets the project set back to
/// schema 5 (the submission counts and their triggers and index removed).
fn fit_schema(bin: &str, db: &Path) {
    let out = Command::new(bin).arg("status").arg(db).output().unwrap();
    let error = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        return;
    }
    assert!(
        error.contains("newer than this afkit (5)"),
        "{bin} cannot open the bench project: {error}"
    );
    Fixtures::on(&rusqlite::Connection::open(db).unwrap())
        .back_to_schema_5()
        .unwrap();
}

/// Marks the first `backlog` items (in hand-out order) done by earlier annotators, each with all
/// the submissions its task wants, as in a project well under way. The annotate stage creates
/// the tasks when it first opens the project (here with an empty key script).
fn annotate_backlog(bin: &str, dir: &Path, db: &Path, backlog: usize) {
    let empty = dir.join("no-keys");
    std::fs::write(&empty, "").unwrap();
    let status = Command::new(bin)
        .arg("annotate")
        .arg(db)
        .args(["--annotator", "setup", "--script"])
        .arg(&empty)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let mut conn = rusqlite::Connection::open(db).unwrap();
    let tx = conn.transaction().unwrap();
    let tasks: Vec<(i64, i64)> = tx
        .prepare("SELECT id, replicas FROM tasks ORDER BY id LIMIT ?1")
        .unwrap()
        .query_map([backlog as i64], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    for (task, replicas) in tasks {
        for earlier in 0..replicas {
            tx.execute(
                "INSERT INTO submissions(task_id, annotator, origin, broken, submitted_at)
                 VALUES (?1, ?2, 'tui', 1, '2026-01-01T00:00:00Z')",
                rusqlite::params![task, format!("earlier{earlier}")],
            )
            .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// How a scenario runs, apart from the binary and the number of annotators.
struct Scenario {
    items: usize,
    backlog: usize,
    key_delay_ms: u64,
    tmux: bool,
}

fn run(dir: &Path, bin: &str, processes: usize, scenario: &Scenario) -> Run {
    let run_dir = tempfile::tempdir_in(dir).unwrap();
    let dir = run_dir.path();
    let db = bench_project(dir, bin, processes, scenario);
    let keys = dir.join("keys");
    std::fs::write(&keys, "lulugl 1b 3s Enter\n".repeat(scenario.items)).unwrap();
    let logs: Vec<PathBuf> = (0..processes)
        .map(|i| dir.join(format!("timings{processes}-{i}.jsonl")))
        .collect();
    let commands: Vec<String> = (0..processes)
        .map(|i| {
            format!(
                "{bin} annotate {} --annotator a{i} --script {} --script-delay-ms {} \
                 --timings {}",
                db.display(),
                keys.display(),
                scenario.key_delay_ms,
                logs[i].display()
            )
        })
        .collect();
    let start = Instant::now();
    if scenario.tmux {
        run_in_tmux(&dir.join(format!("tmux{processes}.sock")), &commands);
    } else {
        run_headless(&commands);
    }
    let wall = start.elapsed();
    let (commit, claim, draw) = read_timings(&logs);
    let submissions = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM submissions WHERE annotator NOT LIKE 'earlier%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    Run {
        processes,
        wall,
        commit,
        claim,
        draw,
        submissions,
    }
}

/// A project with enough contexts for every annotator's items, the backlog and some to spare,
/// in the schema `bin` reads, with the scenario's backlog done.
fn bench_project(dir: &Path, bin: &str, processes: usize, scenario: &Scenario) -> PathBuf {
    let db = dir.join(format!("bench{processes}.sqlite"));
    let mut store = Store::create(&db).unwrap();
    store
        .synthetic_af_project(
            scenario.backlog + processes * scenario.items + 200,
            9,
            afkit_engine::seed::Seed::new(1),
        )
        .unwrap();
    drop(store);
    fit_schema(bin, &db);
    if scenario.backlog > 0 {
        annotate_backlog(bin, dir, &db, scenario.backlog);
    }
    db
}

/// Runs each command in its own 80×24 tmux terminal and waits until all have exited.
fn run_in_tmux(socket: &Path, commands: &[String]) {
    for (i, command) in commands.iter().enumerate() {
        let status = Command::new("tmux")
            .arg("-S")
            .arg(socket)
            .args([
                "new-session",
                "-d",
                "-s",
                &format!("a{i}"),
                "-x",
                "80",
                "-y",
                "24",
            ])
            .arg(format!("exec {command}"))
            .status()
            .unwrap();
        assert!(status.success());
    }
    // The server exits when its last session ends.
    while Command::new("tmux")
        .arg("-S")
        .arg(socket)
        .arg("has-session")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the commands at once without a terminal (the sessions draw into 80×24 buffers) and
/// waits for each to succeed.
fn run_headless(commands: &[String]) {
    let children: Vec<_> = commands
        .iter()
        .map(|command| {
            Command::new("sh")
                .args(["-c", command])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
}

/// The milliseconds of every commit, claim and draw in the sessions' `--timings` files, each
/// list sorted.
fn read_timings(logs: &[PathBuf]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut commit, mut claim, mut draw) = (Vec::new(), Vec::new(), Vec::new());
    for log in logs {
        let text = std::fs::read_to_string(log)
            .unwrap_or_else(|e| panic!("{}: {e} (did the annotator process fail?)", log.display()));
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let ms = v["ms"].as_f64().unwrap();
            match v["event"].as_str().unwrap() {
                "commit" => commit.push(ms),
                "claim" => claim.push(ms),
                "draw" => draw.push(ms),
                other => panic!("unknown event {other}"),
            }
        }
    }
    for v in [&mut commit, &mut claim, &mut draw] {
        v.sort_by(f64::total_cmp);
    }
    (commit, claim, draw)
}

/// The number after `flag`, if the flag is given.
fn number_after<T: std::str::FromStr>(args: &[String], flag: &str) -> Option<T> {
    let i = args.iter().position(|a| a == flag)?;
    let number = args.get(i + 1).and_then(|n| n.parse().ok());
    Some(number.unwrap_or_else(|| panic!("{flag} needs a number")))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let items: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(100);
    let backlog = number_after(&args, "--backlog").unwrap_or(0);
    let peer = args.iter().position(|a| a == "--peer").map(|i| {
        args.get(i + 1)
            .expect("--peer needs an afkit binary")
            .clone()
    });
    let key_delay_ms = number_after(&args, "--key-delay").unwrap_or(0);
    let tmux = tmux_available();
    let scenario = Scenario {
        items,
        backlog,
        key_delay_ms,
        tmux,
    };
    let dir = tempfile::tempdir().unwrap();
    let pace = match key_delay_ms {
        0 => "scripted keys with no pause".to_string(),
        ms => format!("scripted keys {ms} ms apart"),
    };
    println!(
        "annotate latency: {items} items per annotator after {backlog} done, {pace}, {} (every label flushed to the disk before the next item shows)\n",
        if tmux {
            "each process in its own 80×24 tmux terminal"
        } else {
            "tmux missing: headless 80×24 buffers"
        }
    );
    let mut builds = vec![("this build", BIN.to_string())];
    builds.extend(peer.map(|p| ("peer", p)));
    println!("| afkit | annotators | submissions | wall s | commit p50 ms | commit p99 ms | claim p50 ms | claim p99 ms | draw p50 ms | draw p99 ms |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut runs = Vec::new();
    for processes in [1, 8] {
        for (name, bin) in &builds {
            let r = run(dir.path(), bin, processes, &scenario);
            assert_eq!(
                r.submissions as usize,
                processes * items,
                "a label was lost"
            );
            assert_eq!(r.commit.len(), processes * items);
            print_row(name, &r);
            runs.push((*name, r));
        }
    }
    // A percentile of commit latency for one build and number of annotators, if it ran.
    let commit_ms = |name: &str, processes: usize, p: f64| {
        runs.iter()
            .find(|(n, r)| *n == name && r.processes == processes)
            .map(|(_, r)| percentile(&r.commit, p))
    };
    let this = |processes: usize, p: f64| commit_ms("this build", processes, p).unwrap();
    println!(
        "\nthis build, 8 vs 1 annotator: commit p50 ×{:.1}, commit p99 ×{:.1}",
        this(8, 0.5) / this(1, 0.5),
        this(8, 0.99) / this(1, 0.99)
    );
    if let (Some(this), Some(peer)) = (commit_ms("this build", 8, 0.99), commit_ms("peer", 8, 0.99))
    {
        println!("8 annotators, commit p99: this build {this:.2} ms, peer {peer:.2} ms (peer / this ×{:.1})", peer / this);
    }
}

fn print_row(name: &str, r: &Run) {
    println!(
        "| {name} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} |",
        r.processes,
        r.submissions,
        r.wall.as_secs_f64(),
        percentile(&r.commit, 0.5),
        percentile(&r.commit, 0.99),
        percentile(&r.claim, 0.5),
        percentile(&r.claim, 0.99),
        percentile(&r.draw, 0.5),
        percentile(&r.draw, 0.99),
    );
}
