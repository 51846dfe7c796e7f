//! A real terminal for the tests of the annotation UI: tmux on a private socket.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// tmux on a private socket, so tests never touch a user's sessions.
pub struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// A tmux server with its socket in `dir` (the tests that need one are ignored when the
    /// tests were built where tmux is not installed).
    pub fn new(dir: &Path) -> Tmux {
        Tmux {
            socket: dir.join("tmux.sock"),
        }
    }

    pub fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// Starts `command` in a detached 80×24 session whose pane stays after the command exits.
    pub fn start(&self, name: &str, command: &str) {
        let out = self.cmd(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            "80",
            "-y",
            "24",
            command,
        ]);
        assert!(
            out.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.cmd(&["set-option", "-t", name, "remain-on-exit", "on"]);
    }

    pub fn keys(&self, name: &str, keys: &[&str]) {
        for k in keys {
            self.cmd(&["send-keys", "-t", name, k]);
        }
    }

    pub fn screen(&self, name: &str) -> String {
        String::from_utf8_lossy(
            &self
                .cmd(&["capture-pane", "-p", "-J", "-S", "-100", "-t", name])
                .stdout,
        )
        .into_owned()
    }

    pub fn wait_for(&self, name: &str, needle: &str) -> String {
        self.wait_for_all(name, &[needle])
    }

    /// Waits until the screen shows all of `needles` (a screen may be captured mid-redraw).
    pub fn wait_for_all(&self, name: &str, needles: &[&str]) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen(name);
            if needles.iter().all(|n| screen.contains(n)) {
                return screen;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out waiting for {needles:?}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pane_pid(&self, name: &str) -> u32 {
        let out = self.cmd(&["display-message", "-p", "-t", name, "#{pane_pid}"]);
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    pub fn pane_dead(&self, name: &str) -> bool {
        let out = self.cmd(&["display-message", "-p", "-t", name, "#{pane_dead}"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }

    pub fn wait_dead(&self, name: &str) {
        let start = Instant::now();
        while !self.pane_dead(name) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{name} did not exit"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}
