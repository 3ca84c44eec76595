//! The index, fed object by object as the watches would feed it.

use std::time::Duration;

use allot_core::config::{Object, reconcile};
use allot_index::{
    Index, IndexResource, Kind, Lookup, Need, PodRequest, PoolObject, ReservedObject, SharedIndex,
    SubnetObject, feed,
};
use allot_k8s::openapi::api::apps::v1::ReplicaSet;
use allot_k8s::openapi::api::batch::v1::Job;
use allot_k8s::openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use serde_json::json;

const NODE: &str = "node-a";

fn pod(ns: &str, name: &str, node: &str, owner: Option<(&str, &str)>) -> Pod {
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"),
                     "labels": {"app": "web"}, "annotations": {"ipam.allot.dev/ippool": "{\"ipv4\":[\"a\"]}"}},
        "spec": {"nodeName": node, "containers": []},
    });
    if let Some((kind, owner)) = owner {
        v["metadata"]["ownerReferences"] = json!([
            {"apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": "o", "controller": true}
        ]);
    }
    serde_json::from_value(v).unwrap()
}

fn namespace(name: &str) -> Namespace {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"team": "blue"},
                     "annotations": {"ipam.allot.dev/default-ipv4-ippool": "[\"ns-pool\"]"}}
    }))
    .unwrap()
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"zone": "z1"}}})).unwrap()
}

fn owned<K>(ns: &str, name: &str, owner: Option<(&str, &str)>) -> PartialObjectMeta<K> {
    let mut meta = json!({"namespace": ns, "name": name});
    if let Some((kind, o)) = owner {
        meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": o, "uid": "u", "controller": true}]);
    }
    PartialObjectMeta {
        types: None,
        metadata: serde_json::from_value(meta).unwrap(),
        _phantom: Default::default(),
    }
}

fn dynamic(kind: &str, name: &str, spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "allot.dev/v1alpha1", "kind": kind,
        "metadata": {"name": name, "resourceVersion": "7", "uid": "x"},
        "spec": spec,
    }))
    .unwrap()
}

/// An index with everything listed: namespace `web`, this node, no pods or owners yet.
fn listed() -> Index {
    let mut i = Index::new(NODE);
    i.reset(vec![namespace("web")]);
    i.reset(vec![node(NODE)]);
    i.reset(Vec::<Pod>::new());
    i.reset(Vec::<PoolObject>::new());
    i.reset(Vec::<SubnetObject>::new());
    i.reset(Vec::<ReservedObject>::new());
    i
}

fn ready(lookup: Lookup) -> PodRequest {
    match lookup {
        Lookup::Ready(r) => *r,
        other => panic!("not ready: {other:?}"),
    }
}

fn owner(r: &PodRequest) -> Option<(String, String)> {
    r.pod
        .owner
        .as_ref()
        .map(|o| (o.kind.clone(), o.name.clone()))
}

#[test]
fn a_request_carries_the_pods_namespaces_and_nodes_labels_and_annotations() {
    let mut i = listed();
    i.apply(pod("web", "p", NODE, None));
    let r = ready(i.lookup("web", "p", "eth0", true));
    assert_eq!(r.pod.uid, "uid-p");
    assert_eq!(r.pod.labels["app"], "web");
    assert!(r.pod.annotations.contains_key("ipam.allot.dev/ippool"));
    assert_eq!(r.namespace.labels["team"], "blue");
    assert!(
        r.namespace
            .annotations
            .contains_key("ipam.allot.dev/default-ipv4-ippool")
    );
    assert_eq!(r.node.name, NODE);
    assert_eq!(r.node.labels["zone"], "z1");
    assert_eq!(r.multus_name, "");
    assert!(r.pod.owner.is_none());
}

#[test]
fn a_replicaset_pod_is_owned_by_its_deployment() {
    let mut i = listed();
    i.apply(owned::<ReplicaSet>(
        "web",
        "web-5d8f",
        Some(("Deployment", "web")),
    ));
    i.apply(pod("web", "p", NODE, Some(("ReplicaSet", "web-5d8f"))));
    let r = ready(i.lookup("web", "p", "eth0", true));
    assert_eq!(owner(&r), Some(("Deployment".into(), "web".into())));
}

#[test]
fn a_bare_replicaset_owns_its_pods() {
    let mut i = listed();
    i.apply(owned::<ReplicaSet>("web", "rs", None));
    i.apply(pod("web", "p", NODE, Some(("ReplicaSet", "rs"))));
    let r = ready(i.lookup("web", "p", "eth0", true));
    assert_eq!(owner(&r), Some(("ReplicaSet".into(), "rs".into())));
}

#[test]
fn a_job_pod_is_owned_by_its_cronjob() {
    let mut i = listed();
    i.apply(owned::<Job>(
        "web",
        "backup-2891",
        Some(("CronJob", "backup")),
    ));
    i.apply(pod("web", "p", NODE, Some(("Job", "backup-2891"))));
    let r = ready(i.lookup("web", "p", "eth0", true));
    assert_eq!(owner(&r), Some(("CronJob".into(), "backup".into())));
}

#[test]
fn statefulset_and_daemonset_pods_are_owned_directly() {
    let mut i = listed();
    i.apply(pod("web", "db-0", NODE, Some(("StatefulSet", "db"))));
    i.apply(pod("web", "agent-x", NODE, Some(("DaemonSet", "agent"))));
    let r = ready(i.lookup("web", "db-0", "eth0", true));
    assert_eq!(owner(&r), Some(("StatefulSet".into(), "db".into())));
    let r = ready(i.lookup("web", "agent-x", "eth0", true));
    assert_eq!(owner(&r), Some(("DaemonSet".into(), "agent".into())));
}

/// A KubeVirt launcher pod, as virt-controller builds it: controlled by its
/// VirtualMachineInstance (named after the VirtualMachine), labelled with the VM's name. Its
/// addresses are the VM's; a VirtualMachineInstance of another API group is just a kind.
#[test]
fn a_kubevirt_launcher_pod_is_owned_by_its_virtual_machine() {
    let mut i = listed();
    let mut launcher = pod("web", "virt-launcher-db-x7k2p", NODE, None);
    launcher.metadata.labels = Some(
        [
            ("kubevirt.io", "virt-launcher"),
            ("kubevirt.io/created-by", "uid-vmi"),
            ("vm.kubevirt.io/name", "db"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    launcher.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "db",
            "uid": "uid-vmi", "controller": true, "blockOwnerDeletion": true
        }))
        .unwrap(),
    ]);
    i.apply(launcher);
    i.apply(pod(
        "web",
        "other",
        NODE,
        Some(("VirtualMachineInstance", "db")),
    ));
    let r = ready(i.lookup("web", "virt-launcher-db-x7k2p", "net1", true));
    assert_eq!(owner(&r), Some(("VirtualMachine".into(), "db".into())));
    let r = ready(i.lookup("web", "other", "eth0", true));
    assert_eq!(
        owner(&r),
        Some(("VirtualMachineInstance".into(), "db".into())),
        "apps/v1 is not KubeVirt's group"
    );
}

#[test]
fn an_uncached_replicaset_is_needed_then_taken_as_the_owner_when_gone() {
    let mut i = listed();
    i.apply(pod("web", "p", NODE, Some(("ReplicaSet", "new-rs"))));
    match i.lookup("web", "p", "eth0", true) {
        Lookup::Missing(needs) => assert_eq!(
            needs,
            [Need::ReplicaSet {
                namespace: "web".into(),
                name: "new-rs".into()
            }]
        ),
        other => panic!("{other:?}"),
    }
    // The caller fetched it once and it was gone: the ReplicaSet is the best owner known.
    let r = ready(i.lookup("web", "p", "eth0", false));
    assert_eq!(owner(&r), Some(("ReplicaSet".into(), "new-rs".into())));
    // Once the watch brings it, its Deployment is the owner.
    i.apply(owned::<ReplicaSet>(
        "web",
        "new-rs",
        Some(("Deployment", "d")),
    ));
    let r = ready(i.lookup("web", "p", "eth0", true));
    assert_eq!(owner(&r), Some(("Deployment".into(), "d".into())));
}

/// A ReplicaSet or Job as one GET read it: with its own UID.
fn read<K>(ns: &str, name: &str, uid: &str, owner: Option<(&str, &str)>) -> PartialObjectMeta<K> {
    let mut o = owned::<K>(ns, name, owner);
    o.metadata.uid = Some(uid.into());
    o
}

/// `pod` naming its controller by `uid`.
fn of_uid(mut pod: Pod, uid: &str) -> Pod {
    pod.metadata.owner_references.as_mut().unwrap()[0].uid = uid.into();
    pod
}

fn needs(lookup: Lookup) -> Vec<Need> {
    match lookup {
        Lookup::Missing(needs) => needs,
        other => panic!("not missing anything: {other:?}"),
    }
}

/// The owners the index reads follow this node's pods: a ReplicaSet or Job stays while a pod
/// of the node names it, and goes with the last such pod (deleted, relisted away, or adopted
/// by another controller), so an agent holds what its node runs, not the cluster's workloads.
#[test]
fn an_owner_is_cached_while_a_pod_of_the_node_names_it() {
    let mut i = listed();
    let (p, q) = (
        pod("web", "p", NODE, Some(("ReplicaSet", "web-5d8f"))),
        pod("web", "q", NODE, Some(("ReplicaSet", "web-5d8f"))),
    );
    i.apply(p.clone());
    i.apply(q.clone());
    i.apply(read::<ReplicaSet>(
        "web",
        "web-5d8f",
        "o",
        Some(("Deployment", "web")),
    ));
    i.apply(pod("web", "j", NODE, Some(("Job", "backup-1"))));
    i.apply(read::<Job>(
        "web",
        "backup-1",
        "o",
        Some(("CronJob", "backup")),
    ));
    assert_eq!(i.cached_owners(), 2);

    // A status update changes nothing; q still names the ReplicaSet after p goes.
    i.apply(p.clone());
    i.delete(p);
    assert_eq!(i.cached_owners(), 2);
    let r = ready(i.lookup("web", "q", "eth0", true));
    assert_eq!(owner(&r), Some(("Deployment".into(), "web".into())));
    i.delete(q);
    assert_eq!(
        i.cached_owners(),
        1,
        "the ReplicaSet went with its last pod"
    );
    // A later pod of it is read again.
    i.apply(pod("web", "r", NODE, Some(("ReplicaSet", "web-5d8f"))));
    assert_eq!(
        needs(i.lookup("web", "r", "eth0", true)),
        [Need::ReplicaSet {
            namespace: "web".into(),
            name: "web-5d8f".into()
        }]
    );

    // The Job pod adopted by another controller: the Job goes.
    i.apply(pod("web", "j", NODE, Some(("ReplicaSet", "other"))));
    assert_eq!(i.cached_owners(), 0);
    // A relist without its pods drops what they named.
    i.apply(pod("web", "j2", NODE, Some(("Job", "backup-2"))));
    i.apply(read::<Job>(
        "web",
        "backup-2",
        "o",
        Some(("CronJob", "backup")),
    ));
    assert_eq!(i.cached_owners(), 1);
    i.reset(vec![pod(
        "web",
        "r",
        NODE,
        Some(("ReplicaSet", "web-5d8f")),
    )]);
    assert_eq!(i.cached_owners(), 0);
}

/// A cached ReplicaSet of the name but another UID is an earlier object of that name (deleted
/// and created again, maybe by another Deployment): the pod's own is read.
#[test]
fn a_cached_owner_of_another_uid_is_read_again() {
    let mut i = listed();
    i.apply(of_uid(
        pod("web", "old", NODE, Some(("ReplicaSet", "rs"))),
        "uid-1",
    ));
    i.apply(read::<ReplicaSet>(
        "web",
        "rs",
        "uid-1",
        Some(("Deployment", "a")),
    ));
    i.apply(of_uid(
        pod("web", "new", NODE, Some(("ReplicaSet", "rs"))),
        "uid-2",
    ));
    let r = ready(i.lookup("web", "old", "eth0", true));
    assert_eq!(owner(&r), Some(("Deployment".into(), "a".into())));
    assert_eq!(
        needs(i.lookup("web", "new", "eth0", true)),
        [Need::ReplicaSet {
            namespace: "web".into(),
            name: "rs".into()
        }]
    );
    i.apply(read::<ReplicaSet>(
        "web",
        "rs",
        "uid-2",
        Some(("Deployment", "b")),
    ));
    let r = ready(i.lookup("web", "new", "eth0", true));
    assert_eq!(owner(&r), Some(("Deployment".into(), "b".into())));
}

#[test]
fn only_the_pod_its_namespace_and_this_node_are_watched_needs() {
    let watched = [
        Need::Pod {
            namespace: "web".into(),
            name: "p".into(),
        },
        Need::Namespace("web".into()),
        Need::Node(NODE.into()),
    ];
    assert!(watched.iter().all(Need::is_watched));
    let read = [
        Need::ReplicaSet {
            namespace: "web".into(),
            name: "rs".into(),
        },
        Need::Job {
            namespace: "web".into(),
            name: "j".into(),
        },
    ];
    assert!(!read.iter().any(Need::is_watched));
    assert!(
        !Kind::ALL.iter().any(|k| k.as_str() == "ReplicaSet"
            || k.as_str() == "Job"
            || k.as_str() == "StatefulSet")
    );
}

#[test]
fn a_pod_namespace_and_node_not_yet_cached_are_all_named() {
    let mut i = Index::new(NODE);
    match i.lookup("web", "p", "eth0", true) {
        Lookup::Missing(needs) => assert_eq!(
            needs,
            [
                Need::Pod {
                    namespace: "web".into(),
                    name: "p".into()
                },
                Need::Namespace("web".into()),
                Need::Node(NODE.into()),
            ]
        ),
        other => panic!("{other:?}"),
    }
    i.apply(namespace("web"));
    i.apply(node(NODE));
    i.apply(pod("web", "p", NODE, None));
    ready(i.lookup("web", "p", "eth0", true));
}

#[test]
fn pods_of_other_nodes_are_not_indexed() {
    let mut i = listed();
    i.apply(pod("web", "p", "node-b", None));
    i.reset(vec![
        pod("web", "q", "node-b", None),
        pod("web", "r", NODE, None),
    ]);
    assert!(i.pod("web", "p").is_none());
    assert!(i.pod("web", "q").is_none());
    assert!(i.pod("web", "r").is_some());
    // Another node's object does not replace ours.
    i.apply(node("node-b"));
    assert_eq!(
        ready(i.lookup("web", "r", "eth0", true)).node.labels["zone"],
        "z1"
    );
}

#[test]
fn a_relist_drops_pods_deleted_while_the_watch_was_down() {
    let mut i = listed();
    i.apply(pod("web", "gone", NODE, None));
    i.apply(pod("web", "stays", NODE, None));
    i.reset(vec![pod("web", "stays", NODE, None)]);
    assert!(i.pod("web", "gone").is_none());
    assert_eq!(i.pod_count(), 1);
    i.delete(pod("web", "stays", NODE, None));
    assert_eq!(i.pod_count(), 0);
}

#[test]
fn a_late_deletion_of_an_earlier_pod_of_the_name_leaves_the_new_one() {
    let mut i = listed();
    let mut old = pod("web", "db-0", NODE, Some(("StatefulSet", "db")));
    old.metadata.uid = Some("uid-old".into());
    i.apply(pod("web", "db-0", NODE, Some(("StatefulSet", "db"))));
    i.delete(old);
    assert_eq!(i.pod("web", "db-0").unwrap().uid, "uid-db-0");
    i.delete(pod("web", "db-0", NODE, None));
    assert!(i.pod("web", "db-0").is_none());
}

#[test]
fn each_interface_gets_its_multus_network() {
    let mut i = listed();
    let mut p = pod("web", "p", NODE, None);
    p.metadata.annotations.get_or_insert_default().extend([
        (
            "k8s.v1.cni.cncf.io/networks".to_string(),
            "kube-system/macvlan-a,macvlan-b@storage".to_string(),
        ),
        (
            "v1.multus-cni.io/default-network".to_string(),
            "kube-system/underlay".to_string(),
        ),
    ]);
    i.apply(p);
    let net = |ifname| ready(i.lookup("web", "p", ifname, true)).multus_name;
    assert_eq!(net("eth0"), "kube-system/underlay");
    assert_eq!(net("net1"), "kube-system/macvlan-a");
    assert_eq!(net("storage"), "web/macvlan-b");
}

#[test]
fn a_malformed_multus_annotation_is_the_pods_error() {
    let mut i = listed();
    let mut p = pod("web", "p", NODE, None);
    p.metadata.annotations.get_or_insert_default().insert(
        "k8s.v1.cni.cncf.io/networks".into(),
        "[{\"namespace\": \"x\"}]".into(),
    );
    i.apply(p);
    match i.lookup("web", "p", "net1", true) {
        Lookup::Invalid(why) => {
            assert!(why.contains("pod web/p") && why.contains("without a name"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn pools_are_observed_only_once_all_three_kinds_are_listed() {
    let mut i = Index::new(NODE);
    i.reset(vec![PoolObject(dynamic(
        "IPPool",
        "a",
        json!({"subnet": "10.6.0.0/24", "ips": ["10.6.0.10-10.6.0.20"]}),
    ))]);
    assert!(
        i.observation().is_none(),
        "Subnets and ReservedIPs not listed yet"
    );
    i.reset(Vec::<SubnetObject>::new());
    i.reset(Vec::<ReservedObject>::new());
    let (generation, observation) = i.observation().unwrap();
    assert_eq!(observation.objects.len(), 1);
    assert!(matches!(observation.objects[0].object, Ok(Object::Pool(_))));
    i.apply(PoolObject(dynamic(
        "IPPool",
        "b",
        json!({"subnet": "10.7.0.0/24"}),
    )));
    assert_ne!(i.observation().unwrap().0, generation);
    assert_eq!(i.valid_pools(), ["a", "b"]);
}

#[test]
fn a_status_write_or_a_relist_of_the_same_pools_changes_nothing_agents_serve() {
    let mut i = listed();
    let pool = |status: serde_json::Value| {
        let mut o = dynamic("IPPool", "a", json!({"subnet": "10.6.0.0/24"}));
        o.data["status"] = status;
        PoolObject(o)
    };
    i.apply(pool(json!({"allocatedIPCount": 0})));
    let generation = i.pools_generation().unwrap();
    // The controller rewrites counts every few seconds; a watch relists every few minutes.
    i.apply(pool(json!({"allocatedIPCount": 3})));
    i.reset(vec![pool(json!({"allocatedIPCount": 4}))]);
    assert_eq!(i.pools_generation(), Some(generation));
    let mut edited = dynamic("IPPool", "a", json!({"subnet": "10.6.0.0/23"}));
    edited.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    i.apply(PoolObject(edited));
    assert_ne!(i.pools_generation(), Some(generation));
    let edited = i.pools_generation();
    i.reset(Vec::<PoolObject>::new());
    assert_ne!(
        i.pools_generation(),
        edited,
        "a relist without it deletes it"
    );
    assert!(i.valid_pools().is_empty());
}

#[test]
fn a_malformed_pool_is_one_invalid_object_and_the_last_good_version_stays_in_force() {
    let mut i = listed();
    i.apply(PoolObject(dynamic(
        "IPPool",
        "a",
        json!({"subnet": "10.6.0.0/24", "ips": ["10.6.0.10-10.6.0.20"]}),
    )));
    let first = reconcile(&Default::default(), &i.observation().unwrap().1, &|_| false);
    assert!(first.in_force.pools.contains_key("a"));
    // An edit that widens the pool past its subnet, and one with a field no agent knows.
    i.apply(PoolObject(dynamic(
        "IPPool",
        "a",
        json!({"subnet": "10.6.0.0/24", "ips": ["10.6.0.10-10.6.1.20"]}),
    )));
    i.apply(PoolObject(dynamic(
        "IPPool",
        "typo",
        json!({"subnet": "10.8.0.0/24", "nodename": ["x"]}),
    )));
    let second = reconcile(&first.in_force, &i.observation().unwrap().1, &|_| false);
    let (kept, _) = &second.in_force.pools["a"];
    assert_eq!(kept.ips.to_entries(), ["10.6.0.10-10.6.0.20"]);
    assert!(!second.in_force.pools.contains_key("typo"));
    let problems: Vec<String> = second.problems.iter().map(|p| p.to_string()).collect();
    assert!(
        problems.iter().any(|p| p.contains("nodename")),
        "{problems:?}"
    );
}

#[test]
fn a_pool_without_spec_or_of_a_relist_without_it_goes_away() {
    let mut i = listed();
    i.apply(PoolObject(dynamic(
        "IPPool",
        "a",
        json!({"subnet": "10.6.0.0/24"}),
    )));
    let mut nospec = dynamic("IPPool", "b", json!(null));
    nospec.data = json!({});
    i.apply(PoolObject(nospec));
    let obs = i.observation().unwrap().1;
    let b = obs.objects.iter().find(|o| o.name == "b").unwrap();
    assert!(b.object.is_err());
    i.reset(vec![PoolObject(dynamic(
        "IPPool",
        "b",
        json!({"subnet": "10.9.0.0/24"}),
    ))]);
    assert_eq!(i.valid_pools(), ["b"]);
}

#[test]
fn a_reserved_ip_with_a_bad_entry_still_reserves_what_it_can() {
    let mut i = listed();
    i.apply(ReservedObject(dynamic(
        "ReservedIP",
        "routers",
        json!({"ips": ["10.6.0.1", "10.6.0.999"]}),
    )));
    let r = reconcile(&Default::default(), &i.observation().unwrap().1, &|_| false);
    assert_eq!(
        r.in_force.reserved["routers"].0.ips.to_entries(),
        ["10.6.0.1"]
    );
}

#[tokio::test]
async fn a_waiting_lookup_wakes_when_the_pod_arrives() {
    let index = SharedIndex::new(NODE);
    index.update(|i| {
        i.apply(namespace("web"));
        i.apply(node(NODE));
    });
    let waiter = {
        let index = index.clone();
        tokio::spawn(async move {
            index
                .wait_for(Duration::from_secs(30), |i| {
                    match i.lookup("web", "p", "eth0", true) {
                        Lookup::Ready(r) => Some(r.pod.uid),
                        _ => None,
                    }
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    index.update(|i| i.apply(pod("web", "p", NODE, None)));
    assert_eq!(waiter.await.unwrap().unwrap(), "uid-p");
    // And gives up at its timeout.
    let gone = index
        .wait_for(Duration::from_millis(30), |i| {
            i.pod("web", "nobody").cloned()
        })
        .await;
    assert!(gone.is_err());
}

#[tokio::test]
async fn a_watch_stream_replaces_a_kind_only_when_its_list_is_complete() {
    let index = SharedIndex::new(NODE);
    index.update(|i| i.apply(pod("web", "old", NODE, None)));
    let events = vec![
        Ok(watcher::Event::Init),
        Ok(watcher::Event::InitApply(pod("web", "a", NODE, None))),
        Err(watcher::Error::NoResourceVersion),
        Ok(watcher::Event::InitApply(pod("web", "b", NODE, None))),
        Ok(watcher::Event::InitDone),
        Ok(watcher::Event::Apply(pod("web", "c", NODE, None))),
        Ok(watcher::Event::Delete(pod("web", "a", NODE, None))),
    ];
    feed(index.clone(), futures::stream::iter(events), |p: Pod| p).await;
    let i = index.read();
    assert!(i.is_synced(Kind::Pod));
    assert!(i.pod("web", "old").is_none());
    assert!(i.pod("web", "a").is_none());
    assert!(i.pod("web", "b").is_some() && i.pod("web", "c").is_some());
}
