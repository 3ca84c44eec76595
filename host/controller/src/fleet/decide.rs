//! The decisions, pure: what one cluster gets from one pool (the API adapter and `allotctl
//! fleet plan` both call [`decide`]), and which edits the webhook will refuse (of a pool:
//! [`check_pool_edit`]; of an IPAMAllocation: [`check_allocation_object`]). Core does the
//! arithmetic; this adds what the objects say on top of it: the `deprecated` flag, the records
//! of a pool's status, the IPAMAllocations holding addresses the pool has no record of
//! ([`holders`]), and who the cluster is.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use allot_core::fleet::{
    Allocation, AllocationProblem, FleetError, FleetPool, FleetSpecError, allocate,
    check_allocation, check_edit,
};
use allot_k8s::{IPAMAllocation, IPAMAllocationSpec, IPAMPool, IPAMPoolDatacenter};

/// A cluster that asks for allocations. Its namespace is its identity: an `IPAMAllocation` is
/// named after its pool in the cluster's namespace, so one namespace holds one cluster.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FleetCluster {
    pub namespace: String,
    /// For people (a Cluster API `Cluster`'s name; a request's namespace).
    pub name: String,
    pub datacenter: String,
    /// The pools the cluster asks from: `None` for every pool serving its datacenter (a
    /// `Cluster`), otherwise those named (`IPAMAllocation` requests).
    pub pools: Option<BTreeSet<String>>,
}

impl FleetCluster {
    /// Whether the cluster asks `pool` for an allocation; `serves_datacenter`: the pool has an
    /// entry for the cluster's datacenter.
    pub fn asks(&self, pool: &str, serves_datacenter: bool) -> bool {
        match &self.pools {
            None => serves_datacenter,
            Some(named) => named.contains(pool),
        }
    }
}

/// Why a cluster gets no (new or larger) allocation from a pool; what it holds stays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no IPAMPool {pool}: create it, or fix the name the request is named after")]
    NoPool { pool: String },
    #[error(
        "IPAMPool {pool} has no entry for datacenter {dc}: add spec.datacenters.{dc}, or fix the cluster's datacenter"
    )]
    NoDatacenter { pool: String, dc: String },
    #[error("IPAMPool {pool} datacenter {dc}: {error}")]
    Spec {
        pool: String,
        dc: String,
        error: FleetSpecError,
    },
    #[error(
        "IPAMPool {pool} datacenter {dc} is deprecated and serves no new cluster: give the datacenter another IPAMPool, or set deprecated back to false"
    )]
    Deprecated { pool: String, dc: String },
    #[error("IPAMPool {pool} datacenter {dc}: {error}")]
    Fleet {
        pool: String,
        dc: String,
        error: Box<FleetError>,
    },
    #[error(
        "IPAMPool {pool}: the record of cluster namespace {namespace} is unreadable ({error}): fix or remove status.allocations.{namespace}"
    )]
    BadRecord {
        pool: String,
        namespace: String,
        error: FleetSpecError,
    },
    #[error(
        "IPAMAllocation {namespace}/{pool} holds {held}, which IPAMPool {pool} cannot keep: {problems}; delete the IPAMAllocation to get a new allocation, or fix the pool",
        problems = Problems(problems)
    )]
    Inconsistent {
        pool: String,
        namespace: String,
        held: String,
        problems: Vec<AllocationProblem>,
    },
}

struct Problems<'a>(&'a [AllocationProblem]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// What a decision did to the cluster's allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    New,
    Kept,
    Grown,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Change::New => "new",
            Change::Kept => "kept",
            Change::Grown => "grown",
        })
    }
}

/// What a cluster already holds in a pool.
#[derive(Clone, Copy, Debug)]
pub enum Current<'a> {
    None,
    /// The pool's own record (trusted: it was checked when it was written).
    Recorded(&'a Allocation),
    /// An `IPAMAllocation` the pool has no record of (migrated from another allocator, or
    /// written by hand): kept only when it fits the pool and overlaps nobody.
    Adopted(&'a Allocation),
}

/// What `namespace` gets from datacenter `dc` of `pool`, given every other allocation of that
/// datacenter in `existing` and what the cluster holds. A deprecated pool keeps (and grows) the
/// allocations it made but makes no new one.
pub fn decide(
    pool: &str,
    dc: &str,
    entry: &IPAMPoolDatacenter,
    existing: &[(String, Allocation)],
    namespace: &str,
    current: Current<'_>,
) -> Result<(Allocation, Change), Refusal> {
    let checked = FleetPool::try_from(entry).map_err(|error| Refusal::Spec {
        pool: pool.to_string(),
        dc: dc.to_string(),
        error,
    })?;
    let current = match current {
        Current::None => None,
        Current::Recorded(a) => Some(a),
        Current::Adopted(a) => {
            let problems = check_allocation(&checked, existing, namespace, a);
            if !problems.is_empty() {
                return Err(Refusal::Inconsistent {
                    pool: pool.to_string(),
                    namespace: namespace.to_string(),
                    held: a.to_string(),
                    problems,
                });
            }
            Some(a)
        }
    };
    if current.is_none() && entry.deprecated {
        return Err(Refusal::Deprecated {
            pool: pool.to_string(),
            dc: dc.to_string(),
        });
    }
    let decided =
        allocate(&checked, existing, namespace, current).map_err(|error| Refusal::Fleet {
            pool: pool.to_string(),
            dc: dc.to_string(),
            error: Box::new(error),
        })?;
    let change = match current {
        None => Change::New,
        Some(c) if *c == decided => Change::Kept,
        Some(_) => Change::Grown,
    };
    Ok((decided, change))
}

/// Whether `decision`, made by [`decide`] against no other cluster, could change once every
/// allocation holding addresses counts ([`holders`]): a new, adopted or grown allocation could,
/// and so could a pool found full or an adoption refused (the refusal names whom it overlaps).
/// A recorded allocation kept as it is, or a refusal of the pool's settings, depends on nobody
/// else: deciding those costs the allocator no list of the pool's IPAMAllocations.
pub fn depends_on_others(
    current: Current<'_>,
    decision: &Result<(Allocation, Change), Refusal>,
) -> bool {
    match decision {
        Ok((_, Change::Kept)) => !matches!(current, Current::Recorded(_)),
        Ok(_) => true,
        Err(Refusal::Fleet { error, .. }) => matches!(
            **error,
            FleetError::Exhausted { .. } | FleetError::NoFreePrefix { .. }
        ),
        Err(Refusal::Inconsistent { .. }) => true,
        Err(_) => false,
    }
}

/// A pool's records, read: cluster namespace → (datacenter, allocation). An unreadable record
/// is an error, never skipped: skipping it could hand its addresses out twice.
pub fn records(
    pool: &str,
    recorded: &BTreeMap<String, IPAMAllocationSpec>,
) -> Result<BTreeMap<String, (String, Allocation)>, Refusal> {
    let mut out = BTreeMap::new();
    for (namespace, spec) in recorded {
        let bad = |error| Refusal::BadRecord {
            pool: pool.to_string(),
            namespace: namespace.clone(),
            error,
        };
        let allocation = spec
            .allocation()
            .map_err(bad)?
            .ok_or_else(|| bad(FleetSpecError::NoAddresses))?;
        out.insert(namespace.clone(), (spec.dc.clone(), allocation));
    }
    Ok(out)
}

/// The allocations of datacenter `dc` among `records`, as core takes them.
pub fn in_datacenter(
    records: &BTreeMap<String, (String, Allocation)>,
    dc: &str,
) -> Vec<(String, Allocation)> {
    records
        .iter()
        .filter(|(_, (d, _))| d == dc)
        .map(|(ns, (_, a))| (ns.clone(), a.clone()))
        .collect()
}

/// Every allocation of datacenter `dc` that holds addresses, as core takes them: the pool's
/// `records` from `dc`, and each IPAMAllocation of the pool from `dc` (namespace, spec) whose
/// namespace the pool has no record of (adopted, made by another tool such as Kubermatic, or
/// created meanwhile). Its cluster may use those addresses whether the pool knows it or not,
/// so they count as taken: left out, they would be handed out again. A namespace the pool has
/// a record of is its record (the allocator writes its IPAMAllocation from it); an
/// IPAMAllocation that cannot be read, or a request, holds nothing.
pub fn holders<'a>(
    records: &BTreeMap<String, (String, Allocation)>,
    objects: impl IntoIterator<Item = (&'a str, &'a IPAMAllocationSpec)>,
    dc: &str,
) -> Vec<(String, Allocation)> {
    let mut out = in_datacenter(records, dc);
    for (namespace, spec) in objects {
        if spec.dc != dc || records.contains_key(namespace) {
            continue;
        }
        if let Ok(Some(allocation)) = spec.allocation() {
            out.push((namespace.to_string(), allocation));
        }
    }
    out
}

/// The IPAMAllocations of IPAMPool `pool` among `objects` (each is named after its pool), as
/// (namespace, spec).
pub fn of_pool<'a>(
    pool: &'a str,
    objects: &'a [IPAMAllocation],
) -> impl Iterator<Item = (&'a str, &'a IPAMAllocationSpec)> + 'a {
    objects
        .iter()
        .filter(move |o| o.metadata.name.as_deref() == Some(pool))
        .map(|o| (o.metadata.namespace.as_deref().unwrap_or_default(), &o.spec))
}

/// Why the edit of IPAMPool `old` into `new` must be refused (`old` is `None` on creation,
/// `new` on deletion), judged against every allocation that holds addresses: those recorded
/// in `old`'s status and the pool's IPAMAllocations among `objects` it has no record of (see
/// [`holders`]). Each datacenter goes through core's `check_edit` (poolCidr, type and
/// allocationPrefix immutable; an exclusion that covers allocated addresses; removing a
/// datacenter clusters still hold allocations from), and a new entry that is not a valid pool
/// is refused. Empty when the edit is allowed.
pub fn check_pool_edit(
    old: Option<&IPAMPool>,
    new: Option<&IPAMPool>,
    objects: &[IPAMAllocation],
) -> Vec<String> {
    let name = new
        .or(old)
        .and_then(|p| p.metadata.name.clone())
        .unwrap_or_default();
    let empty = BTreeMap::new();
    let recorded = old
        .and_then(|p| p.status.as_ref())
        .map_or(&empty, |s| &s.allocations);
    let held = match records(&name, recorded) {
        Ok(held) => held,
        Err(e) => return vec![e.to_string()],
    };
    let entries = |p: Option<&IPAMPool>| p.map(|p| p.spec.datacenters.clone()).unwrap_or_default();
    let (old_dcs, new_dcs) = (entries(old), entries(new));
    let names: BTreeSet<&String> = old_dcs.keys().chain(new_dcs.keys()).collect();
    let mut refusals = Vec::new();
    for dc in names {
        let old_pool = old_dcs.get(dc).and_then(|e| FleetPool::try_from(e).ok());
        let new_pool = match new_dcs.get(dc).map(FleetPool::try_from) {
            Some(Err(e)) => {
                refusals.push(format!("IPAMPool {name} datacenter {dc}: {e}"));
                continue;
            }
            Some(Ok(p)) => Some(p),
            None => None,
        };
        let allocations = holders(&held, of_pool(&name, objects), dc);
        for refusal in check_edit(old_pool.as_ref(), new_pool.as_ref(), &allocations) {
            refusals.push(format!("IPAMPool {name} datacenter {dc}: {refusal}"));
        }
    }
    refusals
}

/// Why an IPAMAllocation written (or edited) by anyone but the allocator must be refused: the
/// consistency check the proposal asks of a validating webhook. A request (no addresses) is
/// fine when its pool serves its datacenter; an allocation must fit its pool and, when the
/// pool holds a record for this namespace, be that record. One the pool has a record of must
/// overlap no other record; one it has no record of must overlap no allocation holding
/// addresses, recorded or among `objects` (the pool's IPAMAllocations; see [`holders`]).
/// Empty when the object is allowed.
pub fn check_allocation_object(
    pool: &IPAMPool,
    object: &IPAMAllocation,
    objects: &[IPAMAllocation],
) -> Vec<String> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let ns = object.metadata.namespace.clone().unwrap_or_default();
    let dc = &object.spec.dc;
    let Some(entry) = pool.spec.datacenters.get(dc) else {
        return vec![
            Refusal::NoDatacenter {
                pool: name,
                dc: dc.clone(),
            }
            .to_string(),
        ];
    };
    let allocation = match object.spec.allocation() {
        Ok(Some(a)) => a,
        Ok(None) => return Vec::new(),
        Err(e) => return vec![format!("IPAMAllocation {ns}/{name}: {e}")],
    };
    let checked = match FleetPool::try_from(entry) {
        Ok(p) => p,
        Err(error) => {
            return vec![
                Refusal::Spec {
                    pool: name,
                    dc: dc.clone(),
                    error,
                }
                .to_string(),
            ];
        }
    };
    let empty = BTreeMap::new();
    let recorded = pool.status.as_ref().map_or(&empty, |s| &s.allocations);
    let held = match records(&name, recorded) {
        Ok(held) => held,
        Err(e) => return vec![e.to_string()],
    };
    if let Some((record_dc, record)) = held.get(&ns)
        && (record_dc != dc || *record != allocation)
    {
        return vec![format!(
            "IPAMAllocation {ns}/{name} holds {allocation} from datacenter {dc}, but IPAMPool {name} records {record} from datacenter {record_dc} for this namespace: the allocator writes this object from the pool's record; delete it to have it written again"
        )];
    }
    // A record was checked against every holder when it was written: an IPAMAllocation that
    // came in since without a record (past a webhook that was down) must not keep the
    // allocator from writing the record's object; that one is refused on its own.
    let others = if held.contains_key(&ns) {
        in_datacenter(&held, dc)
    } else {
        holders(&held, of_pool(&name, objects), dc)
    };
    check_allocation(&checked, &others, &ns, &allocation)
        .into_iter()
        .map(|p| format!("IPAMAllocation {ns}/{name} ({allocation}): {p}"))
        .collect()
}
