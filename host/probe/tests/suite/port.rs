//! The macvlan probe port probing ahead uses on a master in the node's namespace: it is made
//! in bridge mode, up, without ARP or IPv6 addresses, sends nothing of its own, hears a sibling
//! macvlan (which the master itself cannot), never changes the master, replaces a stale port of
//! its own name but no other link, and goes away when dropped.

use std::thread;
use std::time::Duration;

use crate::common::*;
use allot_probe::{
    MacAddr, MacvlanPort, ProbeConfig, ProbeError, ProbeOutcome, in_netns, link_kind,
    with_host_link,
};

/// node: `par0`, a veth whose other end is the peer's `eth0` (the wire); a foreign macvlan of
/// `par0` in its own namespace holds `v4(50)` and `v6(0x50)`.
struct PortLab {
    node: Netns,
    peer: Netns,
    _sibling: Netns,
}

fn lab() -> PortLab {
    let node = Netns::new("node");
    let peer = Netns::new("peer");
    let sibling = Netns::new("sibling");
    node.ip(&[
        "link",
        "add",
        "par0",
        "type",
        "veth",
        "peer",
        "name",
        IF,
        "netns",
        peer.name(),
    ]);
    node.ip(&["link", "set", "par0", "up"]);
    peer.ip(&["link", "set", IF, "up"]);
    node.ip(&[
        "link",
        "add",
        "link",
        "par0",
        "name",
        "sib0",
        "address",
        &POD_MAC.to_string(),
        "type",
        "macvlan",
        "mode",
        "bridge",
    ]);
    node.ip(&["link", "set", "sib0", "netns", sibling.name()]);
    sibling.ip(&["link", "set", "sib0", "up"]);
    sibling.hold("sib0", v4(50));
    sibling.hold("sib0", v6(0x50));
    PortLab {
        node,
        peer,
        _sibling: sibling,
    }
}

fn quick() -> ProbeConfig {
    ProbeConfig {
        tries: 2,
        timeout: Duration::from_millis(50),
        carrier_timeout: Duration::ZERO,
    }
}

#[test]
fn the_port_sees_a_sibling_macvlan_that_the_master_cannot() {
    let lab = lab();
    let capture = Raw::open(&lab.peer, IF);
    let (name, from_master, from_port) = in_netns(lab.node.path(), || {
        let from_master = with_host_link("par0", quick(), |l| l.probe_conflict(v4(50)))?;
        let port = MacvlanPort::create("par0")?;
        let mut seen = Vec::new();
        for addr in [v4(50), v6(0x50), v4(51)] {
            seen.push(with_host_link(port.name(), quick(), |l| {
                l.probe_conflict(addr)
            })?);
        }
        Ok((port.name().to_string(), from_master, seen))
    })
    .unwrap();
    assert_eq!(
        from_master,
        ProbeOutcome::Free,
        "the master never hears its macvlans"
    );
    assert_eq!(
        from_port,
        [
            ProbeOutcome::Conflict { mac: POD_MAC },
            ProbeOutcome::Conflict { mac: POD_MAC },
            ProbeOutcome::Free
        ]
    );
    assert!(name.starts_with("allotp"), "{name}");
    assert!(!lab.node.flags("par0").is_empty());
    // Dropped inside the closure: gone.
    assert!(
        lab.node
            .ip(&["-o", "link", "show"])
            .lines()
            .all(|l| !l.contains(&name))
    );
    drop(capture);
}

#[test]
fn the_port_is_quiet_and_leaves_the_master_alone() {
    let lab = lab();
    let before = lab.node.flags("par0");
    let capture = Raw::open(&lab.peer, IF);
    in_netns(lab.node.path(), || {
        let port = MacvlanPort::create("par0")?;
        let flags = lab.node.flags(port.name());
        assert!(flags.contains("UP") && flags.contains("NOARP"), "{flags}");
        let addrs = lab.node.ip(&["-o", "addr", "show", "dev", port.name()]);
        assert!(addrs.trim().is_empty(), "the port has addresses: {addrs}");
        let mac = lab.node.ip(&["-o", "link", "show", "dev", port.name()]);
        // Nothing of its own on the wire for a while (an IPv6 link-local address would have
        // sent duplicate address detection and router solicitations by now).
        thread::sleep(Duration::from_millis(1500));
        let own: Vec<Vec<u8>> = capture.capture(Duration::from_millis(10), |f| {
            let src = MacAddr([f[6], f[7], f[8], f[9], f[10], f[11]]).to_string();
            mac.contains(&src)
        });
        assert!(own.is_empty(), "the port sent {} frames", own.len());
        Ok(())
    })
    .unwrap();
    assert_eq!(lab.node.flags("par0"), before);
}

#[test]
fn a_stale_port_is_replaced_and_another_link_of_its_name_refused() {
    let lab = lab();
    let line = lab.node.ip(&["-o", "link", "show", "dev", "par0"]);
    let index = line.split(':').next().unwrap().trim();
    let name = format!("allotp{index}");
    // A port left by a killed agent: a macvlan of par0.
    lab.node.ip(&[
        "link", "add", "link", "par0", "name", &name, "type", "macvlan", "mode", "bridge",
    ]);
    in_netns(lab.node.path(), || {
        let port = MacvlanPort::create("par0")?;
        assert!(lab.node.flags(port.name()).contains("NOARP"), "replaced");
        Ok(())
    })
    .unwrap();
    // A link of that name that is not a macvlan of par0 is not ours.
    lab.node.ip(&[
        "link", "add", &name, "type", "veth", "peer", "name", "other0",
    ]);
    let kinds = in_netns(lab.node.path(), || {
        Ok([
            link_kind("par0"),
            link_kind(&name),
            link_kind("lo"),
            link_kind("nonexistent0"),
        ])
    })
    .unwrap();
    assert_eq!(
        kinds,
        [
            Some(Some("veth".to_string())),
            Some(Some("veth".to_string())),
            Some(None),
            None
        ]
    );
    let e = in_netns(lab.node.path(), || MacvlanPort::create("par0").map(drop)).unwrap_err();
    assert!(matches!(e, ProbeError::Io { .. }), "{e}");
    assert!(e.to_string().contains("is not a macvlan of par0"), "{e}");
    assert!(lab.node.flags(&name).contains("BROADCAST"), "left alone");
}
