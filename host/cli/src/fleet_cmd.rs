//! `allotctl fleet plan`: a fleet's allocations computed offline, with the decisions the
//! controller makes (allot_controller::fleet::plan), from the objects a platform team would apply.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use allot_controller::fleet::{FleetCluster, Plan, plan};
use allot_k8s::{IPAMAllocation, IPAMAllocationSpec, IPAMPool};
use anyhow::{Context as _, bail};
use clap::{Subcommand, ValueEnum};
use serde::Deserialize;

/// The label a Cluster API `Cluster` carries its datacenter in, unless `--datacenter-label`
/// says otherwise.
pub const DATACENTER_LABEL: &str = "allot.dev/datacenter";

#[derive(Subcommand)]
pub enum FleetCommand {
    /// Compute every cluster's allocations offline (no cluster needed) and print them.
    Plan {
        /// IPAMPool objects, and optionally IPAMAllocation objects already held (kept).
        #[arg(short = 'f', long = "filename", value_name = "POOLS.yaml")]
        pools: PathBuf,
        /// The clusters: Cluster API `Cluster` objects (datacenter from a label), IPAMAllocation
        /// requests (`spec.dc` set, no addresses), or entries {name, namespace, datacenter}.
        #[arg(long, value_name = "CLUSTERS.yaml")]
        clusters: PathBuf,
        /// The label of a Cluster API `Cluster` that names its datacenter.
        #[arg(long, default_value = DATACENTER_LABEL)]
        datacenter_label: String,
        /// `text` for people; `yaml` prints the IPAMAllocation objects.
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Text,
    Yaml,
}

pub fn fleet_command(command: FleetCommand) -> anyhow::Result<ExitCode> {
    match command {
        FleetCommand::Plan {
            pools,
            clusters,
            datacenter_label,
            output,
        } => plan_command(&pools, &clusters, &datacenter_label, output),
    }
}

/// A plain cluster entry of `--clusters`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlainCluster {
    name: String,
    /// Kubermatic's naming when omitted: `cluster-NAME`.
    #[serde(default)]
    namespace: Option<String>,
    datacenter: String,
}

/// Every object of a YAML file: documents, each one object, a list of them, or a `kind: List`.
fn items(path: &Path) -> anyhow::Result<Vec<serde_yaml::Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (n, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc)
            .with_context(|| format!("{}: document {} is not YAML", path.display(), n + 1))?;
        match value {
            serde_yaml::Value::Null => {}
            serde_yaml::Value::Sequence(items) => out.extend(items),
            v if v["kind"].as_str() == Some("List") => {
                out.extend(v["items"].as_sequence().cloned().unwrap_or_default())
            }
            v => out.push(v),
        }
    }
    Ok(out)
}

fn object_name(v: &serde_yaml::Value) -> String {
    let name = v["metadata"]["name"].as_str().unwrap_or("(unnamed)");
    match v["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

fn read_pools(path: &Path) -> anyhow::Result<(Vec<IPAMPool>, Vec<IPAMAllocation>)> {
    let (mut pools, mut allocations) = (Vec::new(), Vec::new());
    for v in items(path)? {
        let what = format!("{}: {}", path.display(), object_name(&v));
        match v["kind"].as_str() {
            Some("IPAMPool") => pools.push(
                serde_yaml::from_value(v).with_context(|| format!("{what}: not an IPAMPool"))?,
            ),
            Some("IPAMAllocation") => allocations.push(
                serde_yaml::from_value(v)
                    .with_context(|| format!("{what}: not an IPAMAllocation"))?,
            ),
            other => bail!(
                "{what}: kind {} is neither IPAMPool nor IPAMAllocation; list clusters in --clusters",
                other.unwrap_or("(none)")
            ),
        }
    }
    if pools.is_empty() {
        bail!(
            "{} holds no IPAMPool: nothing to plan (see examples/fleet/pools.yaml)",
            path.display()
        );
    }
    Ok((pools, allocations))
}

/// The clusters, merged by namespace (one cluster per namespace), and why some were refused.
struct Clusters {
    clusters: BTreeMap<String, FleetCluster>,
    /// Allocations held, given with the requests.
    held: Vec<IPAMAllocation>,
    refused: Vec<String>,
}

fn read_clusters(path: &Path, label: &str) -> anyhow::Result<Clusters> {
    let mut out = Clusters {
        clusters: BTreeMap::new(),
        held: Vec::new(),
        refused: Vec::new(),
    };
    for v in items(path)? {
        let what = format!("{}: {}", path.display(), object_name(&v));
        let api_version = v["apiVersion"].as_str().unwrap_or_default();
        let cluster = match v["kind"].as_str() {
            Some("Cluster") if api_version.starts_with("cluster.x-k8s.io/") => {
                let name = v["metadata"]["name"]
                    .as_str()
                    .with_context(|| format!("{what}: a Cluster needs metadata.name"))?;
                let namespace = v["metadata"]["namespace"].as_str().unwrap_or("default");
                let Some(dc) = v["metadata"]["labels"][label].as_str() else {
                    out.refused.push(format!(
                        "Cluster {namespace}/{name}: no label {label}: label it with its datacenter, or name the label that holds it with --datacenter-label"
                    ));
                    continue;
                };
                FleetCluster {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    datacenter: dc.to_string(),
                    pools: None,
                }
            }
            Some("IPAMAllocation") => {
                let object: IPAMAllocation = serde_yaml::from_value(v)
                    .with_context(|| format!("{what}: not an IPAMAllocation"))?;
                let pool = object.metadata.name.clone().unwrap_or_default();
                let namespace = object.metadata.namespace.clone().with_context(|| {
                    format!("{what}: an IPAMAllocation needs a namespace (its cluster's)")
                })?;
                let dc = object.spec.dc.clone();
                if object.spec != request_spec(&object.spec) {
                    out.held.push(object);
                }
                FleetCluster {
                    name: namespace.clone(),
                    namespace,
                    datacenter: dc,
                    pools: Some(BTreeSet::from([pool])),
                }
            }
            Some(other) => bail!(
                "{what}: kind {other} ({api_version}) is not a cluster: list Cluster API Clusters (cluster.x-k8s.io), IPAMAllocation requests or {{name, namespace, datacenter}} entries"
            ),
            None => {
                let plain: PlainCluster = serde_yaml::from_value(v).with_context(|| {
                    format!(
                        "{}: a cluster entry needs name and datacenter (namespace is optional)",
                        path.display()
                    )
                })?;
                FleetCluster {
                    namespace: plain
                        .namespace
                        .unwrap_or_else(|| format!("cluster-{}", plain.name)),
                    name: plain.name,
                    datacenter: plain.datacenter,
                    pools: None,
                }
            }
        };
        merge(&mut out, cluster);
    }
    Ok(out)
}

fn request_spec(spec: &IPAMAllocationSpec) -> IPAMAllocationSpec {
    IPAMAllocationSpec {
        allocation_type: spec.allocation_type,
        dc: spec.dc.clone(),
        ..IPAMAllocationSpec::default()
    }
}

/// Adds `c` to the cluster of its namespace: requests of one cluster join, two clusters in one
/// namespace or two datacenters for one namespace are refused.
fn merge(out: &mut Clusters, c: FleetCluster) {
    let Some(have) = out.clusters.get_mut(&c.namespace) else {
        out.clusters.insert(c.namespace.clone(), c);
        return;
    };
    if have.datacenter != c.datacenter {
        out.refused.push(format!(
            "{} in namespace {}: datacenter {} differs from {}'s {}; one namespace is one cluster in one datacenter",
            c.name, c.namespace, c.datacenter, have.name, have.datacenter
        ));
        return;
    }
    match (&mut have.pools, c.pools) {
        (None, None) if have.name != c.name => out.refused.push(format!(
            "cluster {} shares namespace {} with cluster {}: an IPAMAllocation is named after its pool in its cluster's namespace, so give each cluster a namespace of its own",
            c.name, c.namespace, have.name
        )),
        (None, _) => {}
        (mine @ Some(_), None) => {
            *mine = None;
            have.name = c.name;
        }
        (Some(mine), Some(theirs)) => mine.extend(theirs),
    }
}

fn plan_command(
    pools_path: &Path,
    clusters_path: &Path,
    label: &str,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let (pools, mut held) = read_pools(pools_path)?;
    let clusters = read_clusters(clusters_path, label)?;
    held.extend(clusters.held);
    let fleet: Vec<FleetCluster> = clusters.clusters.into_values().collect();
    let planned = plan(&pools, &held, &fleet);
    match output {
        Output::Text => print!("{}", render(&planned, &clusters.refused)),
        Output::Yaml => {
            for e in &planned.entries {
                if let Ok((allocation, _)) = &e.outcome {
                    let mut object = IPAMAllocation::new(
                        &e.pool,
                        IPAMAllocationSpec::recording(allocation, &e.dc),
                    );
                    object.metadata.namespace = Some(e.namespace.clone());
                    print!("---\n{}", serde_yaml::to_string(&object)?);
                }
            }
            for line in planned
                .entries
                .iter()
                .filter_map(|e| e.outcome.as_ref().err())
                .map(ToString::to_string)
                .chain(clusters.refused.iter().cloned())
            {
                eprintln!("refused: {line}");
            }
        }
    }
    Ok(if planned.refused() == 0 && clusters.refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The plan as text: per pool and datacenter, one line per cluster; then releases, warnings and
/// a summary.
fn render(p: &Plan, refused_clusters: &[String]) -> String {
    let mut out = String::new();
    let mut heading = (String::new(), String::new());
    let who = |e: &allot_controller::fleet::Entry| {
        if e.cluster == e.namespace {
            e.namespace.clone()
        } else {
            format!("{} ({})", e.namespace, e.cluster)
        }
    };
    let width = p
        .entries
        .iter()
        .map(|e| who(e).chars().count())
        .max()
        .unwrap_or(0);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for e in &p.entries {
        if heading.0 != e.pool {
            let _ = writeln!(out, "IPAMPool {}", e.pool);
            heading = (e.pool.clone(), String::new());
        }
        if heading.1 != e.dc {
            let _ = writeln!(out, "  datacenter {}", e.dc);
            heading.1 = e.dc.clone();
        }
        let who = who(e);
        match &e.outcome {
            Ok((allocation, change)) => {
                *counts.entry(change.to_string()).or_default() += 1;
                let _ = writeln!(out, "    {who:width$}  {allocation}  {change}");
            }
            Err(refusal) => {
                *counts.entry("refused".into()).or_default() += 1;
                let _ = writeln!(out, "    {who:width$}  refused: {refusal}");
            }
        }
    }
    if !p.releases.is_empty() {
        let _ = writeln!(out, "released");
        for r in &p.releases {
            let _ = writeln!(
                out,
                "  IPAMPool {} {}: {} ({})",
                r.pool, r.namespace, r.allocation, r.why
            );
        }
    }
    if !refused_clusters.is_empty() {
        let _ = writeln!(out, "clusters refused");
        for r in refused_clusters {
            let _ = writeln!(out, "  {r}");
        }
    }
    if !p.warnings.is_empty() {
        let _ = writeln!(out, "warnings");
        for w in &p.warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    let count = |k: &str| counts.get(k).copied().unwrap_or(0);
    let _ = writeln!(
        out,
        "{} new, {} kept, {} grown, {} refused, {} released",
        count("new"),
        count("kept"),
        count("grown"),
        count("refused") + refused_clusters.len(),
        p.releases.len()
    );
    out
}
