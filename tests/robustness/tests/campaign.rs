//! The simulation as `make unit` runs it: many seeds of each scenario keep every promise,
//! a seed replays exactly, and a store or agent broken on purpose is caught (so that a
//! campaign with no violation means something).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use allot_robustness::checker::ViolationKind;
use allot_robustness::history::Outcome;
use allot_robustness::sim::Sabotage;
use allot_robustness::sim::store::FaultCounts;
use allot_robustness::sim::{self, Options, Report, Scenario};

/// Runs `seeds` of `scenario` on two threads; the reports, by seed.
fn campaign(scenario: Scenario, seeds: u64, options: &Options) -> Vec<Report> {
    let next = AtomicU64::new(0);
    let reports = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= seeds {
                        break;
                    }
                    let report = sim::run(seed, scenario, options)
                        .unwrap_or_else(|e| panic!("{scenario} seed {seed}: {e:#}"));
                    reports.lock().unwrap().push(report);
                }
            });
        }
    });
    let mut reports = reports.into_inner().unwrap();
    reports.sort_by_key(|r| r.seed);
    reports
}

fn faults(reports: &[Report]) -> FaultCounts {
    let mut total = FaultCounts::default();
    for r in reports {
        total.add(&r.faults);
    }
    total
}

#[test]
fn a_thousand_seeds_of_one_node_keep_every_promise() {
    keeps_every_promise(Scenario::SqliteNode, 1000);
}

#[test]
fn a_thousand_seeds_of_nodes_sharing_a_sqlite_store_keep_every_promise() {
    keeps_every_promise(Scenario::SqliteShared, 1000);
}

#[test]
fn five_hundred_seeds_of_nodes_on_the_kubernetes_store_keep_every_promise() {
    // Fewer: each store runs a tokio runtime of its own, started at every (re)start.
    keeps_every_promise(Scenario::KubeShared, 500);
}

fn keeps_every_promise(scenario: Scenario, seeds: u64) {
    let reports = campaign(scenario, seeds, &Options::default());
    if let Some(failed) = reports.iter().find(|r| !r.violations.is_empty()) {
        let shown: Vec<String> = failed.violations.iter().map(|v| v.to_string()).collect();
        panic!(
            "{scenario} seed {} (replay: allot-robustness-sim --scenario {scenario} --seed {}):\n{}",
            failed.seed,
            failed.seed,
            shown.join("\n")
        );
    }
    // The campaign must have done what it claims: many operations, every kind of fault.
    let operations: usize = reports.iter().map(Report::operations).sum();
    assert!(
        operations as u64 > 30 * seeds,
        "{scenario}: only {operations} operations"
    );
    let f = faults(&reports);
    assert!(f.unavailable > seeds / 10, "{scenario}: {f:?}");
    assert!(f.crash_before > seeds / 20, "{scenario}: {f:?}");
    assert!(f.crash_after_write > seeds / 50, "{scenario}: {f:?}");
    assert!(f.dropped_replies > seeds / 20, "{scenario}: {f:?}");
    assert!(f.idle_kills > seeds / 20, "{scenario}: {f:?}");
    if scenario != Scenario::SqliteNode {
        assert!(f.interleaved > seeds, "{scenario}: {f:?}");
        // Nodes raced for one address and the store's create-if-absent settled it.
        let lost: u64 = reports.iter().map(|r| r.lost_races).sum();
        assert!(lost > seeds / 20, "{scenario}: only {lost} lost races");
    }
    // And pools must have run out now and then.
    let exhausted = reports
        .iter()
        .flat_map(|r| &r.history.ops)
        .filter(|o| matches!(&o.outcome, Outcome::Err(m) if m.contains("no pool can serve")))
        .count();
    assert!(
        exhausted > 10,
        "{scenario}: pools ran out {exhausted} times"
    );
}

#[test]
fn a_seed_replays_exactly() {
    for scenario in Scenario::ALL.into_iter().filter(|s| s.deterministic()) {
        let one = sim::run(42, scenario, &Options::default()).unwrap();
        let two = sim::run(42, scenario, &Options::default()).unwrap();
        assert_eq!(one.history, two.history, "{scenario}");
        let other = sim::run(43, scenario, &Options::default()).unwrap();
        assert_ne!(one.history, other.history, "{scenario}");
    }
}

/// Which kinds of violation `sabotage` produced over `seeds` of `scenario`.
fn caught(scenario: Scenario, sabotage: Sabotage, seeds: u64) -> BTreeSet<ViolationKind> {
    let options = Options {
        sabotage: Some(sabotage),
        ..Options::default()
    };
    let reports = campaign(scenario, seeds, &options);
    assert!(faults(&reports).sabotaged > 0, "the sabotage never struck");
    reports
        .iter()
        .flat_map(|r| r.violations.iter().map(|v| v.kind))
        .collect()
}

#[test]
fn a_store_that_releases_another_attachments_claim_is_caught() {
    let kinds = caught(Scenario::SqliteNode, Sabotage::ReleaseAnother, 200);
    // The silently freed address is handed to another sandbox while its holder lives.
    assert!(kinds.contains(&ViolationKind::TwoLiveHolders), "{kinds:?}");
}

#[test]
fn a_store_whose_claims_overwrite_is_caught() {
    let kinds = caught(Scenario::SqliteShared, Sabotage::DoubleAllocate, 200);
    assert!(kinds.contains(&ViolationKind::TwoLiveHolders), "{kinds:?}");
}

#[test]
fn an_agent_that_adds_before_settling_the_journal_is_caught() {
    // A past allot bug: the DEL journaled for a container ID, replayed after the re-ADD of the
    // same container ID, releases what the re-ADD was given.
    let kinds = caught(Scenario::SqliteNode, Sabotage::AddBeforeJournal, 400);
    assert!(
        kinds.contains(&ViolationKind::ReleasedWhileHeld),
        "{kinds:?}"
    );
}

#[test]
fn a_kubernetes_store_whose_claims_overwrite_is_caught() {
    let kinds = caught(Scenario::KubeShared, Sabotage::DoubleAllocate, 100);
    assert!(kinds.contains(&ViolationKind::TwoLiveHolders), "{kinds:?}");
}

/// With API errors, the Kubernetes store's release of a dual-stack attachment can commit in one
/// block and fail in the other. It once reported that as unavailable ("nothing was written"),
/// and the checker saw the released address claimed again while the journal still held it
/// (`claimed while held`, 16 of 1,000 seeds). Now the store reports what it released
/// (`StoreError::Partial`) and the agent knows it: no violation of any kind.
#[test]
fn two_hundred_seeds_with_api_errors_under_the_kubernetes_store_keep_every_promise() {
    let reports = campaign(Scenario::KubeApiFaults, 200, &Options::default());
    assert!(faults(&reports).api_errors > 100);
    let violations: Vec<String> = reports
        .iter()
        .flat_map(|r| r.violations.iter().map(|v| format!("seed {}: {v}", r.seed)))
        .collect();
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// The seed that first showed the half-done dual-stack DEL (docs/robustness.md, "Findings"):
/// `s5`'s DEL released its IPv6 address while the API server refused its IPv4 block's write
/// (429), and `fd00:6::13` went to `s15` while the DEL was journaled as not done.
#[test]
fn seed_19_of_api_errors_keeps_every_promise() {
    let report = sim::run(19, Scenario::KubeApiFaults, &Options::default()).unwrap();
    let shown: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
    assert!(shown.is_empty(), "{}", shown.join("\n"));
}

/// The seed that showed a DEL released in part and answered as failed (docs/robustness.md,
/// "Findings"): `s17`'s DEL released `10.6.0.12` while its IPv6 block's read was refused with
/// a 409 (a `StoreError::Partial` whose rest is no unavailability), the agent answered the DEL
/// with an error, so the runtime still counted the sandbox as holding the address, and `s20` got
/// it. Ten runs: the Kubernetes scenarios' threads replay a seed likely, not certainly, and
/// one run in three took the failing path before the fix.
#[test]
fn seed_6838_of_api_errors_keeps_every_promise() {
    for _ in 0..10 {
        let report = sim::run(6838, Scenario::KubeApiFaults, &Options::default()).unwrap();
        let shown: Vec<String> = report.violations.iter().map(|v| v.to_string()).collect();
        assert!(shown.is_empty(), "{}", shown.join("\n"));
    }
}
