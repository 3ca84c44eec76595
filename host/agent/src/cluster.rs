//! Cluster mode (`--kubernetes`): claims in the cluster's IPBlocks, pools from its IPPools,
//! Subnets and ReservedIPs, and each ADD's policy request built from watch-fed indexes
//! ([`allot_index`]) rather than from what the plugin was told.
//!
//! What runs where: the agent (one per node) watches this node's pods, all namespaces, this
//! node, allot's pool objects and the cluster's `Policy` (and, through the claim store, the
//! IPBlocks of the pools this node may use: [`Cluster::follow_blocks`]); it writes IPBlocks
//! (claims) and `Endpoint`s (what each pod holds). It watches no
//! workload: a pod's ReplicaSet or Job (for its Deployment or CronJob) is read by one
//! metadata-only GET when a pod of this node first names it, and kept while one does
//! ([`Cluster::request`]); a StatefulSet's replica count is read by one GET at the DEL of its
//! pod, when the plugin did not say it ([`Cluster::owner_replicas`]). The controller derives
//! pool status counts and collects garbage.

mod endpoints;
pub mod migration;
mod policy;

use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::block::BlockScope;
use allot_core::config::{InForce, reconcile};
use allot_core::policy::Labels;
use allot_index::{
    Index, IndexResource, Kind, Lookup, Need, PodRequest, SharedIndex, feed, pool_document_feeds,
};
use allot_k8s::openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use allot_k8s::openapi::api::batch::v1::Job;
use allot_k8s::openapi::api::core::v1::{Namespace, Node, Pod};
use allot_store::KubeStore;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

pub use endpoints::EndpointWriter;
pub use policy::PolicyFollower;

/// How long a DEL waits for its StatefulSet's GET: well inside the plugin's DEL timeout (15 s).
/// Past it the replica count is unknown and the address kept (released later if the pod does
/// not come back).
pub const STATEFULSET_READ_TIMEOUT: Duration = Duration::from_secs(3);

/// What cluster mode adds to the agent.
pub struct Cluster {
    pub index: Arc<SharedIndex>,
    pub client: kube::Client,
    /// How long an ADD waits for its pod to reach the index before asking the API once.
    pub pod_wait: Duration,
    pub endpoints: EndpointWriter,
    /// The agent's runtime: a DEL, on a blocking thread, reads its StatefulSet through it.
    pub runtime: tokio::runtime::Handle,
    /// The claim store, whose IPBlocks the agent narrows to its pools' ([`Cluster::follow_blocks`]).
    pub blocks: Arc<KubeStore>,
    /// The scope last asked of `blocks`, and when.
    pub scoped: std::sync::Mutex<Option<(BlockScope, Instant)>>,
}

/// How often the scope is asked again unchanged: the blocks of claims this node made outside
/// its pools (a policy that ignores node affinity) join it by then.
const RESCOPE_EVERY: Duration = Duration::from_secs(60);

/// The IPBlocks this node's agent follows: those of the pools in force that admit this node
/// (their `nodeAffinity` and `nodeName`) and of every Subnet. `None` until the Node watch has
/// listed (a node without its Node object has no labels).
pub fn blocks_scope(in_force: &InForce, index: &Index) -> Option<BlockScope> {
    let none = Labels::new();
    let labels = match index.node_labels() {
        Some(labels) => labels,
        None if !index.unsynced().contains(&Kind::Node) => &none,
        None => return None,
    };
    Some(BlockScope::of_node(
        in_force.pools.values().map(|(p, _)| p),
        in_force.subnets.values().map(|(s, _)| s),
        index.node_name(),
        labels,
    ))
}

/// Why an ADD's request could not be built.
#[derive(Debug)]
pub enum LookupError {
    /// The pod's own objects are wrong (a malformed Multus annotation).
    Invalid(String),
    /// The API does not answer, or does not know the pod: retry later.
    Unavailable(String),
}

/// Starts one watch per kind the index follows, on the current runtime: this node's pods,
/// namespaces, this node, and the pool objects. Workloads are not watched (see the module).
pub fn watch(index: &Arc<SharedIndex>, client: &kube::Client) {
    let node = index.read().node_name().to_string();
    let config = watcher::Config::default();
    let on_this_node = config.clone().fields(&format!("spec.nodeName={node}"));
    let this_node = config.clone().fields(&format!("metadata.name={node}"));
    let c = client.clone();
    let i = index.clone();
    tokio::spawn(feed(
        i.clone(),
        watcher(Api::<Pod>::all(c.clone()), on_this_node).default_backoff(),
        |p| p,
    ));
    tokio::spawn(feed(
        i.clone(),
        watcher(Api::<Namespace>::all(c.clone()), config.clone()).default_backoff(),
        |n| n,
    ));
    tokio::spawn(feed(
        i.clone(),
        watcher(Api::<Node>::all(c.clone()), this_node).default_backoff(),
        |n| n,
    ));
    for watch in pool_document_feeds(&i, &c, &config) {
        tokio::spawn(watch);
    }
}

/// How long the agent's start waits for the pools and this node before it lists IPBlocks;
/// past it, it follows every block until its first reload narrows them.
const FIRST_SCOPE_WAIT: Duration = Duration::from_secs(15);

/// The IPBlocks to list at start: those of the pools this node may use, once the index's
/// first lists of pools and of this node are in ([`FIRST_SCOPE_WAIT`] at most).
pub async fn first_scope(index: &Arc<SharedIndex>) -> BlockScope {
    let known = index
        .wait_for(FIRST_SCOPE_WAIT, |i| {
            let (_, observation) = i.observation()?;
            let in_force = reconcile(&InForce::default(), &observation, &|_| false).in_force;
            blocks_scope(&in_force, i)
        })
        .await;
    known.unwrap_or_else(|_| {
        tracing::warn!(
            "the pools or this Node are not known after {} s; following every IPBlock until \
             they are",
            FIRST_SCOPE_WAIT.as_secs()
        );
        BlockScope::All
    })
}

impl Cluster {
    /// Narrows the IPBlocks the store follows to those of `in_force`'s pools this node may use
    /// (after a reload, and at every tick for the node's labels); cheap when nothing changed.
    pub fn follow_blocks(&self, in_force: &InForce) {
        let Some(wanted) = blocks_scope(in_force, &self.index.read()) else {
            return;
        };
        let mut last = self.scoped.lock().unwrap_or_else(|p| p.into_inner());
        let due = last
            .as_ref()
            .is_none_or(|(s, at)| *s != wanted || at.elapsed() >= RESCOPE_EVERY);
        if due {
            self.blocks.scope_to(wanted.clone());
            *last = Some((wanted, Instant::now()));
        }
    }

    /// The policy request for `interface` of pod `namespace/name`: from the index, waiting up
    /// to `pod_wait` for what the watches bring (a pod just scheduled may reach the agent's
    /// watch after the runtime's ADD), then fetching the rest once from the API. A pod's
    /// ReplicaSet or Job, which no watch brings, is read at once, the first time a pod of this
    /// node names it.
    pub async fn request(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        interface: &str,
    ) -> Result<PodRequest, LookupError> {
        // The runtime names the pod's UID: a cached pod with another one is an earlier pod of
        // the same name (a StatefulSet's), not this one.
        let stale =
            |l: &Lookup| matches!(l, Lookup::Ready(r) if !uid.is_empty() && r.pod.uid != uid);
        let answer = |i: &Index| {
            if !uid.is_empty() && i.pod(namespace, name).is_some_and(|p| p.uid != uid) {
                return None;
            }
            match i.lookup(namespace, name, interface, true) {
                Lookup::Missing(needs) if needs.iter().any(Need::is_watched) => None,
                other => Some(other),
            }
        };
        let lookup = match self.index.wait_for(self.pod_wait, answer).await {
            Ok(Lookup::Missing(_)) | Err(_) => {
                // Each object fetched may name another (a pod its ReplicaSet): ask until
                // nothing new is missing, each object at most once.
                let mut asked = Vec::new();
                loop {
                    let needs = match self.index.read().lookup(namespace, name, interface, true) {
                        Lookup::Missing(needs) => needs,
                        l if stale(&l) => vec![Need::Pod {
                            namespace: namespace.to_string(),
                            name: name.to_string(),
                        }],
                        _ => Vec::new(),
                    };
                    let fresh: Vec<Need> =
                        needs.into_iter().filter(|n| !asked.contains(n)).collect();
                    if fresh.is_empty() {
                        break;
                    }
                    let pod = format!("{namespace}/{name}");
                    if fresh.iter().any(Need::is_watched) {
                        tracing::info!(%pod, needs = ?fresh, "not in the watch caches yet; asking the API");
                    } else {
                        tracing::debug!(%pod, needs = ?fresh, "reading the pod's owner");
                    }
                    for need in fresh {
                        asked.push(need.clone());
                        self.fetch(need).await?;
                    }
                }
                self.index.read().lookup(namespace, name, interface, false)
            }
            Ok(found) => found,
        };
        match lookup {
            l if stale(&l) => Err(LookupError::Unavailable(format!(
                "pod {namespace}/{name} in the API is not the one the runtime adds (UID {uid}); \
                 the runtime will retry"
            ))),
            Lookup::Ready(r) => Ok(*r),
            Lookup::Invalid(why) => Err(LookupError::Invalid(why)),
            Lookup::Missing(needs) => Err(LookupError::Unavailable(format!(
                "pod {namespace}/{name}: still missing {needs:?} after asking the API; retry"
            ))),
        }
    }

    /// One GET for one object the index lacks, put into the index. A missing ReplicaSet or
    /// Job is no error (the lookup then takes it as the owner); a missing pod, namespace or
    /// node is.
    async fn fetch(&self, need: Need) -> Result<(), LookupError> {
        let c = self.client.clone();
        match need {
            Need::Pod { namespace, name } => self.put(
                format!("pod {namespace}/{name}"),
                Api::<Pod>::namespaced(c, &namespace).get_opt(&name).await,
                true,
            ),
            Need::Namespace(name) => self.put(
                format!("namespace {name}"),
                Api::<Namespace>::all(c).get_opt(&name).await,
                true,
            ),
            Need::Node(name) => self.put(
                format!("node {name}"),
                Api::<Node>::all(c).get_opt(&name).await,
                true,
            ),
            Need::ReplicaSet { namespace, name } => self.put(
                format!("ReplicaSet {namespace}/{name}"),
                Api::<ReplicaSet>::namespaced(c, &namespace)
                    .get_metadata_opt(&name)
                    .await,
                false,
            ),
            Need::Job { namespace, name } => self.put(
                format!("Job {namespace}/{name}"),
                Api::<Job>::namespaced(c, &namespace)
                    .get_metadata_opt(&name)
                    .await,
                false,
            ),
        }
    }

    /// Puts what one GET read into the index. An object that does not exist is an error when
    /// `required`.
    fn put<K>(
        &self,
        what: String,
        read: Result<Option<K>, kube::Error>,
        required: bool,
    ) -> Result<(), LookupError>
    where
        Index: IndexResource<K>,
    {
        match read {
            Ok(Some(object)) => {
                self.index.update(|i| i.apply(object));
                Ok(())
            }
            Ok(None) if required => Err(LookupError::Unavailable(format!(
                "{what} does not exist in the Kubernetes API; the runtime will retry the ADD"
            ))),
            Ok(None) => Ok(()),
            Err(e) => Err(LookupError::Unavailable(format!(
                "cannot read {what} from the Kubernetes API: {e}; check the agent's \
                 ServiceAccount may get it"
            ))),
        }
    }

    /// The replica count of the StatefulSet owning the claims of `attachment`, for a DEL the
    /// plugin could not say it for, read fresh from the API (a set scaled a moment ago decides
    /// this DEL): `Some(0)` once the StatefulSet is gone or being deleted, so its pods'
    /// addresses are released rather than kept; `None` when the pod is not a StatefulSet's or
    /// the API does not answer within [`STATEFULSET_READ_TIMEOUT`] (the address is then kept,
    /// and released later if the pod does not come back). Blocking: call it off the runtime's
    /// workers (a DEL runs on a blocking thread).
    pub fn owner_replicas(
        &self,
        store: &dyn allot_core::store::Store,
        attachment: &allot_core::store::Attachment,
    ) -> Option<u32> {
        let claims = store.claims_of(attachment).ok()?;
        let claim = claims.iter().find(|c| c.pod.is_stateful())?;
        let owner = claim.pod.owner_name.as_deref()?;
        self.runtime
            .block_on(self.statefulset_replicas(&claim.pod.namespace, owner))
    }

    /// One GET of StatefulSet `namespace/name`: its replica count (see
    /// [`Cluster::owner_replicas`]).
    pub async fn statefulset_replicas(&self, namespace: &str, name: &str) -> Option<u32> {
        let api = Api::<StatefulSet>::namespaced(self.client.clone(), namespace);
        let what = format!("StatefulSet {namespace}/{name}");
        match tokio::time::timeout(STATEFULSET_READ_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(Some(sts))) => Some(allot_index::cluster::statefulset_replicas(&sts)),
            Ok(Ok(None)) => Some(0),
            Ok(Err(e)) => {
                tracing::warn!(
                    "cannot read {what} from the Kubernetes API ({e}): its pod's address is kept; check the agent's ServiceAccount may get StatefulSets"
                );
                None
            }
            Err(_) => {
                tracing::warn!(
                    "reading {what} from the Kubernetes API took over {STATEFULSET_READ_TIMEOUT:?}: its pod's address is kept"
                );
                None
            }
        }
    }
}
