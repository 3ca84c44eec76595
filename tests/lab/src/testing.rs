//! Helpers for tests on a lab cluster: starting one (or skipping, only when `ALLOT_LAB_SKIP`
//! says so), waiting for what a user would wait for, images of the machine's own programs,
//! CNI configurations on a node.

use std::fmt::Debug;
use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;

use crate::{ClusterOptions, LabCluster, NodeInfo};

/// Starts a cluster of `nodes` nodes for test `test` in a temporary directory, waiting (up to
/// 20 minutes) for another lab on this machine to end; None (after saying why) when
/// `ALLOT_LAB_SKIP` is set. Missing root or tools fail the test: they are not reasons to skip.
pub async fn start(
    test: &str,
    nodes: usize,
    node_binary: &str,
    tune: impl FnOnce(&mut ClusterOptions),
) -> Option<LabCluster> {
    if let Some(why) = crate::skip_reason() {
        println!("SKIP: {test}: {why}");
        return None;
    }
    // An empty directory the lab takes as its own (its teardown removes it).
    let dir = tempfile::Builder::new()
        .prefix("allot-lab-test-")
        .tempdir()
        .expect("a temporary directory")
        .keep();
    let mut options = ClusterOptions::new(dir);
    options.nodes = nodes;
    options.node_binary = PathBuf::from(node_binary);
    options.lock_wait = Duration::from_secs(20 * 60);
    tune(&mut options);
    let started = Instant::now();
    let lab = LabCluster::start(options)
        .await
        .unwrap_or_else(|e| panic!("{test}: starting the lab cluster: {e:#}"));
    println!(
        "{test}: lab cluster with {nodes} node(s) up in {:.1?}",
        started.elapsed()
    );
    Some(lab)
}

/// Polls `check` until it returns Some, every 200 ms, failing after `timeout` with `what` and
/// the last value seen.
pub async fn wait_for<T, S: Debug, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, S>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if Instant::now() > deadline => {
                panic!("{what}: not within {timeout:?}; last seen: {last:?}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Writes an image into `dir` whose files are the machine's own (its root stands in for the
/// image's base) and whose entrypoint is `/bin/sh -c`, running as `user`.
pub fn shell_image(dir: &Path, user: &str) -> Result<PathBuf> {
    fs::create_dir_all(dir.join("rootfs/etc/lab"))?;
    fs::write(dir.join("rootfs/etc/lab/image"), "the lab's shell image\n")?;
    let config = json!({
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ["sleep infinity"],
        "User": user,
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    });
    fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    Ok(dir.to_path_buf())
}

/// Writes a network configuration list on `node`: Debian's bridge plugin on bridge `bridge`
/// with host-local addresses from `subnet` between `start` and `end`.
pub fn bridge_conflist(
    node: &NodeInfo,
    file: &str,
    network: &str,
    bridge: &str,
    subnet: &str,
    (start, end): (&str, &str),
) -> Result<PathBuf> {
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet, "rangeStart": start, "rangeEnd": end}]],
            },
        }],
    });
    let path = node.root.join("etc/cni/net.d").join(file);
    fs::write(&path, serde_json::to_vec_pretty(&conf)?)?;
    Ok(path)
}

/// The pods matching `selector` in `ns`.
pub async fn pods(client: &kube::Client, ns: &str, selector: &str) -> Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    Ok(api
        .list(&ListParams::default().labels(selector))
        .await?
        .items)
}

/// The status of condition `kind` of a pod.
pub fn condition(pod: &Pod, kind: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.clone())
}

/// Where the node of `pod` keeps the log of its container `container`: the kubelet's
/// `/var/log/pods/<ns>_<pod>_<uid>/<container>/<restarts>.log` (its latest run) on a real node,
/// `…/<container>.log` on a stand-in.
pub fn container_log(lab: &LabCluster, pod: &Pod, container: &str) -> Result<PathBuf> {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .context("the pod is not bound to a node")?;
    let node = lab.node(&node)?;
    let dir = node.root.join(format!(
        "var/log/pods/{}_{}_{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    ));
    if node.kind == crate::NodeKind::StandIn {
        return Ok(dir.join(format!("{container}.log")));
    }
    let runs = dir.join(container);
    let latest = std::fs::read_dir(&runs)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            Some((name.strip_suffix(".log")?.parse::<u32>().ok()?, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p);
    Ok(latest.unwrap_or_else(|| runs.join("0.log")))
}

/// The pods' network namespaces on `nodes`: on a real node, those containerd pinned in its
/// `/run/netns` (a file each, on the node's own directory); on a stand-in, the lab's in the
/// machine's `/run/netns` that are not a node's.
pub fn pod_namespaces(nodes: &[crate::NodeInfo]) -> Vec<String> {
    let mut out = Vec::new();
    for node in nodes {
        if node.kind == crate::NodeKind::Real {
            let pins = std::fs::read_dir(node.root.join("run/netns"))
                .into_iter()
                .flatten();
            out.extend(
                pins.flatten()
                    .filter_map(|e| e.file_name().into_string().ok()),
            );
        }
    }
    if nodes.iter().any(|n| n.kind == crate::NodeKind::StandIn) {
        out.extend(
            crate::net::lab_namespaces()
                .into_iter()
                .filter(|n| !n.contains("-node-")),
        );
    }
    out
}

/// Applies a YAML document (one object) with the admin client: created, or replaced.
pub async fn apply_yaml(client: &kube::Client, yaml: &str) -> Result<()> {
    let value: serde_json::Value = serde_yaml::from_str(yaml)?;
    let obj: kube::api::DynamicObject = serde_json::from_value(value)?;
    let types = obj.types.clone().context("apiVersion and kind")?;
    let gvk = kube::api::GroupVersionKind::try_from(&types)?;
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
    let api: Api<kube::api::DynamicObject> = match (caps.scope, obj.metadata.namespace.as_deref()) {
        (kube::discovery::Scope::Namespaced, ns) => {
            Api::namespaced_with(client.clone(), ns.unwrap_or("default"), &resource)
        }
        (kube::discovery::Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    };
    let name = obj.metadata.name.clone().context("metadata.name")?;
    let params = kube::api::PatchParams::apply("allot-lab-test").force();
    api.patch(&name, &params, &kube::api::Patch::Apply(&obj))
        .await
        .with_context(|| format!("applying {} {name}", types.kind))?;
    Ok(())
}

/// Fails unless the file at `path` comes to contain `text` within `timeout`.
pub async fn wait_for_text(path: &Path, text: &str, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let content = fs::read_to_string(path).unwrap_or_default();
        if content.contains(text) {
            return Ok(content);
        }
        if Instant::now() > deadline {
            bail!(
                "{} does not contain {text:?} after {timeout:?}:\n{content}",
                path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A client authenticated as ServiceAccount `ns/name`, with a token from the TokenRequest
/// API (what a pod of that account presents).
pub async fn service_account_client(
    lab: &LabCluster,
    ns: &str,
    name: &str,
) -> Result<kube::Client> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let admin = lab.client().await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin, ns);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = accounts
        .create_token_request(name, &Default::default(), &request)
        .await?
        .status
        .context("a TokenRequest without status")?
        .token;
    let info = lab.info();
    let path = info
        .dir
        .join(format!("kubeconfigs/sa-{ns}-{name}.kubeconfig"));
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": info.server, "certificate-authority": info.ca}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": name}}],
        "current-context": "lab",
    });
    fs::write(&path, serde_yaml::to_string(&config)?)?;
    crate::kube_client(&path).await
}

/// Writes the lab's underlay network configuration on `node` (the `index`-th, 1-based):
/// macvlan on the node's `eth0`, host-local addresses of 198.51.100.128/25 (twenty per node,
/// from .130), the bridge's address as gateway. Pods are on the lab's L2 segment and reach the
/// API server directly; as with any macvlan, not their own node's address.
pub fn macvlan_conflist(node: &NodeInfo, index: usize) -> Result<PathBuf> {
    let first = 110 + 20 * index;
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "underlay",
        "plugins": [{
            "type": "macvlan",
            "master": "eth0",
            "mode": "bridge",
            "ipam": {
                "type": "host-local",
                "ranges": [[{
                    "subnet": "198.51.100.0/24",
                    "rangeStart": format!("198.51.100.{first}"),
                    "rangeEnd": format!("198.51.100.{}", first + 19),
                    "gateway": crate::net::HOST_IPV4.to_string(),
                }]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    });
    let path = node.root.join("etc/cni/net.d/10-underlay.conflist");
    fs::write(&path, serde_json::to_vec_pretty(&conf)?)?;
    Ok(path)
}
