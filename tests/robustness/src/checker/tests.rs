//! Hand-written histories, with and without each kind of violation.

use std::net::IpAddr;

use super::{ViolationKind, check};
use crate::history::{History, Op, Outcome, StoredClaim, Verb};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Builds histories: each operation gets the next id.
#[derive(Default)]
struct Builder {
    history: History,
}

impl Builder {
    #[allow(clippy::too_many_arguments)]
    fn op(
        mut self,
        verb: Verb,
        sandbox: Option<&str>,
        addresses: &[&str],
        released: &[&str],
        call: u64,
        ret: u64,
        outcome: Outcome,
    ) -> Self {
        let id = self.history.ops.len() as u64 + 1;
        self.history.ops.push(Op {
            id,
            node: "n1".into(),
            verb,
            sandbox: sandbox.map(str::to_string),
            attachment: sandbox.map(|s| format!("{s}/eth0")),
            pod: None,
            addresses: addresses.iter().map(|a| ip(a)).collect(),
            released: released.iter().map(|a| ip(a)).collect(),
            call,
            ret,
            outcome,
            note: String::new(),
        });
        self
    }

    fn add(self, sandbox: &str, address: &str, call: u64, ret: u64) -> Self {
        self.op(
            Verb::Add,
            Some(sandbox),
            &[address],
            &[],
            call,
            ret,
            Outcome::Ok,
        )
    }

    fn del(self, sandbox: &str, released: &[&str], call: u64, ret: u64, outcome: Outcome) -> Self {
        self.op(Verb::Del, Some(sandbox), &[], released, call, ret, outcome)
    }

    fn gc(self, released: &[&str], call: u64, ret: u64, outcome: Outcome) -> Self {
        self.op(Verb::Gc, None, &[], released, call, ret, outcome)
    }

    /// The store at quiescence: `(address, sandbox)`.
    fn quiescent(mut self, claims: &[(&str, &str)]) -> Self {
        self.history.quiescent = Some(
            claims
                .iter()
                .map(|(a, s)| StoredClaim {
                    address: ip(a),
                    attachment: Some(format!("{s}/eth0")),
                    node: "n1".into(),
                })
                .collect(),
        );
        self.history.end = 1000;
        self
    }

    fn kinds(self) -> Vec<ViolationKind> {
        check(&self.history).into_iter().map(|v| v.kind).collect()
    }
}

const A: &str = "10.0.0.2";

#[test]
fn a_clean_lifecycle_has_no_violation() {
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .add("s1", A, 3, 4) // a retried ADD: the same holder
        .del("s1", &[A], 5, 6, Outcome::Ok)
        .add("s2", A, 7, 8)
        .quiescent(&[(A, "s2")])
        .kinds();
    assert_eq!(kinds, vec![]);
}

#[test]
fn two_sandboxes_holding_one_address_are_two_live_holders() {
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .add("s2", A, 3, 4)
        .kinds();
    assert!(kinds.contains(&ViolationKind::TwoLiveHolders), "{kinds:?}");
    // Concurrent with the first holder's DEL, the second ADD may come after it: fine.
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .del("s1", &[A], 3, 6, Outcome::Ok)
        .add("s2", A, 4, 5)
        .kinds();
    assert_eq!(kinds, vec![]);
}

#[test]
fn a_gc_inside_a_holding_is_a_release_while_held() {
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .gc(&[A], 3, 4, Outcome::Ok)
        .kinds();
    assert_eq!(kinds, vec![ViolationKind::ReleasedWhileHeld]);
    // A GC that began before the ADD returned may have released a previous holder's claim.
    let kinds = Builder::default()
        .add("s1", A, 1, 3)
        .gc(&[A], 2, 4, Outcome::Ok)
        .kinds();
    assert_eq!(kinds, vec![]);
    // The holder's own DEL releases it, of course; a GC after that DEL too.
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .del("s1", &[], 3, 4, Outcome::Unknown)
        .gc(&[A], 5, 6, Outcome::Ok)
        .kinds();
    assert_eq!(kinds, vec![]);
}

#[test]
fn handing_out_an_unreleased_address_is_claimed_while_held() {
    // s1's DEL failed: its claim is still in the store, so s2 cannot have been given it.
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .del("s1", &[], 3, 4, Outcome::Err("store unavailable".into()))
        .add("s2", A, 5, 6)
        .kinds();
    assert_eq!(kinds, vec![ViolationKind::ClaimedWhileHeld]);
}

#[test]
fn an_operation_without_a_reply_may_have_released_the_address() {
    // s1's DEL never answered (the agent crashed): it may have released the address.
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .del("s1", &[], 3, 4, Outcome::Unknown)
        .add("s2", A, 5, 6)
        .kinds();
    assert_eq!(kinds, vec![]);
    // So may a GC without a reply.
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .del("s1", &[], 3, 4, Outcome::Err("store unavailable".into()))
        .gc(&[], 5, 6, Outcome::Unknown)
        .add("s2", A, 7, 8)
        .kinds();
    assert_eq!(kinds, vec![]);
    // But another attachment's DEL without a reply cannot release s1's claim.
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .del("s1", &[], 3, 4, Outcome::Err("store unavailable".into()))
        .del("s9", &[], 5, 6, Outcome::Unknown)
        .add("s2", A, 7, 8)
        .kinds();
    assert_eq!(kinds, vec![ViolationKind::ClaimedWhileHeld]);
}

#[test]
fn a_claim_of_nobody_alive_at_quiescence_is_leaked() {
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .del("s1", &[], 3, 4, Outcome::Unknown)
        .quiescent(&[(A, "s1")])
        .kinds();
    assert_eq!(kinds, vec![ViolationKind::Leaked]);
    // An ADD that never answered may have claimed; its claim must be gone at quiescence too.
    let kinds = Builder::default()
        .op(Verb::Add, Some("s1"), &[], &[], 1, 2, Outcome::Unknown)
        .del("s1", &[], 3, 4, Outcome::Ok)
        .quiescent(&[(A, "s1")])
        .kinds();
    assert_eq!(kinds, vec![ViolationKind::Leaked]);
}

#[test]
fn a_live_sandbox_whose_claim_is_gone_has_lost_it() {
    let kinds = Builder::default().add("s1", A, 1, 2).quiescent(&[]).kinds();
    assert_eq!(kinds, vec![ViolationKind::Lost]);
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .quiescent(&[(A, "s1")])
        .kinds();
    assert_eq!(kinds, vec![]);
}

#[test]
fn the_window_is_the_two_operations_and_what_touched_the_address_between() {
    let history = Builder::default()
        .add("s1", A, 1, 2)
        .add("s3", "10.0.0.3", 3, 4) // another address: not in the window
        .gc(&[], 5, 6, Outcome::Ok) // released nothing: not in the window
        .add("s2", A, 7, 8)
        .add("s2", A, 9, 10) // after the second ADD: not in the window
        .history;
    let violations = check(&history);
    let two = violations
        .iter()
        .find(|v| v.kind == ViolationKind::TwoLiveHolders)
        .expect("two live holders");
    let ids: Vec<u64> = two.window.iter().map(|o| o.id).collect();
    assert_eq!(ids, vec![1, 4]);
    assert_eq!(two.sandboxes, vec!["s1".to_string(), "s2".to_string()]);
    let text = two.to_string();
    assert!(text.starts_with("two live holders on 10.0.0.2"), "{text}");
}

#[test]
fn a_repeated_add_or_check_that_answers_otherwise_has_changed() {
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .op(Verb::Check, Some("s1"), &[A], &[], 3, 4, Outcome::Ok)
        .add("s1", A, 5, 6)
        .kinds();
    assert_eq!(kinds, vec![]);
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .op(
            Verb::Check,
            Some("s1"),
            &["10.0.0.3"],
            &[],
            3,
            4,
            Outcome::Ok,
        )
        .kinds();
    assert_eq!(kinds, vec![ViolationKind::Changed]);
    let kinds = Builder::default()
        .add("s1", A, 1, 2)
        .add("s1", "10.0.0.3", 3, 4)
        .kinds();
    assert_eq!(kinds, vec![ViolationKind::Changed]);
}
