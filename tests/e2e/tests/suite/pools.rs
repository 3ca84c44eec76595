//! What the pools say reaches the pods: dual stack, exhaustion, excluded and reserved addresses,
//! and pool files edited while the agent runs.

use std::collections::BTreeSet;
use std::thread;
use std::time::{Duration, Instant};

use allot_e2e::*;
use serde_json::json;

/// How long a pool file change may take to reach allocations.
const RELOAD_WAIT: Duration = Duration::from_secs(15);

#[test]
fn dual_stack_pod_gets_one_address_of_each_family() {
    // The IPv6 pool is a whole /64: choosing an address must not depend on the pool's size.
    let pools = ippool(
        "v4",
        "10.83.0.0/24",
        Some("10.83.0.1"),
        &["10.83.0.10-10.83.0.99"],
    ) + &document(
        "IPPool",
        "v6",
        json!({"ipVersion": 6, "subnet": "fd00:a110:83::/64", "gateway": "fd00:a110:83::1"}),
    );
    let Some(lab) = Lab::new("dual_stack_pod_gets_one_address_of_each_family", &pools) else {
        return;
    };
    let conf = lab.bridge_conf(&["v4"], &["v6"]);
    let pod = Attachment::new("dual");
    let add = lab.bridge_add(&pod, &conf);
    let ips = add.ips();
    assert_eq!(ips.len(), 2, "{add}");
    let v4: Vec<&String> = ips.iter().filter(|ip| addr_of(ip).is_ipv4()).collect();
    let v6: Vec<&String> = ips.iter().filter(|ip| addr_of(ip).is_ipv6()).collect();
    assert_eq!((v4.len(), v6.len()), (1, 1), "{add}");
    assert!(
        in_range(addr_of(v4[0]), "10.83.0.10", "10.83.0.99"),
        "{add}"
    );
    assert!(v4[0].ends_with("/24"));
    assert!(in_subnet(addr_of(v6[0]), "fd00:a110:83::/64"), "{add}");
    assert!(v6[0].ends_with("/64"));
    assert_ne!(
        addr_of(v6[0]).to_string(),
        "fd00:a110:83::1",
        "the gateway was handed out"
    );
    assert_ne!(
        addr_of(v6[0]).to_string(),
        "fd00:a110:83::",
        "the subnet-router anycast address was handed out"
    );

    let mut in_ns = pod.addrs();
    in_ns.sort();
    let mut want = ips.clone();
    want.sort();
    assert_eq!(in_ns, want);
    assert!(pod.netns.ping("10.83.0.1"), "no IPv4 path to the gateway");
    assert!(
        pod.netns.ping("fd00:a110:83::1"),
        "no IPv6 path to the gateway"
    );

    // Another pod gets other addresses of both families.
    let other = Attachment::new("dual-2");
    let add2 = lab.bridge_add(&other, &conf);
    assert_eq!(add2.ips().len(), 2);
    for ip in add2.ips() {
        assert!(!ips.contains(&ip), "{ip} handed out twice");
    }
    assert!(
        other.netns.ping(&addr_of(v4[0]).to_string()),
        "pods cannot reach each other"
    );

    for p in [&pod, &other] {
        lab.cni("bridge", "DEL", p, &conf).expect_ok();
        assert!(p.addrs().is_empty());
    }
    assert_eq!(lab.agent.pool_counts("v4"), (90, 90));
    let (total6, free6) = lab.agent.pool_counts("v6");
    assert_eq!(total6, free6);
}

#[test]
fn an_exhausted_pool_is_a_clear_error_naming_the_pool() {
    let pools = ippool(
        "tiny",
        "10.84.0.0/24",
        Some("10.84.0.1"),
        &["10.84.0.10-10.84.0.11"],
    );
    let Some(lab) = Lab::new("an_exhausted_pool_is_a_clear_error", &pools) else {
        return;
    };
    let conf = lab.bridge_conf(&["tiny"], &[]);
    let pods: Vec<Attachment> = (0..3).map(|i| Attachment::new(&format!("p{i}"))).collect();
    let a = lab.bridge_add(&pods[0], &conf).ip();
    let b = lab.bridge_add(&pods[1], &conf).ip();
    assert_ne!(a, b);

    for plugin in ["bridge", "allot"] {
        let third = lab.cni(plugin, "ADD", &pods[2], &conf);
        third.expect_err(&[100]);
        let msg = third.msg();
        assert!(
            msg.contains("tiny"),
            "the message does not name the pool:\n{third}"
        );
        assert!(
            msg.to_lowercase().contains("exhaust"),
            "the message does not say the pool is exhausted:\n{third}"
        );
        lab.cni(plugin, "DEL", &pods[2], &conf).expect_ok();
    }
    assert_eq!(lab.agent.pool_counts("tiny"), (2, 0));

    // A pool that does not exist is named too. The default policy fails the NIC as Spiderpool
    // does (not-ready: the pool may yet be created), so the code is "try again later".
    let conf = lab.bridge_conf(&["no-such-pool"], &[]);
    let out = lab.cni("allot", "ADD", &pods[2], &conf);
    out.expect_err(&[11]);
    assert!(
        out.msg().contains("IPPool no-such-pool does not exist"),
        "{out}"
    );

    // Freeing one address makes room.
    lab.cni("bridge", "DEL", &pods[0], &lab.bridge_conf(&["tiny"], &[]))
        .expect_ok();
    assert_eq!(
        lab.bridge_add(&pods[2], &lab.bridge_conf(&["tiny"], &[]))
            .ip(),
        a
    );
}

#[test]
fn listed_pools_are_used_in_order_and_exhaustion_names_them_all() {
    let pools = ippool("first", "10.84.0.0/24", Some("10.84.0.1"), &["10.84.0.10"])
        + &ippool(
            "second",
            "10.84.0.0/24",
            Some("10.84.0.1"),
            &["10.84.0.20-10.84.0.21"],
        );
    let Some(lab) = Lab::new("listed_pools_are_used_in_order", &pools) else {
        return;
    };
    let conf = lab.bridge_conf(&["first", "second"], &[]);
    let netns = std::sync::Arc::new(Netns::new());
    let got: Vec<String> = (0..3)
        .map(|i| {
            let out = lab.cni(
                "allot",
                "ADD",
                &Attachment::in_netns(&netns, &format!("o{i}")),
                &conf,
            );
            out.expect_ok();
            assert_eq!(
                out.json.as_ref().unwrap()["ips"][0]["gateway"],
                "10.84.0.1",
                "{out}"
            );
            addr_of(&out.ip()).to_string()
        })
        .collect();
    assert_eq!(got[0], "10.84.0.10", "the first listed pool serves first");
    let rest: BTreeSet<&str> = got[1..].iter().map(String::as_str).collect();
    assert_eq!(rest, BTreeSet::from(["10.84.0.20", "10.84.0.21"]));

    let out = lab.cni("allot", "ADD", &Attachment::in_netns(&netns, "o3"), &conf);
    out.expect_err(&[100]);
    assert!(
        out.msg().contains("first") && out.msg().contains("second"),
        "the message names both pools:\n{out}"
    );
}

/// Adds attachments in one namespace until the pool says no; returns the addresses.
fn drain(lab: &Lab, pool: &str, limit: usize) -> Vec<String> {
    let conf = lab.bridge_conf(&[pool], &[]);
    let netns = std::sync::Arc::new(Netns::new());
    let mut got = Vec::new();
    for i in 0..=limit {
        let att = Attachment::in_netns(&netns, &format!("{pool}-{i}"));
        let out = lab.cni("allot", "ADD", &att, &conf);
        if !out.success() {
            out.expect_err(&[100]);
            return got;
        }
        got.push(addr_of(&out.ip()).to_string());
    }
    panic!("pool {pool} handed out more than {limit} addresses: {got:?}");
}

#[test]
fn excluded_reserved_gateway_network_and_broadcast_addresses_never_appear() {
    let pools = document(
        "IPPool",
        "ranged",
        json!({
            "ipVersion": 4,
            "subnet": "10.85.0.0/28",
            "gateway": "10.85.0.1",
            "ips": ["10.85.0.2-10.85.0.12"],
            "excludeIPs": ["10.85.0.4", "10.85.0.6-10.85.0.7"],
        }),
    ) + &document(
        "ReservedIP",
        "held-back",
        json!({"ipVersion": 4, "ips": ["10.85.0.9", "10.86.0.3"]}),
    ) + &ippool("whole", "10.86.0.0/29", Some("10.86.0.1"), &[]);
    let Some(lab) = Lab::new("excluded_reserved_gateway_never_appear", &pools) else {
        return;
    };

    let got: BTreeSet<String> = drain(&lab, "ranged", 12).into_iter().collect();
    let want: BTreeSet<String> = [2, 3, 5, 8, 10, 11, 12]
        .iter()
        .map(|i| format!("10.85.0.{i}"))
        .collect();
    assert_eq!(got, want, "pool ranged: 4, 6, 7 excluded, 9 reserved");

    // No ips: every usable host of the /29 but the network, broadcast, gateway and reserved.
    let got: BTreeSet<String> = drain(&lab, "whole", 8).into_iter().collect();
    let want: BTreeSet<String> = [2, 4, 5, 6]
        .iter()
        .map(|i| format!("10.86.0.{i}"))
        .collect();
    assert_eq!(
        got, want,
        "pool whole: .0 network, .1 gateway, .3 reserved, .7 broadcast"
    );
}

/// Retries ADD of `att` until it succeeds (the agent picking up a pool file), for [`RELOAD_WAIT`].
fn add_when_ready(lab: &Lab, att: &Attachment, conf: &serde_json::Value) -> CniOutput {
    let deadline = Instant::now() + RELOAD_WAIT;
    loop {
        let out = lab.cni("allot", "ADD", att, conf);
        if out.success() {
            return out;
        }
        out.expect_failure();
        assert!(
            Instant::now() < deadline,
            "pool change not picked up after {RELOAD_WAIT:?}:\n{out}\nagent log:\n{}",
            lab.agent.log()
        );
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn pool_files_edited_while_the_agent_runs_are_picked_up() {
    let pools = ippool("first", "10.87.0.0/24", Some("10.87.0.1"), &["10.87.0.10"]);
    let Some(lab) = Lab::new("pool_files_edited_while_the_agent_runs", &pools) else {
        return;
    };
    let first = lab.bridge_conf(&["first"], &[]);
    let a = Attachment::new("a");
    assert_eq!(lab.bridge_add(&a, &first).ip(), "10.87.0.10/24");
    let b = Attachment::new("b");
    lab.cni("allot", "ADD", &b, &first).expect_err(&[100]);

    // Grow the pool in place.
    lab.agent.write_pools(
        "pools.yaml",
        &ippool(
            "first",
            "10.87.0.0/24",
            Some("10.87.0.1"),
            &["10.87.0.10-10.87.0.12"],
        ),
    );
    let out = add_when_ready(&lab, &b, &first);
    assert!(
        in_range(addr_of(&out.ip()), "10.87.0.11", "10.87.0.12"),
        "{out}"
    );
    lab.cni("allot", "DEL", &b, &first).expect_ok();

    // A new file with a new pool.
    lab.agent.write_pools(
        "second.yaml",
        &ippool(
            "second",
            "10.88.0.0/24",
            Some("10.88.0.1"),
            &["10.88.0.20-10.88.0.29"],
        ),
    );
    // Its own bridge: the bridge plugin gives a bridge one IPv4 gateway address.
    let second = bridge_conf(
        "1.0.0",
        "allot-e2e-second",
        &unique_name("bs"),
        allot_ipam(&lab.agent.socket(), &["second"], &[]),
    );
    let c = Attachment::new("c");
    add_when_ready(&lab, &c, &second);
    lab.cni("allot", "DEL", &c, &second).expect_ok();
    let add = lab.bridge_add(&c, &second);
    assert!(
        in_range(addr_of(&add.ip()), "10.88.0.20", "10.88.0.29"),
        "{add}"
    );
    assert_eq!(c.addrs(), vec![add.ip()]);
    assert!(c.netns.ping("10.88.0.1"));

    // The claim made before the edits is intact.
    let again = lab.cni("allot", "ADD", &a, &first);
    again.expect_ok();
    assert_eq!(again.ip(), "10.87.0.10/24");
}

#[test]
fn a_broken_pool_file_does_not_take_the_agent_or_other_pools_down() {
    let pools = ippool(
        "good",
        "10.89.0.0/24",
        Some("10.89.0.1"),
        &["10.89.0.10-10.89.0.19"],
    );
    let Some(mut lab) = Lab::new("a_broken_pool_file_does_not_take_the_agent_down", &pools) else {
        return;
    };
    let conf = lab.bridge_conf(&["good"], &[]);
    let a = Attachment::new("a");
    let ip_a = lab.bridge_add(&a, &conf).ip();

    lab.agent.write_pools(
        "broken.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: IPPool\nmetadata: {name: [\nspec: 12\n",
    );
    lab.agent.write_pools(
        "typo.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: IPPool\nmetadata: {name: typo}\nspec: {subnet: 10.90.0.0/24, nodename: [x]}\n",
    );
    thread::sleep(Duration::from_secs(2));
    assert!(
        lab.agent.running(),
        "the agent died on a broken pool file; log:\n{}",
        lab.agent.log()
    );

    // The good pool keeps serving, and its claims are intact.
    let b = Attachment::new("b");
    let ip_b = lab.bridge_add(&b, &conf).ip();
    assert_ne!(ip_a, ip_b);
    let again = lab.cni("allot", "ADD", &a, &conf);
    again.expect_ok();
    assert_eq!(again.ip(), ip_a);

    // Fixing the file brings its pool in.
    lab.agent.remove_pools("broken.yaml");
    lab.agent.write_pools(
        "typo.yaml",
        &ippool("typo", "10.90.0.0/24", Some("10.90.0.1"), &["10.90.0.5"]),
    );
    let c = Attachment::new("c");
    let out = add_when_ready(&lab, &c, &lab.bridge_conf(&["typo"], &[]));
    assert_eq!(out.ip(), "10.90.0.5/24");
}
