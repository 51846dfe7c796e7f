//! The project store: one SQLite file per project, owned by this crate.
//!
//! Every stage reads and writes the project through methods of [`Store`], defined next to the
//! tables they touch in the submodules here; the SQLite connection never leaves this crate, so
//! a schema change is made in one place. Work that must commit together runs in
//! [`Store::transaction`] (or [`Store::write_transaction`]) with a closure over the store, or is
//! one operation of its own (`commit_assembly`, `commit_af_iteration`, `submit`).
//!
//! The schema is versioned with SQLite's `user_version` and upgraded by [`MIGRATIONS`] when a
//! project is opened, so a project made by an older afkit keeps working.
//!
//! Seeds: the project records the seed of every stage's random choices (`generations.seed`,
//! `af_runs.seed`, `tasks.seed` with the annotation policy's seed in `meta`, the `assemble`
//! parameters in `meta`, `exports.seed`); [`afkit_engine::seed`] turns them into randomness.
//!
//! Durability: WAL journal, `synchronous = NORMAL` (a committed transaction survives a process
//! kill; only an OS crash can lose the last commits), foreign keys on, and a busy handler that
//! polls for the write lock, so that several annotators (processes) can share one file. An
//! annotator's labels also survive an OS crash: each is flushed to the disk after its commit
//! ([`Store::sync_every_label`]).

// The dataset vocabulary: SWAG's columns, splits, annotation labels, the startphrase.
pub mod dataset;
// Which of a context's assigned negatives become its distractors (annotate and assemble).
pub mod distractors;
// "Could be right": which negatives a strong reader rates as likely as the found ending.
pub mod risk;

pub mod adapters;
pub mod af;
pub mod annotate;
pub mod assemble;
pub mod bundle;
pub mod examples;
pub mod export;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod fluency;
pub mod pool;
pub mod review;
mod risk_evidence;
pub mod scorer;
pub mod status;
pub mod vector_cache;

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use afkit_engine::seed::Seed;

/// Schema migrations, in order. Index `i` upgrades `user_version` from `i` to `i + 1`.
/// Never edit a migration that has shipped: append a new one.
const MIGRATIONS: &[&str] = &[
    include_str!("schema.sql"),
    include_str!("migration_2.sql"),
    include_str!("migration_3.sql"),
    include_str!("migration_4.sql"),
    include_str!("migration_5.sql"),
    include_str!("migration_6.sql"),
    include_str!("migration_7.sql"),
    include_str!("migration_8.sql"),
    include_str!("migration_9.sql"),
    include_str!("migration_10.sql"),
    include_str!("migration_11.sql"),
    include_str!("migration_12.sql"),
    include_str!("migration_13.sql"),
    include_str!("migration_14.sql"),
];

/// The schema version this build of afkit writes.
pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// An open project file.
pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Whether [`Store::make_durable`] flushes the journal to the disk (annotators' labels).
    sync_labels: bool,
    /// The write-ahead log, opened by the first [`Store::make_durable`] that flushes it.
    wal: Option<File>,
}

/// How long a connection waits for another process's write lock before it reports the project
/// busy.
const LOCK_WAIT: Duration = Duration::from_secs(30);
/// The first pause before trying a lock that another process holds again; each further try
/// waits twice as long, up to [`LOCK_POLL_MAX`].
const LOCK_POLL_FIRST: Duration = Duration::from_micros(100);
const LOCK_POLL_MAX: Duration = Duration::from_millis(2);

/// SQLite's busy handler: retries quickly at first and then every [`LOCK_POLL_MAX`], for up to
/// [`LOCK_WAIT`]. SQLite's own timeout backs off to sleeps of up to 100 ms, so with several
/// annotators submitting at once a writer slept long after the lock it waited for was free;
/// transactions here hold the lock for a millisecond or two.
fn wait_for_lock(attempts: i32) -> bool {
    let attempts = attempts.max(0) as u32;
    if LOCK_POLL_MAX * attempts >= LOCK_WAIT {
        return false;
    }
    let pause = LOCK_POLL_FIRST * 2u32.saturating_pow(attempts.min(16));
    std::thread::sleep(pause.min(LOCK_POLL_MAX));
    true
}

impl Store {
    /// Creates a new, empty project. Fails if the file already exists.
    pub fn create(path: &Path) -> Result<Store> {
        if path.exists() {
            bail!(
                "{} already exists; `afkit init` only creates new projects",
                path.display()
            );
        }
        let mut store = Store::connect(path)?;
        store.migrate()?;
        store.set_meta("created_at", &now())?;
        store.set_meta("created_by", concat!("afkit ", env!("CARGO_PKG_VERSION")))?;
        Ok(store)
    }

    /// Opens an existing project and upgrades its schema if it is older than this build.
    ///
    /// Nothing is written to a file before it is known to be an afkit project: an empty file, a
    /// file that is not SQLite or a SQLite file of some other program is refused as it is.
    pub fn open(path: &Path) -> Result<Store> {
        check_project_file(path)?;
        let conn = Connection::open(path)
            .with_context(|| format!("cannot open project file {}", path.display()))?;
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .with_context(|| format!("{} is not a readable SQLite file", path.display()))?;
        if version == 0 {
            bail!("{} is not an afkit project (no schema)", path.display());
        }
        if version > SCHEMA_VERSION {
            bail!(
                "{} has schema version {version}, newer than this afkit ({SCHEMA_VERSION}); upgrade afkit",
                path.display()
            );
        }
        let mut store = Store::configure(conn, path)?;
        store.migrate()?;
        Ok(store)
    }

    fn connect(path: &Path) -> Result<Store> {
        let conn = Connection::open(path)
            .with_context(|| format!("cannot open project file {}", path.display()))?;
        Store::configure(conn, path)
    }

    fn configure(conn: Connection, path: &Path) -> Result<Store> {
        conn.busy_handler(Some(wait_for_lock))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .with_context(|| format!("cannot set up the journal of {}", path.display()))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        Ok(Store {
            conn,
            path: path.to_path_buf(),
            sync_labels: false,
            wal: None,
        })
    }

    fn schema_version(&self) -> Result<i64> {
        Ok(self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    fn migrate(&mut self) -> Result<()> {
        let from = self.schema_version()?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(from as usize) {
            let tx = self.conn.transaction()?;
            tx.execute_batch(sql)
                .with_context(|| format!("schema migration {} failed", i + 1))?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` in one transaction (`BEGIN DEFERRED`): committed when it returns `Ok`, rolled
    /// back when it fails or panics. Stages group each unit of work (a file, a context, an
    /// assembly) into one, so that an interruption never leaves half of it behind; `work` gets
    /// the store itself, so the typed operations run inside the transaction.
    pub fn transaction<T>(&mut self, work: impl FnOnce(&Store) -> Result<T>) -> Result<T> {
        self.run_in(TransactionBehavior::Deferred, work)
    }

    /// Like [`Store::transaction`], but holding the write lock from the first statement (`BEGIN
    /// IMMEDIATE`), so that what `work` reads cannot change before it writes.
    pub fn write_transaction<T>(&mut self, work: impl FnOnce(&Store) -> Result<T>) -> Result<T> {
        self.run_in(TransactionBehavior::Immediate, work)
    }

    fn run_in<T>(
        &mut self,
        behavior: TransactionBehavior,
        work: impl FnOnce(&Store) -> Result<T>,
    ) -> Result<T> {
        let tx = self.begin(behavior)?;
        let out = work(self)?;
        tx.commit()?;
        Ok(out)
    }

    /// Starts a transaction on the store's connection for this crate's operations. It borrows
    /// the store shared, so the operation can call the store's other methods inside it; taking
    /// `&mut self` in the public operations that begin one keeps two from nesting.
    pub(crate) fn begin(&self, behavior: TransactionBehavior) -> Result<Transaction<'_>> {
        Ok(Transaction::new_unchecked(&self.conn, behavior)?)
    }

    /// Flushes what this store has committed to the disk, if it was asked to with
    /// [`Store::sync_every_label`]: a flush of the write-ahead log (where every commit lands first)
    /// after the commit, out of the write lock, instead of `synchronous = FULL`'s flush inside
    /// it, so that writers waiting for the lock do not also wait for each other's disk. It is as
    /// durable: commits reach the log in order, and the log is only rewritten after a checkpoint
    /// has copied it into the project file and flushed that.
    pub(crate) fn make_durable(&mut self) -> Result<()> {
        if !self.sync_labels {
            return Ok(());
        }
        if self.wal.is_none() {
            let mut name = self.path.clone().into_os_string();
            name.push("-wal");
            // Only opened for flushing; SQLite keeps no locks on this file, so this handle
            // cannot disturb the connection's.
            let wal = File::open(&name).with_context(|| {
                format!(
                    "cannot open the journal {} to flush it",
                    Path::new(&name).display()
                )
            })?;
            self.wal = Some(wal);
        }
        let wal = self.wal.as_ref().expect("opened above");
        wal.sync_data()
            .context("cannot flush the project's journal to the disk")
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        get_meta(&self.conn, key)
    }

    pub(crate) fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        set_meta(&self.conn, key, value)
    }

    /// The project's fingerprint: 12 random hex digits drawn the first time it is asked for and
    /// kept in `meta`, so that files made for this project (crowd task files) can be told from
    /// another project's.
    pub fn fingerprint(&self) -> Result<String> {
        let drawn = format!("{:012x}", rand::random::<u64>() >> 16);
        self.conn.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('fingerprint', ?1)",
            [drawn],
        )?;
        get_meta(&self.conn, "fingerprint")?.context("the project's fingerprint was not kept")
    }
}

/// The first bytes of every SQLite database file.
const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Every command writes to the project (its journal at least), so a file that is missing,
/// read-only, empty or not SQLite is refused before SQLite touches it, with a message that
/// names it.
fn check_project_file(path: &Path) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        bail!(
            "no project at {}: create one with `afkit init {}`",
            path.display(),
            path.display()
        );
    };
    if !meta.is_file() {
        bail!(
            "{} is not a file; expected an afkit project file",
            path.display()
        );
    }
    if meta.permissions().readonly() {
        bail!(
            "{} is read-only; afkit writes to the project file (its journal at least): make it \
             writable, e.g. `chmod u+w {}`",
            path.display(),
            path.display()
        );
    }
    let mut header = Vec::with_capacity(SQLITE_HEADER.len());
    std::fs::File::open(path)
        .and_then(|f| f.take(SQLITE_HEADER.len() as u64).read_to_end(&mut header))
        .with_context(|| format!("cannot read {}", path.display()))?;
    if header.is_empty() {
        bail!("{} is empty, not an afkit project", path.display());
    }
    if header != SQLITE_HEADER {
        bail!(
            "{} is not a SQLite file, so not an afkit project",
            path.display()
        );
    }
    Ok(())
}

fn get_meta(conn: &Connection, key: &str) -> Result<Option<String>> {
    Ok(conn
        .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()?)
}

fn set_meta(conn: &Connection, key: &str, value: &str) -> Result<()> {
    conn.execute(
        "INSERT INTO meta(key, value) VALUES (?1, ?2)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        params![key, value],
    )?;
    Ok(())
}

/// UTC timestamp in RFC 3339 form, as every `*_at` column stores it.
pub fn now() -> String {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    format_millis(strictly_later(millis))
}

/// `millis`, or one past the last timestamp this process made when the clock has not moved on
/// since: what one process records is ordered by its timestamps, so `undo_last` can tell which
/// of an annotator's skip and submission came last even when both fall in one millisecond.
fn strictly_later(millis: i64) -> i64 {
    use std::sync::atomic::{AtomicI64, Ordering::SeqCst};
    static LAST: AtomicI64 = AtomicI64::new(i64::MIN);
    let after = |last: i64| millis.max(last.saturating_add(1));
    let (Ok(last) | Err(last)) = LAST.fetch_update(SeqCst, SeqCst, |last| Some(after(last)));
    after(last)
}

fn format_timestamp(unix_secs: f64) -> String {
    format_millis((unix_secs * 1000.0).floor() as i64)
}

/// RFC 3339 (UTC, milliseconds) of a Unix time in milliseconds.
fn format_millis(unix_millis: i64) -> String {
    let secs = unix_millis.div_euclid(1000);
    let millis = unix_millis.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A seed as an SQLite integer: its 64 bits read as a signed number (SQLite has no unsigned
/// type), so every seed round-trips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SqlSeed(pub(crate) Seed);

impl rusqlite::ToSql for SqlSeed {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok((self.0.value() as i64).into())
    }
}

impl rusqlite::types::FromSql for SqlSeed {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        i64::column_result(value).map(|n| SqlSeed(Seed::new(n as u64)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_timestamps_strictly_increase() {
        let stamps: Vec<String> = (0..200).map(|_| now()).collect();
        assert!(stamps.windows(2).all(|w| w[0] < w[1]), "{stamps:?}");
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(format_timestamp(0.0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_timestamp(1_795_314_096.5),
            "2026-11-22T02:21:36.500Z"
        );
        assert_eq!(format_timestamp(951_782_400.0), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn create_then_open_keeps_schema_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.sqlite");
        Store::create(&path).unwrap();
        assert!(
            Store::create(&path).is_err(),
            "init must not clobber a project"
        );
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert!(store.meta("created_at").unwrap().is_some());
    }

    /// A project file at schema `version`, with one context (a found ending, id 1, and another,
    /// id 2) and `rows` inserted after it.
    fn project_at_version(path: &Path, version: usize, rows: &str) {
        let conn = Connection::open(path).unwrap();
        for sql in &MIGRATIONS[..version] {
            conn.execute_batch(sql).unwrap();
        }
        conn.pragma_update(None, "user_version", version as i64)
            .unwrap();
        conn.execute_batch(
            "INSERT INTO sources VALUES (1, 'in.jsonl', 'jsonl', 'x', '{}', 'now');
             INSERT INTO examples VALUES (1, 'a#0', 'a', 's1', 's2', 'ends.', 1, NULL, 'now');
             INSERT INTO endings(id, example_id, text, is_gold) VALUES (1, 1, 'ends.', 1),
                                                                       (2, 1, 'stops.', 0);",
        )
        .unwrap();
        conn.execute_batch(rows).unwrap();
    }

    #[test]
    fn a_version_1_project_keeps_its_af_scores_through_the_migrations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.sqlite");
        project_at_version(
            &path,
            1,
            "INSERT INTO af_runs VALUES (1, 1, 0, '{}', 'now', 'fp', 'now', NULL, 'done');
             INSERT INTO af_scores VALUES (1, 1, 0.5), (1, 2, -1.25);",
        );
        let store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let scores: Vec<(i64, f64)> = store
            .conn
            .prepare("SELECT ending_id, score FROM af_scores WHERE run_id = 1 ORDER BY ending_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(scores, vec![(1, 0.5), (2, -1.25)]);
        let ddl: String = store
            .conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE name = 'af_scores'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(ddl.contains("WITHOUT ROWID"), "{ddl}");
    }

    /// Readings a scorer stored with its reading alone keep it through migration 12; readings
    /// without it are stored since.
    #[test]
    fn a_version_11_project_keeps_its_scorer_readings_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v11.sqlite");
        project_at_version(
            &path,
            11,
            "INSERT INTO scorer_scores VALUES (1, 'm', -3.5, -7.25, 2);",
        );
        let mut store = Store::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let stored = |store: &Store, id| store.scorer_score("m", id).unwrap().unwrap();
        assert_eq!(stored(&store, 1).ll_alone, Some(-7.25));
        let read_now = scorer::ScorerScore {
            ll_cond: -4.0,
            ll_alone: None,
            n_tok: 3,
        };
        store.put_scorer_scores("m", &[(2, read_now)]).unwrap();
        assert_eq!(stored(&store, 2), read_now);
    }

    #[test]
    fn open_rejects_missing_and_foreign_files() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Store::open(&dir.path().join("nope.sqlite")).is_err());
        let junk = dir.path().join("junk.sqlite");
        std::fs::write(&junk, b"this is not sqlite at all, not even close........").unwrap();
        assert!(Store::open(&junk).is_err());
    }
}
