//! Endpoint writes against kube's mock service (tower-test), each request checked and answered
//! as the API server would, refusals included.

use allot_core::policy::{Owner, PodInfo};
use allot_test_apiserver::verifier::{ApiServerVerifier, answer, mock_client, refusal};
use serde_json::{Value, json};

use super::*;

const PATH: &str = "/apis/allot.dev/v1alpha1/namespaces/web/endpoints";

fn status(code: u16, reason: &str) -> Value {
    refusal(code, reason, &format!("injected {reason}"))
}

fn pod(owner: Option<(&str, &str)>) -> PodInfo {
    PodInfo {
        namespace: "web".into(),
        name: "p".into(),
        uid: "uid-p".into(),
        owner: owner.map(|(kind, name)| Owner {
            kind: kind.into(),
            name: name.into(),
        }),
        ..Default::default()
    }
}

fn entry(ifname: &str, ipv4: &str) -> EndpointInterface {
    EndpointInterface {
        ifname: ifname.into(),
        ipv4: Some(ipv4.into()),
        pools: vec!["a".into()],
        ..Default::default()
    }
}

fn stored(rv: &str, interfaces: Value) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Endpoint",
           "metadata": {"name": "p", "namespace": "web", "resourceVersion": rv},
           "spec": {"uid": "uid-p", "node": "n1", "interfaces": interfaces}})
}

/// Records eth0 = 10.0.0.7/24 for `pod` on node n1 against the mock, in the background.
fn record_eth0(
    pod: PodInfo,
) -> (
    tokio::task::JoinHandle<Result<(), String>>,
    ApiServerVerifier,
) {
    let (client, verifier) = mock_client("default");
    let api: Api<Endpoint> = Api::namespaced(client, "web");
    let write = tokio::spawn(async move {
        update(&api, "p", |c| {
            Some(with_interface(c, &pod, "n1", &entry("eth0", "10.0.0.7/24")))
        })
        .await
    });
    (write, verifier)
}

#[tokio::test]
async fn a_new_endpoint_is_created_owned_by_its_pod() {
    let (write, mut server) = record_eth0(pod(Some(("Deployment", "d"))));
    let (_, send) = server.expect("GET", &format!("{PATH}/p")).await;
    answer(send, 404, status(404, "NotFound"));
    let (body, send) = server.expect("POST", PATH).await;
    assert_eq!(
        body["spec"]["owner"],
        json!({"kind": "Deployment", "name": "d"})
    );
    assert_eq!(body["spec"]["interfaces"][0]["ipv4"], "10.0.0.7/24");
    assert_eq!(body["metadata"]["ownerReferences"][0]["kind"], "Pod");
    assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "uid-p");
    assert!(body["metadata"].get("resourceVersion").is_none());
    answer(send, 201, body);
    write.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_statefulset_pods_endpoint_has_no_owner_reference() {
    let (write, mut server) = record_eth0(pod(Some(("StatefulSet", "db"))));
    let (_, send) = server.expect("GET", &format!("{PATH}/p")).await;
    answer(send, 404, status(404, "NotFound"));
    let (body, send) = server.expect("POST", PATH).await;
    assert!(body["metadata"].get("ownerReferences").is_none(), "{body}");
    answer(send, 201, body);
    write.await.unwrap().unwrap();
}

/// Another node (or the same agent's other interface) wrote first: the write reads again and
/// keeps what the other one recorded.
#[tokio::test]
async fn a_lost_compare_and_swap_reads_again_and_keeps_the_other_interface() {
    let (write, mut server) = record_eth0(pod(None));
    let (_, send) = server.expect("GET", &format!("{PATH}/p")).await;
    answer(send, 200, stored("5", json!([])));
    let (body, send) = server.expect("PUT", &format!("{PATH}/p")).await;
    assert_eq!(body["metadata"]["resourceVersion"], "5");
    answer(send, 409, status(409, "Conflict"));
    let (_, send) = server.expect("GET", &format!("{PATH}/p")).await;
    answer(
        send,
        200,
        stored("6", json!([{"ifname": "net1", "ipv4": "10.1.0.3/24"}])),
    );
    let (body, send) = server.expect("PUT", &format!("{PATH}/p")).await;
    assert_eq!(body["metadata"]["resourceVersion"], "6");
    let names: Vec<&str> = body["spec"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["ifname"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["eth0", "net1"]);
    answer(send, 200, body);
    write.await.unwrap().unwrap();
}

/// Two creates raced: AlreadyExists (409) is read again and replaced.
#[tokio::test]
async fn already_exists_on_create_becomes_a_replace() {
    let (write, mut server) = record_eth0(pod(None));
    let (_, send) = server.expect("GET", &format!("{PATH}/p")).await;
    answer(send, 404, status(404, "NotFound"));
    let (_, send) = server.expect("POST", PATH).await;
    answer(send, 409, status(409, "AlreadyExists"));
    let (_, send) = server.expect("GET", &format!("{PATH}/p")).await;
    answer(send, 200, stored("9", json!([{"ifname": "net1"}])));
    let (body, send) = server.expect("PUT", &format!("{PATH}/p")).await;
    assert_eq!(body["spec"]["interfaces"].as_array().unwrap().len(), 2);
    answer(send, 200, body);
    write.await.unwrap().unwrap();
}

/// A previous pod of the same name (a StatefulSet's): its interfaces are not carried over.
#[tokio::test]
async fn an_endpoint_of_an_earlier_pod_of_the_name_is_started_over() {
    let mut old: Endpoint =
        serde_json::from_value(stored("3", json!([{"ifname": "net1"}]))).unwrap();
    old.spec.uid = "uid-old".into();
    let ep = with_interface(Some(old), &pod(None), "n2", &entry("eth0", "10.0.0.8/24"));
    assert_eq!(ep.spec.uid, "uid-p");
    assert_eq!(ep.spec.node, "n2");
    assert_eq!(ep.spec.interfaces.len(), 1);
    assert_eq!(ep.metadata.resource_version.as_deref(), Some("3"));
}

#[tokio::test]
async fn a_refused_write_is_an_error_naming_the_refusal() {
    let (write, mut server) = record_eth0(pod(None));
    let (_, send) = server.expect("GET", &format!("{PATH}/p")).await;
    answer(
        send,
        403,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
               "reason": "Forbidden",
               "message": "endpoints.allot.dev \"p\" is forbidden: User \"system:serviceaccount:allot:agent\" cannot get resource \"endpoints\" in API group \"allot.dev\""}),
    );
    let err = write.await.unwrap().unwrap_err();
    assert!(err.contains("cannot get resource \"endpoints\""), "{err}");
}

/// Writes of one pod run in the order they were asked for; an earlier one that comes late is
/// dropped, and the pod is forgotten once nothing is in flight.
#[tokio::test]
async fn a_pods_writes_keep_their_order_and_a_late_earlier_one_is_dropped() {
    let order = Sequencer::default();
    let first = order.ticket("web", "p");
    let second = order.ticket("web", "p");
    let other = order.ticket("web", "q");
    let ran = std::sync::Mutex::new(Vec::new());
    order
        .run(second, async { ran.lock().unwrap().push("second") })
        .await;
    order
        .run(first, async { ran.lock().unwrap().push("first") })
        .await;
    order
        .run(other, async { ran.lock().unwrap().push("other") })
        .await;
    assert_eq!(*ran.lock().unwrap(), ["second", "other"]);
    assert!(order.pods.lock().unwrap().is_empty());
}

/// What others put in an Endpoint's metadata (a GitOps tool's labels and annotations, a
/// finalizer, another owner) survives the agent's replace, for the same pod and for a later
/// pod of the name alike; only the pod owner is the agent's to set.
#[test]
fn others_metadata_survives_a_rewrite() {
    let mut current: Endpoint = serde_json::from_value(json!({
        "apiVersion": "allot.dev/v1alpha1", "kind": "Endpoint",
        "metadata": {"name": "p", "namespace": "web", "resourceVersion": "7",
                     "labels": {"team": "blue"}, "annotations": {"gitops/sync": "x"},
                     "finalizers": ["example.com/audit"],
                     "ownerReferences": [
                         {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-old"},
                         {"apiVersion": "example.com/v1", "kind": "Audit", "name": "a", "uid": "ua"}]},
        "spec": {"uid": "uid-old", "node": "n0", "interfaces": [{"ifname": "eth0", "ipv4": "10.0.0.5/24"}]}
    }))
    .unwrap();
    for uid in ["uid-old", "uid-p"] {
        current.spec.uid = uid.into();
        let next = with_interface(
            Some(current.clone()),
            &pod(None),
            "n1",
            &entry("net1", "10.0.0.7/24"),
        );
        let meta = &next.metadata;
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        assert_eq!(meta.labels.as_ref().unwrap()["team"], "blue", "{uid}");
        assert_eq!(
            meta.annotations.as_ref().unwrap()["gitops/sync"],
            "x",
            "{uid}"
        );
        assert_eq!(
            meta.finalizers.as_deref(),
            Some(&["example.com/audit".to_string()][..])
        );
        let owners: Vec<(&str, &str)> = meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| (o.kind.as_str(), o.uid.as_str()))
            .collect();
        assert_eq!(owners, [("Audit", "ua"), ("Pod", "uid-p")], "{uid}");
        let kept_eth0 = next.spec.interfaces.iter().any(|i| i.ifname == "eth0");
        assert_eq!(
            kept_eth0,
            uid == "uid-p",
            "a previous pod's addresses are not this pod's"
        );
    }
}
