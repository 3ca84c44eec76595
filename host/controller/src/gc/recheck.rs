//! The last look before a release: the pod (and its StatefulSet or virtual machine) read fresh
//! from the API, and the Events that tell people what GC released.

use std::collections::BTreeMap;

use allot_core::gc::{GcConfig, LeakReason, NotBefore, Verdict, decide};
use allot_core::store::Claim;
use allot_index::{ClusterIndex, PodEntry, Shared, cluster::statefulset_replicas};
use allot_k8s::Endpoint;
use allot_k8s::openapi::api::apps::v1::StatefulSet;
use allot_k8s::openapi::api::core::v1::{ObjectReference, Pod};
use futures::StreamExt;
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Preconditions};
use kube::runtime::events::{Event, EventType};

use crate::events::Events;

use super::Leak;

/// Fresh reads run at once, at most this many.
const PARALLEL_READS: usize = 16;

/// Reads the API directly (not the index) for the re-check, and records Events.
pub struct ApiReader {
    client: kube::Client,
    events: Events,
}

/// What a fresh read can answer: the pod and the StatefulSet, or an API error (then nothing
/// is decided: the leak stays suspect until a read succeeds).
pub trait FreshReader: Send + Sync {
    fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> futures::future::BoxFuture<'_, Result<Option<PodEntry>, kube::Error>>;
    fn statefulset_replicas(
        &self,
        namespace: &str,
        name: &str,
    ) -> futures::future::BoxFuture<'_, Result<Option<u32>, kube::Error>>;
    /// Whether a VirtualMachine or a VirtualMachineInstance `namespace/name` exists (KubeVirt
    /// not installed: no).
    fn virtual_machine_exists(
        &self,
        namespace: &str,
        name: &str,
    ) -> futures::future::BoxFuture<'_, Result<bool, kube::Error>>;
    fn record_releases<'a>(
        &'a self,
        released: &'a [(Claim, LeakReason)],
    ) -> futures::future::BoxFuture<'a, ()>;
    fn delete_outdated_endpoint<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        pod_uid: &'a str,
    ) -> futures::future::BoxFuture<'a, bool>;
}

impl ApiReader {
    pub fn new(client: kube::Client, instance: &str) -> ApiReader {
        let events = Events::new(client.clone(), instance);
        ApiReader { client, events }
    }

    async fn publish(&self, reference: ObjectReference, reason: &str, note: String) {
        let event = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note),
            action: "ReleaseLeakedAddress".into(),
            secondary: None,
        };
        if let Err(e) = self.events.publish(&event, &reference).await {
            tracing::warn!("cannot record an Event: {e}");
        }
    }
}

impl FreshReader for ApiReader {
    fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> futures::future::BoxFuture<'_, Result<Option<PodEntry>, kube::Error>> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let name = name.to_string();
        Box::pin(async move { Ok(api.get_opt(&name).await?.as_ref().map(PodEntry::of)) })
    }

    fn statefulset_replicas(
        &self,
        namespace: &str,
        name: &str,
    ) -> futures::future::BoxFuture<'_, Result<Option<u32>, kube::Error>> {
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), namespace);
        let name = name.to_string();
        Box::pin(async move { Ok(api.get_opt(&name).await?.as_ref().map(statefulset_replicas)) })
    }

    fn virtual_machine_exists(
        &self,
        namespace: &str,
        name: &str,
    ) -> futures::future::BoxFuture<'_, Result<bool, kube::Error>> {
        let (client, namespace, name) =
            (self.client.clone(), namespace.to_string(), name.to_string());
        Box::pin(async move {
            for kind in ["VirtualMachine", "VirtualMachineInstance"] {
                let gvk = GroupVersionKind::gvk("kubevirt.io", "v1", kind);
                let resource = ApiResource::from_gvk(&gvk);
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &namespace, &resource);
                // A 404 also answers a server that does not serve the kind: KubeVirt's CRDs
                // removed took their objects with them.
                if api.get_metadata_opt(&name).await?.is_some() {
                    return Ok(true);
                }
            }
            Ok(false)
        })
    }

    /// An Event on each pod that still exists (finished, terminating, replaced), and one per
    /// pool summing up the addresses of pods that are gone.
    fn record_releases<'a>(
        &'a self,
        released: &'a [(Claim, LeakReason)],
    ) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            let mut per_pool: BTreeMap<&str, BTreeMap<LeakReason, usize>> = BTreeMap::new();
            for (claim, reason) in released {
                let pod_lives = matches!(
                    reason,
                    LeakReason::Finished
                        | LeakReason::TerminatingOnReadyNode
                        | LeakReason::TerminatingOnNotReadyNode
                        | LeakReason::RunningWithoutPodIps
                );
                if pod_lives {
                    let reference = ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        namespace: Some(claim.pod.namespace.clone()),
                        name: Some(claim.pod.name.clone()),
                        uid: Some(claim.pod.uid.clone()).filter(|u| !u.is_empty()),
                        ..ObjectReference::default()
                    };
                    let note = format!(
                        "released {} (pool {}): {}",
                        claim.address,
                        claim.pool,
                        reason.describe()
                    );
                    self.publish(reference, "AddressReleased", note).await;
                } else {
                    *per_pool
                        .entry(claim.pool.as_str())
                        .or_default()
                        .entry(*reason)
                        .or_default() += 1;
                }
            }
            for (pool, reasons) in per_pool {
                let total: usize = reasons.values().sum();
                let why: Vec<String> = reasons
                    .iter()
                    .map(|(r, n)| format!("{n} {}", r.as_str()))
                    .collect();
                let reference = ObjectReference {
                    api_version: Some(format!("{}/{}", allot_k8s::GROUP, allot_k8s::VERSION)),
                    kind: Some("IPPool".into()),
                    name: Some(pool.to_string()),
                    ..ObjectReference::default()
                };
                let note = format!(
                    "released {total} leaked address(es) of pods that are gone: {}",
                    why.join(", ")
                );
                self.publish(reference, "LeakedAddressesReleased", note)
                    .await;
            }
        })
    }

    /// Deletes the Endpoint `namespace/name` if it is still the one written for `pod_uid` and
    /// no pod with that UID exists (read fresh), with preconditions on what was read.
    fn delete_outdated_endpoint<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        pod_uid: &'a str,
    ) -> futures::future::BoxFuture<'a, bool> {
        Box::pin(async move {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
            match pods.get_opt(name).await {
                Ok(Some(p)) if p.metadata.uid.as_deref() == Some(pod_uid) => return false,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("cannot read pod {namespace}/{name}: {e}");
                    return false;
                }
            }
            let endpoints: Api<Endpoint> = Api::namespaced(self.client.clone(), namespace);
            let endpoint = match endpoints.get_opt(name).await {
                Ok(Some(e)) if e.spec.uid == pod_uid => e,
                Ok(_) => return false,
                Err(e) => {
                    tracing::warn!("cannot read Endpoint {namespace}/{name}: {e}");
                    return false;
                }
            };
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: endpoint.metadata.uid.clone(),
                    resource_version: endpoint.metadata.resource_version.clone(),
                }),
                ..DeleteParams::default()
            };
            match endpoints.delete(name, &params).await {
                Ok(_) => {
                    tracing::info!(
                        endpoint = %format!("{namespace}/{name}"),
                        "deleted an outdated Endpoint: its pod is gone and it holds no address"
                    );
                    true
                }
                Err(e) => {
                    tracing::warn!("cannot delete Endpoint {namespace}/{name}: {e}");
                    false
                }
            }
        })
    }
}

/// Due leaks after the fresh reads.
pub(super) struct Confirmed {
    /// Still leaked (with the reason the fresh read gives).
    pub leaks: Vec<Leak>,
    /// In use after all.
    pub kept: Vec<Claim>,
}

/// Reads each due leak's pod (and StatefulSet) fresh and decides again. A pod that cannot be
/// read decides nothing, and neither does a leak whose fresh release time is still ahead (the
/// pod turned out to be terminating, not gone): those are neither released nor forgotten.
pub(super) async fn confirm(
    reader: &dyn FreshReader,
    index: &Shared<ClusterIndex>,
    table: &GcConfig,
    due: Vec<Claim>,
    now: u64,
) -> Confirmed {
    let mut by_pod: BTreeMap<(String, String), Vec<Claim>> = BTreeMap::new();
    for c in due {
        by_pod
            .entry((c.pod.namespace.clone(), c.pod.name.clone()))
            .or_default()
            .push(c);
    }
    let reads = futures::stream::iter(by_pod)
        .map(|((ns, name), claims)| async move {
            let pod = reader.pod(&ns, &name).await;
            let owner = claims
                .iter()
                .find(|c| c.pod.is_stateful())
                .and_then(|c| c.pod.owner_name.clone());
            let replicas = match owner {
                Some(owner) => Some(reader.statefulset_replicas(&ns, &owner).await),
                None => None,
            };
            let vm = claims.iter().find_map(|c| c.pod.virtual_machine());
            let vm_exists = match vm {
                Some(vm) => Some(reader.virtual_machine_exists(&ns, vm).await),
                None => None,
            };
            (ns, name, claims, pod, replicas, vm_exists)
        })
        .buffer_unordered(PARALLEL_READS)
        .collect::<Vec<_>>()
        .await;
    let mut confirmed = Confirmed {
        leaks: Vec::new(),
        kept: Vec::new(),
    };
    let index = index.read();
    for (ns, name, claims, pod, replicas, vm_exists) in reads {
        let pod = match pod {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("cannot re-read pod {ns}/{name} before releasing: {e}");
                continue;
            }
        };
        let replicas = match replicas.transpose() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("cannot re-read the StatefulSet of {ns}/{name}: {e}");
                continue;
            }
        };
        let vm_exists = match vm_exists.transpose() {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!("cannot re-read the virtual machine of {ns}/{name}: {e}");
                continue;
            }
        };
        let state = pod.as_ref().map(|p| index.state_of(p));
        for claim in claims {
            let owner = allot_index::cluster::owner_state(
                &claim,
                |_, _| replicas.flatten(),
                |_, _| vm_exists,
            );
            match decide(&claim, state.as_ref(), owner, table) {
                Verdict::Leak {
                    not_before: NotBefore::At(t),
                    ..
                } if t > now => {}
                Verdict::Leak { reason, not_before } => confirmed.leaks.push(Leak {
                    claim,
                    reason,
                    not_before,
                }),
                Verdict::Keep(why) => {
                    tracing::info!(
                        address = %claim.address,
                        pod = %format!("{ns}/{name}"),
                        "kept: the fresh read shows it in use ({why:?})"
                    );
                    confirmed.kept.push(claim);
                }
            }
        }
    }
    confirmed
}
