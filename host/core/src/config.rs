//! Keeping the last good configuration in force.
//!
//! A loader (the standalone directory, and later the cluster's watches) observes pool, subnet
//! and reserved-address objects; some are invalid, some files are half-written. The rule: an
//! invalid object may never make *more* addresses allocatable than before. So
//!
//! * an invalid object keeps its previous version in force (held back, with the reason);
//! * an object whose source could not be read completely (a YAML error mid-file) keeps its
//!   previous version if it is not seen at all;
//! * an invalid ReservedIP with no previous version still reserves every entry that parses
//!   (partial), and the configuration is degraded;
//! * an invalid new pool or subnet is left out (leaving a pool out never frees an address);
//! * a new or edited pool that overlaps a pool in force is left out (an edited one keeps its
//!   previous version), whatever the names: the pool in force keeps serving its claims. Among
//!   pools that are all new (the first load), those that already hold claims go first.
//!
//! Pure: no I/O. [`reconcile`] takes what is in force and what was observed and says what is in
//! force now and what is held back, left out or partial, and why.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::pool::{Pool, Reserved, Subnet, conflict};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    IpPool,
    Subnet,
    ReservedIp,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::IpPool => "IPPool",
            ObjectKind::Subnet => "Subnet",
            ObjectKind::ReservedIp => "ReservedIP",
        }
    }
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A checked object.
#[derive(Clone, Debug)]
pub enum Object {
    Pool(Box<Pool>),
    Subnet(Box<Subnet>),
    Reserved(Reserved),
}

/// An object that failed its checks.
#[derive(Clone, Debug)]
pub struct Invalid {
    pub error: String,
    /// For a ReservedIP: what it reserves anyway ([`Reserved::salvage`]).
    pub salvaged: Option<Box<Reserved>>,
}

/// One object as a loader found it.
#[derive(Clone, Debug)]
pub struct Observed {
    pub kind: ObjectKind,
    pub name: String,
    /// The source it came from (a file): objects of an incomplete source are kept.
    pub source: String,
    /// Where exactly, for messages (`file#document`).
    pub at: String,
    pub object: Result<Object, Invalid>,
}

/// Everything a loader found in one pass.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    pub objects: Vec<Observed>,
    /// Sources that could not be read completely, and why.
    pub incomplete: BTreeMap<String, String>,
}

/// The versions in force, by name, with the source each came from.
#[derive(Clone, Debug, Default)]
pub struct InForce {
    pub pools: BTreeMap<String, (Pool, String)>,
    pub subnets: BTreeMap<String, (Subnet, String)>,
    pub reserved: BTreeMap<String, (Reserved, String)>,
}

impl InForce {
    pub fn pools(&self) -> Vec<Pool> {
        self.pools.values().map(|(p, _)| p.clone()).collect()
    }

    pub fn subnets(&self) -> Vec<Subnet> {
        self.subnets.values().map(|(s, _)| s.clone()).collect()
    }

    pub fn reserved(&self) -> Vec<Reserved> {
        self.reserved.values().map(|(r, _)| r.clone()).collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProblemState {
    /// The previous version stays in force.
    HeldBack,
    /// Not in force at all (no previous version).
    LeftOut,
    /// In force as far as it could be read (a ReservedIP's readable entries).
    Partial,
}

impl ProblemState {
    pub fn as_str(self) -> &'static str {
        match self {
            ProblemState::HeldBack => "held-back",
            ProblemState::LeftOut => "left-out",
            ProblemState::Partial => "partial",
        }
    }
}

/// An object whose observed version is not (entirely) in force, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub kind: ObjectKind,
    pub name: String,
    pub state: ProblemState,
    pub reason: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.state {
            ProblemState::HeldBack => "keeping the version in force",
            ProblemState::LeftOut => "left out",
            ProblemState::Partial => "reserving what could be read",
        };
        write!(f, "{} {}: {what}: {}", self.kind, self.name, self.reason)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Reconciled {
    pub in_force: InForce,
    pub problems: Vec<Problem>,
}

impl Reconciled {
    /// The configuration on disk is not entirely what is in force.
    pub fn degraded(&self) -> bool {
        !self.problems.is_empty()
    }
}

type Key = (ObjectKind, String);

/// What is in force after observing `observation`, given what was in force before. `serving`
/// says whether a pool (by name) holds claims: such pools win overlaps among new pools.
pub fn reconcile(
    previous: &InForce,
    observation: &Observation,
    serving: &dyn Fn(&str) -> bool,
) -> Reconciled {
    let mut problems = Vec::new();
    let mut groups: BTreeMap<Key, Vec<&Observed>> = BTreeMap::new();
    for o in &observation.objects {
        groups.entry((o.kind, o.name.clone())).or_default().push(o);
    }

    // Per object, the version proposed to be in force (before the checks across pools).
    let mut out = InForce::default();
    let mut proposed_pools: BTreeMap<String, (Pool, String)> = BTreeMap::new();
    for ((kind, name), seen) in &groups {
        let problem = |state, reason: String| Problem {
            kind: *kind,
            name: name.clone(),
            state,
            reason,
        };
        let had_previous = match kind {
            ObjectKind::IpPool => previous.pools.contains_key(name),
            ObjectKind::Subnet => previous.subnets.contains_key(name),
            ObjectKind::ReservedIp => previous.reserved.contains_key(name),
        };
        let new_version: Result<(&Object, &str), String> = match seen.as_slice() {
            [one] => match &one.object {
                Ok(object) => Ok((object, one.source.as_str())),
                Err(invalid) => Err(format!("{}: {}", one.at, invalid.error)),
            },
            many => Err(format!(
                "defined {} times ({}): keep one",
                many.len(),
                many.iter()
                    .map(|o| o.at.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        };
        match new_version {
            Ok((Object::Pool(p), source)) => {
                proposed_pools.insert(name.clone(), ((**p).clone(), source.to_string()));
            }
            Ok((Object::Subnet(s), source)) => {
                out.subnets
                    .insert(name.clone(), ((**s).clone(), source.to_string()));
            }
            Ok((Object::Reserved(r), source)) => {
                out.reserved
                    .insert(name.clone(), (r.clone(), source.to_string()));
            }
            Err(reason) if had_previous => {
                keep_previous(previous, &mut out, &mut proposed_pools, *kind, name);
                problems.push(problem(ProblemState::HeldBack, reason));
            }
            Err(reason) if *kind == ObjectKind::ReservedIp => {
                // No previous version: reserve everything any observation could read.
                let salvaged = seen.iter().filter_map(|o| match &o.object {
                    Ok(Object::Reserved(r)) => Some(r),
                    Err(invalid) => invalid.salvaged.as_deref(),
                    Ok(_) => None,
                });
                let mut union: Option<Reserved> = None;
                for r in salvaged {
                    union = Some(match union {
                        None => r.clone(),
                        Some(mut u) if u.family == r.family => {
                            u.ips = u.ips.union(&r.ips);
                            u
                        }
                        Some(u) => u,
                    });
                }
                match union {
                    Some(r) => {
                        let reason =
                            format!("{reason}; reserving {}", r.ips.to_entries().join(", "));
                        out.reserved
                            .insert(name.clone(), (r, seen[0].source.clone()));
                        problems.push(problem(ProblemState::Partial, reason));
                    }
                    None => problems.push(problem(ProblemState::LeftOut, reason)),
                }
            }
            Err(reason) => problems.push(problem(ProblemState::LeftOut, reason)),
        }
    }

    // Objects not seen at all: gone, unless their source could not be read completely.
    let unseen = |kind: ObjectKind, name: &str| !groups.contains_key(&(kind, name.to_string()));
    let held_by_source = |source: &str| observation.incomplete.get(source);
    for (kind, name, source) in previous
        .pools
        .iter()
        .map(|(n, (_, s))| (ObjectKind::IpPool, n, s))
        .chain(
            previous
                .subnets
                .iter()
                .map(|(n, (_, s))| (ObjectKind::Subnet, n, s)),
        )
        .chain(
            previous
                .reserved
                .iter()
                .map(|(n, (_, s))| (ObjectKind::ReservedIp, n, s)),
        )
    {
        if !unseen(kind, name) {
            continue;
        }
        if let Some(why) = held_by_source(source) {
            keep_previous(previous, &mut out, &mut proposed_pools, kind, name);
            problems.push(Problem {
                kind,
                name: name.clone(),
                state: ProblemState::HeldBack,
                reason: format!("{source} could not be read completely ({why})"),
            });
        }
    }

    out.pools = check_across_pools(previous, proposed_pools, serving, &mut problems);
    problems.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    Reconciled {
        in_force: out,
        problems,
    }
}

fn keep_previous(
    previous: &InForce,
    out: &mut InForce,
    proposed_pools: &mut BTreeMap<String, (Pool, String)>,
    kind: ObjectKind,
    name: &str,
) {
    match kind {
        ObjectKind::IpPool => {
            if let Some(p) = previous.pools.get(name) {
                proposed_pools.insert(name.to_string(), p.clone());
            }
        }
        ObjectKind::Subnet => {
            if let Some(s) = previous.subnets.get(name) {
                out.subnets.insert(name.to_string(), s.clone());
            }
        }
        ObjectKind::ReservedIp => {
            if let Some(r) = previous.reserved.get(name) {
                out.reserved.insert(name.to_string(), r.clone());
            }
        }
    }
}

/// Pools in force stay; a changed pool takes its new version only if that fits beside every
/// other pool in force, else keeps the old one; a new pool joins only if it fits. Pools that
/// serve claims go first, then by name.
fn check_across_pools(
    previous: &InForce,
    proposed: BTreeMap<String, (Pool, String)>,
    serving: &dyn Fn(&str) -> bool,
    problems: &mut Vec<Problem>,
) -> BTreeMap<String, (Pool, String)> {
    let mut accepted: BTreeMap<String, (Pool, String)> = BTreeMap::new();
    let mut changed = Vec::new();
    let mut new = Vec::new();
    for (name, (pool, source)) in proposed {
        match previous.pools.get(&name) {
            Some((old, old_source)) => {
                if same_pool(old, &pool) {
                    accepted.insert(name, (pool, source));
                } else {
                    accepted.insert(name.clone(), (old.clone(), old_source.clone()));
                    changed.push((name, pool, source));
                }
            }
            None => new.push((name, pool, source)),
        }
    }
    let order = |list: &mut Vec<(String, Pool, String)>| {
        list.sort_by_key(|(name, _, _)| (!serving(name), name.clone()));
    };
    order(&mut changed);
    order(&mut new);
    let fits = |accepted: &BTreeMap<String, (Pool, String)>, pool: &Pool| {
        accepted
            .values()
            .filter(|(other, _)| other.meta.name != pool.meta.name)
            .find_map(|(other, _)| conflict(pool, other))
    };
    for (name, pool, source) in changed {
        match fits(&accepted, &pool) {
            None => {
                accepted.insert(name, (pool, source));
            }
            Some(e) => problems.push(Problem {
                kind: ObjectKind::IpPool,
                name,
                state: ProblemState::HeldBack,
                reason: e.to_string(),
            }),
        }
    }
    for (name, pool, source) in new {
        match fits(&accepted, &pool) {
            None => {
                accepted.insert(name, (pool, source));
            }
            Some(e) => problems.push(Problem {
                kind: ObjectKind::IpPool,
                name,
                state: ProblemState::LeftOut,
                reason: e.to_string(),
            }),
        }
    }
    accepted
}

/// Whether two checked pools are the same version (what the user wrote is the same).
pub fn same_pool(a: &Pool, b: &Pool) -> bool {
    a.meta == b.meta && a.spec == b.spec
}

/// Names of the objects of a kind in force, for messages and tests.
pub fn names(in_force: &InForce, kind: ObjectKind) -> BTreeSet<String> {
    match kind {
        ObjectKind::IpPool => in_force.pools.keys().cloned().collect(),
        ObjectKind::Subnet => in_force.subnets.keys().cloned().collect(),
        ObjectKind::ReservedIp => in_force.reserved.keys().cloned().collect(),
    }
}
