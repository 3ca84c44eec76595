//! An idle host costs nothing: the epoch ticker sleeps until a call is in flight. (A file of
//! its own, so that no other test's calls share the process.)

use std::time::Duration;

use allot_core::policy::Policy;
use allot_policy::{Limits, PolicyEngine, PolicySource};

/// Context switches of this process's epoch threads so far.
fn epoch_thread_switches() -> u64 {
    let mut total = 0;
    let mut found = false;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        // The kernel keeps 15 bytes of a thread's name.
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim() != "allot-policy-ep" {
            continue;
        }
        found = true;
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        for line in status.lines() {
            if let Some(n) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += n.trim().parse::<u64>().unwrap();
            }
        }
    }
    assert!(found, "no allot-policy-epoch thread in this process");
    total
}

#[test]
fn the_epoch_ticker_sleeps_while_no_call_is_in_flight() {
    let engine = PolicyEngine::new(Limits::default(), None).unwrap();
    let policy = engine
        .load(&PolicySource::bytes(
            "hostile",
            crate::common::hostile_wasm(),
        ))
        .unwrap();
    let inv = crate::common::inventory(3);
    policy.decide(&inv, &crate::common::request(&inv)).unwrap();
    // Let the ticker notice that the call is over.
    std::thread::sleep(Duration::from_millis(50));
    let before = epoch_thread_switches();
    std::thread::sleep(Duration::from_millis(500));
    let woke = epoch_thread_switches() - before;
    // A ticker that ticks regardless wakes about 500 times in 500 ms.
    assert!(
        woke <= 2,
        "the idle epoch thread woke {woke} times in 500 ms"
    );
    // And it still ticks when needed: a call after the idle spell decides normally.
    policy.decide(&inv, &crate::common::request(&inv)).unwrap();
}
