//! `allotctl ipam check [-o json]` and `allotctl ipam release --from-report FILE`: the online
//! audit (`allot_controller::audit`, core's `allot_core::audit`) on demand, and the release of
//! what a report found leaked, after a second sighting. No lock: agents keep allocating while
//! it runs. `allotctl ipam release --virtual-machine NS/NAME` frees what allot keeps for a
//! KubeVirt VM, on purpose ([`vm_release`]).

mod vm_release;

mod report;

use std::path::PathBuf;
use std::process::ExitCode;

use crate::store_args::StoreArgs;
use allot_controller::args::GcArgs;
use allot_controller::audit::check_now;
use allot_core::audit::{Clocks, Kept, repair};
use allot_core::store::Store;
use anyhow::Context as _;
use clap::Subcommand;

use crate::cluster::connect;
use crate::store_cmd::Output;

#[derive(Subcommand)]
pub enum IpamCommand {
    /// Compare every pod's addresses (status.podIPs, Multus's network status), allot's
    /// Endpoints, the claims and the IPPools' counts; print what disagrees, with the objects
    /// involved (exit 1 when anything does).
    Check {
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// GC's decision table, which says when a claim has no live holder (flags or
        /// ALLOT_GC_…, as the controller takes them).
        #[command(flatten)]
        gc: GcArgs,
    },
    /// Release the leaked claims a report (`ipam check -o json`) lists that a fresh check still
    /// finds leaked and unchanged, once GC would release them (its grace period after the
    /// report, the claim's age, the pod's grace period and the additional delay, as the GC
    /// flags set them: give the controller's); never anything else. Or, with
    /// `--virtual-machine`, the addresses allot keeps for a KubeVirt VM, so that its next
    /// launcher pod gets new ones.
    #[command(group(clap::ArgGroup::new("what").required(true).args(["from_report", "virtual_machine"])))]
    Release {
        /// The report of an earlier `allotctl ipam check -o json`.
        #[arg(long = "from-report", value_name = "FILE")]
        from_report: Option<PathBuf>,
        /// The virtual machine NAMESPACE/NAME whose kept addresses to release: those no
        /// launcher pod holds now (a stopped VM's, or one whose next launcher pod cannot keep
        /// them); an address a launcher pod holds is left to it.
        #[arg(long, value_name = "NAMESPACE/NAME", conflicts_with = "from_report")]
        virtual_machine: Option<String>,
        /// With --virtual-machine: only this address of the VM's.
        #[arg(long, value_name = "ADDRESS", requires = "virtual_machine")]
        address: Option<std::net::IpAddr>,
        /// With --virtual-machine: release without asking (needed when standard input is not a
        /// terminal).
        #[arg(long, requires = "virtual_machine")]
        yes: bool,
        #[command(flatten)]
        gc: GcArgs,
    },
}

pub fn ipam_command(store: &StoreArgs, command: &IpamCommand) -> anyhow::Result<ExitCode> {
    match command {
        IpamCommand::Check { output, gc } => {
            let cluster = connect(store, "ipam check")?;
            let settings = gc.settings();
            let shared: std::sync::Arc<dyn Store> = cluster.store.clone();
            let found =
                cluster
                    .runtime
                    .block_on(check_now(&cluster.client, shared, &settings.table))?;
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&report::to_json(&found, now()))?
                ),
                Output::Table => report::print(&found),
            }
            Ok(if found.is_clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        IpamCommand::Release {
            virtual_machine: Some(vm),
            address,
            yes,
            ..
        } => vm_release::release(store, vm, *address, *yes),
        IpamCommand::Release {
            from_report: Some(from_report),
            gc,
            ..
        } => {
            let text = std::fs::read_to_string(from_report)
                .with_context(|| format!("cannot read {}", from_report.display()))?;
            let value: serde_json::Value = serde_json::from_str(&text).with_context(|| {
                format!(
                    "{} is not JSON: give the output of `allotctl ipam check -o json`",
                    from_report.display()
                )
            })?;
            let reported = report::leaked_claims(&value)
                .with_context(|| format!("{} is not a report", from_report.display()))?;
            let first_seen = report::checked_at(&value)
                .with_context(|| format!("{} is not a report", from_report.display()))?;
            if reported.is_empty() {
                println!("the report lists no leaked claim: nothing to release");
                return Ok(ExitCode::SUCCESS);
            }
            let cluster = connect(store, "ipam release")?;
            let settings = gc.settings();
            let shared: std::sync::Arc<dyn Store> = cluster.store.clone();
            let again =
                cluster
                    .runtime
                    .block_on(check_now(&cluster.client, shared, &settings.table))?;
            let clocks = Clocks {
                grace: settings.grace,
                additional_delay: settings.table.additional_grace_delay,
                first_seen,
                now: now(),
            };
            let (due, mut kept) = repair(&reported, &again, &clocks);
            let released = cluster
                .store
                .release_unchanged(&due)
                .context("cannot release the leaks (nothing more was released)")?;
            for c in &released {
                println!(
                    "released {} (IPPool {}) of {}/{}",
                    c.address, c.pool, c.pod.namespace, c.pod.name
                );
            }
            kept.extend(
                due.into_iter()
                    .filter(|d| !released.iter().any(|c| c.address == d.address))
                    .map(|c| (c, Kept::NoLongerLeaked)),
            );
            for (c, why) in &kept {
                println!(
                    "kept {} (IPPool {}) of {}/{}: {why}",
                    c.address, c.pool, c.pod.namespace, c.pod.name
                );
            }
            println!(
                "{} of {} reported leak(s) released",
                released.len(),
                reported.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        IpamCommand::Release { .. } => {
            anyhow::bail!("give --from-report FILE or --virtual-machine NAMESPACE/NAME")
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
