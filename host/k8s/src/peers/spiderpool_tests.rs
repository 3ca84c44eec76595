//! Spiderpool's objects as its controllers write them, decoded (kept apart: the decoder is short,
//! its cases are not).

use serde_json::json;

use super::*;

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// A SpiderIPPool as Spiderpool v1.2's controller and agents leave it: `status.allocatedIPs`
/// a JSON text (`convert.MarshalIPPoolAllocatedIPs`).
fn pool(name: &str, labels: Value, allocated: &str) -> DynamicObject {
    object(json!({
        "apiVersion": "spiderpool.spidernet.io/v2beta1",
        "kind": "SpiderIPPool",
        "metadata": {"name": name, "labels": labels, "finalizers": ["spiderpool.spidernet.io"]},
        "spec": {
            "ipVersion": 4, "subnet": "192.0.2.0/24", "ips": ["192.0.2.10-192.0.2.20"],
            "gateway": "192.0.2.1", "default": false, "disable": false,
            "podAffinity": {"matchLabels": {"ipam.spidernet.io/app-kind": "Deployment"}}
        },
        "status": {"allocatedIPs": allocated, "allocatedIPCount": 1, "totalIPCount": 11}
    }))
}

#[test]
fn a_pools_allocations_are_records_of_their_pods() {
    let objects = Objects {
        pools: vec![pool(
            "sp-v4",
            json!({}),
            r#"{"192.0.2.10":{"pod":"web/web-0","podUid":"u-0"},"192.0.2.11":{"pod":"web/x","podUid":""}}"#,
        )],
        ..Objects::default()
    };
    let d = decode(&objects);
    assert!(d.unreadable.is_empty(), "{:?}", d.unreadable);
    assert_eq!(d.pools[0].name, "sp-v4");
    let spec = d.pools[0].spec.as_ref().unwrap();
    assert_eq!(spec.ips, ["192.0.2.10-192.0.2.20"]);
    assert!(
        spec.pod_affinity.is_some(),
        "a pool of the user's keeps its affinity"
    );
    assert_eq!(d.records.len(), 2);
    let r = &d.records[0];
    assert_eq!(r.address.to_string(), "192.0.2.10");
    assert_eq!((r.namespace.as_str(), r.name.as_str()), ("web", "web-0"));
    assert_eq!(r.uid.as_deref(), Some("u-0"));
    assert_eq!(r.pool.as_deref(), Some("sp-v4"));
    assert_eq!(r.source, "SpiderIPPool sp-v4 status.allocatedIPs");
    assert_eq!(d.records[1].uid, None, "an empty UID is no UID");
}

#[test]
fn an_auto_pool_becomes_the_auto_pool_allot_would_have_made() {
    let labels = json!({
        "ipam.spidernet.io/owner-spider-subnet": "subnet-v4",
        "ipam.spidernet.io/owner-application-gv": "apps_v1",
        "ipam.spidernet.io/owner-application-kind": "Deployment",
        "ipam.spidernet.io/owner-application-namespace": "web",
        "ipam.spidernet.io/owner-application-name": "front",
        "ipam.spidernet.io/owner-application-uid": "d-1",
        "ipam.spidernet.io/ippool-reclaim": "false",
        "ipam.spidernet.io/interface": "eth0",
    });
    let endpoint = object(json!({
        "apiVersion": "spiderpool.spidernet.io/v2beta1",
        "kind": "SpiderEndpoint",
        "metadata": {"name": "front-abc", "namespace": "web"},
        "status": {
            "current": {"uid": "u-f", "node": "node-1", "ips": [{
                "interface": "eth0", "ipv4": "192.0.2.12/24",
                "ipv4Pool": "auto4-front-eth0-1a2b3", "ipv4Gateway": "192.0.2.1",
                "vlan": 0, "cleanGateway": false
            }]},
            "ownerControllerType": "Deployment",
            "ownerControllerName": "front"
        }
    }));
    let d = decode(&Objects {
        pools: vec![pool(
            "auto4-front-eth0-1a2b3",
            labels,
            r#"{"192.0.2.12":{"pod":"web/front-abc","podUid":"u-f"}}"#,
        )],
        endpoints: vec![endpoint],
        ..Objects::default()
    });
    let app = Application {
        kind: "Deployment".into(),
        namespace: "web".into(),
        name: "front".into(),
    };
    let name = autopool::pool_name(&app, "subnet-v4", IpFamily::V4);
    assert_eq!(d.pools[0].name, name);
    assert_eq!(
        d.pools[0].labels,
        autopool::labels(&app, "subnet-v4", false)
    );
    assert!(d.pools[0].spec.as_ref().unwrap().pod_affinity.is_none());
    assert_eq!(d.records.len(), 2);
    for r in &d.records {
        assert_eq!(r.pool.as_deref(), Some(name.as_str()), "{}", r.source);
    }
    let from_endpoint = &d.records[1];
    assert_eq!(from_endpoint.source, "SpiderEndpoint web/front-abc");
    assert_eq!(from_endpoint.interface.as_deref(), Some("eth0"));
    assert_eq!(
        from_endpoint.owner,
        Some(Owner {
            kind: "Deployment".into(),
            name: "front".into()
        })
    );
}

#[test]
fn a_pool_of_a_subnet_is_labelled_with_allots_subnet_label() {
    let d = decode(&Objects {
        pools: vec![pool(
            "manual",
            json!({"ipam.spidernet.io/owner-spider-subnet": "subnet-v4"}),
            "{}",
        )],
        ..Objects::default()
    });
    assert_eq!(d.pools[0].name, "manual");
    assert_eq!(
        d.pools[0]
            .labels
            .get(auto_pool_labels::OWNER_SUBNET)
            .map(String::as_str),
        Some("subnet-v4")
    );
}

#[test]
fn what_cannot_be_decoded_is_named() {
    let mut bad_spec = pool("bad", json!({}), "{}");
    bad_spec.data["spec"]["vlan"] = json!(5);
    let bad_status = pool(
        "worse",
        json!({}),
        r#"{"192.0.2.10":{"pod":"no-namespace"}}"#,
    );
    let bad_endpoint = object(json!({
        "apiVersion": "spiderpool.spidernet.io/v2beta1", "kind": "SpiderEndpoint",
        "metadata": {"name": "p", "namespace": "web"},
        "status": {"current": {"uid": "u", "node": "n", "ips": [{"interface": "eth0", "ipv4": "x/24"}]},
                   "ownerControllerType": "Pod", "ownerControllerName": "p"}
    }));
    let d = decode(&Objects {
        pools: vec![bad_spec, bad_status],
        endpoints: vec![bad_endpoint],
        ..Objects::default()
    });
    let bad = d.pools[0].spec.as_ref().unwrap_err();
    assert!(bad.contains("unknown field `vlan`"), "{bad}");
    let why: Vec<String> = d
        .unreadable
        .iter()
        .map(|(o, w)| format!("{o}: {w}"))
        .collect();
    assert_eq!(
        why,
        [
            "SpiderIPPool worse: status.allocatedIPs[192.0.2.10].pod `no-namespace` is not namespace/name",
            "SpiderEndpoint web/p: status.current.ips[0].ipv4 `x/24` is not an address",
        ]
    );
}

/// With KubeVirt's static addresses Spiderpool keys a VM's addresses by its
/// VirtualMachineInstance: the pool's record and the SpiderEndpoint name the instance (the VM's
/// name), with the launcher pod's UID; the owner is read as the virtual machine allot keeps the
/// addresses for.
#[test]
fn a_virtual_machines_records_name_the_vm_as_their_owner() {
    let endpoint = object(json!({
        "apiVersion": "spiderpool.spidernet.io/v2beta1",
        "kind": "SpiderEndpoint",
        "metadata": {"name": "db", "namespace": "vms"},
        "status": {
            "current": {"uid": "u-launcher", "node": "node-1", "ips": [{
                "interface": "net1", "ipv4": "192.0.2.30/24", "ipv4Pool": "p",
                "vlan": 0, "cleanGateway": false
            }]},
            "ownerControllerType": "VirtualMachineInstance",
            "ownerControllerName": "db"
        }
    }));
    let d = decode(&Objects {
        pools: vec![pool(
            "p",
            json!({}),
            r#"{"192.0.2.30":{"pod":"vms/db","podUid":"u-launcher"}}"#,
        )],
        endpoints: vec![endpoint],
        ..Objects::default()
    });
    let from_endpoint = d
        .records
        .iter()
        .find(|r| r.source.starts_with("SpiderEndpoint"))
        .unwrap();
    assert_eq!(from_endpoint.name, "db");
    assert_eq!(from_endpoint.uid.as_deref(), Some("u-launcher"));
    assert_eq!(
        from_endpoint.owner,
        Some(Owner {
            kind: allot_core::store::VIRTUAL_MACHINE_KIND.into(),
            name: "db".into()
        })
    );
}
