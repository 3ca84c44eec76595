//! Each reconcile path against kube's mock service (tower-test), in controller-rs's style: the
//! pass's work is decided from an index fed as the watches would feed it, and every request the
//! pass then makes is checked (method, path, body) and answered as the API server would; a
//! request that never comes fails on a timeout, and one nobody expected fails the check that
//! nothing more was asked.

use allot_test_apiserver::verifier::{ApiServerVerifier, answer, refusal};
use serde_json::{Value, json};

use super::fixtures::*;
use super::wants::{Work, wants};
use crate::lease::Leadership;

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
    expect_listed(&mut v, vec![request.clone()]).await;
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
    let labelled = allocation("cluster-a", Some("shop"), record.clone(), allocated(1));
    let i = index(
        vec![held.clone()],
        vec![labelled.clone()],
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
    let running = pass(r, work.clone());

    // Read fresh first: no Cluster in the namespace, and its IPAMAllocation is the Cluster's.
    let (_, send) = v.expect("GET", CLUSTERS_A).await;
    answer(send, 200, no_clusters());
    let path = format!("{}/metallb", allocations("cluster-a"));
    let (_, send) = v.expect("GET", &path).await;
    answer(send, 200, labelled.clone());
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
    let (r, outcome) = running.await.unwrap();
    assert_eq!(outcome.released, 1);

    // Had the Cluster's watch been behind (the Cluster exists when read fresh), nothing goes.
    let running = pass(r, work.clone());
    let (_, send) = v.expect("GET", CLUSTERS_A).await;
    let mut listed = no_clusters();
    listed["items"] = json!([{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"namespace": "cluster-a", "name": "shop"}}]);
    answer(send, 200, listed);
    v.expect_nothing(QUIET).await;
    let (r, outcome) = running.await.unwrap();
    assert_eq!(outcome.released, 0);
    // Nor had a request been created meanwhile.
    let running = pass(r, work);
    let (_, send) = v.expect("GET", CLUSTERS_A).await;
    answer(send, 200, no_clusters());
    let (_, send) = v.expect("GET", &path).await;
    answer(
        send,
        200,
        allocation("cluster-a", None, json!({"dc": "hamburg"}), Value::Null),
    );
    v.expect_nothing(QUIET).await;
    assert_eq!(running.await.unwrap().1.released, 0);
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
    expect_listed(&mut v, vec![object.clone()]).await;
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
    expect_listed(&mut v, vec![request.clone()]).await;
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

/// A refusal is decided, as `allocate` decides it, against every allocation holding addresses,
/// recorded or not: with it in the status, the cluster is left alone on the next pass.
#[test]
fn a_refusal_that_counts_an_unrecorded_allocation_is_not_repeated() {
    let small = json!({"type": "range", "poolCidr": "10.0.0.0/29", "allocationRange": 4});
    let record = range_record("hamburg", &["10.0.0.1-10.0.0.4"]);
    let message = "IPAMPool metallb datacenter hamburg: cluster cluster-b: poolCidr 10.0.0.0/29 has 0 free addresses, the cluster needs 4 more: widen the pool with another IPAMPool, or release clusters";
    let i = index(
        vec![pool(
            json!({"hamburg": small}),
            json!({"cluster-a": record}),
            1,
        )],
        vec![
            allocation("cluster-a", Some("shop"), record.clone(), allocated(1)),
            // Made by another tool, in a namespace of its own: the pool has no record of it.
            allocation(
                "edge",
                None,
                range_record("hamburg", &["10.0.0.5-10.0.0.6"]),
                Value::Null,
            ),
            allocation(
                "cluster-b",
                Some("lab"),
                json!({"dc": "hamburg"}),
                json!({"state": "Refused", "message": message}),
            ),
        ],
        Some(vec![
            cluster("cluster-a", "shop", Some("hamburg")),
            cluster("cluster-b", "lab", Some("hamburg")),
        ]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.1-10.0.0.4"}),
        )],
    );
    let work = wants(&i);
    // Only edge's is adopted; cluster-b is refused as its status says.
    assert_eq!(work.allocations.len(), 1, "{work:?}");
    assert_eq!(work.allocations[0].cluster.namespace, "edge");
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

#[tokio::test]
async fn an_allocation_made_before_allot_is_adopted_and_labelled_for_its_cluster() {
    // Made by another allocator (unlabelled, no record), in the namespace of a Cluster.
    let held = range_record("hamburg", &["10.0.0.200-10.0.0.203"]);
    let migrated = allocation("cluster-a", None, held.clone(), Value::Null);
    let i = index(
        vec![pool(json!({"hamburg": hamburg(false)}), json!({}), 0)],
        vec![migrated.clone()],
        Some(vec![cluster("cluster-a", "shop", Some("hamburg"))]),
        vec![],
    );
    let work = wants(&i);
    assert_eq!(work.allocations.len(), 1);
    assert!(!work.allocations[0].create_request);
    let (r, mut v) = reconciler(Leadership::always());
    let running = pass(r, work);

    let path = format!("{}/metallb", allocations("cluster-a"));
    let (_, send) = v.expect("GET", &path).await;
    answer(send, 200, migrated.clone());
    let (_, send) = v.expect("GET", &format!("{POOLS}/metallb")).await;
    answer(
        send,
        200,
        pool(json!({"hamburg": hamburg(false)}), json!({}), 0),
    );
    expect_listed(&mut v, vec![migrated.clone()]).await;
    let (body, send) = v.expect("PUT", &format!("{POOLS}/metallb/status")).await;
    assert_eq!(
        body["status"]["allocations"],
        json!({"cluster-a": held}),
        "kept as it was"
    );
    answer(send, 200, stored(&body, "51"));
    // The spec is already the record: only the status is written.
    let (_, send) = v.expect("GET", &path).await;
    answer(send, 200, migrated.clone());
    let (body, send) = v.expect("PUT", &format!("{path}/status")).await;
    assert_eq!(body["status"], allocated(1));
    answer(send, 200, stored(&body, "21"));
    let (_, send) = v
        .expect(
            "PATCH",
            &format!("{}/allot-ipam-allocations", config_maps("cluster-a")),
        )
        .await;
    answer(
        send,
        200,
        config_map("cluster-a", json!({"metallb": "10.0.0.200-10.0.0.203"})),
    );
    // Then it is labelled: it goes with its Cluster from now on.
    let (body, send) = v.expect("PATCH", &path).await;
    assert_eq!(
        body,
        json!({"metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "shop"}}})
    );
    let mut labelled = migrated;
    labelled["metadata"]["labels"] = json!({"cluster.x-k8s.io/cluster-name": "shop"});
    answer(send, 200, labelled);
    v.expect_nothing(QUIET).await;
    assert_eq!(running.await.unwrap().1.allocated, 1);
}

#[test]
fn of_two_clusters_in_one_namespace_the_one_holding_its_allocations_is_served() {
    let record = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    let mut older = cluster("cluster-a", "older", Some("hamburg"));
    older["metadata"]["creationTimestamp"] = json!("2025-01-01T00:00:00Z");
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
        Some(vec![cluster("cluster-a", "shop", Some("hamburg")), older]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    let work = wants(&i);
    assert!(
        work.releases.is_empty() && work.allocations.is_empty(),
        "{work:?}"
    );
    assert_eq!(work.notices.len(), 1);
    assert_eq!(work.notices[0].cluster.name, "older");
    assert_eq!(work.notices[0].reason, "NamespaceShared");
    assert!(
        work.notices[0]
            .message
            .starts_with("namespace cluster-a is Cluster shop's")
    );
}

#[test]
fn a_cluster_being_deleted_keeps_its_range_until_it_is_gone() {
    let record = range_record("hamburg", &["10.0.0.2-10.0.0.5"]);
    let mut deleting = cluster("cluster-a", "shop", Some("hamburg"));
    deleting["metadata"]["deletionTimestamp"] = json!("2026-02-01T00:00:00Z");
    deleting["metadata"]["finalizers"] = json!(["cluster.cluster.x-k8s.io"]);
    let i = index(
        vec![pool(
            json!({"hamburg": hamburg(false)}),
            json!({"cluster-a": record}),
            1,
        )],
        vec![allocation("cluster-a", Some("shop"), record, allocated(1))],
        Some(vec![deleting]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    let work = wants(&i);
    assert!(work.is_empty() && work.notices.is_empty(), "{work:?}");
}
