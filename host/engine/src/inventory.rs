//! Installing an inventory and keeping the free indexes true: full rebuilds from a store
//! snapshot (off the state lock), the change feed, periodic resyncs, and usage reports.

use std::collections::BTreeSet;

use crate::state::{Carried, State};
use crate::{Engine, Installed, LoadError, PoolState, PoolUsage, lock};
use allot_core::policy::Policy;
use allot_core::pool::{Pool, Reserved, Subnet};
use allot_core::store::{Changes, Store, StoreError};

impl<S: Store, P: Policy> Engine<S, P> {
    /// Installs a new inventory (checked pools, subnets, reservations) and rebuilds the free
    /// indexes from a store snapshot, without holding up allocations while it reads the store.
    /// Claims are never dropped: a pool deleted or edited while it holds claims keeps serving
    /// them (as a retired version) until they are released. Installing the same objects again
    /// changes nothing. Returns whether anything changed.
    pub fn load(
        &self,
        pools: Vec<Pool>,
        subnets: Vec<Subnet>,
        reserved: Vec<Reserved>,
    ) -> Result<bool, LoadError> {
        let mut installed = lock(&self.installed);
        if installed.generation > 0 && same_objects(&installed, &pools, &subnets, &reserved) {
            return Ok(false);
        }
        let generation = installed.generation + 1;
        self.rebuild(&mut installed, pools, subnets, reserved, generation)?;
        Ok(true)
    }

    /// Rebuilds the indexes from a fresh store snapshot (the change feed's safety net).
    pub fn resync(&self) -> Result<(), LoadError> {
        let mut installed = lock(&self.installed);
        if installed.generation == 0 {
            return Ok(());
        }
        let (pools, subnets, reserved) = (
            installed.pools.clone(),
            installed.subnets.clone(),
            installed.reserved.clone(),
        );
        let generation = installed.generation;
        self.rebuild(&mut installed, pools, subnets, reserved, generation)
    }

    fn rebuild(
        &self,
        installed: &mut Installed,
        pools: Vec<Pool>,
        subnets: Vec<Subnet>,
        reserved: Vec<Reserved>,
        generation: u64,
    ) -> Result<(), LoadError> {
        let now = self.now();
        let snapshot = self
            .store
            .snapshot(now.saturating_sub(self.config.cooldown))?;
        let (previous, cursors, inventory) = {
            let state = self.state();
            let previous: Vec<Pool> = state
                .pools
                .iter()
                .map(|p| p.pool.clone())
                .chain(state.retired.iter().map(|r| r.pool.clone()))
                .collect();
            (previous, state.cursors(), state.inventory.clone())
        };
        let mut built = State::build(
            pools.clone(),
            &subnets,
            &reserved,
            Carried {
                generation,
                snapshot: &snapshot,
                previous: previous.iter().collect(),
                cursors,
                cooldown: self.config.cooldown,
                now,
                spread: self.config.spread,
            },
        )?;
        if generation == installed.generation {
            // A resync: same objects, same inventory (policies need not reload it).
            built.inventory = inventory;
        }
        let mut state = self.state();
        // What happened while we built: a short read under the lock.
        match self.store.changes_since(snapshot.revision)? {
            Changes::Since { changes, revision } => built.apply(&changes, revision, now),
            Changes::Compacted => {
                return Err(LoadError::Store(StoreError::unavailable(
                    "the store compacted its change feed during a rebuild; retrying later",
                )));
            }
        }
        for (name, cursor) in state.cursors() {
            if let Some(&i) = built.by_name.get(&name) {
                built.pools[i].index.resume_after(cursor);
            }
        }
        built.carry_in_flight(std::mem::take(&mut state.in_flight));
        *state = built;
        drop(state);
        *installed = Installed {
            pools,
            subnets,
            reserved,
            generation,
            last_resync: now,
        };
        Ok(())
    }

    /// Brings the indexes up to date with the store's change feed (a resync when the feed was
    /// compacted past us), and ends finished cooldowns.
    pub fn sync(&self) -> Result<(), LoadError> {
        let (from, loaded) = {
            let state = self.state();
            (state.revision, state.loaded)
        };
        if !loaded {
            return Ok(());
        }
        match self.store.changes_since(from)? {
            Changes::Since { changes, revision } => {
                self.state().apply(&changes, revision, self.now());
                Ok(())
            }
            Changes::Compacted => self.resync(),
        }
    }

    /// The agent's periodic work: follow the change feed, and rebuild from a snapshot when the
    /// periodic resync is due.
    pub fn tick(&self) -> Result<(), LoadError> {
        let due = {
            let installed = lock(&self.installed);
            installed.generation > 0
                && installed.last_resync.saturating_add(self.config.resync) <= self.now()
        };
        if due { self.resync() } else { self.sync() }
    }

    /// Pools that hold claims (in force or retired), by name: they win overlaps when the
    /// configuration changes.
    pub fn serving_pools(&self) -> BTreeSet<String> {
        let state = self.state();
        let mut names: BTreeSet<String> = state
            .retired
            .iter()
            .map(|r| r.pool.name().to_string())
            .collect();
        for (i, p) in state.pools.iter().enumerate() {
            if p.assignable.len() > state.free_in(i) {
                names.insert(p.pool.name().to_string());
            }
        }
        names
    }

    pub fn usage(&self) -> Vec<PoolUsage> {
        let cut_short = lock(&self.cut_short).clone();
        let state = self.state();
        let mut usage: Vec<PoolUsage> = state
            .pools
            .iter()
            .enumerate()
            .map(|(i, p)| PoolUsage {
                name: p.pool.meta.name.clone(),
                family: p.pool.family,
                total: p.assignable.len(),
                free: state.free_in(i),
                cooling: state.cooling_in(i),
                cooldown_cut_short: cut_short.get(p.pool.name()).copied().unwrap_or(0),
                claims: 0,
                state: if p.pool.terminating() {
                    PoolState::Terminating
                } else if p.pool.spec.disable {
                    PoolState::Disabled
                } else {
                    PoolState::Serving
                },
            })
            .collect();
        usage.extend(state.retired.iter().map(|r| PoolUsage {
            name: r.pool.meta.name.clone(),
            family: r.pool.family,
            total: 0,
            free: 0,
            cooling: 0,
            cooldown_cut_short: 0,
            claims: r.claims.len() as u64,
            state: PoolState::Terminating,
        }));
        usage
    }
}

fn same_objects(
    installed: &Installed,
    pools: &[Pool],
    subnets: &[Subnet],
    reserved: &[Reserved],
) -> bool {
    fn sorted<T, K: PartialEq>(items: &[T], key: impl Fn(&T) -> (String, K)) -> Vec<(String, K)> {
        let mut keys: Vec<_> = items.iter().map(key).collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        keys
    }
    let pool = |p: &Pool| (p.meta.name.clone(), (p.meta.clone(), p.spec.clone()));
    let subnet = |s: &Subnet| (s.meta.name.clone(), (s.meta.clone(), s.spec.clone()));
    let res = |r: &Reserved| (r.meta.name.clone(), (r.meta.clone(), r.ips.clone()));
    sorted(&installed.pools, pool) == sorted(pools, pool)
        && sorted(&installed.subnets, subnet) == sorted(subnets, subnet)
        && sorted(&installed.reserved, res) == sorted(reserved, res)
}
