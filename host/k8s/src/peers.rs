//! Other IPAMs' objects, read for `allotctl migrate`: Spiderpool's
//! (`spiderpool.spidernet.io/v2beta1`) and Whereabouts's (`whereabouts.cni.cncf.io/v1alpha1`,
//! with Multus's NetworkAttachmentDefinitions), decoded into core's migration inputs
//! (`allot_core::migrate`) exactly as those IPAMs write them. They are read untyped
//! ([`DynamicObject`]): an object that does not decode is one refusal naming it, never a list
//! that fails.

pub mod spiderpool;
pub mod whereabouts;

use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;

/// A kind of another IPAM's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerKind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
}

impl PeerKind {
    /// For `Api::all_with` and friends.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group, self.version, self.kind),
            self.plural,
        )
    }

    /// `plural.group`, the CRD's name.
    pub fn crd_name(&self) -> String {
        format!("{}.{}", self.plural, self.group)
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
pub(crate) fn object_name(o: &DynamicObject) -> String {
    let name = o.metadata.name.clone().unwrap_or_default();
    match o.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name,
    }
}

/// The address of `a.b.c.d/len` or `a.b.c.d`.
pub(crate) fn address_of(cidr: &str) -> Option<std::net::IpAddr> {
    cidr.split('/').next()?.trim().parse().ok()
}
