//! The controller's Prometheus metrics: what GC released and why, scans, leadership, pool usage,
//! the audit's drift.

use allot_core::audit::{KINDS, Report};
use allot_core::gc::LeakReason;
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
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabel {
    pub verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

pub struct Metrics {
    pub registry: Registry,
    /// Addresses GC released, by the decision table's reason.
    pub gc_released: Family<ReasonLabel, Counter>,
    /// Leaks the fresh read from the API just before release showed in use (kept).
    pub gc_kept_on_recheck: Counter,
    pub gc_suspects: Gauge,
    pub gc_scans: Counter,
    pub gc_scan_seconds: Histogram,
    pub gc_errors: Counter,
    pub endpoints_deleted: Counter,
    /// IPBlocks deleted once empty and cooled down.
    pub emptied_deleted: Counter,
    pub leader: Gauge,
    pub pool_allocated: Family<PoolLabel, Gauge>,
    pub pool_total: Family<PoolLabel, Gauge>,
    pub pool_status_writes: Counter,
    /// ResourceSlice writes (`create`, `replace`, `delete`) of `--resource-slices`.
    pub resource_slice_writes: Family<VerbLabel, Counter>,
    /// Findings of the last audit, by kind (`allotctl ipam check` lists them).
    pub ipam_drift: Family<KindLabel, Gauge>,
    pub audits: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("allot");
        let m = Metrics {
            gc_released: Family::default(),
            gc_kept_on_recheck: Counter::default(),
            gc_suspects: Gauge::default(),
            gc_scans: Counter::default(),
            gc_scan_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            gc_errors: Counter::default(),
            endpoints_deleted: Counter::default(),
            emptied_deleted: Counter::default(),
            leader: Gauge::default(),
            pool_allocated: Family::default(),
            pool_total: Family::default(),
            pool_status_writes: Counter::default(),
            resource_slice_writes: Family::default(),
            ipam_drift: Family::default(),
            audits: Counter::default(),
            registry: Registry::default(),
        };
        for kind in KINDS {
            let _ = m.ipam_drift.get_or_create(&KindLabel { kind: kind.into() });
        }
        for reason in LeakReason::ALL {
            // Every reason shows from the start, at 0, so that rate() works from the first scrape.
            let _ = m.gc_released.get_or_create(&ReasonLabel {
                reason: reason.as_str().to_string(),
            });
        }
        registry.register(
            "gc_released",
            "Addresses garbage collection released, by reason (the decision table's row)",
            m.gc_released.clone(),
        );
        registry.register(
            "gc_kept_on_recheck",
            "Leaks that a fresh read of the pod just before release showed in use, and were kept",
            m.gc_kept_on_recheck.clone(),
        );
        registry.register(
            "gc_suspects",
            "Claims seen leaked once, waiting for their second sighting past the grace period",
            m.gc_suspects.clone(),
        );
        registry.register("gc_scans", "Full GC scans run", m.gc_scans.clone());
        registry.register(
            "gc_scan_duration_seconds",
            "Time of one full GC scan (decisions over every claim, re-checks, releases)",
            m.gc_scan_seconds.clone(),
        );
        registry.register(
            "gc_errors",
            "GC passes that stopped on a store or API error (what was not released stays suspect)",
            m.gc_errors.clone(),
        );
        registry.register(
            "gc_endpoints_deleted",
            "Outdated Endpoints deleted (ALLOT_GC_CLEAN_OUTDATED_ENDPOINT)",
            m.endpoints_deleted.clone(),
        );
        registry.register(
            "gc_emptied_blocks_deleted",
            "IPBlocks deleted after a scan: no claim left, last release over an hour ago",
            m.emptied_deleted.clone(),
        );
        registry.register(
            "controller_leader",
            "1 while this replica holds the leader lease",
            m.leader.clone(),
        );
        registry.register(
            "pool_allocated_addresses",
            "Addresses claimed from each IPPool",
            m.pool_allocated.clone(),
        );
        registry.register(
            "pool_total_addresses",
            "Addresses each IPPool may hand out (ips − excludeIPs − gateway)",
            m.pool_total.clone(),
        );
        registry.register(
            "pool_status_writes",
            "IPPool and Subnet status writes (counts changed)",
            m.pool_status_writes.clone(),
        );
        registry.register(
            "resource_slice_writes",
            "ResourceSlice writes publishing the pools to the scheduler, by verb",
            m.resource_slice_writes.clone(),
        );
        registry.register(
            "ipam_drift",
            "Findings of the last audit by kind: leaked-claim, unclaimed-address, claimed-twice, \
             endpoint-without-claim, status-disagrees, pool-count (allotctl ipam check lists them)",
            m.ipam_drift.clone(),
        );
        registry.register(
            "ipam_audits",
            "Audits run (pods, Endpoints, claims and pool counts compared)",
            m.audits.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Records what an audit found.
    pub fn audited(&self, report: &Report) {
        self.audits.inc();
        for (kind, n) in KINDS.iter().zip(report.counts()) {
            self.ipam_drift
                .get_or_create(&KindLabel {
                    kind: (*kind).into(),
                })
                .set(n as i64);
        }
    }

    pub fn released(&self, reason: LeakReason) {
        self.gc_released
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().to_string(),
            })
            .inc();
    }

    /// The text exposition format, for `GET /metrics`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("cannot encode metrics: {e}");
        }
        out
    }
}
