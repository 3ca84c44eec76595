//! The Kubernetes backend: claims in `IPBlock` objects of the cluster's API.
//!
//! # Layout
//!
//! A claim lives in the `IPBlock` of its address: the aligned /26 (IPv4) or /122 (IPv6) that
//! holds it (`allot_core::block`), named after that run alone, so create-if-absent per address
//! holds whatever pools say. 150,000 dense claims take about 2,350 objects, under the ~10,000
//! objects per kind that Kubernetes' list SLOs are measured with (KEP-95); one object per
//! address (Whereabouts) would take 150,000. No pool-wide object is written per allocation.
//!
//! # Atomicity
//!
//! Every write to a block is a compare-and-swap: a `replace` carrying the resourceVersion it
//! was computed from, or a `create` when the block does not exist yet. A writer that lost
//! (409 `Conflict` or `AlreadyExists`) reads the block again and recomputes, up to
//! [`MAX_ATTEMPTS`] times; a fresh address already claimed there is a lost race
//! ([`StoreError::Conflict`]). A release, detach or reattach recomputes from the block as it is,
//! so it never touches a claim another attachment holds now. Within one process a block has one
//! writer at a time ([`combine`]): calls that arrive while it writes queue, and its next write
//! carries all of them, so a node's concurrent ADDs never lose writes to each other.
//!
//! Kubernetes has no transaction across objects. A batch whose addresses lie in several blocks
//! (a dual-stack pod: one IPv4 and one IPv6 block) is written block after block, in name order;
//! when a later block refuses, the blocks already written are rolled back (each rollback again
//! a compare-and-swap that only removes what this batch wrote). For that moment other readers
//! may see the first address claimed; if the process dies in between, the attachment keeps it:
//! the runtime's DEL after the failed ADD, the retried ADD (which completes the missing family)
//! or GC releases it. Either way no address is ever held twice.
//!
//! # Reads and the feed
//!
//! Each store lists the blocks once and then follows them with a watch ([`follow`]), resuming
//! from the last version seen and listing again when the API server answers `410 Gone`. Reads
//! (`claims_of`, `claims_of_pod`, `detached`, `all`, `snapshot`) and the change feed answer from
//! that mirror ([`mirror`]), never by listing per call. A store's own writes are in its mirror
//! when they return; another node's write appears when the watch delivers it (milliseconds). A
//! reader acting on a stale view loses a compare-and-swap and tries again: stale is slow, never
//! wrong.
//!
//! # Synchronous seam
//!
//! As with etcd, [`Backend`] implements the store's operations on the async client once, and
//! [`KubeStore`] is the [`BlockingStore`] of it ([`crate::blocking`]): it owns the runtime of the
//! client and the watch, and the call budget. Reads from the mirror are answered on the caller's
//! thread.

mod combine;
mod compact;
mod follow;
mod mirror;
mod tidy;
mod writes;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use allot_core::block::{BlockScope, region_of};
use allot_core::store::{
    Attachment, Changes, Claim, Clock, Reattach, Snapshot, StoreError, system_clock,
};
use allot_k8s::IPBlock;
use kube::Api;

use crate::blocking::{AsyncStore, BlockingStore};

/// Compare-and-swap attempts on one block before a call gives up as unavailable. Every lost
/// attempt means another writer's write to that block landed, so only a block many writers hit
/// at once gets near it: 16 was reached on a busy real API server by one of 16 threads each
/// claiming 12 addresses of the same few blocks (192 writes), and a pod's ADD is better served
/// late than failed.
pub const MAX_ATTEMPTS: usize = 64;

/// Budget of one API request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Blocks per page of a list (the API server's and kube-rs's customary page size).
pub const LIST_PAGE: u32 = 500;

/// How to reach the API server, and who this store writes for.
#[derive(Clone, Debug, Default)]
pub struct KubeConfig {
    /// A kubeconfig file; `None`: `$KUBECONFIG`, `~/.kube/config`, or the in-cluster
    /// ServiceAccount, as kubectl and kube-rs look for them.
    pub kubeconfig: Option<PathBuf>,
    /// The node this store writes for (recorded on the blocks it opens).
    pub node: Option<String>,
    /// Budget of one store call (all its requests); past it the call fails as unavailable.
    pub timeout: Option<Duration>,
    /// The blocks to follow from the first list on ([`KubeStore::scope_to`] changes it): an
    /// agent's the regions of its node's pools, the controller's every block.
    pub scope: BlockScope,
}

/// Claims in IPBlocks, asynchronously: the client, the watch-fed mirror, the counters.
/// [`KubeStore`] is the [`Store`](allot_core::store::Store) made of it.
pub struct Backend {
    api: Api<IPBlock>,
    mirror: mirror::Mirror,
    node: Option<String>,
    clock: Clock,
    /// Compare-and-swap writes lost to another writer (each followed by a fresh read).
    conflicts: AtomicU64,
    /// Batches refused because an address was claimed by someone else (lost races).
    lost_races: AtomicU64,
    /// API requests made by calls (not the watch).
    requests: AtomicU64,
    /// Blocks the watch delivered (added, modified, deleted): what other writers cost this
    /// store.
    watch_events: AtomicU64,
    /// The edits waiting for each block's writer ([`combine`]).
    queues: combine::Queues,
    /// Claims on their way in a block writer, by attachment.
    pending: Arc<combine::Pending>,
    /// This backend, for the block writers it starts as tasks.
    this: std::sync::Weak<Backend>,
    /// The blocks this store should follow; a change lists again ([`follow`]).
    scope: tokio::sync::watch::Sender<BlockScope>,
    /// The label selector the last list and the watch use (`None`: every block).
    selector: std::sync::Mutex<Option<String>>,
}

/// Claims in IPBlock objects, read through a watch-fed mirror.
pub type KubeStore = BlockingStore<Backend>;

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Counters of one store, for measurements and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KubeStats {
    /// Blocks and claims in the mirror.
    pub blocks: usize,
    pub claims: usize,
    /// Writes lost to another writer's compare-and-swap (each followed by a read and a retry).
    pub conflicts: u64,
    /// Batches refused because an address was already claimed (the engine tries another).
    pub lost_races: u64,
    /// Requests the store's calls made.
    pub requests: u64,
    /// Block versions the watch delivered (its own writes' included).
    pub watch_events: u64,
    /// Regions the store follows (`None`: every block, by its scope or because some block
    /// carries no region yet).
    pub regions: Option<usize>,
}

/// A client from a kubeconfig file, or (`None`) from `$KUBECONFIG`, `~/.kube/config` or the
/// in-cluster ServiceAccount, as kubectl and kube-rs look for them. Call it on the runtime the
/// client will run on (kube spawns its worker there).
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, StoreError> {
    let client_config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                StoreError::backend_caused(
                    format!("cannot read the kubeconfig {}: {e}", path.display()),
                    e,
                )
            })?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|e| {
                    StoreError::backend_caused(format!("kubeconfig {}: {e}", path.display()), e)
                })?
        }
        None => kube::Config::infer().await.map_err(|e| {
            StoreError::backend_caused(
                format!(
                    "no Kubernetes configuration found ({e}); run inside a pod with a \
                     ServiceAccount, or pass --kubeconfig"
                ),
                e,
            )
        })?,
    };
    kube::Client::try_from(client_config).map_err(|e| {
        StoreError::backend_caused(format!("cannot build the Kubernetes client: {e}"), e)
    })
}

impl KubeStore {
    /// Connects with a kubeconfig (or in-cluster configuration), lists the blocks and starts
    /// following them.
    pub fn connect(config: &KubeConfig) -> Result<KubeStore, StoreError> {
        let kubeconfig = config.kubeconfig.clone();
        Self::open_with(config, system_clock(), move || async move {
            client(kubeconfig.as_deref()).await
        })
    }

    /// A store on the client `make` builds (called on the store's runtime: kube's client
    /// spawns its worker where it is built). Tests pass the in-memory API server's client.
    pub fn open_with<M, F>(
        config: &KubeConfig,
        clock: Clock,
        make: M,
    ) -> Result<KubeStore, StoreError>
    where
        M: FnOnce() -> F + Send + 'static,
        F: std::future::Future<Output = Result<kube::Client, StoreError>> + Send + 'static,
    {
        let timeout = config.timeout.unwrap_or(Duration::from_secs(10));
        let node = config.node.clone();
        let scope = config.scope.clone();
        let peer = "the Kubernetes API server";
        BlockingStore::start("allot-kube", peer, timeout, move || async move {
            let client = make().await?;
            let inner = Arc::new_cyclic(|this| Backend {
                api: Api::all(client),
                mirror: mirror::Mirror::default(),
                node,
                clock,
                conflicts: AtomicU64::new(0),
                lost_races: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                watch_events: AtomicU64::new(0),
                queues: combine::Queues::default(),
                pending: Arc::default(),
                this: this.clone(),
                scope: tokio::sync::watch::Sender::new(scope),
                selector: std::sync::Mutex::new(None),
            });
            // Subscribed before the first list: a scope asked for from here on is never missed.
            let scope = inner.scope.subscribe();
            let rv = inner.relist().await?;
            tokio::spawn(follow::follow(inner.clone(), rv, scope));
            Ok(inner)
        })
    }

    pub fn stats(&self) -> KubeStats {
        let inner = self.backend();
        let (blocks, claims) = inner.mirror.counts();
        KubeStats {
            blocks,
            claims,
            conflicts: inner.conflicts.load(Ordering::Relaxed),
            lost_races: inner.lost_races.load(Ordering::Relaxed),
            requests: inner.requests.load(Ordering::Relaxed),
            watch_events: inner.watch_events.load(Ordering::Relaxed),
            regions: match (&*inner.scope.borrow(), inner.selector()) {
                (BlockScope::Regions(r), Some(_)) => Some(r.len()),
                _ => None,
            },
        }
    }

    /// Labels with their region up to a hundred blocks written before blocks carried one;
    /// returns how many (0: none is left). The controller calls it at its start, so that agents
    /// can select their pools' blocks ([`KubeStore::scope_to`] follows every block while one
    /// is unlabelled).
    pub fn label_regions(&self) -> Result<usize, StoreError> {
        self.run(|b| async move { b.label_regions().await })
    }

    /// Follows the blocks of `wanted` from now on, and those holding a claim this store's node
    /// made (a pool edited away from the node still has its pods' addresses released by their
    /// DEL). A change lists the blocks of the new scope and drops the others from the mirror;
    /// the same scope again does nothing. A write to a block outside the scope still works (it
    /// reads the block first, compare-and-swap as always), only its later changes go unseen.
    pub fn scope_to(&self, wanted: BlockScope) {
        let inner = self.backend();
        let scope = match &inner.node {
            Some(node) if wanted != BlockScope::All => {
                let held = inner.mirror.all(|c| &c.node == node);
                wanted.union(BlockScope::Regions(
                    held.iter().map(|c| region_of(c.address)).collect(),
                ))
            }
            _ => wanted,
        };
        inner.scope.send_if_modified(|now| {
            let changed = *now != scope;
            if changed {
                tracing::info!(
                    regions = ?scope.selector(),
                    "following the IPBlocks of this node's pools"
                );
                *now = scope;
            }
            changed
        });
    }
}

/// What a Kubernetes API error means for a store call, and what to do about it.
fn api_error(what: &str, e: kube::Error) -> StoreError {
    let message = match &e {
        kube::Error::Api(s) if s.code == 403 => format!(
            "{what}: {}. The agent's ServiceAccount needs get, list, watch, create and update \
             on ipblocks.allot.dev (the Helm chart's ClusterRole grants them)",
            s.message
        ),
        kube::Error::Api(s) if s.code == 401 => format!(
            "{what}: the API server does not accept this client's credentials ({}); check the \
             kubeconfig or the ServiceAccount token",
            s.message
        ),
        kube::Error::Api(s) if s.code == 404 && s.message.contains("the server could not find") => {
            format!(
                "{what}: the API server does not serve ipblocks.allot.dev; install allot's \
                 CRDs (kubectl apply -f crds/)"
            )
        }
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => {
            let message = format!(
                "{what}: the API server answered {} {} ({}); retrying later may succeed",
                s.code, s.reason, s.message
            );
            return StoreError::unavailable_caused(message, e);
        }
        kube::Error::Api(s) => format!("{what}: {} {}: {}", s.code, s.reason, s.message),
        other => {
            let message = format!("{what}: {other}; is the API server reachable?");
            return StoreError::unavailable_caused(message, e);
        }
    };
    StoreError::backend_caused(message, e)
}

/// Runs one API request within [`REQUEST_TIMEOUT`].
async fn request<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, StoreError> {
    attempt(what, call).await?.map_err(|e| api_error(what, e))
}

/// Runs one API request within [`REQUEST_TIMEOUT`], leaving its refusal to the caller.
async fn attempt<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<Result<T, kube::Error>, StoreError> {
    tokio::time::timeout(REQUEST_TIMEOUT, call)
        .await
        .map_err(|_| {
            StoreError::unavailable(format!(
                "{what}: the API server did not answer within {REQUEST_TIMEOUT:?}"
            ))
        })
}

// Writes are the backend's own methods of the same names (writes.rs, tidy.rs; `Backend::name`
// is the inherent one), reads answer from the mirror at once.
impl AsyncStore for Backend {
    async fn claim_batch(
        &self,
        fresh: Vec<Claim>,
        reattach: Vec<Reattach>,
    ) -> Result<Vec<Claim>, StoreError> {
        Backend::claim_batch(self, fresh, reattach).await
    }

    async fn release_attachment(&self, attachment: Attachment) -> Result<Vec<Claim>, StoreError> {
        Backend::release_attachment(self, attachment).await
    }

    async fn release(
        &self,
        address: std::net::IpAddr,
        attachment: Option<Attachment>,
    ) -> Result<bool, StoreError> {
        Backend::release(self, address, attachment).await
    }

    async fn release_unchanged(&self, claims: Vec<Claim>) -> Result<Vec<Claim>, StoreError> {
        Backend::release_unchanged(self, claims).await
    }

    async fn detach(&self, attachment: Attachment, now: u64) -> Result<Vec<Claim>, StoreError> {
        Backend::detach(self, attachment, now).await
    }

    async fn quarantine(
        &self,
        address: std::net::IpAddr,
        attachment: Attachment,
        holder: allot_core::store::PodRef,
        now: u64,
    ) -> Result<Claim, StoreError> {
        Backend::quarantine(self, address, attachment, holder, now).await
    }

    async fn claims_of(&self, attachment: Attachment) -> Result<Vec<Claim>, StoreError> {
        // A claim of this attachment still on its way (its ADD gave up waiting for it) is
        // waited for: a DEL must see what it lands.
        self.pending.settled(&attachment).await;
        Ok(self.mirror.claims_of(&attachment))
    }

    async fn claims_of_pod(
        &self,
        namespace: String,
        name: String,
    ) -> Result<Vec<Claim>, StoreError> {
        Ok(self.mirror.claims_of_pod(&namespace, &name))
    }

    async fn claims_of_virtual_machine(
        &self,
        namespace: String,
        name: String,
    ) -> Result<Vec<Claim>, StoreError> {
        // The mirror has every claim in memory: a filter, not a read of the API server.
        Ok(self
            .mirror
            .all(|c| c.pod.of_virtual_machine(&namespace, &name)))
    }

    async fn detached(&self) -> Result<Vec<Claim>, StoreError> {
        Ok(self.mirror.all(|c| c.attachment.is_none()))
    }

    async fn all(&self) -> Result<Vec<Claim>, StoreError> {
        Ok(self.mirror.all(|_| true))
    }

    async fn snapshot(&self, released_since: u64) -> Result<Snapshot, StoreError> {
        Ok(self.mirror.snapshot(released_since))
    }

    async fn changes_since(&self, revision: u64) -> Result<Changes, StoreError> {
        Ok(self.mirror.changes_since(revision))
    }

    async fn remove_emptied(&self, cooled_before: u64, limit: usize) -> Result<usize, StoreError> {
        self.delete_emptied(cooled_before, limit).await
    }
}
