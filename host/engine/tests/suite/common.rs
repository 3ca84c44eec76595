//! Shared scaffolding of the engine tests: a small policy (CNI defaults in listed order,
//! exhausted pools dropped), pools, requests.

#![allow(dead_code)]

use std::net::IpAddr;
use std::sync::Arc;

use allot_core::policy::{
    AcquisitionRule, CniDefaults, Decision, DropReason, Dropped, FamilyDecision, Inventory,
    NamespaceInfo, NicDecision, NodeInfo, Owner, PodInfo, Policy, PolicyError, PoolRef, Request,
};
use allot_core::spec::{IpPoolSpec, ObjectMeta, RouteSpec};
use allot_core::store::{Attachment, Clock, MemoryStore, Store};
use allot_core::{IpFamily, PolicyErrorKind, Pool};
use allot_engine::{AddRequest, Engine, EngineConfig};

/// Candidates: the CNI default pools of each family, in order; exhausted ones dropped. A pod
/// annotated `given-ipv4` / `given-ipv6` is given that address (contract 0.3.0's hint).
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
            let (order, dropped) =
                candidates
                    .iter()
                    .fold((vec![], vec![]), |(mut o, mut d), &i| {
                        if req.free_counts[i as usize] > 0 {
                            o.push(i);
                        } else {
                            d.push(Dropped {
                                pool: PoolRef::Index(i),
                                reason: DropReason::Exhausted,
                                detail: String::new(),
                            });
                        }
                        (o, d)
                    });
            families.push(FamilyDecision {
                family,
                rule: AcquisitionRule::CniDefault,
                source: "test".into(),
                candidates,
                order,
                dropped,
                address: req
                    .pod
                    .annotations
                    .get(&format!("given-{family}"))
                    .map(|a| allot_core::policy::AddressHint {
                        address: a.clone(),
                        source: format!("pod annotation given-{family}"),
                    }),
            });
        }
        Ok(Decision {
            nics: req
                .nics
                .iter()
                .map(|n| match req.pod.annotations.get("fail-nic") {
                    // The policy's per-NIC verdict, e.g. a pool the pod names does not exist.
                    Some(message) if *message == n.interface => NicDecision {
                        interface: n.interface.clone(),
                        error: Some(PolicyError::new(
                            PolicyErrorKind::InvalidInput,
                            format!("IPPool ghost named for {message} does not exist"),
                        )),
                        clean_gateway: false,
                        routes: vec![],
                        families: vec![],
                    },
                    _ => NicDecision {
                        interface: n.interface.clone(),
                        error: None,
                        clean_gateway: req.pod.annotations.contains_key("clean-gateway"),
                        routes: vec![RouteSpec {
                            dst: "192.0.2.0/24".into(),
                            gw: "10.0.0.1".into(),
                        }],
                        families: families.clone(),
                    },
                })
                .collect(),
        })
    }
}

pub fn pool(name: &str, subnet: &str, ips: &[&str], gateway: Option<&str>) -> Pool {
    Pool::from_spec(
        ObjectMeta {
            name: name.into(),
            ..Default::default()
        },
        IpPoolSpec {
            subnet: subnet.into(),
            ips: ips.iter().map(|s| s.to_string()).collect(),
            gateway: gateway.map(str::to_string),
            ..Default::default()
        },
    )
    .unwrap()
}

/// No cooldown and no GC grace period: released addresses come back at once, GC releases at
/// its second look. (The tests of those behaviours set them.)
pub fn quick() -> EngineConfig {
    EngineConfig {
        cooldown: 0,
        gc_grace: 0,
        ..EngineConfig::default()
    }
}

pub fn engine(pools: Vec<Pool>) -> Engine<MemoryStore, CniDefaultsPolicy> {
    engine_on(MemoryStore::new(), pools, quick())
}

pub fn engine_on<S: Store>(
    store: S,
    pools: Vec<Pool>,
    config: EngineConfig,
) -> Engine<S, CniDefaultsPolicy> {
    let e = Engine::with_config(
        store,
        CniDefaultsPolicy,
        config,
        allot_core::store::system_clock(),
    );
    e.load(pools, vec![], vec![]).unwrap();
    e
}

/// A clock the test moves by hand, starting at `start`.
pub fn manual_clock(start: u64) -> (Clock, Arc<std::sync::atomic::AtomicU64>) {
    let now = Arc::new(std::sync::atomic::AtomicU64::new(start));
    let read = now.clone();
    (
        Arc::new(move || read.load(std::sync::atomic::Ordering::SeqCst)),
        now,
    )
}

/// A StatefulSet pod's ADD: pod `name` of set `set`.
pub fn stateful_req(container: &str, name: &str, set: &str, v4: &[&str]) -> AddRequest {
    let mut r = add_req(container, "eth0", v4, &[]);
    r.pod.name = name.into();
    r.pod.owner = Some(Owner {
        kind: "StatefulSet".into(),
        name: set.into(),
    });
    r
}

pub fn add_req(container: &str, ifname: &str, v4: &[&str], v6: &[&str]) -> AddRequest {
    AddRequest {
        attachment: Attachment {
            container_id: container.into(),
            interface: ifname.into(),
        },
        network: "net-a".into(),
        pod: PodInfo {
            namespace: "ns".into(),
            name: format!("pod-{container}"),
            uid: format!("uid-{container}"),
            ..Default::default()
        },
        namespace: NamespaceInfo {
            name: "ns".into(),
            ..Default::default()
        },
        node: NodeInfo {
            name: "node-1".into(),
            ..Default::default()
        },
        multus_name: String::new(),
        cni_defaults: CniDefaults {
            ipv4: v4.iter().map(|s| s.to_string()).collect(),
            ipv6: v6.iter().map(|s| s.to_string()).collect(),
        },
    }
}

pub fn att(container: &str, ifname: &str) -> Attachment {
    Attachment {
        container_id: container.into(),
        interface: ifname.into(),
    }
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The addresses an ADD returned, in order.
pub fn addresses(out: &allot_engine::AddOutcome) -> Vec<IpAddr> {
    out.allocations.iter().map(|a| a.address).collect()
}

/// The time a clocked engine reads, moved by the test.
pub type Now = Arc<std::sync::atomic::AtomicU64>;

/// An engine on `store` whose clock the test moves; the store's writes (release times) read the
/// same clock.
pub fn clocked_on(
    store: Arc<MemoryStore>,
    now: &Now,
    config: EngineConfig,
) -> Engine<Arc<MemoryStore>, CniDefaultsPolicy> {
    let read = now.clone();
    let clock: allot_core::store::Clock =
        Arc::new(move || read.load(std::sync::atomic::Ordering::SeqCst));
    Engine::with_config(store, CniDefaultsPolicy, config, clock)
}

/// An engine on a fresh store, both on a clock the test moves from `start`.
pub fn clocked(
    config: EngineConfig,
    start: u64,
) -> (Engine<Arc<MemoryStore>, CniDefaultsPolicy>, Now) {
    let (clock, now) = manual_clock(start);
    let store = Arc::new(MemoryStore::with_clock(clock));
    (clocked_on(store, &now, config), now)
}
