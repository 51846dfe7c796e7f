//! Human verification (SWAG §3.5): the terminal UI, assignment of items to annotators,
//! agreement statistics, crowd import/export and question reviews.
//!
//! The UI follows ratatui's example structure: [`app`] is the pure state machine (key → state),
//! [`event`] reads input (terminal or script) and signals, [`ui`] draws, and [`session`] is the
//! loop that binds them to the project store.

pub mod agreement;
mod app;
pub mod crowd;
mod event;
mod handout;
pub mod review;
mod session;
pub mod tasks;
mod text;
mod ui;
mod verdict;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use afkit_store::Store;

use event::{Keys, ScriptKeys, TerminalKeys};
use session::{Session, Summary};
use tasks::{PolicyRequest, Setup};

/// An annotation session's settings.
pub struct Config {
    /// The annotator's name (checked: 1 to 64 printable characters).
    pub annotator: String,
    /// How items are dealt out; fixed once tasks exist.
    pub policy: PolicyRequest,
    /// Replay keys from this file instead of the keyboard, with a pause between them.
    pub script: Option<(PathBuf, Duration)>,
    /// Append per-event timings (draw, claim, commit) as JSON lines to this file.
    pub timings: Option<PathBuf>,
    /// The order this session takes items in.
    pub order: Order,
}

/// The order in which a session is handed items (its own claim, if any, always comes first).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// The project's seeded order (agreement items first).
    #[default]
    Seeded,
    /// The items whose shown negatives could most be right first (`afkit_store::risk`): the ones an
    /// unverified export would flag get a human reading before the rest.
    Risk,
}

/// What a session did, and the task setup it found or made.
pub struct Outcome {
    pub summary: Summary,
    pub setup: Setup,
}

/// Runs one annotator's session on the terminal (or a replayed script), committing each
/// submission before the next item shows.
pub fn annotate(store: &mut Store, config: &Config) -> Result<Outcome> {
    let name = config.annotator.trim();
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        bail!("--annotator must be a name of 1 to 64 printable characters");
    }
    let setup = tasks::ensure_tasks(store, config.policy)?;
    let preferred = match config.order {
        Order::Seeded => Vec::new(),
        Order::Risk => handout::riskiest_first(store)?,
    };
    let holder = store.start_annotation(name, &preferred)?;
    let stop = event::stop_flag()?;
    let mut session = Session::new(store, holder);
    let summary = match &config.script {
        Some((script, delay)) => {
            let mut keys = ScriptKeys::load(script, *delay, stop)?;
            if std::io::stdout().is_terminal() {
                with_terminal(&mut session, &mut keys)?
            } else {
                let mut terminal = Terminal::new(TestBackend::new(80, 24))?;
                session.run(&mut terminal, &mut keys)?
            }
        }
        None => {
            if !std::io::stdout().is_terminal() {
                bail!("afkit annotate needs a terminal; for batch work use `afkit crowd export`");
            }
            with_terminal(&mut session, &mut TerminalKeys::start(stop)?)?
        }
    };
    if let Some(path) = &config.timings {
        session.timings.write(path)?;
    }
    Ok(Outcome { summary, setup })
}

/// Runs the session in the real terminal (raw mode, alternate screen, bracketed paste so that
/// pasted text arrives as one paste and not as keys), restoring the terminal on every way out:
/// normal return, error, panic (ratatui's hook) or signal (the session ends its loop and returns
/// here).
fn with_terminal(session: &mut Session, keys: &mut dyn Keys) -> Result<Summary> {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = crossterm::execute!(std::io::stdout(), crossterm::event::DisableBracketedPaste);
            ratatui::restore();
            let _ = crossterm::execute!(std::io::stdout(), crossterm::cursor::Show);
        }
    }
    let mut terminal = ratatui::try_init().context("cannot set up the terminal")?;
    let _restore = Restore;
    crossterm::execute!(std::io::stdout(), crossterm::event::EnableBracketedPaste)
        .context("cannot set up the terminal")?;
    session.run(&mut terminal, keys)
}
