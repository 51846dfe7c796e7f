//! Input for the annotation session: key presses from the terminal (crossterm) or replayed
//! from a script file, and the signals that end a session cleanly (SIGTERM, SIGHUP from a
//! closed terminal or dropped SSH connection, SIGINT through [`afkit_engine::interrupt`]).

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::app::Key;

/// What the session loop gets next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
    Key(Key),
    /// Text pasted into the terminal (bracketed paste): never taken as keys.
    Paste,
    /// Nothing happened for a while (or the terminal was resized): redraw, heartbeat.
    Tick,
    /// A signal asked the session to end, or the script is over.
    Stop,
}

pub(crate) trait Keys {
    /// Waits at most `timeout` for the next input.
    fn next(&mut self, timeout: Duration) -> Result<Input>;
}

/// A flag raised by SIGTERM or SIGHUP; the session polls it between inputs.
pub(crate) fn stop_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    #[cfg(unix)]
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGHUP] {
        signal_hook::flag::register(signal, Arc::clone(&flag))
            .context("cannot install the SIGTERM/SIGHUP handler")?;
    }
    Ok(flag)
}

fn stop_requested(flag: &AtomicBool) -> bool {
    flag.load(Ordering::SeqCst) || afkit_engine::interrupt::check().is_err()
}

/// Signals are noticed within this time even while no key is pressed.
const POLL: Duration = Duration::from_millis(200);

/// Keys from the terminal, read on a thread of their own.
///
/// crossterm's reader loops without end once the terminal is gone (a closed tmux session or
/// dropped SSH connection: every read returns end-of-file), so the session loop never waits on
/// crossterm itself. The reader thread first waits for the terminal with `poll(2)`, which
/// reports the hang-up, and only then lets crossterm read; the session loop waits on the thread's
/// channel, so it still sees SIGHUP/SIGTERM within [`POLL`] even if crossterm were stuck.
pub(crate) struct TerminalKeys {
    stop: Arc<AtomicBool>,
    inputs: Receiver<Input>,
}

impl TerminalKeys {
    pub(crate) fn start(stop: Arc<AtomicBool>) -> Result<TerminalKeys> {
        let tty = Tty::open()?;
        let (send, inputs) = mpsc::channel();
        std::thread::Builder::new()
            .name("terminal-keys".into())
            .spawn(move || read_terminal(&tty, &send))
            .context("cannot start the terminal reader")?;
        Ok(TerminalKeys { stop, inputs })
    }
}

impl Keys for TerminalKeys {
    fn next(&mut self, timeout: Duration) -> Result<Input> {
        if stop_requested(&self.stop) {
            return Ok(Input::Stop);
        }
        match self.inputs.recv_timeout(timeout.min(POLL)) {
            Ok(input) => Ok(input),
            Err(RecvTimeoutError::Timeout) => Ok(Input::Tick),
            Err(RecvTimeoutError::Disconnected) => Ok(Input::Stop),
        }
    }
}

/// The reader thread: sends every key, and `Stop` when the terminal hangs up or fails. Ends
/// when the session is over (its receiver dropped).
fn read_terminal(tty: &Tty, send: &Sender<Input>) {
    loop {
        let inputs = match tty.wait(POLL) {
            Ok(Readiness::Idle) => continue,
            Ok(Readiness::HungUp) | Err(_) => vec![Input::Stop],
            Ok(Readiness::Readable) => buffered_keys(),
        };
        for input in inputs {
            let stop = input == Input::Stop;
            if send.send(input).is_err() || stop {
                return;
            }
        }
    }
}

/// Every key crossterm can hand over without waiting. crossterm reads the terminal in chunks,
/// so keys typed in quick succession (or pasted) reach its buffer together; the terminal will not
/// report them readable again, so a key left in the buffer would wait for the next key press.
fn buffered_keys() -> Vec<Input> {
    let mut keys = Vec::new();
    loop {
        match event::poll(Duration::ZERO).and_then(|ready| ready.then(event::read).transpose()) {
            Ok(Some(Event::Key(k))) if k.kind != KeyEventKind::Release => {
                keys.extend(map_key(k).map(Input::Key));
            }
            Ok(Some(Event::Paste(_))) => keys.push(Input::Paste),
            Ok(Some(_)) => {}
            Ok(None) => return keys,
            Err(_) => {
                keys.push(Input::Stop);
                return keys;
            }
        }
    }
}

/// The terminal crossterm reads keys from: standard input when it is a terminal, else the
/// process's controlling terminal.
struct Tty {
    fd: std::os::fd::RawFd,
    /// Keeps `/dev/tty` open when it was opened here.
    _owned: Option<std::fs::File>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readiness {
    Readable,
    Idle,
    /// The other side closed: a killed tmux session, a dropped SSH connection, a closed window.
    HungUp,
}

impl Tty {
    fn open() -> Result<Tty> {
        use std::os::fd::AsRawFd;
        if std::io::stdin().is_terminal() {
            return Ok(Tty {
                fd: std::io::stdin().as_raw_fd(),
                _owned: None,
            });
        }
        let file = std::fs::File::open("/dev/tty").context("cannot open the terminal /dev/tty")?;
        Ok(Tty {
            fd: file.as_raw_fd(),
            _owned: Some(file),
        })
    }

    /// Waits at most `timeout` for input or a hang-up.
    fn wait(&self, timeout: Duration) -> std::io::Result<Readiness> {
        let mut pollfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd, whose fd stays open as long as `self` lives.
        let n = unsafe { libc::poll(&mut pollfd, 1, millis) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::Interrupted {
                Ok(Readiness::Idle)
            } else {
                Err(e)
            };
        }
        Ok(
            if pollfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                Readiness::HungUp
            } else if pollfd.revents & libc::POLLIN != 0 {
                Readiness::Readable
            } else {
                Readiness::Idle
            },
        )
    }
}

/// The app's key for a terminal key; `None` for keys that are not commands: Ctrl- and Alt-
/// combinations (Alt+q must not quit), except Ctrl+C.
fn map_key(k: KeyEvent) -> Option<Key> {
    Some(match k.code {
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Key::CtrlC,
        _ if k.modifiers.intersects(
            KeyModifiers::CONTROL | KeyModifiers::ALT | KeyModifiers::SUPER | KeyModifiers::META,
        ) =>
        {
            return None
        }
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        KeyCode::Backspace | KeyCode::Delete => Key::Backspace,
        KeyCode::Tab => Key::Char('\t'),
        _ => return None,
    })
}

/// Keys replayed from a file (the hidden `--script` mode used by tests and benchmarks).
///
/// The file holds whitespace-separated tokens: the names `Enter`, `Esc`, `Up`, `Down`,
/// `PageUp`, `PageDown`, `Home`, `End`, `Backspace`, `Tab`, `Space`, `C-c`; any other token is
/// typed character by character (`lulugl 1b3s Enter` labels and submits an item). When the
/// script ends, the session ends as if `q` was pressed.
pub(crate) struct ScriptKeys {
    keys: std::vec::IntoIter<Key>,
    delay: Duration,
    stop: Arc<AtomicBool>,
}

impl ScriptKeys {
    pub(crate) fn load(path: &Path, delay: Duration, stop: Arc<AtomicBool>) -> Result<ScriptKeys> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read key script {}", path.display()))?;
        let keys =
            parse_script(&text).with_context(|| format!("in key script {}", path.display()))?;
        Ok(ScriptKeys {
            keys: keys.into_iter(),
            delay,
            stop,
        })
    }
}

impl Keys for ScriptKeys {
    fn next(&mut self, _timeout: Duration) -> Result<Input> {
        if stop_requested(&self.stop) {
            return Ok(Input::Stop);
        }
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        Ok(self.keys.next().map_or(Input::Stop, Input::Key))
    }
}

pub(crate) fn parse_script(text: &str) -> Result<Vec<Key>> {
    let mut keys = Vec::new();
    for token in text.split_whitespace() {
        let named = match token {
            "Enter" => Some(Key::Enter),
            "Esc" => Some(Key::Esc),
            "Up" => Some(Key::Up),
            "Down" => Some(Key::Down),
            "PageUp" => Some(Key::PageUp),
            "PageDown" => Some(Key::PageDown),
            "Home" => Some(Key::Home),
            "End" => Some(Key::End),
            "Backspace" => Some(Key::Backspace),
            "Tab" => Some(Key::Char('\t')),
            "Space" => Some(Key::Char(' ')),
            "C-c" => Some(Key::CtrlC),
            _ => None,
        };
        match named {
            Some(k) => keys.push(k),
            None if token.chars().next().is_some_and(char::is_uppercase) && token.len() > 1 => {
                bail!("unknown key name {token:?} (names: Enter Esc Up Down PageUp PageDown Home End Backspace Tab Space C-c)")
            }
            None => keys.extend(token.chars().map(Key::Char)),
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_mix_names_and_typed_keys() {
        let keys = parse_script("lu 1b\nEnter C-c").unwrap();
        assert_eq!(
            keys,
            [
                Key::Char('l'),
                Key::Char('u'),
                Key::Char('1'),
                Key::Char('b'),
                Key::Enter,
                Key::CtrlC
            ]
        );
        assert!(parse_script("Entr").is_err());
    }

    #[test]
    fn terminal_keys_map_to_app_keys() {
        let k = |code, m| map_key(KeyEvent::new(code, m));
        assert_eq!(
            k(KeyCode::Char('c'), KeyModifiers::CONTROL),
            Some(Key::CtrlC)
        );
        assert_eq!(
            k(KeyCode::Char('l'), KeyModifiers::NONE),
            Some(Key::Char('l'))
        );
        assert_eq!(
            k(KeyCode::Char('?'), KeyModifiers::SHIFT),
            Some(Key::Char('?'))
        );
        assert_eq!(k(KeyCode::Delete, KeyModifiers::NONE), Some(Key::Backspace));
        for c in ['q', 'x', 'z'] {
            assert_eq!(k(KeyCode::Char(c), KeyModifiers::ALT), None, "Alt+{c}");
        }
        assert_eq!(k(KeyCode::Enter, KeyModifiers::ALT), None);
        assert_eq!(k(KeyCode::Char('z'), KeyModifiers::CONTROL), None);
        assert_eq!(k(KeyCode::F(1), KeyModifiers::NONE), None);
    }
}
