//! End-to-end tests of assemble, export, audit and score through the `afkit` binary, on
//! hand-made projects: one label fixture per assembly rule and edge case. The rule tests assemble
//! with `--distractors hardest`, so that the distractors come in the fixture's score order.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use afkit_engine::seed::Seed;
use afkit_store::dataset::REGULAR_COLUMNS;
use afkit_store::fixtures::Fixtures;
use common::{afkit, example_texts, fails, ok, read, unverified_project, Ctx, Project};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

const L: &str = "likely";
const U: &str = "unlikely";
const G: &str = "gibberish";
const BEST: Option<&str> = Some("best");
const SECOND: Option<&str> = Some("second");

#[test]
fn found_ending_ranked_best_is_gold0_with_the_hardest_unlikely_distractors() {
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, BEST),
        [(G, None), (U, SECOND), (L, None), (U, None), (U, None)],
    );
    let s = p.assemble(&["--distractors", "hardest", "--split", "1,0,0"]);
    assert_eq!(s["gold_sources"]["gold0-orig"], 1);
    let a = p.assembled();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].1, c.found);
    // Gibberish cands[0] is out, and so is cands[2]: judged likely, it could be right. The
    // rest hardest first; a second best judged unlikely is a distractor like any other.
    assert_eq!(a[0].3, vec![c.cands[1], c.cands[3], c.cands[4]]);
}

#[test]
fn verified_distractors_are_matched_to_the_found_endings_scores_by_default() {
    // The shown negatives score 100, 99, ..., 96 and the found ending 50: all accepted, the
    // four nearest the found ending's score are kept, nearest first; the hardest is left out.
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, BEST),
        [(U, None), (U, None), (U, SECOND), (U, None), (U, None)],
    );
    let s = p.assemble(&["--split", "1,0,0"]);
    assert_eq!(s["distractors"], "matched");
    assert_eq!(s["gold_sources"]["gold0-orig"], 1);
    let nearest_first: Vec<i64> = c.cands[1..5].iter().rev().copied().collect();
    assert_eq!(p.assembled()[0].3, nearest_first);
}

#[test]
fn matching_without_found_ending_scores_fails_clearly_and_writes_nothing() {
    // A run that kept no score for the found endings (finished before afkit kept them) has
    // nothing to match distractors to: assemble says so and how to go on.
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    p.conn
        .execute("DELETE FROM af_scores WHERE ending_id = ?1", [c.found])
        .unwrap();
    for flags in [&["--unverified"][..], &[][..]] {
        let mut args = vec!["assemble", p.p(), "--split", "1,0,0"];
        args.extend_from_slice(flags);
        let err = common::fails(&args);
        assert!(err.contains("--distractors hardest"), "{err}");
        assert!(p.assembled().is_empty(), "nothing is written");
    }
    let s = p.assemble(&[
        "--unverified",
        "--distractors",
        "hardest",
        "--split",
        "1,0,0",
    ]);
    assert_eq!(s["gold_sources"]["unverified"], 1);
}

#[test]
fn found_ending_ranked_second_is_gold1_and_the_best_generation_is_not_a_distractor() {
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, SECOND),
        [(L, None), (U, None), (L, BEST), (U, None), (U, None)],
    );
    p.assemble(&["--distractors", "hardest", "--split", "0,1,0"]);
    let a = p.assembled();
    assert_eq!(a.len(), 1, "no generation-as-gold outside train");
    assert_eq!(a[0].0, "gold1-orig");
    // Neither the best generation nor cands[0], judged likely.
    assert_eq!(a[0].3, vec![c.cands[1], c.cands[3], c.cands[4]]);
}

#[test]
fn generation_best_over_found_second_adds_a_training_only_example() {
    let p = Project::new();
    let ctxs: Vec<Ctx> = ["v1", "v2", "v3"]
        .iter()
        .map(|g| p.context(g, 0, 10, 8))
        .collect();
    for c in &ctxs {
        let t = p.task(c, 0, &c.shown());
        p.label(
            t,
            c,
            "ann",
            (L, SECOND),
            [(L, BEST), (U, None), (G, None), (U, None), (U, None)],
        );
    }
    let s = p.assemble(&[
        "--distractors",
        "hardest",
        "--split",
        "0.34,0.33,0.33",
        "--seed",
        "4",
    ]);
    assert_eq!(s["groups"]["train"], 1);
    assert_eq!(s["generated_gold_withheld_from_eval"], 2);
    let a = p.assembled();
    let gen: Vec<_> = a.iter().filter(|x| x.0 == "gen-orig").collect();
    assert_eq!(gen.len(), 1);
    assert_eq!(gen[0].2, "train");
    let c = ctxs
        .iter()
        .find(|c| c.cands[0] == gen[0].1)
        .expect("the best generation is gold");
    // The other generations judged unlikely, hardest first; the found ending is not a distractor.
    assert_eq!(gen[0].3, vec![c.cands[1], c.cands[3], c.cands[4]]);
    assert_eq!(a.iter().filter(|x| x.0 == "gold1-orig").count(), 3);
}

#[test]
fn found_outside_top_two_goes_back_to_the_queue_and_comes_back_as_reannot() {
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, None),
        [(L, BEST), (U, None), (L, SECOND), (G, None), (U, None)],
    );
    let s = p.assemble(&["--distractors", "hardest", "--split", "1,0,0"]);
    assert_eq!(s["reannotation_queued"]["found_outside_top_two"], 1);
    assert!(p.assembled().is_empty());
    let (new_task, round): (i64, i64) = p
        .conn
        .query_row(
            "SELECT id, round FROM tasks WHERE status = 'open'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(round, 1);
    let old: String = p
        .conn
        .query_row("SELECT status FROM tasks WHERE id = ?1", [t], |r| r.get(0))
        .unwrap();
    assert_eq!(old, "superseded");
    let shown: BTreeSet<i64> = p
        .conn
        .prepare("SELECT ending_id FROM task_endings WHERE task_id = ?1")
        .unwrap()
        .query_map([new_task], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    // Kept: found, cands 1 and 4; replaced (best, second, gibberish) by the next-hardest
    // assigned negatives never shown: cands 5, 6, 7.
    let expected: BTreeSet<i64> = [
        c.found, c.cands[1], c.cands[4], c.cands[5], c.cands[6], c.cands[7],
    ]
    .into();
    assert_eq!(shown, expected);

    // Re-running before the new task is labelled queues nothing twice.
    let again = p.assemble(&["--distractors", "hardest", "--split", "1,0,0"]);
    assert_eq!(again["awaiting_labels"], 1);
    assert_eq!(again["reannotation_queued"], serde_json::json!({}));

    let endings: Vec<(i64, &str, Option<&str>)> = vec![
        (c.found, L, BEST),
        (c.cands[1], U, SECOND),
        (c.cands[4], U, None),
        (c.cands[5], L, None),
        (c.cands[6], U, None),
        (c.cands[7], L, None),
    ];
    Fixtures::on(&p.conn)
        .insert_submission(new_task, "ann2", false, &endings)
        .unwrap();
    let s = p.assemble(&["--distractors", "hardest", "--split", "1,0,0"]);
    assert_eq!(s["gold_sources"]["gold0-reannot"], 1);
    assert_eq!(p.assembled()[0].3, vec![c.cands[1], c.cands[4], c.cands[6]]);
}

/// The open task's id and its endings.
fn open_task(p: &Project) -> (i64, BTreeSet<i64>) {
    let id: i64 = p
        .conn
        .query_row("SELECT id FROM tasks WHERE status = 'open'", [], |r| {
            r.get(0)
        })
        .unwrap();
    (id, p.open_task_endings())
}

#[test]
fn three_accepted_endings_get_a_spare_round_whose_accepted_endings_join_the_choice() {
    let p = Project::new();
    // Eleven scored candidates: five shown in the first round, six never shown.
    let c = p.context("v1", 0, 12, 11);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, BEST),
        [(U, None), (G, None), (U, SECOND), (L, None), (U, None)],
    );
    let args = ["--distractors", "hardest", "--split", "1,0,0"];
    let s = p.assemble(&args);
    assert_eq!(s["spare_rounds_queued"], 1);
    assert_eq!(s["candidates_per_question"]["3"], 1);
    // The question is built meanwhile; the spare round shows the found ending and the five
    // hardest endings never shown.
    assert_eq!(p.assembled()[0].3, vec![c.cands[0], c.cands[2], c.cands[4]]);
    let (spare, shown) = open_task(&p);
    let expected: BTreeSet<i64> = std::iter::once(c.found)
        .chain(c.cands[5..10].iter().copied())
        .collect();
    assert_eq!(shown, expected);
    let again = p.assemble(&args);
    assert_eq!(again["spare_rounds_queued"], 0);
    assert_eq!(again["spare_rounds_awaiting_labels"], 1);

    // The found ending's labels in the spare round change nothing (its place was settled); a
    // generation ranked best there could be right and is never a distractor, nor one judged
    // likely or gibberish. The generator finds cands[9] likeliest, so it is shown first.
    Fixtures::on(&p.conn).set_lp_cond(c.cands[9], -1.0).unwrap();
    let labels: Vec<(i64, &str, Option<&str>)> = vec![
        (c.found, U, None),
        (c.cands[5], U, None),
        (c.cands[6], U, BEST),
        (c.cands[7], L, None),
        (c.cands[8], G, None),
        (c.cands[9], U, SECOND),
    ];
    Fixtures::on(&p.conn)
        .insert_submission(spare, "ann2", false, &labels)
        .unwrap();
    let s = p.assemble(&args);
    assert_eq!(s["gold_sources"]["gold0-orig"], 1);
    assert_eq!(s["candidates_per_question"]["5"], 1);
    assert_eq!(s["chosen_after_annotation"], 1);
    assert_eq!(s["spare_rounds_queued"], 0);
    assert_eq!(
        p.assembled()[0].3,
        vec![c.cands[9], c.cands[0], c.cands[2], c.cands[4]]
    );
}

#[test]
fn choose_from_three_asks_for_no_spare_round_and_keeps_the_distractors_order() {
    let p = Project::new();
    let c = p.context("v1", 0, 12, 11);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, BEST),
        [(U, None), (U, None), (U, None), (U, None), (U, None)],
    );
    Fixtures::on(&p.conn).set_lp_cond(c.cands[4], -1.0).unwrap();
    let s = p.assemble(&[
        "--distractors",
        "hardest",
        "--split",
        "1,0,0",
        "--choose-from",
        "3",
    ]);
    assert_eq!(s["spare_rounds_queued"], 0);
    assert_eq!(s["chosen_after_annotation"], 0);
    assert_eq!(p.assembled()[0].3, c.cands[..4].to_vec());
    let rounds: i64 = p
        .conn
        .query_row("SELECT MAX(round) FROM tasks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rounds, 0);
    // By default five accepted are fewer than six: a spare round, and the likeliest first.
    let s = p.assemble(&["--distractors", "hardest", "--split", "1,0,0"]);
    assert_eq!(s["spare_rounds_queued"], 1);
    assert_eq!(
        p.assembled()[0].3,
        vec![c.cands[4], c.cands[0], c.cands[1], c.cands[2]]
    );
    let err = fails(&["assemble", p.p(), "--choose-from", "2"]);
    assert!(err.contains("--choose-from"), "{err}");
}

#[test]
fn matched_refill_takes_the_unseen_pool_endings_nearest_the_found_endings_score() {
    // Unseen scored pool endings: cands 5–7 (assigned, 95–93) and 8–9 (not assigned, 40 and
    // 10); the found ending scores 50. The default refill takes 8, 9 and 7 (distances 10, 40,
    // 43), where --distractors hardest would take 5, 6, 7.
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    for (cand, score) in [(c.cands[8], 40.0), (c.cands[9], 10.0)] {
        Fixtures::on(&p.conn)
            .insert_score(p.run, cand, score)
            .unwrap();
    }
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, None),
        [(L, BEST), (U, None), (L, SECOND), (G, None), (U, None)],
    );
    let s = p.assemble(&["--split", "1,0,0"]);
    assert_eq!(s["reannotation_queued"]["found_outside_top_two"], 1);
    let shown = p.open_task_endings();
    let expected: BTreeSet<i64> = [
        c.found, c.cands[1], c.cands[4], c.cands[7], c.cands[8], c.cands[9],
    ]
    .into();
    assert_eq!(shown, expected);
}

#[test]
fn fewer_than_four_non_gibberish_endings_goes_back_to_the_queue() {
    let p = Project::new();
    // Nine assigned: the four never shown refill all but the found ending and cands[4].
    let c = p.context("v1", 0, 10, 9);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, BEST),
        [(G, None), (L, SECOND), (G, None), (G, None), (U, None)],
    );
    let s = p.assemble(&["--split", "1,0,0"]);
    assert_eq!(s["reannotation_queued"]["too_few_non_gibberish"], 1);
    assert!(p.assembled().is_empty());
}

#[test]
fn generations_judged_likely_are_never_distractors_and_go_back_to_the_queue() {
    let p = Project::new();
    let c = p.context("v1", 0, 10, 9);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, BEST),
        [(L, SECOND), (U, None), (L, None), (G, None), (U, None)],
    );
    let s = p.assemble(&["--distractors", "hardest", "--split", "1,0,0"]);
    assert_eq!(s["reannotation_queued"]["too_few_unlikely"], 1);
    assert!(p.assembled().is_empty());
    let shown = p.open_task_endings();
    // The two judged unlikely stay; the likely and gibberish ones give way to unseen endings.
    let expected: BTreeSet<i64> = [
        c.found, c.cands[1], c.cands[4], c.cands[5], c.cands[6], c.cands[7],
    ]
    .into();
    assert_eq!(shown, expected);
}

#[test]
fn an_item_the_pool_cannot_refill_is_reported() {
    let p = Project::new();
    // Six assigned: only one never-shown scored ending is left for three slots.
    let c = p.context("v1", 0, 10, 6);
    let t = p.task(&c, 0, &c.shown());
    p.label(
        t,
        &c,
        "ann",
        (L, BEST),
        [(G, None), (L, SECOND), (G, None), (G, None), (U, None)],
    );
    let s = p.assemble(&["--split", "1,0,0"]);
    assert_eq!(s["cannot_refill"], serde_json::json!(["v1#0"]));
    let open: i64 = p
        .conn
        .query_row("SELECT COUNT(*) FROM tasks WHERE round = 1", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(open, 0);
}

#[test]
fn several_annotators_are_combined_per_ending_with_documented_ties() {
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    let t = p.task(&c, 0, &c.shown());
    // Found: best once, second once → second (a rank needs a strict majority).
    // cands[0]: unlikely vs gibberish → gibberish (judgement ties go to the more severe label).
    p.label(
        t,
        &c,
        "a",
        (L, BEST),
        [(U, None), (U, SECOND), (U, None), (U, None), (U, None)],
    );
    p.label(
        t,
        &c,
        "b",
        (U, SECOND),
        [(G, None), (U, BEST), (U, None), (U, None), (U, None)],
    );
    p.assemble(&["--distractors", "hardest", "--split", "1,0,0"]);
    let a = p.assembled();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].0, "gold1-orig");
    assert_eq!(
        a[0].3,
        vec![c.cands[1], c.cands[2], c.cands[3], c.cands[4]],
        "cands[1] is only second: stays"
    );
    let gold_type: String = p
        .conn
        .query_row("SELECT gold_type FROM assembled", [], |r| r.get(0))
        .unwrap();
    assert_eq!(gold_type, "unlikely");

    // A third annotator makes cands[1] best by majority (2 of 3) and the found ending second.
    p.label(
        t,
        &c,
        "c",
        (L, SECOND),
        [(U, None), (L, BEST), (U, None), (U, None), (U, None)],
    );
    p.assemble(&["--distractors", "hardest", "--split", "1,0,0"]);
    let a = p.assembled();
    assert_eq!(
        a.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
        vec!["gold1-orig", "gen-orig"]
    );
    assert_eq!(
        a[0].3,
        vec![c.cands[0], c.cands[2], c.cands[3], c.cands[4]],
        "unlikely ×2 beats gibberish ×1"
    );
}

#[test]
fn broken_submissions_are_ignored() {
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    let t = p.task(&c, 0, &c.shown());
    let all_neither: Vec<(i64, &str, Option<&str>)> =
        c.shown().iter().map(|&e| (e, G, None)).collect();
    Fixtures::on(&p.conn)
        .insert_submission(t, "flagger", true, &all_neither)
        .unwrap();
    p.label(
        t,
        &c,
        "ann",
        (L, BEST),
        [(L, SECOND), (U, None), (U, None), (U, None), (L, None)],
    );
    let only_broken = p.context("v2", 0, 10, 8);
    let t2 = p.task(&only_broken, 0, &only_broken.shown());
    Fixtures::on(&p.conn)
        .insert_submission(t2, "flagger", true, &[])
        .unwrap();
    let s = p.assemble(&["--split", "1,0,0"]);
    assert_eq!(s["gold_sources"]["gold0-orig"], 1);
    assert_eq!(s["broken"], 1);
    assert_eq!(p.assembled().len(), 1);
}

#[test]
fn unverified_takes_the_assigned_negatives_nearest_the_found_endings_scores() {
    // The assigned negatives score 100, 99, ..., 93 and the found ending 50: the matched choice
    // takes the four lowest, nearest first; --distractors hardest the four highest.
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    let s = p.assemble(&["--unverified", "--split", "1,0,0"]);
    assert_eq!(s["gold_sources"]["unverified"], 1);
    assert_eq!(s["distractors"], "matched");
    assert_eq!(s["matched_on"], serde_json::json!(["ensemble"]));
    let a = p.assembled();
    let nearest_first: Vec<i64> = c.cands[4..8].iter().rev().copied().collect();
    assert_eq!(a[0].3, nearest_first);

    let s = p.assemble(&[
        "--unverified",
        "--distractors",
        "hardest",
        "--split",
        "1,0,0",
    ]);
    assert_eq!(s["distractors"], "hardest");
    assert_eq!(s["matched_on"], serde_json::json!([]));
    let a = p.assembled();
    assert_eq!(a[0].3, c.cands[..4].to_vec());

    // With the sentence model's scores, the match is on both: the negatives nearest the found
    // ending's (50, 0) on the sentence axis win, although 6 and 7 are nearer on the ensemble's.
    let sentence = [3.0, 2.0, 0.1, 0.2, 0.3, 0.4, 9.0, 8.0];
    for (i, s) in sentence.into_iter().enumerate() {
        let ensemble = 50.0 + 0.05 * i as f64;
        p.conn
            .execute(
                "UPDATE af_scores SET score = ?2, sentence_score = ?3 WHERE ending_id = ?1",
                (c.cands[7 - i], ensemble, s),
            )
            .unwrap();
    }
    p.conn
        .execute(
            "UPDATE af_scores SET sentence_score = 0.0 WHERE ending_id = ?1",
            [c.found],
        )
        .unwrap();
    p.assemble(&["--unverified", "--split", "1,0,0"]);
    let mut chosen = p.assembled()[0].3.clone();
    chosen.sort_unstable();
    assert_eq!(chosen, c.cands[2..6].to_vec());

    // With the word-level heads' style scores as well, on all three: the negative nearest on
    // the sentence axis but far off on style gives way to the next nearest.
    p.conn
        .execute("UPDATE af_scores SET style_score = 0.0", [])
        .unwrap();
    p.conn
        .execute(
            "UPDATE af_scores SET style_score = 5.0 WHERE ending_id = ?1",
            [c.cands[5]],
        )
        .unwrap();
    let s = p.assemble(&["--unverified", "--split", "1,0,0"]);
    assert_eq!(
        s["matched_on"],
        serde_json::json!(["ensemble", "sentence", "style"])
    );
    let mut chosen = p.assembled()[0].3.clone();
    chosen.sort_unstable();
    assert_eq!(chosen, [&c.cands[2..5], &c.cands[6..7]].concat());
    let (verified, gold_type): (i64, Option<String>) = p
        .conn
        .query_row("SELECT verified, gold_type FROM assembled", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((verified, gold_type), (0, None));
}

fn splits(p: &Project) -> BTreeMap<String, String> {
    p.conn
        .prepare("SELECT grp, split FROM splits")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn splits_keep_groups_whole_and_are_stable() {
    let p = Project::new();
    let mut ctxs = Vec::new();
    for g in 0..30 {
        for i in 0..3 {
            ctxs.push(p.context(&format!("vid{g:02}"), i, 8, 6));
        }
    }
    // Every item labelled "generation best, found second" to check fn. 5 across splits.
    for c in &ctxs {
        let t = p.task(c, 0, &c.shown());
        p.label(
            t,
            c,
            "ann",
            (L, SECOND),
            [(L, BEST), (U, None), (U, None), (U, None), (L, None)],
        );
    }
    let s = p.assemble(&["--seed", "3"]);
    let first = splits(&p);
    assert_eq!(first.len(), 30);
    let by_example: Vec<(String, String)> = p
        .conn
        .prepare("SELECT x.grp, a.split FROM assembled a JOIN examples x ON x.id = a.example_id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (g, split) in &by_example {
        seen.entry(g.clone()).or_default().insert(split.clone());
    }
    assert!(
        seen.values().all(|s| s.len() == 1),
        "a group straddles splits: {seen:?}"
    );
    let gen_splits: BTreeSet<String> = p
        .conn
        .prepare("SELECT DISTINCT split FROM assembled WHERE gold_source = 'gen-orig'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(gen_splits, BTreeSet::from(["train".to_string()]));
    for name in ["train", "val", "test"] {
        assert!(
            s["groups"][name].as_u64().unwrap() > 0,
            "{name} is empty: {s}"
        );
    }
    // Re-running replaces the assembly (no duplicates) and keeps every group where it was,
    // also after new groups arrive.
    let n = p.assembled().len();
    p.assemble(&["--seed", "3"]);
    assert_eq!(p.assembled().len(), n);
    p.context("vid99", 0, 8, 6);
    p.assemble(&["--seed", "3"]);
    let after = splits(&p);
    for (g, split) in &first {
        assert_eq!(&after[g], split);
    }
    // Another seed gives another split.
    p.assemble(&["--seed", "4"]);
    assert_ne!(splits(&p), after);
}

/// Contexts from two groups: as many groups as splits minus one, so one split gets none.
fn two_group_project() -> Project {
    let p = Project::new();
    for g in 0..2 {
        for i in 0..10 {
            p.context(&format!("vid{g:02}"), i, 10, 8);
        }
    }
    p
}

#[test]
fn a_split_that_would_be_empty_is_an_error_that_names_the_fix() {
    let p = two_group_project();
    let err = fails(&["assemble", p.p(), "--unverified", "--seed", "1"]);
    assert!(
        err.contains("the test split would be empty")
            && err.contains("of the project's 2 groups")
            && err.contains("more groups")
            && err.contains("--split 0.9,0.1,0"),
        "{err}"
    );
    assert!(p.assembled().is_empty(), "nothing half-written");
}

#[test]
fn an_explicitly_empty_split_exports_without_files_for_it() {
    let p = two_group_project();
    let summary = p.assemble(&["--unverified", "--seed", "1", "--split", "0.9,0.1,0"]);
    assert_eq!(
        summary["examples"]["test"].as_u64().unwrap_or(0),
        0,
        "{summary}"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dataset");
    let printed = ok(&["export", p.p(), "--out", out.to_str().unwrap()]);
    for file in ["test.csv", "jsonl/test.jsonl", "test_full.csv"] {
        assert!(
            !out.join(file).exists(),
            "{file} written for an empty split"
        );
    }
    assert!(!dir.path().join("dataset-test-answers.csv").exists());
    assert!(!printed.contains("test answers"), "{printed}");
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(!card.contains("split: test"), "{card}");
    assert!(card.contains("The test split has no examples"), "{card}");
    for task in ["lm_eval/afkit_swag.yaml", "lm_eval/afkit_hellaswag.yaml"] {
        let yaml = std::fs::read_to_string(out.join(task)).unwrap();
        assert!(
            !yaml.contains("test.") && yaml.contains("test_split: null"),
            "{yaml}"
        );
    }
}

#[test]
fn the_card_is_named_after_the_project_or_export_name() {
    let p = unverified_project(6);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dataset");
    let card = |extra: &[&str]| {
        let mut args = vec!["export", p.p(), "--out", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        ok(&args);
        std::fs::read_to_string(out.join("README.md")).unwrap()
    };
    let named = card(&["--name", "How-to endings"]);
    assert!(
        named.starts_with("---\npretty_name: \"How-to endings\"\n")
            && named.contains("# Dataset card: How-to endings\n"),
        "{named}"
    );
    assert!(card(&[]).starts_with("---\npretty_name: \"p\"\n"));
    let err = fails(&[
        "export",
        p.p(),
        "--out",
        out.to_str().unwrap(),
        "--name",
        " ",
    ]);
    assert!(err.contains("--name"), "{err}");
}

const FILES: [&str; 11] = [
    "train.csv",
    "val.csv",
    "test.csv",
    "train_full.csv",
    "val_full.csv",
    "jsonl/train.jsonl",
    "jsonl/val.jsonl",
    "jsonl/test.jsonl",
    "lm_eval/afkit_swag.yaml",
    "lm_eval/afkit_hellaswag.yaml",
    "README.md",
];

/// Where the answers of the export at `dir` go: beside it, named after it.
fn answers_beside(dir: &Path) -> PathBuf {
    dir.with_file_name(format!(
        "{}-test-answers.csv",
        dir.file_name().unwrap().to_str().unwrap()
    ))
}

/// The export at `a` has SWAG's regular and full CSV headers, and its published test split
/// withholds the labels that the answers file beside it holds.
fn check_csv_files(a: &Path) {
    let train = String::from_utf8(read(&a.join("train.csv"))).unwrap();
    assert!(train.starts_with(",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label,could-be-right\n0,"));
    let full = String::from_utf8(read(&a.join("val_full.csv"))).unwrap();
    assert!(full.starts_with(
        "video-id,fold-ind,startphrase,gold-ending,distractor-0,distractor-1,distractor-2,distractor-3,\
         gold-source,gold-type,distractor-0-type,distractor-1-type,distractor-2-type,distractor-3-type,sent1,sent2\n"
    ));
    // The published test split withholds its labels; the answers file beside it has them.
    let test = String::from_utf8(read(&a.join("test.csv"))).unwrap();
    let labelled = String::from_utf8(read(&answers_beside(a))).unwrap();
    assert!(test.lines().skip(1).all(|l| l.ends_with(",-1,0")), "{test}");
    // (everything before the label, the label, the could-be-right flag)
    let cut = |line: &str| {
        let (rest, flag) = line.rsplit_once(',').unwrap();
        let (body, label) = rest.rsplit_once(',').unwrap();
        (body.to_string(), label.to_string(), flag.to_string())
    };
    assert_eq!(test.lines().count(), labelled.lines().count());
    for (hidden, known) in test.lines().zip(labelled.lines()).skip(1) {
        let (hidden, known) = (cut(hidden), cut(known));
        assert_eq!((&hidden.0, &hidden.2), (&known.0, &known.2));
        assert!(["0", "1", "2", "3"].contains(&known.1.as_str()));
    }
}

/// The export's JSONL rows carry afkit's and HellaSwag's fields, the gold ending at its label.
fn check_jsonl(a: &Path) {
    let jsonl = String::from_utf8(read(&a.join("jsonl/val.jsonl"))).unwrap();
    let first: Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    for key in [
        "id",
        "group",
        "sent1",
        "sent2",
        "startphrase",
        "endings",
        "label",
        "gold_source",
        "verified",
        "could_be_right",
        "activity_label",
        "ctx_a",
        "ctx_b",
        "ctx",
    ] {
        assert!(first.get(key).is_some(), "jsonl lacks {key}");
    }
    assert_eq!(first["ctx_a"], first["sent1"]);
    assert_eq!(first["ctx"], first["startphrase"]);
    assert_eq!(
        first["endings"][first["label"].as_u64().unwrap() as usize]
            .as_str()
            .unwrap(),
        {
            let ext = first["id"].as_str().unwrap();
            let index = ext.rsplit('#').next().unwrap();
            format!("sits down at table {index}.")
        }
    );
}

/// The export's dataset card has its YAML header, its configs, how to evaluate, and where the
/// questions came from.
fn check_card(a: &Path) {
    let card = String::from_utf8(read(&a.join("README.md"))).unwrap();
    for needle in [
        "---\npretty_name: \"p\"\nlicense: \"unknown\"\n",
        "# Dataset card: p\n",
        "  - split: validation\n    path: val_full.csv\n  keep_default_na: false\n",
        "lm_eval --model MODEL --model_args ARGS --include_path lm_eval --tasks afkit_swag,afkit_hellaswag",
        "b179c952",
        "SmolLM2",
        "gap found − generated = +1.0000",
        "\"seed\":1",
        "Apache-2.0",
        "| ensemble |",
    ] {
        assert!(card.contains(needle), "card lacks {needle:?}:\n{card}");
    }
}

#[test]
fn export_is_complete_deterministic_and_replaces_atomically() {
    let p = unverified_project(20);
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    ok(&["export", p.p(), "--out", a.to_str().unwrap()]);
    ok(&["export", p.p(), "--out", b.to_str().unwrap()]);
    for f in FILES {
        assert_eq!(
            read(&a.join(f)),
            read(&b.join(f)),
            "{f} differs between two exports"
        );
    }
    assert_eq!(read(&answers_beside(&a)), read(&answers_beside(&b)));
    assert!(
        !a.join("test_full.csv").exists(),
        "the full test CSV names the answers"
    );
    check_csv_files(&a);
    check_jsonl(&a);
    check_card(&a);
    // The export is recorded.
    let n: i64 = p
        .conn
        .query_row("SELECT COUNT(*) FROM exports", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2);
    // Re-exporting into an existing export replaces its files and keeps the user's; a directory
    // with other files gets the export beside them.
    std::fs::write(a.join("stale.txt"), "old").unwrap();
    ok(&["export", p.p(), "--out", a.to_str().unwrap(), "--seed", "9"]);
    assert_eq!(std::fs::read_to_string(a.join("stale.txt")).unwrap(), "old");
    let foreign = dir.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    ok(&["export", p.p(), "--out", foreign.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(foreign.join("notes.txt")).unwrap(),
        "mine"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        // The ledger of the files afkit wrote stays; nothing else of afkit's may.
        .filter(|n| n.starts_with(".afkit") && n != ".afkit-written.json")
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary directories left behind: {leftovers:?}"
    );
}

#[test]
fn random_negatives_export_the_same_contexts_with_pool_distractors() {
    let p = unverified_project(10);
    let dir = tempfile::tempdir().unwrap();
    let adv = dir.path().join("adv");
    let rnd = dir.path().join("rnd");
    ok(&["export", p.p(), "--out", adv.to_str().unwrap()]);
    ok(&[
        "export",
        p.p(),
        "--out",
        rnd.to_str().unwrap(),
        "--negatives",
        "random",
        "--seed",
        "2",
    ]);
    let rows = |dir: &Path| -> Vec<Value> {
        let mut all = Vec::new();
        for split in ["train", "val"] {
            let text = String::from_utf8(read(&dir.join(format!("jsonl/{split}.jsonl")))).unwrap();
            all.extend(
                text.lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap()),
            );
        }
        all
    };
    let (a, r) = (rows(&adv), rows(&rnd));
    assert_eq!(a.len(), r.len());
    let mut differ = 0;
    for (x, y) in a.iter().zip(&r) {
        assert_eq!(x["id"], y["id"]);
        let gold_x = &x["endings"][x["label"].as_u64().unwrap() as usize];
        let gold_y = &y["endings"][y["label"].as_u64().unwrap() as usize];
        assert_eq!(gold_x, gold_y);
        let set = |v: &Value| -> BTreeSet<String> {
            v["endings"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap().to_string())
                .collect()
        };
        differ += usize::from(set(x) != set(y));
        assert!(
            set(y)
                .iter()
                .filter(|e| e.starts_with("does thing"))
                .count()
                == 3
        );
    }
    assert!(
        differ > a.len() / 2,
        "random distractors should mostly differ from the AF ones"
    );
    let card = String::from_utf8(read(&rnd.join("README.md"))).unwrap();
    assert!(card.contains("Negatives: **random**"));
}

/// A SWAG-format dataset of synthetic questions. `tell` puts a marker word in every gold ending;
/// `shuffle_labels` then points the label at a random option instead of the gold.
fn synthetic_dataset(dir: &Path, tell: bool, shuffle_labels: bool, seed: Seed) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.value());
    let verbs = [
        "walks", "jumps", "sits", "waves", "runs", "talks", "laughs", "spins", "rolls", "climbs",
    ];
    let things = [
        "the ball",
        "a rope",
        "the table",
        "a dog",
        "the door",
        "a hat",
        "the car",
        "a cup",
    ];
    let places = [
        "on stage",
        "in the park",
        "at home",
        "near a lake",
        "on the mat",
        "in a gym",
    ];
    for (split, n) in [("train", 600), ("val", 300)] {
        let mut w = csv::Writer::from_path(dir.join(format!("{split}.csv"))).unwrap();
        w.write_record(REGULAR_COLUMNS).unwrap();
        for i in 0..n {
            let mut ending = |gold: bool| {
                let mut e = format!(
                    "{} {} {}",
                    verbs[rng.random_range(0..verbs.len())],
                    things[rng.random_range(0..things.len())],
                    places[rng.random_range(0..places.len())]
                );
                if gold && tell {
                    e.push_str(" happily");
                }
                e.push('.');
                e
            };
            let mut options = vec![
                (true, ending(true)),
                (false, ending(false)),
                (false, ending(false)),
                (false, ending(false)),
            ];
            options.shuffle(&mut rng);
            let mut label = options.iter().position(|o| o.0).unwrap();
            if shuffle_labels {
                label = rng.random_range(0..4);
            }
            let sent1 = format!("Someone is seen in clip {i}.");
            let mut rec = vec![
                format!("v{i}"),
                "0".into(),
                format!("{sent1} They"),
                sent1,
                "They".into(),
                "unverified".into(),
            ];
            rec.extend(options.into_iter().map(|o| o.1));
            rec.push(label.to_string());
            w.write_record(&rec).unwrap();
        }
        w.flush().unwrap();
    }
}

/// The audit's `--json` report, its timings left out (the one part that differs between runs).
fn audit_json(dir: &Path) -> Value {
    let mut v: Value =
        serde_json::from_str(&ok(&["audit", dir.to_str().unwrap(), "--json", "--no-knn"])).unwrap();
    let timings = v.as_object_mut().unwrap().remove("timings").unwrap();
    assert!(timings
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "ngram_end"));
    v
}

#[test]
fn audit_finds_a_planted_tell_and_not_a_shuffled_label() {
    let planted = tempfile::tempdir().unwrap();
    synthetic_dataset(planted.path(), true, false, Seed::new(1));
    let a = audit_json(planted.path());
    assert!(a["ngram_end"].as_f64().unwrap() > 0.95, "{a}");
    assert!(a["ngram_s2"].as_f64().unwrap() > 0.95, "{a}");
    assert!(a["ngram_ctx"].as_f64().unwrap() > 0.9, "{a}");
    assert_eq!(a["random"].as_f64().unwrap(), 0.25);
    // The tell makes gold endings the longest ones.
    assert!(a["longest"].as_f64().unwrap() > a["shortest"].as_f64().unwrap());
    let ppmi = a["ppmi"].as_array().unwrap();
    assert_eq!(ppmi[0]["word"], "happily");
    assert_eq!(ppmi[0]["label"], "gold");
    assert!(a["knn"]["skipped"].is_string());
    for f in ["audit.md", "audit.json", "accuracy.png", "ppmi.png"] {
        assert!(planted.path().join("audit").join(f).exists(), "{f} missing");
    }

    let shuffled = tempfile::tempdir().unwrap();
    synthetic_dataset(shuffled.path(), true, true, Seed::new(2));
    let s = audit_json(shuffled.path());
    for key in ["ngram_end", "ngram_s2", "ngram_ctx", "shortest", "longest"] {
        let acc = s[key].as_f64().unwrap();
        assert!(
            (0.17..0.33).contains(&acc),
            "{key} = {acc} on shuffled labels"
        );
    }
    // Same input, same report.
    assert_eq!(audit_json(shuffled.path()), s);
}

#[test]
fn score_grades_line_and_jsonl_predictions() {
    let dir = tempfile::tempdir().unwrap();
    let split = dir.path().join("val.csv");
    std::fs::write(
        &split,
        REGULAR_COLUMNS.join(",")
            + "\n\
         a,0,x y,x,y,unverified,e0,e1,e2,e3,0\n\
         b,0,x y,x,y,unverified,e0,e1,e2,e3,3\n\
         c,0,x y,x,y,unverified,e0,e1,e2,e3,1\n\
         d,0,x y,x,y,unverified,e0,e1,e2,e3,2\n",
    )
    .unwrap();
    let preds = dir.path().join("preds.txt");
    std::fs::write(&preds, "0\n3\n1\n0\n").unwrap();
    let s: Value = serde_json::from_str(&ok(&[
        "score",
        split.to_str().unwrap(),
        preds.to_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    assert_eq!(s["accuracy"], 0.75);
    assert!(
        ok(&["score", split.to_str().unwrap(), preds.to_str().unwrap()])
            .contains("accuracy: 0.7500")
    );
    let jl = dir.path().join("preds.jsonl");
    std::fs::write(&jl, "{\"id\": 3, \"label\": 2}\n{\"id\": \"0\", \"label\": 1}\n{\"id\": 1, \"label\": 3}\n{\"id\": 2, \"label\": 1}\n").unwrap();
    let s: Value = serde_json::from_str(&ok(&[
        "score",
        split.to_str().unwrap(),
        jl.to_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    assert_eq!(s["accuracy"], 0.75);
    std::fs::write(&preds, "0\n3\n").unwrap();
    let out = afkit(&["score", split.to_str().unwrap(), preds.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 predictions for 4 questions"));
    std::fs::write(&preds, "0\n3\n7\n1\n").unwrap();
    let out = afkit(&["score", split.to_str().unwrap(), preds.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 3"));
}

#[test]
fn exported_csvs_ingest_back_to_the_same_examples() {
    let p = unverified_project(12);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("export");
    ok(&["export", p.p(), "--out", out.to_str().unwrap()]);
    let back = dir.path().join("back.sqlite");
    ok(&["init", back.to_str().unwrap()]);
    let csv = |name: &str| out.join(name).to_str().unwrap().to_string();
    let answers = dir.path().join("export-test-answers.csv");
    let (train, val, test) = (
        csv("train.csv"),
        csv("val.csv"),
        answers.to_str().unwrap().to_string(),
    );
    let ingest = afkit(&[
        "ingest",
        back.to_str().unwrap(),
        "--format",
        "swag-csv",
        &train,
        &val,
        &test,
    ]);
    let stderr = String::from_utf8_lossy(&ingest.stderr);
    assert!(ingest.status.success(), "ingest failed: {stderr}");
    assert_eq!(example_texts(&back), example_texts(&p.path));
    // The full CSVs describe the same examples: ingesting them adds nothing.
    let full: Vec<String> = ["train_full.csv", "val_full.csv"]
        .iter()
        .map(|f| csv(f))
        .collect();
    let mut args = vec!["ingest", back.to_str().unwrap(), "--format", "swag-csv"];
    args.extend(full.iter().map(String::as_str));
    ok(&args);
    assert_eq!(example_texts(&back).len(), 24);
}

#[test]
fn status_tells_pools_too_small_for_af_from_pools_added_after_it() {
    let p = Project::new();
    p.context("v1", 0, 10, 8); // filtered by the run (k = 8)
    p.context("v2", 0, 10, 0); // a full pool the run never saw: stale
    p.context("v3", 0, 5, 0); // fewer than k candidates: left out, not stale
    let status: Value = serde_json::from_str(&ok(&["status", p.p(), "--json"])).unwrap();
    assert_eq!(status["af_stale_contexts"], 1);
    assert_eq!(status["af_too_few_candidates"], 1);
    let text = ok(&["status", p.p()]);
    assert!(
        text.contains("1 context got a pool after the last AF run"),
        "{text}"
    );
    assert!(
        text.contains("1 context has fewer candidate endings than AF's k"),
        "{text}"
    );
}

/// Makes the first `n` assigned negatives of `c` as likely as its found ending (the fixture's
/// generator gives found endings -2.0 and negatives -3.0 per token): they could be right.
fn make_risky(p: &Project, c: &Ctx, n: usize) {
    for &e in &c.cands[..n] {
        Fixtures::on(&p.conn).set_lp_cond(e, -1.5).unwrap();
    }
}

/// With `--could-be-right avoid`, the safe negatives of contexts 0 to 2 (`ctxs`) become
/// distractors first, hardest first, and then those that could be right; the one question
/// still showing one is flagged, and the printed summary says so.
fn check_avoided_last(p: &Project, ctxs: &[Ctx]) {
    let avoid = ["--could-be-right", "avoid"];
    let s = p.assemble(&[
        "--unverified",
        "--seed",
        "1",
        "--distractors",
        "hardest",
        avoid[0],
        avoid[1],
    ]);
    assert_eq!(s["could_be_right_flagged"], 1, "{s}");
    assert_eq!(s["could_be_right_left_out"], 0);
    assert_eq!(s["unjudged_negatives"], 0);
    let assembled = p.assembled();
    let of = |c: &Ctx| assembled.iter().find(|a| a.1 == c.found).unwrap().3.clone();
    // Hardest first among the safe ones, then among those that could be right.
    assert_eq!(
        of(&ctxs[0]),
        vec![
            ctxs[0].cands[6],
            ctxs[0].cands[7],
            ctxs[0].cands[0],
            ctxs[0].cands[1]
        ]
    );
    assert_eq!(
        of(&ctxs[1]),
        ctxs[1].cands[5..8]
            .iter()
            .chain(&ctxs[1].cands[..1])
            .copied()
            .collect::<Vec<_>>()
    );
    assert_eq!(of(&ctxs[2]), ctxs[2].cands[..4].to_vec());
    let printed = ok(&[
        "assemble",
        p.p(),
        "--unverified",
        "--seed",
        "1",
        avoid[0],
        avoid[1],
    ]);
    assert!(printed.contains("could be right"), "{printed}");
    assert!(
        printed.contains(": 1 flagged of 24 questions, 0 left out"),
        "{printed}"
    );
}

/// The export of `p` marks its one flagged question (the JSONL field, the CSV's last column,
/// the card), and the audit of that export reports the flagged share of what it read.
fn check_flag_through_export_and_audit(p: &Project) {
    // The export marks the flagged question: the JSONL field, the CSV's last column, the card.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("export");
    ok(&[
        "export",
        p.p(),
        "--out",
        out.to_str().unwrap(),
        "--with-test-labels",
    ]);
    let mut flagged = Vec::new();
    let mut rows = 0;
    for split in ["train", "val", "test"] {
        let Ok(text) = std::fs::read_to_string(out.join(format!("jsonl/{split}.jsonl"))) else {
            continue;
        };
        for line in text.lines() {
            let row: Value = serde_json::from_str(line).unwrap();
            rows += 1;
            if row["could_be_right"].as_bool().unwrap() {
                flagged.push(row["id"].as_str().unwrap().to_string());
            }
        }
        let csv = std::fs::read_to_string(out.join(format!("{split}.csv"))).unwrap();
        assert!(csv
            .lines()
            .next()
            .unwrap()
            .ends_with(",label,could-be-right"));
    }
    assert_eq!((rows, flagged), (24, vec!["vid00#0".to_string()]));
    let card = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(
        card.contains("Could be right: 1 of 24 unverified examples (4.2%)"),
        "{card}"
    );

    // The audit reports the flagged share of what it read (train and val).
    let audit = audit_json(&out);
    let share = &audit["could_be_right"];
    assert!(share["flagged"].as_u64().unwrap() <= 1, "{share}");
    assert!(share["questions"].as_u64().unwrap() > 0, "{share}");
    let md = std::fs::read_to_string(out.join("audit/audit.md")).unwrap();
    assert!(md.contains("flagged could-be-right by the export"), "{md}");
}

#[test]
fn unverified_questions_take_safe_distractors_first_and_flag_the_rest_through_export_and_audit() {
    let p = Project::new();
    let mut ctxs = Vec::new();
    for g in 0..12 {
        for i in 0..2 {
            ctxs.push(p.context(&format!("vid{g:02}"), i, 10, 8));
        }
    }
    // Context 0: 6 of its 8 negatives could be right, so its question needs one of them;
    // context 1: 5 could be right, which leaves three safe ones; context 2 has none.
    make_risky(&p, &ctxs[0], 6);
    make_risky(&p, &ctxs[1], 5);
    // By default the order stays AF's (here the hardest first) and a question showing one that
    // could be right is flagged: contexts 0 and 1.
    let s = p.assemble(&["--unverified", "--seed", "1", "--distractors", "hardest"]);
    assert_eq!(s["could_be_right_flagged"], 2, "{s}");
    assert_eq!(
        p.assembled()
            .iter()
            .find(|a| a.1 == ctxs[0].found)
            .unwrap()
            .3,
        ctxs[0].cands[..4].to_vec()
    );
    check_avoided_last(&p, &ctxs);
    check_flag_through_export_and_audit(&p);

    // Left out instead of flagged: the question is gone, and so is its flag.
    let s = p.assemble(&[
        "--unverified",
        "--seed",
        "1",
        "--could-be-right",
        "leave-out",
    ]);
    assert_eq!(s["could_be_right_left_out"], 1, "{s}");
    assert_eq!(s["could_be_right_flagged"], 0);
    assert_eq!(p.assembled().len(), 23);
    assert!(p.assembled().iter().all(|a| a.1 != ctxs[0].found));
    let help = ok(&["assemble", "--help"]);
    assert!(help.contains("--could-be-right"), "{help}");
}

#[test]
fn verified_questions_are_never_flagged() {
    let p = Project::new();
    let c = p.context("v1", 0, 10, 8);
    make_risky(&p, &c, 8);
    let task = p.task(&c, 0, &c.shown());
    p.label(
        task,
        &c,
        "ann",
        (L, BEST),
        [(L, SECOND), (U, None), (U, None), (U, None), (U, None)],
    );
    let s = p.assemble(&["--split", "1,0,0", "--distractors", "hardest"]);
    assert_eq!(s["gold_sources"]["gold0-orig"], 1, "{s}");
    assert_eq!(s["could_be_right_flagged"], 0);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("export");
    ok(&["export", p.p(), "--out", out.to_str().unwrap()]);
    let row: Value = serde_json::from_str(
        std::fs::read_to_string(out.join("jsonl/train.jsonl"))
            .unwrap()
            .trim(),
    )
    .unwrap();
    assert_eq!(row["could_be_right"], false);
}
