//! The checker: decides, per address, whether a [`History`] could have come from an IPAM that
//! keeps allot's promise: **an address has at most one live holder, and a live holder's
//! address is never released or handed to another**; and, once faults heal and GC has run past
//! its grace period, **every claim in the store belongs to a live sandbox and every live
//! sandbox still holds what it was given**.
//!
//! The model, per address (histories are partitioned by address, as Jepsen's Knossos and Elle
//! partition by key, so each check stays linear in the operations on one address):
//!
//! * A sandbox **holds** an address from the return of an ADD that gave it the address until
//!   the invocation of its first DEL: from then on the runtime has let the address go, whether
//!   that DEL succeeds, fails or never answers.
//! * An operation **may release** an address when it reports releasing it, or when it got no
//!   reply (or is a GC that failed part way) and could have released it (a DEL or ADD of the holder's attachment, a GC,
//!   a journal replay): like a linearizability checker (porcupine in etcd's robustness tests),
//!   an operation without a reply is taken as possibly applied *or* not, and a violation is
//!   reported only when no choice explains the history.
//!
//! Each violation comes with the shortest window of operations that shows it: the two
//! operations it is between, and every operation on the address in between.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use serde::Serialize;

use crate::history::{History, Op, Outcome, Verb};

/// What was broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ViolationKind {
    /// Two sandboxes held the address at the same time.
    TwoLiveHolders,
    /// An operation other than the holder's own DEL (another sandbox's DEL, GC, a replay)
    /// released the address entirely within the time its holder held it.
    ReleasedWhileHeld,
    /// The address was handed to a sandbox after its previous holder had gone, but before any
    /// operation that could have released it: the store still held it.
    ClaimedWhileHeld,
    /// A live sandbox's repeated ADD, or its CHECK, answered other addresses than its first
    /// ADD gave it (ADD and CHECK are idempotent per attachment).
    Changed,
    /// After quiescence, the store holds the address for no live sandbox.
    Leaked,
    /// After quiescence, a live sandbox's address is not held for it in the store.
    Lost,
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ViolationKind::TwoLiveHolders => "two live holders",
            ViolationKind::ReleasedWhileHeld => "released while held",
            ViolationKind::ClaimedWhileHeld => "claimed while held",
            ViolationKind::Changed => "changed",
            ViolationKind::Leaked => "leaked",
            ViolationKind::Lost => "lost",
        })
    }
}

/// One violation of the model, with the operations that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub address: IpAddr,
    /// The sandboxes involved.
    pub sandboxes: Vec<String>,
    pub detail: String,
    /// The operations that show it, by invocation time.
    pub window: Vec<Op>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} on {}: {}", self.kind, self.address, self.detail)?;
        for op in &self.window {
            let line = serde_json::to_string(op).unwrap_or_else(|e| format!("op {}: {e}", op.id));
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// When one sandbox held one address.
#[derive(Clone, Debug)]
struct Holding<'h> {
    sandbox: &'h str,
    attachment: &'h str,
    /// The first ADD that gave it the address.
    add: &'h Op,
    start: u64,
    /// Invocation of the sandbox's first DEL; `u64::MAX` while it lives.
    end: u64,
}

/// Every violation in `history`, by address.
pub fn check(history: &History) -> Vec<Violation> {
    let mut ops: Vec<&Op> = history.ops.iter().collect();
    ops.sort_by_key(|o| (o.call, o.id));

    // The runtime lets a sandbox's addresses go when it first asks to DEL it.
    let mut first_del: BTreeMap<&str, u64> = BTreeMap::new();
    for op in ops.iter().filter(|o| o.verb == Verb::Del) {
        if let Some(s) = &op.sandbox {
            let at = first_del.entry(s).or_insert(op.call);
            *at = (*at).min(op.call);
        }
    }

    let mut holdings: BTreeMap<IpAddr, Vec<Holding>> = BTreeMap::new();
    let mut seen: BTreeSet<(IpAddr, &str)> = BTreeSet::new();
    for op in ops
        .iter()
        .filter(|o| o.verb == Verb::Add && o.outcome == Outcome::Ok)
    {
        let (Some(sandbox), Some(attachment)) = (&op.sandbox, &op.attachment) else {
            continue;
        };
        let end = first_del.get(sandbox.as_str()).copied().unwrap_or(u64::MAX);
        for &address in &op.addresses {
            // Ops are in invocation order; a retried ADD keeps the first one's start.
            if op.ret < end && seen.insert((address, sandbox)) {
                holdings.entry(address).or_default().push(Holding {
                    sandbox,
                    attachment,
                    add: op,
                    start: op.ret,
                    end,
                });
            }
        }
    }

    let mut violations = Vec::new();
    for (&address, held) in &mut holdings {
        held.sort_by_key(|h| (h.start, h.add.id));
        two_live_holders(address, held, &ops, &mut violations);
        released_while_held(address, held, &ops, &mut violations);
        claimed_while_held(address, held, &ops, &mut violations);
    }
    changed(&ops, &first_del, &mut violations);
    if let Some(claims) = &history.quiescent {
        at_quiescence(history, claims, &ops, &mut violations);
    }
    violations
}

fn two_live_holders(address: IpAddr, held: &[Holding], ops: &[&Op], out: &mut Vec<Violation>) {
    for (i, a) in held.iter().enumerate() {
        // Sorted by start: only later holders can overlap, and only while `a` still holds.
        for b in held[i + 1..].iter().take_while(|b| b.start < a.end) {
            if a.sandbox == b.sandbox {
                continue;
            }
            out.push(Violation {
                kind: ViolationKind::TwoLiveHolders,
                address,
                sandboxes: vec![a.sandbox.into(), b.sandbox.into()],
                detail: format!(
                    "{} held it from t={} (op {}) and {} was given it at t={} (op {}) before {} let it go",
                    a.sandbox, a.start, a.add.id, b.sandbox, b.start, b.add.id, a.sandbox
                ),
                window: window(address, a.add, b.add, ops, a.attachment),
            });
        }
    }
}

fn released_while_held(address: IpAddr, held: &[Holding], ops: &[&Op], out: &mut Vec<Violation>) {
    for h in held {
        for r in ops.iter().filter(|r| {
            r.outcome != Outcome::Unknown
                && r.released.contains(&address)
                && r.sandbox.as_deref() != Some(h.sandbox)
                && h.start <= r.call
                && r.ret < h.end
        }) {
            out.push(Violation {
                kind: ViolationKind::ReleasedWhileHeld,
                address,
                sandboxes: vec![h.sandbox.into()],
                detail: format!(
                    "{} held it from t={} (op {}); {:?} op {} on {} released it at t={}..{}",
                    h.sandbox, h.start, h.add.id, r.verb, r.id, r.node, r.call, r.ret
                ),
                window: window(address, h.add, r, ops, h.attachment),
            });
        }
    }
}

fn claimed_while_held(address: IpAddr, held: &[Holding], ops: &[&Op], out: &mut Vec<Violation>) {
    for pair in held.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.sandbox == b.sandbox || b.start < a.end {
            // The same holder, or two live holders (reported as such).
            continue;
        }
        // Some operation overlapping [a's ADD invoked, b's ADD returned] must be able to
        // have released a's claim.
        let released = ops.iter().any(|r| {
            r.call < b.add.ret && r.ret > a.add.call && may_release(r, address, a.attachment)
        });
        if !released {
            out.push(Violation {
                kind: ViolationKind::ClaimedWhileHeld,
                address,
                sandboxes: vec![a.sandbox.into(), b.sandbox.into()],
                detail: format!(
                    "{} (op {}) was given it at t={} while {}'s claim (op {}) had not been released by anything",
                    b.sandbox, b.add.id, b.start, a.sandbox, a.add.id
                ),
                window: window(address, a.add, b.add, ops, a.attachment),
            });
        }
    }
}

fn changed(ops: &[&Op], first_del: &BTreeMap<&str, u64>, out: &mut Vec<Violation>) {
    let mut first_add: BTreeMap<&str, &Op> = BTreeMap::new();
    for op in ops
        .iter()
        .filter(|o| matches!(o.verb, Verb::Add | Verb::Check) && o.outcome == Outcome::Ok)
    {
        let Some(sandbox) = op.sandbox.as_deref() else {
            continue;
        };
        if first_del.get(sandbox).is_some_and(|&del| del <= op.call) {
            continue;
        }
        let Some(first) = first_add.get(sandbox) else {
            if op.verb == Verb::Add {
                first_add.insert(sandbox, op);
            }
            continue;
        };
        let sorted = |o: &Op| o.addresses.iter().copied().collect::<BTreeSet<IpAddr>>();
        if sorted(first) == sorted(op) {
            continue;
        }
        let address = first
            .addresses
            .iter()
            .chain(&op.addresses)
            .copied()
            .find(|a| !(first.addresses.contains(a) && op.addresses.contains(a)))
            .unwrap_or(IpAddr::from([0, 0, 0, 0]));
        out.push(Violation {
            kind: ViolationKind::Changed,
            address,
            sandboxes: vec![sandbox.into()],
            detail: format!(
                "{sandbox}'s {:?} op {} answered {:?}, its first ADD (op {}) {:?}",
                op.verb, op.id, op.addresses, first.id, first.addresses
            ),
            window: window(
                address,
                first,
                op,
                ops,
                first.attachment.as_deref().unwrap_or(""),
            ),
        });
    }
}

fn at_quiescence(
    history: &History,
    claims: &[crate::history::StoredClaim],
    ops: &[&Op],
    out: &mut Vec<Violation>,
) {
    let deleted: BTreeSet<&str> = ops
        .iter()
        .filter(|o| o.verb == Verb::Del)
        .filter_map(|o| o.sandbox.as_deref())
        .collect();
    // A live sandbox: ADDed and never DELed; it should hold what its last successful ADD gave.
    let mut live: BTreeMap<&str, (&str, &Op)> = BTreeMap::new();
    for op in ops.iter().filter(|o| o.verb == Verb::Add) {
        if let (Some(s), Some(a)) = (&op.sandbox, &op.attachment)
            && !deleted.contains(s.as_str())
            && op.outcome == Outcome::Ok
        {
            live.insert(s, (a, op));
        }
    }
    let live_attachments: BTreeSet<&str> = live.values().map(|(a, _)| *a).collect();
    for claim in claims {
        let holder = claim.attachment.as_deref();
        if holder.is_some_and(|a| live_attachments.contains(a)) {
            continue;
        }
        let attachment = holder.unwrap_or("(detached)");
        let mut window: Vec<Op> = ops
            .iter()
            .filter(|o| {
                o.attachment.as_deref() == holder
                    || o.addresses.contains(&claim.address)
                    || o.released.contains(&claim.address)
            })
            .map(|o| (*o).clone())
            .collect();
        // The shortest story: from the last ADD that could have made this claim.
        if let Some(from) = window.iter().rposition(|o| {
            o.verb == Verb::Add
                && o.attachment.as_deref() == holder
                && (o.outcome != Outcome::Ok || o.addresses.contains(&claim.address))
        }) {
            window.drain(..from);
        }
        out.push(Violation {
            kind: ViolationKind::Leaked,
            address: claim.address,
            sandboxes: vec![],
            detail: format!(
                "at quiescence (t={}) the store holds it for {attachment} on {}, which no live sandbox is",
                history.end, claim.node
            ),
            window,
        });
    }
    for (sandbox, (attachment, add)) in &live {
        for &address in &add.addresses {
            let kept = claims
                .iter()
                .any(|c| c.address == address && c.attachment.as_deref() == Some(attachment));
            if kept {
                continue;
            }
            let window: Vec<Op> = ops
                .iter()
                .filter(|o| o.call >= add.call && (o.id == add.id || o.touches_exactly(address)))
                .map(|o| (*o).clone())
                .collect();
            out.push(Violation {
                kind: ViolationKind::Lost,
                address,
                sandboxes: vec![sandbox.to_string()],
                detail: format!(
                    "{sandbox} lives and was given it (op {}), but at quiescence (t={}) the store does not hold it for {attachment}",
                    add.id, history.end
                ),
                window,
            });
        }
    }
}

/// Whether `op` may have released `address` while `attachment` held it (see the module's
/// documentation): it says so, or it got no reply and is a release of that attachment's
/// claims (a DEL, or an ADD that serves a journaled DEL first) or of anyone's (GC, a replay).
fn may_release(op: &Op, address: IpAddr, attachment: &str) -> bool {
    if op.released.contains(&address) {
        return true;
    }
    match (&op.outcome, op.verb) {
        (Outcome::Ok, _) => false,
        (Outcome::Unknown, Verb::Add | Verb::Del) => op.attachment.as_deref() == Some(attachment),
        (Outcome::Unknown, Verb::Gc | Verb::Replay) => true,
        // GC releases in batches of a transaction each: one that failed may have committed
        // the batches before it. Any other error took no effect.
        (Outcome::Err(_), Verb::Gc) => true,
        _ => false,
    }
}

impl Op {
    /// Whether the operation names `address` (returned or released).
    fn touches_exactly(&self, address: IpAddr) -> bool {
        self.addresses.contains(&address) || self.released.contains(&address)
    }
}

/// `from`, `to`, and every operation invoked between them that names `address` or may have
/// released it from `attachment`, or is a crash or restart of a node involved.
fn window(address: IpAddr, from: &Op, to: &Op, ops: &[&Op], attachment: &str) -> Vec<Op> {
    let (lo, hi) = (from.call.min(to.call), from.call.max(to.call));
    let nodes = [from.node.as_str(), to.node.as_str()];
    ops.iter()
        .filter(|o| {
            o.id == from.id
                || o.id == to.id
                || (o.call >= lo
                    && o.call <= hi
                    && (o.touches_exactly(address)
                        || may_release(o, address, attachment)
                        || (matches!(o.verb, Verb::Crash | Verb::Restart)
                            && nodes.contains(&o.node.as_str()))))
        })
        .map(|o| (*o).clone())
        .collect()
}

#[cfg(test)]
#[path = "checker/tests.rs"]
mod tests;
