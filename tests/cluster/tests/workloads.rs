//! Workloads as users run them on the real control plane: a Deployment with a Subnet
//! auto-pool scaled up, down and deleted, a StatefulSet pod moved to another node.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use allot_cluster_tests::Suite;
use allot_cluster_tests::objects::{claims_in, pod_ips};
use allot_k8s::IPPool;
use allot_lab::testing::wait_for;
use kube::api::{Api, ListParams};

fn subnet_yaml(name: &str, subnet: &str, gateway: &str, ips: &str) -> String {
    format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Subnet\nmetadata:\n  name: {name}\nspec:\n  \
         subnet: {subnet}\n  gateway: {gateway}\n  ips: [\"{ips}\"]\n"
    )
}

fn auto_deployment(ns: &str, replicas: u32) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {ns}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata:
      labels: {{app: web}}
      annotations: {{"ipam.allot.dev/subnet": '{{"ipv4":["auto-v4"],"ipv6":["auto-v6"]}}'}}
    spec:
      containers: [{{name: c, image: busybox, command: [sleep, "3600"]}}]
"#
    )
}

/// The auto-pools of Deployment `ns/web`: per family, its size.
async fn auto_pool_sizes(client: &kube::Client, ns: &str) -> Vec<(String, u128)> {
    let api: Api<IPPool> = Api::all(client.clone());
    let selector = format!(
        "ipam.allot.dev/owner-application-namespace={ns},ipam.allot.dev/owner-application-name=web"
    );
    let mut out: Vec<(String, u128)> = api
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let spec = p.spec.0;
            let family = if spec.subnet.contains(':') {
                "v6"
            } else {
                "v4"
            };
            let size = spec
                .ips
                .iter()
                .map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    let (a, b): (IpAddr, IpAddr) = (a.parse().unwrap(), b.parse().unwrap());
                    let n = |ip: IpAddr| match ip {
                        IpAddr::V4(v) => u128::from(u32::from(v)),
                        IpAddr::V6(v) => u128::from(v),
                    };
                    n(b) - n(a) + 1
                })
                .sum();
            (family.to_string(), size)
        })
        .collect();
    out.sort();
    out
}

/// Waits until web's auto-pools have `want` sizes per family.
async fn sizes(s: &Suite, ns: &str, want: &[(&str, u128)]) {
    let want: Vec<(String, u128)> = want.iter().map(|(f, n)| (f.to_string(), *n)).collect();
    wait_for(
        &format!("web's auto-pools of {want:?}"),
        Duration::from_secs(120),
        || async {
            let now = auto_pool_sizes(&s.client, ns).await;
            (now == want).then_some(()).ok_or(now)
        },
    )
    .await
}

/// A Deployment naming Subnets gets pools carved for it alone, replicas + 1 addresses per
/// family: its pods start with addresses from them; scaled 2 → 5 → 1 the pools grow and then
/// shrink to what the remaining pod holds; deleted, its pools go.
#[tokio::test]
async fn a_subnet_auto_pool_follows_its_deployment() {
    let Some(s) = Suite::shared("a_subnet_auto_pool_follows_its_deployment").await else {
        return;
    };
    let ns = s.namespace("auto").await;
    s.must_apply(&subnet_yaml(
        "auto-v4",
        "198.51.100.0/24",
        "198.51.100.1",
        "198.51.100.224-198.51.100.254",
    ));
    s.must_apply(&subnet_yaml(
        "auto-v6",
        "2001:db8:1ab::/64",
        "2001:db8:1ab::1",
        "2001:db8:1ab::3:0-2001:db8:1ab::3:ffff",
    ));
    let from_auto_pools = |ips: &[IpAddr]| {
        ips.iter().all(|ip| match ip {
            IpAddr::V4(v) => v.octets()[3] >= 224,
            IpAddr::V6(v) => v.segments()[6] == 3,
        })
    };

    s.must_apply(&auto_deployment(&ns, 2));
    sizes(&s, &ns, &[("v4", 3), ("v6", 3)]).await;
    for pod in s.ready_pods(&ns, "app=web", 2).await {
        assert!(from_auto_pools(&pod_ips(&pod)), "{:?}", pod_ips(&pod));
    }

    s.must(
        "kubectl",
        &["-n", &ns, "scale", "deployment/web", "--replicas=5"],
    );
    sizes(&s, &ns, &[("v4", 6), ("v6", 6)]).await;
    let pods = s.ready_pods(&ns, "app=web", 5).await;
    let used: BTreeSet<IpAddr> = pods.iter().flat_map(pod_ips).collect();
    assert_eq!(used.len(), 10, "ten addresses, none twice");
    assert!(from_auto_pools(&used.iter().copied().collect::<Vec<_>>()));

    s.must(
        "kubectl",
        &["-n", &ns, "scale", "deployment/web", "--replicas=1"],
    );
    let left = s.ready_pods(&ns, "app=web", 1).await.remove(0);
    wait_for(
        "the other pods' addresses released",
        Duration::from_secs(120),
        || async {
            let held: BTreeSet<IpAddr> = claims_in(&s.client, &ns).await.keys().copied().collect();
            let kept: BTreeSet<IpAddr> = pod_ips(&left).into_iter().collect();
            (held == kept).then_some(()).ok_or(held)
        },
    )
    .await;
    sizes(&s, &ns, &[("v4", 2), ("v6", 2)]).await;

    s.must(
        "kubectl",
        &["-n", &ns, "delete", "deployment", "web", "--wait=true"],
    );
    sizes(&s, &ns, &[]).await;
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.must(
        "kubectl",
        &["delete", "subnet", "auto-v4", "auto-v6", "--wait=true"],
    );
    s.no_refusals();
}

/// A StatefulSet pod deleted and scheduled again on another node (its node cordoned) comes back
/// with the same addresses, and nobody else held them meanwhile.
#[tokio::test]
async fn a_statefulset_pod_rescheduled_on_another_node_keeps_its_addresses() {
    let Some(s) =
        Suite::shared("a_statefulset_pod_rescheduled_on_another_node_keeps_its_addresses").await
    else {
        return;
    };
    let ns = s.namespace("stateful").await;
    s.must_apply(&format!(
        r#"apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: db, namespace: {ns}}}
spec:
  replicas: 1
  serviceName: db
  selector: {{matchLabels: {{app: db}}}}
  template:
    metadata: {{labels: {{app: db}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{{name: c, image: busybox, command: [sleep, "3600"]}}]
"#
    ));
    let first = s.ready_pods(&ns, "app=db", 1).await.remove(0);
    let node = first.spec.as_ref().unwrap().node_name.clone().unwrap();
    let ips = pod_ips(&first);

    s.must("kubectl", &["cordon", &node]);
    s.must(
        "kubectl",
        &["-n", &ns, "delete", "pod", "db-0", "--wait=true"],
    );
    let second = wait_for(
        "db-0 back on another node",
        Duration::from_secs(120),
        || async {
            let pods = s.ready_pods(&ns, "app=db", 1).await;
            let pod = pods.into_iter().next().unwrap();
            let uid = pod.metadata.uid.clone();
            (uid != first.metadata.uid).then_some(pod).ok_or(uid)
        },
    )
    .await;
    s.must("kubectl", &["uncordon", &node]);
    let moved_to = second.spec.as_ref().unwrap().node_name.clone().unwrap();
    assert_ne!(moved_to, node);
    assert_eq!(
        pod_ips(&second),
        ips,
        "db-0 keeps its addresses on {moved_to}"
    );
    let held = claims_in(&s.client, &ns).await;
    assert_eq!(held.keys().copied().collect::<Vec<_>>(), ips);
    for h in held.values() {
        assert_eq!(h.uid, second.metadata.uid.clone().unwrap());
        assert_eq!(
            h.node, moved_to,
            "the claim names the node that took it back"
        );
    }
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.no_refusals();
}
