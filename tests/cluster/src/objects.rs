//! What a user reads back: a pod's addresses, its allot Endpoint, the claims in the IPBlocks,
//! a pool's counts; and the objects a test writes (pools, workloads).

use std::collections::BTreeMap;
use std::net::IpAddr;

use allot_k8s::{Endpoint, IPBlock, IPPool};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

/// A pod's addresses (`status.podIPs`), sorted.
pub fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect();
    ips.sort();
    ips
}

/// The addresses allot's Endpoint of `ns/name` records (every interface), sorted; empty when
/// there is none.
pub async fn endpoint_ips(client: &kube::Client, ns: &str, name: &str) -> Vec<IpAddr> {
    let api: Api<Endpoint> = Api::namespaced(client.clone(), ns);
    let Some(ep) = api.get_opt(name).await.unwrap() else {
        return Vec::new();
    };
    let mut ips: Vec<IpAddr> = ep
        .spec
        .interfaces
        .iter()
        .flat_map(|i| [i.ipv4.clone(), i.ipv6.clone()])
        .flatten()
        .filter_map(|cidr| cidr.split('/').next()?.parse().ok())
        .collect();
    ips.sort();
    ips
}

/// One claim as the IPBlocks hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub pool: String,
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub node: String,
    /// Attached (held by a sandbox), or kept for a StatefulSet pod.
    pub attached: bool,
}

/// Every claim in the cluster's IPBlocks, by address.
pub async fn claims(client: &kube::Client) -> BTreeMap<IpAddr, Held> {
    let api: Api<IPBlock> = Api::all(client.clone());
    let mut out = BTreeMap::new();
    for block in api.list(&ListParams::default()).await.unwrap() {
        for (address, c) in block.spec.claims {
            let Ok(address) = address.parse() else {
                continue;
            };
            out.insert(
                address,
                Held {
                    pool: c.pool,
                    namespace: c.namespace,
                    pod: c.pod,
                    uid: c.uid,
                    node: c.node,
                    attached: c.container_id.is_some(),
                },
            );
        }
    }
    out
}

/// The claims of pods of namespace `ns`.
pub async fn claims_in(client: &kube::Client, ns: &str) -> BTreeMap<IpAddr, Held> {
    let mut all = claims(client).await;
    all.retain(|_, h| h.namespace == ns);
    all
}

/// An IPPool's `status.allocatedIPCount` and `totalIPCount`, as `kubectl get ippools` shows them.
pub async fn pool_counts(client: &kube::Client, pool: &str) -> Option<(u64, u64)> {
    let api: Api<IPPool> = Api::all(client.clone());
    let status = api.get_opt(pool).await.unwrap()?.status?;
    Some((status.allocated_ip_count?, status.total_ip_count?))
}

/// An IPPool of `v4` addresses (a range) and `v6` addresses, given only to pods that name it
/// (not a default pool), as YAML for kubectl.
pub fn pool_yaml(name: &str, subnet: &str, gateway: &str, ips: &str) -> String {
    format!(
        "apiVersion: allot.dev/v1alpha1\nkind: IPPool\nmetadata:\n  name: {name}\nspec:\n  \
         subnet: {subnet}\n  gateway: {gateway}\n  ips: [\"{ips}\"]\n"
    )
}

/// The annotation that names pools for a pod (allot's prefix).
pub fn pools_annotation(v4: &str, v6: &str) -> String {
    format!(r#"{{"ipv4":["{v4}"],"ipv6":["{v6}"]}}"#)
}
