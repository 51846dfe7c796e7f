//! Marks the engine's tests that fetch a default model ignored, with their reason, when the
//! environment variable AFKIT_TEST_OFFLINE is set (nothing may be downloaded), as the
//! workspace's build script does for the integration tests.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=AFKIT_TEST_OFFLINE");
    println!("cargo::rustc-check-cfg=cfg(offline)");
    if std::env::var_os("AFKIT_TEST_OFFLINE").is_some() {
        println!("cargo::rustc-cfg=offline");
    }
}
