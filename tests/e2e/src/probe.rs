//! Helpers of the probing tests and benchmark: foreign hosts on a segment, bridges with the
//! pools' gateways, the agent's metrics and quarantines, and frame captures.

use std::process::Command;

use serde_json::Value;

use crate::{Agent, Netns, bin, unique_name};

/// The MAC of `ifname` in `ns`.
pub fn mac_of(ns: &Netns, ifname: &str) -> String {
    let out = ns.ip(&["-j", "link", "show", "dev", ifname]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v[0]["address"].as_str().unwrap().to_string()
}

/// A foreign host on the segment: its own namespace, one end of a veth pair (`ifname` inside
/// it, up), the other end returned (in `host`, up) for the caller to plug into a bridge, or
/// to use as a macvlan master.
pub fn foreign_host(host: &Netns, addresses: &[&str]) -> (Netns, String, String) {
    let ns = Netns::new();
    let outside = unique_name("fh");
    let inside = unique_name("fn");
    host.ip(&[
        "link",
        "add",
        &outside,
        "type",
        "veth",
        "peer",
        "name",
        &inside,
        "netns",
        ns.name(),
    ]);
    host.ip(&["link", "set", &outside, "up"]);
    ns.ip(&["link", "set", &inside, "up"]);
    for a in addresses {
        // nodad: the address is the foreign host's at once (not tentative), as on a host that
        // has held it for a while.
        ns.ip(&["addr", "add", a, "dev", &inside, "nodad"]);
    }
    let mac = mac_of(&ns, &inside);
    (ns, outside, mac)
}

/// A bridge in `host` named `name`, up, with `addresses` (the pools' gateways), created before
/// the bridge plugin sees it: the plugin puts its gateway addresses on the bridge only after
/// IPAM has returned, too late for a gateway probe of the first pod.
pub fn bridge_with(host: &Netns, name: &str, addresses: &[&str]) {
    host.ip(&["link", "add", name, "type", "bridge"]);
    host.ip(&["link", "set", name, "up"]);
    for a in addresses {
        host.ip(&["addr", "add", a, "dev", name, "nodad"]);
    }
}

pub fn with_probe(mut conf: Value, probe: Value) -> Value {
    conf["ipam"]["probe"] = probe;
    conf
}

pub fn metric(agent: &Agent, name: &str) -> f64 {
    let (status, body) = agent.get("/metrics").expect("metrics");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{body}"))
}

/// `allotctl claims list -o json` on the agent's store.
pub fn claims(agent: &Agent) -> Vec<Value> {
    let out = Command::new(bin("allotctl"))
        .arg("--store")
        .arg(agent.state())
        .args(["claims", "list", "-o", "json"])
        .output()
        .expect("allotctl");
    assert!(out.status.success(), "allotctl: {out:?}");
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

pub fn quarantined(agent: &Agent) -> Vec<(String, String)> {
    let mut q: Vec<(String, String)> = claims(agent)
        .iter()
        .filter_map(|c| {
            Some((
                c["address"].as_str()?.to_string(),
                c["conflictMac"].as_str()?.to_string(),
            ))
        })
        .collect();
    q.sort();
    q
}

/// Frames seen on one interface of `ns` while a capture runs (see [`allot_lab::capture`]).
pub struct Capture(allot_lab::capture::Capture);

impl Capture {
    pub fn start(ns: &Netns, ifname: &str) -> Capture {
        Capture(allot_lab::capture::Capture::start(Some(ns.path()), ifname))
    }

    pub fn finish(self) -> Vec<Vec<u8>> {
        self.0.finish()
    }
}

/// ARP frames and IPv6 neighbour discovery messages (solicitations, advertisements) among
/// `frames` sent from `mac`.
pub fn neighbour_frames(frames: &[Vec<u8>], mac: &str) -> (usize, usize) {
    let mac: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let from = frames
        .iter()
        .filter(|f| f.len() >= 14 && f[6..12] == mac[..]);
    let (mut arp, mut ndp) = (0, 0);
    for f in from {
        match (f[12], f[13]) {
            (0x08, 0x06) => arp += 1,
            // IPv6, next header ICMPv6, type 135 or 136.
            (0x86, 0xdd) if f.len() > 54 && f[20] == 58 && matches!(f[54], 135 | 136) => ndp += 1,
            _ => {}
        }
    }
    (arp, ndp)
}

/// The probes among `frames`: ARP requests from 0.0.0.0 and Neighbor Solicitations from `::`
/// (duplicate address detection), as (sender MAC, probed address).
pub fn probe_frames(frames: &[Vec<u8>]) -> Vec<(String, std::net::IpAddr)> {
    let mac = |f: &[u8]| {
        f[6..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    let mut out = Vec::new();
    for f in frames.iter().filter(|f| f.len() >= 14) {
        match (f[12], f[13]) {
            (0x08, 0x06) if f.len() >= 42 && f[20..22] == [0, 1] && f[28..32] == [0; 4] => {
                let t: [u8; 4] = f[38..42].try_into().unwrap();
                out.push((mac(f), std::net::Ipv4Addr::from(t).into()));
            }
            (0x86, 0xdd)
                if f.len() >= 78 && f[20] == 58 && f[54] == 135 && f[22..38] == [0; 16] =>
            {
                let t: [u8; 16] = f[62..78].try_into().unwrap();
                out.push((mac(f), std::net::Ipv6Addr::from(t).into()));
            }
            _ => {}
        }
    }
    out
}
