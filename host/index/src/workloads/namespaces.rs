//! Namespaces in the workload index: their labels, followed as metadata. A pool's
//! namespaceAffinity is matched against them when the controller reserves a StatefulSet's
//! declared addresses (only in pools its pods may use).
//!
//! A namespace changes the generation only when its labels change and a StatefulSet the index
//! holds lives in it: namespaces come and go with every test run in some clusters, and each
//! pass reads every claim.

use std::collections::{BTreeMap, BTreeSet};

use allot_k8s::openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;

use super::{WorkloadIndex, WorkloadKind};
use crate::feed::IndexResource;

fn entry(o: &PartialObjectMeta<Namespace>) -> (String, BTreeMap<String, String>) {
    (
        o.metadata.name.clone().unwrap_or_default(),
        o.metadata.labels.clone().unwrap_or_default(),
    )
}

impl WorkloadIndex {
    /// The labels of namespace `name`, or `None` while it is not known (not listed yet, or
    /// gone): then nothing may be decided from them.
    pub fn namespace_labels(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.namespaces.get(name)
    }

    /// Whether a StatefulSet the index holds lives in `namespace`.
    fn holds_statefulsets_in(&self, namespace: &str) -> bool {
        self.workloads
            .keys()
            .any(|(kind, ns, _)| *kind == WorkloadKind::StatefulSet && ns == namespace)
    }
}

impl IndexResource<PartialObjectMeta<Namespace>> for WorkloadIndex {
    const KIND: &'static str = "Namespace";

    fn apply(&mut self, o: PartialObjectMeta<Namespace>) {
        let (name, labels) = entry(&o);
        let changed = self.namespaces.get(&name) != Some(&labels);
        let matters = changed && self.holds_statefulsets_in(&name);
        self.namespaces.insert(name, labels);
        if matters {
            self.generation += 1;
        }
    }

    fn delete(&mut self, o: PartialObjectMeta<Namespace>) {
        let (name, _) = entry(&o);
        if self.namespaces.remove(&name).is_some() && self.holds_statefulsets_in(&name) {
            self.generation += 1;
        }
    }

    fn reset(&mut self, all: Vec<PartialObjectMeta<Namespace>>) {
        let fresh: BTreeMap<String, BTreeMap<String, String>> = all.iter().map(entry).collect();
        let names: BTreeSet<&String> = fresh.keys().chain(self.namespaces.keys()).collect();
        let matters = names.into_iter().any(|name| {
            fresh.get(name) != self.namespaces.get(name) && self.holds_statefulsets_in(name)
        });
        self.namespaces = fresh;
        if matters {
            self.generation += 1;
        }
    }
}
