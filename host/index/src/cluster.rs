//! What the controller knows of the whole cluster, fed by watches: every pod (what the GC
//! decision reads of it), every node's readiness, StatefulSets' replica counts, allot's
//! `Endpoint`s, and the IPPools, Subnets and ReservedIPs with the metadata their lifecycle
//! needs (finalizers, deletion, status as written).
//!
//! Like the agent's [`Index`](crate::Index) it is a plain struct of maps behind
//! [`Shared`](crate::Shared), fed through [`feed`](crate::feed) and tested by feeding objects.
//! Pod events that may mean a leak (a pod deleted, terminating, finished, replaced by another
//! of its name) are remembered in [`ClusterIndex::take_pending`] for the garbage collector to
//! look at soon, instead of waiting for its next full scan.

mod resources;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use allot_core::config::{ObjectKind, Observed};
use allot_core::gc::{OwnerState, PodPhase, PodState};
use allot_core::migrate::PodAddress;
use allot_core::store::Claim;

pub use resources::{
    EndpointObject, VirtualMachineInstanceObject, VirtualMachineObject, statefulset_replicas,
};

/// The kinds the controller's index follows; each is "synced" once its first list is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClusterKind {
    Pod,
    Node,
    StatefulSet,
    Endpoint,
    IpPool,
    Subnet,
    ReservedIp,
    VirtualMachine,
    VirtualMachineInstance,
}

impl ClusterKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            ClusterKind::Pod => "Pod",
            ClusterKind::Node => "Node",
            ClusterKind::StatefulSet => "StatefulSet",
            ClusterKind::Endpoint => "Endpoint",
            ClusterKind::IpPool => "IPPool",
            ClusterKind::Subnet => "Subnet",
            ClusterKind::ReservedIp => "ReservedIP",
            ClusterKind::VirtualMachine => "VirtualMachine",
            ClusterKind::VirtualMachineInstance => "VirtualMachineInstance",
        }
    }
}

/// What the index keeps of one pod: what the GC decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEntry {
    pub uid: String,
    pub node: String,
    pub phase: PodPhase,
    pub deleting_at: Option<u64>,
    pub grace: u64,
    pub host_network: bool,
    pub has_pod_ips: bool,
    pub finished_at: Option<u64>,
    /// What it reports using: `status.podIPs` and the Multus network status (for the audit).
    pub addresses: Vec<PodAddress>,
    /// The KubeVirt virtual machine it is a launcher pod of (for the audit: a live migration's
    /// source and target both report the VM's address).
    pub virtual_machine: Option<String>,
}

/// What the index keeps of one allot Endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointEntry {
    /// The pod UID it was written for.
    pub uid: String,
    /// Each address it records, with its interface.
    pub addresses: Vec<(IpAddr, String)>,
}

/// An IPPool, Subnet or ReservedIP: core's check of its spec, and the metadata the controller
/// manages.
#[derive(Clone, Debug)]
pub struct AllotEntry {
    pub observed: Observed,
    pub uid: String,
    pub resource_version: String,
    pub finalizers: Vec<String>,
    pub deleting: bool,
    /// `status.allocatedIPCount` and `status.totalIPCount` as last written.
    pub status: (Option<u64>, Option<u64>),
}

type Key = (String, String);

/// Whether the API server serves KubeVirt's VirtualMachines and VirtualMachineInstances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KubeVirt {
    /// Not asked yet, or discovery failed: no virtual machine may be taken for gone.
    #[default]
    Unknown,
    /// Discovery says the kinds are not served: no virtual machine exists.
    Absent,
    /// Served, and followed (listed once both kinds are synced).
    Served,
}

fn key(namespace: &str, name: &str) -> Key {
    (namespace.to_string(), name.to_string())
}

/// The controller's view of the cluster. Fed by [`crate::feed`] (or by tests, object by object).
#[derive(Debug, Default)]
pub struct ClusterIndex {
    pub(crate) pods: HashMap<Key, PodEntry>,
    /// Node name → Ready.
    pub(crate) nodes: HashMap<String, bool>,
    pub(crate) statefulsets: HashMap<Key, u32>,
    /// allot Endpoints by (namespace, name).
    pub(crate) endpoints: HashMap<Key, EndpointEntry>,
    pub(crate) allot: BTreeMap<(ObjectKind, String), AllotEntry>,
    /// KubeVirt's VirtualMachines and VirtualMachineInstances by (namespace, name).
    pub(crate) virtual_machines: HashSet<Key>,
    pub(crate) virtual_machine_instances: HashSet<Key>,
    pub(crate) kubevirt: KubeVirt,
    pub(crate) synced: BTreeSet<ClusterKind>,
    pub(crate) pending: BTreeSet<Key>,
}

impl ClusterIndex {
    pub fn new() -> ClusterIndex {
        ClusterIndex::default()
    }

    pub fn is_synced(&self, kind: ClusterKind) -> bool {
        self.synced.contains(&kind)
    }

    /// Whether pods, nodes and StatefulSets are listed: before that, a pod missing from the
    /// index may just not be listed yet, and no decision may be taken on it.
    pub fn ready_for_gc(&self) -> bool {
        [
            ClusterKind::Pod,
            ClusterKind::Node,
            ClusterKind::StatefulSet,
        ]
        .iter()
        .all(|k| self.is_synced(*k))
    }

    /// IPPools, Subnets and ReservedIPs are listed.
    pub fn ready_for_pools(&self) -> bool {
        [
            ClusterKind::IpPool,
            ClusterKind::Subnet,
            ClusterKind::ReservedIp,
        ]
        .iter()
        .all(|k| self.is_synced(*k))
    }

    pub(crate) fn mark_synced(&mut self, kind: ClusterKind) {
        self.synced.insert(kind);
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodEntry> {
        self.pods.get(&key(namespace, name))
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Every pod: (namespace, name, entry).
    pub fn pods(&self) -> impl Iterator<Item = (&str, &str, &PodEntry)> {
        self.pods
            .iter()
            .map(|((ns, name), p)| (ns.as_str(), name.as_str(), p))
    }

    /// Whether `node` is Ready; `None` for a node the index does not know.
    pub fn node_ready(&self, node: &str) -> Option<bool> {
        self.nodes.get(node).copied()
    }

    /// What the GC decision needs to know of the pod `namespace/name`.
    pub fn pod_state(&self, namespace: &str, name: &str) -> Option<PodState> {
        self.pod(namespace, name).map(|p| self.state_of(p))
    }

    /// A pod entry as the decision reads it (its node's readiness from the index).
    pub fn state_of(&self, p: &PodEntry) -> PodState {
        PodState {
            uid: p.uid.clone(),
            phase: p.phase,
            deleting_at: p.deleting_at,
            grace: p.grace,
            host_network: p.host_network,
            node_ready: if p.node.is_empty() {
                None
            } else {
                self.node_ready(&p.node)
            },
            has_pod_ips: p.has_pod_ips,
            finished_at: p.finished_at,
        }
    }

    /// The replica count of a StatefulSet, `None` when it does not exist (or is being deleted:
    /// then it keeps no address).
    pub fn statefulset_replicas(&self, namespace: &str, name: &str) -> Option<u32> {
        self.statefulsets.get(&key(namespace, name)).copied()
    }

    /// What the decision needs to know of the StatefulSet or virtual machine `claim` was made
    /// for.
    pub fn owner_state(&self, claim: &Claim) -> OwnerState {
        owner_state(
            claim,
            |ns, name| self.statefulset_replicas(ns, name),
            |ns, name| self.virtual_machine_exists(ns, name),
        )
    }

    /// Whether the virtual machine `namespace/name` exists (a VirtualMachine or a
    /// VirtualMachineInstance of that name); `None` while that cannot be known (KubeVirt's
    /// kinds not discovered or not listed yet).
    pub fn virtual_machine_exists(&self, namespace: &str, name: &str) -> Option<bool> {
        match self.kubevirt {
            KubeVirt::Absent => Some(false),
            KubeVirt::Unknown => None,
            KubeVirt::Served => {
                let listed = self.is_synced(ClusterKind::VirtualMachine)
                    && self.is_synced(ClusterKind::VirtualMachineInstance);
                let k = key(namespace, name);
                let exists = self.virtual_machines.contains(&k)
                    || self.virtual_machine_instances.contains(&k);
                // One listed and seen is enough to know it exists.
                (listed || exists).then_some(exists)
            }
        }
    }

    /// Records what discovery says of KubeVirt's kinds. When they stop being served (KubeVirt
    /// uninstalled: its objects are deleted with its CRDs), what was known of them goes.
    pub fn set_kubevirt(&mut self, kubevirt: KubeVirt) {
        if kubevirt != KubeVirt::Served {
            self.virtual_machines.clear();
            self.virtual_machine_instances.clear();
            self.synced.remove(&ClusterKind::VirtualMachine);
            self.synced.remove(&ClusterKind::VirtualMachineInstance);
        }
        self.kubevirt = kubevirt;
    }

    /// The pod UID an allot Endpoint was written for.
    pub fn endpoint_uid(&self, namespace: &str, name: &str) -> Option<&str> {
        self.endpoints
            .get(&key(namespace, name))
            .map(|e| e.uid.as_str())
    }

    /// Every allot Endpoint: (namespace, name, pod UID).
    pub fn endpoints(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.endpoints
            .iter()
            .map(|((ns, name), e)| (ns.as_str(), name.as_str(), e.uid.as_str()))
    }

    /// Every allot Endpoint with what it records: (namespace, name, entry).
    pub fn endpoint_entries(&self) -> impl Iterator<Item = (&str, &str, &EndpointEntry)> {
        self.endpoints
            .iter()
            .map(|((ns, name), e)| (ns.as_str(), name.as_str(), e))
    }

    /// IPPools, Subnets and ReservedIPs as last seen, by kind and name.
    pub fn allot_objects(&self) -> impl Iterator<Item = &AllotEntry> {
        self.allot.values()
    }

    pub fn allot_object(&self, kind: ObjectKind, name: &str) -> Option<&AllotEntry> {
        self.allot.get(&(kind, name.to_string()))
    }

    /// Pods whose events since the last call may mean their addresses leaked.
    pub fn take_pending(&mut self) -> BTreeSet<(String, String)> {
        std::mem::take(&mut self.pending)
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// [`OwnerState`] of `claim`'s owner, given lookups (the index's, or fresh reads from the API)
/// of a StatefulSet's replica count (`None`: gone) and of whether a virtual machine exists
/// (`None`: not known, which keeps its address).
pub fn owner_state(
    claim: &Claim,
    replicas: impl FnOnce(&str, &str) -> Option<u32>,
    virtual_machine_exists: impl FnOnce(&str, &str) -> Option<bool>,
) -> OwnerState {
    if let Some(vm) = claim.pod.virtual_machine() {
        return match virtual_machine_exists(&claim.pod.namespace, vm) {
            Some(false) => OwnerState::VirtualMachineGone,
            Some(true) | None => OwnerState::VirtualMachine,
        };
    }
    if !claim.pod.is_stateful() {
        return OwnerState::NotKept;
    }
    let owner = claim.pod.owner_name.as_deref().unwrap_or_default();
    match replicas(&claim.pod.namespace, owner) {
        Some(n) => OwnerState::Replicas(n),
        None => OwnerState::StatefulSetGone,
    }
}
