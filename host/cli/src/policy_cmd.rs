//! `allotctl policy new|diff|push|pull|record`: authoring, distribution and safe rollout of
//! policies (`test`, `explain` and `bench` are in main.rs and harness.rs).

mod diff;
mod record;
mod scaffold;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use allot_policy::{Limits, LoadedPolicy, PolicyEngine, PolicySource, PrecompiledCache};
use anyhow::{Context as _, bail};
use clap::Args;

#[derive(Args)]
pub struct NewArgs {
    /// The crate's name (and directory): letters, digits, '-' and '_', e.g. zone-aware.
    name: String,
    /// The allot checkout whose policies/sdk and policies/default the crate builds against
    /// (path dependencies: the SDK is not on crates.io). Default: the checkout this allotctl
    /// was built from.
    #[arg(long, value_name = "DIR")]
    allot: Option<PathBuf>,
    /// Where to create the crate's directory.
    #[arg(long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,
}

#[derive(Args)]
pub struct DiffArgs {
    /// The two policies to compare, A then B (.wasm files); give the flag twice.
    #[arg(
        long = "policy",
        value_name = "FILE.wasm",
        num_args = 1,
        required = true
    )]
    policies: Vec<PathBuf>,
    /// Scenario files or directories (searched recursively for *.yaml, *.yml), e.g. the
    /// output of `allotctl policy record`.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Print the scenarios that decide the same too.
    #[arg(short, long)]
    verbose: bool,
}

#[derive(Args)]
pub struct RegistryArgs {
    /// A registry (`HOST` or `HOST:PORT`) spoken to over plain HTTP (loopback registries always
    /// are); may be repeated.
    #[arg(long, value_name = "HOST[:PORT]")]
    registry_plain_http: Vec<String>,
    /// A user name for the registry; the password comes from $ALLOT_REGISTRY_PASSWORD.
    #[arg(long, value_name = "USER")]
    registry_user: Option<String>,
}

impl RegistryArgs {
    fn options(&self) -> anyhow::Result<allot_oci::Options> {
        let credentials = match &self.registry_user {
            Some(user) => Some((
                user.clone(),
                std::env::var("ALLOT_REGISTRY_PASSWORD")
                    .context("--registry-user needs the password in $ALLOT_REGISTRY_PASSWORD")?,
            )),
            None => None,
        };
        Ok(allot_oci::Options {
            plain_http: self.registry_plain_http.clone(),
            credentials,
        })
    }
}

#[derive(Args)]
pub struct PushArgs {
    /// The policy component to push.
    file: PathBuf,
    /// Where: oci://HOST[:PORT]/REPO:TAG.
    target: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Args)]
pub struct PullArgs {
    /// What: oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:HEX.
    source: String,
    /// Where to write the component.
    #[arg(short, long, value_name = "FILE.wasm")]
    output: PathBuf,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Args)]
pub struct RecordArgs {
    /// The agent's socket.
    #[arg(long, value_name = "PATH", default_value = allot_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The directory to write one scenario file per recorded decision to (created if needed).
    #[arg(short, long, value_name = "DIR")]
    out: PathBuf,
    /// Only decisions made by the policy with this sha256 (hex; a prefix will do).
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,
}

/// `allotctl policy new NAME`.
pub fn new(args: &NewArgs) -> anyhow::Result<ExitCode> {
    let allot = args.allot.clone().unwrap_or_else(scaffold::built_from);
    let dir = scaffold::new_policy(&args.dir, &args.name, &allot)?;
    let wasm = args.name.replace('-', "_");
    println!("created {}", dir.display());
    println!("next:");
    println!("  cd {}", dir.display());
    println!("  cargo build --release --target wasm32-wasip2");
    println!("  allotctl policy test --policy target/wasm32-wasip2/release/{wasm}.wasm scenarios/");
    Ok(ExitCode::SUCCESS)
}

fn load(path: &Path) -> anyhow::Result<LoadedPolicy> {
    let engine = PolicyEngine::new(Limits::default(), PrecompiledCache::default_location())?;
    Ok(engine.load(&PolicySource::file(path)?)?)
}

/// `allotctl policy diff --policy A --policy B SCENARIOS…`: 1 when any scenario decides
/// differently, 0 when none does, 2 on errors (a policy or scenario that cannot be read).
pub fn diff(args: &DiffArgs) -> anyhow::Result<ExitCode> {
    let [a, b] = &args.policies[..] else {
        bail!(
            "give exactly two policies, --policy A.wasm --policy B.wasm (got {})",
            args.policies.len()
        );
    };
    let scenarios = crate::scenario::load_all(&args.paths)?;
    let (pa, pb) = (load(a)?, load(b)?);
    let report = diff::diff(&pa, &pb, &scenarios);
    println!(
        "A: {} (sha256 {}, allot:policy@{})",
        a.display(),
        &pa.sha256()[..16],
        pa.contract_version()
    );
    println!(
        "B: {} (sha256 {}, allot:policy@{})",
        b.display(),
        &pb.sha256()[..16],
        pb.contract_version()
    );
    if args.verbose {
        for loaded in &scenarios {
            let listed = report
                .differing
                .iter()
                .chain(&report.broken)
                .any(|(l, _)| *l == loaded.label);
            if !listed {
                println!("same     {}", loaded.label);
            }
        }
    }
    for (label, text) in &report.differing {
        println!("DIFFERS  {label}");
        print!("{text}");
    }
    for (label, why) in &report.broken {
        println!("ERROR    {label}\n    {why}");
    }
    println!(
        "{} differ, {} same, {} errors",
        report.differing.len(),
        report.same,
        report.broken.len()
    );
    Ok(if !report.broken.is_empty() {
        ExitCode::from(2)
    } else if !report.differing.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `allotctl policy push FILE.wasm oci://HOST/REPO:TAG`: prints the pinned reference.
pub fn push(args: &PushArgs) -> anyhow::Result<ExitCode> {
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    // Refuse to publish what no agent would load.
    let engine = PolicyEngine::new(Limits::default(), PrecompiledCache::default_location())?;
    let loaded = engine
        .load(&PolicySource::bytes(
            args.file.display().to_string(),
            bytes.clone(),
        ))
        .context("refusing to push it")?;
    let pushed = runtime()?.block_on(allot_oci::push(
        &bytes,
        &args.target,
        &args.registry.options()?,
    ))?;
    println!(
        "pushed {} (allot:policy@{}) to {}",
        args.file.display(),
        loaded.contract_version(),
        args.target
    );
    println!("manifest  {}", pushed.manifest_digest);
    println!("component {}", pushed.component_digest);
    println!("{}", pushed.pinned);
    Ok(ExitCode::SUCCESS)
}

/// `allotctl policy pull oci://… -o FILE.wasm`: every digest verified before the file is written.
pub fn pull(args: &PullArgs) -> anyhow::Result<ExitCode> {
    let source = allot_oci::OciSource::parse(&args.source)?;
    let pulled = runtime()?.block_on(allot_oci::pull(&source, &args.registry.options()?))?;
    let tmp = args.output.with_extension("wasm.partial");
    std::fs::write(&tmp, &pulled.component)
        .and_then(|()| std::fs::rename(&tmp, &args.output))
        .with_context(|| format!("writing {}", args.output.display()))?;
    println!("pulled {} to {}", args.source, args.output.display());
    println!("manifest  {}", pulled.manifest_digest);
    println!("component {}", pulled.component_digest);
    println!("{}", source.with_digest(&pulled.manifest_digest));
    Ok(ExitCode::SUCCESS)
}

/// `allotctl policy record --out DIR`.
pub fn record(args: &RecordArgs) -> anyhow::Result<ExitCode> {
    record::record(&args.socket, &args.out, args.sha256.as_deref())
}
