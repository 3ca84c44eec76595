//! The sandboxes the nodes' runtimes have networked and not yet torn down, read from each
//! node's CNI result cache (kept as containerd keeps it): what answers on the underlay,
//! whichever IPAM gave the addresses. The failure tests assert on it; the benchmark samples it
//! for every IPAM.

use std::collections::BTreeMap;
use std::net::IpAddr;

use allot_lab::NodeInfo;
use allot_lab::node::cni::Attachment;

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
            let Ok(attachment) = serde_json::from_slice::<Attachment>(&bytes) else {
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
    use allot_lab::node::cni::PodRef;
    use serde_json::json;

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
