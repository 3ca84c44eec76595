//! Keeps the certificates and the webhook configurations true, on every replica.
//!
//! One round: read the Secret (create it if absent, repair it if unusable; the leader also
//! renews ahead of time), serve its certificate (swapped into the running server when it
//! changed), and, on the leader, make both webhook configurations trust its CA bundle. A round
//! runs at start, when the Secret or a configuration changes (watched), when leadership
//! changes, when a renewal falls due, and every `check_every` in any case.

use std::sync::Arc;
use std::time::Duration;

use allot_k8s::openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use allot_k8s::openapi::api::core::v1::Secret;
use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};

use super::Settings;
use super::certs::{self, Material};
use super::configs::{self, Outcome};
use super::secret::{self, unix_now};
use super::server::{Certified, stopped};
use crate::lease::Leadership;

pub(super) struct Keeper {
    pub client: kube::Client,
    pub settings: Settings,
    pub certified: Arc<Certified>,
    pub leadership: Leadership,
    /// The CA bundle the webhook configurations were last made to trust (by this replica, as
    /// leader): a next CA in it may take over.
    pub confirmed: Option<String>,
}

impl Keeper {
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let wake = Arc::new(Notify::new());
        let watches = self.watch(wake.clone());
        let mut leading = self.leadership.subscribe();
        let mut failures = 0u32;
        loop {
            let pause = match self.round().await {
                Ok(pause) => {
                    failures = 0;
                    pause
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!("webhook: {e:#}");
                    // 1, 2, 4 … seconds, at most the check period.
                    Duration::from_secs(1 << failures.min(6)).min(self.settings.check_every)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = wake.notified() => {}
                changed = leading.changed() => {
                    if changed.is_err() {
                        // Nobody can change leadership any more: stop listening for it.
                        leading = watch::channel(false).1;
                    }
                }
                _ = stopped(&mut stop) => break,
            }
        }
        for w in watches {
            w.abort();
        }
    }

    /// One round; returns how long until the next one is due.
    async fn round(&mut self) -> anyhow::Result<Duration> {
        let s = &self.settings;
        let leader = self.leadership.is_leading();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &s.namespace);
        let names = certs::service_names(&s.service, &s.namespace);
        let confirmed = self.confirmed.clone();
        let promote = move |m: &Material| {
            m.next_ca.is_some() && confirmed.as_deref() == Some(m.bundle.as_str())
        };
        let material =
            secret::ensure(&secrets, &s.secret, &names, &s.certs, leader, &promote).await?;
        match self.certified.install(&material) {
            Ok(true) => tracing::info!(
                secret = %s.secret,
                not_after = material.serving_not_after().unwrap_or_default(),
                "webhook: serving the certificate of the Secret"
            ),
            Ok(false) => {}
            Err(e) => anyhow::bail!(
                "the certificate of Secret {} cannot be served: {e}",
                s.secret
            ),
        }
        if leader {
            let target = s.target();
            for outcome in
                configs::ensure(&self.client, &target, material.bundle.as_bytes()).await?
            {
                if let Outcome::Repaired(fields) = outcome {
                    tracing::warn!("webhook: configuration repaired ({})", fields.join(", "));
                }
            }
            self.confirmed = Some(material.bundle.clone());
        } else {
            self.confirmed = None;
        }
        let now = unix_now();
        let due = certs::next_renewal(&material, &s.certs, leader)
            .map_or(Duration::from_secs(1), |at| {
                Duration::from_secs((at - now).max(1) as u64)
            });
        Ok(due.min(s.check_every))
    }

    /// Watches of the Secret and both configurations, each event waking a round.
    fn watch(&self, wake: Arc<Notify>) -> Vec<tokio::task::JoinHandle<()>> {
        let s = &self.settings;
        let secret = format!("metadata.name={}", s.secret);
        let config = format!("metadata.name={}", s.config_name);
        vec![
            follow(
                Api::<Secret>::namespaced(self.client.clone(), &s.namespace),
                secret,
                wake.clone(),
            ),
            follow(
                Api::<ValidatingWebhookConfiguration>::all(self.client.clone()),
                config.clone(),
                wake.clone(),
            ),
            follow(
                Api::<MutatingWebhookConfiguration>::all(self.client.clone()),
                config,
                wake,
            ),
        ]
    }
}

fn follow<K>(api: Api<K>, fields: String, wake: Arc<Notify>) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let events = watcher(api, watcher::Config::default().fields(&fields)).default_backoff();
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Ok(
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
                ) => wake.notify_one(),
                Ok(_) => {}
                Err(e) => tracing::debug!("webhook: watch ({fields}): {e}"),
            }
        }
    })
}
