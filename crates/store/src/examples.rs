//! Ingest's tables: sources, examples (with their found ending) and dropped records.

use std::collections::BTreeMap;

use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension};

use super::{now, Store};

/// An example ready to store: a context and its found ending, already split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewExample {
    pub ext_id: String,
    pub group: String,
    pub sent1: String,
    pub sent2: String,
    pub ending: String,
    /// Provenance carried over from a SWAG CSV (`gold0-orig`, ...); `None` for raw inputs.
    pub gold_source: Option<String>,
}

/// A stored example.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub id: i64,
    pub ext_id: String,
    pub group: String,
    pub sent1: String,
    pub sent2: String,
    pub ending: String,
    /// Row id of the found ending in `endings`.
    pub gold_ending_id: i64,
}

impl Store {
    /// Registers an input file; the same content, format and options map to the same row.
    pub fn upsert_source(
        &self,
        path: &str,
        format: &str,
        sha256: &str,
        options_json: &str,
    ) -> Result<i64> {
        upsert_source(&self.conn, path, format, sha256, options_json)
    }

    /// Stores an example and its found ending. Returns false (and changes nothing) when an example
    /// with the same `ext_id` exists already, which makes re-ingesting a file idempotent. A record
    /// dropped by an earlier ingest (e.g. with stricter filters) and kept now is no longer dropped.
    pub fn insert_example(&self, source_id: i64, ex: &NewExample) -> Result<bool> {
        insert_example(&self.conn, source_id, ex)
    }

    /// Records why an input record was not kept (once per record; never for a kept example).
    pub fn insert_dropped(&self, source_id: i64, ext_id: &str, reason: &str) -> Result<()> {
        let conn = &self.conn;
        conn.prepare_cached(
            "INSERT OR IGNORE INTO dropped(ext_id, source_id, reason)
         SELECT ?1, ?2, ?3 WHERE NOT EXISTS (SELECT 1 FROM examples WHERE ext_id = ?1)",
        )?
        .execute(params![ext_id, source_id, reason])?;
        Ok(())
    }

    /// The stored `(sent1, sent2, ending)` of the example with this external id, if any.
    pub fn example_text_by_ext_id(&self, ext_id: &str) -> Result<Option<(String, String, String)>> {
        let conn = &self.conn;
        Ok(conn
            .prepare_cached("SELECT sent1, sent2, ending FROM examples WHERE ext_id = ?1")?
            .query_row([ext_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?)
    }

    pub(crate) fn count_examples(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("SELECT COUNT(*) FROM examples", [], |r| r.get(0))?)
    }

    /// Dropped input records by reason.
    pub(crate) fn dropped_by_reason(&self) -> Result<BTreeMap<String, i64>> {
        let mut stmt = self
            .conn
            .prepare("SELECT reason, COUNT(*) FROM dropped GROUP BY reason ORDER BY reason")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every example, in id order (the order of insertion), in one query.
    pub fn examples(&self) -> Result<Vec<Example>> {
        let mut stmt = self.conn.prepare(
            "SELECT x.id, x.ext_id, x.grp, x.sent1, x.sent2, x.ending, e.id
             FROM examples x JOIN endings e ON e.example_id = x.id AND e.is_gold = 1
             ORDER BY x.id",
        )?;
        let rows = stmt.query_map([], example_from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn example(&self, id: i64) -> Result<Option<Example>> {
        Ok(self
            .conn
            .query_row(
                "SELECT x.id, x.ext_id, x.grp, x.sent1, x.sent2, x.ending, e.id
                 FROM examples x JOIN endings e ON e.example_id = x.id AND e.is_gold = 1
                 WHERE x.id = ?1",
                [id],
                example_from_row,
            )
            .optional()?)
    }
}

fn example_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Example> {
    Ok(Example {
        id: r.get(0)?,
        ext_id: r.get(1)?,
        group: r.get(2)?,
        sent1: r.get(3)?,
        sent2: r.get(4)?,
        ending: r.get(5)?,
        gold_ending_id: r.get(6)?,
    })
}

// The writes behind [`Store::upsert_source`] and [`Store::insert_example`], shared with the
// fixtures that tests run on a connection of their own.

pub(super) fn upsert_source(
    conn: &Connection,
    path: &str,
    format: &str,
    sha256: &str,
    options_json: &str,
) -> Result<i64> {
    conn.execute(
        "INSERT OR IGNORE INTO sources(path, format, sha256, options, ingested_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![path, format, sha256, options_json, now()],
    )?;
    Ok(conn.query_row(
        "SELECT id FROM sources WHERE sha256 = ?1 AND format = ?2 AND options = ?3",
        params![sha256, format, options_json],
        |r| r.get(0),
    )?)
}

pub(super) fn insert_example(conn: &Connection, source_id: i64, ex: &NewExample) -> Result<bool> {
    let inserted = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO examples(ext_id, grp, sent1, sent2, ending, source_id, gold_source, added_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?
        .execute(params![
            ex.ext_id,
            ex.group,
            ex.sent1,
            ex.sent2,
            ex.ending,
            source_id,
            ex.gold_source,
            now()
        ])?;
    if inserted == 0 {
        return Ok(false);
    }
    let example_id = conn.last_insert_rowid();
    conn.prepare_cached("INSERT INTO endings(example_id, text, is_gold) VALUES (?1, ?2, 1)")?
        .execute(params![example_id, ex.ending])?;
    conn.prepare_cached("DELETE FROM dropped WHERE ext_id = ?1")?
        .execute([&ex.ext_id])?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(ext_id: &str) -> NewExample {
        NewExample {
            ext_id: ext_id.into(),
            group: "v1".into(),
            sent1: "A man stands in a kitchen.".into(),
            sent2: "He".into(),
            ending: "chops an onion on a board.".into(),
            gold_source: None,
        }
    }

    #[test]
    fn reinserting_an_example_is_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(&dir.path().join("p.sqlite")).unwrap();
        let src = store.upsert_source("a.json", "jsonl", "abc", "{}").unwrap();
        assert_eq!(
            store.upsert_source("b.json", "jsonl", "abc", "{}").unwrap(),
            src
        );
        assert!(store.insert_example(src, &example("x#1")).unwrap());
        assert!(!store.insert_example(src, &example("x#1")).unwrap());
        store.insert_dropped(src, "x#2", "short_context").unwrap();
        store.insert_dropped(src, "x#2", "short_context").unwrap();
        store.insert_dropped(src, "x#1", "rare_token").unwrap();
        assert_eq!(store.count_examples().unwrap(), 1);
        assert_eq!(
            store.dropped_by_reason().unwrap().len(),
            1,
            "a kept example is not dropped"
        );
        assert_eq!(store.dropped_by_reason().unwrap()["short_context"], 1);
        assert!(store.insert_example(src, &example("x#2")).unwrap());
        assert!(
            store.dropped_by_reason().unwrap().is_empty(),
            "kept now, so no longer dropped"
        );
        assert_eq!(
            store.example_text_by_ext_id("x#2").unwrap().unwrap().1,
            "He"
        );
        let all = store.examples().unwrap();
        assert_eq!(
            crate::dataset::startphrase(&all[0].sent1, &all[0].sent2),
            "A man stands in a kitchen. He"
        );
        assert_eq!(store.example(all[0].id).unwrap().unwrap(), all[0]);
    }
}
