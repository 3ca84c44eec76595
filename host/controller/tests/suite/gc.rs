//! The garbage collector against a real kube-apiserver (upstream etcd and kube-apiserver on
//! 127.0.0.1, with allot's CRDs): what it releases, when, and what it never touches. Claims
//! live in core's memory store; the pods the collector re-reads before a release, and the
//! Events it records, live in the API server. A leader losing its lease in the middle of a
//! scan runs on the in-memory API server (`tests/apiserver`), which slows reads on demand.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use allot_controller::gc::{ApiReader, Collector, GcSettings, RELEASE_BATCH};
use allot_controller::lease::{Leadership, LeaseConfig, elect};
use allot_controller::metrics::Metrics;
use allot_core::gc::LeakReason;
use allot_core::store::{MemoryStore, Store};
use allot_index::{ClusterIndex, IndexResource, Shared};
use allot_k8s::openapi::api::core::v1::Pod;
use allot_lab::LoopbackControlPlane;
use allot_test_apiserver::ApiServer;
use serde_json::{Value, json};

/// The user the collector's requests are made as.
const USER: &str = "allot-controller";

struct Setup {
    server: LoopbackControlPlane,
    /// A client as [`USER`], on the test's runtime.
    client: kube::Client,
    store: Arc<MemoryStore>,
    clock: TestClock,
    metrics: Arc<Metrics>,
}

impl Setup {
    /// A real API server with namespaces team-a, team-b and allot-system, for test `test`.
    async fn start(test: &str) -> Option<Setup> {
        let server = real_api(test)?;
        for ns in ["team-a", "team-b", "allot-system"] {
            server.create_namespace(ns, json!({})).unwrap();
        }
        let client = client_as(&server, USER).await;
        let clock = TestClock::new();
        Some(Setup {
            server,
            client,
            store: Arc::new(MemoryStore::with_clock(clock.clock())),
            clock,
            metrics: Arc::new(Metrics::new()),
        })
    }

    fn collector(&self, index: &Arc<Shared<ClusterIndex>>, leadership: Leadership) -> Collector {
        Collector::new(
            self.store.clone(),
            index.clone(),
            Arc::new(ApiReader::new(self.client.clone(), "test")),
            GcSettings::default(),
            leadership,
            self.metrics.clone(),
            self.clock.clock(),
        )
    }

    /// A pod of `ns` on node-1, Running with a pod IP (written through its status), as stored.
    fn running_json(&self, mut pod: Value) -> Value {
        let status = pod["status"].clone();
        pod.as_object_mut().unwrap().remove("status");
        let mut stored = self.server.create("pods", pod).unwrap();
        stored["status"] = status;
        self.server.replace_status("pods", stored).unwrap()
    }

    /// A running pod stored in the API server, as stored.
    fn running(&self, ns: &str, name: &str) -> Pod {
        typed(self.running_json(pod_json(ns, name, "node-1")))
    }

    /// The Events the collector recorded (events.k8s.io/v1). The API server records its own
    /// too (its Service IP repair loop, about Services of `default`), so only allot's count.
    fn events(&self) -> Vec<Value> {
        self.server
            .list("events.k8s.io/v1", "events")
            .unwrap()
            .into_iter()
            .filter(|e| e["reportingController"] == "allot-controller")
            .collect()
    }

    fn held(&self) -> Vec<String> {
        let mut a: Vec<String> = self
            .store
            .all()
            .unwrap()
            .iter()
            .map(|c| c.address.to_string())
            .collect();
        a.sort();
        a
    }
}

/// The collector on the in-memory API server, for a fault it injects.
struct InMemory {
    server: ApiServer,
    store: Arc<MemoryStore>,
    clock: TestClock,
    metrics: Arc<Metrics>,
}

impl InMemory {
    fn new() -> InMemory {
        let clock = TestClock::new();
        InMemory {
            server: ApiServer::new(),
            store: Arc::new(MemoryStore::with_clock(clock.clock())),
            clock,
            metrics: Arc::new(Metrics::new()),
        }
    }

    fn collector(&self, index: &Arc<Shared<ClusterIndex>>, leadership: Leadership) -> Collector {
        Collector::new(
            self.store.clone(),
            index.clone(),
            Arc::new(ApiReader::new(self.server.client(), "test")),
            GcSettings::default(),
            leadership,
            self.metrics.clone(),
            self.clock.clock(),
        )
    }
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap()
}

#[tokio::test]
async fn a_deleted_pods_address_is_released_at_the_second_look_past_the_grace_period() {
    let Some(s) =
        Setup::start("a_deleted_pods_address_is_released_at_the_second_look_past_the_grace_period")
            .await
    else {
        return;
    };
    let kept = s.running("team-a", "web-2");
    s.store
        .claim(&[
            claim("10.0.0.1", "team-a", "web-1", "uid-gone", T0 - 3600),
            claim("10.0.0.2", "team-a", "web-2", &uid(&kept), T0 - 3600),
        ])
        .unwrap();
    let index = listed(vec![kept], vec![node("node-1", true)], vec![]);
    let mut gc = s.collector(&index, Leadership::always());

    let first = gc.scan().await.unwrap();
    assert_eq!((first.claims, first.leaked), (2, 1));
    assert!(first.released.is_empty(), "one sighting is not enough");
    s.clock.advance(59);
    assert!(
        gc.scan().await.unwrap().released.is_empty(),
        "within the grace period"
    );
    s.clock.advance(1);
    let third = gc.scan().await.unwrap();
    assert_eq!(third.released.len(), 1);
    assert_eq!(third.released[0].1, LeakReason::PodDeleted);
    assert_eq!(
        s.held(),
        vec!["10.0.0.2"],
        "the running pod's address stays"
    );

    let metrics = s.metrics.encode();
    assert!(
        metrics.contains("allot_gc_released_total{reason=\"pod-deleted\"} 1"),
        "{metrics}"
    );
    let events = s.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["regarding"]["kind"], "IPPool");
    assert_eq!(events[0]["regarding"]["name"], "p");
    let note = events[0]["note"].as_str().unwrap();
    assert!(note.contains("1 pod-deleted"), "{note}");
}

#[tokio::test]
async fn a_pod_the_index_has_not_seen_yet_is_kept_by_the_fresh_read() {
    let Some(s) = Setup::start("a_pod_the_index_has_not_seen_yet_is_kept_by_the_fresh_read").await
    else {
        return;
    };
    // The pod exists, but the controller's watch has not delivered it (the index lags).
    let late = s.running("team-a", "web-1");
    s.store
        .claim(&[claim("10.0.0.1", "team-a", "web-1", &uid(&late), T0 - 3600)])
        .unwrap();
    let index = listed(vec![], vec![node("node-1", true)], vec![]);
    let mut gc = s.collector(&index, Leadership::always());
    gc.scan().await.unwrap();
    s.clock.advance(60);
    let pass = gc.scan().await.unwrap();
    assert!(pass.released.is_empty());
    assert_eq!(pass.kept_on_recheck, 1);
    assert_eq!(s.held(), vec!["10.0.0.1"]);
    assert!(
        s.metrics
            .encode()
            .contains("allot_gc_kept_on_recheck_total 1")
    );
}

#[tokio::test]
async fn a_pod_of_the_same_name_in_another_namespace_is_another_pod() {
    let Some(s) = Setup::start("a_pod_of_the_same_name_in_another_namespace_is_another_pod").await
    else {
        return;
    };
    let other = s.running("team-b", "web");
    s.store
        .claim(&[
            claim("10.0.0.1", "team-a", "web", "uid-a", T0 - 3600),
            claim("10.0.0.2", "team-b", "web", &uid(&other), T0 - 3600),
        ])
        .unwrap();
    let index = listed(vec![other], vec![node("node-1", true)], vec![]);
    let mut gc = s.collector(&index, Leadership::always());
    gc.scan().await.unwrap();
    s.clock.advance(60);
    let pass = gc.scan().await.unwrap();
    let released: Vec<String> = pass
        .released
        .iter()
        .map(|(c, _)| c.address.to_string())
        .collect();
    assert_eq!(released, vec!["10.0.0.1"]);
    assert_eq!(s.held(), vec!["10.0.0.2"]);
}

#[tokio::test]
async fn a_claim_of_an_earlier_pod_of_the_same_name_is_released() {
    let Some(s) = Setup::start("a_claim_of_an_earlier_pod_of_the_same_name_is_released").await
    else {
        return;
    };
    let now = s.running("team-a", "web");
    s.store
        .claim(&[claim(
            "10.0.0.1",
            "team-a",
            "web",
            "uid-of-the-pod-before",
            T0 - 3600,
        )])
        .unwrap();
    let index = listed(vec![now], vec![node("node-1", true)], vec![]);
    let mut gc = s.collector(&index, Leadership::always());
    gc.scan().await.unwrap();
    s.clock.advance(60);
    let pass = gc.scan().await.unwrap();
    assert_eq!(pass.released.len(), 1);
    assert_eq!(pass.released[0].1, LeakReason::UidMismatch);
}

#[tokio::test]
async fn a_terminating_pod_keeps_its_address_until_its_grace_period_has_passed() {
    let Some(s) =
        Setup::start("a_terminating_pod_keeps_its_address_until_its_grace_period_has_passed").await
    else {
        return;
    };
    // kubectl delete --grace-period=300 of a pod whose kubelet has not confirmed (none runs
    // here) and which a finalizer holds: the API server gives it its deletionTimestamp.
    let mut p = pod_json("team-a", "web", "node-1");
    p["metadata"]["finalizers"] = json!(["example.com/keep"]);
    s.running_json(p);
    s.server
        .delete_with_grace("v1", "pods", Some("team-a"), "web", 300)
        .unwrap();
    let p: Pod = typed(
        s.server
            .get("v1", "pods", Some("team-a"), "web")
            .unwrap()
            .unwrap(),
    );
    let meta = &p.metadata;
    assert_eq!(meta.deletion_grace_period_seconds, Some(300));
    // The collector's clock starts at the pod's deletionTimestamp.
    let deleted_at = meta.deletion_timestamp.as_ref().unwrap().0.as_second() as u64;
    s.clock.set(deleted_at);
    s.store
        .claim(&[claim(
            "10.0.0.1",
            "team-a",
            "web",
            &uid(&p),
            deleted_at - 3600,
        )])
        .unwrap();
    let index = listed(vec![p], vec![node("node-1", true)], vec![]);
    let mut gc = s.collector(&index, Leadership::always());
    gc.scan().await.unwrap();
    s.clock.advance(60);
    assert!(
        gc.scan().await.unwrap().released.is_empty(),
        "deletionTimestamp + 300 s is ahead"
    );
    s.clock.set(deleted_at + 300);
    let pass = gc.scan().await.unwrap();
    assert_eq!(pass.released.len(), 1);
    assert_eq!(pass.released[0].1, LeakReason::TerminatingOnReadyNode);
    let events = s.events();
    assert_eq!(
        events[0]["regarding"]["kind"], "Pod",
        "the pod exists: the Event is on it"
    );
}

#[tokio::test]
async fn statefulset_pods_keep_their_addresses_while_their_set_wants_them() {
    let Some(s) =
        Setup::start("statefulset_pods_keep_their_addresses_while_their_set_wants_them").await
    else {
        return;
    };
    let set = typed(
        s.server
            .create("statefulsets", statefulset_json("team-a", "db", 2))
            .unwrap(),
    );
    s.store
        .claim(&[
            of_statefulset(
                claim("10.0.0.1", "team-a", "db-1", "uid-old-1", T0 - 3600),
                "db",
            ),
            of_statefulset(
                claim("10.0.0.2", "team-a", "db-2", "uid-old-2", T0 - 3600),
                "db",
            ),
        ])
        .unwrap();
    // Both pods are gone (being recreated); the set has 2 replicas: db-1 comes back, db-2 not.
    let index = listed(vec![], vec![node("node-1", true)], vec![set]);
    let mut gc = s.collector(&index, Leadership::always());
    gc.scan().await.unwrap();
    s.clock.advance(60);
    let pass = gc.scan().await.unwrap();
    let released: Vec<(String, LeakReason)> = pass
        .released
        .iter()
        .map(|(c, r)| (c.address.to_string(), *r))
        .collect();
    assert_eq!(
        released,
        vec![("10.0.0.2".to_string(), LeakReason::StatefulSetScaledDown)]
    );
    assert_eq!(s.held(), vec!["10.0.0.1"]);
}

#[tokio::test]
async fn a_claim_changed_since_it_was_seen_is_kept() {
    let Some(s) = Setup::start("a_claim_changed_since_it_was_seen_is_kept").await else {
        return;
    };
    let c = claim("10.0.0.1", "team-a", "web-1", "uid-gone", T0 - 3600);
    s.store.claim(std::slice::from_ref(&c)).unwrap();
    let index = listed(vec![], vec![node("node-1", true)], vec![]);
    let mut gc = s.collector(&index, Leadership::always());
    gc.scan().await.unwrap();
    // The address was released and claimed again by another pod meanwhile.
    s.store.release(c.address, c.attachment.as_ref()).unwrap();
    s.store
        .claim(&[claim("10.0.0.1", "team-a", "web-9", "uid-9", T0 + 30)])
        .unwrap();
    s.clock.advance(60);
    let pass = gc.scan().await.unwrap();
    assert!(
        pass.released.is_empty(),
        "the new claim is young and a new suspect"
    );
    assert_eq!(s.held(), vec!["10.0.0.1"]);
}

#[tokio::test]
async fn a_replica_that_does_not_lead_releases_nothing() {
    let Some(s) = Setup::start("a_replica_that_does_not_lead_releases_nothing").await else {
        return;
    };
    s.store
        .claim(&[claim("10.0.0.1", "team-a", "web-1", "uid-gone", T0 - 3600)])
        .unwrap();
    let index = listed(vec![], vec![node("node-1", true)], vec![]);
    let mut gc = s.collector(&index, Leadership::default());
    gc.scan().await.unwrap();
    s.clock.advance(60);
    let pass = gc.scan().await.unwrap();
    assert!(pass.released.is_empty());
    assert!(pass.lost_leadership);
    assert_eq!(s.held(), vec!["10.0.0.1"]);
}

/// Fault: every fresh read of a pod slowed down (`delay`), so that the lease can be taken in the
/// middle of a scan; a real API server answers as fast as it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_lease_mid_scan_stops_releasing() {
    let s = InMemory::new();
    const LEAKS: usize = 3000;
    let claims: Vec<_> = (0..LEAKS)
        .map(|i| {
            let a = std::net::Ipv4Addr::from(u32::from_be_bytes([10, 1, 0, 0]) + i as u32);
            claim(
                &a.to_string(),
                "team-a",
                &format!("gone-{i}"),
                "u",
                T0 - 3600,
            )
        })
        .collect();
    s.store.claim(&claims).unwrap();
    let index = listed(vec![], vec![node("node-1", true)], vec![]);

    let leadership = Leadership::default();
    let config = LeaseConfig {
        duration: Duration::from_secs(5),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(20),
        ..LeaseConfig::new("allot-system", "allot-controller", "me")
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let election = tokio::spawn(elect(
        kube::Api::namespaced(s.server.client(), "allot-system"),
        config,
        leadership.clone(),
        async {
            let _ = stopped.await;
        },
    ));
    tokio::time::timeout(Duration::from_secs(5), leadership.until_leading())
        .await
        .expect("leads");

    let mut gc = s.collector(&index, leadership.clone());
    gc.scan().await.unwrap();
    s.clock.advance(60);
    // Each fresh read of a pod takes a while: each of the scan's 30 batches takes half a second.
    s.server.delay("get", "pods", Duration::from_millis(5));
    let scan = tokio::spawn(async move { gc.scan().await.unwrap() });
    // Once the first batch is released, another replica takes the lease over.
    tokio::time::timeout(Duration::from_secs(30), async {
        while s.store.all().unwrap().len() > LEAKS - RELEASE_BATCH {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the first batch is released");
    let mut lease = s.server.objects("leases").pop().unwrap();
    lease["spec"]["holderIdentity"] = json!("another-replica");
    s.server.edit("leases", lease);

    let pass = scan.await.unwrap();
    assert!(pass.lost_leadership, "the scan noticed");
    assert!(!leadership.is_leading());
    assert_eq!(
        pass.released.len(),
        RELEASE_BATCH,
        "only the batch released before the loss"
    );
    assert_eq!(s.store.all().unwrap().len(), LEAKS - RELEASE_BATCH);
    let _ = stop.send(());
    election.await.unwrap();
}

#[tokio::test]
async fn pod_events_make_the_collector_look_at_once_and_again_when_due() {
    let Some(s) =
        Setup::start("pod_events_make_the_collector_look_at_once_and_again_when_due").await
    else {
        return;
    };
    let p = s.running("team-a", "web-1");
    // This test runs on the system clock: a claim made long ago.
    s.store
        .claim(&[claim(
            "10.0.0.1",
            "team-a",
            "web-1",
            &uid(&p),
            1_700_000_000,
        )])
        .unwrap();
    let index = listed(vec![p.clone()], vec![node("node-1", true)], vec![]);
    let settings = GcSettings {
        grace: 1,
        interval: Duration::from_secs(3600),
        ..GcSettings::default()
    };
    let gc = Collector::new(
        s.store.clone(),
        index.clone(),
        Arc::new(ApiReader::new(s.client.clone(), "test")),
        settings,
        Leadership::always(),
        s.metrics.clone(),
        allot_core::store::system_clock(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(gc.run(async {
        let _ = stopped.await;
    }));
    // The first full scan finds nothing to do.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.held(), vec!["10.0.0.1"]);
    // The pod is deleted and its DEL never came: the event makes the collector look at it,
    // and look again a grace period later, long before the next full scan.
    s.server
        .delete("v1", "pods", Some("team-a"), "web-1")
        .unwrap();
    index.update(|i| IndexResource::<Pod>::delete(i, p));
    tokio::time::timeout(Duration::from_secs(10), async {
        while !s.held().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("released within seconds of the event, not at the next scan an hour later");
    let _ = stop.send(());
    run.await.unwrap();
}

#[tokio::test]
async fn nothing_is_decided_before_the_index_has_listed_the_pods() {
    let Some(s) = Setup::start("nothing_is_decided_before_the_index_has_listed_the_pods").await
    else {
        return;
    };
    s.store
        .claim(&[claim("10.0.0.1", "team-a", "web-1", "u", T0 - 3600)])
        .unwrap();
    // An index that has not listed pods yet: every pod would look deleted.
    let index = Shared::of(ClusterIndex::new());
    let settings = GcSettings {
        grace: 0,
        interval: Duration::from_millis(10),
        ..GcSettings::default()
    };
    let gc = Collector::new(
        s.store.clone(),
        index.clone(),
        Arc::new(ApiReader::new(s.client.clone(), "test")),
        settings,
        Leadership::always(),
        s.metrics.clone(),
        s.clock.clock(),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(gc.run(async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(s.held(), vec!["10.0.0.1"]);
    assert!(s.metrics.encode().contains("allot_gc_scans_total 0"));
    let _ = stop.send(());
    run.await.unwrap();
}

/// After a scan the leader deletes the IPBlocks that GC (or anyone) emptied over an hour ago,
/// and only those; a replica that does not lead deletes nothing.
#[test]
fn the_leader_deletes_ipblocks_emptied_over_an_hour_ago() {
    use allot_store::{KubeConfig, KubeStore};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let Some(s) = runtime.block_on(Setup::start(
        "the_leader_deletes_ipblocks_emptied_over_an_hour_ago",
    )) else {
        return;
    };
    let kept = s.running("team-a", "web-2");
    let kubeconfig = s.server.kubeconfig().to_path_buf();
    let store = Arc::new(
        KubeStore::open_with(
            &KubeConfig::default(),
            s.clock.clock(),
            move || async move { allot_store::kube_client(Some(&kubeconfig)).await },
        )
        .unwrap(),
    );
    store
        .claim(&[
            claim("10.0.0.1", "team-a", "web-1", "uid-gone", T0 - 3600),
            claim("10.0.1.2", "team-a", "web-2", &uid(&kept), T0 - 3600),
        ])
        .unwrap();
    let blocks = |server: &LoopbackControlPlane| -> Vec<String> {
        let mut names: Vec<String> = server
            .list("allot.dev/v1alpha1", "ipblocks")
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    let _entered = runtime.enter();
    let index = listed(vec![kept], vec![node("node-1", true)], vec![]);
    let collector = |leadership| {
        Collector::new(
            store.clone(),
            index.clone(),
            Arc::new(ApiReader::new(s.client.clone(), "test")),
            GcSettings::default(),
            leadership,
            s.metrics.clone(),
            s.clock.clock(),
        )
    };
    let mut leader = collector(Leadership::always());
    let mut follower = collector(Leadership::default());
    runtime.block_on(async {
        leader.scan().await.unwrap();
        s.clock.advance(60);
        assert_eq!(leader.scan().await.unwrap().released.len(), 1);
        // The block of 10.0.0.1 is empty now, its release cooling down.
        s.clock.advance(3599);
        assert_eq!(leader.scan().await.unwrap().emptied_deleted, 0);
        s.clock.advance(2);
        assert_eq!(follower.scan().await.unwrap().emptied_deleted, 0);
        assert_eq!(blocks(&s.server), ["v4-10-0-0-0-26", "v4-10-0-1-0-26"]);
        assert_eq!(leader.scan().await.unwrap().emptied_deleted, 1);
    });
    assert_eq!(
        blocks(&s.server),
        ["v4-10-0-1-0-26"],
        "the claimed block stays"
    );
    let metrics = s.metrics.encode();
    assert!(
        metrics.contains("allot_gc_emptied_blocks_deleted_total 1"),
        "{metrics}"
    );
}
