//! Prometheus metrics: allocations, releases, errors by reason, ADD latency, pool usage, and
//! what of the configuration is not in force.

use std::sync::atomic::AtomicU64;

use allot_engine::PoolUsage;

use crate::config::ConfigState;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FaultLabel {
    pub kind: String,
    /// `failed` (the allocation failed) or `fell-back` (the default policy decided instead).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolNameLabel {
    pub pool: String,
}

pub struct Metrics {
    registry: Registry,
    pub allocations: Counter,
    pub releases: Counter,
    pub errors: Family<ReasonLabel, Counter>,
    pub add_seconds: Histogram,
    /// Per pool and state; a float, since an IPv6 pool's counts pass any integer gauge's range
    /// (2^64 addresses in a /64), and a dashboard wants the real count, not a saturated one.
    pub pool_addresses: Family<PoolLabel, Gauge<f64, AtomicU64>>,
    pub config_problems: Family<StateLabel, Gauge>,
    pub degraded: Gauge,
    /// Addresses found in use by another host on a pod's link (each one quarantined).
    pub conflicts: Counter,
    /// Quarantined addresses, as of the last quarantine or expiry pass.
    pub quarantined: Gauge,
    /// Cluster mode: the IPBlocks the claim store follows, and their regions (-1: every block),
    /// set at each scrape.
    pub ipblocks_followed: Gauge,
    pub ipblock_regions_followed: Gauge,
    /// `--probe-ahead`: addresses handed out probed ahead (the plugin does not probe them),
    /// addresses of probing ADDs on a probed-ahead link handed out without a fresh verdict,
    /// and probes run from parent links.
    pub probe_ahead_hits: Counter,
    pub probe_ahead_misses: Counter,
    pub probe_ahead_probes: Counter,
    lost_races: Counter,
    /// Cooling addresses handed out because nothing else was free, per pool, advanced to the
    /// engine's totals at each scrape.
    cooldown_cut_short: Family<PoolNameLabel, Counter>,
    /// Policy faults (trap, deadline, memory-limit, bad-output, internal), advanced to the
    /// policy registry's totals at each scrape.
    policy_faults: Family<FaultLabel, Counter>,
    /// Serialises scrapes (counters are advanced to the engine's totals while encoding).
    encoding: std::sync::Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("allot");
        let allocations = Counter::default();
        let releases = Counter::default();
        let errors = Family::<ReasonLabel, Counter>::default();
        let add_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        let pool_addresses = Family::<PoolLabel, Gauge<f64, AtomicU64>>::default();
        let config_problems = Family::<StateLabel, Gauge>::default();
        let degraded = Gauge::default();
        let lost_races = Counter::default();
        let conflicts = Counter::default();
        let quarantined = Gauge::default();
        let ipblocks_followed = Gauge::default();
        let ipblock_regions_followed = Gauge::default();
        registry.register(
            "ipblocks_followed",
            "Cluster mode: IPBlocks the agent's claim store holds and watches (those of the pools its node may use)",
            ipblocks_followed.clone(),
        );
        registry.register(
            "ipblock_regions_followed",
            "Cluster mode: regions (allot.dev/region) of the IPBlocks followed; -1 while every block is followed",
            ipblock_regions_followed.clone(),
        );
        registry.register(
            "conflicts",
            "Addresses another host answered for on a pod's link during an ADD's probe; each was quarantined and replaced",
            conflicts.clone(),
        );
        registry.register(
            "quarantined_addresses",
            "Addresses held by a quarantine (a conflict seen on the link) until --quarantine-seconds have passed",
            quarantined.clone(),
        );
        let probe_ahead_hits = Counter::default();
        let probe_ahead_misses = Counter::default();
        let probe_ahead_probes = Counter::default();
        registry.register(
            "probe_ahead_hits",
            "Addresses handed out with a fresh verdict probed ahead from the parent link: the plugin did not probe them in the pod's namespace",
            probe_ahead_hits.clone(),
        );
        registry.register(
            "probe_ahead_misses",
            "Addresses of probing ADDs on a link probed ahead that had no fresh verdict: the plugin probed them in the pod's namespace",
            probe_ahead_misses.clone(),
        );
        registry.register(
            "probe_ahead_probes",
            "Probes (each of up to the network's tries) the agent completed from parent links ahead of ADDs",
            probe_ahead_probes.clone(),
        );
        let cooldown_cut_short = Family::<PoolNameLabel, Counter>::default();
        registry.register(
            "cooldown_cut_short",
            "Addresses handed out before their cooldown (--cooldown-seconds) was over, because no \
             other address of the pool was free: the one released longest ago, rather than \
             failing the pod",
            cooldown_cut_short.clone(),
        );
        registry.register(
            "lost_races",
            "Address races lost to another writer of the store (another agent); each was retried with another address",
            lost_races.clone(),
        );
        let policy_faults = Family::<FaultLabel, Counter>::default();
        for kind in ["trap", "deadline", "memory-limit", "bad-output", "internal"] {
            for outcome in ["failed", "fell-back"] {
                // Every series from the start, at 0, so that rate() and alerts see it.
                let _ = policy_faults.get_or_create(&FaultLabel {
                    kind: kind.into(),
                    outcome: outcome.into(),
                });
            }
        }
        registry.register(
            "policy_faults",
            "Policy calls that faulted (a trap, the deadline, the memory cap, output that is not a \
             decision), by kind and outcome: failed (the ADD failed, code 102) or fell-back (the \
             embedded default decided, --policy-on-failure fallback / onFailure: fallback)",
            policy_faults.clone(),
        );
        registry.register("allocations", "Addresses handed out", allocations.clone());
        registry.register("releases", "Addresses released", releases.clone());
        registry.register("errors", "Failed requests by reason", errors.clone());
        registry.register(
            "add_duration_seconds",
            "Time to serve an ADD",
            add_seconds.clone(),
        );
        registry.register(
            "pool_addresses",
            "Addresses per pool: total (assignable), free (can be handed out, cooling ones \
             included), cooling (of the free ones, released less than the cooldown ago: handed \
             out only when no other is free) and claims (held by a terminating version)",
            pool_addresses.clone(),
        );
        registry.register(
            "config_problems",
            "Objects (and files) of the configuration not entirely in force, by state: held-back \
             (the previous version serves), left-out, partial (a ReservedIP reserving what could \
             be read), incomplete (a file that could not be read completely)",
            config_problems.clone(),
        );
        registry.register(
            "degraded",
            "1 while the configuration in force differs from the files or the last reload failed",
            degraded.clone(),
        );
        Metrics {
            registry,
            allocations,
            releases,
            errors,
            add_seconds,
            pool_addresses,
            config_problems,
            degraded,
            conflicts,
            quarantined,
            ipblocks_followed,
            ipblock_regions_followed,
            probe_ahead_hits,
            probe_ahead_misses,
            probe_ahead_probes,
            lost_races,
            cooldown_cut_short,
            policy_faults,
            encoding: Default::default(),
        }
    }

    pub fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Sets the configuration gauges from what the last reload made of the files.
    pub fn set_config(&self, config: &ConfigState) {
        self.config_problems.clear();
        for state in ["held-back", "left-out", "partial", "incomplete", "failed"] {
            // Every state is exported, at 0 when nothing is in it, so alerts see the series.
            self.config_problems
                .get_or_create(&StateLabel {
                    state: state.to_string(),
                })
                .set(0);
        }
        for p in config.listed() {
            self.config_problems
                .get_or_create(&StateLabel { state: p.state })
                .inc();
        }
        self.degraded.set(i64::from(config.degraded()));
    }

    /// Encodes the registry, with pool gauges set from `usage` and the lost-races and
    /// policy-fault counters advanced to the engine's and the policy registry's totals first.
    pub fn encode(
        &self,
        usage: &[PoolUsage],
        lost_races: u64,
        policy_faults: &[(allot_policy::FaultKey, u64)],
    ) -> String {
        let _one_scrape = self.encoding.lock().unwrap_or_else(|p| p.into_inner());
        let seen = self.lost_races.get();
        if lost_races > seen {
            self.lost_races.inc_by(lost_races - seen);
        }
        for (key, total) in policy_faults {
            let counter = self.policy_faults.get_or_create(&FaultLabel {
                kind: key.kind.to_string(),
                outcome: if key.fell_back { "fell-back" } else { "failed" }.to_string(),
            });
            let seen = counter.get();
            if *total > seen {
                counter.inc_by(total - seen);
            }
        }
        for u in usage.iter().filter(|u| u.cooldown_cut_short > 0) {
            let counter = self.cooldown_cut_short.get_or_create(&PoolNameLabel {
                pool: u.name.clone(),
            });
            let seen = counter.get();
            if u.cooldown_cut_short > seen {
                counter.inc_by(u.cooldown_cut_short - seen);
            }
        }
        self.pool_addresses.clear();
        for u in usage {
            for (state, value) in [
                ("total", u.total),
                ("free", u.free),
                ("cooling", u.cooling),
                ("claims", u.claims),
            ] {
                self.pool_addresses
                    .get_or_create(&PoolLabel {
                        pool: u.name.clone(),
                        state: state.to_string(),
                    })
                    .set(value as f64);
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Metrics;
    use allot_core::addr::IpFamily;
    use allot_engine::{PoolState, PoolUsage};
    use allot_policy::FaultKey;

    #[test]
    fn policy_faults_follow_the_registry_totals() {
        let m = Metrics::new();
        let text = m.encode(&[], 0, &[]);
        assert!(
            text.contains("allot_policy_faults_total{kind=\"deadline\",outcome=\"fell-back\"} 0"),
            "{text}"
        );
        let trap = FaultKey {
            kind: "trap",
            fell_back: false,
        };
        assert!(
            m.encode(&[], 0, &[(trap, 3)])
                .contains("allot_policy_faults_total{kind=\"trap\",outcome=\"failed\"} 3")
        );
        // Totals, not increments: the same total twice counts once.
        assert!(
            m.encode(&[], 0, &[(trap, 5)])
                .contains("allot_policy_faults_total{kind=\"trap\",outcome=\"failed\"} 5")
        );
    }

    /// An IPv6 /64 has more free addresses than any signed 64-bit gauge holds: the metric shows
    /// the real count (as a float), not a saturated 9223372036854775807.
    #[test]
    fn an_ipv6_pools_counts_are_real() {
        let usage = PoolUsage {
            name: "v6".into(),
            family: IpFamily::V6,
            total: u64::MAX,
            free: u64::MAX - 3,
            cooling: 0,
            cooldown_cut_short: 0,
            claims: 3,
            state: PoolState::Serving,
        };
        let text = Metrics::new().encode(&[usage], 0, &[]);
        let free: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("allot_pool_addresses{pool=\"v6\",state=\"free\"} "))
            .unwrap_or_else(|| panic!("no free count in:\n{text}"))
            .parse()
            .unwrap();
        assert!(free > 1.8e19, "{free}");
    }
}
