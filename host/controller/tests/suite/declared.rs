//! The controller's reservations of StatefulSets' declared addresses, for a list that got past
//! admission (the webhook down, a list older than the check, a pool or namespace changed
//! since): nothing is reserved in a pool the StatefulSet's pods may not use, and the
//! StatefulSet gets a Warning Event saying what was left out and why.

use crate::common::{dynamic, typed};
use allot_controller::autopool::{DeclaredSnapshot, Keeper};
use allot_controller::events::Events;
use allot_controller::lease::Leadership;
use allot_index::{IndexResource, PoolObject, ReservedObject, SubnetObject, WorkloadIndex};
use allot_k8s::openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use allot_k8s::openapi::api::batch::v1::{CronJob, Job};
use allot_k8s::openapi::api::core::v1::Namespace;
use allot_test_apiserver::ApiServer;
use kube::core::PartialObjectMeta;
use serde_json::{Value, json};

/// StatefulSet `team-a/db`, its pod template labelled `app: db`, declaring `ipv4`.
fn db(ipv4: &[&str]) -> StatefulSet {
    typed(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"namespace": "team-a", "name": "db", "uid": "uid-db"},
        "spec": {"replicas": 3, "serviceName": "db",
                 "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {
                     "labels": {"app": "db"},
                     "annotations": {
                         "ipam.allot.dev/ordinal-ips": json!({"ipv4": ipv4}).to_string()}},
                     "spec": {"containers": [{"name": "db", "image": "postgres"}]}}}
    }))
}

fn pool(name: &str, subnet: &str, ips: &str, tenancy: Value) -> PoolObject {
    let mut spec = json!({"subnet": subnet, "ips": [ips]});
    spec.as_object_mut()
        .unwrap()
        .extend(tenancy.as_object().unwrap().clone());
    PoolObject(dynamic(json!({
        "apiVersion": "allot.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": name, "resourceVersion": "1"}, "spec": spec,
    })))
}

fn namespace(name: &str, tenant: &str) -> PartialObjectMeta<Namespace> {
    typed(json!({"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": name, "labels": {"tenant": tenant}}}))
}

/// db's ReservedIP as an earlier controller kept it.
fn kept(ips: &[&str]) -> Value {
    json!({
        "apiVersion": "allot.dev/v1alpha1", "kind": "ReservedIP",
        "metadata": {"name": "statefulset.team-a.db.ipv4", "labels": {
            "ipam.allot.dev/reserved-for-kind": "StatefulSet",
            "ipam.allot.dev/reserved-for-namespace": "team-a",
            "ipam.allot.dev/reserved-for-name": "db"}},
        "spec": {"ipVersion": 4, "ips": ips},
    })
}

/// Everything listed: `set`, team-a's and team-b's pools (team-b-v4 by namespaceName,
/// tenant-b-v4 by namespaceAffinity), the namespaces given and the ReservedIPs `server` holds.
fn index(
    set: StatefulSet,
    namespaces: Vec<PartialObjectMeta<Namespace>>,
    server: &ApiServer,
) -> WorkloadIndex {
    let mut i = WorkloadIndex::new();
    i.reset(Vec::<Deployment>::new());
    i.reset(vec![set]);
    i.reset(Vec::<ReplicaSet>::new());
    i.reset(Vec::<Job>::new());
    i.reset(Vec::<DaemonSet>::new());
    i.reset(Vec::<CronJob>::new());
    i.reset(vec![
        pool(
            "team-a-v4",
            "192.0.2.0/24",
            "192.0.2.10-192.0.2.19",
            json!({"namespaceName": ["team-a"]}),
        ),
        pool(
            "team-b-v4",
            "198.51.100.0/24",
            "198.51.100.10-198.51.100.19",
            json!({"namespaceName": ["team-b"]}),
        ),
        pool(
            "tenant-b-v4",
            "203.0.113.0/24",
            "203.0.113.10-203.0.113.19",
            json!({"namespaceAffinity": {"matchLabels": {"tenant": "b"}}}),
        ),
    ]);
    i.reset(Vec::<SubnetObject>::new());
    i.reset(
        server
            .objects("reservedips")
            .into_iter()
            .map(|r| ReservedObject(dynamic(r)))
            .collect::<Vec<_>>(),
    );
    i.reset(namespaces);
    i
}

fn keeper(server: &ApiServer) -> Keeper {
    let client = server.client();
    Keeper::new(
        client.clone(),
        Leadership::always(),
        Events::new(client, "test"),
    )
}

fn reserved_ips(server: &ApiServer) -> Vec<Value> {
    server
        .objects("reservedips")
        .into_iter()
        .map(|r| r["spec"]["ips"].clone())
        .collect()
}

/// The notes of the Warning Events on StatefulSet team-a/db.
fn refusals(server: &ApiServer) -> Vec<String> {
    server
        .objects("events")
        .into_iter()
        .filter(|e| e["reason"] == "DeclaredAddressesRefused" && e["regarding"]["name"] == "db")
        .map(|e| e["note"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn addresses_in_another_namespaces_pool_are_not_reserved_and_the_statefulset_is_told() {
    let server = ApiServer::new();
    let mut keeper = keeper(&server);
    let set = db(&["192.0.2.10-192.0.2.12", "198.51.100.10-198.51.100.11"]);
    let tenants = || vec![namespace("team-a", "a"), namespace("team-b", "b")];
    let i = index(set.clone(), tenants(), &server);
    assert!(!keeper.pass(DeclaredSnapshot::of(&i)).await);
    assert_eq!(reserved_ips(&server), [json!(["192.0.2.10-192.0.2.12"])]);
    let told = refusals(&server);
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].contains(
            "not reserved: 198.51.100.10-198.51.100.11 are in IPPool team-b-v4, which pods of \
             StatefulSet team-a/db may not use: its namespaceName [\"team-b\"] does not name \
             namespace team-a"
        ),
        "{told:?}"
    );
    // Told once, not at every pass.
    let i = index(set, tenants(), &server);
    assert!(!keeper.pass(DeclaredSnapshot::of(&i)).await);
    assert_eq!(refusals(&server).len(), 1);
}

#[tokio::test]
async fn a_reservation_made_before_the_check_loses_the_addresses_its_pods_may_not_use() {
    let server = ApiServer::new();
    server.insert(
        "reservedips",
        kept(&["192.0.2.10-192.0.2.12", "203.0.113.10-203.0.113.12"]),
    );
    let mut keeper = keeper(&server);
    let declared = db(&["192.0.2.10-192.0.2.12", "203.0.113.10-203.0.113.12"]);
    let i = index(
        declared.clone(),
        vec![namespace("team-a", "a"), namespace("team-b", "b")],
        &server,
    );
    keeper.pass(DeclaredSnapshot::of(&i)).await;
    assert_eq!(reserved_ips(&server), [json!(["192.0.2.10-192.0.2.12"])]);
    assert!(
        refusals(&server)[0]
            .contains("the labels of namespace team-a do not match its namespaceAffinity"),
        "{:?}",
        refusals(&server)
    );

    // Only addresses of a pool its pods may not use: no reservation at all.
    let foreign = db(&["198.51.100.10"]);
    let i = index(
        foreign,
        vec![namespace("team-a", "a"), namespace("team-b", "b")],
        &server,
    );
    keeper.pass(DeclaredSnapshot::of(&i)).await;
    assert!(server.objects("reservedips").is_empty());

    // team-a's namespace labelled for tenant b: tenant-b-v4 is its to use, and reserved.
    let i = index(declared, vec![namespace("team-a", "b")], &server);
    keeper.pass(DeclaredSnapshot::of(&i)).await;
    assert_eq!(
        reserved_ips(&server),
        [json!([
            "192.0.2.10-192.0.2.12",
            "203.0.113.10-203.0.113.12"
        ])]
    );
}

#[tokio::test]
async fn a_statefulset_whose_namespace_is_not_known_yet_keeps_its_reservation_as_it_is() {
    let server = ApiServer::new();
    server.insert("reservedips", kept(&["203.0.113.10"]));
    let mut keeper = keeper(&server);
    let set = db(&["192.0.2.10", "203.0.113.10-203.0.113.12"]);
    // The namespaces not listed yet: nothing is judged, nothing written, nobody told.
    let i = index(set, vec![], &server);
    assert!(!keeper.pass(DeclaredSnapshot::of(&i)).await);
    assert_eq!(reserved_ips(&server), [json!(["203.0.113.10"])]);
    assert!(refusals(&server).is_empty());
}
