//! Question reviews: after assembly a reviewer reads a question as a test taker sees it (the
//! context and its four endings in a shuffled order, the real one not marked), picks the ending
//! that follows and names any other that could also follow and any that is broken.
//!
//! The annotation rounds judge each ending on its own beside the found one; read as a question,
//! more wrong answers turn out to fit as well. A review's verdicts are vetoes: an ending a
//! reviewer named plausible or broken, or picked instead of the found ending, is never again a
//! distractor of its context ([`Store::review_vetoes`]), whatever the annotators said.
//! Assembly then shows the next candidate, and the changed question goes out for review again (`afkit crowd review-export`).

use std::collections::{HashMap, HashSet};

use anyhow::{ensure, Result};
use rusqlite::{params, OptionalExtension};

use crate::{now, Store};

/// Endings of a reviewed question: the found one and three distractors.
pub const OPTIONS: usize = 4;

/// What a reviewer said of an ending other than the one they picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flag {
    /// It could also follow the context: a second right answer.
    Plausible,
    /// Ungrammatical, a non-word or a wrong word form, cut off or garbled.
    Broken,
}

impl Flag {
    fn as_str(self) -> &'static str {
        match self {
            Flag::Plausible => "plausible",
            Flag::Broken => "broken",
        }
    }
}

/// One question as it went out for review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewItem {
    pub id: i64,
    pub example_id: i64,
    /// The endings in the order shown (A to D).
    pub endings: [i64; OPTIONS],
    /// Reviews wanted.
    pub reviewers: i64,
    /// Reviews stored.
    pub reviewed: i64,
}

impl ReviewItem {
    /// Whether the item shows exactly these endings, in any order.
    pub fn shows(&self, endings: &[i64; OPTIONS]) -> bool {
        let mut mine = self.endings;
        let mut theirs = *endings;
        mine.sort_unstable();
        theirs.sort_unstable();
        mine == theirs
    }
}

/// A review item with the texts its reviewer read.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewItemView {
    pub item: ReviewItem,
    pub sent1: String,
    pub sent2: String,
    /// The endings' texts, in the item's order.
    pub texts: [String; OPTIONS],
}

/// A review to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewReview {
    pub item_id: i64,
    pub reviewer: String,
    /// The ending the reviewer picked as the one that follows.
    pub pick: i64,
    /// Verdicts on the other endings.
    pub flags: Vec<(i64, Flag)>,
    /// When it was submitted; `None` = now.
    pub submitted_at: Option<String>,
}

/// How the stored reviews went, for summaries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReviewTally {
    pub items: usize,
    pub reviews: usize,
    /// Reviews whose pick is the found ending.
    pub found_picked: usize,
    /// Endings set aside as distractors, by the first reason found: picked over the found
    /// ending, named plausible, named broken.
    pub vetoed_picked: usize,
    pub vetoed_plausible: usize,
    pub vetoed_broken: usize,
    /// Found endings a reviewer named broken (kept: the found ending is the question).
    pub found_broken: usize,
}

const ITEM_COLUMNS: &str = "i.id, i.example_id, i.ending_a, i.ending_b, i.ending_c, i.ending_d, \
     i.reviewers, (SELECT COUNT(*) FROM reviews r WHERE r.item_id = i.id)";

fn item_row(r: &rusqlite::Row) -> rusqlite::Result<ReviewItem> {
    Ok(ReviewItem {
        id: r.get(0)?,
        example_id: r.get(1)?,
        endings: [r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?],
        reviewers: r.get(6)?,
        reviewed: r.get(7)?,
    })
}

/// Every verdict that sets an ending aside, one row each (`example_id`, `ending_id`, `reason`:
/// 0 picked over the ending shown as the real one, 1 named plausible, 2 named broken); the
/// real endings among them are the callers' to leave out.
const VETOES: &str = "SELECT i.example_id, r.pick AS ending_id, 0 AS reason FROM reviews r
       JOIN review_items i ON i.id = r.item_id
     UNION ALL
     SELECT i.example_id, f.ending_id, CASE f.flag WHEN 'plausible' THEN 1 ELSE 2 END
       FROM review_flags f
       JOIN reviews r ON r.id = f.review_id
       JOIN review_items i ON i.id = r.item_id";

impl Store {
    /// Every review item of a context, the oldest first.
    pub fn review_items_of(&self, example_id: i64) -> Result<Vec<ReviewItem>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {ITEM_COLUMNS} FROM review_items i WHERE i.example_id = ?1 ORDER BY i.id"
        ))?;
        let items = stmt
            .query_map([example_id], item_row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(items)
    }

    /// Stores a review item: the context's question with its endings in the order shown.
    pub fn create_review_item(
        &self,
        example_id: i64,
        endings: [i64; OPTIONS],
        reviewers: i64,
    ) -> Result<i64> {
        ensure!(reviewers > 0, "a review item wants at least one reviewer");
        self.conn
            .prepare_cached(
                "INSERT INTO review_items(example_id, ending_a, ending_b, ending_c, ending_d,
                     reviewers, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                example_id,
                endings[0],
                endings[1],
                endings[2],
                endings[3],
                reviewers,
                now()
            ])?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Raises the reviews an item wants to `reviewers` (never lowers them).
    pub fn want_reviews(&self, item_id: i64, reviewers: i64) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE review_items SET reviewers = MAX(reviewers, ?2) WHERE id = ?1")?
            .execute(params![item_id, reviewers])?;
        Ok(())
    }

    /// A review item with its context's and endings' texts; `None` when there is no such item.
    pub fn review_item(&self, id: i64) -> Result<Option<ReviewItemView>> {
        let conn = &self.conn;
        let Some(item) = conn
            .prepare_cached(&format!(
                "SELECT {ITEM_COLUMNS} FROM review_items i WHERE i.id = ?1"
            ))?
            .query_row([id], item_row)
            .optional()?
        else {
            return Ok(None);
        };
        let (sent1, sent2) = conn
            .prepare_cached("SELECT sent1, sent2 FROM examples WHERE id = ?1")?
            .query_row([item.example_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let mut text = conn.prepare_cached("SELECT text FROM endings WHERE id = ?1")?;
        let mut texts: [String; OPTIONS] = Default::default();
        for (slot, ending) in texts.iter_mut().zip(item.endings) {
            *slot = text.query_row([ending], |r| r.get(0))?;
        }
        Ok(Some(ReviewItemView {
            item,
            sent1,
            sent2,
            texts,
        }))
    }

    /// Whether `reviewer` already reviewed the item.
    pub fn has_reviewed(&self, item_id: i64, reviewer: &str) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT 1 FROM reviews WHERE item_id = ?1 AND reviewer = ?2")?
            .exists(params![item_id, reviewer])?)
    }

    /// Stores a review and its verdicts (the caller provides the transaction).
    pub fn insert_review(&self, review: &NewReview) -> Result<i64> {
        let at = review.submitted_at.clone().unwrap_or_else(now);
        self.conn
            .prepare_cached(
                "INSERT INTO reviews(item_id, reviewer, pick, submitted_at) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![review.item_id, review.reviewer, review.pick, at])?;
        let id = self.conn.last_insert_rowid();
        let mut flag = self.conn.prepare_cached(
            "INSERT OR IGNORE INTO review_flags(review_id, ending_id, flag) VALUES (?1, ?2, ?3)",
        )?;
        for (ending, f) in &review.flags {
            flag.execute(params![id, ending, f.as_str()])?;
        }
        Ok(id)
    }

    /// The endings reviews set aside, by context: never a distractor of it again. Those a
    /// reviewer picked instead of the found ending, or named plausible or broken; never the
    /// found ending itself.
    pub fn review_vetoes(&self) -> Result<HashMap<i64, HashSet<i64>>> {
        let mut vetoes: HashMap<i64, HashSet<i64>> = HashMap::new();
        for (example, ending, _) in self.vetoed_endings()? {
            vetoes.entry(example).or_default().insert(ending);
        }
        Ok(vetoes)
    }

    /// The endings that passed review, by context, each with the number of reviews it passed:
    /// shown as a wrong answer in reviewed questions of that context and never vetoed (see
    /// [`Store::review_vetoes`]). A verdict is on one ending of one context, so an ending that
    /// passed needs no review again when assembly shows it beside other distractors.
    pub fn review_passed(&self) -> Result<HashMap<i64, HashMap<i64, i64>>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT i.example_id, e.id, COUNT(*) FROM review_items i
               JOIN reviews r ON r.item_id = i.id
               JOIN endings e ON e.id IN (i.ending_a, i.ending_b, i.ending_c, i.ending_d)
             WHERE e.is_gold = 0
               AND (i.example_id, e.id) NOT IN (SELECT example_id, ending_id FROM ({VETOES}))
             GROUP BY i.example_id, e.id"
        ))?;
        let mut passed: HashMap<i64, HashMap<i64, i64>> = HashMap::new();
        for row in stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))? {
            let (example, ending, reviews) = row?;
            passed.entry(example).or_default().insert(ending, reviews);
        }
        Ok(passed)
    }

    /// (context, ending, reason) of every vetoed ending, in that order: the first reason of
    /// picked (0), named plausible (1), named broken (2).
    fn vetoed_endings(&self) -> Result<Vec<(i64, i64, i64)>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT v.example_id, v.ending_id, MIN(v.reason) FROM ({VETOES}) v
             JOIN endings e ON e.id = v.ending_id
             WHERE e.is_gold = 0
             GROUP BY v.example_id, v.ending_id
             ORDER BY v.example_id, v.ending_id",
        ))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Counts of the stored review items, reviews and vetoes.
    pub fn review_tally(&self) -> Result<ReviewTally> {
        let count = |sql: &str| -> Result<usize> {
            Ok(self.conn.query_row(sql, [], |r| r.get::<_, i64>(0))? as usize)
        };
        let mut tally = ReviewTally {
            items: count("SELECT COUNT(*) FROM review_items")?,
            reviews: count("SELECT COUNT(*) FROM reviews")?,
            found_picked: count(
                "SELECT COUNT(*) FROM reviews r JOIN endings e ON e.id = r.pick WHERE e.is_gold = 1",
            )?,
            found_broken: count(
                "SELECT COUNT(DISTINCT f.ending_id) FROM review_flags f
                 JOIN endings e ON e.id = f.ending_id WHERE e.is_gold = 1 AND f.flag = 'broken'",
            )?,
            ..ReviewTally::default()
        };
        for (_, _, reason) in self.vetoed_endings()? {
            match reason {
                0 => tally.vetoed_picked += 1,
                1 => tally.vetoed_plausible += 1,
                _ => tally.vetoed_broken += 1,
            }
        }
        Ok(tally)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use afkit_engine::seed::Seed;

    /// A project of one context with five generated endings: (store, context, found ending,
    /// the generated endings).
    fn one_context(dir: &std::path::Path) -> (Store, i64, i64, Vec<i64>) {
        let mut store = Store::create(&dir.join("p.sqlite")).unwrap();
        store.synthetic_af_project(1, 5, Seed::new(1)).unwrap();
        let ids = |gold: bool| -> Vec<i64> {
            let mut stmt = store
                .conn
                .prepare("SELECT id FROM endings WHERE is_gold = ?1 ORDER BY id")
                .unwrap();
            let rows = stmt.query_map([gold], |r| r.get(0)).unwrap();
            rows.map(Result::unwrap).collect()
        };
        let (found, others) = (ids(true)[0], ids(false));
        let example = store
            .conn
            .query_row("SELECT id FROM examples", [], |r| r.get(0))
            .unwrap();
        (store, example, found, others)
    }

    #[test]
    fn reviews_veto_the_endings_they_flag_or_pick_but_never_the_found_one() {
        let dir = tempfile::tempdir().unwrap();
        let (store, example, found, others) = one_context(dir.path());
        let shown = [others[0], found, others[1], others[2]];
        let item = store.create_review_item(example, shown, 2).unwrap();
        let first = NewReview {
            item_id: item,
            reviewer: "r1".into(),
            pick: found,
            flags: vec![(others[1], Flag::Plausible), (found, Flag::Broken)],
            submitted_at: None,
        };
        store.insert_review(&first).unwrap();
        let second = NewReview {
            item_id: item,
            reviewer: "r2".into(),
            pick: others[2],
            flags: vec![(others[2], Flag::Broken), (others[1], Flag::Broken)],
            submitted_at: None,
        };
        store.insert_review(&second).unwrap();
        assert!(store.has_reviewed(item, "r1").unwrap());
        assert!(!store.has_reviewed(item, "r3").unwrap());

        let vetoes = store.review_vetoes().unwrap();
        assert_eq!(vetoes[&example], HashSet::from([others[1], others[2]]));
        let tally = store.review_tally().unwrap();
        assert_eq!(
            tally,
            ReviewTally {
                items: 1,
                reviews: 2,
                found_picked: 1,
                vetoed_picked: 1,
                vetoed_plausible: 1,
                vetoed_broken: 0,
                found_broken: 1,
            }
        );
        let view = store.review_item(item).unwrap().unwrap();
        assert_eq!(view.item.endings, shown);
        assert_eq!(view.item.reviewed, 2);
        assert!(view.item.shows(&[found, others[2], others[1], others[0]]));
        assert!(!view.item.shows(&[found, others[2], others[1], others[3]]));
        assert!(store.review_item(item + 1).unwrap().is_none());
        store.want_reviews(item, 3).unwrap();
        store.want_reviews(item, 1).unwrap();
        assert_eq!(store.review_item(item).unwrap().unwrap().item.reviewers, 3);
    }
}
