//! Pool lifecycle: status counts derived from the claims, and the finalizer that keeps a
//! deleted pool until its claims are released. Against a real kube-apiserver (upstream etcd
//! and kube-apiserver on 127.0.0.1) with the controller's own watches, and each write against
//! kube's mock service.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use allot_controller::lease::Leadership;
use allot_controller::metrics::Metrics;
use allot_controller::pools::{FINALIZER, PoolLifecycle};
use allot_controller::run::watch;
use allot_core::store::{MemoryStore, Store};
use allot_index::{ClusterIndex, IndexResource, PoolObject, Shared};
use allot_lab::LoopbackControlPlane;
use allot_test_apiserver::verifier::{answer, mock_client};
use serde_json::{Value, json};

async fn until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The user the lifecycle's requests are made as.
const USER: &str = "allot-controller";
const ALLOT: &str = "allot.dev/v1alpha1";

struct Setup {
    server: LoopbackControlPlane,
    store: Arc<MemoryStore>,
    index: Arc<Shared<ClusterIndex>>,
    lifecycle: PoolLifecycle,
    metrics: Arc<Metrics>,
}

async fn setup(test: &str, leadership: Leadership) -> Option<Setup> {
    let server = real_api(test)?;
    server
        .create(
            "ippools",
            pool_json("p", "10.0.0.0/24", &["10.0.0.10-10.0.0.19"]),
        )
        .unwrap();
    server
        .create(
            "ippools",
            pool_json("q", "10.0.0.0/24", &["10.0.0.30-10.0.0.39"]),
        )
        .unwrap();
    server
        .create(
            "subnets",
            json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Subnet", "metadata": {"name": "s"},
                   "spec": {"subnet": "10.0.0.0/24", "gateway": "10.0.0.1"}}),
        )
        .unwrap();
    let store = Arc::new(MemoryStore::new());
    store
        .claim(&[
            claim("10.0.0.10", "web", "a", "ua", T0),
            claim("10.0.0.11", "web", "b", "ub", T0),
        ])
        .unwrap();
    let client = client_as(&server, USER).await;
    let index = Shared::of(ClusterIndex::new());
    watch(&index, &client, false);
    let _ = index
        .wait_for(Duration::from_secs(10), |i| {
            i.ready_for_pools().then_some(())
        })
        .await;
    let metrics = Arc::new(Metrics::new());
    let lifecycle = PoolLifecycle::new(
        client,
        store.clone(),
        index.clone(),
        leadership,
        metrics.clone(),
    );
    Some(Setup {
        server,
        store,
        index,
        lifecycle,
        metrics,
    })
}

fn object(server: &LoopbackControlPlane, plural: &str, name: &str) -> Option<Value> {
    server.get(ALLOT, plural, None, name).unwrap()
}

/// The lifecycle's patches of `plural`, the objects and their status.
fn patches(server: &LoopbackControlPlane, plural: &str) -> usize {
    let resource = format!("allot.dev/{plural}");
    requests(server, USER, "patch", &resource)
        + requests(server, USER, "patch", &format!("{resource}/status"))
}

fn status(server: &LoopbackControlPlane, plural: &str, name: &str) -> (Value, Value) {
    let o = object(server, plural, name).unwrap();
    (
        o["status"]["allocatedIPCount"].clone(),
        o["status"]["totalIPCount"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_are_derived_from_the_claims_and_written_only_when_they_change() {
    let Some(mut s) = setup(
        "status_counts_are_derived_from_the_claims_and_written_only_when_they_change",
        Leadership::always(),
    )
    .await
    else {
        return;
    };
    let round = s.lifecycle.round().await.unwrap();
    assert_eq!(round.status_written, vec!["p", "q", "s"]);
    assert_eq!(status(&s.server, "ippools", "p"), (json!(2), json!(10)));
    assert_eq!(status(&s.server, "ippools", "q"), (json!(0), json!(10)));
    // The Subnet: 20 of its 253 addresses (a /24 without network, broadcast and gateway) are
    // handed to its pools.
    assert_eq!(status(&s.server, "subnets", "s"), (json!(20), json!(253)));
    let metrics = s.metrics.encode();
    assert!(
        metrics.contains("allot_pool_allocated_addresses{pool=\"p\"} 2"),
        "{metrics}"
    );

    // Once the watch has delivered what was written, nothing changed: nothing is written.
    until("the watch delivers the status", || {
        s.index.read().allot_objects().all(|e| e.status.0.is_some())
    })
    .await;
    let writes = patches(&s.server, "ippools");
    let round = s.lifecycle.round().await.unwrap();
    assert!(round.status_written.is_empty(), "{round:?}");
    // A claim released: p's count follows.
    let held = s.store.claims_of_pod("web", "b").unwrap();
    s.store
        .release_attachment(held[0].attachment.as_ref().unwrap())
        .unwrap();
    let round = s.lifecycle.round().await.unwrap();
    assert_eq!(round.status_written, vec!["p"]);
    assert_eq!(status(&s.server, "ippools", "p"), (json!(1), json!(10)));
    assert!(patches(&s.server, "ippools") > writes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pool_stays_until_no_claim_holds_its_addresses() {
    let Some(mut s) = setup(
        "a_deleted_pool_stays_until_no_claim_holds_its_addresses",
        Leadership::always(),
    )
    .await
    else {
        return;
    };
    let round = s.lifecycle.round().await.unwrap();
    assert_eq!(round.finalizers_added, vec!["p", "q"]);
    let p = object(&s.server, "ippools", "p").unwrap();
    assert_eq!(p["metadata"]["finalizers"], json!([FINALIZER]));
    until("the watch delivers the finalizers", || {
        s.index
            .read()
            .allot_objects()
            .filter(|e| e.observed.kind == allot_core::config::ObjectKind::IpPool)
            .all(|e| !e.finalizers.is_empty())
    })
    .await;

    // kubectl delete: p holds two claims, q none.
    s.server.delete(ALLOT, "ippools", None, "p").unwrap();
    s.server.delete(ALLOT, "ippools", None, "q").unwrap();
    until("the watch sees p terminating and q gone", || {
        let i = s.index.read();
        i.allot_objects()
            .any(|e| e.observed.name == "p" && e.deleting)
            && i.allot_objects()
                .any(|e| e.observed.name == "q" && e.deleting)
    })
    .await;
    let round = s.lifecycle.round().await.unwrap();
    assert_eq!(round.finalizers_removed, vec!["q"], "q held nothing");
    assert!(object(&s.server, "ippools", "q").is_none(), "q is gone");
    let p = object(&s.server, "ippools", "p").expect("p stays while it holds claims");
    assert!(p["metadata"]["deletionTimestamp"].is_string());

    // Its pods release their addresses (a terminating pool still releases).
    for pod in ["a", "b"] {
        let held = s.store.claims_of_pod("web", pod).unwrap();
        s.store
            .release_attachment(held[0].attachment.as_ref().unwrap())
            .unwrap();
    }
    let round = s.lifecycle.round().await.unwrap();
    assert_eq!(round.finalizers_removed, vec!["p"]);
    assert!(object(&s.server, "ippools", "p").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_does_not_lead_writes_nothing() {
    let Some(mut s) = setup(
        "a_replica_that_does_not_lead_writes_nothing",
        Leadership::default(),
    )
    .await
    else {
        return;
    };
    let round = s.lifecycle.round().await.unwrap();
    assert_eq!(round, Default::default());
    assert_eq!(patches(&s.server, "ippools"), 0);
    assert_eq!(patches(&s.server, "subnets"), 0);
}

const POOLS: &str = "/apis/allot.dev/v1alpha1/ippools";

/// Each write against the mock: the finalizer added with the resourceVersion read, then the
/// status patch of the status subresource, and the finalizer of a deleted, empty pool removed
/// keeping the other finalizers.
#[tokio::test]
async fn each_write_is_the_request_it_should_be() {
    let (client, mut api) = mock_client("default");
    let store = Arc::new(MemoryStore::new());
    store
        .claim(&[claim("10.0.0.10", "web", "a", "ua", T0)])
        .unwrap();
    let mut index = ClusterIndex::new();
    let mut live = pool_json("p", "10.0.0.0/24", &["10.0.0.10-10.0.0.19"]);
    live["metadata"]["resourceVersion"] = json!("41");
    let mut gone = pool_json("r", "10.0.1.0/24", &[]);
    gone["metadata"]["resourceVersion"] = json!("7");
    gone["metadata"]["deletionTimestamp"] = json!(rfc3339(T0));
    gone["metadata"]["finalizers"] = json!(["example.com/backup", FINALIZER]);
    gone["status"] = json!({"allocatedIPCount": 0, "totalIPCount": 254});
    IndexResource::<PoolObject>::reset(
        &mut index,
        vec![PoolObject(dynamic(live)), PoolObject(dynamic(gone))],
    );
    IndexResource::<allot_index::SubnetObject>::reset(&mut index, vec![]);
    IndexResource::<allot_index::ReservedObject>::reset(&mut index, vec![]);
    let mut lifecycle = PoolLifecycle::new(
        client,
        store,
        Shared::of(index),
        Leadership::always(),
        Arc::new(Metrics::new()),
    );
    let round = tokio::spawn(async move { lifecycle.round().await.unwrap() });

    let (body, send) = api.expect("PATCH", &format!("{POOLS}/p")).await;
    assert_eq!(
        body,
        json!({"metadata": {"resourceVersion": "41", "finalizers": [FINALIZER]}})
    );
    answer(send, 200, pool_json("p", "10.0.0.0/24", &[]));
    let (body, send) = api.expect("PATCH", &format!("{POOLS}/p/status")).await;
    assert_eq!(
        body,
        json!({"status": {"allocatedIPCount": 1, "totalIPCount": 10}})
    );
    answer(
        send,
        200,
        pool_json("p", "10.0.0.0/24", &["10.0.0.10-10.0.0.19"]),
    );
    // r's status is already right: only its finalizer goes, the other one stays.
    let (body, send) = api.expect("PATCH", &format!("{POOLS}/r")).await;
    assert_eq!(
        body,
        json!({"metadata": {"resourceVersion": "7", "finalizers": ["example.com/backup"]}})
    );
    answer(send, 200, pool_json("r", "10.0.1.0/24", &[]));
    api.expect_nothing(Duration::from_millis(200)).await;
    let round = round.await.unwrap();
    assert_eq!(round.status_written, vec!["p"]);
    assert_eq!(round.finalizers_added, vec!["p"]);
    assert_eq!(round.finalizers_removed, vec!["r"]);
}
