//! Contract checks of concurrent callers (threads racing on one store) and of several handles
//! on one location (reopening, racing handles).

use super::*;

// ---------------------------------------------------------------------------------------------
// Concurrency.

/// Runs `f(thread index)` on [`THREADS`] threads released together by a barrier.
fn race<T: Send>(f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let barrier = Barrier::new(THREADS);
    thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (barrier, f) = (&barrier, &f);
                s.spawn(move || {
                    barrier.wait();
                    f(t)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a racing thread panicked"))
            .collect()
    })
}

/// Checks that each address was won by exactly one racer, that everyone else got `Conflict` for
/// it, and that the store holds each address for its winner. `results[t][i]` is racer `t`'s
/// outcome on `addresses[i]`; racer `t` claims as `racer-t/eth0`.
fn one_winner_each(
    store: &dyn Store,
    addresses: &[IpAddr],
    results: &[Vec<Result<(), StoreError>>],
) {
    let mut winners = BTreeMap::new();
    for (i, &address) in addresses.iter().enumerate() {
        let mut won = Vec::new();
        for (t, outcome) in results.iter().enumerate() {
            match &outcome[i] {
                Ok(()) => won.push(t),
                Err(StoreError::Conflict(a)) if *a == address => {}
                Err(e) => panic!(
                    "racer {t} claiming {address}: expected success or Conflict({address}), got {e}"
                ),
            }
        }
        assert_eq!(
            won.len(),
            1,
            "{address} must have exactly one winner, has {won:?}"
        );
        winners.insert(address, attachment(&format!("racer-{}", won[0]), "eth0"));
    }
    let held: BTreeMap<IpAddr, Attachment> = settled(|| {
        let held: BTreeMap<IpAddr, Attachment> = all(store)
            .into_iter()
            .map(|c| (c.address, c.attachment.expect("racers claim attached")))
            .collect();
        if held == winners { Ok(held) } else { Err(held) }
    });
    assert_eq!(held, winners, "the store holds each address for its winner");
}

/// [`THREADS`] threads claim the same addresses at the same moment: each address has exactly one
/// winner, every other thread gets `Conflict`.
pub fn concurrent_claims_of_one_address_have_one_winner(store: &dyn Store) {
    let addresses: Vec<IpAddr> = (0..24).map(|i| nth(1, i, i % 2 == 1)).collect();
    let results = race(|t| {
        let me = attachment(&format!("racer-{t}"), "eth0");
        addresses
            .iter()
            .map(|&a| store.claim(&[claim_at(a, &me)]))
            .collect::<Vec<_>>()
    });
    one_winner_each(store, &addresses, &results);
}

/// Threads claim overlapping batches (thread `t` wants addresses `t` and `t+1` of a ring): every
/// batch is entirely won or entirely lost, and the winners' batches are disjoint.
pub fn concurrent_overlapping_batches_are_all_or_nothing(store: &dyn Store) {
    for round in 0..6u8 {
        let ring: Vec<IpAddr> = (0..THREADS)
            .map(|i| nth(10 + round, i, round % 2 == 1))
            .collect();
        let results = race(|t| {
            let me = attachment(&format!("r{round}-racer-{t}"), "eth0");
            let batch = [
                claim_at(ring[t], &me),
                claim_at(ring[(t + 1) % THREADS], &me),
            ];
            store.claim(&batch)
        });
        let mut expected = BTreeMap::new();
        for (t, outcome) in results.iter().enumerate() {
            let me = attachment(&format!("r{round}-racer-{t}"), "eth0");
            let batch = [ring[t], ring[(t + 1) % THREADS]];
            match outcome {
                Ok(()) => {
                    for a in batch {
                        let previous = expected.insert(a, me.clone());
                        assert!(
                            previous.is_none(),
                            "round {round}: {a} won by both {} and {me}",
                            previous.unwrap()
                        );
                    }
                }
                Err(StoreError::Conflict(a)) if batch.contains(a) => {
                    assert_eq!(
                        must("claims_of", store.claims_of(&me)),
                        vec![],
                        "round {round}: {me} lost, wrote nothing"
                    );
                }
                Err(e) => panic!(
                    "round {round}: racer {t}: expected success or Conflict on its batch, got {e}"
                ),
            }
        }
        assert!(!expected.is_empty(), "round {round}: somebody must win");
        let held: BTreeMap<IpAddr, Attachment> = all(store)
            .into_iter()
            .filter(|c| ring.contains(&c.address))
            .map(|c| (c.address, c.attachment.expect("racers claim attached")))
            .collect();
        assert_eq!(
            held, expected,
            "round {round}: exactly the winning batches are stored"
        );
    }
}

/// Threads claiming distinct addresses at the same moment all succeed.
pub fn concurrent_claims_of_distinct_addresses_all_succeed(store: &dyn Store) {
    const EACH: usize = 12;
    let results = race(|t| {
        let me = attachment(&format!("racer-{t}"), "eth0");
        (0..EACH)
            .map(|i| store.claim(&[claim_at(nth(2, t * EACH + i, i % 3 == 0), &me)]))
            .collect::<Vec<_>>()
    });
    for (t, outcomes) in results.iter().enumerate() {
        for (i, outcome) in outcomes.iter().enumerate() {
            assert_eq!(outcome, &Ok(()), "racer {t}, address {i}");
        }
    }
    let stored = all(store);
    assert_eq!(stored.len(), THREADS * EACH);
    let addresses: BTreeSet<IpAddr> = stored.iter().map(|c| c.address).collect();
    assert_eq!(addresses.len(), THREADS * EACH);
}

/// Threads releasing the same attachments and addresses at once: each claim is released, and
/// reported released, exactly once.
pub fn concurrent_releases_have_one_winner(store: &dyn Store) {
    const N: usize = 16;
    let holders: Vec<Attachment> = (0..N)
        .map(|i| attachment(&format!("holder-{i}"), "eth0"))
        .collect();
    for (i, h) in holders.iter().enumerate() {
        must(
            "claim",
            store.claim(&[claim_at(nth(3, i, false), h), claim_at(nth(3, i, true), h)]),
        );
    }
    // Even threads release attachments, odd threads release the IPv4 address of each holder.
    let results = race(|t| {
        holders
            .iter()
            .enumerate()
            .map(|(i, h)| {
                if t % 2 == 0 {
                    must("release_attachment", store.release_attachment(h))
                        .into_iter()
                        .map(|c| c.address)
                        .collect()
                } else if must("release", store.release(nth(3, i, false), Some(h))) {
                    vec![nth(3, i, false)]
                } else {
                    vec![]
                }
            })
            .collect::<Vec<Vec<IpAddr>>>()
    });
    for i in 0..N {
        let mut released: Vec<IpAddr> = results.iter().flat_map(|r| r[i].iter().copied()).collect();
        released.sort();
        let mut expected = vec![nth(3, i, false), nth(3, i, true)];
        expected.sort();
        assert_eq!(
            released, expected,
            "each claim of holder-{i} released exactly once"
        );
    }
    assert_eq!(all(store), vec![]);
}

/// Threads reattaching one detached claim to different attachments: one wins, the rest are
/// `Stale`, and the claim ends up on the winner.
pub fn concurrent_reattach_has_one_winner(store: &dyn Store) {
    let p = stateful_pod("db", "pg-0", "uid-1");
    for round in 0..6 {
        let address = nth(4, round, round % 2 == 1);
        let old = attachment(&format!("old-{round}"), "eth0");
        must(
            "claim",
            store.claim(&[Claim {
                pod: p.clone(),
                ..claim_at(address, &old)
            }]),
        );
        must("detach", store.detach(&old, T0 + 1));
        let racer = |t: usize| attachment(&format!("r{round}-racer-{t}"), "eth0");
        let results = race(|t| reattach(store, address, &p, &racer(t), T0 + 2));
        let mut won = Vec::new();
        for (t, outcome) in results.iter().enumerate() {
            match outcome {
                Ok(c) => {
                    assert_eq!(
                        c.attachment,
                        Some(racer(t)),
                        "the returned claim is attached to its caller"
                    );
                    won.push(t);
                }
                Err(StoreError::Stale(a)) if *a == address => {}
                Err(e) => panic!(
                    "racer {t} reattaching {address}: expected success or Stale({address}), got {e}"
                ),
            }
        }
        assert_eq!(
            won.len(),
            1,
            "{address} must be reattached exactly once, was by {won:?}"
        );
        let stored = all(store)
            .into_iter()
            .find(|c| c.address == address)
            .expect("the claim is kept");
        assert_eq!(
            stored.attachment,
            Some(racer(won[0])),
            "{address} is held by the winner"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Checks on a location: several handles, reopening.

/// Everything committed is there, unchanged, after the store is dropped and reopened, and the
/// reopened store still enforces uniqueness.
pub fn reopen_keeps_everything<L, S: Store>(location: &L, open: impl Fn(&L) -> S) {
    let (a, b, c) = (
        attachment("c1", "eth0"),
        attachment("c2", "net1"),
        attachment("c3", "eth0"),
    );
    let expected = {
        let store = open(location);
        must(
            "claim",
            store.claim(&[
                claim("10.0.0.1", "p", Some(&a), &pod("ns", "a", "ua"), T0),
                claim("fd00::1", "p6", Some(&a), &pod("ns", "a", "ua"), T0),
            ]),
        );
        must(
            "claim",
            store.claim(&[claim(
                "10.0.0.2",
                "p",
                Some(&b),
                &stateful_pod("db", "pg-0", "ub"),
                T0,
            )]),
        );
        must("detach", store.detach(&b, T0 + 1));
        must(
            "claim",
            store.claim(&[claim("10.0.0.3", "p", Some(&c), &pod("ns", "c", "uc"), T0)]),
        );
        must(
            "release",
            store.release(ip("10.0.0.3"), Some(&c)).map(|_| ()),
        );
        all(&store)
    };
    assert_eq!(expected.len(), 3);

    let store = open(location);
    assert_eq!(
        all(&store),
        expected,
        "a reopened store holds everything committed"
    );
    assert_eq!(
        store.claim(&[claim("10.0.0.1", "p", Some(&c), &pod("ns", "c", "uc"), T0)]),
        Err(StoreError::Conflict(ip("10.0.0.1"))),
        "and still enforces uniqueness"
    );
    assert_eq!(
        must("detached_of", store.detached_of("db", "pg-0")).len(),
        1
    );
    must(
        "reattach",
        reattach(
            &store,
            ip("10.0.0.2"),
            &stateful_pod("db", "pg-0", "ub2"),
            &c,
            T0 + 2,
        ),
    );
    let after = all(&store);
    drop(store);
    assert_eq!(
        all(&open(location)),
        after,
        "and so on, reopen after reopen"
    );
}

/// Independently opened handles on one location (separate clients: connections, processes,
/// agents) race for the same addresses: each address has exactly one winner, and every handle
/// sees every other's writes.
pub fn handles_on_one_location_race_safely<L, S: Store>(location: &L, open: impl Fn(&L) -> S) {
    const HANDLES: usize = 4;
    let handles: Vec<S> = (0..HANDLES).map(|_| open(location)).collect();
    let addresses: Vec<IpAddr> = (0..24).map(|i| nth(5, i, i % 2 == 0)).collect();
    let results = race(|t| {
        let store = &handles[t % HANDLES];
        let me = attachment(&format!("racer-{t}"), "eth0");
        addresses
            .iter()
            .map(|&a| store.claim(&[claim_at(a, &me)]))
            .collect::<Vec<_>>()
    });
    one_winner_each(&handles[0], &addresses, &results);
    let seen = all(&handles[0]);
    for (h, handle) in handles.iter().enumerate().skip(1) {
        let theirs = settled(|| {
            let theirs = all(handle);
            if theirs == seen {
                Ok(theirs)
            } else {
                Err(theirs)
            }
        });
        assert_eq!(theirs, seen, "handle {h} sees the same claims");
    }
}
