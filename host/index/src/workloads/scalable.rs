//! Workloads of any kind with a `scale` subresource (OpenKruise's CloneSet and Advanced
//! StatefulSet, Argo Rollouts, ReplicationControllers, …), beside the built-in kinds the index
//! reads typed.
//!
//! The controller finds such kinds through API discovery and tells the index which it follows
//! ([`WorkloadIndex::follow`]); their objects arrive untyped. The pod template is read where
//! every such kind keeps it (`spec.template`, as the built-in kinds do); the replica count is
//! not guessed from the spec but read through the kind's scale subresource
//! ([Kubernetes: scale subresource](https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#scale-subresource)),
//! whose `specReplicasPath` only the kind's definition knows. The watch feeding the index does
//! that read; the index says when one is due ([`WorkloadIndex::scale_due`]: an annotated object
//! whose `metadata.generation` moved since the last read, since a spec change is what moves it)
//! and keeps what it got. A count that could not be read leaves the workload's pools exactly as
//! they are (its wants are refused with the reason) until a read succeeds.

use std::collections::BTreeSet;

use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use serde_json::Value;

use super::{PREFIXES, WorkloadEntry, WorkloadIndex, WorkloadKind};

/// A kind found to have a `scale` subresource.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScalableKind {
    /// The API group, empty for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    /// The resource's plural name, as URLs spell it.
    pub plural: String,
}

impl ScalableKind {
    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.api_version(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }
}

impl std::fmt::Display for ScalableKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.kind, self.api_version())
    }
}

/// The replica count the watch read for an object, if it read one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScaleRead {
    /// Not read for this event ([`WorkloadIndex::scale_due`] said no): the last one stands.
    Unchanged,
    /// `spec.replicas` of the object's scale subresource.
    Read(u64),
    /// The read failed, and why.
    Failed(String),
}

/// What the index keeps of one object of a followed kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ScalableEntry {
    pub entry: WorkloadEntry,
    /// The object's `metadata.generation` when it was last applied.
    pub seen_at: Option<i64>,
    /// The `metadata.generation` the replica count was read at; `None` while it could not be.
    pub read_at: Option<i64>,
    /// Why the replica count is not known (not read yet, or the read failed).
    pub unread: Option<String>,
}

/// An object of a followed kind: its key, and its entry if its pod template carries allot or
/// Spiderpool annotations.
pub type ScalableKey = (ScalableKind, String, String);

fn template_annotations(o: &DynamicObject) -> Vec<(String, String)> {
    o.data
        .pointer("/spec/template/metadata/annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, _)| PREFIXES.iter().any(|p| k.starts_with(p)))
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

fn key_of(kind: &ScalableKind, o: &DynamicObject) -> ScalableKey {
    (
        kind.clone(),
        o.metadata.namespace.clone().unwrap_or_default(),
        o.metadata.name.clone().unwrap_or_default(),
    )
}

impl WorkloadIndex {
    /// Follows `kind` from now on; the index is not [`ready`](WorkloadIndex::ready) until its
    /// first list arrived ([`WorkloadIndex::reset_scalable`]).
    pub fn follow(&mut self, kind: ScalableKind) {
        if let std::collections::btree_map::Entry::Vacant(unfollowed) = self.followed.entry(kind) {
            unfollowed.insert(false);
            self.generation += 1;
        }
    }

    /// Stops following `kind` (its API is no longer served, or no longer readable): its objects
    /// leave the index, and its auto pools are left as they are.
    pub fn unfollow(&mut self, kind: &ScalableKind) {
        if self.followed.remove(kind).is_some() {
            self.scalable.retain(|(k, _, _), _| k != kind);
            self.generation += 1;
        }
    }

    /// The kinds followed beside the built-in ones.
    pub fn followed(&self) -> impl Iterator<Item = &ScalableKind> {
        self.followed.keys()
    }

    /// The names of every owner kind whose objects the index holds: the built-in workload
    /// kinds and the followed scalable ones (the auto-pool planner judges only their pools).
    pub fn followed_kinds(&self) -> BTreeSet<String> {
        WorkloadKind::ALL
            .iter()
            .filter(|k| k.is_workload())
            .map(|k| k.as_str().to_string())
            .chain(self.followed.keys().map(|k| k.kind.clone()))
            .collect()
    }

    /// Followed kinds whose first list has not arrived yet.
    pub fn unsynced_scalable(&self) -> Vec<&ScalableKind> {
        self.followed
            .iter()
            .filter(|(_, synced)| !**synced)
            .map(|(k, _)| k)
            .collect()
    }

    /// Whether the watch should read `o`'s replica count before applying it: it asks for auto
    /// pools, and its count was not read at its current generation.
    pub fn scale_due(&self, kind: &ScalableKind, o: &DynamicObject) -> bool {
        if template_annotations(o).is_empty() {
            return false;
        }
        match self.scalable.get(&key_of(kind, o)) {
            Some(known) => known.unread.is_some() || known.read_at != o.metadata.generation,
            None => true,
        }
    }

    fn scalable_entry(
        &self,
        kind: &ScalableKind,
        o: &DynamicObject,
        read: ScaleRead,
    ) -> Option<ScalableEntry> {
        let annotations = template_annotations(o);
        if annotations.is_empty() {
            return None;
        }
        let previous = self.scalable.get(&key_of(kind, o));
        let (replicas, read_at, unread) = match read {
            ScaleRead::Read(n) => (n, o.metadata.generation, None),
            ScaleRead::Failed(why) => (
                previous.map_or(0, |p| p.entry.replicas),
                None,
                Some(format!(
                    "its replica count cannot be read through the scale subresource: {why}"
                )),
            ),
            ScaleRead::Unchanged => match previous {
                Some(p) => (p.entry.replicas, p.read_at, p.unread.clone()),
                None => (
                    0,
                    None,
                    Some("its replica count has not been read yet".to_string()),
                ),
            },
        };
        Some(ScalableEntry {
            entry: WorkloadEntry {
                uid: o.metadata.uid.clone().unwrap_or_default(),
                annotations: annotations.into_iter().collect(),
                // Only StatefulSets' are read (their declared addresses).
                labels: Default::default(),
                replicas,
                deleting: o.metadata.deletion_timestamp.is_some(),
            },
            seen_at: o.metadata.generation,
            read_at,
            unread,
        })
    }

    /// An object of `kind` was created or changed; `read` is what the watch read of its scale.
    pub fn apply_scalable(&mut self, kind: &ScalableKind, o: &DynamicObject, read: ScaleRead) {
        if !self.followed.contains_key(kind) {
            return;
        }
        let key = key_of(kind, o);
        let changed = match self.scalable_entry(kind, o, read) {
            Some(e) => self.scalable.insert(key, e.clone()).as_ref() != Some(&e),
            None => self.scalable.remove(&key).is_some(),
        };
        if changed {
            self.generation += 1;
        }
    }

    /// An object of `kind` was deleted (a later one of the same name, already applied, stays).
    pub fn delete_scalable(&mut self, kind: &ScalableKind, o: &DynamicObject) {
        let key = key_of(kind, o);
        let uid = o.metadata.uid.clone().unwrap_or_default();
        if self
            .scalable
            .get(&key)
            .is_some_and(|s| uid.is_empty() || s.entry.uid == uid)
        {
            self.scalable.remove(&key);
            self.generation += 1;
        }
    }

    /// Every object of `kind`, as a (re)started watch listed them, with what was read of each.
    pub fn reset_scalable(&mut self, kind: &ScalableKind, all: Vec<(DynamicObject, ScaleRead)>) {
        let Some(synced) = self.followed.get(kind).copied() else {
            return;
        };
        let fresh: Vec<_> = all
            .into_iter()
            .filter_map(|(o, read)| Some((key_of(kind, &o), self.scalable_entry(kind, &o, read)?)))
            .collect();
        let old: Vec<_> = self
            .scalable
            .extract_if(.., |(k, _, _), _| k == kind)
            .collect();
        if old != fresh || !synced {
            self.generation += 1;
        }
        self.scalable.extend(fresh);
        self.followed.insert(kind.clone(), true);
    }

    /// Objects of followed kinds whose count could not be read: the watch reads them again.
    pub fn scale_unread(&self) -> Vec<ScalableKey> {
        self.scalable
            .iter()
            .filter(|(_, s)| s.unread.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every object of a followed kind that asks for auto pools: its entry, and why its replica
    /// count is not known, if it is not.
    pub fn scalable_workloads(
        &self,
    ) -> impl Iterator<Item = (&ScalableKey, &WorkloadEntry, Option<&str>)> {
        self.scalable
            .iter()
            .map(|(k, s)| (k, &s.entry, s.unread.as_deref()))
    }

    /// Records a replica count read outside a watch event (a retry of an unread one), as read
    /// at the generation the object was last applied at.
    pub fn set_scale(&mut self, key: &ScalableKey, read: ScaleRead) {
        let Some(s) = self.scalable.get_mut(key) else {
            return;
        };
        let before = s.clone();
        match read {
            ScaleRead::Read(n) => {
                s.entry.replicas = n;
                s.read_at = s.seen_at;
                s.unread = None;
            }
            ScaleRead::Failed(why) => {
                s.unread = Some(format!(
                    "its replica count cannot be read through the scale subresource: {why}"
                ));
            }
            ScaleRead::Unchanged => {}
        }
        if *s != before {
            self.generation += 1;
        }
    }
}
