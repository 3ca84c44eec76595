//! Fleet ranges against the Kubernetes API: the library the controller runs.
//!
//! A platform team defines `IPAMPool`s (per datacenter: a CIDR, and a range size or prefix
//! length per cluster); each cluster of the fleet gets its own allocation from every pool that
//! serves its datacenter, written as an `IPAMAllocation` named after the pool in the cluster's
//! namespace and as a key of the ConfigMap [`CONFIG_MAP`] there.
//!
//! - [`decide`](mod@decide): the pure decisions on top of core's arithmetic (the `deprecated`
//!   flag, a pool's records, adopting an allocation made elsewhere, every IPAMAllocation that
//!   holds addresses counted as taken, the checks the webhook runs);
//! - [`plan`](mod@plan): a whole fleet offline, for `allotctl fleet plan`;
//! - [`api`]: [`allocate`], [`release`] and [`sync`] against the API. Each allocation is one
//!   compare-and-swap on the pool's record (`IPAMPool.status.allocations`) before anything else
//!   is written, so allocators racing (two controllers, a leader that lost its lease) can never
//!   hand out overlapping ranges.

pub mod api;
pub mod decide;
pub mod plan;

pub use api::{CONFIG_MAP, FleetApiError, MAX_ATTEMPTS, SyncReport, allocate, release, sync};
pub use decide::{
    Change, Current, FleetCluster, Refusal, check_allocation_object, check_pool_edit, decide,
};
pub use plan::{Entry, Plan, Release, plan};
