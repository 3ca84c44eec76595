//! `allotctl --store … claims list` and `allotctl --store etcd://… pool apply|list|get`: what an
//! operator reads and writes in the claim store, without an agent.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use allot_core::config::{Object, Observation};
use allot_core::documents;
use allot_core::store::{Claim, Store};
use allot_store::etcd::config::ConfigWrite;
use allot_store::{EtcdStore, OpenedStore};
use anyhow::{Context as _, bail};
use clap::{Subcommand, ValueEnum};

use crate::store_args::StoreArgs;

/// The embedded store's file when --store is not given (the agent's default --state).
const DEFAULT_STATE: &str = "/var/lib/allot/allot.db";

#[derive(Subcommand)]
pub enum ClaimsCommand {
    /// Every claim: address, pool, network, holder, pod, last change.
    List {
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Write IPPool, Subnet and ReservedIP objects from a YAML file into etcd, checked as an
    /// agent checks them; nothing is written unless every object is accepted, and an edit that
    /// would leave a claimed address outside its pool is refused.
    Apply {
        #[arg(short = 'f', long = "filename", value_name = "FILE.yaml")]
        file: std::path::PathBuf,
    },
    /// The pools in etcd, with their claims.
    List,
    /// One object as stored (kind IPPool unless --kind).
    Get {
        name: String,
        #[arg(long, default_value = "IPPool")]
        kind: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

fn open(store: &StoreArgs) -> anyhow::Result<OpenedStore> {
    store
        .open(Path::new(DEFAULT_STATE))
        .map_err(anyhow::Error::from)
}

fn etcd(store: &StoreArgs) -> anyhow::Result<Arc<EtcdStore>> {
    match open(store)? {
        OpenedStore::Etcd(etcd) => Ok(etcd),
        OpenedStore::Sqlite(_) => bail!(
            "pools live in etcd only with --store etcd://HOST:PORT; an embedded store's pools are \
             the files of its agent's --standalone directory: edit those"
        ),
        OpenedStore::Kubernetes(_) => bail!(
            "a cluster's pools are IPPool objects: kubectl apply -f FILE.yaml (kubectl get ippools \
             lists them)"
        ),
    }
}

fn claims(store: &StoreArgs) -> anyhow::Result<Vec<Claim>> {
    open(store)?.shared().all().context("reading claims")
}

pub fn claims_command(store: &StoreArgs, command: ClaimsCommand) -> anyhow::Result<ExitCode> {
    let ClaimsCommand::List { output } = command;
    let claims = claims(store)?;
    match output {
        Output::Json => {
            let rows: Vec<serde_json::Value> = claims
                .iter()
                .map(|c| {
                    serde_json::json!({
                        "address": c.address.to_string(),
                        "pool": c.pool,
                        "network": c.network,
                        "containerID": c.attachment.as_ref().map(|a| &a.container_id),
                        "interface": c.attachment.as_ref().map(|a| &a.interface),
                        "pod": {
                            "namespace": c.pod.namespace,
                            "name": c.pod.name,
                            "uid": c.pod.uid,
                            "ownerKind": c.pod.owner_kind,
                            "ownerName": c.pod.owner_name,
                        },
                        "updatedAt": c.updated_at,
                        // Quarantined: the MAC of the host found using the address.
                        "conflictMac": c.pod.conflict_mac(),
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        }
        Output::Table => {
            println!(
                "{:<40} {:<20} {:<16} {:<28} {:<32} UPDATED",
                "ADDRESS", "POOL", "NETWORK", "HOLDER", "POD"
            );
            for c in &claims {
                let holder = match (&c.attachment, c.pod.conflict_mac()) {
                    (Some(a), _) => format!("{}/{}", short(&a.container_id), a.interface),
                    (None, Some(mac)) => format!("(conflict {mac})"),
                    (None, None) => "(kept for the pod)".into(),
                };
                println!(
                    "{:<40} {:<20} {:<16} {:<28} {:<32} {}",
                    c.address,
                    c.pool,
                    c.network,
                    holder,
                    format!("{}/{}", c.pod.namespace, c.pod.name),
                    c.updated_at
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn short(container_id: &str) -> &str {
    container_id.get(..12).unwrap_or(container_id)
}

pub fn pool_command(store: &StoreArgs, command: PoolCommand) -> anyhow::Result<ExitCode> {
    let etcd = etcd(store)?;
    match command {
        PoolCommand::Apply { file } => apply(&etcd, &file),
        PoolCommand::List => {
            let (_, observation) = etcd.load_config()?;
            let claims = etcd.all()?;
            println!(
                "{:<24} {:<7} {:<20} {:>9} {:>9} DISABLE",
                "NAME", "VERSION", "SUBNET", "ALLOCATED", "TOTAL"
            );
            for o in &observation.objects {
                let Ok(Object::Pool(pool)) = &o.object else {
                    continue;
                };
                let allocated = claims.iter().filter(|c| c.pool == o.name).count();
                println!(
                    "{:<24} {:<7} {:<20} {:>9} {:>9} {}",
                    o.name,
                    pool.family.version(),
                    pool.subnet,
                    allocated,
                    pool.assignable(&allot_core::AddrSet::empty(pool.family))
                        .len(),
                    pool.spec.disable
                );
            }
            for o in &observation.objects {
                if let Err(invalid) = &o.object {
                    eprintln!("allotctl: {} is invalid: {}", o.at, invalid.error);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        PoolCommand::Get { name, kind } => {
            let (_, entries) = etcd.config_entries()?;
            let Some(entry) = entries.iter().find(|e| e.kind == kind && e.name == name) else {
                bail!("no {kind} {name} in etcd (allotctl pool list shows what there is)");
            };
            let value: serde_json::Value = serde_json::from_str(&entry.value)
                .with_context(|| format!("{} is not JSON", entry.key))?;
            print!("{}", serde_yaml::to_string(&value)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn apply(etcd: &EtcdStore, file: &Path) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let source = file.display().to_string();
    let mut applied = Observation::default();
    documents::observe_text(&text, &source, &mut applied);
    if applied.objects.is_empty() && applied.incomplete.is_empty() {
        bail!("{source} holds no IPPool, Subnet or ReservedIP");
    }
    let (_, entries) = etcd.config_entries()?;
    let mut current = Observation::default();
    for e in &entries {
        documents::observe_text(&e.value, &e.key, &mut current);
    }
    let claims = etcd.all()?;
    if let Err(reasons) = documents::check_apply(&current, &applied, &claims) {
        for r in &reasons {
            eprintln!("allotctl: {r}");
        }
        eprintln!("allotctl: nothing was written");
        return Ok(ExitCode::from(1));
    }
    // Store each document as JSON, the form agents read back.
    let mut writes = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_json::Value = match serde::Deserialize::deserialize(doc) {
            Ok(serde_json::Value::Null) => continue,
            Ok(v) => v,
            Err(e) => bail!("{source}: {e}"),
        };
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let expected_revision = entries
            .iter()
            .find(|e| e.kind == kind && e.name == name)
            .map_or(0, |e| e.mod_revision);
        writes.push(ConfigWrite {
            kind,
            name,
            value: serde_json::to_string(&value)?,
            expected_revision,
        });
    }
    let summary: Vec<String> = writes
        .iter()
        .map(|w| format!("{} {}", w.kind, w.name))
        .collect();
    etcd.apply_config(writes)?;
    for s in &summary {
        println!("{s} applied");
    }
    Ok(ExitCode::SUCCESS)
}
