//! Reloading the inventory: the pools, subnets and reserved addresses a [`Source`] holds now,
//! reconciled with what is in force (an invalid object never makes more addresses allocatable
//! than before) and installed in the engine. A verb of the node, as ADD and DEL are, so that
//! the agent's periodic work, its start and the tests all reload the same way.

use std::collections::BTreeSet;

use allot_core::config::reconcile;

use super::Node;
use crate::config::{ConfigState, lock};
use crate::inventory::{LoadError, Source};

impl Node {
    /// Reads `source`, decides what is in force (never more allocatable addresses than before
    /// because of an invalid object), and installs it in the engine; the configuration's state
    /// and metrics say what happened. Blocking: call off the async threads.
    pub fn reload(&self, source: &Source) {
        let _one_at_a_time = self.reloading();
        self.reload_serialized(source, source.fingerprint());
    }

    /// Reloads when `source` changed since the last reload read it, or, with `if_degraded`,
    /// when the configuration is degraded (an invalid object, a failed reload); whether it
    /// did. Blocking: call off the async threads.
    pub fn reload_if_changed(&self, source: &Source, if_degraded: bool) -> bool {
        let _one_at_a_time = self.reloading();
        let now = source.fingerprint();
        let (changed, degraded) = {
            let config = lock(self.config());
            (now != config.loaded_from, config.degraded())
        };
        if !(changed || if_degraded && degraded) {
            return false;
        }
        if changed && self.engine().is_loaded() {
            tracing::info!(source = %source.describe(), "pools changed; reloading");
        }
        self.reload_serialized(source, now);
        true
    }

    /// Cluster mode: narrows the IPBlocks followed to those of the pools in force this node may
    /// use ([`crate::cluster::Cluster::follow_blocks`]). Called after every reload and at every
    /// tick (a change of the node's labels changes the pools it may use).
    pub fn follow_blocks(&self) {
        if let Some(cluster) = self.cluster() {
            cluster.follow_blocks(&lock(self.config()).in_force);
        }
    }

    /// One reload at a time: an older observation is never installed over a newer one.
    fn reloading(&self) -> std::sync::MutexGuard<'_, ()> {
        self.reloading.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reloads what `source` says, read after its `fingerprint`.
    fn reload_serialized(&self, source: &Source, fingerprint: Option<u64>) {
        let first_load = !self.engine().is_loaded();
        let mut waiting = false;
        let result = (|| -> Result<(), String> {
            let observation = source.load().map_err(|e| {
                waiting = matches!(e, LoadError::Waiting { .. });
                e.to_string()
            })?;
            let previous = lock(self.config()).in_force.clone();
            let serving = serving_pools(self)?;
            let reconciled = reconcile(&previous, &observation, &|name| serving.contains(name));
            self.engine()
                .load(
                    reconciled.in_force.pools(),
                    reconciled.in_force.subnets(),
                    reconciled.in_force.reserved(),
                )
                .map_err(|e| e.to_string())?;
            let mut config = lock(self.config());
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
            let mut config = lock(self.config());
            if config.failure.as_deref() != Some(why.as_str()) {
                if waiting {
                    // Cluster mode starting: not a failure yet.
                    tracing::info!("{why}");
                } else {
                    tracing::error!("reload failed, keeping the configuration in force: {why}");
                }
            }
            config.failure = Some(why);
            // Degraded: the periodic work retries it; a change of the watched pools does not.
            config.loaded_from = fingerprint;
        }
        self.follow_blocks();
        let config = lock(self.config());
        self.metrics().set_config(&config);
        if first_load && self.engine().is_loaded() {
            // The first load read every claim (the store's list, the engine's snapshot): hand the
            // freed pages of those transient copies back to the system, or the resident set keeps
            // them for good.
            crate::memory::release_free_pages();
        }
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
