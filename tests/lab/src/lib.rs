//! allot's local Kubernetes lab: the upstream control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler) on this machine, and per node a network namespace
//! and a kubelet stand-in ([`node`]) that runs real CNI plugins and, for the images it knows,
//! real container processes. See `README.md` for what is real and what is stood in.
//!
//! A test starts its own cluster with [`LabCluster::start`] (torn down on drop), or attaches
//! to one started by `allot-lab-cluster up` with [`LabCluster::from_env`]. A test that needs
//! only the API server starts a [`LoopbackControlPlane`]: etcd and kube-apiserver on
//! 127.0.0.1, one per test, with no lock, no namespaces and no root.

pub mod audit;
pub mod capture;
pub mod cluster;
pub mod control;
pub mod controlplane;
pub mod http;
pub mod image;
pub mod images;
pub mod lock;
pub mod loopback;
pub mod net;
pub mod node;
pub mod oci;
pub mod paths;
pub mod pki;
pub mod process;
pub mod realnode;
pub mod registry;
pub mod testing;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;

pub use cluster::{ClusterInfo, ClusterOptions, NodeInfo, NodeKind, ProcessInfo};
pub use control::Command;
pub use controlplane::Component;
pub use loopback::{LoopbackControlPlane, LoopbackOptions};

/// The environment variable naming a running lab's `cluster.json`.
pub const CLUSTER_ENV: &str = "ALLOT_LAB_CLUSTER";

/// A kube client from a kubeconfig file.
pub async fn kube_client(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("loading {}", kubeconfig.display()))?;
    Ok(kube::Client::try_from(config)?)
}

/// The status of a Node's Ready condition (None when it has none).
pub fn node_ready(node: &Node) -> Option<bool> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

/// Whether a Node's kubelet posts its status: a Ready condition it wrote (Ready, or NotReady
/// for a reason of its own such as no network yet), not the node lifecycle controller's
/// `Unknown` for a node that stopped posting.
pub fn node_posting(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status != "Unknown")
}

/// A lab cluster: started by this process ([`LabCluster::start`], torn down on drop) or by
/// `allot-lab-cluster up` ([`LabCluster::from_env`], controlled over its socket).
pub struct LabCluster {
    handle: Handle,
}

enum Handle {
    Owned {
        shared: cluster::Shared,
        ops: Arc<tokio::sync::Mutex<()>>,
        server: Option<tokio::task::JoinHandle<()>>,
    },
    Remote {
        info: Box<ClusterInfo>,
    },
}

impl LabCluster {
    /// Starts a cluster as `options` say and waits until it is ready: the API server answers,
    /// the nodes are Ready, the `default` ServiceAccount exists. Everything is torn down when
    /// the value is dropped (or when start fails).
    pub async fn start(options: ClusterOptions) -> Result<LabCluster> {
        let shared = Arc::new(Mutex::new(cluster::State::new(options)));
        let mut lab = LabCluster {
            handle: Handle::Owned {
                shared: shared.clone(),
                ops: Arc::new(tokio::sync::Mutex::new(())),
                server: None,
            },
        };
        cluster::start(&shared).await?;
        if let Handle::Owned { ops, server, .. } = &mut lab.handle {
            let socket = cluster::lock(&shared).info.control_socket.clone();
            *server = Some(control::serve(&socket, shared.clone(), ops.clone()).await?);
        }
        Ok(lab)
    }

    /// The lab named by `$ALLOT_LAB_CLUSTER` (a `cluster.json`).
    pub fn from_env() -> Result<LabCluster> {
        let path = std::env::var_os(CLUSTER_ENV).with_context(|| {
            format!("{CLUSTER_ENV} is not set: point it at a running lab's cluster.json")
        })?;
        LabCluster::from_file(Path::new(&path))
    }

    /// The lab described by `cluster.json` at `path`.
    pub fn from_file(path: &Path) -> Result<LabCluster> {
        let info: ClusterInfo = serde_json::from_slice(
            &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        )
        .with_context(|| format!("parsing {}", path.display()))?;
        Ok(LabCluster {
            handle: Handle::Remote {
                info: Box::new(info),
            },
        })
    }

    /// The cluster's description (refreshed pids for an owned cluster).
    pub fn info(&self) -> ClusterInfo {
        match &self.handle {
            Handle::Owned { shared, .. } => {
                cluster::write_info(shared).unwrap_or_else(|_| cluster::lock(shared).info.clone())
            }
            Handle::Remote { info } => (**info).clone(),
        }
    }

    /// The admin kubeconfig (`system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.info().kubeconfig
    }

    /// The requests of users whose name starts with `user_prefix` that the API server refused
    /// with 403 (RBAC, the Node authorizer), from its audit log.
    pub fn forbidden(&self, user_prefix: &str) -> Result<Vec<audit::Request>> {
        audit::requests(&self.info().dir.join("logs"), user_prefix, 403)
    }

    /// The kube-apiserver restarts made through [`LabCluster::restart`], oldest first.
    pub fn apiserver_restarts(&self) -> Result<Vec<audit::Restart>> {
        audit::restarts(&self.info().dir.join("logs"))
    }

    /// A client with the admin kubeconfig.
    pub async fn client(&self) -> Result<kube::Client> {
        kube_client(&self.kubeconfig()).await
    }

    pub fn nodes(&self) -> Vec<NodeInfo> {
        self.info().nodes
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Result<NodeInfo> {
        self.nodes()
            .into_iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name} in the lab"))
    }

    /// Runs a control command (as `allot-lab-cluster ctl` does).
    pub async fn control(&self, command: Command) -> Result<String> {
        match &self.handle {
            Handle::Owned { shared, ops, .. } => control::execute(shared, ops, &command).await,
            Handle::Remote { info } => {
                control::send(&info.control_socket, &command, Duration::from_secs(300)).await
            }
        }
    }

    /// Stops `component` and starts it again with the same flags and data; returns once it
    /// serves again (etcd, API server) or runs.
    pub async fn restart(&self, component: Component) -> Result<()> {
        self.control(Command::Restart(component)).await.map(drop)
    }

    /// Loses node `name`, as when its power is cut: every process of it killed (the kubelet,
    /// containerd, the containers; or the stand-in and its containers), nothing reports for
    /// the node any more.
    pub async fn stop_node(&self, name: &str) -> Result<()> {
        self.control(Command::StopNode(name.into())).await.map(drop)
    }

    /// Restarts a daemon of real node `name` (containerd or the kubelet); its containers go on.
    pub async fn restart_daemon(&self, name: &str, daemon: realnode::Daemon) -> Result<()> {
        self.control(Command::RestartDaemon(name.into(), daemon))
            .await
            .map(drop)
    }

    /// Starts node `name` again (a real node boots afresh) and waits until it posts its
    /// status.
    pub async fn start_node(&self, name: &str) -> Result<()> {
        self.control(Command::StartNode(name.into()))
            .await
            .map(drop)
    }

    /// Adds a node; returns its name once it is Ready.
    pub async fn add_node(&self) -> Result<String> {
        self.control(Command::AddNode).await
    }
}

impl Drop for LabCluster {
    fn drop(&mut self) {
        if let Handle::Owned { shared, server, .. } = &mut self.handle {
            if let Some(server) = server.take() {
                server.abort();
            }
            cluster::lock(shared).teardown();
        }
    }
}

/// Why the lab's tests cannot run here, or None. `ALLOT_LAB_SKIP` set: skip, saying so; else
/// missing root or tools are failures, not skips.
pub fn skip_reason() -> Option<String> {
    std::env::var("ALLOT_LAB_SKIP")
        .ok()
        .map(|why| format!("ALLOT_LAB_SKIP is set ({why})"))
}
