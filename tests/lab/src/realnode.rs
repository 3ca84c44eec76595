//! A real node: upstream containerd (with runc), the kubelet and kube-proxy, pinned and built
//! from source (`scripts/build-upstream.sh`), in the node's network namespace and a mount
//! namespace of the node's own ([`crate::node::hostfs`], a `Real` view), under a cgroup root of
//! its own. Pods are real containers: images pulled from the lab's registry, their user,
//! capabilities, seccomp, read-only root and resource limits enforced by runc and the kernel,
//! their network set up by containerd calling the node's CNI configuration, as on any
//! Kubernetes node. kube-proxy (iptables mode, on the nf_tables backend) makes the `kubernetes`
//! Service's ClusterIP reach the API server from the node's network, which host-network pods
//! (allot's agent and controller, Multus) use as in-cluster configuration says.
//!
//! What a test can do to a node, as happens to machines: restart containerd or the kubelet (the
//! containers go on), lose the node (every process of it killed at once, as when its power is
//! cut) and start it again (its `/run` and every network namespace gone, as after a reboot:
//! the kubelet makes each pod's sandbox anew).
//!
//! The kubelet changes three kernel settings of the machine when it starts
//! (`vm.overcommit_memory`, `kernel.panic`, `kernel.panic_on_oops`: there is no setting to stop
//! it, `protectKernelDefaults` only makes it refuse to start): [`KernelTunables`] keeps their
//! values from before the lab and puts them back at its end.

pub mod cgroups;
pub mod containerd;
pub mod kubelet;
pub mod runs;

use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::node::hostfs::{NodeFs, ViewKind};
use crate::pki::{self, CertFiles};
use crate::process::Supervised;
use cgroups::CgroupRoot;

/// Where a node keeps its credentials, as it sees them (its own `/etc/kubernetes`, as kubeadm
/// lays a node out).
const ETC: &str = "/etc/kubernetes";

/// Copies the node's credentials into its `/etc/kubernetes` and writes the kubelet's and
/// kube-proxy's kubeconfigs there, naming them as the node sees them: the node's processes
/// see their own root, not the machine's paths (its `/tmp` is its own).
fn write_credentials(spec: &RealNodeSpec) -> Result<()> {
    let dir = spec.root.join(ETC.trim_start_matches('/'));
    fs::create_dir_all(dir.join("pki"))?;
    let copy = |from: &Path, name: &str| -> Result<PathBuf> {
        fs::copy(from, dir.join("pki").join(name))
            .with_context(|| format!("copying {} into the node", from.display()))?;
        Ok(Path::new(ETC).join("pki").join(name))
    };
    let ca = copy(&spec.ca, "ca.crt")?;
    let pairs = [
        ("kubelet-client", &spec.kubelet_client),
        ("kubelet", &spec.kubelet_serving),
        ("kube-proxy", &spec.proxy_client),
    ];
    let mut seen = Vec::new();
    for (name, files) in pairs {
        seen.push(CertFiles {
            cert: copy(&files.cert, &format!("{name}.crt"))?,
            key: copy(&files.key, &format!("{name}.key"))?,
        });
    }
    pki::write_kubeconfig(
        &dir.join("kubelet.kubeconfig"),
        &spec.server,
        &ca,
        &seen[0],
        &format!("system:node:{}", spec.name),
    )?;
    pki::write_kubeconfig(
        &dir.join("kube-proxy.kubeconfig"),
        &spec.server,
        &ca,
        &seen[2],
        "system:kube-proxy",
    )
}

/// What starting a real node takes, beside its own directory.
#[derive(Debug, Clone)]
pub struct RealNodeSpec {
    pub name: String,
    pub index: usize,
    /// The node's host filesystem (its `/etc/cni/net.d`, `/var/lib/kubelet`, ...).
    pub root: PathBuf,
    /// Its network namespace.
    pub netns: PathBuf,
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
    /// The API server's URL.
    pub server: String,
    /// The lab's CA; the kubelet's client certificate (user `system:node:<name>`, group
    /// `system:nodes`) and serving certificate; kube-proxy's client certificate (user
    /// `system:kube-proxy`, whom the bootstrap RBAC binds to `system:node-proxier`). Paths of
    /// the machine: [`RealNode::prepare`] copies them into the node's `/etc/kubernetes`.
    pub ca: PathBuf,
    pub kubelet_client: CertFiles,
    pub kubelet_serving: CertFiles,
    pub proxy_client: CertFiles,
    /// The upstream binaries (containerd, its shim, runc, the kubelet).
    pub tools: PathBuf,
    /// The lab's registry (`HOST:PORT`) and the pause image's reference.
    pub registry: String,
    pub pause_image: String,
    /// Where containerd's and the kubelet's logs go.
    pub logs: PathBuf,
    pub max_pods: u32,
}

/// A running (or stopped) real node.
#[derive(Debug)]
pub struct RealNode {
    pub spec: RealNodeSpec,
    netns: Arc<OwnedFd>,
    fs: Option<NodeFs>,
    cgroup: CgroupRoot,
    pub containerd: Supervised,
    pub kubelet: Supervised,
    pub proxy: Supervised,
}

/// How long containerd may take to serve its socket.
const CONTAINERD_READY: Duration = Duration::from_secs(30);

impl RealNode {
    /// Writes the node's configuration and makes its cgroup root; starts nothing.
    pub fn prepare(spec: RealNodeSpec) -> Result<RealNode> {
        for tool in [
            "containerd",
            "containerd-shim-runc-v2",
            "runc",
            "kubelet",
            "kube-proxy",
        ] {
            crate::paths::tool(&spec.tools, tool)?;
        }
        containerd::write(&spec.root, &spec.tools, &spec.pause_image, &spec.registry)?;
        write_credentials(&spec)?;
        let cgroup = CgroupRoot::new(&format!("{}{}", cgroups::ROOT_PREFIX, spec.name));
        cgroup.create()?;
        let etc = Path::new(ETC);
        kubelet::write(
            &spec.root,
            &kubelet::KubeletFiles {
                ca: &etc.join("pki/ca.crt"),
                serving_cert: &etc.join("pki/kubelet.crt"),
                serving_key: &etc.join("pki/kubelet.key"),
                cgroup_root: &cgroup.path(),
                ipv4: spec.ipv4,
                max_pods: spec.max_pods,
            },
        )?;
        let netns = Arc::new(OwnedFd::from(fs::File::open(&spec.netns).with_context(
            || {
                format!(
                    "opening {}'s network namespace {}",
                    spec.name,
                    spec.netns.display()
                )
            },
        )?));
        // The shim is found on PATH (containerd's `runtime_type` names it), runc by path.
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            spec.tools.display()
        );
        let containerd = Supervised::new(
            &format!("{}-containerd", spec.name),
            &spec.tools.join("containerd"),
            vec!["--config".into(), "/etc/containerd/config.toml".into()],
            spec.logs.join(format!("{}-containerd.log", spec.name)),
        )
        .env("PATH", &path);
        let kubelet = Supervised::new(
            &format!("{}-kubelet", spec.name),
            &spec.tools.join("kubelet"),
            kubelet::args(
                &spec.name,
                &etc.join("kubelet.kubeconfig"),
                spec.ipv4,
                spec.ipv6,
            ),
            spec.logs.join(format!("{}-kubelet.log", spec.name)),
        )
        .env("PATH", &path);
        let proxy = Supervised::new(
            &format!("{}-kube-proxy", spec.name),
            &spec.tools.join("kube-proxy"),
            [
                format!("--kubeconfig={ETC}/kube-proxy.kubeconfig"),
                format!("--hostname-override={}", spec.name),
                "--proxy-mode=iptables".to_string(),
                // The conntrack table is the machine's: leave its size alone.
                "--conntrack-max-per-core=0".to_string(),
                "--metrics-bind-address=127.0.0.1:10249".to_string(),
                "--healthz-bind-address=127.0.0.1:10256".to_string(),
                "--v=1".to_string(),
            ]
            .into_iter()
            .map(Into::into)
            .collect(),
            spec.logs.join(format!("{}-kube-proxy.log", spec.name)),
        )
        .env("PATH", &path);
        Ok(RealNode {
            spec,
            netns,
            fs: None,
            cgroup,
            containerd,
            kubelet,
            proxy,
        })
    }

    /// Makes the node's mount namespace (a fresh `/run`: nothing of an earlier run survives),
    /// then starts containerd, waits for its socket, and starts the kubelet.
    pub fn power_on(&mut self) -> Result<()> {
        if self.fs.is_none() {
            let run = self.spec.root.join("run");
            if run.exists() {
                fs::remove_dir_all(&run).with_context(|| format!("emptying {}", run.display()))?;
            }
            let fs = NodeFs::setup_in(&self.spec.root, Some(&self.spec.netns), ViewKind::Real)?;
            let entry = fs.entry()?;
            self.containerd.on_node(self.netns.clone(), entry.clone());
            self.kubelet.on_node(self.netns.clone(), entry.clone());
            self.proxy.on_node(self.netns.clone(), entry);
            self.fs = Some(fs);
        }
        self.start_containerd()?;
        self.kubelet.start()?;
        self.proxy.start()?;
        Ok(())
    }

    /// Starts containerd and waits until it serves its socket.
    pub fn start_containerd(&mut self) -> Result<()> {
        self.containerd.start()?;
        let socket = self
            .spec
            .root
            .join(containerd::SOCKET.trim_start_matches('/'));
        let deadline = Instant::now() + CONTAINERD_READY;
        // The socket is in the node's run directory, which the machine sees too (the node's
        // view binds it): its existence says containerd listens.
        while !socket.exists() {
            if let Some(status) = self.containerd.try_exit() {
                bail!(
                    "{}'s containerd exited ({status}): {}",
                    self.spec.name,
                    self.containerd.log_tail(20)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{}'s containerd did not serve {} within {CONTAINERD_READY:?}: {}",
                    self.spec.name,
                    containerd::SOCKET,
                    self.containerd.log_tail(20)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Restarts one of the node's daemons (SIGTERM, SIGKILL after 10 s, started again); the
    /// containers go on running.
    pub fn restart(&mut self, daemon: Daemon) -> Result<()> {
        match daemon {
            Daemon::Containerd => {
                self.containerd
                    .stop_blocking(libc::SIGTERM, Duration::from_secs(10));
                let socket = self
                    .spec
                    .root
                    .join(containerd::SOCKET.trim_start_matches('/'));
                let _ = fs::remove_file(socket);
                self.start_containerd()
            }
            Daemon::Kubelet => {
                self.kubelet
                    .stop_blocking(libc::SIGTERM, Duration::from_secs(10));
                self.kubelet.start().map(drop)
            }
        }
    }

    /// The node lost, as when its power is cut: the kubelet, containerd, every shim and every
    /// container SIGKILLed at once, and the node's mount namespace (with the network namespaces
    /// containerd pinned in it) dropped. Returns how many processes were killed.
    pub fn power_off(&mut self) -> usize {
        let mut killed = 0;
        for daemon in [&mut self.proxy, &mut self.kubelet, &mut self.containerd] {
            if daemon.running() {
                daemon.kill();
                killed += 1;
            }
        }
        // Shims and host-network containers live in the node's network namespace; the pods'
        // containers in its cgroup root.
        killed += crate::net::pids_in_netns(&self.spec.netns).len();
        crate::net::kill_processes_in(&self.spec.netns);
        killed += self.cgroup.kill_all(Duration::from_secs(10));
        self.fs = None;
        killed
    }

    /// Stops everything of the node and removes its cgroup root; returns what could not be
    /// removed.
    pub fn teardown(&mut self) -> Vec<String> {
        self.kubelet
            .stop_blocking(libc::SIGTERM, Duration::from_secs(5));
        self.power_off();
        self.cgroup.remove()
    }

    pub fn running(&mut self) -> bool {
        self.kubelet.running()
    }

    /// Whether a daemon of the node exited by itself (not stopped by the lab), with its log's
    /// end, for errors.
    pub fn exited(&mut self) -> Option<String> {
        for daemon in [&mut self.containerd, &mut self.kubelet, &mut self.proxy] {
            if let Some(status) = daemon.try_exit() {
                return Some(format!(
                    "{} exited ({status}); its log ({}):\n{}",
                    daemon.name,
                    daemon.log.display(),
                    daemon.log_tail(30)
                ));
            }
        }
        None
    }

    /// The node's root directory.
    pub fn root(&self) -> &Path {
        &self.spec.root
    }

    /// The daemons' pids, for `cluster.json`.
    pub fn kubelet_pid(&self) -> Option<u32> {
        self.kubelet.pid()
    }
}

/// A daemon of a real node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    Containerd,
    Kubelet,
}

impl std::str::FromStr for Daemon {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Daemon> {
        match s {
            "containerd" => Ok(Daemon::Containerd),
            "kubelet" => Ok(Daemon::Kubelet),
            _ => bail!("unknown daemon {s:?}: containerd or kubelet"),
        }
    }
}

impl std::fmt::Display for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Daemon::Containerd => "containerd",
            Daemon::Kubelet => "kubelet",
        })
    }
}

/// The kernel settings the kubelet changes (see the module's documentation), as they were.
#[derive(Debug, Clone, Default)]
pub struct KernelTunables {
    saved: Vec<(PathBuf, String)>,
}

/// The settings: `/proc/sys` paths.
const TUNABLES: [&str; 5] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
];

impl KernelTunables {
    pub fn save() -> KernelTunables {
        let saved = TUNABLES
            .iter()
            .map(|t| Path::new("/proc/sys").join(t))
            .filter_map(|p| Some((p.clone(), fs::read_to_string(&p).ok()?.trim().to_string())))
            .collect();
        KernelTunables { saved }
    }

    /// Puts the saved values back; returns the settings that could not be written.
    pub fn restore(&self) -> Vec<String> {
        self.saved
            .iter()
            .filter(|(p, v)| fs::read_to_string(p).is_ok_and(|now| now.trim() != v))
            .filter_map(|(p, v)| {
                fs::write(p, v)
                    .err()
                    .map(|e| format!("{}: {e}", p.display()))
            })
            .collect()
    }
}

/// The host pid of the process a container of a real node runs (its init, pid 1 inside it),
/// from the id the Pod's status gives (`containerd://<id>`), as containerd's runc shim records
/// it under the node's `/run` (which the machine sees: the node's view binds it).
pub fn container_pid(root: &Path, container_id: &str) -> Option<u32> {
    let id = container_id
        .strip_prefix("containerd://")
        .unwrap_or(container_id);
    let file = root
        .join("run/containerd/io.containerd.runtime.v2.task/k8s.io")
        .join(id)
        .join("init.pid");
    fs::read_to_string(file).ok()?.trim().parse().ok()
}
