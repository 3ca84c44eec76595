//! Admission: an AdmissionReview's request in, allowed or denied out, for IPPool, Subnet,
//! ReservedIP, IPAMPool and IPAMAllocation, and for StatefulSets that declare addresses
//! ([`declared`]).
//!
//! Every rule is core's or the fleet module's, never written again here: one object is checked by
//! the same `TryFrom` (`from_spec`) as the agent and the standalone loader; an edit against the
//! others and the claims by `allot_core::edit`; fleet objects by `crate::fleet::check_pool_edit`
//! and `check_allocation_object`. This module reads what those need (the objects through the
//! API, the claims through the store) and turns their refusals into the response.
//!
//! An update that leaves the spec (and an IPPool's owner-subnet label) as it is, such as the
//! controller adding or removing its finalizer, is always allowed: a finalizer must come off a
//! pool even if something else about the cluster is wrong by then.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use allot_core::edit::{self, Existing, Held};
use allot_core::spec::auto_pool_labels::OWNER_SUBNET;
use allot_core::store::Store;
use allot_core::{Pool, Reserved, Subnet};
use allot_k8s::openapi::api::core::v1::Namespace;
use allot_k8s::{GROUP, IPAMAllocation, IPAMPool, IPPool, ReservedIP, Subnet as SubnetObject};
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use serde::de::DeserializeOwned;
use serde_json::json;

mod declared;

/// Budget of the reads one admission makes; the configuration's `timeoutSeconds` is 5.
const READ_TIMEOUT: Duration = Duration::from_secs(4);

/// Why an admission could not read what its checks need: the change is neither allowed nor
/// found invalid, and the answer says to try again (503), not that the object is wrong.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error(
        "{what}: {message}; the controller's ServiceAccount needs list on ippools, subnets, reservedips and ipamallocations and get on ipampools and namespaces"
    )]
    Forbidden { what: String, message: String },
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what}: no answer within {READ_TIMEOUT:?}")]
    TimedOut { what: String },
    #[error("reading the claims: {0}")]
    Claims(#[from] allot_core::store::StoreError),
    #[error("reading the claims: {0}")]
    Aborted(#[from] tokio::task::JoinError),
}

/// What admissions read: the objects through the API (a fresh list per admission: two pools
/// created one after the other are always checked against each other) and the claims through
/// the store.
#[derive(Clone)]
pub struct Lookup {
    client: kube::Client,
    store: Arc<dyn Store>,
}

impl Lookup {
    pub fn new(client: kube::Client, store: Arc<dyn Store>) -> Lookup {
        Lookup { client, store }
    }

    /// The valid IPPools and Subnets and every claim.
    async fn existing(&self) -> Result<Existing, LookupError> {
        let (pools, subnets, held) = tokio::try_join!(
            self.listed::<IPPool>("ippools"),
            self.listed::<SubnetObject>("subnets"),
            self.held()
        )?;
        Ok(Existing {
            pools: pools
                .iter()
                .filter_map(|p| Pool::try_from(p).ok())
                .collect(),
            subnets: subnets
                .iter()
                .filter_map(|s| Subnet::try_from(s).ok())
                .collect(),
            held,
        })
    }

    /// Every claim, by pool.
    async fn held(&self) -> Result<BTreeMap<String, Held>, LookupError> {
        Ok(edit::held_by_pool(self.claims().await?))
    }

    /// Every claim.
    async fn claims(&self) -> Result<Vec<allot_core::store::Claim>, LookupError> {
        let store = self.store.clone();
        Ok(tokio::task::spawn_blocking(move || store.all()).await??)
    }

    /// Every object of a kind that reads as `K`, in pages. Read untyped and decoded one by one,
    /// so one object stored before the webhook was there, that does not decode, is skipped
    /// rather than failing every admission.
    async fn listed<K>(&self, plural: &str) -> Result<Vec<K>, LookupError>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let api: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &ApiResource::erase::<K>(&()));
        let mut out = Vec::new();
        let mut params = ListParams::default().limit(500);
        loop {
            let page = timed(&format!("listing {plural}"), api.list(&params)).await?;
            out.extend(
                page.items
                    .into_iter()
                    .filter_map(|o| serde_json::to_value(o).ok())
                    .filter_map(|v| serde_json::from_value(v).ok()),
            );
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(out),
            }
        }
    }

    /// The namespace `name` (its labels: a pool's namespaceAffinity), if it exists.
    async fn namespace(&self, name: &str) -> Result<Option<Namespace>, LookupError> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        timed(&format!("reading namespace {name}"), api.get_opt(name)).await
    }

    async fn ipam_pool(&self, name: &str) -> Result<Option<IPAMPool>, LookupError> {
        let api: Api<IPAMPool> = Api::all(self.client.clone());
        timed(&format!("reading IPAMPool {name}"), api.get_opt(name)).await
    }

    /// The IPAMAllocations of IPAMPool `pool` (each is named after its pool), in pages: every
    /// one holding addresses counts, whether the pool has a record of it or not.
    async fn ipam_allocations(&self, pool: &str) -> Result<Vec<IPAMAllocation>, LookupError> {
        let api: Api<IPAMAllocation> = Api::all(self.client.clone());
        let what = format!("listing the IPAMAllocations of IPAMPool {pool}");
        let mut params = ListParams::default()
            .fields(&format!("metadata.name={pool}"))
            .limit(500);
        let mut out = Vec::new();
        loop {
            let page = timed(&what, api.list(&params)).await?;
            out.extend(page.items);
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(out),
            }
        }
    }
}

async fn timed<T>(
    what: &str,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, LookupError> {
    let what = what.to_string();
    match tokio::time::timeout(READ_TIMEOUT, call).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(kube::Error::Api(s))) if s.code == 403 => Err(LookupError::Forbidden {
            what,
            message: s.message,
        }),
        Ok(Err(source)) => Err(LookupError::Api { what, source }),
        Err(_) => Err(LookupError::TimedOut { what }),
    }
}

/// Refusals and warnings of one admission.
#[derive(Debug, Default)]
struct Verdict {
    refusals: Vec<String>,
    warnings: Vec<String>,
    /// The refusal is only that the checks could not run: try again.
    unavailable: bool,
}

impl Verdict {
    /// The checks could not read what they need: refused for now, with the reason.
    fn cannot_check(why: &LookupError) -> Verdict {
        Verdict {
            refusals: vec![format!(
                "the allot webhook could not check this change ({why}); try again"
            )],
            warnings: Vec::new(),
            unavailable: true,
        }
    }

    fn refuse(why: impl ToString) -> Verdict {
        Verdict {
            refusals: vec![why.to_string()],
            ..Verdict::default()
        }
    }

    fn refusals<T: ToString>(refusals: impl IntoIterator<Item = T>) -> Verdict {
        Verdict {
            refusals: refusals.into_iter().map(|r| r.to_string()).collect(),
            ..Verdict::default()
        }
    }
}

/// The validating webhook's answer to `request`.
pub async fn validate(
    request: &AdmissionRequest<DynamicObject>,
    lookup: &Lookup,
) -> AdmissionResponse {
    let verdict = if request.kind.group == "apps" && request.kind.kind == "StatefulSet" {
        declared::statefulset(request, lookup).await
    } else if request.kind.group != GROUP {
        Verdict::default()
    } else {
        match request.kind.kind.as_str() {
            "IPPool" => ippool(request, lookup).await,
            "Subnet" => subnet(request, lookup).await,
            "ReservedIP" => reserved_ip(request, lookup).await,
            "IPAMPool" => ipam_pool(request, lookup).await,
            "IPAMAllocation" => ipam_allocation(request, lookup).await,
            _ => Verdict::default(),
        }
    };
    let mut response = AdmissionResponse::from(request);
    if !verdict.warnings.is_empty() {
        response.warnings = Some(verdict.warnings);
    }
    if verdict.refusals.is_empty() {
        return response;
    }
    tracing::info!(
        kind = %request.kind.kind,
        name = %request.name,
        operation = ?request.operation,
        user = request.user_info.username.as_deref().unwrap_or(""),
        "admission denied: {}",
        verdict.refusals.join("; ")
    );
    let mut denied = response.deny(summary(&verdict.refusals));
    // 422 as for any invalid object; a deletion refused is 403 (nothing about the request is
    // malformed, the pool's state forbids it); 503 when the checks could not run, so that
    // clients and GitOps tools retry rather than take the object for wrong.
    (denied.result.code, denied.result.reason) = match (verdict.unavailable, &request.operation) {
        (true, _) => (503, "ServiceUnavailable".into()),
        (false, Operation::Delete) => (403, "Forbidden".into()),
        (false, _) => (422, "Invalid".into()),
    };
    denied
}

/// Refusals shown in one answer: a /8 laid over a thousand pools is one message naming a few.
const SHOWN_REFUSALS: usize = 5;

/// The first refusals, then how many more there are.
fn summary(refusals: &[String]) -> String {
    let mut shown: Vec<&str> = refusals
        .iter()
        .take(SHOWN_REFUSALS)
        .map(String::as_str)
        .collect();
    let more = refusals.len().saturating_sub(SHOWN_REFUSALS);
    let tail = format!("… and {more} more");
    if more > 0 {
        shown.push(&tail);
    }
    shown.join("; ")
}

/// The object and the old object of `request`, as `K`.
fn decode<K: DeserializeOwned>(
    request: &AdmissionRequest<DynamicObject>,
) -> Result<(Option<K>, Option<K>), String> {
    let one = |o: &Option<DynamicObject>, which: &str| -> Result<Option<K>, String> {
        o.as_ref()
            .map(|o| {
                serde_json::to_value(o)
                    .and_then(serde_json::from_value)
                    .map_err(|e| format!("{} {}: {which}: {e}", request.kind.kind, request.name))
            })
            .transpose()
    };
    Ok((
        one(&request.old_object, "oldObject")?,
        one(&request.object, "object")?,
    ))
}

/// The name of the object of a DELETE (the request names it; the old object too).
fn deleted_name<K: Resource>(request: &AdmissionRequest<DynamicObject>, old: Option<&K>) -> String {
    old.and_then(|o| o.meta().name.clone())
        .unwrap_or_else(|| request.name.clone())
}

fn owner_subnet(p: &IPPool) -> Option<&String> {
    p.metadata.labels.as_ref().and_then(|l| l.get(OWNER_SUBNET))
}

async fn ippool(request: &AdmissionRequest<DynamicObject>, lookup: &Lookup) -> Verdict {
    let (old, new) = match decode::<IPPool>(request) {
        Ok(pair) => pair,
        Err(e) => return Verdict::refuse(e),
    };
    match (request.operation.clone(), new) {
        (Operation::Delete, _) => {
            let name = deleted_name(request, old.as_ref());
            match lookup.held().await {
                Ok(held) => Verdict::refusals(edit::check_pool_deletion(
                    &name,
                    &Existing {
                        held,
                        ..Existing::default()
                    },
                )),
                Err(e) => Verdict::cannot_check(&e),
            }
        }
        (Operation::Create | Operation::Update, Some(new)) => {
            if let Some(old) = &old
                && old.spec == new.spec
                && owner_subnet(old) == owner_subnet(&new)
            {
                return Verdict::default();
            }
            let checked = match Pool::try_from(&new) {
                Ok(p) => p,
                Err(e) => return Verdict::refuse(e),
            };
            match lookup.existing().await {
                Ok(existing) => Verdict::refusals(edit::check_pool(
                    old.as_ref().map(|o| &o.spec.0),
                    &checked,
                    &existing,
                )),
                Err(e) => Verdict::cannot_check(&e),
            }
        }
        _ => Verdict::default(),
    }
}

async fn subnet(request: &AdmissionRequest<DynamicObject>, lookup: &Lookup) -> Verdict {
    let (old, new) = match decode::<SubnetObject>(request) {
        Ok(pair) => pair,
        Err(e) => return Verdict::refuse(e),
    };
    match (request.operation.clone(), new) {
        (Operation::Delete, _) => {
            let name = deleted_name(request, old.as_ref());
            match lookup.existing().await {
                Ok(existing) => Verdict::refusals(edit::check_subnet_deletion(&name, &existing)),
                Err(e) => Verdict::cannot_check(&e),
            }
        }
        (Operation::Create | Operation::Update, Some(new)) => {
            if old.as_ref().is_some_and(|o| o.spec == new.spec) {
                return Verdict::default();
            }
            let checked = match Subnet::try_from(&new) {
                Ok(s) => s,
                Err(e) => return Verdict::refuse(e),
            };
            match lookup.existing().await {
                Ok(existing) => Verdict::refusals(edit::check_subnet(
                    old.as_ref().map(|o| &o.spec.0),
                    &checked,
                    &existing,
                )),
                Err(e) => Verdict::cannot_check(&e),
            }
        }
        _ => Verdict::default(),
    }
}

/// A ReservedIP must be well formed; reserving an address in use is allowed, with a warning.
/// Deleting one is always allowed (it only makes addresses available again).
async fn reserved_ip(request: &AdmissionRequest<DynamicObject>, lookup: &Lookup) -> Verdict {
    let (old, new) = match decode::<ReservedIP>(request) {
        Ok(pair) => pair,
        Err(e) => return Verdict::refuse(e),
    };
    let Some(new) = new else {
        return Verdict::default();
    };
    if old.as_ref().is_some_and(|o| o.spec == new.spec) {
        return Verdict::default();
    }
    let checked = match Reserved::try_from(&new) {
        Ok(r) => r,
        Err(e) => return Verdict::refuse(e),
    };
    // Only a warning depends on the claims: if they cannot be read, say so and allow.
    let warnings = match lookup.held().await {
        Ok(held) => edit::reserved_in_use(
            &checked,
            &Existing {
                held,
                ..Existing::default()
            },
        ),
        Err(e) => vec![format!(
            "could not check which reserved addresses are in use: {e}"
        )],
    };
    Verdict {
        warnings,
        ..Verdict::default()
    }
}

async fn ipam_pool(request: &AdmissionRequest<DynamicObject>, lookup: &Lookup) -> Verdict {
    let (old, new) = match decode::<IPAMPool>(request) {
        Ok(pair) => pair,
        Err(e) => return Verdict::refuse(e),
    };
    if let (Some(old), Some(new)) = (&old, &new)
        && old.spec == new.spec
    {
        return Verdict::default();
    }
    let name = new
        .as_ref()
        .or(old.as_ref())
        .and_then(|p| p.metadata.name.clone())
        .unwrap_or_else(|| request.name.clone());
    match lookup.ipam_allocations(&name).await {
        Ok(objects) => Verdict::refusals(crate::fleet::check_pool_edit(
            old.as_ref(),
            new.as_ref(),
            &objects,
        )),
        Err(e) => Verdict::cannot_check(&e),
    }
}

async fn ipam_allocation(request: &AdmissionRequest<DynamicObject>, lookup: &Lookup) -> Verdict {
    let (old, new) = match decode::<IPAMAllocation>(request) {
        Ok(pair) => pair,
        Err(e) => return Verdict::refuse(e),
    };
    let Some(new) = new else {
        return Verdict::default();
    };
    if old.as_ref().is_some_and(|o| o.spec == new.spec) {
        return Verdict::default();
    }
    let name = new.metadata.name.clone().unwrap_or_default();
    match lookup.ipam_pool(&name).await {
        Ok(Some(pool)) => match lookup.ipam_allocations(&name).await {
            Ok(objects) => {
                Verdict::refusals(crate::fleet::check_allocation_object(&pool, &new, &objects))
            }
            Err(e) => Verdict::cannot_check(&e),
        },
        Ok(None) => Verdict::refuse(format!(
            "IPAMAllocation {}/{name}: there is no IPAMPool {name}: an IPAMAllocation is named after the IPAMPool it comes from; create the pool first",
            new.metadata.namespace.as_deref().unwrap_or_default()
        )),
        Err(e) => Verdict::cannot_check(&e),
    }
}

/// The mutating webhook's answer: `ipVersion` defaulted from the subnet (or a ReservedIP's
/// entries) when it is missing and the object is valid without it; nothing else is ever changed.
pub fn mutate(request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    if request.kind.group != GROUP
        || !matches!(request.operation, Operation::Create | Operation::Update)
    {
        return response;
    }
    let version = match request.kind.kind.as_str() {
        "IPPool" => decode::<IPPool>(request)
            .ok()
            .and_then(|(_, new)| new)
            .and_then(|p| edit::default_version_pool(&Pool::try_from(&p))),
        "Subnet" => decode::<SubnetObject>(request)
            .ok()
            .and_then(|(_, new)| new)
            .and_then(|s| edit::default_version_subnet(&Subnet::try_from(&s))),
        "ReservedIP" => decode::<ReservedIP>(request)
            .ok()
            .and_then(|(_, new)| new)
            .and_then(|r| {
                edit::default_version_reserved(&Reserved::try_from(&r), r.spec.0.ip_version)
            }),
        _ => None,
    };
    let Some(version) = version else {
        return response;
    };
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/spec/ipVersion", "value": version}]))
            .expect("a JSON patch");
    match response.clone().with_patch(patch) {
        Ok(patched) => patched,
        Err(e) => {
            tracing::warn!("webhook: cannot serialise a patch: {e}");
            response
        }
    }
}
