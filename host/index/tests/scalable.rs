//! Workloads of kinds with a `scale` subresource (a CloneSet), fed as the controller's watch
//! feeds them: followed kinds gate readiness, counts come from the scale reads, an unread count
//! is carried as such.

use allot_index::{
    IndexResource, PoolObject, ReservedObject, ScalableKind, ScaleRead, SubnetObject, WorkloadIndex,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::api::DynamicObject;
use serde_json::{Value, json};

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

fn ours() -> Value {
    json!({"ipam.allot.dev/subnet": r#"{"ipv4":["subnet-a"]}"#, "other.io/x": "y"})
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

fn replicas(i: &WorkloadIndex, name: &str) -> Option<(u64, Option<String>)> {
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

    let web = cloneset("web", 1, ours());
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
        replicas(&i, "web"),
        Some((3, None)),
        "the scale's count, not spec.replicas"
    );
    assert_eq!(replicas(&i, "plain"), None);
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
    let scaled = cloneset("web", 2, ours());
    assert!(i.scale_due(&cloneset_kind(), &scaled));
    i.apply_scalable(&cloneset_kind(), &scaled, ScaleRead::Read(5));
    assert_eq!(replicas(&i, "web"), Some((5, None)));
    assert!(i.generation() > before);
}

#[test]
fn a_count_that_cannot_be_read_is_carried_as_unread_until_a_read_succeeds() {
    let mut i = listed();
    i.follow(cloneset_kind());
    let web = cloneset("web", 1, ours());
    i.reset_scalable(
        &cloneset_kind(),
        vec![(
            web.clone(),
            ScaleRead::Failed("503 Service Unavailable".into()),
        )],
    );
    let (_, unread) = replicas(&i, "web").unwrap();
    assert!(unread.unwrap().contains("503 Service Unavailable"));
    assert!(
        i.scale_due(&cloneset_kind(), &web),
        "an unread count is read again"
    );
    assert_eq!(i.scale_unread().len(), 1);

    let key = i.scale_unread().remove(0);
    i.set_scale(&key, ScaleRead::Read(2));
    assert_eq!(replicas(&i, "web"), Some((2, None)));
    assert!(i.scale_unread().is_empty());
    assert!(
        !i.scale_due(&cloneset_kind(), &web),
        "read at the generation last applied"
    );

    // A later failure does not fall back to the old count silently.
    let scaled = cloneset("web", 2, ours());
    i.apply_scalable(
        &cloneset_kind(),
        &scaled,
        ScaleRead::Failed("timeout".into()),
    );
    assert!(replicas(&i, "web").unwrap().1.is_some());
}

#[test]
fn deletion_names_its_object_and_unfollowing_drops_the_kind() {
    let mut i = listed();
    i.follow(cloneset_kind());
    let web = cloneset("web", 1, ours());
    i.reset_scalable(&cloneset_kind(), vec![(web.clone(), ScaleRead::Read(1))]);

    // An older object of the same name deleted after the new one was applied: the new stays.
    let mut older = web.clone();
    older.metadata.uid = Some("uid-older".into());
    i.delete_scalable(&cloneset_kind(), &older);
    assert!(replicas(&i, "web").is_some());
    i.delete_scalable(&cloneset_kind(), &web);
    assert!(replicas(&i, "web").is_none());

    i.apply_scalable(&cloneset_kind(), &web, ScaleRead::Read(1));
    i.unfollow(&cloneset_kind());
    assert!(replicas(&i, "web").is_none());
    assert!(!i.followed_kinds().contains("CloneSet"));
    assert!(i.ready());
    // Events of a kind no longer followed (a watch stopping) change nothing.
    i.apply_scalable(&cloneset_kind(), &web, ScaleRead::Read(1));
    assert!(replicas(&i, "web").is_none());
}
