//! The wire contract between `allot` (the CNI IPAM plugin) and `allot-agent`: JSON bodies over
//! HTTP/1.1 on the agent's unix socket. Both sides use these types, so they cannot drift.
//!
//! | method and path   | body             | success          |
//! |-------------------|------------------|------------------|
//! | `POST /v1/add`    | [`AddRequest`]   | [`IpamResult`]   |
//! | `POST /v1/del`    | [`DelRequest`]   | `{}`             |
//! | `POST /v1/check`  | [`AttachmentId`] | [`IpamResult`]   |
//! | `POST /v1/gc`     | [`GcRequest`]    | [`GcResponse`]   |
//! | `POST /v1/quarantine` | [`QuarantineRequest`] | [`IpamResult`] |
//! | `GET /v1/status`  |                  | [`StatusResponse`] |
//! | `GET /v1/decisions` |                | [`RecordedDecisions`] |
//! | `GET /healthz`, `GET /readyz`, `GET /metrics` | | text |
//!
//! Failures answer a non-2xx status with an [`ErrorBody`] whose `code` is the CNI error code the
//! plugin prints.

use serde::{Deserialize, Serialize};

pub mod deadline;
pub mod journal;

pub const ADD: &str = "/v1/add";
pub const DEL: &str = "/v1/del";
pub const CHECK: &str = "/v1/check";
pub const GC: &str = "/v1/gc";
pub const STATUS: &str = "/v1/status";
pub const QUARANTINE: &str = "/v1/quarantine";
pub const DECISIONS: &str = "/v1/decisions";
pub const HEALTHZ: &str = "/healthz";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";

/// Where the agent listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/allot/agent.sock";

/// Where the plugin remembers DELs the agent could not take (one [`DelRequest`] per file, named
/// `CONTAINERID@IFNAME.json`), and where the agent replays them from.
pub const DEFAULT_JOURNAL: &str = "/var/lib/allot/journal";

/// The pod behind an attachment, from `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`,
/// `K8S_POD_UID`) or, in cluster mode, from the agent's pod cache.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub uid: String,
    /// Kind and name of the pod's top-level controller, when the caller knows them (standalone:
    /// the allot-specific `CNI_ARGS` key `ALLOT_OWNER=Kind/name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentId {
    pub container_id: String,
    pub if_name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AddRequest {
    pub container_id: String,
    pub if_name: String,
    /// `CNI_NETNS`, for probes.
    #[serde(default)]
    pub netns: String,
    /// The network config's `name`.
    pub network: String,
    /// The network config's `default_ipv4_ippool` / `default_ipv6_ippool`.
    #[serde(default)]
    pub default_ipv4_pools: Vec<String>,
    #[serde(default)]
    pub default_ipv6_pools: Vec<String>,
    /// Multus network ("namespace/name") the interface belongs to, when known.
    #[serde(default)]
    pub multus_name: String,
    pub pod: PodIdentity,
    /// The network config's ipam `probe` section, when it has one (the agent's `--probe-*`
    /// defaults apply otherwise): the agent needs to know what the plugin will probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeSettings>,
    /// The link on the node the pod's interface hangs from, when the main plugin has one the
    /// agent can probe from (a bridge; a macvlan's master in bridge mode): what probing ahead
    /// needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
}

/// How the pod's interface is attached to the node's network, from the main plugin's config.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentLink {
    pub kind: ParentKind,
    /// The bridge's name, or the macvlan master's.
    pub name: String,
    /// The network namespace the plugin runs in, which is the main plugin's and so the
    /// parent link's: `DEVICE:INODE` of `/proc/self/ns/net`. The agent probes only links in its
    /// own namespace.
    pub netns: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParentKind {
    /// Debian's `bridge` plugin without VLANs: the pod's veth is a port of the bridge, which
    /// sees every other port and the uplink.
    Bridge,
    /// Debian's `macvlan` plugin in `bridge` mode: the pod's macvlan hangs from the master.
    Macvlan,
}

impl ParentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ParentKind::Bridge => "bridge",
            ParentKind::Macvlan => "macvlan",
        }
    }
}

/// An IPAM result in the CNI 1.1.0 shape (the plugin converts it for older callers).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamResult {
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// ADD only: the agent's probe defaults (`--probe-*`), for a network whose config has no
    /// `probe` section; absent while the agent's defaults probe nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeSettings>,
    /// ADD only: what the agent probed ahead of time from the parent link and found free (or,
    /// for gateways, answering) recently enough that the plugin need not probe it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preprobed: Option<Preprobed>,
    /// ADD only: addresses (without prefix length) a KubeVirt virtual machine's guest is using
    /// right now from its live migration's source on another node. The plugin neither probes
    /// them (the guest answers for them) nor announces them (that would draw the guest's
    /// traffic here before the migration completes); the agent announces them from this pod
    /// once the VM runs here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guest_addresses: Vec<String>,
}

/// Addresses and gateways of an ADD's result the agent probed from the pod's parent link
/// within its freshness bound (`--probe-ahead-fresh-seconds`), with at least the tries and
/// timeout the network asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preprobed {
    /// The link probed from (`bridge`/`master` name).
    pub link: String,
    /// Addresses (without prefix length) nobody answered for.
    #[serde(default)]
    pub free: Vec<String>,
    /// Gateways that answered.
    #[serde(default)]
    pub gateways: Vec<String>,
    /// The age of the oldest of those verdicts, in milliseconds.
    #[serde(default)]
    pub oldest_ms: u64,
}

/// ARP/NDP probing of an ADD's addresses, as the network config's ipam `probe` section
/// writes it (`{"conflict": true, "gateway": true, "tries": 3, "timeoutMs": 100}`) and as the
/// agent's `--probe-*` defaults are sent to the plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProbeSettings {
    /// Duplicate address detection of every address of the result before it is used.
    #[serde(default)]
    pub conflict: bool,
    /// Whether each gateway of the result answers on the pod's interface.
    #[serde(default)]
    pub gateway: bool,
    /// Requests per probe.
    #[serde(default = "default_tries")]
    pub tries: u32,
    /// How long to listen after each request, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_tries() -> u32 {
    3
}

fn default_timeout_ms() -> u64 {
    100
}

impl Default for ProbeSettings {
    /// Off, with 3 × 100 ms once turned on.
    fn default() -> Self {
        ProbeSettings {
            conflict: false,
            gateway: false,
            tries: default_tries(),
            timeout_ms: default_timeout_ms(),
        }
    }
}

impl ProbeSettings {
    /// Whether anything is probed (and so anything is sent on the pod's link).
    pub fn enabled(&self) -> bool {
        self.conflict || self.gateway
    }
}

/// Addresses of an ADD that another host answered for on the pod's link: the agent moves each
/// to a quarantine claim owned by the conflict and, when `replace`, serves the ADD again (the
/// attachment gets other addresses for those families).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineRequest {
    /// The ADD being served, as it was sent.
    pub add: AddRequest,
    pub conflicts: Vec<Conflict>,
    /// Allocate replacements (false on the plugin's last round: it gives up and releases).
    #[serde(default)]
    pub replace: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    /// The address alone, without prefix length.
    pub address: String,
    /// The MAC address of the host that answered for it (`aa:bb:cc:dd:ee:ff`).
    pub mac: String,
    /// The host was itself probing for the address (about to take it), not yet using it.
    #[serde(default)]
    pub contested: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpConfig {
    /// CIDR notation: the address with its pool's subnet prefix, e.g. `10.6.0.12/24`.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The pool the address came from.
    pub pool: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteConfig {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcRequest {
    /// The network (config `name`) being collected: only its claims are considered.
    #[serde(default)]
    pub network: String,
    /// Every attachment of that network still in use; every other claim of it is released.
    pub valid_attachments: Vec<AttachmentId>,
}

/// A DEL: the attachment, and what else the plugin knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DelRequest {
    #[serde(flatten)]
    pub attachment: AttachmentId,
    /// The StatefulSet's replica count (`ALLOT_OWNER=StatefulSet/name/replicas`): a pod whose
    /// ordinal is at or past it was scaled away, and its address is released instead of kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_replicas: Option<u32>,
    /// Unix seconds when the runtime issued the DEL, for a DEL replayed late from the plugin's
    /// journal: claims made after it belong to a later ADD and are left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<u64>,
    /// When the plugin gives up waiting and journals the DEL instead ([`deadline`]: ms of
    /// `CLOCK_MONOTONIC`). The agent does not act on a DEL past it (it answers
    /// [`codes::PAST_DEADLINE`]): the runtime may have re-added the container by then, and the
    /// journal entry serves the DEL in order. Optional, so that an older plugin's DEL (which
    /// has none) is served as before, and an older agent ignores it; never in a journal entry,
    /// which is served late on purpose (and the clock restarts with the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monotonic_deadline_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcResponse {
    /// Addresses released.
    pub released: Vec<String>,
    /// Claims seen leaked and waiting for a second look past the grace period.
    #[serde(default)]
    pub suspects: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusResponse {
    /// Whether ADD can be served: pools loaded, store open.
    pub ready: bool,
    pub message: String,
    pub pools: Vec<PoolStatus>,
    /// The configuration in force is not exactly what the files say (see `problems`).
    #[serde(default)]
    pub degraded: bool,
    /// Objects whose observed version is not (entirely) in force, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<ConfigProblem>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigProblem {
    /// `IPPool`, `Subnet`, `ReservedIP`, or `File` (a file that could not be read completely).
    pub kind: String,
    pub name: String,
    /// `held-back` (the previous version stays in force), `left-out` (nothing in force),
    /// `partial` (a ReservedIP reserving what could be read).
    pub state: String,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    pub name: String,
    pub ip_version: u8,
    pub total: u64,
    pub free: u64,
    /// Released addresses cooling down before reuse.
    #[serde(default)]
    pub cooling: u64,
    /// `serving`, `disabled` (serves its claims, takes no new ones) or `terminating` (deleted or
    /// edited while holding claims: serves them until released).
    #[serde(default = "serving")]
    pub state: String,
    /// Claims a terminating version still serves.
    #[serde(default)]
    pub claims: u64,
}

fn serving() -> String {
    "serving".into()
}

/// The agent's ring of recent policy decisions (`--record-decisions`), oldest first, for
/// `allotctl policy record`. Each carries what the policy saw, pod labels and annotations
/// included, as a scenario (examples/scenarios/README.md) whose expectation is the decision made.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedDecisions {
    /// How many decisions the agent keeps (0: recording is off).
    pub capacity: usize,
    pub decisions: Vec<RecordedDecision>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedDecision {
    /// Counts decisions since the agent started; a gap means older ones left the ring.
    pub seq: u64,
    /// Unix seconds.
    pub at: u64,
    /// The policy that decided, and its sha256 (hex).
    pub policy: String,
    pub sha256: String,
    /// The cluster's policy faulted with this error and the embedded default decided instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_from: Option<String>,
    /// `namespace/name` of the pod.
    pub pod: String,
    /// The scenario document.
    pub scenario: serde_json::Value,
}

/// A failure, carrying the CNI error code the plugin reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: u32,
    pub msg: String,
    #[serde(default)]
    pub details: String,
}

/// CNI error codes (spec 1.1.0) and allot's own (100 and up).
pub mod codes {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENVIRONMENT: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_NETWORK_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADD now (agent unreachable or not ready).
    pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
    /// STATUS: the plugin is up but has no address left in any pool.
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// No pool can serve the pod (every candidate dropped or exhausted); details hold the trace.
    pub const NO_POOL_FITS: u32 = 100;
    /// The pod's annotations (or identity) are malformed; the message names the key.
    pub const INVALID_POD: u32 = 101;
    /// The cluster's policy failed (trap, deadline, memory cap, bogus output).
    pub const POLICY_FAILED: u32 = 102;
    /// The claim store failed.
    pub const STORE_FAILED: u32 = 103;
    /// CHECK: what the agent holds differs from the runtime's prevResult.
    pub const CHECK_MISMATCH: u32 = 104;
    /// ADD: other hosts kept answering for the addresses tried (the message names their MACs).
    pub const ADDRESS_CONFLICT: u32 = 105;
    /// ADD: a gateway did not answer on the pod's interface.
    pub const GATEWAY_UNREACHABLE: u32 = 106;
    /// ADD: a probe could not run (namespace, interface, carrier, permissions).
    pub const PROBE_FAILED: u32 = 107;
    /// DEL: the agent reached it after the plugin's deadline and did nothing; the plugin
    /// journals it, as when it times out.
    pub const PAST_DEADLINE: u32 = 108;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_request_round_trips_in_camel_case() {
        let req = AddRequest {
            container_id: "c1".into(),
            if_name: "eth0".into(),
            network: "net".into(),
            pod: PodIdentity {
                namespace: "ns".into(),
                name: "p".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let json = serde_json::to_string(&req).unwrap();
        assert!(
            json.contains("\"containerId\":\"c1\"") && json.contains("\"ifName\":\"eth0\""),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<AddRequest>(&json).unwrap(), req);
    }

    /// An older plugin sends no deadline, and its DEL is served as before; a newer one's
    /// deadline is a field an older agent skips.
    #[test]
    fn a_del_without_a_deadline_still_decodes() {
        let old: DelRequest = serde_json::from_str(r#"{"containerId":"c1","ifName":"eth0"}"#)
            .expect("an older plugin's DEL");
        assert_eq!(old.monotonic_deadline_ms, None);
        let new = DelRequest {
            monotonic_deadline_ms: Some(42),
            ..old
        };
        let json = serde_json::to_string(&new).unwrap();
        assert!(json.contains("\"monotonicDeadlineMs\":42"), "{json}");
        assert_eq!(serde_json::from_str::<DelRequest>(&json).unwrap(), new);
    }

    #[test]
    fn probe_settings_take_the_documented_names_and_defaults() {
        let p: ProbeSettings = serde_json::from_str(r#"{"conflict":true}"#).unwrap();
        assert_eq!(
            p,
            ProbeSettings {
                conflict: true,
                ..ProbeSettings::default()
            }
        );
        assert_eq!((p.tries, p.timeout_ms), (3, 100));
        let p: ProbeSettings =
            serde_json::from_str(r#"{"conflict":false,"gateway":true,"tries":5,"timeoutMs":20}"#)
                .unwrap();
        assert_eq!((p.gateway, p.tries, p.timeout_ms), (true, 5, 20));
        assert!(!ProbeSettings::default().enabled());
        let e = serde_json::from_str::<ProbeSettings>(r#"{"timeout_ms":20}"#).unwrap_err();
        assert!(e.to_string().contains("timeout_ms"), "{e}");
    }
}
