//! Helpers for the end-to-end tests: network namespaces, veth pairs, the agent, CNI plugins.
//!
//! Every test builds a [`Lab`]: a private "host" network namespace in which the main CNI plugins
//! (bridge, macvlan, host-local) run and create their bridges and parents, a standalone
//! `allot-agent` on temporary pools, socket and state, and a `CNI_PATH` holding Debian's plugins
//! and `allot`. Pods are further namespaces ([`Pod`]). Nothing is created in the machine's own
//! network namespace, and everything a test created is removed when its guard drops, panic or
//! not. Names carry the process id and a counter, so tests run in parallel.
//!
//! Tests call [`Lab::new`] first: it returns `None` (after printing `SKIP: ...`) when the
//! machine cannot run them (not root, or containernetworking-plugins missing).

pub mod fleet;
pub mod kube;
pub mod probe;
pub mod registry;

use std::fmt;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::symlink;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Where Debian's containernetworking-plugins live.
pub const SYSTEM_CNI_DIR: &str = "/usr/lib/cni";
/// How long the agent may take to become ready (cold policy compilation on a busy 2-core box).
pub const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long one plugin invocation may take before it is killed and reported as hung.
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn next_id() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A name unique across the processes of a test run: `prefix`, the pid, a separator, a counter.
/// Fits an interface name (15 bytes) when `prefix` has at most 2 characters.
pub fn unique_name(prefix: &str) -> String {
    let name = format!("{prefix}{:x}z{:x}", std::process::id(), next_id());
    assert!(name.len() <= 15, "interface name too long: {name}");
    name
}

/// Why the end-to-end tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
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

/// True (after printing `SKIP: <test>: <reason>`) when this machine cannot run the test.
pub fn skip(test: &str) -> bool {
    match skip_reason() {
        Some(reason) => {
            println!("SKIP: {test}: {reason}");
            true
        }
        None => false,
    }
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
fn run(cmd: &mut Command) -> Output {
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

// ---------------------------------------------------------------------------------------------
// Network namespaces

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

// ---------------------------------------------------------------------------------------------
// Pool documents

/// An `IPPool` document. `ips` empty: every usable host of `subnet`.
pub fn ippool(name: &str, subnet: &str, gateway: Option<&str>, ips: &[&str]) -> String {
    let mut spec = json!({ "subnet": subnet });
    if let Some(gw) = gateway {
        spec["gateway"] = json!(gw);
    }
    if !ips.is_empty() {
        spec["ips"] = json!(ips);
    }
    document("IPPool", name, spec)
}

/// A YAML document of `kind` (JSON is YAML) with `apiVersion: allot.dev/v1alpha1`.
pub fn document(kind: &str, name: &str, spec: Value) -> String {
    format!(
        "---\n{}\n",
        json!({
            "apiVersion": "allot.dev/v1alpha1",
            "kind": kind,
            "metadata": { "name": name },
            "spec": spec,
        })
    )
}

// ---------------------------------------------------------------------------------------------
// The agent

/// A standalone `allot-agent` on a temporary pools directory, socket and state file. Killed on
/// drop (SIGTERM, then SIGKILL); its log is checked for panics.
pub struct Agent {
    dir: tempfile::TempDir,
    pools_dir: PathBuf,
    child: Option<Child>,
    starts: u32,
    /// Flags and values that replace the lab's defaults (see [`Agent::flags`]).
    overrides: Vec<(String, String)>,
    /// Another agent's state file, to share one store.
    state: Option<PathBuf>,
    /// Serve the pools directory (`--standalone`); without it the agent reads pools from its
    /// `--store` (etcd).
    standalone: bool,
    /// The network namespace the agent runs in (the machine's own when `None`).
    netns: Option<PathBuf>,
}

/// The lab's agent flags: no cooldown and no GC grace period, so tests see releases at once
/// (the tests of those behaviours set them), and a fast tick.
const LAB_FLAGS: &[(&str, &str)] = &[
    ("--cooldown-seconds", "0"),
    ("--gc-grace-seconds", "0"),
    ("--reload-interval-ms", "200"),
];

impl Agent {
    /// Writes `pools` (YAML documents) to `pools.yaml` in a fresh pools directory, starts the
    /// agent and waits until `/readyz` answers 200.
    pub fn start(pools: &str) -> Agent {
        Self::start_with(pools, &[])
    }

    /// [`Agent::start`] with flags replacing the lab's defaults (e.g. `("--cooldown-seconds",
    /// "30")`; a switch takes an empty value: `("--probe-conflict", "")`).
    pub fn start_with(pools: &str, flags: &[(&str, &str)]) -> Agent {
        let mut agent = Self::unstarted(flags);
        let pools_dir = agent.dir.path().join("pools");
        fs::create_dir(&pools_dir).unwrap();
        agent.pools_dir = pools_dir;
        agent.write_pools("pools.yaml", pools);
        agent.spawn();
        agent.wait_ready();
        agent
    }

    /// Starts the agent on an existing pools directory (which the tests do not write to), with
    /// a temporary socket and state file.
    pub fn start_on(pools_dir: &Path) -> Agent {
        let mut agent = Self::unstarted(&[]);
        agent.pools_dir = pools_dir.to_path_buf();
        agent.spawn();
        agent.wait_ready();
        agent
    }

    /// A second agent on the same pools directory, the same state file and the same flags as
    /// `other` (its own socket and journal): two agents sharing one store.
    pub fn start_sharing(other: &Agent) -> Agent {
        // Same flags too: `--store etcd://…` shares the etcd store.
        Self::start_sharing_with(other, &[])
    }

    /// [`Agent::start_sharing`] with `flags` replacing those of `other` (e.g. another
    /// `--node-name`: a second node on the same store).
    pub fn start_sharing_with(other: &Agent, flags: &[(&str, &str)]) -> Agent {
        let mut agent = Self::unstarted(&[]);
        agent.pools_dir = other.pools_dir();
        agent.state = Some(other.state());
        agent.overrides = other
            .overrides
            .iter()
            .filter(|(k, _)| !flags.iter().any(|(f, _)| f == k))
            .cloned()
            .chain(flags.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        agent.spawn();
        agent.wait_ready();
        agent
    }

    fn unstarted(flags: &[(&str, &str)]) -> Agent {
        let dir = tempfile::Builder::new()
            .prefix("allot-e2e-agent-")
            .tempdir()
            .expect("temp dir");
        Agent {
            pools_dir: dir.path().join("pools"),
            dir,
            child: None,
            starts: 0,
            overrides: flags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            state: None,
            standalone: true,
            netns: None,
        }
    }

    /// [`Agent::start_with`] inside `netns`, as a node's agent runs in the node's namespace
    /// (where probing ahead finds the bridges and macvlan masters the main plugins use).
    pub fn start_in(netns: &Netns, pools: &str, flags: &[(&str, &str)]) -> Agent {
        let mut agent = Self::unstarted(flags);
        agent.netns = Some(netns.path().to_path_buf());
        let pools_dir = agent.dir.path().join("pools");
        fs::create_dir(&pools_dir).unwrap();
        agent.pools_dir = pools_dir;
        agent.write_pools("pools.yaml", pools);
        agent.spawn();
        agent.wait_ready();
        agent
    }

    /// An agent serving the pools kept in etcd (`--store URL`, no `--standalone`), once they
    /// are there.
    pub fn start_on_etcd_pools(url: &str) -> Agent {
        let mut agent = Self::unstarted(&[("--store", url)]);
        agent.standalone = false;
        agent.spawn();
        agent.wait_ready();
        agent
    }

    /// An agent in cluster mode (`--kubernetes`) on the API server of `kubeconfig`, as node
    /// `node`, with the lab's flags and `flags`.
    pub fn start_on_cluster(kubeconfig: &Path, node: &str, flags: &[(&str, &str)]) -> Agent {
        let mut all = vec![
            ("--kubernetes", ""),
            ("--kubeconfig", kubeconfig.to_str().expect("UTF-8 path")),
            ("--node-name", node),
        ];
        all.extend_from_slice(flags);
        let mut agent = Self::unstarted(&all);
        agent.standalone = false;
        agent.spawn();
        agent.wait_ready();
        agent
    }

    /// The flags the agent runs with beyond directory, socket, state and journal (a flag
    /// with an empty value is passed bare, like `--kubernetes`).
    pub fn flags(&self) -> Vec<(String, String)> {
        let mut flags: Vec<(String, String)> = LAB_FLAGS
            .iter()
            .filter(|(k, _)| !self.overrides.iter().any(|(o, _)| o == k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        flags.extend(self.overrides.iter().cloned());
        flags
    }

    /// Where the plugin remembers DELs for this agent (next to its socket, as
    /// [`allot_ipam`] configures the plugin).
    pub fn journal(&self) -> PathBuf {
        journal_next_to(&self.socket())
    }

    pub fn pools_dir(&self) -> PathBuf {
        self.pools_dir.clone()
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    pub fn state(&self) -> PathBuf {
        self.state
            .clone()
            .unwrap_or_else(|| self.dir.path().join("allot.db"))
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("agent.log")
    }

    /// Everything the agent printed so far, across restarts.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Writes (or replaces, atomically) `file` in the pools directory (a temporary one: see
    /// [`Agent::start`]).
    pub fn write_pools(&self, file: &str, yaml: &str) {
        let tmp = self.dir.path().join(format!(".{file}.tmp"));
        fs::write(&tmp, yaml).unwrap();
        fs::rename(&tmp, self.pools_dir().join(file)).unwrap();
    }

    pub fn remove_pools(&self, file: &str) {
        fs::remove_file(self.pools_dir().join(file)).unwrap();
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "agent already running");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        self.starts += 1;
        writeln!(&log, "=== e2e: start #{} ===", self.starts).unwrap();
        let mut command = Command::new(bin("allot-agent"));
        if let Some(netns) = &self.netns {
            let file = File::open(netns)
                .unwrap_or_else(|e| panic!("cannot open {}: {e}", netns.display()));
            // SAFETY: as in `Netns::command`: only setns(2) between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        if self.standalone {
            command.arg("--standalone").arg(self.pools_dir());
        }
        command
            .arg("--socket")
            .arg(self.socket())
            .arg("--state")
            .arg(self.state())
            .arg("--journal")
            .arg(self.journal());
        for (flag, value) in self.flags() {
            // A switch (`--kubernetes`, `--probe-conflict`) is given with an empty value.
            command.arg(flag);
            if !value.is_empty() {
                command.arg(value);
            }
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start allot-agent: {e}"));
        self.child = Some(child);
    }

    /// Waits until `/readyz` answers 200; panics with the log when the agent exits or times out.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + AGENT_READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                panic!(
                    "allot-agent exited before it was ready ({status}); log:\n{}",
                    self.log()
                );
            }
            if matches!(self.get(allot_api::READYZ), Ok((200, _))) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "allot-agent not ready after {AGENT_READY_TIMEOUT:?}; log:\n{}",
                    self.log()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET path` over the agent's socket: (status code, body).
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        http_get(&self.socket(), path)
    }

    /// The agent's `GET /v1/status`.
    #[track_caller]
    pub fn status(&self) -> allot_api::StatusResponse {
        let (code, body) = self
            .get(allot_api::STATUS)
            .unwrap_or_else(|e| panic!("GET /v1/status: {e}"));
        assert_eq!(code, 200, "GET /v1/status answered {code}: {body}");
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET /v1/status: bad body ({e}): {body}"))
    }

    /// (total, free) of `pool` per `GET /v1/status`.
    #[track_caller]
    pub fn pool_counts(&self, pool: &str) -> (u64, u64) {
        let status = self.status();
        let p = status
            .pools
            .iter()
            .find(|p| p.name == pool)
            .unwrap_or_else(|| panic!("pool {pool} not in /v1/status: {status:?}"));
        (p.total, p.free)
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` to the running agent.
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on the pid of a child we have not reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, signal);
            }
        }
    }

    /// SIGSTOP: the agent hangs (its socket still accepts connections, nothing answers).
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`Agent::freeze`].
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGTERM and wait (up to 10 s) for the exit status; SIGKILL after that.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.thaw();
        self.signal(libc::SIGTERM);
        let mut child = self.child.take()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
                _ => {
                    eprintln!("allot-agent ignored SIGTERM for 10 s; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
            }
        }
    }

    /// Starts the agent again (after killing it if it still runs) on the same pools, socket and
    /// state, and waits until it is ready.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
        self.wait_ready();
    }

    /// Whether the agent process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
        if !thread::panicking() {
            let log = self.log();
            assert!(
                !log.contains("panicked"),
                "allot-agent panicked; log:\n{log}"
            );
        }
    }
}

/// A minimal HTTP/1.1 GET over a unix socket: (status code, body).
pub fn http_get(socket: &Path, path: &str) -> std::io::Result<(u16, String)> {
    http_request(socket, "GET", path, "")
}

/// POSTs a JSON body to the agent's API, as the plugin does; returns status and body.
pub fn http_post(socket: &Path, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    http_request(socket, "POST", path, body)
}

fn http_request(
    socket: &Path,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let (code, body_start, length) = loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(bad("connection closed before the response head"));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let code = head
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse::<u16>().ok())
                .ok_or_else(|| bad("bad status line"))?;
            let length = head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            });
            break (code, end + 4, length);
        }
    };
    loop {
        if length.is_some_and(|l| buf.len() >= body_start + l) {
            break;
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) if length.is_none() => break,
            Err(e) => return Err(e),
        }
    }
    let end = length.map_or(buf.len(), |l| (body_start + l).min(buf.len()));
    Ok((
        code,
        String::from_utf8_lossy(&buf[body_start..end]).into_owned(),
    ))
}

// ---------------------------------------------------------------------------------------------
// CNI plugins

/// A `CNI_PATH` directory holding `allot` (a symlink to the built binary); removed on drop.
pub struct PluginDir {
    dir: tempfile::TempDir,
}

impl PluginDir {
    pub fn new() -> PluginDir {
        let dir = tempfile::Builder::new()
            .prefix("allot-e2e-cni-")
            .tempdir()
            .expect("temp dir");
        symlink(bin("allot"), dir.path().join("allot")).unwrap();
        PluginDir { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `/usr/lib/cni:<this dir>`.
    pub fn cni_path(&self) -> String {
        format!("{SYSTEM_CNI_DIR}:{}", self.dir.path().display())
    }

    /// Where `plugin` is: `allot` here, the others in `/usr/lib/cni`.
    pub fn plugin(&self, plugin: &str) -> PathBuf {
        let own = self.dir.path().join(plugin);
        if own.exists() {
            own
        } else {
            Path::new(SYSTEM_CNI_DIR).join(plugin)
        }
    }
}

impl Default for PluginDir {
    fn default() -> Self {
        Self::new()
    }
}

/// One plugin invocation: the `CNI_*` environment and the network config on stdin.
#[derive(Clone, Debug)]
pub struct Cni {
    pub plugin: PathBuf,
    /// `CNI_COMMAND`, `CNI_CONTAINERID`, ... in the order they are set; `None` leaves one out.
    pub env: Vec<(String, Option<String>)>,
    pub stdin: String,
}

impl Cni {
    /// An invocation of `plugin` with `CNI_COMMAND`, `CNI_PATH` and the config; add the
    /// attachment with [`Cni::attachment`] or [`Cni::set`].
    pub fn new(plugins: &PluginDir, plugin: &str, command: &str, config: &str) -> Cni {
        Cni {
            plugin: plugins.plugin(plugin),
            env: vec![
                ("CNI_COMMAND".into(), Some(command.into())),
                ("CNI_PATH".into(), Some(plugins.cni_path())),
            ],
            stdin: config.into(),
        }
    }

    /// Sets (or, with `None`, leaves out) one environment variable.
    pub fn set(mut self, key: &str, value: Option<&str>) -> Cni {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.map(str::to_string)));
        self
    }

    /// `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME` and `CNI_ARGS` of an attachment.
    pub fn attachment(self, att: &Attachment) -> Cni {
        self.set("CNI_CONTAINERID", Some(&att.container_id))
            .set("CNI_NETNS", Some(&att.netns.path().display().to_string()))
            .set("CNI_IFNAME", Some(&att.ifname))
            .set("CNI_ARGS", Some(&att.args()))
    }

    /// Runs the plugin (inside `run_in` when given), feeding the config on stdin; kills it after
    /// [`PLUGIN_TIMEOUT`]. Panics when the plugin's stderr says it panicked.
    pub fn run(&self, run_in: Option<&Netns>) -> CniOutput {
        let mut cmd = match run_in {
            Some(ns) => ns.command(&self.plugin),
            None => Command::new(&self.plugin),
        };
        cmd.env_clear().env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        );
        for (k, v) in &self.env {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.plugin.display()));
        let mut stdin = child.stdin.take().unwrap();
        let input = self.stdin.clone();
        let writer = thread::spawn(move || {
            let _ = stdin.write_all(input.as_bytes());
        });
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let out_reader = thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stdout.read_to_end(&mut s);
            s
        });
        let err_reader = thread::spawn(move || {
            let mut s = Vec::new();
            let _ = stderr.read_to_end(&mut s);
            s
        });
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() < PLUGIN_TIMEOUT => {
                    thread::sleep(Duration::from_millis(2))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "{} hung for {PLUGIN_TIMEOUT:?} and was killed\n{}",
                        self.plugin.display(),
                        self.describe()
                    );
                }
            }
        };
        let elapsed = started.elapsed();
        let _ = writer.join();
        let stdout = String::from_utf8_lossy(&out_reader.join().unwrap()).into_owned();
        let stderr = String::from_utf8_lossy(&err_reader.join().unwrap()).into_owned();
        let json = serde_json::from_str(stdout.trim()).ok();
        let out = CniOutput {
            call: self.describe(),
            status,
            stdout,
            stderr,
            json,
            elapsed,
        };
        assert!(
            !out.stderr.contains("panicked") && !out.stdout.contains("panicked"),
            "a plugin panicked:\n{out}"
        );
        out
    }

    /// The invocation as a shell line, for failure messages and bug reports.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.env {
            if let Some(v) = v {
                s.push_str(&format!("{k}='{v}' "));
            }
        }
        s.push_str(&format!(
            "{} <<'EOF'\n{}\nEOF",
            self.plugin.display(),
            self.stdin
        ));
        s
    }
}

/// What a plugin printed and how it exited.
#[derive(Clone, Debug)]
pub struct CniOutput {
    /// The invocation, as [`Cni::describe`] prints it.
    pub call: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// stdout parsed as JSON, when it is.
    pub json: Option<Value>,
    pub elapsed: Duration,
}

impl CniOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The CNI error code of a failure (`code` of the error object on stdout).
    pub fn code(&self) -> Option<u64> {
        self.json.as_ref()?.get("code")?.as_u64()
    }

    /// The error message of a failure (`msg`, then `details`).
    pub fn msg(&self) -> String {
        let Some(json) = &self.json else {
            return String::new();
        };
        format!(
            "{} {}",
            json["msg"].as_str().unwrap_or_default(),
            json["details"].as_str().unwrap_or_default()
        )
    }

    /// The `address` of every entry of the result's `ips`.
    pub fn ips(&self) -> Vec<String> {
        self.json
            .as_ref()
            .and_then(|j| j["ips"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str().map(str::to_string))
            .collect()
    }

    /// The only address of the result (panics unless there is exactly one).
    #[track_caller]
    pub fn ip(&self) -> String {
        let ips = self.ips();
        assert_eq!(ips.len(), 1, "expected one address:\n{self}");
        ips.into_iter().next().unwrap()
    }

    /// Panics, with the whole invocation, unless the plugin succeeded.
    #[track_caller]
    pub fn expect_ok(&self) -> &CniOutput {
        assert!(self.success(), "plugin failed:\n{self}");
        self
    }

    /// Panics, with the whole invocation, unless the plugin failed with a well-formed CNI error
    /// object whose code is one of `codes` and whose message is not empty.
    #[track_caller]
    pub fn expect_err(&self, codes: &[u64]) -> &CniOutput {
        let code = self.expect_failure();
        assert!(
            codes.contains(&code),
            "expected error code {codes:?}, got {code}:\n{self}"
        );
        self
    }

    /// Panics unless the plugin failed with a well-formed CNI error object (a numeric `code`, a
    /// `msg` that is not empty); returns the code.
    #[track_caller]
    pub fn expect_failure(&self) -> u64 {
        assert!(
            !self.success(),
            "plugin succeeded, expected an error:\n{self}"
        );
        let code = self
            .code()
            .unwrap_or_else(|| panic!("failure without a CNI error object on stdout:\n{self}"));
        assert!(
            !self.msg().trim().is_empty(),
            "error without a message:\n{self}"
        );
        code
    }
}

impl fmt::Display for CniOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "--- call:\n{}", self.call)?;
        writeln!(f, "--- exit: {} after {:?}", self.status, self.elapsed)?;
        writeln!(f, "--- stdout:\n{}", self.stdout.trim_end())?;
        write!(f, "--- stderr:\n{}", self.stderr.trim_end())
    }
}

// ---------------------------------------------------------------------------------------------
// Pods and attachments

/// One interface of one pod: the container, its network namespace, the interface name and the
/// pod identity the runtime passes in `CNI_ARGS`.
#[derive(Clone, Debug)]
pub struct Attachment {
    pub netns: Arc<Netns>,
    pub container_id: String,
    pub ifname: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `ALLOT_OWNER` (e.g. `StatefulSet/web`), when set.
    pub owner: Option<String>,
}

impl Attachment {
    /// Pod `name` in namespace `default`, `eth0`, in a fresh network namespace.
    pub fn new(name: &str) -> Attachment {
        Attachment::in_netns(&Arc::new(Netns::new()), name)
    }

    /// Pod `name`, `eth0`, in an existing network namespace.
    pub fn in_netns(netns: &Arc<Netns>, name: &str) -> Attachment {
        let n = next_id();
        let pid = std::process::id();
        Attachment {
            netns: netns.clone(),
            container_id: format!("e2e{pid:08x}{n:08x}{:040x}", 0xa110c),
            ifname: "eth0".into(),
            namespace: "default".into(),
            name: name.into(),
            uid: format!(
                "00000000-e2e0-{:04x}-{:04x}-{:012x}",
                pid & 0xffff,
                n & 0xffff,
                n
            ),
            owner: None,
        }
    }

    /// Another interface of the same pod (same container, namespace and identity).
    pub fn with_ifname(&self, ifname: &str) -> Attachment {
        Attachment {
            ifname: ifname.into(),
            ..self.clone()
        }
    }

    /// `CNI_ARGS` as containerd passes it for a Kubernetes pod.
    pub fn args(&self) -> String {
        let mut args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            self.namespace, self.name, self.container_id, self.uid
        );
        if let Some(owner) = &self.owner {
            args.push_str(&format!(";ALLOT_OWNER={owner}"));
        }
        args
    }

    /// The global addresses on this interface inside the pod.
    pub fn addrs(&self) -> Vec<String> {
        self.netns.global_addrs(&self.ifname)
    }

    /// `{"containerID", "ifname"}` as GC's valid-attachments list holds it.
    pub fn gc_entry(&self) -> Value {
        json!({ "containerID": self.container_id, "ifname": self.ifname })
    }
}

// ---------------------------------------------------------------------------------------------
// Network configs

/// The DEL journal of the agent on `socket`: in the test's directory, never the real
/// `/var/lib/allot/journal`.
pub fn journal_next_to(socket: &Path) -> PathBuf {
    socket
        .parent()
        .expect("socket in a directory")
        .join("journal")
}

/// An ipam section for allot on `socket` with the CNI config's default pools.
pub fn allot_ipam(socket: &Path, v4: &[&str], v6: &[&str]) -> Value {
    let mut ipam = json!({ "type": "allot", "socket": socket, "journal": journal_next_to(socket) });
    if !v4.is_empty() {
        ipam["default_ipv4_ippool"] = json!(v4);
    }
    if !v6.is_empty() {
        ipam["default_ipv6_ippool"] = json!(v6);
    }
    ipam
}

/// A bridge network config (the bridge is the pods' gateway) with the given ipam section.
pub fn bridge_conf(cni_version: &str, network: &str, bridge: &str, ipam: Value) -> Value {
    json!({
        "cniVersion": cni_version,
        "name": network,
        "type": "bridge",
        "bridge": bridge,
        "isGateway": true,
        "ipMasq": false,
        "ipam": ipam,
    })
}

/// A macvlan network config (bridge mode) on `master` with the given ipam section.
pub fn macvlan_conf(cni_version: &str, network: &str, master: &str, ipam: Value) -> Value {
    json!({
        "cniVersion": cni_version,
        "name": network,
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
        "ipam": ipam,
    })
}

/// `config` with `prevResult` set (for CHECK).
pub fn with_prev_result(config: &Value, prev: &Value) -> Value {
    let mut c = config.clone();
    c["prevResult"] = prev.clone();
    c
}

// ---------------------------------------------------------------------------------------------
// The lab

/// Everything one test needs: a host namespace for bridges and plugins, an agent, a CNI_PATH.
pub struct Lab {
    pub agent: Agent,
    /// Where the main plugins run, so bridges, veths and gateway addresses stay out of the
    /// machine's own namespace.
    pub host: Netns,
    pub plugins: PluginDir,
    /// A bridge name for this lab's bridge network (created by the bridge plugin).
    pub bridge: String,
    /// The network name of this lab's bridge network.
    pub network: String,
}

impl Lab {
    /// `None` (after printing `SKIP: test: reason`) when this machine cannot run e2e tests;
    /// else a lab whose agent serves `pools` (YAML documents).
    pub fn new(test: &str, pools: &str) -> Option<Lab> {
        Self::with_agent(test, || Agent::start(pools))
    }

    /// Like [`Lab::new`], with agent flags replacing the lab's defaults.
    pub fn with_flags(test: &str, pools: &str, flags: &[(&str, &str)]) -> Option<Lab> {
        Self::with_agent(test, || Agent::start_with(pools, flags))
    }

    /// Like [`Lab::new`], with the agent on an existing pools directory.
    pub fn on_pools_dir(test: &str, pools_dir: &Path) -> Option<Lab> {
        Self::with_agent(test, || Agent::start_on(pools_dir))
    }

    /// Like [`Lab::new`], with the agent in cluster mode on the API server of `kubeconfig`.
    pub fn on_cluster(
        test: &str,
        kubeconfig: &Path,
        node: &str,
        flags: &[(&str, &str)],
    ) -> Option<Lab> {
        Self::with_agent(test, || Agent::start_on_cluster(kubeconfig, node, flags))
    }

    /// Like [`Lab::new`], with the agent serving the pools kept in the etcd at `url`.
    pub fn on_etcd_pools(test: &str, url: &str) -> Option<Lab> {
        Self::with_agent(test, || Agent::start_on_etcd_pools(url))
    }

    /// Like [`Lab::with_flags`], with the agent running in the lab's host namespace, as a
    /// node's agent runs in the node's.
    pub fn in_host(test: &str, pools: &str, flags: &[(&str, &str)]) -> Option<Lab> {
        if skip(test) {
            return None;
        }
        let plugins = PluginDir::new();
        let host = Netns::new();
        let agent = Agent::start_in(&host, pools, flags);
        Some(Lab {
            agent,
            host,
            plugins,
            bridge: unique_name("br"),
            network: "allot-e2e".into(),
        })
    }

    fn with_agent(test: &str, start: impl FnOnce() -> Agent) -> Option<Lab> {
        if skip(test) {
            return None;
        }
        let plugins = PluginDir::new();
        let host = Netns::new();
        let agent = start();
        Some(Lab {
            agent,
            host,
            plugins,
            bridge: unique_name("br"),
            network: "allot-e2e".into(),
        })
    }

    /// This lab's bridge network (CNI 1.0.0) with allot and the given default pools.
    pub fn bridge_conf(&self, v4: &[&str], v6: &[&str]) -> Value {
        self.bridge_conf_via(&self.agent.socket(), v4, v6)
    }

    /// This lab's bridge network with allot asking the agent on `socket` (another agent
    /// sharing the lab's store: another node).
    pub fn bridge_conf_via(&self, socket: &Path, v4: &[&str], v6: &[&str]) -> Value {
        bridge_conf(
            "1.0.0",
            &self.network,
            &self.bridge,
            allot_ipam(socket, v4, v6),
        )
    }

    /// Polls `holds` until it is true; panics with the agent's log after `within`.
    #[track_caller]
    pub fn eventually(&self, what: &str, within: Duration, mut holds: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        while !holds() {
            assert!(
                Instant::now() < deadline,
                "{what}: not after {within:?}; agent log:\n{}",
                self.agent.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `plugin` (`bridge`, `macvlan`, `allot`, ...) with `command` for `att` in the host
    /// namespace.
    pub fn cni(&self, plugin: &str, command: &str, att: &Attachment, config: &Value) -> CniOutput {
        Cni::new(&self.plugins, plugin, command, &config.to_string())
            .attachment(att)
            .run(Some(&self.host))
    }

    /// A bare invocation (no attachment variables) for custom environments.
    pub fn call(&self, plugin: &str, command: &str, config: &str) -> Cni {
        Cni::new(&self.plugins, plugin, command, config)
    }

    /// ADD through the bridge plugin; panics unless it succeeds. Returns the result.
    #[track_caller]
    pub fn bridge_add(&self, att: &Attachment, config: &Value) -> CniOutput {
        let out = self.cni("bridge", "ADD", att, config);
        out.expect_ok();
        out
    }
}
