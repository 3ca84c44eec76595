//! Builders shared by the controller's tests: pods, nodes, StatefulSets, pools and claims as
//! the API would hold them, a settable clock, a listed index, and the admission webhook's
//! handlers over an in-memory API server ([`admission`]).

#![allow(dead_code)]

pub mod admission;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use allot_core::store::{Attachment, Claim, Clock, PodRef};
use allot_index::{ClusterIndex, IndexResource, PoolObject, ReservedObject, Shared, SubnetObject};
use allot_k8s::openapi::api::apps::v1::StatefulSet;
use allot_k8s::openapi::api::core::v1::{Node, Pod};
use allot_test_apiserver::ApiServer;
use kube::api::DynamicObject;
use serde_json::{Value, json};

/// Unix seconds the tests start at.
pub const T0: u64 = 1_800_000_000;

/// A clock the test moves.
#[derive(Clone)]
pub struct TestClock(pub Arc<AtomicU64>);

impl TestClock {
    pub fn new() -> TestClock {
        TestClock(Arc::new(AtomicU64::new(T0)))
    }
    pub fn clock(&self) -> Clock {
        let t = self.0.clone();
        Arc::new(move || t.load(Ordering::SeqCst))
    }
    pub fn set(&self, t: u64) {
        self.0.store(t, Ordering::SeqCst);
    }
    pub fn advance(&self, seconds: u64) {
        self.0.fetch_add(seconds, Ordering::SeqCst);
    }
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

pub fn rfc3339(unix: u64) -> String {
    allot_k8s::openapi::jiff::Timestamp::from_second(unix as i64)
        .unwrap()
        .to_string()
}

/// A pod as the API holds it: Running on `node` with a pod IP.
pub fn pod_json(ns: &str, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{ns}-{name}")},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}],
                 "terminationGracePeriodSeconds": 30},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]},
    })
}

pub fn owned_by(mut pod: Value, kind: &str, name: &str) -> Value {
    pod["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": kind, "name": name, "uid": "owner", "controller": true
    }]);
    pod
}

pub fn typed<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

pub fn node(name: &str, ready: bool) -> Node {
    typed(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    }))
}

pub fn statefulset_json(ns: &str, name: &str, replicas: i32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"replicas": replicas, "serviceName": name,
                 "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}}
    })
}

pub fn pool_json(name: &str, subnet: &str, ips: &[&str]) -> Value {
    json!({
        "apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name},
        "spec": {"subnet": subnet, "ips": ips},
    })
}

/// A claim of `address` from pool `p`, made for pod `ns/name` with the UID the API gave it.
pub fn claim(address: &str, ns: &str, name: &str, uid: &str, updated_at: u64) -> Claim {
    Claim {
        address: address.parse().unwrap(),
        pool: "p".into(),
        network: "underlay".into(),
        attachment: Some(Attachment {
            container_id: format!("c-{address}"),
            interface: "eth0".into(),
        }),
        pod: PodRef {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            owner_kind: None,
            owner_name: None,
        },
        node: "node-a".into(),
        updated_at,
    }
}

pub fn of_statefulset(mut c: Claim, set: &str) -> Claim {
    c.pod.owner_kind = Some("StatefulSet".into());
    c.pod.owner_name = Some(set.into());
    c
}

/// An index with every kind listed, holding `pods`, `nodes` and `statefulsets`.
pub fn listed(
    pods: Vec<Pod>,
    nodes: Vec<Node>,
    sets: Vec<StatefulSet>,
) -> Arc<Shared<ClusterIndex>> {
    let mut i = ClusterIndex::new();
    i.reset(pods);
    i.reset(nodes);
    i.reset(sets);
    IndexResource::<PoolObject>::reset(&mut i, Vec::new());
    IndexResource::<SubnetObject>::reset(&mut i, Vec::new());
    IndexResource::<ReservedObject>::reset(&mut i, Vec::new());
    i.take_pending();
    Shared::of(i)
}

/// A real kube-apiserver (upstream etcd and kube-apiserver on 127.0.0.1) with allot's CRDs
/// Established; None when the lab's tests are skipped here (`ALLOT_LAB_SKIP`).
pub fn real_api(test: &str) -> Option<allot_lab::LoopbackControlPlane> {
    let plane = allot_lab::LoopbackControlPlane::for_test(test, Default::default())?;
    plane
        .apply_crds(&allot_k8s::crds())
        .expect("allot's CRDs applied");
    Some(plane)
}

/// A client of `plane` as user `user` (in `system:masters`), on the caller's runtime: the
/// audit log tells its requests apart ([`requests`]).
pub async fn client_as(plane: &allot_lab::LoopbackControlPlane, user: &str) -> kube::Client {
    let kubeconfig = plane
        .user_kubeconfig(user, &["system:masters"])
        .expect("a kubeconfig");
    allot_lab::kube_client(&kubeconfig).await.expect("a client")
}

/// How many requests of `verb` on `resource` (`group/plural`) user `user` made.
pub fn requests(
    plane: &allot_lab::LoopbackControlPlane,
    user: &str,
    verb: &str,
    resource: &str,
) -> usize {
    plane
        .requests_of(user)
        .expect("the audit log")
        .iter()
        .filter(|r| r.verb == verb && r.resource == resource)
        .count()
}

/// Stores `object` in the server and returns it typed as stored (with the UID it was given).
pub fn stored<T: serde::de::DeserializeOwned>(
    server: &ApiServer,
    plural: &str,
    object: Value,
) -> T {
    typed(server.insert(plural, object))
}

pub fn dynamic(v: Value) -> DynamicObject {
    typed(v)
}
