//! The collector's API paths against kube's mock service: the fresh reads before a release
//! and the Events after it, every request checked, nothing more allowed.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use allot_controller::gc::{ApiReader, Collector, GcSettings};
use allot_controller::lease::Leadership;
use allot_controller::metrics::Metrics;
use allot_core::gc::LeakReason;
use allot_core::store::{MemoryStore, Store};
use allot_test_apiserver::verifier::{ApiServerVerifier, answer, mock_client, refusal};

struct Setup {
    store: Arc<MemoryStore>,
    clock: TestClock,
    api: ApiServerVerifier,
    gc: Option<Collector>,
}

/// A collector over `claims` whose pods the index does not know (so all are leaks), after a
/// first look and a grace period: the next scan's leaks are due.
async fn due(claims: Vec<allot_core::store::Claim>) -> Setup {
    let clock = TestClock::new();
    let store = Arc::new(MemoryStore::with_clock(clock.clock()));
    store.claim(&claims).unwrap();
    let (client, api) = mock_client("default");
    let index = listed(vec![], vec![node("node-1", true)], vec![]);
    let mut gc = Collector::new(
        store.clone(),
        index,
        Arc::new(ApiReader::new(client, "controller-0")),
        GcSettings::default(),
        Leadership::always(),
        Arc::new(Metrics::new()),
        clock.clock(),
    );
    assert!(gc.scan().await.unwrap().released.is_empty());
    clock.advance(60);
    Setup {
        store,
        clock,
        api,
        gc: Some(gc),
    }
}

const PODS: &str = "/api/v1/namespaces/team-a/pods";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events";

#[tokio::test]
async fn a_leak_confirmed_by_a_404_is_released_and_reported_on_its_pool() {
    let mut s = due(vec![claim("10.0.0.1", "team-a", "web-1", "u1", T0 - 3600)]).await;
    let mut gc = s.gc.take().unwrap();
    let scan = tokio::spawn(async move { gc.scan().await.unwrap() });
    let (_, send) = s.api.expect("GET", &format!("{PODS}/web-1")).await;
    answer(
        send,
        404,
        refusal(404, "NotFound", "pods \"web-1\" not found"),
    );
    let (event, send) = s.api.expect("POST", EVENTS).await;
    assert_eq!(event["regarding"]["kind"], "IPPool");
    assert_eq!(event["regarding"]["name"], "p");
    assert_eq!(event["reason"], "LeakedAddressesReleased");
    assert_eq!(event["reportingInstance"], "controller-0");
    answer(send, 201, event);
    s.api.expect_nothing(Duration::from_millis(200)).await;
    let pass = scan.await.unwrap();
    assert_eq!(pass.released.len(), 1);
    assert_eq!(pass.released[0].1, LeakReason::PodDeleted);
    assert!(s.store.all().unwrap().is_empty());
}

#[tokio::test]
async fn a_leak_the_fresh_read_shows_in_use_is_kept_and_nothing_is_written() {
    let mut s = due(vec![claim(
        "10.0.0.1",
        "team-a",
        "web-1",
        "uid-team-a-web-1",
        T0 - 3600,
    )])
    .await;
    let mut gc = s.gc.take().unwrap();
    let scan = tokio::spawn(async move { gc.scan().await.unwrap() });
    let (_, send) = s.api.expect("GET", &format!("{PODS}/web-1")).await;
    answer(send, 200, pod_json("team-a", "web-1", "node-1"));
    s.api.expect_nothing(Duration::from_millis(200)).await;
    let pass = scan.await.unwrap();
    assert_eq!(pass.kept_on_recheck, 1);
    assert_eq!(s.store.all().unwrap().len(), 1);
}

#[tokio::test]
async fn a_statefulset_pods_leak_reads_its_set_too() {
    let mut s = due(vec![of_statefulset(
        claim("10.0.0.1", "team-a", "db-0", "u0", T0 - 3600),
        "db",
    )])
    .await;
    // The index says the set is gone; the fresh read finds it back with 3 replicas: kept.
    let mut gc = s.gc.take().unwrap();
    let scan = tokio::spawn(async move { (gc.scan().await.unwrap(), gc) });
    let (_, send) = s.api.expect("GET", &format!("{PODS}/db-0")).await;
    answer(
        send,
        404,
        refusal(404, "NotFound", "pods \"db-0\" not found"),
    );
    let (_, send) = s
        .api
        .expect("GET", "/apis/apps/v1/namespaces/team-a/statefulsets/db")
        .await;
    answer(send, 200, statefulset_json("team-a", "db", 3));
    s.api.expect_nothing(Duration::from_millis(200)).await;
    let (pass, mut gc) = scan.await.unwrap();
    assert_eq!(pass.kept_on_recheck, 1);
    assert_eq!(s.store.all().unwrap().len(), 1);

    // Later the set is gone for real: seen twice again, read again, released.
    gc.scan().await.unwrap();
    s.clock.advance(60);
    let scan = tokio::spawn(async move { gc.scan().await.unwrap() });
    let (_, send) = s.api.expect("GET", &format!("{PODS}/db-0")).await;
    answer(
        send,
        404,
        refusal(404, "NotFound", "pods \"db-0\" not found"),
    );
    let (_, send) = s
        .api
        .expect("GET", "/apis/apps/v1/namespaces/team-a/statefulsets/db")
        .await;
    answer(
        send,
        404,
        refusal(404, "NotFound", "statefulsets \"db\" not found"),
    );
    let (event, send) = s.api.expect("POST", EVENTS).await;
    assert!(
        event["note"]
            .as_str()
            .unwrap()
            .contains("1 statefulset-gone"),
        "{event}"
    );
    answer(send, 201, event);
    let pass = scan.await.unwrap();
    assert_eq!(pass.released[0].1, LeakReason::StatefulSetGone);
}

#[tokio::test]
async fn a_read_that_fails_decides_nothing() {
    let mut s = due(vec![claim("10.0.0.1", "team-a", "web-1", "u1", T0 - 3600)]).await;
    let mut gc = s.gc.take().unwrap();
    let scan = tokio::spawn(async move { (gc.scan().await.unwrap(), gc) });
    let (_, send) = s.api.expect("GET", &format!("{PODS}/web-1")).await;
    answer(
        send,
        403,
        refusal(403, "Forbidden", "pods \"web-1\" is forbidden"),
    );
    s.api.expect_nothing(Duration::from_millis(200)).await;
    let (pass, mut gc) = scan.await.unwrap();
    assert!(pass.released.is_empty());
    assert_eq!(pass.kept_on_recheck, 0, "neither released nor forgotten");
    // Still a suspect: the next scan reads again (and releases when the read succeeds).
    let scan = tokio::spawn(async move { gc.scan().await.unwrap() });
    let (_, send) = s.api.expect("GET", &format!("{PODS}/web-1")).await;
    answer(
        send,
        404,
        refusal(404, "NotFound", "pods \"web-1\" not found"),
    );
    let (event, send) = s.api.expect("POST", EVENTS).await;
    answer(send, 201, event);
    assert_eq!(scan.await.unwrap().released.len(), 1);
}

#[tokio::test]
async fn a_finished_pod_is_told_on_the_pod_itself() {
    let mut s = due(vec![claim(
        "10.0.0.1",
        "team-a",
        "job-1",
        "uid-team-a-job-1",
        T0 - 3600,
    )])
    .await;
    let mut gc = s.gc.take().unwrap();
    let scan = tokio::spawn(async move { gc.scan().await.unwrap() });
    let mut finished = pod_json("team-a", "job-1", "node-1");
    finished["status"]["phase"] = "Succeeded".into();
    let (_, send) = s.api.expect("GET", &format!("{PODS}/job-1")).await;
    answer(send, 200, finished);
    let (event, send) = s
        .api
        .expect("POST", "/apis/events.k8s.io/v1/namespaces/team-a/events")
        .await;
    assert_eq!(event["regarding"]["kind"], "Pod");
    assert_eq!(event["regarding"]["name"], "job-1");
    assert_eq!(event["reason"], "AddressReleased");
    answer(send, 201, event);
    let pass = scan.await.unwrap();
    assert_eq!(pass.released[0].1, LeakReason::Finished);
}
