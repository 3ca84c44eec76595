//! What users of other IPAMs reported going wrong, as tests of allot on the real control plane.
//! Each names the peer's issue it answers; the counts are shorter than the benchmark's. What
//! they check is what a user would notice: one address answering in two sandboxes, a live
//! pod's address released, a rollout that never finishes, claims that no pod uses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use allot_cluster_tests::objects::{
    Workload, claims, claims_in, endpoint_ips, pod_ips, pool_counts, pool_yaml, pools_annotation,
};
use allot_cluster_tests::sandboxes::shared_addresses;
use allot_cluster_tests::{NAMESPACE, Suite};
use allot_lab::node::cni::Attachment;
use allot_lab::testing::wait_for;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};

/// Every sandbox of namespace `ns` the nodes' runtimes have networked and not yet torn down,
/// with its node. Nodes in `except` (stopped ones, their pods declared gone) are left out.
fn sandboxes(s: &Suite, ns: &str, except: &[&str]) -> Vec<(String, Attachment)> {
    let nodes: Vec<_> = s
        .lab
        .nodes()
        .into_iter()
        .filter(|n| !except.contains(&n.name.as_str()))
        .collect();
    allot_cluster_tests::sandboxes::sandboxes(&nodes, ns)
}

/// Fails when one address is configured in the sandboxes of two pods (two UIDs).
fn no_address_in_two_sandboxes(s: &Suite, ns: &str, except: &[&str]) {
    if let Some(shared) = shared_addresses(&sandboxes(s, ns, except)).first() {
        panic!("{shared}");
    }
}

fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && !pod_ips(pod).is_empty()
}

/// Waits until the claims of `ns` are exactly the addresses its running pods use, each held
/// for its pod, and every pod of `ns` runs; returns the pods.
async fn claims_are_the_running_pods(s: &Suite, ns: &str, count: usize) -> Vec<Pod> {
    wait_for(
        &format!("{count} pods running in {ns}, holding exactly their addresses"),
        Duration::from_secs(180),
        || async {
            let pods = s.pods(ns, "").await;
            let mut want = BTreeMap::new();
            for pod in pods.iter().filter(|p| running(p)) {
                for ip in pod_ips(pod) {
                    want.insert(ip, pod.metadata.uid.clone().unwrap());
                }
            }
            let held: BTreeMap<IpAddr, String> = claims_in(&s.client, ns)
                .await
                .into_iter()
                .map(|(ip, h)| (ip, h.uid))
                .collect();
            let all_running = pods.len() == count && pods.iter().all(running);
            let count = pods.len();
            (all_running && want == held)
                .then_some(pods)
                .ok_or(format!("{count} pods, claims {held:?}, pods use {want:?}"))
        },
    )
    .await
}

/// The `AddressReleased` Events allot's controller recorded on pods of `ns`, and its
/// `LeakedAddressesReleased` Events on `pool`: what its GC released.
async fn gc_releases(s: &Suite, ns: &str, pool: &str) -> Vec<String> {
    let ours = |e: &Event| e.reporting_controller.as_deref() == Some("allot-controller");
    let on_pods: Api<Event> = Api::namespaced(s.client.clone(), ns);
    let mut out: Vec<String> = on_pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| ours(e) && e.reason.as_deref() == Some("AddressReleased"))
        .filter_map(|e| e.note)
        .collect();
    let all: Api<Event> = Api::all(s.client.clone());
    out.extend(
        all.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| ours(e) && e.reason.as_deref() == Some("LeakedAddressesReleased"))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(pool))
            .filter_map(|e| e.note),
    );
    out
}

fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap()
}

/// A Deployment naming `pools`, its pods spread over the nodes.
fn spread(ns: &str, name: &str, replicas: u32, pools: &str) -> Workload {
    Workload::deployment(ns, name, replicas)
        .pools(pools)
        .grace(1)
        .spread("ScheduleAnyway")
}

/// Same-name StatefulSet pods deleted and recreated, and the StatefulSet scaled down and up
/// fast, while a Deployment takes and gives back addresses of the same small pool: no address
/// ever answers in two pods' sandboxes, and each StatefulSet pod comes back with its own.
/// Spiderpool #1187 and #2526 (a StatefulSet pod's address released as "pod UID is different"
/// and handed to a Deployment pod while the StatefulSet pod used it), #3751 (fast scale down
/// and up).
#[tokio::test]
async fn same_name_pods_churned_beside_a_deployment_never_share_an_address() {
    let test = "same_name_pods_churned_beside_a_deployment_never_share_an_address";
    let Some(s) = Suite::shared(test).await else {
        return;
    };
    let ns = s.namespace("churn").await;
    s.must_apply(&pool_yaml(
        "churn-v4",
        "198.51.100.0/24",
        "198.51.100.1",
        "198.51.100.96-198.51.100.103",
    ));
    s.must_apply(&pool_yaml(
        "churn-v6",
        "2001:db8:1ab::/64",
        "2001:db8:1ab::1",
        "2001:db8:1ab::7:0-2001:db8:1ab::7:7",
    ));
    let pools = pools_annotation("churn-v4", "churn-v6");
    s.must_apply(
        &Workload::statefulset(&ns, "web", 3)
            .pools(&pools)
            .grace(1)
            .yaml(),
    );
    s.must_apply(&spread(&ns, "filler", 2, &pools).yaml());
    let web = s.ready_pods(&ns, "app=web", 3).await;
    s.ready_pods(&ns, "app=filler", 2).await;
    let mut own: BTreeMap<String, Vec<IpAddr>> = web
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap(), pod_ips(p)))
        .collect();

    const CYCLES: usize = 12;
    for cycle in 0..CYCLES {
        let before: BTreeSet<String> = s
            .pods(&ns, "app=web")
            .await
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let scaled = cycle % 4 == 3;
        if scaled {
            // Down to one and straight back up once the others are going (#3751).
            s.must(
                "kubectl",
                &["-n", &ns, "scale", "statefulset/web", "--replicas=1"],
            );
            wait_for("web-1 and web-2 going", Duration::from_secs(60), || async {
                let pods = s.pods(&ns, "app=web").await;
                let going = pods
                    .iter()
                    .filter(|p| p.metadata.name.as_deref() != Some("web-0"))
                    .all(|p| p.metadata.deletion_timestamp.is_some());
                going.then_some(()).ok_or(pods.len())
            })
            .await;
            s.must(
                "kubectl",
                &["-n", &ns, "scale", "statefulset/web", "--replicas=3"],
            );
        } else {
            let name = format!("web-{}", cycle % 3);
            s.must(
                "kubectl",
                &["-n", &ns, "delete", "pod", &name, "--wait=false"],
            );
        }
        let filler = if cycle % 2 == 0 {
            "--replicas=4"
        } else {
            "--replicas=2"
        };
        s.must(
            "kubectl",
            &["-n", &ns, "scale", "deployment/filler", filler],
        );
        // Look at the sandboxes all the while the replacement comes up.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            no_address_in_two_sandboxes(&s, &ns, &[]);
            let pods = s.pods(&ns, "app=web").await;
            let replaced = pods
                .iter()
                .any(|p| !before.contains(p.metadata.uid.as_ref().unwrap()));
            if replaced && pods.len() == 3 && pods.iter().all(running) {
                for pod in &pods {
                    let name = pod.metadata.name.clone().unwrap();
                    if scaled {
                        // Scaled away, its addresses may have gone to the Deployment meanwhile.
                        own.insert(name, pod_ips(pod));
                    } else {
                        assert_eq!(pod_ips(pod), own[&name], "{name} came back with others");
                    }
                }
                break;
            }
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: web not back in 120 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    s.must(
        "kubectl",
        &["-n", &ns, "scale", "deployment/filler", "--replicas=2"],
    );
    claims_are_the_running_pods(&s, &ns, 5).await;
    no_address_in_two_sandboxes(&s, &ns, &[]);
    assert_eq!(gc_releases(&s, &ns, "churn-v4").await, Vec::<String>::new());
    assert_eq!(gc_releases(&s, &ns, "churn-v6").await, Vec::<String>::new());
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    // The StatefulSet's kept addresses go with it (GC: statefulset-gone), then the pools can.
    wait_for(
        "web's addresses released",
        Duration::from_secs(120),
        || async {
            let left: Vec<IpAddr> = claims_in(&s.client, &ns).await.into_keys().collect();
            left.is_empty().then_some(()).ok_or(left)
        },
    )
    .await;
    s.must("kubectl", &["delete", "ippool", "churn-v4", "churn-v6"]);
    s.no_refusals();
}

/// A StatefulSet pod whose node stops answering: while the node is NotReady and the pod
/// Terminating on it, GC keeps its addresses; once the operator force-deletes it, the pod comes
/// back on another node with the same addresses; when the old node returns and tears the old
/// sandbox down (its DEL, its CNI GC), the new pod keeps them. Spiderpool #2442 and #2526
/// (a StatefulSet pod's address released while it was rescheduled), Whereabouts #176 (an
/// address released by the reconciler while its pod still ran).
#[tokio::test]
async fn a_statefulset_pod_keeps_its_addresses_through_its_nodes_outage() {
    let test = "a_statefulset_pod_keeps_its_addresses_through_its_nodes_outage";
    let Some(s) = Suite::shared(test).await else {
        return;
    };
    let ns = s.namespace("outage").await;
    // The node to lose: one no controller replica runs on (losing the leader is another test's).
    let controllers: BTreeSet<String> = s
        .pods(NAMESPACE, "app.kubernetes.io/component=controller")
        .await
        .iter()
        .map(node_of)
        .collect();
    let victim = s
        .lab
        .nodes()
        .into_iter()
        .map(|n| n.name)
        .find(|n| !controllers.contains(n))
        .expect("a node without a controller replica");
    // On that node, evicted 5 s after it goes NotReady (not the default 300 s).
    let extra = format!(
        "      affinity:\n        nodeAffinity:\n          \
         preferredDuringSchedulingIgnoredDuringExecution:\n          - weight: 100\n            \
         preference: {{matchExpressions: [{{key: kubernetes.io/hostname, operator: In, \
         values: [{victim}]}}]}}\n      tolerations:\n      - {{key: \
         node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: \
         5}}\n      - {{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, \
         tolerationSeconds: 5}}\n"
    );
    s.must_apply(
        &Workload::statefulset(&ns, "db", 1)
            .pools(&pools_annotation("default-v4", "default-v6"))
            .grace(1)
            .pod_spec(&extra)
            .yaml(),
    );
    let first = s.ready_pods(&ns, "app=db", 1).await.remove(0);
    assert_eq!(node_of(&first), victim, "db-0 started on the node to lose");
    let ips = pod_ips(&first);
    let first_uid = first.metadata.uid.clone().unwrap();
    let held_for = |uid: String| {
        let s = &s;
        let ns = ns.clone();
        let ips = ips.clone();
        async move {
            let held = claims_in(&s.client, &ns).await;
            for ip in &ips {
                let h = held
                    .get(ip)
                    .unwrap_or_else(|| panic!("{ip} of db-0 was released"));
                assert_eq!(h.uid, uid, "{ip} is held for another pod");
            }
        }
    };

    // Before: the node stops (its stand-in and containers killed, no DEL).
    s.lab.stop_node(&victim).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &ns);
    wait_for(
        "db-0 Terminating on the NotReady node",
        Duration::from_secs(120),
        || async {
            let pod = pods.get("db-0").await.map_err(|e| e.to_string())?;
            pod.metadata
                .deletion_timestamp
                .is_some()
                .then_some(())
                .ok_or("not terminating yet".to_string())
        },
    )
    .await;
    // During: three GC intervals and more with the pod Terminating on a NotReady node.
    let until = Instant::now() + Duration::from_secs(35);
    while Instant::now() < until {
        held_for(first_uid.clone()).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // The operator declares it gone; the StatefulSet makes db-0 again elsewhere.
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "pod",
            "db-0",
            "--force",
            "--grace-period=0",
        ],
    );
    let second = wait_for(
        "db-0 back on another node",
        Duration::from_secs(120),
        || async {
            let pods = s.pods(&ns, "app=db").await;
            let pod = pods.into_iter().next().ok_or("no pod".to_string())?;
            (pod.metadata.uid.as_deref() != Some(&first_uid) && running(&pod))
                .then_some(pod)
                .ok_or("not yet".to_string())
        },
    )
    .await;
    let moved_to = node_of(&second);
    assert_ne!(moved_to, victim);
    assert_eq!(
        pod_ips(&second),
        ips,
        "db-0 keeps its addresses on {moved_to}"
    );
    let second_uid = second.metadata.uid.clone().unwrap();
    held_for(second_uid.clone()).await;

    // After: the old node comes back, finds the old sandbox and tears it down.
    s.lab.start_node(&victim).await.unwrap();
    wait_for(
        "the old node's sandbox of db-0 torn down",
        Duration::from_secs(120),
        || async {
            let left: Vec<String> = sandboxes(&s, &ns, &[])
                .into_iter()
                .filter(|(node, _)| node == &victim)
                .map(|(_, a)| a.container_id)
                .collect();
            left.is_empty().then_some(()).ok_or(left)
        },
    )
    .await;
    // Two GC intervals more, then the new pod still holds both.
    tokio::time::sleep(Duration::from_secs(25)).await;
    held_for(second_uid).await;
    no_address_in_two_sandboxes(&s, &ns, &[]);
    let held = claims_in(&s.client, &ns).await;
    assert!(
        held.values().all(|h| h.node == moved_to && h.attached),
        "the claims name the new node's sandbox: {held:?}"
    );
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.wait_ready().await;
    s.no_refusals();
}

/// The controller leader frozen (its watches lag: it reads nothing while pods come and go),
/// then every controller replica restarted at once with cold caches while pods are created:
/// its GC releases nothing of a live pod, and nothing at all, since no address leaked.
/// Calico #5044 (kube-controllers' IPAM GC released addresses of running pods after a
/// restart, from a cache not yet synced), Whereabouts #75 (the reconciler released addresses
/// of pods it had not listed).
#[tokio::test]
async fn a_controller_with_a_lagging_watch_or_cold_caches_releases_nothing() {
    let test = "a_controller_with_a_lagging_watch_or_cold_caches_releases_nothing";
    let Some(s) = Suite::shared(test).await else {
        return;
    };
    let ns = s.namespace("cold").await;
    s.must_apply(&pool_yaml(
        "cold-v6",
        "2001:db8:1ab::/64",
        "2001:db8:1ab::1",
        "2001:db8:1ab::9:0-2001:db8:1ab::9:ff",
    ));
    let pools = pools_annotation("default-v4", "cold-v6");
    s.must_apply(&spread(&ns, "app", 8, &pools).yaml());
    s.ready_pods(&ns, "app=app", 8).await;

    // The leader frozen while pods are replaced and added.
    let leader = s.leader().await.expect("a leader");
    let controllers = s
        .pods(NAMESPACE, "app.kubernetes.io/component=controller")
        .await;
    let leader_pod = controllers
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(leader.as_str()))
        .unwrap_or_else(|| panic!("the leader {leader} among {controllers:?}"));
    s.signal_container(leader_pod, "controller", libc::SIGSTOP);
    let frozen_at = Instant::now();
    s.must(
        "kubectl",
        &["-n", &ns, "delete", "pod", "-l", "app=app", "--wait=false"],
    );
    s.must(
        "kubectl",
        &["-n", &ns, "scale", "deployment/app", "--replicas=12"],
    );
    // Frozen past its lease (6 s): another replica may lead meanwhile, and the frozen one, woken,
    // must notice it lost the lease before it releases anything.
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(frozen_at.elapsed())).await;
    s.signal_container(leader_pod, "controller", libc::SIGCONT);
    claims_are_the_running_pods(&s, &ns, 12).await;

    // Every replica restarted at once, cold, while pods are created.
    s.must(
        "kubectl",
        &[
            "-n",
            NAMESPACE,
            "delete",
            "pod",
            "-l",
            "app.kubernetes.io/component=controller",
            "--wait=false",
        ],
    );
    s.must(
        "kubectl",
        &["-n", &ns, "scale", "deployment/app", "--replicas=16"],
    );
    s.wait_ready().await;
    claims_are_the_running_pods(&s, &ns, 16).await;
    // Three GC intervals of the new leader, checking all along.
    let until = Instant::now() + Duration::from_secs(35);
    while Instant::now() < until {
        let pods = s.pods(&ns, "app=app").await;
        let held = claims_in(&s.client, &ns).await;
        for pod in pods.iter().filter(|p| running(p)) {
            for ip in pod_ips(pod) {
                assert_eq!(
                    held.get(&ip).map(|h| h.uid.as_str()),
                    pod.metadata.uid.as_deref(),
                    "{ip} of running pod {:?}",
                    pod.metadata.name
                );
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(gc_releases(&s, &ns, "cold-v6").await, Vec::<String>::new());
    no_address_in_two_sandboxes(&s, &ns, &[]);
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.must("kubectl", &["delete", "ippool", "cold-v6"]);
    s.no_refusals();
}

/// A pool of exactly four addresses per family serving a Deployment of four replicas, rolled
/// out one pod at a time, with the agent of a node that is replacing a pod killed mid-rollout:
/// the rollout finishes, four new pods run with the pool's four addresses. Spiderpool #2517
/// and #4916 (pods stuck without addresses after an agent restart: addresses of deleted pods
/// never given back to a full pool).
#[tokio::test]
async fn a_full_pool_rollout_finishes_with_an_agent_killed_midway() {
    let test = "a_full_pool_rollout_finishes_with_an_agent_killed_midway";
    let Some(s) = Suite::shared(test).await else {
        return;
    };
    let ns = s.namespace("full").await;
    s.must_apply(&pool_yaml(
        "full-v4",
        "198.51.100.0/24",
        "198.51.100.1",
        "198.51.100.104-198.51.100.107",
    ));
    s.must_apply(&pool_yaml(
        "full-v6",
        "2001:db8:1ab::/64",
        "2001:db8:1ab::1",
        "2001:db8:1ab::8:0-2001:db8:1ab::8:3",
    ));
    let pools = pools_annotation("full-v4", "full-v6");
    let strategy = "  strategy:\n    type: RollingUpdate\n    rollingUpdate: {maxSurge: 0, \
                    maxUnavailable: 1}\n";
    s.must_apply(&spread(&ns, "app", 4, &pools).spec(strategy).yaml());
    let before = s.ready_pods(&ns, "app=app", 4).await;
    let old: BTreeSet<String> = before
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let pool_ips: BTreeSet<IpAddr> = before.iter().flat_map(pod_ips).collect();
    assert_eq!(pool_ips.len(), 8);

    s.must(
        "kubectl",
        &["-n", &ns, "rollout", "restart", "deployment/app"],
    );
    // The first pod on its way out: kill its node's agent while it goes and its successor comes.
    let leaving = wait_for("a pod terminating", Duration::from_secs(60), || async {
        let pods = s.pods(&ns, "app=app").await;
        pods.into_iter()
            .find(|p| p.metadata.deletion_timestamp.is_some())
            .ok_or("none yet")
    })
    .await;
    let node = node_of(&leaving);
    let agent = s
        .pods(NAMESPACE, "app.kubernetes.io/component=agent")
        .await
        .into_iter()
        .find(|p| node_of(p) == node)
        .expect("the node's agent");
    s.kill_container(&agent, "agent");

    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "rollout",
            "status",
            "deployment/app",
            "--timeout=240s",
        ],
    );
    let after = claims_are_the_running_pods(&s, &ns, 4).await;
    assert!(
        after
            .iter()
            .all(|p| !old.contains(p.metadata.uid.as_ref().unwrap())),
        "all four pods are new"
    );
    let used: BTreeSet<IpAddr> = after.iter().flat_map(pod_ips).collect();
    assert_eq!(used, pool_ips, "the four new pods use the pool's addresses");
    for pool in ["full-v4", "full-v6"] {
        wait_for(
            &format!("{pool} counted full"),
            Duration::from_secs(30),
            || async {
                let counts = pool_counts(&s.client, pool).await;
                (counts == Some((4, 4))).then_some(()).ok_or(counts)
            },
        )
        .await;
    }
    no_address_in_two_sandboxes(&s, &ns, &[]);
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.must("kubectl", &["delete", "ippool", "full-v4", "full-v6"]);
    s.wait_ready().await;
    s.no_refusals();
}

/// A ValidatingAdmissionPolicy of the API server refuses every IPBlock write that adds a claim
/// of pool `pool`: each dual-stack ADD then fails between its IPv4 claim and its IPv6 one.
fn refuse_claims_of(pool: &str) -> String {
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: refuse-{pool}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {{apiGroups: [allot.dev], apiVersions: ["*"], operations: [CREATE, UPDATE], resources: [ipblocks]}}
  validations:
  - expression: >-
      !has(object.spec.claims) || object.spec.claims.all(k, object.spec.claims[k].pool != '{pool}'
      || (oldObject != null && has(oldObject.spec.claims) && k in oldObject.spec.claims))
    message: "injected: no new claim of {pool}"
    reason: Invalid
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: refuse-{pool}}}
spec:
  policyName: refuse-{pool}
  validationActions: [Deny]
"#
    )
}

/// API errors between the IPv4 and the IPv6 write of concurrent dual-stack ADDs (the API
/// server refuses every new IPv6 claim for a while): once the errors stop, claims = the
/// Endpoints' addresses = the running pods' addresses, the pools count what is held, and
/// scaling to zero leaves no claim. Whereabouts #712 (IPv4 addresses leaked when the IPv6
/// allocation of a dual-stack pod failed).
#[tokio::test]
async fn api_errors_between_the_ipv4_and_ipv6_writes_leave_no_half_claims() {
    let test = "api_errors_between_the_ipv4_and_ipv6_writes_leave_no_half_claims";
    let Some(s) = Suite::shared(test).await else {
        return;
    };
    let ns = s.namespace("halves").await;
    s.must_apply(&pool_yaml(
        "halves-v6",
        "2001:db8:1ab::/64",
        "2001:db8:1ab::1",
        "2001:db8:1ab::a:0-2001:db8:1ab::a:ff",
    ));
    s.must_apply(&refuse_claims_of("halves-v6"));
    // The policy is in force once a server-side dry run of such a write is refused.
    let probe = r#"{"apiVersion":"allot.dev/v1alpha1","kind":"IPBlock",
        "metadata":{"name":"v6-2001-db8-1ab--a-ff00-120"},
        "spec":{"cidr":"2001:db8:1ab::a:ff00/120","claims":{"2001:db8:1ab::a:ff00":
        {"pool":"halves-v6","network":"n","namespace":"x","pod":"p","uid":"u","updatedAt":1}}}}"#;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), probe).unwrap();
    let path = file.path().to_str().unwrap().to_string();
    wait_for("the policy in force", Duration::from_secs(60), || async {
        let out = s.kubectl(&["create", "--dry-run=server", "-f", &path]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (!out.status.success() && err.contains("injected"))
            .then_some(())
            .ok_or(err)
    })
    .await;

    let pools = pools_annotation("default-v4", "halves-v6");
    s.must_apply(&spread(&ns, "app", 6, &pools).yaml());
    // Long enough for every pod's ADD to be refused and retried a few times.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let pods = s.pods(&ns, "app=app").await;
    assert!(
        pods.iter().all(|p| pod_ips(p).is_empty()),
        "no pod got addresses while IPv6 claims were refused"
    );
    let half: Vec<IpAddr> = claims_in(&s.client, &ns).await.into_keys().collect();
    assert!(
        half.len() <= pods.len(),
        "at most one IPv4 claim per pod, mid-ADD: {half:?}"
    );

    s.must(
        "kubectl",
        &[
            "delete",
            "validatingadmissionpolicybinding",
            "refuse-halves-v6",
        ],
    );
    s.must(
        "kubectl",
        &["delete", "validatingadmissionpolicy", "refuse-halves-v6"],
    );
    let running = claims_are_the_running_pods(&s, &ns, 6).await;
    for pod in &running {
        let name = pod.metadata.name.clone().unwrap();
        assert_eq!(pod_ips(pod).len(), 2, "{name} is dual-stack");
        assert_eq!(
            endpoint_ips(&s.client, &ns, &name).await,
            pod_ips(pod),
            "{name}'s Endpoint"
        );
    }
    // Each pool counts exactly what the IPBlocks hold of it.
    for pool in ["default-v4", "halves-v6"] {
        wait_for(
            &format!("{pool} counts its claims"),
            Duration::from_secs(30),
            || async {
                let held = claims(&s.client)
                    .await
                    .values()
                    .filter(|h| h.pool == pool)
                    .count() as u64;
                let counts = pool_counts(&s.client, pool).await;
                (counts.map(|c| c.0) == Some(held))
                    .then_some(())
                    .ok_or((counts, held))
            },
        )
        .await;
    }
    s.must(
        "kubectl",
        &["-n", &ns, "scale", "deployment/app", "--replicas=0"],
    );
    wait_for(
        "no claim left in the namespace",
        Duration::from_secs(90),
        || async {
            let left: Vec<IpAddr> = claims_in(&s.client, &ns).await.into_keys().collect();
            left.is_empty().then_some(()).ok_or(left)
        },
    )
    .await;
    wait_for("halves-v6 empty", Duration::from_secs(30), || async {
        let counts = pool_counts(&s.client, "halves-v6").await;
        (counts.map(|c| c.0) == Some(0)).then_some(()).ok_or(counts)
    })
    .await;
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.must("kubectl", &["delete", "ippool", "halves-v6"]);
    s.no_refusals();
}
