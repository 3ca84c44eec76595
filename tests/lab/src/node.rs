//! The kubelet stand-in: one process per node, playing the kubelet **and** the container
//! runtime for what the lab needs. No container runtime can run on this machine (no image
//! store, no cgroups to give containers), so this stand-in does their work with plain
//! processes and namespaces:
//!
//! * **Node**: registers the Node (InternalIPs, 8 CPUs, 32 GiB, 250 pods, no taints), renews
//!   its Lease and its Ready heartbeat ([`nodeobj`]). It authenticates as `system:node:<name>`
//!   in `system:nodes`, so the Node authorizer and NodeRestriction apply to it as to a kubelet.
//! * **Network**: a hostNetwork pod uses the node's namespace; any other pod gets a network
//!   namespace of its own and the node's CNI configuration, as containerd applies it ([`cni`]).
//! * **Containers** of an image the node has (`--image REF=DIR`, see [`crate::image`]) run as
//!   real processes in the pod's network namespace, with their own mount, UTS and IPC
//!   namespaces, their volumes mounted, their user and environment, probes and restarts
//!   ([`pod`], [`helper`]). Containers of other images (busybox, pause, ...) are not run: the
//!   pod's sandbox and network are real, init containers report completion at once and
//!   containers report running (and ready) until the pod stops; their probes are not run.
//! * **What a node's files are**: see [`hostfs`].
//!
//! Not done: cgroups and resource limits, capabilities (`securityContext.capabilities` and
//! `privileged` are not enforced: containers run as their user with no capability changes
//! beyond the uid), seccomp and AppArmor, a pid namespace, images pulled from registries,
//! `kubectl logs`/`exec`/`port-forward` (no kubelet server: logs are files on the node,
//! `/var/log/pods/<ns>_<pod>_<uid>/<container>.log`), Service environment variables other than
//! the `kubernetes` Service's (no kube-proxy either), preStop and postStart hooks, sidecar init
//! containers (`restartPolicy: Always` on an init container), ephemeral containers, HTTPS and
//! gRPC probes, volume types other than hostPath, emptyDir (a directory, also for
//! `medium: Memory`), configMap, secret, downwardAPI and projected. A real kubelet reports its
//! node NotReady until the CNI configuration exists; this one reports Ready at once and holds
//! pods back with a `NetworkNotReady` event instead. When a stand-in starts again after it was
//! killed, the containers it had started are killed and started again (counted as restarts);
//! their sandboxes are kept.

pub mod cni;
pub mod containers;
pub mod env;
pub mod events;
pub mod helper;
pub mod hostfs;
pub mod manager;
pub mod nodeobj;
pub mod pod;
pub mod probe;
pub mod state;
pub mod status;
mod sys;
pub mod volumes;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::{Semaphore, watch};

use crate::image::Image;

/// `allot-lab-node` flags.
#[derive(Debug, clap::Parser)]
#[command(about = "A kubelet stand-in for allot's local Kubernetes lab")]
pub struct NodeArgs {
    /// Kubeconfig with the node's credentials (user system:node:<name>, group system:nodes).
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// The Node's name.
    #[arg(long)]
    pub name: String,
    /// The node's network namespace (its host network).
    #[arg(long)]
    pub netns: PathBuf,
    #[arg(long)]
    pub ipv4: Ipv4Addr,
    #[arg(long)]
    pub ipv6: Option<Ipv6Addr>,
    /// The node's host filesystem (its /etc/cni/net.d, /opt/cni/bin, /var/lib/cni, ...).
    #[arg(long)]
    pub root: PathBuf,
    /// An image the node runs as real processes: REFERENCE=DIRECTORY (repeatable).
    #[arg(long = "image", value_name = "REF=DIR")]
    pub images: Vec<String>,
    /// CNI calls (ADD, DEL) in flight at once.
    #[arg(long, default_value_t = 8)]
    pub parallel_cni: usize,
}

/// What every pod task of the node shares.
pub struct Node {
    pub client: kube::Client,
    pub id: nodeobj::NodeIdentity,
    pub fs: Arc<hostfs::NodeFs>,
    pub cni: Arc<cni::Cni>,
    pub images: Vec<Image>,
    pub recorder: Arc<events::Recorder>,
    pub objects: volumes::ObjectCache,
    /// The API server's address, as containers' `KUBERNETES_SERVICE_*` name it.
    pub api_host: String,
    pub api_port: u16,
    /// This binary: the container helper.
    pub helper: PathBuf,
    pub host_ips: Vec<IpAddr>,
    /// Bounds concurrent status writes.
    pub status_slots: Semaphore,
}

/// A client error as a kubelet reports it: the API server's message, without the client's
/// debugging detail.
pub fn api_error(e: kube::Error) -> anyhow::Error {
    match e {
        kube::Error::Api(status) => anyhow::anyhow!("{}", status.message),
        other => anyhow::anyhow!(other),
    }
}

/// The stand-in's `main`: helper modes first, then enter the node's network namespace and make
/// its mount namespace (both need a single-threaded process), then run.
pub fn main() -> Result<()> {
    helper::run_if_requested();
    let args = <NodeArgs as clap::Parser>::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_client=off".into()),
        )
        .with_ansi(false)
        .init();
    let netns = sys::open(&args.netns, libc::O_RDONLY)?;
    sys::setns(&netns, libc::CLONE_NEWNET, &args.netns)?;
    let fs = hostfs::NodeFs::setup(&args.root)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args, fs))
}

async fn run(args: NodeArgs, fs: hostfs::NodeFs) -> Result<()> {
    let kc = kube::config::Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let api_host = config.cluster_url.host().unwrap_or("127.0.0.1").to_string();
    let api_port = config.cluster_url.port_u16().unwrap_or(443);
    let client = kube::Client::try_from(config)?;
    let mut images = Vec::new();
    for spec in &args.images {
        let (reference, dir) = spec
            .split_once('=')
            .with_context(|| format!("--image {spec:?}: expected REFERENCE=DIRECTORY"))?;
        images.push(Image::load(reference, &PathBuf::from(dir))?);
    }
    let id = nodeobj::NodeIdentity {
        name: args.name.clone(),
        ipv4: args.ipv4,
        ipv6: args.ipv6,
    };
    let fs = Arc::new(fs);
    let cni = Arc::new(cni::Cni::new(fs.clone(), args.parallel_cni));
    // Why the node's network is not ready (the NotReady condition words the rest).
    let network = {
        let cni = cni.clone();
        move || match cni.network() {
            Ok(_) => Ok(()),
            Err(cni::CniError::NotReady(why) | cni::CniError::Failed(why)) => Err(why),
        }
    };
    register(&client, &id, &network()).await?;
    tokio::spawn(nodeobj::heartbeat(client.clone(), id.clone(), network));
    let mut host_ips: Vec<IpAddr> = vec![args.ipv4.into()];
    host_ips.extend(args.ipv6.map(IpAddr::from));
    let node = Arc::new(Node {
        cni,
        recorder: Arc::new(events::Recorder::new(client.clone(), &args.name)),
        objects: volumes::ObjectCache::new(client.clone()),
        client,
        id,
        fs,
        images,
        api_host,
        api_port,
        helper: std::env::current_exe()?,
        host_ips,
        status_slots: Semaphore::new(16),
    });
    let (stop, stopped) = watch::channel(false);
    let pods = tokio::spawn(manager::run(node, stopped));
    tracing::info!("node {} ready", args.name);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down: stopping containers and sandboxes, keeping the Pod objects");
    let _ = stop.send(true);
    let _ = pods.await;
    Ok(())
}

/// Registers the Node, its Lease and first status, retrying while the API server is not
/// there yet (a stand-in may start while it restarts).
async fn register(
    client: &kube::Client,
    id: &nodeobj::NodeIdentity,
    network: &Result<(), String>,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let attempt = async {
            nodeobj::register(client, id).await?;
            nodeobj::renew_lease(client, id).await?;
            nodeobj::report_status(client, id, network).await
        };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline => {
                tracing::warn!("registering node {}: {e:#}; retrying", id.name);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e),
        }
    }
}
