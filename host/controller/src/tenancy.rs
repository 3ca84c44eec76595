//! Which IPPools a workload's pods may use, judged before any of them exists (a StatefulSet's
//! declared addresses, at admission and when the controller reserves them): a pool's
//! namespaceName / namespaceAffinity against the workload's namespace and its labels, and its
//! podAffinity against the pod template's labels, by the default policy's own rules
//! ([`allot_policy_default::namespace_matches`], [`allot_policy_default::pod_matches`]): the
//! same code drops the pool for a pod at its ADD.
//!
//! Not judged here, because no object says it before a pod is scheduled: nodeName and
//! nodeAffinity (where a pool serves, not whom: the nodes a pod lands on depend on the
//! scheduler, taints and nodes that join later), and multusName (the network an interface
//! attaches through is Multus' choice at the pod's creation). A pod's ADD still checks both.

use std::collections::BTreeMap;

use allot_core::declared::Barred;
use allot_core::spec::{IpPoolSpec, LabelSelector, SelectorOperator};
use allot_policy_default::{namespace_matches, pod_matches};
use allot_policy_sdk::types as sdk;

/// A workload as a pool's tenancy fields see it.
pub struct Workload<'a> {
    namespace: &'a str,
    namespace_labels: Vec<sdk::Label>,
    pod_labels: Vec<sdk::Label>,
}

impl<'a> Workload<'a> {
    /// Pods of `namespace`, whose labels are `namespace_labels`, labelled `pod_labels` (the pod
    /// template's: labels a pod gets later, from its controller or a mutating webhook, are not
    /// known yet).
    pub fn new(
        namespace: &'a str,
        namespace_labels: &BTreeMap<String, String>,
        pod_labels: &BTreeMap<String, String>,
    ) -> Workload<'a> {
        Workload {
            namespace,
            namespace_labels: labels(namespace_labels),
            pod_labels: labels(pod_labels),
        }
    }

    /// Why its pods may not use a pool of `spec`, or `None` when they may.
    pub fn barred(&self, spec: &IpPoolSpec) -> Option<Barred> {
        let namespace_affinity = spec.namespace_affinity.as_ref().map(selector);
        if !namespace_matches(
            &spec.namespace_name,
            namespace_affinity.as_ref(),
            self.namespace,
            &self.namespace_labels,
        ) {
            // The same precedence as the rule's: namespaceName, when set, decided.
            return Some(if spec.namespace_name.is_empty() {
                Barred::NamespaceAffinity
            } else {
                Barred::NamespaceName(spec.namespace_name.clone())
            });
        }
        let pod_affinity = spec.pod_affinity.as_ref().map(selector);
        (!pod_matches(pod_affinity.as_ref(), &self.pod_labels)).then_some(Barred::PodAffinity)
    }
}

fn labels(map: &BTreeMap<String, String>) -> Vec<sdk::Label> {
    map.iter()
        .map(|(key, value)| sdk::Label {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

fn selector(s: &LabelSelector) -> sdk::LabelSelector {
    sdk::LabelSelector {
        match_labels: labels(&s.match_labels),
        match_expressions: s
            .match_expressions
            .iter()
            .map(|r| sdk::SelectorRequirement {
                key: r.key.clone(),
                operator: match r.operator {
                    SelectorOperator::In => sdk::SelectorOperator::In,
                    SelectorOperator::NotIn => sdk::SelectorOperator::NotIn,
                    SelectorOperator::Exists => sdk::SelectorOperator::Exists,
                    SelectorOperator::DoesNotExist => sdk::SelectorOperator::DoesNotExist,
                },
                values: r.values.clone(),
            })
            .collect(),
    }
}
