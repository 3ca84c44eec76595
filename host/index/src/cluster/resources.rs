//! How each Kubernetes kind enters the controller's index.

use allot_core::config::ObjectKind;
use allot_core::gc::PodPhase;
use allot_core::store::VIRTUAL_MACHINE_KIND;
use allot_k8s::Endpoint;
use allot_k8s::openapi::api::apps::v1::StatefulSet;
use allot_k8s::openapi::api::core::v1::{Node, Pod};
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;

use super::{AllotEntry, ClusterIndex, ClusterKind, EndpointEntry, Key, PodEntry};
use crate::allot::observe;
use crate::feed::IndexResource;
use crate::{PoolObject, ReservedObject, SubnetObject};

/// An allot `Endpoint` as the watch delivered it.
#[derive(Clone, Debug)]
pub struct EndpointObject(pub Endpoint);

fn names(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn seconds(t: &Time) -> u64 {
    u64::try_from(t.0.as_second()).unwrap_or(0)
}

/// The API's default `terminationGracePeriodSeconds`.
const DEFAULT_GRACE: i64 = 30;

impl PodEntry {
    /// What the GC decision reads of a pod (from a watch or a fresh GET).
    pub fn of(pod: &Pod) -> PodEntry {
        let m = &pod.metadata;
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let grace = m
            .deletion_grace_period_seconds
            .filter(|_| m.deletion_timestamp.is_some())
            .or_else(|| spec.and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(DEFAULT_GRACE);
        let finished_at = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
            .map(seconds)
            .max();
        PodEntry {
            uid: m.uid.clone().unwrap_or_default(),
            node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            phase: PodPhase::parse(status.and_then(|s| s.phase.as_deref())),
            deleting_at: m.deletion_timestamp.as_ref().map(seconds),
            grace: u64::try_from(grace).unwrap_or(0),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            has_pod_ips: status
                .and_then(|s| s.pod_ips.as_ref())
                .is_some_and(|ips| !ips.is_empty())
                || status.and_then(|s| s.pod_ip.as_ref()).is_some(),
            finished_at,
            addresses: crate::multus::pod_addresses(pod),
            virtual_machine: crate::resources::pod_controller(m)
                .filter(|o| o.kind == VIRTUAL_MACHINE_KIND)
                .map(|o| o.name),
        }
    }

    /// Whether this state of a pod may mean its addresses leak: terminating, finished, or
    /// running without pod IPs.
    fn may_leak(&self) -> bool {
        self.deleting_at.is_some()
            || matches!(self.phase, PodPhase::Succeeded | PodPhase::Failed)
            || (self.phase == PodPhase::Running && !self.has_pod_ips)
    }
}

/// Replicas a StatefulSet keeps addresses for: `spec.replicas` (the API's default 1), none
/// while it is being deleted.
pub fn statefulset_replicas(sts: &StatefulSet) -> u32 {
    if sts.metadata.deletion_timestamp.is_some() {
        return 0;
    }
    let n = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    u32::try_from(n).unwrap_or(0)
}

impl IndexResource<Pod> for ClusterIndex {
    const KIND: &'static str = ClusterKind::Pod.as_str();

    fn apply(&mut self, pod: Pod) {
        let key = names(&pod.metadata);
        let entry = PodEntry::of(&pod);
        let replaced = self.pods.get(&key).is_some_and(|p| p.uid != entry.uid);
        if replaced || entry.may_leak() {
            self.pending.insert(key.clone());
        }
        self.pods.insert(key, entry);
    }

    fn delete(&mut self, pod: Pod) {
        // A deletion names the pod it deleted: a later pod of the same name stays.
        let key = names(&pod.metadata);
        let uid = pod.metadata.uid.unwrap_or_default();
        if self
            .pods
            .get(&key)
            .is_some_and(|p| uid.is_empty() || p.uid == uid)
        {
            self.pods.remove(&key);
        }
        self.pending.insert(key);
    }

    fn reset(&mut self, pods: Vec<Pod>) {
        let before = std::mem::take(&mut self.pods);
        for pod in pods {
            self.apply(pod);
        }
        // Pods deleted while the watch was down: look at them as at any deletion.
        let gone: Vec<Key> = before
            .into_keys()
            .filter(|k| !self.pods.contains_key(k))
            .collect();
        self.pending.extend(gone);
        self.mark_synced(ClusterKind::Pod);
    }
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

impl IndexResource<Node> for ClusterIndex {
    const KIND: &'static str = ClusterKind::Node.as_str();

    fn apply(&mut self, node: Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.nodes.insert(name, node_ready(&node));
    }

    fn delete(&mut self, node: Node) {
        self.nodes
            .remove(node.metadata.name.as_deref().unwrap_or_default());
    }

    fn reset(&mut self, nodes: Vec<Node>) {
        self.nodes.clear();
        for node in nodes {
            self.apply(node);
        }
        self.mark_synced(ClusterKind::Node);
    }
}

impl IndexResource<StatefulSet> for ClusterIndex {
    const KIND: &'static str = ClusterKind::StatefulSet.as_str();

    fn apply(&mut self, sts: StatefulSet) {
        self.statefulsets
            .insert(names(&sts.metadata), statefulset_replicas(&sts));
    }

    fn delete(&mut self, sts: StatefulSet) {
        self.statefulsets.remove(&names(&sts.metadata));
    }

    fn reset(&mut self, all: Vec<StatefulSet>) {
        self.statefulsets.clear();
        for sts in all {
            self.apply(sts);
        }
        self.mark_synced(ClusterKind::StatefulSet);
    }
}

impl IndexResource<EndpointObject> for ClusterIndex {
    const KIND: &'static str = ClusterKind::Endpoint.as_str();

    fn apply(&mut self, e: EndpointObject) {
        self.endpoints
            .insert(names(&e.0.metadata), EndpointEntry::of(&e.0));
    }

    fn delete(&mut self, e: EndpointObject) {
        self.endpoints.remove(&names(&e.0.metadata));
    }

    fn reset(&mut self, all: Vec<EndpointObject>) {
        self.endpoints.clear();
        for e in all {
            self.apply(e);
        }
        self.mark_synced(ClusterKind::Endpoint);
    }
}

impl EndpointEntry {
    /// The pod UID and each address (`10.0.0.7/24` read as `10.0.0.7`) an Endpoint records.
    pub fn of(e: &Endpoint) -> EndpointEntry {
        let addresses = e
            .spec
            .interfaces
            .iter()
            .flat_map(|i| {
                [&i.ipv4, &i.ipv6]
                    .into_iter()
                    .flatten()
                    .filter_map(|cidr| cidr.split('/').next()?.parse().ok())
                    .map(|a| (a, i.ifname.clone()))
            })
            .collect();
        EndpointEntry {
            uid: e.spec.uid.clone(),
            addresses,
        }
    }
}

fn entry(kind: ObjectKind, o: &DynamicObject) -> AllotEntry {
    let m = &o.metadata;
    let status = o.data.get("status");
    let count = |field: &str| status.and_then(|s| s.get(field)).and_then(|v| v.as_u64());
    AllotEntry {
        observed: observe(kind, o),
        uid: m.uid.clone().unwrap_or_default(),
        resource_version: m.resource_version.clone().unwrap_or_default(),
        finalizers: m.finalizers.clone().unwrap_or_default(),
        deleting: m.deletion_timestamp.is_some(),
        status: (count("allocatedIPCount"), count("totalIPCount")),
    }
}

macro_rules! allot_kind {
    ($wrapper:ident, $object_kind:expr, $tag:expr) => {
        impl IndexResource<$wrapper> for ClusterIndex {
            const KIND: &'static str = $tag.as_str();

            fn apply(&mut self, o: $wrapper) {
                let e = entry($object_kind, &o.0);
                self.allot
                    .insert(($object_kind, e.observed.name.clone()), e);
            }

            fn delete(&mut self, o: $wrapper) {
                let name = o.0.metadata.name.clone().unwrap_or_default();
                self.allot.remove(&($object_kind, name));
            }

            fn reset(&mut self, all: Vec<$wrapper>) {
                self.allot.retain(|(kind, _), _| *kind != $object_kind);
                for o in all {
                    self.apply(o);
                }
                self.mark_synced($tag);
            }
        }
    };
}

allot_kind!(PoolObject, ObjectKind::IpPool, ClusterKind::IpPool);
allot_kind!(SubnetObject, ObjectKind::Subnet, ClusterKind::Subnet);
allot_kind!(
    ReservedObject,
    ObjectKind::ReservedIp,
    ClusterKind::ReservedIp
);

/// A KubeVirt VirtualMachine (`kubevirt.io`), as a metadata watch delivers it.
#[derive(Clone, Debug)]
pub struct VirtualMachineObject(pub PartialObjectMeta<DynamicObject>);

/// A KubeVirt VirtualMachineInstance (`kubevirt.io`), as a metadata watch delivers it.
#[derive(Clone, Debug)]
pub struct VirtualMachineInstanceObject(pub PartialObjectMeta<DynamicObject>);

impl IndexResource<VirtualMachineObject> for ClusterIndex {
    const KIND: &'static str = ClusterKind::VirtualMachine.as_str();

    fn apply(&mut self, vm: VirtualMachineObject) {
        self.virtual_machines.insert(names(&vm.0.metadata));
    }

    fn delete(&mut self, vm: VirtualMachineObject) {
        self.virtual_machines.remove(&names(&vm.0.metadata));
    }

    fn reset(&mut self, all: Vec<VirtualMachineObject>) {
        self.virtual_machines = all.iter().map(|vm| names(&vm.0.metadata)).collect();
        self.mark_synced(ClusterKind::VirtualMachine);
    }
}

impl IndexResource<VirtualMachineInstanceObject> for ClusterIndex {
    const KIND: &'static str = ClusterKind::VirtualMachineInstance.as_str();

    fn apply(&mut self, vmi: VirtualMachineInstanceObject) {
        self.virtual_machine_instances
            .insert(names(&vmi.0.metadata));
    }

    fn delete(&mut self, vmi: VirtualMachineInstanceObject) {
        self.virtual_machine_instances
            .remove(&names(&vmi.0.metadata));
    }

    fn reset(&mut self, all: Vec<VirtualMachineInstanceObject>) {
        self.virtual_machine_instances = all.iter().map(|vmi| names(&vmi.0.metadata)).collect();
        self.mark_synced(ClusterKind::VirtualMachineInstance);
    }
}
