//! The claims and Endpoints of a migration: one claim per address the peer records (or a pod
//! in a migrated pool uses), for its one holder, unless allot holds the address already.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::holders::{self, Holder};
use super::{
    DEFAULT_INTERFACE, EndpointNic, EndpointRecord, Inputs, LivePod, Owner, Plan, Record, Refusal,
    migrated_sandbox,
};
use crate::pool::Pool;
use crate::store::{Attachment, Claim, PodRef};

pub(super) fn plan_claims(
    inputs: &Inputs,
    pools: &[Pool],
    plan: &mut Plan,
    refusals: &mut Vec<Refusal>,
) {
    let pool_of = |address: IpAddr| pools.iter().find(|p| p.ips.contains(address));
    let current: BTreeMap<IpAddr, &Claim> = inputs
        .current
        .claims
        .iter()
        .map(|c| (c.address, c))
        .collect();
    // Pools allot serves already: an earlier run wrote them, after every claim of theirs. What
    // the peer still records there and allot does not hold, allot has released since (its pod
    // gone, by GC) or never held: a rerun imports only records of pods that still hold them,
    // so it never brings back what GC released.
    let served: BTreeSet<&str> = plan
        .pools
        .iter()
        .filter(|w| w.exists)
        .map(|w| w.name.as_str())
        .collect();
    let mut records: Vec<Record> = inputs
        .records
        .iter()
        .map(|r| of_launcher_pod(r, inputs.pods))
        .filter(|r| {
            !pool_of(r.address).is_some_and(|p| served.contains(p.name()))
                || still_held(r, inputs.pods)
        })
        .collect();
    // Addresses pods use inside the migrated pools, beside the peer's records: a running pod's
    // address the peer lost track of must not be handed out again either. One allot claims for
    // that pod already (allot handed it out, or an earlier run) needs nothing.
    let recorded: BTreeSet<IpAddr> = records.iter().map(|r| r.address).collect();
    for pod in inputs.pods.iter().filter(|p| p.holds) {
        for a in &pod.addresses {
            if recorded.contains(&a.address) {
                continue;
            }
            if current
                .get(&a.address)
                .is_some_and(|c| c.pod.same_holder(&pod_ref(pod)))
            {
                continue;
            }
            let Some(pool) = pool_of(a.address) else {
                continue;
            };
            plan.notes.push(format!(
                "{} is used by pod {}/{} but no record of {}'s says so: claimed for the pod \
                 from its status",
                a.address,
                pod.namespace,
                pod.name,
                inputs.peer.as_str()
            ));
            records.push(Record {
                address: a.address,
                pool: Some(pool.name().to_string()),
                network: String::new(),
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: Some(pod.uid.clone()),
                interface: a.interface.clone(),
                container_id: None,
                owner: pod.owner.clone(),
                source: format!("pod {}/{} status", pod.namespace, pod.name),
            });
        }
    }
    let by_address = holders::group(&records, inputs.pods);
    let mut held: Vec<Claim> = Vec::new();
    for (address, group) in by_address {
        if group.holders.len() > 1 {
            refusals.push(Refusal::TwoHolders {
                address,
                holders: group
                    .holders
                    .iter()
                    .map(Holder::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
            continue;
        }
        let claim = claim_for(inputs, address, &group, pool_of(address), plan);
        match current.get(&address) {
            Some(c) if c.pod.same_holder(&claim.pod) => {
                plan.claimed.push(address);
                held.push((*c).clone());
            }
            Some(c) => refusals.push(Refusal::ClaimedByOther {
                address,
                holder: if c.pod.is_conflict() {
                    format!(
                        "a quarantine (host {} answered for it)",
                        c.pod.conflict_mac().unwrap_or_default()
                    )
                } else {
                    format!("pod {}/{} (IPPool {})", c.pod.namespace, c.pod.name, c.pool)
                },
                object: group.records[0].source.clone(),
                pod: format!("{}/{}", claim.pod.namespace, claim.pod.name),
            }),
            None => {
                held.push(claim.clone());
                plan.claims.push(claim);
            }
        }
    }
    plan.endpoints = endpoints(inputs, &held, pools);
}

/// The holder `pod` is, as a claim names it.
fn pod_ref(pod: &LivePod) -> PodRef {
    PodRef {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        owner_kind: pod.owner.as_ref().map(|o| o.kind.clone()),
        owner_name: pod.owner.as_ref().map(|o| o.name.clone()),
    }
}

/// `record` as the record of a pod. Spiderpool keys a virtual machine's addresses by the VM (its
/// VirtualMachineInstance, named after it), not by the launcher pod: a record naming a VM (its
/// owner says so, or a launcher pod of the VM of that name has the recorded UID) is made the
/// record of the launcher pod that holds the address, the one with the recorded UID, else one
/// that uses it. With no launcher pod running the VM's name stays: the VM's next launcher pod
/// takes the claim over as it takes over allot's own (the same virtual machine).
fn of_launcher_pod(record: &Record, pods: &[LivePod]) -> Record {
    let of_vm = |o: Option<&Owner>| {
        o.is_some_and(|o| o.kind == crate::store::VIRTUAL_MACHINE_KIND && o.name == record.name)
    };
    let launchers: Vec<&LivePod> = pods
        .iter()
        .filter(|p| p.holds && p.namespace == record.namespace && of_vm(p.owner.as_ref()))
        .collect();
    let uid = record.uid.as_deref().filter(|u| !u.is_empty());
    let by_uid = launchers.iter().find(|p| Some(p.uid.as_str()) == uid);
    let holding = by_uid.or_else(|| {
        of_vm(record.owner.as_ref())
            .then(|| {
                launchers
                    .iter()
                    .find(|p| p.addresses.iter().any(|a| a.address == record.address))
            })
            .flatten()
    });
    match holding {
        Some(p) => Record {
            name: p.name.clone(),
            owner: record.owner.clone().or_else(|| p.owner.clone()),
            ..record.clone()
        },
        None => record.clone(),
    }
}

/// Whether the pod `record` names still holds its address: a live pod of that name that is the
/// pod recorded (the same UID) or shows the address (a pod of that name started since, that
/// does not, is another pod).
fn still_held(record: &Record, pods: &[LivePod]) -> bool {
    let uid = record.uid.as_deref().filter(|u| !u.is_empty());
    pods.iter().any(|p| {
        p.holds
            && p.namespace == record.namespace
            && p.name == record.name
            && (uid == Some(p.uid.as_str())
                || p.addresses.iter().any(|a| a.address == record.address))
    })
}

/// The claim that keeps `address` for its one holder.
fn claim_for(
    inputs: &Inputs,
    address: IpAddr,
    group: &holders::Group,
    pool: Option<&Pool>,
    plan: &mut Plan,
) -> Claim {
    let records = &group.records;
    let first = &records[0];
    let live = inputs
        .pods
        .iter()
        .find(|p| p.holds && p.namespace == first.namespace && p.name == first.name);
    let live_uses = live.filter(|p| p.addresses.iter().any(|a| a.address == address));
    let recorded_uid = records
        .iter()
        .find_map(|r| r.uid.clone().filter(|u| !u.is_empty()));
    // The pod using the address now is its holder; a record's UID otherwise (a pod of that name
    // with another UID is a later one: GC judges the claim by it).
    let uid = live_uses
        .map(|p| p.uid.clone())
        .or(recorded_uid)
        .or(live.map(|p| p.uid.clone()))
        .unwrap_or_default();
    let interface = records
        .iter()
        .find_map(|r| r.interface.clone().filter(|i| !i.is_empty()))
        .or_else(|| {
            live?
                .addresses
                .iter()
                .find(|a| a.address == address)?
                .interface
                .clone()
        })
        .unwrap_or_else(|| DEFAULT_INTERFACE.to_string());
    let container_id = records
        .iter()
        .find_map(|r| r.container_id.clone().filter(|c| !c.is_empty()))
        .unwrap_or_else(|| {
            let key = if uid.is_empty() {
                format!("{}/{}", first.namespace, first.name)
            } else {
                uid.clone()
            };
            migrated_sandbox(inputs.peer, &key)
        });
    let owner = records
        .iter()
        .find_map(|r| r.owner.clone())
        .or(live.and_then(|p| p.owner.clone()));
    let pool_name = records
        .iter()
        .find_map(|r| r.pool.clone())
        .or(pool.map(|p| p.name().to_string()));
    let pool_name = match pool_name {
        Some(name) => {
            if pool.is_none_or(|p| p.name() != name || !p.allocatable().contains(address)) {
                plan.notes.push(format!(
                    "{address} ({}/{}, {}) is not one IPPool {name} hands out: it stays \
                     claimed for its pod and is never handed out while it is",
                    first.namespace, first.name, first.source
                ));
            }
            name
        }
        None => {
            plan.notes.push(format!(
                "{address} ({}/{}, {}) lies in no migrated pool: it stays claimed for its pod",
                first.namespace, first.name, first.source
            ));
            String::new()
        }
    };
    Claim {
        address,
        pool: pool_name,
        network: records
            .iter()
            .map(|r| r.network.clone())
            .find(|n| !n.is_empty())
            .unwrap_or_default(),
        attachment: Some(Attachment {
            container_id,
            interface,
        }),
        pod: PodRef {
            namespace: first.namespace.clone(),
            name: first.name.clone(),
            uid,
            owner_kind: owner.as_ref().map(|o| o.kind.clone()),
            owner_name: owner.map(|o| o.name),
        },
        node: String::new(),
        updated_at: inputs.now,
    }
}

/// The Endpoint of every live pod that holds one of `held`.
fn endpoints(inputs: &Inputs, held: &[Claim], pools: &[Pool]) -> Vec<EndpointRecord> {
    let mut out: Vec<EndpointRecord> = Vec::new();
    for pod in inputs.pods.iter().filter(|p| p.holds) {
        let mine: Vec<&Claim> = held
            .iter()
            .filter(|c| c.pod.namespace == pod.namespace && c.pod.name == pod.name)
            .filter(|c| c.pod.uid == pod.uid)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let mut nics: BTreeMap<String, EndpointNic> = BTreeMap::new();
        for c in mine {
            let ifname = c
                .attachment
                .as_ref()
                .map_or(DEFAULT_INTERFACE, |a| a.interface.as_str());
            let nic = nics
                .entry(ifname.to_string())
                .or_insert_with(|| EndpointNic {
                    ifname: ifname.to_string(),
                    ..EndpointNic::default()
                });
            let pool = pools.iter().find(|p| p.name() == c.pool);
            let prefix = pool.map_or(if c.address.is_ipv4() { 32 } else { 128 }, |p| {
                p.subnet.prefix_len()
            });
            let cidr = format!("{}/{prefix}", c.address);
            if c.address.is_ipv4() {
                nic.ipv4 = Some(cidr);
            } else {
                nic.ipv6 = Some(cidr);
            }
            if !c.pool.is_empty() && !nic.pools.contains(&c.pool) {
                nic.pools.push(c.pool.clone());
            }
            if let Some(p) = pool {
                nic.gateways.extend(p.gateway.map(|g| g.to_string()));
                nic.routes.extend(p.spec.routes.iter().cloned());
            }
        }
        let owner = held
            .iter()
            .find(|c| c.pod.namespace == pod.namespace && c.pod.name == pod.name)
            .and_then(|c| {
                Some(Owner {
                    kind: c.pod.owner_kind.clone()?,
                    name: c.pod.owner_name.clone()?,
                })
            })
            .or(pod.owner.clone());
        out.push(EndpointRecord {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            node: pod.node.clone(),
            owner,
            interfaces: nics.into_values().collect(),
        });
    }
    out
}
