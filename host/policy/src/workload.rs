//! A synthetic but realistic decision workload for benchmarks (`allotctl policy bench`, the
//! crate's `decision` bench): `n` IPv4 pools, all cluster defaults, with a mix of affinities so
//! that acquisition, every filter and the sort all do real work.

use std::collections::BTreeMap;

use allot_core::Pool;
use allot_core::policy::{Inventory, NamespaceInfo, Nic, NodeInfo, Owner, PodInfo, Request};
use allot_core::spec::{
    IpPoolSpec, LabelSelector, LabelSelectorRequirement, ObjectMeta, SelectorOperator,
};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The inventory: pool `i` is `bench-{i:05}` on its own /24, with podAffinity on every 4th,
/// nodeName on every 3rd, nodeAffinity on every 5th, namespaceName on every 7th, multusName on
/// every 11th, and every 13th disabled.
pub fn inventory(n: usize) -> Inventory {
    let pools: Vec<Pool> = (0..n)
        .map(|i| {
            let mut spec = IpPoolSpec {
                subnet: format!("10.{}.{}.0/24", (i / 256) % 256, i % 256),
                gateway: Some(format!("10.{}.{}.1", (i / 256) % 256, i % 256)),
                default: true,
                disable: i % 13 == 12,
                ..Default::default()
            };
            if i % 4 == 0 {
                spec.pod_affinity = Some(LabelSelector {
                    match_labels: labels(&[("app", "web")]),
                    ..Default::default()
                });
            }
            if i % 3 == 0 {
                spec.node_name = vec!["node-1".into(), "node-2".into()];
            }
            if i % 5 == 0 {
                spec.node_affinity = Some(LabelSelector {
                    match_expressions: vec![LabelSelectorRequirement {
                        key: "topology.kubernetes.io/zone".into(),
                        operator: SelectorOperator::In,
                        values: vec!["zone-a".into(), "zone-b".into()],
                    }],
                    ..Default::default()
                });
            }
            if i % 7 == 0 {
                spec.namespace_name = vec!["team-a".into()];
            }
            if i % 11 == 0 {
                spec.multus_name = vec!["kube-system/macvlan".into()];
            }
            let meta = ObjectMeta {
                name: format!("bench-{i:05}"),
                labels: labels(&[(
                    "topology.kubernetes.io/zone",
                    if i % 2 == 0 { "zone-a" } else { "zone-b" },
                )]),
                ..Default::default()
            };
            Pool::from_spec(meta, spec).expect("synthetic pools are valid")
        })
        .collect();
    Inventory::build(1, &pools, &[], &[])
}

/// A pod of a StatefulSet on node-1 in team-a, attached through Multus, with the labels and
/// annotations a real pod carries.
pub fn request(inventory: &Inventory) -> Request {
    Request {
        pod: PodInfo {
            namespace: "team-a".into(),
            name: "web-3".into(),
            uid: "6f1c2a8e-1d0b-4a57-9a55-3c1b0e2f7d10".into(),
            labels: labels(&[
                ("app", "web"),
                ("app.kubernetes.io/name", "web"),
                ("controller-revision-hash", "web-7d4b9c8f6"),
                ("statefulset.kubernetes.io/pod-name", "web-3"),
            ]),
            annotations: labels(&[
                ("kubectl.kubernetes.io/restartedAt", "2026-11-01T10:00:00Z"),
                ("k8s.v1.cni.cncf.io/networks", "kube-system/macvlan"),
            ]),
            owner: Some(Owner {
                kind: "StatefulSet".into(),
                name: "web".into(),
            }),
        },
        namespace: NamespaceInfo {
            name: "team-a".into(),
            labels: labels(&[("kubernetes.io/metadata.name", "team-a"), ("team", "a")]),
            annotations: BTreeMap::new(),
        },
        node: NodeInfo {
            name: "node-1".into(),
            labels: labels(&[
                ("kubernetes.io/hostname", "node-1"),
                ("kubernetes.io/os", "linux"),
                ("topology.kubernetes.io/zone", "zone-a"),
                ("node-role.kubernetes.io/worker", ""),
            ]),
        },
        nics: vec![Nic {
            interface: "eth0".into(),
            multus_name: "kube-system/macvlan".into(),
        }],
        cni_defaults: Default::default(),
        // Every 17th pool exhausted.
        free_counts: (0..inventory.pools.len())
            .map(|i| if i % 17 == 16 { 0 } else { 200 })
            .collect(),
    }
}
