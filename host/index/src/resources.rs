//! How each Kubernetes kind enters the index.

use std::collections::BTreeMap;

use allot_core::policy::Owner;
use allot_core::store::holder_kind;
use allot_k8s::openapi::api::apps::v1::ReplicaSet;
use allot_k8s::openapi::api::batch::v1::Job;
use allot_k8s::openapi::api::core::v1::{Namespace, Node, Pod};
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::PartialObjectMeta;

use crate::feed::IndexResource;
use crate::index::{CachedOwner, Index, Kind, PodFacts};

fn names(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn map(m: &Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    m.clone().unwrap_or_default()
}

/// The owner reference marked as controller.
fn controller_ref(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// The owner reference marked as controller.
pub(crate) fn controller(meta: &ObjectMeta) -> Option<Owner> {
    controller_ref(meta).map(|r| Owner {
        kind: r.kind.clone(),
        name: r.name.clone(),
    })
}

/// A pod's controller as allot keys its addresses: a KubeVirt launcher pod's
/// VirtualMachineInstance stands for its virtual machine (KubeVirt names the instance after its
/// VirtualMachine), whose address every launcher pod of it shares (`holder_kind`).
pub fn pod_controller(meta: &ObjectMeta) -> Option<Owner> {
    let r = controller_ref(meta)?;
    Some(Owner {
        kind: holder_kind(&r.api_version, &r.kind).to_string(),
        name: r.name.clone(),
    })
}

impl Index {
    fn facts(pod: &Pod) -> PodFacts {
        PodFacts {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            labels: map(&pod.metadata.labels),
            annotations: map(&pod.metadata.annotations),
            controller: pod_controller(&pod.metadata),
            controller_uid: controller_ref(&pod.metadata)
                .map(|r| r.uid.clone())
                .unwrap_or_default(),
            host_network: pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false),
        }
    }

    fn on_this_node(&self, pod: &Pod) -> bool {
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node_name())
    }
}

impl IndexResource<Pod> for Index {
    const KIND: &'static str = Kind::Pod.as_str();

    fn apply(&mut self, pod: Pod) {
        let key = names(&pod.metadata);
        // The watch selects this node's pods; a pod of another node (a misconfigured selector)
        // is not ours to serve.
        let facts = self.on_this_node(&pod).then(|| Index::facts(&pod));
        let named = facts
            .as_ref()
            .map(|f| (f.controller.clone(), f.controller_uid.clone()));
        let before = match facts {
            Some(f) => self.pods.insert(key, f),
            None => self.pods.remove(&key),
        };
        // Orphaned, adopted or gone: its former owner may be named by no pod any more.
        if before.is_some_and(|b| named != Some((b.controller, b.controller_uid))) {
            self.forget_unnamed_owners();
        }
    }

    fn delete(&mut self, pod: Pod) {
        // A deletion names the object it deleted: a later pod of the same name (a
        // StatefulSet's, already applied) stays.
        let key = names(&pod.metadata);
        let uid = pod.metadata.uid.unwrap_or_default();
        if self
            .pods
            .get(&key)
            .is_some_and(|p| uid.is_empty() || p.uid == uid)
        {
            self.pods.remove(&key);
            self.forget_unnamed_owners();
        }
    }

    fn reset(&mut self, pods: Vec<Pod>) {
        self.pods = pods
            .iter()
            .filter(|p| self.on_this_node(p))
            .map(|p| (names(&p.metadata), Index::facts(p)))
            .collect();
        self.forget_unnamed_owners();
        self.mark_synced(Kind::Pod);
    }
}

impl IndexResource<Namespace> for Index {
    const KIND: &'static str = Kind::Namespace.as_str();

    fn apply(&mut self, ns: Namespace) {
        let m = &ns.metadata;
        self.namespaces.insert(
            m.name.clone().unwrap_or_default(),
            (map(&m.labels), map(&m.annotations)),
        );
    }

    fn delete(&mut self, ns: Namespace) {
        self.namespaces
            .remove(ns.metadata.name.as_deref().unwrap_or_default());
    }

    fn reset(&mut self, all: Vec<Namespace>) {
        self.namespaces.clear();
        for ns in all {
            self.apply(ns);
        }
        self.mark_synced(Kind::Namespace);
    }
}

impl IndexResource<Node> for Index {
    const KIND: &'static str = Kind::Node.as_str();

    fn apply(&mut self, node: Node) {
        if node.metadata.name.as_deref() == Some(self.node_name()) {
            self.node = Some(map(&node.metadata.labels));
        }
    }

    fn delete(&mut self, node: Node) {
        if node.metadata.name.as_deref() == Some(self.node_name()) {
            self.node = None;
        }
    }

    fn reset(&mut self, nodes: Vec<Node>) {
        self.node = None;
        for node in nodes {
            self.apply(node);
        }
        self.mark_synced(Kind::Node);
    }
}

/// A pod's ReplicaSet or Job, read by one metadata-only GET when a pod of this node first names
/// it (no watch follows them): its UID and its controller are all the index needs. `delete`
/// and `reset` complete the trait: nothing lists or watches these kinds.
macro_rules! owner_cache {
    ($kind:ty, $field:ident, $tag:expr) => {
        impl IndexResource<PartialObjectMeta<$kind>> for Index {
            const KIND: &'static str = $tag;

            fn apply(&mut self, o: PartialObjectMeta<$kind>) {
                self.$field.insert(names(&o.metadata), cached(&o.metadata));
            }

            fn delete(&mut self, o: PartialObjectMeta<$kind>) {
                self.$field.remove(&names(&o.metadata));
            }

            fn reset(&mut self, all: Vec<PartialObjectMeta<$kind>>) {
                self.$field = all
                    .iter()
                    .map(|o| (names(&o.metadata), cached(&o.metadata)))
                    .collect();
            }
        }
    };
}

fn cached(meta: &ObjectMeta) -> CachedOwner {
    CachedOwner {
        uid: meta.uid.clone().unwrap_or_default(),
        controller: controller(meta),
    }
}

owner_cache!(ReplicaSet, replicasets, "ReplicaSet");
owner_cache!(Job, jobs, "Job");
