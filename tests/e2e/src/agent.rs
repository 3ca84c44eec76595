//! The standalone agent a lab runs, the pool documents it is given, and HTTP on its socket.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{AGENT_READY_TIMEOUT, Netns, bin, journal_next_to};

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
        Self::start_next_to(other, flags, Some(other.state()))
    }

    /// Another node's agent on the store of `other` (its `--store`): the same pools directory
    /// and flags, `flags` replacing some, and a socket, journal and state directory of its own,
    /// as on another machine. Both run on this machine, so both are named after its hostname
    /// unless `flags` name them (`--node-name`).
    pub fn start_as_another_node(other: &Agent, flags: &[(&str, &str)]) -> Agent {
        Self::start_next_to(other, flags, None)
    }

    /// An agent on `other`'s pools and flags (`flags` replacing some), on `state` or its own.
    fn start_next_to(other: &Agent, flags: &[(&str, &str)], state: Option<PathBuf>) -> Agent {
        let mut agent = Self::unstarted(&[]);
        agent.pools_dir = other.pools_dir();
        agent.state = state;
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
