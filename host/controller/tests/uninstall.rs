//! `--remove-webhook-configurations` (the chart's uninstall hook) against the in-memory API
//! server: it deletes the configurations only once no replica leads, since a leader recreates
//! them at once.

use std::time::{Duration, Instant};

use allot_controller::args::ControllerArgs;
use allot_controller::uninstall::{remove_webhook_configurations, wait_for_no_leader};
use allot_test_apiserver::ApiServer;
use clap::Parser;
use k8s_openapi::api::coordination::v1::Lease;
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

fn configurations(server: &ApiServer) {
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
        server.insert(
            plural,
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                   "metadata": {"name": "allot"}, "webhooks": []}),
        );
    }
}

fn left(server: &ApiServer) -> usize {
    server.objects("validatingwebhookconfigurations").len()
        + server.objects("mutatingwebhookconfigurations").len()
}

#[tokio::test]
async fn the_configurations_go_once_the_leader_gives_the_lease_up() {
    let server = ApiServer::new();
    configurations(&server);
    server.insert("leases", lease(Some("allot-controller-a"), 15));
    let client = server.client();
    let removal = tokio::spawn(async move { remove_webhook_configurations(client, &args()).await });

    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        left(&server),
        2,
        "deleted while a leader would recreate them"
    );
    assert!(!removal.is_finished());

    // What a replica does when it stops (lease::give_up).
    server.edit("leases", lease(None, 1));
    tokio::time::timeout(Duration::from_secs(10), removal)
        .await
        .expect("removal finished")
        .unwrap()
        .unwrap();
    assert_eq!(left(&server), 0);
}

#[tokio::test]
async fn a_holder_that_stopped_renewing_is_gone_after_its_lease_duration() {
    let server = ApiServer::new();
    configurations(&server);
    server.insert("leases", lease(Some("allot-controller-killed"), 1));
    let started = Instant::now();
    remove_webhook_configurations(server.client(), &args())
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(left(&server), 0);
}

#[tokio::test]
async fn without_a_lease_or_configurations_there_is_nothing_to_wait_for() {
    let server = ApiServer::new();
    configurations(&server);
    remove_webhook_configurations(server.client(), &args())
        .await
        .unwrap();
    assert_eq!(left(&server), 0);
    // Run again (a retried hook): the configurations are already gone.
    remove_webhook_configurations(server.client(), &args())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_leader_that_keeps_renewing_is_named_and_nothing_is_deleted() {
    let server = ApiServer::new();
    configurations(&server);
    server.insert("leases", lease(Some("allot-controller-b"), 1));
    let renewer = {
        let server = server.clone();
        tokio::spawn(async move {
            for i in 0.. {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let mut renewed = lease(Some("allot-controller-b"), 1);
                renewed["spec"]["renewTime"] =
                    json!(format!("2026-01-01T00:00:{:02}.000000Z", i % 60));
                server.edit("leases", renewed);
            }
        })
    };
    let leases: Api<Lease> = Api::namespaced(server.client(), NS);
    let err = wait_for_no_leader(&leases, "allot-controller", Duration::from_secs(3))
        .await
        .unwrap_err()
        .to_string();
    renewer.abort();
    assert!(err.contains("allot-controller-b still leads"), "{err}");
    assert_eq!(left(&server), 2);
}
