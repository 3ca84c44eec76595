//! A cluster "running under" another IPAM, for the migration tests: the peers' real CRDs (from
//! their published sources at pinned releases, fetched by `scripts/fetch-peer-crds.sh`), pods
//! given their addresses by real CNI plugins (macvlan and host-local, from ranges inside the
//! peer's pools), and the peer's objects written as that peer writes them, recording exactly
//! the addresses the pods got.

use std::net::IpAddr;
use std::path::PathBuf;

use allot_lab::NodeInfo;
use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::root;

/// `target/peer-crds/<name>`, as setup links it.
pub fn crds_dir(name: &str) -> PathBuf {
    let dir = std::env::var_os("ALLOT_PEER_CRDS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/peer-crds"))
        .join(name);
    assert!(
        dir.join(".complete").exists(),
        "{}: the peers' CRDs are missing: run scripts/setup.sh (scripts/fetch-peer-crds.sh)",
        dir.display()
    );
    dir
}

/// Every CRD file of the peers a migration test applies.
pub fn crd_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for peer in ["spiderpool", "whereabouts", "network-attachment-definition"] {
        let dir = crds_dir(peer);
        let mut yaml: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        yaml.sort();
        files.extend(yaml);
    }
    files
}

/// The node's network before the switch: macvlan on its `eth0` (as allot's chart configures
/// it, so pods on either side share the segment), host-local addresses from the given ranges
/// (each `[subnet, first, last]`), the lab's bridge as gateway. Named to sort before allot's
/// `10-allot.conflist`, so it stays the node's network until it is removed (the switch).
pub fn write_peer_conflist(node: &NodeInfo, v4: (&str, &str), v6: (&str, &str)) -> PathBuf {
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "peer-underlay",
        "plugins": [{
            "type": "macvlan",
            "master": "eth0",
            "mode": "bridge",
            "ipam": {
                "type": "host-local",
                "ranges": [
                    [{"subnet": "198.51.100.0/24", "rangeStart": v4.0, "rangeEnd": v4.1,
                      "gateway": "198.51.100.1"}],
                    [{"subnet": "2001:db8:1ab::/64", "rangeStart": v6.0, "rangeEnd": v6.1,
                      "gateway": "2001:db8:1ab::1"}],
                ],
                "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
            },
        }],
    });
    let path = node.root.join("etc/cni/net.d/05-peer.conflist");
    std::fs::write(&path, serde_json::to_vec_pretty(&conf).unwrap()).unwrap();
    path
}

/// The switch: the peer's network configuration goes, allot's (already written by its agent)
/// is the node's network from the next pod on.
pub fn remove_peer_conflist(node: &NodeInfo) {
    std::fs::remove_file(node.root.join("etc/cni/net.d/05-peer.conflist")).unwrap();
}

/// A pod's IPv4 and IPv6 address.
pub fn addresses(pod: &Pod) -> (IpAddr, IpAddr) {
    let ips = crate::objects::pod_ips(pod);
    let v4 = *ips.iter().find(|ip| ip.is_ipv4()).expect("an IPv4 address");
    let v6 = *ips.iter().find(|ip| ip.is_ipv6()).expect("an IPv6 address");
    (v4, v6)
}

/// The sandbox (container) ID the node's runtime gave `pod`: what Whereabouts records. Read
/// from the node's CNI result cache, which names it with the pod.
pub fn sandbox_id(lab: &allot_lab::LabCluster, pod: &Pod) -> String {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let node = lab.node(&node).unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let ns = pod.metadata.namespace.clone().unwrap();
    crate::sandboxes::sandboxes(std::slice::from_ref(&node), &ns)
        .into_iter()
        .find(|(_, a)| a.pod.uid == uid)
        .map(|(_, a)| a.container_id)
        .expect("the node's cached CNI result of the pod's sandbox")
}

fn api(
    client: &kube::Client,
    kind: allot_k8s::peers::PeerKind,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let r = kind.api_resource();
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &r),
        None => Api::all_with(client.clone(), &r),
    }
}

/// Creates `object` of `kind`, then writes its `status` through the status subresource when the
/// kind has one (as Spiderpool's controller and agents write pool status).
pub async fn create(
    client: &kube::Client,
    kind: allot_k8s::peers::PeerKind,
    object: Value,
) -> Result<()> {
    let ns = object["metadata"]["namespace"].as_str().map(str::to_string);
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    let api = api(client, kind, ns.as_deref());
    let typed: DynamicObject = serde_json::from_value(object.clone())?;
    api.create(&PostParams::default(), &typed)
        .await
        .with_context(|| format!("creating {} {name}", kind.kind))?;
    if kind == allot_k8s::peers::spiderpool::IPPOOL
        && let Some(status) = object.get("status")
    {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .with_context(|| format!("writing {} {name}'s status", kind.kind))?;
    }
    Ok(())
}

/// A SpiderEndpoint as Spiderpool's agent writes it after an allocation
/// (`workloadendpointmanager.PatchIPAllocationResults`): named after the pod, all in `status`,
/// Spiderpool's finalizer, owned by the pod unless a StatefulSet's. A KubeVirt launcher pod's
/// (owner `VirtualMachineInstance`, with its `enableKubevirtStaticIP`) is named after the
/// instance instead, and owned by nothing: it is the VM's record.
pub fn spider_endpoint(
    pod: &Pod,
    owner: (&str, &str),
    v4: (&str, IpAddr, u8),
    v6: (&str, IpAddr, u8),
) -> Value {
    let m = &pod.metadata;
    let vm = owner.0 == "VirtualMachineInstance";
    let name = if vm {
        Some(owner.1.to_string())
    } else {
        m.name.clone()
    };
    let mut e = json!({
        "apiVersion": "spiderpool.spidernet.io/v2beta1",
        "kind": "SpiderEndpoint",
        "metadata": {
            "name": name, "namespace": m.namespace,
            "finalizers": ["spiderpool.spidernet.io"],
        },
        "status": {
            "current": {
                "uid": m.uid,
                "node": pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                "ips": [{
                    "interface": "eth0",
                    "ipv4": format!("{}/{}", v4.1, v4.2), "ipv4Pool": v4.0,
                    "ipv4Gateway": "198.51.100.1",
                    "ipv6": format!("{}/{}", v6.1, v6.2), "ipv6Pool": v6.0,
                    "ipv6Gateway": "2001:db8:1ab::1",
                    "vlan": 0, "cleanGateway": false,
                }],
            },
            "ownerControllerType": owner.0,
            "ownerControllerName": owner.1,
        },
    });
    if owner.0 != "StatefulSet" && !vm {
        e["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "v1", "kind": "Pod", "name": m.name, "uid": m.uid,
            "controller": false, "blockOwnerDeletion": false,
        }]);
    }
    e
}
