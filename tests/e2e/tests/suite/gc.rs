//! The CNI GC verb (spec 1.1.0): claims of attachments not listed are released.
//!
//! Debian's bridge plugin (containernetworking-plugins 1.1.1) speaks CNI up to 1.0.0 and has no
//! GC, so GC goes to `allot` directly, with the network config the runtime would pass: the bridge
//! network at `cniVersion` 1.1.0 plus `cni.dev/valid-attachments`.

use allot_e2e::*;
use serde_json::Value;

fn pools() -> String {
    ippool(
        "three",
        "10.79.0.0/24",
        Some("10.79.0.1"),
        &["10.79.0.10-10.79.0.12"],
    ) + &ippool(
        "b",
        "10.80.0.0/24",
        Some("10.80.0.1"),
        &["10.80.0.10-10.80.0.19"],
    )
}

fn gc_conf(
    lab: &Lab,
    network: &str,
    bridge: &str,
    pool: &str,
    key: &str,
    valid: &[&Attachment],
) -> Value {
    let mut conf = bridge_conf(
        "1.1.0",
        network,
        bridge,
        allot_ipam(&lab.agent.socket(), &[pool], &[]),
    );
    conf[key] = Value::Array(valid.iter().map(|a| a.gc_entry()).collect());
    conf
}

/// A GC that releases: a leak is released at its second sighting past the grace period (0 in
/// the lab), so the runtime's GC runs twice.
fn gc(lab: &Lab, conf: &Value) {
    gc_look(lab, conf);
    gc_look(lab, conf);
}

/// One GC verb: a first sighting only makes leaks suspects.
fn gc_look(lab: &Lab, conf: &Value) -> CniOutput {
    let out = lab
        .call("allot", "GC", &conf.to_string())
        .run(Some(&lab.host));
    out.expect_ok();
    assert!(
        out.stdout.trim().is_empty(),
        "GC prints nothing on success:\n{out}"
    );
    out
}

fn check(lab: &Lab, att: &Attachment, conf: &Value, prev: &Value) -> CniOutput {
    lab.cni("allot", "CHECK", att, &with_prev_result(conf, prev))
}

fn run_gc_releases_unlisted(test: &str, key: &str) {
    let Some(lab) = Lab::new(test, &pools()) else {
        return;
    };
    let conf = lab.bridge_conf(&["three"], &[]);
    let pods: Vec<Attachment> = ["a", "b", "c"].iter().map(|n| Attachment::new(n)).collect();
    let results: Vec<Value> = pods
        .iter()
        .map(|p| lab.bridge_add(p, &conf).json.unwrap())
        .collect();
    let late = Attachment::new("late");
    lab.cni("allot", "ADD", &late, &conf).expect_err(&[100]);
    assert_eq!(lab.agent.pool_counts("three"), (3, 0));

    // c's container is gone without a DEL: GC lists only a and b. The first look only
    // suspects c's claim.
    let listed = gc_conf(
        &lab,
        &lab.network,
        &lab.bridge,
        "three",
        key,
        &[&pods[0], &pods[1]],
    );
    gc_look(&lab, &listed);
    check(&lab, &pods[2], &conf, &results[2]).expect_ok();
    assert_eq!(lab.agent.pool_counts("three"), (3, 0), "seen once: kept");
    gc_look(&lab, &listed);
    check(&lab, &pods[0], &conf, &results[0]).expect_ok();
    check(&lab, &pods[1], &conf, &results[1]).expect_ok();
    check(&lab, &pods[2], &conf, &results[2]).expect_failure();
    assert_eq!(
        lab.agent.pool_counts("three"),
        (3, 1),
        "GC released exactly c's claim"
    );

    // c's address is free again.
    let add = lab.bridge_add(&late, &conf);
    assert_eq!(
        Some(add.ip().as_str()),
        results[2]["ips"][0]["address"].as_str()
    );

    // GC with everything listed releases nothing; an unlisted DEL-ed pod is harmless.
    lab.cni("bridge", "DEL", &pods[2], &conf).expect_ok();
    gc(
        &lab,
        &gc_conf(
            &lab,
            &lab.network,
            &lab.bridge,
            "three",
            key,
            &[&pods[0], &pods[1], &late],
        ),
    );
    check(&lab, &pods[0], &conf, &results[0]).expect_ok();
    check(&lab, &pods[1], &conf, &results[1]).expect_ok();
    check(&lab, &late, &conf, add.json.as_ref().unwrap()).expect_ok();
    assert_eq!(lab.agent.pool_counts("three"), (3, 0));

    // An empty list releases everything of this network.
    gc(
        &lab,
        &gc_conf(&lab, &lab.network, &lab.bridge, "three", key, &[]),
    );
    assert_eq!(lab.agent.pool_counts("three"), (3, 3));
}

#[test]
fn gc_releases_claims_not_in_valid_attachments() {
    run_gc_releases_unlisted(
        "gc_releases_claims_not_in_valid_attachments",
        "cni.dev/valid-attachments",
    );
}

#[test]
fn gc_accepts_the_older_attachments_key() {
    run_gc_releases_unlisted(
        "gc_accepts_the_older_attachments_key",
        "cni.dev/attachments",
    );
}

/// GC is per network (CNI 1.1.0: the runtime sends one GC per network configuration, listing
/// the attachments of that network). A pod on two allot networks keeps its second address when
/// the first network is collected.
#[test]
fn gc_of_one_network_leaves_other_networks_alone() {
    let Some(lab) = Lab::new("gc_of_one_network_leaves_other_networks_alone", &pools()) else {
        return;
    };
    let conf_a = lab.bridge_conf(&["three"], &[]);
    let bridge_b = unique_name("bb");
    let conf_b = bridge_conf(
        "1.0.0",
        "allot-e2e-b",
        &bridge_b,
        allot_ipam(&lab.agent.socket(), &["b"], &[]),
    );
    let pod = Attachment::new("two-nics");
    let net1 = pod.with_ifname("net1");
    lab.bridge_add(&pod, &conf_a);
    let on_b = lab.bridge_add(&net1, &conf_b).json.unwrap();
    let gone = Attachment::new("gone");
    let on_b_gone = lab
        .bridge_add(&gone.with_ifname("net1"), &conf_b)
        .json
        .unwrap();

    // GC of network a lists its one attachment (pod eth0).
    gc(
        &lab,
        &gc_conf(
            &lab,
            &lab.network,
            &lab.bridge,
            "three",
            "cni.dev/valid-attachments",
            &[&pod],
        ),
    );
    check(&lab, &net1, &conf_b, &on_b).expect_ok();
    check(&lab, &gone.with_ifname("net1"), &conf_b, &on_b_gone).expect_ok();
    assert_eq!(
        lab.agent.pool_counts("b"),
        (10, 8),
        "GC of network a released claims of network b"
    );

    // GC of network b collects b only.
    gc(
        &lab,
        &gc_conf(
            &lab,
            "allot-e2e-b",
            &bridge_b,
            "b",
            "cni.dev/valid-attachments",
            &[&net1],
        ),
    );
    check(&lab, &net1, &conf_b, &on_b).expect_ok();
    check(&lab, &gone.with_ifname("net1"), &conf_b, &on_b_gone).expect_failure();
    assert_eq!(lab.agent.pool_counts("b"), (10, 9));
    assert_eq!(lab.agent.pool_counts("three"), (3, 2));
}

/// Two nodes' agents share one etcd. A runtime lists only its own node's attachments, so node
/// A's GC must never release node B's claims: before claims recorded their node, A's second GC
/// released B's live pod's address, and A could hand it out again.
#[test]
fn gc_on_one_node_never_releases_another_nodes_claims() {
    let etcd = allot_store::etcd::testing::EtcdServer::start();
    let url = etcd.url();
    let Some(lab) = Lab::with_flags(
        "gc_on_one_node_never_releases_another_nodes_claims",
        &pools(),
        &[("--store", url.as_str()), ("--node-name", "node-a")],
    ) else {
        return;
    };
    let node_b = Agent::start_sharing_with(&lab.agent, &[("--node-name", "node-b")]);
    let conf_a = lab.bridge_conf(&["three"], &[]);
    let conf_b = lab.bridge_conf_via(&node_b.socket(), &["three"], &[]);
    let on_a = Attachment::new("on-a");
    let gone_from_a = Attachment::new("gone-from-a");
    let on_b = Attachment::new("on-b");
    lab.bridge_add(&on_a, &conf_a);
    let gone_result = lab.bridge_add(&gone_from_a, &conf_a).json.unwrap();
    let b_result = lab.bridge_add(&on_b, &conf_b).json.unwrap();

    // Node A's runtime: on-a runs, gone-from-a is gone without a DEL; it knows nothing of B.
    gc(
        &lab,
        &gc_conf(
            &lab,
            &lab.network,
            &lab.bridge,
            "three",
            "cni.dev/valid-attachments",
            &[&on_a],
        ),
    );
    // CHECK against each attachment's own result: gone-from-a's claim is released (CHECK fails
    // only because of that), on-b's is intact.
    check(&lab, &gone_from_a, &conf_a, &gone_result).expect_failure();
    check(&lab, &on_b, &conf_b, &b_result).expect_ok();
    lab.eventually(
        "both nodes see two addresses held",
        std::time::Duration::from_secs(10),
        || lab.agent.pool_counts("three") == (3, 1) && node_b.pool_counts("three") == (3, 1),
    );
    // The address A released is the only one A can hand out: never B's.
    let next = lab.bridge_add(&Attachment::new("next"), &conf_a);
    assert_ne!(
        Some(next.ip().as_str()),
        b_result["ips"][0]["address"].as_str()
    );
}

/// Two nodes' agents share one etcd, and neither is given `--node-name`: on this machine both
/// would be named after its hostname, as two hosts are whose hostnames agree (cloned VMs,
/// `localhost`). Named alike, node A's GC, whose runtime lists A's attachments only, released
/// B's live pod's address. Each agent keeps an identity of its own in its state directory, and
/// its claims record that: A's GC releases A's leak and never B's claim.
#[test]
fn gc_never_releases_another_nodes_claims_when_both_go_by_the_hostname() {
    let etcd = allot_store::etcd::testing::EtcdServer::start();
    let url = etcd.url();
    let Some(lab) = Lab::with_flags(
        "gc_never_releases_another_nodes_claims_when_both_go_by_the_hostname",
        &pools(),
        &[("--store", url.as_str())],
    ) else {
        return;
    };
    let node_b = Agent::start_as_another_node(&lab.agent, &[]);
    let conf_a = lab.bridge_conf(&["three"], &[]);
    let conf_b = lab.bridge_conf_via(&node_b.socket(), &["three"], &[]);
    let on_a = Attachment::new("on-a");
    let gone_from_a = Attachment::new("gone-from-a");
    let on_b = Attachment::new("on-b");
    lab.bridge_add(&on_a, &conf_a);
    let gone_result = lab.bridge_add(&gone_from_a, &conf_a).json.unwrap();
    let b_result = lab.bridge_add(&on_b, &conf_b).json.unwrap();
    let b_address = b_result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();

    // Node A's runtime: on-a runs, gone-from-a is gone without a DEL; it knows nothing of B.
    gc(
        &lab,
        &gc_conf(
            &lab,
            &lab.network,
            &lab.bridge,
            "three",
            "cni.dev/valid-attachments",
            &[&on_a],
        ),
    );
    check(&lab, &gone_from_a, &conf_a, &gone_result).expect_failure();
    check(&lab, &on_b, &conf_b, &b_result).expect_ok();
    let stored = etcd.keys("/allot/claims/");
    assert!(
        stored.contains(&format!("/allot/claims/{b_address}")),
        "etcd still holds B's claim on {b_address}: {stored:?}"
    );
}
