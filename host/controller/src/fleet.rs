//! Fleet ranges: each cluster of a fleet gets its own range or prefix from the IPAMPools that
//! serve its datacenter (see `docs/fleet.md`). Core does the address arithmetic
//! (`allot_core::fleet`); everything about the objects is here, in one place per role:
//!
//! - [`decide`](mod@decide): what one cluster gets from one pool on top of core's arithmetic
//!   (the `deprecated` flag, a pool's records, adopting an allocation made elsewhere, every
//!   IPAMAllocation that holds addresses counted as taken), and the checks the webhook runs;
//! - [`plan`](mod@plan): a whole fleet decided offline, for `allotctl fleet plan`;
//! - [`wants`]: what a pass must do, decided from the index alone;
//! - [`api`]: [`allocate`], [`release`] and [`sync`] against the API, each allocation one
//!   compare-and-swap on the pool's record (`IPAMPool.status.allocations`) before anything else
//!   is written, so allocators racing (two controllers, a leader that lost its lease) can never
//!   hand out overlapping ranges;
//! - [`reconcile`] does a pass's work through them; [`workload`] copies each cluster's ConfigMap
//!   into its workload cluster.
//!
//! [`FleetController::run`] watches IPAMPools, IPAMAllocations, the `allot-ipam-allocations`
//! ConfigMaps and Cluster API `Cluster`s (untyped, `cluster.x-k8s.io`, so Cluster API need not be
//! installed: a 404 on their list means "not served", logged once and looked at again with
//! backoff) into a [`FleetIndex`], and, while this replica leads:
//! - on every change (and with backoff after a pass that could not finish) runs a pass;
//! - every `--fleet-resync-seconds` runs [`sync`] on every pool;
//! - copies each Cluster API cluster's ConfigMap into its workload cluster when asked to, in a
//!   loop of its own so that an unreachable workload cluster never holds up an allocation.
//!
//! RBAC: get, list, watch on ipampools.allot.dev, update on ipampools/status; get, list, watch,
//! create, update, patch, delete on ipamallocations.allot.dev, update and patch on
//! ipamallocations/status; get, list, watch, create, patch on configmaps; list, watch on
//! clusters.cluster.x-k8s.io; create, patch on events.k8s.io events; get on secrets (only for
//! the workload-cluster copy).

pub mod api;
pub mod decide;
pub mod plan;
pub mod reconcile;
pub mod wants;
pub mod workload;

#[cfg(test)]
mod api_tests;
#[cfg(test)]
mod copy_tests;
#[cfg(test)]
mod fixtures;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use allot_index::{
    CapiClusterObject, FleetIndex, IpamAllocationObject, IpamPoolObject, Shared, feed,
};
use allot_k8s::openapi::api::core::v1::ConfigMap;
use allot_k8s::{IPAMAllocation, IPAMPool};
use futures::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinSet;

use crate::lease::Leadership;

pub use api::{CONFIG_MAP, FleetApiError, MAX_ATTEMPTS, SyncReport, allocate, release, sync};
pub use decide::{
    Change, Current, FleetCluster, Refusal, check_allocation_object, check_pool_edit, decide,
};
pub use plan::{Entry, Plan, Release, plan};
pub use reconcile::{Outcome, Reconciler};
pub use wants::{Work, wants};
pub use workload::{CopySettings, WorkloadCopier, connect_with_kubeconfig};

/// The label `allotctl fleet plan` reads a Cluster's datacenter from, too.
pub const DATACENTER_LABEL: &str = "allot.dev/datacenter";

/// The flags of fleet ranges. Their ids are prefixed: flattened beside the other components'
/// flags, an `enabled` or `resync_seconds` of their own would be taken for another's.
#[derive(Clone, Debug, clap::Args)]
pub struct FleetArgs {
    /// Allocate fleet ranges from IPAMPools for Cluster API clusters and IPAMAllocation requests
    /// (`--fleet=false` leaves them alone).
    #[arg(id = "fleet_enabled", long = "fleet", default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub enabled: bool,
    /// The label of a Cluster API `Cluster` that names its datacenter (as `allotctl fleet plan
    /// --datacenter-label`).
    #[arg(id = "fleet_datacenter_label", long = "fleet-datacenter-label", default_value = DATACENTER_LABEL, value_parser = label_key)]
    pub datacenter_label: String,
    /// The version of Cluster API's `clusters.cluster.x-k8s.io` to watch.
    #[arg(id = "fleet_cluster_api_version", long = "fleet-cluster-api-version", default_value = "v1beta1", value_parser = api_version)]
    pub cluster_api_version: String,
    /// Sync every IPAMPool in full at least this often (changes are acted on at once).
    #[arg(id = "fleet_resync_seconds", long = "fleet-resync-seconds", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub resync_seconds: u64,
    /// Copy each Cluster API cluster's ConfigMap allot-ipam-allocations into its workload
    /// cluster (a Cluster's annotation allot.dev/workload-configmap "true" or "false" decides
    /// for that Cluster).
    #[arg(id = "fleet_workload_configmap", long = "fleet-workload-configmap", default_value_t = false, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub workload_configmap: bool,
    /// The namespace of the copy in the workload cluster.
    #[arg(
        id = "fleet_workload_namespace",
        long = "fleet-workload-namespace",
        default_value = "kube-system"
    )]
    pub workload_namespace: String,
    /// The most one copy into a workload cluster may take (reading the kubeconfig, connecting,
    /// writing).
    #[arg(id = "fleet_workload_timeout_seconds", long = "fleet-workload-timeout-seconds", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub workload_timeout_seconds: u64,
}

impl Default for FleetArgs {
    fn default() -> Self {
        FleetArgs {
            enabled: true,
            datacenter_label: DATACENTER_LABEL.to_string(),
            cluster_api_version: "v1beta1".to_string(),
            resync_seconds: 600,
            workload_configmap: false,
            workload_namespace: "kube-system".to_string(),
            workload_timeout_seconds: 10,
        }
    }
}

/// A label key: `[prefix/]name`, name at most 63 characters of `[A-Za-z0-9._-]`, beginning and
/// ending alphanumeric; prefix a DNS subdomain.
fn label_key(s: &str) -> Result<String, String> {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && edge(part.chars().next())
                    && edge(part.chars().last())
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    });
    if name_ok && prefix_ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a label key ([prefix/]name, e.g. allot.dev/datacenter or topology.kubernetes.io/region)"
        ))
    }
}

/// A Kubernetes API version: `v1`, `v1beta1`, `v2alpha3`.
fn api_version(s: &str) -> Result<String, String> {
    let well_formed = || -> Option<()> {
        let rest = s.strip_prefix('v')?;
        let major = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let tail = &rest[major..];
        if major == 0 {
            return None;
        }
        if tail.is_empty() {
            return Some(());
        }
        let minor = tail
            .strip_prefix("alpha")
            .or_else(|| tail.strip_prefix("beta"))?;
        (!minor.is_empty() && minor.chars().all(|c| c.is_ascii_digit())).then_some(())
    };
    match well_formed() {
        Some(()) => Ok(s.to_string()),
        None => Err(format!(
            "{s:?} is not an API version (v1beta1, v1beta2, v1)"
        )),
    }
}

/// Everything fleet ranges need.
pub struct FleetController {
    pub client: kube::Client,
    pub leadership: Leadership,
    pub args: FleetArgs,
    /// This replica's name, on the Events it records.
    pub instance: String,
}

impl FleetController {
    /// Watches, allocates and copies until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        if !self.args.enabled {
            tracing::info!("fleet ranges are off (--fleet=false)");
            shutdown.await;
            return;
        }
        let index = Shared::of(FleetIndex::new(&self.args.datacenter_label));
        let _watches = watch(&index, &self.client, &self.args.cluster_api_version);
        let recorder = crate::events::Events::new(self.client.clone(), &self.instance);
        let reconciler = Reconciler::new(
            self.client.clone(),
            recorder.clone(),
            self.leadership.clone(),
            &self.args.cluster_api_version,
        );
        let resync = Duration::from_secs(self.args.resync_seconds);
        let timeout = Duration::from_secs(self.args.workload_timeout_seconds);
        let copier = WorkloadCopier::new(
            self.client.clone(),
            recorder,
            self.leadership.clone(),
            CopySettings {
                default_on: self.args.workload_configmap,
                namespace: self.args.workload_namespace.clone(),
                timeout,
                resync,
                cluster_api_version: self.args.cluster_api_version.clone(),
            },
            connect_with_kubeconfig(timeout),
        );
        tokio::select! {
            _ = shutdown => {}
            _ = reconcile_loop(index.clone(), reconciler, self.leadership, resync) => {}
            _ = copier.run(index) => {}
        }
    }
}

/// Starts one watch per kind the index follows; they stop when the set is dropped.
pub fn watch(
    index: &Arc<Shared<FleetIndex>>,
    client: &kube::Client,
    cluster_api_version: &str,
) -> JoinSet<()> {
    let config = watcher::Config::default();
    let mut set = JoinSet::new();
    let dynamic = |r: ApiResource| Api::<DynamicObject>::all_with(client.clone(), &r);
    set.spawn(feed(
        index.clone(),
        watcher(dynamic(ApiResource::erase::<IPAMPool>(&())), config.clone()).default_backoff(),
        IpamPoolObject,
    ));
    set.spawn(feed(
        index.clone(),
        watcher(
            dynamic(ApiResource::erase::<IPAMAllocation>(&())),
            config.clone(),
        )
        .default_backoff(),
        IpamAllocationObject,
    ));
    set.spawn(feed(
        index.clone(),
        watcher(
            Api::<ConfigMap>::all(client.clone()),
            config
                .clone()
                .fields(&format!("metadata.name={}", crate::fleet::CONFIG_MAP)),
        )
        .default_backoff(),
        |c: ConfigMap| c,
    ));
    let clusters = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", cluster_api_version, "Cluster"),
        "clusters",
    );
    set.spawn(feed(
        index.clone(),
        not_served_as_absent(
            index.clone(),
            cluster_api_version.to_string(),
            watcher(dynamic(clusters), config).default_backoff(),
        ),
        CapiClusterObject,
    ));
    set
}

/// Cluster API's watch with its "not served" (404 on the list) turned into
/// [`FleetIndex::clusters_absent`], logged once; the watcher keeps looking with its backoff.
/// Any other error (a 403: RBAC) stays an error: the index is then not ready and nothing is
/// released on the strength of Clusters it could not see.
pub fn not_served_as_absent<S>(
    index: Arc<Shared<FleetIndex>>,
    version: String,
    stream: S,
) -> impl Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>
where
    S: Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>,
{
    let mut absent = false;
    stream.filter_map(move |event| {
        let out = match event {
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) if s.code == 404 => {
                if !absent {
                    tracing::info!(
                        "clusters.cluster.x-k8s.io/{version} is not served (Cluster API is not installed, or serves another version: --fleet-cluster-api-version): IPAMAllocation requests are served, allocations made for Clusters are kept; looking again with backoff"
                    );
                    absent = true;
                }
                index.update(FleetIndex::clusters_absent);
                None
            }
            Ok(watcher::Event::InitDone) if absent => {
                tracing::info!("clusters.cluster.x-k8s.io/{version} is served: watching Clusters");
                absent = false;
                Some(Ok(watcher::Event::InitDone))
            }
            other => Some(other),
        };
        std::future::ready(out)
    })
}

impl crate::passes::Watched for FleetIndex {
    fn ready(&self) -> bool {
        FleetIndex::ready(self)
    }
    fn generation(&self) -> u64 {
        FleetIndex::generation(self)
    }
}

impl crate::passes::Pass<FleetIndex> for Reconciler {
    /// The targeted pass; when a resync is due, `sync` on every pool after it.
    fn pass<'a>(
        &'a mut self,
        index: &'a Shared<FleetIndex>,
        resync_due: bool,
    ) -> futures::future::BoxFuture<'a, crate::passes::Passed> {
        let mut work = wants(&index.read());
        Box::pin(async move {
            let clusters = std::mem::take(&mut work.clusters);
            let mut outcome = Reconciler::pass(self, work).await;
            let mut resynced = false;
            if resync_due && !outcome.retry && !outcome.stopped {
                outcome = self.sync_all(&clusters).await;
                resynced = true;
            }
            crate::passes::Passed {
                retry: outcome.retry,
                resynced,
            }
        })
    }
}

/// Allocates and releases while this replica leads (see [`crate::passes`]).
pub async fn reconcile_loop(
    index: Arc<Shared<FleetIndex>>,
    reconciler: Reconciler,
    leadership: Leadership,
    resync: Duration,
) {
    crate::passes::run("fleet", index, leadership, resync, reconciler).await
}
