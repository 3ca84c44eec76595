//! allot's Kubernetes API: the custom resources of group `allot.dev`, version `v1alpha1`.
//!
//! - [`IPPool`] (`ipp`), [`Subnet`], [`ReservedIP`]: the shapes users already know from the
//!   standalone files (`allot_core::spec`), so one YAML document means the same in a directory,
//!   in etcd and in a cluster. Converting one into core's checked object is one `TryFrom`, which
//!   calls the same `from_spec` as the standalone loader: validation is written once.
//! - [`Endpoint`]: what a pod holds, per interface, named after the pod.
//! - [`IPBlock`]: the claims of an aligned run of one pool's addresses (the Kubernetes store's
//!   unit of truth, written with resourceVersion compare-and-swap).
//! - [`Policy`]: which policy component a cluster runs, and what its status says about it.
//! - [`IPAMPool`] and [`IPAMAllocation`]: fleet ranges, per-cluster ranges or prefixes carved
//!   from per-datacenter CIDRs (Kubermatic's shapes); the pool's status records every
//!   allocation.
//! - [`peers`]: other IPAMs' objects (Spiderpool's, Whereabouts's and the Multus networks'),
//!   read untyped and decoded for `allotctl migrate`.
//!
//! `crds/` is generated from these types by `allotctl crds` ([`crds`]); a test fails when the
//! committed files are stale.
//!
//! It is also allot's one door to Kubernetes' own types: [`openapi`] re-exports k8s-openapi, and
//! every other allot crate imports them from there (`allot_k8s::openapi::api::core::v1::Pod`),
//! as linkerd's crates import theirs from its `k8s-api` crate. The Kubernetes version these
//! types speak is k8s-openapi's version feature (`v1_34`), chosen once, on the `k8s-openapi`
//! line of the workspace's Cargo.toml; no other allot crate depends on k8s-openapi (a test of
//! this crate fails if one does).

mod block;
mod convert;
mod crd;
mod endpoint;
mod fleet;
pub mod listen;
pub mod peers;
mod policy;
mod pools;

/// Kubernetes' own API types (k8s-openapi), at the version this build speaks.
pub use k8s_openapi as openapi;

pub use block::{BlockClaim, IPBlock, IPBlockSpec};
pub use crd::{crd_file_name, crds, crds_yaml};
pub use endpoint::{Endpoint, EndpointInterface, EndpointSpec, OwnerRef};
pub use fleet::{
    AllocationState, IPAMAllocation, IPAMAllocationSpec, IPAMAllocationStatus, IPAMPool,
    IPAMPoolDatacenter, IPAMPoolSpec, IPAMPoolStatus,
};
pub use policy::{
    ConfigMapKey, LocationError, OnFailure, Policy, PolicyLocation, PolicySource, PolicySpec,
    PolicyStatus,
};
pub use pools::{
    AddressCounts, IPPool, IpPoolSpec, ReservedIP, ReservedIpSpec, Subnet, SubnetSpec,
};

/// The API group of every allot resource.
pub const GROUP: &str = "allot.dev";
/// The one version served so far.
pub const VERSION: &str = "v1alpha1";

/// The most an Event's note may hold (the API server refuses longer notes).
pub const EVENT_NOTE_BYTES: usize = 1000;

/// `text` as an Event's note: cut at a character boundary within [`EVENT_NOTE_BYTES`], with "…"
/// where it was cut.
pub fn event_note(text: &str) -> String {
    if text.len() <= EVENT_NOTE_BYTES {
        return text.to_string();
    }
    format!("{}…", &text[..text.floor_char_boundary(EVENT_NOTE_BYTES)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_note_is_cut_within_its_limit_at_a_character_boundary() {
        assert_eq!(event_note("short"), "short");
        let long = format!("{}é{}", "a".repeat(EVENT_NOTE_BYTES - 1), "b".repeat(10));
        let note = event_note(&long);
        assert_eq!(note, format!("{}…", "a".repeat(EVENT_NOTE_BYTES - 1)));
    }
}
