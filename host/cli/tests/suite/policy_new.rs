//! `allotctl policy new NAME` from an empty directory: the crate it writes builds for
//! wasm32-wasip2 with no edits and passes `allotctl policy test` on its own scenario. It builds
//! into a target directory of its own, `target/wasm-policy-new`: the new crate is outside the
//! workspace, so cargo builds the SDK and the default policy there as other units than
//! `make policies` does, and in a shared directory their outputs replaced the workspace's
//! (the next `make policies` then failed on two versions of the SDK).

use std::path::Path;
use std::process::Command;

#[test]
fn a_new_policy_builds_and_passes_its_scenario_without_edits() {
    let dir = tempfile::tempdir().unwrap();
    let allotctl = env!("CARGO_BIN_EXE_allotctl");
    let out = Command::new(allotctl)
        .args(["policy", "new", "fresh-policy", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let krate = dir.path().join("fresh-policy");
    for file in [
        "Cargo.toml",
        "Cargo.lock",
        "src/lib.rs",
        "scenarios/cluster-default-pools.yaml",
    ] {
        assert!(krate.join(file).is_file(), "{file} is missing");
    }

    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/wasm-policy-new");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(&krate)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target);
    // The outer build's flags and wrappers are not the new crate's.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
    ] {
        build.env_remove(var);
    }
    let built = build.output().unwrap();
    assert!(
        built.status.success(),
        "the scaffold does not build:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );

    let wasm = target.join("wasm32-wasip2/release/fresh_policy.wasm");
    let out = Command::new(allotctl)
        .args(["policy", "test", "--policy"])
        .arg(&wasm)
        .arg(krate.join("scenarios"))
        .env("ALLOT_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l == "1 passed, 0 failed"),
        "{stdout}"
    );
    assert!(stdout.contains("allot:policy@0.3.0"), "{stdout}");

    // Run again into the same directory: refused, nothing overwritten.
    let again = Command::new(allotctl)
        .args(["policy", "new", "fresh-policy", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));
}
