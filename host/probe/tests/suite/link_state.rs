//! The interface as the main plugin leaves it when it calls IPAM: a macvlan, moved into the pod
//! namespace and still DOWN, on a parent in another namespace (the "node"). The probe raises
//! it, probes through it, and leaves it DOWN again. Also: no carrier, no such interface, not
//! Ethernet.

use std::time::Duration;

use crate::common::*;
use allot_probe::frame::{self, Neighbor};
use allot_probe::{ProbeConfig, ProbeError, ProbeOutcome, announce, probe_conflict, with_link};

/// node: `par0` (a veth: dummy links cannot be made here) whose other end is the peer's
/// `eth0`; pod: `eth0`, a bridge-mode macvlan on `par0`, DOWN.
struct MacvlanLab {
    pod: Netns,
    peer: Netns,
    node: Netns,
}

impl MacvlanLab {
    fn new() -> MacvlanLab {
        let node = Netns::new("node");
        let pod = Netns::new("pod");
        let peer = Netns::new("peer");
        node.ip(&[
            "link",
            "add",
            "par0",
            "index",
            "30",
            "type",
            "veth",
            "peer",
            "name",
            IF,
            "index",
            "40",
            "address",
            &PEER_MAC.to_string(),
            "netns",
            peer.name(),
        ]);
        node.ip(&["link", "set", "par0", "up"]);
        peer.ip(&["link", "set", IF, "up"]);
        node.ip(&[
            "link",
            "add",
            "mv0",
            "index",
            "50",
            "link",
            "par0",
            "address",
            &POD_MAC.to_string(),
            "type",
            "macvlan",
            "mode",
            "bridge",
        ]);
        node.ip(&["link", "set", "mv0", "netns", pod.name()]);
        pod.ip(&["link", "set", "mv0", "name", IF]);
        assert!(!pod.is_up(IF), "{}", pod.flags(IF));
        MacvlanLab { pod, peer, node }
    }
}

#[test]
fn a_down_macvlan_is_raised_for_the_probe_and_set_down_again() {
    let lab = MacvlanLab::new();
    for addr in [v4(40), v6(0x40)] {
        lab.peer.hold(IF, addr);
        let out = probe_conflict(lab.pod.path(), IF, addr, ProbeConfig::default()).unwrap();
        assert_eq!(out, ProbeOutcome::Conflict { mac: PEER_MAC }, "{addr}");
        assert!(!lab.pod.is_up(IF), "{addr}: {}", lab.pod.flags(IF));
    }
    for addr in [v4(41), v6(0x41)] {
        let out = probe_conflict(lab.pod.path(), IF, addr, ProbeConfig::default()).unwrap();
        assert_eq!(out, ProbeOutcome::Free, "{addr}");
        assert!(!lab.pod.is_up(IF), "{addr}: {}", lab.pod.flags(IF));
    }
}

#[test]
fn an_announcement_over_a_down_macvlan_goes_out() {
    let lab = MacvlanLab::new();
    let capture = Raw::open(&lab.peer, IF);
    announce(lab.pod.path(), IF, v4(42)).unwrap();
    announce(lab.pod.path(), IF, v6(0x42)).unwrap();
    let seen = capture.capture(Duration::from_millis(300), |f| {
        matches!(
            frame::parse(f),
            Some(Neighbor::Arp { sha: POD_MAC, .. })
                | Some(Neighbor::Advertisement {
                    target_ll: Some(POD_MAC),
                    ..
                })
        )
    });
    assert_eq!(seen.len(), 2, "a gratuitous ARP and an advertisement");
    assert!(!lab.pod.is_up(IF), "{}", lab.pod.flags(IF));
}

#[test]
fn a_link_without_carrier_is_an_error_not_free() {
    let lab = MacvlanLab::new();
    lab.node.ip(&["link", "set", "par0", "down"]);
    let cfg = ProbeConfig {
        carrier_timeout: Duration::from_millis(200),
        ..ProbeConfig::default()
    };
    let (out, took) = timed(|| probe_conflict(lab.pod.path(), IF, v4(43), cfg));
    let e = out.unwrap_err();
    assert!(matches!(e, ProbeError::NoCarrier { .. }), "{e}");
    assert!(e.to_string().contains("parent"), "{e}");
    assert!(took >= cfg.carrier_timeout && took < cfg.carrier_timeout + SLACK);
    assert!(!lab.pod.is_up(IF), "{}", lab.pod.flags(IF));
}

#[test]
fn a_veth_whose_peer_is_down_has_no_carrier_either() {
    let lab = Lab::new();
    lab.peer.ip(&["link", "set", IF, "down"]);
    let cfg = ProbeConfig {
        carrier_timeout: Duration::from_millis(100),
        ..ProbeConfig::default()
    };
    let e = probe_conflict(lab.pod.path(), IF, v6(0x43), cfg).unwrap_err();
    assert!(matches!(e, ProbeError::NoCarrier { .. }), "{e}");
    assert!(!lab.pod.is_up(IF));
}

#[test]
fn a_link_that_was_up_stays_up() {
    let lab = Lab::new().pod_up();
    lab.peer.hold(IF, v4(44));
    let was_down = with_link(lab.pod.path(), IF, ProbeConfig::default(), |link| {
        assert_eq!(
            link.probe_conflict(v4(44))?,
            ProbeOutcome::Conflict { mac: PEER_MAC }
        );
        Ok(link.was_down())
    })
    .unwrap();
    assert!(!was_down);
    assert!(lab.pod.is_up(IF));
}

#[test]
fn an_error_inside_with_link_still_sets_the_link_down() {
    let lab = Lab::new();
    let e = with_link(lab.pod.path(), IF, ProbeConfig::default(), |link| {
        assert!(link.was_down());
        link.probe_conflict("0.0.0.0".parse().unwrap())
    })
    .unwrap_err();
    assert!(matches!(e, ProbeError::Address { .. }), "{e}");
    assert!(!lab.pod.is_up(IF), "{}", lab.pod.flags(IF));
    // A panic too: the link's drop restores it, and the panic comes back as an error.
    let e = with_link(
        lab.pod.path(),
        IF,
        ProbeConfig::default(),
        |_| -> Result<(), _> { panic!("a bug in the caller's closure") },
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("a bug in the caller's closure"),
        "{e}"
    );
    assert!(!lab.pod.is_up(IF), "{}", lab.pod.flags(IF));
}

#[test]
fn a_missing_interface_says_so() {
    let lab = Lab::new();
    let e = probe_conflict(lab.pod.path(), "net1", v4(45), ProbeConfig::default()).unwrap_err();
    assert!(matches!(e, ProbeError::NoSuchInterface { .. }), "{e}");
    assert!(e.to_string().contains("\"net1\"") && e.to_string().contains("CNI_IFNAME"));
    let e = probe_conflict(lab.pod.path(), "lo", v4(45), ProbeConfig::default()).unwrap_err();
    assert!(matches!(e, ProbeError::NotEthernet { .. }), "{e}");
}
