//! IPPools, Subnets and ReservedIPs enter the index untyped and are checked one by one by
//! core's loader (`documents::observe`), as a file's documents are: an object that does not
//! deserialize (a field an older agent does not know, a hand edit the schema let through) is
//! one invalid object, never a watch that fails for every pool.

use std::sync::Arc;

use allot_core::config::{Invalid, ObjectKind, Observed};
use allot_core::documents;
use allot_k8s::{IPPool, ReservedIP, Subnet};
use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::feed::{IndexResource, feed};
use crate::index::{Index, Kind, Shared};

/// An IPPool as the watch delivered it.
#[derive(Clone, Debug)]
pub struct PoolObject(pub DynamicObject);
/// A Subnet as the watch delivered it.
#[derive(Clone, Debug)]
pub struct SubnetObject(pub DynamicObject);
/// A ReservedIP as the watch delivered it.
#[derive(Clone, Debug)]
pub struct ReservedObject(pub DynamicObject);

/// What core reads of one object: its spec with the metadata core reads, under the object's
/// own kind (not its status, which the controller rewrites every few seconds).
fn document(kind: ObjectKind, object: &DynamicObject) -> Value {
    let m = &object.metadata;
    json!({
        "apiVersion": documents::API_VERSION,
        "kind": kind.as_str(),
        "metadata": {
            "name": m.name.clone().unwrap_or_default(),
            "labels": m.labels.clone().unwrap_or_default(),
            "annotations": m.annotations.clone().unwrap_or_default(),
            "deletionTimestamp": m.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
        },
        "spec": object.data.get("spec").cloned().unwrap_or(Value::Null),
    })
}

/// Core's observation of one object.
pub(crate) fn observe(kind: ObjectKind, object: &DynamicObject) -> Observed {
    let name = object.metadata.name.clone().unwrap_or_default();
    observe_document(kind, &name, &document(kind, object))
}

/// Core's observation of one object's [`document`].
fn observe_document(kind: ObjectKind, name: &str, document: &Value) -> Observed {
    let source = format!("{kind}/{name}");
    let observed = serde_yaml::to_value(document)
        .map_err(|e| format!("{source}: {e}"))
        .and_then(|value| documents::observe(value, &source, &source).map_err(|e| e.to_string()));
    observed.unwrap_or_else(|error| Observed {
        kind,
        name: name.to_string(),
        source: source.clone(),
        at: source,
        object: Err(Invalid {
            error,
            salvaged: None,
        }),
    })
}

impl Index {
    /// Puts `object` of `kind` in; whether what core reads of it changed.
    fn put_allot(&mut self, kind: ObjectKind, object: &DynamicObject) -> bool {
        let key = (kind, object.metadata.name.clone().unwrap_or_default());
        let document = document(kind, object);
        if self
            .allot
            .get(&key)
            .is_some_and(|(_, seen)| *seen == document)
        {
            return false;
        }
        let observed = observe_document(kind, &key.1, &document);
        self.allot.insert(key, (observed, document));
        true
    }

    fn remove_allot(&mut self, kind: ObjectKind, name: String) -> bool {
        self.allot.remove(&(kind, name)).is_some()
    }
}

macro_rules! allot_kind {
    ($wrapper:ident, $object_kind:expr, $tag:expr) => {
        impl IndexResource<$wrapper> for Index {
            const KIND: &'static str = $tag.as_str();

            fn apply(&mut self, o: $wrapper) {
                if self.put_allot($object_kind, &o.0) {
                    self.allot_changed();
                }
            }

            fn delete(&mut self, o: $wrapper) {
                let name = o.0.metadata.name.clone().unwrap_or_default();
                if self.remove_allot($object_kind, name) {
                    self.allot_changed();
                }
            }

            fn reset(&mut self, all: Vec<$wrapper>) {
                let listed: std::collections::BTreeSet<String> = all
                    .iter()
                    .map(|o| o.0.metadata.name.clone().unwrap_or_default())
                    .collect();
                let gone: Vec<String> = self
                    .allot
                    .keys()
                    .filter(|(kind, name)| *kind == $object_kind && !listed.contains(name))
                    .map(|(_, name)| name.clone())
                    .collect();
                let mut changed = !self.is_synced($tag);
                for name in gone {
                    changed |= self.remove_allot($object_kind, name);
                }
                for o in all {
                    changed |= self.put_allot($object_kind, &o.0);
                }
                if changed {
                    self.allot_changed();
                }
                self.mark_synced($tag);
            }
        }
    };
}

allot_kind!(PoolObject, ObjectKind::IpPool, Kind::IpPool);
allot_kind!(SubnetObject, ObjectKind::Subnet, Kind::Subnet);
allot_kind!(ReservedObject, ObjectKind::ReservedIp, Kind::ReservedIp);

/// The watches of allot's IPPools, Subnets and ReservedIPs into `index`, for the caller to
/// spawn: read untyped, so that core's loader checks each object on its own (see
/// [`PoolObject`]). The agent's index and both of the controller's take them the same way.
pub fn pool_document_feeds<I>(
    index: &Arc<Shared<I>>,
    client: &kube::Client,
    config: &watcher::Config,
) -> [BoxFuture<'static, ()>; 3]
where
    I: IndexResource<PoolObject>
        + IndexResource<SubnetObject>
        + IndexResource<ReservedObject>
        + Send
        + Sync
        + 'static,
{
    let watch = |r: ApiResource| {
        watcher(
            Api::<DynamicObject>::all_with(client.clone(), &r),
            config.clone(),
        )
        .default_backoff()
    };
    [
        feed(
            index.clone(),
            watch(ApiResource::erase::<IPPool>(&())),
            PoolObject,
        )
        .boxed(),
        feed(
            index.clone(),
            watch(ApiResource::erase::<Subnet>(&())),
            SubnetObject,
        )
        .boxed(),
        feed(
            index.clone(),
            watch(ApiResource::erase::<ReservedIP>(&())),
            ReservedObject,
        )
        .boxed(),
    ]
}
