//! One annotator's session: the loop that draws the app state, reads a key, lets the app decide,
//! and carries out its decision against the project store. Every submission is committed before
//! the next item is drawn.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ratatui::backend::Backend;
use ratatui::Terminal;

use afkit_store::annotate::claims::{Holder, HEARTBEAT};
use afkit_store::annotate::labels::{EndingLabel, NewSubmission, UndoneKind};
use afkit_store::Store;

use super::agreement::items_per_hour;
use super::app::{Action, App, Item, Tone};
use super::event::{Input, Keys};
use super::ui;

/// What a session did, for the line printed after the terminal is restored.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub submitted: usize,
    pub done_total: i64,
    pub remaining: i64,
}

/// Timings of the hidden `--timings FILE` mode: milliseconds per event kind.
#[derive(Default)]
pub(crate) struct Timings {
    rows: Vec<(&'static str, f64)>,
}

impl Timings {
    fn record(&mut self, event: &'static str, took: Duration) {
        self.rows.push((event, took.as_secs_f64() * 1000.0));
    }

    /// Appends one JSON line per event: `{"event": "commit"|"draw"|"claim", "ms": ...}`.
    pub(crate) fn write(&self, path: &Path) -> Result<()> {
        let mut file = std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot write timings to {}", path.display()))?,
        );
        for (event, ms) in &self.rows {
            writeln!(file, "{}", serde_json::json!({"event": event, "ms": ms}))?;
        }
        file.flush()?;
        Ok(())
    }
}

pub(crate) struct Session<'a> {
    store: &'a mut Store,
    holder: Holder,
    app: App,
    shown_at: Instant,
    submitted: usize,
    pub timings: Timings,
}

impl<'a> Session<'a> {
    pub(crate) fn new(store: &'a mut Store, holder: Holder) -> Session<'a> {
        let app = App::new(&holder.annotator);
        Session {
            store,
            holder,
            app,
            shown_at: Instant::now(),
            submitted: 0,
            timings: Timings::default(),
        }
    }

    /// Runs the session until the annotator quits, a signal arrives or the terminal goes away;
    /// on every way out the claim on the item on screen is released.
    pub(crate) fn run<B: Backend>(
        &mut self,
        terminal: &mut Terminal<B>,
        keys: &mut dyn Keys,
    ) -> Result<Summary> {
        let ended = self.run_until_stopped(terminal, keys);
        let released = self.store.release_claims(&self.holder);
        ended?;
        released?;
        let progress = self.store.annotator_progress(&self.holder.annotator)?;
        Ok(Summary {
            submitted: self.submitted,
            done_total: progress.done,
            remaining: progress.remaining,
        })
    }

    fn run_until_stopped<B: Backend>(
        &mut self,
        terminal: &mut Terminal<B>,
        keys: &mut dyn Keys,
    ) -> Result<()> {
        self.next_item()?;
        let mut last_heartbeat = Instant::now();
        loop {
            let started = Instant::now();
            terminal.draw(|frame| ui::draw(frame, &mut self.app))?;
            self.timings.record("draw", started.elapsed());
            let input = keys.next(HEARTBEAT.saturating_sub(last_heartbeat.elapsed()))?;
            if last_heartbeat.elapsed() >= HEARTBEAT {
                self.heartbeat();
                last_heartbeat = Instant::now();
            }
            let key = match input {
                Input::Stop => break,
                Input::Tick => continue,
                Input::Paste => {
                    self.app.on_paste();
                    continue;
                }
                Input::Key(key) => key,
            };
            let pressed = Instant::now();
            match self.app.on_key(key) {
                Action::None => {}
                Action::Quit => break,
                Action::Submit { task_id, labels } => {
                    self.store_submission(task_id, false, labels, pressed)?;
                }
                Action::Flag(task_id) => {
                    self.store_submission(task_id, true, Vec::new(), pressed)?;
                }
                Action::Skip(task_id) => {
                    self.store.skip(&self.holder, task_id)?;
                    self.next_item()?;
                    self.app.say(Tone::Info, "skipped (z to undo)");
                }
                Action::Undo => self.undo()?,
            }
        }
        Ok(())
    }

    fn store_submission(
        &mut self,
        task_id: i64,
        broken: bool,
        labels: Vec<EndingLabel>,
        pressed: Instant,
    ) -> Result<()> {
        let sub = NewSubmission {
            task_id,
            annotator: self.holder.annotator.clone(),
            broken,
            seconds: Some(self.shown_at.elapsed().as_secs_f64()),
            submitted_at: None,
            labels,
        };
        // Another session under the same name may have submitted this item meanwhile.
        if self.store.has_submitted(task_id, &self.holder.annotator)? {
            self.next_item()?;
            self.app.say(
                Tone::Warn,
                "you already submitted that item in another session; here is the next one",
            );
            return Ok(());
        }
        self.store.submit(&sub)?;
        self.timings.record("commit", pressed.elapsed());
        self.submitted += 1;
        self.next_item()?;
        let what = if broken { "flagged as broken" } else { "saved" };
        self.app.say(Tone::Good, format!("{what} (z to undo)"));
        Ok(())
    }

    fn undo(&mut self) -> Result<()> {
        match self.store.undo_last(&self.holder)? {
            None => self.app.say(Tone::Warn, "nothing to undo"),
            Some(undone) => {
                if undone.was != UndoneKind::Skip {
                    self.submitted = self.submitted.saturating_sub(1);
                }
                self.app
                    .show(Some(Item::with_labels(undone.task, &undone.labels)));
                self.shown_at = Instant::now();
                self.refresh_progress()?;
                let what = match undone.was {
                    UndoneKind::Submission => {
                        "your last submission is undone: edit and submit again"
                    }
                    UndoneKind::Broken => "the broken flag is undone",
                    UndoneKind::Skip => "the skip is undone",
                };
                self.app.say(Tone::Info, what);
            }
        }
        Ok(())
    }

    fn next_item(&mut self) -> Result<()> {
        let started = Instant::now();
        let task = self.store.claim_next(&self.holder)?;
        self.timings.record("claim", started.elapsed());
        self.app.show(task.map(Item::new));
        self.app.message = None;
        self.shown_at = Instant::now();
        self.refresh_progress()
    }

    fn refresh_progress(&mut self) -> Result<()> {
        let p = self.store.annotator_progress(&self.holder.annotator)?;
        self.app.progress = super::app::Standing {
            done: p.done,
            per_hour: items_per_hour(&p.items),
            remaining: p.remaining,
        };
        Ok(())
    }

    /// Keeps the claim on the item on screen fresh; a failure (e.g. the file is busy for long)
    /// is shown, not fatal: the claim merely risks going stale.
    fn heartbeat(&mut self) {
        if let Some(item) = &self.app.item {
            if let Err(e) = self.store.heartbeat(&self.holder, item.task.task_id) {
                self.app
                    .say(Tone::Warn, format!("could not refresh your claim: {e}"));
            }
        }
    }
}
