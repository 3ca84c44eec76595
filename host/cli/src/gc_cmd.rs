//! `allotctl --store kubernetes gc --dry-run`: what the controller's garbage collection would
//! release, and why, against the cluster as it is now. Changes nothing.

use std::process::ExitCode;

use allot_controller::args::GcArgs;
use allot_controller::gc::report::{dry_run, when};
use allot_store::OpenedStore;
use anyhow::{Context as _, bail};
use clap::Args;

use crate::store_args::StoreArgs;

#[derive(Args)]
pub struct GcCommand {
    /// Print what would be released and why; change nothing. (Releasing is the controller's
    /// job: it waits for a second sighting past the grace period and reads each pod again.)
    #[arg(long)]
    dry_run: bool,
    /// The decision table's settings, as the controller takes them (flags or ALLOT_GC_…).
    #[command(flatten)]
    gc: GcArgs,
}

pub fn gc_command(store: &StoreArgs, command: &GcCommand) -> anyhow::Result<ExitCode> {
    if !command.dry_run {
        bail!(
            "allotctl gc only reports: add --dry-run. Leaked addresses are released by \
             allot-controller, after a second sighting past the grace period and a fresh read of \
             each pod"
        );
    }
    let OpenedStore::Kubernetes(claims) = store.open(std::path::Path::new("/nonexistent"))? else {
        bail!(
            "GC judges claims against the cluster's pods: use --store kubernetes (with \
             --kubeconfig, or the in-cluster ServiceAccount)"
        );
    };
    let settings = command.gc.settings();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let findings = runtime.block_on(async {
        let client = allot_store::kube_client(store.kubeconfig.as_deref()).await?;
        dry_run(client, claims, &settings).await
    })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if findings.is_empty() {
        println!("nothing to release: every claim's pod still needs it");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<40} {:<16} {:<40} {:<30} WHEN",
        "ADDRESS", "POOL", "POD", "REASON"
    );
    for f in &findings {
        let c = &f.claim;
        println!(
            "{:<40} {:<16} {:<40} {:<30} {}",
            c.address,
            c.pool,
            format!("{}/{}", c.pod.namespace, c.pod.name),
            f.reason.as_str(),
            when(f, now, &settings)
        );
    }
    println!();
    let mut reasons: Vec<_> = findings.iter().map(|f| f.reason).collect();
    reasons.sort();
    reasons.dedup();
    for r in reasons {
        println!("{}: {}", r.as_str(), r.describe());
    }
    println!(
        "{} address(es) would be released; nothing was changed (dry run)",
        findings.len()
    );
    Ok(ExitCode::SUCCESS)
}
