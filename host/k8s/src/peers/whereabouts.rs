//! Whereabouts's objects (v0.9, `whereabouts.cni.cncf.io/v1alpha1`) and the Multus
//! NetworkAttachmentDefinitions (`k8s.cni.cncf.io/v1`) whose configuration holds the ranges:
//!
//! - a NetworkAttachmentDefinition's `spec.config` is a CNI configuration (one plugin, or a list
//!   under `plugins`) whose `ipam` section, of type `whereabouts`, has the ranges
//!   (`allot_core::migrate::whereabouts::IpamConfig`);
//! - an `IPPool` (namespaced, in Whereabouts's namespace) per range and network name, named
//!   after them, holds `spec.range` and `spec.allocations`: offset (decimal text, from the
//!   address `spec.range` writes) → `{id: container ID, podref: "namespace/name", ifname}`;
//! - an `OverlappingRangeIPReservation` per address in use (named after the address, `:`
//!   written `-`, after `<network_name>-`), `spec: {podref, ifname, containerid}`, keeps one
//!   address from being handed out by two ranges that overlap.
//!
//! Each range becomes an allot IPPool named `whereabouts-<the IPPool's name>`; NADs with the
//! same range and network name share it.

use std::collections::BTreeMap;

use allot_core::migrate::whereabouts::{
    IpamConfig, Range, allocation_address, allot_pool_name, ippool_name, reservation_address,
    split_podref,
};
use allot_core::migrate::{PeerPool, Record};
use ipnet::IpNet;
use kube::api::DynamicObject;
use serde_json::Value;

use super::{PeerKind, object_name};

pub const NETWORK_ATTACHMENT_DEFINITION: PeerKind = PeerKind {
    group: "k8s.cni.cncf.io",
    version: "v1",
    kind: "NetworkAttachmentDefinition",
    plural: "network-attachment-definitions",
    namespaced: true,
};
pub const IPPOOL: PeerKind = PeerKind {
    group: "whereabouts.cni.cncf.io",
    version: "v1alpha1",
    kind: "IPPool",
    plural: "ippools",
    namespaced: true,
};
pub const RESERVATION: PeerKind = PeerKind {
    group: "whereabouts.cni.cncf.io",
    version: "v1alpha1",
    kind: "OverlappingRangeIPReservation",
    plural: "overlappingrangeipreservations",
    namespaced: true,
};

/// Every object a Whereabouts migration reads.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub networks: Vec<DynamicObject>,
    pub pools: Vec<DynamicObject>,
    pub reservations: Vec<DynamicObject>,
}

/// What they say, as core's migration inputs.
#[derive(Clone, Debug, Default)]
pub struct Decoded {
    pub pools: Vec<PeerPool>,
    pub records: Vec<Record>,
    pub unreadable: Vec<(String, String)>,
    /// Each NetworkAttachmentDefinition that uses Whereabouts, with the allot pools of its
    /// ranges: its `ipam` section becomes allot's, naming them.
    pub networks: Vec<(String, Vec<String>)>,
}

/// A range some network uses: its allot pool and the CNI network's name.
struct Known {
    network_name: String,
    net: IpNet,
    range: Range,
    pool: String,
    network: String,
}

/// The Whereabouts `ipam` sections of a CNI configuration, with the network's name.
fn ipam_sections(config: &Value) -> Vec<(String, Value)> {
    let name = config
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let plugins: Vec<&Value> = match config.get("plugins").and_then(Value::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![config],
    };
    plugins
        .into_iter()
        .filter_map(|p| p.get("ipam"))
        .filter(|ipam| ipam.get("type").and_then(Value::as_str) == Some("whereabouts"))
        .map(|ipam| (name.clone(), ipam.clone()))
        .collect()
}

/// Decodes every object.
pub fn decode(objects: &Objects) -> Decoded {
    let mut out = Decoded::default();
    let mut known: Vec<Known> = Vec::new();
    for o in &objects.networks {
        let source = format!("NetworkAttachmentDefinition {}", object_name(o));
        let text = o
            .data
            .get("spec")
            .and_then(|s| s.get("config"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let config: Value = match serde_json::from_str(text) {
            Ok(config) => config,
            // Not JSON: a network of no concern unless it names Whereabouts.
            Err(e) if text.contains("whereabouts") => {
                out.unreadable
                    .push((source, format!("spec.config is not JSON: {e}")));
                continue;
            }
            Err(_) => continue,
        };
        let mut pools_of_network = Vec::new();
        for (network, ipam) in ipam_sections(&config) {
            let ranges = serde_json::from_value::<IpamConfig>(ipam)
                .map_err(|e| format!("spec.config ipam: {e}"))
                .and_then(|c| Ok((c.ranges().map_err(|e| e.to_string())?, c)));
            let (ranges, ipam) = match ranges {
                Ok(r) => r,
                Err(why) => {
                    out.unreadable.push((source.clone(), why));
                    continue;
                }
            };
            for range in ranges {
                let pool = allot_pool_name(ipam.network_name(), &range.net);
                out.pools.push(PeerPool {
                    source: format!("{source} (range {})", range.net),
                    name: pool.clone(),
                    labels: BTreeMap::new(),
                    spec: Ok(range.pool_spec(ipam.gateway.as_deref(), &ipam.routes)),
                });
                pools_of_network.push(pool.clone());
                known.push(Known {
                    network_name: ipam.network_name().to_string(),
                    net: range.net,
                    range,
                    pool,
                    network: network.clone(),
                });
            }
        }
        if !pools_of_network.is_empty() {
            out.networks.push((object_name(o), pools_of_network));
        }
    }
    for o in &objects.pools {
        let source = format!("Whereabouts IPPool {}", object_name(o));
        if let Err(why) = allocations(o, &known, &source, &mut out.records) {
            out.unreadable.push((source, why));
        }
    }
    let networks: Vec<String> = known.iter().map(|k| k.network_name.clone()).collect();
    for o in &objects.reservations {
        let source = format!("OverlappingRangeIPReservation {}", object_name(o));
        match reservation(o, &known, &networks, &source) {
            Ok(record) => out.records.push(record),
            Err(why) => out.unreadable.push((source, why)),
        }
    }
    out
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn podref(v: &Value, at: &str) -> Result<(String, String), String> {
    let podref = text(v, "podref").unwrap_or_default();
    let (ns, name) = split_podref(&podref)
        .ok_or_else(|| format!("{at}.podref `{podref}` is not namespace/name"))?;
    Ok((ns.to_string(), name.to_string()))
}

/// The records of an IPPool's allocations.
fn allocations(
    o: &DynamicObject,
    known: &[Known],
    source: &str,
    out: &mut Vec<Record>,
) -> Result<(), String> {
    let spec = o.data.get("spec").unwrap_or(&Value::Null);
    let range = text(spec, "range").ok_or("spec.range is missing")?;
    let net: IpNet = range
        .parse::<IpNet>()
        .map_err(|_| format!("spec.range `{range}` is not a CIDR"))?
        .trunc();
    let name = o.metadata.name.clone().unwrap_or_default();
    // The network name is what the IPPool's name has before the range.
    let network_name = name
        .strip_suffix(&ippool_name("", &net))
        .map(|prefix| prefix.trim_end_matches('-').to_string())
        .unwrap_or_default();
    let of_range = known
        .iter()
        .find(|k| k.net == net && k.network_name == network_name);
    let pool = of_range.map_or_else(|| allot_pool_name(&network_name, &net), |k| k.pool.clone());
    let network = of_range.map(|k| k.network.clone()).unwrap_or_default();
    let allocations = spec.get("allocations").and_then(Value::as_object);
    for (offset, a) in allocations.into_iter().flatten() {
        let at = format!("spec.allocations[{offset}]");
        let address = allocation_address(&range, offset).map_err(|e| format!("{at}: {e}"))?;
        let (namespace, name) = podref(a, &at)?;
        out.push(Record {
            address,
            pool: Some(pool.clone()),
            network: network.clone(),
            namespace,
            name,
            uid: None,
            interface: text(a, "ifname"),
            container_id: text(a, "id"),
            owner: None,
            source: format!("{source} {at}"),
        });
    }
    Ok(())
}

/// The record of an OverlappingRangeIPReservation.
fn reservation(
    o: &DynamicObject,
    known: &[Known],
    networks: &[String],
    source: &str,
) -> Result<Record, String> {
    let name = o.metadata.name.clone().unwrap_or_default();
    let (network_name, address) = reservation_address(&name, networks)
        .ok_or_else(|| format!("its name `{name}` is not an address"))?;
    let spec = o.data.get("spec").unwrap_or(&Value::Null);
    let (namespace, pod) = podref(spec, "spec")?;
    let of_range = known.iter().find(|k| {
        k.network_name == network_name
            && k.net.contains(&address)
            && allot_core::addr::addr_to_u128(k.range.first)
                <= allot_core::addr::addr_to_u128(address)
            && allot_core::addr::addr_to_u128(address)
                <= allot_core::addr::addr_to_u128(k.range.last)
    });
    Ok(Record {
        address,
        pool: of_range.map(|k| k.pool.clone()),
        network: of_range.map(|k| k.network.clone()).unwrap_or_default(),
        namespace,
        name: pod,
        uid: None,
        interface: text(spec, "ifname"),
        container_id: text(spec, "containerid"),
        owner: None,
        source: source.to_string(),
    })
}

#[cfg(test)]
#[path = "whereabouts_tests.rs"]
mod tests;
