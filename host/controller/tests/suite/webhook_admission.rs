//! Every admission rule, allowed and denied, through the handlers the HTTPS server calls: the
//! objects are read from the in-memory API server (tests/apiserver), the claims from a store.

use crate::common::admission::{Cluster, request};
use allot_controller::webhook::admit;
use allot_core::store::{Attachment, Claim, PodRef};
use serde_json::{Value, json};

fn ippool(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": name},
           "spec": spec})
}

fn subnet(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Subnet", "metadata": {"name": name},
           "spec": spec})
}

fn reserved(name: &str, ips: &[&str]) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "ReservedIP", "metadata": {"name": name},
           "spec": {"ips": ips}})
}

fn ipam_pool(name: &str, datacenters: Value, allocations: Value) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMPool", "metadata": {"name": name},
           "spec": {"datacenters": datacenters},
           "status": {"allocations": allocations, "recordVersion": 1}})
}

fn ipam_allocation(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPAMAllocation",
           "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

fn claim(address: &str, pool: &str, pod: &str) -> Claim {
    Claim {
        address: address.parse().unwrap(),
        pool: pool.into(),
        network: "net".into(),
        attachment: Some(Attachment {
            container_id: pod.into(),
            interface: "eth0".into(),
        }),
        pod: PodRef {
            namespace: "web".into(),
            name: pod.into(),
            uid: format!("uid-{pod}"),
            ..PodRef::default()
        },
        node: String::new(),
        updated_at: 0,
    }
}

#[tokio::test]
async fn an_ippool_must_be_valid_as_the_agent_reads_it() {
    let c = Cluster::new(&[], &[]);
    let ok = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.20"], "gateway": "10.0.0.1"}),
    );
    c.allowed("CREATE", Some(&ok), None).await;
    let reversed = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.20-10.0.0.10"]}),
    );
    c.denied(
        "CREATE",
        Some(&reversed),
        None,
        &["range `10.0.0.20-10.0.0.10` ends before it starts"],
    )
    .await;
    let gateway = ippool("a", json!({"subnet": "10.0.0.0/24", "gateway": "10.9.0.1"}));
    c.denied(
        "CREATE",
        Some(&gateway),
        None,
        &["gateway 10.9.0.1 lies outside subnet 10.0.0.0/24"],
    )
    .await;
    let version = ippool("a", json!({"subnet": "10.0.0.0/24", "ipVersion": 6}));
    c.denied(
        "CREATE",
        Some(&version),
        None,
        &["ipVersion 6 does not match subnet 10.0.0.0/24"],
    )
    .await;
    let outside = ippool("a", json!({"subnet": "10.0.0.0/24", "ips": ["10.0.1.5"]}));
    let r = c.validate("CREATE", Some(&outside), None).await;
    assert_eq!((r.result.code, r.result.reason.as_str()), (422, "Invalid"));
}

#[tokio::test]
async fn an_ippool_overlapping_another_is_refused_naming_it() {
    let a = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.20"]}),
    );
    // Stored before the webhook was there and not valid: it serves nowhere, nothing overlaps it.
    let broken = ippool(
        "broken",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.x"]}),
    );
    let c = Cluster::new(&[("ippools", a.clone()), ("ippools", broken)], &[]);
    let b = ippool(
        "b",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.15-10.0.0.30"]}),
    );
    c.denied(
        "CREATE",
        Some(&b),
        None,
        &["IPPool b: addresses 10.0.0.15-10.0.0.20 are also in IPPool a"],
    )
    .await;
    let wide = ippool("b", json!({"subnet": "10.0.0.0/16", "ips": ["10.0.9.1"]}));
    c.denied(
        "CREATE",
        Some(&wide),
        None,
        &["overlaps subnet 10.0.0.0/24 of IPPool a"],
    )
    .await;
    let beside = ippool(
        "b",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.21-10.0.0.30"]}),
    );
    c.allowed("CREATE", Some(&beside), None).await;
    // Editing `a` itself is not an overlap with its stored version.
    let grown = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.25"]}),
    );
    c.allowed("UPDATE", Some(&grown), Some(&a)).await;
}

#[tokio::test]
async fn subnet_and_ip_version_of_an_ippool_are_immutable() {
    let c = Cluster::new(&[], &[]);
    let old = ippool("a", json!({"subnet": "10.0.0.0/24", "ipVersion": 4}));
    let moved = ippool("a", json!({"subnet": "10.1.0.0/24", "ipVersion": 4}));
    c.denied(
        "UPDATE",
        Some(&moved),
        Some(&old),
        &["IPPool a: subnet is immutable (10.0.0.0/24 → 10.1.0.0/24)"],
    )
    .await;
    let six = ippool("a", json!({"subnet": "fd00::/64", "ipVersion": 6}));
    c.denied(
        "UPDATE",
        Some(&six),
        Some(&old),
        &["ipVersion is immutable (4 → 6)"],
    )
    .await;
    let same = ippool("a", json!({"subnet": "10.0.0.0/24", "disable": true}));
    c.allowed("UPDATE", Some(&same), Some(&old)).await;
}

#[tokio::test]
async fn an_address_in_use_cannot_leave_its_pool() {
    let old = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.20"]}),
    );
    let c = Cluster::new(
        &[("ippools", old.clone())],
        &[claim("10.0.0.12", "a", "web-0")],
    );
    let shrunk = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.13-10.0.0.20"]}),
    );
    c.denied(
        "UPDATE",
        Some(&shrunk),
        Some(&old),
        &["removes 10.0.0.12 from ips", "10.0.0.12 (web/web-0)"],
    )
    .await;
    let excluded = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.20"], "excludeIPs": ["10.0.0.12"]}),
    );
    c.denied(
        "UPDATE",
        Some(&excluded),
        Some(&old),
        &["adds 10.0.0.12 to excludeIPs"],
    )
    .await;
    let gateway = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.20"], "gateway": "10.0.0.12"}),
    );
    c.denied(
        "UPDATE",
        Some(&gateway),
        Some(&old),
        &["makes 10.0.0.12 the gateway"],
    )
    .await;
    let free_removed = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.11-10.0.0.13"]}),
    );
    c.allowed("UPDATE", Some(&free_removed), Some(&old)).await;
}

#[tokio::test]
async fn a_pool_holding_addresses_cannot_be_deleted_but_its_finalizer_can_always_come_off() {
    let a = ippool(
        "a",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.20"]}),
    );
    let claims: Vec<Claim> = (10..14)
        .map(|i| claim(&format!("10.0.0.{i}"), "a", &format!("web-{i}")))
        .collect();
    let c = Cluster::new(&[("ippools", a.clone())], &claims);
    let r = c.validate("DELETE", None, Some(&a)).await;
    assert!(!r.allowed);
    assert!(
        r.result
            .message
            .contains("IPPool a holds 4 address(es): 10.0.0.10 (web/web-10)"),
        "{}",
        r.result.message
    );
    assert_eq!(r.result.code, 403);
    let empty = ippool("empty", json!({"subnet": "10.1.0.0/24"}));
    c.allowed("DELETE", None, Some(&empty)).await;

    // Terminating, finalizer removed: the spec is unchanged, so nothing else is looked at (the
    // claims could not even be read here).
    let mut terminating = a.clone();
    terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    terminating["metadata"]["finalizers"] = json!(["allot.dev/claims"]);
    let mut released = terminating.clone();
    released["metadata"]["finalizers"] = json!([]);
    c.server.forbid("list", "ippools");
    c.allowed("UPDATE", Some(&released), Some(&terminating))
        .await;
}

#[tokio::test]
async fn when_the_checks_cannot_run_the_change_is_refused_saying_so() {
    let c = Cluster::new(&[], &[]);
    let a = ippool("a", json!({"subnet": "10.0.0.0/24"}));
    // An invalid object is refused as invalid (422) even while the API is unreadable...
    let bad = ippool("b", json!({"subnet": "10.0.0.0/33"}));
    c.server.forbid("list", "ippools");
    assert_eq!(
        c.validate("CREATE", Some(&bad), None).await.result.code,
        422
    );
    // ...and a valid one as unavailable (503, ServiceUnavailable): clients retry it rather
    // than read it as a fault of the object.
    c.denied(
        "CREATE",
        Some(&a),
        None,
        &[
            "could not check this change",
            "needs list on ippools",
            "try again",
        ],
    )
    .await;
    let r = c.validate("CREATE", Some(&a), None).await;
    assert_eq!(
        (r.result.code, r.result.reason.as_str()),
        (503, "ServiceUnavailable")
    );
}

#[tokio::test]
async fn a_pool_carved_from_a_subnet_must_fit_inside_it() {
    let s = subnet(
        "s",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.50"]}),
    );
    let c = Cluster::new(&[("subnets", s)], &[]);
    let mut inside = ippool(
        "auto-web",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.12"]}),
    );
    inside["metadata"]["labels"] = json!({"ipam.allot.dev/owner-subnet": "s"});
    c.allowed("CREATE", Some(&inside), None).await;
    let mut outside = inside.clone();
    outside["spec"]["ips"] = json!(["10.0.0.45-10.0.0.55"]);
    c.denied(
        "CREATE",
        Some(&outside),
        None,
        &[
            "IPPool auto-web is carved from Subnet s",
            "10.0.0.51-10.0.0.55",
        ],
    )
    .await;
    // Labelling a pool with a Subnet later is checked too.
    let mut plain = outside.clone();
    plain["metadata"]["labels"] = json!({});
    c.denied(
        "UPDATE",
        Some(&outside),
        Some(&plain),
        &["carved from Subnet s"],
    )
    .await;
}

#[tokio::test]
async fn subnets_are_disjoint_immutable_and_keep_what_their_pools_hold() {
    let s = subnet(
        "s",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.50"]}),
    );
    let mut auto = ippool(
        "auto-web",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.20-10.0.0.25"]}),
    );
    auto["metadata"]["labels"] = json!({"ipam.allot.dev/owner-subnet": "s"});
    let c = Cluster::new(
        &[("subnets", s.clone()), ("ippools", auto)],
        &[claim("10.0.0.21", "auto-web", "web-0")],
    );

    let t = subnet("t", json!({"subnet": "10.0.0.0/23"}));
    c.denied(
        "CREATE",
        Some(&t),
        None,
        &["Subnet t: subnet 10.0.0.0/23 overlaps subnet 10.0.0.0/24 of Subnet s"],
    )
    .await;
    let moved = subnet("s", json!({"subnet": "10.2.0.0/24"}));
    c.denied(
        "UPDATE",
        Some(&moved),
        Some(&s),
        &["Subnet s: subnet is immutable"],
    )
    .await;
    let shrunk = subnet(
        "s",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.22"]}),
    );
    c.denied(
        "UPDATE",
        Some(&shrunk),
        Some(&s),
        &["IPPool auto-web is carved from it and offers 10.0.0.23-10.0.0.25"],
    )
    .await;
    let grown = subnet(
        "s",
        json!({"subnet": "10.0.0.0/24", "ips": ["10.0.0.10-10.0.0.60"]}),
    );
    c.allowed("UPDATE", Some(&grown), Some(&s)).await;
    c.denied(
        "DELETE",
        None,
        Some(&s),
        &["Subnet s: pools carved from it hold addresses (auto-web: 1)"],
    )
    .await;
    let malformed = subnet(
        "u",
        json!({"subnet": "10.9.0.0/24", "excludeIPs": ["nonsense"]}),
    );
    c.denied(
        "CREATE",
        Some(&malformed),
        None,
        &["Subnet u: excludeIPs: `nonsense` is not an address"],
    )
    .await;
}

#[tokio::test]
async fn a_reserved_ip_must_parse_and_reserving_an_address_in_use_warns() {
    let c = Cluster::new(&[], &[claim("10.0.0.12", "a", "web-0")]);
    let bad = reserved("r", &["10.0.0.1-10.0.0.x"]);
    c.denied(
        "CREATE",
        Some(&bad),
        None,
        &["ReservedIP r: ips: `10.0.0.1-10.0.0.x` is not an address"],
    )
    .await;
    let mixed = reserved("r", &["10.0.0.1", "fd00::1"]);
    c.denied(
        "CREATE",
        Some(&mixed),
        None,
        &["`fd00::1` is ipv6, but this set holds ipv4 addresses"],
    )
    .await;
    let in_use = reserved("r", &["10.0.0.10-10.0.0.14"]);
    let r = c.validate("CREATE", Some(&in_use), None).await;
    assert!(r.allowed);
    let warnings = r.warnings.unwrap_or_default();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("10.0.0.12 (web/web-0) of IPPool a in use")),
        "{warnings:?}"
    );
    c.allowed("DELETE", None, Some(&in_use)).await;
}

fn hamburg() -> Value {
    json!({"hamburg": {"type": "range", "poolCidr": "192.168.1.0/24", "allocationRange": 10}})
}

fn held_by_a() -> Value {
    json!({"cluster-a": {"type": "range", "dc": "hamburg", "addresses": ["192.168.1.1-192.168.1.10"]}})
}

#[tokio::test]
async fn ipam_pool_edits_are_refused_as_the_allocator_refuses_them() {
    let c = Cluster::new(&[], &[]);
    let old = ipam_pool("metallb", hamburg(), held_by_a());
    let mut moved = old.clone();
    moved["spec"]["datacenters"]["hamburg"]["poolCidr"] = json!("192.168.2.0/24");
    c.denied(
        "UPDATE",
        Some(&moved),
        Some(&old),
        &["IPAMPool metallb datacenter hamburg", "192.168.1.0/24"],
    )
    .await;
    let mut retyped = old.clone();
    retyped["spec"]["datacenters"]["hamburg"] =
        json!({"type": "prefix", "poolCidr": "192.168.1.0/24", "allocationPrefix": 28});
    c.denied(
        "UPDATE",
        Some(&retyped),
        Some(&old),
        &["datacenter hamburg"],
    )
    .await;
    let mut excluding = old.clone();
    excluding["spec"]["datacenters"]["hamburg"]["excludeRanges"] = json!(["192.168.1.5"]);
    c.denied("UPDATE", Some(&excluding), Some(&old), &["192.168.1.5"])
        .await;
    let mut dropped = old.clone();
    dropped["spec"]["datacenters"] = json!({});
    c.denied("UPDATE", Some(&dropped), Some(&old), &["cluster-a"])
        .await;
    c.denied("DELETE", None, Some(&old), &["cluster-a"]).await;
    let mut grown = old.clone();
    grown["spec"]["datacenters"]["hamburg"]["allocationRange"] = json!(20);
    c.allowed("UPDATE", Some(&grown), Some(&old)).await;
    let unused = ipam_pool("spare", hamburg(), json!({}));
    c.allowed("DELETE", None, Some(&unused)).await;
    let invalid = ipam_pool(
        "bad",
        json!({"x": {"type": "prefix", "poolCidr": "10.0.0.0/24", "allocationPrefix": 33}}),
        json!({}),
    );
    c.denied(
        "CREATE",
        Some(&invalid),
        None,
        &["IPAMPool bad datacenter x"],
    )
    .await;
}

#[tokio::test]
async fn an_ipam_allocation_must_agree_with_its_pools_record() {
    let pool = ipam_pool("metallb", hamburg(), held_by_a());
    let c = Cluster::new(&[("ipampools", pool)], &[]);
    let recorded = ipam_allocation(
        "cluster-a",
        "metallb",
        json!({"type": "range", "dc": "hamburg", "addresses": ["192.168.1.1-192.168.1.10"]}),
    );
    c.allowed("CREATE", Some(&recorded), None).await;
    let request = ipam_allocation("cluster-b", "metallb", json!({"dc": "hamburg"}));
    c.allowed("CREATE", Some(&request), None).await;
    let overlapping = ipam_allocation(
        "cluster-b",
        "metallb",
        json!({"type": "range", "dc": "hamburg", "addresses": ["192.168.1.5-192.168.1.14"]}),
    );
    c.denied(
        "CREATE",
        Some(&overlapping),
        None,
        &["IPAMAllocation cluster-b/metallb", "cluster-a"],
    )
    .await;
    let rewritten = ipam_allocation(
        "cluster-a",
        "metallb",
        json!({"type": "range", "dc": "hamburg", "addresses": ["192.168.1.11-192.168.1.20"]}),
    );
    c.denied("UPDATE", Some(&rewritten), Some(&recorded), &["records"])
        .await;
    let elsewhere = ipam_allocation("cluster-c", "metallb", json!({"dc": "berlin"}));
    c.denied("CREATE", Some(&elsewhere), None, &["berlin"])
        .await;
    let orphan = ipam_allocation("cluster-c", "nopool", json!({"dc": "hamburg"}));
    c.denied(
        "CREATE",
        Some(&orphan),
        None,
        &["there is no IPAMPool nopool"],
    )
    .await;
}

/// cluster-b's IPAMAllocation was made by another tool (Kubermatic, a migration): the pool has
/// no record of it, yet its addresses are taken for every check.
#[tokio::test]
async fn ipam_objects_are_judged_against_every_allocation_holding_addresses() {
    let pool = ipam_pool("metallb", hamburg(), held_by_a());
    let unrecorded = ipam_allocation(
        "cluster-b",
        "metallb",
        json!({"type": "range", "dc": "hamburg", "addresses": ["192.168.1.11-192.168.1.20"]}),
    );
    let c = Cluster::new(
        &[
            ("ipampools", pool.clone()),
            ("ipamallocations", unrecorded.clone()),
        ],
        &[],
    );
    let over_b = ipam_allocation(
        "cluster-c",
        "metallb",
        json!({"type": "range", "dc": "hamburg", "addresses": ["192.168.1.15-192.168.1.24"]}),
    );
    c.denied(
        "CREATE",
        Some(&over_b),
        None,
        &[
            "IPAMAllocation cluster-c/metallb",
            "192.168.1.15-192.168.1.20 are also held by cluster cluster-b",
        ],
    )
    .await;
    // cluster-b's own object is judged against the others, not against itself.
    let mut edited = unrecorded.clone();
    edited["spec"]["addresses"] = json!(["192.168.1.11-192.168.1.21"]);
    c.allowed("UPDATE", Some(&edited), Some(&unrecorded)).await;
    // The allocator writes cluster-a's object from the record, whatever came in meanwhile.
    let recorded = ipam_allocation(
        "cluster-a",
        "metallb",
        json!({"type": "range", "dc": "hamburg", "addresses": ["192.168.1.1-192.168.1.10"]}),
    );
    c.allowed("CREATE", Some(&recorded), None).await;

    let mut excluding = pool.clone();
    excluding["spec"]["datacenters"]["hamburg"]["excludeRanges"] = json!(["192.168.1.15"]);
    c.denied(
        "UPDATE",
        Some(&excluding),
        Some(&pool),
        &["cluster cluster-b holds 192.168.1.15"],
    )
    .await;
    let mut dropped = pool.clone();
    dropped["spec"]["datacenters"] = json!({});
    c.denied(
        "UPDATE",
        Some(&dropped),
        Some(&pool),
        &["clusters cluster-a, cluster-b still hold"],
    )
    .await;
    // A pool created again over the allocations its predecessor made.
    let mut again = excluding.clone();
    again["status"] = json!({});
    c.denied(
        "CREATE",
        Some(&again),
        None,
        &["cluster cluster-b holds 192.168.1.15"],
    )
    .await;
}

/// A prefix pool's first and last prefixes are the clusters' to hold.
#[tokio::test]
async fn an_ipam_allocation_of_a_prefix_pools_first_prefix_is_allowed() {
    let pool = ipam_pool(
        "nodes",
        json!({"dc1": {"type": "prefix", "poolCidr": "10.0.0.0/23", "allocationPrefix": 24}}),
        json!({}),
    );
    let c = Cluster::new(&[("ipampools", pool)], &[]);
    for cidr in ["10.0.0.0/24", "10.0.1.0/24"] {
        let held = ipam_allocation(
            "cluster-m",
            "nodes",
            json!({"type": "prefix", "dc": "dc1", "cidr": cidr}),
        );
        c.allowed("CREATE", Some(&held), None).await;
    }
}

#[tokio::test]
async fn the_mutating_webhook_only_defaults_ip_version_of_valid_objects() {
    let patch_of = |object: &Value| -> Option<Value> {
        let response = admit::mutate(&request("CREATE", Some(object), None));
        assert!(response.allowed, "the mutating webhook never refuses");
        response.patch.map(|p| serde_json::from_slice(&p).unwrap())
    };
    let v4 = ippool("a", json!({"subnet": "10.0.0.0/24"}));
    assert_eq!(
        patch_of(&v4),
        Some(json!([{"op": "add", "path": "/spec/ipVersion", "value": 4}]))
    );
    let v6 = subnet("s", json!({"subnet": "fd00::/64"}));
    assert_eq!(
        patch_of(&v6),
        Some(json!([{"op": "add", "path": "/spec/ipVersion", "value": 6}]))
    );
    let r6 = reserved("r", &["fd00::5"]);
    assert_eq!(
        patch_of(&r6),
        Some(json!([{"op": "add", "path": "/spec/ipVersion", "value": 6}]))
    );
    let said = ippool("a", json!({"subnet": "10.0.0.0/24", "ipVersion": 4}));
    assert_eq!(patch_of(&said), None);
    // Invalid stays invalid and unchanged: the validating webhook says why.
    let invalid = ippool("a", json!({"subnet": "10.0.0.0/24", "ips": ["fd00::1"]}));
    assert_eq!(patch_of(&invalid), None);
    let mixed = reserved("r", &["10.0.0.1", "fd00::1"]);
    assert_eq!(patch_of(&mixed), None);
}
