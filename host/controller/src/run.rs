//! Wiring: the client, the claim store, the index's watches, the election, and the loops that
//! act as leader.
//!
//! The claim store (the cluster's IPBlocks) runs on a one-worker runtime of its own with an API
//! client of its own ([`allot_store::BlockingStore`]), as in the agent (whose `run` module says
//! why): GC, the audit, the pool lifecycle and the webhook call it synchronously from blocking
//! threads, and it must not wait on the workers that serve the webhook and the watches.

use std::sync::Arc;
use std::time::Duration;

use allot_core::store::{Store, system_clock};
use allot_index::{ClusterIndex, EndpointObject, Shared, feed, pool_document_feeds};
use allot_k8s::Endpoint;
use allot_k8s::openapi::api::apps::v1::StatefulSet;
use allot_k8s::openapi::api::coordination::v1::Lease;
use allot_k8s::openapi::api::core::v1::{Node, Pod};
use allot_store::{KubeConfig, KubeStore};
use anyhow::{Context as _, bail};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::args::ControllerArgs;
use crate::gc::{ApiReader, Collector};
use crate::lease::{Leadership, elect};
use crate::metrics::Metrics;
use crate::pools::PoolLifecycle;
use crate::serve::{Readiness, serve};

/// Starts one watch per kind the controller's index follows, on the current runtime (allot's
/// Endpoints when `endpoints`: the audit and GC's outdated-Endpoint cleaning read them; KubeVirt's
/// virtual machines while the API server serves them).
pub fn watch(index: &Arc<Shared<ClusterIndex>>, client: &kube::Client, endpoints: bool) {
    let config = watcher::Config::default();
    let c = client.clone();
    let i = index.clone();
    tokio::spawn(feed(
        i.clone(),
        watcher(Api::<Pod>::all(c.clone()), config.clone()).default_backoff(),
        |p| p,
    ));
    tokio::spawn(feed(
        i.clone(),
        watcher(Api::<Node>::all(c.clone()), config.clone()).default_backoff(),
        |n| n,
    ));
    tokio::spawn(feed(
        i.clone(),
        watcher(Api::<StatefulSet>::all(c.clone()), config.clone()).default_backoff(),
        |s| s,
    ));
    if endpoints {
        tokio::spawn(feed(
            i.clone(),
            watcher(Api::<Endpoint>::all(c.clone()), config.clone()).default_backoff(),
            EndpointObject,
        ));
    }
    for watch in pool_document_feeds(&i, &c, &config) {
        tokio::spawn(watch);
    }
    tokio::spawn(crate::kubevirt::follow(
        i.clone(),
        c.clone(),
        crate::kubevirt::DISCOVERY_EVERY,
    ));
}

/// A future that completes when `stop` turns true.
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

pub fn run(args: ControllerArgs) -> anyhow::Result<()> {
    if args.lease_renew_deadline_seconds >= args.lease_duration_seconds {
        bail!(
            "--lease-renew-deadline-seconds ({}) must be shorter than --lease-duration-seconds \
             ({}): a leader must stop acting before another may take over",
            args.lease_renew_deadline_seconds,
            args.lease_duration_seconds
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("allot-controller")
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(serve_cluster(args))
}

/// Labels the IPBlocks an older allot wrote with their region, so that agents can follow only
/// their pools' blocks (until none is left unlabelled, each agent follows every block).
async fn label_regions(store: Arc<KubeStore>) {
    let mut labelled = 0;
    loop {
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.label_regions()).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => labelled += n,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "labelling IPBlocks with their region failed; retrying in 10 s");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            Err(e) => {
                tracing::error!("labelling IPBlocks with their region failed: {e}");
                return;
            }
        }
    }
    if labelled > 0 {
        tracing::info!(
            labelled,
            "IPBlocks written by an older allot now carry their region"
        );
    }
}

async fn serve_cluster(args: ControllerArgs) -> anyhow::Result<()> {
    let identity = match &args.identity {
        Some(i) => i.clone(),
        None => hostname(),
    };
    let metrics = Arc::new(Metrics::new());
    let ready = Readiness::default();
    let bound = serve(args.metrics_address, metrics.clone(), ready.clone())
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_address))?;
    tracing::info!(%bound, "serving /metrics, /healthz, /readyz");

    let client = allot_store::kube_client(args.kubeconfig.as_deref()).await?;
    if args.remove_webhook_configurations {
        return crate::uninstall::remove_webhook_configurations(client, &args).await;
    }
    let kubeconfig = args.kubeconfig.clone();
    let blocks = tokio::task::spawn_blocking(move || {
        KubeStore::connect(&KubeConfig {
            kubeconfig,
            ..KubeConfig::default()
        })
    })
    .await?
    .map(Arc::new)
    .context("cannot open the claim store (the cluster's IPBlocks); apply crds/ first")?;
    tokio::spawn(label_regions(blocks.clone()));
    let store: Arc<dyn Store> = blocks;

    let index = Shared::of(ClusterIndex::new());
    let settings = args.gc.settings();
    let audit = args.audit_interval_seconds > 0;
    watch(&index, &client, audit || settings.clean_outdated_endpoints);
    let table = settings.table.clone();

    let (stop_tx, stop_rx) = watch::channel(false);
    let leadership = Leadership::default();
    let election = tokio::spawn(elect(
        Api::<Lease>::namespaced(client.clone(), &args.namespace),
        args.lease_config(&identity),
        leadership.clone(),
        stopped(stop_rx.clone()),
    ));

    let collector = Collector::new(
        store.clone(),
        index.clone(),
        Arc::new(ApiReader::new(client.clone(), &identity)),
        settings,
        leadership.clone(),
        metrics.clone(),
        system_clock(),
    );
    let gc = tokio::spawn(collector.run(stopped(stop_rx.clone())));
    let auditor = audit.then(|| {
        tokio::spawn(
            crate::audit::Auditor {
                store: store.clone(),
                index: index.clone(),
                table,
                interval: Duration::from_secs(args.audit_interval_seconds),
                leadership: leadership.clone(),
                metrics: metrics.clone(),
                events: crate::events::Events::new(client.clone(), &identity),
            }
            .run(stopped(stop_rx.clone())),
        )
    });
    let lifecycle = PoolLifecycle::new(
        client.clone(),
        store.clone(),
        index.clone(),
        leadership.clone(),
        metrics.clone(),
    );
    let pools = tokio::spawn(lifecycle.run(
        Duration::from_secs(args.status_interval_seconds.max(1)),
        stopped(stop_rx.clone()),
    ));
    let slices = args.resource_slices.then(|| {
        tokio::spawn(
            crate::slices::SlicePublisher::new(
                client.clone(),
                store.clone(),
                index.clone(),
                leadership.clone(),
                metrics.clone(),
            )
            .run(
                Duration::from_millis(args.resource_slices_poll_ms.max(50)),
                stopped(stop_rx.clone()),
            ),
        )
    });

    // The webhook stops last, after the shutdown delay (see --shutdown-delay-seconds).
    let (webhook_stop_tx, webhook_stop_rx) = watch::channel(false);
    let certified = Readiness::default();
    let mut webhook = {
        let (client, store, leadership) = (client.clone(), store.clone(), leadership.clone());
        let (webhook_args, namespace) = (args.webhook.clone(), args.namespace.clone());
        let (stop, certified) = (stopped(webhook_stop_rx), certified.clone());
        tokio::spawn(async move {
            crate::webhook::run(
                client,
                &webhook_args,
                &namespace,
                store,
                leadership,
                certified,
                stop,
            )
            .await
        })
    };
    let auto_pools = tokio::spawn(
        crate::autopool::AutoPools {
            client: client.clone(),
            store: store.clone(),
            leadership: leadership.clone(),
            args: args.auto_pools.clone(),
            instance: identity.clone(),
        }
        .run(stopped(stop_rx.clone())),
    );
    let fleet = tokio::spawn(
        crate::fleet::FleetController {
            client: client.clone(),
            leadership: leadership.clone(),
            args: args.fleet.clone(),
            instance: identity.clone(),
        }
        .run(stopped(stop_rx.clone())),
    );

    // Ready once the index has listed what GC and pool lifecycle read, and the webhook serves
    // a certificate.
    let readiness = {
        let index = index.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _ = index
                .wait_for(Duration::MAX, |i| {
                    (i.ready_for_gc() && i.ready_for_pools()).then_some(())
                })
                .await;
            while !certified.get() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ready.set(true);
            tracing::info!("index listed and the webhook certificate served: ready");
        })
    };

    tokio::select! {
        _ = shutdown_signal() => {}
        served = &mut webhook => {
            // The webhook could not start (its port taken, no Secret access): nothing would
            // answer the API server, so the replica must not look healthy.
            let why = match served {
                Ok(Ok(())) => anyhow::anyhow!("the webhook server stopped"),
                Ok(Err(e)) => e,
                Err(e) => anyhow::anyhow!("the webhook server failed: {e}"),
            };
            let _ = stop_tx.send(true);
            return Err(why.context("cannot serve the admission webhooks"));
        }
    }
    tracing::info!("stopping: giving the lease up");
    let _ = stop_tx.send(true);
    readiness.abort();
    ready.set(false);
    let delay = Duration::from_secs(args.shutdown_delay_seconds);
    if !delay.is_zero() {
        tracing::info!(
            "stopping: the webhook answers for {delay:?} more, while the API server learns that \
             this replica is going"
        );
        // A second signal (an impatient operator) stops at once.
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown_signal() => {}
        }
    }
    let _ = webhook_stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = election.await;
        let _ = gc.await;
        if let Some(auditor) = auditor {
            let _ = auditor.await;
        }
        let _ = pools.await;
        if let Some(slices) = slices {
            let _ = slices.await;
        }
        let _ = auto_pools.await;
        let _ = fleet.await;
        let _ = webhook.await;
    })
    .await;
    Ok(())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "allot-controller".into())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
