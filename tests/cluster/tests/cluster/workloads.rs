//! Workloads as users run them on the real control plane: a Deployment with a Subnet
//! auto-pool scaled up, down and deleted, an OpenKruise CloneSet with one, a StatefulSet pod
//! moved to another node.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use allot_cluster_tests::Suite;
use allot_cluster_tests::objects::{Workload, claims_in, pod_ips};
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
    Workload::deployment(ns, "web", replicas)
        .annotate(
            "ipam.allot.dev/subnet",
            r#"{"ipv4":["auto-v4"],"ipv6":["auto-v6"]}"#,
        )
        .yaml()
}

/// The Subnets auto-v4 (198.51.100.224-.254) and auto-v6 (2001:db8:1ab::G:0/112, G =
/// `v6_group`) a test carves auto pools from.
fn apply_auto_subnets(s: &Suite, v6_group: u16) {
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
        &format!("2001:db8:1ab::{v6_group:x}:0-2001:db8:1ab::{v6_group:x}:ffff"),
    ));
}

/// Whether every one of `ips` lies in the Subnets [`apply_auto_subnets`] made.
fn from_auto_subnets(ips: &[IpAddr], v6_group: u16) -> bool {
    ips.iter().all(|ip| match ip {
        IpAddr::V4(v) => v.octets()[3] >= 224,
        IpAddr::V6(v) => v.segments()[6] == v6_group,
    })
}

/// The auto-pools of workload `ns/owner`: per family, its size.
async fn auto_pool_sizes(client: &kube::Client, ns: &str, owner: &str) -> Vec<(String, u128)> {
    let api: Api<IPPool> = Api::all(client.clone());
    let selector = format!(
        "ipam.allot.dev/owner-application-namespace={ns},ipam.allot.dev/owner-application-name={owner}"
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

/// Waits until Deployment web's auto-pools have `want` sizes per family.
async fn sizes(s: &Suite, ns: &str, want: &[(&str, u128)]) {
    sizes_of(s, ns, "web", want).await
}

/// Waits until `owner`'s auto-pools have `want` sizes per family.
async fn sizes_of(s: &Suite, ns: &str, owner: &str, want: &[(&str, u128)]) {
    let want: Vec<(String, u128)> = want.iter().map(|(f, n)| (f.to_string(), *n)).collect();
    wait_for(
        &format!("{owner}'s auto-pools of {want:?}"),
        Duration::from_secs(120),
        || async {
            let now = auto_pool_sizes(&s.client, ns, owner).await;
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
    apply_auto_subnets(&s, 3);
    let from_auto_pools = |ips: &[IpAddr]| from_auto_subnets(ips, 3);

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

/// A CloneSet's pods, as OpenKruise's controller makes them (no Kruise controller runs here:
/// the test stands in for it): named after the set, owned by it, with its template's labels and
/// annotations.
fn cloneset_pod(ns: &str, uid: &str, instance: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: clone-{instance}
  namespace: {ns}
  labels: {{app: clone, apps.kruise.io/cloneset-instance-id: "{instance}", controller-revision-hash: clone-6d5c8b9f7}}
  annotations: {{"ipam.allot.dev/subnet": '{{"ipv4":["auto-v4"],"ipv6":["auto-v6"]}}'}}
  ownerReferences:
    - {{apiVersion: apps.kruise.io/v1alpha1, kind: CloneSet, name: clone, uid: "{uid}", controller: true, blockOwnerDeletion: true}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{{name: c, image: busybox, command: [sleep, "3600"]}}]
"#
    )
}

/// A kind with a scale subresource in a group the chart does not grant: discovered, never read.
const WIDGET_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.scale.example.com}
spec:
  group: scale.example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}}
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"#;

/// An OpenKruise CloneSet (Kruise's own CRD at a pinned release) naming Subnets gets auto
/// pools like a Deployment: sized through its scale subresource, grown by `kubectl scale`, its
/// pods served from them, and gone with it (the real garbage collector deletes its pods, the
/// pools follow once their addresses are released). A scalable kind of a group the chart does
/// not grant is left alone: never listed (no refusal in the audit log), no pool for it.
#[tokio::test]
async fn a_cloneset_gets_auto_pools_like_a_deployment() {
    let Some(s) = Suite::shared("a_cloneset_gets_auto_pools_like_a_deployment").await else {
        return;
    };
    let crds = allot_cluster_tests::peers::crds_dir("kruise");
    s.must(
        "kubectl",
        &[
            "apply",
            "--server-side",
            "-f",
            crds.join("apps.kruise.io_clonesets.yaml").to_str().unwrap(),
        ],
    );
    s.must_apply(WIDGET_CRD);
    s.must(
        "kubectl",
        &[
            "wait",
            "--for=condition=Established",
            "crd/clonesets.apps.kruise.io",
            "crd/widgets.scale.example.com",
        ],
    );
    let ns = s.namespace("kruise").await;
    apply_auto_subnets(&s, 7);
    let template = r#"
  selector: {matchLabels: {app: clone}}
  template:
    metadata:
      labels: {app: clone}
      annotations: {"ipam.allot.dev/subnet": '{"ipv4":["auto-v4"],"ipv6":["auto-v6"]}'}
    spec:
      containers: [{name: c, image: busybox, command: [sleep, "3600"]}]
"#;
    s.must_apply(&format!(
        "apiVersion: apps.kruise.io/v1alpha1\nkind: CloneSet\nmetadata: {{name: clone, namespace: {ns}}}\nspec:\n  replicas: 2{template}"
    ));
    s.must_apply(&format!(
        "apiVersion: scale.example.com/v1\nkind: Widget\nmetadata: {{name: widget, namespace: {ns}}}\nspec:\n  replicas: 2{template}"
    ));
    sizes_of(&s, &ns, "clone", &[("v4", 3), ("v6", 3)]).await;
    let uid = s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "get",
            "clonesets.apps.kruise.io",
            "clone",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
    );
    let from_auto_pools = |ips: &[IpAddr]| ips.len() == 2 && from_auto_subnets(ips, 7);
    for instance in ["a1b2c", "d3e4f"] {
        s.must_apply(&cloneset_pod(&ns, &uid, instance));
    }
    for pod in s.ready_pods(&ns, "app=clone", 2).await {
        assert!(from_auto_pools(&pod_ips(&pod)), "{:?}", pod_ips(&pod));
    }

    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "scale",
            "clonesets.apps.kruise.io/clone",
            "--replicas=4",
        ],
    );
    sizes_of(&s, &ns, "clone", &[("v4", 5), ("v6", 5)]).await;
    for instance in ["g5h6i", "j7k8l"] {
        s.must_apply(&cloneset_pod(&ns, &uid, instance));
    }
    let pods = s.ready_pods(&ns, "app=clone", 4).await;
    let used: BTreeSet<IpAddr> = pods.iter().flat_map(pod_ips).collect();
    assert_eq!(used.len(), 8, "eight addresses, none twice");
    for pod in &pods {
        assert!(from_auto_pools(&pod_ips(pod)), "{:?}", pod_ips(pod));
    }
    assert_eq!(
        auto_pool_sizes(&s.client, &ns, "widget").await,
        [],
        "a kind allot-controller may not read gets no pool"
    );

    // Deleted: the garbage collector deletes its pods, their addresses are released, the
    // pools go.
    s.must(
        "kubectl",
        &[
            "-n",
            &ns,
            "delete",
            "clonesets.apps.kruise.io",
            "clone",
            "--wait=true",
        ],
    );
    sizes_of(&s, &ns, "clone", &[]).await;
    assert!(claims_in(&s.client, &ns).await.is_empty());
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.must(
        "kubectl",
        &["delete", "subnet", "auto-v4", "auto-v6", "--wait=true"],
    );
    s.must(
        "kubectl",
        &[
            "delete",
            "crd",
            "clonesets.apps.kruise.io",
            "widgets.scale.example.com",
            "--wait=true",
        ],
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
    s.must_apply(&Workload::statefulset(&ns, "db", 1).grace(1).yaml());
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
