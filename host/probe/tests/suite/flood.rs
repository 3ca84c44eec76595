//! A link busy with ARP and NDP traffic about other addresses (and look-alikes about the probed
//! one that are not answers) neither makes a probe report a conflict nor hides a real one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::common::*;
use allot_probe::frame::{self, MacAddr};
use allot_probe::{GatewayOutcome, ProbeConfig, ProbeOutcome, probe_conflict, probe_gateway};

/// Hosts that talk a lot, none of them the peer.
fn noisy(i: usize) -> MacAddr {
    MacAddr([0x02, 0xf1, 0, 0, (i >> 8) as u8, i as u8])
}

/// Traffic that says nothing about who holds `target`.
fn unrelated(target: IpAddr) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for i in 0..32usize {
        let mac = noisy(i);
        let other4 = Ipv4Addr::new(192, 0, 2, 100 + i as u8);
        let other6: Ipv6Addr = format!("{SUBNET6}::1:{i:x}").parse().unwrap();
        let ll: Ipv6Addr = format!("fe80::f1:{i:x}").parse().unwrap();
        // Gratuitous ARP, ARP probes, replies and requests, all about other addresses.
        frames.push(frame::arp_announcement(mac, other4));
        frames.push(frame::arp_probe(mac, other4));
        frames.push(frame::arp(
            frame::ARP_REPLY,
            POD_MAC,
            mac,
            other4,
            POD_MAC,
            Ipv4Addr::UNSPECIFIED,
        ));
        frames.push(frame::unsolicited_advertisement(mac, other6));
        frames.push(frame::neighbor_solicitation(
            mac,
            Ipv6Addr::UNSPECIFIED,
            other6,
        ));
        frames.push(frame::neighbor_solicitation(mac, ll, other6));
        match target {
            IpAddr::V4(t) => {
                // Someone resolving the address: not its holder.
                frames.push(frame::arp(
                    frame::ARP_REQUEST,
                    MacAddr::BROADCAST,
                    mac,
                    other4,
                    MacAddr::ZERO,
                    t,
                ));
                // Our own probe, reflected (a hairpinning bridge).
                frames.push(frame::arp_probe(POD_MAC, t));
                // A truncated reply from the address.
                let reply = frame::arp(frame::ARP_REPLY, POD_MAC, mac, t, POD_MAC, t);
                frames.push(reply[..14 + 20].to_vec());
            }
            IpAddr::V6(t) => {
                frames.push(frame::neighbor_solicitation(mac, ll, t));
                frames.push(frame::neighbor_solicitation(
                    POD_MAC,
                    Ipv6Addr::UNSPECIFIED,
                    t,
                ));
                // An advertisement for the address that came through a router (hop limit
                // 64), and one with a broken checksum: both invalid.
                let mut routed = frame::unsolicited_advertisement(mac, t);
                routed[21] = 64;
                frames.push(routed);
                let mut broken = frame::unsolicited_advertisement(mac, t);
                broken[60] ^= 0x10;
                frames.push(broken);
            }
        }
    }
    frames
}

fn busy_link(target: IpAddr, held: bool) {
    let lab = Lab::new();
    if held {
        lab.peer.hold(IF, target);
    }
    let flood = Flood::start(Raw::open(&lab.peer, IF), unrelated(target));
    let cfg = ProbeConfig::default();
    let before = flood.sent();
    let (out, took) = timed(|| probe_conflict(lab.pod.path(), IF, target, cfg));
    let during = flood.sent() - before;
    eprintln!("{target} (held: {held}) probed in {took:?} among {during} unrelated frames");
    if held {
        assert_eq!(out.unwrap(), ProbeOutcome::Conflict { mac: PEER_MAC });
        assert!(took < cfg.timeout + SLACK, "took {took:?}");
    } else {
        assert_eq!(out.unwrap(), ProbeOutcome::Free);
        let window = cfg.timeout * cfg.tries;
        assert!(took >= window && took < window + SLACK, "took {took:?}");
        assert!(during > 500, "only {during} frames: no flood to speak of");
    }
}

#[test]
fn unrelated_arp_traffic_does_not_make_a_conflict() {
    busy_link(v4(30), false);
}

#[test]
fn unrelated_arp_traffic_does_not_hide_a_conflict() {
    busy_link(v4(30), true);
}

#[test]
fn unrelated_ndp_traffic_does_not_make_a_conflict() {
    busy_link(v6(0x30), false);
}

#[test]
fn unrelated_ndp_traffic_does_not_hide_a_conflict() {
    busy_link(v6(0x30), true);
}

#[test]
fn a_busy_link_does_not_hide_the_gateway() {
    let lab = Lab::new();
    lab.peer.hold(IF, v4(1));
    lab.peer.hold(IF, v6(1));
    let mut frames = unrelated(v4(1));
    frames.extend(unrelated(v6(1)));
    let _flood = Flood::start(Raw::open(&lab.peer, IF), frames);
    for g in [v4(1), v6(1)] {
        let out = probe_gateway(lab.pod.path(), IF, g, ProbeConfig::default()).unwrap();
        assert_eq!(out, GatewayOutcome::Reachable { mac: PEER_MAC }, "{g}");
    }
}
