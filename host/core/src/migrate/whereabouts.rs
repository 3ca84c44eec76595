//! Whereabouts's shapes and arithmetic (v0.9): the `ipam` section of a
//! NetworkAttachmentDefinition's configuration, the addresses a range hands out, the names of
//! its IPPools and OverlappingRangeIPReservations, and the offsets its IPPools key allocations
//! by. Whereabouts keeps no pool object of its own: the range lives in each network's
//! configuration, and an IPPool (named after the range) only records allocations.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

use crate::addr::{IpFamily, addr_to_u128, u128_to_addr};
use crate::spec::{IpPoolSpec, RouteSpec};

/// The `ipam` section Whereabouts reads (the fields a migration needs; the others are ignored,
/// as Whereabouts ignores what it does not know).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct IpamConfig {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub range: String,
    #[serde(default)]
    pub range_start: Option<String>,
    #[serde(default)]
    pub range_end: Option<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(rename = "ipRanges", default)]
    pub ip_ranges: Vec<RangeConfig>,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub routes: Vec<CniRoute>,
    #[serde(default)]
    pub network_name: Option<String>,
    #[serde(default)]
    pub node_slice_size: Option<String>,
}

/// One entry of `ipRanges` (or the top-level `range`, `range_start`, `range_end`, `exclude`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct RangeConfig {
    pub range: String,
    #[serde(default)]
    pub range_start: Option<String>,
    #[serde(default)]
    pub range_end: Option<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// A CNI route (`{"dst": "0.0.0.0/0", "gw": "10.0.0.1"}`; `gw` may be absent).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct CniRoute {
    pub dst: String,
    #[serde(default)]
    pub gw: Option<String>,
}

/// Why a Whereabouts `ipam` section's ranges cannot be carried over.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// `node_slice_size` is set: the addresses live in NodeSlicePools, which a migration does
    /// not read.
    #[error("node_slice_size is set: node-sliced ranges (NodeSlicePools) are not carried over")]
    NodeSliced,
    #[error("no range and no ipRanges")]
    NoRange,
    #[error("range `{range}` is not a CIDR")]
    NotCidr {
        range: String,
        #[source]
        source: ipnet::AddrParseError,
    },
    /// `start-end/len`, whose `end/len` is not a CIDR.
    #[error("range `{range}`: `{end}` is not a CIDR")]
    EndNotCidr {
        range: String,
        end: String,
        #[source]
        source: ipnet::AddrParseError,
    },
    /// A start or end (`what`: `range start`, `range_start`, `range_end`) that is no address.
    #[error("{what} `{text}` is not an address")]
    NotAddress {
        what: &'static str,
        text: String,
        #[source]
        source: std::net::AddrParseError,
    },
    /// `start-end/len` whose start lies outside `end/len`.
    #[error("range `{range}`: {start} is not in {net}")]
    StartOutside {
        range: String,
        start: IpAddr,
        net: IpNet,
    },
    #[error("range {net} has no usable address")]
    NoUsableAddress { net: IpNet },
}

/// Why a Whereabouts IPPool's allocation names no address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    #[error("spec.range `{range}` is not a CIDR")]
    RangeNotCidr { range: String },
    #[error("spec.range `{text}` is not an address")]
    RangeNotAddress {
        text: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error("allocation key `{offset}` is not an offset")]
    NotOffset {
        offset: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("offset {offset} lies past the end of {range}")]
    PastTheEnd { offset: u128, range: String },
}

/// One range as Whereabouts uses it once its configuration is loaded: the network, the first
/// and last address it hands out, and what it excludes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub net: IpNet,
    pub first: IpAddr,
    pub last: IpAddr,
    pub exclude: Vec<String>,
}

impl IpamConfig {
    /// Whether this is Whereabouts's section.
    pub fn is_whereabouts(&self) -> bool {
        self.kind == "whereabouts"
    }

    /// The ranges, as Whereabouts loads them: the top-level `range` first, then `ipRanges`.
    pub fn ranges(&self) -> Result<Vec<Range>, RangeError> {
        if self
            .node_slice_size
            .as_deref()
            .is_some_and(|s| !s.is_empty())
        {
            return Err(RangeError::NodeSliced);
        }
        let mut configs = Vec::new();
        if !self.range.is_empty() {
            configs.push(RangeConfig {
                range: self.range.clone(),
                range_start: self.range_start.clone(),
                range_end: self.range_end.clone(),
                exclude: self.exclude.clone(),
            });
        }
        configs.extend(self.ip_ranges.iter().cloned());
        if configs.is_empty() {
            return Err(RangeError::NoRange);
        }
        configs.iter().map(Range::load).collect()
    }

    /// `network_name`, or "" for the unnamed network.
    pub fn network_name(&self) -> &str {
        self.network_name.as_deref().unwrap_or("")
    }
}

fn parse_ip(what: &'static str, s: &str) -> Result<IpAddr, RangeError> {
    s.trim().parse().map_err(|source| RangeError::NotAddress {
        what,
        text: s.to_string(),
        source,
    })
}

impl Range {
    /// A range as Whereabouts's configuration loader reads it: `a.b.c.d-e.f.g.h/len` (start and
    /// end written in the range), or a CIDR with optional `range_start` and `range_end`; the
    /// first and last usable address (never the network or the broadcast address, in either
    /// family) unless the start or end lie within them.
    pub fn load(c: &RangeConfig) -> Result<Range, RangeError> {
        let (start, end, net) = match c.range.split_once('-') {
            Some((first, rest)) => {
                let last: ipnet::IpNet =
                    rest.trim()
                        .parse()
                        .map_err(|source| RangeError::EndNotCidr {
                            range: c.range.clone(),
                            end: rest.to_string(),
                            source,
                        })?;
                let first = parse_ip("range start", first)?;
                if !last.contains(&first) {
                    return Err(RangeError::StartOutside {
                        range: c.range.clone(),
                        start: first,
                        net: last,
                    });
                }
                (Some(first), Some(last.addr()), last.trunc())
            }
            None => {
                let net: IpNet = c
                    .range
                    .trim()
                    .parse()
                    .map_err(|source| RangeError::NotCidr {
                        range: c.range.clone(),
                        source,
                    })?;
                let start = c
                    .range_start
                    .as_deref()
                    .map(|s| parse_ip("range_start", s))
                    .transpose()?;
                let end = c
                    .range_end
                    .as_deref()
                    .map(|s| parse_ip("range_end", s))
                    .transpose()?;
                (start, end, net.trunc())
            }
        };
        let family = IpFamily::of_net(&net);
        let lo = addr_to_u128(net.network());
        let hi = addr_to_u128(net.broadcast());
        if hi.saturating_sub(lo) < 2 {
            return Err(RangeError::NoUsableAddress { net });
        }
        let (mut first, mut last) = (lo + 1, hi - 1);
        if let Some(s) = start.map(addr_to_u128)
            && (first..=last).contains(&s)
        {
            first = s;
        }
        if let Some(e) = end.map(addr_to_u128)
            && (first..=last).contains(&e)
        {
            last = e;
        }
        Ok(Range {
            net,
            first: u128_to_addr(family, first),
            last: u128_to_addr(family, last),
            exclude: c.exclude.clone(),
        })
    }

    /// The spec of the allot pool that hands out what this range does. Whereabouts puts its one
    /// `gateway` and every route on each address it hands out, whatever their family; a pool
    /// takes those of its own family (a route without `gw` goes through the gateway, as a CNI
    /// route without one does).
    pub fn pool_spec(&self, gateway: Option<&str>, routes: &[CniRoute]) -> IpPoolSpec {
        let family = IpFamily::of_net(&self.net);
        let of_family = |a: &str| {
            a.trim()
                .parse::<IpAddr>()
                .is_ok_and(|a| IpFamily::of(a) == family)
        };
        let gateway = gateway.filter(|g| of_family(g)).map(str::to_string);
        let routes = routes
            .iter()
            .filter(|r| {
                r.dst
                    .trim()
                    .parse::<IpNet>()
                    .is_ok_and(|n| IpFamily::of_net(&n) == family)
            })
            .filter_map(|r| {
                let gw = r.gw.clone().or_else(|| gateway.clone())?;
                Some(RouteSpec {
                    dst: r.dst.clone(),
                    gw,
                })
            })
            .collect();
        IpPoolSpec {
            ip_version: Some(family.version()),
            subnet: self.net.to_string(),
            ips: vec![if self.first == self.last {
                self.first.to_string()
            } else {
                format!("{}-{}", self.first, self.last)
            }],
            exclude_ips: self.exclude.clone(),
            gateway,
            routes,
            ..IpPoolSpec::default()
        }
    }
}

/// Whereabouts's `normalizeRange`: `:` and `/` become `-` (an IPv6 range ending in `:` gets a
/// `0` first).
pub fn normalize_range(range: &str) -> String {
    let mut r = range.to_string();
    if r.ends_with(':') {
        r.push('0');
    }
    r.replace([':', '/'], "-")
}

/// The name of the IPPool holding a range's allocations (`IPPoolName`, without node slices):
/// the normalized range, after `<network_name>-` for a named network.
pub fn ippool_name(network_name: &str, range: &IpNet) -> String {
    let normalized = normalize_range(&range.to_string());
    if network_name.is_empty() {
        normalized
    } else {
        format!("{network_name}-{normalized}")
    }
}

/// The allot IPPool a Whereabouts range becomes: `whereabouts-` and the IPPool's own name.
pub fn allot_pool_name(network_name: &str, range: &IpNet) -> String {
    format!("whereabouts-{}", ippool_name(network_name, range))
}

/// The address of an allocation: the IPPool's `spec.range` as Whereabouts parses it (the
/// address written there, not its network: `net.ParseCIDR`) plus the allocation's offset.
pub fn allocation_address(range: &str, offset: &str) -> Result<IpAddr, AllocationError> {
    let (address, _) =
        range
            .trim()
            .split_once('/')
            .ok_or_else(|| AllocationError::RangeNotCidr {
                range: range.to_string(),
            })?;
    let base: IpAddr =
        address
            .trim()
            .parse()
            .map_err(|source| AllocationError::RangeNotAddress {
                text: address.to_string(),
                source,
            })?;
    let offset: u128 = offset
        .parse()
        .map_err(|source| AllocationError::NotOffset {
            offset: offset.to_string(),
            source,
        })?;
    let family = IpFamily::of(base);
    let n = addr_to_u128(base)
        .checked_add(offset)
        .filter(|&n| n <= family.max())
        .ok_or_else(|| AllocationError::PastTheEnd {
            offset,
            range: range.to_string(),
        })?;
    Ok(u128_to_addr(family, n))
}

/// The address an OverlappingRangeIPReservation's name stands for (`NormalizeIP`: the address
/// with `:` written `-`, after `<network_name>-` for a named network), and the network name.
/// The networks the configurations name are tried first: a name like `ab-cd--1` reads both as
/// network `ab`'s `cd::1` and as the unnamed network's `ab:cd::1`.
pub fn reservation_address(name: &str, networks: &[String]) -> Option<(String, IpAddr)> {
    let parse = |tail: &str| -> Option<IpAddr> {
        if tail.contains('.') {
            tail.parse().ok()
        } else {
            tail.replace('-', ":").parse().ok()
        }
    };
    for n in networks.iter().filter(|n| !n.is_empty()) {
        if let Some(tail) = name
            .strip_prefix(n.as_str())
            .and_then(|t| t.strip_prefix('-'))
            && let Some(address) = parse(tail)
        {
            return Some((n.clone(), address));
        }
    }
    if let Some(address) = parse(name) {
        return Some((String::new(), address));
    }
    // A network no configuration names any more: the longest tail after a `-` that reads.
    name.match_indices('-').find_map(|(i, _)| {
        let address = parse(&name[i + 1..])?;
        Some((name[..i].to_string(), address))
    })
}

/// `namespace/name` of a Whereabouts `podref`.
pub fn split_podref(podref: &str) -> Option<(&str, &str)> {
    podref
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
}
