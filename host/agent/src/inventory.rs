//! Where pools come from and how they are reloaded: the standalone directory, etcd's config
//! keys or the cluster's objects, each reload deciding what is in force (never more allocatable
//! addresses than before because of an invalid object), and the periodic work that keeps the
//! configuration and the engine's index current.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use allot_core::config::reconcile;

use crate::config::{ConfigState, lock};
use crate::node::Node;
use crate::standalone;

/// How a cluster-mode reload before the first lists of pools says why it installed nothing.
const WAITING_FOR_LISTS: &str = "waiting for the first list of";

/// Where pools, subnets and reserved addresses come from.
#[derive(Clone)]
pub enum Source {
    /// The YAML files of a directory (`--standalone`).
    Dir(PathBuf),
    /// The `PREFIX/config/` keys of etcd (`--store etcd://…` without `--standalone`), written by
    /// `allotctl pool apply`.
    Etcd(Arc<allot_store::EtcdStore>),
    /// The cluster's IPPool, Subnet and ReservedIP objects (`--kubernetes`), as the watches
    /// keep them in the index.
    Cluster(Arc<allot_index::SharedIndex>),
}

impl Source {
    pub fn describe(&self) -> String {
        match self {
            Source::Dir(dir) => dir.display().to_string(),
            Source::Etcd(etcd) => format!("{etcd:?} config keys"),
            Source::Cluster(_) => "the cluster's IPPools, Subnets and ReservedIPs".into(),
        }
    }

    /// Changes whenever what [`Source::load`] would read changes (`None`: unreadable now).
    pub fn fingerprint(&self) -> Option<u64> {
        match self {
            Source::Dir(dir) => standalone::fingerprint(dir).ok(),
            Source::Etcd(etcd) => etcd.load_config().ok().map(|(f, _)| f),
            Source::Cluster(index) => index.read().pools_generation(),
        }
    }

    pub fn load(&self) -> Result<allot_core::config::Observation, String> {
        match self {
            Source::Dir(dir) => {
                standalone::load(dir).map_err(|e| format!("reading {}: {e}", dir.display()))
            }
            Source::Etcd(etcd) => etcd
                .load_config()
                .map(|(_, o)| o)
                .map_err(|e| format!("reading pools from etcd: {e}")),
            Source::Cluster(index) => {
                let index = index.read();
                index.observation().map(|(_, o)| o).ok_or_else(|| {
                    let waiting: Vec<&str> = index
                        .unsynced()
                        .into_iter()
                        .filter(|k| k.holds_pools())
                        .map(|k| k.as_str())
                        .collect();
                    format!(
                        "{WAITING_FOR_LISTS} {} from the Kubernetes API",
                        waiting.join(", ")
                    )
                })
            }
        }
    }
}

/// Reads the directory, decides what is in force (never more allocatable addresses than before
/// because of an invalid object), and installs it. Blocking: call off the async threads.
pub fn reload(node: &Node, source: &Source) {
    let _one_at_a_time = node.reloading();
    reload_serialized(node, source, source.fingerprint());
}

/// Reloads when the source changed since the last reload read it, or, with `if_degraded`,
/// when the configuration is degraded (an invalid object, a failed reload); whether it did.
/// Blocking: call off the async threads.
pub fn reload_if_changed(node: &Node, source: &Source, if_degraded: bool) -> bool {
    let _one_at_a_time = node.reloading();
    let now = source.fingerprint();
    let (changed, degraded) = {
        let config = lock(node.config());
        (now != config.loaded_from, config.degraded())
    };
    if !(changed || if_degraded && degraded) {
        return false;
    }
    if changed && node.engine().is_loaded() {
        tracing::info!(source = %source.describe(), "pools changed; reloading");
    }
    reload_serialized(node, source, now);
    true
}

/// Cluster mode: reloads as soon as the watches deliver a change of pools (after a short pause
/// that gathers a burst: a relist, `kubectl apply -f dir/`), the first lists included, rather
/// than at the next tick: the agent is ready once its watches have listed, and serves a new
/// pool a moment after it is created.
pub async fn follow_index(node: Arc<Node>) {
    let Some(index) = node.cluster().map(|c| c.index.clone()) else {
        return;
    };
    let mut changes = index.changes();
    while changes.changed().await.is_ok() {
        let seen = index.read().pools_generation();
        if seen.is_none() || seen == lock(node.config()).loaded_from {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (node, source) = (node.clone(), Source::Cluster(index.clone()));
        if let Err(e) =
            tokio::task::spawn_blocking(move || reload_if_changed(&node, &source, false)).await
        {
            tracing::error!("reloading the pools failed: {e}");
        }
    }
}

/// Reloads what `source` says, read after its `fingerprint`.
fn reload_serialized(node: &Node, source: &Source, fingerprint: Option<u64>) {
    let first_load = !node.engine().is_loaded();
    let result = (|| -> Result<(), String> {
        let observation = source.load()?;
        let previous = lock(node.config()).in_force.clone();
        let serving = serving_pools(node)?;
        let reconciled = reconcile(&previous, &observation, &|name| serving.contains(name));
        node.engine()
            .load(
                reconciled.in_force.pools(),
                reconciled.in_force.subnets(),
                reconciled.in_force.reserved(),
            )
            .map_err(|e| e.to_string())?;
        let mut config = lock(node.config());
        let incomplete: Vec<(String, String)> = observation.incomplete.into_iter().collect();
        if reconciled.problems != config.problems || incomplete != config.incomplete {
            for p in &reconciled.problems {
                tracing::error!(kind = %p.kind, name = %p.name, state = p.state.as_str(), "{p}");
            }
            for (file, why) in &incomplete {
                tracing::error!(file, "incomplete, keeping its objects in force: {why}");
            }
        }
        if config.failure.is_some() {
            tracing::info!("reload succeeded again");
        }
        *config = ConfigState {
            in_force: reconciled.in_force,
            problems: reconciled.problems,
            incomplete,
            failure: None,
            loaded_from: fingerprint,
        };
        Ok(())
    })();
    if let Err(why) = result {
        let mut config = lock(node.config());
        if config.failure.as_deref() != Some(why.as_str()) {
            if why.starts_with(WAITING_FOR_LISTS) {
                // Cluster mode starting: not a failure yet.
                tracing::info!("{why}");
            } else {
                tracing::error!("reload failed, keeping the configuration in force: {why}");
            }
        }
        config.failure = Some(why);
        // Degraded: the ticker retries it; a change of the watched pools does not.
        config.loaded_from = fingerprint;
    }
    let config = lock(node.config());
    node.metrics().set_config(&config);
    if first_load && node.engine().is_loaded() {
        // The first load read every claim (the store's list, the engine's snapshot): hand the
        // freed pages of those transient copies back to the system, or the resident set keeps
        // them for good.
        crate::memory::release_free_pages();
    }
}

/// Pools that hold claims: they win overlaps. Before the first load the engine knows no pools,
/// so the store says which pools hold claims (once, at start).
fn serving_pools(node: &Node) -> Result<BTreeSet<String>, String> {
    if node.engine().is_loaded() {
        return Ok(node.engine().serving_pools());
    }
    use allot_core::store::Store as _;
    let taken = node
        .engine()
        .store()
        .snapshot(u64::MAX)
        .map_err(|e| format!("reading claims: {e}"))?;
    Ok(taken.claims.iter().map(|t| t.pool.to_string()).collect())
}

/// The agent's periodic work, one blocking call per tick: reload when the files changed or the
/// configuration is degraded, follow the store's change feed, replay the DEL journal, release
/// kept StatefulSet addresses past their keep time.
pub async fn run(node: Arc<Node>, source: Source, every: Duration) {
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
            reload_if_changed(&node, &source, true);
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
