//! A StatefulSet's declared addresses (`ipam.allot.dev/ordinal-ips`) at admission: refused in
//! a pool its pods may not use (the pool's namespaceName, namespaceAffinity or podAffinity
//! against its namespace, the namespace's labels and the pod template's labels), allowed in
//! one they may, through the handler the HTTPS server calls.

use crate::common::admission::Cluster;
use serde_json::{Value, json};

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn ippool(name: &str, subnet: &str, ips: &str, tenancy: Value) -> Value {
    let mut spec = json!({"subnet": subnet, "ips": [ips]});
    spec.as_object_mut()
        .unwrap()
        .extend(tenancy.as_object().unwrap().clone());
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": name},
           "spec": spec})
}

/// StatefulSet `namespace/db` whose pod template is labelled `labels` and declares `ipv4`.
fn statefulset(namespace: &str, labels: Value, ipv4: &[&str]) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"namespace": namespace, "name": "db"},
        "spec": {
            "replicas": 3, "serviceName": "db",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "ipam.allot.dev/ordinal-ips": json!({"ipv4": ipv4}).to_string(),
                    },
                },
                "spec": {"containers": [{"name": "db", "image": "postgres"}]},
            },
        },
    })
}

/// Two tenants' namespaces and the pools of a cluster that keeps them apart.
fn cluster() -> Cluster {
    Cluster::new(
        &[
            ("namespaces", namespace("team-a", json!({"tenant": "a"}))),
            ("namespaces", namespace("team-b", json!({"tenant": "b"}))),
            (
                "ippools",
                ippool(
                    "team-a-v4",
                    "192.0.2.0/24",
                    "192.0.2.10-192.0.2.19",
                    json!({"namespaceName": ["team-a"]}),
                ),
            ),
            (
                "ippools",
                ippool(
                    "team-b-v4",
                    "198.51.100.0/24",
                    "198.51.100.10-198.51.100.19",
                    json!({"namespaceName": ["team-b"]}),
                ),
            ),
            (
                "ippools",
                ippool(
                    "tenant-b-v4",
                    "203.0.113.0/24",
                    "203.0.113.10-203.0.113.19",
                    json!({"namespaceAffinity": {"matchLabels": {"tenant": "b"}}}),
                ),
            ),
            (
                "ippools",
                ippool(
                    "db-only-v4",
                    "10.1.0.0/24",
                    "10.1.0.10-10.1.0.19",
                    json!({"podAffinity": {"matchLabels": {"app": "db"}}}),
                ),
            ),
            (
                "ippools",
                ippool("shared-v4", "10.2.0.0/24", "10.2.0.10-10.2.0.19", json!({})),
            ),
            (
                "ippools",
                ippool(
                    "tenant-a-v4",
                    "10.3.0.0/24",
                    "10.3.0.10-10.3.0.19",
                    json!({"namespaceAffinity": {"matchExpressions": [
                        {"key": "tenant", "operator": "In", "values": ["a"]}]}}),
                ),
            ),
            (
                // namespaceName decides alone when set, as the default policy's filter: the
                // affinity beside it is not looked at.
                "ippools",
                ippool(
                    "named-a-v4",
                    "10.4.0.0/24",
                    "10.4.0.10-10.4.0.19",
                    json!({"namespaceName": ["team-a"],
                           "namespaceAffinity": {"matchLabels": {"tenant": "b"}}}),
                ),
            ),
            (
                // Where a pool serves is not whom: a pod's node is not known at admission.
                "ippools",
                ippool(
                    "node-1-v4",
                    "10.5.0.0/24",
                    "10.5.0.10-10.5.0.19",
                    json!({"nodeName": ["node-1"]}),
                ),
            ),
        ],
        &[],
    )
}

fn app(name: &str) -> Value {
    json!({"app": name})
}

#[tokio::test]
async fn another_namespaces_pool_by_namespace_name_is_refused_naming_pool_workload_and_fix() {
    let c = cluster();
    let theirs = statefulset("team-a", app("db"), &["198.51.100.10-198.51.100.12"]);
    let message = c
        .denied(
            "CREATE",
            Some(&theirs),
            None,
            &[
                "ipam.allot.dev/ordinal-ips: 198.51.100.10-198.51.100.12 are in IPPool \
                 team-b-v4, which pods of StatefulSet team-a/db may not use",
                "its namespaceName [\"team-b\"] does not name namespace team-a",
                "declare addresses of a pool that serves team-a, or have the pool's owner add \
                 team-a to its namespaceName",
            ],
        )
        .await;
    // One refusal for the pool, not one per address.
    assert_eq!(message.matches("team-b-v4").count(), 1, "{message}");
    let r = c.validate("CREATE", Some(&theirs), None).await;
    assert_eq!((r.result.code, r.result.reason.as_str()), (422, "Invalid"));
    // Naming the pool in the template's ippool annotation does not make it team-a's.
    let mut named = theirs.clone();
    named["spec"]["template"]["metadata"]["annotations"]["ipam.allot.dev/ippool"] =
        json!(r#"{"ipv4":["team-b-v4"]}"#);
    c.denied("CREATE", Some(&named), None, &["may not use"])
        .await;
    // team-b's own StatefulSet may declare them.
    let own = statefulset("team-b", app("db"), &["198.51.100.10-198.51.100.12"]);
    c.allowed("CREATE", Some(&own), None).await;
}

#[tokio::test]
async fn another_tenants_pool_by_namespace_affinity_is_refused_by_the_namespaces_labels() {
    let c = cluster();
    let theirs = statefulset("team-a", app("db"), &["203.0.113.10"]);
    c.denied(
        "CREATE",
        Some(&theirs),
        None,
        &[
            "203.0.113.10 is in IPPool tenant-b-v4, which pods of StatefulSet team-a/db may \
             not use: the labels of namespace team-a do not match its namespaceAffinity",
        ],
    )
    .await;
    c.allowed(
        "CREATE",
        Some(&statefulset("team-b", app("db"), &["203.0.113.10"])),
        None,
    )
    .await;
    // The namespace is read at each admission: labelled for tenant b, team-a may.
    c.server
        .edit("namespaces", namespace("team-a", json!({"tenant": "b"})));
    c.allowed("CREATE", Some(&theirs), None).await;
}

#[tokio::test]
async fn a_pool_whose_pod_affinity_the_template_does_not_match_is_refused() {
    let c = cluster();
    let web = statefulset("team-a", app("web"), &["10.1.0.10-10.1.0.11"]);
    c.denied(
        "CREATE",
        Some(&web),
        None,
        &[
            "10.1.0.10-10.1.0.11 are in IPPool db-only-v4, which pods of StatefulSet \
             team-a/db may not use: the labels of the pod template do not match its \
             podAffinity; label the pod template as the pool's podAffinity asks",
        ],
    )
    .await;
    let db = statefulset("team-a", app("db"), &["10.1.0.10-10.1.0.11"]);
    c.allowed("CREATE", Some(&db), None).await;
}

#[tokio::test]
async fn pools_the_workloads_pods_may_use_are_allowed() {
    let c = cluster();
    for declared in [
        // Its namespace's pool, by namespaceName.
        "192.0.2.10-192.0.2.12",
        // A pool for every namespace and pod.
        "10.2.0.10-10.2.0.12",
        // Its tenant's pool, by namespaceAffinity (matchExpressions).
        "10.3.0.10-10.3.0.12",
        // namespaceName names it, whatever the affinity beside it says.
        "10.4.0.10-10.4.0.12",
        // A pool pinned to a node: which node a pod lands on is the scheduler's, later.
        "10.5.0.10-10.5.0.12",
    ] {
        let set = statefulset("team-a", app("web"), &[declared]);
        c.allowed("CREATE", Some(&set), None).await;
    }
    // Several pools at once, each allowed.
    let mixed = statefulset(
        "team-a",
        app("db"),
        &["192.0.2.10", "10.1.0.10", "10.2.0.10"],
    );
    c.allowed("CREATE", Some(&mixed), None).await;
}

#[tokio::test]
async fn only_a_change_of_the_template_is_judged_so_a_pool_changed_since_holds_nothing_up() {
    let c = cluster();
    // Stored before this check existed (or before team-b-v4 was restricted).
    let old = statefulset("team-a", app("db"), &["198.51.100.10"]);
    let mut scaled = old.clone();
    scaled["spec"]["replicas"] = json!(1);
    c.allowed("UPDATE", Some(&scaled), Some(&old)).await;
    let mut deleting = old.clone();
    deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    c.allowed("UPDATE", Some(&deleting), Some(&old)).await;
    // A change of the list is judged, as a change of the labels would be.
    let grown = statefulset("team-a", app("db"), &["198.51.100.10-198.51.100.11"]);
    c.denied("UPDATE", Some(&grown), Some(&old), &["team-b-v4"])
        .await;
    let relabelled = statefulset("team-a", app("web"), &["198.51.100.10"]);
    c.denied("UPDATE", Some(&relabelled), Some(&old), &["team-b-v4"])
        .await;
}

#[tokio::test]
async fn a_namespace_that_cannot_be_read_is_a_check_that_could_not_run() {
    let c = cluster();
    c.server.forbid("get", "namespaces");
    let set = statefulset("team-a", app("db"), &["192.0.2.10"]);
    c.denied(
        "CREATE",
        Some(&set),
        None,
        &[
            "could not check this change",
            "reading namespace team-a",
            "get on ipampools and namespaces",
            "try again",
        ],
    )
    .await;
    let r = c.validate("CREATE", Some(&set), None).await;
    assert_eq!(r.result.code, 503);
}
