//! From the cluster's objects to core's checked ones, through the same `from_spec` as the
//! standalone loader and `allotctl pool apply`: an object is valid in a cluster exactly when it
//! is valid in a file.

use allot_core::spec::ObjectMeta;
use allot_core::{Pool, Reserved, SpecError, Subnet};
use kube::Resource;

use crate::{IPPool, ReservedIP, Subnet as SubnetObject};

/// The parts of Kubernetes metadata core reads.
fn meta(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: m.name.clone().unwrap_or_default(),
        labels: m.labels.clone().unwrap_or_default(),
        annotations: m.annotations.clone().unwrap_or_default(),
        deletion_timestamp: m.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
    }
}

impl TryFrom<&IPPool> for Pool {
    type Error = SpecError;

    fn try_from(p: &IPPool) -> Result<Pool, SpecError> {
        Pool::from_spec(meta(p.meta()), p.spec.0.clone())
    }
}

impl TryFrom<&SubnetObject> for Subnet {
    type Error = SpecError;

    fn try_from(s: &SubnetObject) -> Result<Subnet, SpecError> {
        Subnet::from_spec(meta(s.meta()), s.spec.0.clone())
    }
}

impl TryFrom<&ReservedIP> for Reserved {
    type Error = SpecError;

    fn try_from(r: &ReservedIP) -> Result<Reserved, SpecError> {
        Reserved::from_spec(meta(r.meta()), r.spec.0.clone())
    }
}
