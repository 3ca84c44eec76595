//! Network namespaces and veth pairs the tests create, and the addresses on them.

use std::fmt;
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{next_id, run, try_ip, unique_name};

/// A named network namespace (`ip netns add allot-e2e-<pid>-<n>`), deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
}

impl Netns {
    pub fn new() -> Netns {
        loop {
            let name = format!("allot-e2e-{}-{}", std::process::id(), next_id());
            match try_ip(&["netns", "add", &name]) {
                Ok(_) => {
                    let ns = Netns {
                        path: PathBuf::from("/run/netns").join(&name),
                        name,
                    };
                    ns.ip(&["link", "set", "lo", "up"]);
                    return ns;
                }
                // A namespace of that name left behind by an earlier process with our pid.
                Err(e) if e.contains("exists") => continue,
                Err(e) => panic!("{e}"),
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`: what `CNI_NETNS` names.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `ip -n <name> ARGS...`; `Err(stderr)` when it fails.
    pub fn try_ip(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        try_ip(&all)
    }

    /// `ip -n <name> ARGS...`; panics when it fails.
    #[track_caller]
    pub fn ip(&self, args: &[&str]) -> String {
        self.try_ip(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A command whose process enters this namespace (setns) just before it executes.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let file = File::open(&self.path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.path.display()));
        let mut cmd = Command::new(program);
        // SAFETY: the closure runs in the forked child before exec and only calls setns(2),
        // which is async-signal-safe. `file` is moved into the closure, so the descriptor stays
        // open until the child execs (it is close-on-exec).
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        cmd
    }

    /// Runs `argv` inside this namespace and returns its output.
    pub fn exec(&self, argv: &[&str]) -> Output {
        run(self.command(argv[0]).args(&argv[1..]))
    }

    /// Creates a veth pair with both ends in this namespace, both up; returns their names.
    pub fn veth_pair(&self) -> (String, String) {
        let a = unique_name("va");
        let b = unique_name("vb");
        self.ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        self.ip(&["link", "set", &a, "up"]);
        self.ip(&["link", "set", &b, "up"]);
        (a, b)
    }

    /// Creates a Linux bridge in this namespace, up; returns its name.
    pub fn bridge(&self) -> String {
        let name = unique_name("br");
        self.ip(&["link", "add", &name, "type", "bridge"]);
        self.ip(&["link", "set", &name, "up"]);
        name
    }

    pub fn link_exists(&self, ifname: &str) -> bool {
        self.try_ip(&["link", "show", "dev", ifname]).is_ok()
    }

    /// Every address on `ifname` (`ip -n NS -j addr show dev IF`); empty when the link is gone.
    pub fn addrs(&self, ifname: &str) -> Vec<IfAddr> {
        let Ok(out) = self.try_ip(&["-j", "addr", "show", "dev", ifname]) else {
            return Vec::new();
        };
        let links: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("ip -j addr printed bad JSON ({e}): {out}"));
        let mut addrs = Vec::new();
        for link in links.as_array().into_iter().flatten() {
            for info in link["addr_info"].as_array().into_iter().flatten() {
                let (Some(local), Some(prefix)) =
                    (info["local"].as_str(), info["prefixlen"].as_u64())
                else {
                    continue;
                };
                addrs.push(IfAddr {
                    addr: local
                        .parse()
                        .unwrap_or_else(|e| panic!("bad address {local}: {e}")),
                    prefix_len: prefix as u8,
                    scope: info["scope"].as_str().unwrap_or_default().to_string(),
                });
            }
        }
        addrs
    }

    /// The global-scope addresses on `ifname`, as `addr/prefix` strings.
    pub fn global_addrs(&self, ifname: &str) -> Vec<String> {
        self.addrs(ifname)
            .into_iter()
            .filter(|a| a.scope == "global")
            .map(|a| a.to_string())
            .collect()
    }

    /// Whether `addr` answers one ping from inside this namespace (retried for ~5 s, which
    /// covers IPv6 duplicate address detection and bridge port learning).
    pub fn ping(&self, addr: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = self.exec(&["ping", "-c", "1", "-W", "1", addr]);
            if out.status.success() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Default for Netns {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = try_ip(&["netns", "del", &self.name]) {
            eprintln!(
                "warning: cannot remove network namespace {}: {e}",
                self.name
            );
        }
    }
}

/// One address of a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    pub addr: IpAddr,
    pub prefix_len: u8,
    pub scope: String,
}

impl fmt::Display for IfAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

// ---------------------------------------------------------------------------------------------
// Addresses

/// The address part of `addr/prefix`.
#[track_caller]
pub fn addr_of(cidr: &str) -> IpAddr {
    let a = cidr.split('/').next().unwrap_or_default();
    a.parse()
        .unwrap_or_else(|e| panic!("not an address: {cidr:?}: {e}"))
}

/// Whether `addr` lies in the inclusive range `first..=last` (same family).
pub fn in_range(addr: IpAddr, first: &str, last: &str) -> bool {
    let (first, last): (IpAddr, IpAddr) = (first.parse().unwrap(), last.parse().unwrap());
    match (addr, first, last) {
        (IpAddr::V4(a), IpAddr::V4(f), IpAddr::V4(l)) => f <= a && a <= l,
        (IpAddr::V6(a), IpAddr::V6(f), IpAddr::V6(l)) => f <= a && a <= l,
        _ => false,
    }
}

/// Whether `addr` lies in the subnet `cidr`.
pub fn in_subnet(addr: IpAddr, cidr: &str) -> bool {
    let (net, len) = cidr.split_once('/').expect("CIDR");
    let net: IpAddr = net.parse().unwrap();
    let len: u32 = len.parse().unwrap();
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}
