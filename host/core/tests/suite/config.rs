//! The fail-safe rule of configuration reloads: an invalid object never makes more addresses
//! allocatable than before.

use allot_core::config::{
    InForce, Invalid, Object, ObjectKind, Observation, Observed, ProblemState, Reconciled,
    reconcile,
};
use allot_core::spec::{IpPoolSpec, ObjectMeta, ReservedIpSpec};
use allot_core::{Pool, Reserved};

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: name.into(),
        ..Default::default()
    }
}

fn pool(name: &str, subnet: &str, ips: &[&str], gateway: Option<&str>) -> Pool {
    Pool::from_spec(
        meta(name),
        IpPoolSpec {
            subnet: subnet.into(),
            ips: ips.iter().map(|s| s.to_string()).collect(),
            gateway: gateway.map(str::to_string),
            ..Default::default()
        },
    )
    .unwrap()
}

fn reserved(name: &str, ips: &[&str]) -> Reserved {
    Reserved::from_spec(
        meta(name),
        ReservedIpSpec {
            ip_version: None,
            ips: ips.iter().map(|s| s.to_string()).collect(),
        },
    )
    .expect("valid reservation")
}

fn seen(source: &str, object: Object) -> Observed {
    let (kind, name) = match &object {
        Object::Pool(p) => (ObjectKind::IpPool, p.meta.name.clone()),
        Object::Subnet(s) => (ObjectKind::Subnet, s.meta.name.clone()),
        Object::Reserved(r) => (ObjectKind::ReservedIp, r.meta.name.clone()),
    };
    Observed {
        kind,
        name,
        source: source.into(),
        at: format!("{source}#1"),
        object: Ok(object),
    }
}

/// An invalid ReservedIP `name`, salvaging `readable` entries.
fn bad_reserved(source: &str, name: &str, readable: &[&str]) -> Observed {
    let spec = ReservedIpSpec {
        ip_version: None,
        ips: readable
            .iter()
            .map(|s| s.to_string())
            .chain(["10.6.0.999".to_string()])
            .collect(),
    };
    let error = Reserved::from_spec(meta(name), spec.clone())
        .expect_err("the spec is invalid")
        .to_string();
    Observed {
        kind: ObjectKind::ReservedIp,
        name: name.into(),
        source: source.into(),
        at: format!("{source}#1"),
        object: Err(Invalid {
            error,
            salvaged: Reserved::salvage(meta(name), &spec).map(|(r, _)| Box::new(r)),
        }),
    }
}

fn bad_pool(source: &str, name: &str) -> Observed {
    Observed {
        kind: ObjectKind::IpPool,
        name: name.into(),
        source: source.into(),
        at: format!("{source}#1"),
        object: Err(Invalid {
            error: "gateway 10.8.0.1 lies outside subnet 10.7.0.0/24".into(),
            salvaged: None,
        }),
    }
}

fn observe(objects: Vec<Observed>) -> Observation {
    Observation {
        objects,
        ..Default::default()
    }
}

fn reserved_entries(r: &Reconciled, name: &str) -> Vec<String> {
    r.in_force.reserved[name].0.ips.to_entries()
}

fn pools(r: &Reconciled) -> Vec<(String, String)> {
    r.in_force
        .pools
        .values()
        .map(|(p, _)| (p.meta.name.clone(), p.spec.ips.join(",")))
        .collect()
}

fn pool_object(name: &str, ips: &[&str]) -> Object {
    Object::Pool(Box::new(v4(name, ips)))
}

fn nothing_serves(_: &str) -> bool {
    false
}

fn v4(name: &str, ips: &[&str]) -> Pool {
    pool(name, "10.6.0.0/24", ips, Some("10.6.0.1"))
}

#[test]
fn an_invalid_reserved_ip_keeps_its_previous_version() {
    let first = reconcile(
        &InForce::default(),
        &observe(vec![seen(
            "r.yaml",
            Object::Reserved(reserved("routers", &["10.6.0.10", "10.6.0.11"])),
        )]),
        &nothing_serves,
    );
    assert!(!first.degraded());

    // One malformed entry is added to the same object: both addresses stay reserved.
    let second = reconcile(
        &first.in_force,
        &observe(vec![bad_reserved(
            "r.yaml",
            "routers",
            &["10.6.0.10", "10.6.0.11", "10.6.0.12"],
        )]),
        &nothing_serves,
    );
    assert_eq!(
        reserved_entries(&second, "routers"),
        ["10.6.0.10-10.6.0.11"]
    );
    assert!(second.degraded());
    assert_eq!(second.problems[0].state, ProblemState::HeldBack);
    assert!(
        second.problems[0].reason.contains("10.6.0.999"),
        "{}",
        second.problems[0]
    );
}

#[test]
fn an_invalid_reserved_ip_at_first_load_reserves_what_it_can_read() {
    let r = reconcile(
        &InForce::default(),
        &observe(vec![bad_reserved(
            "r.yaml",
            "routers",
            &["10.6.0.10", "10.6.0.11"],
        )]),
        &nothing_serves,
    );
    assert_eq!(reserved_entries(&r, "routers"), ["10.6.0.10-10.6.0.11"]);
    assert_eq!(r.problems[0].state, ProblemState::Partial);
    assert!(r.degraded());
}

#[test]
fn a_half_written_file_keeps_the_objects_it_held() {
    let first = reconcile(
        &InForce::default(),
        &observe(vec![
            seen("a.yaml", pool_object("web", &["10.6.0.20-10.6.0.29"])),
            seen(
                "a.yaml",
                Object::Reserved(reserved("routers", &["10.6.0.10"])),
            ),
        ]),
        &nothing_serves,
    );
    // Mid-edit, only the pool parses before a YAML error.
    let mut partial = observe(vec![seen(
        "a.yaml",
        pool_object("web", &["10.6.0.20-10.6.0.29"]),
    )]);
    partial
        .incomplete
        .insert("a.yaml".into(), "a.yaml#2: not YAML".into());
    let r = reconcile(&first.in_force, &partial, &nothing_serves);
    assert_eq!(reserved_entries(&r, "routers"), ["10.6.0.10"]);
    assert_eq!(r.problems[0].state, ProblemState::HeldBack);
    assert!(
        r.problems[0]
            .reason
            .contains("could not be read completely")
    );

    // Once the file is whole and the object gone, it is gone.
    let fixed = observe(vec![seen(
        "a.yaml",
        pool_object("web", &["10.6.0.20-10.6.0.29"]),
    )]);
    let r = reconcile(&r.in_force, &fixed, &nothing_serves);
    assert!(r.in_force.reserved.is_empty());
    assert!(!r.degraded());
}

#[test]
fn an_invalid_pool_keeps_its_previous_version() {
    let first = reconcile(
        &InForce::default(),
        &observe(vec![seen(
            "p.yaml",
            pool_object("web", &["10.6.0.20-10.6.0.29"]),
        )]),
        &nothing_serves,
    );
    let r = reconcile(
        &first.in_force,
        &observe(vec![bad_pool("p.yaml", "web")]),
        &nothing_serves,
    );
    assert_eq!(
        pools(&r),
        [("web".to_string(), "10.6.0.20-10.6.0.29".to_string())]
    );
    assert_eq!(r.problems[0].state, ProblemState::HeldBack);

    // A new pool that is invalid is simply left out.
    let r = reconcile(
        &first.in_force,
        &observe(vec![
            seen("p.yaml", pool_object("web", &["10.6.0.20-10.6.0.29"])),
            bad_pool("q.yaml", "db"),
        ]),
        &nothing_serves,
    );
    assert_eq!(r.in_force.pools.len(), 1);
    assert_eq!(r.problems[0].state, ProblemState::LeftOut);
}

#[test]
fn a_new_overlapping_pool_is_left_out_whatever_its_name() {
    let first = reconcile(
        &InForce::default(),
        &observe(vec![seen(
            "p.yaml",
            pool_object("web", &["10.6.0.20-10.6.0.29"]),
        )]),
        &nothing_serves,
    );
    // "aaa" sorts before "web": it must not take web out of service.
    let r = reconcile(
        &first.in_force,
        &observe(vec![
            seen("p.yaml", pool_object("web", &["10.6.0.20-10.6.0.29"])),
            seen("a.yaml", pool_object("aaa", &["10.6.0.25-10.6.0.40"])),
        ]),
        &|name| name == "web",
    );
    assert_eq!(
        pools(&r),
        [("web".to_string(), "10.6.0.20-10.6.0.29".to_string())]
    );
    assert_eq!(r.problems[0].name, "aaa");
    assert_eq!(r.problems[0].state, ProblemState::LeftOut);
    assert!(r.problems[0].reason.contains("web"), "{}", r.problems[0]);
}

#[test]
fn an_edit_that_overlaps_another_pool_keeps_the_previous_version() {
    let first = reconcile(
        &InForce::default(),
        &observe(vec![
            seen("p.yaml", pool_object("web", &["10.6.0.20-10.6.0.29"])),
            seen("p.yaml", pool_object("db", &["10.6.0.40-10.6.0.49"])),
        ]),
        &nothing_serves,
    );
    let r = reconcile(
        &first.in_force,
        &observe(vec![
            seen("p.yaml", pool_object("web", &["10.6.0.20-10.6.0.29"])),
            seen("p.yaml", pool_object("db", &["10.6.0.25-10.6.0.49"])),
        ]),
        &|_| true,
    );
    assert_eq!(
        pools(&r),
        [
            ("db".to_string(), "10.6.0.40-10.6.0.49".to_string()),
            ("web".to_string(), "10.6.0.20-10.6.0.29".to_string())
        ]
    );
    assert_eq!(r.problems[0].state, ProblemState::HeldBack);
}

#[test]
fn at_first_load_the_pool_holding_claims_wins_an_overlap() {
    let r = reconcile(
        &InForce::default(),
        &observe(vec![
            seen("p.yaml", pool_object("web", &["10.6.0.20-10.6.0.29"])),
            seen("a.yaml", pool_object("aaa", &["10.6.0.25-10.6.0.40"])),
        ]),
        &|name| name == "web",
    );
    assert_eq!(
        pools(&r),
        [("web".to_string(), "10.6.0.20-10.6.0.29".to_string())]
    );
    // Without claims, name order decides as before.
    let r = reconcile(
        &InForce::default(),
        &observe(vec![
            seen("p.yaml", pool_object("web", &["10.6.0.20-10.6.0.29"])),
            seen("a.yaml", pool_object("aaa", &["10.6.0.25-10.6.0.40"])),
        ]),
        &nothing_serves,
    );
    assert_eq!(r.in_force.pools.keys().collect::<Vec<_>>(), ["aaa"]);
}

#[test]
fn an_object_defined_twice_keeps_its_previous_version() {
    let first = reconcile(
        &InForce::default(),
        &observe(vec![seen(
            "r.yaml",
            Object::Reserved(reserved("routers", &["10.6.0.10"])),
        )]),
        &nothing_serves,
    );
    let r = reconcile(
        &first.in_force,
        &observe(vec![
            seen(
                "r.yaml",
                Object::Reserved(reserved("routers", &["10.6.0.10"])),
            ),
            seen(
                "s.yaml",
                Object::Reserved(reserved("routers", &["10.6.0.50"])),
            ),
        ]),
        &nothing_serves,
    );
    assert_eq!(reserved_entries(&r, "routers"), ["10.6.0.10"]);
    assert!(r.problems[0].reason.contains("defined 2 times"));
}
