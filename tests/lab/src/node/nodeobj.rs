//! The node's own objects, as a kubelet keeps them ("Nodes", "Node heartbeats" in the
//! Kubernetes documentation): the Node (registered once, labels and addresses), its status
//! (conditions with a heartbeat, capacity), and its Lease in `kube-node-lease`, renewed every
//! 10 s (a quarter of the 40 s lease duration), so the node lifecycle controller keeps the node
//! Ready while the stand-in runs and marks it NotReady once it stops renewing.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::events::time_now;

/// Lease duration (kubelet's default `nodeLeaseDurationSeconds`).
const LEASE_SECONDS: i32 = 40;
/// Renewal interval: a quarter of the lease, as the kubelet renews.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// What the node reports about itself.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub name: String,
    pub ipv4: Ipv4Addr,
    pub ipv6: Option<Ipv6Addr>,
}

impl NodeIdentity {
    fn labels(&self) -> BTreeMap<String, String> {
        [
            ("kubernetes.io/hostname", self.name.as_str()),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", ARCH),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", ARCH),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

/// Kubernetes' name for this machine's architecture (GOARCH).
#[cfg(target_arch = "x86_64")]
const ARCH: &str = "amd64";
#[cfg(target_arch = "aarch64")]
const ARCH: &str = "arm64";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCH: &str = std::env::consts::ARCH;

/// Creates the Node if it does not exist (a restarted kubelet finds its own).
pub async fn register(client: &kube::Client, id: &NodeIdentity) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(id.name.clone()),
            labels: Some(id.labels()),
            annotations: Some(
                [("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string())].into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("registering Node {}", id.name)),
    }
}

/// Patches the Node's status: Ready with a fresh heartbeat, addresses, capacity. As a kubelet,
/// the node is NotReady while its container runtime reports no network (`network` is the
/// reason: no CNI configuration yet), so that the node lifecycle controller taints it and only
/// pods tolerating that are scheduled there (a CNI plugin's DaemonSet, which installs the
/// configuration).
pub async fn report_status(
    client: &kube::Client,
    id: &NodeIdentity,
    network: &Result<(), String>,
) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    // A kubelet reads its Node (the Node authorizer allows get, not get of nodes/status).
    let current = nodes.get(&id.name).await?;
    let existing = current
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    let now = time_now();
    let condition = |kind: &str, status: &str, reason: &str, message: &str| -> Value {
        // The transition time moves only when the status does (a node back from Unknown).
        let transition = existing
            .iter()
            .find(|c| c.type_ == kind && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.clone());
        json!({
            "type": kind, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": transition,
        })
    };
    let mut addresses = vec![json!({"type": "InternalIP", "address": id.ipv4.to_string()})];
    if let Some(v6) = id.ipv6 {
        addresses.push(json!({"type": "InternalIP", "address": v6.to_string()}));
    }
    addresses.push(json!({"type": "Hostname", "address": id.name}));
    // Addresses merge by type in a strategic patch, which folds the two InternalIPs into one:
    // the list is replaced whole instead.
    addresses.push(json!({"$patch": "replace"}));
    let resources =
        json!({"cpu": "8", "memory": "32Gi", "pods": "250", "ephemeral-storage": "100Gi"});
    let patch = json!({"status": {
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                      "kubelet has sufficient memory available"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                      "kubelet has no disk pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID",
                      "kubelet has sufficient PID available"),
            match network {
                Ok(()) => condition("Ready", "True", "KubeletReady",
                                    "kubelet is posting ready status"),
                Err(why) => condition("Ready", "False", "KubeletNotReady", &format!(
                    "container runtime network not ready: NetworkReady=false \
                     reason:NetworkPluginNotReady message:Network plugin returns error: {why}")),
            },
        ],
        "addresses": addresses,
        "capacity": resources,
        "allocatable": resources,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": id.name, "systemUUID": id.name, "bootID": boot_id(),
            "kernelVersion": kernel_version(), "osImage": "allot lab node",
            "containerRuntimeVersion": "allot-lab://0.1.0",
            "kubeletVersion": "v1.35.4-allot-lab", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": ARCH,
        },
    }});
    nodes
        .patch_status(&id.name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .with_context(|| format!("updating Node {}'s status", id.name))?;
    Ok(())
}

/// Creates or renews the node's Lease.
pub async fn renew_lease(client: &kube::Client, id: &NodeIdentity) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renew = MicroTime(super::events::now());
    match leases.get_opt(&id.name).await? {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some(id.name.clone());
            spec.lease_duration_seconds = Some(LEASE_SECONDS);
            spec.renew_time = Some(renew);
            leases
                .replace(&id.name, &PostParams::default(), &lease)
                .await
                .with_context(|| format!("renewing Lease kube-node-lease/{}", id.name))?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(id.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(id.name.clone()),
                    lease_duration_seconds: Some(LEASE_SECONDS),
                    renew_time: Some(renew),
                    ..Default::default()
                }),
            };
            leases
                .create(&PostParams::default(), &lease)
                .await
                .with_context(|| format!("creating Lease kube-node-lease/{}", id.name))?;
        }
    }
    Ok(())
}

/// Renews the Lease and reports status every [`RENEW_INTERVAL`], forever; failures are logged
/// and retried at the next beat (an unreachable API server is what the lease is for).
/// Renews the Lease and reports the status every [`RENEW_INTERVAL`], and the status at once
/// when the network's readiness (`network()`) changes, as a kubelet does.
pub async fn heartbeat(
    client: kube::Client,
    id: NodeIdentity,
    network: impl Fn() -> Result<(), String> + Send + 'static,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported: Option<(tokio::time::Instant, Result<(), String>)> = None;
    loop {
        tick.tick().await;
        let now_network = network();
        let due = match &reported {
            None => true,
            Some((at, last)) => at.elapsed() >= RENEW_INTERVAL || *last != now_network,
        };
        if !due {
            continue;
        }
        if let Err(e) = renew_lease(&client, &id).await {
            tracing::warn!("{e:#}");
        }
        match report_status(&client, &id, &now_network).await {
            Ok(()) => reported = Some((tokio::time::Instant::now(), now_network)),
            Err(e) => tracing::warn!("{e:#}"),
        }
    }
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn kernel_version() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
