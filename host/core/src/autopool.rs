//! Subnet auto-pools: a pool carved from a Subnet for one workload, sized with it, deleted with
//! it.
//!
//! A workload (Deployment, StatefulSet, ReplicaSet, Job, DaemonSet, CronJob) whose pod template
//! names Subnets in its `subnet`/`subnets` annotation gets, per named Subnet, one IPPool of the
//! Subnet's family, labelled so that the default policy finds it
//! ([`crate::spec::auto_pool_labels`]). This module holds the decisions, all pure:
//!
//! - the annotation values of `ippool-ip-number` ([`IpNumber`]) and `ippool-reclaim`
//!   ([`parse_reclaim`]): malformed values are errors, never guesses;
//! - the pool's name ([`pool_name`]), labels ([`labels`]) and spec ([`pool_spec`]);
//! - which addresses a pool gets, grows by or gives back ([`SubnetSpace`], [`carve`],
//!   [`resize`]): never another pool's, never excluded, reserved, the gateway, a network or
//!   broadcast address; cost O(ranges), never O(addresses);
//! - a whole reconcile pass as actions ([`plan`]), which the controller carries out.

mod carve;
mod plan;

use std::collections::BTreeMap;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::addr::{AddrSet, IpFamily};
use crate::policy::Application;
use crate::pool::Subnet;
use crate::spec::{IpPoolSpec, RouteSpec, auto_pool_labels};

pub use carve::{Resize, SubnetSpace, TooSmall, carve, resize};
pub use plan::{Action, Inputs, PoolView, SubnetWant, Wants, Workload, plan};

/// Annotation names (without prefix; read under `ipam.allot.dev/` and `ipam.spidernet.io/`).
pub const IP_NUMBER: &str = "ippool-ip-number";
pub const RECLAIM: &str = "ippool-reclaim";

/// The label that marks a pool the controller created (Kubernetes' recommended
/// `app.kubernetes.io/managed-by`): only such pools are resized or deleted by it.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "allot-controller";
/// The label that records the workload's `ippool-reclaim` on its pool, so that the choice is
/// still known when the workload is gone (Spiderpool keeps it in the same place).
pub const RECLAIM_LABEL: &str = "ipam.allot.dev/ippool-reclaim";

/// An annotation whose value cannot be read: the key and what is wrong, with an example.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("annotation {key} is malformed: {problem}; expected a value like {example}")]
pub struct AnnotationError {
    pub key: String,
    pub problem: String,
    pub example: &'static str,
}

/// How many addresses an auto pool holds per NIC that uses its Subnet: `+N` is the workload's
/// replicas plus N (grown and shrunk with it), `N` a fixed count. The default is `+1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpNumber {
    Flexible(u32),
    Fixed(u32),
}

impl Default for IpNumber {
    fn default() -> Self {
        IpNumber::Flexible(1)
    }
}

impl fmt::Display for IpNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpNumber::Flexible(n) => write!(f, "+{n}"),
            IpNumber::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl IpNumber {
    const EXAMPLE: &'static str = r#""+1" (replicas plus one) or "5" (five, fixed)"#;

    /// Parses `"+N"` or `"N"`: plain decimal digits, no spaces, signs other than the leading
    /// `+`, or fractions. A fixed count must be at least 1.
    pub fn parse(key: &str, value: &str) -> Result<IpNumber, AnnotationError> {
        let error = |problem: String| AnnotationError {
            key: key.to_string(),
            problem,
            example: Self::EXAMPLE,
        };
        let (flexible, digits) = match value.strip_prefix('+') {
            Some(rest) => (true, rest),
            None => (false, value),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(error(format!(
                "{value:?} is not \"+N\" or \"N\" with N a whole number"
            )));
        }
        let n: u32 = digits
            .parse()
            .map_err(|_| error(format!("{digits} is too large")))?;
        match (flexible, n) {
            (true, n) => Ok(IpNumber::Flexible(n)),
            (false, 0) => Err(error(
                "a fixed count of 0 leaves the pool nothing to hand out".into(),
            )),
            (false, n) => Ok(IpNumber::Fixed(n)),
        }
    }

    /// The addresses a pool holds for `replicas` pods with `nics` interfaces each on its
    /// Subnet: every pod (the flexible extra ones too) takes one address per such NIC. Never
    /// below 1: an IPPool without `ips` would mean its whole subnet.
    pub fn addresses(self, replicas: u64, nics: u64) -> u64 {
        let per_nic = match self {
            IpNumber::Flexible(n) => replicas.saturating_add(u64::from(n)),
            IpNumber::Fixed(n) => u64::from(n),
        };
        per_nic.saturating_mul(nics).max(1)
    }
}

/// Parses `ippool-reclaim`: exactly `"true"` (delete the pool with its workload, the default)
/// or `"false"` (keep it).
pub fn parse_reclaim(key: &str, value: &str) -> Result<bool, AnnotationError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(AnnotationError {
            key: key.to_string(),
            problem: format!("{other:?} is not \"true\" or \"false\""),
            example: r#""false" (keep the pool when the workload is deleted)"#,
        }),
    }
}

/// The addresses an IPPool lists, as far as they can be read, valid or not: carving never takes
/// them, so a pool that fails its checks today cannot find its addresses in an auto pool once it
/// is corrected. The family is `ipVersion`'s, else the subnet's, else the first entry's; entries
/// that do not parse are skipped; no `ips` means every usable host of the subnet. `None` when
/// nothing can be read.
pub fn listed_addresses(
    ip_version: Option<u8>,
    subnet: Option<&str>,
    ips: &[String],
) -> Option<AddrSet> {
    let net: Option<ipnet::IpNet> = subnet.and_then(|s| s.trim().parse().ok());
    let family = ip_version
        .and_then(IpFamily::from_version)
        .or(net.as_ref().map(IpFamily::of_net))
        .or_else(|| {
            ips.first().map(|e| {
                if e.contains(':') {
                    IpFamily::V6
                } else {
                    IpFamily::V4
                }
            })
        })?;
    let set = if ips.is_empty() {
        AddrSet::usable_hosts(&net?.trunc())
    } else {
        AddrSet::parse_entries_lenient(family, ips).0
    };
    (!set.is_empty() && set.family() == family).then_some(set)
}

/// The longest Kubernetes label value (and DNS-1123 label).
const MAX_LABEL: usize = 63;
/// Hex digits of the name's hash suffix (40 bits).
const HASH_DIGITS: usize = 10;

/// The auto pool's name: `auto-<namespace>-<name>-v4-<hash>`, a DNS-1123 label of at most 63
/// characters. The readable part is cut to fit; the hash of the kind, namespace, name, Subnet
/// and family keeps names of different workloads, Subnets and families apart. The same inputs
/// always give the same name, so a workload deleted and created again with `ippool-reclaim:
/// "false"` finds its kept pool.
pub fn pool_name(app: &Application, subnet: &str, family: IpFamily) -> String {
    let mut hasher = Sha256::new();
    let family_name = family.to_string();
    for part in [
        app.kind.as_str(),
        &app.namespace,
        &app.name,
        subnet,
        &family_name,
    ] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let hash: String = digest
        .iter()
        .take(HASH_DIGITS / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    let suffix = format!("-v{}-{hash}", family.version());
    let room = MAX_LABEL - "auto-".len() - suffix.len();
    let readable: String = format!("{}-{}", app.namespace, app.name)
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .take(room)
        .collect();
    format!("auto-{}{suffix}", readable.trim_matches('-'))
}

/// The labels of an auto pool: its Subnet, its workload (what the default policy matches on),
/// the manager, and the workload's `ippool-reclaim`.
pub fn labels(app: &Application, subnet: &str, reclaim: bool) -> BTreeMap<String, String> {
    BTreeMap::from([
        (auto_pool_labels::OWNER_SUBNET.into(), subnet.into()),
        (auto_pool_labels::APPLICATION_KIND.into(), app.kind.clone()),
        (
            auto_pool_labels::APPLICATION_NAMESPACE.into(),
            app.namespace.clone(),
        ),
        (auto_pool_labels::APPLICATION_NAME.into(), app.name.clone()),
        (MANAGED_BY.into(), MANAGER.into()),
        (RECLAIM_LABEL.into(), reclaim.to_string()),
    ])
}

/// A name that cannot be a label value of an auto pool.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {what} {value:?} cannot be a label value (at most 63 letters, digits, '-', '_' or '.'), \
     and auto pools are found by their labels: use a shorter name"
)]
pub struct LabelValueError {
    /// Which name: `workload name`, `namespace` or `Subnet name`.
    pub what: &'static str,
    pub value: String,
}

/// Why the labels of this workload's pool cannot be written, if they cannot: a label value is
/// at most 63 characters of letters, digits, `-`, `_` and `.`, starting and ending with a
/// letter or digit. Workload and Subnet names may be longer (up to 253).
pub fn check_label_values(app: &Application, subnet: &str) -> Result<(), LabelValueError> {
    for (what, value) in [
        ("workload name", app.name.as_str()),
        ("namespace", &app.namespace),
        ("Subnet name", subnet),
    ] {
        let edges_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        let ok = value.len() <= MAX_LABEL
            && edges_ok(value.chars().next())
            && edges_ok(value.chars().last())
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !ok {
            return Err(LabelValueError {
                what,
                value: value.to_string(),
            });
        }
    }
    Ok(())
}

/// The spec of an auto pool holding `ips` of `subnet`: the Subnet's CIDR, gateway and routes
/// (kept in step with the Subnet), the addresses as ranges.
pub fn pool_spec(subnet: &Subnet, ips: &AddrSet) -> IpPoolSpec {
    IpPoolSpec {
        ip_version: Some(subnet.family.version()),
        subnet: subnet.subnet.to_string(),
        ips: ips.to_entries(),
        gateway: subnet.gateway.map(|g| g.to_string()),
        routes: subnet
            .routes
            .iter()
            .map(|r| RouteSpec {
                dst: r.dst.to_string(),
                gw: r.gw.to_string(),
            })
            .collect(),
        ..IpPoolSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(kind: &str, namespace: &str, name: &str) -> Application {
        Application {
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn ip_number_reads_plus_n_and_n_and_nothing_else() {
        let parse = |v| IpNumber::parse("ipam.allot.dev/ippool-ip-number", v);
        assert_eq!(parse("+1"), Ok(IpNumber::Flexible(1)));
        assert_eq!(parse("+0"), Ok(IpNumber::Flexible(0)));
        assert_eq!(parse("5"), Ok(IpNumber::Fixed(5)));
        assert_eq!(parse("007"), Ok(IpNumber::Fixed(7)));
        for bad in [
            "",
            "+",
            "-1",
            " 2",
            "2 ",
            "1.5",
            "+-1",
            "++1",
            "two",
            "0",
            "99999999999",
            "1e3",
        ] {
            let err = parse(bad).expect_err(bad).to_string();
            assert!(
                err.contains("annotation ipam.allot.dev/ippool-ip-number is malformed"),
                "{bad}: {err}"
            );
        }
        assert!(
            parse("0")
                .unwrap_err()
                .to_string()
                .contains("fixed count of 0")
        );
        assert_eq!(IpNumber::default(), IpNumber::Flexible(1));
    }

    #[test]
    fn sizes_count_every_nic_and_never_fall_below_one() {
        assert_eq!(IpNumber::Flexible(1).addresses(3, 1), 4);
        assert_eq!(IpNumber::Flexible(1).addresses(3, 2), 8);
        assert_eq!(IpNumber::Fixed(5).addresses(3, 1), 5);
        assert_eq!(IpNumber::Fixed(5).addresses(100, 2), 10);
        assert_eq!(IpNumber::Flexible(0).addresses(0, 1), 1);
        assert_eq!(IpNumber::Flexible(2).addresses(u64::MAX, 3), u64::MAX);
    }

    #[test]
    fn reclaim_is_true_or_false_exactly() {
        assert_eq!(parse_reclaim("k", "true"), Ok(true));
        assert_eq!(parse_reclaim("k", "false"), Ok(false));
        for bad in ["False", "no", "0", "", " false"] {
            assert!(parse_reclaim("k", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_short_dns_labels_and_differ_by_every_input() {
        let a = app("Deployment", "team-a", "web");
        let name = pool_name(&a, "subnet-a", IpFamily::V4);
        assert!(name.starts_with("auto-team-a-web-v4-"), "{name}");
        assert_eq!(name.len(), "auto-team-a-web-v4-".len() + HASH_DIGITS);
        assert_eq!(name, pool_name(&a, "subnet-a", IpFamily::V4));
        let others = [
            pool_name(&a, "subnet-b", IpFamily::V4),
            pool_name(&a, "subnet-a", IpFamily::V6),
            pool_name(
                &app("StatefulSet", "team-a", "web"),
                "subnet-a",
                IpFamily::V4,
            ),
            pool_name(
                &app("Deployment", "team-a-web", ""),
                "subnet-a",
                IpFamily::V4,
            ),
            pool_name(
                &app("Deployment", "team", "a-web"),
                "subnet-a",
                IpFamily::V4,
            ),
        ];
        for other in &others {
            assert_ne!(&name, other);
        }
        let long = app(
            "Deployment",
            &"n".repeat(63),
            &format!("a.b-{}", "x".repeat(240)),
        );
        let name = pool_name(&long, "s", IpFamily::V6);
        assert!(name.len() <= 63, "{name}");
        let label = |s: &str| {
            s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        assert!(label(&name), "{name}");
        assert!(label(&pool_name(&app("Job", "x", "a."), "s", IpFamily::V4)));
    }

    #[test]
    fn what_an_invalid_pool_lists_is_still_read() {
        let ips = |e: &[&str]| e.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let set = listed_addresses(None, Some("10.0.0.0/24"), &ips(&["10.0.0.5", "10.0.0.x"]));
        assert_eq!(set.unwrap().to_entries(), ["10.0.0.5"]);
        let whole = listed_addresses(None, Some("10.0.0.0/30"), &[]).unwrap();
        assert_eq!(whole.to_entries(), ["10.0.0.1-10.0.0.2"]);
        let v6 = listed_addresses(None, Some("garbage"), &ips(&["fd00::1-fd00::3"])).unwrap();
        assert_eq!(v6.len(), 3);
        assert!(listed_addresses(None, Some("garbage"), &[]).is_none());
        assert!(listed_addresses(Some(4), None, &ips(&["fd00::1"])).is_none());
    }

    #[test]
    fn label_values_that_cannot_be_written_are_refused_with_the_reason() {
        assert!(check_label_values(&app("Deployment", "ns", "web"), "subnet-a").is_ok());
        let err = check_label_values(&app("Deployment", "ns", &"w".repeat(64)), "s").unwrap_err();
        assert_eq!(err.what, "workload name");
        assert!(err.to_string().contains("workload name"), "{err}");
        assert_eq!(
            check_label_values(&app("Deployment", "ns", "web"), "-s"),
            Err(LabelValueError {
                what: "Subnet name",
                value: "-s".into()
            })
        );
    }
}
