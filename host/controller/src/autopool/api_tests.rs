//! Each reconcile path against kube's mock service (tower-test), in controller-rs's style:
//! every request the pass makes is checked (method, path, body) and answered as the API server
//! would; a request that never comes fails on a timeout, and a request nobody expected fails
//! the check that the pass made no more.

use std::sync::Arc;
use std::time::Duration;

use allot_core::IpFamily;
use allot_core::autopool::pool_name;
use allot_core::policy::Application;
use allot_core::store::{MemoryStore, Store};
use allot_index::{IndexResource, PoolObject, ReservedObject, SubnetObject, WorkloadIndex};
use allot_k8s::openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use allot_k8s::openapi::api::batch::v1::{CronJob, Job};
use allot_store::contract::{attachment, claim, pod};
use allot_test_apiserver::verifier::{ApiServerVerifier, answer, mock_client, refusal};
use kube::api::DynamicObject;
use serde_json::{Value, json};

use super::reconcile::{Outcome, Reconciler, Snapshot};
use crate::lease::Leadership;

const POOLS: &str = "/apis/allot.dev/v1alpha1/ippools";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team-a/events";

fn status(code: u16, reason: &str) -> Value {
    refusal(code, reason, &format!("injected {reason}"))
}

fn web() -> Application {
    Application {
        kind: "Deployment".into(),
        namespace: "team-a".into(),
        name: "web".into(),
    }
}

fn web_pool() -> String {
    pool_name(&web(), "subnet-a", IpFamily::V4)
}

fn deployment(replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"namespace": "team-a", "name": "web", "uid": "uid-web"},
        "spec": {"replicas": replicas, "selector": {}, "template": {
            "metadata": {"annotations": {"ipam.allot.dev/subnet": "{\"ipv4\":[\"subnet-a\"]}"}},
            "spec": {"containers": []}}},
    }))
    .unwrap()
}

fn dynamic(kind: &str, name: &str, labels: Value, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "allot.dev/v1alpha1", "kind": kind,
        "metadata": {"name": name, "resourceVersion": "7", "uid": name, "labels": labels},
        "spec": spec,
    }))
    .unwrap()
}

/// Web's auto pool as the controller wrote it, holding `ips`.
fn stored_pool(ips: &[&str], reclaim: &str) -> DynamicObject {
    dynamic(
        "IPPool",
        &web_pool(),
        json!({"ipam.allot.dev/owner-subnet": "subnet-a",
               "ipam.allot.dev/owner-application-kind": "Deployment",
               "ipam.allot.dev/owner-application-namespace": "team-a",
               "ipam.allot.dev/owner-application-name": "web",
               "app.kubernetes.io/managed-by": "allot-controller",
               "ipam.allot.dev/ippool-reclaim": reclaim}),
        json!({"ipVersion": 4, "subnet": "10.10.0.0/24", "ips": ips, "gateway": "10.10.0.1"}),
    )
}

/// Everything listed: Subnet subnet-a (10.10.0.10-10.10.0.29, gateway .1), the given
/// Deployment and pools.
fn index(deployment: Option<Deployment>, pools: Vec<DynamicObject>) -> WorkloadIndex {
    let mut i = WorkloadIndex::new();
    i.reset(deployment.into_iter().collect::<Vec<_>>());
    i.reset(Vec::<StatefulSet>::new());
    i.reset(Vec::<ReplicaSet>::new());
    i.reset(Vec::<Job>::new());
    i.reset(Vec::<DaemonSet>::new());
    i.reset(Vec::<CronJob>::new());
    i.reset(pools.into_iter().map(PoolObject).collect::<Vec<_>>());
    i.reset(vec![SubnetObject(dynamic(
        "Subnet",
        "subnet-a",
        json!({}),
        json!({"subnet": "10.10.0.0/24", "ips": ["10.10.0.10-10.10.0.29"], "gateway": "10.10.0.1"}),
    ))]);
    i.reset(Vec::<ReservedObject>::new());
    i
}

fn reconciler(leadership: Leadership, store: Arc<dyn Store>) -> (Reconciler, ApiServerVerifier) {
    let (client, verifier) = mock_client("default");
    let recorder = crate::events::Events::new(client.clone(), "test");
    (
        Reconciler::new(client, recorder, leadership, store),
        verifier,
    )
}

fn empty_store() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new())
}

/// Runs a pass in the background while the test answers its requests.
fn pass(
    mut reconciler: Reconciler,
    index: &WorkloadIndex,
) -> tokio::task::JoinHandle<(Reconciler, Outcome)> {
    let snapshot = Snapshot::of(index);
    tokio::spawn(async move {
        let outcome = reconciler.pass(snapshot).await;
        (reconciler, outcome)
    })
}

/// The pool a create or patch asked for, as the API server would return it.
fn written(body: &Value, rv: &str) -> Value {
    let mut pool = body.clone();
    pool["apiVersion"] = json!("allot.dev/v1alpha1");
    pool["kind"] = json!("IPPool");
    pool["metadata"]["name"] = json!(web_pool());
    pool["metadata"]["resourceVersion"] = json!(rv);
    if pool["spec"]["subnet"].is_null() {
        pool["spec"]["subnet"] = json!("10.10.0.0/24");
    }
    // A merge patch's nulls remove fields: the stored pool has none.
    if let Some(spec) = pool["spec"].as_object_mut() {
        spec.retain(|_, v| !v.is_null());
    }
    pool
}

#[tokio::test]
async fn a_new_workload_gets_its_pool_created_and_pending_addresses_are_not_carved_twice() {
    let (r, mut api) = reconciler(Leadership::always(), empty_store());
    let i = index(Some(deployment(2)), vec![]);
    let running = pass(r, &i);
    let (body, send) = api.expect("POST", POOLS).await;
    assert_eq!(body["metadata"]["name"], web_pool());
    let labels = &body["metadata"]["labels"];
    assert_eq!(labels["ipam.allot.dev/owner-subnet"], "subnet-a");
    assert_eq!(
        labels["ipam.allot.dev/owner-application-kind"],
        "Deployment"
    );
    assert_eq!(
        labels["ipam.allot.dev/owner-application-namespace"],
        "team-a"
    );
    assert_eq!(labels["ipam.allot.dev/owner-application-name"], "web");
    assert_eq!(labels["ipam.allot.dev/ippool-reclaim"], "true");
    assert_eq!(body["spec"]["ips"], json!(["10.10.0.10-10.10.0.12"]));
    assert_eq!(body["spec"]["gateway"], "10.10.0.1");
    assert_eq!(body["spec"]["ipVersion"], 4);
    answer(send, 201, written(&body, "8"));
    let (r, outcome) = running.await.unwrap();
    assert_eq!(outcome.created, 1);
    assert!(!outcome.retry);
    api.expect_nothing(Duration::from_millis(200)).await;

    // The watch has not shown the pool yet: the same plan is made, but its addresses are held
    // apart (another workload could not get them either); the API says it exists.
    let running = pass(r, &i);
    let (body, send) = api.expect("POST", POOLS).await;
    assert_eq!(body["spec"]["ips"], json!(["10.10.0.13-10.10.0.15"]));
    answer(send, 409, status(409, "AlreadyExists"));
    let (_, outcome) = running.await.unwrap();
    assert!(outcome.retry);
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn scaling_up_patches_the_pool_at_its_resource_version() {
    let (r, mut api) = reconciler(Leadership::always(), empty_store());
    let i = index(
        Some(deployment(5)),
        vec![stored_pool(&["10.10.0.10-10.10.0.12"], "true")],
    );
    let running = pass(r, &i);
    let (body, send) = api
        .expect_merge_patch(&format!("{POOLS}/{}", web_pool()))
        .await;
    assert_eq!(body["metadata"]["resourceVersion"], "7");
    assert_eq!(body["spec"]["ips"], json!(["10.10.0.10-10.10.0.15"]));
    assert_eq!(body["spec"]["gateway"], "10.10.0.1");
    assert!(body["spec"]["routes"].is_null(), "no routes: removed");
    answer(send, 200, written(&body, "8"));
    let (_, outcome) = running.await.unwrap();
    assert_eq!((outcome.updated, outcome.retry), (1, false));
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn scaling_down_keeps_the_claimed_addresses() {
    let store = Arc::new(MemoryStore::new());
    let holder = pod("team-a", "web-1", "u1");
    store
        .claim(&[
            claim(
                "10.10.0.11",
                &web_pool(),
                Some(&attachment("c1", "eth0")),
                &holder,
                1,
            ),
            claim(
                "10.10.0.14",
                &web_pool(),
                Some(&attachment("c2", "eth0")),
                &holder,
                1,
            ),
        ])
        .unwrap();
    let (r, mut api) = reconciler(Leadership::always(), store);
    // Scaled to 0: it wants 1, claims hold 2.
    let i = index(
        Some(deployment(0)),
        vec![stored_pool(&["10.10.0.10-10.10.0.15"], "true")],
    );
    let running = pass(r, &i);
    let (body, send) = api
        .expect_merge_patch(&format!("{POOLS}/{}", web_pool()))
        .await;
    assert_eq!(body["spec"]["ips"], json!(["10.10.0.11", "10.10.0.14"]));
    answer(send, 200, written(&body, "8"));
    let (_, outcome) = running.await.unwrap();
    assert_eq!(outcome.updated, 1);
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_lost_compare_and_swap_is_retried_by_a_later_pass() {
    let (r, mut api) = reconciler(Leadership::always(), empty_store());
    let i = index(
        Some(deployment(5)),
        vec![stored_pool(&["10.10.0.10-10.10.0.12"], "true")],
    );
    let running = pass(r, &i);
    let (_, send) = api
        .expect_merge_patch(&format!("{POOLS}/{}", web_pool()))
        .await;
    answer(send, 409, status(409, "Conflict"));
    let (_, outcome) = running.await.unwrap();
    assert_eq!((outcome.updated, outcome.retry), (0, true));
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_deleted_workloads_pool_is_deleted_with_a_precondition() {
    let (r, mut api) = reconciler(Leadership::always(), empty_store());
    let i = index(None, vec![stored_pool(&["10.10.0.10-10.10.0.12"], "true")]);
    let running = pass(r, &i);
    let (body, send) = api
        .expect("DELETE", &format!("{POOLS}/{}", web_pool()))
        .await;
    assert_eq!(body["preconditions"]["resourceVersion"], "7");
    answer(
        send,
        200,
        written(&json!({"spec": {"ips": ["10.10.0.10"]}}), "8"),
    );
    let (_, outcome) = running.await.unwrap();
    assert_eq!(outcome.deleted, 1);
    api.expect_nothing(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn a_pool_with_reclaim_false_outlives_its_workload() {
    let (r, mut api) = reconciler(Leadership::always(), empty_store());
    let i = index(None, vec![stored_pool(&["10.10.0.10-10.10.0.12"], "false")]);
    let running = pass(r, &i);
    api.expect_nothing(Duration::from_millis(200)).await;
    let (_, outcome) = running.await.unwrap();
    assert_eq!(outcome, Outcome::default());
}

#[tokio::test]
async fn a_subnet_too_small_is_an_event_on_the_workload_once() {
    let (r, mut api) = reconciler(Leadership::always(), empty_store());
    let i = index(Some(deployment(40)), vec![]);
    let running = pass(r, &i);
    let (body, send) = api.expect("POST", EVENTS).await;
    assert_eq!(body["type"], "Warning");
    assert_eq!(body["reason"], "AutoPoolRefused");
    assert_eq!(body["regarding"]["kind"], "Deployment");
    assert_eq!(body["regarding"]["name"], "web");
    assert_eq!(body["regarding"]["uid"], "uid-web");
    assert_eq!(body["regarding"]["apiVersion"], "apps/v1");
    let note = body["note"].as_str().unwrap();
    assert!(note.contains("is not created"), "{note}");
    assert!(
        note.contains("Subnet subnet-a has 20 free ipv4 addresses, 41 more are needed"),
        "{note}"
    );
    answer(send, 201, body.clone());
    let (r, outcome) = running.await.unwrap();
    assert_eq!((outcome.created, outcome.refused), (0, 1));
    api.expect_nothing(Duration::from_millis(200)).await;
    // The same refusal again: no second Event.
    let running = pass(r, &i);
    api.expect_nothing(Duration::from_millis(200)).await;
    let (_, outcome) = running.await.unwrap();
    assert_eq!(outcome.refused, 1);
}

#[tokio::test]
async fn a_replica_that_does_not_lead_writes_nothing() {
    let (r, mut api) = reconciler(Leadership::default(), empty_store());
    let i = index(Some(deployment(2)), vec![]);
    let running = pass(r, &i);
    api.expect_nothing(Duration::from_millis(200)).await;
    let (_, outcome) = running.await.unwrap();
    assert!(outcome.retry);
    assert_eq!(outcome.created, 0);
}
