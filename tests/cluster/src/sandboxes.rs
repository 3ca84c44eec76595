//! The sandboxes the nodes' runtimes have networked and not yet torn down, read from each
//! node's CNI result cache: what answers on the underlay, whichever IPAM gave the addresses.
//! The failure tests assert on it; the benchmark samples it for every IPAM.
//!
//! A real node's containerd keeps the cache as libcni writes it
//! (`/var/lib/cni/results/<network>-<container>-<interface>`: `{"kind": "cniCacheV1",
//! "containerId", "ifName", "networkName", "cniArgs": [[key, value], …], "result"}`, libcni's
//! `api.go`), which [`from_libcni`] reads; a stand-in node writes the same place in a shape of
//! its own.

use std::collections::BTreeMap;
use std::net::IpAddr;

use allot_lab::NodeInfo;
use allot_lab::node::cni::{Attachment, PodRef};
use serde_json::Value;

/// A libcni cache entry as an attachment (without the network namespace, which libcni does
/// not keep), or None when `entry` is not one.
pub fn from_libcni(entry: &Value) -> Option<Attachment> {
    // containerd sets up each sandbox's `lo` through libcni too (the network "cni-loopback",
    // 127.0.0.1 and ::1 in every sandbox): not an address anyone allots.
    if entry["kind"] != "cniCacheV1" || entry["networkName"] == "cni-loopback" {
        return None;
    }
    let arg = |key: &str| -> Option<String> {
        entry["cniArgs"].as_array()?.iter().find_map(|pair| {
            let pair = pair.as_array()?;
            (pair.first()?.as_str()? == key).then(|| pair.get(1)?.as_str().map(str::to_string))?
        })
    };
    Some(Attachment {
        container_id: entry["containerId"].as_str()?.to_string(),
        netns: Default::default(),
        pod: PodRef {
            namespace: arg("K8S_POD_NAMESPACE")?,
            name: arg("K8S_POD_NAME")?,
            uid: arg("K8S_POD_UID").unwrap_or_default(),
        },
        network: serde_json::json!({"name": entry["networkName"]}),
        result: entry["result"].clone(),
    })
}

/// Every sandbox of namespace `ns` on `nodes`, with its node.
pub fn sandboxes(nodes: &[NodeInfo], ns: &str) -> Vec<(String, Attachment)> {
    let mut out = Vec::new();
    for node in nodes {
        let dir = node.root.join("var/lib/cni/results");
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(bytes) = std::fs::read(entry.path()) else {
                continue;
            };
            // A result being written reads short; the next look sees it whole.
            let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
                continue;
            };
            let Some(attachment) =
                from_libcni(&value).or_else(|| serde_json::from_value::<Attachment>(value).ok())
            else {
                continue;
            };
            if attachment.pod.namespace == ns {
                out.push((node.name.clone(), attachment));
            }
        }
    }
    out
}

/// An address configured in the sandboxes of two pods (two UIDs) at once.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shared {
    pub address: IpAddr,
    /// Each pod as `name (uid) on node`.
    pub pods: [String; 2],
}

impl std::fmt::Display for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} answers in two sandboxes: pod {} and pod {}",
            self.address, self.pods[0], self.pods[1]
        )
    }
}

/// The addresses that `sandboxes` configure in two pods at once.
pub fn shared_addresses(sandboxes: &[(String, Attachment)]) -> Vec<Shared> {
    let mut seen: BTreeMap<IpAddr, (&str, &Attachment)> = BTreeMap::new();
    let mut shared = Vec::new();
    let describe = |node: &str, a: &Attachment| format!("{} ({}) on {node}", a.pod.name, a.pod.uid);
    for (node, a) in sandboxes {
        for ip in a.pod_ips() {
            match seen.get(&ip) {
                Some((first_node, first)) if first.pod.uid != a.pod.uid => shared.push(Shared {
                    address: ip,
                    pods: [describe(first_node, first), describe(node, a)],
                }),
                Some(_) => {}
                None => {
                    seen.insert(ip, (node, a));
                }
            }
        }
    }
    shared
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_libcni_cache_entry_reads_as_its_pods_attachment() {
        let entry = json!({
            "kind": "cniCacheV1", "containerId": "abc", "ifName": "eth0",
            "networkName": "allot-underlay", "config": "e30=",
            "cniArgs": [["IgnoreUnknown", "1"], ["K8S_POD_NAMESPACE", "web"],
                        ["K8S_POD_NAME", "web-0"], ["K8S_POD_INFRA_CONTAINER_ID", "abc"],
                        ["K8S_POD_UID", "u1"]],
            "result": {"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.130/24"}]},
        });
        let a = from_libcni(&entry).unwrap();
        assert_eq!(
            (a.pod.namespace.as_str(), a.pod.name.as_str()),
            ("web", "web-0")
        );
        assert_eq!(a.pod.uid, "u1");
        assert_eq!(a.pod_ips(), ["198.51.100.130".parse::<IpAddr>().unwrap()]);
        assert!(from_libcni(&json!({"container_id": "x"})).is_none());
        let mut lo = entry.clone();
        lo["networkName"] = json!("cni-loopback");
        assert!(
            from_libcni(&lo).is_none(),
            "every sandbox's lo is nobody's address"
        );
    }

    fn sandbox(node: &str, pod: &str, uid: &str, ips: &[&str]) -> (String, Attachment) {
        let ips: Vec<_> = ips.iter().map(|ip| json!({"address": ip})).collect();
        let attachment = Attachment {
            container_id: format!("c-{uid}"),
            netns: "/run/netns/x".into(),
            pod: PodRef {
                namespace: "n".into(),
                name: pod.into(),
                uid: uid.into(),
            },
            network: json!({}),
            result: json!({"ips": ips}),
        };
        (node.into(), attachment)
    }

    #[test]
    fn an_address_in_two_pods_sandboxes_is_reported_once_per_pair() {
        let sandboxes = [
            sandbox("a", "web-0", "u1", &["192.0.2.1/24", "2001:db8::1/64"]),
            // The same pod's sandbox seen twice (a retried ADD): not two pods.
            sandbox("a", "web-0", "u1", &["192.0.2.1/24"]),
            sandbox("b", "web-0", "u2", &["192.0.2.1/24"]),
            sandbox("b", "web-1", "u3", &["192.0.2.3/24", "2001:db8::3/64"]),
        ];
        let shared = shared_addresses(&sandboxes);
        assert_eq!(shared.len(), 1, "{shared:?}");
        assert_eq!(
            shared[0].to_string(),
            "192.0.2.1 answers in two sandboxes: pod web-0 (u1) on a and pod web-0 (u2) on b"
        );
        assert!(shared_addresses(&sandboxes[..2]).is_empty());
    }
}
