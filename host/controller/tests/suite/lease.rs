//! Leader election: replicas racing for one Lease on a real kube-apiserver (upstream etcd and
//! kube-apiserver on 127.0.0.1), and each API path of a round against kube's mock service,
//! every request checked. A leader cut off from the API runs on the in-memory API server
//! (`tests/apiserver`), which answers 503 on demand.

use std::time::{Duration, Instant};

use allot_controller::lease::{Leadership, LeaseConfig, elect};
use allot_lab::LoopbackControlPlane;
use allot_test_apiserver::ApiServer;
use allot_test_apiserver::verifier::{answer, mock_client, refusal};
use kube::Api;
use serde_json::json;
use tokio::sync::oneshot;

const NS: &str = "allot-system";

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig {
        // Whole seconds: the Lease records its duration in seconds, and followers go by the record.
        duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1000),
        retry_period: Duration::from_millis(50),
        ..LeaseConfig::new(NS, "allot-controller", identity)
    }
}

struct Replica {
    leadership: Leadership,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Replica {
    fn start(client: &kube::Client, identity: &str) -> Replica {
        let leadership = Leadership::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(elect(
            Api::namespaced(client.clone(), NS),
            config(identity),
            leadership.clone(),
            async {
                let _ = stopped.await;
            },
        ));
        Replica {
            leadership,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }

    /// Stops without giving the lease up (the process died).
    fn kill(self) {
        self.task.abort();
    }
}

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

/// A real API server with namespace [`NS`], and a client of it on the caller's runtime.
async fn real_api(test: &str) -> Option<(LoopbackControlPlane, kube::Client)> {
    let server = LoopbackControlPlane::for_test(test, Default::default())?;
    server.create_namespace(NS, json!({})).unwrap();
    let client = allot_lab::kube_client(server.kubeconfig()).await.unwrap();
    Some((server, client))
}

fn the_lease(server: &LoopbackControlPlane) -> serde_json::Value {
    server
        .get(
            "coordination.k8s.io/v1",
            "leases",
            Some(NS),
            "allot-controller",
        )
        .unwrap()
        .expect("the Lease")
}

fn holder(server: &LoopbackControlPlane) -> String {
    the_lease(server)["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_replicas_racing_exactly_one_leads_at_any_time() {
    let Some((server, client)) = real_api("of_replicas_racing_exactly_one_leads_at_any_time").await
    else {
        return;
    };
    let replicas: Vec<Replica> = (0..3)
        .map(|i| Replica::start(&client, &format!("replica-{i}")))
        .collect();
    until("someone leads", || {
        replicas.iter().any(|r| r.leadership.is_leading())
    })
    .await;
    // Sampled for a while: never two at once, and the holder is the one that acts.
    for _ in 0..100 {
        let leading: Vec<usize> = (0..3)
            .filter(|i| replicas[*i].leadership.is_leading())
            .collect();
        assert!(leading.len() <= 1, "two leaders at once: {leading:?}");
        if let [i] = leading[..] {
            assert_eq!(holder(&server), format!("replica-{i}"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for r in replicas {
        r.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_stops_gives_the_lease_up_and_another_takes_over_at_once() {
    let Some((server, client)) =
        real_api("a_leader_that_stops_gives_the_lease_up_and_another_takes_over_at_once").await
    else {
        return;
    };
    let a = Replica::start(&client, "a");
    until("a leads", || a.leadership.is_leading()).await;
    let b = Replica::start(&client, "b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.leadership.is_leading(), "a renews: b follows");
    let t = Instant::now();
    a.stop().await;
    until("b leads", || b.leadership.is_leading()).await;
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a gave the lease up, so b did not wait the lease's duration ({:?})",
        t.elapsed()
    );
    assert_eq!(holder(&server), "b");
    assert_eq!(the_lease(&server)["spec"]["leaseTransitions"], 1);
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_leader_is_replaced_after_the_lease_duration() {
    let Some((_server, client)) =
        real_api("a_dead_leader_is_replaced_after_the_lease_duration").await
    else {
        return;
    };
    let a = Replica::start(&client, "a");
    until("a leads", || a.leadership.is_leading()).await;
    let b = Replica::start(&client, "b");
    a.kill();
    let t = Instant::now();
    until("b leads", || b.leadership.is_leading()).await;
    assert!(
        t.elapsed() >= Duration::from_millis(1900),
        "b waited for the silent lease to expire ({:?})",
        t.elapsed()
    );
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_is_taken_stops_acting_at_once() {
    let Some((server, client)) =
        real_api("a_leader_whose_lease_is_taken_stops_acting_at_once").await
    else {
        return;
    };
    let a = Replica::start(&client, "a");
    until("a leads", || a.leadership.is_leading()).await;
    let mut changes = a.leadership.subscribe();
    server
        .edit(
            "coordination.k8s.io/v1",
            "leases",
            Some(NS),
            "allot-controller",
            |lease| lease["spec"]["holderIdentity"] = json!("intruder"),
        )
        .unwrap();
    until("a stops", || !a.leadership.is_leading()).await;
    changes.changed().await.unwrap();
    assert!(!*changes.borrow());
    a.stop().await;
    assert_eq!(
        holder(&server),
        "intruder",
        "a does not give up a lease it lost"
    );
}

/// Fault: every read of the Lease answered 503 (`fail`), while the API server otherwise
/// runs; a real one answers what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_reach_the_api_stops_acting_by_its_renew_deadline() {
    let server = ApiServer::new();
    let a = Replica::start(&server.client(), "a");
    until("a leads", || a.leadership.is_leading()).await;
    server.fail("get", "leases", 1000, 503, "ServiceUnavailable");
    let t = Instant::now();
    until("a stops", || !a.leadership.is_leading()).await;
    assert!(
        t.elapsed() <= Duration::from_millis(1100),
        "stopped by the renew deadline, before anyone may take over ({:?})",
        t.elapsed()
    );
    a.kill();
}

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/allot-system/leases";

fn lease(holder: &str, rv: &str) -> serde_json::Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": "allot-controller", "namespace": NS, "resourceVersion": rv},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 4,
                    "renewTime": "2026-11-25T00:00:00.000000Z",
                    "acquireTime": "2026-11-25T00:00:00.000000Z"}})
}

/// One round each way against the mock: create when absent, renew its own, follow another's,
/// lose a compare-and-swap.
#[tokio::test]
async fn each_round_makes_exactly_the_requests_it_should() {
    let (client, mut api) = mock_client(NS);
    let leadership = Leadership::default();
    let (stop, stopped) = oneshot::channel::<()>();
    let mut config = config("me");
    config.retry_period = Duration::from_millis(10);
    let task = tokio::spawn(elect(
        Api::namespaced(client, NS),
        config,
        leadership.clone(),
        async {
            let _ = stopped.await;
        },
    ));

    // No Lease yet: it is created, naming this replica.
    let (_, send) = api
        .expect("GET", &format!("{LEASE}/allot-controller"))
        .await;
    answer(
        send,
        404,
        refusal(404, "NotFound", "leases \"allot-controller\" not found"),
    );
    let (body, send) = api.expect("POST", LEASE).await;
    assert_eq!(body["spec"]["holderIdentity"], "me");
    assert_eq!(body["spec"]["leaseTransitions"], 0);
    assert_eq!(body["spec"]["leaseDurationSeconds"], 2);
    answer(send, 201, lease("me", "1"));
    // Held: renewed with a replace carrying the version read, the transitions kept.
    let (_, send) = api
        .expect("GET", &format!("{LEASE}/allot-controller"))
        .await;
    answer(send, 200, lease("me", "1"));
    let (body, send) = api
        .expect("PUT", &format!("{LEASE}/allot-controller"))
        .await;
    assert_eq!(body["metadata"]["resourceVersion"], "1");
    assert_eq!(body["spec"]["holderIdentity"], "me");
    assert_eq!(body["spec"]["leaseTransitions"], 4);
    answer(send, 200, lease("me", "2"));
    until("leads", || leadership.is_leading()).await;
    // Someone else took it meanwhile: the replace is refused, and this replica stops at once.
    let (_, send) = api
        .expect("GET", &format!("{LEASE}/allot-controller"))
        .await;
    answer(send, 200, lease("me", "2"));
    let (_, send) = api
        .expect("PUT", &format!("{LEASE}/allot-controller"))
        .await;
    answer(
        send,
        409,
        refusal(409, "Conflict", "the object has been modified"),
    );
    let (_, send) = api
        .expect("GET", &format!("{LEASE}/allot-controller"))
        .await;
    assert!(!leadership.is_leading());
    // Another's fresh lease: followed, no write.
    answer(send, 200, lease("other", "3"));
    let (_, send) = api
        .expect("GET", &format!("{LEASE}/allot-controller"))
        .await;
    answer(send, 200, lease("other", "3"));
    let _ = stop.send(());
    // A follower that stops writes nothing more.
    api.expect_nothing(Duration::from_millis(300)).await;
    task.await.unwrap();
}
