//! A pass's writes: [`Work`] from the index, done through [`super::api`] (`allocate`, `release`,
//! `sync`), whose compare-and-swap on the pool's record keeps allocators that race (two
//! controllers, a leader that lost its lease) from handing out overlapping ranges. Leadership is
//! checked before each call; a pass stops at the first error that says the API is failing (the
//! loop retries with backoff) and goes on past a refusal or a lost race, which concern one
//! cluster.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::fleet::{FleetApiError, FleetCluster, allocate, release, sync};
use allot_index::fleet::CLUSTER_NAME_LABEL;
use allot_k8s::openapi::api::core::v1::ObjectReference;
use allot_k8s::{IPAMAllocation, IPAMAllocationSpec, IPAMPool};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::events::{Event, EventType};
use serde_json::json;

use super::wants::{Allocate, ClusterRef, Notice, Release, Work, cluster_label};
use crate::lease::Leadership;

pub use crate::events::Events;

/// The reason of the Event that tells a Cluster its allocation was refused.
const REFUSED: &str = "FleetAllocationRefused";
/// Events remembered as told, at most.
const MAX_REMEMBERED: usize = 100_000;

/// What a pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub allocated: usize,
    pub released: usize,
    /// Refusals (from the pool, or of a request's datacenter), written into statuses.
    pub refused: usize,
    /// Something could not be done now (the API failing, a race lost 16 times): pass again
    /// soon.
    pub retry: bool,
    /// Leadership was lost during the pass: nothing more was written.
    pub stopped: bool,
}

/// Does the passes' writes.
pub struct Reconciler {
    client: kube::Client,
    recorder: Events,
    leadership: Leadership,
    /// The Cluster API version Events name their Cluster with.
    cluster_api_version: String,
    /// Events published: (namespace, cluster, reason, pool) → the note, so a reason is told
    /// once, not every pass.
    published: HashMap<(String, String, &'static str, String), String>,
}

impl Reconciler {
    pub fn new(
        client: kube::Client,
        recorder: Events,
        leadership: Leadership,
        cluster_api_version: &str,
    ) -> Reconciler {
        Reconciler {
            client,
            recorder,
            leadership,
            cluster_api_version: cluster_api_version.to_string(),
            published: HashMap::new(),
        }
    }

    /// Does `work`: releases, refusals of requests, allocations, then Events.
    pub async fn pass(&mut self, work: Work) -> Outcome {
        let mut out = Outcome::default();
        for (pool, why) in &work.unreadable {
            tracing::warn!(%pool, "IPAMPool cannot be read, nothing is allocated from or released into it: {why}");
        }
        for r in &work.releases {
            if !self.leading(&mut out) {
                return out;
            }
            match self.still_unasked(r).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::debug!(pool = %r.pool, namespace = %r.namespace, "not released: the index is behind the API; the watch will tell");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(pool = %r.pool, namespace = %r.namespace, "cannot check before releasing: {e}; the fleet pass stops and is retried");
                    out.retry = true;
                    return out;
                }
            }
            match release(&self.client, &r.pool, &r.namespace).await {
                Ok(released) => {
                    out.released += 1;
                    let held = released.map(|s| describe(&s)).unwrap_or_default();
                    tracing::info!(pool = %r.pool, namespace = %r.namespace, "released {held}: {}", r.why);
                }
                Err(e) => {
                    if failing(&mut out, &e, &r.pool, &r.namespace) {
                        return out;
                    }
                }
            }
        }
        for r in &work.refusals {
            if !self.leading(&mut out) {
                return out;
            }
            let objects: Api<IPAMAllocation> = Api::namespaced(self.client.clone(), &r.namespace);
            let status = json!({"status": {"state": "Refused", "message": r.message}});
            match objects
                .patch_status(&r.pool, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                Ok(_) => {
                    out.refused += 1;
                    tracing::info!(pool = %r.pool, namespace = %r.namespace, "request refused: {}", r.message);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    tracing::warn!(pool = %r.pool, namespace = %r.namespace, "cannot write the refusal into the IPAMAllocation's status: {e}");
                    out.retry = true;
                    return out;
                }
            }
        }
        for a in &work.allocations {
            if !self.leading(&mut out) {
                return out;
            }
            if self.allocate(a, &mut out).await {
                return out;
            }
        }
        for n in &work.notices {
            self.publish(n, "").await;
        }
        // A notice that no longer holds (the label is back) is told again if it comes back;
        // refusals are told once per reason, and the memory of them stays bounded.
        let current: HashSet<(&str, &str, &str)> = work
            .notices
            .iter()
            .map(|n| {
                (
                    n.cluster.namespace.as_str(),
                    n.cluster.name.as_str(),
                    n.reason,
                )
            })
            .collect();
        self.published.retain(|(ns, name, reason, _), _| {
            *reason == REFUSED || current.contains(&(ns.as_str(), name.as_str(), *reason))
        });
        if self.published.len() > MAX_REMEMBERED {
            self.published.clear();
        }
        out
    }

    /// A full `crate::fleet::sync` of every pool in `clusters` (the periodic resync: it also
    /// writes again what the index may not show, like a ConfigMap key edited away).
    pub async fn sync_all(&mut self, clusters: &BTreeMap<String, Vec<FleetCluster>>) -> Outcome {
        let mut out = Outcome::default();
        for (pool, asking) in clusters {
            if !self.leading(&mut out) {
                return out;
            }
            match sync(&self.client, pool, asking).await {
                Ok(report) => {
                    out.released += report.released.len();
                    for (ns, outcome) in report.allocated {
                        match outcome {
                            Ok(_) => out.allocated += 1,
                            Err(e) => {
                                tracing::debug!(%pool, namespace = %ns, "{e}");
                                out.refused += 1;
                            }
                        }
                    }
                    tracing::debug!(%pool, clusters = asking.len(), "synced");
                }
                Err(e) => {
                    if failing(&mut out, &e, pool, "") {
                        return out;
                    }
                }
            }
        }
        out
    }

    /// Whether what made `r` a release is still so when read fresh: no Cluster in the
    /// namespace, no request, no pool, as the index said.
    async fn still_unasked(&self, r: &Release) -> Result<bool, kube::Error> {
        let ns = &r.namespace;
        if r.recheck.cluster {
            let gvk =
                GroupVersionKind::gvk("cluster.x-k8s.io", &self.cluster_api_version, "Cluster");
            let resource = ApiResource::from_gvk_with_plural(&gvk, "clusters");
            let clusters: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), ns, &resource);
            match clusters
                .list_metadata(&ListParams::default().limit(1))
                .await
            {
                Ok(list) if !list.items.is_empty() => return Ok(false),
                Ok(_) => {}
                // No longer served: no Cluster there either.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        if r.recheck.request {
            let objects: Api<IPAMAllocation> = Api::namespaced(self.client.clone(), ns);
            if let Some(o) = objects.get_opt(&r.pool).await? {
                let labelled = o
                    .metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(CLUSTER_NAME_LABEL));
                if !labelled && o.metadata.deletion_timestamp.is_none() {
                    return Ok(false);
                }
            }
        }
        if r.recheck.pool {
            let pools: Api<IPAMPool> = Api::all(self.client.clone());
            if pools.get_opt(&r.pool).await?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn leading(&self, out: &mut Outcome) -> bool {
        let leading = self.leadership.is_leading();
        if !leading {
            tracing::info!("no longer leading: the fleet pass stops");
            out.stopped = true;
        }
        leading
    }

    /// One allocation; `true` when the pass must stop.
    async fn allocate(&mut self, a: &Allocate, out: &mut Outcome) -> bool {
        let ns = &a.cluster.namespace;
        let objects: Api<IPAMAllocation> = Api::namespaced(self.client.clone(), ns);
        if let (true, Some(owner)) = (a.create_request, &a.owner) {
            let mut request = IPAMAllocation::new(
                &a.pool,
                IPAMAllocationSpec {
                    dc: a.cluster.datacenter.clone(),
                    ..IPAMAllocationSpec::default()
                },
            );
            request.metadata.namespace = Some(ns.clone());
            request.metadata.labels = Some(BTreeMap::from([(
                CLUSTER_NAME_LABEL.to_string(),
                owner.name.clone(),
            )]));
            match objects.create(&PostParams::default(), &request).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(pool = %a.pool, namespace = %ns, "cannot create the IPAMAllocation for Cluster {}: {e}", owner.name);
                    out.retry = true;
                    return true;
                }
            }
        }
        match allocate(&self.client, &a.pool, &a.cluster).await {
            Ok(written) => {
                out.allocated += 1;
                tracing::info!(pool = %a.pool, namespace = %ns, dc = %a.cluster.datacenter, "allocated {}", describe(&written.spec));
                if let Some(owner) = &a.owner {
                    let labelled = written
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(CLUSTER_NAME_LABEL));
                    if labelled != Some(&owner.name) {
                        let patch = cluster_label(&owner.name);
                        if let Err(e) = objects
                            .patch(&a.pool, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                        {
                            tracing::warn!(pool = %a.pool, namespace = %ns, "cannot label the IPAMAllocation for Cluster {}: {e}", owner.name);
                            out.retry = true;
                        }
                    }
                }
                false
            }
            Err(FleetApiError::Refused(refusal)) => {
                out.refused += 1;
                let note = refusal.to_string();
                tracing::info!(pool = %a.pool, namespace = %ns, "refused: {note}");
                if let Some(owner) = &a.owner {
                    let notice = Notice {
                        cluster: owner.clone(),
                        reason: REFUSED,
                        message: note,
                    };
                    self.publish(&notice, &a.pool).await;
                }
                false
            }
            Err(e) => failing(out, &e, &a.pool, ns),
        }
    }

    /// A Warning Event on the Cluster, unless the same was told already.
    async fn publish(&mut self, n: &Notice, pool: &str) {
        let key = (
            n.cluster.namespace.clone(),
            n.cluster.name.clone(),
            n.reason,
            pool.to_string(),
        );
        if self.published.get(&key) == Some(&n.message) {
            return;
        }
        if !self.leadership.is_leading() {
            return;
        }
        tracing::info!(namespace = %n.cluster.namespace, cluster = %n.cluster.name, reason = n.reason, "{}", n.message);
        let event = Event {
            type_: EventType::Warning,
            reason: n.reason.into(),
            note: Some(allot_k8s::event_note(&n.message)),
            action: "AllocateFleetRange".into(),
            secondary: None,
        };
        match self
            .recorder
            .publish(&event, &self.cluster_reference(&n.cluster))
            .await
        {
            Ok(()) => {
                self.published.insert(key, n.message.clone());
            }
            Err(e) => {
                tracing::warn!(namespace = %n.cluster.namespace, cluster = %n.cluster.name, "cannot record an Event: {e}")
            }
        }
    }

    pub(crate) fn cluster_reference(&self, c: &ClusterRef) -> ObjectReference {
        cluster_reference(&self.cluster_api_version, c)
    }
}

/// An Event's reference to a Cluster API `Cluster`.
pub(crate) fn cluster_reference(api_version: &str, c: &ClusterRef) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("cluster.x-k8s.io/{api_version}")),
        kind: Some("Cluster".into()),
        namespace: Some(c.namespace.clone()),
        name: Some(c.name.clone()),
        uid: (!c.uid.is_empty()).then(|| c.uid.clone()),
        ..ObjectReference::default()
    }
}

/// Logs an error of [`super::api`]; `true` when the API itself is failing and the pass must
/// stop (the next one, with backoff, resumes).
fn failing(out: &mut Outcome, e: &FleetApiError, pool: &str, namespace: &str) -> bool {
    out.retry = true;
    match e {
        FleetApiError::Refused(r) => {
            tracing::info!(%pool, %namespace, "refused: {r}");
            out.retry = false;
            false
        }
        FleetApiError::Contention { .. } => {
            tracing::warn!(%pool, %namespace, "{e}");
            false
        }
        FleetApiError::Api { .. } => {
            tracing::warn!(%pool, %namespace, "{e}; the fleet pass stops and is retried");
            true
        }
    }
}

/// An allocation for the log: its CIDR or runs.
fn describe(spec: &IPAMAllocationSpec) -> String {
    match &spec.cidr {
        Some(cidr) => cidr.clone(),
        None => spec.addresses.join(","),
    }
}
