//! Says what the integration tests can use on this machine, as cfgs they read to mark a test
//! ignored with its reason (so that a test that cannot run is counted as skipped, never shown as
//! passed): `has_shared_data` and `has_shared_fixtures` (the real corpora and the llama.cpp
//! reference outputs in `../shared`), `has_tmux`, `has_llama_server` (llama.cpp's server on
//! PATH), `has_python3`, `has_python_venv`, and `offline` (the environment variable
//! AFKIT_TEST_OFFLINE is set: nothing may be downloaded).
//!
//! Cargo re-runs this script when `../shared/data` or `../shared/fixtures` (when present) or
//! AFKIT_TEST_OFFLINE change. Nothing else is watched, so that `scripts/test` builds nothing the
//! release build (`scripts/demo`) already built: a re-run recompiles afkit. `scripts/reprobe`,
//! which both scripts run first, touches this file when the machine differs from what the last
//! build saw (tmux installed, llama-server put on PATH, `../shared` added) or when no stamp
//! describes an existing build, so the probes are made again then.

use std::path::Path;
use std::process::{Command, Stdio};

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn set(cfg: &str, present: bool) {
    println!("cargo::rustc-check-cfg=cfg({cfg})");
    if present {
        println!("cargo::rustc-cfg={cfg}");
    }
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=AFKIT_TEST_OFFLINE");
    let shared = Path::new("../shared");
    for (cfg, dir) in [
        ("has_shared_data", shared.join("data")),
        ("has_shared_fixtures", shared.join("fixtures")),
    ] {
        let present = dir.is_dir();
        if present {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
        set(cfg, present);
    }
    set("has_tmux", succeeds("tmux", &["-V"]));
    set("has_llama_server", succeeds("llama-server", &["--version"]));
    set("has_python3", succeeds("python3", &["--version"]));
    set(
        "has_python_venv",
        succeeds("python3", &["-c", "import ensurepip, venv"]),
    );
    set("offline", std::env::var_os("AFKIT_TEST_OFFLINE").is_some());
}
