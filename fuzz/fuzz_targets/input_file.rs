//! afkit's readers take a path, as the CLI gives them: each target writes the fuzzer's bytes to
//! one file (reused across executions) and hands the reader that path, so the fuzzed code is the
//! code the CLI runs.

use std::path::PathBuf;
use std::sync::OnceLock;

static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();

/// Writes `data` to `name` in this process's scratch directory and returns the file's path.
pub fn write(name: &str, data: &[u8]) -> PathBuf {
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a scratch directory"));
    let path = dir.path().join(name);
    std::fs::write(&path, data).expect("the scratch file is writable");
    path
}
