//! Leak detection: when a claim that nobody uses may be released.
//!
//! A claim is released only after it is seen leaked twice, at least a grace period apart, and
//! re-checked in the store just before release (the release compares the claim with what was
//! seen: a claim re-attached or refreshed meanwhile is kept). A claim younger than the grace
//! period is never a suspect: its ADD may still be in flight while the runtime computed the list
//! of attachments it still uses. Calico's IPAM GC works the same way.
//!
//! Pure: the caller decides what "leaked" means (for the CNI GC verb: held by no attachment the
//! runtime still lists; in a cluster, [`decide`]'s table) and does the releasing.

mod decision;

use std::collections::HashMap;
use std::net::IpAddr;

use crate::store::{Claim, unchanged};

pub use decision::{
    GcConfig, Keep, LeakReason, NotBefore, OwnerState, PodPhase, PodState, Verdict, decide,
    endpoint_outdated,
};

/// What a leak seen twice still waits for, by GC's clocks ([`due`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The claim was younger than the grace period at its first sighting (its ADD may still have
    /// been in flight): that sighting does not count; it is a suspect from this time on.
    Young { until: u64 },
    /// The second sighting must be at least the grace period after the first: not before this.
    Sightings { until: u64 },
    /// Its own release time ([`NotBefore`]: the pod's deletion plus its grace and the additional
    /// delay, or the delay after the first sighting) is this.
    NotBefore { until: u64 },
}

impl Wait {
    /// The unix time it waits for.
    pub fn until(self) -> u64 {
        match self {
            Wait::Young { until } | Wait::Sightings { until } | Wait::NotBefore { until } => until,
        }
    }
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wait::Young { until } => write!(
                f,
                "the claim was younger than GC's grace period when first seen leaked: it counts \
                 as leaked from {until} on (unix time)"
            ),
            Wait::Sightings { until } => write!(
                f,
                "GC's two sightings must be its grace period apart: not before {until} (unix \
                 time)"
            ),
            Wait::NotBefore { until } => write!(
                f,
                "its release time (the pod's grace period and GC's additional delay) is {until} \
                 (unix time)"
            ),
        }
    }
}

/// Whether a leak of `claim`, first seen at `first_seen` and seen again, unchanged, at `now`, is
/// due by GC's clocks: the claim was at least `grace` seconds old at the first sighting, the
/// second comes at least `grace` seconds after it, and its own release time (`not_before`) has
/// come. The collector's [`Suspects`] and the operator's `ipam release --from-report` both
/// decide by it.
pub fn due(
    claim: &Claim,
    not_before: NotBefore,
    first_seen: u64,
    now: u64,
    grace: u64,
) -> Result<(), Wait> {
    let old_enough = claim.updated_at.saturating_add(grace);
    if old_enough > first_seen {
        return Err(Wait::Young { until: old_enough });
    }
    let second = first_seen.saturating_add(grace);
    if second > now {
        return Err(Wait::Sightings { until: second });
    }
    let own = match not_before {
        NotBefore::At(t) => t,
        NotBefore::AfterFirstSighting(d) => first_seen.saturating_add(d),
    };
    if own > now {
        return Err(Wait::NotBefore { until: own });
    }
    Ok(())
}

/// Claims seen leaked once, waiting for their second sighting.
#[derive(Debug, Default)]
pub struct Suspects {
    /// Per claim: the claim as first seen leaked, when, and at which look.
    seen: HashMap<(String, IpAddr), Sighting>,
    looks: u64,
}

#[derive(Debug)]
struct Sighting {
    claim: Claim,
    at: u64,
    look: u64,
}

impl Suspects {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records what one look at `network` found leaked at `now`, and returns the claims due for
    /// release: leaked at an earlier look at least `grace` seconds ago, and unchanged since.
    /// Suspects of `network` not found leaked this time are forgotten (they are in use again, or
    /// gone); suspects of other networks are kept.
    pub fn observe(
        &mut self,
        network: &str,
        leaked: impl IntoIterator<Item = Claim>,
        now: u64,
        grace: u64,
    ) -> Vec<Claim> {
        self.look(
            |c| c.network == network,
            leaked
                .into_iter()
                .map(|c| (c, NotBefore::AfterFirstSighting(0))),
            now,
            grace,
        )
    }

    /// Records what one look found leaked at `now` among the claims `in_scope` selects (a whole
    /// scan, one network, one pod's claims), and returns the claims due for release: leaked at
    /// an earlier look at least `grace` seconds ago, unchanged since, and past their own
    /// [`NotBefore`]. Suspects in scope not found leaked this time are forgotten (in use again,
    /// or gone); suspects out of scope are kept.
    pub fn look(
        &mut self,
        in_scope: impl Fn(&Claim) -> bool,
        leaked: impl IntoIterator<Item = (Claim, NotBefore)>,
        now: u64,
        grace: u64,
    ) -> Vec<Claim> {
        self.looks += 1;
        let look = self.looks;
        let mut still: HashMap<(String, IpAddr), Sighting> = HashMap::new();
        let mut due = Vec::new();
        for (claim, not_before) in leaked {
            if !in_scope(&claim) || claim.updated_at.saturating_add(grace) > now {
                continue;
            }
            let key = (claim.network.clone(), claim.address);
            let first = match self.seen.remove(&key) {
                Some(s) if unchanged(&s.claim, &claim) => s,
                _ => Sighting {
                    claim: claim.clone(),
                    at: now,
                    look,
                },
            };
            if first.look < look && self::due(&claim, not_before, first.at, now, grace).is_ok() {
                due.push(claim);
            }
            still.insert(key, first);
        }
        self.seen.retain(|_, s| !in_scope(&s.claim));
        self.seen.extend(still);
        due
    }

    /// Forgets a suspect (released, or found in use).
    pub fn forget(&mut self, claim: &Claim) {
        self.seen.remove(&(claim.network.clone(), claim.address));
    }

    /// Suspects waiting for their second sighting.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Whether a StatefulSet pod's address, kept (detached) since `claim.updated_at`, has waited
/// longer than `keep` seconds for its pod to come back.
pub fn kept_too_long(claim: &Claim, now: u64, keep: u64) -> bool {
    claim.attachment.is_none() && claim.updated_at.saturating_add(keep) <= now
}

/// Whether a StatefulSet pod's ordinal is at or past `replicas`: the set was scaled down and the
/// pod will not come back, so its address is released at DEL instead of kept.
pub fn scaled_away(pod_name: &str, owner_name: &str, replicas: u32) -> bool {
    pod_name
        .strip_prefix(owner_name)
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|ordinal| ordinal.parse::<u32>().ok())
        .is_some_and(|ordinal| ordinal >= replicas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Attachment, PodRef};

    fn claim(addr: &str, network: &str, updated_at: u64) -> Claim {
        Claim {
            address: addr.parse().unwrap(),
            pool: "p".into(),
            network: network.into(),
            attachment: Some(Attachment {
                container_id: format!("c-{addr}"),
                interface: "eth0".into(),
            }),
            pod: PodRef::default(),
            node: "node-a".into(),
            updated_at,
        }
    }

    #[test]
    fn released_only_on_a_second_sighting_past_the_grace_period() {
        let mut s = Suspects::new();
        let old = claim("10.0.0.1", "n", 1_000);
        assert!(
            s.observe("n", [old.clone()], 2_000, 60).is_empty(),
            "first sighting"
        );
        assert!(
            s.observe("n", [old.clone()], 2_059, 60).is_empty(),
            "second sighting within the grace period"
        );
        assert_eq!(s.observe("n", [old.clone()], 2_060, 60), vec![old]);
    }

    #[test]
    fn without_grace_two_looks_still_make_two_sightings() {
        let mut s = Suspects::new();
        let c = claim("10.0.0.1", "n", 1_000);
        assert!(
            s.observe("n", [c.clone()], 2_000, 0).is_empty(),
            "one look is one sighting"
        );
        assert_eq!(s.observe("n", [c.clone()], 2_000, 0), vec![c]);
    }

    #[test]
    fn young_claims_are_never_suspects() {
        let mut s = Suspects::new();
        let young = claim("10.0.0.1", "n", 1_990);
        assert!(s.observe("n", [young.clone()], 2_000, 60).is_empty());
        assert!(s.is_empty(), "not even recorded");
        assert!(s.observe("n", [young.clone()], 2_049, 60).is_empty());
        assert!(
            s.observe("n", [young.clone()], 2_050, 60).is_empty(),
            "now first seen"
        );
        assert_eq!(s.observe("n", [young.clone()], 2_110, 60), vec![young]);
    }

    #[test]
    fn a_claim_in_use_again_or_changed_starts_over() {
        let mut s = Suspects::new();
        let c = claim("10.0.0.1", "n", 1_000);
        s.observe("n", [c.clone()], 2_000, 60);
        s.observe("n", [], 2_030, 60);
        assert!(
            s.observe("n", [c.clone()], 2_100, 60).is_empty(),
            "forgotten when in use"
        );
        let mut refreshed = c.clone();
        refreshed.updated_at = 1_500;
        assert!(
            s.observe("n", [refreshed.clone()], 2_200, 60).is_empty(),
            "a claim that changed is a new suspect"
        );
        assert_eq!(
            s.observe("n", [refreshed.clone()], 2_260, 60),
            vec![refreshed]
        );
    }

    #[test]
    fn networks_are_looked_at_separately() {
        let mut s = Suspects::new();
        let a = claim("10.0.0.1", "a", 1_000);
        let b = claim("10.0.0.2", "b", 1_000);
        s.observe("a", [a.clone()], 2_000, 60);
        s.observe("b", [b.clone()], 2_000, 60);
        assert!(s.observe("b", [], 2_100, 60).is_empty());
        assert_eq!(
            s.observe("a", [a.clone()], 2_100, 60),
            vec![a],
            "b's look forgot none of a"
        );
        assert!(
            s.observe("a", [b], 2_200, 60).is_empty(),
            "a claim of another network is not this look's business"
        );
    }

    #[test]
    fn statefulset_keep_and_scale_down() {
        let mut kept = claim("10.0.0.1", "n", 1_000);
        kept.attachment = None;
        assert!(!kept_too_long(&kept, 1_000 + 86_399, 86_400));
        assert!(kept_too_long(&kept, 1_000 + 86_400, 86_400));
        assert!(
            !kept_too_long(&claim("10.0.0.2", "n", 0), 1 << 40, 86_400),
            "attached"
        );

        assert!(scaled_away("web-3", "web", 3));
        assert!(!scaled_away("web-2", "web", 3));
        assert!(!scaled_away("web-x", "web", 0));
        assert!(!scaled_away("webby-7", "web", 3), "another set's pod");
        assert!(scaled_away("web-0", "web", 0));
    }
}
