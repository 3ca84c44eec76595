//! Wiring: the store, the policy registry and the engine a node is made of, from the flags;
//! then its background work (watches, the Policy follower, reloads, the journal's replay once
//! the socket and the journal are the agent's, quarantine expiry) and the servers, until
//! SIGINT or SIGTERM.
//!
//! # Two runtimes, two API clients, on purpose
//!
//! The agent's runtime (two workers) serves the socket and runs the watches, the Policy follower
//! and the Endpoint writes, with the API client made here. An etcd or Kubernetes claim store
//! runs on a runtime of its own (one worker, [`allot_store::BlockingStore`]) with a client of
//! its own, made on that runtime by `KubeStore::connect`, because the engine calls the store
//! synchronously, from blocking threads and under an attachment's lock: were the store's calls
//! tasks of the agent's runtime, every ADD waiting on the store would hold a blocking thread
//! while the workers it waits for serve watches and requests, and a kube client's connection
//! task lives on the runtime that made it. Apart, a burst of watch events cannot delay a claim,
//! and the store's call budget times only the store. The cost is one thread and one connection
//! to the API server.

use std::sync::Arc;
use std::time::Duration;

use allot_core::store::{Store, system_clock};
use allot_engine::{Engine, EngineConfig, seed_of};
use allot_policy::{
    Limits, OnFailure, PolicyEngine, PolicyRegistry, PolicySource, PrecompiledCache,
};
use allot_store::OpenedStore;
use anyhow::{Context as _, bail};

use crate::args::{Args, FailureMode};
use crate::cluster::{self, Cluster, EndpointWriter, PolicyFollower};
use crate::engine::{AgentEngine, STANDALONE_CLUSTER};
use crate::identity;
use crate::inventory;
use crate::journal::Journal;
use crate::node::Node;
use crate::server;

/// Runs the agent `args` describe until it is told to stop.
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
    let hostname = identity::hostname();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()
        .context("starting the async runtime")?;
    let (store, source, etcd, cluster, node_id) = if args.kubernetes {
        // The Node's name, which the API server keeps unique, is the claims' identity: the
        // controller reads claims' node as a Node's name.
        let node_id = identity::resolve(args.node_name.as_deref(), &hostname, None)?;
        let node_name = node_id.name.clone();
        let client =
            runtime.block_on(allot_store::kube_client(args.store.kubeconfig.as_deref()))?;
        let index = allot_index::SharedIndex::new(&node_name);
        // The index first: its pools and this node's labels say which IPBlocks the store lists
        // and follows (the blocks of this node's pools, not the cluster's).
        {
            let _in_runtime = runtime.enter();
            cluster::watch(&index, &client);
        }
        let scope = runtime.block_on(cluster::first_scope(&index));
        let store = Arc::new(allot_store::KubeStore::connect(&allot_store::KubeConfig {
            kubeconfig: args.store.kubeconfig.clone(),
            node: Some(node_name.clone()),
            timeout: None,
            scope,
        })?);
        tracing::info!(node = %node_name, "cluster mode: claims are kept in the cluster's IPBlocks");
        let cluster = Cluster {
            index: index.clone(),
            client: client.clone(),
            pod_wait: Duration::from_millis(args.pod_wait_ms),
            endpoints: EndpointWriter::new(client, &node_name, runtime.handle().clone()),
            runtime: runtime.handle().clone(),
            blocks: store.clone(),
            scoped: Default::default(),
        };
        let store: Arc<dyn Store> = store;
        (
            store,
            inventory::Source::Cluster(index),
            None,
            Some(cluster),
            node_id,
        )
    } else {
        let opened = args.store.open(&args.state)?;
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
        // Nodes sharing etcd may share a hostname too (clones, `localhost`): without a name
        // given, each claims as an identity kept next to its state.
        let state_dir = match args.state.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => std::path::Path::new("."),
        };
        let node_id = identity::resolve(
            args.node_name.as_deref(),
            &hostname,
            etcd.is_some().then_some(state_dir),
        )?;
        if let Some(file) = &node_id.kept_in {
            tracing::info!(node = %node_id.name, claims_as = %node_id.claims_as, kept_in = %file.display(), "no --node-name: pools match the hostname; this node's claims record the identity kept in its state directory");
        }
        (opened.shared(), source, etcd, None, node_id)
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
        spread: shared_store.then(|| seed_of(&node_id.claims_as)),
        single_node: !shared_store,
    };
    let engine: Arc<AgentEngine> = Arc::new(
        Engine::with_config(
            store,
            registry.for_cluster(STANDALONE_CLUSTER),
            config,
            system_clock(),
        )
        .on_node(&node_id.claims_as),
    );
    let follower = cluster.as_ref().map(|c| PolicyFollower {
        client: c.client.clone(),
        registry: registry.clone(),
        cluster: STANDALONE_CLUSTER.into(),
        name: args.policy_object.clone(),
        node: node_id.name.clone(),
        base_limits: limits,
        cache,
        base: base_policy,
        oci,
    });
    let mut node = Node::new(node_id.name, engine, registry, Journal::new(&args.journal))
        .with_underlay(underlay);
    if let Some(log) = decisions {
        node = node.with_decisions(log);
    }
    if let Some(cluster) = cluster {
        node = node.with_cluster(cluster);
    }
    let node = Arc::new(node);
    let stopping = node.clone();

    let served = runtime.block_on(async move {
        // First, so that the kubelet's probes and Prometheus get answers while pools load.
        if let Some(address) = args.metrics_address {
            server::serve_metrics(node.clone(), address).await?;
        }
        if let Some(follower) = follower {
            tokio::spawn(follower.run());
        }
        let first = node.clone();
        let first_source = source.clone();
        tokio::task::spawn_blocking(move || first.reload(&first_source))
            .await
            .context("loading the pools")?;
        // Once the socket and the journal are this agent's, DELs remembered while it was away
        // are served before any ADD is taken; an entry that cannot be served yet is settled by
        // its attachment's ADD, or at a tick (which replays only from here on, too).
        let owned = server::start(node.clone(), &args.socket).await?;
        if let Some(etcd) = etcd {
            follow_watch(node.clone(), etcd);
        }
        let expiry = spawn_expiry(node.clone());
        let ticker = tokio::spawn(periodic(
            node.clone(),
            source,
            Duration::from_millis(args.reload_interval_ms.max(100)),
        ));
        let pools_follower = tokio::spawn(follow_index(node.clone()));
        let served = server::serve(node, owned).await;
        pools_follower.abort();
        ticker.abort();
        expiry.abort();
        served
    });
    // The workers finish their probes, and macvlan probe ports are removed.
    if let Some(ahead) = stopping.ahead() {
        ahead.stop();
    }
    served
}

/// How often expired quarantines are looked for: a tenth of the quarantine, between 1 s and a
/// minute.
fn expiry_interval(quarantine_seconds: u64) -> Duration {
    Duration::from_secs((quarantine_seconds / 10).clamp(1, 60))
}

/// Releases quarantined addresses once `--quarantine-seconds` have passed.
fn spawn_expiry(node: Arc<Node>) -> tokio::task::JoinHandle<()> {
    let every = expiry_interval(node.underlay().quarantine_seconds);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !node.ready() {
                continue;
            }
            let node = node.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || node.expire_quarantined()).await {
                tracing::error!("releasing expired quarantines failed: {e}");
            }
        }
    })
}

/// Applies other nodes' claims and releases as soon as the store's watch reports them, rather
/// than at the next tick (which still follows the feed, and resyncs, as the safety net).
fn follow_watch(node: Arc<Node>, etcd: Arc<allot_store::EtcdStore>) {
    let spawned = std::thread::Builder::new()
        .name("allot-follow".into())
        .spawn(move || {
            loop {
                let seen = node.engine().revision();
                if !node.engine().is_loaded() || !etcd.wait_for_change(seen, Duration::from_secs(5))
                {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                if let Err(e) = node.engine().sync() {
                    tracing::debug!("following the store's watch: {e}");
                }
                if node.engine().revision() == seen {
                    // Nothing applied (the store is unreachable): do not spin.
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start following the store's watch ({e}); the periodic tick will");
    }
}

/// The agent's periodic work, one blocking call per tick: reload when the files changed or the
/// configuration is degraded, follow the store's change feed, replay the DEL journal, release
/// kept StatefulSet addresses past their keep time.
async fn periodic(node: Arc<Node>, source: inventory::Source, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let expire_every = Duration::from_secs(60);
    let mut last_expiry = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        let node = node.clone();
        let source = source.clone();
        let expire = last_expiry.elapsed() >= expire_every;
        if expire {
            last_expiry = tokio::time::Instant::now();
        }
        let work = tokio::task::spawn_blocking(move || {
            node.reload_if_changed(&source, true);
            node.follow_blocks();
            if let Err(e) = node.engine().tick() {
                tracing::warn!("following the store's changes: {e}");
            }
            node.replay_journal();
            if expire {
                // Resyncs read every claim again; give their transient copies back.
                crate::memory::release_free_pages();
                node.expire_kept();
            }
        })
        .await;
        if let Err(e) = work {
            tracing::error!("periodic work failed: {e}");
        }
    }
}

/// Cluster mode: reloads as soon as the watches deliver a change of pools (after a short pause
/// that gathers a burst: a relist, `kubectl apply -f dir/`), the first lists included, rather
/// than at the next tick: the agent is ready once its watches have listed, and serves a new
/// pool a moment after it is created.
async fn follow_index(node: Arc<Node>) {
    let Some(index) = node.cluster().map(|c| c.index.clone()) else {
        return;
    };
    let mut changes = index.changes();
    while changes.changed().await.is_ok() {
        let seen = index.read().pools_generation();
        if seen.is_none() || seen == crate::config::lock(node.config()).loaded_from {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (node, source) = (node.clone(), inventory::Source::Cluster(index.clone()));
        if let Err(e) =
            tokio::task::spawn_blocking(move || node.reload_if_changed(&source, false)).await
        {
            tracing::error!("reloading the pools failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_runs_often_enough() {
        assert_eq!(expiry_interval(1), Duration::from_secs(1));
        assert_eq!(expiry_interval(120), Duration::from_secs(12));
        assert_eq!(
            expiry_interval(crate::node::DEFAULT_QUARANTINE_SECONDS),
            Duration::from_secs(60)
        );
    }
}
