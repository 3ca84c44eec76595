//! What the controller's subnet auto-pools follow, fed by watches: the workloads whose pod
//! template may name Subnets, and the IPPools, Subnets and ReservedIPs that carving reads.
//!
//! Workloads (Deployments, StatefulSets, ReplicaSets, Jobs, DaemonSets, CronJobs) are kept only
//! while their pod template carries an annotation under `ipam.allot.dev/` or
//! `ipam.spidernet.io/` (only those annotations are kept), so the index stays small in a
//! cluster where few workloads use auto pools. A ReplicaSet or Job that has a controller owner is
//! not a workload of its own: its pods' top-level owner is that controller (a Deployment, a
//! CronJob; the agent resolves pod owners the same way), so a pool labelled with the
//! ReplicaSet would never be chosen.
//!
//! Pods per workload ([`WorkloadEntry::replicas`]): `spec.replicas` (default 1) for
//! Deployments, StatefulSets and ReplicaSets; `status.desiredNumberScheduled` for DaemonSets
//! (the nodes it should run on, 0 until the DaemonSet controller counted them); for Jobs
//! `spec.parallelism` (default 1), capped by `spec.completions` when that is set, since a Job
//! never runs more pods at once; for CronJobs the same of `spec.jobTemplate`. A suspended Job
//! keeps its count, so that it finds its addresses when it resumes.
//!
//! Allot's objects enter as the agent's index reads them: untyped, each checked by core's loader
//! on its own, so a malformed object is one refused object. Besides the check, the index keeps
//! what writing back needs: the resourceVersion, labels, deletion, and what a pool lists as far
//! as it can be read (carving avoids an invalid pool's addresses too).
//!
//! Kinds beyond these with a `scale` subresource (a CloneSet, say) are followed as the
//! controller's discovery finds them ([`scalable`]).
//!
//! Namespaces are followed as metadata, for their labels only: a StatefulSet's declared
//! addresses are reserved only in pools its pods may use, which a pool's namespaceAffinity
//! decides from them ([`namespaces`]).
//!
//! [`WorkloadIndex::generation`] changes only with what the auto-pool decisions read (not with
//! a pool's status or a Deployment's rollout progress), so the controller can skip a pass when
//! nothing it reads changed.

use std::collections::{BTreeMap, BTreeSet};

use allot_core::autopool::listed_addresses;
use allot_core::config::{Object, ObjectKind};
use allot_core::spec::IpPoolSpec;
use allot_core::{AddrSet, IpFamily, Reserved, Subnet};
use allot_k8s::openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use allot_k8s::openapi::api::batch::v1::{CronJob, Job, JobSpec};
use allot_k8s::openapi::api::core::v1::PodTemplateSpec;
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::DynamicObject;
use serde_json::Value;

mod namespaces;
mod scalable;

pub use scalable::{ScalableKey, ScalableKind, ScaleRead};

use crate::allot::observe;
use crate::feed::IndexResource;
use crate::{PoolObject, ReservedObject, SubnetObject};

/// Annotation prefixes the auto pools read (allot's and Spiderpool's).
const PREFIXES: [&str; 2] = ["ipam.allot.dev/", "ipam.spidernet.io/"];

/// The kinds of workload that get auto pools, and the allot kinds carving reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    ReplicaSet,
    Job,
    DaemonSet,
    CronJob,
    IpPool,
    Subnet,
    ReservedIp,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 9] = [
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::ReplicaSet,
        WorkloadKind::Job,
        WorkloadKind::DaemonSet,
        WorkloadKind::CronJob,
        WorkloadKind::IpPool,
        WorkloadKind::Subnet,
        WorkloadKind::ReservedIp,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::ReplicaSet => "ReplicaSet",
            WorkloadKind::Job => "Job",
            WorkloadKind::DaemonSet => "DaemonSet",
            WorkloadKind::CronJob => "CronJob",
            WorkloadKind::IpPool => "IPPool",
            WorkloadKind::Subnet => "Subnet",
            WorkloadKind::ReservedIp => "ReservedIP",
        }
    }

    /// A workload kind, not one of allot's that carving reads.
    pub const fn is_workload(self) -> bool {
        !matches!(
            self,
            WorkloadKind::IpPool | WorkloadKind::Subnet | WorkloadKind::ReservedIp
        )
    }

    /// The API group/version of a workload kind (for Event references).
    pub const fn api_version(self) -> &'static str {
        match self {
            WorkloadKind::Job | WorkloadKind::CronJob => "batch/v1",
            WorkloadKind::IpPool | WorkloadKind::Subnet | WorkloadKind::ReservedIp => {
                "allot.dev/v1alpha1"
            }
            _ => "apps/v1",
        }
    }
}

/// A workload, keyed by kind, namespace and name.
pub type WorkloadKey = (WorkloadKind, String, String);

/// What the index keeps of a workload whose pod template carries allot or Spiderpool
/// annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadEntry {
    pub uid: String,
    /// The pod template's annotations under the two prefixes.
    pub annotations: BTreeMap<String, String>,
    /// The pod template's labels, for the built-in kinds (a pool's podAffinity is matched
    /// against a StatefulSet's when its declared addresses are reserved).
    pub labels: BTreeMap<String, String>,
    /// Pods it runs at once (see the module's documentation per kind).
    pub replicas: u64,
    pub deleting: bool,
}

/// An IPPool as carving and writing back need it.
#[derive(Clone, Debug)]
pub struct PoolEntry {
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub deleting: bool,
    /// Its spec if it passed core's checks, else why not.
    pub spec: Result<IpPoolSpec, String>,
    /// What it lists, as far as that can be read.
    pub addresses: Option<AddrSet>,
}

/// Why a Subnet cannot be carved from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubnetError {
    #[error("it is being deleted")]
    Deleting,
    /// The object is some other kind (the Subnet watch never delivers one).
    #[error("not a Subnet")]
    NotASubnet,
    /// It fails core's checks, which say why.
    #[error("{0}")]
    Invalid(String),
}

/// What decides a new pass: the spec, labels and deletion of an allot object.
type Fingerprint = (Value, BTreeMap<String, String>, bool);

/// The controller's auto-pool view of the cluster. Fed by [`crate::feed`] (or by tests).
#[derive(Debug, Default)]
pub struct WorkloadIndex {
    workloads: BTreeMap<WorkloadKey, WorkloadEntry>,
    pools: BTreeMap<String, (PoolEntry, Fingerprint)>,
    subnets: BTreeMap<String, (Result<Subnet, SubnetError>, Fingerprint)>,
    reserved: BTreeMap<String, (Option<Reserved>, Fingerprint)>,
    synced: BTreeSet<WorkloadKind>,
    /// Namespaces' labels, by name (listed or not: [`WorkloadIndex::namespace_labels`]).
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Objects of the followed scalable kinds that ask for auto pools.
    scalable: BTreeMap<ScalableKey, scalable::ScalableEntry>,
    /// The scalable kinds followed, and whether their first list arrived.
    followed: BTreeMap<ScalableKind, bool>,
    generation: u64,
}

fn names(meta: &ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

fn has_controller(meta: &ObjectMeta) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true))
}

fn count(n: Option<i32>, default: u64) -> u64 {
    n.map_or(default, |n| u64::try_from(n).unwrap_or(0))
}

fn job_pods(spec: Option<&JobSpec>) -> u64 {
    let Some(spec) = spec else { return 1 };
    let parallel = count(spec.parallelism, 1);
    match spec.completions {
        Some(c) => parallel.min(count(Some(c), 1)),
        None => parallel,
    }
}

/// The entry of a workload, or `None` when it has no annotation auto pools read.
fn entry(
    meta: &ObjectMeta,
    template: Option<&PodTemplateSpec>,
    replicas: u64,
) -> Option<WorkloadEntry> {
    let annotations: BTreeMap<String, String> = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .into_iter()
        .flatten()
        .filter(|(k, _)| PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!annotations.is_empty()).then(|| WorkloadEntry {
        uid: meta.uid.clone().unwrap_or_default(),
        annotations,
        labels: template
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default(),
        replicas,
        deleting: meta.deletion_timestamp.is_some(),
    })
}

impl WorkloadIndex {
    pub fn new() -> WorkloadIndex {
        WorkloadIndex::default()
    }

    /// Changes whenever something the auto-pool decisions read changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn is_synced(&self, kind: WorkloadKind) -> bool {
        self.synced.contains(&kind)
    }

    /// Every kind is listed: before that, a workload or pool missing from the index may just not
    /// be listed yet, and nothing may be deleted or carved on that.
    pub fn ready(&self) -> bool {
        WorkloadKind::ALL.iter().all(|k| self.synced.contains(k))
            && self.followed.values().all(|synced| *synced)
    }

    /// Kinds whose first list has not arrived yet.
    pub fn unsynced(&self) -> Vec<WorkloadKind> {
        WorkloadKind::ALL
            .into_iter()
            .filter(|k| !self.synced.contains(k))
            .collect()
    }

    pub fn workloads(&self) -> impl Iterator<Item = (&WorkloadKey, &WorkloadEntry)> {
        self.workloads.iter()
    }

    pub fn workload(
        &self,
        kind: WorkloadKind,
        namespace: &str,
        name: &str,
    ) -> Option<&WorkloadEntry> {
        self.workloads
            .get(&(kind, namespace.to_string(), name.to_string()))
    }

    pub fn pools(&self) -> impl Iterator<Item = (&String, &PoolEntry)> {
        self.pools.iter().map(|(name, (entry, _))| (name, entry))
    }

    pub fn pool(&self, name: &str) -> Option<&PoolEntry> {
        self.pools.get(name).map(|(entry, _)| entry)
    }

    /// Every Subnet by name: checked, or why it cannot be carved from (invalid, being deleted).
    pub fn subnets(&self) -> BTreeMap<String, Result<Subnet, SubnetError>> {
        self.subnets
            .iter()
            .map(|(name, (s, _))| (name.clone(), s.clone()))
            .collect()
    }

    /// What live ReservedIPs of `family` reserve (an invalid one: what can be read of it).
    pub fn reserved(&self, family: IpFamily) -> AddrSet {
        self.reserved
            .values()
            .filter_map(|(r, _)| r.as_ref())
            .filter(|r| r.family == family)
            .fold(AddrSet::empty(family), |acc, r| acc.union(&r.ips))
    }

    /// Every ReservedIP by name: what it reserves (`None` while it is being deleted, or when
    /// nothing of it can be read), its labels, and whether it is being deleted.
    pub fn reserved_objects(
        &self,
    ) -> impl Iterator<Item = (&String, Option<&Reserved>, &BTreeMap<String, String>, bool)> {
        self.reserved
            .iter()
            .map(|(name, (r, (_, labels, deleting)))| (name, r.as_ref(), labels, *deleting))
    }

    fn set_workload(&mut self, key: WorkloadKey, entry: Option<WorkloadEntry>) {
        let changed = match entry {
            Some(e) => self.workloads.insert(key, e.clone()).as_ref() != Some(&e),
            None => self.workloads.remove(&key).is_some(),
        };
        if changed {
            self.generation += 1;
        }
    }

    fn reset_workloads(
        &mut self,
        kind: WorkloadKind,
        entries: Vec<(WorkloadKey, Option<WorkloadEntry>)>,
    ) {
        let fresh: BTreeMap<WorkloadKey, WorkloadEntry> = entries
            .into_iter()
            .filter_map(|(k, e)| Some((k, e?)))
            .collect();
        let old: BTreeMap<WorkloadKey, WorkloadEntry> =
            self.workloads.extract_if(.., |k, _| k.0 == kind).collect();
        if old != fresh || !self.synced.contains(&kind) {
            self.generation += 1;
        }
        self.workloads.extend(fresh);
        self.synced.insert(kind);
    }
}

/// Each workload kind: how to read its key, pod template and pod count, and whether it is a
/// workload of its own.
trait WorkloadObject: Resource {
    const KIND: WorkloadKind;
    fn template(&self) -> Option<&PodTemplateSpec>;
    fn pods(&self) -> u64;
    /// A ReplicaSet or Job run by a controller is that controller's business.
    fn top_level(&self) -> bool {
        true
    }

    fn key(&self) -> WorkloadKey {
        let (namespace, name) = names(self.meta());
        (Self::KIND, namespace, name)
    }

    fn entry(&self) -> Option<WorkloadEntry> {
        if !self.top_level() {
            return None;
        }
        entry(self.meta(), self.template(), self.pods())
    }
}

impl WorkloadObject for Deployment {
    const KIND: WorkloadKind = WorkloadKind::Deployment;
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|s| &s.template)
    }
    fn pods(&self) -> u64 {
        count(self.spec.as_ref().and_then(|s| s.replicas), 1)
    }
}

impl WorkloadObject for StatefulSet {
    const KIND: WorkloadKind = WorkloadKind::StatefulSet;
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|s| &s.template)
    }
    fn pods(&self) -> u64 {
        count(self.spec.as_ref().and_then(|s| s.replicas), 1)
    }
}

impl WorkloadObject for ReplicaSet {
    const KIND: WorkloadKind = WorkloadKind::ReplicaSet;
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().and_then(|s| s.template.as_ref())
    }
    fn pods(&self) -> u64 {
        count(self.spec.as_ref().and_then(|s| s.replicas), 1)
    }
    fn top_level(&self) -> bool {
        !has_controller(&self.metadata)
    }
}

impl WorkloadObject for Job {
    const KIND: WorkloadKind = WorkloadKind::Job;
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|s| &s.template)
    }
    fn pods(&self) -> u64 {
        job_pods(self.spec.as_ref())
    }
    fn top_level(&self) -> bool {
        !has_controller(&self.metadata)
    }
}

impl WorkloadObject for DaemonSet {
    const KIND: WorkloadKind = WorkloadKind::DaemonSet;
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|s| &s.template)
    }
    fn pods(&self) -> u64 {
        self.status
            .as_ref()
            .map_or(0, |s| count(Some(s.desired_number_scheduled), 0))
    }
}

impl WorkloadObject for CronJob {
    const KIND: WorkloadKind = WorkloadKind::CronJob;
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec
            .as_ref()
            .and_then(|s| s.job_template.spec.as_ref())
            .map(|s| &s.template)
    }
    fn pods(&self) -> u64 {
        job_pods(
            self.spec
                .as_ref()
                .and_then(|s| s.job_template.spec.as_ref()),
        )
    }
}

macro_rules! workload_kind {
    ($ty:ty) => {
        impl IndexResource<$ty> for WorkloadIndex {
            const KIND: &'static str = <$ty as WorkloadObject>::KIND.as_str();

            fn apply(&mut self, o: $ty) {
                self.set_workload(o.key(), o.entry());
            }

            fn delete(&mut self, o: $ty) {
                // A deletion names the object it deleted: a later one of the same name (already
                // applied) stays.
                let key = o.key();
                let uid = o.metadata.uid.clone().unwrap_or_default();
                if self
                    .workloads
                    .get(&key)
                    .is_some_and(|w| uid.is_empty() || w.uid == uid)
                {
                    self.set_workload(key, None);
                }
            }

            fn reset(&mut self, all: Vec<$ty>) {
                let entries = all.iter().map(|o| (o.key(), o.entry())).collect();
                self.reset_workloads(<$ty as WorkloadObject>::KIND, entries);
            }
        }
    };
}

workload_kind!(Deployment);
workload_kind!(StatefulSet);
workload_kind!(ReplicaSet);
workload_kind!(Job);
workload_kind!(DaemonSet);
workload_kind!(CronJob);

fn fingerprint(o: &DynamicObject) -> Fingerprint {
    (
        o.data.get("spec").cloned().unwrap_or(Value::Null),
        o.metadata.labels.clone().unwrap_or_default(),
        o.metadata.deletion_timestamp.is_some(),
    )
}

fn pool_entry(o: &DynamicObject) -> PoolEntry {
    let observed = observe(ObjectKind::IpPool, o);
    let spec = o.data.get("spec").unwrap_or(&Value::Null);
    let ips: Vec<String> = spec["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let (spec, addresses) = match observed.object {
        Ok(Object::Pool(p)) => (Ok(p.spec.clone()), Some(p.ips.clone())),
        Ok(_) => (Err("not an IPPool".to_string()), None),
        Err(invalid) => (
            Err(invalid.error),
            listed_addresses(
                spec["ipVersion"]
                    .as_u64()
                    .and_then(|v| u8::try_from(v).ok()),
                spec["subnet"].as_str(),
                &ips,
            ),
        ),
    };
    PoolEntry {
        resource_version: o.metadata.resource_version.clone().unwrap_or_default(),
        labels: o.metadata.labels.clone().unwrap_or_default(),
        deleting: o.metadata.deletion_timestamp.is_some(),
        spec,
        addresses,
    }
}

fn subnet_entry(o: &DynamicObject) -> Result<Subnet, SubnetError> {
    if o.metadata.deletion_timestamp.is_some() {
        return Err(SubnetError::Deleting);
    }
    match observe(ObjectKind::Subnet, o).object {
        Ok(Object::Subnet(s)) => Ok(*s),
        Ok(_) => Err(SubnetError::NotASubnet),
        Err(invalid) => Err(SubnetError::Invalid(invalid.error)),
    }
}

/// What a ReservedIP reserves: nothing while it is being deleted; an invalid one what can be
/// read of it (one typo never un-reserves the rest).
fn reserved_entry(o: &DynamicObject) -> Option<Reserved> {
    if o.metadata.deletion_timestamp.is_some() {
        return None;
    }
    match observe(ObjectKind::ReservedIp, o).object {
        Ok(Object::Reserved(r)) => Some(r),
        Ok(_) => None,
        Err(invalid) => invalid.salvaged.map(|r| *r),
    }
}

fn name_of(o: &DynamicObject) -> String {
    o.metadata.name.clone().unwrap_or_default()
}

/// One allot kind's map in the index, and how an object becomes its entry.
macro_rules! allot_kind {
    ($wrapper:ident, $field:ident, $entry:expr, $tag:expr) => {
        impl IndexResource<$wrapper> for WorkloadIndex {
            const KIND: &'static str = $tag.as_str();

            fn apply(&mut self, o: $wrapper) {
                let print = fingerprint(&o.0);
                let changed = self
                    .$field
                    .get(&name_of(&o.0))
                    .is_none_or(|(_, old)| *old != print);
                self.$field.insert(name_of(&o.0), ($entry(&o.0), print));
                if changed {
                    self.generation += 1;
                }
            }

            fn delete(&mut self, o: $wrapper) {
                if self.$field.remove(&name_of(&o.0)).is_some() {
                    self.generation += 1;
                }
            }

            fn reset(&mut self, all: Vec<$wrapper>) {
                let fresh: BTreeMap<_, _> = all
                    .iter()
                    .map(|o| (name_of(&o.0), ($entry(&o.0), fingerprint(&o.0))))
                    .collect();
                let same = fresh.len() == self.$field.len()
                    && fresh
                        .iter()
                        .all(|(k, (_, p))| self.$field.get(k).is_some_and(|(_, old)| old == p));
                self.$field = fresh;
                if !same || !self.synced.contains(&$tag) {
                    self.generation += 1;
                }
                self.synced.insert($tag);
            }
        }
    };
}

allot_kind!(PoolObject, pools, pool_entry, WorkloadKind::IpPool);
allot_kind!(SubnetObject, subnets, subnet_entry, WorkloadKind::Subnet);
allot_kind!(
    ReservedObject,
    reserved,
    reserved_entry,
    WorkloadKind::ReservedIp
);
