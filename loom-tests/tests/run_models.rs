//! Runs the loom models from a plain `cargo test -p loom-tests`, one test per
//! model.
//!
//! The models need `--cfg loom --cfg crossbeam_loom` for every crate in the
//! build, which a plain build cannot set, so the first test to need them builds
//! the models' test binary with a second cargo (once, shared by every test of
//! this binary) in a target directory of its own under this build's
//! (`CARGO_TARGET_TMPDIR/loom`: no lock conflict with the cargo that runs this
//! test, and wherever `CARGO_TARGET_DIR` puts it). Each test then runs that
//! binary filtered to its model and fails unless exactly that model ran and
//! passed. `every_model_has_its_own_test` checks that the list below, the crate's
//! [`loom_tests::MODELS`] and the models the binary holds are the same.
#![cfg(not(loom))]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// One `#[test]` per model (a module per model module of `tests/models.rs`),
/// and [`TESTED`], the names the models' harness gives them.
macro_rules! models {
    ($($model:ident),+ ; $($module:ident { $($inner:ident),+ })+) => {
        $(
            #[test]
            fn $model() {
                crate::run_model(stringify!($model));
            }
        )+
        $(
            mod $module {
                $(
                    #[test]
                    fn $inner() {
                        crate::run_model(concat!(stringify!($module), "::", stringify!($inner)));
                    }
                )+
            }
        )+
        /// Every model this binary has a test for, as the models' harness
        /// names it.
        const TESTED: &[&str] = &[
            $(stringify!($model),)+
            $($(concat!(stringify!($module), "::", stringify!($inner)),)+)+
        ];
    };
}

models! {
    stack_push_pop_is_exact,
    bag_push_races_take_all,
    stream_pool_two_threads_one_device,
    stream_get_races_purge,
    stream_put_to_busy_races_scan,
    lazy_device_table_two_threads,
    shared_event_last_two_clones,
    event_pool_two_threads_get_put,
    parked_error_two_drops,
    thread_cache_owner_races_a_drain,
    thread_cache_registration_races_a_drain;
    thread_exit {
        adopter_keeps_the_handles_racing_a_drain,
        one_adopter_per_orphaned_cell,
        adopter_is_not_served_the_orphans
    }
    in_place {
        owner_lease_races_a_drain,
        lease_ends_on_another_thread_racing_a_drain,
        vacate_races_give_and_drain,
        lease_ends_after_its_owner_exits
    }
    mock_backend {
        two_threads_every_call,
        completion_races_a_stream_ordered_free,
        queries_race_destroy_and_record
    }
    block_pool {
        reuse_waits_for_the_fence,
        give_after_races_trim,
        failed_record_races_take,
        idle_return_races_take
    }
    shards {
        adoption_from_an_exited_thread,
        trim_races_an_owner,
        forget_races_an_owner,
        retire_races_an_orphans_reader
    }
    completion {
        wake_races_the_gpu,
        drop_races_the_gpu,
        ordered_pair_never_resolves_early
    }
    capture {
        side_stream_return_races_a_get_during_a_capture
    }
}

/// The models' test binary, built once for every test of this binary (the
/// error text if the build failed, which then fails each of them).
fn models_binary() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(build_models) {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    }
}

/// Builds `tests/models.rs` with the loom flags, in release mode, and returns
/// the path of its test binary.
fn build_models() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("loom-tests has no parent directory (the workspace root)")?;
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("loom");
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
            "--no-run",
            // Artifacts as JSON on stdout, diagnostics rendered on stderr.
            "--message-format=json-render-diagnostics",
            "--target-dir",
        ])
        .arg(&target_dir)
        .env("RUSTFLAGS", "--cfg loom --cfg crossbeam_loom")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .output()
        .map_err(|e| format!("could not start cargo to build the loom models: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "building the loom models failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    // The only executable of this build is the models' test binary.
    stdout
        .lines()
        .filter(|l| l.contains(r#""reason":"compiler-artifact""#))
        .find_map(executable)
        .ok_or_else(|| format!("cargo reported no test binary for the loom models:\n{stdout}"))
}

/// The `"executable"` path of one line of cargo's JSON messages, if it has one.
fn executable(line: &str) -> Option<PathBuf> {
    const KEY: &str = r#""executable":""#;
    let start = line.find(KEY)? + KEY.len();
    let mut path = String::new();
    let mut chars = line[start..].chars();
    loop {
        match chars.next()? {
            '"' => return Some(PathBuf::from(path)),
            '\\' => match chars.next()? {
                'n' => path.push('\n'),
                't' => path.push('\t'),
                // `\\`, `\"` and `\/`; cargo escapes nothing else in a path
                // it can print.
                c => path.push(c),
            },
            c => path.push(c),
        }
    }
}

/// Runs the models' binary with `args` and the suite's preemption bound.
fn run_models_binary(args: &[&str]) -> Output {
    Command::new(models_binary())
        .args(args)
        .env("LOOM_MAX_PREEMPTIONS", loom_tests::MAX_PREEMPTIONS)
        .output()
        .expect("could not start the loom models' test binary")
}

/// Runs one model (its full name in the models' harness) and fails unless it,
/// and only it, ran and passed.
fn run_model(model: &str) {
    let output = run_models_binary(&["--exact", model, "--test-threads=1"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "loom model `{model}` failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let ran = format!("test {model} ... ok");
    assert!(
        stdout.lines().any(|l| l.trim() == ran)
            && stdout
                .lines()
                .any(|l| l.starts_with("test result: ok. 1 passed;")),
        "loom model `{model}` did not run and pass alone:\n{stdout}\n{stderr}"
    );
}

/// The tests of this binary, [`loom_tests::MODELS`] and the models the models'
/// binary holds name the same models: a model added to `tests/models.rs`
/// without a test here (or renamed) fails this test.
#[test]
fn every_model_has_its_own_test() {
    let tested: BTreeSet<&str> = TESTED.iter().copied().collect();
    assert_eq!(tested.len(), TESTED.len(), "a model is listed twice");
    let listed: BTreeSet<&str> = loom_tests::MODELS.iter().copied().collect();
    assert_eq!(
        tested, listed,
        "the tests here and loom_tests::MODELS differ"
    );

    let output = run_models_binary(&["--list", "--format", "terse"]);
    assert!(output.status.success(), "listing the loom models failed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let held: BTreeSet<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .collect();
    assert_eq!(
        tested, held,
        "the tests here and the models in tests/models.rs differ"
    );
}
