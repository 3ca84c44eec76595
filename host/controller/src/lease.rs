//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it.
//!
//! Every replica runs [`elect`]. The holder renews the Lease every `retry_period` with a
//! compare-and-swap on its resourceVersion; a replica that sees the record unchanged for a whole
//! `duration` (measured on its own clock from when it last saw the record change, so clock skew
//! between replicas does not matter) takes it over with another compare-and-swap. Only one write
//! can win each race.
//!
//! A leader acts only while [`Leadership::is_leading`]: its last successful renewal started
//! less than `renew_deadline` ago. `renew_deadline` is shorter than `duration`, so a leader that
//! cannot reach the API stops acting before anyone else may take over; a leader whose renewal is
//! refused (someone else holds the Lease) stops at once. Whoever releases addresses checks
//! `is_leading` right before each write.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use allot_k8s::openapi::api::coordination::v1::{Lease, LeaseSpec};
use allot_k8s::openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use allot_k8s::openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

/// Where the Lease is and how it is held.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's name in `holderIdentity` (the pod's name).
    pub identity: String,
    /// `leaseDurationSeconds`: how long others wait for a silent holder (client-go: 15 s).
    pub duration: Duration,
    /// A leader that has not renewed for this long stops acting (client-go: 10 s).
    pub renew_deadline: Duration,
    /// How often to renew, or to try to acquire (client-go: 2 s).
    pub retry_period: Duration,
}

impl LeaseConfig {
    pub fn new(namespace: &str, name: &str, identity: &str) -> LeaseConfig {
        LeaseConfig {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Whether this replica leads, shared by everything that must act only as the leader.
#[derive(Clone, Debug)]
pub struct Leadership {
    inner: Arc<State>,
}

#[derive(Debug)]
struct State {
    /// Until when this replica may act; `None` while it does not lead.
    valid_until: Mutex<Option<Instant>>,
    changes: watch::Sender<bool>,
}

impl Default for Leadership {
    fn default() -> Self {
        Leadership {
            inner: Arc::new(State {
                valid_until: Mutex::new(None),
                changes: watch::Sender::new(false),
            }),
        }
    }
}

impl Leadership {
    /// Leadership that is always held: for a one-off run (`allotctl gc`) and tests.
    pub fn always() -> Leadership {
        let l = Leadership::default();
        l.renewed(Instant::now() + Duration::from_secs(u32::MAX as u64));
        l
    }

    /// Whether this replica may act now.
    pub fn is_leading(&self) -> bool {
        self.valid_until().is_some_and(|t| Instant::now() < t)
    }

    fn valid_until(&self) -> Option<Instant> {
        *self
            .inner
            .valid_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Changes of leadership: `true` when it is won, `false` when it is lost.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.inner.changes.subscribe()
    }

    /// Waits until this replica leads.
    pub async fn until_leading(&self) {
        let mut changes = self.subscribe();
        while !self.is_leading() {
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    fn renewed(&self, until: Instant) {
        let was_leading = {
            let mut valid_until = self
                .inner
                .valid_until
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let was = valid_until.is_some_and(|t| Instant::now() < t);
            *valid_until = Some(until);
            was
        };
        // Announced also after a lapse: a renewal that came after the renew deadline (a slow
        // API server) let `is_leading` turn false on its own, with nothing sent, and whoever
        // waits in `until_leading` must hear of the renewal that ends the lapse.
        self.inner.changes.send_if_modified(|leading| {
            let announce = !*leading || !was_leading;
            *leading = true;
            announce
        });
    }

    fn lost(&self) {
        *self
            .inner
            .valid_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
        self.inner.changes.send_if_modified(|leading| {
            let was = *leading;
            *leading = false;
            was
        });
    }
}

/// The record last seen, and when (on this replica's clock) it last changed.
struct Observed {
    resource_version: Option<String>,
    at: Instant,
}

/// What one round decided.
#[derive(Debug, PartialEq, Eq)]
enum Round {
    /// This replica holds the Lease (acquired or renewed).
    Holding,
    /// Someone else holds it.
    Following,
}

/// Runs the election until `shutdown` completes, then gives the Lease up if it holds it (so
/// the next replica takes over at once instead of after `duration`).
pub async fn elect(
    api: Api<Lease>,
    config: LeaseConfig,
    leadership: Leadership,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut observed: Option<Observed> = None;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let started = Instant::now();
        match round(&api, &config, &mut observed).await {
            Ok(Round::Holding) => {
                if !leadership.is_leading() {
                    tracing::info!(
                        lease = %config.name,
                        identity = %config.identity,
                        "leading: this replica holds the lease"
                    );
                }
                leadership.renewed(started + config.renew_deadline);
            }
            Ok(Round::Following) => {
                if leadership.valid_until().is_some() {
                    tracing::warn!(lease = %config.name, "lost the lease to another replica");
                }
                leadership.lost();
            }
            Err(e) => {
                tracing::warn!(lease = %config.name, "cannot renew or acquire the lease: {e}");
                if leadership.valid_until().is_some() && !leadership.is_leading() {
                    tracing::warn!(
                        lease = %config.name,
                        "not renewed within the renew deadline: no longer acting as leader"
                    );
                    leadership.lost();
                }
            }
        }
        let pause = jittered(config.retry_period);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = &mut shutdown => break,
        }
    }
    if leadership.valid_until().is_some() {
        leadership.lost();
        if let Err(e) = give_up(&api, &config).await {
            tracing::warn!(lease = %config.name, "could not give the lease up: {e}");
        }
    }
}

/// `period` plus up to 20% (client-go's jitter factor is 1.2), so replicas do not stay in step.
fn jittered(period: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    period + period.mul_f64(f64::from(nanos % 1000) / 5000.0)
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn spec(config: &LeaseConfig, transitions: i32, acquired: MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: Some(config.duration.as_secs().max(1) as i32),
        acquire_time: Some(acquired),
        renew_time: Some(now()),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

async fn round(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observed: &mut Option<Observed>,
) -> Result<Round, kube::Error> {
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(spec(config, 0, now())),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(Round::Holding),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Round::Following),
            Err(e) => Err(e),
        };
    };
    let current = lease.spec.clone().unwrap_or_default();
    let holder = current.holder_identity.clone().unwrap_or_default();
    let transitions = current.lease_transitions.unwrap_or(0);
    let version = lease.metadata.resource_version.clone();
    let changed = observed
        .as_ref()
        .is_none_or(|o| o.resource_version != version);
    if changed {
        *observed = Some(Observed {
            resource_version: version,
            at: Instant::now(),
        });
    }
    let duration = current
        .lease_duration_seconds
        .map(|s| Duration::from_secs(s.max(0) as u64))
        .unwrap_or(config.duration);
    let mine = holder == config.identity;
    let expired = holder.is_empty()
        || observed
            .as_ref()
            .is_some_and(|o| o.at.elapsed() >= duration && !changed);
    if !mine && !expired {
        return Ok(Round::Following);
    }
    lease.spec = Some(if mine {
        spec(
            config,
            transitions,
            current.acquire_time.clone().unwrap_or_else(now),
        )
    } else {
        spec(config, transitions.saturating_add(1), now())
    });
    // `replace` carries the resourceVersion read: a write by anyone since makes it a 409.
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(written) => {
            *observed = Some(Observed {
                resource_version: written.metadata.resource_version,
                at: Instant::now(),
            });
            Ok(Round::Holding)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Round::Following),
        Err(e) => Err(e),
    }
}

/// Empties the holder (client-go's ReleaseOnCancel), if this replica still holds the Lease.
async fn give_up(api: &Api<Lease>, config: &LeaseConfig) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    api.replace(&config.name, &PostParams::default(), &lease)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The autopool and declared-pool passes wait in `until_leading`; after a renewal that came
    /// too late (the API server restarting) they waited forever, and Deployments got no pools.
    #[tokio::test]
    async fn a_renewal_after_a_lapse_wakes_whoever_waits_to_lead() {
        let leadership = Leadership::default();
        leadership.renewed(Instant::now() + Duration::from_millis(20));
        assert!(leadership.is_leading());
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(!leadership.is_leading(), "the renew deadline passed");

        let waiting = tokio::spawn({
            let leadership = leadership.clone();
            async move { leadership.until_leading().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A round that took longer than the renew deadline: held, but not valid to act on.
        leadership.renewed(Instant::now() - Duration::from_millis(1));
        assert!(!leadership.is_leading());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "woken, but not leading yet");
        leadership.renewed(Instant::now() + Duration::from_secs(10));
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("until_leading returns once the lease is renewed in time")
            .unwrap();
    }

    #[tokio::test]
    async fn losing_and_winning_again_is_announced_once_each() {
        let leadership = Leadership::default();
        let mut changes = leadership.subscribe();
        leadership.renewed(Instant::now() + Duration::from_secs(10));
        leadership.renewed(Instant::now() + Duration::from_secs(10));
        assert!(changes.has_changed().unwrap());
        assert!(*changes.borrow_and_update());
        assert!(
            !changes.has_changed().unwrap(),
            "a renewal in time is no news"
        );
        leadership.lost();
        assert!(!*changes.borrow_and_update());
        leadership.lost();
        assert!(!changes.has_changed().unwrap());
    }
}
