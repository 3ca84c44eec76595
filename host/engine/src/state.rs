//! The engine's in-memory view: the pools in force with their free-address indexes, kept true
//! by the store's change feed, plus the retired pool versions that still serve claims.
//!
//! Everything here is a hint about the store, which is the truth: an index that is wrong for a
//! moment costs a lost create-if-absent race and a retry, never a duplicate address.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::free::FreeIndex;
use allot_core::addr::{AddrSet, IpFamily, addr_to_u128};
use allot_core::policy::Inventory;
use allot_core::pool::{Pool, Reserved, Subnet, reserved_set};
use allot_core::store::{Change, ChangeKind, Snapshot};

use crate::LoadError;

pub(super) struct PoolEntry {
    pub pool: Pool,
    pub assignable: AddrSet,
    /// Free addresses that are not cooling down: handed out first.
    pub index: FreeIndex,
    /// Free addresses released less than the cooldown ago, the one released longest ago first
    /// ([`CoolingKey`]): handed out only when `index` has none left.
    pub cooling: BTreeSet<CoolingKey>,
}

/// Released addresses are told apart to within this many seconds when the cooling ones are
/// handed out: within that, each node goes its own order ([`CoolingKey`]).
const COOLING_TIE_SECONDS: u64 = 5;

/// Where a cooling address stands among its pool's: by the end of its cooldown to within
/// [`COOLING_TIE_SECONDS`], then in an order of this node's own when nodes share the store
/// ([`crate::EngineConfig::spread`]), then exactly. Without that order every node would hand out
/// the same address next (a pool scaled to 0 and back within its cooldown has nothing else), and
/// all but one would lose the race for it, again and again: scaled up to 1,000 pods on 10 nodes,
/// an ADD lost 16 races in a row. Within a few seconds of each other, which goes first does not
/// matter to a neighbour's ARP cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct CoolingKey {
    window: u64,
    order: u64,
    until: u64,
    addr: IpAddr,
}

/// A pool version no longer in force (the pool was deleted, or edited so that it no longer holds
/// some of its claims) that still serves those claims: retried ADDs and CHECKs get the same
/// address, gateway and routes until the claims are released. It takes no new allocations.
pub(super) struct Retired {
    pub pool: Pool,
    pub claims: BTreeSet<IpAddr>,
}

pub(super) struct State {
    pub inventory: Arc<Inventory>,
    /// In inventory order (name order).
    pub pools: Vec<PoolEntry>,
    pub by_name: HashMap<String, usize>,
    /// (first, last, family, pool index) over every pool's assignable ranges, sorted: finds the
    /// pool of an address in O(log ranges).
    ranges: Vec<(u128, u128, IpFamily, usize)>,
    pub retired: Vec<Retired>,
    pub loaded: bool,
    /// The store revision the indexes reflect.
    pub revision: u64,
    /// Released addresses kept out of the indexes until the given unix second (each is also in
    /// its pool's `cooling`).
    cooling: HashMap<IpAddr, u64>,
    /// Addresses taken from an index whose claim is not committed yet.
    pub in_flight: HashSet<IpAddr>,
    /// Of those, the ones taken while cooling down, with the end of their cooldown: one whose
    /// claim is not made cools on.
    taken_cooling: HashMap<IpAddr, u64>,
    cooldown: u64,
    /// [`crate::EngineConfig::spread`]: this node's order of cooling addresses.
    spread: Option<u64>,
    /// The ReservedIPs in force, to name the one that keeps a given address from a pod.
    pub reserved: Vec<Reserved>,
}

/// What [`State::build`] needs besides the new objects.
pub(super) struct Carried<'a> {
    pub generation: u64,
    pub snapshot: &'a Snapshot,
    /// The versions in force until now, and the retired ones: they may keep serving claims.
    pub previous: Vec<&'a Pool>,
    /// Where each pool's round-robin cursor stood (by pool name).
    pub cursors: HashMap<String, IpAddr>,
    pub cooldown: u64,
    pub now: u64,
    /// [`crate::EngineConfig::spread`].
    pub spread: Option<u64>,
}

impl State {
    pub fn empty(cooldown: u64, spread: Option<u64>) -> Self {
        State {
            inventory: Arc::new(Inventory::default()),
            pools: Vec::new(),
            by_name: HashMap::new(),
            ranges: Vec::new(),
            retired: Vec::new(),
            loaded: false,
            revision: 0,
            cooling: HashMap::new(),
            in_flight: HashSet::new(),
            taken_cooling: HashMap::new(),
            cooldown,
            spread,
            reserved: Vec::new(),
        }
    }

    /// A complete view from a snapshot of the store: built without holding the engine's lock.
    pub fn build(
        pools: Vec<Pool>,
        subnets: &[Subnet],
        reserved: &[Reserved],
        carried: Carried<'_>,
    ) -> Result<State, LoadError> {
        let mut names = BTreeSet::new();
        for p in &pools {
            if !names.insert(p.name()) {
                return Err(LoadError::Duplicate {
                    kind: "IPPool",
                    name: p.name().to_string(),
                });
            }
        }
        let mut subnet_names = BTreeSet::new();
        for s in subnets {
            if !subnet_names.insert(s.meta.name.as_str()) {
                return Err(LoadError::Duplicate {
                    kind: "Subnet",
                    name: s.meta.name.clone(),
                });
            }
        }
        let inventory = Arc::new(Inventory::build(
            carried.generation,
            &pools,
            subnets,
            reserved,
        ));
        let reserved_v4 = reserved_set(IpFamily::V4, reserved);
        let reserved_v6 = reserved_set(IpFamily::V6, reserved);
        let mut by_pool: HashMap<String, Pool> = pools
            .into_iter()
            .map(|p| (p.meta.name.clone(), p))
            .collect();
        let mut entries = Vec::with_capacity(inventory.pools.len());
        let mut ranges = Vec::new();
        for (i, ip) in inventory.pools.iter().enumerate() {
            let Some(pool) = by_pool.remove(&ip.name) else {
                return Err(LoadError::Duplicate {
                    kind: "IPPool",
                    name: ip.name.clone(),
                });
            };
            let reserved = match pool.family {
                IpFamily::V4 => &reserved_v4,
                IpFamily::V6 => &reserved_v6,
            };
            let assignable = pool.assignable(reserved);
            for (lo, hi) in assignable.ranges() {
                ranges.push((addr_to_u128(lo), addr_to_u128(hi), pool.family, i));
            }
            let mut index = FreeIndex::new(&assignable);
            let stored = || {
                carried
                    .snapshot
                    .cursors
                    .iter()
                    .find(|(p, _)| *p == ip.name)
                    .map(|&(_, a)| a)
            };
            match (carried.cursors.get(&ip.name), carried.spread) {
                (Some(&cursor), _) => index.resume_after(cursor),
                (None, Some(spread)) => index.scatter(crate::seed_of(&(spread, &ip.name))),
                (None, None) => {
                    if let Some(cursor) = stored() {
                        index.resume_after(cursor);
                    }
                }
            }
            entries.push(PoolEntry {
                index,
                assignable,
                pool,
                cooling: BTreeSet::new(),
            });
        }
        ranges.sort_unstable_by_key(|&(lo, _, f, _)| (f, lo));
        let mut state = State {
            by_name: entries
                .iter()
                .enumerate()
                .map(|(i, e)| (e.pool.meta.name.clone(), i))
                .collect(),
            inventory,
            pools: entries,
            ranges,
            retired: Vec::new(),
            loaded: true,
            revision: carried.snapshot.revision,
            cooling: HashMap::new(),
            in_flight: HashSet::new(),
            taken_cooling: HashMap::new(),
            cooldown: carried.cooldown,
            spread: carried.spread,
            reserved: reserved.to_vec(),
        };

        // Retired versions: a claim the pool in force (by name) no longer holds is served by
        // the previous version that does.
        let mut retired: Vec<Option<Retired>> = carried.previous.iter().map(|_| None).collect();
        for claim in &carried.snapshot.claims {
            if let Some(i) = state.locate(claim.address) {
                state.pools[i].index.remove(claim.address);
            }
            if state.serves(&claim.pool, claim.address) {
                continue;
            }
            let old = carried
                .previous
                .iter()
                .position(|p| p.name() == &*claim.pool && p.ips.contains(claim.address));
            if let Some(k) = old {
                retired[k]
                    .get_or_insert_with(|| Retired {
                        pool: carried.previous[k].clone(),
                        claims: BTreeSet::new(),
                    })
                    .claims
                    .insert(claim.address);
            }
        }
        state.retired = retired.into_iter().flatten().collect();

        for &(address, at) in &carried.snapshot.released {
            let until = at.saturating_add(carried.cooldown);
            if until > carried.now
                && let Some(i) = state.locate(address)
                && state.pools[i].index.remove(address)
            {
                state.cool(i, address, until);
            }
        }
        Ok(state)
    }

    /// Whether the pool in force named `pool` holds `address` (as written in its `ips`).
    fn serves(&self, pool: &str, address: IpAddr) -> bool {
        self.by_name
            .get(pool)
            .is_some_and(|&i| self.pools[i].pool.ips.contains(address))
    }

    /// The pool version that serves a claim: the one in force, else a retired one.
    pub fn pool_of_claim(&self, pool: &str, address: IpAddr) -> Option<&Pool> {
        if self.serves(pool, address) {
            return self.by_name.get(pool).map(|&i| &self.pools[i].pool);
        }
        self.retired
            .iter()
            .find(|r| r.pool.name() == pool && r.claims.contains(&address))
            .map(|r| &r.pool)
    }

    pub fn locate(&self, addr: IpAddr) -> Option<usize> {
        let family = IpFamily::of(addr);
        let n = addr_to_u128(addr);
        let i = self
            .ranges
            .partition_point(|&(lo, _, f, _)| (f, lo) <= (family, n));
        let &(lo, hi, f, pool) = self.ranges.get(i.checked_sub(1)?)?;
        (f == family && lo <= n && n <= hi).then_some(pool)
    }

    /// Takes the next free address of pool `i` that is not cooling down, and marks it in
    /// flight.
    pub fn take(&mut self, i: usize) -> Option<IpAddr> {
        let addr = self.pools[i].index.take_next()?;
        self.in_flight.insert(addr);
        Some(addr)
    }

    /// Takes the address of pool `i` released longest ago among those still cooling down, and
    /// marks it in flight: for when the pool has no other free address left. A cooldown
    /// protects neighbours' stale ARP caches; refusing the pod instead would leave a pool of one
    /// address unusable for the cooldown after every DEL.
    pub fn take_cooling(&mut self, i: usize) -> Option<IpAddr> {
        let CoolingKey { until, addr, .. } = self.pools[i].cooling.pop_first()?;
        self.cooling.remove(&addr);
        self.in_flight.insert(addr);
        self.taken_cooling.insert(addr, until);
        Some(addr)
    }

    /// Takes `addr` of pool `i` out of the cooling ones and marks it in flight, if it is
    /// cooling down there.
    pub fn take_cooling_exact(&mut self, i: usize, addr: IpAddr) -> bool {
        let Some(&until) = self.cooling.get(&addr) else {
            return false;
        };
        let key = self.cooling_key(until, addr);
        if !self.pools[i].cooling.remove(&key) {
            return false;
        }
        self.cooling.remove(&addr);
        self.in_flight.insert(addr);
        self.taken_cooling.insert(addr, until);
        true
    }

    fn cooling_key(&self, until: u64, addr: IpAddr) -> CoolingKey {
        CoolingKey {
            window: until / COOLING_TIE_SECONDS,
            order: self
                .spread
                .map_or(0, |spread| crate::seed_of(&(spread, addr))),
            until,
            addr,
        }
    }

    /// Puts free `addr` of pool `i` among the cooling ones, until `until`.
    fn cool(&mut self, i: usize, addr: IpAddr, until: u64) {
        if let Some(old) = self.cooling.insert(addr, until) {
            let old = self.cooling_key(old, addr);
            self.pools[i].cooling.remove(&old);
        }
        let key = self.cooling_key(until, addr);
        self.pools[i].cooling.insert(key);
    }

    /// Takes `addr` out of the cooling ones, if it is one; returns whether it was.
    fn uncool(&mut self, addr: IpAddr) -> bool {
        let Some(until) = self.cooling.remove(&addr) else {
            return false;
        };
        if let Some(i) = self.locate(addr) {
            let key = self.cooling_key(until, addr);
            self.pools[i].cooling.remove(&key);
        }
        true
    }

    /// Takes `addr` itself out of its pool's index and marks it in flight, if it is free and
    /// not cooling down.
    pub fn take_exact(&mut self, addr: IpAddr) -> bool {
        let Some(i) = self.locate(addr) else {
            return false;
        };
        if !self.pools[i].index.remove(addr) {
            return false;
        }
        self.in_flight.insert(addr);
        true
    }

    /// A taken address whose claim was committed.
    pub fn committed(&mut self, addr: IpAddr) {
        self.in_flight.remove(&addr);
        self.taken_cooling.remove(&addr);
    }

    /// A taken address whose claim was not made: free again at once (it was never handed out),
    /// unless `taken_by_someone` (a lost race: someone else holds it).
    pub fn untake(&mut self, addr: IpAddr, taken_by_someone: bool) {
        self.in_flight.remove(&addr);
        let cooling = self.taken_cooling.remove(&addr);
        if !taken_by_someone && let Some(i) = self.locate(addr) {
            match cooling {
                Some(until) => self.cool(i, addr, until),
                None => {
                    self.pools[i].index.insert(addr);
                }
            }
        }
    }

    /// After a race for `addr` was lost: its pool's cursor jumps to a place chosen by `seed`.
    pub fn scatter(&mut self, addr: IpAddr, seed: u64) {
        if let Some(i) = self.locate(addr) {
            self.pools[i].index.scatter(seed);
        }
    }

    /// Marks an address claimed (by anyone).
    pub fn mark_claimed(&mut self, addr: IpAddr) {
        self.uncool(addr);
        if let Some(i) = self.locate(addr) {
            self.pools[i].index.remove(addr);
        }
    }

    /// Marks an address released at `at`: it cools down before it is handed out again.
    pub fn mark_released(&mut self, addr: IpAddr, at: u64, now: u64) {
        if !self.retired.is_empty() {
            for r in &mut self.retired {
                r.claims.remove(&addr);
            }
            self.retired.retain(|r| !r.claims.is_empty());
        }
        if self.in_flight.contains(&addr) {
            return;
        }
        let Some(i) = self.locate(addr) else {
            return;
        };
        let until = at.saturating_add(self.cooldown);
        if until > now {
            self.pools[i].index.remove(addr);
            self.cool(i, addr, until);
        } else {
            self.uncool(addr);
            self.pools[i].index.insert(addr);
        }
    }

    /// Applies the change feed from the store (changes at or below our revision are skipped).
    pub fn apply(&mut self, changes: &[Change], revision: u64, now: u64) {
        for c in changes {
            if c.revision <= self.revision {
                continue;
            }
            match c.kind {
                ChangeKind::Claimed => self.mark_claimed(c.address),
                ChangeKind::Released => self.mark_released(c.address, c.at, now),
                ChangeKind::Updated => {}
            }
            self.revision = c.revision;
        }
        self.revision = self.revision.max(revision);
        self.expire_cooling(now);
    }

    /// Returns addresses whose cooldown is over to their indexes.
    pub fn expire_cooling(&mut self, now: u64) {
        if self.cooling.is_empty() {
            return;
        }
        let done: Vec<IpAddr> = self
            .cooling
            .iter()
            .filter(|&(_, &until)| until <= now)
            .map(|(&a, _)| a)
            .collect();
        for addr in done {
            self.uncool(addr);
            if !self.in_flight.contains(&addr)
                && let Some(i) = self.locate(addr)
            {
                self.pools[i].index.insert(addr);
            }
        }
    }

    /// Takes over what only the live view knows: addresses in flight stay out of the new
    /// indexes.
    pub fn carry_in_flight(&mut self, in_flight: HashSet<IpAddr>) {
        for &addr in &in_flight {
            if let Some(i) = self.locate(addr) {
                self.pools[i].index.remove(addr);
            }
        }
        self.in_flight = in_flight;
    }

    /// Round-robin cursors by pool name.
    pub fn cursors(&self) -> HashMap<String, IpAddr> {
        self.pools
            .iter()
            .filter_map(|p| Some((p.pool.meta.name.clone(), p.index.last_taken()?)))
            .collect()
    }

    /// Free addresses per pool, cooling ones included: a pool whose free addresses are all
    /// cooling down can still serve a pod.
    pub fn free_counts(&self) -> Vec<u64> {
        (0..self.pools.len()).map(|i| self.free_in(i)).collect()
    }

    /// Free addresses of pool `i`, cooling ones included.
    pub fn free_in(&self, i: usize) -> u64 {
        self.pools[i].index.free_count() + self.cooling_in(i)
    }

    /// Free addresses of pool `i` that are cooling down.
    pub fn cooling_in(&self, i: usize) -> u64 {
        self.pools[i].cooling.len() as u64
    }
}
