//! Which Multus network an interface of a pod belongs to, read from the pod's annotations the
//! way Multus reads them: `k8s.v1.cni.cncf.io/networks` (a comma-separated list of
//! `[namespace/]name[@interface]`, or a JSON list of `{name, namespace, interface}`) names the
//! additional networks, which get `net1`, `net2`, … in list order unless they name their
//! interface; `v1.multus-cni.io/default-network` overrides the cluster network of `eth0`.
//! A network without a namespace is in the pod's.

use allot_core::migrate::PodAddress;
use allot_k8s::openapi::api::core::v1::Pod;
use serde_json::Value;

pub const NETWORKS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/networks";
/// What Multus writes back on a pod: a JSON list of `{name, interface, ips, mac, default}`, one
/// per network it attached (Network Plumbing Working Group's specification, section 4.1.2).
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";
pub const DEFAULT_NETWORK_ANNOTATION: &str = "v1.multus-cni.io/default-network";
/// The interface Multus gives the cluster's default network.
pub const DEFAULT_INTERFACE: &str = "eth0";

/// One entry of the networks annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkSelection {
    /// `namespace/name`.
    pub network: String,
    pub interface: String,
}

/// Why a Multus annotation names no networks; each says which `annotation` and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum NetworksError {
    #[error("{annotation} is not a JSON list: {source}")]
    NotJson {
        annotation: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// An entry of the JSON list without a name (the entry, as JSON).
    #[error("{annotation}: an entry without a name: {entry}")]
    NoName {
        annotation: &'static str,
        entry: String,
    },
    #[error("{annotation}: `{item}` is not [namespace/]name[@interface]")]
    Malformed {
        annotation: &'static str,
        item: String,
    },
}

/// The additional networks of a pod, in order, with their interfaces.
pub fn selections(
    annotation: &str,
    pod_namespace: &str,
) -> Result<Vec<NetworkSelection>, NetworksError> {
    let trimmed = annotation.trim();
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    let entries: Vec<(String, Option<String>, Option<String>)> = if trimmed.starts_with('[') {
        let list: Vec<Value> =
            serde_json::from_str(trimmed).map_err(|source| NetworksError::NotJson {
                annotation: NETWORKS_ANNOTATION,
                source,
            })?;
        list.iter()
            .map(|v| {
                let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
                let name = field("name").filter(|n| !n.is_empty()).ok_or_else(|| {
                    NetworksError::NoName {
                        annotation: NETWORKS_ANNOTATION,
                        entry: v.to_string(),
                    }
                })?;
                Ok((name, field("namespace"), field("interface")))
            })
            .collect::<Result<_, NetworksError>>()?
    } else {
        trimmed
            .split(',')
            .map(|item| parse_short(NETWORKS_ANNOTATION, item.trim()))
            .collect::<Result<_, NetworksError>>()?
    };
    Ok(entries
        .into_iter()
        .enumerate()
        .map(|(i, (name, namespace, interface))| NetworkSelection {
            network: format!(
                "{}/{name}",
                namespace
                    .filter(|n| !n.is_empty())
                    .as_deref()
                    .unwrap_or(pod_namespace)
            ),
            interface: interface
                .filter(|i| !i.is_empty())
                .unwrap_or_else(|| format!("net{}", i + 1)),
        })
        .collect())
}

/// `[namespace/]name[@interface]`, an item of `annotation`.
fn parse_short(
    annotation: &'static str,
    item: &str,
) -> Result<(String, Option<String>, Option<String>), NetworksError> {
    let (rest, interface) = match item.split_once('@') {
        Some((rest, interface)) => (rest, Some(interface.to_string())),
        None => (item, None),
    };
    let (namespace, name) = match rest.split_once('/') {
        Some((ns, name)) => (Some(ns.to_string()), name),
        None => (None, rest),
    };
    let valid = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    };
    if !valid(name)
        || namespace.as_deref().is_some_and(|n| !valid(n))
        || interface.as_deref().is_some_and(|i| !valid(i))
    {
        return Err(NetworksError::Malformed {
            annotation,
            item: item.to_string(),
        });
    }
    Ok((name.to_string(), namespace, interface))
}

/// The Multus network (`namespace/name`) of `interface`, or "" when the pod's annotations do not
/// say (the cluster's default network without an override, or no Multus at all).
pub fn network_of(
    annotations: &std::collections::BTreeMap<String, String>,
    pod_namespace: &str,
    interface: &str,
) -> Result<String, NetworksError> {
    if let Some(list) = annotations.get(NETWORKS_ANNOTATION) {
        let found = selections(list, pod_namespace)?
            .into_iter()
            .find(|s| s.interface == interface);
        if let Some(s) = found {
            return Ok(s.network);
        }
    }
    if interface == DEFAULT_INTERFACE
        && let Some(default) = annotations.get(DEFAULT_NETWORK_ANNOTATION)
    {
        let (name, namespace, _) = parse_short(DEFAULT_NETWORK_ANNOTATION, default.trim())?;
        return Ok(format!(
            "{}/{name}",
            namespace.as_deref().unwrap_or(pod_namespace)
        ));
    }
    Ok(String::new())
}

/// Every address a pod reports, with its interface: `status.podIPs` (the default network's,
/// on `eth0`, where a runtime puts the pod's first interface) and each entry of Multus's
/// network status. An address both name is listed once, with the interface the network status
/// gives; a malformed network status is skipped (the pod still reports its `podIPs`).
pub fn pod_addresses(pod: &Pod) -> Vec<PodAddress> {
    let mut out: Vec<PodAddress> = Vec::new();
    let status = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NETWORK_STATUS_ANNOTATION))
        .and_then(|s| serde_json::from_str::<Vec<Value>>(s).ok())
        .unwrap_or_default();
    for entry in &status {
        let interface = entry
            .get("interface")
            .and_then(Value::as_str)
            .filter(|i| !i.is_empty())
            .map(str::to_string);
        let ips = entry.get("ips").and_then(Value::as_array);
        for ip in ips.into_iter().flatten().filter_map(Value::as_str) {
            if let Ok(address) = ip.split('/').next().unwrap_or(ip).parse()
                && !out.iter().any(|a| a.address == address)
            {
                out.push(PodAddress {
                    address,
                    interface: interface.clone(),
                });
            }
        }
    }
    let status = pod.status.as_ref();
    let pod_ips = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|ip| ip.ip.as_str())
        .chain(status.and_then(|s| s.pod_ip.as_deref()));
    for ip in pod_ips {
        if let Ok(address) = ip.parse()
            && !out.iter().any(|a| a.address == address)
        {
            out.push(PodAddress {
                address,
                interface: Some(DEFAULT_INTERFACE.to_string()),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn short_form_numbers_interfaces_from_net1_in_list_order() {
        let a = annotations(&[(NETWORKS_ANNOTATION, "macvlan-a, infra/macvlan-b@storage, c")]);
        assert_eq!(network_of(&a, "web", "net1").unwrap(), "web/macvlan-a");
        assert_eq!(network_of(&a, "web", "storage").unwrap(), "infra/macvlan-b");
        // The third entry is net3 although the second named its interface.
        assert_eq!(network_of(&a, "web", "net3").unwrap(), "web/c");
        assert_eq!(network_of(&a, "web", "net2").unwrap(), "");
        assert_eq!(network_of(&a, "web", "eth0").unwrap(), "");
    }

    #[test]
    fn json_form_with_namespaces_and_interfaces() {
        let a = annotations(&[(
            NETWORKS_ANNOTATION,
            r#"[{"name":"underlay","namespace":"kube-system","interface":"eth1"},{"name":"b"}]"#,
        )]);
        assert_eq!(
            network_of(&a, "web", "eth1").unwrap(),
            "kube-system/underlay"
        );
        assert_eq!(network_of(&a, "web", "net2").unwrap(), "web/b");
    }

    #[test]
    fn the_default_network_annotation_names_eth0s_network() {
        let a = annotations(&[(DEFAULT_NETWORK_ANNOTATION, "kube-system/macvlan-underlay")]);
        assert_eq!(
            network_of(&a, "web", "eth0").unwrap(),
            "kube-system/macvlan-underlay"
        );
        let a = annotations(&[(DEFAULT_NETWORK_ANNOTATION, "underlay")]);
        assert_eq!(network_of(&a, "web", "eth0").unwrap(), "web/underlay");
        assert_eq!(network_of(&a, "web", "net1").unwrap(), "");
    }

    #[test]
    fn a_pods_addresses_come_from_its_pod_ips_and_the_network_status() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"annotations": {NETWORK_STATUS_ANNOTATION: r#"[
                {"name":"kube-system/cluster","interface":"eth0","ips":["10.244.1.5"],"default":true},
                {"name":"web/underlay","interface":"net1","ips":["192.0.2.10","2001:db8::10"]}]"#}},
            "status": {"podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}, {"ip": "fd00::5"}]}
        }))
        .unwrap();
        let got: Vec<(String, Option<String>)> = pod_addresses(&pod)
            .into_iter()
            .map(|a| (a.address.to_string(), a.interface))
            .collect();
        let on = |i: &str| Some(i.to_string());
        assert_eq!(
            got,
            [
                ("10.244.1.5".to_string(), on("eth0")),
                ("192.0.2.10".to_string(), on("net1")),
                ("2001:db8::10".to_string(), on("net1")),
                ("fd00::5".to_string(), on("eth0")),
            ]
        );
        let mut broken = pod.clone();
        broken
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(NETWORK_STATUS_ANNOTATION.into(), "[{".into());
        assert_eq!(pod_addresses(&broken).len(), 2, "podIPs still count");
    }

    #[test]
    fn malformed_annotations_say_what_is_wrong() {
        for bad in ["[{\"namespace\":\"x\"}]", "[1,", "a b", "ns/", "x@"] {
            let a = annotations(&[(NETWORKS_ANNOTATION, bad)]);
            let err = network_of(&a, "web", "net1").unwrap_err().to_string();
            assert!(err.contains(NETWORKS_ANNOTATION), "{bad}: {err}");
        }
        let a = annotations(&[(DEFAULT_NETWORK_ANNOTATION, "a/b/c")]);
        let err = network_of(&a, "web", "eth0").unwrap_err();
        assert!(
            matches!(
                &err,
                NetworksError::Malformed { annotation, item }
                    if *annotation == DEFAULT_NETWORK_ANNOTATION && item == "a/b/c"
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!("{DEFAULT_NETWORK_ANNOTATION}: `a/b/c` is not [namespace/]name[@interface]")
        );
    }
}
