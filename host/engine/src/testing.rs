//! What benchmarks of the engine over a store share: a minimal native policy (the CNI default
//! pools in order), pools, and ADD requests. Only with the `testing` feature, which benches turn
//! on through a dev-dependency, so no binary ships it.

use std::sync::Arc;

use crate::AddRequest;
use allot_core::policy::{
    AcquisitionRule, CniDefaults, Decision, FamilyDecision, Inventory, NamespaceInfo, NicDecision,
    NodeInfo, Owner, PodInfo, Policy, PolicyError, Request,
};
use allot_core::spec::{IpPoolSpec, ObjectMeta};
use allot_core::store::Attachment;
use allot_core::{IpFamily, Pool};

/// The CNI default pools, in order.
pub struct CniDefaultsPolicy;

impl Policy for CniDefaultsPolicy {
    fn decide(&self, inv: &Arc<Inventory>, req: &Request) -> Result<Decision, PolicyError> {
        let order: Vec<u32> = req
            .cni_defaults
            .ipv4
            .iter()
            .filter_map(|n| inv.pool_index(n))
            .collect();
        Ok(Decision {
            nics: req
                .nics
                .iter()
                .map(|n| NicDecision {
                    interface: n.interface.clone(),
                    error: None,
                    clean_gateway: false,
                    routes: vec![],
                    families: vec![FamilyDecision {
                        family: IpFamily::V4,
                        rule: AcquisitionRule::CniDefault,
                        source: "bench".into(),
                        candidates: order.clone(),
                        order: order.clone(),
                        dropped: vec![],
                        address: None,
                    }],
                })
                .collect(),
        })
    }
}

pub fn pool(name: &str, subnet: &str) -> Pool {
    let meta = ObjectMeta {
        name: name.into(),
        ..Default::default()
    };
    let spec = IpPoolSpec {
        subnet: subnet.into(),
        ..Default::default()
    };
    Pool::from_spec(meta, spec).expect("valid pool")
}

/// An ADD of `pod` from pool `big`.
pub fn request(container: &str, pod: &str, stateful: bool) -> AddRequest {
    request_from("big", container, pod, stateful)
}

/// An ADD of `pod` from pool `pool`.
pub fn request_from(pool: &str, container: &str, pod: &str, stateful: bool) -> AddRequest {
    AddRequest {
        attachment: Attachment {
            container_id: container.into(),
            interface: "eth0".into(),
        },
        network: "bench".into(),
        pod: PodInfo {
            namespace: "ns".into(),
            name: pod.into(),
            uid: format!("uid-{container}"),
            owner: stateful.then(|| Owner {
                kind: "StatefulSet".into(),
                name: "web".into(),
            }),
            ..Default::default()
        },
        namespace: NamespaceInfo {
            name: "ns".into(),
            ..Default::default()
        },
        node: NodeInfo {
            name: "node".into(),
            ..Default::default()
        },
        multus_name: String::new(),
        cni_defaults: CniDefaults {
            ipv4: vec![pool.into()],
            ipv6: vec![],
        },
    }
}
