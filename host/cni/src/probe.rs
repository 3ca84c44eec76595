//! ADD's optional probes: is each address already used on the pod's link, does each gateway
//! answer there.
//!
//! # Why the plugin probes, not the agent
//!
//! The plugin is the process the runtime runs for this pod, as root, with `CNI_NETNS` and
//! `CNI_IFNAME` in hand, at the moment the interface exists: Debian's `bridge` and `macvlan`
//! create `CNI_IFNAME` in the pod's namespace (down, without an address) before they call IPAM.
//! Probing from there sends the frames from the pod's own interface and MAC onto exactly the
//! segment the pod will use, whatever the main plugin (bridge port, macvlan, ipvlan, SR-IOV VF).
//! The agent would have to enter every pod's namespace itself (a privileged, long-lived daemon
//! juggling namespaces on its threads), and would add a second round trip per probe; probing
//! from the node's side of the link instead (the bridge, the macvlan master) does not exist for
//! every topology (an SR-IOV VF has no node-side port) and sees another MAC than the pod's.
//! The agent only keeps the store side: quarantine, replacement, expiry.
//!
//! # The flow
//!
//! The agent allocates; the plugin enters the namespace once per round ([`allot_probe::with_link`],
//! which raises the interface if it is down and restores it) and probes every address of the
//! result for conflicts, one after another, then (only when none conflicts) every gateway. On a
//! conflict it asks the agent (`POST /v1/quarantine`) to move the address to a quarantine claim
//! owned by the conflicting MAC and to allocate another one for the same attachment (the
//! address stays claimed throughout, so it can never be handed out twice), and probes again: at
//! most [`ROUNDS`] replacements, then it gives up. Once every address is free and every
//! gateway answers, each address is announced (gratuitous ARP, unsolicited Neighbor
//! Advertisement). Every failure (conflicts left, gateway silent, probe impossible) releases
//! what the ADD allocated (through DEL, so it is journaled if the agent is gone) before the
//! error is returned: a failed ADD leaks nothing but the quarantined addresses, which expire.
//!
//! # Probed ahead
//!
//! Where the main plugin hangs the pod's interface from a link in the node's namespace (a
//! bridge, a macvlan master in bridge mode: [`parent_link`]), the plugin tells the agent, which
//! may probe the pools' next addresses from that link ahead of time (`--probe-ahead`). The
//! agent's answer then lists, in `preprobed`, the addresses it found free and the gateways it
//! found answering within its freshness bound; the plugin does not probe those again. What
//! is not listed is probed here as above. When nothing is left to probe, only the IPv6
//! addresses are announced from the pod's interface (the bridge and macvlan plugins send a
//! gratuitous ARP for IPv4 themselves once they have configured the address), so an IPv4-only
//! ADD does not enter the pod's namespace at all.

use std::io::Write;
use std::net::IpAddr;
use std::path::Path;

use allot_api::{
    AddRequest, Conflict, IpamResult, ParentKind, ParentLink, Preprobed, ProbeSettings,
    QuarantineRequest, codes,
};
use allot_probe::{GatewayOutcome, ProbeOutcome};

use crate::error::CniError;

/// Replacement rounds after the first allocation: a pod gets at most `1 + ROUNDS` tries per
/// family before the ADD fails with the MACs seen.
pub const ROUNDS: usize = 3;

/// What one round of probes found.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Clean { announce_failures: Vec<String> },
    Conflicts(Vec<Conflict>),
    GatewayDown(IpAddr),
}

/// The agent, as the flow needs it (a trait so that the flow is tested without a socket).
pub trait Agent {
    /// `POST /v1/quarantine`; with `replace`, the new result.
    fn quarantine(&mut self, request: &QuarantineRequest) -> Result<Option<IpamResult>, CniError>;
    /// Gives back what the ADD allocated (a DEL of the attachment).
    fn release(&mut self);
}

/// Probes `result` on `ifname` in `netns` as `settings` say, quarantining and replacing
/// conflicting addresses; returns the result to print.
pub fn settle(
    netns: &Path,
    ifname: &str,
    settings: ProbeSettings,
    request: &AddRequest,
    mut result: IpamResult,
    agent: &mut dyn Agent,
    log: &mut dyn Write,
) -> Result<IpamResult, CniError> {
    let cfg = crate::config::probe_config(&settings).map_err(|e| {
        agent.release();
        CniError::new(codes::PROBE_FAILED, format!("probe settings: {e}"))
    })?;
    let who = format!("{}/{}", request.container_id, request.if_name);
    if !result.guest_addresses.is_empty() {
        let _ = writeln!(
            log,
            "allot: ADD {who}: {} in use by the virtual machine's guest on its migration's \
             source: not probed or announced here (allot-agent announces them once the VM runs \
             here)",
            result.guest_addresses.join(", ")
        );
    }
    let mut seen: Vec<Conflict> = Vec::new();
    // Addresses found free in an earlier round (the other family of a dual-stack ADD whose
    // first address conflicted) are not probed again.
    let mut free: Vec<IpAddr> = Vec::new();
    for round in 0..=ROUNDS {
        let (checked, gateways_up) = preprobed(result.preprobed.as_ref());
        if !checked.is_empty() || !gateways_up.is_empty() {
            let p = result.preprobed.as_ref().expect("listed");
            let what: Vec<String> = checked
                .iter()
                .map(|a| a.to_string())
                .chain(gateways_up.iter().map(|g| format!("gateway {g}")))
                .collect();
            let _ = writeln!(
                log,
                "allot: ADD {who}: {} probed ahead from {} (at most {} ms ago): not probed again",
                what.join(", "),
                p.link,
                p.oldest_ms
            );
        }
        free.extend(checked);
        let verdict = match probe_round(
            netns,
            ifname,
            cfg,
            settings,
            &result,
            &mut free,
            &gateways_up,
        ) {
            Ok(v) => v,
            Err(e) => {
                agent.release();
                return Err(CniError::new(
                    codes::PROBE_FAILED,
                    format!(
                        "probing the addresses of {who} failed: {e}; the addresses were released"
                    ),
                ));
            }
        };
        match verdict {
            Verdict::Clean { announce_failures } => {
                for f in announce_failures {
                    let _ = writeln!(log, "allot: ADD {who}: announcing an address failed: {f}");
                }
                return Ok(result);
            }
            Verdict::GatewayDown(gw) => {
                agent.release();
                return Err(CniError::new(
                    codes::GATEWAY_UNREACHABLE,
                    format!(
                        "gateway {gw} does not answer on {ifname} (network namespace {}) after \
                         {} tries of {} ms: check the pool's gateway and the link behind \
                         {ifname} (bridge, macvlan master, VLAN), or turn the gateway probe \
                         off for this network; the addresses of this ADD were released",
                        netns.display(),
                        settings.tries,
                        settings.timeout_ms
                    ),
                ));
            }
            Verdict::Conflicts(conflicts) => {
                for c in &conflicts {
                    let how = if c.contested {
                        "is being probed for by"
                    } else {
                        "is in use by"
                    };
                    let _ = writeln!(
                        log,
                        "allot: ADD {who}: address conflict: {} {how} {} on {ifname}; quarantined{}",
                        c.address,
                        c.mac,
                        if round < ROUNDS {
                            ", trying another address"
                        } else {
                            ""
                        }
                    );
                }
                let replace = round < ROUNDS;
                let answer = agent.quarantine(&QuarantineRequest {
                    add: request.clone(),
                    conflicts: conflicts.clone(),
                    replace,
                });
                seen.extend(conflicts);
                match answer {
                    Ok(Some(next)) if replace => result = next,
                    Ok(_) if replace => {
                        agent.release();
                        return Err(CniError::io(
                            "allot-agent quarantined the conflicting addresses but sent no new result; the addresses were released",
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        agent.release();
                        return Err(e);
                    }
                }
            }
        }
    }
    agent.release();
    let list: Vec<String> = seen
        .iter()
        .map(|c| format!("{} (MAC {})", c.address, c.mac))
        .collect();
    Err(CniError::new(
        codes::ADDRESS_CONFLICT,
        format!(
            "every address tried for {who} is used by another host on {ifname}: {}; each is \
             quarantined (see `allotctl claims list`); find those hosts by their MAC, or exclude \
             the addresses from the pool, then retry",
            list.join(", ")
        ),
    ))
}

fn address_of(cidr: &str) -> Option<IpAddr> {
    cidr.split('/').next()?.parse().ok()
}

/// What the agent says it probed ahead: free addresses, answering gateways.
fn preprobed(p: Option<&Preprobed>) -> (Vec<IpAddr>, Vec<IpAddr>) {
    let parse = |v: &[String]| v.iter().filter_map(|a| a.parse().ok()).collect();
    match p {
        Some(p) => (parse(&p.free), parse(&p.gateways)),
        None => (Vec::new(), Vec::new()),
    }
}

/// The link in the node's namespace the main plugin hangs the pod's interface from, when the
/// agent can probe the pod's segment from it: Debian's `bridge` without VLANs (the bridge, whose
/// ports all hear it), and `macvlan` in bridge mode with a named master in the node's
/// namespace (probed from a sibling macvlan of the agent's). Nothing for other plugins: an
/// ipvlan, an SR-IOV VF or a host-device has no node-side port that sees what the pod sees, a
/// VLAN-tagged bridge port is on another segment than the bridge itself, a macvlan in private
/// or VEPA mode does not talk to its siblings, and a master inside the pod's namespace
/// (`linkInContainer`) is not the node's.
pub fn parent_link(conf: &crate::config::Conf) -> Option<ParentLink> {
    use serde_json::Value;
    let text = |key: &str| conf.get(key).and_then(Value::as_str);
    let (kind, name) = match text("type")? {
        "bridge" => {
            let vlan = conf.get("vlan").and_then(Value::as_u64).unwrap_or(0) != 0;
            let trunk = conf.get("vlanTrunk").is_some_and(|v| !v.is_null());
            if vlan || trunk {
                return None;
            }
            // The bridge plugin's default bridge.
            (ParentKind::Bridge, text("bridge").unwrap_or("cni0"))
        }
        "macvlan" => {
            let in_container = conf.get("linkInContainer").and_then(Value::as_bool) == Some(true);
            if in_container || text("mode").is_some_and(|m| m != "bridge") {
                return None;
            }
            // Without a master the plugin takes the default route's interface: not guessed.
            (ParentKind::Macvlan, text("master")?)
        }
        _ => return None,
    };
    if name.is_empty() {
        return None;
    }
    Some(ParentLink {
        kind,
        name: name.to_string(),
        netns: own_netns()?,
    })
}

/// `DEVICE:INODE` of this process's network namespace.
fn own_netns() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata("/proc/self/ns/net").ok()?;
    Some(format!("{}:{}", meta.dev(), meta.ino()))
}

/// One entry into the namespace: conflicts first, gateways only when every address is free
/// (never in parallel, so that no probe races another on the link), then the announcements.
fn probe_round(
    netns: &Path,
    ifname: &str,
    cfg: allot_probe::ProbeConfig,
    settings: ProbeSettings,
    result: &IpamResult,
    free: &mut Vec<IpAddr>,
    gateways_up: &[IpAddr],
) -> Result<Verdict, allot_probe::ProbeError> {
    // A virtual machine's guest uses these from its migration's source right now: it would
    // answer a probe, and an announcement would draw its traffic here too early.
    let guest: Vec<IpAddr> = result
        .guest_addresses
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    let addresses: Vec<IpAddr> = result
        .ips
        .iter()
        .filter_map(|ip| address_of(&ip.address))
        .filter(|a| !guest.contains(a))
        .collect();
    let mut gateways: Vec<IpAddr> = result
        .ips
        .iter()
        .filter_map(|ip| ip.gateway.as_deref()?.parse().ok())
        .collect();
    gateways.dedup();
    gateways.retain(|g| !gateways_up.contains(g));
    let gateways_left = settings.gateway && !gateways.is_empty();
    if !((settings.conflict && !addresses.is_empty()) || gateways_left) {
        // Nothing to probe or announce (all probed ahead, or the guest's): the pod's namespace
        // is not even entered.
        return Ok(Verdict::Clean {
            announce_failures: Vec::new(),
        });
    }
    // Everything probed ahead: the interface is raised only to announce. Probing ahead applies
    // only to Debian's bridge and macvlan, which send a gratuitous ARP for each IPv4 address
    // themselves once they have configured it: only IPv6 addresses are left to announce (none:
    // the namespace is not entered). The interface is set down again afterwards, as always:
    // left up, it made the bridge plugin wait about a second for IPv6 duplicate address
    // detection of the address it adds next.
    let only_announce = result.preprobed.is_some()
        && gateways.is_empty()
        && (!settings.conflict || addresses.iter().all(|a| free.contains(a)));
    let announced: Vec<IpAddr> = addresses
        .iter()
        .copied()
        .filter(|a| settings.conflict && (!only_announce || a.is_ipv6()))
        .collect();
    if only_announce && announced.is_empty() {
        return Ok(Verdict::Clean {
            announce_failures: Vec::new(),
        });
    }
    allot_probe::with_link(netns, ifname, cfg, |link| {
        if settings.conflict {
            let mut conflicts = Vec::new();
            let unchecked: Vec<IpAddr> = addresses
                .iter()
                .copied()
                .filter(|a| !free.contains(a))
                .collect();
            for address in unchecked {
                let (mac, contested) = match link.probe_conflict(address)? {
                    ProbeOutcome::Free => {
                        free.push(address);
                        continue;
                    }
                    ProbeOutcome::Conflict { mac } => (mac, false),
                    ProbeOutcome::Contested { mac } => (mac, true),
                };
                conflicts.push(Conflict {
                    address: address.to_string(),
                    mac: mac.to_string(),
                    contested,
                });
            }
            if !conflicts.is_empty() {
                return Ok(Verdict::Conflicts(conflicts));
            }
        }
        if settings.gateway {
            for &gw in &gateways {
                if link.probe_gateway(gw)? == GatewayOutcome::Unreachable {
                    return Ok(Verdict::GatewayDown(gw));
                }
            }
        }
        // Announce only what was checked: an unchecked address may be someone else's, and an
        // announcement would point their neighbours at this pod.
        let mut announce_failures = Vec::new();
        for &address in &announced {
            if let Err(e) = link.announce(address) {
                announce_failures.push(format!("{address}: {e}"));
            }
        }
        Ok(Verdict::Clean { announce_failures })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_api::IpConfig;

    #[test]
    fn addresses_come_from_cidrs() {
        assert_eq!(address_of("10.0.0.5/24"), Some("10.0.0.5".parse().unwrap()));
        assert_eq!(address_of("fd00::5/64"), Some("fd00::5".parse().unwrap()));
        assert_eq!(address_of("nonsense"), None);
    }

    struct Refusing {
        released: usize,
    }

    impl Agent for Refusing {
        fn quarantine(&mut self, _: &QuarantineRequest) -> Result<Option<IpamResult>, CniError> {
            unreachable!("no probe ran")
        }
        fn release(&mut self) {
            self.released += 1;
        }
    }

    /// A result of 192.0.2.10/24 whose `guest` addresses are the guest's, settled with
    /// conflict probes in a namespace that does not exist: the answer, what the agent was
    /// asked to release, and the log.
    fn settled_nowhere(guest: &[&str]) -> (Result<IpamResult, CniError>, usize, String) {
        let mut agent = Refusing { released: 0 };
        let result = IpamResult {
            ips: vec![IpConfig {
                address: "192.0.2.10/24".into(),
                gateway: None,
                pool: "p".into(),
            }],
            guest_addresses: guest.iter().map(|a| a.to_string()).collect(),
            ..IpamResult::default()
        };
        let settings = ProbeSettings {
            conflict: true,
            ..ProbeSettings::default()
        };
        let mut log = Vec::new();
        let out = settle(
            Path::new("/nonexistent/netns"),
            "net1",
            settings,
            &AddRequest::default(),
            result,
            &mut agent,
            &mut log,
        );
        (out, agent.released, String::from_utf8(log).unwrap())
    }

    /// A live migration's target: the addresses the guest still uses from the source are
    /// neither probed nor announced, so the pod's namespace is not even entered (here it does
    /// not exist, which would fail any probe) and nothing is released.
    #[test]
    fn a_virtual_machines_guest_addresses_are_not_probed() {
        let (out, released, log) = settled_nowhere(&["192.0.2.10"]);
        assert_eq!(out.unwrap().ips[0].address, "192.0.2.10/24");
        assert_eq!(released, 0);
        assert!(
            log.contains("192.0.2.10 in use by the virtual machine's guest"),
            "{log}"
        );
    }

    /// A probe that cannot run (no such namespace) fails the ADD with code 107, names the
    /// reason, and releases what was allocated.
    #[test]
    fn a_probe_that_cannot_run_releases_and_fails() {
        let (out, released, _) = settled_nowhere(&[]);
        let e = out.unwrap_err();
        assert_eq!(e.code, codes::PROBE_FAILED);
        assert!(e.msg.contains("/nonexistent/netns"), "{e:?}");
        assert!(e.msg.contains("released"), "{e:?}");
        assert_eq!(released, 1);
    }
}
