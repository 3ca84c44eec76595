//! `--remove-webhook-configurations` (the chart's uninstall hook) against a real
//! kube-apiserver (upstream etcd and kube-apiserver on 127.0.0.1): it deletes the
//! configurations only once no replica leads, since a leader recreates them at once.

use std::time::{Duration, Instant};

use allot_controller::args::ControllerArgs;
use allot_controller::uninstall::{remove_webhook_configurations, wait_for_no_leader};
use allot_k8s::openapi::api::coordination::v1::Lease;
use allot_lab::LoopbackControlPlane;
use clap::Parser;
use kube::Api;
use serde_json::{Value, json};

const NS: &str = "allot-system";

fn args() -> ControllerArgs {
    ControllerArgs::parse_from(["allot-controller", "--namespace", NS])
}

fn lease(holder: Option<&str>, duration: u64) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"namespace": NS, "name": "allot-controller"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration,
                 "renewTime": "2026-01-01T00:00:00.000000Z"},
    })
}

/// A real API server with namespace [`NS`] and both webhook configurations, and a client of it
/// on the caller's runtime.
async fn real_api(test: &str) -> Option<(LoopbackControlPlane, kube::Client)> {
    let server = LoopbackControlPlane::for_test(test, Default::default())?;
    server.create_namespace(NS, json!({})).unwrap();
    configurations(&server);
    let client = allot_lab::kube_client(server.kubeconfig()).await.unwrap();
    Some((server, client))
}

/// Replaces the Lease with `lease`, as its holder writes it.
fn write_lease(server: &LoopbackControlPlane, lease: Value) {
    server
        .edit(
            "coordination.k8s.io/v1",
            "leases",
            Some(NS),
            "allot-controller",
            |live| live["spec"] = lease["spec"].clone(),
        )
        .unwrap();
}

fn configurations(server: &LoopbackControlPlane) {
    for (plural, kind) in [
        (
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
        ),
        (
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
        ),
    ] {
        server
            .create(
                plural,
                json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                       "metadata": {"name": "allot"}, "webhooks": []}),
            )
            .unwrap();
    }
}

fn left(server: &LoopbackControlPlane) -> usize {
    [
        "validatingwebhookconfigurations",
        "mutatingwebhookconfigurations",
    ]
    .into_iter()
    .map(|plural| {
        server
            .list("admissionregistration.k8s.io/v1", plural)
            .unwrap()
            .len()
    })
    .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configurations_go_once_the_leader_gives_the_lease_up() {
    let Some((server, client)) =
        real_api("the_configurations_go_once_the_leader_gives_the_lease_up").await
    else {
        return;
    };
    server
        .create("leases", lease(Some("allot-controller-a"), 15))
        .unwrap();
    let removal = tokio::spawn(async move { remove_webhook_configurations(client, &args()).await });

    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        left(&server),
        2,
        "deleted while a leader would recreate them"
    );
    assert!(!removal.is_finished());

    // What a replica does when it stops (lease::give_up).
    write_lease(&server, lease(None, 1));
    tokio::time::timeout(Duration::from_secs(10), removal)
        .await
        .expect("removal finished")
        .unwrap()
        .unwrap();
    assert_eq!(left(&server), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stopped_renewing_is_gone_after_its_lease_duration() {
    let Some((server, client)) =
        real_api("a_holder_that_stopped_renewing_is_gone_after_its_lease_duration").await
    else {
        return;
    };
    server
        .create("leases", lease(Some("allot-controller-killed"), 1))
        .unwrap();
    let started = Instant::now();
    remove_webhook_configurations(client, &args())
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(left(&server), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lease_or_configurations_there_is_nothing_to_wait_for() {
    let Some((server, client)) =
        real_api("without_a_lease_or_configurations_there_is_nothing_to_wait_for").await
    else {
        return;
    };
    remove_webhook_configurations(client.clone(), &args())
        .await
        .unwrap();
    assert_eq!(left(&server), 0);
    // Run again (a retried hook): the configurations are already gone.
    remove_webhook_configurations(client, &args())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_keeps_renewing_is_named_and_nothing_is_deleted() {
    let Some((server, client)) =
        real_api("a_leader_that_keeps_renewing_is_named_and_nothing_is_deleted").await
    else {
        return;
    };
    server
        .create("leases", lease(Some("allot-controller-b"), 1))
        .unwrap();
    let renewer = {
        let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
        tokio::spawn(async move {
            for i in 0.. {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let mut renewed = leases.get("allot-controller").await.unwrap();
                let spec = renewed.spec.get_or_insert_default();
                spec.renew_time = Some(
                    allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                        format!("2026-01-01T00:00:{:02}.000000Z", i % 60)
                            .parse()
                            .unwrap(),
                    ),
                );
                let _ = leases
                    .replace("allot-controller", &Default::default(), &renewed)
                    .await;
            }
        })
    };
    let leases: Api<Lease> = Api::namespaced(client, NS);
    let err = wait_for_no_leader(&leases, "allot-controller", Duration::from_secs(3))
        .await
        .unwrap_err()
        .to_string();
    renewer.abort();
    assert!(err.contains("allot-controller-b still leads"), "{err}");
    assert_eq!(left(&server), 2);
}
