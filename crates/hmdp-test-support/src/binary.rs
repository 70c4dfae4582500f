//! Finds the `hmdp` executable for tests that run it as a second process but
//! live outside `hmdp-tools`, the package that builds it (Cargo's
//! `CARGO_BIN_EXE_hmdp` exists only there).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// `target/<profile>/hmdp` next to the running test executable, built (or
/// brought up to date) once per test process by `cargo build -p hmdp-tools
/// --bin hmdp`: a test of the product alone (`cargo test -p hmdp`) must not
/// run a stale binary. Cargo releases its build lock before it runs the
/// tests, so this nested build does not wait on the outer one.
pub fn hmdp_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(build).clone()
}

fn build() -> PathBuf {
    // A test executable lives in `target/<profile>/deps/`.
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test executable is in target/<profile>/deps");
    let target_dir = profile_dir.parent().expect("target/<profile>");
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--quiet", "-p", "hmdp-tools", "--bin", "hmdp"])
        .arg("--target-dir")
        .arg(target_dir);
    if profile_dir
        .file_name()
        .is_some_and(|name| name == "release")
    {
        cargo.arg("--release");
    }
    let status = cargo.status().unwrap_or_else(|error| {
        panic!("cannot run cargo to build hmdp ({error}); run `cargo build -p hmdp-tools --bin hmdp` first")
    });
    assert!(
        status.success(),
        "`cargo build -p hmdp-tools --bin hmdp` failed ({status})"
    );
    let binary = profile_dir.join("hmdp");
    assert!(
        binary.exists(),
        "{} missing after the build",
        binary.display()
    );
    binary
}
