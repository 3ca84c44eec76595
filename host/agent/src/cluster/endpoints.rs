//! The pod's `Endpoint`: which addresses it holds on which interface, from which pools, with
//! its owner. Written after the ADD answered (the runtime does not wait for it), retried with
//! a fresh read on a compare-and-swap conflict, and owned by the pod (so Kubernetes deletes it
//! with the pod) except for StatefulSet pods, whose addresses outlive the pod object.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use allot_engine::AddOutcome;
use allot_index::PodRequest;
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use allot_k8s::{Endpoint, EndpointInterface, EndpointSpec, OwnerRef};
use kube::api::{Api, DeleteParams, PostParams};

const ATTEMPTS: u32 = 5;

/// Writes Endpoints on the agent's runtime, in the background.
#[derive(Clone)]
pub struct EndpointWriter {
    client: kube::Client,
    node: String,
    runtime: tokio::runtime::Handle,
    order: Arc<Sequencer>,
}

/// Keeps one pod's background writes in the order they were asked for: the ADD's write and
/// the quarantine's replacement (or a DEL and the next ADD) run one at a time, and a write
/// that finds a later one already done is dropped, so the Endpoint never ends on stale
/// addresses.
#[derive(Default)]
struct Sequencer {
    next: AtomicU64,
    pods: Mutex<HashMap<(String, String), LastDone>>,
}

/// The sequence number of a pod's last write done.
type LastDone = Arc<tokio::sync::Mutex<u64>>;

/// A place in one pod's order of writes.
struct Ticket {
    seq: u64,
    key: (String, String),
    last_done: LastDone,
}

impl Sequencer {
    fn ticket(&self, namespace: &str, name: &str) -> Ticket {
        let seq = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let key = (namespace.to_string(), name.to_string());
        let last_done = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        Ticket {
            seq,
            key,
            last_done,
        }
    }

    /// Runs `write` unless a later write of the pod is already done.
    async fn run<F: std::future::Future<Output = ()>>(&self, ticket: Ticket, write: F) {
        {
            let mut last_done = ticket.last_done.lock().await;
            if *last_done < ticket.seq {
                write.await;
                *last_done = ticket.seq;
            }
        }
        // Forget the pod once nobody holds a ticket for it (the map stays as small as the
        // writes in flight).
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&ticket.last_done) == 2 {
            pods.remove(&ticket.key);
        }
    }
}

impl EndpointWriter {
    pub fn new(client: kube::Client, node: &str, runtime: tokio::runtime::Handle) -> Self {
        EndpointWriter {
            client,
            node: node.to_string(),
            runtime,
            order: Arc::default(),
        }
    }

    /// Records what `interface` of the pod got (after a successful ADD).
    pub fn added(&self, request: &PodRequest, interface: &str, outcome: &AddOutcome) {
        let entry = interface_entry(interface, outcome);
        let pod = request.pod.clone();
        let node = self.node.clone();
        let api = Api::<Endpoint>::namespaced(self.client.clone(), &pod.namespace);
        let order = self.order.clone();
        let ticket = order.ticket(&pod.namespace, &pod.name);
        self.runtime.spawn(async move {
            let what = format!("Endpoint {}/{}", pod.namespace, pod.name);
            let write = async {
                let result = update(&api, &pod.name, |current| {
                    Some(with_interface(current, &pod, &node, &entry))
                })
                .await;
                if let Err(e) = result {
                    tracing::warn!("cannot write {what}: {e}");
                }
            };
            order.run(ticket, write).await;
        });
    }

    /// Removes `interface` from the pod's Endpoint after its addresses were released (a DEL);
    /// the Endpoint goes when no interface is left. Addresses kept for a StatefulSet pod stay
    /// recorded.
    pub fn released(&self, namespace: &str, name: &str, uid: &str, interface: &str) {
        let api = Api::<Endpoint>::namespaced(self.client.clone(), namespace);
        let (name, uid, interface) = (name.to_string(), uid.to_string(), interface.to_string());
        let what = format!("Endpoint {namespace}/{name}");
        let order = self.order.clone();
        let ticket = order.ticket(namespace, &name);
        self.runtime.spawn(async move {
            let write = async {
                let result = update(&api, &name, |current| {
                    let mut ep = current?;
                    if ep.spec.uid != uid {
                        // A later pod of this name owns it now.
                        return None;
                    }
                    ep.spec.interfaces.retain(|i| i.ifname != interface);
                    Some(ep)
                })
                .await;
                if let Err(e) = result {
                    tracing::warn!("cannot update {what}: {e}");
                }
            };
            order.run(ticket, write).await;
        });
    }
}

/// The Endpoint `current` becomes once `entry` (one interface) is recorded for `pod`.
fn with_interface(
    current: Option<Endpoint>,
    pod: &allot_core::policy::PodInfo,
    node: &str,
    entry: &EndpointInterface,
) -> Endpoint {
    let mut ep = match current {
        // The same pod: replace this interface's entry, keep the others.
        Some(ep) if ep.spec.uid == pod.uid => ep,
        // A previous pod of this name (a StatefulSet's): its addresses start over, and what
        // others put in the metadata (labels, annotations, finalizers, other owners) stays: a
        // replace without them would drop them.
        Some(previous) => Endpoint {
            metadata: previous.metadata,
            ..Endpoint::new(&pod.name, EndpointSpec::default())
        },
        None => Endpoint::new(&pod.name, EndpointSpec::default()),
    };
    ep.spec.uid = pod.uid.clone();
    ep.spec.node = node.to_string();
    ep.spec.owner = pod.owner.as_ref().map(|o| OwnerRef {
        kind: o.kind.clone(),
        name: o.name.clone(),
    });
    // The pod is this Endpoint's owner (this pod, not a previous one of its name); owners others
    // added stay.
    let mut owners: Vec<OwnerReference> = ep
        .metadata
        .owner_references
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|o| !(o.api_version == "v1" && o.kind == "Pod"))
        .collect();
    owners.extend(owned_by_pod(pod).into_iter().flatten());
    ep.metadata.owner_references = (!owners.is_empty()).then_some(owners);
    ep.spec.interfaces.retain(|i| i.ifname != entry.ifname);
    ep.spec.interfaces.push(entry.clone());
    ep.spec.interfaces.sort_by(|a, b| a.ifname.cmp(&b.ifname));
    ep
}

fn interface_entry(interface: &str, outcome: &AddOutcome) -> EndpointInterface {
    let mut entry = EndpointInterface {
        ifname: interface.to_string(),
        ..Default::default()
    };
    for a in &outcome.allocations {
        if a.address.is_ipv4() {
            entry.ipv4 = Some(a.cidr());
        } else {
            entry.ipv6 = Some(a.cidr());
        }
        if !entry.pools.contains(&a.pool) {
            entry.pools.push(a.pool.clone());
        }
        if let Some(gw) = a.gateway {
            entry.gateways.push(gw.to_string());
        }
    }
    entry.routes = outcome
        .routes
        .iter()
        .map(|r| allot_core::spec::RouteSpec {
            dst: r.dst.to_string(),
            gw: r.gw.to_string(),
        })
        .collect();
    entry
}

/// The pod as the Endpoint's owner, so it is deleted with the pod; none for a StatefulSet
/// pod, whose addresses (and their record) outlive one pod object.
fn owned_by_pod(pod: &allot_core::policy::PodInfo) -> Option<Vec<OwnerReference>> {
    if pod.owner.as_ref().is_some_and(|o| o.kind == "StatefulSet") || pod.uid.is_empty() {
        return None;
    }
    Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        ..Default::default()
    }])
}

/// Read, change, write with the read's resourceVersion; on a conflict read again. `change`
/// returns the new object (`None`: leave it; an object without interfaces is deleted).
async fn update(
    api: &Api<Endpoint>,
    name: &str,
    change: impl Fn(Option<Endpoint>) -> Option<Endpoint>,
) -> Result<(), String> {
    let mut backoff = Duration::from_millis(50);
    for attempt in 1..=ATTEMPTS {
        let current = api.get_opt(name).await.map_err(|e| e.to_string())?;
        let existed = current.is_some();
        let Some(next) = change(current) else {
            return Ok(());
        };
        let written = if next.spec.interfaces.is_empty() {
            let precondition = kube::api::Preconditions {
                resource_version: next.metadata.resource_version.clone(),
                uid: None,
            };
            let dp = DeleteParams {
                preconditions: Some(precondition),
                ..Default::default()
            };
            api.delete(name, &dp).await.map(|_| ())
        } else if existed {
            api.replace(name, &PostParams::default(), &next)
                .await
                .map(|_| ())
        } else {
            let mut fresh = next;
            fresh.metadata.resource_version = None;
            api.create(&PostParams::default(), &fresh).await.map(|_| ())
        };
        match written {
            Ok(()) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < ATTEMPTS => {
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!("still conflicting after {ATTEMPTS} attempts"))
}

#[cfg(test)]
#[path = "endpoints_tests.rs"]
mod tests;
