//! Duplicate address detection against a real foreign host (the kernel of the peer namespace)
//! and against a host probing for the same address, both families; and the announcement, as
//! the peer's neighbour table and a capture see it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use crate::common::*;
use allot_probe::frame::{self, Neighbor};
use allot_probe::{ProbeConfig, ProbeOutcome, announce, probe_conflict};

fn conflict_with_the_holders_mac(addr: IpAddr) {
    let lab = Lab::new();
    lab.peer.hold(IF, addr);
    let cfg = ProbeConfig::default();
    let (out, took) = timed(|| probe_conflict(lab.pod.path(), IF, addr, cfg));
    assert_eq!(out.unwrap(), ProbeOutcome::Conflict { mac: PEER_MAC });
    eprintln!("conflict on {addr} found in {took:?}");
    assert!(took < cfg.timeout + SLACK, "took {took:?}");
}

#[test]
fn an_ipv4_address_held_by_another_host_is_a_conflict_with_its_mac() {
    conflict_with_the_holders_mac(v4(10));
}

#[test]
fn an_ipv6_address_held_by_another_host_is_a_conflict_with_its_mac() {
    conflict_with_the_holders_mac(v6(0x10));
}

fn free_after_tries_times_timeout(addr: IpAddr) {
    let lab = Lab::new();
    // The peer holds a neighbour of the address: answering is not the point, silence is.
    lab.peer
        .hold(IF, if addr.is_ipv4() { v4(11) } else { v6(0x11) });
    let cfg = ProbeConfig::default();
    let window = cfg.timeout * cfg.tries;
    let (out, took) = timed(|| probe_conflict(lab.pod.path(), IF, addr, cfg));
    assert_eq!(out.unwrap(), ProbeOutcome::Free);
    eprintln!("{addr} free after {took:?} (window {window:?})");
    assert!(
        took >= window,
        "answered before listening long enough: {took:?}"
    );
    assert!(took < window + SLACK, "took {took:?}");
}

#[test]
fn a_free_ipv4_address_is_free_after_tries_times_timeout() {
    free_after_tries_times_timeout(v4(10));
}

#[test]
fn a_free_ipv6_address_is_free_after_tries_times_timeout() {
    free_after_tries_times_timeout(v6(0x10));
}

#[test]
fn tries_and_timeout_are_honoured() {
    let lab = Lab::new();
    let cfg = ProbeConfig {
        tries: 5,
        timeout: Duration::from_millis(30),
        ..ProbeConfig::default()
    };
    let capture = Raw::open(&lab.peer, IF);
    let (out, took) = timed(|| probe_conflict(lab.pod.path(), IF, v4(12), cfg));
    assert_eq!(out.unwrap(), ProbeOutcome::Free);
    assert!(took >= Duration::from_millis(150) && took < Duration::from_millis(150) + SLACK);
    let probes = capture.capture(Duration::from_millis(100), |f| {
        frame::parse(f)
            == Some(Neighbor::Arp {
                op: frame::ARP_REQUEST,
                sha: POD_MAC,
                spa: Ipv4Addr::UNSPECIFIED,
                tha: allot_probe::MacAddr::ZERO,
                tpa: Ipv4Addr::new(192, 0, 2, 12),
            })
    });
    assert_eq!(probes.len(), 5, "one ARP probe per try, from 0.0.0.0");
}

/// Another host runs its own duplicate address detection for the address while we probe.
fn contested(addr: IpAddr) {
    const OTHER: allot_probe::MacAddr = allot_probe::MacAddr([0x02, 0xa1, 0, 0, 0, 0x99]);
    let lab = Lab::new();
    let frame = match addr {
        IpAddr::V4(a) => frame::arp_probe(OTHER, a),
        IpAddr::V6(a) => frame::neighbor_solicitation(OTHER, Ipv6Addr::UNSPECIFIED, a),
    };
    let _prober = Flood::start(Raw::open(&lab.peer, IF), vec![frame]);
    let out = probe_conflict(lab.pod.path(), IF, addr, ProbeConfig::default()).unwrap();
    assert_eq!(out, ProbeOutcome::Contested { mac: OTHER });
    assert!(!out.is_free());
}

#[test]
fn another_host_probing_for_the_ipv4_address_contests_it() {
    contested(v4(13));
}

#[test]
fn another_host_probing_for_the_ipv6_address_contests_it() {
    contested(v6(0x13));
}

/// The peer had the address at an old MAC; after the announcement it has it at the pod's.
/// The pod's link is up here: raising and lowering it would take the carrier of the peer's
/// veth end along, and the peer's kernel flushes its neighbour entries when the carrier goes
/// (a host behind a bridge or a switch keeps them; `link_state.rs` announces over a link that
/// was down).
fn announcement_updates_the_peer(addr: IpAddr) {
    let lab = Lab::new().pod_up();
    let old = "02:a1:00:00:00:77";
    lab.peer.ip(&[
        "neigh",
        "replace",
        &addr.to_string(),
        "lladdr",
        old,
        "dev",
        IF,
        "nud",
        "stale",
    ]);
    assert_eq!(lab.peer.neighbour(IF, addr).as_deref(), Some(old));
    let capture = Raw::open(&lab.peer, IF);
    announce(lab.pod.path(), IF, addr).unwrap();
    let seen = capture.capture(Duration::from_millis(300), |f| {
        matches!(frame::parse(f), Some(Neighbor::Arp { spa, .. }) if IpAddr::V4(spa) == addr)
            || matches!(frame::parse(f), Some(Neighbor::Advertisement { target, .. }) if IpAddr::V6(target) == addr)
    });
    assert_eq!(seen.len(), 1, "one announcement");
    let want = match addr {
        IpAddr::V4(a) => Neighbor::Arp {
            op: frame::ARP_REQUEST,
            sha: POD_MAC,
            spa: a,
            tha: allot_probe::MacAddr::ZERO,
            tpa: a,
        },
        IpAddr::V6(a) => Neighbor::Advertisement {
            eth_src: POD_MAC,
            src: a,
            target: a,
            flags: frame::NA_OVERRIDE,
            target_ll: Some(POD_MAC),
        },
    };
    assert_eq!(frame::parse(&seen[0]), Some(want));
    let broadcast_or_all_nodes = if addr.is_ipv4() {
        [0xff; 6]
    } else {
        [0x33, 0x33, 0, 0, 0, 1]
    };
    assert_eq!(&seen[0][..6], &broadcast_or_all_nodes);
    assert_eq!(
        lab.peer.neighbour(IF, addr).as_deref(),
        Some(POD_MAC.to_string().as_str()),
        "the peer's kernel took the announcement"
    );
    assert!(lab.pod.is_up(IF), "a link that was up stays up");
}

#[test]
fn a_gratuitous_arp_updates_the_peers_neighbour_table() {
    announcement_updates_the_peer(v4(14));
}

#[test]
fn an_unsolicited_advertisement_updates_the_peers_neighbour_table() {
    announcement_updates_the_peer(v6(0x14));
}
