//! What an agent's cost grows with, on the real control plane (issue 40): the IPBlocks each
//! agent follows are those of the pools its node may use, selected by their region label, so
//! a claim write in a pool of one node reaches that node's agent and no other.

use std::time::Duration;

use allot_cluster_tests::Suite;
use allot_cluster_tests::objects::{Workload, pod_ips, pool_yaml, pools_annotation};
use allot_lab::testing::wait_for;

/// A gauge of an agent's metrics text.
fn gauge(metrics: &str, series: &str) -> Option<i64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// (IPBlocks followed, regions followed) of each node's agent, in the lab's node order.
async fn followed(s: &Suite) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for node in s.lab.nodes() {
        let m = allot_cluster_tests::metrics(&node.ipv4.to_string(), 9401)
            .await
            .unwrap_or_else(|e| panic!("{}'s agent metrics: {e}", node.name));
        let blocks = gauge(&m, "allot_ipblocks_followed").expect("allot_ipblocks_followed");
        let regions =
            gauge(&m, "allot_ipblock_regions_followed").expect("allot_ipblock_regions_followed");
        out.push((blocks, regions));
    }
    out
}

/// A pool whose `nodeName` names the second node alone (in regions no other pool of the suite
/// uses): that node's agent follows two more regions once the pool exists, and the two blocks
/// its pods' addresses go into; the other agents follow neither. Every agent follows its
/// pools' regions, not every block: the real API server answers the region selector, and no
/// IPBlock lacks the label.
#[tokio::test]
async fn each_agent_follows_only_the_ipblocks_of_the_pools_its_node_may_use() {
    let Some(s) = Suite::shared("each_agent_follows_only_the_ipblocks_of_its_nodes_pools").await
    else {
        return;
    };
    let nodes = s.lab.nodes();
    let target = 1;
    let before = followed(&s).await;
    for (node, (_, regions)) in nodes.iter().zip(&before) {
        assert!(
            *regions >= 1,
            "{}'s agent follows every IPBlock ({regions} regions)",
            node.name
        );
    }
    let only_target = format!("  nodeName: [{}]\n", nodes[target].name);
    s.must_apply(&format!(
        "{}{only_target}",
        pool_yaml(
            "scoped-v4",
            "203.0.113.0/24",
            "203.0.113.1",
            "203.0.113.40-203.0.113.47"
        )
    ));
    s.must_apply(&format!(
        "{}{only_target}",
        pool_yaml(
            "scoped-v6",
            "2001:db8:1ab::/64",
            "2001:db8:1ab::1",
            "2001:db8:1ab::e:0-2001:db8:1ab::e:7"
        )
    ));
    let ns = s.namespace("scoped").await;
    s.must_apply(
        &Workload::deployment(&ns, "pinned", 2)
            .pools(&pools_annotation("scoped-v4", "scoped-v6"))
            .grace(1)
            .pod_spec(&format!("      nodeName: {}\n", nodes[target].name))
            .yaml(),
    );
    for pod in s.ready_pods(&ns, "app=pinned", 2).await {
        let ips = pod_ips(&pod);
        assert!(
            ips.iter()
                .any(|ip| ip.to_string().starts_with("203.0.113.4")),
            "{ips:?}"
        );
    }
    let after = wait_for(
        "the pinned pods' blocks in their node's agent",
        Duration::from_secs(30),
        || async {
            let now = followed(&s).await;
            (now[target].0 >= before[target].0 + 2)
                .then_some(now.clone())
                .ok_or(now)
        },
    )
    .await;
    for (i, node) in nodes.iter().enumerate() {
        let (blocks, regions) = (after[i].0 - before[i].0, after[i].1 - before[i].1);
        if i == target {
            assert_eq!((blocks, regions), (2, 2), "{}", node.name);
        } else {
            assert_eq!((blocks, regions), (0, 0), "{}", node.name);
        }
    }
    s.must("kubectl", &["delete", "namespace", &ns, "--wait=true"]);
    s.must(
        "kubectl",
        &["delete", "ippool", "scoped-v4", "scoped-v6", "--wait=true"],
    );
    s.no_refusals();
}
