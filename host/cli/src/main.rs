//! allotctl: the command people type. `policy test|explain|bench` for policy authors.

mod cluster;
mod cni_cmd;
mod crds_cmd;
mod crds_delete;
mod fleet_cmd;
mod gc_cmd;
mod harness;
mod ipam_cmd;
mod migrate_cmd;
mod policy_cmd;
mod scenario;
mod store_args;
mod store_cmd;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_core::policy::Policy;
use allot_policy::{Limits, LoadedPolicy, PolicyEngine, PolicySource, PrecompiledCache, workload};
use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "allotctl",
    version,
    about = "Work with allot: claims and pools in the store; test, explain and benchmark pool-selection policies"
)]
struct Cli {
    #[command(flatten)]
    store: store_args::StoreArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Pool-selection policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Claims in the store (`--store`, default the embedded /var/lib/allot/allot.db).
    #[command(subcommand)]
    Claims(store_cmd::ClaimsCommand),
    /// Pools, subnets and reserved addresses kept in etcd (`--store etcd://…`).
    #[command(subcommand)]
    Pool(store_cmd::PoolCommand),
    /// Leaked addresses: what garbage collection would release, and why (`--dry-run`).
    Gc(gc_cmd::GcCommand),
    /// Carry a running cluster over from Spiderpool or Whereabouts, every pod keeping its
    /// address (docs/migration.md).
    #[command(subcommand)]
    Migrate(migrate_cmd::MigrateCommand),
    /// Audit a cluster's addresses online (check) and release what a report found leaked
    /// (docs/audit.md).
    #[command(subcommand)]
    Ipam(ipam_cmd::IpamCommand),
    /// Fleet ranges: per-cluster ranges and prefixes from IPAMPools.
    #[command(subcommand)]
    Fleet(fleet_cmd::FleetCommand),
    /// Print the CustomResourceDefinitions of allot.dev (or write one file per CRD with --out,
    /// or apply them to the cluster with --apply).
    Crds {
        /// A directory to write `PLURAL.allot.dev.yaml` files to (the repository's `crds/`).
        #[arg(long, conflicts_with = "apply")]
        out: Option<PathBuf>,
        /// Apply them to the cluster of --kubeconfig (else in-cluster): server-side apply,
        /// never over a CRD a newer allot applied; then wait until each is Established. The
        /// Helm chart runs it before every install and upgrade, since Helm never upgrades CRDs.
        #[arg(long)]
        apply: bool,
        /// Delete them from the cluster, with every object of theirs: the last step of an
        /// uninstall. Takes off the finalizer a controller that is gone left on pools and
        /// Subnets, and webhook configurations left calling a Service that is gone. Waits for
        /// a controller that is stopping to give its Lease up; refused while one still leads.
        #[arg(long, conflicts_with_all = ["apply", "out"])]
        delete: bool,
        /// With --apply: how long to wait for the CRDs to be Established; with --delete, for
        /// the controller to stop leading and then for the CRDs to be gone.
        #[arg(long, value_name = "SECONDS", default_value_t = 60)]
        wait_seconds: u64,
    },
    /// The CNI plugin on a node.
    #[command(subcommand)]
    Cni(cni_cmd::CniCommand),
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Run scenario files (or directories of them) against a policy.
    Test {
        #[command(flatten)]
        policy: PolicyArgs,
        /// Scenario files or directories (searched recursively for *.yaml, *.yml).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print passing scenarios too.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Print the whole decision trace for one scenario.
    Explain {
        #[command(flatten)]
        policy: PolicyArgs,
        /// A scenario file (with several documents, pick one with --doc).
        scenario: PathBuf,
        /// Which document of a multi-document file (1-based).
        #[arg(long, default_value_t = 1)]
        doc: usize,
    },
    /// Measure decision latency on a synthetic inventory.
    Bench {
        #[command(flatten)]
        policy: PolicyArgs,
        /// Pools in the inventory (all cluster defaults, mixed affinities).
        #[arg(long, default_value_t = 100)]
        pools: usize,
        /// Decisions to time (after a warm-up of a tenth as many).
        #[arg(long, default_value_t = 20_000)]
        iterations: usize,
    },
    /// Create a policy crate that starts as the default policy, with one scenario.
    New(policy_cmd::NewArgs),
    /// Print every scenario whose decision differs between two policies (exit 1 if any).
    Diff(policy_cmd::DiffArgs),
    /// Push a policy component to an OCI registry; prints its digests.
    Push(policy_cmd::PushArgs),
    /// Pull a policy component from an OCI registry, verifying its digests.
    Pull(policy_cmd::PullArgs),
    /// Write the decisions an agent made recently as scenario files.
    Record(policy_cmd::RecordArgs),
}

#[derive(Args)]
struct PolicyArgs {
    /// A policy component (.wasm); the embedded default policy when omitted.
    #[arg(long, value_name = "FILE.wasm")]
    policy: Option<PathBuf>,
    /// Refuse the policy unless its sha256 is this (hex).
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
    /// Wall-clock budget of one policy call, in milliseconds.
    #[arg(long, default_value_t = 100)]
    deadline_ms: u64,
    /// Memory a policy instance may use, in MiB.
    #[arg(long, default_value_t = 64)]
    memory_mib: usize,
}

impl PolicyArgs {
    fn load(&self) -> anyhow::Result<LoadedPolicy> {
        let limits = Limits {
            memory_bytes: self.memory_mib << 20,
            deadline: Duration::from_millis(self.deadline_ms),
            ..Limits::default()
        };
        let engine = PolicyEngine::new(limits, PrecompiledCache::default_location())?;
        let mut source = match &self.policy {
            Some(path) => PolicySource::file(path)?,
            None => PolicySource::embedded_default(),
        };
        if let Some(hex) = &self.sha256 {
            source = source.with_sha256(hex);
        }
        Ok(engine.load(&source)?)
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: not in a file, a pipe or a container's log.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none(),
        )
        .init();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("allotctl: {}", allot_core::store::report(e.as_ref()));
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Policy(PolicyCommand::Test {
            policy,
            paths,
            verbose,
        }) => test(&policy, &paths, verbose),
        Command::Policy(PolicyCommand::Explain {
            policy,
            scenario,
            doc,
        }) => explain(&policy, &scenario, doc),
        Command::Policy(PolicyCommand::Bench {
            policy,
            pools,
            iterations,
        }) => bench(&policy, pools, iterations),
        Command::Policy(PolicyCommand::New(args)) => policy_cmd::new(&args),
        Command::Policy(PolicyCommand::Diff(args)) => policy_cmd::diff(&args),
        Command::Policy(PolicyCommand::Push(args)) => policy_cmd::push(&args),
        Command::Policy(PolicyCommand::Pull(args)) => policy_cmd::pull(&args),
        Command::Policy(PolicyCommand::Record(args)) => policy_cmd::record(&args),
        Command::Claims(c) => store_cmd::claims_command(&cli.store, c),
        Command::Pool(c) => store_cmd::pool_command(&cli.store, c),
        Command::Fleet(c) => fleet_cmd::fleet_command(c),
        Command::Gc(c) => gc_cmd::gc_command(&cli.store, &c),
        Command::Migrate(c) => migrate_cmd::migrate_command(&cli.store, &c),
        Command::Ipam(c) => ipam_cmd::ipam_command(&cli.store, &c),
        Command::Crds {
            delete: true,
            wait_seconds,
            ..
        } => crds_delete::delete(
            cli.store.kubeconfig.as_deref(),
            Duration::from_secs(wait_seconds),
        ),
        Command::Crds {
            out, apply: false, ..
        } => crds_cmd::print_or_write(out.as_deref()),
        Command::Crds { wait_seconds, .. } => crds_cmd::apply(
            cli.store.kubeconfig.as_deref(),
            Duration::from_secs(wait_seconds),
        ),
        Command::Cni(c) => cni_cmd::command(c),
    }
}

fn test(args: &PolicyArgs, paths: &[PathBuf], verbose: bool) -> anyhow::Result<ExitCode> {
    let scenarios = scenario::load_all(paths)?;
    let policy = args.load()?;
    let (mut passed, mut failed) = (0usize, 0usize);
    for (n, loaded) in scenarios.iter().enumerate() {
        let description = loaded
            .scenario
            .as_ref()
            .ok()
            .and_then(|s| s.description.as_deref())
            .unwrap_or("");
        match harness::run(&policy, loaded, n as u64 + 1) {
            harness::Verdict::Pass => {
                passed += 1;
                if verbose {
                    println!("ok    {}", loaded.label);
                }
            }
            harness::Verdict::Fail(mismatches) => {
                failed += 1;
                println!("FAIL  {}", loaded.label);
                if !description.is_empty() {
                    println!("    ({})", description.trim());
                }
                print!("{}", harness::render_failure(&mismatches));
            }
            harness::Verdict::Broken(why) => {
                failed += 1;
                println!("FAIL  {}\n    {why}", loaded.label);
            }
        }
    }
    println!(
        "policy {} (sha256 {}, allot:policy@{})",
        policy.name(),
        &policy.sha256()[..16],
        policy.contract_version()
    );
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn explain(args: &PolicyArgs, path: &std::path::Path, doc: usize) -> anyhow::Result<ExitCode> {
    let docs = scenario::load_file(path);
    let Some(loaded) = docs.get(doc.wrapping_sub(1)) else {
        bail!(
            "{} has {} document(s); --doc {doc} is out of range",
            path.display(),
            docs.len()
        );
    };
    let scenario = loaded
        .scenario
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{}: {e}", loaded.label))?;
    let inputs = scenario
        .inputs(1)
        .map_err(|e| anyhow::anyhow!("{}: invalid inventory: {e}", loaded.label))?;
    let policy = args.load()?;
    println!("scenario {}", loaded.label);
    if let Some(d) = &scenario.description {
        println!("  {}", d.trim());
    }
    println!(
        "policy {} (sha256 {}, allot:policy@{})",
        policy.name(),
        policy.sha256(),
        policy.contract_version()
    );
    let req = &inputs.request;
    println!(
        "pod {}/{} on node {}, {} pools in the inventory",
        req.pod.namespace,
        req.pod.name,
        req.node.name,
        inputs.inventory.pools.len()
    );
    let result = policy.decide(&inputs.inventory, req);
    print!("{}", harness::explain(&inputs.inventory, req, &result));
    let verdict = harness::compare(&scenario.expect, &inputs.inventory, &result);
    if verdict.is_empty() {
        println!("expectations: met");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("expectations: NOT met");
        print!("{}", harness::render_failure(&verdict));
        Ok(ExitCode::FAILURE)
    }
}

fn bench(args: &PolicyArgs, pools: usize, iterations: usize) -> anyhow::Result<ExitCode> {
    if pools == 0 || iterations == 0 {
        bail!("--pools and --iterations must be at least 1");
    }
    let load_started = Instant::now();
    let policy = args.load()?;
    let load_time = load_started.elapsed();
    let inventory = Arc::new(workload::inventory(pools));
    let request = workload::request(&inventory);
    // The first call instantiates and pushes the inventory; report it apart.
    let first_started = Instant::now();
    let decision = policy
        .decide(&inventory, &request)
        .context("the first decision failed")?;
    let first = first_started.elapsed();
    for _ in 0..iterations / 10 {
        policy.decide(&inventory, &request)?;
    }
    let mut samples = Vec::with_capacity(iterations);
    let started = Instant::now();
    for _ in 0..iterations {
        let t = Instant::now();
        std::hint::black_box(policy.decide(&inventory, &request)?);
        samples.push(t.elapsed());
    }
    let total = started.elapsed();
    samples.sort_unstable();
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let order_len = decision.nics[0]
        .families
        .first()
        .map_or(0, |f| f.order.len());
    println!(
        "policy {} (sha256 {}, {} in {:.1} ms)",
        policy.name(),
        &policy.sha256()[..16],
        if policy.from_cache() {
            "loaded from cache"
        } else {
            "compiled"
        },
        load_time.as_secs_f64() * 1e3
    );
    println!("{pools} pools ({order_len} survive filtering), {iterations} decisions");
    println!(
        "first decision (instantiate + load inventory): {:.1} µs",
        us(first)
    );
    println!(
        "p50 {:.1} µs  p90 {:.1} µs  p99 {:.1} µs  max {:.1} µs  {:.0} decisions/s",
        us(pct(0.50)),
        us(pct(0.90)),
        us(pct(0.99)),
        us(*samples.last().expect("iterations >= 1")),
        iterations as f64 / total.as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
