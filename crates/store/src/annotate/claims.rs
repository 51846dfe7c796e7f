//! Who holds which item: claims with their holder's process (pid and host) and heartbeat, so
//! that an item on an annotator's screen is not handed to another, and an item whose process has
//! exited or gone quiet is; which item an annotator is handed next; and a session's preferred
//! order, kept where only its own connection sees it.

use std::time::Duration;

use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::annotate::tasks::TaskView;
use crate::{format_timestamp, now, Store};

/// The process that holds claims for an annotator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub annotator: String,
    pub pid: u32,
    pub host: String,
}

impl Holder {
    /// This process, on this machine.
    fn this_process(annotator: &str) -> Holder {
        Holder {
            annotator: annotator.to_string(),
            pid: std::process::id(),
            host: hostname(),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Whether a process of this machine still runs. Without /proc (not Linux) nothing is known, and
/// claims expire by age only.
fn process_alive(pid: u32) -> bool {
    let proc_root = std::path::Path::new("/proc");
    !proc_root.join("self").exists() || proc_root.join(pid.to_string()).exists()
}

/// A claim not refreshed for this long no longer reserves its item (the holder heartbeats
/// every [`HEARTBEAT`] while the item is on screen).
pub(super) const STALE_AFTER: Duration = Duration::from_secs(10 * 60);
/// How often a running session refreshes its claim.
pub const HEARTBEAT: Duration = Duration::from_secs(60);

pub(super) fn cutoff(age: Duration) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
        - age.as_secs_f64();
    format_timestamp(secs)
}

/// A session's hand-out preference: per connection, in SQLite's temporary database.
const HANDOUT_PRIORITY: &str = "CREATE TEMP TABLE IF NOT EXISTS handout_priority (
    task_id INTEGER PRIMARY KEY,
    rank    INTEGER NOT NULL UNIQUE
);";

/// SQL condition: task `t` still wants a submission. Written as the partial index
/// `tasks_wanting` states it, so that queries with it read that index: finished tasks are never
/// looked at again, however many there are.
pub(super) const WANTING: &str = "t.status = 'open' AND t.submitted < t.replicas";

/// SQL condition on a wanting task `t`: it can take one more annotator other than ?1 (annotator)
/// given the live claims of others (?2 = stale cutoff), and ?1 has neither submitted nor skipped
/// it. Every task it rules out is one ?1 submitted or skipped or one others have claimed.
pub(super) const TAKES_ANNOTATOR: &str = "
    NOT EXISTS (SELECT 1 FROM submissions s WHERE s.task_id = t.id AND s.annotator = ?1)
    AND NOT EXISTS (SELECT 1 FROM skips k WHERE k.task_id = t.id AND k.annotator = ?1)
    AND t.submitted
      + (SELECT COUNT(*) FROM claims c WHERE c.task_id = t.id AND c.annotator <> ?1
           AND c.pid IS NOT NULL AND c.seen_at > ?2) < t.replicas";

/// The tasks [`TAKES_ANNOTATOR`] can rule out for ?1: those ?1 submitted or skipped, and those
/// others hold a live claim on.
const RULED_OUT_CANDIDATES: &str = "SELECT task_id FROM submissions WHERE annotator = ?1
    UNION SELECT task_id FROM skips WHERE annotator = ?1
    UNION SELECT task_id FROM claims WHERE annotator <> ?1 AND pid IS NOT NULL AND seen_at > ?2";

impl Store {
    /// Starts `annotator`'s session in this process: every submission, skip and undo it makes
    /// reaches the disk before it returns ([`Store::sync_every_label`]), and it is handed the
    /// tasks `preferred` first, in that order (`annotate --order risk`; then the rest in id
    /// order), an order kept in a temporary table that other processes never see. Returns the
    /// holder of the session's claims.
    pub fn start_annotation(&mut self, annotator: &str, preferred: &[i64]) -> Result<Holder> {
        self.sync_every_label();
        self.conn
            .execute_batch(&format!("{HANDOUT_PRIORITY} DELETE FROM handout_priority;"))?;
        let mut stmt = self
            .conn
            .prepare("INSERT OR IGNORE INTO handout_priority(task_id, rank) VALUES (?1, ?2)")?;
        for (rank, id) in preferred.iter().enumerate() {
            stmt.execute(params![id, rank as i64])?;
        }
        Ok(Holder::this_process(annotator))
    }

    /// Hands `holder` its next item, atomically: in one write transaction the claims of this
    /// machine's exited processes are freed; the holder gets the item it claimed last (the one
    /// on its screen when its session stopped) if it may still take it, else the first it may
    /// take in this connection's hand-out order (the session's preferred tasks, then the rest
    /// by id: the order tasks were made in); its other claims are dropped and that one claimed
    /// (or its claim refreshed). It may take a task that still wants a submission, that it has
    /// neither submitted nor skipped, and on which the live claims of others leave room. `None`
    /// when nothing is left for it.
    pub fn claim_next(&mut self, holder: &Holder) -> Result<Option<TaskView>> {
        self.conn.execute_batch(HANDOUT_PRIORITY)?;
        let tx = self.begin(TransactionBehavior::Immediate)?;
        forget_dead_holders(&tx, holder)?;
        let stale = cutoff(STALE_AFTER);
        let task = match held_task(&tx, &holder.annotator, &stale)? {
            Some(task) => Some(task),
            None => first_task(&tx, &holder.annotator, &stale)?,
        };
        tx.execute(
            "DELETE FROM claims WHERE annotator = ?1 AND task_id IS NOT ?2",
            params![holder.annotator, task],
        )?;
        let Some(task) = task else {
            tx.commit()?;
            return Ok(None);
        };
        tx.execute(
            "INSERT INTO claims(task_id, annotator, claimed_at, seen_at, pid, host)
         VALUES (?1, ?2, ?3, ?3, ?4, ?5)
         ON CONFLICT(task_id, annotator) DO UPDATE
           SET seen_at = excluded.seen_at, pid = excluded.pid, host = excluded.host",
            params![task, holder.annotator, now(), holder.pid, holder.host],
        )?;
        let view = self.task_view(task)?.expect("claimed task exists");
        tx.commit()?;
        Ok(Some(view))
    }
}

/// The annotator's latest claim, if [`TAKES_ANNOTATOR`] still holds for its task.
fn held_task(conn: &Connection, annotator: &str, stale: &str) -> Result<Option<i64>> {
    let held: Option<i64> = conn
        .query_row(
            "SELECT task_id FROM claims WHERE annotator = ?1 ORDER BY claimed_at DESC LIMIT 1",
            [annotator],
            |r| r.get(0),
        )
        .optional()?;
    let Some(task) = held else {
        return Ok(None);
    };
    let takes = conn
        .query_row(
            &format!("SELECT 1 FROM tasks t WHERE t.id = ?3 AND {WANTING} AND {TAKES_ANNOTATOR}"),
            params![annotator, stale, task],
            |_| Ok(()),
        )
        .optional()?;
    Ok(takes.map(|()| task))
}

/// The first task the annotator may take in the connection's hand-out order.
fn first_task(conn: &Connection, annotator: &str, stale: &str) -> Result<Option<i64>> {
    let first = |sql: String| -> Result<Option<i64>> {
        Ok(conn
            .query_row(&sql, params![annotator, stale], |r| r.get(0))
            .optional()?)
    };
    let preferred = first(format!(
        "SELECT t.id FROM handout_priority p JOIN tasks t ON t.id = p.task_id
         WHERE {WANTING} AND {TAKES_ANNOTATOR} ORDER BY p.rank LIMIT 1"
    ))?;
    match preferred {
        Some(task) => Ok(Some(task)),
        None => first(format!(
            "SELECT t.id FROM tasks t WHERE {WANTING} AND {TAKES_ANNOTATOR} ORDER BY t.id LIMIT 1"
        )),
    }
}

/// Claims held by processes of this machine that have exited lose their pid: their items are
/// free for others at once (their annotators still get them back first).
fn forget_dead_holders(conn: &Connection, holder: &Holder) -> Result<()> {
    let mut stmt = conn.prepare(
        "SELECT DISTINCT pid FROM claims WHERE host = ?1 AND pid IS NOT NULL AND pid <> ?2",
    )?;
    let pids: Vec<u32> = stmt
        .query_map(params![holder.host, holder.pid], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for pid in pids.into_iter().filter(|&p| !process_alive(p)) {
        conn.execute(
            "UPDATE claims SET pid = NULL WHERE host = ?1 AND pid = ?2",
            params![holder.host, pid],
        )?;
    }
    Ok(())
}

/// How many tasks `annotator` could still be given (a task it holds included), counted among
/// the few that [`TAKES_ANNOTATOR`] can rule out: a count over every wanting task would cost each
/// item a scan of the project.
pub(super) fn remaining_for(conn: &Connection, annotator: &str) -> Result<i64> {
    Ok(conn.query_row(
        &format!(
            "SELECT (SELECT COUNT(*) FROM tasks t WHERE {WANTING})
                  - (SELECT COUNT(*) FROM tasks t WHERE t.id IN ({RULED_OUT_CANDIDATES})
                       AND {WANTING} AND NOT ({TAKES_ANNOTATOR}))"
        ),
        params![annotator, cutoff(STALE_AFTER)],
        |r| r.get(0),
    )?)
}

impl Store {
    /// Ends the holder's session: its claims lose their pid, so their items are free for others at
    /// once, on any machine, while the annotator still gets them back first when it resumes.
    pub fn release_claims(&self, holder: &Holder) -> Result<()> {
        self.conn.execute(
            "UPDATE claims SET pid = NULL WHERE annotator = ?1 AND pid = ?2 AND host = ?3",
            params![holder.annotator, holder.pid, holder.host],
        )?;
        Ok(())
    }

    /// Refreshes the holder's claim on `task_id` so that it stays reserved while on screen.
    pub fn heartbeat(&self, holder: &Holder, task_id: i64) -> Result<()> {
        self.conn.execute(
        "UPDATE claims SET seen_at = ?3, pid = ?4, host = ?5 WHERE task_id = ?1 AND annotator = ?2",
        params![task_id, holder.annotator, now(), holder.pid, holder.host],
    )?;
        Ok(())
    }
}
