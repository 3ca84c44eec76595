//! Probing ahead (`--probe-ahead`): the agent keeps the next addresses of each pool probed from
//! the node-side link the pods of a network hang from, so that an ADD handed one of them does
//! not wait `tries × timeout` inside the pod's namespace.
//!
//! # What the agent learns, and from whom
//!
//! The plugin sees the whole network config and names the parent link in each ADD (`parent`: a
//! bridge without VLANs, or a macvlan master in bridge mode; see `allot-cni`'s `probe` module),
//! with the network namespace it runs in. A probing ADD (the network's `probe` section or the
//! agent's `--probe-*` defaults turn something on) on a parent in the agent's own namespace
//! registers each pool it was served from with that link; registrations unused for
//! [`IDLE`] are dropped, and with them the probing. Several networks on one pool register it
//! with each of their links, and each link gets its own verdicts: an address found free from a
//! bridge says nothing about a macvlan master's segment. Nothing registers for networks that do
//! not probe, so they cause no frame at all.
//!
//! # What is probed, from where, and how often
//!
//! Per link, one worker thread probes one address at a time (never two probes in parallel on
//! one link: Spiderpool's issue 4475): the next `--probe-ahead-candidates` addresses of each
//! registered pool, as [`allot_engine::Engine::upcoming`] lists them (the same
//! round-robin from the pool's cursor, skipping claimed, in-flight and cooling addresses, that
//! the next ADDs will follow), with the conflict probe, and the pool's gateway with the gateway
//! probe, each with the largest tries and timeout a registered network asks for. A verdict
//! is fresh for `--probe-ahead-fresh-seconds` from the moment its probe started; the worker
//! probes again once half of that has passed, so a candidate is fresh whenever an ADD comes.
//! A link sends at most `--probe-ahead-rate` requests a second. From a bridge, the probe goes
//! out of the bridge device itself, which every port hears. From a macvlan master it goes out
//! of a macvlan sibling the agent creates for it ([`allot_probe::MacvlanPort`]): the master
//! itself cannot reach its own macvlan children, the sibling does (bridge mode). Neither
//! changes any link of the node; a link that is down or has no carrier yields no verdict.
//!
//! # What a probe from the parent cannot see, and what covers it
//!
//! The node itself never answers a probe it sent: a candidate that is one of the node's own
//! addresses (any interface) is taken, by that interface's MAC, without probing. Frames the
//! probe sends are from 0.0.0.0 / `::`, so no neighbour cache learns anything from them.
//! Anything else the link does not show (a VLAN-tagged port, an ipvlan, an SR-IOV VF, a parent
//! in another namespace) is not registered in the first place: those ADDs probe in the pod's
//! namespace, as without this module.
//!
//! # Never a stale "free"
//!
//! An ADD's reply lists (`preprobed`) only addresses and gateways whose verdict, from this
//! link, is younger than the freshness bound and as thorough as the network asks; everything
//! else the plugin probes in the pod's namespace as before. An address being probed when an ADD
//! takes it is waited for (the ADD would otherwise probe it from the pod at the same moment, and
//! each probe would read the other as a contender). A conflict found ahead quarantines the
//! address at once (a claim owned by the conflicting MAC, as an ADD's probe would make it); if
//! an ADD took it meanwhile, that ADD's reply does not list it, and the pod's own probe finds
//! the conflict and quarantines it. What no probe at ADD time can catch either way is a host
//! that takes an address without probing after the probe: the bound limits that window to
//! `--probe-ahead-fresh-seconds` (the in-namespace probe leaves a window of the ADD's length).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use allot_api::{AddRequest, ParentKind, Preprobed, ProbeSettings};
use allot_engine::AddOutcome;
use allot_probe::{GatewayOutcome, MacAddr, MacvlanPort, ProbeConfig, ProbeError, ProbeOutcome};

use crate::engine::AgentEngine;
use crate::metrics::Metrics;

/// A pool registered with a link and not served to a probing ADD on it for this long is no
/// longer probed from it.
pub const IDLE: Duration = Duration::from_secs(3600);

/// How long the agent's shutdown waits for probes in progress.
const STOP_WAIT: Duration = Duration::from_secs(3);

/// How long a worker waits after a probe that could not run (link down, no carrier) before it
/// tries again.
const RETRY: Duration = Duration::from_secs(2);

/// The `--probe-ahead*` flags, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AheadConfig {
    /// Addresses probed ahead per pool and link.
    pub candidates: usize,
    /// How long a verdict may be used.
    pub fresh: Duration,
    /// Requests a second per link, at most.
    pub rate: u32,
}

pub struct ProbeAhead {
    cfg: AheadConfig,
    /// `DEVICE:INODE` of the agent's network namespace: only parents in it are probed.
    own_netns: Option<String>,
    engine: Arc<AgentEngine>,
    metrics: Arc<Metrics>,
    parents: Mutex<HashMap<(ParentKind, String), Arc<Parent>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    stopping: Arc<AtomicBool>,
}

/// One parent link: what to probe from it and what was found.
struct Parent {
    kind: ParentKind,
    name: String,
    state: Mutex<ParentState>,
    /// Signalled when a verdict is recorded, a pool registered, or the agent stops.
    changed: Condvar,
}

#[derive(Default)]
struct ParentState {
    pools: HashMap<String, Use>,
    verdicts: HashMap<IpAddr, Verdict>,
    /// The address (or gateway) being probed now.
    probing: Option<IpAddr>,
}

/// A pool served on the link to probing ADDs.
#[derive(Clone, Debug)]
struct Use {
    /// A network that used it (a conflict found ahead is quarantined in its name).
    network: String,
    conflict: bool,
    /// The pool's gateway, when a network probes gateways.
    gateway: Option<IpAddr>,
    tries: u32,
    timeout_ms: u64,
    last_used: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
    Free,
    /// A host answered for it, or is probing for it: not free.
    Taken,
    GatewayUp,
    GatewayDown,
}

#[derive(Clone, Copy, Debug)]
struct Verdict {
    /// When its probe started.
    at: Instant,
    tries: u32,
    timeout_ms: u64,
    found: Found,
}

impl Verdict {
    fn usable(&self, now: Instant, fresh: Duration, wanted: &ProbeSettings) -> bool {
        now.saturating_duration_since(self.at) < fresh
            && self.tries >= wanted.tries
            && self.timeout_ms >= wanted.timeout_ms
    }
}

/// One probe a worker is to run.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Job {
    target: IpAddr,
    /// `Some((pool, network))` for a candidate address; `None` for a gateway.
    candidate: Option<(String, String)>,
    tries: u32,
    timeout_ms: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `DEVICE:INODE` of this process's network namespace, as the plugin reports its own.
pub fn own_netns() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata("/proc/self/ns/net").ok()?;
    Some(format!("{}:{}", meta.dev(), meta.ino()))
}

impl ProbeAhead {
    pub fn new(cfg: AheadConfig, engine: Arc<AgentEngine>, metrics: Arc<Metrics>) -> Self {
        ProbeAhead {
            cfg,
            own_netns: own_netns(),
            engine,
            metrics,
            parents: Mutex::default(),
            workers: Mutex::default(),
            stopping: Arc::default(),
        }
    }

    /// After an ADD (or the ADD served again after a quarantine): registers the pools it was
    /// served from with its parent link, and says which of its addresses and gateways were
    /// probed ahead recently enough. `settings` are what the plugin will probe with.
    pub fn served(
        &self,
        request: &AddRequest,
        settings: Option<ProbeSettings>,
        out: &AddOutcome,
    ) -> Option<Preprobed> {
        let settings = settings.filter(ProbeSettings::enabled)?;
        let link = request.parent.as_ref()?;
        if self.own_netns.as_deref() != Some(link.netns.as_str()) {
            tracing::debug!(link = %link.name, "probing ahead skips a parent link outside the agent's network namespace");
            return None;
        }
        let parent = self.parent(link.kind, &link.name);
        let now = Instant::now();
        let mut state = lock(&parent.state);
        for a in &out.allocations {
            let gateway = a.gateway.filter(|_| settings.gateway);
            let entry = state.pools.entry(a.pool.clone()).or_insert_with(|| Use {
                network: request.network.clone(),
                conflict: false,
                gateway: None,
                tries: 0,
                timeout_ms: 0,
                last_used: now,
            });
            entry.network.clone_from(&request.network);
            entry.conflict |= settings.conflict;
            entry.gateway = gateway.or(entry.gateway);
            entry.tries = entry.tries.max(settings.tries);
            entry.timeout_ms = entry.timeout_ms.max(settings.timeout_ms);
            entry.last_used = now;
        }
        parent.changed.notify_all();
        // An address or gateway of this ADD being probed right now: wait for its verdict
        // rather than have the pod probe it at the same moment.
        let ours = |t: &IpAddr| {
            out.allocations
                .iter()
                .any(|a| a.address == *t || a.gateway == Some(*t))
        };
        // A probe runs with the largest tries and timeout of the networks on the link.
        let longest = state
            .pools
            .values()
            .map(|u| u64::from(u.tries) * u.timeout_ms)
            .max()
            .unwrap_or(0);
        let give_up = now + Duration::from_millis(longest) + Duration::from_secs(1);
        while state.probing.as_ref().is_some_and(ours) {
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = parent
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        tracing::debug!(waited_ms = now.elapsed().as_millis() as u64, link = %link.name, "an ADD waited for probes of its addresses in progress");
        let now = Instant::now();
        let mut listed = Preprobed {
            link: link.name.clone(),
            ..Preprobed::default()
        };
        let mut oldest = Duration::ZERO;
        let mut take = |v: &Verdict| oldest = oldest.max(now.saturating_duration_since(v.at));
        for a in &out.allocations {
            if settings.conflict {
                match state.verdicts.get(&a.address) {
                    Some(v)
                        if v.found == Found::Free && v.usable(now, self.cfg.fresh, &settings) =>
                    {
                        take(v);
                        listed.free.push(a.address.to_string());
                        self.metrics.probe_ahead_hits.inc();
                    }
                    _ => {
                        self.metrics.probe_ahead_misses.inc();
                    }
                }
            }
            if let Some(gw) = a.gateway.filter(|_| settings.gateway)
                && let Some(v) = state.verdicts.get(&gw)
                && v.found == Found::GatewayUp
                && v.usable(now, self.cfg.fresh, &settings)
                && !listed.gateways.contains(&gw.to_string())
            {
                take(v);
                listed.gateways.push(gw.to_string());
            }
        }
        listed.oldest_ms = oldest.as_millis() as u64;
        (!listed.free.is_empty() || !listed.gateways.is_empty()).then_some(listed)
    }

    /// The link's record, with its worker started on first use.
    fn parent(&self, kind: ParentKind, name: &str) -> Arc<Parent> {
        let mut parents = lock(&self.parents);
        if let Some(p) = parents.get(&(kind, name.to_string())) {
            return p.clone();
        }
        let parent = Arc::new(Parent {
            kind,
            name: name.to_string(),
            state: Mutex::default(),
            changed: Condvar::new(),
        });
        parents.insert((kind, name.to_string()), parent.clone());
        let worker = Worker {
            parent: parent.clone(),
            cfg: self.cfg,
            engine: self.engine.clone(),
            metrics: self.metrics.clone(),
            stopping: self.stopping.clone(),
            port: None,
        };
        match std::thread::Builder::new()
            .name(format!("allot-ahead-{name}"))
            .spawn(move || worker.run())
        {
            Ok(handle) => lock(&self.workers).push(handle),
            Err(e) => tracing::warn!(link = %name, "cannot start probing ahead: {e}"),
        }
        tracing::info!(link = %name, kind = kind.as_str(), "probing ahead from this link");
        parent
    }

    /// Stops the workers and removes the probe ports they made. A worker finishes the probe
    /// it is running first; one still probing after [`STOP_WAIT`] (a network asking for very
    /// long probes) is left to the process's exit, and its port to the next start, which
    /// replaces it.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for p in lock(&self.parents).values() {
            let _guard = lock(&p.state);
            p.changed.notify_all();
        }
        let deadline = Instant::now() + STOP_WAIT;
        let mut workers = lock(&self.workers);
        while workers.iter().any(|w| !w.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        for w in workers.drain(..).filter(|w| w.is_finished()) {
            let _ = w.join();
        }
    }
}

struct Worker {
    parent: Arc<Parent>,
    cfg: AheadConfig,
    engine: Arc<AgentEngine>,
    metrics: Arc<Metrics>,
    stopping: Arc<AtomicBool>,
    /// The macvlan sibling probes go out of (a macvlan parent only), made on first use.
    port: Option<MacvlanPort>,
}

impl Worker {
    fn run(mut self) {
        let mut last_error = String::new();
        while !self.stopping.load(Ordering::SeqCst) {
            let Some(job) = self.next_job() else {
                continue;
            };
            let started = Instant::now();
            let result = self.probe(&job);
            tracing::debug!(link = %self.parent.name, target = %job.target, took_ms = started.elapsed().as_millis() as u64, ?result, "probed ahead");
            let frames = job.tries;
            match result {
                Ok(found) => {
                    last_error.clear();
                    self.record(&job, started, found);
                }
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        if e.lacks_privilege() {
                            tracing::error!(link = %self.parent.name, "probing ahead: {text}; the agent needs CAP_NET_RAW and CAP_NET_ADMIN for --probe-ahead (the chart adds them to its container with agent.probeAhead.enabled=true; a policy that drops them turns probing ahead off in effect); ADDs on this link probe in the pod's namespace meanwhile");
                        } else {
                            tracing::warn!(link = %self.parent.name, "probing ahead: {text}; ADDs on this link probe in the pod's namespace meanwhile");
                        }
                        last_error = text;
                    }
                    self.metrics.error("probe-ahead");
                    if matches!(e, ProbeError::NoSuchLink { .. }) {
                        // The master (and with it the probe port) went away: make the port
                        // again once it is back.
                        self.port = None;
                    }
                    lock(&self.parent.state).probing = None;
                    self.parent.changed.notify_all();
                    self.pause(RETRY);
                    continue;
                }
            }
            // At most `rate` requests a second on this link.
            let floor = Duration::from_secs_f64(f64::from(frames) / f64::from(self.cfg.rate));
            self.pause(floor.saturating_sub(started.elapsed()));
        }
        // Dropping the port removes it.
        self.port = None;
    }

    fn pause(&self, d: Duration) {
        if d.is_zero() {
            return;
        }
        let state = lock(&self.parent.state);
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let _ = self.parent.changed.wait_timeout(state, d);
    }

    /// The most urgent probe (a candidate or gateway without a verdict, then the oldest
    /// verdict past half its freshness), marked as running; `None` after waiting for one.
    fn next_job(&self) -> Option<Job> {
        let mut state = lock(&self.parent.state);
        let now = Instant::now();
        state
            .pools
            .retain(|_, u| now.saturating_duration_since(u.last_used) < IDLE);
        let mut wanted: Vec<Job> = Vec::new();
        for (pool, u) in &state.pools {
            if u.conflict {
                for target in self.engine.upcoming(pool, self.cfg.candidates) {
                    wanted.push(Job {
                        target,
                        candidate: Some((pool.clone(), u.network.clone())),
                        tries: u.tries,
                        timeout_ms: u.timeout_ms,
                    });
                }
            }
            if let Some(gw) = u.gateway
                && !wanted.iter().any(|j| j.target == gw)
            {
                wanted.push(Job {
                    target: gw,
                    candidate: None,
                    tries: u.tries,
                    timeout_ms: u.timeout_ms,
                });
            }
        }
        // Verdicts about addresses no longer wanted go: the map stays as small as the work.
        state
            .verdicts
            .retain(|a, _| wanted.iter().any(|j| j.target == *a));
        let recheck = self.cfg.fresh / 2;
        let due_in = |j: &Job| -> Duration {
            match state.verdicts.get(&j.target) {
                Some(v) if v.tries >= j.tries && v.timeout_ms >= j.timeout_ms => {
                    recheck.saturating_sub(now.saturating_duration_since(v.at))
                }
                _ => Duration::ZERO,
            }
        };
        let most_urgent = wanted.iter().min_by_key(|j| {
            let age = state
                .verdicts
                .get(&j.target)
                .map_or(Duration::MAX, |v| now.saturating_duration_since(v.at));
            (due_in(j), std::cmp::Reverse(age))
        });
        let wait = match most_urgent {
            Some(j) if due_in(j).is_zero() => {
                // Still free in the engine (an ADD may have taken it since `upcoming`)?
                // Checked under the link's lock, which the ADD's reply takes after its claim.
                if j.candidate.is_some() && !self.engine.is_free(j.target) {
                    return None;
                }
                let job = j.clone();
                state.probing = Some(job.target);
                return Some(job);
            }
            Some(j) => due_in(j).min(Duration::from_secs(1)),
            None => Duration::from_secs(1),
        };
        let _ = self.parent.changed.wait_timeout(state, wait);
        None
    }

    /// The link probes go out of: the bridge itself, or the macvlan sibling (made now if need
    /// be).
    fn link(&mut self) -> Result<String, ProbeError> {
        match self.parent.kind {
            ParentKind::Bridge => {
                // What the plugin named a bridge must be one: never probe from another link.
                match allot_probe::link_kind(&self.parent.name) {
                    None => Err(ProbeError::NoSuchLink {
                        ifname: self.parent.name.clone(),
                    }),
                    Some(Some(kind)) if kind == "bridge" => Ok(self.parent.name.clone()),
                    Some(kind) => Err(ProbeError::Io {
                        op: "probing ahead",
                        ifname: self.parent.name.clone(),
                        source: std::io::Error::other(format!(
                            "the network's bridge is a {} link, not a bridge",
                            kind.as_deref().unwrap_or("physical")
                        )),
                    }),
                }
            }
            ParentKind::Macvlan => {
                if self.port.is_none() {
                    let port = MacvlanPort::create(&self.parent.name)?;
                    tracing::info!(master = %self.parent.name, port = %port.name(), "created a macvlan probe port (bridge mode, no addresses, IPv6 and ARP off)");
                    self.port = Some(port);
                }
                Ok(self.port.as_ref().expect("made above").name().to_string())
            }
        }
    }

    fn probe(&mut self, job: &Job) -> Result<(Found, Option<MacAddr>), ProbeError> {
        let gateway = job.candidate.is_none();
        // The node's own addresses: it never answers its own probe.
        let local = allot_probe::local_addresses().map_err(|source| ProbeError::Io {
            op: "listing the node's addresses",
            ifname: self.parent.name.clone(),
            source,
        })?;
        if let Some(l) = local.iter().find(|l| l.address == job.target) {
            let found = if gateway {
                Found::GatewayUp
            } else {
                Found::Taken
            };
            return Ok((found, Some(l.mac.unwrap_or(MacAddr::ZERO))));
        }
        let link = self.link()?;
        let cfg = ProbeConfig {
            tries: job.tries,
            timeout: Duration::from_millis(job.timeout_ms),
            // A link of the node has its carrier or not: waiting helps nobody.
            carrier_timeout: Duration::ZERO,
        };
        allot_probe::with_host_link(&link, cfg, |l| {
            Ok(if gateway {
                match l.probe_gateway(job.target)? {
                    GatewayOutcome::Reachable { mac } => (Found::GatewayUp, Some(mac)),
                    GatewayOutcome::Unreachable => (Found::GatewayDown, None),
                }
            } else {
                match l.probe_conflict(job.target)? {
                    ProbeOutcome::Free => (Found::Free, None),
                    ProbeOutcome::Conflict { mac } => (Found::Taken, Some(mac)),
                    // Another host about to take it (or a pod's probe on another node):
                    // not free, but nobody holds it yet, so no quarantine.
                    ProbeOutcome::Contested { .. } => (Found::Taken, None),
                }
            })
        })
    }

    fn record(&self, job: &Job, started: Instant, (found, mac): (Found, Option<MacAddr>)) {
        self.metrics.probe_ahead_probes.inc();
        {
            let mut state = lock(&self.parent.state);
            state.probing = None;
            state.verdicts.insert(
                job.target,
                Verdict {
                    at: started,
                    tries: job.tries,
                    timeout_ms: job.timeout_ms,
                    found,
                },
            );
        }
        self.parent.changed.notify_all();
        let (Some((pool, network)), Found::Taken, Some(mac)) = (&job.candidate, found, mac) else {
            return;
        };
        let mac = mac.to_string();
        self.metrics.conflicts.inc();
        match self.engine.quarantine_free(job.target, pool, network, &mac) {
            Ok(Some(_)) => {
                self.metrics.quarantined.inc();
                tracing::warn!(address = %job.target, %mac, pool = %pool, link = %self.parent.name, "address conflict found ahead: another host answered for the address on the link; quarantined");
            }
            Ok(None) => {
                tracing::info!(address = %job.target, %mac, link = %self.parent.name, "address conflict found ahead, but the address was handed out meanwhile: that ADD probes it in the pod's namespace")
            }
            Err(e) => {
                tracing::warn!(address = %job.target, %mac, "address conflict found ahead; quarantining it failed: {e}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(age: Duration, tries: u32, timeout_ms: u64) -> (Verdict, Instant) {
        let now = Instant::now() + Duration::from_secs(3600);
        (
            Verdict {
                at: now - age,
                tries,
                timeout_ms,
                found: Found::Free,
            },
            now,
        )
    }

    #[test]
    fn a_verdict_is_used_only_while_fresh_and_thorough_enough() {
        let fresh = Duration::from_secs(10);
        let wanted = ProbeSettings {
            conflict: true,
            ..ProbeSettings::default()
        };
        let (v, now) = verdict(Duration::from_secs(9), 3, 100);
        assert!(v.usable(now, fresh, &wanted));
        let (v, now) = verdict(Duration::from_secs(10), 3, 100);
        assert!(!v.usable(now, fresh, &wanted), "stale");
        let (v, now) = verdict(Duration::from_secs(1), 2, 100);
        assert!(!v.usable(now, fresh, &wanted), "fewer tries than asked");
        let (v, now) = verdict(Duration::from_secs(1), 3, 50);
        assert!(!v.usable(now, fresh, &wanted), "shorter timeout than asked");
        let (v, now) = verdict(Duration::from_secs(1), 5, 200);
        assert!(v.usable(now, fresh, &wanted), "more thorough is fine");
    }
}
