//! The simulator: one seeded run of several nodes' agents over one SQLite claim store.
//!
//! Each node runs allot's allocation engine (`allot-engine`, what the agent serves CNI ADD,
//! DEL, CHECK and GC with) over the real SQLite store (`allot-store`) in a temporary
//! directory, on a logical clock. The agent's own glue around the engine is reproduced in
//! [`verbs`]: an ADD first settles a DEL remembered in the node's journal for its attachment,
//! a DEL the store cannot take is journaled and answered, the journal is replayed at start.
//! One scheduler, drawing from one seeded generator, decides every step: which client verb
//! runs next, and what fault strikes between two store steps ([`store`]). Nothing runs on
//! another thread and nothing sleeps, so a seed replays exactly (as in FoundationDB's
//! simulation testing); a run ends by healing every fault, serving every pending DEL and
//! running GC past its grace period, then reading the store: the history's quiescent state.

mod policy;
pub mod rng;
pub mod store;
mod verbs;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use allot_core::Pool;
use allot_core::spec::{IpPoolSpec, ObjectMeta};
use allot_core::store::{Attachment, Clock, Store};
use allot_engine::{DelRequest, Engine, EngineConfig};
use allot_store::{KubeConfig, KubeStore, SqliteStore};
use allot_test_apiserver::ApiServer;

use crate::checker::{self, Violation};
use crate::history::{History, Op, Outcome, StoredClaim, Verb};
use policy::CniDefaultsPolicy;
use store::{Between, FaultCounts, Faults, FaultyStore, Rates};

/// What is simulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// One node's agent with its embedded store: the standalone deployment.
    SqliteNode,
    /// Three nodes' agents sharing one store, their operations interleaved between store
    /// steps: what a shared store (etcd, the Kubernetes store) must survive.
    SqliteShared,
    /// Three nodes' agents on the Kubernetes store (IPBlocks written with resourceVersion
    /// compare-and-swap, read from a watch-fed mirror) against the in-memory API server
    /// (`tests/apiserver`). Seeded, but not exactly replayable: each store's client and watch
    /// run on a tokio runtime of their own, so when a node's mirror sees another's write
    /// depends on thread timing.
    KubeShared,
    /// [`Scenario::KubeShared`] with API errors too: the API server refuses one or two
    /// requests of a verb on IPBlocks now and then (409, 429, 500, 503). It found that a DEL
    /// of a dual-stack attachment whose second block refused was reported unavailable while
    /// the first block's release had committed (see docs/robustness.md, fixed by
    /// `StoreError::Partial`).
    KubeApiFaults,
}

impl Scenario {
    pub const ALL: [Scenario; 4] = [
        Scenario::SqliteNode,
        Scenario::SqliteShared,
        Scenario::KubeShared,
        Scenario::KubeApiFaults,
    ];

    /// The scenarios that must find no violation (`--scenario all`, `make unit`).
    pub const CAMPAIGN: [Scenario; 4] = [
        Scenario::SqliteNode,
        Scenario::SqliteShared,
        Scenario::KubeShared,
        Scenario::KubeApiFaults,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::SqliteNode => "sqlite-node",
            Scenario::SqliteShared => "sqlite-shared",
            Scenario::KubeShared => "kube-shared",
            Scenario::KubeApiFaults => "kube-api-faults",
        }
    }

    pub fn parse(name: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|s| s.name() == name)
    }

    fn nodes(self) -> usize {
        match self {
            Scenario::SqliteNode => 1,
            Scenario::SqliteShared | Scenario::KubeShared | Scenario::KubeApiFaults => 3,
        }
    }

    /// Whether a seed replays exactly (see [`Scenario::KubeShared`]).
    pub fn deterministic(self) -> bool {
        matches!(self, Scenario::SqliteNode | Scenario::SqliteShared)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A deliberately broken store or agent, to prove the checker catches one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// A DEL also silently releases one claim of another attachment, now and then: the bug
    /// of an IPAM that frees by the wrong key.
    ReleaseAnother,
    /// A claim of an address already claimed overwrites the claim instead of failing: a
    /// create-if-absent that is not one.
    DoubleAllocate,
    /// An ADD does not settle its attachment's journaled DEL first: the DEL, replayed later,
    /// releases what the re-ADD of a reused container ID was given (an allot bug once: the
    /// journal replayed after a re-ADD).
    AddBeforeJournal,
}

/// How a run goes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Workload steps before healing (each one client verb, a GC, a tick, a kill or a jump
    /// of the clock).
    pub steps: usize,
    /// Break the store on purpose (to test the checker).
    pub sabotage: Option<Sabotage>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            steps: 60,
            sabotage: None,
        }
    }
}

/// What one seed did and what the checker found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub scenario: Scenario,
    pub history: History,
    pub violations: Vec<Violation>,
    pub faults: FaultCounts,
    /// Create-if-absent races the engines lost to another node and retried.
    pub lost_races: u64,
}

impl Report {
    /// Client operations in the history (crashes and restarts not counted).
    pub fn operations(&self) -> usize {
        self.history
            .ops
            .iter()
            .filter(|o| !matches!(o.verb, Verb::Crash | Verb::Restart))
            .count()
    }

    pub fn crashes(&self) -> usize {
        self.history
            .ops
            .iter()
            .filter(|o| o.verb == Verb::Crash)
            .count()
    }
}

/// Runs `seed` of `scenario`, with its store in a fresh directory under /dev/shm (or the
/// system's temporary directory), and checks its history.
pub fn run(seed: u64, scenario: Scenario, options: &Options) -> anyhow::Result<Report> {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::Builder::new()
            .prefix("allot-sim-")
            .tempdir_in(shm)?
    } else {
        tempfile::Builder::new().prefix("allot-sim-").tempdir()?
    };
    let backend = match scenario {
        Scenario::SqliteNode | Scenario::SqliteShared => {
            Backend::Sqlite(dir.path().join("allot.db"))
        }
        Scenario::KubeShared | Scenario::KubeApiFaults => Backend::Kube(ApiServer::new()),
    };
    let world = World::new(seed, scenario, backend, options.sabotage);
    for n in 0..world.nodes.len() {
        world.start(n)?;
    }
    for _ in 0..options.steps {
        world.step()?;
    }
    let end = world.quiesce()?;
    let history = History {
        ops: std::mem::take(&mut *lock(&world.history)),
        quiescent: Some(end),
        end: world.now(),
    };
    let violations = checker::check(&history);
    let faults = world.faults.lock().counts;
    let lost_races = world.lost_races.load(Ordering::SeqCst)
        + (0..world.nodes.len())
            .filter_map(|n| world.engine(n))
            .map(|e| e.lost_races())
            .sum::<u64>();
    Ok(Report {
        seed,
        scenario,
        history,
        violations,
        faults,
        lost_races,
    })
}

/// The network every attachment is on.
const NETWORK: &str = "sim-net";
/// Sandboxes alive at once, at most: with the pools below, enough to exhaust them.
const MAX_LIVE: usize = 10;

type SimEngine = Engine<FaultyStore, CniDefaultsPolicy>;

/// Where a pod sandbox is in its life, as its runtime sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    /// Its ADD is being served.
    Adding,
    /// Its ADD succeeded; the runtime uses what it was given.
    Live,
    /// The runtime asked to DEL it and has not had a success yet: it retries.
    Deleting,
    Gone,
}

#[derive(Clone, Debug)]
struct Sandbox {
    id: String,
    node: usize,
    attachment: Attachment,
    pod: String,
    life: Life,
}

/// One node: its agent's engine (`None` while the process is dead) and what outlives it.
struct Node {
    name: String,
    engine: Mutex<Option<Arc<SimEngine>>>,
    /// The DEL journal (the agent's `--journal` directory): it survives the process.
    journal: Mutex<BTreeMap<Attachment, DelRequest>>,
}

/// One run's nodes, sandboxes, clocks and history. Shared (`Arc`) and locked field by field,
/// never across an engine call: an operation interleaved between two store steps of another
/// reaches it from inside that operation's store call, on the same thread.
struct World {
    /// For the stores' [`Between`] hook, without a cycle.
    me: Weak<World>,
    scenario: Scenario,
    backend: Backend,
    config: EngineConfig,
    pools: Vec<Pool>,
    faults: Arc<Faults>,
    /// The engines' clock, unix seconds.
    seconds: Arc<AtomicU64>,
    /// The history's logical clock: one tick per invocation or completion.
    time: AtomicU64,
    next_op: AtomicU64,
    /// Lost races of engines that died (a live engine counts its own).
    lost_races: AtomicU64,
    nodes: Vec<Node>,
    sandboxes: Mutex<Vec<Sandbox>>,
    history: Mutex<Vec<Op>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pool(name: &str, subnet: &str, range: &str) -> Pool {
    Pool::from_spec(
        ObjectMeta {
            name: name.into(),
            ..Default::default()
        },
        IpPoolSpec {
            subnet: subnet.into(),
            ips: vec![range.into()],
            ..Default::default()
        },
    )
    .expect("the simulation's pools are valid")
}

impl World {
    fn new(
        seed: u64,
        scenario: Scenario,
        backend: Backend,
        sabotage: Option<Sabotage>,
    ) -> Arc<World> {
        let nodes = scenario.nodes();
        let rates = Rates {
            unavailable: 20,
            crash_before: 8,
            crash_after_write: 15,
            interleave: 80,
        };
        Arc::new_cyclic(|me| World {
            me: me.clone(),
            scenario,
            backend,
            config: EngineConfig {
                // Short enough that a run of sixty steps crosses them many times.
                cooldown: 5,
                gc_grace: 10,
                stateful_keep: 3600,
                resync: 60,
                spread: (nodes > 1).then_some(seed),
                single_node: nodes == 1,
            },
            // Eight IPv4 addresses for up to ten sandboxes: pools run out. Dual stack, so that
            // an ADD claims two addresses in one batch.
            pools: vec![
                pool("v4", "10.6.0.0/24", "10.6.0.10-10.6.0.17"),
                pool("v6", "fd00:6::/64", "fd00:6::10-fd00:6::1f"),
            ],
            faults: Arc::new(Faults::new(seed, nodes, rates, sabotage)),
            seconds: Arc::new(AtomicU64::new(1_000_000)),
            time: AtomicU64::new(0),
            next_op: AtomicU64::new(1),
            lost_races: AtomicU64::new(0),
            nodes: (0..nodes)
                .map(|n| Node {
                    name: format!("node-{n}"),
                    engine: Mutex::new(None),
                    journal: Mutex::new(BTreeMap::new()),
                })
                .collect(),
            sandboxes: Mutex::new(Vec::new()),
            history: Mutex::new(Vec::new()),
        })
    }

    /// The engines' and stores' clock.
    fn clock(&self) -> Clock {
        let seconds = self.seconds.clone();
        Arc::new(move || seconds.load(Ordering::SeqCst))
    }

    fn tick(&self) -> u64 {
        self.time.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn now(&self) -> u64 {
        self.time.load(Ordering::SeqCst)
    }

    fn roll(&self, n: u64) -> u64 {
        self.faults.lock().rng.below(n)
    }

    fn record(&self, op: Op) {
        lock(&self.history).push(op);
    }

    fn op(&self, node: usize, verb: Verb, call: u64) -> Op {
        Op {
            id: self.next_op.fetch_add(1, Ordering::SeqCst),
            node: self.nodes[node].name.clone(),
            verb,
            sandbox: None,
            attachment: None,
            pod: None,
            addresses: vec![],
            released: vec![],
            call,
            ret: call,
            outcome: Outcome::Ok,
            note: String::new(),
        }
    }

    fn engine(&self, node: usize) -> Option<Arc<SimEngine>> {
        lock(&self.nodes[node].engine).clone()
    }

    fn is_dead(&self, node: usize) -> bool {
        self.faults.lock().dead[node]
    }

    /// Starts `node`'s agent: opens the store, loads the pools and replays the journal before
    /// serving, as the agent does; a fault during start kills it and it starts again.
    fn start(&self, node: usize) -> anyhow::Result<()> {
        for _ in 0..100 {
            self.faults.lock().dead[node] = false;
            let inner = self.backend.open(&self.nodes[node].name, self.clock())?;
            let between: Option<Between> = Some({
                let world = self.me.clone();
                Arc::new(move |from: usize, step: &str| {
                    if let Some(world) = world.upgrade() {
                        world.interleave(from, step);
                    }
                }) as Between
            });
            let store = FaultyStore::new(inner, node, self.faults.clone(), between);
            let engine = Engine::with_config(store, CniDefaultsPolicy, self.config, self.clock())
                .on_node(&self.nodes[node].name);
            if engine.load(self.pools.clone(), vec![], vec![]).is_err() {
                if self.is_dead(node) {
                    self.crashed(node);
                }
                continue;
            }
            *lock(&self.nodes[node].engine) = Some(Arc::new(engine));
            let call = self.tick();
            let mut op = self.op(node, Verb::Restart, call);
            op.ret = call;
            self.record(op);
            if self.replay(node) {
                return Ok(());
            }
            self.crashed(node);
        }
        anyhow::bail!("node {node} did not start in 100 attempts")
    }

    /// Records that `node`'s agent died, and forgets its in-memory state.
    fn crashed(&self, node: usize) {
        let note = self.faults.lock().crash_note[node]
            .take()
            .unwrap_or_else(|| "killed".into());
        if let Some(engine) = lock(&self.nodes[node].engine).take() {
            self.lost_races
                .fetch_add(engine.lost_races(), Ordering::SeqCst);
        }
        let call = self.tick();
        let mut op = self.op(node, Verb::Crash, call);
        op.note = note;
        self.record(op);
    }

    /// After an operation on `node`: when its agent died under it, restart it.
    fn restart_if_dead(&self, node: usize) -> anyhow::Result<()> {
        if self.is_dead(node) {
            self.crashed(node);
            self.start(node)?;
        }
        Ok(())
    }

    /// One workload step.
    fn step(&self) -> anyhow::Result<()> {
        self.seconds.fetch_add(self.roll(3), Ordering::SeqCst);
        let node = self.roll(self.nodes.len() as u64) as usize;
        match self.roll(100) {
            0..30 => self.new_sandbox(node)?,
            30..40 => self.with_sandbox(Life::Live, |s| self.add(s))?,
            40..45 => self.with_sandbox(Life::Live, |s| self.check(s))?,
            45..65 => self.with_sandbox(Life::Live, |s| self.del(s))?,
            65..72 => self.with_sandbox(Life::Deleting, |s| self.del(s))?,
            72..82 => self.gc(node)?,
            // With API faults, a quarter of the ticks are API faults instead.
            88..90 if self.scenario == Scenario::KubeApiFaults => self.api_fault(),
            82..90 => self.sync(node)?,
            90..94 => {
                // SIGKILL between operations.
                let mut s = self.faults.lock();
                s.dead[node] = true;
                s.counts.idle_kills += 1;
                s.crash_note[node] = Some("killed between operations".into());
                drop(s);
                self.restart_if_dead(node)?;
            }
            _ => {
                // Time passes: cool-downs end, GC's grace period passes.
                let jump = self.config.gc_grace + self.roll(self.config.gc_grace);
                self.seconds.fetch_add(jump, Ordering::SeqCst);
            }
        }
        Ok(())
    }

    /// The API server refuses the next one or two requests of a verb on IPBlocks, as an
    /// overloaded or failing server does, or as a compare-and-swap lost to a writer the
    /// simulation does not see (409): the Kubernetes store must retry or fail cleanly.
    fn api_fault(&self) {
        let Backend::Kube(server) = &self.backend else {
            return;
        };
        const VERBS: [&str; 5] = ["create", "update", "patch", "get", "delete"];
        const ANSWERS: [(u16, &str); 4] = [
            (409, "Conflict"),
            (429, "TooManyRequests"),
            (500, "InternalError"),
            (503, "ServiceUnavailable"),
        ];
        let verb = VERBS[self.roll(VERBS.len() as u64) as usize];
        let (code, reason) = ANSWERS[self.roll(ANSWERS.len() as u64) as usize];
        let times = 1 + self.roll(2) as usize;
        server.fail(verb, "ipblocks", times, code, reason);
        self.faults.lock().counts.api_errors += times as u64;
    }

    /// Another operation, run between two store steps of `from`'s: right before an ADD's
    /// claim, now and then a GC of the same node (the agent serves a GC while an ADD waits for
    /// the store; GC takes no attachment lock, so it can run there); otherwise another node's
    /// ADD, DEL, GC or tick.
    fn interleave(&self, from: usize, step: &str) {
        if step == "claim" && self.roll(2) == 0 {
            // Not restarted here when it dies: the ADD it interrupted dies with it and its
            // caller restarts the node.
            self.faults.lock().counts.interleaved += 1;
            let outer = self.notes_of(from);
            self.gc_once(from);
            self.faults.lock().notes[from].splice(0..0, outer);
            return;
        }
        let others: Vec<usize> = (0..self.nodes.len())
            .filter(|&n| n != from && !self.is_dead(n) && self.engine(n).is_some())
            .collect();
        if others.is_empty() {
            return;
        }
        let node = others[self.roll(others.len() as u64) as usize];
        self.faults.lock().counts.interleaved += 1;
        let live = |s: &Sandbox| s.node == node && s.life == Life::Live;
        let result = match self.roll(4) {
            0 => self.new_sandbox(node),
            1 => self.with_sandbox_where(live, |s| self.del(s)),
            2 => self.gc(node),
            _ => self.sync(node),
        };
        if let Err(e) = result {
            // Only a node that cannot start again fails an operation; the outer one sees it.
            self.faults.lock().notes[from].push(format!("interleaved operation failed: {e}"));
        }
    }

    /// Runs `f` on a random sandbox in `life`, if there is one.
    fn with_sandbox(
        &self,
        life: Life,
        f: impl FnOnce(Sandbox) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.with_sandbox_where(|s| s.life == life, f)
    }

    fn with_sandbox_where(
        &self,
        pick: impl Fn(&Sandbox) -> bool,
        f: impl FnOnce(Sandbox) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let candidates: Vec<Sandbox> = lock(&self.sandboxes)
            .iter()
            .filter(|s| pick(s) && !self.is_dead(s.node))
            .cloned()
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let chosen = candidates[self.roll(candidates.len() as u64) as usize].clone();
        f(chosen)
    }

    fn set_life(&self, id: &str, life: Life) {
        if let Some(s) = lock(&self.sandboxes).iter_mut().find(|s| s.id == id) {
            s.life = life;
        }
    }

    /// A new pod sandbox on `node`, and its ADD. Now and then it reuses the container ID of a
    /// sandbox that is gone (as `podman restart` does), so that its ADD must settle that
    /// sandbox's journaled DEL first.
    fn new_sandbox(&self, node: usize) -> anyhow::Result<()> {
        let sandbox = {
            let mut all = lock(&self.sandboxes);
            let alive = all
                .iter()
                .filter(|s| matches!(s.life, Life::Adding | Life::Live))
                .count();
            if alive >= MAX_LIVE {
                return Ok(());
            }
            let k = all.len();
            let reused: Vec<Attachment> = all
                .iter()
                .filter(|s| s.node == node && s.life == Life::Gone)
                .map(|s| s.attachment.clone())
                .filter(|a| {
                    !all.iter()
                        .any(|s| &s.attachment == a && s.life != Life::Gone)
                })
                .collect();
            let attachment = if !reused.is_empty() && self.roll(8) == 0 {
                reused[self.roll(reused.len() as u64) as usize].clone()
            } else {
                Attachment {
                    container_id: format!("c{k}"),
                    interface: "eth0".into(),
                }
            };
            let sandbox = Sandbox {
                id: format!("s{k}"),
                node,
                attachment,
                pod: format!("sim/pod-{k}"),
                life: Life::Adding,
            };
            all.push(sandbox.clone());
            sandbox
        };
        self.add(sandbox)
    }
}

/// Where the claims live.
enum Backend {
    /// A SQLite file every node opens.
    Sqlite(PathBuf),
    /// The in-memory API server every node's Kubernetes store talks to.
    Kube(ApiServer),
}

impl Backend {
    /// A store as `node`'s agent opens it at start.
    fn open(&self, node: &str, clock: Clock) -> anyhow::Result<Arc<dyn Store>> {
        Ok(match self {
            Backend::Sqlite(db) => Arc::new(SqliteStore::open(db)?),
            Backend::Kube(server) => {
                let server = server.clone();
                let config = KubeConfig {
                    kubeconfig: None,
                    node: Some(node.into()),
                    timeout: Some(Duration::from_secs(10)),
                    scope: Default::default(),
                };
                Arc::new(KubeStore::open_with(&config, clock, move || async move {
                    Ok(server.client())
                })?)
            }
        })
    }
}

/// Every claim in the store, read with a store of its own.
fn stored_claims(backend: &Backend, clock: Clock) -> anyhow::Result<Vec<StoredClaim>> {
    let store = backend.open("checker", clock)?;
    let mut claims: Vec<StoredClaim> = store
        .all()?
        .into_iter()
        .map(|c| StoredClaim {
            address: c.address,
            attachment: c.attachment.map(|a| a.to_string()),
            node: c.node,
        })
        .collect();
    claims.sort_by_key(|c| c.address);
    Ok(claims)
}
