//! Whereabouts' objects as its controllers write them, decoded (kept apart: the decoder is short,
//! its cases are not).

use serde_json::json;

use super::*;

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

fn nad(name: &str, config: Value) -> DynamicObject {
    object(json!({
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": "web"},
        "spec": {"config": config.to_string()}
    }))
}

/// A macvlan network with Whereabouts's IPAM, as users write them.
fn underlay(name: &str, network_name: Option<&str>) -> DynamicObject {
    let mut ipam = json!({
        "type": "whereabouts",
        "range": "192.0.2.0/24",
        "range_start": "192.0.2.100",
        "range_end": "192.0.2.149",
        "exclude": ["192.0.2.120/30"],
        "gateway": "192.0.2.1",
        "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}
    });
    if let Some(n) = network_name {
        ipam["network_name"] = json!(n);
    }
    nad(
        name,
        json!({"cniVersion": "0.3.1", "name": name, "plugins": [
            {"type": "macvlan", "master": "eth1", "mode": "bridge", "ipam": ipam}
        ]}),
    )
}

/// An IPPool as Whereabouts writes it (`toAllocationMap`: decimal offsets from the address
/// `spec.range` writes).
fn ippool(name: &str, allocations: Value) -> DynamicObject {
    object(json!({
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"range": "192.0.2.0/24", "allocations": allocations}
    }))
}

fn reservation(name: &str, podref: &str) -> DynamicObject {
    object(json!({
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "OverlappingRangeIPReservation",
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"podref": podref, "ifname": "net1"}
    }))
}

#[test]
fn ranges_become_pools_and_allocations_records() {
    let d = decode(&Objects {
        networks: vec![
            underlay("underlay-a", None),
            underlay("underlay-b", None),
            nad(
                "other",
                json!({"cniVersion": "0.3.1", "name": "other", "type": "bridge",
                "ipam": {"type": "host-local", "subnet": "10.1.0.0/24"}}),
            ),
        ],
        pools: vec![ippool(
            "192.0.2.0-24",
            json!({"100": {"id": "0123abcd", "podref": "web/db-0", "ifname": "net1"}}),
        )],
        reservations: vec![reservation("192.0.2.100", "web/db-0")],
    });
    assert!(d.unreadable.is_empty(), "{:?}", d.unreadable);
    assert_eq!(d.pools.len(), 2, "one per NAD, joined by the plan");
    let p = &d.pools[0];
    assert_eq!(p.name, "whereabouts-192.0.2.0-24");
    assert_eq!(
        p.source,
        "NetworkAttachmentDefinition web/underlay-a (range 192.0.2.0/24)"
    );
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(spec.ips, ["192.0.2.100-192.0.2.149"]);
    assert_eq!(spec.exclude_ips, ["192.0.2.120/30"]);
    assert_eq!(spec.gateway.as_deref(), Some("192.0.2.1"));
    assert_eq!(
        d.networks,
        [
            (
                "web/underlay-a".to_string(),
                vec!["whereabouts-192.0.2.0-24".to_string()]
            ),
            (
                "web/underlay-b".to_string(),
                vec!["whereabouts-192.0.2.0-24".to_string()]
            ),
        ]
    );
    assert_eq!(d.records.len(), 2);
    let r = &d.records[0];
    assert_eq!(r.address.to_string(), "192.0.2.100");
    assert_eq!((r.namespace.as_str(), r.name.as_str()), ("web", "db-0"));
    assert_eq!(r.container_id.as_deref(), Some("0123abcd"));
    assert_eq!(r.interface.as_deref(), Some("net1"));
    assert_eq!(r.network, "underlay-a", "the CNI network's name");
    assert_eq!(r.pool.as_deref(), Some("whereabouts-192.0.2.0-24"));
    assert_eq!(
        r.source,
        "Whereabouts IPPool kube-system/192.0.2.0-24 spec.allocations[100]"
    );
    let o = &d.records[1];
    assert_eq!(
        o.source,
        "OverlappingRangeIPReservation kube-system/192.0.2.100"
    );
    assert_eq!(o.pool.as_deref(), Some("whereabouts-192.0.2.0-24"));
}

#[test]
fn a_named_network_has_pools_of_its_own() {
    let d = decode(&Objects {
        networks: vec![underlay("blue", Some("blue"))],
        pools: vec![ippool(
            "blue-192.0.2.0-24",
            json!({"101": {"id": "c", "podref": "web/a"}}),
        )],
        reservations: vec![reservation("blue-192.0.2.101", "web/a")],
    });
    assert!(d.unreadable.is_empty(), "{:?}", d.unreadable);
    assert_eq!(d.pools[0].name, "whereabouts-blue-192.0.2.0-24");
    for r in &d.records {
        assert_eq!(
            r.pool.as_deref(),
            Some("whereabouts-blue-192.0.2.0-24"),
            "{}",
            r.source
        );
        assert_eq!(r.address.to_string(), "192.0.2.101");
    }
    assert_eq!(d.records[0].interface, None, "no ifname recorded");
}

#[test]
fn what_cannot_be_decoded_is_named() {
    let sliced = nad(
        "sliced",
        json!({"cniVersion": "0.3.1", "name": "sliced", "type": "macvlan",
            "ipam": {"type": "whereabouts", "range": "10.0.0.0/16", "node_slice_size": "/22"}}),
    );
    let d = decode(&Objects {
        networks: vec![sliced],
        pools: vec![ippool(
            "192.0.2.0-24",
            json!({"7": {"id": "c", "podref": "nobody"}}),
        )],
        reservations: vec![reservation("not-an-ip", "web/a")],
    });
    let why: Vec<String> = d
        .unreadable
        .iter()
        .map(|(o, w)| format!("{o}: {w}"))
        .collect();
    assert_eq!(
        why,
        [
            "NetworkAttachmentDefinition web/sliced: node_slice_size is set: node-sliced ranges (NodeSlicePools) are not carried over",
            "Whereabouts IPPool kube-system/192.0.2.0-24: spec.allocations[7].podref `nobody` is not namespace/name",
            "OverlappingRangeIPReservation kube-system/not-an-ip: its name `not-an-ip` is not an address",
        ]
    );
}
