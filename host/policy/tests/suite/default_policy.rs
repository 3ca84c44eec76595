//! The default policy embedded in the host decides as its README says, through the real runtime.

use std::sync::Arc;

use allot_core::IpFamily;
use allot_core::policy::{AcquisitionRule, Policy};
use allot_policy::{Limits, PolicyEngine, PolicySource};

#[test]
fn embedded_default_policy_decides_cluster_default_pools() {
    let engine = PolicyEngine::new(Limits::default(), None).unwrap();
    let policy = engine.load(&PolicySource::embedded_default()).unwrap();
    let inv = crate::common::inventory(3);
    let mut req = crate::common::request(&inv);
    req.free_counts[1] = 0;
    let d = policy.decide(&inv, &req).unwrap();
    let fam = &d.nics[0].families[0];
    assert_eq!(fam.family, IpFamily::V4);
    assert_eq!(fam.rule, AcquisitionRule::ClusterDefault);
    assert_eq!(fam.candidates, vec![0, 1, 2]);
    assert_eq!(fam.order, vec![0, 2]);
    assert_eq!(fam.dropped.len(), 1);
    assert_eq!(fam.dropped[0].reason.as_str(), "exhausted");
    // The instance stays warm and serves a new generation after reloading it.
    assert_eq!(policy.warm_instances(), 1);
    let inv2 = Arc::new(allot_core::Inventory {
        generation: 2,
        ..(*crate::common::inventory(5)).clone()
    });
    let req2 = crate::common::request(&inv2);
    assert_eq!(
        policy.decide(&inv2, &req2).unwrap().nics[0].families[0]
            .order
            .len(),
        5
    );
    assert_eq!(policy.warm_instances(), 1);
}
