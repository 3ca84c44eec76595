//! What a node agent knows of its cluster, kept current by watches (linkerd's shape: indexes
//! fed by watch events, tested by feeding them objects, read by a thin layer that serves
//! requests).
//!
//! One [`Index`] holds, for one node:
//! - this node's pods (watched with a field selector on `spec.nodeName`): labels, annotations,
//!   UID, the controller owner reference;
//! - namespaces (labels, annotations: namespace default pools), this node's labels;
//! - the ReplicaSets and Jobs this node's pods name, as metadata only, to resolve a pod's
//!   top-level owner (ReplicaSet → Deployment, Job → CronJob): not watched but read by one GET
//!   when a pod first needs it ([`Need`]), and kept while a pod of this node names it, so that
//!   what an agent holds follows its node's pods, not the cluster's workloads (StatefulSets are
//!   not held at all: the agent reads one's replica count when a DEL needs it);
//! - allot's IPPools, Subnets and ReservedIPs, read as untyped objects and checked by core's
//!   loader one by one (so one malformed object can neither break the watch nor make more
//!   addresses allocatable: core's `reconcile` keeps its last good version in force).
//!
//! [`ClusterIndex`] holds what the controller knows of the whole cluster (every pod, node,
//! StatefulSet, allot's Endpoints and pools), for garbage collection and pool lifecycle.
//!
//! The controller's [`WorkloadIndex`] holds, for subnet auto-pools, the workloads whose pod
//! template carries allot's annotations (Deployments, StatefulSets, ReplicaSets and Jobs of their
//! own, DaemonSets, CronJobs, and objects of any kind with a `scale` subresource the controller
//! follows) and the IPPools, Subnets and ReservedIPs that carving reads.
//!
//! The controller's [`FleetIndex`] holds, for fleet ranges, the IPAMPools with their records,
//! the IPAMAllocations, Cluster API `Cluster`s (their datacenter label) and the ConfigMaps the
//! allocations are projected into.
//!
//! Every change goes through [`SharedIndex::update`], which counts it and wakes whoever waits
//! for one (an ADD waiting for its pod to reach the cache). [`feed`] turns a watch stream into
//! those updates: objects listed after a (re)start replace the kind's contents at once, when
//! the list is complete, so a relist never shows a half-empty cache.

mod allot;
pub mod cluster;
mod feed;
pub mod fleet;
mod index;
pub mod multus;
mod resources;
mod workloads;

pub use allot::{PoolObject, ReservedObject, SubnetObject, pool_document_feeds};
pub use cluster::{
    ClusterIndex, ClusterKind, EndpointEntry, EndpointObject, KubeVirt, PodEntry,
    VirtualMachineInstanceObject, VirtualMachineObject,
};
pub use feed::{IndexResource, feed};
pub use fleet::{
    CapiClusterObject, ClusterEntry, FleetAllocationEntry, FleetIndex, FleetKind, FleetPoolEntry,
    IpamAllocationObject, IpamPoolObject, Undecodable,
};
pub use index::{Index, Kind, Lookup, Need, PodFacts, PodRequest, Shared, SharedIndex};
pub use resources::pod_controller;
pub use workloads::{
    PoolEntry, ScalableKey, ScalableKind, ScaleRead, SubnetError, WorkloadEntry, WorkloadIndex,
    WorkloadKey, WorkloadKind,
};
