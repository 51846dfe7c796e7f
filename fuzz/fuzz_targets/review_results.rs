//! `afkit review import`'s reader and row checks on arbitrary bytes, against a project with
//! review items (made once per process): every row imported or rejected with its line, or an
//! error for the whole file; never a panic. Nothing is written to the project.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use afkit_store::Store;

/// A project with 12 contexts of 9 negatives each and a review item per context (item ids 1
/// to 12: the found ending and three negatives).
fn project() -> &'static Path {
    static PROJECT: OnceLock<PathBuf> = OnceLock::new();
    PROJECT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let path = dir.keep().join("project.sqlite");
        let mut store = Store::create(&path).expect("a new project");
        store.synthetic_af_project(12, 9, afkit_engine::seed::Seed::new(1)).expect("a synthetic AF run");
        for example in store.examples().expect("the contexts") {
            let negatives = store.pool_candidate_texts(example.id).expect("the negatives");
            let shown = [example.gold_ending_id, negatives[0].0, negatives[1].0, negatives[2].0];
            store.create_review_item(example.id, shown, 2).expect("a review item");
        }
        path
    })
}

thread_local! {
    static STORE: Store = Store::open(project()).expect("the project opens");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let name = Path::new("reviews.csv");
    STORE.with(|store| {
        let _ = afkit_annotate::review::check_reviews(store, name, data);
    });
});
