//! The controller's fleet index, fed object by object as the watches would feed it.

use allot_index::fleet::{CLUSTER_NAME_LABEL, WORKLOAD_COPY_ANNOTATION};
use allot_index::{
    CapiClusterObject, FleetIndex, FleetKind, IndexResource, IpamAllocationObject, IpamPoolObject,
    Shared, feed,
};
use allot_k8s::openapi::api::core::v1::ConfigMap;
use kube::api::DynamicObject;
use kube::runtime::watcher;
use serde_json::{Value, json};

fn pool(name: &str, spec: Value, status: Value) -> IpamPoolObject {
    IpamPoolObject(
        serde_json::from_value(json!({
            "apiVersion": "allot.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": name, "uid": format!("uid-{name}")},
            "spec": spec, "status": status,
        }))
        .unwrap(),
    )
}

fn metallb() -> IpamPoolObject {
    pool(
        "metallb",
        json!({"datacenters": {"hamburg": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}}),
        json!({"allocations": {"cluster-a": {"type": "range", "dc": "hamburg", "addresses": ["10.0.0.1-10.0.0.4"]}},
               "recordVersion": 3, "clusters": 1}),
    )
}

fn allocation(ns: &str, pool: &str, labels: Value, spec: Value) -> IpamAllocationObject {
    IpamAllocationObject(
        serde_json::from_value(json!({
            "apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
            "metadata": {"namespace": ns, "name": pool, "labels": labels,
                         "creationTimestamp": "2026-01-02T03:04:05Z"},
            "spec": spec,
        }))
        .unwrap(),
    )
}

fn cluster(
    ns: &str,
    name: &str,
    uid: &str,
    labels: Value,
    annotations: Value,
) -> CapiClusterObject {
    CapiClusterObject(
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"namespace": ns, "name": name, "uid": uid, "labels": labels,
                         "annotations": annotations},
            "spec": {"paused": false},
        }))
        .unwrap(),
    )
}

fn config_map(ns: &str, name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"namespace": ns, "name": name}, "data": data}))
        .unwrap()
}

fn listed() -> FleetIndex {
    let mut i = FleetIndex::new("allot.dev/datacenter");
    i.reset(vec![metallb()]);
    i.reset(Vec::<IpamAllocationObject>::new());
    i.reset(Vec::<CapiClusterObject>::new());
    i.reset(Vec::<ConfigMap>::new());
    i
}

#[test]
fn ready_once_every_kind_is_listed() {
    let mut i = FleetIndex::new("allot.dev/datacenter");
    assert!(!i.ready());
    i.reset(vec![metallb()]);
    i.reset(Vec::<IpamAllocationObject>::new());
    i.reset(Vec::<ConfigMap>::new());
    assert_eq!(i.unsynced(), [FleetKind::Cluster]);
    assert!(!i.ready());
    i.reset(Vec::<CapiClusterObject>::new());
    assert!(i.ready());
}

#[test]
fn a_pool_is_kept_with_its_records_and_an_undecodable_one_is_one_refused_pool() {
    let mut i = listed();
    let p = i.pools()["metallb"].as_ref().unwrap();
    assert_eq!(p.uid, "uid-metallb");
    assert_eq!(p.record_version, 3);
    assert_eq!(p.records["cluster-a"].addresses, ["10.0.0.1-10.0.0.4"]);
    assert!(p.spec.datacenters.contains_key("hamburg"));

    i.apply(pool(
        "broken",
        json!({"datacenters": {"x": {"type": "sideways"}}}),
        json!({}),
    ));
    assert!(i.pools()["broken"].is_err());
    assert!(i.pools()["metallb"].is_ok());
    i.delete(pool("broken", json!({}), json!({})));
    assert!(!i.pools().contains_key("broken"));
}

#[test]
fn allocations_keep_their_cluster_label_spec_and_status() {
    let mut i = listed();
    i.apply(allocation(
        "cluster-a",
        "metallb",
        json!({CLUSTER_NAME_LABEL: "shop"}),
        json!({"type": "range", "dc": "hamburg", "addresses": ["10.0.0.1-10.0.0.4"]}),
    ));
    i.apply(allocation(
        "edge",
        "metallb",
        json!({}),
        json!({"dc": "hamburg"}),
    ));
    let a = i.allocations()[&("cluster-a".into(), "metallb".into())]
        .as_ref()
        .unwrap();
    assert_eq!(a.cluster.as_deref(), Some("shop"));
    assert_eq!(a.spec.dc, "hamburg");
    assert!(a.created.is_some());
    let request = i.allocations()[&("edge".into(), "metallb".into())]
        .as_ref()
        .unwrap();
    assert_eq!(request.cluster, None);
    assert_eq!(request.spec.allocation(), Ok(None));
}

#[test]
fn a_cluster_keeps_only_its_datacenter_label_and_the_copy_annotation() {
    let mut i = listed();
    i.apply(cluster(
        "cluster-a",
        "shop",
        "u1",
        json!({"allot.dev/datacenter": "hamburg", "team": "shop"}),
        json!({WORKLOAD_COPY_ANNOTATION: "true", "note": "x"}),
    ));
    i.apply(cluster(
        "cluster-b",
        "lab",
        "u2",
        json!({"allot.dev/datacenter": ""}),
        json!({}),
    ));
    let clusters = i.clusters().unwrap();
    let shop = &clusters[&("cluster-a".into(), "shop".into())];
    assert_eq!(shop.datacenter.as_deref(), Some("hamburg"));
    assert_eq!(shop.workload_copy.as_deref(), Some("true"));
    assert!(!shop.deleting);
    // An empty label names no datacenter.
    assert_eq!(
        clusters[&("cluster-b".into(), "lab".into())].datacenter,
        None
    );

    // Another label, another index: the label is the index's.
    let mut other = FleetIndex::new("topology.example.com/site");
    other.apply(cluster(
        "cluster-a",
        "shop",
        "u1",
        json!({"allot.dev/datacenter": "hamburg", "topology.example.com/site": "berlin"}),
        json!({}),
    ));
    assert_eq!(
        other.clusters().unwrap()[&("cluster-a".into(), "shop".into())]
            .datacenter
            .as_deref(),
        Some("berlin")
    );
}

#[test]
fn a_late_deletion_of_an_earlier_cluster_leaves_the_new_one() {
    let mut i = listed();
    i.apply(cluster(
        "ns",
        "c",
        "new",
        json!({"allot.dev/datacenter": "hamburg"}),
        json!({}),
    ));
    i.delete(cluster("ns", "c", "old", json!({}), json!({})));
    assert_eq!(i.clusters().unwrap().len(), 1);
    i.delete(cluster("ns", "c", "new", json!({}), json!({})));
    assert!(i.clusters().unwrap().is_empty());
}

#[test]
fn only_the_fleet_configmap_is_kept() {
    let mut i = listed();
    i.apply(config_map(
        "cluster-a",
        "allot-ipam-allocations",
        json!({"metallb": "10.0.0.1-10.0.0.4"}),
    ));
    i.apply(config_map(
        "cluster-a",
        "kube-root-ca.crt",
        json!({"ca.crt": "x"}),
    ));
    assert_eq!(
        i.config_map("cluster-a").unwrap()["metallb"],
        "10.0.0.1-10.0.0.4"
    );
    assert!(i.config_map("cluster-b").is_none());
    i.delete(config_map("cluster-a", "kube-root-ca.crt", json!({})));
    assert!(i.config_map("cluster-a").is_some());
    i.delete(config_map("cluster-a", "allot-ipam-allocations", json!({})));
    assert!(i.config_map("cluster-a").is_none());
}

#[test]
fn the_generation_moves_only_with_what_is_kept() {
    let mut i = listed();
    let g = i.generation();
    // The same pool again (a relist, a resync): no change.
    i.reset(vec![metallb()]);
    i.apply(metallb());
    assert_eq!(i.generation(), g);
    // A Cluster's unrelated label: no change either.
    i.apply(cluster(
        "ns",
        "c",
        "u",
        json!({"allot.dev/datacenter": "hamburg"}),
        json!({}),
    ));
    let g = i.generation();
    i.apply(cluster(
        "ns",
        "c",
        "u",
        json!({"allot.dev/datacenter": "hamburg", "team": "x"}),
        json!({}),
    ));
    assert_eq!(i.generation(), g);
    // Its datacenter: a change.
    i.apply(cluster(
        "ns",
        "c",
        "u",
        json!({"allot.dev/datacenter": "berlin"}),
        json!({}),
    ));
    assert_ne!(i.generation(), g);
    // A record: a change.
    let g = i.generation();
    i.apply(pool(
        "metallb",
        json!({"datacenters": {"hamburg": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4}}}),
        json!({"recordVersion": 4}),
    ));
    assert_ne!(i.generation(), g);
}

#[test]
fn cluster_api_not_served_lists_no_clusters_until_it_is() {
    let mut i = FleetIndex::new("allot.dev/datacenter");
    i.clusters_absent();
    assert!(i.clusters().is_none());
    assert!(!i.unsynced().contains(&FleetKind::Cluster));
    let g = i.generation();
    // Retried and still absent: no change.
    i.clusters_absent();
    assert_eq!(i.generation(), g);
    // An event from a watch that was closing is ignored; the list that follows counts.
    i.apply(cluster(
        "ns",
        "c",
        "u",
        json!({"allot.dev/datacenter": "hamburg"}),
        json!({}),
    ));
    assert!(i.clusters().is_none());
    i.reset(vec![cluster(
        "ns",
        "c",
        "u",
        json!({"allot.dev/datacenter": "hamburg"}),
        json!({}),
    )]);
    assert_eq!(i.clusters().unwrap().len(), 1);
    assert_ne!(i.generation(), g);
}

#[tokio::test]
async fn fed_from_a_watch_stream() {
    let index = Shared::of(FleetIndex::new("allot.dev/datacenter"));
    let event =
        |o: Value| watcher::Event::InitApply(serde_json::from_value::<DynamicObject>(o).unwrap());
    let stream = futures::stream::iter(vec![
        Ok(watcher::Event::Init),
        Ok(event(
            json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"namespace": "a", "name": "a", "uid": "a", "labels": {"allot.dev/datacenter": "hamburg"}}}),
        )),
        Ok(watcher::Event::InitDone),
    ]);
    feed(index.clone(), stream, CapiClusterObject).await;
    let i = index.read();
    assert_eq!(i.clusters().unwrap().len(), 1);
    assert!(i.unsynced().contains(&FleetKind::IpamPool));
}
