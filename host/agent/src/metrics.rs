//! Prometheus metrics: allocations, releases, errors by reason, ADD latency, pool usage.

use allot_core::engine::PoolUsage;
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
pub struct PoolLabel {
    pub pool: String,
    pub state: String,
}

pub struct Metrics {
    registry: Registry,
    pub allocations: Counter,
    pub releases: Counter,
    pub errors: Family<ReasonLabel, Counter>,
    pub add_seconds: Histogram,
    pub pool_addresses: Family<PoolLabel, Gauge>,
    pub config_errors: Gauge,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("allot");
        let allocations = Counter::default();
        let releases = Counter::default();
        let errors = Family::<ReasonLabel, Counter>::default();
        let add_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        let pool_addresses = Family::<PoolLabel, Gauge>::default();
        let config_errors = Gauge::default();
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
            "Addresses per pool: total (assignable) and free",
            pool_addresses.clone(),
        );
        registry.register(
            "config_errors",
            "Objects in the standalone directory left out because they are invalid",
            config_errors.clone(),
        );
        Metrics {
            registry,
            allocations,
            releases,
            errors,
            add_seconds,
            pool_addresses,
            config_errors,
        }
    }

    pub fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Encodes the registry, with pool gauges set from `usage` first.
    pub fn encode(&self, usage: &[PoolUsage]) -> String {
        self.pool_addresses.clear();
        for u in usage {
            for (state, value) in [("total", u.total), ("free", u.free)] {
                self.pool_addresses
                    .get_or_create(&PoolLabel {
                        pool: u.name.clone(),
                        state: state.to_string(),
                    })
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
