//! `allotctl crds --delete`: the last step of an uninstall. Deletes allot's CRDs and with them
//! every object of theirs, and what only a running controller would have undone: its finalizer
//! on pools and Subnets (a pool that still held addresses when its controller went keeps
//! `allot.dev/claims` forever, and its CRD stays Terminating), and webhook configurations left
//! calling a Service that is gone (an installation whose namespace was deleted first, whose
//! Helm release went with it). Refused while a controller still leads: its finalizers and
//! webhooks are its to keep.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use allot_k8s::openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use allot_k8s::openapi::api::coordination::v1::Lease;
use allot_k8s::openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use anyhow::{Context as _, bail};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};

/// The finalizer the controller puts on pools and Subnets that hold addresses.
const CLAIMS_FINALIZER: &str = "allot.dev/claims";
/// The Lease of the controller's leader, and the webhook configurations' name, as the chart
/// sets them.
const LEASE: &str = "allot-controller";
const WEBHOOK_CONFIGURATIONS: &str = "allot";

pub fn delete(kubeconfig: Option<&std::path::Path>, wait: Duration) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(delete_all(kubeconfig, wait))
}

async fn delete_all(
    kubeconfig: Option<&std::path::Path>,
    wait: Duration,
) -> anyhow::Result<ExitCode> {
    let client = allot_store::kube_client(kubeconfig).await?;
    let deadline = Instant::now() + wait;
    // Right after `helm uninstall` the controller's replicas may still be stopping (each gives
    // the Lease up as it goes, and the other may take it meanwhile): wait for them, as long as
    // --wait-seconds allows; a controller that goes on leading is still installed.
    let mut told = false;
    while let Some(leader) = leading_controller(&client).await? {
        if Instant::now() >= deadline {
            bail!(
                "an allot controller still leads ({leader}) after {}s: uninstall allot first \
                 (`helm uninstall`), then run this again",
                wait.as_secs()
            );
        }
        if !told {
            println!("waiting for the controller to stop leading ({leader})");
            told = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    remove_webhook_configurations(&client).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let ours: Vec<CustomResourceDefinition> = allot_k8s::crds();
    for crd in &ours {
        let name = crd.metadata.name.clone().unwrap_or_default();
        match crds.delete(&name, &DeleteParams::default()).await {
            Ok(_) => println!("{name}: deleting"),
            Err(kube::Error::Api(e)) if e.code == 404 => println!("{name}: not installed"),
            Err(e) => return Err(e).with_context(|| format!("deleting CRD {name}")),
        }
    }
    // The API server now deletes every object of those CRDs; the controller's finalizer on
    // those it no longer tends is taken off.
    loop {
        let mut left = Vec::new();
        for crd in &ours {
            let name = crd.metadata.name.clone().unwrap_or_default();
            if crds.get_opt(&name).await?.is_none() {
                continue;
            }
            let held = release_finalizers(&client, crd).await?;
            left.push(if held.is_empty() {
                name
            } else {
                format!("{name} (held by {})", held.join(", "))
            });
        }
        if left.is_empty() {
            println!("allot's CRDs and every object of theirs are deleted");
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() >= deadline {
            bail!(
                "still deleting after {}s: {}; objects held by finalizers of other tools \
                 need those tools (or `kubectl patch … --type=merge -p \
                 '{{\"metadata\":{{\"finalizers\":null}}}}'`)",
                wait.as_secs(),
                left.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The holder of a controller Lease renewed within its duration, if any.
async fn leading_controller(client: &kube::Client) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::all(client.clone());
    let now = std::time::SystemTime::now();
    for lease in leases
        .list(&ListParams::default().fields(&format!("metadata.name={LEASE}")))
        .await
        .context("listing the controller's Leases")?
    {
        let Some(spec) = lease.spec else { continue };
        let (Some(holder), Some(renewed)) = (spec.holder_identity, spec.renew_time) else {
            continue;
        };
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(0) as u64);
        let renewed = std::time::SystemTime::from(renewed.0);
        if renewed + duration > now {
            let ns = lease.metadata.namespace.unwrap_or_default();
            return Ok(Some(format!("Lease {ns}/{LEASE}, holder {holder}")));
        }
    }
    Ok(None)
}

async fn remove_webhook_configurations(client: &kube::Client) -> anyhow::Result<()> {
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for (kind, result) in [
        (
            "ValidatingWebhookConfiguration",
            validating
                .delete(WEBHOOK_CONFIGURATIONS, &DeleteParams::default())
                .await
                .map(drop),
        ),
        (
            "MutatingWebhookConfiguration",
            mutating
                .delete(WEBHOOK_CONFIGURATIONS, &DeleteParams::default())
                .await
                .map(drop),
        ),
    ] {
        match result {
            Ok(()) => println!("{kind} {WEBHOOK_CONFIGURATIONS}: deleted"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).with_context(|| format!("deleting {kind}")),
        }
    }
    Ok(())
}

/// Takes the controller's finalizer off the objects of `crd` being deleted; returns the other
/// finalizers that still hold some (`KIND NAME: FINALIZER`).
async fn release_finalizers(
    client: &kube::Client,
    crd: &CustomResourceDefinition,
) -> anyhow::Result<Vec<String>> {
    let version = crd
        .spec
        .versions
        .first()
        .map(|v| v.name.clone())
        .unwrap_or_default();
    let gvk = GroupVersionKind::gvk(&crd.spec.group, &version, &crd.spec.names.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let objects = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // The CRD went between the check and the list.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", crd.spec.names.plural)),
    };
    let mut held = Vec::new();
    for object in objects {
        let name = object.metadata.name.clone().unwrap_or_default();
        let finalizers = object.metadata.finalizers.clone().unwrap_or_default();
        let others: Vec<String> = finalizers
            .iter()
            .filter(|f| *f != CLAIMS_FINALIZER)
            .cloned()
            .collect();
        if others.len() < finalizers.len() && object.metadata.deletion_timestamp.is_some() {
            let api = match &object.metadata.namespace {
                Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource),
                None => api.clone(),
            };
            // On the version read: a finalizer someone else added meanwhile is not dropped.
            let patch = serde_json::json!({"metadata": {
                "finalizers": others,
                "resourceVersion": object.metadata.resource_version,
            }});
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => println!(
                    "{} {name}: released the controller's finalizer",
                    crd.spec.names.kind
                ),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(e).with_context(|| format!("updating {name}")),
            }
        }
        held.extend(
            others
                .iter()
                .map(|f| format!("{} {name}: {f}", crd.spec.names.kind)),
        );
    }
    Ok(held)
}
