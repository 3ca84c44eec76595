//! What a workload's pod-template annotations ask of its auto pools, read with the policy
//! SDK's parsers (the same words and rules the default policy applies to its pods) and core's
//! `ippool-ip-number` / `ippool-reclaim` rules.

use std::collections::BTreeMap;

use allot_core::IpFamily;
use allot_core::autopool::{
    AnnotationError, IP_NUMBER, IpNumber, RECLAIM, SubnetWant, Wants, parse_reclaim,
};
use allot_policy_sdk::annotations::{self, Selection};
use allot_policy_sdk::types::{DecisionError, Label};
use allot_policy_sdk::wildcard;

/// Why a workload's annotations ask for no auto pools that can be made.
#[derive(Debug, thiserror::Error)]
pub enum WantsError {
    /// `ippool-reclaim` or `ippool-ip-number` cannot be read (the error names the key).
    #[error("{0}")]
    Annotation(#[source] AnnotationError),
    /// `subnets` or `subnet` cannot be read: the policy SDK's parser says why, as it says it to
    /// a pod's policy.
    #[error("{}", .0.message)]
    Subnets(#[source] DecisionError),
    /// A Subnet named with a wildcard.
    #[error(
        "the Subnet name {name:?} is a pattern: auto pools are carved from Subnets named \
         exactly; list each Subnet by name"
    )]
    Pattern { name: String },
}

/// The auto pools `annotations` ask for, or why they cannot be read. Each entry of `subnets`
/// (or the single `subnet`) is one NIC of every pod; each Subnet it names for a family is one
/// pool, sized for every NIC that names it.
///
/// A Subnet name with a wildcard (`*`, `?`, `[…]`) is refused: Spiderpool's wildcards (v1.0)
/// match IPPool names only, and a pattern here would carve one pool, sized for the whole
/// workload, from every matching Subnet, and again from every Subnet created later that
/// matches: address use nobody asked for.
pub fn wants(annotations: &BTreeMap<String, String>) -> Result<Wants, WantsError> {
    let labels: Vec<Label> = annotations
        .iter()
        .map(|(k, v)| Label {
            key: k.clone(),
            value: v.clone(),
        })
        .collect();
    let reclaim = match annotations::find(&labels, RECLAIM) {
        Some(found) => parse_reclaim(found.key, found.value).map_err(WantsError::Annotation)?,
        None => true,
    };
    let nics: Vec<Selection> = if let Some(found) = annotations::find(&labels, annotations::SUBNETS)
    {
        annotations::selections(found).map_err(WantsError::Subnets)?
    } else if let Some(found) = annotations::find(&labels, annotations::SUBNET) {
        vec![annotations::selection(found).map_err(WantsError::Subnets)?]
    } else {
        // No Subnet named (any more): the count does not matter, the reclaim choice does.
        return Ok(Wants {
            subnets: Vec::new(),
            ip_number: IpNumber::default(),
            reclaim,
        });
    };
    let ip_number = match annotations::find(&labels, IP_NUMBER) {
        Some(found) => IpNumber::parse(found.key, found.value).map_err(WantsError::Annotation)?,
        None => IpNumber::default(),
    };
    let mut counts: BTreeMap<(IpFamily, String), u64> = BTreeMap::new();
    for nic in &nics {
        for (family, names) in [(IpFamily::V4, &nic.ipv4), (IpFamily::V6, &nic.ipv6)] {
            let mut seen: Vec<&str> = Vec::new();
            for name in names {
                if wildcard::is_pattern(name) {
                    return Err(WantsError::Pattern { name: name.clone() });
                }
                if !seen.contains(&name.as_str()) {
                    seen.push(name);
                    *counts.entry((family, name.clone())).or_default() += 1;
                }
            }
        }
    }
    Ok(Wants {
        subnets: counts
            .into_iter()
            .map(|((family, subnet), nics)| SubnetWant {
                subnet,
                family,
                nics,
            })
            .collect(),
        ip_number,
        reclaim,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anns(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn want(subnet: &str, family: IpFamily, nics: u64) -> SubnetWant {
        SubnetWant {
            subnet: subnet.into(),
            family,
            nics,
        }
    }

    #[test]
    fn subnet_names_one_nic_and_each_family() {
        let w = wants(&anns(&[(
            "ipam.spidernet.io/subnet",
            r#"{"ipv4":["s4"],"ipv6":["s6"]}"#,
        )]))
        .unwrap();
        assert_eq!(
            w.subnets,
            [want("s4", IpFamily::V4, 1), want("s6", IpFamily::V6, 1)]
        );
        assert_eq!(w.ip_number, IpNumber::Flexible(1));
        assert!(w.reclaim);
    }

    #[test]
    fn subnets_count_the_nics_naming_each_subnet_and_beat_subnet() {
        let w = wants(&anns(&[
            (
                "ipam.allot.dev/subnets",
                r#"[{"interface":"eth0","ipv4":["a","b","a"]},{"interface":"net1","ipv4":["a"]}]"#,
            ),
            ("ipam.allot.dev/subnet", r#"{"ipv4":["ignored"]}"#),
            ("ipam.allot.dev/ippool-ip-number", "4"),
            ("ipam.spidernet.io/ippool-reclaim", "false"),
        ]))
        .unwrap();
        assert_eq!(
            w.subnets,
            [want("a", IpFamily::V4, 2), want("b", IpFamily::V4, 1)]
        );
        assert_eq!(w.ip_number, IpNumber::Fixed(4));
        assert!(!w.reclaim);
    }

    #[test]
    fn allots_prefix_wins() {
        let w = wants(&anns(&[
            ("ipam.allot.dev/ippool-ip-number", "+3"),
            ("ipam.spidernet.io/ippool-ip-number", "bogus"),
            ("ipam.allot.dev/subnet", r#"{"ipv4":["a"]}"#),
        ]))
        .unwrap();
        assert_eq!(w.ip_number, IpNumber::Flexible(3));
    }

    #[test]
    fn malformed_values_and_patterns_are_refused_with_the_key() {
        for (pairs, expected) in [
            (
                vec![("ipam.allot.dev/subnet", r#"{"ipv4":"a"}"#)],
                "annotation ipam.allot.dev/subnet is malformed",
            ),
            (
                vec![
                    ("ipam.allot.dev/subnet", r#"{"ipv4":["a"]}"#),
                    ("ipam.allot.dev/ippool-ip-number", "+x"),
                ],
                "annotation ipam.allot.dev/ippool-ip-number is malformed",
            ),
            (
                vec![("ipam.allot.dev/ippool-reclaim", "nope")],
                "annotation ipam.allot.dev/ippool-reclaim is malformed",
            ),
            (
                vec![("ipam.allot.dev/subnet", r#"{"ipv4":["team-*"]}"#)],
                "is a pattern",
            ),
        ] {
            let err = wants(&anns(&pairs)).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
        }
        assert!(matches!(
            wants(&anns(&[("ipam.allot.dev/subnet", r#"{"ipv4":["team-*"]}"#)])),
            Err(WantsError::Pattern { name }) if name == "team-*"
        ));
        assert!(matches!(
            wants(&anns(&[("ipam.allot.dev/ippool-reclaim", "nope")])),
            Err(WantsError::Annotation(e)) if e.key == "ipam.allot.dev/ippool-reclaim"
        ));
    }

    #[test]
    fn no_subnet_means_no_pools_but_reclaim_still_counts() {
        let w = wants(&anns(&[
            ("ipam.allot.dev/ippool-reclaim", "false"),
            ("ipam.allot.dev/ippool-ip-number", "whatever"),
        ]))
        .unwrap();
        assert!(w.subnets.is_empty());
        assert!(!w.reclaim);
    }
}
