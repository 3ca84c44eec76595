//! Subnet auto-pools: a workload whose pod template names Subnets in its `subnet`/`subnets`
//! annotation gets, per Subnet, an IPPool carved from it, sized with the workload and deleted
//! with it (see `docs/controller.md`, "Subnet auto-pools").
//!
//! [`AutoPools::run`] watches Deployments, StatefulSets, ReplicaSets, Jobs, DaemonSets,
//! CronJobs, the objects of every other kind with a `scale` subresource it may read
//! ([`scalable`]), IPPools, Subnets, ReservedIPs and Namespaces (their labels) into a
//! [`WorkloadIndex`], and, while this replica leads, runs a reconcile pass whenever what the
//! decisions read changes, every `--auto-pool-resync-seconds` (claims released since may let a
//! pool shrink), and with backoff after a pass that could not finish. A pass plans in core and
//! writes here ([`reconcile`]).
//!
//! The same passes keep StatefulSets' declared addresses (`ipam.allot.dev/ordinal-ips`)
//! reserved for them: one ReservedIP per StatefulSet and family, only in pools its pods may use
//! ([`declared`]).
//!
//! RBAC: get, list, watch on deployments, statefulsets, replicasets, daemonsets (apps) and jobs,
//! cronjobs (batch); list, watch and get on the `scale` subresource of each other scalable kind
//! to follow (the chart's `controller.autoPools.scalableWorkloads`); create on
//! selfsubjectaccessreviews (every user may); get, list, watch, create, patch, delete on ippools.allot.dev; get, list,
//! watch, create, patch, delete on reservedips.allot.dev; get, list, watch on
//! subnets.allot.dev; list, watch on namespaces; create, patch on events.k8s.io events; and
//! what the claim store reads (list, watch on ipblocks.allot.dev).

mod declared;
mod reconcile;
pub mod scalable;
mod wants;

#[cfg(test)]
mod api_tests;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use allot_core::store::Store;
use allot_index::{Shared, WorkloadIndex, feed, pool_document_feeds};
use allot_k8s::openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use allot_k8s::openapi::api::batch::v1::{CronJob, Job};
use allot_k8s::openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::task::JoinSet;

use crate::lease::Leadership;

pub use declared::{DeclaredSnapshot, Keeper};
pub use reconcile::{Outcome, Reconciler, Snapshot};
pub use wants::wants;

/// The flags of subnet auto-pools.
#[derive(Clone, Debug, clap::Args)]
pub struct AutoPoolArgs {
    /// Create, resize and delete auto pools for workloads that name Subnets
    /// (`--auto-pools=false` leaves them to someone else).
    #[arg(long = "auto-pools", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// Reconcile every auto pool at least this often (claims released since may let a pool
    /// shrink).
    #[arg(long = "auto-pool-resync-seconds", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub resync_seconds: u64,
    /// Ask the API server this often which kinds have a `scale` subresource (a CRD installed
    /// later, such as OpenKruise's CloneSet, is followed from the next time on).
    #[arg(long = "auto-pool-discovery-seconds", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub discovery_seconds: u64,
    /// A kind with a scale subresource whose first list fails this long is given up for ten
    /// minutes (its workloads' pools stay as they are), so that the others' passes go on.
    #[arg(long = "auto-pool-first-list-seconds", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub first_list_seconds: u64,
}

impl Default for AutoPoolArgs {
    fn default() -> Self {
        AutoPoolArgs {
            enabled: true,
            resync_seconds: 60,
            discovery_seconds: 60,
            first_list_seconds: 60,
        }
    }
}

/// Everything subnet auto-pools need.
pub struct AutoPools {
    pub client: kube::Client,
    /// The claims (which addresses a shrinking pool must keep).
    pub store: Arc<dyn Store>,
    pub leadership: Leadership,
    pub args: AutoPoolArgs,
    /// This replica's name, on the Events it records.
    pub instance: String,
}

impl AutoPools {
    /// Watches and reconciles until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        if !self.args.enabled {
            tracing::info!("subnet auto-pools are off (--auto-pools=false)");
            shutdown.await;
            return;
        }
        let index = Shared::of(WorkloadIndex::new());
        let mut watches = watch(&index, &self.client);
        watches.spawn(scalable::follow(
            index.clone(),
            self.client.clone(),
            Duration::from_secs(self.args.discovery_seconds),
            Duration::from_secs(self.args.first_list_seconds),
        ));
        let recorder = crate::events::Events::new(self.client.clone(), &self.instance);
        let reconciler = Passes {
            pools: Reconciler::new(
                self.client.clone(),
                recorder.clone(),
                self.leadership.clone(),
                self.store.clone(),
            ),
            declared: Keeper::new(self.client.clone(), self.leadership.clone(), recorder),
        };
        let resync = Duration::from_secs(self.args.resync_seconds);
        tokio::select! {
            _ = shutdown => {}
            _ = reconcile_loop(index, reconciler, self.leadership, resync) => {}
        }
    }
}

/// Starts one watch per kind the index follows; they stop when the set is dropped.
pub fn watch(index: &Arc<Shared<WorkloadIndex>>, client: &kube::Client) -> JoinSet<()> {
    let config = watcher::Config::default();
    let mut set = JoinSet::new();
    macro_rules! typed {
        ($ty:ty) => {
            set.spawn(feed(
                index.clone(),
                watcher(Api::<$ty>::all(client.clone()), config.clone()).default_backoff(),
                |o: $ty| o,
            ));
        };
    }
    typed!(Deployment);
    typed!(StatefulSet);
    typed!(ReplicaSet);
    typed!(Job);
    typed!(DaemonSet);
    typed!(CronJob);
    // Namespaces' labels (a pool's namespaceAffinity, for StatefulSets' declared addresses).
    set.spawn(feed(
        index.clone(),
        watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            config.clone(),
        )
        .default_backoff(),
        |o| o,
    ));
    for watch in pool_document_feeds(index, client, &config) {
        set.spawn(watch);
    }
    set
}

impl crate::passes::Watched for WorkloadIndex {
    fn ready(&self) -> bool {
        WorkloadIndex::ready(self)
    }
    fn generation(&self) -> u64 {
        WorkloadIndex::generation(self)
    }
}

/// A pass over the workload index: auto pools, then StatefulSets' declared addresses.
pub struct Passes {
    pub pools: Reconciler,
    pub declared: Keeper,
}

impl crate::passes::Pass<WorkloadIndex> for Passes {
    /// Every pass is a full one.
    fn pass<'a>(
        &'a mut self,
        index: &'a Shared<WorkloadIndex>,
        _resync_due: bool,
    ) -> futures::future::BoxFuture<'a, crate::passes::Passed> {
        let (snapshot, declared) = {
            let index = index.read();
            (Snapshot::of(&index), DeclaredSnapshot::of(&index))
        };
        Box::pin(async move {
            let outcome = Reconciler::pass(&mut self.pools, snapshot).await;
            let declared_retry = self.declared.pass(declared).await;
            crate::passes::Passed {
                retry: outcome.retry || declared_retry,
                resynced: true,
            }
        })
    }
}

/// Reconciles while this replica leads (see [`crate::passes`]).
pub async fn reconcile_loop(
    index: Arc<Shared<WorkloadIndex>>,
    reconciler: Passes,
    leadership: Leadership,
    resync: Duration,
) {
    crate::passes::run("auto-pool", index, leadership, resync, reconciler).await
}
