//! Each reconcile path against kube's mock service (tower-test), in controller-rs's style: the
//! pass's work is decided from an index fed as the watches would feed it, and every request the
//! pass then makes is checked (method, path, body) and answered as the API server would; a
//! request that never comes fails on a timeout, and one nobody expected fails the check that
//! nothing more was asked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use allot_index::{
    CapiClusterObject, FleetIndex, IndexResource, IpamAllocationObject, IpamPoolObject,
};
use allot_test_apiserver::verifier::{ApiServerVerifier, answer, mock_client, refusal};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::events::Reporter;
use serde_json::{Value, json};

use super::reconcile::{Events, Outcome, Reconciler};
use super::wants::{Work, wants};
use super::workload::{Connect, CopySettings, WorkloadCopier, copies};
use crate::lease::Leadership;

const POOLS: &str = "/apis/allot.dev/v1alpha1/ipampools";
const QUIET: Duration = Duration::from_millis(300);

fn allocations(ns: &str) -> String {
    format!("/apis/allot.dev/v1alpha1/namespaces/{ns}/ipamallocations")
}

fn config_maps(ns: &str) -> String {
    format!("/api/v1/namespaces/{ns}/configmaps")
}

fn events(ns: &str) -> String {
    format!("/apis/events.k8s.io/v1/namespaces/{ns}/events")
}

fn hamburg(deprecated: bool) -> Value {
    json!({"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4,
           "excludeRanges": ["10.0.0.1"], "deprecated": deprecated})
}

fn berlin() -> Value {
    json!({"type": "range", "poolCidr": "10.9.0.0/24", "allocationRange": 4})
}

fn range_record(dc: &str, runs: &[&str]) -> Value {
    json!({"type": "range", "dc": dc, "addresses": runs})
}

/// IPAMPool metallb as the API holds it.
fn pool(datacenters: Value, records: Value, version: u64) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMPool",
           "metadata": {"name": "metallb", "uid": "uid-metallb", "resourceVersion": "50"},
           "spec": {"datacenters": datacenters},
           "status": {"allocations": records, "recordVersion": version}})
}

/// IPAMAllocation metallb in `ns`.
fn allocation(ns: &str, cluster: Option<&str>, spec: Value, status: Value) -> Value {
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
fn allocated(version: u64) -> Value {
    json!({"state": "Allocated", "message": "4 addresses from IPAMPool metallb",
           "recordVersion": version, "poolUid": "uid-metallb"})
}

fn cluster(ns: &str, name: &str, dc: Option<&str>) -> Value {
    let labels = match dc {
        Some(dc) => json!({"allot.dev/datacenter": dc}),
        None => json!({}),
    };
    json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
           "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"),
                        "labels": labels, "creationTimestamp": "2026-01-01T00:00:00Z"},
           "spec": {}})
}

fn config_map(ns: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"namespace": ns, "name": "allot-ipam-allocations", "resourceVersion": "30"},
           "data": data})
}

/// Everything listed: the given objects (Clusters `None`: Cluster API not served).
fn index(
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

fn recorder(client: &kube::Client) -> Events {
    Events::new(
        client.clone(),
        Reporter {
            controller: "allot-controller".into(),
            instance: Some("test".into()),
        },
    )
}

fn reconciler(leadership: Leadership) -> (Reconciler, ApiServerVerifier) {
    let (client, verifier) = mock_client("default");
    let recorder = recorder(&client);
    (
        Reconciler::new(client, recorder, leadership, "v1beta1"),
        verifier,
    )
}

/// Runs a pass in the background while the test answers its requests.
fn pass(mut r: Reconciler, work: Work) -> tokio::task::JoinHandle<(Reconciler, Outcome)> {
    tokio::spawn(async move {
        let outcome = r.pass(work).await;
        (r, outcome)
    })
}

/// `body` as the API server returns it after a write.
fn stored(body: &Value, rv: &str) -> Value {
    let mut o = body.clone();
    o["metadata"]["resourceVersion"] = json!(rv);
    o
}

/// The requests of `allocate` once the pool's record is written with `record` (for the
/// cluster in `ns`) at `version`: the IPAMAllocation read, its spec and status replaced from
/// `object`, the ConfigMap key patched.
async fn expect_projection(
    v: &mut ApiServerVerifier,
    ns: &str,
    object: Value,
    record: &Value,
    version: u64,
    data: &str,
) {
    let path = format!("{}/metallb", allocations(ns));
    let (_, send) = v.expect("GET", &path).await;
    answer(send, 200, object.clone());
    let (body, send) = v.expect("PUT", &path).await;
    assert_eq!(body["spec"], *record);
    assert_eq!(
        body["metadata"]["labels"], object["metadata"]["labels"],
        "labels kept"
    );
    answer(send, 200, stored(&body, "21"));
    let (body, send) = v.expect("PUT", &format!("{path}/status")).await;
    assert_eq!(body["status"], allocated(version));
    answer(send, 200, stored(&body, "22"));
    let (body, send) = v
        .expect(
            "PATCH",
            &format!("{}/allot-ipam-allocations", config_maps(ns)),
        )
        .await;
    assert_eq!(body, json!({"data": {"metallb": data}}));
    answer(send, 200, config_map(ns, json!({"metallb": data})));
}

#[tokio::test]
async fn a_new_cluster_gets_its_range_recorded_written_and_projected() {
    let i = index(
        vec![pool(json!({"hamburg": hamburg(false)}), json!({}), 0)],
        vec![],
        Some(vec![cluster("cluster-a", "shop", Some("hamburg"))]),
        vec![],
    );
    let work = wants(&i);
    assert_eq!(work.allocations.len(), 1);
    assert!(work.allocations[0].create_request);
    let (r, mut v) = reconciler(Leadership::always());
    let running = pass(r, work);

    // The IPAMAllocation is created labelled for its Cluster before anything is allocated.
    let (body, send) = v.expect("POST", &allocations("cluster-a")).await;
    assert_eq!(
        body["metadata"]["labels"],
        json!({"cluster.x-k8s.io/cluster-name": "shop"})
    );
    assert_eq!(body["spec"], json!({"dc": "hamburg"}));
    let request = allocation(
        "cluster-a",
        Some("shop"),
        json!({"dc": "hamburg"}),
        Value::Null,
    );
    answer(send, 201, request.clone());
    // allocate: the IPAMAllocation, the pool, the record (compare-and-swap at its version).
    let (_, send) = v
        .expect("GET", &format!("{}/metallb", allocations("cluster-a")))
        .await;
    answer(send, 200, request.clone());
    let (_, send) = v.expect("GET", &format!("{POOLS}/metallb")).await;
    answer(
        send,
        200,
        pool(json!({"hamburg": hamburg(false)}), json!({}), 0),
    );
    let (body, send) = v.expect("PUT", &format!("{POOLS}/metallb/status")).await;
    assert_eq!(body["metadata"]["resourceVersion"], "50");
    let record = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    assert_eq!(body["status"]["allocations"], json!({"cluster-a": record}));
    assert_eq!(body["status"]["recordVersion"], 1);
    answer(send, 200, stored(&body, "51"));
    let (_, send) = v
        .expect("GET", &format!("{}/metallb", allocations("cluster-a")))
        .await;
    answer(send, 200, request.clone());
    let path = format!("{}/metallb", allocations("cluster-a"));
    let (body, send) = v.expect("PUT", &path).await;
    assert_eq!(body["spec"], record);
    answer(send, 200, stored(&body, "21"));
    let (body, send) = v.expect("PUT", &format!("{path}/status")).await;
    assert_eq!(body["status"], allocated(1));
    answer(send, 200, stored(&body, "22"));
    // The ConfigMap does not exist yet: created.
    let cm = format!("{}/allot-ipam-allocations", config_maps("cluster-a"));
    let (_, send) = v.expect("PATCH", &cm).await;
    answer(
        send,
        404,
        refusal(
            404,
            "NotFound",
            "configmaps \"allot-ipam-allocations\" not found",
        ),
    );
    let (body, send) = v.expect("POST", &config_maps("cluster-a")).await;
    assert_eq!(body["data"], json!({"metallb": "10.0.0.2-10.0.0.5"}));
    answer(send, 201, config_map("cluster-a", body["data"].clone()));
    v.expect_nothing(QUIET).await;
    let (_, outcome) = running.await.unwrap();
    assert_eq!(outcome.allocated, 1);
    assert!(!outcome.retry);

    // Once the watches show what was written, there is nothing left to do.
    let i = index(
        vec![pool(
            json!({"hamburg": hamburg(false)}),
            json!({"cluster-a": record}),
            1,
        )],
        vec![allocation(
            "cluster-a",
            Some("shop"),
            record.clone(),
            allocated(1),
        )],
        Some(vec![cluster("cluster-a", "shop", Some("hamburg"))]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    assert!(wants(&i).is_empty());
}

#[tokio::test]
async fn a_deleted_cluster_is_released() {
    let record = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    let held = pool(
        json!({"hamburg": hamburg(false)}),
        json!({"cluster-a": record}),
        1,
    );
    let i = index(
        vec![held.clone()],
        vec![allocation(
            "cluster-a",
            Some("shop"),
            record.clone(),
            allocated(1),
        )],
        // Another Cluster, in a datacenter the pool does not serve.
        Some(vec![cluster("cluster-b", "lab", Some("paris"))]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5", "other": "x"}),
        )],
    );
    let work = wants(&i);
    assert_eq!(work.releases.len(), 1);
    assert!(
        work.releases[0]
            .why
            .contains("no Cluster and no request in namespace cluster-a")
    );
    let (r, mut v) = reconciler(Leadership::always());
    let running = pass(r, work);

    let (_, send) = v.expect("GET", &format!("{POOLS}/metallb")).await;
    answer(send, 200, held);
    let (body, send) = v.expect("PUT", &format!("{POOLS}/metallb/status")).await;
    assert_eq!(
        body["status"].get("allocations"),
        None,
        "the record removed"
    );
    assert_eq!(body["status"]["recordVersion"], 2);
    answer(send, 200, stored(&body, "51"));
    let (_, send) = v
        .expect("DELETE", &format!("{}/metallb", allocations("cluster-a")))
        .await;
    answer(
        send,
        200,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
    );
    let (body, send) = v
        .expect(
            "PATCH",
            &format!("{}/allot-ipam-allocations", config_maps("cluster-a")),
        )
        .await;
    assert_eq!(
        body,
        json!({"data": {"metallb": null}}),
        "only the pool's key"
    );
    answer(send, 200, config_map("cluster-a", json!({"other": "x"})));
    v.expect_nothing(QUIET).await;
    let (_, outcome) = running.await.unwrap();
    assert_eq!(outcome.released, 1);
}

#[tokio::test]
async fn a_cluster_moved_to_another_datacenter_of_the_pool_gets_its_range_there() {
    let both = json!({"hamburg": hamburg(false), "berlin": berlin()});
    let old = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    let object = allocation("cluster-a", Some("shop"), old.clone(), allocated(1));
    let i = index(
        vec![pool(both.clone(), json!({"cluster-a": old}), 1)],
        vec![object.clone()],
        Some(vec![cluster("cluster-a", "shop", Some("berlin"))]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    let work = wants(&i);
    assert!(work.releases.is_empty());
    assert_eq!(work.allocations.len(), 1);
    assert_eq!(work.allocations[0].cluster.datacenter, "berlin");
    assert!(!work.allocations[0].create_request);
    let (r, mut v) = reconciler(Leadership::always());
    let running = pass(r, work);

    let (_, send) = v
        .expect("GET", &format!("{}/metallb", allocations("cluster-a")))
        .await;
    answer(send, 200, object.clone());
    let (_, send) = v.expect("GET", &format!("{POOLS}/metallb")).await;
    answer(send, 200, pool(both.clone(), json!({"cluster-a": old}), 1));
    // One compare-and-swap replaces the hamburg record with one from berlin's CIDR.
    let (body, send) = v.expect("PUT", &format!("{POOLS}/metallb/status")).await;
    let new = range_record("berlin", &["10.9.0.1-10.9.0.4"]);
    assert_eq!(body["status"]["allocations"], json!({"cluster-a": new}));
    answer(send, 200, stored(&body, "51"));
    expect_projection(&mut v, "cluster-a", object, &new, 2, "10.9.0.1-10.9.0.4").await;
    v.expect_nothing(QUIET).await;
    assert_eq!(running.await.unwrap().1.allocated, 1);
}

#[tokio::test]
async fn a_cluster_moved_to_a_datacenter_the_pool_does_not_serve_is_released() {
    let old = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    let i = index(
        vec![pool(
            json!({"hamburg": hamburg(false)}),
            json!({"cluster-a": old}),
            1,
        )],
        vec![allocation("cluster-a", Some("shop"), old, allocated(1))],
        Some(vec![cluster("cluster-a", "shop", Some("paris"))]),
        vec![],
    );
    let work = wants(&i);
    assert!(work.allocations.is_empty());
    assert_eq!(work.releases.len(), 1);
    assert!(
        work.releases[0]
            .why
            .contains("moved from datacenter hamburg to paris, which the pool does not serve"),
        "{}",
        work.releases[0].why
    );
}

#[tokio::test]
async fn a_cluster_whose_datacenter_label_is_removed_keeps_its_range_and_is_told_once() {
    let record = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    let i = index(
        vec![pool(
            json!({"hamburg": hamburg(false)}),
            json!({"cluster-a": record}),
            1,
        )],
        vec![allocation("cluster-a", Some("shop"), record, allocated(1))],
        Some(vec![cluster("cluster-a", "shop", None)]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    let work = wants(&i);
    assert!(
        work.is_empty(),
        "nothing released, nothing allocated: {work:?}"
    );
    // Kept through a full sync too: the cluster still asks, with the datacenter it holds.
    assert_eq!(work.clusters["metallb"][0].datacenter, "hamburg");
    let (r, mut v) = reconciler(Leadership::always());
    let running = pass(r, work.clone());
    let (body, send) = v.expect("POST", &events("cluster-a")).await;
    assert_eq!(body["reason"], "NoDatacenterLabel");
    assert_eq!(body["type"], "Warning");
    assert_eq!(body["regarding"]["kind"], "Cluster");
    assert_eq!(body["regarding"]["apiVersion"], "cluster.x-k8s.io/v1beta1");
    assert_eq!(body["regarding"]["name"], "shop");
    assert!(
        body["note"]
            .as_str()
            .unwrap()
            .contains("no label allot.dev/datacenter")
    );
    answer(send, 201, body);
    v.expect_nothing(QUIET).await;
    let (r, _) = running.await.unwrap();
    // The next pass says nothing again.
    let running = pass(r, work);
    v.expect_nothing(QUIET).await;
    running.await.unwrap();
}

#[tokio::test]
async fn an_explicit_request_is_filled_in() {
    let request = allocation("edge", None, json!({"dc": "hamburg"}), Value::Null);
    let i = index(
        vec![pool(json!({"hamburg": hamburg(false)}), json!({}), 0)],
        vec![request.clone()],
        Some(vec![]),
        vec![config_map("edge", json!({"other": "kept"}))],
    );
    let work = wants(&i);
    assert_eq!(work.allocations.len(), 1);
    assert!(!work.allocations[0].create_request, "the request exists");
    assert_eq!(work.allocations[0].owner, None);
    let (r, mut v) = reconciler(Leadership::always());
    let running = pass(r, work);

    let (_, send) = v
        .expect("GET", &format!("{}/metallb", allocations("edge")))
        .await;
    answer(send, 200, request.clone());
    let (_, send) = v.expect("GET", &format!("{POOLS}/metallb")).await;
    answer(
        send,
        200,
        pool(json!({"hamburg": hamburg(false)}), json!({}), 0),
    );
    let (body, send) = v.expect("PUT", &format!("{POOLS}/metallb/status")).await;
    let record = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    assert_eq!(body["status"]["allocations"], json!({"edge": record}));
    answer(send, 200, stored(&body, "51"));
    expect_projection(&mut v, "edge", request, &record, 1, "10.0.0.2-10.0.0.5").await;
    v.expect_nothing(QUIET).await;
    assert_eq!(running.await.unwrap().1.allocated, 1);
}

#[tokio::test]
async fn a_request_from_another_datacenter_than_its_namespace_is_refused_in_its_status() {
    let first = allocation("edge", None, json!({"dc": "hamburg"}), Value::Null);
    let mut second = allocation("edge", None, json!({"dc": "berlin"}), Value::Null);
    second["metadata"]["name"] = json!("nodes");
    second["metadata"]["creationTimestamp"] = json!("2026-01-02T00:00:00Z");
    let i = index(
        vec![pool(json!({"hamburg": hamburg(false)}), json!({}), 0)],
        vec![first, second],
        Some(vec![]),
        vec![],
    );
    let work = wants(&i);
    assert_eq!(work.refusals.len(), 1);
    let (r, mut v) = reconciler(Leadership::always());
    let running = pass(
        r,
        Work {
            refusals: work.refusals,
            ..Work::default()
        },
    );
    let (body, send) = v
        .expect("PATCH", &format!("{}/nodes/status", allocations("edge")))
        .await;
    assert_eq!(body["status"]["state"], "Refused");
    assert!(
        body["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("namespace edge is one cluster in datacenter hamburg"),
        "{body}"
    );
    let mut refused = allocation(
        "edge",
        None,
        json!({"dc": "berlin"}),
        body["status"].clone(),
    );
    refused["metadata"]["name"] = json!("nodes");
    answer(send, 200, refused);
    v.expect_nothing(QUIET).await;
    assert_eq!(running.await.unwrap().1.refused, 1);
}

#[tokio::test]
async fn a_deprecated_pool_keeps_its_clusters_and_refuses_a_new_one_once() {
    let record = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    let deprecated = pool(
        json!({"hamburg": hamburg(true)}),
        json!({"cluster-a": record}),
        1,
    );
    let clusters = vec![
        cluster("cluster-a", "shop", Some("hamburg")),
        cluster("cluster-b", "lab", Some("hamburg")),
    ];
    let i = index(
        vec![deprecated.clone()],
        vec![allocation(
            "cluster-a",
            Some("shop"),
            record.clone(),
            allocated(1),
        )],
        Some(clusters.clone()),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    let work = wants(&i);
    assert!(work.releases.is_empty());
    assert_eq!(work.allocations.len(), 1, "only the new cluster: {work:?}");
    assert_eq!(work.allocations[0].cluster.namespace, "cluster-b");
    let (r, mut v) = reconciler(Leadership::always());
    let running = pass(r, work);

    let (body, send) = v.expect("POST", &allocations("cluster-b")).await;
    let request = allocation(
        "cluster-b",
        Some("lab"),
        json!({"dc": "hamburg"}),
        Value::Null,
    );
    answer(send, 201, stored(&body, "1"));
    let (_, send) = v
        .expect("GET", &format!("{}/metallb", allocations("cluster-b")))
        .await;
    answer(send, 200, request.clone());
    let (_, send) = v.expect("GET", &format!("{POOLS}/metallb")).await;
    answer(send, 200, deprecated.clone());
    // No record is written: the refusal goes into the IPAMAllocation's status ...
    let (body, send) = v
        .expect(
            "PATCH",
            &format!("{}/metallb/status", allocations("cluster-b")),
        )
        .await;
    let message = "IPAMPool metallb datacenter hamburg is deprecated and serves no new cluster: give the datacenter another IPAMPool, or set deprecated back to false";
    assert_eq!(
        body,
        json!({"status": {"state": "Refused", "message": message}})
    );
    let mut refused = request.clone();
    refused["status"] = body["status"].clone();
    answer(send, 200, refused);
    // ... and into an Event on the Cluster.
    let (body, send) = v.expect("POST", &events("cluster-b")).await;
    assert_eq!(body["reason"], "FleetAllocationRefused");
    assert_eq!(body["regarding"]["name"], "lab");
    assert_eq!(body["note"], message);
    answer(send, 201, body);
    v.expect_nothing(QUIET).await;
    let (_, outcome) = running.await.unwrap();
    assert_eq!(outcome.refused, 1);

    // With the refusal in its status, the cluster is not asked again on every pass.
    let i = index(
        vec![deprecated],
        vec![
            allocation("cluster-a", Some("shop"), record, allocated(1)),
            allocation(
                "cluster-b",
                Some("lab"),
                json!({"dc": "hamburg"}),
                json!({"state": "Refused", "message": message}),
            ),
        ],
        Some(clusters),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    assert!(wants(&i).is_empty());
}

#[tokio::test]
async fn a_replica_that_does_not_lead_writes_nothing() {
    let i = index(
        vec![pool(
            json!({"hamburg": hamburg(false)}),
            json!({"gone": range_record("hamburg", &["10.0.0.6-10.0.0.9"])}),
            1,
        )],
        vec![allocation(
            "edge",
            None,
            json!({"dc": "hamburg"}),
            Value::Null,
        )],
        Some(vec![cluster("cluster-a", "shop", Some("hamburg"))]),
        vec![],
    );
    let work = wants(&i);
    assert!(!work.releases.is_empty() && !work.allocations.is_empty());
    let (r, mut v) = reconciler(Leadership::default());
    let running = pass(r, work);
    v.expect_nothing(QUIET).await;
    let (_, outcome) = running.await.unwrap();
    assert!(outcome.stopped);
    assert_eq!((outcome.allocated, outcome.released), (0, 0));
}

#[tokio::test]
async fn a_pass_stops_at_an_api_failure_and_asks_to_be_retried() {
    let i = index(
        vec![pool(json!({"hamburg": hamburg(false)}), json!({}), 0)],
        vec![
            allocation("a", None, json!({"dc": "hamburg"}), Value::Null),
            allocation("b", None, json!({"dc": "hamburg"}), Value::Null),
        ],
        Some(vec![]),
        vec![],
    );
    let (r, mut v) = reconciler(Leadership::always());
    let running = pass(r, wants(&i));
    let (_, send) = v
        .expect("GET", &format!("{}/metallb", allocations("a")))
        .await;
    answer(
        send,
        503,
        refusal(503, "ServiceUnavailable", "etcd is down"),
    );
    // b is not tried: the API is failing.
    v.expect_nothing(QUIET).await;
    let (_, outcome) = running.await.unwrap();
    assert!(outcome.retry);
    assert_eq!(outcome.allocated, 0);
}

#[tokio::test]
async fn without_cluster_api_the_allocations_made_for_clusters_are_kept() {
    let record = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    let i = index(
        vec![pool(
            json!({"hamburg": hamburg(false)}),
            json!({"cluster-a": record}),
            1,
        )],
        vec![
            allocation("cluster-a", Some("shop"), record.clone(), allocated(1)),
            allocation("edge", None, json!({"dc": "hamburg"}), Value::Null),
        ],
        None,
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    let work = wants(&i);
    assert!(work.releases.is_empty(), "{work:?}");
    // Requests are still served.
    assert_eq!(work.allocations.len(), 1);
    assert_eq!(work.allocations[0].cluster.namespace, "edge");
}

#[tokio::test]
async fn an_unreadable_pool_is_neither_allocated_from_nor_released_into() {
    let mut broken = pool(
        json!({"hamburg": hamburg(false)}),
        json!({"cluster-a": {"type": "range", "dc": "hamburg", "addresses": ["10.0.0.9-banana"]}}),
        1,
    );
    broken["metadata"]["resourceVersion"] = json!("51");
    let i = index(
        vec![broken],
        vec![allocation(
            "edge",
            None,
            json!({"dc": "hamburg"}),
            Value::Null,
        )],
        Some(vec![]),
        vec![],
    );
    let work = wants(&i);
    assert!(work.is_empty(), "{work:?}");
    assert_eq!(work.unreadable.len(), 1);
    assert!(
        work.unreadable[0]
            .1
            .contains("status.allocations.cluster-a"),
        "{:?}",
        work.unreadable
    );
}

// ---------------------------------------------------------------------------------------------
// The workload-cluster copy.

fn kubeconfig_secret(ns: &str, cluster: &str, kubeconfig: &str) -> Value {
    use k8s_openapi::ByteString;
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"namespace": ns, "name": format!("{cluster}-kubeconfig")},
           "data": {"value": ByteString(kubeconfig.as_bytes().to_vec())}})
}

const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: shop\n  cluster:\n    server: https://shop.example:6443\n    certificate-authority-data: Zm9v\ncontexts:\n- name: shop\n  context: {cluster: shop, user: admin}\ncurrent-context: shop\nusers:\n- name: admin\n  user: {token: abc}\n";

/// A copier whose workload clusters are all the second mock.
fn copier(default_on: bool) -> (WorkloadCopier, ApiServerVerifier, ApiServerVerifier) {
    let (client, management) = mock_client("default");
    let (workload_client, workload) = mock_client("default");
    let connect: Connect = Arc::new(move |_| {
        let c = workload_client.clone();
        Box::pin(async move { Ok(c) })
    });
    let settings = CopySettings {
        default_on,
        namespace: "kube-system".into(),
        timeout: Duration::from_secs(5),
        resync: Duration::from_secs(3600),
        cluster_api_version: "v1beta1".into(),
    };
    let recorder = recorder(&client);
    (
        WorkloadCopier::new(client, recorder, Leadership::always(), settings, connect),
        management,
        workload,
    )
}

fn with_annotation(mut c: Value, value: &str) -> Value {
    c["metadata"]["annotations"] = json!({"allot.dev/workload-configmap": value});
    c
}

#[tokio::test]
async fn the_configmap_is_copied_into_the_workload_cluster_and_kept_there() {
    let data = json!({"metallb": "10.0.0.2-10.0.0.5"});
    let i = index(
        vec![],
        vec![],
        Some(vec![
            cluster("cluster-a", "shop", Some("hamburg")),
            with_annotation(cluster("cluster-b", "lab", Some("hamburg")), "false"),
        ]),
        vec![
            config_map("cluster-a", data.clone()),
            config_map("cluster-b", data.clone()),
        ],
    );
    let (targets, notices) = copies(&i, true);
    assert!(notices.is_empty());
    assert_eq!(targets.len(), 1, "lab's annotation turns it off");
    let (mut copier, mut management, mut workload) = copier(true);
    let round = tokio::spawn(async move {
        copier.round(targets, Vec::new()).await;
        copier
    });
    let (_, send) = management
        .expect(
            "GET",
            "/api/v1/namespaces/cluster-a/secrets/shop-kubeconfig",
        )
        .await;
    answer(
        send,
        200,
        kubeconfig_secret("cluster-a", "shop", KUBECONFIG),
    );
    let path = "/api/v1/namespaces/kube-system/configmaps";
    let (_, send) = workload
        .expect("GET", &format!("{path}/allot-ipam-allocations"))
        .await;
    answer(send, 404, refusal(404, "NotFound", "not found"));
    let (body, send) = workload.expect("POST", path).await;
    assert_eq!(body["data"], data);
    assert_eq!(
        body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "allot-controller"
    );
    assert_eq!(
        body["metadata"]["annotations"]["allot.dev/copied-from"],
        "cluster-a/shop"
    );
    answer(send, 201, stored(&body, "1"));
    let (body, send) = management.expect("POST", &events("cluster-a")).await;
    assert_eq!(body["reason"], "WorkloadConfigMapWritten");
    assert_eq!(body["type"], "Normal");
    answer(send, 201, body);
    let mut copier = round.await.unwrap();
    management.expect_nothing(QUIET).await;
    workload.expect_nothing(Duration::from_millis(10)).await;

    // The same data again: nothing to do before the resync.
    let (targets, _) = copies(&i, true);
    copier.round(targets, Vec::new()).await;

    // A grown range: replaced, carrying the resourceVersion read.
    let grown = json!({"metallb": "10.0.0.2-10.0.0.5,10.0.0.9-10.0.0.10"});
    let i = index(
        vec![],
        vec![],
        Some(vec![cluster("cluster-a", "shop", Some("hamburg"))]),
        vec![config_map("cluster-a", grown.clone())],
    );
    let (targets, _) = copies(&i, true);
    let round = tokio::spawn(async move { copier.round(targets, Vec::new()).await });
    let (_, send) = management
        .expect(
            "GET",
            "/api/v1/namespaces/cluster-a/secrets/shop-kubeconfig",
        )
        .await;
    answer(
        send,
        200,
        kubeconfig_secret("cluster-a", "shop", KUBECONFIG),
    );
    let (_, send) = workload
        .expect("GET", &format!("{path}/allot-ipam-allocations"))
        .await;
    let mut existing = config_map("kube-system", data);
    existing["metadata"]["labels"] =
        json!({"app.kubernetes.io/managed-by": "allot-controller", "team": "net"});
    answer(send, 200, existing);
    let (body, send) = workload
        .expect("PUT", &format!("{path}/allot-ipam-allocations"))
        .await;
    assert_eq!(body["metadata"]["resourceVersion"], "30");
    assert_eq!(body["data"], grown);
    assert_eq!(
        body["metadata"]["labels"]["team"], "net",
        "other labels kept"
    );
    answer(send, 200, stored(&body, "31"));
    // A new Event of the same reason, with its own note.
    let (body, send) = management.expect("POST", &events("cluster-a")).await;
    assert!(
        body["note"].as_str().unwrap().ends_with("updated"),
        "{body}"
    );
    answer(send, 201, body);
    round.await.unwrap();
}

#[tokio::test]
async fn a_copy_that_fails_is_an_event_retried_later_and_never_runs_a_kubeconfigs_command() {
    let i = index(
        vec![],
        vec![],
        Some(vec![with_annotation(
            cluster("cluster-a", "shop", Some("hamburg")),
            "true",
        )]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    // Off by default, on by the annotation.
    let (targets, _) = copies(&i, false);
    assert_eq!(targets.len(), 1);
    let (mut copier, mut management, mut workload) = copier(false);
    let round = tokio::spawn(async move {
        let next = copier.round(targets, Vec::new()).await;
        (copier, next)
    });
    let (_, send) = management
        .expect(
            "GET",
            "/api/v1/namespaces/cluster-a/secrets/shop-kubeconfig",
        )
        .await;
    answer(send, 404, refusal(404, "NotFound", "not found"));
    let (body, send) = management.expect("POST", &events("cluster-a")).await;
    assert_eq!(body["reason"], "WorkloadConfigMapFailed");
    assert_eq!(body["type"], "Warning");
    assert!(
        body["note"]
            .as_str()
            .unwrap()
            .contains("no Secret cluster-a/shop-kubeconfig: Cluster API writes it once"),
        "{body}"
    );
    answer(send, 201, body);
    let (mut copier, next) = round.await.unwrap();
    let next = next.expect("a retry is due");
    assert!(next <= tokio::time::Instant::now() + Duration::from_secs(10));
    // Not retried before its time.
    let (targets, _) = copies(&i, false);
    copier.round(targets, Vec::new()).await;
    management.expect_nothing(QUIET).await;

    // A kubeconfig that would run a command: refused before any connection.
    let exec = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://x:6443'}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user:\n    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: ['-c', 'touch /tmp/pwned']}\n";
    let target = copies(&i, false).0.remove(0);
    let copying = tokio::spawn(async move { copier.copy(&target).await });
    let (_, send) = management
        .expect(
            "GET",
            "/api/v1/namespaces/cluster-a/secrets/shop-kubeconfig",
        )
        .await;
    answer(send, 200, kubeconfig_secret("cluster-a", "shop", exec));
    let e = copying.await.unwrap().unwrap_err();
    assert!(e.contains("authenticates by running a command"), "{e}");
    workload.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn an_annotation_that_is_not_true_or_false_copies_nothing_and_says_so() {
    let i = index(
        vec![],
        vec![],
        Some(vec![with_annotation(
            cluster("cluster-a", "shop", Some("hamburg")),
            "yes",
        )]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    let (targets, notices) = copies(&i, true);
    assert!(targets.is_empty());
    assert_eq!(notices.len(), 1);
    assert!(
        notices[0]
            .message
            .contains("is \"yes\": write \"true\" or \"false\"")
    );
    let _ = BTreeMap::<String, String>::new();
}
