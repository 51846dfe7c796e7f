//! The store's side of annotation: claims and process liveness, skips and undo, durable labels,
//! submission counts, re-annotation.

use rusqlite::{params, Connection};

use super::claims::{cutoff, Holder, STALE_AFTER, TAKES_ANNOTATOR, WANTING};
use super::labels::{EndingLabel, NewSubmission, UndoneKind};
use super::tasks::{NewTask, TaskView, ENDINGS_PER_TASK};
use crate::dataset::{Judgement, Rank};
use crate::Store;
use afkit_engine::seed::Seed;

/// A pid no process has (above Linux's pid_max).
const DEAD_PID: u32 = 4_000_000_000;

/// A filtered project with a round-0 task per context, in example order: the first `m` for
/// `r` annotators each, the rest for one (the hand-out these tests exercise, without the
/// annotate stage's seeded order).
fn project(contexts: usize, m: i64, r: i64) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::create(&dir.path().join("p.sqlite")).unwrap();
    let run_id = store
        .synthetic_af_project(contexts, 6, afkit_engine::seed::Seed::new(3))
        .unwrap();
    for (index, context) in (0..).zip(store.untasked_contexts(run_id).unwrap()) {
        let mut endings = vec![context.gold_ending_id];
        endings.extend(&context.negatives[..ENDINGS_PER_TASK - 1]);
        let task = NewTask {
            example_id: context.example_id,
            run_id,
            round: 0,
            replicas: if index < m { r } else { 1 },
            seed: Seed::new(0),
            endings,
        };
        store.insert_task(&task).unwrap();
    }
    (dir, store)
}

/// The holder's next item: its own claim if it may still take it, else the first it may take.
fn claim_next(store: &mut Store, holder: &Holder) -> Option<TaskView> {
    store.claim_next(holder).unwrap()
}

fn holder(name: &str, pid: u32) -> Holder {
    Holder {
        annotator: name.into(),
        pid,
        host: "testhost".into(),
    }
}

fn complete(task: &TaskView, who: &str) -> NewSubmission {
    NewSubmission {
        task_id: task.task_id,
        annotator: who.into(),
        broken: false,
        seconds: Some(1.0),
        submitted_at: None,
        labels: task
            .endings
            .iter()
            .enumerate()
            .map(|(i, e)| EndingLabel {
                ending_id: e.ending_id,
                judgement: Judgement::Likely,
                rank: [Some(Rank::Best), Some(Rank::Second)]
                    .get(i)
                    .copied()
                    .flatten(),
            })
            .collect(),
    }
}

#[test]
fn flushed_labels_are_kept_across_checkpoints_by_other_connections() {
    let (dir, mut store) = project(4, 0, 1);
    store.sync_every_label();
    let a = holder("a", std::process::id());
    let other = Connection::open(dir.path().join("p.sqlite")).unwrap();
    for round in 0..3 {
        let task = claim_next(&mut store, &a).unwrap();
        if round == 1 {
            // Another process empties the log while this store keeps it open.
            other
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .unwrap();
        }
        store.submit(&complete(&task, "a")).unwrap();
    }
    let task = claim_next(&mut store, &a).unwrap();
    store.skip(&a, task.task_id).unwrap();
    assert!(store.undo_last(&a).unwrap().is_some());
    let stored: i64 = other
        .query_row("SELECT COUNT(*) FROM submissions", [], |r| r.get(0))
        .unwrap();
    assert_eq!(stored, 3);
}

#[test]
fn submission_counts_follow_every_submission_and_survive_the_upgrade() {
    let (dir, mut store) = project(5, 2, 2);
    let me = std::process::id();
    let (a, b) = (holder("a", me), holder("b", me));
    for who in [&a, &b, &a, &a] {
        let task = claim_next(&mut store, who).unwrap();
        store.submit(&complete(&task, &who.annotator)).unwrap();
    }
    let undone = store.undo_last(&a).unwrap().unwrap();
    let counts = |store: &Store| -> Vec<(i64, i64)> {
        store
            .conn
            .prepare(
                "SELECT t.submitted, (SELECT COUNT(*) FROM submissions s WHERE s.task_id = t.id)
                 FROM tasks t ORDER BY t.id",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    // A live claim of b's and a skip of a's rule items out as well.
    claim_next(&mut store, &b).unwrap();
    let skipped = claim_next(&mut store, &holder("c", me)).unwrap();
    store.skip(&holder("c", me), skipped.task_id).unwrap();
    for who in ["a", "b", "c", "d"] {
        let by_scan: i64 = store
            .conn
            .query_row(
                &format!("SELECT COUNT(*) FROM tasks t WHERE {WANTING} AND {TAKES_ANNOTATOR}"),
                params![who, cutoff(STALE_AFTER)],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(
            store.annotator_progress(who).unwrap().remaining,
            by_scan,
            "{who}"
        );
    }
    let kept = counts(&store);
    assert!(kept.iter().all(|(kept, real)| kept == real), "{kept:?}");
    assert_eq!(kept.iter().map(|c| c.1).sum::<i64>(), 3);
    let remaining = store.annotator_progress("a").unwrap().remaining;
    // A project of schema 5 (no counts) gets them from its submissions when opened.
    let path = dir.path().join("p.sqlite");
    drop(store);
    crate::fixtures::Fixtures::on(&Connection::open(&path).unwrap())
        .back_to_schema_5()
        .unwrap();
    let mut store = Store::open(&path).unwrap();
    assert_eq!(counts(&store), kept);
    assert_eq!(store.annotator_progress("a").unwrap().remaining, remaining);
    let again = claim_next(&mut store, &a).unwrap();
    assert_eq!(
        again.task_id, undone.task.task_id,
        "the undone item comes back"
    );
}

#[test]
fn claims_fill_replicas_and_nobody_gets_an_item_twice() {
    let (_dir, mut store) = project(3, 1, 2);
    let me = std::process::id();
    let (a, b, c) = (holder("a", me), holder("b", me), holder("c", me));
    let ta = claim_next(&mut store, &a).unwrap();
    let tb = claim_next(&mut store, &b).unwrap();
    assert_eq!(
        ta.task_id, tb.task_id,
        "the agreement item goes to two annotators"
    );
    assert_eq!(ta.replicas, 2);
    let tc = claim_next(&mut store, &c).unwrap();
    assert_ne!(
        tc.task_id, ta.task_id,
        "a third annotator gets the next item"
    );
    // Asking again returns the same claimed item (the resume point).
    assert_eq!(claim_next(&mut store, &a).unwrap().task_id, ta.task_id);
    store.submit(&complete(&ta, "a")).unwrap();
    let next = claim_next(&mut store, &a).unwrap();
    assert!(next.task_id != ta.task_id && next.task_id != tc.task_id);
    store.submit(&complete(&next, "a")).unwrap();
    assert_eq!(claim_next(&mut store, &a), None, "c holds the last item");
    assert_eq!(store.annotator_progress("a").unwrap().done, 2);
}

#[test]
fn items_of_dead_processes_go_to_others_but_come_back_to_their_owner_first() {
    let (_dir, mut store) = project(2, 0, 1);
    let me = std::process::id();
    let ghost = holder("ghost", DEAD_PID);
    let held = claim_next(&mut store, &ghost).unwrap();
    // The ghost's process is gone: its item is free for others.
    let other = claim_next(&mut store, &holder("other", me)).unwrap();
    assert_eq!(other.task_id, held.task_id);
    // Back under the same name, the ghost gets another item, since "other" holds its old one.
    let back = claim_next(&mut store, &holder("ghost", me)).unwrap();
    assert_ne!(back.task_id, held.task_id);
    // Without competition the owner's claim comes back first.
    let (_d2, mut store) = project(2, 0, 1);
    let first = claim_next(&mut store, &holder("ann", DEAD_PID)).unwrap();
    let resumed = claim_next(&mut store, &holder("ann", me)).unwrap();
    assert_eq!(resumed.task_id, first.task_id);
}

#[test]
fn skip_and_undo() {
    let (_dir, mut store) = project(2, 0, 1);
    let a = holder("a", std::process::id());
    let first = claim_next(&mut store, &a).unwrap();
    store.skip(&a, first.task_id).unwrap();
    let second = claim_next(&mut store, &a).unwrap();
    assert_ne!(
        second.task_id, first.task_id,
        "a skipped item is not offered again"
    );
    store.submit(&complete(&second, "a")).unwrap();
    assert_eq!(claim_next(&mut store, &a), None);
    // Undo takes back the submission (the latest action) with its labels, then the skip.
    let undone = store.undo_last(&a).unwrap().unwrap();
    assert_eq!(
        (undone.task.task_id, undone.was),
        (second.task_id, UndoneKind::Submission)
    );
    assert_eq!(undone.labels.len(), second.endings.len());
    assert_eq!(store.annotator_progress("a").unwrap().done, 0);
    assert_eq!(claim_next(&mut store, &a).unwrap().task_id, second.task_id);
    let undone = store.undo_last(&a).unwrap().unwrap();
    assert_eq!(
        (undone.task.task_id, undone.was),
        (first.task_id, UndoneKind::Skip)
    );
    assert_eq!(store.undo_last(&a).unwrap(), None);
}

#[test]
fn reannotation_supersedes_the_open_task() {
    let (_dir, store) = project(2, 0, 1);
    let old = store.open_tasks(false).unwrap()[0].clone();
    let mut endings: Vec<i64> = old.endings.iter().map(|e| e.ending_id).collect();
    endings.truncate(4);
    if !old.endings[..4].iter().any(|e| e.is_gold) {
        endings[0] = old.endings.iter().find(|e| e.is_gold).unwrap().ending_id;
    }
    let new_id = store
        .create_reannotation_task(old.example_id, &endings)
        .unwrap();
    let new = store.task_view(new_id).unwrap().unwrap();
    assert_eq!((new.round, new.replicas, new.open), (1, 1, true));
    let mut shown: Vec<i64> = new.endings.iter().map(|e| e.ending_id).collect();
    shown.sort();
    endings.sort();
    assert_eq!(shown, endings);
    assert!(!store.task_view(old.task_id).unwrap().unwrap().open);
    // Endings of another context, or no found ending, are refused.
    let other = store.open_tasks(false).unwrap()[0].clone();
    assert_ne!(other.example_id, old.example_id);
    let foreign: Vec<i64> = other.endings.iter().map(|e| e.ending_id).collect();
    assert!(store
        .create_reannotation_task(old.example_id, &foreign)
        .is_err());
    let no_gold: Vec<i64> = new
        .endings
        .iter()
        .filter(|e| !e.is_gold)
        .map(|e| e.ending_id)
        .collect();
    assert!(store
        .create_reannotation_task(old.example_id, &no_gold)
        .is_err());
}
