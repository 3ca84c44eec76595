//! The ValidatingWebhookConfiguration and MutatingWebhookConfiguration, created and kept true by
//! the leader: created once a certificate exists (so nothing is refused before a replica can
//! answer, e.g. the default pools a Helm chart installs together with the controller), and
//! repaired whenever they differ from what this controller serves: a `helm upgrade` or a
//! `kubectl apply` of an old copy that resets `caBundle` is put right within seconds (the keeper
//! watches them) instead of leaving every pool write refused with a TLS error.
//!
//! Choices, for every webhook:
//! - `failurePolicy: Fail` for validation: a change that could not be checked is refused (the
//!   message names the webhook), never let through unchecked; pool writes are rare and an
//!   operator can wait for the controller or delete the configuration (the controller puts it
//!   back when it is up). `Ignore` for the mutating webhook: its only change, `ipVersion`
//!   defaulted from the subnet, is what core derives anyway.
//! - `timeoutSeconds`: 5 to validate (a list of pools and the claims from memory take
//!   milliseconds; the handler gives up after 4 s and refuses), 3 to mutate (no reads).
//! - `sideEffects: None`: the webhook only reads, so dry-run requests are sent too.
//! - `matchPolicy: Equivalent` with version `v1alpha1`: a later version of the CRDs is
//!   converted to the one this code decodes.
//! - Only writes of pools, subnets, reserved addresses and fleet objects are matched: never
//!   IPBlocks or Endpoints (the agents' hot path), never status subresources; and of
//!   StatefulSets whose pod template declares addresses (`ipam.allot.dev/ordinal-ips`, a match
//!   condition: every other StatefulSet is admitted without asking this webhook).
//! - Owned by a cluster-scoped object of the installation (the chart's ClusterRole
//!   `allot-controller`, `--webhook-owner`): whatever takes the installation away (`helm
//!   uninstall`, with or without its hooks) takes the configurations with it through the
//!   garbage collector, so none is left calling a Service that is gone and refusing every
//!   pool write.

use std::collections::BTreeMap;
use std::fmt::Debug;

use allot_k8s::openapi::ByteString;
use allot_k8s::openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use allot_k8s::openapi::api::rbac::v1::ClusterRole;
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference,
};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::secret::MANAGED_BY;
use super::{api_error, is_conflict, request};

pub const VALIDATE_PATH: &str = "/validate";
pub const MUTATE_PATH: &str = "/mutate";
pub const VALIDATING_WEBHOOK: &str = "validate.allot.dev";
pub const MUTATING_WEBHOOK: &str = "default.allot.dev";
pub const VALIDATE_TIMEOUT_SECONDS: i32 = 5;
pub const MUTATE_TIMEOUT_SECONDS: i32 = 3;

/// Where the API server reaches the webhooks.
#[derive(Clone, Debug)]
pub struct Target {
    /// The name of both configurations.
    pub config_name: String,
    pub namespace: String,
    pub service: String,
    pub port: u16,
    /// The ClusterRole that owns both configurations, if any (`--webhook-owner`).
    pub owner: Option<String>,
}

fn rule(operations: &[&str], resources: &[&str], scope: &str) -> RuleWithOperations {
    let strings = |items: &[&str]| Some(items.iter().map(|s| s.to_string()).collect());
    RuleWithOperations {
        api_groups: strings(&[allot_k8s::GROUP]),
        api_versions: strings(&[allot_k8s::VERSION]),
        operations: strings(operations),
        resources: strings(resources),
        scope: Some(scope.to_string()),
    }
}

fn client_config(target: &Target, path: &str, bundle: &[u8]) -> WebhookClientConfig {
    WebhookClientConfig {
        ca_bundle: Some(ByteString(bundle.to_vec())),
        service: Some(ServiceReference {
            name: target.service.clone(),
            namespace: target.namespace.clone(),
            path: Some(path.to_string()),
            port: Some(i32::from(target.port)),
        }),
        url: None,
    }
}

fn meta(target: &Target) -> ObjectMeta {
    ObjectMeta {
        name: Some(target.config_name.clone()),
        labels: Some(BTreeMap::from([(
            MANAGED_BY.0.to_string(),
            MANAGED_BY.1.to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

/// The validating configuration this controller serves, trusting `bundle`.
pub fn validating(target: &Target, bundle: &[u8]) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: meta(target),
        webhooks: Some(vec![
            ValidatingWebhook {
                name: VALIDATING_WEBHOOK.into(),
                admission_review_versions: vec!["v1".into()],
                client_config: client_config(target, VALIDATE_PATH, bundle),
                failure_policy: Some("Fail".into()),
                match_policy: Some("Equivalent".into()),
                side_effects: "None".into(),
                timeout_seconds: Some(VALIDATE_TIMEOUT_SECONDS),
                namespace_selector: Some(LabelSelector::default()),
                object_selector: Some(LabelSelector::default()),
                rules: Some(vec![
                    rule(
                        &["CREATE", "UPDATE", "DELETE"],
                        &["ippools", "subnets", "ipampools"],
                        "Cluster",
                    ),
                    // Deleting a reservation or an allocation is always allowed.
                    rule(&["CREATE", "UPDATE"], &["reservedips"], "Cluster"),
                    rule(&["CREATE", "UPDATE"], &["ipamallocations"], "Namespaced"),
                ]),
                match_conditions: None,
            },
            ValidatingWebhook {
                // StatefulSets that declare addresses, and only those (the match condition): no
                // other StatefulSet write waits for this controller.
                name: STATEFULSET_WEBHOOK.into(),
                admission_review_versions: vec!["v1".into()],
                client_config: client_config(target, VALIDATE_PATH, bundle),
                failure_policy: Some("Fail".into()),
                match_policy: Some("Equivalent".into()),
                side_effects: "None".into(),
                timeout_seconds: Some(VALIDATE_TIMEOUT_SECONDS),
                namespace_selector: Some(LabelSelector::default()),
                object_selector: Some(LabelSelector::default()),
                rules: Some(vec![RuleWithOperations {
                    api_groups: Some(vec!["apps".into()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                    resources: Some(vec!["statefulsets".into()]),
                    scope: Some("Namespaced".into()),
                }]),
                match_conditions: Some(vec![MatchCondition {
                    name: "declares-addresses".into(),
                    expression: DECLARES_ADDRESSES.into(),
                }]),
            },
        ]),
    }
}

/// The webhook that checks StatefulSets' declared addresses.
pub const STATEFULSET_WEBHOOK: &str = "statefulsets.validate.allot.dev";

/// CEL: the StatefulSet's pod template carries `ipam.allot.dev/ordinal-ips`.
const DECLARES_ADDRESSES: &str = "has(object.spec.template.metadata) && \
    has(object.spec.template.metadata.annotations) && \
    'ipam.allot.dev/ordinal-ips' in object.spec.template.metadata.annotations";

/// The mutating configuration this controller serves, trusting `bundle`.
pub fn mutating(target: &Target, bundle: &[u8]) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: meta(target),
        webhooks: Some(vec![MutatingWebhook {
            name: MUTATING_WEBHOOK.into(),
            admission_review_versions: vec!["v1".into()],
            client_config: client_config(target, MUTATE_PATH, bundle),
            failure_policy: Some("Ignore".into()),
            match_policy: Some("Equivalent".into()),
            side_effects: "None".into(),
            timeout_seconds: Some(MUTATE_TIMEOUT_SECONDS),
            namespace_selector: Some(LabelSelector::default()),
            object_selector: Some(LabelSelector::default()),
            reinvocation_policy: Some("Never".into()),
            rules: Some(vec![rule(
                &["CREATE", "UPDATE"],
                &["ippools", "subnets", "reservedips"],
                "Cluster",
            )]),
            match_conditions: None,
        }]),
    }
}

/// What [`ensure`] did to one configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Unchanged,
    Created,
    /// It differed; the fields that did (`caBundle` after an upgrade reset it, say).
    Repaired(Vec<String>),
}

/// Makes both configurations what this controller serves, trusting `bundle`, owned by the
/// target's owner when it exists.
pub async fn ensure(
    client: &kube::Client,
    target: &Target,
    bundle: &[u8],
) -> anyhow::Result<[Outcome; 2]> {
    let owner = match &target.owner {
        Some(name) => owner_reference(client, name).await?,
        None => None,
    };
    let mut validating = validating(target, bundle);
    validating.metadata.owner_references = owner.clone().map(|o| vec![o]);
    let mut mutating = mutating(target, bundle);
    mutating.metadata.owner_references = owner.map(|o| vec![o]);
    let validating = ensure_one(
        Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        validating,
    )
    .await?;
    let mutating = ensure_one(
        Api::<MutatingWebhookConfiguration>::all(client.clone()),
        mutating,
    )
    .await?;
    Ok([validating, mutating])
}

/// The ClusterRole `name` as the configurations' owner; `None` (said in the log) when it does
/// not exist, so that a controller run without the chart still serves.
async fn owner_reference(
    client: &kube::Client,
    name: &str,
) -> anyhow::Result<Option<OwnerReference>> {
    let what = format!("ClusterRole {name}");
    let api = Api::<ClusterRole>::all(client.clone());
    let role = request(&what, "get", api.get_opt(name))
        .await?
        .map_err(|e| api_error(&what, "get", e))?;
    let Some(role) = role else {
        tracing::warn!(
            "webhook: {what} (--webhook-owner) does not exist: the configurations are made without an owner"
        );
        return Ok(None);
    };
    Ok(role.metadata.uid.map(|uid| OwnerReference {
        api_version: "rbac.authorization.k8s.io/v1".into(),
        kind: "ClusterRole".into(),
        name: name.to_string(),
        uid,
        // Deleting the owner never waits for the configurations.
        block_owner_deletion: Some(false),
        controller: Some(false),
    }))
}

/// Deletes both configurations (for an uninstall: a pre-delete hook runs it, so that no
/// configuration is left pointing at a Service that is gone); a missing one is fine.
pub async fn remove(client: &kube::Client, config_name: &str) -> anyhow::Result<()> {
    remove_one(
        Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        config_name,
    )
    .await?;
    remove_one(
        Api::<MutatingWebhookConfiguration>::all(client.clone()),
        config_name,
    )
    .await
}

async fn remove_one<K>(api: Api<K>, name: &str) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let what = format!("{} {name}", K::kind(&()));
    match request(&what, "delete", api.delete(name, &DeleteParams::default())).await? {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(api_error(&what, "delete", e)),
    }
    .map(|()| tracing::info!("webhook: deleted {what}"))
}

/// Writes before [`ensure_one`] gives up for this round (each lost race costs a read).
const ATTEMPTS: usize = 4;

async fn ensure_one<K>(api: Api<K>, desired: K) -> anyhow::Result<Outcome>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + Debug,
{
    let name = desired.meta().name.clone().unwrap_or_default();
    let what = format!("{} {name}", K::kind(&()));
    for _ in 0..ATTEMPTS {
        let live = request(&what, "get", api.get_opt(&name))
            .await?
            .map_err(|e| api_error(&what, "get", e))?;
        let Some(live) = live else {
            match request(
                &what,
                "create",
                api.create(&PostParams::default(), &desired),
            )
            .await?
            {
                Ok(_) => {
                    tracing::info!("webhook: created {what}");
                    return Ok(Outcome::Created);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(api_error(&what, "create", e)),
            }
        };
        let mut differs = differences(&essentials(&live), &essentials(&desired));
        let owners = |k: &K| k.meta().owner_references.clone().unwrap_or_default();
        let missing: Vec<OwnerReference> = owners(&desired)
            .into_iter()
            .filter(|o| !owners(&live).iter().any(|l| l.uid == o.uid))
            .collect();
        if !missing.is_empty() {
            differs.push("ownerReferences".into());
        }
        if differs.is_empty() {
            return Ok(Outcome::Unchanged);
        }
        // The webhooks as served, on the object as stored (its labels and annotations kept, its
        // resourceVersion making the write a compare-and-swap).
        let mut repaired = serde_json::to_value(&live)?;
        let wanted = serde_json::to_value(&desired)?;
        repaired["webhooks"] = wanted["webhooks"].clone();
        repaired["metadata"]["labels"][MANAGED_BY.0] = Value::from(MANAGED_BY.1);
        if !missing.is_empty() {
            let mut all = owners(&live);
            all.extend(missing);
            repaired["metadata"]["ownerReferences"] = serde_json::to_value(all)?;
        }
        let repaired: K = serde_json::from_value(repaired)?;
        match request(
            &what,
            "update",
            api.replace(&name, &PostParams::default(), &repaired),
        )
        .await?
        {
            Ok(_) => {
                tracing::warn!("webhook: repaired {what}: {} differed", differs.join(", "));
                return Ok(Outcome::Repaired(differs));
            }
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(api_error(&what, "update", e)),
        }
    }
    anyhow::bail!("{what}: {ATTEMPTS} writes in a row lost to other writers; will try again")
}

/// The fields of each webhook this controller decides, by webhook name (the API server fills
/// in others, such as selectors left empty, that are not compared).
fn essentials<K: Serialize>(config: &K) -> BTreeMap<String, Value> {
    const KEPT: [&str; 9] = [
        "clientConfig",
        "rules",
        "failurePolicy",
        "matchPolicy",
        "sideEffects",
        "timeoutSeconds",
        "admissionReviewVersions",
        "reinvocationPolicy",
        "matchConditions",
    ];
    let value = serde_json::to_value(config).unwrap_or(Value::Null);
    value["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let name = w["name"].as_str().unwrap_or_default().to_string();
            let kept: serde_json::Map<String, Value> = KEPT
                .iter()
                .filter_map(|k| w.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect();
            (name, Value::Object(kept))
        })
        .collect()
}

/// The webhooks and fields that differ: `validate.allot.dev caBundle`, say.
fn differences(live: &BTreeMap<String, Value>, desired: &BTreeMap<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, want) in desired {
        let Some(have) = live.get(name) else {
            out.push(format!("{name} (missing)"));
            continue;
        };
        let fields = want.as_object().into_iter().flatten().map(|(k, _)| k);
        for field in fields.chain(have.as_object().into_iter().flatten().map(|(k, _)| k)) {
            let (h, w) = (&have[field], &want[field]);
            if h == w {
                continue;
            }
            let label = if field == "clientConfig" && h["caBundle"] != w["caBundle"] {
                format!("{name} caBundle")
            } else {
                format!("{name} {field}")
            };
            if !out.contains(&label) {
                out.push(label);
            }
        }
    }
    for name in live.keys().filter(|n| !desired.contains_key(*n)) {
        out.push(format!("{name} (not served by this controller)"));
    }
    out
}
