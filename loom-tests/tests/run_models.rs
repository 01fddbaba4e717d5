//! Runs the loom models from a plain `cargo test -p loom-tests`.
//!
//! The models need `--cfg loom --cfg crossbeam_loom` for every crate in the
//! build, which a plain build cannot set, so this test runs a second cargo with
//! those flags and its own target directory (no lock conflict with the cargo
//! that runs this test), then checks that every model ran and passed.
#![cfg(not(loom))]

use std::path::Path;
use std::process::Command;

#[test]
fn loom_models_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(root)
        .args([
            "test",
            "-p",
            "loom-tests",
            "--release",
            "--test",
            "models",
            "--target-dir",
            "target/loom",
            "--",
            "--test-threads=2",
        ])
        .env("RUSTFLAGS", "--cfg loom --cfg crossbeam_loom")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env("LOOM_MAX_PREEMPTIONS", loom_tests::MAX_PREEMPTIONS)
        .output()
        .expect("could not start cargo for the loom models");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    if !output.status.success() {
        panic!(
            "the loom models failed ({}):\n{stdout}\n{stderr}",
            output.status
        );
    }
    for model in loom_tests::MODELS {
        let line = format!("test {model} ... ok");
        assert!(
            stdout.lines().any(|l| l.trim() == line),
            "loom model `{model}` did not run and pass:\n{stdout}\n{stderr}"
        );
    }
}
