//! The index itself and the lookups an ADD makes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use allot_core::config::{Object, ObjectKind, Observation, Observed};
use allot_core::policy::{Labels, NamespaceInfo, NodeInfo, Owner, PodInfo};

use crate::multus;

/// The kinds of objects the index watches; each is "synced" once its first list is in. A pod's
/// ReplicaSet or Job is no watched kind: it is read when a pod needs it ([`Need`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Pod,
    Namespace,
    Node,
    IpPool,
    Subnet,
    ReservedIp,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Pod,
        Kind::Namespace,
        Kind::Node,
        Kind::IpPool,
        Kind::Subnet,
        Kind::ReservedIp,
    ];

    /// IPPools, Subnets and ReservedIPs: what the pools in force are made of.
    pub fn holds_pools(self) -> bool {
        matches!(self, Kind::IpPool | Kind::Subnet | Kind::ReservedIp)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
            Kind::Node => "Node",
            Kind::IpPool => "IPPool",
            Kind::Subnet => "Subnet",
            Kind::ReservedIp => "ReservedIP",
        }
    }
}

/// What the index keeps of one of this node's pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub labels: Labels,
    pub annotations: Labels,
    /// The owner reference marked `controller: true` (kind, name), if any; a KubeVirt
    /// VirtualMachineInstance is reported as its VirtualMachine.
    pub controller: Option<Owner>,
    /// The UID that owner reference names ("" when none): a cached ReplicaSet or Job of the
    /// name with another UID is an earlier object of that name, not this pod's owner.
    pub controller_uid: String,
    pub host_network: bool,
}

/// Everything the policy request needs about one interface of one pod.
#[derive(Clone, Debug, Default)]
pub struct PodRequest {
    pub pod: PodInfo,
    pub namespace: NamespaceInfo,
    pub node: NodeInfo,
    /// The interface's Multus network (`namespace/name`), "" when none is named.
    pub multus_name: String,
}

/// An object the index lacks to answer a lookup: the caller may wait for a watch to bring it
/// (the pod, its namespace, this node), then fetch it once; a pod's ReplicaSet or Job no watch
/// brings, the caller reads it at once.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    Pod { namespace: String, name: String },
    Namespace(String),
    Node(String),
    ReplicaSet { namespace: String, name: String },
    Job { namespace: String, name: String },
}

impl Need {
    /// Whether a watch of the index brings it (a pod just scheduled may reach the watch after
    /// the runtime's ADD: worth a short wait); a ReplicaSet or Job is only ever read by a GET.
    pub fn is_watched(&self) -> bool {
        matches!(self, Need::Pod { .. } | Need::Namespace(_) | Need::Node(_))
    }
}

/// The answer to "what is this pod?".
#[derive(Clone, Debug)]
pub enum Lookup {
    Ready(Box<PodRequest>),
    /// Objects not (yet) in the index.
    Missing(Vec<Need>),
    /// The pod's annotations cannot be read (a malformed Multus annotation); the pod, not the
    /// agent, has to change.
    Invalid(String),
}

type Key = (String, String);

fn key(namespace: &str, name: &str) -> Key {
    (namespace.to_string(), name.to_string())
}

/// A ReplicaSet or Job as a GET read it: its UID and its controller (Deployment, CronJob),
/// `None` when it has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CachedOwner {
    pub(crate) uid: String,
    pub(crate) controller: Option<Owner>,
}

/// What one node agent knows. Fed by [`crate::feed`] (or by tests, object by object).
#[derive(Debug, Default)]
pub struct Index {
    node_name: String,
    pub(crate) pods: HashMap<Key, PodFacts>,
    pub(crate) namespaces: HashMap<String, (Labels, Labels)>,
    pub(crate) node: Option<Labels>,
    /// The ReplicaSets and Jobs this node's pods name as controller, read once each (a GET when
    /// a pod first needs it) and kept while a pod of this node names them: a controller's
    /// controller does not change, and what the cache holds follows the node's pods, not the
    /// cluster's workloads.
    pub(crate) replicasets: HashMap<Key, CachedOwner>,
    pub(crate) jobs: HashMap<Key, CachedOwner>,
    /// Each object as core observed it, with the document it was observed from: an event that
    /// changes none of the document (a status write, a relist) changes nothing the agent serves.
    pub(crate) allot: BTreeMap<(ObjectKind, String), (Observed, serde_json::Value)>,
    pub(crate) synced: BTreeSet<Kind>,
    /// Bumped by every change of what an IPPool, Subnet or ReservedIP says (not its status).
    allot_generation: u64,
}

impl Index {
    pub fn new(node_name: &str) -> Index {
        Index {
            node_name: node_name.to_string(),
            ..Index::default()
        }
    }

    /// This node's labels, once its watch has delivered the Node.
    pub fn node_labels(&self) -> Option<&Labels> {
        self.node.as_ref()
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    pub fn is_synced(&self, kind: Kind) -> bool {
        self.synced.contains(&kind)
    }

    /// Kinds whose first list has not arrived yet.
    pub fn unsynced(&self) -> Vec<Kind> {
        Kind::ALL
            .into_iter()
            .filter(|k| !self.synced.contains(k))
            .collect()
    }

    pub(crate) fn mark_synced(&mut self, kind: Kind) {
        self.synced.insert(kind);
    }

    pub(crate) fn allot_changed(&mut self) {
        self.allot_generation += 1;
    }

    /// Changes whenever what [`Index::observation`] returns changes; `None` until the first
    /// lists of pool objects arrived. Cheap: for checking before each ADD.
    pub fn pools_generation(&self) -> Option<u64> {
        self.pools_synced().then_some(self.allot_generation)
    }

    fn pools_synced(&self) -> bool {
        Kind::ALL
            .iter()
            .filter(|k| k.holds_pools())
            .all(|k| self.is_synced(*k))
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodFacts> {
        self.pods.get(&key(namespace, name))
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// How many ReplicaSets and Jobs the index holds (each named by a pod of this node).
    pub fn cached_owners(&self) -> usize {
        self.replicasets.len() + self.jobs.len()
    }

    /// Drops the cached ReplicaSets and Jobs no pod of this node names any more (after a pod
    /// went, or changed controller).
    pub(crate) fn forget_unnamed_owners(&mut self) {
        if self.replicasets.is_empty() && self.jobs.is_empty() {
            return;
        }
        let named: HashSet<(&str, &str, &str)> = self
            .pods
            .iter()
            .filter_map(|((namespace, _), p)| {
                let c = p.controller.as_ref()?;
                Some((c.kind.as_str(), namespace.as_str(), c.name.as_str()))
            })
            .collect();
        self.replicasets
            .retain(|(ns, name), _| named.contains(&("ReplicaSet", ns.as_str(), name.as_str())));
        self.jobs
            .retain(|(ns, name), _| named.contains(&("Job", ns.as_str(), name.as_str())));
    }

    /// The IPPools, Subnets and ReservedIPs as core's loader observed them, and a generation
    /// that changes with them; `None` until all three kinds are listed (an empty cache must not
    /// read as "every pool deleted").
    pub fn observation(&self) -> Option<(u64, Observation)> {
        if !self.pools_synced() {
            return None;
        }
        Some((
            self.allot_generation,
            Observation {
                objects: self.allot.values().map(|(o, _)| o.clone()).collect(),
                incomplete: Default::default(),
            },
        ))
    }

    /// Checked pools, for tests and status (the agent reconciles [`Index::observation`]).
    pub fn valid_pools(&self) -> Vec<String> {
        self.allot
            .iter()
            .filter(|(_, (o, _))| matches!(o.object, Ok(Object::Pool(_))))
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    /// The pod's top-level owner: a ReplicaSet's Deployment, a Job's CronJob, else the
    /// controller itself. With `strict`, an intermediate owner missing from the index (or
    /// cached with another UID than the pod names: an earlier object of the name) is a
    /// [`Need`]; without, the intermediate is taken as the owner.
    fn owner(
        &self,
        namespace: &str,
        controller: &Owner,
        uid: &str,
        strict: bool,
    ) -> Result<Owner, Need> {
        let (cache, need): (_, fn(String, String) -> Need) = match controller.kind.as_str() {
            "ReplicaSet" => (&self.replicasets, |namespace, name| Need::ReplicaSet {
                namespace,
                name,
            }),
            "Job" => (&self.jobs, |namespace, name| Need::Job { namespace, name }),
            _ => return Ok(controller.clone()),
        };
        let same = |c: &&CachedOwner| c.uid.is_empty() || uid.is_empty() || c.uid == uid;
        match cache.get(&key(namespace, &controller.name)).filter(same) {
            Some(cached) => Ok(cached
                .controller
                .clone()
                .unwrap_or_else(|| controller.clone())),
            None if strict => Err(need(namespace.to_string(), controller.name.clone())),
            None => Ok(controller.clone()),
        }
    }

    /// Builds the policy request for `interface` of pod `namespace/name` from the index alone.
    /// With `strict` off, a missing ReplicaSet or Job counts as the owner itself (after the
    /// caller fetched it once and it was gone).
    pub fn lookup(&self, namespace: &str, name: &str, interface: &str, strict: bool) -> Lookup {
        let mut missing = Vec::new();
        let pod = self.pod(namespace, name);
        if pod.is_none() {
            missing.push(Need::Pod {
                namespace: namespace.to_string(),
                name: name.to_string(),
            });
        }
        let ns = self.namespaces.get(namespace);
        if ns.is_none() {
            missing.push(Need::Namespace(namespace.to_string()));
        }
        if self.node.is_none() {
            missing.push(Need::Node(self.node_name.clone()));
        }
        let owner = match pod.and_then(|p| Some((p.controller.as_ref()?, &p.controller_uid))) {
            Some((c, uid)) => match self.owner(namespace, c, uid, strict) {
                Ok(o) => Some(o),
                Err(need) => {
                    missing.push(need);
                    None
                }
            },
            None => None,
        };
        let (Some(pod), Some((ns_labels, ns_annotations)), Some(node_labels), true) =
            (pod, ns, &self.node, missing.is_empty())
        else {
            return Lookup::Missing(missing);
        };
        let multus_name = match multus::network_of(&pod.annotations, namespace, interface) {
            Ok(n) => n,
            Err(why) => return Lookup::Invalid(format!("pod {namespace}/{name}: {why}")),
        };
        Lookup::Ready(Box::new(PodRequest {
            pod: PodInfo {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: pod.uid.clone(),
                labels: pod.labels.clone(),
                annotations: pod.annotations.clone(),
                owner,
            },
            namespace: NamespaceInfo {
                name: namespace.to_string(),
                labels: ns_labels.clone(),
                annotations: ns_annotations.clone(),
            },
            node: NodeInfo {
                name: self.node_name.clone(),
                labels: node_labels.clone(),
            },
            multus_name,
        }))
    }
}

/// An index shared between the watches that feed it and the readers that serve from it: the
/// node agent's [`Index`] ([`SharedIndex`]) or the controller's.
#[derive(Debug)]
pub struct Shared<I> {
    index: RwLock<I>,
    changes: tokio::sync::watch::Sender<u64>,
}

/// The node agent's index, shared.
pub type SharedIndex = Shared<Index>;

impl SharedIndex {
    pub fn new(node_name: &str) -> Arc<SharedIndex> {
        Shared::of(Index::new(node_name))
    }
}

impl<I> Shared<I> {
    pub fn of(index: I) -> Arc<Shared<I>> {
        Arc::new(Shared {
            index: RwLock::new(index),
            changes: tokio::sync::watch::Sender::new(0),
        })
    }

    pub fn read(&self) -> RwLockReadGuard<'_, I> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the index and wakes those waiting for a change.
    pub fn update<R>(&self, f: impl FnOnce(&mut I) -> R) -> R {
        let out = {
            let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
            f(&mut index)
        };
        self.changes.send_modify(|n| *n += 1);
        out
    }

    /// A receiver that sees every change made through [`Shared::update`].
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Waits until `ready` holds of the index, or `timeout` passes; returns what `ready` last
    /// returned. Wakes on every change rather than polling.
    pub async fn wait_for<R>(
        &self,
        timeout: Duration,
        mut ready: impl FnMut(&I) -> Option<R>,
    ) -> Result<R, tokio::time::error::Elapsed> {
        let mut changes = self.changes.subscribe();
        tokio::time::timeout(timeout, async {
            loop {
                changes.mark_unchanged();
                if let Some(r) = ready(&self.read()) {
                    return r;
                }
                if changes.changed().await.is_err() {
                    // The sender lives as long as self: cannot happen; wait for the timeout.
                    std::future::pending::<()>().await;
                }
            }
        })
        .await
    }
}
