//! `afkit crowd import`'s reader and row checks on arbitrary bytes, against a project with
//! annotation tasks (made once per process): every row imported or rejected with its line, or
//! an error for the whole file; never a panic. Nothing is written to the project.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use afkit_annotate::tasks::{ensure_tasks, PolicyRequest};
use afkit_store::Store;

/// A project with 12 contexts of 9 negatives each and its tasks (item ids 1 to 12).
fn project() -> &'static Path {
    static PROJECT: OnceLock<PathBuf> = OnceLock::new();
    PROJECT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let path = dir.keep().join("project.sqlite");
        let mut store = Store::create(&path).expect("a new project");
        store.synthetic_af_project(12, 9, afkit_engine::seed::Seed::new(1)).expect("a synthetic AF run");
        ensure_tasks(&mut store, PolicyRequest::default()).expect("annotation tasks");
        path
    })
}

thread_local! {
    static STORE: Store = Store::open(project()).expect("the project opens");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let name = Path::new("results.csv");
    STORE.with(|store| {
        let _ = afkit_annotate::crowd::check_results(store, name, data);
    });
});
