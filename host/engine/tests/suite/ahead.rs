//! Probing ahead's view of the engine: the next candidates of a pool are exactly what ADDs
//! hand out next, and a free address found in use is quarantined without ever being free in
//! between, or not at all once an ADD has it.

use crate::common::*;
use allot_core::store::Store;

#[test]
fn upcoming_addresses_are_the_ones_adds_hand_out_next() {
    let e = engine(vec![pool(
        "p",
        "10.0.0.0/24",
        &["10.0.0.10-10.0.0.14"],
        None,
    )]);
    assert_eq!(
        e.upcoming("p", 3),
        [ip("10.0.0.10"), ip("10.0.0.11"), ip("10.0.0.12")]
    );
    assert!(e.upcoming("nope", 3).is_empty());
    let first = e.add(&add_req("c1", "eth0", &["p"], &[])).unwrap();
    assert_eq!(first.allocations[0].address, ip("10.0.0.10"));
    assert!(!e.is_free(ip("10.0.0.10")));
    assert!(e.is_free(ip("10.0.0.11")));
    // Released: behind the cursor, so last (round-robin).
    e.del(&att("c1", "eth0")).unwrap();
    let next = e.upcoming("p", 5);
    assert_eq!(
        next,
        [
            "10.0.0.11",
            "10.0.0.12",
            "10.0.0.13",
            "10.0.0.14",
            "10.0.0.10"
        ]
        .map(ip)
    );
    for (k, want) in next.iter().enumerate() {
        let out = e
            .add(&add_req(&format!("d{k}"), "eth0", &["p"], &[]))
            .unwrap();
        assert_eq!(out.allocations[0].address, *want);
    }
    assert!(e.upcoming("p", 3).is_empty(), "the pool is full");
}

#[test]
fn a_free_address_found_in_use_is_quarantined_unless_taken() {
    let e = engine(vec![pool(
        "p",
        "10.0.0.0/24",
        &["10.0.0.10-10.0.0.12"],
        None,
    )]);
    let q = e
        .quarantine_free(ip("10.0.0.10"), "p", "net-a", "02:00:00:00:00:01")
        .unwrap()
        .expect("quarantined");
    assert!(q.is_quarantined());
    assert_eq!(q.pod.conflict_mac(), Some("02:00:00:00:00:01"));
    assert_eq!(e.upcoming("p", 3), [ip("10.0.0.11"), ip("10.0.0.12")]);
    let out = e.add(&add_req("c1", "eth0", &["p"], &[])).unwrap();
    assert_eq!(out.allocations[0].address, ip("10.0.0.11"));
    // Held by a pod, or already quarantined: nothing is written.
    for taken in ["10.0.0.11", "10.0.0.10"] {
        assert!(
            e.quarantine_free(ip(taken), "p", "net-a", "02:00:00:00:00:02")
                .unwrap()
                .is_none()
        );
    }
    assert_eq!(e.store().all().unwrap().len(), 2);
    // The quarantine expires like one made during an ADD.
    let (released, kept) = e.expire_quarantined(0).unwrap();
    assert_eq!((released.len(), kept.len()), (1, 0));
    assert!(e.is_free(ip("10.0.0.10")));
}
