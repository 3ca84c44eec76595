//! allot-controller: the cluster-wide half of allot, one leader per cluster.
//!
//! - [`lease`]: leader election on a `coordination.k8s.io/v1` Lease; everything that writes
//!   acts only while this replica leads.
//! - [`gc`]: garbage collection of leaked addresses, driven by pod events and a periodic scan,
//!   deciding with core's table (`allot_core::gc::decide`).
//! - [`autopool`]: subnet auto-pools: a pool carved from a Subnet per workload that names it,
//!   grown and shrunk with the workload, deleted with it.
//! - [`fleet`]: fleet ranges: each cluster of a fleet (Cluster API `Cluster`s, IPAMAllocation
//!   requests) gets its own range or prefix from the IPAMPools serving its datacenter.
//! - [`pools`]: pool lifecycle: status counts derived from the claims, the finalizer that keeps
//!   a pool with claims from disappearing.
//! - [`webhook`]: the admission webhooks, served by every replica, with the certificate and the
//!   webhook configurations the controller keeps itself.
//! - [`audit`]: the online audit of pods, Endpoints, claims and pool counts: drift metrics and
//!   Events, and `allotctl ipam check`'s findings.
//! - [`kubevirt`]: KubeVirt's virtual machines followed (when served) so that GC keeps a VM's
//!   address while the VM exists.
//! - [`tenancy`]: which pools a workload's pods may use before any exists (a StatefulSet's
//!   declared addresses), by the default policy's namespace and pod rules.
//! - [`uninstall`]: `--remove-webhook-configurations`, once no replica leads.

pub mod args;
pub mod audit;
pub mod autopool;
pub mod events;
pub mod fleet;
pub mod gc;
pub mod kubevirt;
pub mod lease;
pub mod metrics;
pub mod passes;
pub mod pools;
pub mod run;
pub mod serve;
pub mod slices;
pub mod tenancy;
pub mod uninstall;
pub mod webhook;
