//! A zone-aware pool-selection policy for allot: the worked example of `docs/policy-authoring.md`.
//!
//! * **acquire**: the default policy's, unchanged (pod annotations, namespace defaults, CNI
//!   defaults, cluster default pools).
//! * **filter**: the default policy's, plus one rule: a pool labelled `allot.dev/drain: "true"`
//!   is dropped (reason `other`), so operators can empty a pool without deleting it.
//! * **sort**: pools in the node's zone (label `topology.kubernetes.io/zone` on both the pool and
//!   the node) first; within each group, most free addresses first; ties keep the user's order.
//! * **address** (contract 0.3.0): an address the pod's annotations give it (the default
//!   policy's, unchanged); else, for a pod labelled `zone-aware.allot.dev/address-index: "N"`,
//!   the Nth address (from 0) of the `ips` of the first pool of the order: an address derived
//!   from a label, which the host honours under the same rules as a given one.

use std::cmp::Reverse;

use allot_policy_sdk::{
    Acquisition, AddressHint, Context, DecisionError, DropReason, IpFamily, Nic, Policy, Rejection,
    addresses, selector,
};

/// The well-known Kubernetes zone label, read from the node and from each pool.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// A pool carrying this label with the value `"true"` takes no new addresses.
pub const DRAIN_LABEL: &str = "allot.dev/drain";

/// A pod label whose value N asks for the Nth address of the first pool of the order.
pub const ADDRESS_INDEX_LABEL: &str = "zone-aware.allot.dev/address-index";

pub struct ZoneAware;

impl Policy for ZoneAware {
    /// Kept: the default acquisition rules.
    fn acquire(ctx: &Context, nic: &Nic) -> Result<Acquisition, DecisionError> {
        allot_policy_default::acquire(ctx, nic)
    }

    /// The default rules first (their reason wins), then the drain label.
    fn filter(ctx: &Context, nic: &Nic, family: IpFamily, index: u32) -> Result<(), Rejection> {
        allot_policy_default::filter(ctx, nic, family, index)?;
        let pool = ctx.pool(index);
        if selector::get(&pool.labels, DRAIN_LABEL) == Some("true") {
            return Err(Rejection::new(
                DropReason::Other,
                format!("the pool is drained (label {DRAIN_LABEL}=true)"),
            ));
        }
        Ok(())
    }

    /// Replaced: same zone as the node first, then most free addresses first. The sort is
    /// stable, so pools that tie keep the order the user listed them in; `sort_by_cached_key`
    /// looks each pool's labels up once rather than once per comparison.
    fn sort(ctx: &Context, _nic: &Nic, _family: IpFamily, order: &mut [u32]) {
        let zone = selector::get(ctx.node_labels(), ZONE_LABEL);
        order.sort_by_cached_key(|&i| {
            let same_zone =
                zone.is_some() && selector::get(&ctx.pool(i).labels, ZONE_LABEL) == zone;
            (Reverse(same_zone), Reverse(ctx.free(i)))
        });
    }

    /// The default's given addresses first; else the address a pod label derives.
    fn address(
        ctx: &Context,
        nic: &Nic,
        family: IpFamily,
        order: &[u32],
    ) -> Result<Option<AddressHint>, DecisionError> {
        if let Some(given) = allot_policy_default::address(ctx, nic, family, order)? {
            return Ok(Some(given));
        }
        let Some(value) = selector::get(ctx.pod_labels(), ADDRESS_INDEX_LABEL) else {
            return Ok(None);
        };
        let index: u64 = value.parse().map_err(|_| {
            DecisionError::invalid_input(format!(
                "label {ADDRESS_INDEX_LABEL} is {value:?}: expected a number such as \"3\""
            ))
        })?;
        // Only the primary interface's first pool: the label names one address.
        let Some(&first) = order.first() else {
            return Ok(None);
        };
        if nic.interface != allot_policy_sdk::PRIMARY_INTERFACE {
            return Ok(None);
        }
        let pool = ctx.pool(first);
        let key = format!("label {ADDRESS_INDEX_LABEL}");
        match addresses::nth(&key, &pool.ips, index, family)? {
            (Some(ip), _) => Ok(Some(AddressHint {
                address: ip.to_string(),
                source: format!(
                    "pod {key}={value} (address {index} of IPPool {})",
                    pool.name
                ),
            })),
            (None, count) => Err(DecisionError::invalid_input(format!(
                "pod {key}={value} asks for address {index} of IPPool {}, which lists {count}",
                pool.name
            ))),
        }
    }
}

allot_policy_sdk::export_policy!(ZoneAware);

#[cfg(test)]
mod tests {
    use allot_policy_sdk::types::{
        CniDefaults, FamilyDecision, Inventory, Label, Namespace, Node, Pod, Pool,
    };
    use allot_policy_sdk::{AcquisitionRule, Decision, Loaded, PoolRef, Request};

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<Label> {
        pairs
            .iter()
            .map(|(k, v)| Label {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect()
    }

    /// An IPv4 cluster-default pool of 100 addresses with the given labels.
    fn pool(name: &str, pool_labels: &[(&str, &str)]) -> Pool {
        Pool {
            name: name.into(),
            labels: labels(pool_labels),
            ip_version: IpFamily::Ipv4,
            subnet: "10.0.0.0/16".into(),
            ips: vec![],
            exclude_ips: vec![],
            gateway: None,
            routes: vec![],
            pod_affinity: None,
            namespace_affinity: None,
            node_affinity: None,
            namespace_name: vec![],
            node_name: vec![],
            multus_name: vec![],
            default: true,
            disable: false,
            terminating: false,
            total_count: 100,
            all_excluded: false,
            all_reserved: false,
            subnet_owner: None,
            application: None,
        }
    }

    fn in_zone(name: &str, zone: &str) -> Pool {
        pool(name, &[(ZONE_LABEL, zone)])
    }

    /// The pools as the host sends them (sorted by name), with one free count per pool.
    fn loaded(pools: Vec<Pool>) -> Loaded {
        let mut pools = pools;
        pools.sort_by(|a, b| a.name.cmp(&b.name));
        Loaded::new(Inventory {
            generation: 7,
            pools,
            subnets: vec![],
        })
    }

    fn request(
        loaded: &Loaded,
        node_labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
        free: &[(&str, u64)],
    ) -> Request {
        let free_counts = loaded
            .inventory()
            .pools
            .iter()
            .map(|p| {
                free.iter()
                    .find(|(n, _)| *n == p.name)
                    .map_or(50, |&(_, f)| f)
            })
            .collect();
        Request {
            inventory_generation: 7,
            pod: Pod {
                namespace: "team-a".into(),
                name: "web-0".into(),
                uid: "uid-1".into(),
                labels: vec![],
                annotations: labels(annotations),
                owner: None,
            },
            namespace: Some(Namespace {
                name: "team-a".into(),
                labels: vec![],
                annotations: vec![],
            }),
            node: Some(Node {
                name: "node-1".into(),
                labels: labels(node_labels),
            }),
            nics: vec![Nic {
                interface: "eth0".into(),
                multus_name: String::new(),
            }],
            cni_defaults: CniDefaults {
                ipv4: vec![],
                ipv6: vec![],
            },
            free_counts,
        }
    }

    fn decide(loaded: &Loaded, request: &Request) -> Decision {
        loaded
            .decide::<ZoneAware>(request)
            .expect("the policy decides")
    }

    /// The only family decision of the only NIC.
    fn ipv4(decision: &Decision) -> &FamilyDecision {
        assert_eq!(decision.nics.len(), 1);
        let families = &decision.nics[0].families;
        assert_eq!(families.len(), 1);
        assert_eq!(families[0].family, IpFamily::Ipv4);
        &families[0]
    }

    fn names(loaded: &Loaded, indices: &[u32]) -> Vec<String> {
        indices
            .iter()
            .map(|&i| loaded.inventory().pools[i as usize].name.clone())
            .collect()
    }

    #[test]
    fn pools_in_the_nodes_zone_come_first() {
        let loaded = loaded(vec![
            in_zone("pool-a", "zone-1"),
            in_zone("pool-b", "zone-2"),
            in_zone("pool-c", "zone-2"),
        ]);
        let req = request(
            &loaded,
            &[(ZONE_LABEL, "zone-2")],
            &[],
            &[("pool-a", 90), ("pool-b", 10), ("pool-c", 20)],
        );
        let d = decide(&loaded, &req);
        let fam = ipv4(&d);
        assert_eq!(fam.rule, AcquisitionRule::ClusterDefault);
        assert_eq!(names(&loaded, &fam.order), ["pool-c", "pool-b", "pool-a"]);
    }

    #[test]
    fn most_free_first_within_each_group() {
        let loaded = loaded(vec![
            in_zone("pool-a", "zone-1"),
            in_zone("pool-b", "zone-1"),
            in_zone("pool-c", "zone-2"),
            in_zone("pool-d", "zone-2"),
            pool("pool-e", &[]),
        ]);
        let req = request(
            &loaded,
            &[(ZONE_LABEL, "zone-1")],
            &[],
            &[
                ("pool-a", 5),
                ("pool-b", 6),
                ("pool-c", 7),
                ("pool-d", 80),
                ("pool-e", 40),
            ],
        );
        let d = decide(&loaded, &req);
        assert_eq!(
            names(&loaded, &ipv4(&d).order),
            ["pool-b", "pool-a", "pool-d", "pool-e", "pool-c"]
        );
    }

    #[test]
    fn ties_keep_the_users_order() {
        let loaded = loaded(vec![
            in_zone("pool-a", "zone-1"),
            in_zone("pool-b", "zone-1"),
            in_zone("pool-c", "zone-1"),
        ]);
        let req = request(
            &loaded,
            &[(ZONE_LABEL, "zone-1")],
            &[(
                "ipam.allot.dev/ippool",
                r#"{"ipv4":["pool-c","pool-a","pool-b"]}"#,
            )],
            &[],
        );
        let d = decide(&loaded, &req);
        let fam = ipv4(&d);
        assert_eq!(fam.rule, AcquisitionRule::PoolAnnotation);
        assert_eq!(
            names(&loaded, &fam.candidates),
            ["pool-c", "pool-a", "pool-b"]
        );
        assert_eq!(names(&loaded, &fam.order), ["pool-c", "pool-a", "pool-b"]);
    }

    #[test]
    fn a_node_without_a_zone_gets_most_free_first() {
        let loaded = loaded(vec![
            in_zone("pool-a", "zone-1"),
            in_zone("pool-b", "zone-2"),
            pool("pool-c", &[]),
        ]);
        let req = request(
            &loaded,
            &[("kubernetes.io/hostname", "node-1")],
            &[],
            &[("pool-a", 10), ("pool-b", 30), ("pool-c", 20)],
        );
        let d = decide(&loaded, &req);
        assert_eq!(
            names(&loaded, &ipv4(&d).order),
            ["pool-b", "pool-c", "pool-a"]
        );
    }

    #[test]
    fn a_pool_without_a_zone_never_matches() {
        // A pool without the label is never "local", however many addresses it has free.
        let loaded = loaded(vec![pool("pool-a", &[]), in_zone("pool-b", "zone-1")]);
        let req = request(
            &loaded,
            &[(ZONE_LABEL, "zone-1")],
            &[],
            &[("pool-a", 90), ("pool-b", 1)],
        );
        let d = decide(&loaded, &req);
        assert_eq!(names(&loaded, &ipv4(&d).order), ["pool-b", "pool-a"]);
    }

    #[test]
    fn a_drained_pool_is_dropped_with_reason_other() {
        let loaded = loaded(vec![
            pool("pool-a", &[(ZONE_LABEL, "zone-1"), (DRAIN_LABEL, "true")]),
            pool("pool-b", &[(ZONE_LABEL, "zone-1"), (DRAIN_LABEL, "false")]),
        ]);
        let req = request(&loaded, &[(ZONE_LABEL, "zone-1")], &[], &[]);
        let d = decide(&loaded, &req);
        let fam = ipv4(&d);
        assert_eq!(names(&loaded, &fam.order), ["pool-b"]);
        assert_eq!(fam.dropped.len(), 1);
        let dropped = &fam.dropped[0];
        assert_eq!(dropped.pool, PoolRef::Index(0));
        assert_eq!(dropped.reason, DropReason::Other);
        assert!(dropped.detail.contains("drained"), "{}", dropped.detail);
    }

    #[test]
    fn the_default_filter_still_applies_and_its_reason_wins() {
        let mut terminating = pool("pool-a", &[(DRAIN_LABEL, "true")]);
        terminating.terminating = true;
        let loaded = loaded(vec![terminating, pool("pool-b", &[]), pool("pool-c", &[])]);
        let req = request(&loaded, &[], &[], &[("pool-c", 0)]);
        let d = decide(&loaded, &req);
        let fam = ipv4(&d);
        assert_eq!(names(&loaded, &fam.order), ["pool-b"]);
        let reasons: Vec<(PoolRef, DropReason)> = fam
            .dropped
            .iter()
            .map(|d| (d.pool.clone(), d.reason))
            .collect();
        assert_eq!(
            reasons,
            [
                (PoolRef::Index(0), DropReason::Terminating),
                (PoolRef::Index(2), DropReason::Exhausted),
            ]
        );
    }

    #[test]
    fn default_acquisition_errors_pass_through() {
        let loaded = loaded(vec![pool("pool-a", &[])]);
        let req = request(&loaded, &[], &[("ipam.allot.dev/ippool", "not json")], &[]);
        let err = loaded.decide::<ZoneAware>(&req).unwrap_err();
        assert_eq!(err.kind, allot_policy_sdk::ErrorKind::InvalidInput);
        assert!(
            err.message.contains("ipam.allot.dev/ippool"),
            "{}",
            err.message
        );
    }
}
