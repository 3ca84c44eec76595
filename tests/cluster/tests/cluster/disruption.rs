//! What goes wrong in a cluster, on the real control plane: a node lost without DELs, the
//! controller's leader killed while it releases, the API server and etcd restarted under a
//! stream of new pods. No address is ever held twice, none a live pod uses is released, and
//! allot resumes by itself.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use allot_cluster_tests::objects::{
    Workload, claims, claims_in, pod_ips, pool_yaml, pools_annotation,
};
use allot_cluster_tests::{NAMESPACE, Suite};
use allot_k8s::{BlockClaim, IPBlock, IPBlockSpec};
use allot_lab::Component;
use allot_lab::testing::wait_for;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};

/// Every live pod of `pods` still holds its addresses, claimed for its UID.
async fn live_pods_keep_theirs(s: &Suite, ns: &str, pods: &[Pod]) {
    let held = claims_in(&s.client, ns).await;
    for pod in pods {
        for ip in pod_ips(pod) {
            let h = held
                .get(&ip)
                .unwrap_or_else(|| panic!("{ip} of live pod {:?} was released", pod.metadata.name));
            assert_eq!(
                Some(&h.uid),
                pod.metadata.uid.as_ref(),
                "{ip} held for another pod"
            );
        }
    }
}

fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap()
}

/// A node lost without DELs (its stand-in and containers killed) and its pods force-deleted,
/// as an operator does: the controller releases those addresses after its grace period, and
/// never one a live pod on the other nodes uses.
#[tokio::test]
async fn a_lost_nodes_addresses_are_released_and_no_live_pods() {
    let Some(s) = Suite::shared("a_lost_nodes_addresses_are_released_and_no_live_pods").await
    else {
        return;
    };
    let ns = s.namespace("lost").await;
    s.must_apply(
        &Workload::deployment(&ns, "app", 6)
            .grace(1)
            .spread("ScheduleAnyway")
            .yaml(),
    );
    let pods = s.ready_pods(&ns, "app=app", 6).await;
    // The node of a pod that no controller replica runs on, if there is one: a lost leader is
    // the next test's.
    let controllers: BTreeSet<String> = s
        .pods(NAMESPACE, "app.kubernetes.io/component=controller")
        .await
        .iter()
        .map(node_of)
        .collect();
    let victim = pods
        .iter()
        .map(node_of)
        .find(|n| !controllers.contains(n))
        .unwrap_or_else(|| node_of(&pods[0]));
    let (lost, live): (Vec<Pod>, Vec<Pod>) = pods.into_iter().partition(|p| node_of(p) == victim);
    assert!(!lost.is_empty() && !live.is_empty());
    let lost_ips: BTreeSet<IpAddr> = lost.iter().flat_map(pod_ips).collect();

    s.lab.stop_node(&victim).await.unwrap();
    s.must("kubectl", &["cordon", &victim]);
    for pod in &lost {
        let name = pod.metadata.name.clone().unwrap();
        s.must(
            "kubectl",
            &[
                "-n",
                &ns,
                "delete",
                "pod",
                &name,
                "--force",
                "--grace-period=0",
            ],
        );
    }
    // Their replacements start elsewhere; the lost pods' claims go, the live ones' stay.
    let after = s.ready_pods(&ns, "app=app", 6).await;
    wait_for(
        "the lost pods' addresses released",
        Duration::from_secs(180),
        || async {
            let held: BTreeSet<IpAddr> = claims_in(&s.client, &ns).await.keys().copied().collect();
            let still: Vec<&IpAddr> = lost_ips.intersection(&held).collect();
            // A lost address may be handed to a replacement meanwhile: then it is held for it.
            let reused: BTreeSet<IpAddr> = after.iter().flat_map(pod_ips).collect();
            let leaked: Vec<&&IpAddr> = still.iter().filter(|ip| !reused.contains(ip)).collect();
            leaked.is_empty().then_some(()).ok_or(format!("{leaked:?}"))
        },
    )
    .await;
    live_pods_keep_theirs(&s, &ns, &live).await;
    live_pods_keep_theirs(&s, &ns, &after).await;
    let held = claims_in(&s.client, &ns).await;
    let used: BTreeSet<IpAddr> = after.iter().flat_map(pod_ips).collect();
    assert_eq!(held.keys().copied().collect::<BTreeSet<_>>(), used);

    s.lab.start_node(&victim).await.unwrap();
    s.must("kubectl", &["uncordon", &victim]);
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.wait_ready().await;
    s.no_refusals();
}

/// Claims left by pods that no longer exist (as a crashed node leaves them), in IPBlocks of a
/// pool of their own: `count` addresses of `2001:db8:1ab::4:…`.
async fn plant_leaks(s: &Suite, pool: &str, count: u16) -> BTreeSet<IpAddr> {
    let blocks: Api<IPBlock> = Api::all(s.client.clone());
    let mut by_block: BTreeMap<String, (String, BTreeMap<String, BlockClaim>)> = BTreeMap::new();
    let mut planted = BTreeSet::new();
    for i in 0..count {
        let address: IpAddr = format!("2001:db8:1ab::4:{i:x}").parse().unwrap();
        let block = allot_core::block::block_of(address);
        let entry = by_block
            .entry(allot_core::block::block_name(&block))
            .or_insert_with(|| (block.to_string(), BTreeMap::new()));
        entry.1.insert(
            address.to_string(),
            BlockClaim {
                pool: pool.to_string(),
                network: "allot-underlay".into(),
                container_id: Some(format!("{:064x}", u64::from(i) + 1)),
                interface: Some("eth0".into()),
                namespace: "gone".into(),
                pod: format!("gone-{i}"),
                uid: format!("00000000-0000-4000-8000-{i:012x}"),
                node: "node-that-died".into(),
                updated_at: 1_700_000_000,
                ..Default::default()
            },
        );
        planted.insert(address);
    }
    for (name, (cidr, claims)) in by_block {
        let block = IPBlock {
            metadata: ObjectMeta {
                name: Some(name),
                ..Default::default()
            },
            spec: IPBlockSpec {
                cidr,
                node: Some("node-that-died".into()),
                claims,
                released: BTreeMap::new(),
            },
        };
        // Created, or (a block an earlier run emptied) given these claims.
        let name = block.metadata.name.clone().unwrap();
        let apply = kube::api::PatchParams::apply("allot-cluster-tests").force();
        blocks
            .patch(&name, &apply, &kube::api::Patch::Apply(&block))
            .await
            .unwrap();
    }
    planted
}

/// The controller's leader killed while it releases 2,000 leaked addresses of a pool that holds
/// nothing else, while new pods wait for addresses of that pool: the other replica takes over
/// and finishes; the new pods get released addresses, and none of them loses its address to a
/// release (no address is released twice: the Events of both replicas count at most what was
/// leaked).
#[tokio::test]
async fn the_leader_killed_mid_release_hands_over_and_nothing_is_released_twice() {
    let Some(s) =
        Suite::shared("the_leader_killed_mid_release_hands_over_and_nothing_is_released_twice")
            .await
    else {
        return;
    };
    const LEAKS: u16 = 2000;
    // A name of this run's own: Events of an earlier run's pool of that name last an hour.
    let pool = format!(
        "leaky-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    );
    s.must_apply(&pool_yaml(
        &pool,
        "2001:db8:1ab::/64",
        "2001:db8:1ab::1",
        "2001:db8:1ab::4:0-2001:db8:1ab::4:7cf",
    ));
    let planted = plant_leaks(&s, &pool, LEAKS).await;
    let leaked_left = || async {
        claims(&s.client)
            .await
            .iter()
            .filter(|(ip, h)| planted.contains(ip) && h.namespace == "gone")
            .count()
    };
    // Pods that can only start with released addresses of the pool.
    let ns = s.namespace("leader").await;
    s.must_apply(
        &Workload::deployment(&ns, "takers", 20)
            .pools(&pools_annotation("default-v4", &pool))
            .yaml(),
    );
    let first = s.leader().await.expect("a leader");
    wait_for("the leader releasing", Duration::from_secs(120), || async {
        let left = leaked_left().await;
        (left < usize::from(LEAKS)).then_some(()).ok_or(left)
    })
    .await;
    let leader_pod = s
        .pods(NAMESPACE, "app.kubernetes.io/component=controller")
        .await
        .into_iter()
        .find(|p| p.metadata.name.as_deref() == Some(first.as_str()))
        .expect("the leader's pod");
    let left_at_kill = leaked_left().await;
    s.kill_container(&leader_pod, "controller");
    println!("killed leader {first} with {left_at_kill} of {LEAKS} leaks left");

    wait_for("every leak released", Duration::from_secs(240), || async {
        let left = leaked_left().await;
        (left == 0).then_some(()).ok_or(left)
    })
    .await;
    let takers = s.ready_pods(&ns, "app=takers", 20).await;
    // Give a stale release every chance to show: two more scans.
    tokio::time::sleep(Duration::from_secs(25)).await;
    live_pods_keep_theirs(&s, &ns, &takers).await;
    let events: Api<Event> = Api::all(s.client.clone());
    let released: usize = events
        .list(&ListParams::default().fields(&format!(
            "involvedObject.name={pool},reason=LeakedAddressesReleased"
        )))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|e| {
            let note = e.message.as_deref()?;
            let each = note
                .strip_prefix("released ")?
                .split_whitespace()
                .next()?
                .parse::<usize>()
                .ok()?;
            // An Event repeated with the same note is one object with a count (a series).
            let times = e
                .series
                .as_ref()
                .and_then(|s| s.count)
                .or(e.count)
                .unwrap_or(1)
                .max(1);
            Some(each * times as usize)
        })
        .sum();
    println!("the replicas' Events count {released} releases of {LEAKS} leaks");
    assert!(
        released <= planted.len(),
        "{released} releases counted for {} leaks: some address was released twice",
        planted.len()
    );
    wait_for("a leader again", Duration::from_secs(60), || async {
        s.leader().await.ok_or("none")
    })
    .await;
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    wait_for(
        "the takers' addresses released",
        Duration::from_secs(120),
        || async {
            let held = claims_in(&s.client, &ns).await.len();
            (held == 0).then_some(()).ok_or(held)
        },
    )
    .await;
    s.must("kubectl", &["delete", "ippool", &pool, "--wait=true"]);
    s.wait_ready().await;
    s.no_refusals();
}

fn pod_yaml(ns: &str, name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: stream}}}}\n\
         spec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: busybox, command: [sleep, \"3600\"]}}]\n"
    )
}

/// Pods created one after another while the API server, then etcd, restart: every pod ends up
/// with addresses of its own, the IPBlocks hold exactly those, and nobody had to step in.
#[tokio::test]
async fn api_server_and_etcd_restarts_under_new_pods_lose_and_double_nothing() {
    let Some(s) =
        Suite::shared("api_server_and_etcd_restarts_under_new_pods_lose_and_double_nothing").await
    else {
        return;
    };
    let ns = s.namespace("restarts").await;
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), &ns);
    let mut made = 0;
    for phase in [Some(Component::KubeApiserver), Some(Component::Etcd), None] {
        for _ in 0..8 {
            made += 1;
            let name = format!("p{made}");
            let pod: Pod = serde_yaml::from_str(&pod_yaml(&ns, &name)).unwrap();
            // Through a restart a create may fail: a user (or a controller) retries it.
            wait_for(
                &format!("creating {name}"),
                Duration::from_secs(120),
                || async {
                    match pods.create(&PostParams::default(), &pod).await {
                        Ok(_) => Ok(()),
                        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                        Err(e) => Err(e.to_string()),
                    }
                },
            )
            .await;
        }
        if let Some(component) = phase {
            s.lab.restart(component).await.unwrap();
        }
    }
    let running = s.ready_pods(&ns, "app=stream", made).await;
    let mut used = BTreeSet::new();
    for pod in &running {
        for ip in pod_ips(pod) {
            assert!(used.insert(ip), "{ip} handed out twice");
        }
    }
    live_pods_keep_theirs(&s, &ns, &running).await;
    let held: BTreeSet<IpAddr> = claims_in(&s.client, &ns).await.keys().copied().collect();
    assert_eq!(held, used, "the IPBlocks hold exactly the pods' addresses");
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.wait_ready().await;
    s.no_refusals();
}
