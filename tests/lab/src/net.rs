//! The lab's network: a bridge in the machine's namespace (the lab's L2 segment, with the API
//! server's address) and one network namespace per node, joined to the bridge by a veth pair.
//! Everything is named `allot-lab*` / `allotlab*` so that a killed run's leftovers are found
//! and removed by the next one; addresses are documentation ranges only (RFC 5737, RFC 3849).

use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The bridge in the machine's namespace.
pub const BRIDGE: &str = "allotlab0";
/// Prefix of every network namespace the lab creates (nodes and pods).
pub const NETNS_PREFIX: &str = "allot-lab-";
/// Prefix of the host ends of the nodes' veth pairs.
const VETH_PREFIX: &str = "allotlab-n";
/// The bridge's (and API server's) IPv4 address, in 198.51.100.0/24 (TEST-NET-2).
pub const HOST_IPV4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The bridge's IPv6 address, in 2001:db8:1ab::/64 (documentation prefix).
pub const HOST_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x1ab, 0, 0, 0, 0, 1);
/// Nodes take .11 upwards; pods of the underlay take 198.51.100.128/25, so at most this many.
pub const MAX_NODES: usize = 100;

/// The addresses of node `index` (1-based): 198.51.100.(10+i) and 2001:db8:1ab::(10+i).
pub fn node_addresses(index: usize) -> (Ipv4Addr, Ipv6Addr) {
    let host = 10 + index as u16;
    (
        Ipv4Addr::new(198, 51, 100, host as u8),
        Ipv6Addr::new(0x2001, 0xdb8, 0x1ab, 0, 0, 0, 0, host),
    )
}

/// `/run/netns/<name>`.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Runs `ip ARGS`; the error carries ip's message.
pub fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running ip (iproute2): is it installed?")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates the bridge with the host's addresses, up.
pub fn create_bridge() -> Result<()> {
    ip(&["link", "add", BRIDGE, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{HOST_IPV4}/24"), "dev", BRIDGE])?;
    // nodad: the address is usable at once (duplicate address detection takes a second or two,
    // and nothing else on this private segment can hold it).
    ip(&[
        "addr",
        "add",
        &format!("{HOST_IPV6}/64"),
        "dev",
        BRIDGE,
        "nodad",
    ])?;
    ip(&["link", "set", BRIDGE, "up"])?;
    Ok(())
}

/// Creates node `index`'s namespace `name`, its `eth0` (a veth whose peer is on the bridge),
/// its addresses and default routes; returns the namespace's path.
pub fn create_node_network(name: &str, index: usize) -> Result<PathBuf> {
    let (v4, v6) = node_addresses(index);
    let host_end = format!("{VETH_PREFIX}{index}");
    ip(&["netns", "add", name])?;
    ip(&[
        "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", name,
    ])?;
    ip(&["link", "set", &host_end, "master", BRIDGE, "up"])?;
    ip(&["-n", name, "link", "set", "lo", "up"])?;
    ip(&[
        "-n",
        name,
        "addr",
        "add",
        &format!("{v4}/24"),
        "dev",
        "eth0",
    ])?;
    ip(&[
        "-n",
        name,
        "addr",
        "add",
        &format!("{v6}/64"),
        "dev",
        "eth0",
        "nodad",
    ])?;
    ip(&["-n", name, "link", "set", "eth0", "up"])?;
    ip(&[
        "-n",
        name,
        "route",
        "add",
        "default",
        "via",
        &HOST_IPV4.to_string(),
    ])?;
    ip(&[
        "-n",
        name,
        "-6",
        "route",
        "add",
        "default",
        "via",
        &HOST_IPV6.to_string(),
    ])?;
    Ok(netns_path(name))
}

/// The names of the lab's network namespaces (nodes' and pods'), from `/run/netns`.
pub fn lab_namespaces() -> Vec<String> {
    let Ok(entries) = fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(NETNS_PREFIX))
        .collect();
    names.sort();
    names
}

/// The pids of the processes whose network namespace is the one pinned at `path`: found by the
/// namespace's inode, as `ip netns pids` does.
pub fn pids_in_netns(path: &Path) -> Vec<i32> {
    let Ok(meta) = fs::metadata(path) else {
        return Vec::new();
    };
    let want = format!("net:[{}]", meta.ino());
    let Ok(procs) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(|e| e.ok()?.file_name().into_string().ok()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|l| l.to_string_lossy() == want)
        })
        .collect()
}

/// Kills (SIGKILL) every process in the namespace pinned at `path`.
pub fn kill_processes_in(path: &Path) {
    let me = std::process::id() as i32;
    for pid in pids_in_netns(path) {
        if pid != me {
            // SAFETY: kill(2) with a pid and a signal number has no memory-safety preconditions.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Removes everything a lab left in the machine's namespace: processes still running in its
/// namespaces (killed), the namespaces, the nodes' veth ends and the bridge. Returns what it
/// removed, for the log.
pub fn remove_leftovers() -> Vec<String> {
    let mut removed = Vec::new();
    for name in lab_namespaces() {
        kill_processes_in(&netns_path(&name));
    }
    for name in lab_namespaces() {
        if ip(&["netns", "del", &name]).is_ok() {
            removed.push(format!("network namespace {name}"));
        }
    }
    if let Ok(links) = ip(&["-o", "link", "show"]) {
        for line in links.lines() {
            // "12: allotlab-n1@if2: <...>"
            let Some(name) = line
                .split(": ")
                .nth(1)
                .map(|n| n.split('@').next().unwrap_or(n))
            else {
                continue;
            };
            if (name.starts_with(VETH_PREFIX) || name == BRIDGE)
                && ip(&["link", "del", name]).is_ok()
            {
                removed.push(format!("link {name}"));
            }
        }
    }
    removed
}
