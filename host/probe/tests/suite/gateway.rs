//! Gateway reachability, both families: the peer's kernel as the gateway, or nobody.

use std::net::{IpAddr, Ipv6Addr};

use crate::common::*;
use allot_probe::frame;
use allot_probe::{GatewayOutcome, ProbeConfig, ProbeOutcome, probe_gateway, with_link};

fn reachable(gateway: IpAddr) {
    let lab = Lab::new();
    lab.peer.hold(IF, gateway);
    let cfg = ProbeConfig::default();
    let (out, took) = timed(|| probe_gateway(lab.pod.path(), IF, gateway, cfg));
    assert_eq!(out.unwrap(), GatewayOutcome::Reachable { mac: PEER_MAC });
    eprintln!("gateway {gateway} answered in {took:?}");
    assert!(took < cfg.timeout + SLACK, "took {took:?}");
}

#[test]
fn an_ipv4_gateway_that_answers_is_reachable() {
    reachable(v4(1));
}

#[test]
fn an_ipv6_gateway_that_answers_is_reachable() {
    reachable(v6(1));
}

fn unreachable(gateway: IpAddr) {
    // The pod's link is up here, and stays up.
    let lab = Lab::new().pod_up();
    let cfg = ProbeConfig::default();
    let (out, took) = timed(|| probe_gateway(lab.pod.path(), IF, gateway, cfg));
    assert_eq!(out.unwrap(), GatewayOutcome::Unreachable);
    let window = cfg.timeout * cfg.tries;
    assert!(took >= window && took < window + SLACK, "took {took:?}");
    assert!(lab.pod.is_up(IF), "{}", lab.pod.flags(IF));
}

#[test]
fn an_ipv4_gateway_nobody_holds_is_unreachable() {
    unreachable(v4(1));
}

#[test]
fn an_ipv6_gateway_nobody_holds_is_unreachable() {
    unreachable(v6(1));
}

/// A host probing for the gateway's address is not the gateway.
#[test]
fn another_hosts_probe_for_the_gateway_address_is_not_an_answer() {
    let lab = Lab::new();
    let (g4, g6) = (v4(1), v6(1));
    let (IpAddr::V4(a4), IpAddr::V6(a6)) = (g4, g6) else {
        unreachable!()
    };
    let frames = vec![
        frame::arp_probe(PEER_MAC, a4),
        frame::neighbor_solicitation(PEER_MAC, Ipv6Addr::UNSPECIFIED, a6),
    ];
    let _prober = Flood::start(Raw::open(&lab.peer, IF), frames);
    for g in [g4, g6] {
        let out = probe_gateway(lab.pod.path(), IF, g, ProbeConfig::default()).unwrap();
        assert_eq!(out, GatewayOutcome::Unreachable, "{g}");
    }
}

/// What the IPAM plugin does on an ADD: conflict probes before the gateway probes, one at a
/// time, and the announcements, in one namespace entry and one raise of the link.
#[test]
fn a_dual_stack_add_in_one_entry() {
    let lab = Lab::new();
    lab.peer.hold(IF, v4(1));
    lab.peer.hold(IF, v6(1));
    let capture = Raw::open(&lab.peer, IF);
    let (result, took) = timed(|| {
        with_link(lab.pod.path(), IF, ProbeConfig::default(), |link| {
            assert!(link.was_down());
            assert_eq!(link.mac(), POD_MAC);
            assert_eq!(link.name(), IF);
            let mut out = Vec::new();
            for addr in [v4(20), v6(0x20)] {
                out.push(format!("{:?}", link.probe_conflict(addr)?));
            }
            for gw in [v4(1), v6(1)] {
                out.push(format!("{:?}", link.probe_gateway(gw)?));
            }
            for addr in [v4(20), v6(0x20)] {
                link.announce(addr)?;
            }
            Ok(out)
        })
    });
    let free = format!("{:?}", ProbeOutcome::Free);
    let reachable = format!("{:?}", GatewayOutcome::Reachable { mac: PEER_MAC });
    assert_eq!(
        result.unwrap(),
        vec![free.clone(), free, reachable.clone(), reachable]
    );
    eprintln!("dual-stack ADD probes took {took:?}");
    assert!(!lab.pod.is_up(IF), "set down again: {}", lab.pod.flags(IF));
    let announced = capture.capture(
        std::time::Duration::from_millis(200),
        |f| match frame::parse(f) {
            Some(frame::Neighbor::Arp { spa, tpa, .. }) => spa == tpa,
            Some(frame::Neighbor::Advertisement { flags, .. }) => flags == frame::NA_OVERRIDE,
            _ => false,
        },
    );
    // The capture started before the probes, so it holds everything they sent.
    assert_eq!(announced.len(), 2, "one announcement per address");
}
