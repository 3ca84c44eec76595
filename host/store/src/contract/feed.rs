//! Contract checks of the change feed, batches mixing fresh and reattached claims, and the
//! by-pod index: what keeps every engine's free index true when others write to the store.

use std::collections::BTreeMap;
use std::net::IpAddr;

use allot_core::store::{Change, ChangeKind, Changes, Claim, Reattach, Store, StoreError, Taken};

use super::{T0, all, attachment, claim, ip, must, pod, reattach, settled, sorted, stateful_pod};

fn revision(store: &dyn Store) -> u64 {
    must("snapshot", store.snapshot(0)).revision
}

fn changes(store: &dyn Store, since: u64) -> (Vec<Change>, u64) {
    match must("changes_since", store.changes_since(since)) {
        Changes::Since { changes, revision } => (changes, revision),
        Changes::Compacted => panic!("changes since {since} reported compacted on a young store"),
    }
}

fn kinds(changes: &[Change]) -> Vec<(IpAddr, ChangeKind)> {
    changes.iter().map(|c| (c.address, c.kind)).collect()
}

/// Claims, detaches, reattaches and releases appear in the feed in the order they were made,
/// with growing revisions that end at the store's revision.
pub fn feed_reports_every_change_in_order(store: &dyn Store) {
    let start = revision(store);
    let eth0 = attachment("c1", "eth0");
    let web = stateful_pod("default", "web-0", "uid-1");
    must(
        "claim",
        store.claim(&[
            claim("10.0.0.2", "v4", Some(&eth0), &web, T0),
            claim("fd00::2", "v6", Some(&eth0), &web, T0),
        ]),
    );
    must("detach", store.detach(&eth0, T0 + 1));
    let eth0b = attachment("c2", "eth0");
    let web2 = stateful_pod("default", "web-0", "uid-2");
    must(
        "reattach",
        reattach(store, ip("10.0.0.2"), &web2, &eth0b, T0 + 2),
    );
    must("release", store.release(ip("fd00::2"), None));

    let (feed, end) = changes(store, start);
    use ChangeKind::*;
    let mut seen = kinds(&feed);
    // The two claims of one batch, and the two detaches of one call, may come in either order.
    seen[0..2].sort_by_key(|(a, _)| *a);
    seen[2..4].sort_by_key(|(a, _)| *a);
    assert_eq!(
        seen,
        [
            (ip("10.0.0.2"), Claimed),
            (ip("fd00::2"), Claimed),
            (ip("10.0.0.2"), Updated),
            (ip("fd00::2"), Updated),
            (ip("10.0.0.2"), Updated),
            (ip("fd00::2"), Released),
        ],
        "the feed lists every change in order"
    );
    assert!(
        feed.windows(2).all(|w| w[0].revision < w[1].revision),
        "revisions grow: {feed:?}"
    );
    assert!(feed.iter().all(|c| c.revision > start));
    assert_eq!(feed.last().map(|c| c.revision), Some(end));
    assert_eq!(
        revision(store),
        end,
        "the snapshot is at the feed's revision"
    );
    let (none, same) = changes(store, end);
    assert!(none.is_empty(), "nothing after the last change: {none:?}");
    assert_eq!(same, end);
    let (tail, _) = changes(store, feed[3].revision);
    assert_eq!(tail, feed[4..], "changes after a middle revision");
}

/// Writes that fail (a lost race, a stale reattach, releasing what one does not hold) change
/// nothing, so they add nothing to the feed.
pub fn failed_writes_add_no_change(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let b = attachment("c2", "eth0");
    let p = pod("ns", "p", "u");
    must(
        "claim",
        store.claim(&[claim("10.0.0.1", "p", Some(&a), &p, T0)]),
    );
    let before = revision(store);
    assert!(matches!(
        store.claim(&[
            claim("10.0.0.9", "p", Some(&b), &p, T0),
            claim("10.0.0.1", "p", Some(&b), &p, T0)
        ]),
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        reattach(store, ip("10.0.0.1"), &p, &b, T0),
        Err(StoreError::Stale(_))
    ));
    assert!(!must("release", store.release(ip("10.0.0.1"), Some(&b))));
    assert!(must("release_attachment", store.release_attachment(&b)).is_empty());
    let (after, rev) = changes(store, before);
    assert!(after.is_empty(), "failed writes left changes: {after:?}");
    assert_eq!(rev, before);
}

/// A revision the store never reached (another store's, or a replaced file's) is answered with
/// `Compacted`, so the reader starts over from a snapshot instead of trusting a wrong history.
pub fn revision_from_the_future_is_compacted(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    must(
        "claim",
        store.claim(&[claim("10.0.0.1", "p", Some(&a), &pod("ns", "p", "u"), T0)]),
    );
    let now = revision(store);
    assert_eq!(
        must("changes_since", store.changes_since(now + 1000)),
        Changes::Compacted
    );
}

/// The snapshot holds every claim, the addresses released since the time asked for (not those
/// claimed again), and each pool's last handed-out address.
pub fn snapshot_has_claims_releases_and_cursors(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let p = pod("ns", "p", "u");
    for address in ["10.0.0.5", "10.0.0.3", "10.0.0.7"] {
        must(
            "claim",
            store.claim(&[claim(address, "pool-a", Some(&a), &p, T0)]),
        );
    }
    must(
        "claim",
        store.claim(&[claim("fd00::9", "pool-b", Some(&a), &p, T0)]),
    );
    assert!(must("release", store.release(ip("10.0.0.5"), Some(&a))));
    assert!(must("release", store.release(ip("10.0.0.3"), Some(&a))));
    must(
        "claim",
        store.claim(&[claim("10.0.0.3", "pool-a", Some(&a), &p, T0)]),
    );

    let snapshot = must("snapshot", store.snapshot(0));
    assert_eq!(snapshot.claims, Taken::of_all(&all(store)));
    let released: Vec<IpAddr> = snapshot.released.iter().map(|(a, _)| *a).collect();
    assert_eq!(released, [ip("10.0.0.5")], "released and not claimed again");
    let cursors: BTreeMap<String, IpAddr> = snapshot.cursors.into_iter().collect();
    assert_eq!(cursors.get("pool-a"), Some(&ip("10.0.0.3")));
    assert_eq!(cursors.get("pool-b"), Some(&ip("fd00::9")));

    let (_, when) = snapshot.released[0];
    let later = must("snapshot", store.snapshot(when + 1));
    assert!(
        later.released.is_empty(),
        "released before the time asked for: {:?}",
        later.released
    );
}

/// A batch of fresh and reattached claims is all or nothing: a conflicting fresh address leaves
/// the detached claim detached, a stale reattach leaves the fresh addresses free.
pub fn claim_batch_with_reattach_is_all_or_nothing(store: &dyn Store) {
    let old = attachment("c1", "eth0");
    let new = attachment("c2", "eth0");
    let other = attachment("c9", "eth0");
    let web = stateful_pod("default", "web-0", "uid-1");
    let web2 = stateful_pod("default", "web-0", "uid-2");
    must(
        "claim",
        store.claim(&[claim("10.0.0.2", "v4", Some(&old), &web, T0)]),
    );
    must(
        "claim",
        store.claim(&[claim(
            "fd00::9",
            "v6",
            Some(&other),
            &pod("ns", "x", "u"),
            T0,
        )]),
    );
    must("detach", store.detach(&old, T0));
    let back = Reattach {
        address: ip("10.0.0.2"),
        pod: web2.clone(),
        attachment: new.clone(),
        network: "net-a".into(),
        node: super::OTHER_NODE.into(),
        now: T0 + 5,
    };

    let taken = claim("fd00::9", "v6", Some(&new), &web2, T0 + 5);
    assert_eq!(
        store.claim_batch(std::slice::from_ref(&taken), std::slice::from_ref(&back)),
        Err(StoreError::Conflict(ip("fd00::9")))
    );
    assert!(
        must("claims_of", store.claims_of(&new)).is_empty(),
        "the reattach was rolled back with the conflicting fresh claim"
    );

    let stale = Reattach {
        address: ip("10.0.0.77"),
        ..back.clone()
    };
    let fresh = claim("fd00::2", "v6", Some(&new), &web2, T0 + 5);
    assert_eq!(
        store.claim_batch(std::slice::from_ref(&fresh), &[back.clone(), stale]),
        Err(StoreError::Stale(ip("10.0.0.77")))
    );
    assert!(
        must("claims_of", store.claims_of(&new)).is_empty(),
        "the fresh claim was rolled back with the stale reattach"
    );

    let reattached = must(
        "claim_batch",
        store.claim_batch(std::slice::from_ref(&fresh), std::slice::from_ref(&back)),
    );
    let expected = Claim {
        attachment: Some(new.clone()),
        pod: web2.clone(),
        node: super::OTHER_NODE.into(),
        updated_at: T0 + 5,
        ..claim("10.0.0.2", "v4", None, &web, T0)
    };
    assert_eq!(reattached, vec![expected.clone()]);
    assert_eq!(
        sorted(must("claims_of", store.claims_of(&new))),
        sorted(vec![expected, fresh])
    );
}

/// `release_unchanged` releases what is still stored as it was read, and keeps a claim that
/// changed since (reattached by a new pod, or claimed again by someone else).
pub fn release_unchanged_keeps_changed_claims(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let web = stateful_pod("default", "web-0", "uid-1");
    let p = pod("ns", "p", "u");
    must(
        "claim",
        store.claim(&[
            claim("10.0.0.1", "p", Some(&a), &p, T0),
            claim("10.0.0.2", "p", Some(&a), &web, T0),
            claim("10.0.0.3", "p", Some(&a), &p, T0),
        ]),
    );
    let read = all(store);
    // Since the read: .2 moves to a new sandbox of its pod, .3 is released and claimed again.
    must("release", store.release(ip("10.0.0.2"), Some(&a)));
    let b = attachment("c2", "eth0");
    must(
        "claim",
        store.claim(&[claim(
            "10.0.0.2",
            "p",
            Some(&b),
            &stateful_pod("default", "web-0", "uid-2"),
            T0 + 1,
        )]),
    );
    must("release", store.release(ip("10.0.0.3"), Some(&a)));
    must(
        "claim",
        store.claim(&[claim("10.0.0.3", "p", Some(&b), &pod("ns", "q", "v"), T0)]),
    );

    let released = must("release_unchanged", store.release_unchanged(&read));
    assert_eq!(
        released.iter().map(|c| c.address).collect::<Vec<_>>(),
        [ip("10.0.0.1")]
    );
    assert_eq!(
        all(store).iter().map(|c| c.address).collect::<Vec<_>>(),
        [ip("10.0.0.2"), ip("10.0.0.3")],
        "changed claims are kept"
    );
    assert!(
        must("release_unchanged", store.release_unchanged(&read)).is_empty(),
        "idempotent"
    );
}

/// `claims_of_pod` finds a pod's claims, attached and detached, and nothing of a same-name pod
/// in another namespace; `detached` lists only detached claims.
pub fn claims_of_pod_and_detached(store: &dyn Store) {
    let a = attachment("c1", "eth0");
    let b = attachment("c1", "net1");
    let c = attachment("c3", "eth0");
    let web = stateful_pod("default", "web-0", "uid-1");
    let elsewhere = stateful_pod("other", "web-0", "uid-9");
    must(
        "claim",
        store.claim(&[
            claim("10.0.0.1", "p", Some(&a), &web, T0),
            claim("10.0.1.1", "q", Some(&b), &web, T0),
            claim("10.0.0.9", "p", Some(&c), &elsewhere, T0),
        ]),
    );
    must("detach", store.detach(&b, T0 + 1));
    let mine = sorted(must(
        "claims_of_pod",
        store.claims_of_pod("default", "web-0"),
    ));
    assert_eq!(
        mine.iter().map(|c| c.address).collect::<Vec<_>>(),
        [ip("10.0.0.1"), ip("10.0.1.1")]
    );
    assert!(mine[1].attachment.is_none());
    assert!(must("claims_of_pod", store.claims_of_pod("default", "web-1")).is_empty());
    let detached = must("detached", store.detached());
    assert_eq!(
        detached.iter().map(|c| c.address).collect::<Vec<_>>(),
        [ip("10.0.1.1")]
    );
    assert_eq!(
        must("detached_of", store.detached_of("default", "web-0")),
        detached
    );
    assert!(must("detached_of", store.detached_of("other", "web-0")).is_empty());
}

/// Two handles on one location see each other's claims and releases through the feed (within
/// [`SETTLE`](super::SETTLE)): the mechanism that keeps two agents (or an agent and `allotctl`)
/// on one store honest.
pub fn handles_see_each_others_changes<L, S: Store>(location: &L, open: impl Fn(&L) -> S) {
    let (one, two) = (open(location), open(location));
    let start = revision(&two);
    let a = attachment("c1", "eth0");
    must(
        "claim",
        one.claim(&[claim("10.0.0.1", "p", Some(&a), &pod("ns", "p", "u"), T0)]),
    );
    let (seen, rev) = settled(|| {
        let (seen, rev) = changes(&two, start);
        if seen.is_empty() {
            Err((seen, rev))
        } else {
            Ok((seen, rev))
        }
    });
    assert_eq!(kinds(&seen), [(ip("10.0.0.1"), ChangeKind::Claimed)]);
    assert!(must("release", two.release(ip("10.0.0.1"), Some(&a))));
    let (seen, _) = settled(|| {
        let (seen, rev) = changes(&one, rev);
        if seen.is_empty() {
            Err((seen, rev))
        } else {
            Ok((seen, rev))
        }
    });
    assert_eq!(kinds(&seen), [(ip("10.0.0.1"), ChangeKind::Released)]);
}

/// Revisions never go backwards across a reopen, so a reader's revision stays meaningful. They
/// may move forward without a change of this store's: the Kubernetes store's revision follows
/// the API server's resourceVersion, which every other object's write (the API server renewing
/// its own Lease) advances too; seen once in `make test`, one version apart.
pub fn revision_survives_reopen<L, S: Store>(location: &L, open: impl Fn(&L) -> S) {
    let before = {
        let store = open(location);
        let a = attachment("c1", "eth0");
        must(
            "claim",
            store.claim(&[claim("10.0.0.1", "p", Some(&a), &pod("ns", "p", "u"), T0)]),
        );
        must("release", store.release_attachment(&a));
        revision(&store)
    };
    let store = open(location);
    let reopened = revision(&store);
    assert!(
        reopened >= before,
        "the revision went back across a reopen: {before} -> {reopened}"
    );
    let a = attachment("c2", "eth0");
    must(
        "claim",
        store.claim(&[claim("10.0.0.2", "p", Some(&a), &pod("ns", "p", "u"), T0)]),
    );
    assert!(
        revision(&store) > reopened,
        "a new change has a new revision"
    );
}
