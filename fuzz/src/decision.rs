//! Target `decision`: the check of an untrusted policy's output,
//! `allot_core::policy::Decision::validate`, against an inventory and a request.
//!
//! Input: bytes read by [`Bytes`] as choices: the inventory's pools and families, the request's
//! NICs, then a decision that by default fits the request (one entry per NIC, the NIC's
//! interface, indices drawn from the inventory) and that rare choices break in one way each
//! (an out-of-range index, a foreign interface, an oversized detail, too many routes or
//! dropped pools, …). So most inputs reach the deep checks, and each rejection is one mutation
//! away from an acceptance.
//!
//! Invariants beyond "no panic": `validate` accepts exactly the decisions that a plain
//! restatement of its contract ([`fits`], written with sets rather than bitmaps) accepts; a
//! rejection is `BadOutput`; every drop of an accepted decision can be described.

use std::collections::HashSet;

use allot_core::PolicyErrorKind;
use allot_core::addr::IpFamily;
use allot_core::policy::{
    self, AcquisitionRule, Decision, DropReason, Dropped, FamilyDecision, Inventory, InventoryPool,
    MAX_DETAIL_BYTES, MAX_MISSING, MAX_ROUTES, MAX_SOURCE_BYTES, Nic, NicDecision, PolicyError,
    PoolRef, Request,
};
use allot_core::spec::{IpPoolSpec, RouteSpec};

use crate::bytes::Bytes;

const INTERFACES: &[&str] = &["eth0", "net1", "net2"];

pub fn run(data: &[u8]) {
    let mut b = Bytes::new(data);
    let inventory = inventory(&mut b);
    let request = request(&mut b, &inventory);
    let decision = decision(&mut b, &inventory, &request);
    let verdict = decision.validate(&inventory, &request);
    assert_eq!(
        verdict.is_ok(),
        fits(&decision, &inventory, &request),
        "validate says {verdict:?} for {decision:?}"
    );
    match verdict {
        Ok(()) => {
            for (nic, fam) in decision
                .nics
                .iter()
                .flat_map(|n| n.families.iter().map(move |f| (n, f)))
            {
                for d in &fam.dropped {
                    let _ = policy::describe_drop(&inventory, &request, &nic.interface, d);
                }
            }
        }
        Err(e) => {
            assert_eq!(e.kind, PolicyErrorKind::BadOutput);
            assert!(!e.message.is_empty());
        }
    }
}

fn family(b: &mut Bytes) -> IpFamily {
    if b.bool() { IpFamily::V6 } else { IpFamily::V4 }
}

fn inventory(b: &mut Bytes) -> Inventory {
    let pools = (0..b.below(9))
        .map(|i| {
            let mut spec = IpPoolSpec::default();
            if b.rarely(4) {
                spec.node_name = vec![format!("node-{}", b.below(2))];
            }
            if b.rarely(4) {
                spec.multus_name = vec![format!("ns/net-{}", b.below(2))];
            }
            InventoryPool {
                name: format!("pool-{i}"),
                labels: Default::default(),
                family: family(b),
                spec,
                terminating: false,
                total_count: u64::from(b.byte()),
                all_excluded: false,
                all_reserved: false,
                subnet_owner: None,
                application: None,
            }
        })
        .collect();
    Inventory {
        generation: 1,
        pools,
        subnets: Vec::new(),
    }
}

fn request(b: &mut Bytes, inventory: &Inventory) -> Request {
    let mut request = Request {
        nics: (0..b.below(4))
            .map(|_| Nic {
                interface: INTERFACES[b.below(INTERFACES.len())].into(),
                multus_name: if b.bool() {
                    "ns/net-0".into()
                } else {
                    String::new()
                },
            })
            .collect(),
        free_counts: inventory.pools.iter().map(|p| p.total_count).collect(),
        ..Default::default()
    };
    request.node.name = format!("node-{}", b.below(2));
    request
}

/// An index into the inventory, now and then one past it (or far past it).
fn index(b: &mut Bytes, pools: usize) -> u32 {
    if b.rarely(32) {
        return if b.bool() { u32::MAX } else { pools as u32 };
    }
    b.below(pools.max(1)) as u32
}

/// A length, now and then just past `max`.
fn sized(b: &mut Bytes, usual: usize, max: usize) -> usize {
    if b.rarely(64) {
        max + 1
    } else {
        b.below(usual + 1)
    }
}

fn decision(b: &mut Bytes, inventory: &Inventory, request: &Request) -> Decision {
    let pools = inventory.pools.len();
    let nic_count = if b.rarely(32) {
        b.below(5)
    } else {
        request.nics.len()
    };
    let nics = (0..nic_count)
        .map(|n| {
            let interface = match request.nics.get(n) {
                Some(asked) if !b.rarely(32) => asked.interface.clone(),
                _ => b.string(8),
            };
            // Contract 0.2.0: a policy may fail one NIC, and must then decide nothing else for it.
            let error = b.rarely(8).then(|| {
                PolicyError::new(
                    PolicyErrorKind::NotReady,
                    "e".repeat(sized(b, 8, MAX_DETAIL_BYTES)),
                )
            });
            let mut routes: Vec<RouteSpec> = (0..sized(b, 2, MAX_ROUTES))
                .map(|_| RouteSpec {
                    dst: "10.0.0.0/8".into(),
                    gw: "10.0.0.1".into(),
                })
                .collect();
            let mut families: Vec<FamilyDecision> =
                (0..b.below(3)).map(|_| family_decision(b, pools)).collect();
            if error.is_some() && !b.rarely(8) {
                routes.clear();
                families.clear();
            }
            NicDecision {
                interface,
                error,
                clean_gateway: b.bool(),
                routes,
                families,
            }
        })
        .collect();
    Decision { nics }
}

fn family_decision(b: &mut Bytes, pools: usize) -> FamilyDecision {
    let family = family(b);
    let rule = AcquisitionRule::ALL[b.below(AcquisitionRule::ALL.len())];
    let source = "s".repeat(sized(b, 4, MAX_SOURCE_BYTES));
    let candidates: Vec<u32> = (0..b.below(pools + 2)).map(|_| index(b, pools)).collect();
    let order = (0..b.below(candidates.len() + 2))
        .map(|_| match candidates.len() {
            n if n > 0 && !b.rarely(16) => candidates[b.below(n)],
            _ => index(b, pools),
        })
        .collect();
    let dropped_count = if b.rarely(64) {
        candidates.len() + MAX_MISSING + 1
    } else {
        b.below(4)
    };
    let dropped = (0..dropped_count)
        .map(|_| Dropped {
            pool: if b.rarely(4) {
                PoolRef::Missing("m".repeat(sized(b, 4, MAX_SOURCE_BYTES)))
            } else {
                PoolRef::Index(index(b, pools))
            },
            reason: DropReason::ALL[b.below(DropReason::ALL.len())],
            detail: "d".repeat(sized(b, 2, MAX_DETAIL_BYTES)),
        })
        .collect();
    FamilyDecision {
        family,
        rule,
        source,
        candidates,
        order,
        dropped,
        address: None,
    }
}

/// The contract of `Decision::validate`, restated plainly.
fn fits(decision: &Decision, inventory: &Inventory, request: &Request) -> bool {
    let pools = &inventory.pools;
    let in_range = |i: &u32| (*i as usize) < pools.len();
    decision.nics.len() == request.nics.len()
        && decision.nics.iter().zip(&request.nics).all(|(nic, asked)| {
            let families: HashSet<IpFamily> = nic.families.iter().map(|f| f.family).collect();
            nic.interface == asked.interface
                && nic.error.as_ref().is_none_or(|e| {
                    e.message.len() <= MAX_DETAIL_BYTES
                        && nic.families.is_empty()
                        && nic.routes.is_empty()
                })
                && nic.routes.len() <= MAX_ROUTES
                && families.len() == nic.families.len()
                && nic.families.iter().all(|fam| {
                    let candidates: HashSet<u32> = fam.candidates.iter().copied().collect();
                    let ordered: HashSet<u32> = fam.order.iter().copied().collect();
                    fam.source.len() <= MAX_SOURCE_BYTES
                        && fam.candidates.iter().all(in_range)
                        && fam.order.iter().all(in_range)
                        && fam.candidates.len() <= pools.len()
                        && ordered.len() == fam.order.len()
                        && ordered.is_subset(&candidates)
                        && fam
                            .order
                            .iter()
                            .all(|&i| pools[i as usize].family == fam.family)
                        && fam.dropped.len() <= fam.candidates.len() + MAX_MISSING
                        && fam.dropped.iter().all(|d| {
                            d.detail.len() <= MAX_DETAIL_BYTES
                                && match &d.pool {
                                    PoolRef::Index(i) => in_range(i),
                                    PoolRef::Missing(name) => name.len() <= MAX_SOURCE_BYTES,
                                }
                        })
                })
        })
}
