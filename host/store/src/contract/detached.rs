//! Contract checks of claims without an attachment: detached for a pod's next sandbox and
//! reattached only by that pod, released when detached, and quarantined (an address another
//! host was found using, kept from everyone). Kept apart from the checks of attached claims in
//! the parent module, which was past 900 lines.

use super::*;

/// `detach` keeps the claims for the pod: they leave the attachment, show up in `detached_of`
/// of that pod only, keep their address taken, and carry the detach time.
pub fn detach_keeps_addresses_for_the_pod(store: &dyn Store) {
    let eth0 = attachment("c1", "eth0");
    let p = stateful_pod("db", "pg-0", "uid-1");
    let claims = vec![
        claim("10.0.0.1", "p", Some(&eth0), &p, T0),
        claim("fd00::1", "p6", Some(&eth0), &p, T0),
    ];
    must("claim", store.claim(&claims));
    // A claim of the same pod on another attachment stays attached.
    let net1 = attachment("c1", "net1");
    let other_nic = claim("10.1.0.1", "q", Some(&net1), &p, T0);
    must("claim", store.claim(std::slice::from_ref(&other_nic)));

    let detached: Vec<Claim> = claims
        .iter()
        .map(|c| Claim {
            attachment: None,
            node: NODE.into(),
            updated_at: T0 + 10,
            ..c.clone()
        })
        .collect();
    assert_eq!(
        sorted(must("detach", store.detach(&eth0, T0 + 10))),
        detached
    );
    assert_eq!(
        must("claims_of", store.claims_of(&eth0)),
        vec![],
        "the attachment holds nothing now"
    );
    assert_eq!(
        sorted(must("detached_of", store.detached_of("db", "pg-0"))),
        detached
    );
    assert_eq!(
        must("detached_of", store.detached_of("db", "pg-1")),
        vec![],
        "another pod"
    );
    assert_eq!(
        must("detached_of", store.detached_of("other", "pg-0")),
        vec![],
        "another namespace"
    );
    assert_eq!(must("claims_of", store.claims_of(&net1)), vec![other_nic]);

    let intruder = attachment("c9", "eth0");
    assert_eq!(
        store.claim(&[claim(
            "10.0.0.1",
            "p",
            Some(&intruder),
            &pod("db", "x", "u9"),
            T0
        )]),
        Err(StoreError::Conflict(ip("10.0.0.1"))),
        "a detached address is still taken"
    );
}

/// Detaching an attachment that holds nothing is `Ok(vec![])`.
pub fn detach_of_nothing_is_empty(store: &dyn Store) {
    assert_eq!(
        must("detach", store.detach(&attachment("c1", "eth0"), T0)),
        vec![]
    );
    assert_eq!(all(store), vec![]);
}

/// The same pod (namespace and name) gets its detached address back on a new attachment; the
/// claim then carries the new attachment, the new pod's UID and owner, the network and node it
/// came back on (a claim `allotctl migrate` made records no network), and the reattach time.
pub fn reattach_same_pod_succeeds(store: &dyn Store) {
    let old = attachment("c1", "eth0");
    let before = stateful_pod("db", "pg-0", "uid-1");
    let migrated = Claim {
        network: String::new(),
        ..claim("10.0.0.1", "p", Some(&old), &before, T0)
    };
    must("claim", store.claim(&[migrated]));
    must("detach", store.detach(&old, T0 + 10));

    let new = attachment("c2", "eth0");
    let after = stateful_pod("db", "pg-0", "uid-2");
    let expected = Claim {
        node: OTHER_NODE.into(),
        ..claim("10.0.0.1", "p", Some(&new), &after, T0 + 20)
    };
    assert_eq!(
        must(
            "reattach",
            reattach(store, ip("10.0.0.1"), &after, &new, T0 + 20)
        ),
        expected
    );
    assert_eq!(
        must("claims_of", store.claims_of(&new)),
        vec![expected.clone()]
    );
    assert_eq!(must("detached_of", store.detached_of("db", "pg-0")), vec![]);
    assert_eq!(must("claims_of", store.claims_of(&old)), vec![]);
    assert_eq!(all(store), vec![expected]);
}

/// Another pod (other name, or same name in another namespace) cannot take a detached claim.
pub fn reattach_other_pod_is_stale(store: &dyn Store) {
    let old = attachment("c1", "eth0");
    let owner = stateful_pod("db", "pg-0", "uid-1");
    must(
        "claim",
        store.claim(&[claim("10.0.0.1", "p", Some(&old), &owner, T0)]),
    );
    let detached = must("detach", store.detach(&old, T0 + 10));

    let new = attachment("c2", "eth0");
    for other in [
        stateful_pod("db", "pg-1", "uid-2"),
        stateful_pod("other", "pg-0", "uid-3"),
    ] {
        assert_eq!(
            reattach(store, ip("10.0.0.1"), &other, &new, T0 + 20),
            Err(StoreError::Stale(ip("10.0.0.1"))),
            "{}/{} is another pod",
            other.namespace,
            other.name
        );
    }
    assert_eq!(
        all(store),
        detached,
        "the claim is still detached, unchanged"
    );
}

/// A detached claim is reattached once: a second reattach (by any attachment) is stale.
pub fn reattach_twice_is_stale(store: &dyn Store) {
    let old = attachment("c1", "eth0");
    let p = stateful_pod("db", "pg-0", "uid-1");
    must(
        "claim",
        store.claim(&[claim("10.0.0.1", "p", Some(&old), &p, T0)]),
    );
    must("detach", store.detach(&old, T0 + 10));

    let first = attachment("c2", "eth0");
    let won = must(
        "reattach",
        reattach(store, ip("10.0.0.1"), &p, &first, T0 + 20),
    );
    for again in [attachment("c3", "eth0"), first.clone()] {
        assert_eq!(
            reattach(store, ip("10.0.0.1"), &p, &again, T0 + 30),
            Err(StoreError::Stale(ip("10.0.0.1"))),
            "second reattach by {again}"
        );
    }
    assert_eq!(all(store), vec![won]);
}

/// Reattaching an attached claim, or an address nobody holds, is stale.
pub fn reattach_of_attached_or_missing_is_stale(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let p = stateful_pod("db", "pg-0", "uid-1");
    let held = claim("10.0.0.1", "p", Some(&a), &p, T0);
    must("claim", store.claim(std::slice::from_ref(&held)));
    let new = attachment("c2", "eth0");
    assert_eq!(
        reattach(store, ip("10.0.0.1"), &p, &new, T0 + 1),
        Err(StoreError::Stale(ip("10.0.0.1"))),
        "attached"
    );
    assert_eq!(
        reattach(store, ip("10.0.0.2"), &p, &new, T0 + 1),
        Err(StoreError::Stale(ip("10.0.0.2"))),
        "missing"
    );
    assert_eq!(all(store), vec![held]);
}

/// A detached claim is released with `None`, not with the attachment that used to hold it.
pub fn release_detached_with_none(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let p = stateful_pod("db", "pg-0", "uid-1");
    must(
        "claim",
        store.claim(&[
            claim("10.0.0.1", "p", Some(&a), &p, T0),
            claim("10.0.0.2", "p", Some(&a), &p, T0),
        ]),
    );
    must("detach", store.detach(&a, T0 + 10));

    assert!(
        !must("release", store.release(ip("10.0.0.1"), Some(&a))),
        "the old attachment no longer holds it"
    );
    assert!(must("release", store.release(ip("10.0.0.1"), None)));
    assert!(
        !must("release", store.release(ip("10.0.0.1"), None)),
        "only once"
    );
    assert_eq!(
        must("detached_of", store.detached_of("db", "pg-0")),
        vec![claim("10.0.0.2", "p", None, &p, T0 + 10)]
    );
}

/// A quarantine moves one claim from its attachment to the conflict that holds it on the link:
/// the address stays claimed (a fresh claim of it conflicts), the attachment keeps its other
/// claims, the pod no longer sees it, a DEL of the attachment does not release it, only the
/// attachment that holds an address can have it quarantined, and the feed reports an update.
pub fn quarantine_moves_one_claim_to_the_conflict(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let p = pod("ns", "web", "uid-1");
    let v4 = claim("10.0.0.1", "p", Some(&a), &p, T0);
    let v6 = claim("fd00::1", "p6", Some(&a), &p, T0);
    must("claim", store.claim(&[v4.clone(), v6.clone()]));
    let before = must("snapshot", store.snapshot(0)).revision;
    let holder = PodRef::conflict("02:42:ac:11:00:07");
    let expected = Claim {
        attachment: None,
        pod: holder.clone(),
        node: NODE.into(),
        updated_at: T0 + 10,
        ..v4.clone()
    };
    let q = must(
        "quarantine",
        store.quarantine(ip("10.0.0.1"), &a, &holder, T0 + 10),
    );
    assert_eq!(q, expected);
    assert!(q.is_quarantined());
    assert_eq!(q.pod.conflict_mac(), Some("02:42:ac:11:00:07"));
    assert_eq!(
        must("claims_of", store.claims_of(&a)),
        vec![v6.clone()],
        "the attachment keeps its other family"
    );
    assert_eq!(
        sorted(must("claims_of_pod", store.claims_of_pod("ns", "web"))),
        vec![v6.clone()],
        "the pod no longer holds the quarantined address"
    );
    assert_eq!(
        must(
            "claims_of_pod",
            store.claims_of_pod(&holder.namespace, &holder.name)
        ),
        vec![expected.clone()],
        "what the foreign host holds"
    );
    assert_eq!(must("detached", store.detached()), vec![expected.clone()]);
    assert_eq!(
        store.claim(&[claim(
            "10.0.0.1",
            "p",
            Some(&attachment("c2", "eth0")),
            &p,
            T0
        )]),
        Err(StoreError::Conflict(ip("10.0.0.1"))),
        "a quarantined address stays claimed"
    );
    // Only the holder can have an address quarantined; a quarantined one cannot be again.
    for (address, by) in [
        ("fd00::1", attachment("c2", "eth0")),
        ("10.0.0.1", a.clone()),
        ("10.0.0.9", a.clone()),
    ] {
        assert_eq!(
            store.quarantine(ip(address), &by, &holder, T0 + 20),
            Err(StoreError::Stale(ip(address))),
            "{address} by {by}"
        );
    }
    let feed = settled(|| match store.changes_since(before) {
        Ok(allot_core::store::Changes::Since { changes, .. }) if !changes.is_empty() => Ok(changes),
        Ok(_) => Err(Vec::new()),
        Err(e) => panic!("changes_since: {e}"),
    });
    assert_eq!(
        feed.iter().map(|c| (c.address, c.kind)).collect::<Vec<_>>(),
        vec![(ip("10.0.0.1"), allot_core::store::ChangeKind::Updated)],
        "one update, no release"
    );
    // DEL of the attachment releases what it still holds, not the quarantined address.
    assert_eq!(
        must("release_attachment", store.release_attachment(&a)),
        vec![v6]
    );
    assert_eq!(all(store), vec![expected.clone()]);
    // Expiry releases it as a detached claim, unchanged since it was read.
    assert_eq!(
        must(
            "release_unchanged",
            store.release_unchanged(std::slice::from_ref(&expected))
        ),
        vec![expected]
    );
    assert_eq!(all(store), vec![]);
}

/// Probing ahead quarantines a free address found in use: a claim created detached, held by
/// the conflict, like one moved there from an attachment, and released as one.
pub fn quarantine_of_a_free_address_is_a_detached_claim(store: &dyn Store) {
    let holder = PodRef::conflict("02:42:ac:11:00:08");
    let q = claim("10.0.0.2", "p", None, &holder, T0);
    must("claim", store.claim(std::slice::from_ref(&q)));
    assert_eq!(all(store), vec![q.clone()]);
    assert!(all(store)[0].is_quarantined());
    assert_eq!(must("detached", store.detached()), vec![q.clone()]);
    assert_eq!(
        store.claim(&[claim(
            "10.0.0.2",
            "p",
            Some(&attachment("c1", "eth0")),
            &holder,
            T0
        )]),
        Err(StoreError::Conflict(ip("10.0.0.2"))),
    );
    assert_eq!(
        must(
            "release_unchanged",
            store.release_unchanged(std::slice::from_ref(&q))
        ),
        vec![q]
    );
    assert_eq!(all(store), vec![]);
}

/// DEL of an attachment whose claims were detached releases nothing: they are kept for the pod.
pub fn release_attachment_leaves_detached_claims(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let p = stateful_pod("db", "pg-0", "uid-1");
    must(
        "claim",
        store.claim(&[claim("10.0.0.1", "p", Some(&a), &p, T0)]),
    );
    let detached = must("detach", store.detach(&a, T0 + 10));
    assert_eq!(
        must("release_attachment", store.release_attachment(&a)),
        vec![]
    );
    assert_eq!(all(store), detached);
}
