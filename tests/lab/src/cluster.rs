//! Starting, describing and tearing down a lab cluster: the code behind `allot-lab-cluster up`
//! and [`LabCluster::start`].

use std::ffi::OsString;
use std::fs;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, ListParams};
use serde::{Deserialize, Serialize};

use crate::controlplane::{API_PORT, Component, KUBERNETES_SERVICE_IP, Layout};
use crate::image::{self, ALLOT_IMAGE};
use crate::lock::Lock;
use crate::net::{self, HOST_IPV4, MAX_NODES};
use crate::pki::{self, ControlPlaneCerts, Pki};
use crate::process::Supervised;
use crate::realnode::{Daemon, KernelTunables, RealNode, RealNodeSpec};

/// What runs a lab's nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeKind {
    /// Upstream containerd, runc and the kubelet ([`crate::realnode`]): what users run.
    #[default]
    Real,
    /// `allot-lab-node`, the kubelet stand-in ([`crate::node`]): for node counts whose memory
    /// real kubelets and containerd would exceed on this machine (the scale benchmarks).
    StandIn,
}

/// Upstream binaries a real node runs.
const NODE_TOOLS: [&str; 9] = [
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "kubelet",
    "kube-proxy",
    "pause",
    "multus",
    "thin_entrypoint",
    "install_multus",
];

/// How to start a lab cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Nodes to start (each a network namespace, and containerd with a kubelet or a stand-in).
    pub nodes: usize,
    /// What runs them.
    pub node_kind: NodeKind,
    /// Where everything goes: certificates, etcd's data, logs, the nodes' files. Created; must
    /// be absent, empty, or an earlier lab's directory.
    pub dir: PathBuf,
    /// Keep `dir` after teardown.
    pub keep: bool,
    /// The upstream binaries (see [`crate::paths::tools_dir`]).
    pub tools: PathBuf,
    /// allot's binaries (see [`crate::paths::allot_bin_dir`]).
    pub allot_bin: PathBuf,
    /// The `allot-lab-node` binary.
    pub node_binary: PathBuf,
    /// Offer allot's image ([`ALLOT_IMAGE`]), made from `allot_bin`, to the nodes.
    pub allot_image: bool,
    /// More images: reference and directory (see [`crate::image`]).
    pub images: Vec<(String, PathBuf)>,
    /// kube-controller-manager's `--node-monitor-grace-period`: how long a node may miss its
    /// heartbeats before it is NotReady.
    pub node_monitor_grace: Duration,
    /// How long to wait for another lab on this machine to finish before failing.
    pub lock_wait: Duration,
    /// How long the control plane and nodes may take to become ready.
    pub ready_timeout: Duration,
}

impl ClusterOptions {
    pub fn new(dir: impl Into<PathBuf>) -> ClusterOptions {
        ClusterOptions {
            nodes: 3,
            node_kind: NodeKind::default(),
            dir: dir.into(),
            keep: false,
            tools: crate::paths::tools_dir(),
            allot_bin: crate::paths::allot_bin_dir(),
            node_binary: crate::paths::node_binary(),
            allot_image: true,
            images: Vec::new(),
            // Kubernetes' default (kube-controller-manager --help, v1.35).
            node_monitor_grace: Duration::from_secs(50),
            lock_wait: Duration::ZERO,
            ready_timeout: Duration::from_secs(120),
        }
    }
}

/// A node of the lab, as `cluster.json` describes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    #[serde(default)]
    pub kind: NodeKind,
    /// `/run/netns/allot-lab-node-<i>`: the node's host network namespace.
    pub netns: PathBuf,
    pub ipv4: Ipv4Addr,
    pub ipv6: Ipv6Addr,
    /// The node's host filesystem (its `/etc/cni/net.d`, `/opt/cni/bin`, `/var/lib/cni`, ...).
    pub root: PathBuf,
    pub kubeconfig: PathBuf,
    /// The stand-in's (or the kubelet's) pid, while it runs.
    pub pid: Option<u32>,
    /// The stand-in's log, or the kubelet's.
    pub log: PathBuf,
    /// A real node's containerd's log ([`crate::realnode::runs`] reads its sandboxes).
    #[serde(default)]
    pub runtime_log: Option<PathBuf>,
}

/// A control-plane process, as `cluster.json` describes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProcessInfo {
    pub name: String,
    pub pid: Option<u32>,
    pub log: PathBuf,
}

/// `cluster.json`: what tests need to know about a running lab.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ClusterInfo {
    pub dir: PathBuf,
    /// The admin kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    /// The API server's URL.
    pub server: String,
    /// The CA of the API server's certificate and of every client certificate.
    pub ca: PathBuf,
    pub control_socket: PathBuf,
    pub launcher_pid: u32,
    pub node_monitor_grace_seconds: u64,
    /// Images the nodes run as real processes: reference → directory (stand-ins).
    pub images: Vec<(String, PathBuf)>,
    /// The lab's registry (`HOST:PORT`), which real nodes pull every image from.
    #[serde(default)]
    pub registry: Option<String>,
    pub nodes: Vec<NodeInfo>,
    pub processes: Vec<ProcessInfo>,
}

/// A node's processes and description.
pub(crate) struct NodeRuntime {
    pub info: NodeInfo,
    pub index: usize,
    pub proc: NodeProc,
}

/// What runs a node.
pub(crate) enum NodeProc {
    StandIn(Supervised),
    Real(Box<RealNode>),
}

impl NodeProc {
    /// Why the node stopped by itself, if it did: the stand-in or a daemon exited.
    fn exited(&mut self) -> Option<String> {
        match self {
            NodeProc::StandIn(p) => p.try_exit().map(|status| {
                format!(
                    "its stand-in exited ({status}); its log ({}):\n{}",
                    p.log.display(),
                    p.log_tail(30)
                )
            }),
            NodeProc::Real(node) => node.exited(),
        }
    }

    /// The stand-in's pid, or the kubelet's, while it runs.
    fn pid(&mut self) -> Option<u32> {
        match self {
            NodeProc::StandIn(p) => p.running().then(|| p.pid()).flatten(),
            NodeProc::Real(node) => node.running().then(|| node.kubelet_pid()).flatten(),
        }
    }

    pub(crate) fn running(&mut self) -> bool {
        match self {
            NodeProc::StandIn(p) => p.running(),
            NodeProc::Real(node) => node.running(),
        }
    }

    /// The node lost at once (power cut): every process of it killed. Returns how many.
    pub(crate) fn power_off(&mut self, root: &Path) -> usize {
        match self {
            NodeProc::StandIn(p) => {
                p.kill();
                // The node's containers die with it, as a machine that lost its power: a lost
                // node's agent or controller must not go on writing.
                let mut killed = 0;
                for (_, record) in crate::node::state::all(root) {
                    for p in record.processes {
                        if crate::node::containers::start_ticks(p.pid) == Some(p.start_ticks) {
                            // SAFETY: kill(2) of the process group the stand-in gave the
                            // container.
                            unsafe { libc::kill(-(p.pid as libc::pid_t), libc::SIGKILL) };
                            killed += 1;
                        }
                    }
                }
                killed
            }
            NodeProc::Real(node) => node.power_off(),
        }
    }

    /// Starts the node (again).
    pub(crate) fn power_on(&mut self) -> Result<()> {
        match self {
            NodeProc::StandIn(p) => p.start().map(drop),
            NodeProc::Real(node) => node.power_on(),
        }
    }

    /// Restarts one daemon of a real node.
    pub(crate) fn restart(&mut self, daemon: Daemon) -> Result<()> {
        match self {
            NodeProc::StandIn(_) => bail!("a stand-in node has no {daemon} of its own"),
            NodeProc::Real(node) => node.restart(daemon),
        }
    }
}

/// Everything a running lab holds. Behind a std mutex, never held across an await, so that
/// teardown in `Drop` can take it.
pub(crate) struct State {
    pub options: ClusterOptions,
    pub info: ClusterInfo,
    pub layout: Option<Layout>,
    pub pki: Option<Pki>,
    pub control: Vec<(Component, Supervised)>,
    pub nodes: Vec<NodeRuntime>,
    registry: Option<Supervised>,
    /// The machine's kernel settings from before the lab (real kubelets change some).
    tunables: Option<KernelTunables>,
    lock: Option<Lock>,
    torn_down: bool,
}

pub(crate) type Shared = Arc<Mutex<State>>;

/// Locks the shared state; a panic elsewhere does not stop teardown.
pub(crate) fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// Directories of a lab.
fn sub(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// Marks a directory as a lab's, so that a later start may empty it.
const MARKER: &str = ".allot-lab";

/// Empties `dir` if it is an earlier lab's (or empty), creates it if absent.
fn prepare_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let empty = fs::read_dir(dir)?.next().is_none();
        if !empty && !dir.join(MARKER).exists() {
            bail!(
                "{} exists and is not a lab's directory: choose another --dir (or remove it)",
                dir.display()
            );
        }
        fs::remove_dir_all(dir).with_context(|| format!("emptying {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::write(
        dir.join(MARKER),
        "a lab cluster's directory (allot-lab-cluster)\n",
    )?;
    Ok(())
}

/// Starts a cluster into `shared` (whose teardown the caller owns).
pub(crate) async fn start(shared: &Shared) -> Result<()> {
    let options = lock(shared).options.clone();
    let started = Instant::now();
    if options.nodes > MAX_NODES {
        bail!("at most {MAX_NODES} nodes (their addresses are 198.51.100.11 to .110)");
    }
    let dir = fs::canonicalize(options.dir.parent().unwrap_or(Path::new("/")))
        .with_context(|| format!("{}: its parent directory must exist", options.dir.display()))?
        .join(
            options
                .dir
                .file_name()
                .context("--dir needs a final component")?,
        );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the lab needs root (network namespaces, a bridge, mounts): run it as root");
    }
    for name in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        crate::paths::tool(&options.tools, name)?;
    }
    match options.node_kind {
        NodeKind::StandIn if !options.node_binary.exists() && options.nodes > 0 => bail!(
            "{} is missing: build it (`cargo build --release -p allot-lab`) or set ALLOT_LAB_NODE",
            options.node_binary.display()
        ),
        NodeKind::StandIn => {}
        NodeKind::Real => {
            for name in NODE_TOOLS {
                crate::paths::tool(&options.tools, name)?;
            }
        }
    }

    let (lock_file, previous) = Lock::acquire(&dir, options.lock_wait)?;
    lock(shared).lock = Some(lock_file);
    for what in net::remove_leftovers()
        .into_iter()
        .chain(crate::realnode::cgroups::remove_leftovers())
    {
        tracing::info!("removed a left-over {what}");
    }
    if let Some(previous) = previous.filter(|p| *p != dir && p.join(MARKER).exists()) {
        tracing::info!("a previous lab in {} did not clean up", previous.display());
    }
    prepare_dir(&dir)?;
    for d in ["pki", "kubeconfigs", "logs", "etcd", "images", "nodes"] {
        fs::create_dir_all(sub(&dir, d))?;
    }
    net::create_bridge()?;

    // Certificates and kubeconfigs.
    let names = [HOST_IPV4.to_string(), KUBERNETES_SERVICE_IP.to_string()];
    let server = format!("https://{}", SocketAddr::from((HOST_IPV4, API_PORT)));
    let certs = ControlPlaneCerts::create(
        &sub(&dir, "pki"),
        &sub(&dir, "kubeconfigs"),
        &server,
        &names,
    )?;

    let mut images = options.images.clone();
    let policy = crate::paths::default_policy(&options.allot_bin);
    if options.allot_image && options.node_kind == NodeKind::StandIn {
        let image_dir = sub(&dir, "images/allot");
        image::build_allot_image(&image_dir, &options.allot_bin, &policy)?;
        images.push((ALLOT_IMAGE.to_string(), image_dir));
    }

    let layout = Layout::new(
        &options.tools,
        &dir,
        &certs,
        (HOST_IPV4.into(), API_PORT, HOST_IPV4.into()),
        options.node_monitor_grace,
    )?;
    layout.write_audit_policy()?;
    let admin_kc = certs.admin_kubeconfig.clone();
    let pki = certs.pki;
    {
        let mut st = lock(shared);
        st.info = ClusterInfo {
            dir: dir.clone(),
            kubeconfig: admin_kc.clone(),
            server,
            ca: pki.ca_cert.clone(),
            control_socket: dir.join("control.sock"),
            launcher_pid: std::process::id(),
            node_monitor_grace_seconds: options.node_monitor_grace.as_secs(),
            images,
            registry: None,
            nodes: Vec::new(),
            processes: Vec::new(),
        };
        st.layout = Some(layout.clone());
        st.pki = Some(pki);
    }
    if options.node_kind == NodeKind::Real {
        // The registry the real nodes pull from, with every image they may run.
        let mut registry = crate::registry::process(&sub(&dir, "registry"), &layout.logs)?;
        registry.start()?;
        crate::registry::wait_ready(&mut registry, options.ready_timeout).await?;
        let address = crate::registry::address();
        {
            let mut st = lock(shared);
            st.registry = Some(registry);
            st.info.registry = Some(address.clone());
            st.tunables = Some(KernelTunables::save());
        }
        let allot = options
            .allot_image
            .then_some((options.allot_bin.as_path(), policy.as_path()));
        let built = crate::images::all(&options.tools, allot)?;
        crate::images::push_all(&address, &built).await?;
        tracing::info!("{} images pushed to the lab's registry", built.len());
    }

    // The control plane, in dependency order.
    for component in Component::ALL {
        start_component(shared, component).await?;
    }
    tracing::info!("control plane ready after {:.1?}", started.elapsed());

    let client = crate::kube_client(&admin_kc).await?;
    let mut new_nodes = Vec::new();
    for _ in 0..options.nodes {
        new_nodes.push(launch_node(shared)?);
    }
    wait_nodes_ready(shared, &client, &new_nodes, options.ready_timeout).await?;
    let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + options.ready_timeout;
    while sa.get_opt("default").await?.is_none() {
        if Instant::now() > deadline {
            bail!(
                "the default ServiceAccount did not appear within {:?}: is \
                 kube-controller-manager running? Its log: {}",
                options.ready_timeout,
                layout.logs.join("kube-controller-manager.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    write_info(shared)?;
    tracing::info!(
        "lab cluster with {} node(s) ready after {:.1?}",
        options.nodes,
        started.elapsed()
    );
    Ok(())
}

/// Starts `component` and waits until it serves (etcd, API server) or runs.
pub(crate) async fn start_component(shared: &Shared, component: Component) -> Result<()> {
    let (layout, admin) = {
        let st = lock(shared);
        let layout = st.layout.clone().context("the cluster is not set up")?;
        (layout, st.info.kubeconfig.clone())
    };
    let proc = layout.start(component, &admin).await?;
    let mut st = lock(shared);
    st.control.retain(|(c, _)| *c != component);
    st.control.push((component, proc));
    Ok(())
}

/// Stops `component` (SIGTERM, SIGKILL after its grace), waiting until it has exited.
pub(crate) async fn stop_component(shared: &Shared, component: Component) -> Result<()> {
    let signalled = {
        let mut st = lock(shared);
        st.control
            .iter_mut()
            .find(|(c, _)| *c == component)
            .is_some_and(|(_, p)| p.signal(libc::SIGTERM))
    };
    if !signalled {
        return Ok(());
    }
    let deadline = Instant::now() + component.stop_grace();
    loop {
        {
            let mut st = lock(shared);
            let (_, proc) = st
                .control
                .iter_mut()
                .find(|(c, _)| *c == component)
                .context("component vanished")?;
            if proc.try_exit().is_some() || proc.pid().is_none() {
                return Ok(());
            }
            if Instant::now() > deadline {
                proc.kill();
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates node number `len+1` (network, certificates, files) and starts it.
pub(crate) fn launch_node(shared: &Shared) -> Result<String> {
    let mut st = lock(shared);
    let index = st.nodes.iter().map(|n| n.index).max().unwrap_or(0) + 1;
    if index > MAX_NODES {
        bail!("at most {MAX_NODES} nodes");
    }
    let name = format!("node-{index}");
    let dir = st.info.dir.join("nodes").join(&name);
    let root = dir.join("root");
    fs::create_dir_all(&root)?;
    let netns = net::create_node_network(&format!("{}node-{index}", net::NETNS_PREFIX), index)?;
    let (ipv4, ipv6) = net::node_addresses(index);
    let pki = st.pki.as_ref().context("the cluster is not set up")?;
    // The Node authorizer and NodeRestriction know a kubelet by this user and group.
    let user = format!("system:node:{name}");
    let cert = pki.client(&format!("node-{index}"), &user, &["system:nodes"])?;
    let kubeconfig = dir.join("kubeconfig");
    pki::write_kubeconfig(&kubeconfig, &st.info.server, &pki.ca_cert, &cert, &user)?;
    let logs = st.info.dir.join("logs");
    if st.options.node_kind == NodeKind::Real {
        let names = [ipv4.to_string(), ipv6.to_string(), name.clone()];
        let serving = pki.serving(&format!("{name}-kubelet"), &name, &names)?;
        let proxy_cert = pki.client(&format!("{name}-kube-proxy"), "system:kube-proxy", &[])?;
        let spec = RealNodeSpec {
            name: name.clone(),
            index,
            root: root.clone(),
            netns: netns.clone(),
            ipv4,
            ipv6,
            server: st.info.server.clone(),
            ca: pki.ca_cert.clone(),
            kubelet_client: cert,
            kubelet_serving: serving,
            proxy_client: proxy_cert,
            tools: st.options.tools.clone(),
            registry: st
                .info
                .registry
                .clone()
                .context("the lab's registry is not up")?,
            pause_image: crate::images::PAUSE_IMAGE.to_string(),
            logs: logs.clone(),
            max_pods: 250,
        };
        let mut node = RealNode::prepare(spec)?;
        node.power_on()?;
        let info = NodeInfo {
            name: name.clone(),
            kind: NodeKind::Real,
            netns,
            ipv4,
            ipv6,
            root,
            kubeconfig,
            pid: node.kubelet_pid(),
            log: logs.join(format!("{name}-kubelet.log")),
            runtime_log: Some(logs.join(format!("{name}-containerd.log"))),
        };
        st.nodes.push(NodeRuntime {
            info,
            index,
            proc: NodeProc::Real(Box::new(node)),
        });
        return Ok(name);
    }
    let log = logs.join(format!("{name}.log"));
    let mut args: Vec<OsString> = vec![
        "--kubeconfig".into(),
        kubeconfig.clone().into(),
        "--name".into(),
        name.clone().into(),
        "--netns".into(),
        netns.clone().into(),
        "--ipv4".into(),
        ipv4.to_string().into(),
        "--ipv6".into(),
        ipv6.to_string().into(),
        "--root".into(),
        root.clone().into(),
    ];
    for (reference, dir) in &st.info.images {
        args.push("--image".into());
        args.push(format!("{reference}={}", dir.display()).into());
    }
    let mut proc = Supervised::new(&name, &st.options.node_binary, args, log.clone()).env(
        "RUST_LOG",
        &std::env::var("ALLOT_LAB_NODE_LOG").unwrap_or("info".into()),
    );
    let pid = proc.start()?;
    let info = NodeInfo {
        name: name.clone(),
        kind: NodeKind::StandIn,
        netns,
        ipv4,
        ipv6,
        root,
        kubeconfig,
        pid: Some(pid),
        log,
        runtime_log: None,
    };
    st.nodes.push(NodeRuntime {
        info,
        index,
        proc: NodeProc::StandIn(proc),
    });
    Ok(name)
}

/// Waits until the stand-ins of Nodes `names` post their status (Ready, or NotReady while
/// their node has no CNI configuration, as a kubelet's node), failing early when one exits.
pub(crate) async fn wait_nodes_ready(
    shared: &Shared,
    client: &kube::Client,
    names: &[String],
    timeout: Duration,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        {
            let mut st = lock(shared);
            for n in st.nodes.iter_mut().filter(|n| names.contains(&n.info.name)) {
                if let Some(why) = n.proc.exited() {
                    bail!("node {}: {why}", n.info.name);
                }
            }
        }
        let list = nodes.list(&ListParams::default()).await?;
        let ready: Vec<&str> = list
            .items
            .iter()
            .filter(|n| crate::node_posting(n))
            .filter_map(|n| n.metadata.name.as_deref())
            .collect();
        if names.iter().all(|n| ready.contains(&n.as_str())) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "nodes {names:?} did not post their status within {timeout:?} (posting: \
                 {ready:?}); see the \
                 nodes' logs in {}",
                lock(shared).info.dir.join("logs").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Refreshes the pids in the description and writes `cluster.json`.
pub(crate) fn write_info(shared: &Shared) -> Result<ClusterInfo> {
    let mut st = lock(shared);
    let st = &mut *st;
    st.info.processes = st
        .control
        .iter_mut()
        .map(|(c, p)| ProcessInfo {
            name: c.name().to_string(),
            pid: if p.running() { p.pid() } else { None },
            log: p.log.clone(),
        })
        .collect();
    st.info.nodes = st
        .nodes
        .iter_mut()
        .map(|n| {
            let mut info = n.info.clone();
            info.pid = n.proc.pid();
            info
        })
        .collect();
    let path = st.info.dir.join("cluster.json");
    fs::write(&path, serde_json::to_vec_pretty(&st.info)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(st.info.clone())
}

impl State {
    pub(crate) fn new(options: ClusterOptions) -> State {
        State {
            info: ClusterInfo {
                dir: options.dir.clone(),
                kubeconfig: PathBuf::new(),
                server: String::new(),
                ca: PathBuf::new(),
                control_socket: PathBuf::new(),
                launcher_pid: std::process::id(),
                node_monitor_grace_seconds: options.node_monitor_grace.as_secs(),
                images: Vec::new(),
                registry: None,
                nodes: Vec::new(),
                processes: Vec::new(),
            },
            options,
            layout: None,
            pki: None,
            control: Vec::new(),
            nodes: Vec::new(),
            registry: None,
            tunables: None,
            lock: None,
            torn_down: false,
        }
    }

    /// Stops everything this lab started, in order: the stand-ins first (they stop their
    /// containers and run CNI DEL), then whatever still runs in the lab's namespaces, the
    /// control plane, the network, and the directory unless kept.
    pub(crate) fn teardown(&mut self) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        let Some(lock_file) = self.lock.take() else {
            // Never started (the lock was not ours): nothing to undo.
            return;
        };
        for node in &mut self.nodes {
            if let NodeProc::StandIn(p) = &mut node.proc {
                p.signal(libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        for node in &mut self.nodes {
            match &mut node.proc {
                NodeProc::StandIn(p) => {
                    while p.pid().is_some() && p.try_exit().is_none() {
                        if Instant::now() > deadline {
                            tracing::warn!(
                                "{}: stand-in did not stop within 90 s; killed",
                                node.info.name
                            );
                            p.kill();
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                NodeProc::Real(real) => {
                    for left in real.teardown() {
                        tracing::warn!("{}: {left}", node.info.name);
                    }
                }
            }
        }
        for ns in net::lab_namespaces() {
            net::kill_processes_in(&net::netns_path(&ns));
        }
        for component in Component::ALL.iter().rev() {
            if let Some((_, p)) = self.control.iter_mut().find(|(c, _)| c == component) {
                p.stop_blocking(libc::SIGTERM, component.stop_grace());
            }
        }
        if let Some(registry) = &mut self.registry {
            registry.stop_blocking(libc::SIGTERM, Duration::from_secs(5));
        }
        net::remove_leftovers();
        crate::realnode::cgroups::remove_leftovers();
        if let Some(tunables) = &self.tunables {
            for left in tunables.restore() {
                tracing::warn!("could not restore {left}");
            }
        }
        if !self.options.keep
            && self.info.dir.join(MARKER).exists()
            && let Err(e) = fs::remove_dir_all(&self.info.dir)
        {
            tracing::warn!("removing {}: {e}", self.info.dir.display());
        }
        lock_file.release_clean();
    }
}
