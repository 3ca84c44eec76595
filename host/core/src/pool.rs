//! Checked pools: the one conversion from a user's spec to something allocation can trust,
//! used by every loader (standalone files, the kubernetes backend, the webhook, the harness).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::addr::{AddrError, AddrSet, IpFamily};
use crate::spec::{IpPoolSpec, ObjectMeta, ReservedIpSpec, RouteSpec, SubnetSpec};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{kind} has no name: set metadata.name")]
    NoName { kind: &'static str },
    #[error("{kind} {name}: subnet `{subnet}` is not a CIDR such as 10.6.0.0/16 or fd00:6::/64")]
    BadSubnet {
        kind: &'static str,
        name: String,
        subnet: String,
    },
    #[error("{kind} {name}: ipVersion {version} is not 4 or 6")]
    BadVersion {
        kind: &'static str,
        name: String,
        version: u8,
    },
    #[error("{kind} {name}: ipVersion {version} does not match subnet {subnet}")]
    VersionMismatch {
        kind: &'static str,
        name: String,
        version: u8,
        subnet: String,
    },
    #[error("{kind} {name}: {field}: {source}")]
    BadAddresses {
        kind: &'static str,
        name: String,
        field: &'static str,
        source: AddrError,
    },
    #[error("{kind} {name}: ips {outside} lie outside subnet {subnet}")]
    OutsideSubnet {
        kind: &'static str,
        name: String,
        outside: String,
        subnet: String,
    },
    #[error("{kind} {name}: gateway `{gateway}` is not an address")]
    BadGateway {
        kind: &'static str,
        name: String,
        gateway: String,
    },
    #[error("{kind} {name}: gateway {gateway} lies outside subnet {subnet}")]
    GatewayOutsideSubnet {
        kind: &'static str,
        name: String,
        gateway: String,
        subnet: String,
    },
    #[error("{kind} {name}: route {{dst: {dst}, gw: {gw}}}: {problem}")]
    BadRoute {
        kind: &'static str,
        name: String,
        dst: String,
        gw: String,
        problem: &'static str,
    },
    #[error("{kind} {name}: ips must not be empty")]
    NoAddresses { kind: &'static str, name: String },
    #[error("{kind} {name} is defined twice: rename one")]
    Duplicate { kind: &'static str, name: String },
    #[error(
        "IPPool {name}: subnet {subnet} overlaps subnet {other_subnet} of IPPool {other}: subnets of one family must be identical or disjoint"
    )]
    SubnetOverlap {
        name: String,
        subnet: String,
        other: String,
        other_subnet: String,
    },
    #[error(
        "IPPool {name}: addresses {overlap} are also in IPPool {other}: pools must not share addresses"
    )]
    AddressOverlap {
        name: String,
        other: String,
        overlap: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNet,
    pub gw: IpAddr,
}

/// An IPPool whose spec has been checked.
#[derive(Clone, Debug)]
pub struct Pool {
    pub meta: ObjectMeta,
    pub spec: IpPoolSpec,
    pub family: IpFamily,
    pub subnet: IpNet,
    /// `ips` as written (or the subnet's usable hosts when empty).
    pub ips: AddrSet,
    pub excluded: AddrSet,
    pub gateway: Option<IpAddr>,
    pub routes: Vec<Route>,
}

impl Pool {
    pub fn name(&self) -> &str {
        &self.meta.name
    }

    pub fn terminating(&self) -> bool {
        self.meta.deletion_timestamp.is_some()
    }

    /// The addresses this pool may hand out before reservations and claims: `ips` minus
    /// `excludeIPs` minus the gateway, and never an IPv4 subnet's network or broadcast address
    /// (below /31), even when `ips` lists them.
    pub fn allocatable(&self) -> AddrSet {
        allocatable(&self.subnet, &self.ips, &self.excluded, self.gateway)
    }

    pub fn from_spec(meta: ObjectMeta, spec: IpPoolSpec) -> Result<Pool, SpecError> {
        const KIND: &str = "IPPool";
        let checked = check_common(
            KIND,
            &meta,
            spec.ip_version,
            &spec.subnet,
            &spec.ips,
            &spec.exclude_ips,
            spec.gateway.as_deref(),
            &spec.routes,
        )?;
        Ok(Pool {
            meta,
            spec,
            family: checked.family,
            subnet: checked.subnet,
            ips: checked.ips,
            excluded: checked.excluded,
            gateway: checked.gateway,
            routes: checked.routes,
        })
    }
}

/// `ips` minus `excluded` minus the gateway, minus an IPv4 subnet's network and broadcast
/// addresses below /31.
fn allocatable(
    subnet: &IpNet,
    ips: &AddrSet,
    excluded: &AddrSet,
    gateway: Option<IpAddr>,
) -> AddrSet {
    let mut set = ips.difference(excluded);
    if let Some(gw) = gateway {
        set.remove(gw);
    }
    if let IpNet::V4(net) = subnet
        && net.prefix_len() < 31
    {
        set.remove(IpAddr::V4(net.network()));
        set.remove(IpAddr::V4(net.broadcast()));
    }
    set
}

/// A Subnet whose spec has been checked.
#[derive(Clone, Debug)]
pub struct Subnet {
    pub meta: ObjectMeta,
    pub spec: SubnetSpec,
    pub family: IpFamily,
    pub subnet: IpNet,
    pub ips: AddrSet,
    pub excluded: AddrSet,
    pub gateway: Option<IpAddr>,
    pub routes: Vec<Route>,
}

impl Subnet {
    pub fn from_spec(meta: ObjectMeta, spec: SubnetSpec) -> Result<Subnet, SpecError> {
        let checked = check_common(
            "Subnet",
            &meta,
            spec.ip_version,
            &spec.subnet,
            &spec.ips,
            &spec.exclude_ips,
            spec.gateway.as_deref(),
            &spec.routes,
        )?;
        Ok(Subnet {
            meta,
            spec,
            family: checked.family,
            subnet: checked.subnet,
            ips: checked.ips,
            excluded: checked.excluded,
            gateway: checked.gateway,
            routes: checked.routes,
        })
    }

    /// The addresses pools may be carved from: `ips` minus `excludeIPs` minus the gateway, and
    /// never an IPv4 subnet's network or broadcast address (below /31), as for a pool.
    pub fn allocatable(&self) -> AddrSet {
        allocatable(&self.subnet, &self.ips, &self.excluded, self.gateway)
    }
}

/// A ReservedIP whose spec has been checked.
#[derive(Clone, Debug)]
pub struct Reserved {
    pub meta: ObjectMeta,
    pub family: IpFamily,
    pub ips: AddrSet,
}

impl Reserved {
    pub fn from_spec(meta: ObjectMeta, spec: ReservedIpSpec) -> Result<Reserved, SpecError> {
        const KIND: &str = "ReservedIP";
        if meta.name.is_empty() {
            return Err(SpecError::NoName { kind: KIND });
        }
        let name = meta.name.clone();
        if spec.ips.is_empty() {
            return Err(SpecError::NoAddresses { kind: KIND, name });
        }
        let family = match spec.ip_version {
            Some(v) => IpFamily::from_version(v).ok_or(SpecError::BadVersion {
                kind: KIND,
                name: name.clone(),
                version: v,
            })?,
            // Guess from the first entry; a mixed list then fails with WrongFamily.
            None if spec.ips[0].contains(':') => IpFamily::V6,
            None => IpFamily::V4,
        };
        let ips = AddrSet::parse_entries(family, &spec.ips).map_err(|source| {
            SpecError::BadAddresses {
                kind: KIND,
                name,
                field: "ips",
                source,
            }
        })?;
        Ok(Reserved { meta, family, ips })
    }

    /// What an invalid ReservedIP still reserves: every entry that parses (of the family its
    /// `ipVersion` or first entry says), and the errors of the others. `None` when nothing at all
    /// can be read from it. Loaders use it where no previous version of the object is in force,
    /// so that one typo never un-reserves the rest of the list.
    pub fn salvage(meta: ObjectMeta, spec: &ReservedIpSpec) -> Option<(Reserved, Vec<AddrError>)> {
        let family = match spec.ip_version {
            Some(v) => IpFamily::from_version(v)?,
            None if spec.ips.first()?.contains(':') => IpFamily::V6,
            None => IpFamily::V4,
        };
        let (ips, errors) = AddrSet::parse_entries_lenient(family, &spec.ips);
        (!ips.is_empty()).then_some((Reserved { meta, family, ips }, errors))
    }

    /// A terminating ReservedIP no longer reserves.
    pub fn reserves(&self) -> bool {
        self.meta.deletion_timestamp.is_none()
    }

    /// Whether it is in force and keeps `address` from pods.
    pub fn reserves_address(&self, address: IpAddr) -> bool {
        self.reserves() && self.ips.contains(address)
    }
}

struct Common {
    family: IpFamily,
    subnet: IpNet,
    ips: AddrSet,
    excluded: AddrSet,
    gateway: Option<IpAddr>,
    routes: Vec<Route>,
}

#[allow(clippy::too_many_arguments)]
fn check_common(
    kind: &'static str,
    meta: &ObjectMeta,
    ip_version: Option<u8>,
    subnet: &str,
    ips: &[String],
    exclude_ips: &[String],
    gateway: Option<&str>,
    routes: &[RouteSpec],
) -> Result<Common, SpecError> {
    if meta.name.is_empty() {
        return Err(SpecError::NoName { kind });
    }
    let name = || meta.name.clone();
    let net: IpNet = subnet.trim().parse().map_err(|_| SpecError::BadSubnet {
        kind,
        name: name(),
        subnet: subnet.to_string(),
    })?;
    // Users write 10.0.0.1/24 meaning 10.0.0.0/24.
    let net = net.trunc();
    let family = IpFamily::of_net(&net);
    if let Some(v) = ip_version {
        let declared = IpFamily::from_version(v).ok_or(SpecError::BadVersion {
            kind,
            name: name(),
            version: v,
        })?;
        if declared != family {
            return Err(SpecError::VersionMismatch {
                kind,
                name: name(),
                version: v,
                subnet: net.to_string(),
            });
        }
    }
    let bad = |field, source| SpecError::BadAddresses {
        kind,
        name: name(),
        field,
        source,
    };
    let ips_set = if ips.is_empty() {
        AddrSet::usable_hosts(&net)
    } else {
        AddrSet::parse_entries(family, ips).map_err(|e| bad("ips", e))?
    };
    let outside = ips_set.difference(&AddrSet::from_net(&net));
    if !outside.is_empty() {
        return Err(SpecError::OutsideSubnet {
            kind,
            name: name(),
            outside: outside.to_entries().join(", "),
            subnet: net.to_string(),
        });
    }
    let excluded = AddrSet::parse_entries(family, exclude_ips).map_err(|e| bad("excludeIPs", e))?;
    let gateway = match gateway {
        None => None,
        Some(g) => {
            let gw: IpAddr = g.trim().parse().map_err(|_| SpecError::BadGateway {
                kind,
                name: name(),
                gateway: g.to_string(),
            })?;
            if !net.contains(&gw) {
                return Err(SpecError::GatewayOutsideSubnet {
                    kind,
                    name: name(),
                    gateway: g.to_string(),
                    subnet: net.to_string(),
                });
            }
            Some(gw)
        }
    };
    let routes = routes
        .iter()
        .map(|r| check_route(kind, &meta.name, family, r))
        .collect::<Result<_, _>>()?;
    Ok(Common {
        family,
        subnet: net,
        ips: ips_set,
        excluded,
        gateway,
        routes,
    })
}

fn check_route(
    kind: &'static str,
    name: &str,
    family: IpFamily,
    r: &RouteSpec,
) -> Result<Route, SpecError> {
    let err = |problem| SpecError::BadRoute {
        kind,
        name: name.to_string(),
        dst: r.dst.clone(),
        gw: r.gw.clone(),
        problem,
    };
    let dst: IpNet = r.dst.trim().parse().map_err(|_| err("dst is not a CIDR"))?;
    let gw: IpAddr =
        r.gw.trim()
            .parse()
            .map_err(|_| err("gw is not an address"))?;
    if IpFamily::of_net(&dst) != family || IpFamily::of(gw) != family {
        return Err(err("dst and gw must be of the pool's IP family"));
    }
    Ok(Route { dst, gw })
}

/// Why `pool` cannot serve beside `other`, if it cannot: subnets of one family must be identical
/// or disjoint, and no address may belong to two pools.
pub fn conflict(pool: &Pool, other: &Pool) -> Option<SpecError> {
    if other.family != pool.family {
        return None;
    }
    let (a, b) = (&pool.subnet, &other.subnet);
    if a != b && (a.contains(&b.network()) || b.contains(&a.network())) {
        return Some(SpecError::SubnetOverlap {
            name: pool.meta.name.clone(),
            subnet: a.to_string(),
            other: other.meta.name.clone(),
            other_subnet: b.to_string(),
        });
    }
    let overlap = pool.ips.intersection(&other.ips);
    if overlap.is_empty() {
        return None;
    }
    let mut entries = overlap.to_entries();
    if entries.len() > 3 {
        entries.truncate(3);
        entries.push("…".into());
    }
    Some(SpecError::AddressOverlap {
        name: pool.meta.name.clone(),
        other: other.meta.name.clone(),
        overlap: entries.join(", "),
    })
}

/// The checks across pools that users expect: names are unique, subnets of one family are
/// identical or disjoint, and no address belongs to two pools. Pools are taken in name order and
/// a pool that conflicts with an earlier one is rejected (with the reason), so the outcome does
/// not depend on file order. (Loaders that know which pools already serve claims use
/// [`crate::config::reconcile`], which lets those win instead.)
pub fn check_pools(mut pools: Vec<Pool>) -> (Vec<Pool>, Vec<SpecError>) {
    pools.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
    let mut accepted: Vec<Pool> = Vec::with_capacity(pools.len());
    let mut errors = Vec::new();
    for pool in pools {
        if accepted
            .iter()
            .any(|other| other.meta.name == pool.meta.name)
        {
            errors.push(SpecError::Duplicate {
                kind: "IPPool",
                name: pool.meta.name.clone(),
            });
            continue;
        }
        match accepted.iter().find_map(|other| conflict(&pool, other)) {
            Some(e) => errors.push(e),
            None => accepted.push(pool),
        }
    }
    (accepted, errors)
}

/// What the host knows about a pool beyond its spec, computed from reservations and claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolFacts {
    /// Addresses the pool may hand out: ips − excludeIPs − gateway.
    pub total: u64,
    /// Every address of `ips` is excluded.
    pub all_excluded: bool,
    /// Every allocatable address is reserved by a ReservedIP.
    pub all_reserved: bool,
    /// Addresses left to hand out: allocatable − reserved − allocated.
    pub free: u64,
}

/// The union of what every live ReservedIP of one family reserves.
pub fn reserved_set<'a>(
    family: IpFamily,
    reserved: impl IntoIterator<Item = &'a Reserved>,
) -> AddrSet {
    reserved
        .into_iter()
        .filter(|r| r.family == family && r.reserves())
        .fold(AddrSet::empty(family), |acc, r| acc.union(&r.ips))
}

impl Pool {
    /// The pool's facts given the reserved addresses of its family and how many of its
    /// assignable addresses are claimed.
    pub fn facts(&self, reserved: &AddrSet, allocated: u64) -> PoolFacts {
        let allocatable = self.allocatable();
        let assignable = allocatable.difference(reserved);
        PoolFacts {
            total: allocatable.len(),
            all_excluded: self.ips.is_subset(&self.excluded),
            all_reserved: !allocatable.is_empty() && assignable.is_empty(),
            free: assignable.len().saturating_sub(allocated),
        }
    }

    /// Addresses the pool may assign: allocatable minus reserved.
    pub fn assignable(&self, reserved: &AddrSet) -> AddrSet {
        self.allocatable().difference(reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: name.into(),
            ..Default::default()
        }
    }

    fn spec(subnet: &str, ips: &[&str]) -> IpPoolSpec {
        IpPoolSpec {
            subnet: subnet.into(),
            ips: ips.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn checks_subnet_version_range_and_gateway() {
        let ok = Pool::from_spec(meta("a"), spec("10.0.0.0/24", &["10.0.0.10-10.0.0.20"])).unwrap();
        assert_eq!(ok.family, IpFamily::V4);
        assert_eq!(ok.allocatable().len(), 11);

        let err = Pool::from_spec(meta("a"), spec("10.0.0.0/33", &[])).unwrap_err();
        assert!(err.to_string().contains("is not a CIDR"), "{err}");

        let mut s = spec("10.0.0.0/24", &["10.0.1.1"]);
        let err = Pool::from_spec(meta("a"), s.clone()).unwrap_err();
        assert!(
            err.to_string()
                .contains("10.0.1.1 lie outside subnet 10.0.0.0/24"),
            "{err}"
        );

        s.ips = vec![];
        s.gateway = Some("10.9.0.1".into());
        let err = Pool::from_spec(meta("a"), s.clone()).unwrap_err();
        assert!(
            err.to_string().contains("gateway 10.9.0.1 lies outside"),
            "{err}"
        );

        s.gateway = None;
        s.ip_version = Some(6);
        let err = Pool::from_spec(meta("a"), s).unwrap_err();
        assert!(matches!(err, SpecError::VersionMismatch { .. }));
    }

    #[test]
    fn network_and_broadcast_are_never_allocatable_below_slash_31() {
        let listed = Pool::from_spec(
            meta("edges"),
            spec(
                "10.0.0.0/24",
                &["10.0.0.0-10.0.0.2", "10.0.0.254-10.0.0.255"],
            ),
        )
        .unwrap();
        assert_eq!(
            listed.allocatable().to_entries(),
            ["10.0.0.1-10.0.0.2", "10.0.0.254"]
        );
        let point_to_point =
            Pool::from_spec(meta("p2p"), spec("10.0.0.0/31", &["10.0.0.0-10.0.0.1"])).unwrap();
        assert_eq!(
            point_to_point.allocatable().len(),
            2,
            "RFC 3021: both usable"
        );
        let host = Pool::from_spec(meta("one"), spec("10.0.0.7/32", &[])).unwrap();
        assert_eq!(host.allocatable().len(), 1);
        let v6 = Pool::from_spec(meta("v6"), spec("fd00::/120", &["fd00::0-fd00::ff"])).unwrap();
        assert_eq!(v6.allocatable().len(), 256, "IPv6 has no broadcast address");
    }

    #[test]
    fn a_broken_reserved_ip_still_reserves_what_parses() {
        let spec = ReservedIpSpec {
            ip_version: None,
            ips: vec![
                "10.0.0.10".into(),
                "10.0.0.11-10.0.0.1x".into(),
                "10.0.0.12".into(),
            ],
        };
        assert!(Reserved::from_spec(meta("r"), spec.clone()).is_err());
        let (salvaged, errors) = Reserved::salvage(meta("r"), &spec).unwrap();
        assert_eq!(salvaged.ips.to_entries(), ["10.0.0.10", "10.0.0.12"]);
        assert_eq!(errors.len(), 1);
        let nothing = ReservedIpSpec {
            ip_version: None,
            ips: vec!["garbage".into()],
        };
        assert!(Reserved::salvage(meta("r"), &nothing).is_none());
    }

    #[test]
    fn facts_count_exclusions_gateway_reservations_and_claims() {
        let mut s = spec("10.0.0.0/24", &["10.0.0.1-10.0.0.10"]);
        s.exclude_ips = vec!["10.0.0.9-10.0.0.10".into()];
        s.gateway = Some("10.0.0.1".into());
        let pool = Pool::from_spec(meta("a"), s).unwrap();
        let reserved = AddrSet::parse_entries(IpFamily::V4, &["10.0.0.2"]).unwrap();
        let f = pool.facts(&reserved, 3);
        assert_eq!(f.total, 7);
        assert_eq!(f.free, 3);
        assert!(!f.all_excluded && !f.all_reserved);

        let all = AddrSet::parse_entries(IpFamily::V4, &["10.0.0.0/24"]).unwrap();
        assert!(pool.facts(&all, 0).all_reserved);
        assert_eq!(pool.facts(&all, 0).free, 0);
    }

    #[test]
    fn every_address_excluded_is_a_fact() {
        let mut s = spec("fd00::/64", &["fd00::10-fd00::20"]);
        s.exclude_ips = vec!["fd00::/120".into()];
        let pool = Pool::from_spec(meta("six"), s).unwrap();
        let f = pool.facts(&AddrSet::empty(IpFamily::V6), 0);
        assert!(f.all_excluded);
        assert_eq!(f.total, 0);
        assert!(
            !f.all_reserved,
            "nothing left to reserve is 'excluded', not 'reserved'"
        );
    }

    #[test]
    fn cross_pool_checks_reject_the_later_conflicting_pool() {
        let p = |name: &str, subnet: &str, ips: &[&str]| {
            Pool::from_spec(meta(name), spec(subnet, ips)).unwrap()
        };
        let (ok, errors) = check_pools(vec![
            p(
                "b-overlapping-range",
                "10.0.0.0/24",
                &["10.0.0.15-10.0.0.30"],
            ),
            p("a", "10.0.0.0/24", &["10.0.0.10-10.0.0.20"]),
            p("c-wider-subnet", "10.0.0.0/16", &["10.0.5.1"]),
            p("d-disjoint", "10.0.0.0/24", &["10.0.0.100"]),
            p("a", "10.9.0.0/24", &[]),
            p("e-v6", "fd00::/64", &[]),
        ]);
        let names: Vec<_> = ok.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["a", "d-disjoint", "e-v6"]);
        let msgs: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(
            msgs.iter().any(|m| m.contains("IPPool a is defined twice")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter()
                .any(|m| m.contains("10.0.0.15-10.0.0.20 are also in IPPool a")),
            "{msgs:?}"
        );
        assert!(
            msgs.iter()
                .any(|m| m.contains("subnet 10.0.0.0/16 overlaps subnet 10.0.0.0/24")),
            "{msgs:?}"
        );
    }

    #[test]
    fn terminating_reserved_ip_no_longer_reserves() {
        let mut m = meta("r");
        let r = Reserved::from_spec(
            m.clone(),
            ReservedIpSpec {
                ip_version: None,
                ips: vec!["10.0.0.5".into()],
            },
        )
        .unwrap();
        assert_eq!(reserved_set(IpFamily::V4, [&r]).len(), 1);
        m.deletion_timestamp = Some("2026-01-01T00:00:00Z".into());
        let gone = Reserved { meta: m, ..r };
        assert!(reserved_set(IpFamily::V4, [&gone]).is_empty());
    }
}
