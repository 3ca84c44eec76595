//! `allotctl migrate spiderpool|whereabouts [--dry-run]`: carry a running cluster over from
//! another IPAM without renumbering. Reads the peer's objects and the pods, plans with core's
//! `allot_core::migrate::plan` against what allot holds already, prints the plan, and (without
//! `--dry-run`) writes it in the order that keeps every address safe: ReservedIPs, Subnets,
//! claims, Endpoints, IPPools last. Run again, it finds everything in place; interrupted, the
//! next run writes what is missing. Anything it cannot carry over is refused, naming the
//! objects, and nothing is written. The switch-over sequence around it: docs/migration.md.

mod read;
mod write;

use std::process::ExitCode;

use crate::store_args::StoreArgs;
use allot_core::migrate::{Inputs, Peer, Plan, plan};
use allot_core::store::Store;
use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::cluster::{Cluster, connect};

#[derive(Subcommand)]
pub enum MigrateCommand {
    /// From Spiderpool: SpiderIPPools (with status.allocatedIPs), SpiderSubnets,
    /// SpiderReservedIPs and SpiderEndpoints.
    Spiderpool(MigrateArgs),
    /// From Whereabouts: the ranges of the NetworkAttachmentDefinitions that use it, its IPPools'
    /// allocations and its OverlappingRangeIPReservations.
    Whereabouts(MigrateArgs),
}

#[derive(Args)]
pub struct MigrateArgs {
    /// Print what would be written; write nothing.
    #[arg(long)]
    dry_run: bool,
}

pub fn migrate_command(store: &StoreArgs, command: &MigrateCommand) -> anyhow::Result<ExitCode> {
    let (peer, args) = match command {
        MigrateCommand::Spiderpool(a) => (Peer::Spiderpool, a),
        MigrateCommand::Whereabouts(a) => (Peer::Whereabouts, a),
    };
    let cluster = connect(store, "migrate")?;
    let read = cluster
        .runtime
        .block_on(read::read(&cluster.client, peer))?;
    let mut current = read.current.clone();
    current.claims = cluster.store.all().context("cannot read allot's claims")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let planned = plan(&Inputs {
        peer,
        pools: &read.decoded.pools,
        subnets: &read.decoded.subnets,
        reserved: &read.decoded.reserved,
        records: &read.decoded.records,
        unreadable: &read.decoded.unreadable,
        pods: &read.pods,
        current: &current,
        now,
    });
    let plan = match planned {
        Ok(plan) => plan,
        Err(refusals) => {
            for r in &refusals {
                eprintln!("allotctl: {r}");
            }
            eprintln!(
                "allotctl: {} refusal(s); nothing was written: fix them and run again",
                refusals.len()
            );
            return Ok(ExitCode::from(1));
        }
    };
    let endpoints = write::endpoint_changes(&plan, &read.endpoints);
    print(peer, &plan, &endpoints, &read.networks);
    if plan.objects_done() && endpoints.iter().all(|e| e.change == write::Change::Same) {
        println!(
            "nothing to write: everything {} records is in allot",
            peer.as_str()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if args.dry_run {
        println!("nothing was written (dry run)");
        return Ok(ExitCode::SUCCESS);
    }
    write(&cluster, &plan, &endpoints)?;
    println!(
        "written; `allotctl migrate {}` again finds nothing to do",
        peer.as_str()
    );
    Ok(ExitCode::SUCCESS)
}

fn write(
    cluster: &Cluster,
    plan: &Plan,
    endpoints: &[write::EndpointChange],
) -> anyhow::Result<()> {
    let client = &cluster.client;
    cluster.runtime.block_on(write::reserved(client, plan))?;
    cluster.runtime.block_on(write::subnets(client, plan))?;
    write::claims(cluster.store.as_ref(), plan)?;
    cluster
        .runtime
        .block_on(write::endpoints(client, endpoints))?;
    cluster.runtime.block_on(write::pools(client, plan))
}

/// What will be (or was) written, in order.
fn print(
    peer: Peer,
    plan: &Plan,
    endpoints: &[write::EndpointChange],
    networks: &[(String, Vec<String>)],
) {
    let state = |exists: bool| if exists { "in place" } else { "create" };
    for w in &plan.reserved {
        println!(
            "ReservedIP {:<30} {:<8} from {}",
            w.name,
            state(w.exists),
            w.sources.join(", ")
        );
    }
    for w in &plan.subnets {
        println!(
            "Subnet {:<34} {:<8} from {}",
            w.name,
            state(w.exists),
            w.sources.join(", ")
        );
    }
    for c in &plan.claims {
        let interface = c.attachment.as_ref().map_or("", |a| a.interface.as_str());
        println!(
            "claim {:<35} create   IPPool {} for pod {}/{} (uid {}) on {interface}",
            c.address, c.pool, c.pod.namespace, c.pod.name, c.pod.uid
        );
    }
    for e in endpoints {
        println!(
            "Endpoint {:<32} {}",
            format!("{}/{}", e.record.namespace, e.record.name),
            e.change.as_str()
        );
    }
    for w in &plan.pools {
        println!(
            "IPPool {:<34} {:<8} from {}",
            w.name,
            state(w.exists),
            w.sources.join(", ")
        );
    }
    for note in &plan.notes {
        println!("note: {note}");
    }
    println!(
        "{} claim(s) to create, {} address(es) claimed already; {} pool(s), {} Subnet(s), {} \
         ReservedIP(s), {} Endpoint(s) to write",
        plan.claims.len(),
        plan.claimed.len(),
        plan.pools.iter().filter(|w| !w.exists).count(),
        plan.subnets.iter().filter(|w| !w.exists).count(),
        plan.reserved.iter().filter(|w| !w.exists).count(),
        endpoints
            .iter()
            .filter(|e| e.change != write::Change::Same)
            .count()
    );
    if peer == Peer::Whereabouts {
        for (network, pools) in networks {
            let pools: Vec<String> = pools.iter().map(|p| format!("{p:?}")).collect();
            println!(
                "then: NetworkAttachmentDefinition {network}: its ipam section becomes \
                 {{\"type\": \"allot\", \"default_ipv4_ippool\"/\"default_ipv6_ippool\": [{}]}} \
                 (docs/migration.md)",
                pools.join(", ")
            );
        }
    }
}
