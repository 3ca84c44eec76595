//! Runs seeds of the robustness simulation and checks each history; exits non-zero with the
//! failing seed and the window of operations that shows each violation, so that
//! `--seed N` replays it exactly.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use allot_robustness::sim::Sabotage;
use allot_robustness::sim::store::FaultCounts;
use allot_robustness::sim::{self, Options, Report, Scenario};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "allot-robustness-sim",
    about = "Deterministic simulation of allot's agents, SQLite claim store, faults and GC, with a history checker"
)]
struct Args {
    /// Run this one seed (replays a failure exactly).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run this many seeds, from --first.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed of --seeds.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Threads running seeds.
    #[arg(long, default_value_t = 2)]
    jobs: usize,
    /// sqlite-node, sqlite-shared, kube-shared, kube-api-faults, or all.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Workload steps per seed before healing.
    #[arg(long, default_value_t = Options::default().steps)]
    steps: usize,
    /// Write the history of the first failing seed (or of --seed) here, as JSON lines.
    #[arg(long)]
    history: Option<PathBuf>,
    /// Break the store or the agent on purpose, to see the checker catch it: release-another
    /// (a DEL also frees another attachment's claim now and then), double-allocate (a claim
    /// overwrites one that exists) or add-before-journal (an ADD does not settle its
    /// attachment's journaled DEL first).
    #[arg(long, value_parser = ["release-another", "double-allocate", "add-before-journal"])]
    sabotage: Option<String>,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("allot-robustness-sim: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let scenarios: Vec<Scenario> = match args.scenario.as_str() {
        "all" => Scenario::CAMPAIGN.to_vec(),
        name => vec![Scenario::parse(name).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown scenario {name:?}: sqlite-node, sqlite-shared, kube-shared, kube-api-faults or all"
            )
        })?],
    };
    let seeds: Vec<u64> = match args.seed {
        Some(seed) => vec![seed],
        None => (args.first..args.first + args.seeds).collect(),
    };
    let options = Options {
        steps: args.steps,
        sabotage: match args.sabotage.as_deref() {
            Some("release-another") => Some(Sabotage::ReleaseAnother),
            Some("double-allocate") => Some(Sabotage::DoubleAllocate),
            Some("add-before-journal") => Some(Sabotage::AddBeforeJournal),
            _ => None,
        },
    };
    let mut failed = false;
    for scenario in scenarios {
        let started = Instant::now();
        let next = AtomicU64::new(0);
        let totals = Mutex::new(Totals::default());
        let first_failure: Mutex<Option<Report>> = Mutex::new(None);
        let errors = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..args.jobs.max(1) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst) as usize;
                        let Some(&seed) = seeds.get(i) else { break };
                        match sim::run(seed, scenario, &options) {
                            Ok(report) => {
                                totals.lock().unwrap().add(&report);
                                if !report.violations.is_empty() {
                                    let mut first = first_failure.lock().unwrap();
                                    if first.as_ref().is_none_or(|f| f.seed > seed) {
                                        *first = Some(report);
                                    }
                                } else if args.seed.is_some() {
                                    *first_failure.lock().unwrap() = Some(report);
                                }
                            }
                            Err(e) => errors.lock().unwrap().push(format!("seed {seed}: {e:#}")),
                        }
                    }
                });
            }
        });
        let totals = totals.into_inner().unwrap();
        let elapsed = started.elapsed();
        println!(
            "{scenario}: {} seeds, {} operations, {} faults injected ({} crashes), {} violations, {:.1} s",
            totals.seeds,
            totals.operations,
            totals.faults.total(),
            totals.crashes,
            totals.violations,
            elapsed.as_secs_f64()
        );
        println!(
            "  faults: {:?}; lost create-if-absent races (retried): {}",
            totals.faults, totals.lost_races
        );
        for e in errors.into_inner().unwrap() {
            eprintln!("  error: {e}");
            failed = true;
        }
        if let Some(report) = first_failure.into_inner().unwrap() {
            if let Some(path) = &args.history {
                report
                    .history
                    .write_to(std::io::BufWriter::new(std::fs::File::create(path)?))?;
                println!(
                    "  history of seed {} written to {}",
                    report.seed,
                    path.display()
                );
            }
            if !report.violations.is_empty() {
                failed = true;
                println!(
                    "  FAILED: seed {} ({} violations); replay with: allot-robustness-sim --scenario {scenario} --seed {}{}",
                    report.seed,
                    report.violations.len(),
                    report.seed,
                    if scenario.deterministic() {
                        ""
                    } else {
                        " (this scenario's threads make a replay likely, not certain: its history is the record)"
                    }
                );
                for v in &report.violations {
                    print!("  {v}");
                }
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[derive(Default)]
struct Totals {
    seeds: u64,
    operations: u64,
    crashes: u64,
    violations: u64,
    lost_races: u64,
    faults: FaultCounts,
}

impl Totals {
    fn add(&mut self, report: &Report) {
        self.seeds += 1;
        self.operations += report.operations() as u64;
        self.crashes += report.crashes() as u64;
        self.violations += report.violations.len() as u64;
        self.lost_races += report.lost_races;
        self.faults.add(&report.faults);
    }
}
