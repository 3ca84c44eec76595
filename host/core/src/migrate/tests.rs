//! Migration from other IPAMs' records, by example and by property (kept apart from the code it
//! tests).

use std::collections::BTreeMap;
use std::net::IpAddr;

use proptest::prelude::*;

use super::whereabouts::{
    AllocationError, IpamConfig, Range, RangeConfig, RangeError, allocation_address,
    allot_pool_name, ippool_name, normalize_range, reservation_address,
};
use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pool(name: &str, subnet: &str, ips: &[&str]) -> PeerPool {
    PeerPool {
        source: format!("SpiderIPPool {name}"),
        name: name.into(),
        labels: BTreeMap::new(),
        spec: Ok(IpPoolSpec {
            subnet: subnet.into(),
            ips: ips.iter().map(|s| s.to_string()).collect(),
            gateway: Some(if subnet.contains(':') {
                "2001:db8::1".into()
            } else {
                "192.0.2.1".into()
            }),
            ..IpPoolSpec::default()
        }),
    }
}

fn record(address: &str, pool: &str, pod: &str, uid: &str) -> Record {
    Record {
        address: ip(address),
        pool: Some(pool.into()),
        network: String::new(),
        namespace: "web".into(),
        name: pod.into(),
        uid: Some(uid.into()),
        interface: None,
        container_id: None,
        owner: None,
        source: format!("SpiderIPPool {pool} status.allocatedIPs"),
    }
}

fn live(name: &str, uid: &str, addresses: &[&str]) -> LivePod {
    LivePod {
        namespace: "web".into(),
        name: name.into(),
        uid: uid.into(),
        node: "node-1".into(),
        owner: None,
        addresses: addresses
            .iter()
            .map(|a| PodAddress {
                address: ip(a),
                interface: Some("eth0".into()),
            })
            .collect(),
        holds: true,
    }
}

struct World {
    pools: Vec<PeerPool>,
    subnets: Vec<PeerObject<SubnetSpec>>,
    reserved: Vec<PeerObject<ReservedIpSpec>>,
    records: Vec<Record>,
    unreadable: Vec<(String, String)>,
    pods: Vec<LivePod>,
    current: Current,
}

impl World {
    fn spiderpool() -> World {
        let mut sts = record("192.0.2.11", "v4", "db-0", "uid-db-0-old");
        sts.owner = Some(Owner {
            kind: "StatefulSet".into(),
            name: "db".into(),
        });
        let mut sts_v6 = record("2001:db8::11", "v6", "db-0", "uid-db-0-old");
        sts_v6.owner = sts.owner.clone();
        World {
            pools: vec![
                pool("v4", "192.0.2.0/24", &["192.0.2.10-192.0.2.20"]),
                pool("v6", "2001:db8::/64", &["2001:db8::10-2001:db8::20"]),
            ],
            subnets: Vec::new(),
            reserved: vec![PeerObject {
                source: "SpiderReservedIP r".into(),
                name: "r".into(),
                spec: Ok(ReservedIpSpec {
                    ip_version: None,
                    ips: vec!["192.0.2.20".into()],
                }),
            }],
            records: vec![
                record("192.0.2.10", "v4", "web-a", "uid-a"),
                record("2001:db8::10", "v6", "web-a", "uid-a"),
                sts,
                sts_v6,
            ],
            unreadable: Vec::new(),
            pods: vec![
                live("web-a", "uid-a", &["192.0.2.10", "2001:db8::10"]),
                live("db-0", "uid-db-0", &["192.0.2.11", "2001:db8::11"]),
            ],
            current: Current::default(),
        }
    }

    fn plan(&self) -> Result<Plan, Vec<Refusal>> {
        plan(&Inputs {
            peer: Peer::Spiderpool,
            pools: &self.pools,
            subnets: &self.subnets,
            reserved: &self.reserved,
            records: &self.records,
            unreadable: &self.unreadable,
            pods: &self.pods,
            current: &self.current,
            now: 1_000,
        })
    }

    /// What allot holds once `plan` is written.
    fn written(&mut self, plan: &Plan) {
        self.current.claims.extend(plan.claims.iter().cloned());
        for w in &plan.pools {
            self.current.pools.push(CurrentObject {
                name: w.name.clone(),
                labels: w.labels.clone(),
                spec: Some(w.spec.clone()),
            });
        }
        for w in &plan.reserved {
            self.current.reserved.push(CurrentObject {
                name: w.name.clone(),
                labels: w.labels.clone(),
                spec: Some(w.spec.clone()),
            });
        }
    }
}

fn messages(refusals: &[Refusal]) -> Vec<String> {
    refusals.iter().map(|r| r.to_string()).collect()
}

#[test]
fn every_recorded_address_becomes_a_claim_of_its_pod_on_its_interface() {
    let plan = World::spiderpool().plan().unwrap();
    assert_eq!(plan.claims.len(), 4);
    let by: BTreeMap<IpAddr, &Claim> = plan.claims.iter().map(|c| (c.address, c)).collect();
    let a = by[&ip("192.0.2.10")];
    assert_eq!((a.pool.as_str(), a.pod.name.as_str()), ("v4", "web-a"));
    assert_eq!(a.pod.uid, "uid-a");
    assert_eq!(a.node, "", "no agent made it: no node's CNI GC judges it");
    let attachment = a.attachment.as_ref().unwrap();
    assert_eq!(attachment.interface, "eth0");
    assert_eq!(attachment.container_id, "migrated:spiderpool:uid-a");
    assert!(is_migrated_sandbox(&attachment.container_id));
    assert_eq!(a.updated_at, 1_000);

    let db = by[&ip("2001:db8::11")];
    assert_eq!(
        db.pod.uid, "uid-db-0",
        "the pod using the address now holds it, not the UID of an older record"
    );
    assert!(db.pod.is_stateful());
    assert_eq!(db.pod.owner_name.as_deref(), Some("db"));

    let names: Vec<&str> = plan.pools.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["v4", "v6"]);
    assert_eq!(plan.pools[0].spec.ip_version, Some(4));
    assert_eq!(plan.reserved[0].spec.ip_version, Some(4));
    assert!(plan.notes.is_empty(), "{:?}", plan.notes);
}

#[test]
fn endpoints_record_each_pods_addresses_with_the_pools_prefix_and_gateway() {
    let plan = World::spiderpool().plan().unwrap();
    let web = plan.endpoints.iter().find(|e| e.name == "web-a").unwrap();
    assert_eq!(web.uid, "uid-a");
    assert_eq!(web.node, "node-1");
    assert_eq!(web.interfaces.len(), 1);
    let nic = &web.interfaces[0];
    assert_eq!(nic.ipv4.as_deref(), Some("192.0.2.10/24"));
    assert_eq!(nic.ipv6.as_deref(), Some("2001:db8::10/64"));
    assert_eq!(nic.pools, ["v4", "v6"]);
    assert_eq!(nic.gateways, ["192.0.2.1", "2001:db8::1"]);
    let db = plan.endpoints.iter().find(|e| e.name == "db-0").unwrap();
    assert_eq!(
        db.owner,
        Some(Owner {
            kind: "StatefulSet".into(),
            name: "db".into()
        })
    );
}

#[test]
fn a_second_run_finds_everything_in_place() {
    let mut world = World::spiderpool();
    let first = world.plan().unwrap();
    world.written(&first);
    let second = world.plan().unwrap();
    assert!(second.objects_done(), "{second:?}");
    assert_eq!(second.claimed.len(), 4);
    assert_eq!(
        second.endpoints, first.endpoints,
        "the same Endpoints, which the caller finds stored"
    );
}

#[test]
fn an_interrupted_run_is_finished_by_the_next() {
    let mut world = World::spiderpool();
    let first = world.plan().unwrap();
    // Interrupted after the reservations and claims, before the pools.
    world
        .current
        .claims
        .extend(first.claims.iter().take(3).cloned());
    let mut reserved_only = first.clone();
    reserved_only.pools.clear();
    reserved_only.claims.clear();
    world.written(&reserved_only);
    let next = world.plan().unwrap();
    assert_eq!(next.claims.len(), 1, "only the claim not written yet");
    assert!(next.reserved.iter().all(|w| w.exists));
    assert!(next.pools.iter().all(|w| !w.exists));
}

#[test]
fn a_pods_address_the_peer_lost_track_of_is_claimed_too() {
    let mut world = World::spiderpool();
    world.pods.push(live("stray", "uid-s", &["192.0.2.15"]));
    world
        .pods
        .push(live("elsewhere", "uid-e", &["198.51.100.7"]));
    let plan = world.plan().unwrap();
    let stray = plan
        .claims
        .iter()
        .find(|c| c.address == ip("192.0.2.15"))
        .unwrap();
    assert_eq!(
        (stray.pod.name.as_str(), stray.pool.as_str()),
        ("stray", "v4")
    );
    assert_eq!(plan.notes.len(), 1);
    assert!(
        plan.notes[0].contains("no record of spiderpool's"),
        "{:?}",
        plan.notes
    );
    assert!(
        !plan.claims.iter().any(|c| c.address == ip("198.51.100.7")),
        "outside every migrated pool: not the migration's business"
    );
}

#[test]
fn finished_and_host_network_pods_hold_nothing() {
    let mut world = World::spiderpool();
    let mut done = live("done", "uid-d", &["192.0.2.10"]);
    done.holds = false;
    world.pods.push(done);
    assert!(world.plan().is_ok());
}

#[test]
fn an_address_held_by_two_pods_is_refused_naming_both() {
    let mut world = World::spiderpool();
    world.pods.push(live("web-b", "uid-b", &["192.0.2.10"]));
    let refusals = messages(&world.plan().unwrap_err());
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].contains("address 192.0.2.10 is held by more than one pod"));
    assert!(
        refusals[0]
            .contains("web/web-a (SpiderIPPool v4 status.allocatedIPs, pod web/web-a status)")
    );
    assert!(refusals[0].contains("web/web-b (pod web/web-b status)"));
}

#[test]
fn overlapping_pools_are_refused_naming_both() {
    let mut world = World::spiderpool();
    world
        .pools
        .push(pool("v4-b", "192.0.2.0/24", &["192.0.2.18-192.0.2.30"]));
    world.current.pools.push(CurrentObject {
        name: "default-v6".into(),
        labels: BTreeMap::new(),
        spec: Some(IpPoolSpec {
            subnet: "2001:db8::/48".into(),
            ..IpPoolSpec::default()
        }),
    });
    let refusals = messages(&world.plan().unwrap_err());
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(
        refusals
            .iter()
            .any(|r| r.contains("SpiderIPPool v4-b overlaps SpiderIPPool v4")
                && r.contains("192.0.2.18-192.0.2.20")),
        "{refusals:?}"
    );
    assert!(
        refusals
            .iter()
            .any(|r| r.contains("SpiderIPPool v6 overlaps allot's IPPool default-v6")),
        "{refusals:?}"
    );
}

#[test]
fn a_pool_shape_allot_refuses_is_named() {
    let mut world = World::spiderpool();
    world.pools[0].spec.as_mut().unwrap().gateway = Some("10.9.9.9".into());
    world.pools.push(PeerPool {
        source: "SpiderIPPool broken".into(),
        name: "broken".into(),
        labels: BTreeMap::new(),
        spec: Err("spec: unknown field `vlan`".into()),
    });
    world.unreadable.push((
        "SpiderEndpoint web/x".into(),
        "status.current.ips[0].ipv4 `x` is not an address".into(),
    ));
    let refusals = messages(&world.plan().unwrap_err());
    assert!(
        refusals.iter().any(
            |r| r.contains("SpiderIPPool v4 is refused by allot's checks")
                && r.contains("gateway 10.9.9.9 lies outside")
        ),
        "{refusals:?}"
    );
    assert!(
        refusals
            .iter()
            .any(|r| r.contains("SpiderIPPool broken cannot be read: spec: unknown field")),
        "{refusals:?}"
    );
    assert!(
        refusals
            .iter()
            .any(|r| r == "SpiderEndpoint web/x cannot be read: status.current.ips[0].ipv4 `x` is not an address"),
        "{refusals:?}"
    );
}

#[test]
fn an_address_allot_gave_another_pod_or_a_name_taken_is_refused() {
    let mut world = World::spiderpool();
    let mut theirs = World::spiderpool().plan().unwrap().claims[0].clone();
    theirs.pod.name = "someone-else".into();
    world.current.claims.push(theirs);
    world.current.pools.push(CurrentObject {
        name: "v6".into(),
        labels: BTreeMap::new(),
        spec: Some(IpPoolSpec {
            subnet: "2001:db8::/64".into(),
            ips: vec!["2001:db8::10-2001:db8::30".into()],
            ..IpPoolSpec::default()
        }),
    });
    let refusals = messages(&world.plan().unwrap_err());
    assert!(
        refusals.iter().any(|r| r.contains(
            "address 192.0.2.10 is already claimed in allot by pod web/someone-else (IPPool v4), but SpiderIPPool v4 status.allocatedIPs gives it to web/web-a"
        )),
        "{refusals:?}"
    );
    assert!(
        refusals.iter().any(|r| r.contains(
            "SpiderIPPool v6 would become IPPool v6, but allot has a IPPool v6 with another spec"
        )),
        "{refusals:?}"
    );
}

#[test]
fn pools_that_become_one_join_their_addresses() {
    let mut world = World::spiderpool();
    let mut nic2 = pool("v4", "192.0.2.0/24", &["192.0.2.30-192.0.2.31"]);
    nic2.source = "SpiderIPPool auto4-web-net1".into();
    world.pools.push(nic2);
    let plan = world.plan().unwrap();
    assert_eq!(plan.pools.len(), 2);
    assert_eq!(
        plan.pools[0].spec.ips,
        ["192.0.2.10-192.0.2.20", "192.0.2.30-192.0.2.31"]
    );
    assert_eq!(plan.pools[0].sources.len(), 2);
    let mut other = pool("v4", "192.0.2.0/24", &["192.0.2.40"]);
    other.spec.as_mut().unwrap().default = true;
    world.pools.push(other);
    let refusals = messages(&world.plan().unwrap_err());
    assert!(
        refusals[0].contains("both become IPPool v4 but differ in more than their ips"),
        "{refusals:?}"
    );
}

#[test]
fn a_record_outside_its_pool_is_kept_claimed_and_noted() {
    let mut world = World::spiderpool();
    world
        .records
        .push(record("192.0.2.50", "v4", "old", "uid-o"));
    let plan = world.plan().unwrap();
    let old = plan
        .claims
        .iter()
        .find(|c| c.address == ip("192.0.2.50"))
        .unwrap();
    assert_eq!(
        old.pod.uid, "uid-o",
        "no live pod: the record's UID, for GC to judge"
    );
    assert!(
        plan.notes
            .iter()
            .any(|n| n.contains("192.0.2.50") && n.contains("not one IPPool v4 hands out")),
        "{:?}",
        plan.notes
    );
    assert!(
        !plan.endpoints.iter().any(|e| e.name == "old"),
        "no Endpoint for a pod that is gone"
    );
}

#[test]
fn whereabouts_ranges_load_as_whereabouts_loads_them() {
    let load = |range: &str, start: Option<&str>, end: Option<&str>| {
        Range::load(&RangeConfig {
            range: range.into(),
            range_start: start.map(str::to_string),
            range_end: end.map(str::to_string),
            exclude: Vec::new(),
        })
        .map(|r| (r.net.to_string(), r.first.to_string(), r.last.to_string()))
    };
    let t = |a: &str, b: &str, c: &str| Ok((a.to_string(), b.to_string(), c.to_string()));
    assert_eq!(
        load("192.168.2.225/28", None, None),
        t("192.168.2.224/28", "192.168.2.225", "192.168.2.238"),
        "the written address is not the start: the network's first usable is"
    );
    assert_eq!(
        load("10.0.0.0/24", Some("10.0.0.100"), Some("10.0.0.150")),
        t("10.0.0.0/24", "10.0.0.100", "10.0.0.150")
    );
    assert_eq!(
        load("10.0.0.5-10.0.0.9/24", None, None),
        t("10.0.0.0/24", "10.0.0.5", "10.0.0.9")
    );
    assert_eq!(
        load("10.0.0.0/24", Some("10.1.0.0"), None),
        t("10.0.0.0/24", "10.0.0.1", "10.0.0.254"),
        "a start outside the range is ignored, as Whereabouts ignores it"
    );
    assert_eq!(
        load("fd00::/120", None, None),
        t("fd00::/120", "fd00::1", "fd00::fe"),
        "IPv6 too: never the first or the last address"
    );
    assert_eq!(
        load("10.0.0.0/31", None, None).unwrap_err().to_string(),
        "range 10.0.0.0/31 has no usable address"
    );
    assert!(matches!(
        load("10.0.0.9-10.1.0.0/24", None, None),
        Err(RangeError::StartOutside { .. })
    ));
    assert_eq!(
        load("10.0.0.0/24", Some("10.0.0.x"), None)
            .unwrap_err()
            .to_string(),
        "range_start `10.0.0.x` is not an address"
    );
}

#[test]
fn whereabouts_names_and_offsets() {
    let net: ipnet::IpNet = "10.0.0.0/24".parse().unwrap();
    assert_eq!(ippool_name("", &net), "10.0.0.0-24");
    assert_eq!(ippool_name("blue", &net), "blue-10.0.0.0-24");
    assert_eq!(allot_pool_name("", &net), "whereabouts-10.0.0.0-24");
    assert_eq!(normalize_range("fd00::/64"), "fd00---64");
    assert_eq!(normalize_range("fd00::"), "fd00--0");
    assert_eq!(allocation_address("10.0.0.0/24", "5"), Ok(ip("10.0.0.5")));
    assert_eq!(
        allocation_address("192.168.2.225/28", "1"),
        Ok(ip("192.168.2.226")),
        "offsets count from the address spec.range writes, as net.ParseCIDR returns it"
    );
    assert_eq!(allocation_address("fd00::/64", "16"), Ok(ip("fd00::10")));
    assert!(matches!(
        allocation_address("10.0.0.0/24", "x"),
        Err(AllocationError::NotOffset { offset, .. }) if offset == "x"
    ));
    assert_eq!(
        allocation_address("255.255.255.255/32", "1").unwrap_err(),
        AllocationError::PastTheEnd {
            offset: 1,
            range: "255.255.255.255/32".into()
        }
    );
    assert_eq!(
        allocation_address("10.0.0.0", "1").unwrap_err().to_string(),
        "spec.range `10.0.0.0` is not a CIDR"
    );
    let nets = vec!["blue".to_string(), "ab".to_string()];
    assert_eq!(
        reservation_address("10.0.0.5", &nets),
        Some((String::new(), ip("10.0.0.5")))
    );
    assert_eq!(
        reservation_address("blue-10.0.0.5", &nets),
        Some(("blue".into(), ip("10.0.0.5")))
    );
    assert_eq!(
        reservation_address("fd00--5", &nets),
        Some((String::new(), ip("fd00::5")))
    );
    assert_eq!(
        reservation_address("ab-cd--1", &nets),
        Some(("ab".into(), ip("cd::1"))),
        "a known network first"
    );
    assert_eq!(
        reservation_address("gone-net-10.0.0.7", &nets),
        Some(("gone-net".into(), ip("10.0.0.7")))
    );
    assert_eq!(reservation_address("not-an-address", &nets), None);
}

#[test]
fn whereabouts_ipam_sections_read_their_ranges() {
    let config: IpamConfig = serde_yaml::from_str(
        r#"{"type":"whereabouts","range":"10.0.0.0/24","exclude":["10.0.0.0/28"],
            "ipRanges":[{"range":"fd00::/120"}],"gateway":"10.0.0.1","network_name":"blue",
            "kubernetes":{"kubeconfig":"/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}}"#,
    )
    .unwrap();
    assert!(config.is_whereabouts());
    let ranges = config.ranges().unwrap();
    assert_eq!(ranges.len(), 2);
    let spec = ranges[0].pool_spec(config.gateway.as_deref(), &config.routes);
    assert_eq!(spec.subnet, "10.0.0.0/24");
    assert_eq!(spec.ips, ["10.0.0.1-10.0.0.254"]);
    assert_eq!(spec.exclude_ips, ["10.0.0.0/28"]);
    assert_eq!(spec.gateway.as_deref(), Some("10.0.0.1"));
    assert_eq!(config.network_name(), "blue");
    let v6 = ranges[1].pool_spec(config.gateway.as_deref(), &config.routes);
    assert_eq!(v6.gateway, None, "the IPv4 gateway is not the IPv6 range's");
    let routed: IpamConfig = serde_yaml::from_str(
        r#"{"type":"whereabouts","range":"10.0.0.0/24","gateway":"10.0.0.1",
            "routes":[{"dst":"10.9.0.0/16"},{"dst":"fd00:9::/64","gw":"fd00::1"},
                      {"dst":"10.8.0.0/16","gw":"10.0.0.254"}]}"#,
    )
    .unwrap();
    let spec = routed.ranges().unwrap()[0].pool_spec(routed.gateway.as_deref(), &routed.routes);
    let routes: Vec<(&str, &str)> = spec
        .routes
        .iter()
        .map(|r| (r.dst.as_str(), r.gw.as_str()))
        .collect();
    assert_eq!(
        routes,
        [("10.9.0.0/16", "10.0.0.1"), ("10.8.0.0/16", "10.0.0.254")]
    );
    let sliced: IpamConfig = serde_yaml::from_str(
        r#"{"type":"whereabouts","range":"10.0.0.0/16","node_slice_size":"/22"}"#,
    )
    .unwrap();
    assert_eq!(sliced.ranges(), Err(RangeError::NodeSliced));
    assert!(
        sliced
            .ranges()
            .unwrap_err()
            .to_string()
            .contains("NodeSlicePools")
    );
}

proptest! {
    /// Whatever the records say, a plan claims each address at most once, for its one holder,
    /// and an address with two holders is refused, never planned.
    #[test]
    fn each_address_is_claimed_once_for_its_one_holder_or_refused(
        held in proptest::collection::vec((0u8..11, 0u8..4), 0..20),
        used in proptest::collection::vec((0u8..11, 0u8..4), 0..6),
    ) {
        let mut world = World::spiderpool();
        world.reserved.clear();
        world.records = held
            .iter()
            .map(|(a, p)| record(&format!("192.0.2.{}", 10 + a), "v4", &format!("p{p}"), &format!("u{p}")))
            .collect();
        world.pods = (0..4)
            .map(|p| {
                let mine: Vec<String> = used
                    .iter()
                    .filter(|(_, q)| *q == p)
                    .map(|(a, _)| format!("192.0.2.{}", 10 + a))
                    .collect();
                let mine: Vec<&str> = mine.iter().map(String::as_str).collect();
                live(&format!("p{p}"), &format!("u{p}"), &mine)
            })
            .collect();
        let mut holders: BTreeMap<u8, std::collections::BTreeSet<u8>> = BTreeMap::new();
        for (a, p) in held.iter().chain(&used) {
            holders.entry(*a).or_default().insert(*p);
        }
        match world.plan() {
            Ok(plan) => {
                let mut seen = std::collections::BTreeSet::new();
                for c in &plan.claims {
                    prop_assert!(seen.insert(c.address), "{} planned twice", c.address);
                    let IpAddr::V4(v4) = c.address else { unreachable!() };
                    let a = v4.octets()[3] - 10;
                    let only = holders[&a].iter().next().unwrap();
                    prop_assert_eq!(holders[&a].len(), 1);
                    prop_assert_eq!(&c.pod.name, &format!("p{only}"));
                }
                prop_assert_eq!(seen.len(), holders.len());
            }
            Err(refusals) => {
                let twice = holders.values().filter(|h| h.len() > 1).count();
                prop_assert!(twice > 0);
                prop_assert_eq!(refusals.len(), twice);
            }
        }
    }
}

/// After the switch, pods come and go under allot and its GC releases the claims of pods that
/// are gone; the peer, stopped, still records them. Run again, a migration imports nothing of
/// that: not the claim of a pod gone since (GC released it; the address may be another pod's
/// now), not a note or claim for each address allot handed out itself.
#[test]
fn a_rerun_after_the_switch_changes_nothing_allot_owns() {
    let mut world = World::spiderpool();
    let first = world.plan().unwrap();
    world.written(&first);
    // web-a is deleted; GC releases its claims; allot hands 192.0.2.10 to a new pod, and
    // 192.0.2.12 to another.
    world.pods.retain(|p| p.name != "web-a");
    world.current.claims.retain(|c| c.pod.name != "web-a");
    for (name, address) in [("web-new", "192.0.2.10"), ("web-other", "192.0.2.12")] {
        let mut c = first.claims[0].clone();
        c.address = ip(address);
        c.pod.name = name.into();
        c.pod.uid = format!("uid-{name}");
        c.attachment = Some(crate::store::Attachment {
            container_id: format!("sandbox-{name}"),
            interface: "eth0".into(),
        });
        c.node = "node-2".into();
        world.current.claims.push(c);
        world
            .pods
            .push(live(name, &format!("uid-{name}"), &[address]));
    }
    let again = world
        .plan()
        .unwrap_or_else(|r| panic!("{:?}", messages(&r)));
    assert!(again.claims.is_empty(), "{:?}", again.claims);
    assert!(again.objects_done());
    assert!(again.notes.is_empty(), "{:?}", again.notes);
    assert!(
        again
            .endpoints
            .iter()
            .all(|e| e.name != "web-new" && e.name != "web-other"),
        "allot's own pods' Endpoints are the agent's: {:?}",
        again.endpoints
    );
}

/// Before the pools are in allot (the first run, or one interrupted before them), a record of a
/// pod that is gone is carried over (GC judges it by its rules); once allot serves the pools, a
/// record of a pod still holding its address that allot does not hold is still imported.
#[test]
fn a_rerun_imports_what_a_live_pod_still_holds() {
    let mut world = World::spiderpool();
    let mut gone = record("192.0.2.13", "v4", "web-gone", "uid-gone");
    gone.source = "SpiderIPPool v4 status.allocatedIPs".into();
    world.records.push(gone);
    let first = world.plan().unwrap();
    assert!(
        first.claims.iter().any(|c| c.pod.name == "web-gone"),
        "the first run carries over a gone pod's record"
    );
    world.written(&first);
    world.current.claims.retain(|c| c.pod.name != "web-a");
    let again = world.plan().unwrap();
    let names: Vec<&str> = again.claims.iter().map(|c| c.pod.name.as_str()).collect();
    assert_eq!(
        names,
        ["web-a", "web-a"],
        "web-a lives and holds its addresses"
    );
}

/// Spiderpool keys a KubeVirt VM's addresses by its VirtualMachineInstance (named after the
/// VM): the record names the VM, with the launcher pod's UID. The claim is the launcher pod's,
/// held for the VM (owner VirtualMachine), as allot's agent would have made it: a live
/// migration's target takes it over.
#[test]
fn a_spiderpool_virtual_machine_becomes_its_launcher_pods_claim() {
    let vm = Owner {
        kind: crate::store::VIRTUAL_MACHINE_KIND.into(),
        name: "db-vm".into(),
    };
    let mut r = record("192.0.2.15", "v4", "db-vm", "uid-launcher");
    r.owner = Some(vm.clone());
    r.interface = Some("net1".into());
    let mut launcher = live("virt-launcher-db-vm-abcde", "uid-launcher", &[]);
    launcher.owner = Some(vm.clone());
    launcher.addresses = vec![PodAddress {
        address: ip("192.0.2.15"),
        interface: Some("net1".into()),
    }];
    let mut world = World::spiderpool();
    world.records = vec![r];
    world.pods = vec![launcher];
    let plan = world
        .plan()
        .unwrap_or_else(|r| panic!("{:?}", messages(&r)));
    assert_eq!(plan.claims.len(), 1);
    let c = &plan.claims[0];
    assert_eq!(c.pod.name, "virt-launcher-db-vm-abcde");
    assert_eq!(c.pod.uid, "uid-launcher");
    assert_eq!(c.pod.virtual_machine(), Some("db-vm"));
    assert_eq!(c.attachment.as_ref().unwrap().interface, "net1");
    assert_eq!(
        c.network, "",
        "Spiderpool records no network: the first ADD tells it"
    );
    let e = &plan.endpoints[0];
    assert_eq!(e.name, "virt-launcher-db-vm-abcde");

    // A live migration in flight: the target launcher pod uses the address too. One holder.
    let mut target = world.pods[0].clone();
    target.name = "virt-launcher-db-vm-fghij".into();
    target.uid = "uid-target".into();
    world.pods.push(target);
    let plan = world
        .plan()
        .unwrap_or_else(|r| panic!("{:?}", messages(&r)));
    assert_eq!(plan.claims.len(), 1);
    assert_eq!(plan.claims[0].pod.name, "virt-launcher-db-vm-abcde");

    // No launcher pod runs (the VM is stopped): the claim is held for the VM all the same.
    world.pods.clear();
    let plan = world.plan().unwrap();
    assert_eq!(plan.claims[0].pod.virtual_machine(), Some("db-vm"));
}

/// Whereabouts records the launcher pod and the network, no owner: the owner is the live pod's
/// controller as allot records it (the VirtualMachineInstance stands for its VM).
#[test]
fn a_whereabouts_virtual_machine_is_held_for_the_vm_on_its_network() {
    let mut r = record("192.0.2.16", "v4", "virt-launcher-web-vm-zzzzz", "");
    r.uid = None;
    r.network = "underlay".into();
    r.interface = Some("net1".into());
    r.container_id = Some("0123abcd".into());
    let mut launcher = live("virt-launcher-web-vm-zzzzz", "uid-l", &[]);
    launcher.owner = Some(Owner {
        kind: crate::store::VIRTUAL_MACHINE_KIND.into(),
        name: "web-vm".into(),
    });
    let mut world = World::spiderpool();
    world.records = vec![r];
    world.pods = vec![launcher];
    let plan = world.plan().unwrap();
    let c = &plan.claims[0];
    assert_eq!(c.pod.virtual_machine(), Some("web-vm"));
    assert_eq!(c.network, "underlay");
    assert_eq!(c.pod.uid, "uid-l");
    assert_eq!(c.attachment.as_ref().unwrap().container_id, "0123abcd");
}

/// Spiderpool's pool record of a VM's address names the VM with the launcher pod's UID but no
/// owner (the SpiderEndpoint has it): it is the launcher pod's record all the same, one holder.
#[test]
fn a_spiderpool_pool_record_of_a_virtual_machine_is_its_launcher_pods() {
    let vm = Owner {
        kind: crate::store::VIRTUAL_MACHINE_KIND.into(),
        name: "db-vm".into(),
    };
    let pool_record = record("192.0.2.15", "v4", "db-vm", "uid-launcher");
    let mut endpoint_record = pool_record.clone();
    endpoint_record.owner = Some(vm.clone());
    endpoint_record.interface = Some("net1".into());
    endpoint_record.source = "SpiderEndpoint web/db-vm".into();
    let mut launcher = live("virt-launcher-db-vm-abcde", "uid-launcher", &[]);
    launcher.owner = Some(vm);
    let mut world = World::spiderpool();
    world.records = vec![pool_record, endpoint_record];
    world.pods = vec![launcher];
    let plan = world
        .plan()
        .unwrap_or_else(|r| panic!("{:?}", messages(&r)));
    assert_eq!(plan.claims.len(), 1);
    assert_eq!(plan.claims[0].pod.name, "virt-launcher-db-vm-abcde");
    assert_eq!(plan.claims[0].pod.virtual_machine(), Some("db-vm"));
    assert_eq!(
        plan.claims[0].attachment.as_ref().unwrap().interface,
        "net1"
    );
}
