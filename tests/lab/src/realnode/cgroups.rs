//! A node's cgroup root: the kubelet's `cgroupRoot`, under which it puts every pod (its
//! `kubepods` tree). This machine mounts cgroup v1 (a hierarchy per controller under
//! `/sys/fs/cgroup`, and a hybrid `unified` cgroup2 mount); the kubelet refuses a root that is
//! missing from any hierarchy, so the lab makes it in all of them first, and removes it once the
//! node is gone. Several nodes on one machine each get a root of their own.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

const CGROUP_FS: &str = "/sys/fs/cgroup";

/// The hierarchies mounted under `/sys/fs/cgroup` (links such as `cpu -> cpu,cpuacct` left out).
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(CGROUP_FS) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// A cgroup root of the lab's, `/<name>` in every hierarchy.
#[derive(Debug, Clone)]
pub struct CgroupRoot {
    pub name: String,
}

impl CgroupRoot {
    pub fn new(name: &str) -> CgroupRoot {
        CgroupRoot {
            name: name.to_string(),
        }
    }

    /// The kubelet's `cgroupRoot` value.
    pub fn path(&self) -> String {
        format!("/{}", self.name)
    }

    /// Makes the root in every hierarchy (cpuset's takes its parent's CPUs and memory nodes:
    /// a v1 cpuset cgroup starts with none, and no task could join it).
    pub fn create(&self) -> Result<()> {
        let all = hierarchies();
        if all.is_empty() {
            bail!("{CGROUP_FS} has no cgroup hierarchies: the real nodes need cgroups");
        }
        for h in all {
            let dir = h.join(&self.name);
            fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if h.file_name().is_some_and(|n| n == "cpuset") {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let parent = fs::read_to_string(h.join(file))?;
                    fs::write(dir.join(file), parent.trim())
                        .with_context(|| format!("writing {}", dir.join(file).display()))?;
                }
            }
        }
        Ok(())
    }

    /// Every process in the root (its own and its descendants'), by the `pids` hierarchy (or
    /// whichever one has the root).
    pub fn pids(&self) -> Vec<i32> {
        let mut out = Vec::new();
        for h in hierarchies() {
            let dir = h.join(&self.name);
            if dir.is_dir() {
                collect_pids(&dir, &mut out);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// SIGKILLs every process in the root until none is left (a container's processes may
    /// still be forking while the first ones die), for at most `within`.
    pub fn kill_all(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        let mut killed = 0;
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() > deadline {
                return killed;
            }
            for pid in pids {
                // SAFETY: kill(2) has no memory-safety preconditions.
                if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                    killed += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Removes the root from every hierarchy, deepest cgroups first (each must hold no
    /// process). Returns what could not be removed.
    pub fn remove(&self) -> Vec<String> {
        let mut left = Vec::new();
        for h in hierarchies() {
            let dir = h.join(&self.name);
            if dir.exists()
                && let Err(e) = remove_tree(&dir)
            {
                left.push(format!("{}: {e}", dir.display()));
            }
        }
        left
    }
}

/// The lab's cgroup roots left by a lab that did not end cleanly (its processes SIGKILLed, the
/// roots removed). Returns what it removed, for the log.
pub fn remove_leftovers() -> Vec<String> {
    let mut names: Vec<String> = hierarchies()
        .iter()
        .flat_map(|h| fs::read_dir(h).into_iter().flatten().flatten())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(ROOT_PREFIX))
        .collect();
    names.sort();
    names.dedup();
    let mut removed = Vec::new();
    for name in names {
        let root = CgroupRoot::new(&name);
        root.kill_all(Duration::from_secs(10));
        if root.remove().is_empty() {
            removed.push(format!("cgroup root /{name}"));
        }
    }
    removed
}

/// The prefix of the lab's cgroup roots (`allot-lab-node-1`, ...).
pub const ROOT_PREFIX: &str = "allot-lab-";

fn collect_pids(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&entry.path(), out);
        }
    }
}

/// rmdir(2) of a cgroup and its children, children first (a cgroup's files are not removable
/// and need not be: rmdir of the directory removes them).
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    fs::remove_dir(dir)
}
