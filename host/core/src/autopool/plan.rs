//! One reconcile pass over every workload and auto pool, as a list of actions. Pure: the
//! controller gathers the inputs from its index, reads claims when asked, and carries the
//! actions out (creates if absent, updates and deletes with resourceVersion preconditions).

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;

use super::carve::{SubnetSpace, carve, resize};
use super::{
    IpNumber, MANAGED_BY, MANAGER, RECLAIM_LABEL, check_label_values, labels, pool_name, pool_spec,
};
use crate::addr::{AddrSet, IpFamily};
use crate::policy::Application;
use crate::pool::Subnet;
use crate::spec::{IpPoolSpec, auto_pool_labels};

/// A workload as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub app: Application,
    /// Pods it runs at once (what counts per kind is the index's choice).
    pub replicas: u64,
    /// Being deleted: its pools go as if it were gone.
    pub deleting: bool,
    /// What its pod template's annotations ask for; `Err` (why) when they cannot be read: its
    /// pools are then left exactly as they are.
    pub wants: Result<Wants, String>,
}

/// What a workload's annotations ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wants {
    /// Empty when the workload names no Subnet (its former auto pools go).
    pub subnets: Vec<SubnetWant>,
    pub ip_number: IpNumber,
    pub reclaim: bool,
}

/// One Subnet named by a workload for one family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubnetWant {
    pub subnet: String,
    pub family: IpFamily,
    /// How many of each pod's NICs name it for this family.
    pub nics: u64,
}

/// An IPPool object as the planner sees it.
#[derive(Clone, Debug)]
pub struct PoolView {
    pub name: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub terminating: bool,
    /// What it lists as far as that can be read (an invalid pool's readable entries too):
    /// carving never takes them. `None`: nothing can be read.
    pub addresses: Option<AddrSet>,
    /// Its spec, when it passed core's checks; else why not.
    pub spec: Result<IpPoolSpec, String>,
}

impl PoolView {
    /// The workload and Subnet of a pool this controller created, from its labels.
    fn managed_owner(&self) -> Option<(Application, &str)> {
        let l = &self.labels;
        if l.get(MANAGED_BY).map(String::as_str) != Some(MANAGER) {
            return None;
        }
        Some((
            Application {
                kind: l.get(auto_pool_labels::APPLICATION_KIND)?.clone(),
                namespace: l.get(auto_pool_labels::APPLICATION_NAMESPACE)?.clone(),
                name: l.get(auto_pool_labels::APPLICATION_NAME)?.clone(),
            },
            l.get(auto_pool_labels::OWNER_SUBNET)?,
        ))
    }
}

/// Everything one pass decides on.
pub struct Inputs<'a> {
    pub workloads: &'a [Workload],
    /// Every Subnet by name: checked, or why it is invalid.
    pub subnets: &'a BTreeMap<String, Result<Subnet, String>>,
    pub pools: &'a [PoolView],
    /// What live ReservedIPs reserve, per family.
    pub reserved_v4: &'a AddrSet,
    pub reserved_v6: &'a AddrSet,
    /// Addresses of pools written by earlier passes that `pools` may not show yet (the watch
    /// lags the writes): never carved.
    pub pending: &'a [AddrSet],
    /// The owner kinds whose every object `workloads` lists. An auto pool whose owner is of
    /// another kind (one the controller no longer follows: its API was removed, or RBAC no
    /// longer lets it be read) is left exactly as it is, never deleted as if its owner were
    /// gone.
    pub followed_kinds: &'a BTreeSet<String>,
}

/// What the controller does, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create the pool if absent.
    Create {
        app: Application,
        name: String,
        labels: BTreeMap<String, String>,
        spec: IpPoolSpec,
    },
    /// Replace the pool at `resource_version`.
    Update {
        app: Application,
        name: String,
        resource_version: String,
        labels: BTreeMap<String, String>,
        spec: IpPoolSpec,
        added: u64,
        removed: u64,
        /// Addresses it should give back that claims still hold.
        unreturned: u64,
    },
    /// Delete the pool at `resource_version` (its finalizer keeps it while claims remain).
    Delete {
        app: Application,
        name: String,
        resource_version: String,
    },
    /// The workload's request cannot be met for `subnet` (or at all): an Event and a log line;
    /// its pools stay as they are.
    Refuse {
        app: Application,
        subnet: Option<String>,
        reason: String,
    },
    /// Nothing to do until something else happens (a pool still being deleted).
    Wait { app: Application, reason: String },
    /// The pool of a workload that is gone is deleted once its addresses are released: its
    /// last pods are still terminating (the admission webhook refuses deleting a pool that holds
    /// addresses, and nothing else would ask again when the claims go, so pass again soon).
    WaitForRelease {
        app: Application,
        name: String,
        /// How many of its addresses claims still hold.
        held: u64,
    },
}

fn describe(app: &Application) -> String {
    format!("{} {}/{}", app.kind, app.namespace, app.name)
}

/// Plans one pass. `claimed(addresses)` returns which of `addresses` claims hold; it is called
/// only for pools that exist.
pub fn plan(inputs: &Inputs, claimed: &mut dyn FnMut(&AddrSet) -> AddrSet) -> Vec<Action> {
    let mut taken = [AddrSet::empty(IpFamily::V4), AddrSet::empty(IpFamily::V6)];
    let slot = |f: IpFamily| usize::from(f == IpFamily::V6);
    for set in inputs
        .pools
        .iter()
        .filter_map(|p| p.addresses.as_ref())
        .chain(inputs.pending)
    {
        let i = slot(set.family());
        taken[i] = taken[i].union(set);
    }
    let by_name: BTreeMap<&str, &PoolView> =
        inputs.pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut spaces: BTreeMap<&str, SubnetSpace> = BTreeMap::new();
    // Pools a workload names (or may name: its annotations cannot be read): never deleted.
    let mut kept: BTreeSet<String> = BTreeSet::new();
    let mut actions = Vec::new();

    let mut workloads: Vec<&Workload> = inputs.workloads.iter().collect();
    workloads.sort_by(|a, b| a.app.cmp(&b.app));
    for w in workloads {
        if w.deleting {
            continue;
        }
        let app = &w.app;
        let wants = match &w.wants {
            Ok(wants) => wants,
            Err(reason) => {
                for p in inputs.pools {
                    if p.managed_owner().is_some_and(|(a, _)| &a == app) {
                        kept.insert(p.name.clone());
                    }
                }
                actions.push(Action::Refuse {
                    app: app.clone(),
                    subnet: None,
                    reason: reason.clone(),
                });
                continue;
            }
        };
        for want in &wants.subnets {
            let name = pool_name(app, &want.subnet, want.family);
            kept.insert(name.clone());
            let refuse = |reason: String| Action::Refuse {
                app: app.clone(),
                subnet: Some(want.subnet.clone()),
                reason,
            };
            if let Err(reason) = check_label_values(app, &want.subnet) {
                actions.push(refuse(reason.to_string()));
                continue;
            }
            let subnet = match inputs.subnets.get(&want.subnet) {
                None => {
                    actions.push(refuse(format!(
                        "Subnet {} does not exist: create it, or correct the name in the \
                         annotation",
                        want.subnet
                    )));
                    continue;
                }
                Some(Err(why)) => {
                    actions.push(refuse(format!(
                        "Subnet {} cannot be carved from ({why}): no pool is created or \
                         resized from it until that changes",
                        want.subnet
                    )));
                    continue;
                }
                Some(Ok(s)) => s,
            };
            if subnet.family != want.family {
                actions.push(refuse(format!(
                    "Subnet {} holds {} addresses but the annotation names it under {}",
                    want.subnet, subnet.family, want.family
                )));
                continue;
            }
            let size = wants.ip_number.addresses(w.replicas, want.nics);
            let i = slot(want.family);
            let space = spaces.entry(&want.subnet).or_insert_with(|| {
                let reserved = match want.family {
                    IpFamily::V4 => inputs.reserved_v4,
                    IpFamily::V6 => inputs.reserved_v6,
                };
                SubnetSpace::new(subnet, reserved, &taken[i])
            });
            let ours = labels(app, &want.subnet, wants.reclaim);
            let existing = by_name.get(name.as_str()).copied();
            let Some(pool) = existing else {
                if let Some(other) = nested_subnet(inputs.pools, subnet) {
                    actions.push(refuse(format!(
                        "IPPool {name} is not created: IPPool {} has subnet {}, which overlaps \
                         Subnet {}'s {} without being equal, and agents refuse a pool whose \
                         subnet overlaps another's: give them one subnet, or disjoint ones",
                        other.0, other.1, want.subnet, subnet.subnet
                    )));
                    continue;
                }
                match carve(space, size) {
                    Ok(ips) => {
                        take(&mut spaces, &mut taken[i], &ips);
                        actions.push(Action::Create {
                            app: app.clone(),
                            name,
                            labels: ours,
                            spec: pool_spec(subnet, &ips),
                        });
                    }
                    Err(too_small) => actions.push(refuse(format!(
                        "IPPool {name} ({size} addresses for {}) is not created: {too_small}",
                        describe(app)
                    ))),
                }
                continue;
            };
            if pool.managed_owner() != Some((app.clone(), want.subnet.as_str())) {
                actions.push(refuse(format!(
                    "IPPool {name} exists but is not this workload's auto pool (its labels \
                     name another owner, or allot-controller did not create it): rename or \
                     delete it"
                )));
                continue;
            }
            if pool.terminating {
                actions.push(Action::Wait {
                    app: app.clone(),
                    reason: format!(
                        "IPPool {name} is being deleted (claims still hold addresses): it is \
                         carved again once it is gone"
                    ),
                });
                continue;
            }
            let (spec, current) = match (&pool.spec, &pool.addresses) {
                (Ok(spec), Some(current)) if current.family() == want.family => (spec, current),
                (Err(why), _) => {
                    actions.push(refuse(format!(
                        "auto pool {name} is invalid ({why}): correct or delete it"
                    )));
                    continue;
                }
                _ => {
                    actions.push(refuse(format!(
                        "auto pool {name} does not hold {} addresses: delete it to have it \
                         carved again",
                        want.family
                    )));
                    continue;
                }
            };
            let held = claimed(current);
            let resized = match resize(space, current, &held, size) {
                Ok(r) => r,
                Err(too_small) => {
                    actions.push(refuse(format!(
                        "IPPool {name} is not grown to {size} addresses for {}: {too_small}",
                        describe(app)
                    )));
                    continue;
                }
            };
            take(&mut spaces, &mut taken[i], &resized.added);
            // What the controller owns in the spec follows the Subnet; the rest (a user's
            // `disable`, affinities) stays.
            let fresh = pool_spec(subnet, &resized.ips);
            let new_spec = IpPoolSpec {
                ip_version: fresh.ip_version,
                subnet: fresh.subnet,
                ips: fresh.ips,
                gateway: fresh.gateway,
                routes: fresh.routes,
                ..spec.clone()
            };
            let mut new_labels = pool.labels.clone();
            new_labels.extend(ours);
            if new_spec != *spec || new_labels != pool.labels {
                actions.push(Action::Update {
                    app: app.clone(),
                    name,
                    resource_version: pool.resource_version.clone(),
                    labels: new_labels,
                    spec: new_spec,
                    added: resized.added.len(),
                    removed: resized.removed.len(),
                    unreturned: resized.unreturned,
                });
            } else if resized.unreturned > 0 {
                actions.push(Action::Wait {
                    app: app.clone(),
                    reason: format!(
                        "IPPool {name} holds {} addresses more than {size}: claims hold them; \
                         they are returned once released",
                        resized.unreturned
                    ),
                });
            }
        }
    }

    // Auto pools no workload names any more: deleted, unless the workload (or, when it is gone,
    // the pool's label) says ippool-reclaim "false".
    let live: BTreeMap<&Application, &Workload> = inputs
        .workloads
        .iter()
        .filter(|w| !w.deleting)
        .map(|w| (&w.app, w))
        .collect();
    for pool in inputs.pools {
        let Some((app, _)) = pool.managed_owner() else {
            continue;
        };
        if kept.contains(&pool.name)
            || pool.terminating
            || !inputs.followed_kinds.contains(&app.kind)
        {
            continue;
        }
        let reclaim = match live.get(&app).map(|w| &w.wants) {
            Some(Ok(wants)) => wants.reclaim,
            _ => pool.labels.get(RECLAIM_LABEL).map(String::as_str) != Some("false"),
        };
        if reclaim {
            let held = pool.addresses.as_ref().map_or(0, |a| claimed(a).len());
            if held > 0 {
                actions.push(Action::WaitForRelease {
                    app,
                    name: pool.name.clone(),
                    held,
                });
                continue;
            }
            actions.push(Action::Delete {
                app,
                name: pool.name.clone(),
                resource_version: pool.resource_version.clone(),
            });
        }
    }
    actions
}

/// A pool whose subnet overlaps `subnet`'s without being equal (agents keep only one of two
/// such pools), with that subnet.
fn nested_subnet(pools: &[PoolView], subnet: &Subnet) -> Option<(String, IpNet)> {
    pools.iter().find_map(|p| {
        let net = p
            .spec
            .as_ref()
            .ok()?
            .subnet
            .trim()
            .parse::<IpNet>()
            .ok()?
            .trunc();
        let nested = net != subnet.subnet
            && (net.contains(&subnet.subnet.network()) || subnet.subnet.contains(&net.network()));
        nested.then(|| (p.name.clone(), net))
    })
}

/// Marks `ips` taken in the family's running total and in every Subnet's space of that family
/// (Subnets may overlap).
fn take(spaces: &mut BTreeMap<&str, SubnetSpace>, taken: &mut AddrSet, ips: &AddrSet) {
    if ips.is_empty() {
        return;
    }
    *taken = taken.union(ips);
    for space in spaces.values_mut() {
        if space.family() == ips.family() {
            space.take(ips);
        }
    }
}
