//! The online audit (core's `allot_core::audit`) against the controller's watch-fed index, or
//! against one fresh list of the cluster for `allotctl ipam check`: the same inputs, the same
//! function, so the controller's drift metrics count exactly what the command lists.
//!
//! While it leads, the controller audits every `--audit-interval-seconds`: the counts go to
//! `allot_ipam_drift{kind}`, and a finding seen at two audits in a row (not a change in flight)
//! is told once in a Warning Event `IPAMDrift` on the object it is about (the pod, or the
//! IPPool of a count), naming the objects involved. It changes nothing: repairs are the
//! operator's (`allotctl ipam release --from-report`), GC's and the pool status writer's.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use allot_core::audit::{self, EndpointUse, Finding, Inputs, PodUse, PoolCounts, Report};
use allot_core::config::{Object, ObjectKind};
use allot_core::gc::{GcConfig, PodPhase, decide};
use allot_core::store::{Claim, Store};
use allot_index::{
    ClusterIndex, EndpointObject, IndexResource, PodEntry, PoolObject, ReservedObject, Shared,
    SubnetObject,
};
use allot_k8s::openapi::api::core::v1::ObjectReference;
use allot_k8s::{Endpoint, IPPool};
use anyhow::Context as _;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::events::{Event, EventType};

use crate::events::Events;
use crate::gc::report::{fresh_workload_index, list_all};
use crate::lease::Leadership;
use crate::metrics::Metrics;

/// Whether a pod holds the addresses it reports: not finished, not on the host network (whose
/// address is its node's).
fn holds(p: &PodEntry) -> bool {
    !p.host_network && !matches!(p.phase, PodPhase::Succeeded | PodPhase::Failed)
}

/// The audit of what `index` shows against `claims`, leaks decided by `table` (GC's table).
pub fn check(index: &ClusterIndex, claims: &[Claim], table: &GcConfig) -> Report {
    let pods: Vec<PodUse> = index
        .pods()
        .filter(|(_, _, p)| holds(p))
        .map(|(namespace, name, p)| PodUse {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: p.uid.clone(),
            addresses: p.addresses.clone(),
            virtual_machine: p.virtual_machine.clone(),
        })
        .collect();
    let endpoints: Vec<EndpointUse> = index
        .endpoint_entries()
        .map(|(namespace, name, e)| EndpointUse {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid: e.uid.clone(),
            addresses: e.addresses.clone(),
        })
        .collect();
    let pools: Vec<PoolCounts> = index
        .allot_objects()
        .filter(|e| e.observed.kind == ObjectKind::IpPool)
        .filter_map(|e| match &e.observed.object {
            Ok(Object::Pool(p)) => Some(PoolCounts {
                name: p.name().to_string(),
                listed: p.ips.clone(),
                total: p.allocatable().len(),
                status_allocated: e.status.0,
                status_total: e.status.1,
            }),
            _ => None,
        })
        .collect();
    let verdict = |c: &Claim| {
        let pod = index.pod_state(&c.pod.namespace, &c.pod.name);
        decide(c, pod.as_ref(), index.owner_state(c), table)
    };
    audit::check(&Inputs {
        claims,
        pods: &pods,
        endpoints: &endpoints,
        pools: &pools,
        verdict: &verdict,
    })
}

/// The index of one fresh list of everything the audit reads (pods, nodes, StatefulSets, allot
/// Endpoints and IPPools), for `allotctl ipam check`.
pub async fn fresh_index(client: &kube::Client) -> anyhow::Result<ClusterIndex> {
    let mut index = fresh_workload_index(client).await?;
    let endpoints: Vec<Endpoint> =
        list_all(Api::all(client.clone()), "endpoints.allot.dev").await?;
    IndexResource::<EndpointObject>::reset(
        &mut index,
        endpoints.into_iter().map(EndpointObject).collect(),
    );
    let pools: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::erase::<IPPool>(&()));
    let pools = list_all(pools, "ippools.allot.dev").await?;
    IndexResource::<PoolObject>::reset(&mut index, pools.into_iter().map(PoolObject).collect());
    IndexResource::<SubnetObject>::reset(&mut index, Vec::new());
    IndexResource::<ReservedObject>::reset(&mut index, Vec::new());
    Ok(index)
}

/// One audit now, from fresh lists and the store's claims.
pub async fn check_now(
    client: &kube::Client,
    store: Arc<dyn Store>,
    table: &GcConfig,
) -> anyhow::Result<Report> {
    let index = fresh_index(client).await?;
    let claims = tokio::task::spawn_blocking(move || store.all())
        .await?
        .context("cannot read the claims")?;
    Ok(check(&index, &claims, table))
}

/// The controller's periodic audit.
pub struct Auditor {
    pub store: Arc<dyn Store>,
    pub index: Arc<Shared<ClusterIndex>>,
    pub table: GcConfig,
    pub interval: Duration,
    pub leadership: Leadership,
    pub metrics: Arc<Metrics>,
    pub events: Events,
}

impl Auditor {
    /// Audits every interval while this replica leads and the index is listed, until
    /// `shutdown`.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        // Findings seen at the last audit, and those already told in an Event.
        let mut last: Vec<Finding> = Vec::new();
        let mut told: Vec<Finding> = Vec::new();
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            let ready = {
                let i = self.index.read();
                i.ready_for_gc() && i.ready_for_pools()
            };
            if !self.leadership.is_leading() || !ready {
                last.clear();
                continue;
            }
            let store = self.store.clone();
            let claims = match tokio::task::spawn_blocking(move || store.all()).await {
                Ok(Ok(claims)) => claims,
                Ok(Err(e)) => {
                    tracing::warn!("audit: cannot read the claims: {e}");
                    continue;
                }
                Err(e) => {
                    tracing::warn!("audit: {e}");
                    continue;
                }
            };
            let report = check(&self.index.read(), &claims, &self.table);
            self.metrics.audited(&report);
            let persisting: Vec<Finding> = report
                .findings
                .iter()
                .filter(|f| last.contains(f) && !told.contains(f))
                .cloned()
                .collect();
            for f in &persisting {
                self.tell(f).await;
            }
            told.retain(|f| report.findings.contains(f));
            told.extend(persisting);
            if !report.is_clean() {
                tracing::warn!(
                    findings = report.findings.len(),
                    "audit: drift found; `allotctl ipam check` lists it"
                );
            }
            last = report.findings;
        }
    }

    /// A Warning Event on the object the finding is about.
    async fn tell(&self, finding: &Finding) {
        let event = Event {
            type_: EventType::Warning,
            reason: "IPAMDrift".into(),
            note: Some(allot_k8s::event_note(&format!(
                "{}: {finding}; `allotctl --store kubernetes ipam check` lists every finding",
                finding.kind()
            ))),
            action: "Audit".into(),
            secondary: None,
        };
        let reference = regarding(finding);
        if let Err(e) = self.events.publish(&event, &reference).await {
            tracing::warn!("audit: cannot record an Event: {e}");
        }
    }
}

/// The object a finding is about: its pod (the claim's holder, the pod using an address, the
/// first holder, the Endpoint's pod), or its IPPool.
fn regarding(finding: &Finding) -> ObjectReference {
    let pod = |namespace: &str, name: &str, uid: &str| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()).filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    };
    match finding {
        Finding::LeakedClaim { claim, .. } | Finding::StatusDisagrees { claim, .. } => {
            pod(&claim.pod.namespace, &claim.pod.name, &claim.pod.uid)
        }
        Finding::UnclaimedAddress { pod: p, .. }
        | Finding::EndpointWithoutClaim { endpoint: p, .. } => pod(&p.namespace, &p.name, &p.uid),
        Finding::ClaimedTwice { holders, .. } => {
            let first: BTreeSet<_> = holders.iter().map(|h| &h.pod).collect();
            let p = first.into_iter().next().expect("two holders");
            pod(&p.namespace, &p.name, &p.uid)
        }
        Finding::PoolCount { pool, .. } => ObjectReference {
            api_version: Some(format!("{}/{}", allot_k8s::GROUP, allot_k8s::VERSION)),
            kind: Some("IPPool".into()),
            name: Some(pool.clone()),
            ..ObjectReference::default()
        },
    }
}
