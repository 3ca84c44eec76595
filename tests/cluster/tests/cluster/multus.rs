//! Multus in front of allot on real nodes: Multus's thin plugin installed from its own
//! DaemonSet manifest, NetworkAttachmentDefinitions of macvlan on each node's lab link with
//! allot as IPAM, and pods with eth0 from the cluster network (allot's conflist, which Multus
//! delegates to) and one or two allot NICs more. What Multus writes in each pod's
//! `network-status` annotation is what allot claimed and recorded, interface by interface, and
//! deleting the pods gives every address back.
//!
//! A lab of its own: Multus's `00-multus.conf` takes over every later pod's CNI calls on the
//! nodes, which the shared lab's other tests do not expect.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use allot_cluster_tests::objects::{Workload, claims_in, endpoint_ips, pod_ips, pool_yaml};
use allot_cluster_tests::sandboxes::{sandboxes, shared_addresses};
use allot_cluster_tests::{Suite, multus};
use allot_lab::testing::wait_for;
use k8s_openapi::api::core::v1::Pod;

const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// Interface → addresses, from a pod's `network-status` annotation (Multus's).
fn network_status(pod: &Pod) -> Option<BTreeMap<String, Vec<IpAddr>>> {
    let text = pod.metadata.annotations.as_ref()?.get(NETWORK_STATUS)?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{NETWORK_STATUS} is not JSON ({e}): {text}"));
    Some(
        entries
            .iter()
            .map(|e| {
                let interface = e["interface"].as_str().unwrap_or_default().to_string();
                let mut ips: Vec<IpAddr> = e["ips"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|ip| ip.as_str()?.parse().ok())
                    .collect();
                ips.sort();
                (interface, ips)
            })
            .collect(),
    )
}

/// Pods of `ns` labelled `app=<app>` once Multus has annotated all `count` of them.
async fn annotated(s: &Suite, ns: &str, app: &str, count: usize) -> Vec<Pod> {
    let pods = s.ready_pods(ns, &format!("app={app}"), count).await;
    wait_for(
        "Multus's network-status",
        Duration::from_secs(60),
        || async {
            let pods = s.pods(ns, &format!("app={app}")).await;
            pods.iter()
                .all(|p| network_status(p).is_some())
                .then_some(pods)
                .ok_or(())
        },
    )
    .await;
    let _ = pods;
    s.pods(ns, &format!("app={app}")).await
}

#[tokio::test]
async fn pods_with_allot_nics_through_multus_hold_what_network_status_says() {
    let Some(s) = Suite::own("multus", 2, |_| {}).await else {
        return;
    };
    s.install().await;
    multus::install(&s).await;
    let ns = s.namespace("multus").await;
    // Two secondary networks, each with pools of its own: the README's example (its
    // NetworkAttachmentDefinition in `default`, named by pods of other namespaces as
    // `default/second-nic`), and one more in the test's namespace.
    let example = allot_cluster_tests::root().join("examples/multus/second-nic.yaml");
    s.must("kubectl", &["apply", "-f", example.to_str().unwrap()]);
    for (pool, subnet, gateway, ips) in [
        (
            "net-b-v4",
            "203.0.113.0/24",
            "203.0.113.1",
            "203.0.113.96-203.0.113.127",
        ),
        (
            "net-b-v6",
            "2001:db8:3b::/64",
            "2001:db8:3b::1",
            "2001:db8:3b::10-2001:db8:3b::ff",
        ),
    ] {
        s.must_apply(&pool_yaml(pool, subnet, gateway, ips));
    }
    s.must_apply(&multus::macvlan_nad(&ns, "net-b", "net-b-v4", "net-b-v6"));
    s.must_apply(
        &[
            Workload::deployment(&ns, "one", 4)
                .grace(1)
                .annotate("k8s.v1.cni.cncf.io/networks", "default/second-nic"),
            Workload::deployment(&ns, "two", 4)
                .grace(1)
                .annotate("k8s.v1.cni.cncf.io/networks", "default/second-nic,net-b"),
        ]
        .map(|w| w.yaml())
        .join("---\n"),
    );
    let one = annotated(&s, &ns, "one", 4).await;
    let two = annotated(&s, &ns, "two", 4).await;

    let in_range = |ip: &IpAddr, net: &str| match (ip, net) {
        (IpAddr::V4(v4), "net1") => (64..96).contains(&v4.octets()[3]),
        (IpAddr::V4(v4), "net2") => (96..128).contains(&v4.octets()[3]),
        (IpAddr::V6(v6), "net1") => v6.segments()[2] == 0x3a,
        (IpAddr::V6(v6), "net2") => v6.segments()[2] == 0x3b,
        _ => false,
    };
    let mut used = BTreeSet::new();
    for (pods, nics) in [
        (&one, &["eth0", "net1"][..]),
        (&two, &["eth0", "net1", "net2"][..]),
    ] {
        for pod in pods.iter() {
            let name = pod.metadata.name.clone().unwrap();
            let status = network_status(pod).unwrap();
            let interfaces: Vec<&str> = status.keys().map(String::as_str).collect();
            assert_eq!(interfaces, nics, "{name}: {status:?}");
            // eth0 is the pod's cluster address, each further NIC one of each family from
            // its own network's pools.
            assert_eq!(status["eth0"], pod_ips(pod), "{name}: eth0");
            for nic in &nics[1..] {
                let ips = &status[*nic];
                assert_eq!(ips.len(), 2, "{name}: {nic} {ips:?}");
                assert!(
                    ips.iter().all(|ip| in_range(ip, nic)),
                    "{name}: {nic} {ips:?}"
                );
            }
            let all: Vec<IpAddr> = {
                let mut v: Vec<IpAddr> = status.values().flatten().copied().collect();
                v.sort();
                v
            };
            // allot's own record of the pod names the same addresses.
            assert_eq!(
                endpoint_ips(&s.client, &ns, &name).await,
                all,
                "{name}'s Endpoint"
            );
            for ip in all {
                assert!(used.insert(ip), "{ip} is in two pods' network-status");
            }
        }
    }
    let held: BTreeSet<IpAddr> = claims_in(&s.client, &ns).await.keys().copied().collect();
    assert_eq!(held, used, "allot's claims are what network-status lists");
    let shared = shared_addresses(&sandboxes(&s.lab.nodes(), &ns));
    assert!(shared.is_empty(), "{shared:?}");

    // Deleting the pods gives back every NIC's addresses (Multus calls DEL for each).
    s.must(
        "kubectl",
        &[
            "delete",
            "deployment",
            "one",
            "two",
            "-n",
            &ns,
            "--wait=true",
        ],
    );
    wait_for("every claim released", Duration::from_secs(120), || async {
        let held = claims_in(&s.client, &ns).await;
        held.is_empty().then_some(()).ok_or(held.len())
    })
    .await;
    s.no_refusals();
}
