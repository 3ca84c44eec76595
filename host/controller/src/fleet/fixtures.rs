//! Fixtures of the fleet's mock tests: objects as the API holds them, an index fed with them,
//! a reconciler over kube's mock service.

use allot_index::{
    CapiClusterObject, FleetIndex, IndexResource, IpamAllocationObject, IpamPoolObject,
};
use allot_k8s::openapi::api::core::v1::ConfigMap;
use allot_test_apiserver::verifier::{ApiServerVerifier, answer, mock_client};
use serde_json::{Value, json};
use std::time::Duration;

use super::reconcile::{Events, Outcome, Reconciler};
use super::wants::Work;
use crate::lease::Leadership;

pub(super) const POOLS: &str = "/apis/allot.dev/v1alpha1/ipampools";
/// The list of Clusters in namespace cluster-a, as metadata.
pub(super) const CLUSTERS_A: &str = "/apis/cluster.x-k8s.io/v1beta1/namespaces/cluster-a/clusters";

pub(super) fn no_clusters() -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
           "metadata": {"resourceVersion": "9"}, "items": []})
}

pub(super) const QUIET: Duration = Duration::from_millis(300);

pub(super) fn allocations(ns: &str) -> String {
    format!("/apis/allot.dev/v1alpha1/namespaces/{ns}/ipamallocations")
}

pub(super) fn config_maps(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/configmaps")
}

pub(super) fn events(ns: &str) -> String {
    format!("/apis/events.k8s.io/v1/namespaces/{ns}/events")
}

pub(super) fn hamburg(deprecated: bool) -> Value {
    json!({"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4,
           "excludeRanges": ["10.0.0.1"], "deprecated": deprecated})
}

pub(super) fn berlin() -> Value {
    json!({"type": "range", "poolCidr": "10.9.0.0/24", "allocationRange": 4})
}

pub(super) fn range_record(dc: &str, runs: &[&str]) -> Value {
    json!({"type": "range", "dc": dc, "addresses": runs})
}

/// IPAMPool metallb as the API holds it.
pub(super) fn pool(datacenters: Value, records: Value, version: u64) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMPool",
           "metadata": {"name": "metallb", "uid": "uid-metallb", "resourceVersion": "50"},
           "spec": {"datacenters": datacenters},
           "status": {"allocations": records, "recordVersion": version}})
}

/// IPAMAllocation metallb in `ns`.
pub(super) fn allocation(ns: &str, cluster: Option<&str>, spec: Value, status: Value) -> Value {
    let labels = match cluster {
        Some(c) => json!({"cluster.x-k8s.io/cluster-name": c}),
        None => json!({}),
    };
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
           "metadata": {"name": "metallb", "namespace": ns, "uid": format!("uid-{ns}"),
                        "resourceVersion": "20", "labels": labels,
                        "creationTimestamp": "2026-01-01T00:00:00Z"},
           "spec": spec, "status": status})
}

/// The status `allocate` writes for record version `version`.
pub(super) fn allocated(version: u64) -> Value {
    json!({"state": "Allocated", "message": "4 addresses from IPAMPool metallb",
           "recordVersion": version, "poolUid": "uid-metallb"})
}

pub(super) fn cluster(ns: &str, name: &str, dc: Option<&str>) -> Value {
    let labels = match dc {
        Some(dc) => json!({"allot.dev/datacenter": dc}),
        None => json!({}),
    };
    json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
           "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"),
                        "labels": labels, "creationTimestamp": "2026-01-01T00:00:00Z"},
           "spec": {}})
}

pub(super) fn config_map(ns: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"namespace": ns, "name": "allot-ipam-allocations", "resourceVersion": "30"},
           "data": data})
}

/// Everything listed: the given objects (Clusters `None`: Cluster API not served).
pub(super) fn index(
    pools: Vec<Value>,
    objects: Vec<Value>,
    clusters: Option<Vec<Value>>,
    maps: Vec<Value>,
) -> FleetIndex {
    let dynamic = |v: Value| serde_json::from_value(v).unwrap();
    let mut i = FleetIndex::new("allot.dev/datacenter");
    i.reset(
        pools
            .into_iter()
            .map(|p| IpamPoolObject(dynamic(p)))
            .collect::<Vec<_>>(),
    );
    i.reset(
        objects
            .into_iter()
            .map(|o| IpamAllocationObject(dynamic(o)))
            .collect::<Vec<_>>(),
    );
    match clusters {
        Some(cs) => i.reset(
            cs.into_iter()
                .map(|c| CapiClusterObject(dynamic(c)))
                .collect::<Vec<_>>(),
        ),
        None => i.clusters_absent(),
    }
    i.reset(
        maps.into_iter()
            .map(|m| serde_json::from_value(m).unwrap())
            .collect::<Vec<ConfigMap>>(),
    );
    assert!(i.ready());
    i
}

pub(super) fn recorder(client: &kube::Client) -> Events {
    crate::events::Events::new(client.clone(), "test")
}

pub(super) fn reconciler(leadership: Leadership) -> (Reconciler, ApiServerVerifier) {
    let (client, verifier) = mock_client("default");
    let recorder = recorder(&client);
    (
        Reconciler::new(client, recorder, leadership, "v1beta1"),
        verifier,
    )
}

/// Runs a pass in the background while the test answers its requests.
pub(super) fn pass(
    mut r: Reconciler,
    work: Work,
) -> tokio::task::JoinHandle<(Reconciler, Outcome)> {
    tokio::spawn(async move {
        let outcome = r.pass(work).await;
        (r, outcome)
    })
}

/// `allocate` listing the pool's IPAMAllocations (a new, grown or adopted allocation is decided
/// against every one that holds addresses), answered with `items`.
pub(super) async fn expect_listed(v: &mut ApiServerVerifier, items: Vec<Value>) {
    let (method, uri, _, send) = v.next().await.expect("the list of IPAMAllocations");
    assert_eq!(method, "GET");
    assert!(
        uri.starts_with("/apis/allot.dev/v1alpha1/ipamallocations?")
            && uri.contains("fieldSelector=metadata.name%3Dmetallb"),
        "{uri}"
    );
    answer(
        send,
        200,
        json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocationList",
               "metadata": {"resourceVersion": "60"}, "items": items}),
    );
}

/// `body` as the API server returns it after a write.
pub(super) fn stored(body: &Value, rv: &str) -> Value {
    let mut o = body.clone();
    o["metadata"]["resourceVersion"] = json!(rv);
    o
}
