//! An installation's life on the real control plane, each on a lab of its own: an upgrade whose
//! CRDs changed (the hook upgrades them), then the README's uninstall sequence; the same
//! sequence with `helm uninstall --no-hooks`, and after the release's namespace was deleted
//! first. Whatever the path, nothing is left stuck: no CRD Terminating behind a finalizer, no
//! webhook configuration calling a Service that is gone.

use std::time::Duration;

use allot_cluster_tests::objects::{claims, pod_ips};
use allot_cluster_tests::{NAMESPACE, RELEASE, Suite, install_args};
use allot_lab::testing::wait_for;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};

fn allotctl(s: &Suite, args: &[&str]) -> std::process::Output {
    let bin = allot_lab::paths::allot_bin_dir().join("allotctl");
    std::process::Command::new(&bin)
        .args(["--kubeconfig", s.lab.kubeconfig().to_str().unwrap()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()))
}

/// allot's CRDs present on the cluster, with `Terminating` for those being deleted.
async fn allot_crds(s: &Suite) -> Vec<String> {
    let crds: Api<CustomResourceDefinition> = Api::all(s.client.clone());
    crds.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| c.spec.group == "allot.dev")
        .map(|c| {
            let name = c.metadata.name.unwrap_or_default();
            match c.metadata.deletion_timestamp {
                Some(_) => format!("{name} (Terminating)"),
                None => name,
            }
        })
        .collect()
}

async fn webhook_configurations(s: &Suite) -> Vec<String> {
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(s.client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    let mut out = Vec::new();
    if validating.get_opt("allot").await.unwrap().is_some() {
        out.push("validating allot".to_string());
    }
    if mutating.get_opt("allot").await.unwrap().is_some() {
        out.push("mutating allot".to_string());
    }
    out
}

/// `allotctl crds --delete`, the sequence's last step; then nothing of allot is left.
async fn delete_crds_and_nothing_is_stuck(s: &Suite) {
    let out = allotctl(s, &["crds", "--delete", "--wait-seconds", "120"]);
    assert!(
        out.status.success(),
        "allotctl crds --delete: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(allot_crds(s).await, Vec::<String>::new(), "a CRD is left");
    assert_eq!(webhook_configurations(s).await, Vec::<String>::new());
}

/// The README's uninstall, first steps: the pods using allot, then the pools (the controller
/// takes their finalizer off), then the release.
/// allot's requests were all authorized while it was installed ([`Suite::no_refusals`]); once
/// `helm uninstall` begins, Helm deletes the RBAC objects while the pods are still stopping (a
/// controller giving its Lease up), so refusals from then on are expected and not checked.
async fn uninstall_as_the_readme_says(s: &Suite, ns: &str, uninstall: &[&str]) {
    s.must("kubectl", &["delete", "namespace", ns, "--wait=true"]);
    s.must("kubectl", &["delete", "ippools", "--all", "--wait=true"]);
    s.no_refusals();
    s.must("helm", uninstall);
}

/// A pod with an address, in namespace `ns`.
async fn a_pod(s: &Suite, ns: &str) {
    s.namespace(ns).await;
    s.must(
        "kubectl",
        &[
            "-n",
            ns,
            "run",
            "demo",
            "--image=busybox",
            "--restart=Never",
            "--",
            "sleep",
            "3600",
        ],
    );
    let pod = s.ready_pods(ns, "run=demo", 1).await.remove(0);
    assert_eq!(pod_ips(&pod).len(), 2);
}

/// A cluster whose CRDs an older allot applied (allot's first API) gets a release that does not
/// upgrade them (`crds.upgrade=false`, as a chart before the hook); `helm upgrade` to the chart
/// of this checkout runs the hook, which brings every CRD to this allot's: a claim then records
/// its node, a field the old schema pruned. Then the README's uninstall leaves nothing.
#[tokio::test]
async fn an_upgrade_over_older_crds_then_the_readme_uninstall_leaves_nothing_stuck() {
    let Some(s) = Suite::own(
        "an_upgrade_over_older_crds_then_the_readme_uninstall_leaves_nothing_stuck",
        2,
        |_| {},
    )
    .await
    else {
        return;
    };
    s.must("kubectl", &["apply", "-f", "tests/fixtures/crds-699f2d6/"]);
    // Helm 4 applies a chart's crds/ with server-side apply, which conflicts with CRDs another
    // manager wrote differently (here kubectl): the README's install over CRDs already there
    // says --skip-crds, and leaves them to the hook.
    let mut refused = install_args("install");
    refused.extend(["--set", "crds.upgrade=false"]);
    let out = s.helm(&refused);
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("conflict"),
        "helm install over older CRDs without --skip-crds: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = s.helm(&["uninstall", RELEASE, "-n", NAMESPACE]);
    let mut old = install_args("install");
    old.extend(["--skip-crds", "--set", "crds.upgrade=false"]);
    s.must("helm", &old);
    s.wait_ready().await;

    s.must("helm", &install_args("upgrade"));
    s.wait_ready().await;
    let crds: Api<CustomResourceDefinition> = Api::all(s.client.clone());
    let ipblocks = crds.get("ipblocks.allot.dev").await.unwrap();
    let schema = serde_json::to_string(&ipblocks.spec.versions[0].schema).unwrap();
    assert!(
        schema.contains("\"node\""),
        "the hook did not upgrade the IPBlock CRD"
    );
    assert_eq!(allot_crds(&s).await.len(), 8);

    a_pod(&s, "upgraded").await;
    let held = claims(&s.client).await;
    assert!(
        held.values().all(|h| !h.node.is_empty()),
        "claims made after the upgrade name their node: {held:?}"
    );

    uninstall_as_the_readme_says(
        &s,
        "upgraded",
        &["uninstall", RELEASE, "-n", NAMESPACE, "--wait"],
    )
    .await;
    assert_eq!(webhook_configurations(&s).await, Vec::<String>::new());
    delete_crds_and_nothing_is_stuck(&s).await;
}

/// `helm uninstall --no-hooks` runs no uninstall hook: the webhook configurations, owned by the
/// release's ClusterRole, go with it anyway (the garbage collector), so no pool write is left
/// refused by a webhook whose Service is gone.
#[tokio::test]
async fn helm_uninstall_without_hooks_leaves_no_webhook_configuration_behind() {
    let Some(s) = Suite::own(
        "helm_uninstall_without_hooks_leaves_no_webhook_configuration_behind",
        2,
        |_| {},
    )
    .await
    else {
        return;
    };
    s.install().await;
    a_pod(&s, "nohooks").await;
    uninstall_as_the_readme_says(
        &s,
        "nohooks",
        &[
            "uninstall",
            RELEASE,
            "-n",
            NAMESPACE,
            "--wait",
            "--no-hooks",
        ],
    )
    .await;
    wait_for(
        "the webhook configurations gone",
        Duration::from_secs(60),
        || async {
            let left = webhook_configurations(&s).await;
            left.is_empty().then_some(()).ok_or(left)
        },
    )
    .await;
    // A pool can be written again, webhook or not.
    s.must_apply(&allot_cluster_tests::objects::pool_yaml(
        "after",
        "192.0.2.0/24",
        "192.0.2.1",
        "192.0.2.10-192.0.2.20",
    ));
    delete_crds_and_nothing_is_stuck(&s).await;
}

/// The release's namespace deleted first, pods still holding addresses: the controller and the
/// agents are gone, and the Helm release with them (its records lived in that namespace). A pool
/// holding addresses keeps its finalizer, and the webhook configurations still call the deleted
/// Service. `allotctl crds --delete` takes both away: nothing is left stuck.
#[tokio::test]
async fn after_the_namespace_was_deleted_first_nothing_is_left_stuck() {
    let Some(s) = Suite::own(
        "after_the_namespace_was_deleted_first_nothing_is_left_stuck",
        2,
        |_| {},
    )
    .await
    else {
        return;
    };
    s.install().await;
    a_pod(&s, "stranded").await;
    // Deleting the namespace deletes allot's RBAC while its pods stop: checked before.
    s.no_refusals();
    s.must(
        "kubectl",
        &["delete", "namespace", NAMESPACE, "--wait=true"],
    );
    let gone = s.helm(&["status", RELEASE, "-n", NAMESPACE]);
    assert!(
        !gone.status.success(),
        "the release's records went with its namespace"
    );
    // Its pod goes: no agent takes the DEL (the plugin remembers it on the node).
    s.must(
        "kubectl",
        &["delete", "namespace", "stranded", "--wait=true"],
    );
    assert!(
        !claims(&s.client).await.is_empty(),
        "the address stays claimed: nobody could release it"
    );
    delete_crds_and_nothing_is_stuck(&s).await;
}
