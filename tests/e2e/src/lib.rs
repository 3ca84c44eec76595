//! Helpers for the end-to-end tests: network namespaces, veth pairs, the agent, CNI plugins.
//!
//! Every test builds a [`Lab`]: a private "host" network namespace in which the main CNI plugins
//! (bridge, macvlan, host-local) run and create their bridges and parents, a standalone
//! `allot-agent` on temporary pools, socket and state, and a `CNI_PATH` holding Debian's plugins
//! and `allot`. Pods are further namespaces ([`Pod`]). Nothing is created in the machine's own
//! network namespace, and everything a test created is removed when its guard drops, panic or
//! not. Names carry the process id and a counter, so tests run in parallel.
//!
//! Tests call [`Lab::new`] first. A machine that cannot run them (not root, or
//! containernetworking-plugins missing) fails them, saying what is missing: a test that did not
//! run must not count as passed. `ALLOT_E2E_SKIP=<why>` skips them on purpose (`None`, after
//! printing `SKIP: ...`), as `ALLOT_LAB_SKIP` does for the lab's.

mod agent;
mod cni;
pub mod fleet;
pub mod kube;
mod lab;
mod netns;
pub mod probe;
pub mod registry;

pub use agent::*;
pub use cni::*;
pub use lab::*;
pub use netns::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Where Debian's containernetworking-plugins live.
pub const SYSTEM_CNI_DIR: &str = "/usr/lib/cni";
/// How long the agent may take to become ready (cold policy compilation on a busy 2-core box).
pub const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long one plugin invocation may take before it is killed and reported as hung.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub(crate) fn next_id() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A name unique across the processes of a test run: `prefix`, the pid, a separator, a counter.
/// Fits an interface name (15 bytes) when `prefix` has at most 2 characters.
pub fn unique_name(prefix: &str) -> String {
    let name = format!("{prefix}{:x}z{:x}", std::process::id(), next_id());
    assert!(name.len() <= 15, "interface name too long: {name}");
    name
}

/// What this machine lacks to run the end-to-end tests, if anything.
pub fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, veth pairs, bridges)".into());
    }
    let bridge = Path::new(SYSTEM_CNI_DIR).join("bridge");
    if !bridge.exists() {
        return Some(format!(
            "{} is missing (run scripts/setup.sh: containernetworking-plugins)",
            bridge.display()
        ));
    }
    None
}

/// True (after printing `SKIP: <test>: <reason>`) when `ALLOT_E2E_SKIP` is set: the tests are
/// skipped on purpose, and say so. Otherwise a machine that cannot run `test` fails it, naming
/// what is missing: a test that did not run must not pass.
pub fn skip(test: &str) -> bool {
    if let Ok(why) = std::env::var("ALLOT_E2E_SKIP") {
        println!("SKIP: {test}: ALLOT_E2E_SKIP is set ({why})");
        return true;
    }
    if let Some(reason) = missing() {
        panic!(
            "{test} cannot run here: {reason}; run it as root where scripts/setup.sh ran (CI \
             does), or set ALLOT_E2E_SKIP=<why> to skip the end-to-end tests on purpose"
        );
    }
    false
}

/// The directory holding the workspace's binaries: `$ALLOT_BIN_DIR`, else the profile directory
/// of the running test executable (`target/<profile>/deps/..`) when it holds `allot-agent`,
/// else the workspace's `target/release`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ALLOT_BIN_DIR") {
        return PathBuf::from(dir);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(profile) = exe.parent().and_then(Path::parent)
        && profile.join("allot-agent").exists()
        && profile.join("allot").exists()
    {
        return profile.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release")
}

/// The path of a workspace binary; panics with the build command when it is missing.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first with `cargo build --release -p allot-cni -p allot-agent`",
        path.display()
    );
    path
}

/// Runs a command to completion, returning its output; panics when it cannot be started.
pub(crate) fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs `ip ARGS...` in the machine's own namespace; `Err(stderr)` when it fails.
pub fn try_ip(args: &[&str]) -> Result<String, String> {
    let out = run(Command::new("ip").args(args));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
