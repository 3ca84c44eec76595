//! Addresses a pod is given (contract 0.3.0's address hints): the annotations that name them,
//! and the StatefulSet ordinal that indexes a declared list.
//!
//! | annotation | on | value | applies to |
//! |---|---|---|---|
//! | `ipam.allot.dev/ips` | Pod | `[{"interface":"eth0","ipv4":"192.0.2.10"},{"interface":"net1","ipv6":"2001:db8::10"}]` | each listed interface |
//! | `ipam.allot.dev/ip` | Pod | `{"ipv4":"192.0.2.10","ipv6":"2001:db8::10"}` (`interface` optional) | eth0, or the interface named |
//! | `ipam.allot.dev/ordinal-ips` | StatefulSet pod template | `{"ipv4":["192.0.2.10-192.0.2.12"]}` or a list with `interface` | ordinal N gets the Nth address |
//! | `cni.projectcalico.org/ipAddrs` | Pod | `["192.0.2.10","2001:db8::10"]` | eth0 (Calico's spelling, for migrating clusters) |
//!
//! The first that applies to a NIC wins, in the order of the table. A value that cannot be read
//! is an `invalid-input` error naming the key; the policy decides nothing else for that NIC.

use std::net::IpAddr;

use serde::Deserialize;

use crate::annotations::{Found, malformed, parse_json, parse_objects};
use crate::types::{AddressHint, DecisionError, IpFamily, Label};
use crate::{Context, Nic};

pub const IP: &str = "ipam.allot.dev/ip";
pub const IPS: &str = "ipam.allot.dev/ips";
pub const ORDINAL_IPS: &str = "ipam.allot.dev/ordinal-ips";
/// Calico's spelling (Calico IPAM's `ipAddrs`): a JSON list of addresses for the pod's one NIC.
pub const CALICO_IP_ADDRS: &str = "cni.projectcalico.org/ipAddrs";
/// The StatefulSet controller's label holding a pod's ordinal (Kubernetes 1.28+).
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

const IP_EXAMPLE: &str = r#"{"ipv4":"192.0.2.10","ipv6":"2001:db8::10"}"#;
const IPS_EXAMPLE: &str =
    r#"[{"interface":"eth0","ipv4":"192.0.2.10"},{"interface":"net1","ipv4":"198.51.100.10"}]"#;
const ORDINAL_EXAMPLE: &str = r#"{"ipv4":["192.0.2.10-192.0.2.12"]}"#;
const CALICO_EXAMPLE: &str = r#"["192.0.2.10","2001:db8::10"]"#;

/// One interface's given addresses (`ip`, or an entry of `ips`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct Given {
    #[serde(default)]
    interface: Option<String>,
    #[serde(default)]
    ipv4: Option<String>,
    #[serde(default)]
    ipv6: Option<String>,
}

/// One interface's declared list (`ordinal-ips`, or an entry of its list form).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declared {
    /// The interface the list serves (eth0 when omitted).
    #[serde(default)]
    pub interface: Option<String>,
    /// Addresses and `first-last` ranges; ordinal N gets the Nth address.
    #[serde(default)]
    pub ipv4: Vec<String>,
    #[serde(default)]
    pub ipv6: Vec<String>,
}

/// The declared lists of a StatefulSet's pod template (`ordinal-ips`), every entry checked, or
/// `None` when it declares none: what the controller reserves and the webhook checks.
pub fn declared(annotations: &[Label]) -> Result<Option<Vec<Declared>>, DecisionError> {
    let Some(found) = annotation(annotations, ORDINAL_IPS) else {
        return Ok(None);
    };
    let lists = declared_lists(found)?;
    for list in &lists {
        for (family, entries) in [(IpFamily::Ipv4, &list.ipv4), (IpFamily::Ipv6, &list.ipv6)] {
            nth(found.key, entries, 0, family)?;
        }
    }
    Ok(Some(lists))
}

fn annotation<'a>(annotations: &'a [Label], key: &str) -> Option<Found<'a>> {
    annotations.iter().find(|l| l.key == key).map(|l| Found {
        key: &l.key,
        value: &l.value,
    })
}

/// The address `nic` must get in `family`, from the first annotation of the table that applies.
pub fn given_address(
    ctx: &Context,
    nic: &Nic,
    family: IpFamily,
) -> Result<Option<AddressHint>, DecisionError> {
    let anns = ctx.pod_annotations();
    let primary = crate::PRIMARY_INTERFACE;
    if let Some(found) = annotation(anns, IPS) {
        let list: Vec<Given> = parse_objects(found, IPS_EXAMPLE, true)?;
        for g in &list {
            if g.interface.is_none() {
                return Err(malformed(
                    found.key,
                    "every entry names its interface",
                    IPS_EXAMPLE,
                ));
            }
        }
        let Some(g) = list
            .iter()
            .find(|g| g.interface.as_deref() == Some(nic.interface.as_str()))
        else {
            return Ok(None);
        };
        return one(found, g, family, IPS_EXAMPLE);
    }
    if let Some(found) = annotation(anns, IP) {
        let g: Given = parse_objects(found, IP_EXAMPLE, false)?;
        if g.interface.as_deref().unwrap_or(primary) != nic.interface {
            return Ok(None);
        }
        return one(found, &g, family, IP_EXAMPLE);
    }
    if let Some(found) = annotation(anns, ORDINAL_IPS) {
        return ordinal_address(ctx, found, nic, family);
    }
    if let Some(found) = annotation(anns, CALICO_IP_ADDRS) {
        if nic.interface != primary {
            return Ok(None);
        }
        let list: Vec<String> = parse_json(found, CALICO_EXAMPLE)?;
        let mut of_family = Vec::new();
        for a in &list {
            let ip = parse_ip(found.key, a, CALICO_EXAMPLE)?;
            if family_of(ip) == family {
                of_family.push(ip);
            }
        }
        if of_family.len() > 1 {
            return Err(malformed(
                found.key,
                format_args!(
                    "it lists {} {} addresses; give one per family",
                    of_family.len(),
                    family.name()
                ),
                CALICO_EXAMPLE,
            ));
        }
        return Ok(of_family.first().map(|ip| hint(found.key, *ip)));
    }
    Ok(None)
}

fn one(
    found: Found,
    g: &Given,
    family: IpFamily,
    example: &str,
) -> Result<Option<AddressHint>, DecisionError> {
    if g.ipv4.is_none() && g.ipv6.is_none() {
        return Err(malformed(
            found.key,
            "neither ipv4 nor ipv6 gives an address",
            example,
        ));
    }
    let text = match family {
        IpFamily::Ipv4 => &g.ipv4,
        IpFamily::Ipv6 => &g.ipv6,
    };
    let Some(text) = text else { return Ok(None) };
    let ip = parse_ip(found.key, text, example)?;
    if family_of(ip) != family {
        return Err(malformed(
            found.key,
            format_args!(
                "{} {text} is not an {} address",
                family.name(),
                family.name()
            ),
            example,
        ));
    }
    Ok(Some(hint(found.key, ip)))
}

/// The ordinal-th address of the declared list for `nic` and `family`.
fn ordinal_address(
    ctx: &Context,
    found: Found,
    nic: &Nic,
    family: IpFamily,
) -> Result<Option<AddressHint>, DecisionError> {
    let lists = declared_lists(found)?;
    let Some(list) = lists
        .iter()
        .find(|d| d.interface.as_deref().unwrap_or(crate::PRIMARY_INTERFACE) == nic.interface)
    else {
        return Ok(None);
    };
    let entries = match family {
        IpFamily::Ipv4 => &list.ipv4,
        IpFamily::Ipv6 => &list.ipv6,
    };
    if entries.is_empty() {
        return Ok(None);
    }
    let Some(ordinal) = ctx.ordinal() else {
        return Err(DecisionError::invalid_input(format!(
            "annotation {} gives addresses by StatefulSet ordinal, but pod {}/{} has none (no \
             {POD_INDEX_LABEL} label and no StatefulSet owner): put it on a StatefulSet's pod \
             template, or give this pod its address with {IP}",
            found.key, ctx.request.pod.namespace, ctx.request.pod.name
        )));
    };
    let (ip, count) = nth(found.key, entries, ordinal, family)?;
    match ip {
        Some(ip) => Ok(Some(AddressHint {
            address: ip.to_string(),
            source: format!("pod annotation {} (ordinal {ordinal})", found.key),
        })),
        None => Err(DecisionError::invalid_input(format!(
            "annotation {} lists {count} {} addresses, none for ordinal {ordinal} of pod {}/{}: \
             add addresses to the list before scaling past {count} replicas",
            found.key,
            family.name(),
            ctx.request.pod.namespace,
            ctx.request.pod.name
        ))),
    }
}

/// Parses `ordinal-ips`: an object, or a list of objects each naming its interface.
fn declared_lists(found: Found) -> Result<Vec<Declared>, DecisionError> {
    let list: Vec<Declared> = if found.value.trim_start().starts_with('[') {
        let list: Vec<Declared> = parse_objects(found, ORDINAL_EXAMPLE, true)?;
        if list.iter().any(|d| d.interface.is_none()) {
            return Err(malformed(
                found.key,
                "every entry of the list names its interface",
                ORDINAL_EXAMPLE,
            ));
        }
        list
    } else {
        vec![parse_objects(found, ORDINAL_EXAMPLE, false)?]
    };
    for d in &list {
        if d.ipv4.is_empty() && d.ipv6.is_empty() {
            return Err(malformed(
                found.key,
                "neither ipv4 nor ipv6 lists an address",
                ORDINAL_EXAMPLE,
            ));
        }
    }
    Ok(list)
}

/// The `n`-th address (from 0) of `entries` (single addresses and `first-last` ranges, in the
/// order written), and how many addresses they hold in all. Checks every entry.
pub fn nth(
    key: &str,
    entries: &[String],
    n: u64,
    family: IpFamily,
) -> Result<(Option<IpAddr>, u128), DecisionError> {
    let mut found = None;
    let mut seen: u128 = 0;
    for entry in entries {
        let (first, last) = match entry.split_once('-') {
            Some((a, b)) => (
                parse_ip(key, a.trim(), ORDINAL_EXAMPLE)?,
                parse_ip(key, b.trim(), ORDINAL_EXAMPLE)?,
            ),
            None => {
                let ip = parse_ip(key, entry.trim(), ORDINAL_EXAMPLE)?;
                (ip, ip)
            }
        };
        if family_of(first) != family || family_of(last) != family {
            return Err(malformed(
                key,
                format_args!("{entry} is not {}", family.name()),
                ORDINAL_EXAMPLE,
            ));
        }
        let (lo, hi) = (to_u128(first), to_u128(last));
        if hi < lo {
            return Err(malformed(
                key,
                format_args!("range {entry} runs backwards"),
                ORDINAL_EXAMPLE,
            ));
        }
        let len = hi - lo + 1;
        if found.is_none() && (n as u128) < seen + len {
            found = Some(from_u128(family, lo + (n as u128 - seen)));
        }
        seen = seen.saturating_add(len);
    }
    Ok((found, seen))
}

fn hint(key: &str, ip: IpAddr) -> AddressHint {
    AddressHint {
        address: ip.to_string(),
        source: format!("pod annotation {key}"),
    }
}

fn parse_ip(key: &str, text: &str, example: &str) -> Result<IpAddr, DecisionError> {
    text.trim()
        .parse()
        .map_err(|_| malformed(key, format_args!("{text:?} is not an IP address"), example))
}

fn family_of(ip: IpAddr) -> IpFamily {
    match ip {
        IpAddr::V4(_) => IpFamily::Ipv4,
        IpAddr::V6(_) => IpFamily::Ipv6,
    }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_u128(family: IpFamily, n: u128) -> IpAddr {
    match family {
        IpFamily::Ipv4 => IpAddr::V4((n as u32).into()),
        IpFamily::Ipv6 => IpAddr::V6(n.into()),
    }
}

/// A StatefulSet pod's ordinal: the `apps.kubernetes.io/pod-index` label, else (for a pod whose
/// owner is a StatefulSet) the number after the last `-` of its name, as the StatefulSet
/// controller names pods.
pub fn ordinal(ctx: &Context) -> Option<u64> {
    let pod = &ctx.request.pod;
    if let Some(l) = pod.labels.iter().find(|l| l.key == POD_INDEX_LABEL) {
        return l.value.parse().ok();
    }
    let owner = pod.owner.as_ref()?;
    if owner.kind != "StatefulSet" {
        return None;
    }
    let (prefix, n) = pod.name.rsplit_once('-')?;
    (prefix == owner.name).then(|| n.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nth_address_walks_singles_and_ranges_in_order() {
        let entries = vec![
            "192.0.2.10-192.0.2.12".to_string(),
            "192.0.2.20".to_string(),
        ];
        let at = |n| nth("k", &entries, n, IpFamily::Ipv4).unwrap();
        assert_eq!(at(0), (Some("192.0.2.10".parse().unwrap()), 4));
        assert_eq!(at(2).0, Some("192.0.2.12".parse().unwrap()));
        assert_eq!(at(3).0, Some("192.0.2.20".parse().unwrap()));
        assert_eq!(at(4), (None, 4));
        let v6 = vec!["2001:db8::ff-2001:db8::101".to_string()];
        assert_eq!(
            nth("k", &v6, 2, IpFamily::Ipv6).unwrap().0,
            Some("2001:db8::101".parse().unwrap())
        );
        for bad in ["192.0.2.12-192.0.2.10", "2001:db8::1", "192.0.2.x"] {
            let err = nth("k", &[bad.to_string()], 0, IpFamily::Ipv4).unwrap_err();
            assert!(
                err.message.contains("annotation k is malformed"),
                "{}",
                err.message
            );
        }
    }
}
