//! Where the lab finds the upstream binaries, allot's binaries and its own.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The workspace root this crate was built in.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The profile directory (`target/<profile>`) of the running executable: its own directory, or
/// the parent of `deps/` for test executables.
fn profile_dir_of_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_path_buf)
    } else {
        Some(dir.to_path_buf())
    }
}

/// The directory of the upstream binaries (etcd, kube-apiserver, kube-controller-manager,
/// kube-scheduler, kubectl): `$ALLOT_TOOLS`, else `tools/` of the running executable's target
/// directory when it exists (worktrees share one target directory), else
/// `<workspace root>/target/tools`.
pub fn tools_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ALLOT_TOOLS") {
        return PathBuf::from(dir);
    }
    if let Some(tools) = profile_dir_of_exe().and_then(|p| p.parent().map(|t| t.join("tools")))
        && tools.join("kube-apiserver").exists()
    {
        return tools;
    }
    workspace_root().join("target/tools")
}

/// The directory of allot's binaries (`allot`, `allot-agent`, `allot-controller`, `allotctl`):
/// `$ALLOT_BIN`, else the running executable's profile directory when it holds them, else
/// `<workspace root>/target/release`.
pub fn allot_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ALLOT_BIN") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = profile_dir_of_exe()
        && dir.join("allot-agent").exists()
    {
        return dir;
    }
    workspace_root().join("target/release")
}

/// The default policy component built beside allot's binaries
/// (`<target>/wasm-default-policy/wasm32-wasip2/release/allot_policy_default.wasm`).
pub fn default_policy(allot_bin: &Path) -> PathBuf {
    allot_bin
        .parent()
        .unwrap_or(allot_bin)
        .join("wasm-default-policy/wasm32-wasip2/release/allot_policy_default.wasm")
}

/// The `allot-lab-node` binary: `$ALLOT_LAB_NODE`, else beside the running executable (or
/// beside its `deps/` directory, for tests).
pub fn node_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ALLOT_LAB_NODE") {
        return PathBuf::from(path);
    }
    profile_dir_of_exe()
        .unwrap_or_else(|| workspace_root().join("target/release"))
        .join("allot-lab-node")
}

/// `dir/name`, or an error saying how to get it.
pub fn tool(dir: &Path, name: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} is missing: run scripts/build-upstream.sh (it links target/tools), or point \
             ALLOT_TOOLS at a directory holding etcd, kube-apiserver, kube-controller-manager \
             and kube-scheduler",
            path.display()
        );
    }
    Ok(path)
}
