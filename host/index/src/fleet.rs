//! What the controller's fleet ranges follow, fed by watches: IPAMPools (with their records),
//! IPAMAllocations, Cluster API `Cluster`s and the ConfigMaps the allocations are projected
//! into.
//!
//! Every kind enters untyped and is decoded one object at a time, so an object that does not
//! decode (a field an older controller does not know, a hand edit the schema let through) is one
//! unreadable object, never a watch that fails for the whole fleet. Of a `Cluster` only what
//! the fleet reads is kept: its datacenter (the value of the label the index was made with), the
//! workload-copy annotation, its uid, age and deletion.
//!
//! Cluster API may not be installed: [`FleetIndex::clusters_absent`] records that its
//! `clusters` resource is not served (a 404 on the list), which lists the kind as empty and
//! tells the controller that Clusters cannot be asked about (so that allocations made for them
//! are kept, not released).
//!
//! [`FleetIndex::generation`] changes only when something kept changes (a relist that brings
//! the same objects is no change), so the controller can skip a pass when nothing it reads
//! changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use allot_k8s::openapi::api::core::v1::ConfigMap;
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use allot_k8s::openapi::jiff::Timestamp;
use allot_k8s::{IPAMAllocation, IPAMAllocationSpec, IPAMAllocationStatus, IPAMPool, IPAMPoolSpec};
use kube::api::DynamicObject;

use crate::feed::IndexResource;

/// The label that ties an object to its Cluster API `Cluster` (Cluster API's own): the
/// controller puts it on the IPAMAllocations it makes for a Cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// A Cluster's annotation that turns the copy of its ConfigMap into the workload cluster on
/// (`"true"`) or off (`"false"`), whatever the controller's default.
pub const WORKLOAD_COPY_ANNOTATION: &str = "allot.dev/workload-configmap";
/// The ConfigMap allocations are projected into (`allot_controller::fleet::CONFIG_MAP`).
pub const FLEET_CONFIG_MAP: &str = "allot-ipam-allocations";

/// An IPAMPool as the watch delivered it.
#[derive(Clone, Debug)]
pub struct IpamPoolObject(pub DynamicObject);
/// An IPAMAllocation as the watch delivered it.
#[derive(Clone, Debug)]
pub struct IpamAllocationObject(pub DynamicObject);
/// A Cluster API `Cluster` (`cluster.x-k8s.io`) as the watch delivered it.
#[derive(Clone, Debug)]
pub struct CapiClusterObject(pub DynamicObject);

/// The kinds the fleet index follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FleetKind {
    IpamPool,
    IpamAllocation,
    Cluster,
    ConfigMap,
}

impl FleetKind {
    pub const ALL: [FleetKind; 4] = [
        FleetKind::IpamPool,
        FleetKind::IpamAllocation,
        FleetKind::Cluster,
        FleetKind::ConfigMap,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            FleetKind::IpamPool => "IPAMPool",
            FleetKind::IpamAllocation => "IPAMAllocation",
            FleetKind::Cluster => "Cluster",
            FleetKind::ConfigMap => "ConfigMap",
        }
    }
}

/// An IPAMPool, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetPoolEntry {
    pub uid: String,
    pub spec: IPAMPoolSpec,
    /// `status.allocations`: cluster namespace → what it holds (the record of truth).
    pub records: BTreeMap<String, IPAMAllocationSpec>,
    pub record_version: u64,
}

/// An IPAMAllocation, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetAllocationEntry {
    /// The [`CLUSTER_NAME_LABEL`] value: made for that Cluster.
    pub cluster: Option<String>,
    pub created: Option<Timestamp>,
    pub deleting: bool,
    pub spec: IPAMAllocationSpec,
    pub status: Option<IPAMAllocationStatus>,
}

/// What the fleet reads of a Cluster API `Cluster`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterEntry {
    pub uid: String,
    /// The datacenter label's value; `None` when the label is missing or empty.
    pub datacenter: Option<String>,
    /// The [`WORKLOAD_COPY_ANNOTATION`] value, as written.
    pub workload_copy: Option<String>,
    pub created: Option<Timestamp>,
    pub deleting: bool,
}

/// (namespace, name).
pub type NamespacedName = (String, String);

/// The controller's fleet view. Fed by [`crate::feed`] (or by tests).
#[derive(Debug, Default)]
pub struct FleetIndex {
    datacenter_label: String,
    pools: BTreeMap<String, Result<FleetPoolEntry, Undecodable>>,
    /// (namespace, pool name) → the IPAMAllocation.
    allocations: BTreeMap<NamespacedName, Result<FleetAllocationEntry, Undecodable>>,
    clusters: BTreeMap<NamespacedName, ClusterEntry>,
    /// Cluster API's `clusters` is not served.
    clusters_absent: bool,
    /// Namespace → the data of its [`FLEET_CONFIG_MAP`].
    config_maps: BTreeMap<String, BTreeMap<String, String>>,
    synced: BTreeSet<FleetKind>,
    generation: u64,
}

fn names(meta: &ObjectMeta) -> NamespacedName {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// A watched fleet object that does not decode as its kind. It stays in the index with this
/// reason, so that its name still counts and nothing is allocated from or released into it.
#[derive(Clone, Debug, thiserror::Error)]
#[error("not a valid {kind}: {source}")]
pub struct Undecodable {
    /// `IPAMPool` or `IPAMAllocation`.
    pub kind: &'static str,
    #[source]
    pub source: Arc<serde_json::Error>,
}

/// The same reason for the same kind: an object decoded again as badly as before changes
/// nothing in the index (serde_json's errors compare by what they say).
impl PartialEq for Undecodable {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.source.to_string() == other.source.to_string()
    }
}

impl Eq for Undecodable {}

fn decode<T: allot_k8s::openapi::serde::de::DeserializeOwned>(
    kind: &'static str,
    o: &DynamicObject,
) -> Result<T, Undecodable> {
    serde_json::to_value(o)
        .and_then(serde_json::from_value)
        .map_err(|e| Undecodable {
            kind,
            source: Arc::new(e),
        })
}

fn pool_entry(o: &DynamicObject) -> Result<FleetPoolEntry, Undecodable> {
    let pool: IPAMPool = decode("IPAMPool", o)?;
    let status = pool.status.unwrap_or_default();
    Ok(FleetPoolEntry {
        uid: pool.metadata.uid.unwrap_or_default(),
        spec: pool.spec,
        records: status.allocations,
        record_version: status.record_version,
    })
}

fn allocation_entry(o: &DynamicObject) -> Result<FleetAllocationEntry, Undecodable> {
    let object: IPAMAllocation = decode("IPAMAllocation", o)?;
    let m = object.metadata;
    Ok(FleetAllocationEntry {
        cluster: m
            .labels
            .as_ref()
            .and_then(|l| l.get(CLUSTER_NAME_LABEL))
            .filter(|v| !v.is_empty())
            .cloned(),
        created: m.creation_timestamp.map(|t| t.0),
        deleting: m.deletion_timestamp.is_some(),
        spec: object.spec,
        status: object.status,
    })
}

impl FleetIndex {
    /// A Cluster's datacenter is the value of its label `datacenter_label`.
    pub fn new(datacenter_label: &str) -> FleetIndex {
        FleetIndex {
            datacenter_label: datacenter_label.to_string(),
            ..FleetIndex::default()
        }
    }

    pub fn datacenter_label(&self) -> &str {
        &self.datacenter_label
    }

    /// Changes whenever something kept changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Every kind is listed (Clusters: or known not to be served). Before that, a cluster
    /// missing from the index may just not be listed yet, and nothing may be released on that.
    pub fn ready(&self) -> bool {
        FleetKind::ALL.iter().all(|k| self.synced.contains(k))
    }

    pub fn unsynced(&self) -> Vec<FleetKind> {
        FleetKind::ALL
            .into_iter()
            .filter(|k| !self.synced.contains(k))
            .collect()
    }

    /// IPAMPools by name: decoded, or why not.
    pub fn pools(&self) -> &BTreeMap<String, Result<FleetPoolEntry, Undecodable>> {
        &self.pools
    }

    /// IPAMAllocations by (namespace, pool): decoded, or why not.
    pub fn allocations(
        &self,
    ) -> &BTreeMap<NamespacedName, Result<FleetAllocationEntry, Undecodable>> {
        &self.allocations
    }

    /// Cluster API Clusters by (namespace, name); `None` when Cluster API is not served.
    pub fn clusters(&self) -> Option<&BTreeMap<NamespacedName, ClusterEntry>> {
        (!self.clusters_absent).then_some(&self.clusters)
    }

    /// The data of `namespace`'s [`FLEET_CONFIG_MAP`], if it exists.
    pub fn config_map(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.config_maps.get(namespace)
    }

    /// Cluster API's `clusters` resource is not served (its list answered 404): no Cluster
    /// exists, and none can be asked about. A later successful list undoes it.
    pub fn clusters_absent(&mut self) {
        let changed = !self.clusters_absent || !self.clusters.is_empty();
        self.clusters_absent = true;
        self.clusters.clear();
        self.synced.insert(FleetKind::Cluster);
        if changed {
            self.generation += 1;
        }
    }

    fn cluster_entry(&self, o: &DynamicObject) -> ClusterEntry {
        let m = &o.metadata;
        let label = |map: &Option<BTreeMap<String, String>>, key: &str| {
            map.as_ref()
                .and_then(|l| l.get(key))
                .filter(|v| !v.is_empty())
                .cloned()
        };
        ClusterEntry {
            uid: m.uid.clone().unwrap_or_default(),
            datacenter: label(&m.labels, &self.datacenter_label),
            workload_copy: label(&m.annotations, WORKLOAD_COPY_ANNOTATION),
            created: m.creation_timestamp.as_ref().map(|t| t.0),
            deleting: m.deletion_timestamp.is_some(),
        }
    }
}

/// Sets `key` to `value` (`None`: removes it) and counts a change.
fn set<K: Ord, V: PartialEq>(
    map: &mut BTreeMap<K, V>,
    generation: &mut u64,
    key: K,
    value: Option<V>,
) {
    let changed = match value {
        Some(v) if map.get(&key) == Some(&v) => false,
        Some(v) => {
            map.insert(key, v);
            true
        }
        None => map.remove(&key).is_some(),
    };
    if changed {
        *generation += 1;
    }
}

/// Replaces every entry of a kind and counts a change when anything differs.
fn replace<K: Ord, V: PartialEq>(
    map: &mut BTreeMap<K, V>,
    generation: &mut u64,
    fresh: BTreeMap<K, V>,
) {
    if *map != fresh {
        *map = fresh;
        *generation += 1;
    }
}

impl IndexResource<IpamPoolObject> for FleetIndex {
    const KIND: &'static str = FleetKind::IpamPool.as_str();

    fn apply(&mut self, o: IpamPoolObject) {
        let name = o.0.metadata.name.clone().unwrap_or_default();
        set(
            &mut self.pools,
            &mut self.generation,
            name,
            Some(pool_entry(&o.0)),
        );
    }

    fn delete(&mut self, o: IpamPoolObject) {
        let name = o.0.metadata.name.clone().unwrap_or_default();
        set(&mut self.pools, &mut self.generation, name, None);
    }

    fn reset(&mut self, all: Vec<IpamPoolObject>) {
        let fresh = all
            .iter()
            .map(|o| {
                (
                    o.0.metadata.name.clone().unwrap_or_default(),
                    pool_entry(&o.0),
                )
            })
            .collect();
        replace(&mut self.pools, &mut self.generation, fresh);
        self.synced.insert(FleetKind::IpamPool);
    }
}

impl IndexResource<IpamAllocationObject> for FleetIndex {
    const KIND: &'static str = FleetKind::IpamAllocation.as_str();

    fn apply(&mut self, o: IpamAllocationObject) {
        let key = names(&o.0.metadata);
        set(
            &mut self.allocations,
            &mut self.generation,
            key,
            Some(allocation_entry(&o.0)),
        );
    }

    fn delete(&mut self, o: IpamAllocationObject) {
        let key = names(&o.0.metadata);
        set(&mut self.allocations, &mut self.generation, key, None);
    }

    fn reset(&mut self, all: Vec<IpamAllocationObject>) {
        let fresh = all
            .iter()
            .map(|o| (names(&o.0.metadata), allocation_entry(&o.0)))
            .collect();
        replace(&mut self.allocations, &mut self.generation, fresh);
        self.synced.insert(FleetKind::IpamAllocation);
    }
}

impl IndexResource<CapiClusterObject> for FleetIndex {
    const KIND: &'static str = FleetKind::Cluster.as_str();

    fn apply(&mut self, o: CapiClusterObject) {
        if self.clusters_absent {
            // Served again: a full list follows (the watch restarts with one).
            return;
        }
        let entry = self.cluster_entry(&o.0);
        set(
            &mut self.clusters,
            &mut self.generation,
            names(&o.0.metadata),
            Some(entry),
        );
    }

    fn delete(&mut self, o: CapiClusterObject) {
        // A deletion names the object it deleted: a later one of the same name stays.
        let key = names(&o.0.metadata);
        let uid = o.0.metadata.uid.clone().unwrap_or_default();
        if self
            .clusters
            .get(&key)
            .is_some_and(|c| uid.is_empty() || c.uid == uid)
        {
            set(&mut self.clusters, &mut self.generation, key, None);
        }
    }

    fn reset(&mut self, all: Vec<CapiClusterObject>) {
        let fresh = all
            .iter()
            .map(|o| (names(&o.0.metadata), self.cluster_entry(&o.0)))
            .collect();
        if self.clusters_absent {
            self.clusters_absent = false;
            self.generation += 1;
        }
        replace(&mut self.clusters, &mut self.generation, fresh);
        self.synced.insert(FleetKind::Cluster);
    }
}

fn config_map_data(c: &ConfigMap) -> Option<(String, BTreeMap<String, String>)> {
    (c.metadata.name.as_deref() == Some(FLEET_CONFIG_MAP)).then(|| {
        (
            c.metadata.namespace.clone().unwrap_or_default(),
            c.data.clone().unwrap_or_default(),
        )
    })
}

impl IndexResource<ConfigMap> for FleetIndex {
    const KIND: &'static str = FleetKind::ConfigMap.as_str();

    fn apply(&mut self, c: ConfigMap) {
        if let Some((ns, data)) = config_map_data(&c) {
            set(&mut self.config_maps, &mut self.generation, ns, Some(data));
        }
    }

    fn delete(&mut self, c: ConfigMap) {
        if let Some((ns, _)) = config_map_data(&c) {
            set(&mut self.config_maps, &mut self.generation, ns, None);
        }
    }

    fn reset(&mut self, all: Vec<ConfigMap>) {
        let fresh = all.iter().filter_map(config_map_data).collect();
        replace(&mut self.config_maps, &mut self.generation, fresh);
        self.synced.insert(FleetKind::ConfigMap);
    }
}
