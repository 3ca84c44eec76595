//! CNI plugins run as a runtime runs them: the plugin directory, invocations and their output,
//! pods' attachments, network configurations.

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Netns, PLUGIN_TIMEOUT, SYSTEM_CNI_DIR, bin, next_id};

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
