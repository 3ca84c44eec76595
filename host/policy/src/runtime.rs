//! Every wasmtime type lives here: the engine, compiled components, warm instances and the
//! limits that keep a hostile policy from hurting the host. The rest of the crate sees plain
//! Rust and allot-core types.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use allot_core::policy::{Decision, Inventory, Request};
use allot_core::{PolicyError, PolicyErrorKind};
use wasmtime::component::Component;
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    Trap,
};

use crate::Limits;
use crate::contract::{self, GuestInventory, HostState};
use crate::slots::{InstanceSlots, Share, Slot};

/// How often the engine's epoch advances; deadlines are whole ticks.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(1);

pub(crate) fn new_engine(limits: &Limits) -> wasmtime::Result<(Engine, Arc<EpochTicker>)> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    // Synchronous WIT: no async machinery on the call path (it halves the cost of a call).
    config.concurrency_support(false);
    let mut pool = PoolingAllocationConfig::default();
    let instances = limits.max_instances;
    pool.total_component_instances(instances)
        .total_core_instances(instances * 8)
        .total_memories(instances * 2)
        .total_tables(instances * 4)
        // The store limiter enforces the cap with a clear error; the pool's own bound sits above
        // it so that the limiter is the one that speaks.
        .max_memory_size(limits.memory_bytes.saturating_add(16 << 20));
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    let engine = Engine::new(&config)?;
    let ticker = EpochTicker::start(&engine);
    Ok((engine, ticker))
}

/// Advances the engine's epoch once per tick of wall-clock time, but only while policy calls
/// are in flight or were a moment ago ([`IDLE_GRACE`]): an idle agent's ticker sleeps on a
/// condition variable instead of waking a thousand times a second, and a busy one is not woken
/// (a futex wake and a context switch, a third of a short decision's cost) for every call. Ticks follow the clock, not the count of sleeps (each sleep
/// overshoots a little, and 100 of them would stretch a 100 ms deadline by several
/// milliseconds); a late wake-up catches up. The first tick after an idle spell comes at once,
/// so a call that woke the ticker is stopped no later than with a ticker that never slept
/// (between its deadline and one tick past it, plus the wake-up), and never before.
pub(crate) struct EpochTicker {
    shared: Arc<TickerShared>,
}

struct TickerShared {
    state: Mutex<TickerState>,
    wake: Condvar,
}

/// How long the ticker keeps ticking after the last call before it sleeps.
const IDLE_GRACE: Duration = Duration::from_millis(20);

#[derive(Default)]
struct TickerState {
    in_flight: usize,
    stopped: bool,
    /// The ticker waits on the condition variable (and must be notified to tick).
    sleeping: bool,
}

impl TickerShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, TickerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl EpochTicker {
    fn start(engine: &Engine) -> Arc<Self> {
        let shared = Arc::new(TickerShared {
            state: Mutex::new(TickerState::default()),
            wake: Condvar::new(),
        });
        let weak = engine.weak();
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("allot-policy-epoch".into())
            .spawn(move || tick_while_busy(&weak, &thread_shared))
            .expect("spawning the epoch thread");
        Arc::new(EpochTicker { shared })
    }

    /// Marks a call in flight until the guard drops; the epoch advances meanwhile.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        let mut state = self.shared.lock();
        state.in_flight += 1;
        if state.sleeping {
            state.sleeping = false;
            self.shared.wake.notify_one();
        }
        InFlight { ticker: self }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.wake.notify_one();
    }
}

pub(crate) struct InFlight<'a> {
    ticker: &'a EpochTicker,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.ticker.shared.lock().in_flight -= 1;
    }
}

fn tick_while_busy(weak: &wasmtime::EngineWeak, shared: &TickerShared) {
    loop {
        {
            let mut state = shared.lock();
            while state.in_flight == 0 && !state.stopped {
                state.sleeping = true;
                state = shared.wake.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            state.sleeping = false;
            if state.stopped {
                return;
            }
        }
        let start = Instant::now();
        let mut ticks: u128 = 0;
        let mut idle_since: Option<Instant> = None;
        loop {
            // Tick 0 is due at once: see the type's comment.
            let due = start.elapsed().as_nanos() / EPOCH_TICK.as_nanos() + 1;
            let Some(engine) = weak.upgrade() else { return };
            while ticks < due {
                engine.increment_epoch();
                ticks += 1;
            }
            drop(engine);
            {
                let state = shared.lock();
                if state.stopped {
                    return;
                }
                if state.in_flight > 0 {
                    idle_since = None;
                } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= IDLE_GRACE {
                    break;
                }
            }
            let next = start + Duration::from_nanos((ticks * EPOCH_TICK.as_nanos()) as u64);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }
}

/// Called when a call's epoch deadline passes: stops the guest only once the wall-clock
/// deadline has passed too; otherwise extends the epoch deadline to the time that is left.
fn wall_clock_deadline(
    ctx: wasmtime::StoreContextMut<'_, HostState>,
) -> wasmtime::Result<wasmtime::UpdateDeadline> {
    let now = Instant::now();
    Ok(match ctx.data().wall_deadline {
        Some(deadline) if now < deadline => {
            let left = deadline - now;
            wasmtime::UpdateDeadline::Continue(
                (left.as_micros() / EPOCH_TICK.as_micros()) as u64 + 1,
            )
        }
        _ => wasmtime::UpdateDeadline::Interrupt,
    })
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            self.memory_cap_hit = Some(desired);
            wasmtime::bail!(
                "policy tried to grow its memory to {desired} bytes, above the cap of {} bytes",
                self.memory_cap
            );
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

/// A compiled component, linked and ready to instantiate.
pub(crate) struct Prepared {
    engine: Engine,
    ticker: Arc<EpochTicker>,
    pre: contract::Pre,
    name: Arc<str>,
    limits: Limits,
    slots: Arc<InstanceSlots>,
    share: Share,
    warm: Mutex<Vec<Warm>>,
    /// The inventory converted for the guest, shared by every instance of this generation.
    converted: Mutex<Option<(Arc<Inventory>, Arc<GuestInventory>)>>,
}

/// A live instance with the inventory it last loaded.
struct Warm {
    store: Store<HostState>,
    bindings: contract::Instance,
    loaded: Option<Arc<Inventory>>,
    /// Last, so that it is freed after the store (and with it wasmtime's slot).
    _slot: Slot,
}

impl Prepared {
    pub(crate) fn new(
        engine: &Engine,
        ticker: &Arc<EpochTicker>,
        slots: &Arc<InstanceSlots>,
        share: Share,
        component: &Component,
        name: &str,
        limits: Limits,
    ) -> wasmtime::Result<Self> {
        let pre = contract::Pre::new(engine, component)?;
        Ok(Prepared {
            engine: engine.clone(),
            ticker: ticker.clone(),
            pre,
            name: name.into(),
            limits,
            slots: slots.clone(),
            share,
            warm: Mutex::new(Vec::new()),
            converted: Mutex::new(None),
        })
    }

    /// Names of the component's imports other than the allot contract's.
    pub(crate) fn foreign_imports(engine: &Engine, component: &Component) -> Vec<String> {
        component
            .component_type()
            .imports(engine)
            .map(|(name, _)| name.to_string())
            .filter(|name| !name.starts_with("allot:policy/"))
            .collect()
    }

    fn pop_warm(&self) -> Option<Warm> {
        self.warm.lock().unwrap_or_else(|p| p.into_inner()).pop()
    }

    /// A warm instance, else a new one if the policy's share of the pool has a free slot, else
    /// the first of either within the deadline (see `slots`).
    fn take_instance(&self) -> Result<Warm, PolicyError> {
        if let Some(warm) = self.pop_warm() {
            return Ok(warm);
        }
        let until = Instant::now() + self.limits.deadline;
        let mut counts = self.slots.lock();
        loop {
            // Checked again under the slots' lock: whoever returns an instance notifies under it.
            if let Some(warm) = self.pop_warm() {
                return Ok(warm);
            }
            if let Some(slot) = self.slots.try_take(&mut counts, self.share) {
                drop(counts);
                return self.new_warm(slot);
            }
            counts = match self.slots.wait_until(counts, until) {
                Some(counts) => counts,
                None => {
                    return Err(PolicyError::new(
                        PolicyErrorKind::Deadline,
                        format!(
                            "policy {} got no instance within its deadline of {} ms: all {} \
                             instances it may have are busy; raise the instance limit or make \
                             the policy's calls shorter",
                            self.name,
                            self.limits.deadline.as_millis(),
                            self.slots.share_size(self.share)
                        ),
                    ));
                }
            };
        }
    }

    fn new_warm(&self, slot: Slot) -> Result<Warm, PolicyError> {
        let state = HostState {
            policy_name: self.name.clone(),
            memory_cap: self.limits.memory_bytes,
            memory_cap_hit: None,
            log_lines: 0,
            last_panic: None,
            wall_deadline: Some(Instant::now() + self.limits.deadline),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| s);
        store.set_epoch_deadline(self.deadline_ticks());
        store.epoch_deadline_callback(wall_clock_deadline);
        let bindings = self.pre.instantiate(&mut store).map_err(|e| {
            PolicyError::new(
                PolicyErrorKind::Load,
                format!("could not instantiate policy {}: {e:#}", self.name),
            )
        })?;
        Ok(Warm {
            store,
            bindings,
            loaded: None,
            _slot: slot,
        })
    }

    fn deadline_ticks(&self) -> u64 {
        (self.limits.deadline.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64 + 1
    }

    fn converted(&self, inventory: &Arc<Inventory>) -> Arc<GuestInventory> {
        let mut slot = self.converted.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some((inv, wit)) if Arc::ptr_eq(inv, inventory) => wit.clone(),
            _ => {
                let wit = Arc::new(self.pre.convert_inventory(inventory));
                *slot = Some((inventory.clone(), wit.clone()));
                wit
            }
        }
    }

    pub(crate) fn decide(
        &self,
        inventory: &Arc<Inventory>,
        request: &Request,
    ) -> Result<Decision, PolicyError> {
        let _in_flight = self.ticker.enter();
        let mut warm = self.take_instance()?;
        let started = Instant::now();
        match self.call(&mut warm, inventory, request) {
            Ok(verdict) => {
                self.warm
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(warm);
                self.slots.notify_returned();
                let decision = verdict?;
                decision.validate(inventory, request)?;
                Ok(decision)
            }
            // A trapped instance may hold any state: discard it.
            Err(e) => Err(self.classify(&warm, e, started.elapsed())),
        }
    }

    /// Ok(verdict) when the guest returned normally; Err on a trap.
    fn call(
        &self,
        warm: &mut Warm,
        inventory: &Arc<Inventory>,
        request: &Request,
    ) -> wasmtime::Result<Result<Decision, PolicyError>> {
        let state = warm.store.data_mut();
        state.log_lines = 0;
        state.last_panic = None;
        state.wall_deadline = Some(Instant::now() + self.limits.deadline);
        warm.store.set_epoch_deadline(self.deadline_ticks());
        if !warm
            .loaded
            .as_ref()
            .is_some_and(|l| Arc::ptr_eq(l, inventory))
        {
            let converted = self.converted(inventory);
            warm.bindings.load_inventory(&mut warm.store, &converted)?;
            warm.loaded = Some(inventory.clone());
        }
        warm.bindings
            .decide(&mut warm.store, inventory.generation, request)
    }

    fn classify(&self, warm: &Warm, err: wasmtime::Error, elapsed: Duration) -> PolicyError {
        let name = &self.name;
        let state = warm.store.data();
        if let Some(desired) = state.memory_cap_hit {
            return PolicyError::new(
                PolicyErrorKind::MemoryLimit,
                format!(
                    "policy {name} tried to grow its memory to {desired} bytes, above the cap of {} \
                     bytes; raise the cap or fix the policy",
                    self.limits.memory_bytes
                ),
            );
        }
        if err.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            return PolicyError::new(
                PolicyErrorKind::Deadline,
                format!(
                    "policy {name} ran past its deadline of {} ms (stopped after {} ms)",
                    self.limits.deadline.as_millis(),
                    elapsed.as_millis()
                ),
            );
        }
        if let Some(panic) = &state.last_panic {
            return PolicyError::new(
                PolicyErrorKind::Trap,
                format!("policy {name} panicked: {panic}"),
            );
        }
        PolicyError::new(
            PolicyErrorKind::Trap,
            format!("policy {name} trapped: {err:#}"),
        )
    }

    /// The contract version the component was built against, e.g. "0.3.0".
    pub(crate) fn contract_version(&self) -> &'static str {
        self.pre.version()
    }

    /// Instances kept warm right now (for tests and metrics).
    pub(crate) fn warm_instances(&self) -> usize {
        self.warm.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
