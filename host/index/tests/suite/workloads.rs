//! The controller's workload index, fed object by object as the watches would feed it (the
//! built-in kinds typed, and kinds with a `scale` subresource as the controller's watch of
//! them feeds them).

use allot_core::IpFamily;
use allot_index::{
    IndexResource, PoolObject, ReservedObject, ScalableKind, ScaleRead, Shared, SubnetError,
    SubnetObject, WorkloadIndex, WorkloadKind, feed,
};
use allot_k8s::openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use allot_k8s::openapi::api::batch::v1::{CronJob, Job};
use allot_k8s::openapi::api::core::v1::Namespace;
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use serde_json::{Value, json};

const SUBNET: &str = r#"{"ipv4":["subnet-a"]}"#;

fn template(annotations: Value) -> Value {
    json!({"metadata": {"annotations": annotations}, "spec": {"containers": []}})
}

fn meta(name: &str, uid: &str) -> Value {
    json!({"namespace": "team-a", "name": name, "uid": uid})
}

fn deployment(name: &str, replicas: Option<i32>, annotations: Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": meta(name, &format!("uid-{name}")),
        "spec": {"replicas": replicas, "selector": {}, "template": template(annotations)},
    }))
    .unwrap()
}

fn ours() -> Value {
    json!({"ipam.allot.dev/subnet": SUBNET, "ipam.spidernet.io/ippool-ip-number": "+2",
           "prometheus.io/scrape": "true"})
}

fn with_owner(mut v: Value, kind: &str) -> Value {
    v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": "top", "uid": "u", "controller": true}]);
    v
}

fn replicaset(name: &str, owner: Option<&str>) -> ReplicaSet {
    let v = json!({
        "metadata": meta(name, name),
        "spec": {"replicas": 3, "selector": {}, "template": template(ours())},
    });
    serde_json::from_value(match owner {
        Some(kind) => with_owner(v, kind),
        None => v,
    })
    .unwrap()
}

fn job_spec(parallelism: Option<i32>, completions: Option<i32>) -> Value {
    json!({"parallelism": parallelism, "completions": completions, "template": template(ours())})
}

fn job(name: &str, parallelism: Option<i32>, completions: Option<i32>, owner: Option<&str>) -> Job {
    let v = json!({"metadata": meta(name, name), "spec": job_spec(parallelism, completions)});
    serde_json::from_value(match owner {
        Some(kind) => with_owner(v, kind),
        None => v,
    })
    .unwrap()
}

fn dynamic(kind: &str, name: &str, rv: &str, labels: Value, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "allot.dev/v1alpha1", "kind": kind,
        "metadata": {"name": name, "resourceVersion": rv, "uid": name, "labels": labels},
        "spec": spec,
    }))
    .unwrap()
}

fn listed() -> WorkloadIndex {
    let mut i = WorkloadIndex::new();
    i.reset(Vec::<Deployment>::new());
    i.reset(Vec::<StatefulSet>::new());
    i.reset(Vec::<ReplicaSet>::new());
    i.reset(Vec::<Job>::new());
    i.reset(Vec::<DaemonSet>::new());
    i.reset(Vec::<CronJob>::new());
    i.reset(Vec::<PoolObject>::new());
    i.reset(Vec::<SubnetObject>::new());
    i.reset(Vec::<ReservedObject>::new());
    i
}

#[test]
fn only_workloads_with_allot_or_spiderpool_annotations_are_kept() {
    let mut i = listed();
    i.apply(deployment("web", None, ours()));
    i.apply(deployment(
        "plain",
        Some(4),
        json!({"prometheus.io/scrape": "true"}),
    ));
    let w = i
        .workload(WorkloadKind::Deployment, "team-a", "web")
        .unwrap();
    assert_eq!(w.replicas, 1, "spec.replicas defaults to 1");
    assert_eq!(w.uid, "uid-web");
    assert_eq!(w.annotations.len(), 2, "{:?}", w.annotations);
    assert_eq!(w.annotations["ipam.allot.dev/subnet"], SUBNET);
    assert!(
        i.workload(WorkloadKind::Deployment, "team-a", "plain")
            .is_none()
    );
    // The annotation removed: the workload leaves the index (its pools are then unnamed).
    let before = i.generation();
    i.apply(deployment("web", None, json!({})));
    assert!(
        i.workload(WorkloadKind::Deployment, "team-a", "web")
            .is_none()
    );
    assert!(i.generation() > before);
}

#[test]
fn replicasets_and_jobs_run_by_a_controller_are_not_workloads_of_their_own() {
    let mut i = listed();
    i.apply(replicaset("web-5d8f", Some("Deployment")));
    i.apply(replicaset("bare", None));
    i.apply(job("nightly-123", Some(2), None, Some("CronJob")));
    i.apply(job("once", Some(4), Some(3), None));
    assert!(
        i.workload(WorkloadKind::ReplicaSet, "team-a", "web-5d8f")
            .is_none()
    );
    assert_eq!(
        i.workload(WorkloadKind::ReplicaSet, "team-a", "bare")
            .unwrap()
            .replicas,
        3
    );
    assert!(
        i.workload(WorkloadKind::Job, "team-a", "nightly-123")
            .is_none()
    );
    // Parallelism 4, but never more pods than completions.
    assert_eq!(
        i.workload(WorkloadKind::Job, "team-a", "once")
            .unwrap()
            .replicas,
        3
    );
    i.apply(job("defaults", None, None, None));
    assert_eq!(
        i.workload(WorkloadKind::Job, "team-a", "defaults")
            .unwrap()
            .replicas,
        1
    );
}

#[test]
fn daemonsets_count_scheduled_nodes_and_cronjobs_their_job_template() {
    let mut i = listed();
    let ds = |status: Value| -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": meta("agent", "uid-ds"),
            "spec": {"selector": {}, "template": template(ours())},
            "status": status,
        }))
        .unwrap()
    };
    i.apply(ds(Value::Null));
    assert_eq!(
        i.workload(WorkloadKind::DaemonSet, "team-a", "agent")
            .unwrap()
            .replicas,
        0
    );
    i.apply(ds(
        json!({"currentNumberScheduled": 0, "desiredNumberScheduled": 7,
                      "numberMisscheduled": 0, "numberReady": 0}),
    ));
    assert_eq!(
        i.workload(WorkloadKind::DaemonSet, "team-a", "agent")
            .unwrap()
            .replicas,
        7
    );
    let cron: CronJob = serde_json::from_value(json!({
        "metadata": meta("nightly", "uid-cj"),
        "spec": {"schedule": "0 1 * * *", "jobTemplate": {"spec": job_spec(Some(5), None)}},
    }))
    .unwrap();
    i.apply(cron);
    assert_eq!(
        i.workload(WorkloadKind::CronJob, "team-a", "nightly")
            .unwrap()
            .replicas,
        5
    );
}

#[test]
fn deletion_is_seen_and_a_late_deletion_of_an_older_object_is_ignored() {
    let mut i = listed();
    let mut sts: StatefulSet = serde_json::from_value(json!({
        "metadata": meta("db", "uid-new"),
        "spec": {"replicas": 2, "serviceName": "db", "selector": {}, "template": template(ours())},
    }))
    .unwrap();
    i.apply(sts.clone());
    let mut old = sts.clone();
    old.metadata.uid = Some("uid-old".into());
    i.delete(old);
    assert!(
        i.workload(WorkloadKind::StatefulSet, "team-a", "db")
            .is_some()
    );
    sts.metadata.deletion_timestamp =
        Some(allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
    i.apply(sts.clone());
    assert!(
        i.workload(WorkloadKind::StatefulSet, "team-a", "db")
            .unwrap()
            .deleting
    );
    i.delete(sts);
    assert!(
        i.workload(WorkloadKind::StatefulSet, "team-a", "db")
            .is_none()
    );
}

#[test]
fn the_generation_ignores_what_the_decisions_do_not_read() {
    let mut i = listed();
    let mut d = deployment("web", Some(2), ours());
    i.apply(d.clone());
    let g = i.generation();
    d.status = Some(serde_json::from_value(json!({"readyReplicas": 1})).unwrap());
    d.metadata.resource_version = Some("99".into());
    i.apply(d.clone());
    assert_eq!(i.generation(), g, "a rollout's progress is not a change");
    d.spec.as_mut().unwrap().replicas = Some(5);
    i.apply(d);
    assert!(i.generation() > g);

    let spec = json!({"subnet": "10.10.0.0/24", "ips": ["10.10.0.5-10.10.0.7"]});
    i.apply(PoolObject(dynamic(
        "IPPool",
        "p",
        "1",
        json!({}),
        spec.clone(),
    )));
    let g = i.generation();
    let mut status_only = dynamic("IPPool", "p", "2", json!({}), spec);
    status_only.data["status"] = json!({"allocatedIPCount": 1});
    i.apply(PoolObject(status_only));
    assert_eq!(i.generation(), g, "a status write is not a change");
    assert_eq!(
        i.pool("p").unwrap().resource_version,
        "2",
        "but the version is current"
    );
}

fn namespace(name: &str, tenant: &str) -> PartialObjectMeta<Namespace> {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"tenant": tenant}}}))
    .unwrap()
}

/// A namespace's labels decide which pools its StatefulSets' declared addresses may be
/// reserved in: a relabel is a new pass where a StatefulSet lives, and nothing elsewhere.
#[test]
fn namespaces_are_kept_with_their_labels_and_a_relabel_matters_where_statefulsets_live() {
    let mut i = listed();
    assert_eq!(i.namespace_labels("team-a"), None, "not listed yet");
    i.reset(vec![namespace("team-a", "a"), namespace("team-b", "b")]);
    assert_eq!(i.namespace_labels("team-a").unwrap()["tenant"], "a");
    let db: StatefulSet = serde_json::from_value(json!({
        "metadata": meta("db", "uid-db"),
        "spec": {"serviceName": "db", "selector": {},
                 "template": {"metadata": {"labels": {"app": "db"}, "annotations": ours()},
                              "spec": {"containers": []}}},
    }))
    .unwrap();
    i.apply(db);
    let entry = i
        .workload(WorkloadKind::StatefulSet, "team-a", "db")
        .unwrap();
    assert_eq!(entry.labels["app"], "db", "the template's labels are kept");

    let g = i.generation();
    i.apply(namespace("team-b", "c"));
    i.apply(namespace("team-c", "c"));
    assert_eq!(i.generation(), g, "no StatefulSet lives there");
    i.apply(namespace("team-a", "a"));
    assert_eq!(i.generation(), g, "the same labels");
    i.apply(namespace("team-a", "b"));
    assert!(i.generation() > g);
    assert_eq!(i.namespace_labels("team-a").unwrap()["tenant"], "b");
    let g = i.generation();
    i.delete(namespace("team-a", "b"));
    assert!(i.generation() > g);
    assert_eq!(i.namespace_labels("team-a"), None);
}

#[test]
fn pools_subnets_and_reservations_are_checked_one_by_one() {
    let mut i = listed();
    i.apply(PoolObject(dynamic(
        "IPPool",
        "good",
        "3",
        json!({"team": "a"}),
        json!({"subnet": "10.10.0.0/24", "ips": ["10.10.0.5-10.10.0.7"]}),
    )));
    // Invalid (gateway outside its subnet), but what it lists is still read.
    i.apply(PoolObject(dynamic(
        "IPPool",
        "bad",
        "4",
        json!({}),
        json!({"subnet": "10.10.0.0/24", "ips": ["10.10.0.20"], "gateway": "10.99.0.1"}),
    )));
    let good = i.pool("good").unwrap();
    assert_eq!(good.resource_version, "3");
    assert_eq!(good.labels["team"], "a");
    assert_eq!(good.addresses.as_ref().unwrap().len(), 3);
    assert!(good.spec.is_ok());
    let bad = i.pool("bad").unwrap();
    assert!(
        bad.spec.as_ref().unwrap_err().contains("gateway"),
        "{:?}",
        bad.spec
    );
    assert_eq!(bad.addresses.as_ref().unwrap().to_entries(), ["10.10.0.20"]);

    i.apply(SubnetObject(dynamic(
        "Subnet",
        "s",
        "5",
        json!({}),
        json!({"subnet": "10.10.0.0/24"}),
    )));
    i.apply(SubnetObject(dynamic(
        "Subnet",
        "broken",
        "6",
        json!({}),
        json!({"subnet": "nope"}),
    )));
    let subnets = i.subnets();
    assert!(subnets["s"].is_ok());
    assert!(matches!(&subnets["broken"], Err(SubnetError::Invalid(why)) if why.contains("nope")));
    let mut deleting = dynamic(
        "Subnet",
        "s",
        "9",
        json!({}),
        json!({"subnet": "10.10.0.0/24"}),
    );
    deleting.metadata.deletion_timestamp =
        Some(allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
    i.apply(SubnetObject(deleting));
    assert!(matches!(i.subnets()["s"], Err(SubnetError::Deleting)));

    i.apply(ReservedObject(dynamic(
        "ReservedIP",
        "r",
        "7",
        json!({}),
        json!({"ips": ["10.10.0.1", "10.10.0.x"]}),
    )));
    assert_eq!(
        i.reserved(IpFamily::V4).to_entries(),
        ["10.10.0.1"],
        "the readable entry reserves"
    );
    let mut going = dynamic(
        "ReservedIP",
        "r",
        "8",
        json!({}),
        json!({"ips": ["10.10.0.1"]}),
    );
    going.metadata.deletion_timestamp =
        Some(allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
    i.apply(ReservedObject(going));
    assert!(
        i.reserved(IpFamily::V4).is_empty(),
        "a terminating ReservedIP no longer reserves"
    );
}

#[test]
fn ready_only_once_every_kind_is_listed() {
    let mut i = WorkloadIndex::new();
    assert!(!i.ready());
    i.reset(Vec::<Deployment>::new());
    assert_eq!(i.unsynced().len(), 8);
    let mut all = listed();
    assert!(all.ready());
    all.apply(deployment("web", None, ours()));
    all.apply(replicaset("bare", None));
    // A relist of Deployments replaces only Deployments.
    all.reset(Vec::<Deployment>::new());
    assert!(
        all.workload(WorkloadKind::Deployment, "team-a", "web")
            .is_none()
    );
    assert!(
        all.workload(WorkloadKind::ReplicaSet, "team-a", "bare")
            .is_some()
    );
    i.reset(vec![deployment("web", None, ours())]);
    assert_eq!(i.workloads().count(), 1);
}

#[tokio::test]
async fn a_watch_stream_feeds_the_shared_index() {
    let index = Shared::of(WorkloadIndex::new());
    let events = vec![
        Ok(watcher::Event::Init),
        Ok(watcher::Event::InitApply(deployment("a", Some(2), ours()))),
        Ok(watcher::Event::InitDone),
        Ok(watcher::Event::Apply(deployment("b", Some(3), ours()))),
        Ok(watcher::Event::Delete(deployment("a", Some(2), ours()))),
    ];
    feed(
        index.clone(),
        futures::stream::iter(events),
        |d: Deployment| d,
    )
    .await;
    let i = index.read();
    assert!(i.is_synced(WorkloadKind::Deployment));
    assert!(
        i.workload(WorkloadKind::Deployment, "team-a", "a")
            .is_none()
    );
    assert_eq!(
        i.workload(WorkloadKind::Deployment, "team-a", "b")
            .unwrap()
            .replicas,
        3
    );
}

// Workloads of kinds with a `scale` subresource (a CloneSet), fed as the controller's watch
// feeds them: followed kinds gate readiness, counts come from the scale reads, an unread count
// is carried as such.

fn cloneset_annotations() -> Value {
    json!({"ipam.allot.dev/subnet": r#"{"ipv4":["subnet-a"]}"#, "other.io/x": "y"})
}

fn cloneset_kind() -> ScalableKind {
    ScalableKind {
        group: "apps.kruise.io".into(),
        version: "v1alpha1".into(),
        kind: "CloneSet".into(),
        plural: "clonesets".into(),
    }
}

/// A CloneSet as OpenKruise's API serves it.
fn cloneset(name: &str, generation: i64, annotations: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
        "metadata": {"namespace": "team-a", "name": name, "uid": format!("uid-{name}"),
                     "generation": generation},
        "spec": {"replicas": 99, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}, "annotations": annotations},
                              "spec": {"containers": []}}},
    }))
    .unwrap()
}

fn cloneset_replicas(i: &WorkloadIndex, name: &str) -> Option<(u64, Option<String>)> {
    i.scalable_workloads()
        .find(|((_, _, n), _, _)| n == name)
        .map(|(_, e, unread)| (e.replicas, unread.map(str::to_string)))
}

#[test]
fn a_followed_kind_holds_the_pass_until_listed_and_counts_come_from_the_scale_read() {
    let mut i = listed();
    assert!(i.ready());
    assert!(!i.followed_kinds().contains("CloneSet"));
    i.follow(cloneset_kind());
    assert!(
        !i.ready(),
        "not listed yet: a missing CloneSet may just not be seen yet"
    );
    assert!(i.followed_kinds().contains("CloneSet"));

    let web = cloneset("web", 1, cloneset_annotations());
    let plain = cloneset("plain", 1, json!({"other.io/x": "y"}));
    assert!(i.scale_due(&cloneset_kind(), &web));
    assert!(
        !i.scale_due(&cloneset_kind(), &plain),
        "no allot annotation, no read"
    );
    i.reset_scalable(
        &cloneset_kind(),
        vec![
            (web.clone(), ScaleRead::Read(3)),
            (plain, ScaleRead::Unchanged),
        ],
    );
    assert!(i.ready());
    assert_eq!(
        cloneset_replicas(&i, "web"),
        Some((3, None)),
        "the scale's count, not spec.replicas"
    );
    assert_eq!(cloneset_replicas(&i, "plain"), None);
    let entry = i.scalable_workloads().next().unwrap().1;
    assert_eq!(
        entry.annotations.len(),
        1,
        "only allot's and Spiderpool's annotations"
    );

    // A status change leaves the generation: no read, the count stands.
    assert!(!i.scale_due(&cloneset_kind(), &web));
    let before = i.generation();
    i.apply_scalable(&cloneset_kind(), &web, ScaleRead::Unchanged);
    assert_eq!(i.generation(), before, "nothing the passes read changed");

    // Scaled: the generation moves, the count is read again.
    let scaled = cloneset("web", 2, cloneset_annotations());
    assert!(i.scale_due(&cloneset_kind(), &scaled));
    i.apply_scalable(&cloneset_kind(), &scaled, ScaleRead::Read(5));
    assert_eq!(cloneset_replicas(&i, "web"), Some((5, None)));
    assert!(i.generation() > before);
}

#[test]
fn a_count_that_cannot_be_read_is_carried_as_unread_until_a_read_succeeds() {
    let mut i = listed();
    i.follow(cloneset_kind());
    let web = cloneset("web", 1, cloneset_annotations());
    i.reset_scalable(
        &cloneset_kind(),
        vec![(
            web.clone(),
            ScaleRead::Failed("503 Service Unavailable".into()),
        )],
    );
    let (_, unread) = cloneset_replicas(&i, "web").unwrap();
    assert!(unread.unwrap().contains("503 Service Unavailable"));
    assert!(
        i.scale_due(&cloneset_kind(), &web),
        "an unread count is read again"
    );
    assert_eq!(i.scale_unread().len(), 1);

    let key = i.scale_unread().remove(0);
    i.set_scale(&key, ScaleRead::Read(2));
    assert_eq!(cloneset_replicas(&i, "web"), Some((2, None)));
    assert!(i.scale_unread().is_empty());
    assert!(
        !i.scale_due(&cloneset_kind(), &web),
        "read at the generation last applied"
    );

    // A later failure does not fall back to the old count silently.
    let scaled = cloneset("web", 2, cloneset_annotations());
    i.apply_scalable(
        &cloneset_kind(),
        &scaled,
        ScaleRead::Failed("timeout".into()),
    );
    assert!(cloneset_replicas(&i, "web").unwrap().1.is_some());
}

#[test]
fn deletion_names_its_object_and_unfollowing_drops_the_kind() {
    let mut i = listed();
    i.follow(cloneset_kind());
    let web = cloneset("web", 1, cloneset_annotations());
    i.reset_scalable(&cloneset_kind(), vec![(web.clone(), ScaleRead::Read(1))]);

    // An older object of the same name deleted after the new one was applied: the new stays.
    let mut older = web.clone();
    older.metadata.uid = Some("uid-older".into());
    i.delete_scalable(&cloneset_kind(), &older);
    assert!(cloneset_replicas(&i, "web").is_some());
    i.delete_scalable(&cloneset_kind(), &web);
    assert!(cloneset_replicas(&i, "web").is_none());

    i.apply_scalable(&cloneset_kind(), &web, ScaleRead::Read(1));
    i.unfollow(&cloneset_kind());
    assert!(cloneset_replicas(&i, "web").is_none());
    assert!(!i.followed_kinds().contains("CloneSet"));
    assert!(i.ready());
    // Events of a kind no longer followed (a watch stopping) change nothing.
    i.apply_scalable(&cloneset_kind(), &web, ScaleRead::Read(1));
    assert!(cloneset_replicas(&i, "web").is_none());
}
