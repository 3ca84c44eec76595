//! macvlan, the underlay case allot is for: pods on a parent interface (a veth here, since dummy
//! links cannot be created on this machine class), addresses from the underlay pool.

use allot_e2e::*;
use serde_json::json;

#[test]
fn macvlan_pods_on_a_veth_parent_get_pool_addresses_and_reach_each_other() {
    let pools = document(
        "IPPool",
        "underlay",
        json!({
            "subnet": "10.91.0.0/24",
            "gateway": "10.91.0.1",
            "ips": ["10.91.0.100-10.91.0.109"],
            "routes": [{"dst": "10.92.0.0/16", "gw": "10.91.0.1"}],
        }),
    );
    let Some(lab) = Lab::new("macvlan_pods_on_a_veth_parent", &pools) else {
        return;
    };
    let (parent, _peer) = lab.host.veth_pair();
    let conf = macvlan_conf(
        "1.0.0",
        "allot-e2e-macvlan",
        &parent,
        allot_ipam(&lab.agent.socket(), &["underlay"], &[]),
    );

    let pods: Vec<Attachment> = ["mv-a", "mv-b"]
        .iter()
        .map(|n| Attachment::new(n))
        .collect();
    let mut ips = Vec::new();
    for pod in &pods {
        let add = lab.cni("macvlan", "ADD", pod, &conf);
        add.expect_ok();
        let ip = add.ip();
        assert!(
            in_range(addr_of(&ip), "10.91.0.100", "10.91.0.109"),
            "{add}"
        );
        assert_eq!(pod.addrs(), vec![ip.clone()]);
        let routes = pod.netns.ip(&["route", "show", "10.92.0.0/16"]);
        assert!(
            routes.contains("via 10.91.0.1"),
            "the pool's route is missing in the pod: {routes:?}\n{add}"
        );
        ips.push(ip);
    }
    assert_ne!(ips[0], ips[1]);
    assert!(
        pods[0].netns.ping(&addr_of(&ips[1]).to_string()),
        "macvlan pods on one parent cannot reach each other"
    );

    for pod in &pods {
        lab.cni("macvlan", "DEL", pod, &conf).expect_ok();
        assert!(!pod.netns.link_exists("eth0"));
        lab.cni("macvlan", "DEL", pod, &conf).expect_ok();
    }
    assert_eq!(lab.agent.pool_counts("underlay"), (10, 10));
}
