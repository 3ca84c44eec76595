//! The workload-cluster copy against kube's mock service: the management cluster's requests
//! (the kubeconfig Secret, Events) on one mock, the workload cluster's on another, each checked.

use std::sync::Arc;
use std::time::Duration;

use allot_test_apiserver::verifier::{ApiServerVerifier, answer, mock_client, refusal};
use serde_json::{Value, json};

use super::fixtures::*;
use super::workload::{Connect, CopyError, CopySettings, KubeconfigError, WorkloadCopier, copies};
use crate::lease::Leadership;

fn kubeconfig_secret(ns: &str, cluster: &str, kubeconfig: &str) -> Value {
    use allot_k8s::openapi::ByteString;
    json!({"apiVersion": "v1", "kind": "Secret",
           "metadata": {"namespace": ns, "name": format!("{cluster}-kubeconfig")},
           "data": {"value": ByteString(kubeconfig.as_bytes().to_vec())}})
}

const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: shop\n  cluster:\n    server: https://shop.example:6443\n    certificate-authority-data: Zm9v\ncontexts:\n- name: shop\n  context: {cluster: shop, user: admin}\ncurrent-context: shop\nusers:\n- name: admin\n  user: {token: abc}\n";

/// A copier whose workload clusters are all the second mock.
fn copier(default_on: bool) -> (WorkloadCopier, ApiServerVerifier, ApiServerVerifier) {
    let (client, management) = mock_client("default");
    let (workload_client, workload) = mock_client("default");
    let connect: Connect = Arc::new(move |_| {
        let c = workload_client.clone();
        Box::pin(async move { Ok(c) })
    });
    let settings = CopySettings {
        default_on,
        namespace: "kube-system".into(),
        timeout: Duration::from_secs(5),
        resync: Duration::from_secs(3600),
        cluster_api_version: "v1beta1".into(),
    };
    let recorder = recorder(&client);
    (
        WorkloadCopier::new(client, recorder, Leadership::always(), settings, connect),
        management,
        workload,
    )
}

fn with_annotation(mut c: Value, value: &str) -> Value {
    c["metadata"]["annotations"] = json!({"allot.dev/workload-configmap": value});
    c
}

#[tokio::test]
async fn the_configmap_is_copied_into_the_workload_cluster_and_kept_there() {
    let data = json!({"metallb": "10.0.0.2-10.0.0.5"});
    let i = index(
        vec![],
        vec![],
        Some(vec![
            cluster("cluster-a", "shop", Some("hamburg")),
            with_annotation(cluster("cluster-b", "lab", Some("hamburg")), "false"),
        ]),
        vec![
            config_map("cluster-a", data.clone()),
            config_map("cluster-b", data.clone()),
        ],
    );
    let (targets, notices) = copies(&i, true);
    assert!(notices.is_empty());
    assert_eq!(targets.len(), 1, "lab's annotation turns it off");
    let (mut copier, mut management, mut workload) = copier(true);
    let round = tokio::spawn(async move {
        copier.round(targets, Vec::new()).await;
        copier
    });
    let (_, send) = management
        .expect(
            "GET",
            "/api/v1/namespaces/cluster-a/secrets/shop-kubeconfig",
        )
        .await;
    answer(
        send,
        200,
        kubeconfig_secret("cluster-a", "shop", KUBECONFIG),
    );
    let path = "/api/v1/namespaces/kube-system/configmaps";
    let (_, send) = workload
        .expect("GET", &format!("{path}/allot-ipam-allocations"))
        .await;
    answer(send, 404, refusal(404, "NotFound", "not found"));
    let (body, send) = workload.expect("POST", path).await;
    assert_eq!(body["data"], data);
    assert_eq!(
        body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "allot-controller"
    );
    assert_eq!(
        body["metadata"]["annotations"]["allot.dev/copied-from"],
        "cluster-a/shop"
    );
    answer(send, 201, stored(&body, "1"));
    let (body, send) = management.expect("POST", &events("cluster-a")).await;
    assert_eq!(body["reason"], "WorkloadConfigMapWritten");
    assert_eq!(body["type"], "Normal");
    answer(send, 201, body);
    let mut copier = round.await.unwrap();
    management.expect_nothing(QUIET).await;
    workload.expect_nothing(Duration::from_millis(10)).await;

    // The same data again: nothing to do before the resync.
    let (targets, _) = copies(&i, true);
    copier.round(targets, Vec::new()).await;

    // A grown range: replaced, carrying the resourceVersion read.
    let grown = json!({"metallb": "10.0.0.2-10.0.0.5,10.0.0.9-10.0.0.10"});
    let i = index(
        vec![],
        vec![],
        Some(vec![cluster("cluster-a", "shop", Some("hamburg"))]),
        vec![config_map("cluster-a", grown.clone())],
    );
    let (targets, _) = copies(&i, true);
    let round = tokio::spawn(async move { copier.round(targets, Vec::new()).await });
    let (_, send) = management
        .expect(
            "GET",
            "/api/v1/namespaces/cluster-a/secrets/shop-kubeconfig",
        )
        .await;
    answer(
        send,
        200,
        kubeconfig_secret("cluster-a", "shop", KUBECONFIG),
    );
    let (_, send) = workload
        .expect("GET", &format!("{path}/allot-ipam-allocations"))
        .await;
    let mut existing = config_map("kube-system", data);
    existing["metadata"]["labels"] =
        json!({"app.kubernetes.io/managed-by": "allot-controller", "team": "net"});
    answer(send, 200, existing);
    let (body, send) = workload
        .expect("PUT", &format!("{path}/allot-ipam-allocations"))
        .await;
    assert_eq!(body["metadata"]["resourceVersion"], "30");
    assert_eq!(body["data"], grown);
    assert_eq!(
        body["metadata"]["labels"]["team"], "net",
        "other labels kept"
    );
    answer(send, 200, stored(&body, "31"));
    // A new Event of the same reason, with its own note.
    let (body, send) = management.expect("POST", &events("cluster-a")).await;
    assert!(
        body["note"].as_str().unwrap().ends_with("updated"),
        "{body}"
    );
    answer(send, 201, body);
    round.await.unwrap();
}

#[tokio::test]
async fn a_copy_that_fails_is_an_event_retried_later_and_never_runs_a_kubeconfigs_command() {
    let i = index(
        vec![],
        vec![],
        Some(vec![with_annotation(
            cluster("cluster-a", "shop", Some("hamburg")),
            "true",
        )]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    // Off by default, on by the annotation.
    let (targets, _) = copies(&i, false);
    assert_eq!(targets.len(), 1);
    let (mut copier, mut management, mut workload) = copier(false);
    let round = tokio::spawn(async move {
        let next = copier.round(targets, Vec::new()).await;
        (copier, next)
    });
    let (_, send) = management
        .expect(
            "GET",
            "/api/v1/namespaces/cluster-a/secrets/shop-kubeconfig",
        )
        .await;
    answer(send, 404, refusal(404, "NotFound", "not found"));
    let (body, send) = management.expect("POST", &events("cluster-a")).await;
    assert_eq!(body["reason"], "WorkloadConfigMapFailed");
    assert_eq!(body["type"], "Warning");
    assert!(
        body["note"]
            .as_str()
            .unwrap()
            .contains("no Secret cluster-a/shop-kubeconfig: Cluster API writes it once"),
        "{body}"
    );
    answer(send, 201, body);
    let (mut copier, next) = round.await.unwrap();
    let next = next.expect("a retry is due");
    assert!(next <= tokio::time::Instant::now() + Duration::from_secs(10));
    // Not retried before its time.
    let (targets, _) = copies(&i, false);
    copier.round(targets, Vec::new()).await;
    management.expect_nothing(QUIET).await;

    // A kubeconfig that would run a command: refused before any connection.
    let exec = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://x:6443'}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user:\n    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: ['-c', 'touch /tmp/pwned']}\n";
    let target = copies(&i, false).0.remove(0);
    let copying = tokio::spawn(async move { copier.copy(&target).await });
    let (_, send) = management
        .expect(
            "GET",
            "/api/v1/namespaces/cluster-a/secrets/shop-kubeconfig",
        )
        .await;
    answer(send, 200, kubeconfig_secret("cluster-a", "shop", exec));
    let e = copying.await.unwrap().unwrap_err();
    assert!(
        matches!(
            &e,
            CopyError::Refused {
                source: KubeconfigError::RunsCommand { user },
                ..
            } if user == "u"
        ),
        "{e}"
    );
    assert!(
        e.to_string().starts_with(
            "Secret cluster-a/shop-kubeconfig: user u authenticates by running a command"
        ),
        "{e}"
    );
    workload.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn an_annotation_that_is_not_true_or_false_copies_nothing_and_says_so() {
    let i = index(
        vec![],
        vec![],
        Some(vec![with_annotation(
            cluster("cluster-a", "shop", Some("hamburg")),
            "yes",
        )]),
        vec![config_map(
            "cluster-a",
            json!({"metallb": "10.0.0.2-10.0.0.5"}),
        )],
    );
    let (targets, notices) = copies(&i, true);
    assert!(targets.is_empty());
    assert_eq!(notices.len(), 1);
    assert!(
        notices[0]
            .message
            .contains("is \"yes\": write \"true\" or \"false\"")
    );
}
