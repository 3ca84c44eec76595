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

/// A Deployment or StatefulSet of busybox pods labelled `app: <name>`, as YAML for kubectl:
/// what the tests start pods with, with only what a test cares about set.
#[derive(Clone, Debug)]
pub struct Workload {
    kind: &'static str,
    namespace: String,
    name: String,
    replicas: u32,
    annotations: Vec<(String, String)>,
    spread: Option<&'static str>,
    grace_seconds: Option<u32>,
    spec_extra: String,
    pod_spec_extra: String,
}

impl Workload {
    /// A Deployment.
    pub fn deployment(namespace: &str, name: &str, replicas: u32) -> Self {
        Self::new("Deployment", namespace, name, replicas)
    }

    /// A StatefulSet whose pods start and stop all at once (`podManagementPolicy: Parallel`).
    pub fn statefulset(namespace: &str, name: &str, replicas: u32) -> Self {
        Self::new("StatefulSet", namespace, name, replicas)
    }

    fn new(kind: &'static str, namespace: &str, name: &str, replicas: u32) -> Self {
        Workload {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
            replicas,
            annotations: Vec::new(),
            spread: None,
            grace_seconds: None,
            spec_extra: String::new(),
            pod_spec_extra: String::new(),
        }
    }

    /// An annotation of the pods.
    pub fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.to_string(), value.to_string()));
        self
    }

    /// The pools the pods name (allot's `ipam.allot.dev/ippool` annotation, JSON).
    pub fn pools(self, json: &str) -> Self {
        self.annotate("ipam.allot.dev/ippool", json)
    }

    /// One pod per node as far as the scheduler can (`whenUnsatisfiable`: `ScheduleAnyway`, or
    /// `DoNotSchedule` to leave pods Pending rather than put two on a node).
    pub fn spread(mut self, when_unsatisfiable: &'static str) -> Self {
        self.spread = Some(when_unsatisfiable);
        self
    }

    /// The pods' `terminationGracePeriodSeconds` (busybox ignores SIGTERM: tests use 1).
    pub fn grace(mut self, seconds: u32) -> Self {
        self.grace_seconds = Some(seconds);
        self
    }

    /// More fields of the workload's `spec` (YAML, each line indented by two spaces).
    pub fn spec(mut self, yaml: &str) -> Self {
        self.spec_extra.push_str(yaml);
        self
    }

    /// More fields of the pods' `spec` (YAML, each line indented by six spaces).
    pub fn pod_spec(mut self, yaml: &str) -> Self {
        self.pod_spec_extra.push_str(yaml);
        self
    }

    pub fn yaml(&self) -> String {
        let Workload {
            kind,
            namespace,
            name,
            replicas,
            ..
        } = self;
        let mut y = format!(
            "apiVersion: apps/v1\nkind: {kind}\nmetadata: {{name: {name}, namespace: {namespace}}}\n\
             spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n"
        );
        if *kind == "StatefulSet" {
            y.push_str(&format!(
                "  serviceName: {name}\n  podManagementPolicy: Parallel\n"
            ));
        }
        y.push_str(&self.spec_extra);
        y.push_str(&format!(
            "  template:\n    metadata:\n      labels: {{app: {name}}}\n"
        ));
        if !self.annotations.is_empty() {
            y.push_str("      annotations:\n");
            for (key, value) in &self.annotations {
                // A single-quoted YAML scalar: JSON's double quotes stand as they are.
                y.push_str(&format!("        {key}: '{}'\n", value.replace('\'', "''")));
            }
        }
        y.push_str("    spec:\n");
        if let Some(seconds) = self.grace_seconds {
            y.push_str(&format!("      terminationGracePeriodSeconds: {seconds}\n"));
        }
        if let Some(when) = self.spread {
            y.push_str(&format!(
                "      topologySpreadConstraints:\n        - {{maxSkew: 1, topologyKey: \
                 kubernetes.io/hostname, whenUnsatisfiable: {when},\n            \
                 labelSelector: {{matchLabels: {{app: {name}}}}}}}\n"
            ));
        }
        y.push_str(&self.pod_spec_extra);
        y.push_str("      containers: [{name: c, image: busybox, command: [sleep, \"3600\"]}]\n");
        y
    }
}

#[cfg(test)]
mod tests {
    use super::Workload;
    use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};

    #[test]
    fn a_workload_is_an_object_kubectl_reads() {
        let y = Workload::statefulset("ns", "db", 2)
            .pools(r#"{"ipv4":["a"]}"#)
            .annotate("note", "it's")
            .grace(1)
            .spread("ScheduleAnyway")
            .pod_spec("      nodeSelector: {kubernetes.io/hostname: node-3}\n")
            .yaml();
        let set: StatefulSet = serde_yaml::from_str(&y).expect(&y);
        let spec = set.spec.unwrap();
        assert_eq!(set.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(spec.replicas, Some(2));
        assert_eq!(spec.service_name.as_deref(), Some("db"));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        let template = spec.template;
        let annotations = template.metadata.unwrap().annotations.unwrap();
        assert_eq!(annotations["ipam.allot.dev/ippool"], r#"{"ipv4":["a"]}"#);
        assert_eq!(annotations["note"], "it's");
        let pod = template.spec.unwrap();
        assert_eq!(pod.termination_grace_period_seconds, Some(1));
        let spread = &pod.topology_spread_constraints.unwrap()[0];
        assert_eq!(spread.when_unsatisfiable, "ScheduleAnyway");
        assert_eq!(
            pod.node_selector.unwrap()["kubernetes.io/hostname"],
            "node-3"
        );
        assert_eq!(pod.containers[0].image.as_deref(), Some("busybox"));

        let y = Workload::deployment("ns", "web", 3)
            .spec("  strategy: {rollingUpdate: {maxSurge: 0, maxUnavailable: 1}}\n")
            .yaml();
        let d: Deployment = serde_yaml::from_str(&y).expect(&y);
        let spec = d.spec.unwrap();
        let rolling = spec.strategy.unwrap().rolling_update.unwrap();
        assert!(rolling.max_surge.is_some());
        assert!(spec.template.metadata.unwrap().annotations.is_none());
    }
}
