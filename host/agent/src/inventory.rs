//! The configuration in force: what the last reload of the standalone directory installed, what
//! it held back and why, and the periodic work that keeps it (and the engine's index) current.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_api::ConfigProblem;
use allot_core::config::{InForce, Problem, reconcile};

use crate::server::Shared;
use crate::standalone;

/// What the agent last made of its configuration.
#[derive(Default)]
pub struct ConfigState {
    /// The versions in force (what the engine serves).
    pub in_force: InForce,
    /// Objects not (entirely) in force, and why.
    pub problems: Vec<Problem>,
    /// Files that could not be read completely, and why.
    pub incomplete: Vec<(String, String)>,
    /// Why the last reload installed nothing at all (the directory unreadable, the store
    /// failing), if it did.
    pub failure: Option<String>,
}

impl ConfigState {
    /// Whether what is in force differs from what the files say, or the last reload failed:
    /// reloads are retried every tick until it is not.
    pub fn degraded(&self) -> bool {
        !self.problems.is_empty() || !self.incomplete.is_empty() || self.failure.is_some()
    }

    /// Everything wrong, as `GET /v1/status` lists it.
    pub fn listed(&self) -> Vec<ConfigProblem> {
        let mut out: Vec<ConfigProblem> = self
            .incomplete
            .iter()
            .map(|(file, why)| ConfigProblem {
                kind: "File".into(),
                name: file.clone(),
                state: "incomplete".into(),
                reason: why.clone(),
            })
            .collect();
        out.extend(self.problems.iter().map(|p| ConfigProblem {
            kind: p.kind.to_string(),
            name: p.name.clone(),
            state: p.state.as_str().into(),
            reason: p.reason.clone(),
        }));
        if let Some(why) = &self.failure {
            out.push(ConfigProblem {
                kind: "Reload".into(),
                name: String::new(),
                state: "failed".into(),
                reason: why.clone(),
            });
        }
        out
    }
}

pub type SharedConfig = Mutex<ConfigState>;

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
            Source::Cluster(index) => index.read().observation().map(|(generation, _)| generation),
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

fn lock(config: &SharedConfig) -> std::sync::MutexGuard<'_, ConfigState> {
    config.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads the directory, decides what is in force (never more allocatable addresses than before
/// because of an invalid object), and installs it. Blocking: call off the async threads.
pub fn reload(shared: &Shared, source: &Source) {
    let first_load = !shared.engine.is_loaded();
    let result = (|| -> Result<(), String> {
        let observation = source.load()?;
        let previous = lock(&shared.config).in_force.clone();
        let serving = serving_pools(shared)?;
        let reconciled = reconcile(&previous, &observation, &|name| serving.contains(name));
        shared
            .engine
            .load(
                reconciled.in_force.pools(),
                reconciled.in_force.subnets(),
                reconciled.in_force.reserved(),
            )
            .map_err(|e| e.to_string())?;
        let mut config = lock(&shared.config);
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
        };
        Ok(())
    })();
    if let Err(why) = result {
        let mut config = lock(&shared.config);
        if config.failure.as_deref() != Some(why.as_str()) {
            if why.starts_with(WAITING_FOR_LISTS) {
                // Cluster mode starting: not a failure yet.
                tracing::info!("{why}");
            } else {
                tracing::error!("reload failed, keeping the configuration in force: {why}");
            }
        }
        config.failure = Some(why);
    }
    let config = lock(&shared.config);
    shared.metrics.set_config(&config);
    if first_load && shared.engine.is_loaded() {
        // The first load read every claim (the store's list, the engine's snapshot): hand the
        // freed pages of those transient copies back to the system, or the resident set keeps
        // them for good.
        crate::memory::release_free_pages();
    }
}

/// Pools that hold claims: they win overlaps. Before the first load the engine knows no pools,
/// so the store says which pools hold claims (once, at start).
fn serving_pools(shared: &Shared) -> Result<BTreeSet<String>, String> {
    if shared.engine.is_loaded() {
        return Ok(shared.engine.serving_pools());
    }
    use allot_core::store::Store as _;
    let claims = shared
        .engine
        .store()
        .all()
        .map_err(|e| format!("reading claims: {e}"))?;
    Ok(claims.into_iter().map(|c| c.pool).collect())
}

/// The agent's periodic work, one blocking call per tick: reload when the files changed or the
/// configuration is degraded, follow the store's change feed, replay the plugin's DEL journal,
/// release kept StatefulSet addresses past their keep time.
pub async fn run(shared: Arc<Shared>, source: Source, journal: PathBuf, every: Duration) {
    let mut last = source.fingerprint();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let expire_every = Duration::from_secs(60);
    let mut last_expiry = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        let s = shared.clone();
        let source = source.clone();
        let journal = journal.clone();
        let expire = last_expiry.elapsed() >= expire_every;
        if expire {
            last_expiry = tokio::time::Instant::now();
        }
        let fingerprint = last;
        let work = tokio::task::spawn_blocking(move || {
            let now = source.fingerprint();
            let degraded = lock(&s.config).degraded();
            if now != fingerprint || degraded {
                if now != fingerprint {
                    tracing::info!(source = %source.describe(), "pools changed; reloading");
                }
                reload(&s, &source);
            }
            if let Err(e) = s.engine.tick() {
                tracing::warn!("following the store's changes: {e}");
            }
            crate::journal::replay(&s, &journal);
            if expire {
                // Resyncs read every claim again; give their transient copies back.
                crate::memory::release_free_pages();
                match s.engine.expire_kept() {
                    Ok(released) => {
                        s.metrics.releases.inc_by(released.len() as u64);
                        for c in &released {
                            tracing::info!(address = %c.address, pod = %format!("{}/{}", c.pod.namespace, c.pod.name), "released a kept StatefulSet address: the pod did not come back");
                        }
                    }
                    Err(e) => tracing::warn!("releasing expired StatefulSet addresses: {e}"),
                }
            }
            now
        })
        .await;
        match work {
            Ok(now) => last = now,
            Err(e) => tracing::error!("periodic work failed: {e}"),
        }
    }
}
