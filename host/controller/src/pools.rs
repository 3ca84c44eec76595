//! Pool lifecycle: status counts derived from the claims, and the finalizer that keeps a pool
//! with claims from disappearing.
//!
//! - `status.allocatedIPCount` / `status.totalIPCount` of IPPools and Subnets are derived, never
//!   authoritative: recounted from the claims when the store changed, written only when they
//!   differ, at most once per `--status-interval-seconds` per pool. No pool-wide object is
//!   written per allocation (the hot spot that caps Spiderpool's pools).
//! - Every IPPool carries the finalizer [`FINALIZER`]. A deleted pool stays (terminating: the
//!   agents hand out nothing new from it, but still release) until no claim holds one of its
//!   addresses; then the finalizer is removed and the API server deletes it.
//!
//! Every write is a merge patch that carries the resourceVersion read, so a pool changed
//! meanwhile is left for the next round instead of overwritten.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use allot_core::addr::AddrSet;
use allot_core::config::{Object, ObjectKind};
use allot_core::store::{Changes, Store, StoreError};
use allot_index::cluster::AllotEntry;
use allot_index::{ClusterIndex, Shared};
use allot_k8s::{IPPool, Subnet};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::lease::Leadership;
use crate::metrics::{Metrics, PoolLabel};

/// The finalizer the controller keeps on every IPPool.
pub const FINALIZER: &str = "allot.dev/claims";

/// The pool lifecycle of one controller replica.
pub struct PoolLifecycle {
    client: kube::Client,
    store: Arc<dyn Store>,
    index: Arc<Shared<ClusterIndex>>,
    leadership: Leadership,
    metrics: Arc<Metrics>,
    /// Claims per pool, as of `revision` of the store.
    counts: HashMap<String, u64>,
    revision: Option<u64>,
}

/// What one round wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub status_written: Vec<String>,
    pub finalizers_added: Vec<String>,
    pub finalizers_removed: Vec<String>,
}

impl PoolLifecycle {
    pub fn new(
        client: kube::Client,
        store: Arc<dyn Store>,
        index: Arc<Shared<ClusterIndex>>,
        leadership: Leadership,
        metrics: Arc<Metrics>,
    ) -> PoolLifecycle {
        PoolLifecycle {
            client,
            store,
            index,
            leadership,
            metrics,
            counts: HashMap::new(),
            revision: None,
        }
    }

    /// Recounts the claims per pool if the store changed since the last count.
    async fn recount(&mut self) -> Result<(), StoreError> {
        let store = self.store.clone();
        let since = self.revision;
        let changed = match since {
            None => true,
            Some(rev) => {
                let answer = tokio::task::spawn_blocking(move || store.changes_since(rev))
                    .await
                    .map_err(|e| StoreError::backend_caused(e.to_string(), e))??;
                !matches!(answer, Changes::Since { changes, .. } if changes.is_empty())
            }
        };
        if !changed {
            return Ok(());
        }
        let store = self.store.clone();
        let snapshot = tokio::task::spawn_blocking(move || store.snapshot(u64::MAX))
            .await
            .map_err(|e| StoreError::backend_caused(e.to_string(), e))??;
        let mut counts: HashMap<String, u64> = HashMap::new();
        for c in &snapshot.claims {
            match counts.get_mut(&*c.pool) {
                Some(n) => *n += 1,
                None => {
                    counts.insert(c.pool.to_string(), 1);
                }
            }
        }
        self.counts = counts;
        self.revision = Some(snapshot.revision);
        Ok(())
    }

    /// One round: recount, then fix every pool's status and finalizer that is not as it
    /// should be. Only while this replica leads and the pools are listed.
    pub async fn round(&mut self) -> Result<Round, StoreError> {
        let mut round = Round::default();
        if !self.leadership.is_leading() || !self.index.read().ready_for_pools() {
            return Ok(round);
        }
        self.recount().await?;
        let entries: Vec<AllotEntry> = self
            .index
            .read()
            .allot_objects()
            .filter(|e| e.observed.kind != ObjectKind::ReservedIp)
            .cloned()
            .collect();
        let pools: Vec<&allot_core::Pool> = entries
            .iter()
            .filter_map(|e| match &e.observed.object {
                Ok(Object::Pool(p)) => Some(&**p),
                _ => None,
            })
            .collect();
        for entry in &entries {
            if !self.leadership.is_leading() {
                break;
            }
            let name = entry.observed.name.as_str();
            let wanted = match (&entry.observed.kind, &entry.observed.object) {
                (ObjectKind::IpPool, Ok(Object::Pool(p))) => {
                    let allocated = self.counts.get(name).copied().unwrap_or(0);
                    let total = p.allocatable().len();
                    let label = PoolLabel {
                        pool: name.to_string(),
                    };
                    self.metrics
                        .pool_allocated
                        .get_or_create(&label)
                        .set(allocated as i64);
                    self.metrics
                        .pool_total
                        .get_or_create(&label)
                        .set(total as i64);
                    Some((allocated, total))
                }
                (ObjectKind::Subnet, Ok(Object::Subnet(s))) => Some(subnet_counts(s, &pools)),
                _ => None,
            };
            // The finalizer first: its patch carries the resourceVersion read, which a status
            // write would change.
            if entry.observed.kind == ObjectKind::IpPool {
                self.finalize(entry, &mut round).await;
            }
            if let Some((allocated, total)) = wanted
                && entry.status != (Some(allocated), Some(total))
                && self.write_status(entry, allocated, total).await
            {
                round.status_written.push(name.to_string());
            }
        }
        self.forget_deleted_pools(&entries);
        Ok(round)
    }

    async fn write_status(&self, entry: &AllotEntry, allocated: u64, total: u64) -> bool {
        let name = &entry.observed.name;
        let patch = json!({"status": {"allocatedIPCount": allocated, "totalIPCount": total}});
        let result = match entry.observed.kind {
            ObjectKind::IpPool => Api::<IPPool>::all(self.client.clone())
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop),
            _ => Api::<Subnet>::all(self.client.clone())
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop),
        };
        match result {
            Ok(()) => {
                self.metrics.pool_status_writes.inc();
                true
            }
            Err(e) => {
                tracing::warn!(kind = %entry.observed.kind, name = %name, "cannot write status: {e}");
                false
            }
        }
    }

    /// Adds the finalizer to a live pool that lacks it; removes it from a deleted pool whose
    /// addresses no claim holds any more.
    async fn finalize(&self, entry: &AllotEntry, round: &mut Round) {
        let name = entry.observed.name.as_str();
        let has = entry.finalizers.iter().any(|f| f == FINALIZER);
        let finalizers: Vec<String> = if !entry.deleting && !has {
            let mut f = entry.finalizers.clone();
            f.push(FINALIZER.to_string());
            f
        } else if entry.deleting && has && self.counts.get(name).copied().unwrap_or(0) == 0 {
            // The count is from the store's mirror: a claim an agent made in the last moments,
            // before it saw the deletion, stays served as its own claim (the store keys claims
            // by address, so nothing can take that address twice).
            entry
                .finalizers
                .iter()
                .filter(|f| *f != FINALIZER)
                .cloned()
                .collect()
        } else {
            return;
        };
        let patch = json!({"metadata": {
            "resourceVersion": entry.resource_version,
            "finalizers": finalizers,
        }});
        match Api::<IPPool>::all(self.client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) if entry.deleting => {
                tracing::info!(pool = %name, "the deleted pool holds no claim any more: finalizer removed");
                round.finalizers_removed.push(name.to_string());
            }
            Ok(_) => round.finalizers_added.push(name.to_string()),
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                tracing::debug!(pool = %name, "pool changed meanwhile; next round: {}", e.message);
            }
            Err(e) => tracing::warn!(pool = %name, "cannot update the finalizer: {e}"),
        }
    }

    fn forget_deleted_pools(&self, entries: &[AllotEntry]) {
        let live: std::collections::BTreeSet<&str> = entries
            .iter()
            .filter(|e| e.observed.kind == ObjectKind::IpPool)
            .map(|e| e.observed.name.as_str())
            .collect();
        let gone: Vec<String> = self
            .counts
            .keys()
            .filter(|p| !live.contains(p.as_str()))
            .cloned()
            .collect();
        for pool in gone {
            let label = PoolLabel { pool };
            self.metrics.pool_allocated.remove(&label);
            self.metrics.pool_total.remove(&label);
        }
    }

    /// Runs a round every `interval` until `shutdown`.
    pub async fn run(
        mut self,
        interval: Duration,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            if let Err(e) = self.round().await {
                tracing::warn!("pool lifecycle round failed: {e}");
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// A Subnet's counts: addresses handed to pools of its CIDR (allocated), and addresses it may
/// hand out (total: what pools may be carved from, [`allot_core::Subnet::allocatable`]).
pub fn subnet_counts(subnet: &allot_core::Subnet, pools: &[&allot_core::Pool]) -> (u64, u64) {
    let own = subnet.allocatable();
    let handed = pools
        .iter()
        .filter(|p| p.subnet == subnet.subnet)
        .fold(AddrSet::empty(subnet.family), |acc, p| {
            acc.union(&p.allocatable().intersection(&own))
        });
    (handed.len(), own.len())
}
