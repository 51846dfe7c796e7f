//! A cache of sentence vectors shared by every project and run on the machine
//! (`$AFKIT_HOME/embeddings/`), keyed by a hash of the encoder and the text.
//!
//! Embedding is the slow part of AFLite on raw text and of the audit's MiniLM baselines, and the
//! same texts come back: an audit of the AF export and of its random control shares every context
//! and gold ending, a re-run of AFLite after editing a dataset shares most of its sentences. A
//! vector is a pure function of the model and the text, so a hit is always right; losing the
//! cache only costs time. It is a SQLite file of its own, not part of a project.
//!
//! Vectors are rows of an ordinary (rowid) table, appended in the order they are embedded, with
//! a unique index on the key: in a `WITHOUT ROWID` table keyed by the hash, rows of 1.5 KB fill
//! leaf pages about a third full and the file grows to nearly three times the vectors' size.

use std::path::Path;

use afkit_engine::embed::{VectorKey, VectorStore};
use anyhow::{Context, Result};
use rusqlite::{params, Connection, OptionalExtension};

pub struct VectorCache {
    conn: Connection,
}

impl VectorCache {
    /// The cache of MiniLM vectors in a cache folder (`$AFKIT_HOME/embeddings` by default).
    pub fn open_in(dir: &Path) -> Result<Self> {
        Self::open(&dir.join("minilm.sqlite"))
    }

    /// Opens (or creates) the cache file at `path`, creating its folder.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let mut conn = Connection::open(path)
            .with_context(|| format!("cannot open the embedding cache {}", path.display()))?;
        let setup = |conn: &mut Connection| -> Result<()> {
            // Several afkit processes may fill the cache at once.
            conn.busy_timeout(std::time::Duration::from_secs(30))?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            upgrade(conn)?;
            reclaim_free_pages(conn);
            Ok(())
        };
        setup(&mut conn).with_context(|| {
            format!(
                "{} is not a usable embedding cache (delete it to start a new one)",
                path.display()
            )
        })?;
        Ok(Self { conn })
    }
}

impl VectorStore for VectorCache {
    fn get_many(&self, keys: &[VectorKey], dim: usize) -> Result<Vec<Option<Vec<f32>>>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT vector FROM embeddings WHERE key = ?1")?;
        keys.iter()
            .map(|key| {
                let blob: Option<Vec<u8>> = stmt
                    .query_row(params![&key[..]], |row| row.get(0))
                    .optional()?;
                Ok(blob.filter(|b| b.len() == dim * 4).map(|b| {
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                        .collect()
                }))
            })
            .collect()
    }

    /// Stores `rows` in one transaction.
    fn put_many(&mut self, rows: &[(VectorKey, &[f32])]) -> Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut stmt = tx
                .prepare_cached("INSERT OR REPLACE INTO embeddings(key, vector) VALUES (?1, ?2)")?;
            for (key, vector) in rows {
                let blob: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                stmt.execute(params![&key[..], blob])?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

/// The layout this build writes (`PRAGMA user_version`).
const LAYOUT: i64 = 1;

/// Brings a cache file to [`LAYOUT`], in one write transaction so that processes opening it at
/// once do not race. Layout 0 (`vectors`, `WITHOUT ROWID`) is dropped rather than copied: its
/// vectors came from the f32 encoder, whose keys no lookup makes any more.
fn upgrade(conn: &mut Connection) -> Result<()> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let layout: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    anyhow::ensure!(
        layout <= LAYOUT,
        "written by a newer afkit (layout {layout}; this build reads up to {LAYOUT})"
    );
    if layout < LAYOUT {
        tx.execute_batch(
            "DROP TABLE IF EXISTS vectors;
             CREATE TABLE IF NOT EXISTS embeddings (
                 key BLOB NOT NULL UNIQUE,
                 vector BLOB NOT NULL
             );",
        )?;
        tx.pragma_update(None, "user_version", LAYOUT)?;
    }
    tx.commit()?;
    Ok(())
}

/// Gives a mostly empty file's free pages back to the file system: dropping the first layout
/// left a cache of 2.6 GB holding 60 MB of vectors. VACUUM needs every other connection to the
/// file idle; where one is busy this is left for the next open, as the space is all it costs.
fn reclaim_free_pages(conn: &Connection) {
    let pages = |pragma: &str| -> i64 {
        conn.query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))
            .unwrap_or(0)
    };
    if pages("freelist_count") * 2 > pages("page_count") {
        let _ = conn.execute_batch("VACUUM");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_come_back_as_stored_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/cache.sqlite");
        let (a, b) = ([1u8; 32], [2u8; 32]);
        {
            let mut cache = VectorCache::open(&path).unwrap();
            assert_eq!(cache.get_many(&[a], 3).unwrap(), vec![None]);
            cache
                .put_many(&[(a, &[1.0, -2.5, 3.25][..]), (b, &[0.0, 0.0, 1e-30][..])])
                .unwrap();
        }
        let cache = VectorCache::open(&path).unwrap();
        let got = cache.get_many(&[b, [9u8; 32], a], 3).unwrap();
        assert_eq!(
            got,
            vec![
                Some(vec![0.0, 0.0, 1e-30]),
                None,
                Some(vec![1.0, -2.5, 3.25])
            ]
        );
        // A vector of another width is a miss, not a wrong answer.
        assert_eq!(cache.get_many(&[a], 4).unwrap(), vec![None]);
    }

    /// A cache in the first layout opens, is emptied of its unreachable f32 vectors, and
    /// takes new ones; a cache from a newer afkit is refused with its name.
    #[test]
    fn the_first_layout_is_replaced_and_a_newer_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.sqlite");
        {
            let old = Connection::open(&path).unwrap();
            old.execute_batch(
                "CREATE TABLE vectors (key BLOB PRIMARY KEY, vector BLOB NOT NULL) WITHOUT ROWID;
                 WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500)
                 INSERT INTO vectors SELECT randomblob(32), zeroblob(1536) FROM n;",
            )
            .unwrap();
        }
        let key = [1u8; 32];
        let mut cache = VectorCache::open(&path).unwrap();
        assert_eq!(cache.get_many(&[key], 1).unwrap(), vec![None]);
        cache.put_many(&[(key, &[2.0][..])]).unwrap();
        assert_eq!(cache.get_many(&[key], 1).unwrap(), vec![Some(vec![2.0])]);
        let tables: i64 = cache
            .conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'vectors'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 0, "the old table is gone");
        let free: i64 = cache
            .conn
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))
            .unwrap();
        assert_eq!(free, 0, "its pages were given back");
        cache.conn.pragma_update(None, "user_version", 7).unwrap();
        drop(cache);
        let err = VectorCache::open(&path).err().expect("refused");
        let message = format!("{err:#}");
        assert!(
            message.contains("cache.sqlite") && message.contains("newer afkit"),
            "{message}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_cache_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache.sqlite");
        std::fs::write(
            &path,
            b"this is not a database, just text long enough to fail",
        )
        .unwrap();
        let err = VectorCache::open(&path).err().expect("refused");
        assert!(format!("{err:#}").contains("cache.sqlite"), "{err:#}");
    }
}
