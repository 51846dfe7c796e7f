//! The integration tests, one module per area, built as one binary so that candle and afkit are
//! linked once rather than once per file. `common` holds the builders and helpers they share.
//!
//! A test that cannot run here (no `../shared`, no tmux, no Python) is ignored with its reason,
//! decided when the tests are built (see build.rs), so that it is counted as skipped rather
//! than shown as passed; `scripts/test` lists the skipped tests and why at the end.

mod common;

mod adapt;
mod aflite;
mod annotate;
mod assemble;
mod audit_cv;
mod audit_lm;
mod blind_reading;
mod faults;
mod filter;
mod generate;
mod group_counts;
mod help_sections;
mod ingest;
mod interop;
mod layering;
mod openai_backend;
mod pool_bundle;
mod progress_lines;
mod review;
mod safety;

/// Cargo builds only this file's modules (`autotests = false`): a new file under tests/ that is
/// not named above would never run.
#[test]
fn every_file_under_tests_is_a_module_of_the_test_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let this = std::fs::read_to_string(dir.join("tests.rs")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(module) = name.strip_suffix(".rs") else {
            continue;
        };
        if module != "tests" && !this.contains(&format!("\nmod {module};\n")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "add `mod NAME;` to tests/tests.rs for {missing:?}"
    );
}

/// A skipped test says why: `#[ignore]` without a reason would be counted but not explained.
#[test]
fn every_ignored_test_gives_its_reason() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bare = Vec::new();
    let mut dirs = vec![root.join("src"), root.join("crates"), root.join("tests")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (i, line) in text.lines().enumerate() {
                    if line.trim() == "#[ignore]" {
                        bare.push(format!("{}:{}", path.display(), i + 1));
                    }
                }
            }
        }
    }
    assert!(bare.is_empty(), "#[ignore] without a reason at {bare:?}");
}

/// The end of `scripts/test`: how many tests were skipped, then one line each with why, read
/// from libtest's output.
#[test]
fn the_skipped_tests_are_listed_with_their_reasons() {
    let log = "test layering::a ... ok\n\
               test generate::b ... ignored, needs ../shared/fixtures: absent\n\
               test faults::c ... ignored\n\
               test result: ok. 1 passed; 0 failed; 2 ignored\n";
    let summary = |input: &str| {
        let mut child = std::process::Command::new("bash")
            .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/skipped"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
    };
    assert_eq!(
        summary(log),
        "skipped 2 tests:\n  generate::b: needs ../shared/fixtures: absent\n  \
         faults::c: no reason given\n"
    );
    assert_eq!(summary("test a ... ok\n"), "skipped no tests\n");
}

/// `scripts/reprobe` makes the build scripts (the workspace's and the engine's) probe again
/// exactly when the build's view of the machine may be stale: never on a fresh checkout, never
/// twice for the same machine, always for a build no stamp describes.
#[test]
fn reprobe_touches_build_rs_only_when_the_machine_may_have_changed() {
    let root = tempfile::tempdir().unwrap();
    let repo = root.path().join("repo");
    std::fs::create_dir_all(repo.join("scripts")).unwrap();
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/reprobe"),
        repo.join("scripts/reprobe"),
    )
    .unwrap();
    std::fs::create_dir_all(repo.join("crates/engine")).unwrap();
    let build_scripts = [repo.join("build.rs"), repo.join("crates/engine/build.rs")];
    for script in &build_scripts {
        std::fs::write(script, "").unwrap();
    }
    let stamp = repo.join("target/test-environment");
    // Marks the build scripts old, runs the script, and says whether it touched them (it
    // touches both or neither).
    let touches_with = |target_dir: Option<&std::path::Path>| {
        for script in &build_scripts {
            std::fs::File::options()
                .write(true)
                .open(script)
                .unwrap()
                .set_modified(std::time::UNIX_EPOCH)
                .unwrap();
        }
        let mut reprobe = std::process::Command::new("bash");
        reprobe.arg(repo.join("scripts/reprobe"));
        match target_dir {
            Some(dir) => reprobe.env("CARGO_TARGET_DIR", dir),
            None => reprobe.env_remove("CARGO_TARGET_DIR"),
        };
        assert!(reprobe.status().unwrap().success());
        let touched: Vec<bool> = build_scripts
            .iter()
            .map(|script| {
                let modified = std::fs::metadata(script).unwrap().modified().unwrap();
                modified > std::time::UNIX_EPOCH + std::time::Duration::from_secs(1)
            })
            .collect();
        assert_eq!(touched[0], touched[1], "both build scripts or neither");
        touched[0]
    };
    let touches = || touches_with(None);
    assert!(!touches(), "a fresh checkout has nothing to re-probe");
    assert!(stamp.is_file(), "the first run records what it saw");
    assert!(!touches(), "the same machine again");
    std::fs::write(
        &stamp,
        "shared: | tmux: | llama-server: | python3: /elsewhere",
    )
    .unwrap();
    assert!(touches(), "the machine changed since the last build");
    assert!(!touches(), "and is recorded again");
    std::fs::remove_file(&stamp).unwrap();
    std::fs::create_dir_all(repo.join("target/release")).unwrap();
    assert!(touches(), "a build that no stamp describes");
    // A build folder elsewhere, shared with another checkout, keeps its own stamp.
    let elsewhere = root.path().join("builds");
    std::fs::create_dir_all(elsewhere.join("release")).unwrap();
    assert!(
        touches_with(Some(&elsewhere)),
        "its builds, no stamp there yet"
    );
    assert!(elsewhere.join("test-environment").is_file());
    assert!(!touches_with(Some(&elsewhere)), "the same machine again");
}

/// `scripts/demo` runs the afkit that cargo built where CARGO_TARGET_DIR puts it, not a fixed
/// `target/release/afkit`, and tells how to put afkit on PATH.
#[test]
fn the_demo_finds_afkit_where_cargo_target_dir_puts_it() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let elsewhere = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/afkit-binary"))
        .env("CARGO_TARGET_DIR", elsewhere.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim_end(),
        elsewhere.path().join("release/afkit").to_str().unwrap()
    );
    let demo = std::fs::read_to_string(root.join("scripts/demo")).unwrap();
    assert!(
        demo.contains("afkit=$(bash scripts/afkit-binary)") && !demo.contains("target/release"),
        "the demo must run the binary scripts/afkit-binary names"
    );
    assert!(demo.contains("cargo install --path . --locked"));
}
