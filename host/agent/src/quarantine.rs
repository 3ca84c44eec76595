//! Underlay safety, the agent's side: the probe defaults it hands the plugin, the quarantine of
//! addresses the plugin found in use on a pod's link, and their expiry.
//!
//! The plugin probes (see `allot-cni`'s `probe` module for why it, not the agent): it has the
//! pod's namespace and interface in hand when the main plugin has created the interface. The
//! agent answers ADD with its `--probe-*` defaults for networks whose config has no `probe`
//! section, and serves `POST /v1/quarantine`: each conflicting address moves, in one store
//! write, from the attachment to a claim owned by the conflict (`PodRef::conflict`, which
//! records the MAC), then the ADD is served again and gets other addresses. Quarantined claims
//! are detached, so CNI GC never takes them for leaks and no pod takes them back; they are
//! released by [`spawn_expiry`] once `--quarantine-seconds` have passed (and then cool down
//! like any release). Everything goes through the `Store` trait, so SQLite, etcd and the
//! Kubernetes IPBlocks carry quarantines alike, and `allotctl claims list` shows them.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use allot_api::{self as api, ErrorBody, ProbeSettings, codes};
use allot_core::engine::AllocError;
use anyhow::bail;
use hyper::StatusCode;

use crate::server::{Reply, Shared, add_request, blocking, json, result};

/// How long a quarantined address stays out of use by default: an hour. The host that answered
/// for it is usually there to stay (a static address, an appliance, a forgotten VM), so a short
/// quarantine would only send the pool's round-robin cursor back to it soon, to find it taken
/// again at the next ADD (one more probe round); an hour bounds what a transient conflict (a
/// host that has since moved) costs the pool. When it expires the address is released, cools
/// down, and is probed again before it is handed out on any network that probes. Operators see
/// it meanwhile in `allotctl claims list` and `allot_quarantined_addresses`.
pub const DEFAULT_QUARANTINE_SECONDS: u64 = 3600;

/// The agent's probe and quarantine flags (flattened into its `Args`).
#[derive(clap::Args, Debug, Clone)]
pub struct UnderlayArgs {
    /// Probe every address of an ADD for conflicts on the pod's link (ARP / NDP duplicate
    /// address detection), for networks whose config has no ipam `probe` section.
    #[arg(long)]
    probe_conflict: bool,
    /// Check that each gateway answers on the pod's link, for networks whose config has no
    /// ipam `probe` section.
    #[arg(long)]
    probe_gateway: bool,
    /// Requests per probe (with --probe-conflict / --probe-gateway).
    #[arg(long, value_name = "N", default_value_t = 3)]
    probe_tries: u32,
    /// How long each probe request waits for an answer, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    probe_timeout_ms: u64,
    /// How long an address found in use by another host stays quarantined before it is
    /// released (and, after its cool-down, handed out again, probed first).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_QUARANTINE_SECONDS)]
    quarantine_seconds: u64,
    /// Probe the next addresses of each pool (and its gateway) ahead of time from the node-side
    /// parent link of the networks that probe (a bridge; a macvlan master, through a macvlan
    /// sibling the agent creates), so that an ADD handed one of them skips the wait in the
    /// pod's namespace. Sends frames on those links on its own: off unless given.
    #[arg(long)]
    probe_ahead: bool,
    /// Addresses per pool and link kept probed ahead (with --probe-ahead).
    #[arg(long, value_name = "N", default_value_t = 2)]
    probe_ahead_candidates: usize,
    /// How long a verdict found ahead may be used; candidates are probed again after half of
    /// it (with --probe-ahead).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    probe_ahead_fresh_seconds: u64,
    /// Probe requests one link may send per second when probing ahead, at most.
    #[arg(long, value_name = "N", default_value_t = 20)]
    probe_ahead_rate: u32,
}

/// What [`UnderlayArgs`] decided, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Underlay {
    /// The defaults the plugin applies to a network without a `probe` section; `None` when they
    /// probe nothing.
    pub probe: Option<ProbeSettings>,
    pub quarantine_seconds: u64,
    /// `--probe-ahead` and its settings; `None` when off.
    pub ahead: Option<crate::ahead::AheadConfig>,
}

impl UnderlayArgs {
    pub fn underlay(&self) -> anyhow::Result<Underlay> {
        let settings = ProbeSettings {
            conflict: self.probe_conflict,
            gateway: self.probe_gateway,
            tries: self.probe_tries,
            timeout_ms: self.probe_timeout_ms,
        };
        let cfg = allot_probe::ProbeConfig {
            tries: settings.tries,
            timeout: Duration::from_millis(settings.timeout_ms),
            ..allot_probe::ProbeConfig::default()
        };
        if let Err(e) = cfg.validate() {
            bail!("--probe-tries / --probe-timeout-ms: {e}");
        }
        if self.quarantine_seconds == 0 {
            bail!(
                "--quarantine-seconds 0 would hand a conflicting address out again at once: use \
                 at least 1 (default {DEFAULT_QUARANTINE_SECONDS})"
            );
        }
        if !(1..=64).contains(&self.probe_ahead_candidates) {
            bail!(
                "--probe-ahead-candidates {}: use 1 to 64",
                self.probe_ahead_candidates
            );
        }
        if !(1..=3600).contains(&self.probe_ahead_fresh_seconds) {
            bail!(
                "--probe-ahead-fresh-seconds {}: use 1 to 3600",
                self.probe_ahead_fresh_seconds
            );
        }
        if !(1..=1000).contains(&self.probe_ahead_rate) {
            bail!(
                "--probe-ahead-rate {}: use 1 to 1000",
                self.probe_ahead_rate
            );
        }
        Ok(Underlay {
            probe: settings.enabled().then_some(settings),
            quarantine_seconds: self.quarantine_seconds,
            ahead: self.probe_ahead.then_some(crate::ahead::AheadConfig {
                candidates: self.probe_ahead_candidates,
                fresh: Duration::from_secs(self.probe_ahead_fresh_seconds),
                rate: self.probe_ahead_rate,
            }),
        })
    }
}

/// `POST /v1/quarantine`.
pub async fn handle(shared: Arc<Shared>, r: api::QuarantineRequest) -> Reply {
    let mut conflicts = Vec::with_capacity(r.conflicts.len());
    for c in &r.conflicts {
        let Ok(address) = c.address.parse::<IpAddr>() else {
            return bad_request(format!(
                "conflict address {:?} is not an address",
                c.address
            ));
        };
        conflicts.push((address, c.mac.clone(), c.contested));
    }
    if conflicts.is_empty() {
        return bad_request("a quarantine request names no conflict".into());
    }
    let (request, found) = match add_request(&shared, &r.add).await {
        Ok(built) => built,
        Err(reply) => return reply,
    };
    let replace = r.replace;
    blocking(&shared, "quarantine", move |s| {
        let pairs: Vec<(IpAddr, String)> =
            conflicts.iter().map(|(a, m, _)| (*a, m.clone())).collect();
        let (quarantined, outcome) = s.engine.quarantine(&request, &pairs, replace)?;
        s.metrics.conflicts.inc_by(quarantined.len() as u64);
        s.metrics.quarantined.inc_by(quarantined.len() as i64);
        for (address, mac, contested) in &conflicts {
            tracing::warn!(
                %address,
                %mac,
                contested,
                container = %request.attachment,
                pod = %format!("{}/{}", request.pod.namespace, request.pod.name),
                quarantine_seconds = s.underlay.quarantine_seconds,
                "address conflict: another host answered for the address on the pod's link; quarantined"
            );
        }
        match outcome {
            Some(out) => {
                let settings = r.add.probe.or(s.underlay.probe);
                let preprobed = s
                    .ahead
                    .as_ref()
                    .and_then(|a| a.served(&r.add, settings, &out));
                s.metrics.allocations.inc_by(out.claimed.len() as u64);
                for a in out.allocations.iter().filter(|a| out.claimed.contains(&a.address)) {
                    tracing::info!(address = %a.cidr(), pool = %a.pool, container = %request.attachment, "allocated in place of a quarantined address");
                }
                // The Endpoint the first answer wrote names the quarantined address.
                if let (Some(cluster), Some(pod)) = (&s.cluster, &found) {
                    cluster
                        .endpoints
                        .added(pod, &request.attachment.interface, &out);
                }
                Ok(json(
                    StatusCode::OK,
                    &api::IpamResult {
                        preprobed,
                        ..result(&out)
                    },
                ))
            }
            None => Ok(json(StatusCode::OK, &serde_json::json!({}))),
        }
    })
    .await
}

fn bad_request(msg: String) -> Reply {
    json(
        StatusCode::BAD_REQUEST,
        &ErrorBody {
            code: codes::DECODE_FAILURE,
            msg,
            details: String::new(),
        },
    )
}

/// How often expired quarantines are looked for: a tenth of the quarantine, between 1 s and a
/// minute.
fn expiry_interval(quarantine_seconds: u64) -> Duration {
    Duration::from_secs((quarantine_seconds / 10).clamp(1, 60))
}

/// Releases quarantined addresses once `--quarantine-seconds` have passed, and keeps the
/// `allot_quarantined_addresses` gauge true (also for quarantines made by other agents sharing
/// the store).
pub fn spawn_expiry(shared: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    let every = expiry_interval(shared.underlay.quarantine_seconds);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !shared.engine.is_loaded() {
                continue;
            }
            let s = shared.clone();
            let work = tokio::task::spawn_blocking(move || expire(&s)).await;
            if let Err(e) = work {
                tracing::error!("releasing expired quarantines failed: {e}");
            }
        }
    })
}

fn expire(s: &Shared) {
    match s.engine.expire_quarantined(s.underlay.quarantine_seconds) {
        Ok((released, kept)) => {
            s.metrics.releases.inc_by(released.len() as u64);
            s.metrics.quarantined.set(kept.len() as i64);
            for c in &released {
                tracing::info!(
                    address = %c.address,
                    pool = %c.pool,
                    mac = c.pod.conflict_mac().unwrap_or(""),
                    "released a quarantined address: its quarantine has expired"
                );
            }
        }
        Err(AllocError::Store(e)) => tracing::warn!("releasing expired quarantines: {e}"),
        Err(e) => tracing::warn!("releasing expired quarantines: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        underlay: UnderlayArgs,
    }

    fn parse(args: &[&str]) -> anyhow::Result<Underlay> {
        let mut argv = vec!["allot-agent"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)?.underlay.underlay()
    }

    #[test]
    fn off_by_default() {
        assert_eq!(
            parse(&[]).unwrap(),
            Underlay {
                probe: None,
                quarantine_seconds: DEFAULT_QUARANTINE_SECONDS,
                ahead: None,
            }
        );
        // Tries and timeout alone turn nothing on.
        assert_eq!(parse(&["--probe-tries", "5"]).unwrap().probe, None);
    }

    #[test]
    fn flags_become_the_plugins_defaults() {
        let u = parse(&[
            "--probe-conflict",
            "--probe-tries",
            "2",
            "--probe-timeout-ms",
            "50",
            "--quarantine-seconds",
            "60",
        ])
        .unwrap();
        assert_eq!(
            u.probe,
            Some(ProbeSettings {
                conflict: true,
                gateway: false,
                tries: 2,
                timeout_ms: 50
            })
        );
        assert_eq!(u.quarantine_seconds, 60);
        assert_eq!(u.ahead, None, "probing ahead is a flag of its own");
        let u = parse(&["--probe-ahead", "--probe-ahead-fresh-seconds", "4"]).unwrap();
        assert_eq!(
            u.ahead,
            Some(crate::ahead::AheadConfig {
                candidates: 2,
                fresh: Duration::from_secs(4),
                rate: 20
            })
        );
    }

    #[test]
    fn bad_values_are_refused_with_the_bounds() {
        for (args, says) in [
            (
                &["--probe-conflict", "--probe-tries", "0"][..],
                "use 1 to 100",
            ),
            (&["--probe-timeout-ms", "0"][..], "use 1 ms to 10 s"),
            (&["--quarantine-seconds", "0"][..], "at least 1"),
            (&["--probe-ahead-candidates", "0"][..], "use 1 to 64"),
            (&["--probe-ahead-fresh-seconds", "0"][..], "use 1 to 3600"),
            (&["--probe-ahead-rate", "0"][..], "use 1 to 1000"),
        ] {
            let e = parse(args).unwrap_err().to_string();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn expiry_runs_often_enough() {
        assert_eq!(expiry_interval(1), Duration::from_secs(1));
        assert_eq!(expiry_interval(120), Duration::from_secs(12));
        assert_eq!(
            expiry_interval(DEFAULT_QUARANTINE_SECONDS),
            Duration::from_secs(60)
        );
    }
}
