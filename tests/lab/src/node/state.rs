//! What the stand-in remembers of a pod on disk, under the node's
//! `/var/lib/kubelet/pods/<uid>/record.json`, so that a restarted stand-in finds the sandboxes
//! and processes of the pods it ran before (a kubelet asks its container runtime for those).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A container process the stand-in started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProcessRecord {
    pub container: String,
    pub pid: u32,
    /// Its start time in clock ticks (with the pid, its identity).
    pub start_ticks: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PodRecord {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub sandbox_id: Option<String>,
    /// The pod's network namespace name (None: hostNetwork or no sandbox).
    pub netns: Option<String>,
    pub processes: Vec<ProcessRecord>,
    /// Container name → restart count.
    pub restarts: BTreeMap<String, i32>,
}

/// The directory of the pods' records and volumes.
pub fn pods_dir(root: &Path) -> PathBuf {
    root.join("var/lib/kubelet/pods")
}

impl PodRecord {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("record.json")
    }

    pub fn load(dir: &Path) -> Option<PodRecord> {
        serde_json::from_slice(&fs::read(PodRecord::path(dir)).ok()?).ok()
    }

    pub fn save(&self, dir: &Path) {
        let write = fs::create_dir_all(dir).and_then(|()| {
            let tmp = dir.join("record.json.tmp");
            fs::write(&tmp, serde_json::to_vec_pretty(self).expect("serializable"))?;
            fs::rename(&tmp, PodRecord::path(dir))
        });
        if let Err(e) = write {
            tracing::warn!("{}: saving its record: {e}", self.name);
        }
    }
}

/// Every pod record on the node: (directory, record).
pub fn all(root: &Path) -> Vec<(PathBuf, PodRecord)> {
    let Ok(entries) = fs::read_dir(pods_dir(root)) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let dir = e.ok()?.path();
            let record = PodRecord::load(&dir)?;
            Some((dir, record))
        })
        .collect()
}
