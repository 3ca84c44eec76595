//! Probing ahead end to end: an agent with `--probe-ahead` running in the lab's host namespace
//! (as a node's agent runs in the node's) keeps the next addresses of each pool probed from
//! the parent link the bridge and macvlan plugins hang pods from; an ADD handed one of them is
//! answered with it listed as probed ahead, and the plugin does not probe it in the pod's
//! namespace. Foreign hosts on the segment are namespaces joined by veth pairs (or a macvlan
//! sibling) created here and removed on drop.

use std::net::IpAddr;
use std::thread;
use std::time::Duration;

use allot_e2e::probe::*;
use allot_e2e::*;
use serde_json::{Value, json};

const HITS: &str = "allot_probe_ahead_hits_total";
const MISSES: &str = "allot_probe_ahead_misses_total";
const PROBES: &str = "allot_probe_ahead_probes_total";

fn v4_pool(n: u8) -> String {
    ippool(
        "v4",
        &format!("10.8{n}.0.0/24"),
        Some(&format!("10.8{n}.0.1")),
        &[&format!("10.8{n}.0.100-10.8{n}.0.109")],
    )
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Waits until the agent has completed `n` probes ahead in all.
fn probed_ahead(lab: &Lab, n: f64) {
    lab.eventually(
        &format!("{n} probes ahead"),
        Duration::from_secs(30),
        || metric(&lab.agent, PROBES) >= n,
    );
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Bridge, dual stack: the first ADD teaches the agent the bridge and the pools (and is probed
/// in the pod's namespace); the agent then probes the next addresses and the gateways from the
/// bridge, and the second ADD gets its addresses without any probe of them from the pod.
#[test]
fn on_a_bridge_the_next_addresses_are_probed_ahead_and_the_pod_does_not_probe_them() {
    let test = "on_a_bridge_the_next_addresses_are_probed_ahead";
    let pools = format!(
        "{}{}",
        v4_pool(1),
        ippool(
            "v6",
            "fd00:81::/64",
            Some("fd00:81::1"),
            &["fd00:81::100-fd00:81::109"]
        )
    );
    let flags = [("--probe-ahead", ""), ("--probe-ahead-fresh-seconds", "60")];
    let Some(lab) = Lab::in_host(test, &pools, &flags) else {
        return;
    };
    bridge_with(&lab.host, &lab.bridge, &["10.81.0.1/24", "fd00:81::1/64"]);
    let conf = with_probe(
        lab.bridge_conf(&["v4"], &["v6"]),
        json!({"conflict": true, "gateway": true}),
    );
    let capture = Capture::start(&lab.host, &lab.bridge);
    let first = Attachment::new("pa-1");
    let add = lab.bridge_add(&first, &conf);
    assert_eq!(sorted(add.ips()), ["10.81.0.100/24", "fd00:81::100/64"]);
    assert_eq!(metric(&lab.agent, HITS), 0.0);
    assert_eq!(
        metric(&lab.agent, MISSES),
        2.0,
        "nothing was probed ahead yet"
    );

    // Two candidates and a gateway per family.
    probed_ahead(&lab, 6.0);
    // (A bridge takes the lowest MAC of its ports: read it before the next port joins.)
    let bridge_mac = mac_of(&lab.host, &lab.bridge);
    let second = Attachment::new("pa-2");
    let add = lab.bridge_add(&second, &conf);
    let frames = capture.finish();
    assert_eq!(sorted(add.ips()), ["10.81.0.101/24", "fd00:81::101/64"]);
    assert_eq!(metric(&lab.agent, HITS), 2.0, "{add}");
    assert!(
        add.stderr.contains(&format!(
            "10.81.0.101, fd00:81::101, gateway 10.81.0.1, gateway fd00:81::1 probed ahead from {}",
            lab.bridge
        )),
        "{add}"
    );

    let probes = probe_frames(&frames);
    let first_mac = mac_of(&first.netns, "eth0");
    let second_mac = mac_of(&second.netns, "eth0");
    let count = |mac: &str, target: &str| {
        probes
            .iter()
            .filter(|(m, a)| m == mac && *a == ip(target))
            .count()
    };
    // The first pod probed its address itself; the second's was probed from the bridge, and
    // the second pod sent no ARP probe at all (its IPv6 address the kernel probes itself
    // when the bridge plugin adds it).
    assert!(count(&first_mac, "10.81.0.100") >= 3, "{probes:?}");
    assert!(count(&bridge_mac, "10.81.0.101") >= 3, "{probes:?}");
    // The gateways are the bridge's own addresses: answering, known without a frame.
    assert_eq!(count(&bridge_mac, "10.81.0.1"), 0, "{probes:?}");
    let from_second_v4 = probes
        .iter()
        .filter(|(m, a)| *m == second_mac && a.is_ipv4())
        .count();
    assert_eq!(from_second_v4, 0, "{probes:?}");
    assert!(second.netns.ping("10.81.0.1"));
}

/// macvlan: probes go out of a macvlan sibling the agent makes on the master, so a foreign
/// macvlan on the same master (which the master itself could never hear) is found and
/// quarantined before any pod is given its address; the next pod's address is probed ahead;
/// the sibling goes away with the agent.
#[test]
fn on_macvlan_a_sibling_port_probes_ahead_and_sees_other_macvlans_of_the_master() {
    let test = "on_macvlan_a_sibling_port_probes_ahead";
    let flags = [("--probe-ahead", ""), ("--probe-ahead-fresh-seconds", "60")];
    let Some(mut lab) = Lab::in_host(test, &v4_pool(2), &flags) else {
        return;
    };
    // The wire: a router holding the gateway at the other end of the master.
    let (_router, master, _) = foreign_host(&lab.host, &["10.82.0.1/24"]);
    // A foreign macvlan of the same master, in a namespace of its own, holding .102.
    let sibling = Netns::new();
    let sibling_if = unique_name("ms");
    lab.host.ip(&[
        "link",
        "add",
        "link",
        &master,
        "name",
        &sibling_if,
        "type",
        "macvlan",
        "mode",
        "bridge",
    ]);
    lab.host
        .ip(&["link", "set", &sibling_if, "netns", sibling.name()]);
    sibling.ip(&["addr", "add", "10.82.0.102/24", "dev", &sibling_if, "nodad"]);
    sibling.ip(&["link", "set", &sibling_if, "up"]);
    let sibling_mac = mac_of(&sibling, &sibling_if);

    let conf = with_probe(
        macvlan_conf(
            "1.0.0",
            "allot-e2e-ahead-mv",
            &master,
            allot_ipam(&lab.agent.socket(), &["v4"], &[]),
        ),
        json!({"conflict": true, "gateway": true}),
    );
    let first = Attachment::new("pm-1");
    let add = lab.cni("macvlan", "ADD", &first, &conf);
    add.expect_ok();
    assert_eq!(add.ip(), "10.82.0.100/24");

    lab.eventually(
        "the foreign macvlan's address is quarantined ahead",
        Duration::from_secs(30),
        || quarantined(&lab.agent) == [("10.82.0.102".to_string(), sibling_mac.clone())],
    );
    let index: Value =
        serde_json::from_str(&lab.host.ip(&["-j", "link", "show", "dev", &master])).unwrap();
    let port = format!("allotp{}", index[0]["ifindex"]);
    assert!(lab.host.link_exists(&port), "no probe port {port}");
    // .101, .103 and the gateway.
    probed_ahead(&lab, 4.0);
    let second = Attachment::new("pm-2");
    let add = lab.cni("macvlan", "ADD", &second, &conf);
    add.expect_ok();
    assert_eq!(add.ip(), "10.82.0.101/24");
    assert_eq!(metric(&lab.agent, HITS), 1.0, "{add}");
    assert!(
        add.stderr.contains(&format!(
            "10.82.0.101, gateway 10.82.0.1 probed ahead from {master}"
        )),
        "{add}"
    );
    let third = Attachment::new("pm-3");
    let add = lab.cni("macvlan", "ADD", &third, &conf);
    add.expect_ok();
    assert_eq!(
        add.ip(),
        "10.82.0.103/24",
        "the quarantined .102 is skipped"
    );
    assert!(third.netns.ping("10.82.0.1"));

    lab.agent.stop();
    assert!(
        !lab.host.link_exists(&port),
        "the probe port {port} outlived the agent"
    );
}

/// A host that takes an address after it was found free (without announcing it) is found by
/// the re-check once the verdict is half its freshness old, and quarantined with its MAC
/// before any pod is handed the address; the next ADD gets the address after it.
#[test]
fn a_host_appearing_on_a_probed_ahead_address_is_caught_by_the_recheck() {
    let test = "a_host_appearing_on_a_probed_ahead_address";
    let flags = [("--probe-ahead", ""), ("--probe-ahead-fresh-seconds", "2")];
    let Some(lab) = Lab::in_host(test, &v4_pool(3), &flags) else {
        return;
    };
    bridge_with(&lab.host, &lab.bridge, &["10.83.0.1/24"]);
    let conf = with_probe(lab.bridge_conf(&["v4"], &[]), json!({"conflict": true}));
    let first = Attachment::new("pr-1");
    assert_eq!(lab.bridge_add(&first, &conf).ip(), "10.83.0.100/24");
    probed_ahead(&lab, 2.0);
    assert!(quarantined(&lab.agent).is_empty());

    let (_foreign, port, foreign_mac) = foreign_host(&lab.host, &["10.83.0.101/24"]);
    lab.host.ip(&["link", "set", &port, "master", &lab.bridge]);
    lab.eventually(
        "the re-check quarantines 10.83.0.101",
        Duration::from_secs(20),
        || quarantined(&lab.agent) == [("10.83.0.101".to_string(), foreign_mac.clone())],
    );
    assert_eq!(metric(&lab.agent, "allot_conflicts_total"), 1.0);
    assert!(
        lab.agent.log().contains(&foreign_mac),
        "{}",
        lab.agent.log()
    );
    let second = Attachment::new("pr-2");
    let add = lab.bridge_add(&second, &conf);
    assert_eq!(add.ip(), "10.83.0.102/24", "{add}");
}

/// Without `--probe-ahead` the agent sends nothing from the parent link, even with probing on
/// (the ADD's own probes come from the pod); with it, the candidates are probed from the
/// bridge again and again while no ADD runs.
#[test]
fn probing_ahead_off_sends_nothing_from_the_parent_link() {
    let test = "probing_ahead_off_sends_nothing_from_the_parent_link";
    for ahead in [false, true] {
        let mut flags = vec![("--probe-conflict", ""), ("--probe-gateway", "")];
        if ahead {
            flags.extend([("--probe-ahead", ""), ("--probe-ahead-fresh-seconds", "1")]);
        }
        let Some(lab) = Lab::in_host(test, &v4_pool(4), &flags) else {
            return;
        };
        bridge_with(&lab.host, &lab.bridge, &["10.84.0.1/24"]);
        // No probe section: the agent's defaults.
        let conf = lab.bridge_conf(&["v4"], &[]);
        let pod = Attachment::new("po");
        assert_eq!(lab.bridge_add(&pod, &conf).ip(), "10.84.0.100/24");
        let capture = Capture::start(&lab.host, &lab.bridge);
        thread::sleep(Duration::from_secs(2));
        let probes = probe_frames(&capture.finish());
        let bridge_mac = mac_of(&lab.host, &lab.bridge);
        let in_pool = probes
            .iter()
            .filter(|(_, a)| matches!(a, IpAddr::V4(v) if v.octets()[..3] == [10, 84, 0]))
            .collect::<Vec<_>>();
        if ahead {
            assert!(
                in_pool.len() >= 3 && in_pool.iter().all(|(m, _)| *m == bridge_mac),
                "{probes:?}"
            );
        } else {
            assert!(in_pool.is_empty(), "probes while no ADD ran: {probes:?}");
            assert_eq!(metric(&lab.agent, PROBES), 0.0);
        }
    }
}
