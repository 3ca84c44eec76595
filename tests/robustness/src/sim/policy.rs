//! The simulated cluster's policy: each family's CNI default pools in the order listed,
//! exhausted ones dropped. The simulation tests what the host owns (claims, retries, the
//! journal, GC); which pools a pod may use is the policy's, tested by its own suites, so a
//! plain Rust policy stands in for the WebAssembly one here (and keeps wasmtime out of a
//! simulator that runs a hundred thousand seeds).

use std::sync::Arc;

use allot_core::IpFamily;
use allot_core::policy::{
    AcquisitionRule, Decision, DropReason, Dropped, FamilyDecision, Inventory, NicDecision, Policy,
    PolicyError, PoolRef, Request,
};

pub struct CniDefaultsPolicy;

impl Policy for CniDefaultsPolicy {
    fn decide(&self, inv: &Arc<Inventory>, req: &Request) -> Result<Decision, PolicyError> {
        let mut families = Vec::new();
        for (family, names) in [
            (IpFamily::V4, &req.cni_defaults.ipv4),
            (IpFamily::V6, &req.cni_defaults.ipv6),
        ] {
            if names.is_empty() {
                continue;
            }
            let candidates: Vec<u32> = names.iter().filter_map(|n| inv.pool_index(n)).collect();
            let (order, dropped): (Vec<u32>, Vec<u32>) = candidates
                .iter()
                .partition(|&&i| req.free_counts[i as usize] > 0);
            families.push(FamilyDecision {
                family,
                rule: AcquisitionRule::CniDefault,
                source: "simulation".into(),
                candidates,
                order,
                dropped: dropped
                    .into_iter()
                    .map(|i| Dropped {
                        pool: PoolRef::Index(i),
                        reason: DropReason::Exhausted,
                        detail: String::new(),
                    })
                    .collect(),
                address: None,
            });
        }
        Ok(Decision {
            nics: req
                .nics
                .iter()
                .map(|n| NicDecision {
                    interface: n.interface.clone(),
                    error: None,
                    clean_gateway: false,
                    routes: vec![],
                    families: families.clone(),
                })
                .collect(),
        })
    }

    fn name(&self) -> String {
        "simulation".into()
    }
}
