//! Marks the engine's tests ignored, with their reason, when what they need is absent, as the
//! workspace's build script does for the integration tests: `offline` (the environment variable
//! AFKIT_TEST_OFFLINE is set: nothing may be downloaded) for those that fetch a default model,
//! and `has_shared_fixtures` (`../shared/fixtures` beside the workspace holds llama.cpp's
//! reference outputs) for those that compare with them. `scripts/reprobe` touches this file when
//! the machine changes, so the probe is made again then.

use std::path::Path;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=AFKIT_TEST_OFFLINE");
    println!("cargo::rustc-check-cfg=cfg(offline)");
    println!("cargo::rustc-check-cfg=cfg(has_shared_fixtures)");
    if std::env::var_os("AFKIT_TEST_OFFLINE").is_some() {
        println!("cargo::rustc-cfg=offline");
    }
    let fixtures = Path::new("../../../shared/fixtures");
    if fixtures.is_dir() {
        println!("cargo::rerun-if-changed={}", fixtures.display());
        println!("cargo::rustc-cfg=has_shared_fixtures");
    }
}
