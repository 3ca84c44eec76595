//! Auto-pools for any workload with a `scale` subresource: which kinds have one is asked of the
//! API server (aggregated discovery, one request) every `--auto-pool-discovery-seconds`, and
//! each such kind the controller may read is watched into the [`WorkloadIndex`], its replica
//! counts read through the scale subresource.
//!
//! The built-in kinds the index reads typed (Deployments, StatefulSets and ReplicaSets of
//! `apps`) are left out: their scale subresource is their `spec.replicas`, which the typed watch
//! already has. A kind is followed only while a SelfSubjectAccessReview says this controller may
//! list and watch it and get its scale (the chart's `controller.autoPools.scalableWorkloads`
//! grants that per group): a kind it may not read is logged once with what to add, never
//! watched into refusals, and its auto pools are left as they are. A kind that disappears from
//! discovery (its CustomResourceDefinition removed) or stops being readable is unfollowed; so,
//! for ten minutes, is one whose first list has not arrived within a minute (its workloads wait
//! for it, the others do not).
//!
//! Kinds are told apart by their name in the pools' `owner-application-kind` label, as pods'
//! owners are: an `apps.kruise.io` StatefulSet and an `apps` StatefulSet of the same name in
//! one namespace would share their auto pools.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_index::{ScalableKind, ScaleRead, Shared, WorkloadIndex};
use allot_k8s::openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use futures::StreamExt;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::AbortHandle;

/// How often a count that could not be read is read again.
const REREAD_EVERY: Duration = Duration::from_secs(15);

/// How long a kind given up stays so before it is tried again.
const GIVEN_UP_FOR: Duration = Duration::from_secs(600);

/// The kinds the index reads typed.
const TYPED: [(&str, &str); 3] = [
    ("apps", "Deployment"),
    ("apps", "StatefulSet"),
    ("apps", "ReplicaSet"),
];

/// The namespaced kinds among `resources` (one group's preferred version each) that have a
/// `scale` subresource and are not read typed.
pub fn scalable_kinds(
    resources: impl IntoIterator<Item = (ApiResource, ApiCapabilities)>,
) -> Vec<ScalableKind> {
    resources
        .into_iter()
        .filter(|(_, caps)| caps.scope == Scope::Namespaced)
        .filter(|(_, caps)| caps.subresources.iter().any(|(s, _)| s.plural == "scale"))
        .filter(|(ar, _)| {
            !TYPED
                .iter()
                .any(|(group, kind)| ar.group == *group && ar.kind == *kind)
        })
        .map(|(ar, _)| ScalableKind {
            group: ar.group,
            version: ar.version,
            kind: ar.kind,
            plural: ar.plural,
        })
        .collect()
}

/// Every kind with a scale subresource the API server serves.
async fn discover(client: &kube::Client) -> Result<Vec<ScalableKind>, kube::Error> {
    let discovery = match Discovery::new(client.clone()).run_aggregated().await {
        Ok(d) => d,
        // A server without aggregated discovery (before 1.26): one request per group.
        Err(_) => Discovery::new(client.clone()).run().await?,
    };
    Ok(discovery
        .groups()
        .flat_map(|g| scalable_kinds(g.recommended_resources()))
        .collect())
}

/// Whether this controller may do `verb` on `kind` (its `subresource`) in every namespace.
async fn allowed(
    client: &kube::Client,
    kind: &ScalableKind,
    verb: &str,
    subresource: Option<&str>,
) -> Result<bool, kube::Error> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(kind.group.clone()),
                resource: Some(kind.plural.clone()),
                subresource: subresource.map(str::to_string),
                verb: Some(verb.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Whether this controller may follow `kind`: list and watch it, get its scale.
async fn readable(client: &kube::Client, kind: &ScalableKind) -> Result<bool, kube::Error> {
    Ok(allowed(client, kind, "list", None).await?
        && allowed(client, kind, "watch", None).await?
        && allowed(client, kind, "get", Some("scale")).await?)
}

/// Follows the scalable kinds the controller may read until dropped (the caller aborts it),
/// asking discovery `every` so often. Until a followed kind's first list, the auto-pool passes
/// of every workload wait, so one broken API (a CRD whose conversion webhook is down, say) must
/// not hold the others: a kind not listed within `first_list_within` is given up for
/// [`GIVEN_UP_FOR`].
pub async fn follow(
    index: Arc<Shared<WorkloadIndex>>,
    client: kube::Client,
    every: Duration,
    first_list_within: Duration,
) {
    let mut watched: BTreeMap<ScalableKind, Watch> = BTreeMap::new();
    let mut refused_logged: BTreeSet<ScalableKind> = BTreeSet::new();
    let mut given_up: BTreeMap<ScalableKind, Instant> = BTreeMap::new();
    loop {
        // A watch that ended gave its kind up (see `feed`): tried again after a while.
        let ended: Vec<ScalableKind> = watched
            .iter()
            .filter(|(_, w)| w.0.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        for kind in ended {
            watched.remove(&kind);
            given_up.insert(kind, Instant::now());
        }
        given_up.retain(|_, since| since.elapsed() < GIVEN_UP_FOR);
        match discover(&client).await {
            Ok(kinds) => {
                let mut wanted = BTreeSet::new();
                for kind in kinds {
                    match readable(&client, &kind).await {
                        Ok(true) => {
                            refused_logged.remove(&kind);
                            wanted.insert(kind);
                        }
                        Ok(false) => {
                            if refused_logged.insert(kind.clone()) {
                                tracing::info!(
                                    kind = %kind,
                                    "has a scale subresource, but allot-controller may not list, \
                                     watch and get the scale of {}: its workloads get no auto \
                                     pools; add the group and resource to the chart's \
                                     controller.autoPools.scalableWorkloads to follow them",
                                    kind.plural
                                );
                            }
                        }
                        // Unknown: a followed kind stays followed, a new one waits.
                        Err(e) => {
                            tracing::warn!(kind = %kind, "cannot check access: {e}");
                            if watched.contains_key(&kind) {
                                wanted.insert(kind);
                            }
                        }
                    }
                }
                let gone: Vec<ScalableKind> = watched
                    .keys()
                    .filter(|k| !wanted.contains(*k))
                    .cloned()
                    .collect();
                for kind in gone {
                    watched.remove(&kind);
                    index.update(|i| i.unfollow(&kind));
                    tracing::info!(kind = %kind, "no longer followed for auto pools");
                }
                for kind in wanted {
                    if watched.contains_key(&kind) || given_up.contains_key(&kind) {
                        continue;
                    }
                    tracing::info!(kind = %kind, "following its workloads for auto pools");
                    index.update(|i| i.follow(kind.clone()));
                    let task = tokio::spawn(feed(
                        index.clone(),
                        client.clone(),
                        kind.clone(),
                        first_list_within,
                    ));
                    watched.insert(kind, Watch(task.abort_handle()));
                }
            }
            Err(e) => tracing::warn!("API discovery failed, keeping the kinds followed: {e}"),
        }
        tokio::time::sleep(every).await;
    }
}

/// A kind's watch, stopped when this is dropped (by [`follow`] unfollowing the kind, or with
/// [`follow`] itself).
struct Watch(AbortHandle);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `spec.replicas` of `o`'s scale subresource.
async fn read_scale(
    client: &kube::Client,
    kind: &ScalableKind,
    namespace: &str,
    name: &str,
) -> ScaleRead {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &kind.api_resource());
    match api.get_scale(name).await {
        Ok(scale) => ScaleRead::Read(
            scale
                .spec
                .and_then(|s| s.replicas)
                .map_or(0, |n| u64::try_from(n).unwrap_or(0)),
        ),
        Err(e) => ScaleRead::Failed(e.to_string()),
    }
}

async fn read_if_due(
    index: &Shared<WorkloadIndex>,
    client: &kube::Client,
    kind: &ScalableKind,
    o: &DynamicObject,
) -> ScaleRead {
    if !index.read().scale_due(kind, o) {
        return ScaleRead::Unchanged;
    }
    let namespace = o.metadata.namespace.as_deref().unwrap_or_default();
    let name = o.metadata.name.as_deref().unwrap_or_default();
    read_scale(client, kind, namespace, name).await
}

/// Watches `kind` into the index, reading replica counts where due, and again every
/// [`REREAD_EVERY`] those that could not be read.
async fn feed(
    index: Arc<Shared<WorkloadIndex>>,
    client: kube::Client,
    kind: ScalableKind,
    first_list_within: Duration,
) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.api_resource());
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listing: Option<Vec<(DynamicObject, ScaleRead)>> = None;
    let mut failing = false;
    let started = Instant::now();
    let mut listed = false;
    let mut reread = tokio::time::interval(REREAD_EVERY);
    loop {
        tokio::select! {
            event = stream.next() => {
                let Some(event) = event else { return };
                let event = match event {
                    Ok(e) => {
                        failing = false;
                        e
                    }
                    Err(e) => {
                        if !listed && started.elapsed() > first_list_within {
                            tracing::warn!(
                                kind = %kind,
                                "cannot list it ({e}): its workloads get no auto-pool changes \
                                 (their pools stay as they are) while the others go on; trying \
                                 again in {} minutes",
                                GIVEN_UP_FOR.as_secs() / 60
                            );
                            index.update(|i| i.unfollow(&kind));
                            return;
                        }
                        if !failing {
                            tracing::warn!(kind = %kind, "watch failed, retrying with backoff: {e}");
                        }
                        failing = true;
                        continue;
                    }
                };
                match event {
                    watcher::Event::Apply(o) => {
                        let read = read_if_due(&index, &client, &kind, &o).await;
                        index.update(|i| i.apply_scalable(&kind, &o, read));
                    }
                    watcher::Event::Delete(o) => index.update(|i| i.delete_scalable(&kind, &o)),
                    watcher::Event::Init => listing = Some(Vec::new()),
                    watcher::Event::InitApply(o) => {
                        let read = read_if_due(&index, &client, &kind, &o).await;
                        listing.get_or_insert_with(Vec::new).push((o, read));
                    }
                    watcher::Event::InitDone => {
                        let all = listing.take().unwrap_or_default();
                        index.update(|i| i.reset_scalable(&kind, all));
                        listed = true;
                    }
                }
            }
            _ = reread.tick() => {
                let unread: Vec<_> = index
                    .read()
                    .scale_unread()
                    .into_iter()
                    .filter(|(k, _, _)| *k == kind)
                    .collect();
                for key in unread {
                    let read = read_scale(&client, &kind, &key.1, &key.2).await;
                    index.update(|i| i.set_scale(&key, read));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(
        group: &str,
        kind: &str,
        plural: &str,
        scope: Scope,
        subs: &[&str],
    ) -> (ApiResource, ApiCapabilities) {
        let ar = ApiResource {
            group: group.into(),
            version: "v1".into(),
            api_version: if group.is_empty() {
                "v1".into()
            } else {
                format!("{group}/v1")
            },
            kind: kind.into(),
            plural: plural.into(),
        };
        let subresources = subs
            .iter()
            .map(|s| {
                let mut sub = ar.clone();
                sub.plural = s.to_string();
                (
                    sub,
                    ApiCapabilities {
                        scope: scope.clone(),
                        subresources: vec![],
                        operations: vec![],
                    },
                )
            })
            .collect();
        (
            ar,
            ApiCapabilities {
                scope,
                subresources,
                operations: vec!["get".into(), "list".into(), "watch".into()],
            },
        )
    }

    #[test]
    fn namespaced_kinds_with_a_scale_subresource_not_read_typed() {
        let kinds = scalable_kinds([
            resource(
                "apps.kruise.io",
                "CloneSet",
                "clonesets",
                Scope::Namespaced,
                &["status", "scale"],
            ),
            resource(
                "apps.kruise.io",
                "StatefulSet",
                "statefulsets",
                Scope::Namespaced,
                &["scale"],
            ),
            resource(
                "apps.kruise.io",
                "SidecarSet",
                "sidecarsets",
                Scope::Cluster,
                &["status"],
            ),
            resource(
                "apps",
                "Deployment",
                "deployments",
                Scope::Namespaced,
                &["scale", "status"],
            ),
            resource(
                "apps",
                "StatefulSet",
                "statefulsets",
                Scope::Namespaced,
                &["scale"],
            ),
            resource(
                "apps",
                "DaemonSet",
                "daemonsets",
                Scope::Namespaced,
                &["status"],
            ),
            resource(
                "",
                "ReplicationController",
                "replicationcontrollers",
                Scope::Namespaced,
                &["scale", "status"],
            ),
            resource(
                "example.com",
                "Scaled",
                "scaleds",
                Scope::Cluster,
                &["scale"],
            ),
        ]);
        let names: Vec<String> = kinds.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "CloneSet (apps.kruise.io/v1)",
                "StatefulSet (apps.kruise.io/v1)",
                "ReplicationController (v1)",
            ]
        );
        assert_eq!(kinds[0].plural, "clonesets");
    }
}
