//! Pods on the nodes' CNI configuration, as a user deploys them: while the nodes have no
//! network configuration they are NotReady, as a kubelet's (network plugin not ready), and a
//! Deployment of busybox is not scheduled; once configured, each replica gets an address from
//! Debian's host-local through the bridge plugin and is Ready; deleting the Deployment runs CNI
//! DEL (host-local's files go) and removes the pods' namespaces.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use allot_lab::testing::{self, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

fn deployment() -> Deployment {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "bb", "namespace": "default"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "bb"}},
            "template": {
                "metadata": {"labels": {"app": "bb"}},
                "spec": {
                    // One replica per node.
                    "topologySpreadConstraints": [{
                        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "labelSelector": {"matchLabels": {"app": "bb"}},
                    }],
                    "containers": [{"name": "bb", "image": "busybox", "command": ["sleep", "3600"]}],
                },
            },
        },
    }))
    .unwrap()
}

/// Node `i`'s host-local range: 203.0.113.(20i+10) to .(20i+29).
fn range_of(i: usize) -> (Ipv4Addr, Ipv4Addr) {
    let first = (20 * i + 10) as u8;
    (
        Ipv4Addr::new(203, 0, 113, first),
        Ipv4Addr::new(203, 0, 113, first + 19),
    )
}

fn addresses_held(root: &Path) -> Vec<String> {
    std::fs::read_dir(root.join("var/lib/cni/networks/labnet"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.parse::<Ipv4Addr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_deployment_gets_addresses_from_the_nodes_cni_and_gives_them_back() {
    let Some(lab) = testing::start(
        "a_deployment_gets_addresses_from_the_nodes_cni_and_gives_them_back",
        3,
        env!("CARGO_BIN_EXE_allot-lab-node"),
        |o| o.allot_image = false,
    )
    .await
    else {
        return;
    };
    let client = lab.client().await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    deployments
        .create(&PostParams::default(), &deployment())
        .await
        .unwrap();

    // No network configuration on the nodes yet: they are NotReady and say why, and the
    // scheduler keeps the pods off them (the node lifecycle controller's not-ready taint).
    let nodes: Api<Node> = Api::all(client.clone());
    for node in nodes.list(&ListParams::default()).await.unwrap() {
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
            .expect("a Ready condition");
        assert_eq!(ready.status, "False");
        assert!(
            ready
                .message
                .as_deref()
                .unwrap_or("")
                .contains("cni plugin not initialized"),
            "{ready:?}"
        );
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    wait_for(
        "a FailedScheduling event: the nodes' taints",
        Duration::from_secs(60),
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("FailedScheduling")
                        && e.message
                            .as_deref()
                            .unwrap_or("")
                            .contains("untolerated taint")
                })
                .map(|e| e.message.unwrap_or_default())
                .ok_or_else(|| "no FailedScheduling event".to_string())
        },
    )
    .await;
    for pod in testing::pods(&client, "default", "app=bb").await.unwrap() {
        let spec = pod.spec.unwrap_or_default();
        let status = pod.status.unwrap_or_default();
        assert!(
            spec.node_name.is_none(),
            "a pod was scheduled onto a node without a network"
        );
        assert!(
            status.pod_ip.is_none(),
            "a pod got an address without a network"
        );
    }

    let nodes = lab.nodes();
    for (i, node) in nodes.iter().enumerate() {
        let (start, end) = range_of(i + 1);
        testing::bridge_conflist(
            node,
            "10-labnet.conflist",
            "labnet",
            "labbr0",
            "203.0.113.0/24",
            (&start.to_string(), &end.to_string()),
        )
        .unwrap();
    }
    let pods = wait_for(
        "3 pods Running and Ready with addresses",
        Duration::from_secs(60),
        || async {
            let pods = testing::pods(&client, "default", "app=bb")
                .await
                .map_err(|e| e.to_string())?;
            let ready = pods
                .iter()
                .filter(|p| testing::condition(p, "Ready").as_deref() == Some("True"))
                .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
                .count();
            if ready == 3 {
                Ok(pods)
            } else {
                Err(format!("{ready} of 3 ready"))
            }
        },
    )
    .await;
    for pod in &pods {
        let status = pod.status.as_ref().unwrap();
        let node_name = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
        let i = nodes.iter().position(|n| n.name == node_name).unwrap();
        let ip: Ipv4Addr = status.pod_ip.as_ref().unwrap().parse().unwrap();
        let (start, end) = range_of(i + 1);
        assert!(
            start <= ip && ip <= end,
            "{node_name}'s pod has {ip}, outside {start}-{end}"
        );
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(
            status.host_ip.as_deref(),
            Some(nodes[i].ipv4.to_string().as_str())
        );
        assert_eq!(
            addresses_held(&nodes[i].root),
            [ip.to_string()],
            "host-local's record on {node_name}"
        );
    }
    let sandboxes = testing::pod_namespaces(&nodes).len();
    assert_eq!(sandboxes, 3, "one network namespace per pod");

    deployments
        .delete("bb", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the pods gone", Duration::from_secs(60), || async {
        let n = testing::pods(&client, "default", "app=bb")
            .await
            .map_err(|e| e.to_string())?
            .len();
        if n == 0 {
            Ok(())
        } else {
            Err(format!("{n} left"))
        }
    })
    .await;
    for node in &nodes {
        assert!(
            addresses_held(&node.root).is_empty(),
            "{}: host-local still holds an address after DEL",
            node.name
        );
    }
    let left = testing::pod_namespaces(&nodes);
    assert!(left.is_empty(), "pod network namespaces left: {left:?}");
}
