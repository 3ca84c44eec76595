//! The claims and Endpoints of a migration: one claim per address the peer records (or a pod
//! in a migrated pool uses), for its one holder, unless allot holds the address already.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::holders::{self, Holder};
use super::{
    DEFAULT_INTERFACE, EndpointNic, EndpointRecord, Inputs, Owner, Plan, Record, Refusal,
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
    // Addresses pods use inside the migrated pools, beside the peer's records: a running pod's
    // address the peer lost track of must not be handed out again either.
    let mut records: Vec<Record> = inputs.records.to_vec();
    let recorded: BTreeSet<IpAddr> = records.iter().map(|r| r.address).collect();
    for pod in inputs.pods.iter().filter(|p| p.holds) {
        for a in &pod.addresses {
            if recorded.contains(&a.address) {
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
    let current: BTreeMap<IpAddr, &Claim> = inputs
        .current
        .claims
        .iter()
        .map(|c| (c.address, c))
        .collect();
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
            Some(c) if c.pod.namespace == claim.pod.namespace && c.pod.name == claim.pod.name => {
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
