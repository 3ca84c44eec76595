//! Spiderpool's objects (v1.2, `spiderpool.spidernet.io/v2beta1`), as its controller and agents
//! write them:
//!
//! - `SpiderIPPool`: `spec` has allot's IPPool fields (allot took them from Spiderpool), and
//!   `status.allocatedIPs` is a JSON *string* holding a map from address to
//!   `{"pod": "namespace/name", "podUid": "…"}` (`PoolIPAllocations`); no interface.
//! - `SpiderSubnet`, `SpiderReservedIP`: allot's Subnet and ReservedIP fields.
//! - `SpiderEndpoint` (namespaced, named after the pod; no spec, all in `status`):
//!   `status.current` `{uid, node, ips: [{interface, ipv4: "a/len", ipv6, ipv4Pool, ipv6Pool,
//!   ipv4Gateway, ipv6Gateway, vlan, routes, cleanGateway}]}`, `status.ownerControllerType`
//!   and `…Name` (the pod's top-level controller; `Pod` for a bare pod).
//! - A KubeVirt virtual machine's addresses (Spiderpool's `enableKubevirtStaticIP`, on by
//!   default) are keyed by its VirtualMachineInstance, not by the launcher pod: the
//!   `status.allocatedIPs` entry names `namespace/<instance>` with the launcher pod's UID, the
//!   SpiderEndpoint is named after the instance, its owner `VirtualMachineInstance`. Core's
//!   migration finds the launcher pod that holds them.
//!
//! An auto pool (Spiderpool's IPPool for one application, labelled
//! `ipam.spidernet.io/owner-application-name`) becomes the auto pool allot's controller would
//! have made for that application and Subnet: allot's name and labels, so allot keeps sizing it
//! and deletes it with the application. Its pod affinity (Spiderpool's special
//! `ipam.spidernet.io/app-*` keys, which match no pod label) is left out: allot finds auto pools
//! by their labels. A pool of a SpiderSubnet (label `ipam.spidernet.io/owner-spider-subnet`) is
//! labelled with allot's `ipam.allot.dev/owner-subnet`, so the webhook keeps it inside its
//! Subnet as Spiderpool did.

use std::collections::{BTreeMap, HashMap};

use allot_core::addr::IpFamily;
use allot_core::autopool;
use allot_core::migrate::{Owner, PeerObject, PeerPool, Record};
use allot_core::policy::Application;
use allot_core::spec::{IpPoolSpec, ReservedIpSpec, SubnetSpec, auto_pool_labels};
use allot_core::store::holder_kind;
use kube::api::DynamicObject;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{PeerKind, address_of, object_name};

const GROUP: &str = "spiderpool.spidernet.io";
const VERSION: &str = "v2beta1";
/// Whose `VirtualMachineInstance` Spiderpool's `ownerControllerType` names.
const KUBEVIRT_API_VERSION: &str = "kubevirt.io/v1";

pub const IPPOOL: PeerKind = PeerKind {
    group: GROUP,
    version: VERSION,
    kind: "SpiderIPPool",
    plural: "spiderippools",
    namespaced: false,
};
pub const SUBNET: PeerKind = PeerKind {
    group: GROUP,
    version: VERSION,
    kind: "SpiderSubnet",
    plural: "spidersubnets",
    namespaced: false,
};
pub const RESERVED_IP: PeerKind = PeerKind {
    group: GROUP,
    version: VERSION,
    kind: "SpiderReservedIP",
    plural: "spiderreservedips",
    namespaced: false,
};
pub const ENDPOINT: PeerKind = PeerKind {
    group: GROUP,
    version: VERSION,
    kind: "SpiderEndpoint",
    plural: "spiderendpoints",
    namespaced: true,
};

/// Spiderpool's labels on its pools.
const OWNER_SUBNET: &str = "ipam.spidernet.io/owner-spider-subnet";
const APPLICATION_KIND: &str = "ipam.spidernet.io/owner-application-kind";
const APPLICATION_NAMESPACE: &str = "ipam.spidernet.io/owner-application-namespace";
const APPLICATION_NAME: &str = "ipam.spidernet.io/owner-application-name";
const RECLAIM: &str = "ipam.spidernet.io/ippool-reclaim";

/// Every Spiderpool object a migration reads.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub pools: Vec<DynamicObject>,
    pub subnets: Vec<DynamicObject>,
    pub reserved: Vec<DynamicObject>,
    pub endpoints: Vec<DynamicObject>,
}

/// What they say, as core's migration inputs.
#[derive(Clone, Debug, Default)]
pub struct Decoded {
    pub pools: Vec<PeerPool>,
    pub subnets: Vec<PeerObject<SubnetSpec>>,
    pub reserved: Vec<PeerObject<ReservedIpSpec>>,
    pub records: Vec<Record>,
    pub unreadable: Vec<(String, String)>,
}

/// One `PoolIPAllocation` of `status.allocatedIPs`.
#[derive(Deserialize)]
struct Allocation {
    pod: String,
    #[serde(rename = "podUid", default)]
    pod_uid: String,
}

fn spec<S: DeserializeOwned>(o: &DynamicObject) -> Result<S, String> {
    let spec = o.data.get("spec").cloned().unwrap_or(Value::Null);
    serde_json::from_value(spec).map_err(|e| format!("spec: {e}"))
}

/// Decodes every object.
pub fn decode(objects: &Objects) -> Decoded {
    let mut out = Decoded::default();
    // Spiderpool's pool name → allot's (auto pools are renamed).
    let mut names: HashMap<String, String> = HashMap::new();
    for o in &objects.pools {
        let source = format!("SpiderIPPool {}", object_name(o));
        let spider_name = o.metadata.name.clone().unwrap_or_default();
        let labels = o.metadata.labels.clone().unwrap_or_default();
        let (name, labels, spec) = match spec::<IpPoolSpec>(o) {
            Ok(spec) => {
                let (name, labels, spec) = adopted(&spider_name, &labels, spec);
                (name, labels, Ok(spec))
            }
            Err(why) => (spider_name.clone(), labels, Err(why)),
        };
        names.insert(spider_name, name.clone());
        match allocated(o, &name, &source) {
            Ok(records) => out.records.extend(records),
            Err(why) => out.unreadable.push((source.clone(), why)),
        }
        out.pools.push(PeerPool {
            source,
            name,
            labels,
            spec,
        });
    }
    for o in &objects.subnets {
        out.subnets.push(PeerObject {
            source: format!("SpiderSubnet {}", object_name(o)),
            name: o.metadata.name.clone().unwrap_or_default(),
            spec: spec(o),
        });
    }
    for o in &objects.reserved {
        out.reserved.push(PeerObject {
            source: format!("SpiderReservedIP {}", object_name(o)),
            name: o.metadata.name.clone().unwrap_or_default(),
            spec: spec(o),
        });
    }
    for o in &objects.endpoints {
        let source = format!("SpiderEndpoint {}", object_name(o));
        match endpoint_records(o, &names, &source) {
            Ok(records) => out.records.extend(records),
            Err(why) => out.unreadable.push((source, why)),
        }
    }
    out
}

/// allot's name, labels and spec for a Spiderpool pool.
fn adopted(
    name: &str,
    labels: &BTreeMap<String, String>,
    mut spec: IpPoolSpec,
) -> (String, BTreeMap<String, String>, IpPoolSpec) {
    let subnet = labels.get(OWNER_SUBNET);
    let app = match (
        labels.get(APPLICATION_KIND),
        labels.get(APPLICATION_NAMESPACE),
        labels.get(APPLICATION_NAME),
    ) {
        (Some(kind), Some(namespace), Some(name)) => Some(Application {
            kind: kind.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
        }),
        _ => None,
    };
    let family = spec
        .ip_version
        .and_then(IpFamily::from_version)
        .or_else(|| {
            let net: ipnet::IpNet = spec.subnet.trim().parse().ok()?;
            Some(IpFamily::of_net(&net))
        });
    if let (Some(subnet), Some(app), Some(family)) = (subnet, app, family) {
        let reclaim = labels.get(RECLAIM).map(String::as_str) != Some("false");
        spec.pod_affinity = None;
        return (
            autopool::pool_name(&app, subnet, family),
            autopool::labels(&app, subnet, reclaim),
            spec,
        );
    }
    let mut labels = labels.clone();
    if let Some(subnet) = subnet {
        labels.insert(auto_pool_labels::OWNER_SUBNET.into(), subnet.clone());
    }
    (name.to_string(), labels, spec)
}

/// The records of a pool's `status.allocatedIPs`.
fn allocated(o: &DynamicObject, pool: &str, source: &str) -> Result<Vec<Record>, String> {
    let Some(text) = o
        .data
        .get("status")
        .and_then(|s| s.get("allocatedIPs"))
        .filter(|v| !v.is_null())
    else {
        return Ok(Vec::new());
    };
    let text = text
        .as_str()
        .ok_or("status.allocatedIPs is not a string (Spiderpool writes a JSON text)")?;
    let map: BTreeMap<String, Allocation> = serde_json::from_str(text).map_err(|e| {
        format!("status.allocatedIPs is not a JSON map of addresses to {{pod, podUid}}: {e}")
    })?;
    map.into_iter()
        .map(|(address, a)| {
            let parsed = address
                .parse()
                .map_err(|_| format!("status.allocatedIPs: `{address}` is not an address"))?;
            let (namespace, name) = a.pod.split_once('/').ok_or_else(|| {
                format!(
                    "status.allocatedIPs[{address}].pod `{}` is not namespace/name",
                    a.pod
                )
            })?;
            Ok(Record {
                address: parsed,
                pool: Some(pool.to_string()),
                network: String::new(),
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: Some(a.pod_uid).filter(|u| !u.is_empty()),
                interface: None,
                container_id: None,
                owner: None,
                source: format!("{source} status.allocatedIPs"),
            })
        })
        .collect()
}

/// The records of a SpiderEndpoint: each address of each interface, with the pod's UID and
/// owner.
fn endpoint_records(
    o: &DynamicObject,
    names: &HashMap<String, String>,
    source: &str,
) -> Result<Vec<Record>, String> {
    let namespace = o.metadata.namespace.clone().unwrap_or_default();
    let pod = o.metadata.name.clone().unwrap_or_default();
    let status = o.data.get("status").unwrap_or(&Value::Null);
    let text = |v: &Value, key: &str| {
        v.get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let current = status.get("current").unwrap_or(&Value::Null);
    let uid = text(current, "uid");
    let owner = match (
        text(status, "ownerControllerType"),
        text(status, "ownerControllerName"),
    ) {
        // With KubeVirt's static addresses (Spiderpool's default), a launcher pod's
        // controller is its VirtualMachineInstance, which stands for the virtual machine
        // whose launcher pods share its addresses: the owner allot records for them.
        (Some(kind), Some(name)) if kind != "Pod" && kind != "Unknown" => Some(Owner {
            kind: holder_kind(KUBEVIRT_API_VERSION, &kind).to_string(),
            name,
        }),
        _ => None,
    };
    let ips = current.get("ips").and_then(Value::as_array);
    let mut out = Vec::new();
    for (i, nic) in ips.into_iter().flatten().enumerate() {
        for (field, pool_field) in [("ipv4", "ipv4Pool"), ("ipv6", "ipv6Pool")] {
            let Some(cidr) = text(nic, field) else {
                continue;
            };
            let address = address_of(&cidr).ok_or_else(|| {
                format!("status.current.ips[{i}].{field} `{cidr}` is not an address")
            })?;
            let pool = text(nic, pool_field).map(|p| names.get(&p).cloned().unwrap_or(p));
            out.push(Record {
                address,
                pool,
                network: String::new(),
                namespace: namespace.clone(),
                name: pod.clone(),
                uid: uid.clone(),
                interface: text(nic, "interface"),
                container_id: None,
                owner: owner.clone(),
                source: source.to_string(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
#[path = "spiderpool_tests.rs"]
mod tests;
