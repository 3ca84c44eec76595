//! `--remove-webhook-configurations`: the Helm chart's post-delete hook. The leader recreates a
//! webhook configuration it sees deleted (it keeps them true), so deleting them while a replica
//! still leads achieves nothing, and a validating configuration left behind fails closed: every
//! write of an IPPool would be refused once the Service is gone. So this waits until no replica
//! leads (the replicas give the Lease up when they stop; a holder that stopped without doing so
//! is gone once the Lease has not changed for its leaseDurationSeconds, measured on this clock as
//! the election does), then deletes both configurations.

use std::time::{Duration, Instant};

use allot_k8s::openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::args::ControllerArgs;

/// How often the Lease is read while a leader holds it.
const POLL: Duration = Duration::from_millis(500);

/// The controller's entry point for `--remove-webhook-configurations`.
pub async fn remove_webhook_configurations(
    client: kube::Client,
    args: &ControllerArgs,
) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &args.namespace);
    // Time for a rollout's last replica to stop, or a dead holder's Lease to run out.
    let bound = Duration::from_secs((4 * args.lease_duration_seconds).max(60));
    wait_for_no_leader(&leases, &args.lease_name, bound).await?;
    crate::webhook::remove_configurations(client, &args.webhook).await
}

/// Returns once no replica holds the Lease `name`: it does not exist, names no holder, or has not
/// changed for its `leaseDurationSeconds`. Fails, naming the holder, after `bound`.
pub async fn wait_for_no_leader(
    leases: &Api<Lease>,
    name: &str,
    bound: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    // The resourceVersion last seen, and since when (this clock).
    let mut seen: Option<(String, Instant)> = None;
    let mut logged = false;
    loop {
        let lease = leases.get_opt(name).await.map_err(|e| {
            anyhow::anyhow!(
                "reading the Lease {name}: {e}; the hook's ServiceAccount needs get on leases \
                 named {name}"
            )
        })?;
        let Some(lease) = lease else {
            return Ok(());
        };
        let spec = lease.spec.unwrap_or_default();
        let holder = spec.holder_identity.unwrap_or_default();
        if holder.is_empty() {
            return Ok(());
        }
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
        let version = lease.metadata.resource_version.unwrap_or_default();
        match &seen {
            Some((v, since)) if *v == version => {
                if since.elapsed() >= duration {
                    tracing::info!(%holder, "the leader's Lease ran out without a renewal");
                    return Ok(());
                }
            }
            _ => seen = Some((version, Instant::now())),
        }
        if started.elapsed() >= bound {
            anyhow::bail!(
                "{holder} still leads (it renewed the Lease {name} within the last {}s): it would \
                 recreate the webhook configurations at once; stop the controller first (its \
                 Deployment scaled to 0 or deleted), then run this again",
                duration.as_secs()
            );
        }
        if !logged {
            tracing::info!(%holder, "waiting for the leader to stop before removing the webhook configurations");
            logged = true;
        }
        tokio::time::sleep(POLL).await;
    }
}
