//! Builds the default policy (`policies/default`) as a wasm32-wasip2 component in a target
//! directory of its own, so every host binary embeds it and a plain `cargo build` needs no
//! extra step.
//!
//! Set `ALLOT_DEFAULT_POLICY_WASM=/path/to/component.wasm` to embed a prebuilt component instead.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let embedded = out_dir.join("allot_policy_default.wasm");
    println!("cargo:rerun-if-env-changed=ALLOT_DEFAULT_POLICY_WASM");

    if let Some(prebuilt) = env::var_os("ALLOT_DEFAULT_POLICY_WASM") {
        let prebuilt = PathBuf::from(prebuilt);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        copy(&prebuilt, &embedded);
        return;
    }

    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("host/policy lives two levels below the workspace root")
        .to_path_buf();
    for watched in ["policies/default", "policies/sdk", "wit", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(sysroot) = sysroot
        && !sysroot.join("lib/rustlib").join(TARGET).exists()
    {
        panic!(
            "the default policy is built for {TARGET}, which this toolchain lacks; install it \
             with:\n\n    rustup target add {TARGET}\n"
        );
    }

    // A target directory of its own: the outer build holds the lock on target/<profile>.
    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        // Not shared with other policies: a policy that reuses the default's stages as a library
        // builds allot-policy-default without exports into its own target directory's output.
        .join("wasm-default-policy");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--release", "--locked", "--target", TARGET])
        .args(["-p", "allot-policy-default", "--features", "component"])
        .arg("--target-dir")
        .arg(&target_dir);
    // Flags meant for the host build (and clippy's wrapper) must not leak into the guest build.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("could not run cargo to build the default policy: {e}"));
    if !status.success() {
        panic!("building the default policy for {TARGET} failed (see the errors above)");
    }
    copy(
        &target_dir
            .join(TARGET)
            .join("release")
            .join("allot_policy_default.wasm"),
        &embedded,
    );
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
}
