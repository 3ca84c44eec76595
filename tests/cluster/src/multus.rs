//! Multus in front of allot, installed as its users install it: Multus's own thin-plugin
//! DaemonSet manifest (`deployments/multus-daemonset.yml` of the pinned version, which
//! `scripts/build-upstream.sh` keeps beside the binaries), applied as published (the lab's
//! registry serves the image it names, built from the same version). Its entrypoint writes
//! `00-multus.conflist` on each node, delegating to the first configuration it finds there
//! (allot's conflist), and a kubeconfig from its ServiceAccount; the
//! plugin then attaches a pod's `k8s.v1.cni.cncf.io/networks` through their
//! NetworkAttachmentDefinitions and writes the pod's `network-status` annotation.

use std::time::Duration;

use allot_lab::testing::wait_for;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::Api;

use crate::Suite;

/// Installs Multus and waits until it runs on every node.
pub async fn install(s: &Suite) {
    let path = allot_lab::paths::tools_dir().join("multus-daemonset.yml");
    let manifest = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}: run scripts/build-upstream.sh", path.display()));
    assert!(
        manifest.contains(allot_lab::images::MULTUS_MANIFEST_IMAGE),
        "{}: the image it names moved",
        path.display()
    );
    s.must(
        "kubectl",
        &["apply", "-f", path.to_str().expect("a UTF-8 path")],
    );
    let daemonsets: Api<DaemonSet> = Api::namespaced(s.client.clone(), "kube-system");
    wait_for("Multus on every node", Duration::from_secs(180), || async {
        let ds = daemonsets
            .get("kube-multus-ds")
            .await
            .map_err(|e| e.to_string())?;
        let status = ds.status.ok_or("no status")?;
        (status.desired_number_scheduled > 0
            && status.number_ready == status.desired_number_scheduled)
            .then_some(())
            .ok_or(format!(
                "{}/{} ready",
                status.number_ready, status.desired_number_scheduled
            ))
    })
    .await;
    // Ready means its entrypoint runs; the configuration it writes is what containerd must
    // see (it watches the directory) before a pod's sandbox goes through Multus.
    wait_for(
        "00-multus.conflist on every node",
        Duration::from_secs(60),
        || async {
            let missing: Vec<String> = s
                .lab
                .nodes()
                .into_iter()
                .filter(|n| !n.root.join("etc/cni/net.d/00-multus.conflist").exists())
                .map(|n| n.name)
                .collect();
            missing.is_empty().then_some(()).ok_or(missing)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
}

/// A NetworkAttachmentDefinition `name` in `ns`: a macvlan child of each node's `eth0` (the
/// lab's link) with allot as IPAM, from the pools `v4` and `v6`.
pub fn macvlan_nad(ns: &str, name: &str, v4: &str, v6: &str) -> String {
    let config = serde_json::json!({
        "cniVersion": "1.0.0", "name": name, "type": "macvlan", "master": "eth0",
        "mode": "bridge",
        "ipam": {"type": "allot", "default_ipv4_ippool": [v4], "default_ipv6_ippool": [v6]},
    });
    format!(
        "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\n\
         metadata: {{name: {name}, namespace: {ns}}}\nspec:\n  config: '{config}'\n"
    )
}
