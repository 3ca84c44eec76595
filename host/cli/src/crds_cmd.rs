//! `allotctl crds`: print the CustomResourceDefinitions, write them to a directory, or apply them
//! to a cluster (`--apply`, the Helm chart's pre-install and pre-upgrade hook: Helm installs a
//! chart's `crds/` once and never upgrades them, so this does).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use allot_k8s::openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use anyhow::{Context as _, bail};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

/// The allot version that last applied a CRD. A CRD that a newer allot applied is left as it is:
/// objects stored with its newer fields would lose them to an older schema's pruning.
pub const VERSION_ANNOTATION: &str = "allot.dev/version";

/// The server-side apply field manager of `--apply`.
pub const FIELD_MANAGER: &str = "allot";

/// `allotctl crds [--out DIR]`.
pub fn print_or_write(out: Option<&Path>) -> anyhow::Result<ExitCode> {
    let files = allot_k8s::crds_yaml();
    match out {
        None => {
            for (_, yaml) in &files {
                print!("---\n{yaml}");
            }
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, yaml) in &files {
                let path = dir.join(name);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `allotctl crds --apply`: every CRD of this build, created (server-side apply) or its spec
/// replaced by this build's, then waited for until Established.
pub fn apply(kubeconfig: Option<&Path>, wait: Duration) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(apply_all(kubeconfig, wait))
}

async fn apply_all(kubeconfig: Option<&Path>, wait: Duration) -> anyhow::Result<ExitCode> {
    let client = allot_store::kube_client(kubeconfig).await?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let ours = env!("CARGO_PKG_VERSION");
    let mut applied = Vec::new();
    for mut crd in allot_k8s::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let live = api
            .get_opt(&name)
            .await
            .map_err(|e| api_error(&name, "get", e))?;
        let live_version = live
            .as_ref()
            .and_then(|c| c.metadata.annotations.as_ref())
            .and_then(|a| a.get(VERSION_ANNOTATION));
        if let Some(theirs) = live_version
            && newer(theirs, ours)
        {
            println!(
                "{name}: kept: allot {theirs} applied it and this is {ours} (a CRD is never \
                 downgraded: objects stored with its newer fields would lose them)"
            );
            continue;
        }
        crd.metadata
            .annotations
            .get_or_insert_default()
            .insert(VERSION_ANNOTATION.into(), ours.into());
        match live {
            // Server-side apply creates it: authorized as `patch` on this name and, since the
            // object does not exist yet, as `create` too.
            None => {
                api.patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&crd),
                )
                .await
                .map_err(|e| api_error(&name, "patch", e))?;
                println!("{name}: created");
            }
            // The spec becomes exactly this build's (a field dropped from the schema goes too,
            // whoever set it); labels and annotations of others stay.
            Some(live) => {
                replace_spec(&api, live, &crd).await?;
                println!("{name}: replaced");
            }
        }
        applied.push(name);
    }
    let deadline = Instant::now() + wait;
    for name in &applied {
        loop {
            let crd = api.get(name).await.map_err(|e| api_error(name, "get", e))?;
            if established(&crd) {
                break;
            }
            if Instant::now() >= deadline {
                bail!(
                    "{name} was applied but is not Established after {}s: `kubectl describe crd \
                     {name}` says why",
                    wait.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    println!(
        "{} CRD(s) of allot {ours} applied and Established",
        applied.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// Replaces the spec of `live` with `ours` on its resourceVersion, reading it again when another
/// writer came first.
async fn replace_spec(
    api: &Api<CustomResourceDefinition>,
    mut live: CustomResourceDefinition,
    ours: &CustomResourceDefinition,
) -> anyhow::Result<()> {
    let name = ours.metadata.name.clone().unwrap_or_default();
    for _ in 0..5 {
        live.spec = ours.spec.clone();
        let annotations = live.metadata.annotations.get_or_insert_default();
        for (k, v) in ours.metadata.annotations.iter().flatten() {
            annotations.insert(k.clone(), v.clone());
        }
        let labels = live.metadata.labels.get_or_insert_default();
        for (k, v) in ours.metadata.labels.iter().flatten() {
            labels.insert(k.clone(), v.clone());
        }
        match api.replace(&name, &PostParams::default(), &live).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                live = api
                    .get(&name)
                    .await
                    .map_err(|e| api_error(&name, "get", e))?;
            }
            Err(e) => return Err(api_error(&name, "update", e)),
        }
    }
    bail!("{name}: other writers kept changing it; run again")
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// Whether version `a` is newer than `b` (`MAJOR.MINOR.PATCH`, numerically; a pre-release or
/// build suffix is ignored). A version that does not read as one is never newer.
pub fn newer(a: &str, b: &str) -> bool {
    fn parse(v: &str) -> Option<Vec<u64>> {
        let core = v.trim_start_matches('v').split(['-', '+']).next()?;
        core.split('.').map(|n| n.parse().ok()).collect()
    }
    matches!((parse(a), parse(b)), (Some(a), Some(b)) if a > b)
}

fn api_error(name: &str, verb: &str, e: kube::Error) -> anyhow::Error {
    match e {
        kube::Error::Api(s) if s.code == 403 => anyhow::anyhow!(
            "{verb} customresourcedefinition {name}: {}; the ServiceAccount needs get, patch and \
             update on customresourcedefinitions named {name} (the chart's CRD hook grants them)",
            s.message
        ),
        other => {
            anyhow::Error::new(other).context(format!("{verb} customresourcedefinition {name}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::newer;

    #[test]
    fn versions_compare_numerically() {
        assert!(newer("0.10.0", "0.9.1"));
        assert!(newer("1.0.0", "0.99.99"));
        assert!(newer("v0.2.0", "0.1.9"));
        assert!(newer("0.2.0-rc1", "0.1.0"));
        assert!(!newer("0.1.0", "0.1.0"));
        assert!(!newer("0.1.0", "0.2.0"));
        assert!(!newer("garbage", "0.1.0"));
        assert!(!newer("0.1.0", "garbage"));
    }
}
