//! Underlay safety end to end: conflict and gateway probes run by the allot plugin inside the
//! pod's namespace, called by Debian's bridge and macvlan plugins, against foreign hosts the
//! tests put on the segment (namespaces joined by veth pairs, all created here and removed on
//! drop); quarantine in the agent's store; and a capture showing that probing disabled sends
//! nothing.

use std::time::Duration;

use allot_e2e::probe::*;
use allot_e2e::*;
use serde_json::{Value, json};

fn dual_stack_pools(n: u8) -> String {
    format!(
        "{}{}",
        ippool(
            "v4",
            &format!("10.9{n}.0.0/24"),
            Some(&format!("10.9{n}.0.1")),
            &[&format!("10.9{n}.0.100-10.9{n}.0.109")]
        ),
        ippool(
            "v6",
            &format!("fd00:9{n}::/64"),
            Some(&format!("fd00:9{n}::1")),
            &[&format!("fd00:9{n}::100-fd00:9{n}::109")]
        ),
    )
}

/// A foreign host on the bridge already uses the first free IPv4 and IPv6 addresses: allot
/// hands out the next ones, quarantines the first (shown by `allotctl claims list` with the
/// foreign MAC, counted in the metrics), and the plugin's log names the MAC. A second pod
/// does not meet the quarantined addresses again.
#[test]
fn a_foreign_host_holding_the_first_addresses_gets_them_quarantined_and_the_pod_the_next() {
    let test = "a_foreign_host_holding_the_first_addresses_gets_them_quarantined";
    let Some(lab) = Lab::new(test, &dual_stack_pools(3)) else {
        return;
    };
    bridge_with(&lab.host, &lab.bridge, &["10.93.0.1/24", "fd00:93::1/64"]);
    let (_foreign, port, foreign_mac) =
        foreign_host(&lab.host, &["10.93.0.100/24", "fd00:93::100/64"]);
    lab.host.ip(&["link", "set", &port, "master", &lab.bridge]);

    let conf = with_probe(
        lab.bridge_conf(&["v4"], &["v6"]),
        json!({"conflict": true, "gateway": true}),
    );
    let pod = Attachment::new("dad-a");
    let add = lab.bridge_add(&pod, &conf);
    let mut ips = add.ips();
    ips.sort();
    assert_eq!(ips, ["10.93.0.101/24", "fd00:93::101/64"], "{add}");
    assert!(
        add.stderr.contains(&foreign_mac) && add.stderr.contains("10.93.0.100"),
        "the plugin's log names the conflicting MAC:\n{add}"
    );
    assert_eq!(
        quarantined(&lab.agent),
        [
            ("10.93.0.100".to_string(), foreign_mac.clone()),
            ("fd00:93::100".to_string(), foreign_mac.clone())
        ]
    );
    assert!(
        lab.agent.log().contains(&foreign_mac),
        "{}",
        lab.agent.log()
    );
    assert_eq!(metric(&lab.agent, "allot_conflicts_total"), 2.0);
    assert_eq!(metric(&lab.agent, "allot_quarantined_addresses"), 2.0);
    // The pod, its address and the quarantine: 2 of 10 gone per family.
    assert_eq!(lab.agent.pool_counts("v4"), (10, 8));
    assert_eq!(lab.agent.pool_counts("v6"), (10, 8));
    assert!(pod.netns.ping("10.93.0.1"), "the pod reaches its gateway");

    // The next pod goes straight to the next free addresses.
    let second = Attachment::new("dad-b");
    let add = lab.bridge_add(&second, &conf);
    let mut ips = add.ips();
    ips.sort();
    assert_eq!(ips, ["10.93.0.102/24", "fd00:93::102/64"], "{add}");
    assert_eq!(metric(&lab.agent, "allot_conflicts_total"), 2.0);

    // GC with no valid attachment releases the second pod's addresses (a leak, once the
    // first pod is gone), never the quarantine.
    lab.cni("bridge", "DEL", &pod, &conf).expect_ok();
    let gc = json!({"cniVersion": "1.1.0", "name": lab.network, "ipam": conf["ipam"],
                    "cni.dev/valid-attachments": []});
    for _ in 0..2 {
        lab.call("allot", "GC", &gc.to_string())
            .run(Some(&lab.host))
            .expect_ok();
    }
    assert_eq!(quarantined(&lab.agent).len(), 2);
    assert_eq!(lab.agent.pool_counts("v4"), (10, 9));
}

/// The gateway probe: both gateways answer (the bridge holds them) → the ADD succeeds; the
/// IPv6 gateway gone → the ADD fails naming it and the interface; both gone → the IPv4 one
/// is named. A failed ADD leaks nothing.
#[test]
fn an_unreachable_gateway_fails_the_add_by_name_and_leaks_nothing() {
    let test = "an_unreachable_gateway_fails_the_add_by_name_and_leaks_nothing";
    let Some(lab) = Lab::new(test, &dual_stack_pools(5)) else {
        return;
    };
    bridge_with(&lab.host, &lab.bridge, &["10.95.0.1/24", "fd00:95::1/64"]);
    let probe = json!({"gateway": true, "tries": 2, "timeoutMs": 50});
    let present = with_probe(lab.bridge_conf(&["v4"], &["v6"]), probe.clone());
    let ok = Attachment::new("gw-ok");
    lab.bridge_add(&ok, &present);
    assert_eq!(lab.agent.pool_counts("v4"), (10, 9));

    // Without the gateways on the bridge, and without the bridge plugin adding them back.
    let mut absent = present.clone();
    absent["isGateway"] = json!(false);
    for (remove, named) in [
        ("fd00:95::1/64", "fd00:95::1"),
        ("10.95.0.1/24", "10.95.0.1"),
    ] {
        lab.host.ip(&["addr", "del", remove, "dev", &lab.bridge]);
        let pod = Attachment::new("gw-gone");
        let add = lab.cni("bridge", "ADD", &pod, &absent);
        add.expect_err(&[106]);
        let msg = add.msg();
        assert!(
            msg.contains(&format!("gateway {named} does not answer on eth0")),
            "{add}"
        );
        assert!(msg.contains("released"), "{add}");
        assert_eq!(lab.agent.pool_counts("v4"), (10, 9), "leaked:\n{add}");
        assert_eq!(lab.agent.pool_counts("v6"), (10, 9), "leaked:\n{add}");
        lab.cni("bridge", "DEL", &pod, &absent).expect_ok();
    }
    assert_eq!(
        claims(&lab.agent).len(),
        2,
        "only the first pod's addresses"
    );
}

/// The plugin called by itself on an interface the test made (down, no address), the other
/// end of its veth captured: with the agent's `--probe-conflict` default and no `probe`
/// section, ARP and NDP probes leave the pod; with an explicit section that turns probing
/// off, or with an agent whose defaults are off, nothing at all does. The interface is left
/// down either way.
#[test]
fn probing_disabled_sends_nothing_and_the_agents_defaults_apply_without_a_section() {
    let test = "probing_disabled_sends_nothing";
    let pools = dual_stack_pools(4);
    let Some(lab) = Lab::with_flags(test, &pools, &[("--probe-conflict", "")]) else {
        return;
    };
    let quiet = Agent::start(&pools);
    let pod = Attachment::new("capture");
    let outside = unique_name("cp");
    lab.host.ip(&[
        "link",
        "add",
        &outside,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        pod.netns.name(),
    ]);
    lab.host.ip(&["link", "set", &outside, "up"]);
    let pod_mac = mac_of(&pod.netns, "eth0");

    let network = |socket: &std::path::Path, probe: Option<Value>| {
        let mut ipam = allot_ipam(socket, &["v4"], &["v6"]);
        if let Some(p) = probe {
            ipam["probe"] = p;
        }
        json!({"cniVersion": "1.0.0", "name": "allot-e2e-capture", "type": "allot", "ipam": ipam})
    };
    let cases = [
        (
            "agent defaults on, no section",
            network(&lab.agent.socket(), None),
            true,
        ),
        (
            "agent defaults on, section off",
            network(
                &lab.agent.socket(),
                Some(json!({"conflict": false, "gateway": false})),
            ),
            false,
        ),
        (
            "agent defaults off, no section",
            network(&quiet.socket(), None),
            false,
        ),
    ];
    for (i, (case, conf, probes)) in cases.iter().enumerate() {
        let att = Attachment {
            container_id: format!("{}{i}", pod.container_id),
            ..pod.clone()
        };
        let capture = Capture::start(&lab.host, &outside);
        let add = lab.cni("allot", "ADD", &att, conf);
        let frames = capture.finish();
        add.expect_ok();
        let (arp, ndp) = neighbour_frames(&frames, &pod_mac);
        if *probes {
            // 3 tries per address, then one announcement each.
            assert!(arp >= 3 && ndp >= 3, "{case}: arp {arp}, ndp {ndp}\n{add}");
        } else {
            let from_pod = frames.iter().filter(|f| f.len() >= 14).filter(|f| {
                f[6..12]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":")
                    == pod_mac
            });
            assert_eq!(from_pod.count(), 0, "{case}: the pod sent frames\n{add}");
        }
        let state = pod.netns.ip(&["-j", "link", "show", "dev", "eth0"]);
        assert!(
            !state.contains("\"UP\""),
            "{case}: eth0 is left up: {state}"
        );
        lab.cni("allot", "DEL", &att, conf).expect_ok();
    }
}

/// macvlan on a parent link whose other end is a foreign host holding the first address: the
/// agent's defaults (no `probe` section in the network) catch it, the pod gets the next
/// address, and the quarantine is released once `--quarantine-seconds` have passed.
#[test]
fn macvlan_conflict_is_quarantined_replaced_and_expires() {
    let test = "macvlan_conflict_is_quarantined_replaced_and_expires";
    let pools = ippool(
        "underlay",
        "10.96.0.0/24",
        Some("10.96.0.1"),
        &["10.96.0.100-10.96.0.109"],
    );
    let flags = [("--probe-conflict", ""), ("--quarantine-seconds", "2")];
    let Some(lab) = Lab::with_flags(test, &pools, &flags) else {
        return;
    };
    let (_foreign, parent, foreign_mac) = foreign_host(&lab.host, &["10.96.0.100/24"]);
    let conf = macvlan_conf(
        "1.0.0",
        "allot-e2e-macvlan-probe",
        &parent,
        allot_ipam(&lab.agent.socket(), &["underlay"], &[]),
    );
    let pod = Attachment::new("mv-dad");
    let add = lab.cni("macvlan", "ADD", &pod, &conf);
    add.expect_ok();
    assert_eq!(add.ip(), "10.96.0.101/24", "{add}");
    assert!(add.stderr.contains(&foreign_mac), "{add}");
    assert_eq!(pod.addrs(), ["10.96.0.101/24"]);
    assert!(
        pod.netns.ping("10.96.0.100"),
        "the pod reaches the foreign host over the macvlan"
    );
    assert_eq!(metric(&lab.agent, "allot_conflicts_total"), 1.0);

    lab.eventually(
        "the quarantine expires and 10.96.0.100 is free again",
        Duration::from_secs(30),
        || lab.agent.pool_counts("underlay") == (10, 9) && quarantined(&lab.agent).is_empty(),
    );
    assert_eq!(metric(&lab.agent, "allot_quarantined_addresses"), 0.0);
    lab.cni("macvlan", "DEL", &pod, &conf).expect_ok();
    assert_eq!(lab.agent.pool_counts("underlay"), (10, 10));
}
