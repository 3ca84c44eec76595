//! Flags. The GC settings take Spiderpool's environment variables under allot's names
//! (`ALLOT_GC_…`) and, for clusters migrating from Spiderpool, its own spellings
//! (`SPIDERPOOL_GC_…`) where allot's are not set.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use allot_core::gc::GcConfig;
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, CommandFactory, FromArgMatches, Parser};

use crate::gc::GcSettings;

#[derive(Parser, Debug)]
#[command(
    name = "allot-controller",
    version,
    about = "allot's cluster-wide controller: garbage collection of leaked addresses, pool status \
             and finalizers, subnet auto-pools, admission webhooks and fleet ranges; one leader \
             per cluster"
)]
pub struct ControllerArgs {
    /// A kubeconfig file; without it `$KUBECONFIG`, `~/.kube/config` or the in-cluster
    /// ServiceAccount, as kubectl looks for them.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace the controller runs in: its Lease, its Events about itself.
    #[arg(long, env = "POD_NAMESPACE", default_value = "allot-system")]
    pub namespace: String,
    /// This replica's name in the Lease (the pod's name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// The Lease that elects the leader.
    #[arg(long, default_value = "allot-controller")]
    pub lease_name: String,
    /// Seconds others wait for a silent leader before taking over (leaseDurationSeconds).
    #[arg(long, value_name = "SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// A leader that has not renewed for this long stops acting (shorter than the duration).
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub lease_renew_deadline_seconds: u64,
    /// How often the lease is renewed, or tried.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub lease_retry_period_ms: u64,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (plain HTTP).
    #[arg(long, value_name = "ADDR", default_value = "[::]:9402")]
    pub metrics_address: SocketAddr,
    /// How often pool status counts are brought up to date (at most one write per pool per
    /// interval) and pool finalizers checked.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub status_interval_seconds: u64,
    /// Publish every IPPool to the scheduler as a `resource.k8s.io/v1` ResourceSlice
    /// (`<pool>.ipam.allot.dev`, Dynamic Resource Allocation; docs/scheduling.md).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub resource_slices: bool,
    /// How often the leader brings the ResourceSlices up to date (a write only when one changed).
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub resource_slices_poll_ms: u64,
    /// How often the leader audits pods, Endpoints, claims and pool counts (drift metrics, and
    /// an Event for a finding seen at two audits in a row); 0: never.
    #[arg(
        long,
        value_name = "SECONDS",
        env = "ALLOT_AUDIT_INTERVAL_SECONDS",
        default_value_t = 300
    )]
    pub audit_interval_seconds: u64,
    /// After SIGTERM, how long the webhook keeps answering (reporting not ready meanwhile)
    /// before it stops. The API server sends admission requests to the endpoints it knows, and
    /// learns that this replica is terminating a moment after the replica does; a webhook that
    /// stopped at once would refuse what was sent meanwhile, and the webhook fails closed. The
    /// pod's terminationGracePeriodSeconds must exceed it.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub shutdown_delay_seconds: u64,
    /// Delete the webhook configurations this controller made, and exit (for an uninstall
    /// hook: configurations that fail closed must not outlive the controller).
    #[arg(long)]
    pub remove_webhook_configurations: bool,
    #[command(flatten)]
    pub gc: GcArgs,
    #[command(flatten)]
    pub webhook: crate::webhook::WebhookArgs,
    #[command(flatten)]
    pub auto_pools: crate::autopool::AutoPoolArgs,
    #[command(flatten)]
    pub fleet: crate::fleet::FleetArgs,
}

/// The GC decision table's settings, shared by `allot-controller` and `allotctl gc`.
#[derive(Args, Debug, Clone)]
pub struct GcArgs {
    /// Release leaked addresses at all.
    #[arg(long, env = "ALLOT_GC_IP_ENABLED", default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub gc_enabled: bool,
    /// Release the addresses of stateless pods terminating past their grace period on a Ready
    /// node.
    #[arg(long, env = "ALLOT_GC_STATELESS_TERMINATING_POD_ON_READY_NODE_ENABLED", default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub gc_terminating_on_ready_node: bool,
    /// Release the addresses of stateless pods terminating past their grace period on a node
    /// that is not Ready (a node that went down).
    #[arg(long, env = "ALLOT_GC_STATELESS_TERMINATING_POD_ON_NOT_READY_NODE_ENABLED", default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub gc_terminating_on_not_ready_node: bool,
    /// Release the addresses of stateless Running pods whose status.podIPs is empty.
    #[arg(long, env = "ALLOT_GC_ENABLE_STATELESS_RUNNING_POD_ON_EMPTY_POD_STATUS_IPS", default_value_t = false, action = ArgAction::Set, value_name = "BOOL")]
    pub gc_running_on_empty_pod_ips: bool,
    /// Seconds added to every release time (after a pod's grace period, after a deleted pod was
    /// first seen).
    #[arg(
        long,
        env = "ALLOT_GC_ADDITIONAL_GRACE_DELAY",
        default_value_t = 0,
        value_name = "SECONDS"
    )]
    pub gc_additional_grace_delay: u64,
    /// Seconds between full scans of every claim (pod events are looked at at once).
    #[arg(
        long,
        env = "ALLOT_GC_DEFAULT_INTERVAL_DURATION",
        default_value_t = 600,
        value_name = "SECONDS"
    )]
    pub gc_interval: u64,
    /// A leak is released at its second sighting, at least this many seconds after the first.
    #[arg(
        long,
        env = "ALLOT_GC_GRACE_SECONDS",
        default_value_t = 60,
        value_name = "SECONDS"
    )]
    pub gc_grace: u64,
    /// Delete allot Endpoints whose pod is gone and that hold no address.
    #[arg(long, env = "ALLOT_GC_CLEAN_OUTDATED_ENDPOINT", default_value_t = false, action = ArgAction::Set, value_name = "BOOL")]
    pub gc_clean_outdated_endpoints: bool,
}

/// Each GC flag's id and the Spiderpool variable that sets it when neither the flag nor
/// allot's variable is given.
const SPIDERPOOL_ENV: [(&str, &str); 6] = [
    ("gc_enabled", "SPIDERPOOL_GC_IP_ENABLED"),
    (
        "gc_terminating_on_ready_node",
        "SPIDERPOOL_GC_STATELESS_TERMINATING_POD_ON_READY_NODE_ENABLED",
    ),
    (
        "gc_terminating_on_not_ready_node",
        "SPIDERPOOL_GC_STATELESS_TERMINATING_POD_ON_NOT_READY_NODE_ENABLED",
    ),
    (
        "gc_running_on_empty_pod_ips",
        "SPIDERPOOL_GC_ENABLE_STATELESS_RUNNING_POD_ON_EMPTY_POD_STATUS_IPS",
    ),
    (
        "gc_additional_grace_delay",
        "SPIDERPOOL_GC_ADDITIONAL_GRACE_DELAY",
    ),
    ("gc_interval", "SPIDERPOOL_GC_DEFAULT_INTERVAL_DURATION"),
];

/// A Spiderpool variable whose value is not what its setting takes; `value` as it was set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpiderpoolEnvError {
    #[error("{var}={value:?}: expected whole seconds")]
    NotSeconds {
        var: &'static str,
        value: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("{var}={value:?}: expected true or false")]
    NotBool { var: &'static str, value: String },
}

impl GcArgs {
    /// Takes Spiderpool's spelling of each setting left at its default.
    pub fn with_spiderpool_env(
        mut self,
        matches: &ArgMatches,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<GcArgs, SpiderpoolEnvError> {
        for (id, var) in SPIDERPOOL_ENV {
            if matches.value_source(id) != Some(ValueSource::DefaultValue) {
                continue;
            }
            let Some(set) = env(var) else { continue };
            let seconds = |source| SpiderpoolEnvError::NotSeconds {
                var,
                value: set.clone(),
                source,
            };
            let value = set.trim();
            match id {
                "gc_additional_grace_delay" => {
                    self.gc_additional_grace_delay = value.parse().map_err(seconds)?
                }
                "gc_interval" => self.gc_interval = value.parse().map_err(seconds)?,
                _ => {
                    let flag = match value.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(SpiderpoolEnvError::NotBool {
                                var,
                                value: set.clone(),
                            });
                        }
                    };
                    match id {
                        "gc_enabled" => self.gc_enabled = flag,
                        "gc_terminating_on_ready_node" => self.gc_terminating_on_ready_node = flag,
                        "gc_terminating_on_not_ready_node" => {
                            self.gc_terminating_on_not_ready_node = flag
                        }
                        _ => self.gc_running_on_empty_pod_ips = flag,
                    }
                }
            }
        }
        Ok(self)
    }

    pub fn settings(&self) -> GcSettings {
        GcSettings {
            table: GcConfig {
                enabled: self.gc_enabled,
                terminating_on_ready_node: self.gc_terminating_on_ready_node,
                terminating_on_not_ready_node: self.gc_terminating_on_not_ready_node,
                running_on_empty_pod_ips: self.gc_running_on_empty_pod_ips,
                additional_grace_delay: self.gc_additional_grace_delay,
            },
            grace: self.gc_grace,
            interval: Duration::from_secs(self.gc_interval.max(1)),
            clean_outdated_endpoints: self.gc_clean_outdated_endpoints,
        }
    }
}

impl ControllerArgs {
    /// Parses the command line and the environment (allot's variables, then Spiderpool's).
    pub fn parse_with_env() -> Result<ControllerArgs, clap::Error> {
        let matches = ControllerArgs::command().get_matches();
        Self::from_matches(&matches, |k| std::env::var(k).ok())
    }

    pub fn from_matches(
        matches: &ArgMatches,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ControllerArgs, clap::Error> {
        let mut args = ControllerArgs::from_arg_matches(matches)?;
        args.gc = args.gc.with_spiderpool_env(matches, env).map_err(|e| {
            ControllerArgs::command().error(clap::error::ErrorKind::ValueValidation, e)
        })?;
        Ok(args)
    }

    pub fn lease_config(&self, identity: &str) -> crate::lease::LeaseConfig {
        crate::lease::LeaseConfig {
            namespace: self.namespace.clone(),
            name: self.lease_name.clone(),
            identity: identity.to_string(),
            duration: Duration::from_secs(self.lease_duration_seconds.max(1)),
            renew_deadline: Duration::from_secs(self.lease_renew_deadline_seconds.max(1)),
            retry_period: Duration::from_millis(self.lease_retry_period_ms.max(10)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str], env: &[(&str, &str)]) -> Result<ControllerArgs, clap::Error> {
        let env: std::collections::HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let matches = ControllerArgs::command().try_get_matches_from(
            std::iter::once("allot-controller").chain(argv.iter().copied()),
        )?;
        ControllerArgs::from_matches(&matches, |k| env.get(k).cloned())
    }

    #[test]
    fn the_defaults_are_spiderpools() {
        let gc = parse(&[], &[]).unwrap().gc.settings();
        assert_eq!(gc.table, GcConfig::default());
        assert_eq!(gc.interval, Duration::from_secs(600));
        assert_eq!(gc.grace, 60);
        assert!(!gc.clean_outdated_endpoints);
    }

    #[test]
    fn spiderpools_variables_apply_where_allots_are_not_given() {
        let args = parse(
            &["--gc-interval", "30"],
            &[
                ("SPIDERPOOL_GC_IP_ENABLED", "false"),
                ("SPIDERPOOL_GC_ADDITIONAL_GRACE_DELAY", "15"),
                ("SPIDERPOOL_GC_DEFAULT_INTERVAL_DURATION", "900"),
                (
                    "SPIDERPOOL_GC_ENABLE_STATELESS_RUNNING_POD_ON_EMPTY_POD_STATUS_IPS",
                    "TRUE",
                ),
            ],
        )
        .unwrap();
        assert!(!args.gc.gc_enabled);
        assert_eq!(args.gc.gc_additional_grace_delay, 15);
        assert!(args.gc.gc_running_on_empty_pod_ips);
        assert_eq!(
            args.gc.gc_interval, 30,
            "the flag given wins over Spiderpool's variable"
        );
    }

    #[test]
    fn a_malformed_spiderpool_variable_is_an_error_naming_it() {
        let err = parse(&[], &[("SPIDERPOOL_GC_ADDITIONAL_GRACE_DELAY", "10s")])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("SPIDERPOOL_GC_ADDITIONAL_GRACE_DELAY"),
            "{err}"
        );
        assert!(err.contains("whole seconds"), "{err}");
    }

    #[test]
    fn a_spiderpool_variable_that_is_no_boolean_is_quoted_as_set() {
        let matches = ControllerArgs::command()
            .try_get_matches_from(["allot-controller"])
            .unwrap();
        let gc = ControllerArgs::from_arg_matches(&matches).unwrap().gc;
        let err = gc
            .with_spiderpool_env(&matches, |k| {
                (k == "SPIDERPOOL_GC_IP_ENABLED").then(|| " yes".to_string())
            })
            .unwrap_err();
        assert_eq!(
            err,
            SpiderpoolEnvError::NotBool {
                var: "SPIDERPOOL_GC_IP_ENABLED",
                value: " yes".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "SPIDERPOOL_GC_IP_ENABLED=\" yes\": expected true or false"
        );
    }
}
