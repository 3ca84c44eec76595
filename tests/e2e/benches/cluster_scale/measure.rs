//! What a phase cost, read where the cluster keeps it: the API server's own counters
//! (`/metrics`), its audit log (each request's user, user agent, verb and URI), the nodes' log
//! of CNI ADD durations (`allot_lab::node::cni::ADD_LOG`), `/proc` (CPU time and resident
//! memory of processes) and the nodes' CNI result caches (addresses in two sandboxes).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use allot_cluster_tests::sandboxes::{Shared, sandboxes, shared_addresses};
use allot_lab::NodeInfo;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// `kubectl` of `target/tools` with the lab's admin kubeconfig; its stdout.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let tool = allot_lab::paths::tools_dir().join("kubectl");
    let out = Command::new(&tool)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .with_context(|| format!("running {}", tool.display()))?;
    if !out.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The API server's counters and gauges this benchmark reads.
#[derive(Clone, Debug, Default)]
pub struct ApiMetrics {
    /// Σ `apiserver_request_total`.
    pub requests: f64,
    /// `apiserver_longrunning_requests{verb="WATCH"}` by resource.
    pub watches: BTreeMap<String, f64>,
    /// Σ `apiserver_registered_watchers`.
    pub registered_watchers: f64,
}

impl ApiMetrics {
    pub fn read(kubeconfig: &Path) -> Result<ApiMetrics> {
        let text = kubectl(
            kubeconfig,
            &["get", "--raw", "/metrics", "--request-timeout=120s"],
        )?;
        let mut m = ApiMetrics::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let name = series.split('{').next().unwrap_or_default();
            match name {
                "apiserver_request_total" => m.requests += value,
                "apiserver_registered_watchers" => m.registered_watchers += value,
                "apiserver_longrunning_requests" if label(series, "verb") == "WATCH" => {
                    let resource = label(series, "resource");
                    *m.watches.entry(resource.to_string()).or_default() += value;
                }
                _ => {}
            }
        }
        Ok(m)
    }
}

fn label<'a>(series: &'a str, name: &str) -> &'a str {
    let key = format!("{name}=\"");
    series
        .find(&key)
        .map(|at| &series[at + key.len()..])
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_default()
}

/// One request of the audit log.
#[derive(Clone, Debug)]
pub struct Audited {
    pub user: String,
    /// The program of the user agent (`kube-controller-manager`, `whereabouts`, ...).
    pub agent: String,
    pub verb: String,
    pub uri: String,
    pub source: String,
    pub code: u16,
}

/// Reads the audit log from where it was last read, across the API server's rotation of it
/// (`--audit-log-maxsize`: the file is renamed `audit-<time>.log` and a new one begun).
pub struct AuditCursor {
    path: PathBuf,
    inode: u64,
    offset: u64,
}

impl AuditCursor {
    /// A cursor at the log's current end.
    pub fn at_end(logs: &Path) -> AuditCursor {
        let path = allot_lab::audit::log_path(logs);
        let meta = std::fs::metadata(&path).ok();
        AuditCursor {
            inode: meta.as_ref().map(|m| m.ino()).unwrap_or(0),
            offset: meta.map(|m| m.len()).unwrap_or(0),
            path,
        }
    }

    /// The requests logged since the last call.
    pub fn read(&mut self) -> Result<Vec<Audited>> {
        let mut text = Vec::new();
        let meta = std::fs::metadata(&self.path)?;
        if meta.ino() != self.inode {
            // Rotated: the rest of the renamed file (the newest audit-*.log), then the new one.
            if let Some(old) = self.rotated() {
                read_from(&old, self.offset, &mut text)?;
            }
            self.inode = meta.ino();
            self.offset = 0;
        }
        let read = read_from(&self.path, self.offset, &mut text)?;
        self.offset += read;
        Ok(String::from_utf8_lossy(&text)
            .lines()
            .filter_map(parse_audit)
            .collect())
    }

    fn rotated(&self) -> Option<PathBuf> {
        let dir = self.path.parent()?;
        let mut old: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
            })
            .collect();
        old.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
        old.pop()
    }
}

fn read_from(path: &Path, offset: u64, into: &mut Vec<u8>) -> Result<u64> {
    let mut file = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    file.seek(SeekFrom::Start(offset))?;
    let before = into.len();
    file.read_to_end(into)?;
    // Only whole lines: a line being written is read next time.
    let tail = into[before..]
        .iter()
        .rposition(|b| *b == b'\n')
        .map(|i| i + 1)
        .unwrap_or(0);
    into.truncate(before + tail);
    Ok(tail as u64)
}

fn parse_audit(line: &str) -> Option<Audited> {
    let e: Value = serde_json::from_str(line).ok()?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Some(Audited {
        user: text(&e["user"]["username"]),
        agent: text(&e["userAgent"])
            .split('/')
            .next()
            .unwrap_or_default()
            .to_string(),
        verb: text(&e["verb"]),
        uri: text(&e["requestURI"]),
        source: e["sourceIPs"][0].as_str().unwrap_or_default().to_string(),
        code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
    })
}

/// Requests by who made them: the IPAM's own users, the benchmark's (the admin), the rest
/// (kubelets, controllers, scheduler).
#[derive(Clone, Debug, Default)]
pub struct RequestCount {
    pub ipam: usize,
    pub ipam_refused: usize,
    pub admin: usize,
    pub others: usize,
    /// The IPAM's requests by user agent and verb.
    pub ipam_by: BTreeMap<String, usize>,
}

pub fn count(requests: &[Audited], ipam_users: &[String]) -> RequestCount {
    let mut c = RequestCount::default();
    for r in requests {
        if ipam_users.iter().any(|u| r.user.starts_with(u.as_str())) {
            c.ipam += 1;
            if r.code == 403 {
                c.ipam_refused += 1;
            }
            let who = if r.agent.is_empty() {
                r.user.rsplit(':').next().unwrap_or_default()
            } else {
                &r.agent
            };
            *c.ipam_by.entry(format!("{who} {}", r.verb)).or_default() += 1;
        } else if r.user == allot_lab::pki::ADMIN_USER {
            c.admin += 1;
        } else {
            c.others += 1;
        }
    }
    c
}

/// CPU time (utime + stime) of a process and of its waited-for children (cutime + cstime), in
/// seconds; None once it is gone.
pub fn cpu_seconds(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // SAFETY: sysconf(3) has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    // Fields 14-17 of proc(5): utime, stime, cutime, cstime (the state, field 3, is index 0).
    Some(((tick(11)? + tick(12)?) / hz, (tick(13)? + tick(14)?) / hz))
}

/// `VmRSS` and `VmHWM` (peak) of a process, MiB.
pub fn rss_mib(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| -> Option<f64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((kib("VmRSS:")? / 1024.0, kib("VmHWM:")? / 1024.0))
}

/// The durations the nodes noted for each ADD, read from where they were last read.
pub struct AddLog {
    files: Vec<(PathBuf, u64)>,
}

/// One ADD as a node noted it.
#[derive(Clone, Debug)]
pub struct Add {
    pub error: Option<String>,
    pub wait_ms: f64,
    pub add_ms: f64,
    pub ok: bool,
}

impl AddLog {
    pub fn at_end(nodes: &[allot_lab::NodeInfo]) -> AddLog {
        AddLog {
            files: nodes
                .iter()
                .map(|n| {
                    let path = n.root.join(allot_lab::node::cni::ADD_LOG);
                    let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                    (path, len)
                })
                .collect(),
        }
    }

    pub fn read(&mut self, namespace: &str) -> Vec<Add> {
        let mut out = Vec::new();
        for (path, offset) in &mut self.files {
            let mut text = Vec::new();
            let Ok(n) = read_from(path, *offset, &mut text) else {
                continue;
            };
            *offset += n;
            for line in String::from_utf8_lossy(&text).lines() {
                let Ok(v) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                if v["namespace"] != namespace {
                    continue;
                }
                out.push(Add {
                    error: v["error"].as_str().map(str::to_string),
                    wait_ms: v["wait_ms"].as_f64().unwrap_or(0.0),
                    add_ms: v["add_ms"].as_f64().unwrap_or(0.0),
                    ok: v["ok"].as_bool().unwrap_or(false),
                });
            }
        }
        out
    }
}

/// The `q`-quantile (0..=1) of `values` (sorted here), nearest rank.
pub fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// What the sampler of the nodes' sandboxes saw (the CNI result cache, whichever IPAM): the
/// failure users of Spiderpool (#1187, #3751) and Whereabouts (#176) reported, one address
/// answering in two pods, looked for every second through every phase. A pair counts when two
/// samples a second apart both see it: a sandbox whose DEL has released its address is torn
/// down within milliseconds, and a sample that reads the nodes one after another can catch its
/// file beside the next pod's. For a node-local IPAM (host-local, whose nodes each hand out the
/// whole pool) only two sandboxes of one node count: across nodes an address repeats by design.
#[derive(Clone, Debug, Default)]
pub struct Sharing {
    pub samples: usize,
    /// Each address and pair of pods seen sharing it, once.
    pub seen: BTreeSet<Shared>,
}

/// Samples the sandboxes of `ns` on `nodes` every second until `stop` is set; with `per_node`,
/// each node's apart from the others'.
pub fn sample_sharing(
    nodes: Vec<NodeInfo>,
    ns: String,
    per_node: bool,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Sharing> {
    std::thread::spawn(move || {
        let mut sharing = Sharing::default();
        let mut last = BTreeSet::new();
        while !stop.load(Ordering::Relaxed) {
            let found: BTreeSet<Shared> = if per_node {
                nodes
                    .iter()
                    .flat_map(|n| shared_addresses(&sandboxes(std::slice::from_ref(n), &ns)))
                    .collect()
            } else {
                shared_addresses(&sandboxes(&nodes, &ns))
                    .into_iter()
                    .collect()
            };
            sharing.samples += 1;
            for shared in found.intersection(&last) {
                if sharing.seen.insert(shared.clone()) {
                    println!("  ({shared})");
                }
            }
            last = found;
            std::thread::sleep(Duration::from_secs(1));
        }
        sharing
    })
}
