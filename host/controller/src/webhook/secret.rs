//! The Secret that holds the webhook's certificates, shared by every replica so that all serve
//! the same one: created if absent (a replica that loses the race reads the winner's), renewed
//! with a resourceVersion compare-and-swap (a replica that loses reads the new version and
//! serves it).

use std::collections::BTreeMap;

use allot_k8s::openapi::api::core::v1::Secret;
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

use super::certs::{CertPolicy, Material, MaterialError, renew};
use super::{api_error, is_conflict, request};

/// Reads and writes of one [`ensure`] before it gives up (each lost race costs a read).
const ATTEMPTS: usize = 8;
/// Why the Secret was last rewritten, for whoever reads it.
pub const REASON_ANNOTATION: &str = "allot.dev/webhook-certificate-reason";
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "allot-controller");

/// What the Secret holds once it is usable, renewed if due: see [`renew`] for `rotate` and
/// `promote` (`promote` is asked about the material as read).
pub async fn ensure(
    api: &Api<Secret>,
    name: &str,
    names: &[String],
    policy: &CertPolicy,
    rotate: bool,
    promote: &(dyn Fn(&Material) -> bool + Send + Sync),
) -> anyhow::Result<Material> {
    let what = format!("Secret {name}");
    for _ in 0..ATTEMPTS {
        let now = unix_now();
        let stored = request(&what, "get", api.get_opt(name))
            .await?
            .map_err(|e| api_error(&what, "get", e))?;
        let Some(secret) = stored else {
            let fresh = renew(
                Err(&MaterialError::NoSecret),
                names,
                policy,
                now,
                rotate,
                false,
            )?
            .expect("nothing stored: always a fresh certificate");
            let created = secret_of(name, None, &fresh.material, &fresh.reason);
            match request(
                &what,
                "create",
                api.create(&PostParams::default(), &created),
            )
            .await?
            {
                Ok(_) => {
                    tracing::info!(
                        secret = name,
                        "webhook: created the CA and the serving certificate"
                    );
                    return Ok(fresh.material);
                }
                // Another replica created it first: serve what it wrote.
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(api_error(&what, "create", e)),
            }
        };
        let current = Material::from_data(&secret.data.clone().unwrap_or_default());
        let promote_now = current.as_ref().is_ok_and(promote);
        let renewal = renew(current.as_ref(), names, policy, now, rotate, promote_now)?;
        let Some(renewal) = renewal else {
            return Ok(current.expect("renew keeps only usable material"));
        };
        let replaced = secret_of(name, Some(secret), &renewal.material, &renewal.reason);
        match request(
            &what,
            "update",
            api.replace(name, &PostParams::default(), &replaced),
        )
        .await?
        {
            Ok(_) => {
                tracing::info!(
                    secret = name,
                    "webhook: renewed the certificates: {}",
                    renewal.reason
                );
                return Ok(renewal.material);
            }
            // Another replica renewed first (or anyone edited it): read again and decide again.
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(api_error(&what, "update", e)),
        }
    }
    anyhow::bail!("{what}: {ATTEMPTS} writes in a row lost to other writers; will try again")
}

/// `material` as the Secret `name` (keeping what `previous` had besides, and its
/// resourceVersion for the compare-and-swap).
fn secret_of(name: &str, previous: Option<Secret>, material: &Material, reason: &str) -> Secret {
    let mut secret = previous.unwrap_or_else(|| Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        ..Secret::default()
    });
    secret.type_ = Some("kubernetes.io/tls".into());
    secret.data = Some(material.to_data());
    secret.string_data = None;
    secret
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(MANAGED_BY.0.into(), MANAGED_BY.1.into());
    secret
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(REASON_ANNOTATION.into(), reason.to_string());
    secret
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
