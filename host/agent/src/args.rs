//! Flags, and the wiring of store, policy, engine, reloads and server.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_core::engine::{Engine, EngineConfig, seed_of};
use allot_core::store::Store;
use allot_core::store::system_clock;
use allot_policy::{
    ClusterHandle, Limits, OnFailure, PolicyEngine, PolicyRegistry, PolicySource, PrecompiledCache,
};
use allot_store::{OpenedStore, StoreArgs};
use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};

use crate::cluster::{self, Cluster, EndpointWriter, PolicyFollower};
use crate::inventory;
use crate::metrics::Metrics;
use crate::server::{self, Shared};

/// The registry key of the one cluster a standalone agent serves.
pub const STANDALONE_CLUSTER: &str = "standalone";

#[derive(Parser, Debug)]
#[command(
    name = "allot-agent",
    version,
    about = "allot's node agent: allocates addresses for the allot CNI plugin"
)]
pub struct Args {
    /// Serve pools, subnets and reserved addresses from the YAML files of this directory
    /// (reloaded when they change), without Kubernetes. Without it, `--store etcd://…` serves
    /// the pools kept in etcd (`allotctl pool apply`).
    #[arg(long, value_name = "DIR", conflicts_with = "kubernetes")]
    standalone: Option<PathBuf>,
    /// Cluster mode: claims in the cluster's IPBlocks, pools from its IPPools, Subnets and
    /// ReservedIPs, each pod's labels, annotations and owner from watches, the policy from the
    /// cluster's Policy object. Uses the in-cluster ServiceAccount unless --kubeconfig is given.
    #[arg(long, conflicts_with = "store")]
    kubernetes: bool,
    /// Cluster mode: how long an ADD waits for its pod to reach the agent's watch before it
    /// reads the pod from the API once.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 2000,
        requires = "kubernetes"
    )]
    pod_wait_ms: u64,
    /// Cluster mode: the name of the cluster-scoped Policy object the agent follows.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "default",
        requires = "kubernetes"
    )]
    policy_object: String,
    /// The unix socket the plugin talks to.
    #[arg(long, value_name = "PATH", default_value = allot_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The embedded claim store, a SQLite file (inspect it with sqlite3), used unless --store
    /// names another.
    #[arg(long, value_name = "FILE", default_value = "/var/lib/allot/allot.db")]
    state: PathBuf,
    #[command(flatten)]
    store: StoreArgs,
    /// This node's name, as pools' nodeName and nodeAffinity see it (default: the hostname).
    #[arg(long)]
    node_name: Option<String>,
    /// How often the agent checks the standalone directory for changes and follows the store's
    /// change feed; a degraded configuration (an invalid object, a failed reload) is reloaded
    /// this often until it is fixed.
    #[arg(long, default_value_t = 1000)]
    reload_interval_ms: u64,
    /// A pool-selection policy component to use instead of the embedded default: a file, or an
    /// OCI artifact (`oci://HOST/REPO@sha256:…`, pushed with `allotctl policy push`; every digest
    /// is verified, and a tag instead of a digest is pulled as it is now).
    #[arg(long, value_name = "FILE.wasm|oci://HOST/REPO@sha256:HEX")]
    policy: Option<String>,
    /// Refuse the policy unless its sha256 is this (hex).
    #[arg(long, value_name = "HEX", requires = "policy")]
    policy_sha256: Option<String>,
    /// What to do when the policy faults (traps, deadline, memory cap, bogus output).
    #[arg(long, value_enum, default_value_t = FailureMode::Fail)]
    policy_on_failure: FailureMode,
    /// Wall-clock budget of one policy call.
    #[arg(long, default_value_t = 100)]
    policy_deadline_ms: u64,
    /// Memory a policy instance may use, in MiB.
    #[arg(long, default_value_t = 64)]
    policy_memory_mib: usize,
    /// An OCI registry (`HOST` or `HOST:PORT`) to pull policies from over plain HTTP (loopback
    /// registries always are); may be repeated.
    #[arg(long, value_name = "HOST[:PORT]")]
    registry_plain_http: Vec<String>,
    /// How many recent policy decisions the agent keeps for `allotctl policy record` (served on
    /// its socket, GET /v1/decisions). They hold what the policy saw, pod labels and annotations
    /// included; 0 keeps none.
    #[arg(long, value_name = "N", default_value_t = 64)]
    record_decisions: usize,
    /// Seconds a released address stays out of use before it is handed out again (neighbours'
    /// ARP caches may still point at the old pod).
    #[arg(long, value_name = "SECONDS", default_value_t = EngineConfig::default().cooldown)]
    cooldown_seconds: u64,
    /// GC releases a leaked claim only after seeing it leaked twice at least this far apart,
    /// and never a claim younger than this.
    #[arg(long, value_name = "SECONDS", default_value_t = EngineConfig::default().gc_grace)]
    gc_grace_seconds: u64,
    /// A StatefulSet pod's address kept after DEL is released when the pod has not been added
    /// again within this time.
    #[arg(long, value_name = "SECONDS", default_value_t = EngineConfig::default().stateful_keep)]
    statefulset_keep_seconds: u64,
    /// The free indexes are rebuilt from the store this often, whatever its change feed said.
    #[arg(long, value_name = "SECONDS", default_value_t = EngineConfig::default().resync)]
    resync_seconds: u64,
    /// Where the plugin remembers DELs it could not deliver (its ipam `journal`); the agent
    /// replays them.
    #[arg(long, value_name = "DIR", default_value = allot_api::DEFAULT_JOURNAL)]
    journal: PathBuf,
    /// Where compiled policies are cached (default: $ALLOT_CACHE_DIR, else /var/cache/allot
    /// when root, else ~/.cache/allot/policies).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Also serve `/metrics`, `/healthz` and `/readyz` over plain HTTP on this TCP address
    /// (`[::]:9401` answers IPv6 and IPv4), for Prometheus and the kubelet's probes. Only those
    /// three: the plugin API, status and recorded decisions stay on the unix socket.
    #[arg(long, value_name = "ADDR")]
    metrics_address: Option<std::net::SocketAddr>,
    #[command(flatten)]
    underlay: crate::quarantine::UnderlayArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FailureMode {
    /// Fail the ADD with the policy's error.
    Fail,
    /// Decide with the embedded default policy instead.
    Fallback,
}

pub type AgentEngine = Engine<Arc<dyn Store>, ClusterHandle>;

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(dir) = &args.standalone
        && !dir.is_dir()
    {
        bail!(
            "--standalone {}: not a directory of pool YAML files",
            dir.display()
        );
    }
    let underlay = args.underlay.underlay()?;
    let node_name = match &args.node_name {
        Some(n) => n.clone(),
        None => hostname(),
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()
        .context("starting the async runtime")?;
    let (store, source, etcd, cluster) = if args.kubernetes {
        let store = allot_store::KubeStore::connect(&allot_store::KubeConfig {
            kubeconfig: args.store.kubeconfig.clone(),
            node: Some(node_name.clone()),
            timeout: None,
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!(node = %node_name, "cluster mode: claims are kept in the cluster's IPBlocks");
        let client = runtime
            .block_on(allot_store::kube_client(args.store.kubeconfig.as_deref()))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let index = allot_index::SharedIndex::new(&node_name);
        let cluster = Cluster {
            index: index.clone(),
            client: client.clone(),
            pod_wait: Duration::from_millis(args.pod_wait_ms),
            endpoints: EndpointWriter::new(client, &node_name, runtime.handle().clone()),
        };
        let store: Arc<dyn Store> = Arc::new(store);
        (
            store,
            inventory::Source::Cluster(index),
            None,
            Some(cluster),
        )
    } else {
        let opened = args
            .store
            .open(&args.state)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!(store = %opened.describe(), "claims are kept in this store");
        let source = match (&args.standalone, &opened) {
            (_, OpenedStore::Kubernetes(_)) => bail!(
                "--store kubernetes is cluster mode: run the agent with --kubernetes \
                 [--kubeconfig FILE] instead"
            ),
            (Some(dir), _) => inventory::Source::Dir(dir.clone()),
            (None, OpenedStore::Etcd(etcd)) => inventory::Source::Etcd(etcd.clone()),
            (None, OpenedStore::Sqlite(_)) => bail!(
                "no pools to serve: run with --standalone DIR (pools from YAML files), with \
                 --store etcd://HOST:PORT to read the pools `allotctl pool apply` wrote to etcd, \
                 or with --kubernetes to serve a cluster's pools"
            ),
        };
        let etcd = match &opened {
            OpenedStore::Etcd(etcd) => Some(etcd.clone()),
            OpenedStore::Sqlite(_) | OpenedStore::Kubernetes(_) => None,
        };
        (opened.shared(), source, etcd, None)
    };
    let limits = Limits {
        memory_bytes: args.policy_memory_mib << 20,
        deadline: Duration::from_millis(args.policy_deadline_ms),
        ..Limits::default()
    };
    let cache = match &args.cache_dir {
        Some(d) => Some(PrecompiledCache::new(d)),
        None if std::env::var_os("ALLOT_CACHE_DIR").is_none()
            && unsafe { libc::geteuid() } == 0 =>
        {
            Some(PrecompiledCache::new("/var/cache/allot/policies"))
        }
        None => PrecompiledCache::default_location(),
    };
    let policies = PolicyEngine::new(limits, cache.clone())?;
    let default = Arc::new(policies.load(&PolicySource::embedded_default())?);
    let decisions = (args.record_decisions > 0)
        .then(|| Arc::new(allot_policy::DecisionLog::new(args.record_decisions)));
    let mut registry = PolicyRegistry::new(default);
    if let Some(log) = &decisions {
        registry = registry.with_decision_log(log.clone());
    }
    let registry = Arc::new(registry);
    let oci = allot_oci::Options {
        plain_http: args.registry_plain_http.clone(),
        credentials: None,
    };
    let mut base_policy = None;
    if let Some(location) = &args.policy {
        let mut source = match location.strip_prefix("oci://") {
            Some(_) => {
                let reference = allot_oci::OciSource::parse(location)?;
                let pulled = runtime
                    .block_on(allot_oci::pull(&reference, &oci))
                    .context("pulling --policy")?;
                tracing::info!(policy = %reference, manifest = %pulled.manifest_digest, component = %pulled.component_digest, "pulled the policy");
                PolicySource::bytes(location.clone(), pulled.component)
            }
            None => PolicySource::file(location)?,
        };
        if let Some(hex) = &args.policy_sha256 {
            source = source.with_sha256(hex);
        }
        let policy = Arc::new(policies.load(&source)?);
        let on_failure = match args.policy_on_failure {
            FailureMode::Fail => OnFailure::Fail,
            FailureMode::Fallback => OnFailure::FallBackToDefault,
        };
        registry.install(STANDALONE_CLUSTER, policy.clone(), on_failure);
        base_policy = Some((policy, on_failure));
    }
    // Several nodes write this store (etcd, the cluster's IPBlocks), or this node alone (SQLite).
    let shared_store = etcd.is_some() || cluster.is_some();
    let config = EngineConfig {
        cooldown: args.cooldown_seconds,
        gc_grace: args.gc_grace_seconds,
        stateful_keep: args.statefulset_keep_seconds,
        resync: args.resync_seconds.max(1),
        // Nodes sharing a store start each pool at a place of their own, so they rarely race.
        spread: shared_store.then(|| seed_of(&node_name)),
        single_node: !shared_store,
    };
    let engine: Arc<AgentEngine> = Arc::new(
        Engine::with_config(
            store,
            registry.for_cluster(STANDALONE_CLUSTER),
            config,
            system_clock(),
        )
        .on_node(&node_name),
    );
    let metrics = Arc::new(Metrics::new());
    let follower = cluster.as_ref().map(|c| PolicyFollower {
        client: c.client.clone(),
        registry: registry.clone(),
        cluster: STANDALONE_CLUSTER.into(),
        name: args.policy_object.clone(),
        node: node_name.clone(),
        base_limits: limits,
        cache,
        base: base_policy,
        oci,
    });
    let ahead = underlay.ahead.map(|cfg| {
        Arc::new(crate::ahead::ProbeAhead::new(
            cfg,
            engine.clone(),
            metrics.clone(),
        ))
    });
    let stop_ahead = ahead.clone();
    let shared = Arc::new(Shared {
        engine,
        metrics,
        node_name,
        config: Default::default(),
        journal: args.journal.clone(),
        cluster,
        underlay,
        decisions,
        ahead,
        policies: registry,
    });

    let served = runtime.block_on(async move {
        // First, so that the kubelet's probes and Prometheus get answers while pools load.
        if let Some(address) = args.metrics_address {
            server::serve_metrics(shared.clone(), address).await?;
        }
        if let Some(c) = &shared.cluster {
            cluster::watch(&c.index, &c.client);
        }
        if let Some(follower) = follower {
            tokio::spawn(follower.run());
        }
        let first = shared.clone();
        let first_source = source.clone();
        tokio::task::spawn_blocking(move || inventory::reload(&first, &first_source))
            .await
            .context("loading the pools")?;
        // DELs remembered while this agent was away are served before any ADD is taken; an
        // entry that cannot be served yet is settled by its attachment's ADD, or at a tick.
        let replaying = shared.clone();
        let journal = args.journal.clone();
        tokio::task::spawn_blocking(move || crate::journal::replay(&replaying, &journal))
            .await
            .context("replaying the DEL journal")?;
        if let Some(etcd) = etcd {
            follow_watch(shared.clone(), etcd);
        }
        let expiry = crate::quarantine::spawn_expiry(shared.clone());
        let ticker = tokio::spawn(inventory::run(
            shared.clone(),
            source,
            args.journal.clone(),
            Duration::from_millis(args.reload_interval_ms.max(100)),
        ));
        let served = server::serve(shared, &args.socket).await;
        ticker.abort();
        expiry.abort();
        served
    });
    // The workers finish their probes, and macvlan probe ports are removed.
    if let Some(ahead) = stop_ahead {
        ahead.stop();
    }
    served
}

/// Applies other nodes' claims and releases as soon as the store's watch reports them, rather
/// than at the next tick (which still follows the feed, and resyncs, as the safety net).
fn follow_watch(shared: Arc<Shared>, etcd: Arc<allot_store::EtcdStore>) {
    let spawned = std::thread::Builder::new()
        .name("allot-follow".into())
        .spawn(move || {
            loop {
                let seen = shared.engine.revision();
                if !shared.engine.is_loaded() || !etcd.wait_for_change(seen, Duration::from_secs(5))
                {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                if let Err(e) = shared.engine.sync() {
                    tracing::debug!("following the store's watch: {e}");
                }
                if shared.engine.revision() == seen {
                    // Nothing applied (the store is unreachable): do not spin.
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start following the store's watch ({e}); the periodic tick will");
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
