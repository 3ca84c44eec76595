//! Simulated agents: each an engine over a store of its own (its own client, watch and mirror),
//! driven in closed loops of ADD, a short hold, DEL.

use std::sync::Arc;
use std::time::Instant;

use allot_core::store::{Store, system_clock};
use allot_engine::testing::{CniDefaultsPolicy, pool, request_from};
use allot_engine::{Engine, EngineConfig, seed_of};

use crate::measure::{Load, Tally};

/// The pool every agent allocates from.
pub const SHARED: &str = "shared";

/// Agent `i`'s own pool.
pub fn own_pool(i: usize) -> String {
    format!("own-{i}")
}

pub type Agent<S> = Engine<Arc<S>, CniDefaultsPolicy>;

/// Agent `i` on `store`, as an agent on node `node-i` of a shared store is configured: each
/// node starting its pools at a place of its own, no cool-down (the loops reuse addresses at
/// once), serving the shared /16 and its own /24.
pub fn agent<S: Store + 'static>(store: Arc<S>, i: usize) -> Agent<S> {
    let node = format!("node-{i}");
    let config = EngineConfig {
        cooldown: 0,
        gc_grace: 0,
        spread: Some(seed_of(&node)),
        single_node: false,
        ..EngineConfig::default()
    };
    let engine =
        Engine::with_config(store, CniDefaultsPolicy, config, system_clock()).on_node(&node);
    let own = format!("10.{}.{}.0/24", 100 + i / 256, i % 256);
    engine
        .load(
            vec![pool(SHARED, "10.0.0.0/16"), pool(&own_pool(i), &own)],
            vec![],
            vec![],
        )
        .expect("the agent installs its pools");
    engine
}

/// One ADD and DEL per agent, not measured: connections, and the API server's first write of a
/// kind, warm up.
pub fn warm_up<S: Store + 'static>(
    agents: &[Agent<S>],
    pool_of: impl Fn(usize) -> String,
    tag: &str,
) {
    std::thread::scope(|scope| {
        for (a, engine) in agents.iter().enumerate() {
            let req = request_from(&pool_of(a), &format!("{tag}-{a}-warm"), "warm", false);
            scope.spawn(move || {
                let _ = engine.add(&req);
                let _ = engine.del(&req.attachment);
            });
        }
    });
}

/// Runs `load.per_agent` closed loops on each agent until the deadline, each ADD from the pool
/// `pool_of(agent)` names; returns the merged tally and the measured time.
pub fn drive<S: Store + 'static>(
    agents: &[Agent<S>],
    pool_of: impl Fn(usize) -> String + Sync,
    load: &Load,
    tag: &str,
) -> (Tally, std::time::Duration) {
    let started = Instant::now();
    let deadline = started + load.seconds;
    let tallies: Vec<Tally> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (a, engine) in agents.iter().enumerate() {
            for t in 0..load.per_agent {
                let pool = pool_of(a);
                handles.push(scope.spawn(move || {
                    let mut tally = Tally::default();
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        let id = format!("{tag}-{a}-{t}-{i}");
                        i += 1;
                        let req = request_from(&pool, &id, &id, false);
                        let t0 = Instant::now();
                        match engine.add(&req) {
                            Ok(_) => {
                                let done = Instant::now();
                                if done <= deadline {
                                    tally.latencies.push(done - t0);
                                }
                                std::thread::sleep(load.hold);
                            }
                            Err(e) => tally.error(format!(
                                "ADD, {:.1} s in: {e}",
                                started.elapsed().as_secs_f64()
                            )),
                        }
                        // Also after a failed ADD: one that timed out may have claimed.
                        if let Err(e) = engine.del(&req.attachment) {
                            tally.error(format!(
                                "DEL, {:.1} s in: {e}",
                                started.elapsed().as_secs_f64()
                            ));
                        }
                    }
                    tally
                }));
            }
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = Tally::default();
    for t in tallies {
        all.merge(t);
    }
    (all, load.seconds)
}

/// Lost create-if-absent races of all agents so far.
pub fn lost_races<S: Store + 'static>(agents: &[Agent<S>]) -> u64 {
    agents.iter().map(|a| a.lost_races()).sum()
}
