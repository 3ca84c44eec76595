//! The network config on stdin.
//!
//! Error codes: stdin that is not a JSON object is code 6 (decode failure); a JSON object whose
//! fields are missing, mistyped or unknown is code 7 (invalid network config), and the message
//! names the field. Top-level fields allot does not know are tolerated: they belong to the main
//! plugin (`bridge`, `master`, `mtu`, …) or the runtime (`runtimeConfig`, `args`). Fields inside
//! `ipam` are allot's alone, so an unknown one there is a typo that would silently change the
//! allocation: it is rejected (see [`IpamConf::reject_unknown`]).

use std::path::PathBuf;
use std::time::Duration;

use allot_api::{AttachmentId, DEFAULT_JOURNAL, DEFAULT_SOCKET, ProbeSettings};
use serde_json::{Map, Value};

use crate::error::CniError;

/// The CNI spec versions allot speaks, oldest first. 0.1.0 and 0.2.0 predate the result shape
/// with `ips`; no runtime still in use needs them.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CniVersion {
    V030,
    V031,
    V040,
    V100,
    V110,
}

impl CniVersion {
    pub const LATEST: CniVersion = CniVersion::V110;

    /// Exact match, as libcni does: `1.0` or `1.1.0-rc1` are not supported versions.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "0.3.0" => CniVersion::V030,
            "0.3.1" => CniVersion::V031,
            "0.4.0" => CniVersion::V040,
            "1.0.0" => CniVersion::V100,
            "1.1.0" => CniVersion::V110,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V030 => "0.3.0",
            CniVersion::V031 => "0.3.1",
            CniVersion::V040 => "0.4.0",
            CniVersion::V100 => "1.0.0",
            CniVersion::V110 => "1.1.0",
        }
    }
}

pub type Conf = Map<String, Value>;

/// Stdin must be one JSON object.
pub fn decode(stdin: &[u8]) -> Result<Conf, CniError> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Err(CniError::decode(
            "stdin is empty: expected the network config as JSON",
        ));
    }
    match serde_json::from_slice::<Value>(stdin) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(CniError::decode(format!(
            "the network config on stdin must be a JSON object, not {}",
            kind(&other)
        ))),
        Err(e) => Err(CniError::decode(format!(
            "cannot decode the network config on stdin: {e}"
        ))),
    }
}

/// `cniVersion` as the caller wrote it, for echoing in error objects.
pub fn raw_version(conf: &Conf) -> Option<&str> {
    conf.get("cniVersion").and_then(Value::as_str)
}

pub fn cni_version(conf: &Conf) -> Result<CniVersion, CniError> {
    match conf.get("cniVersion") {
        None | Some(Value::Null) => Err(CniError::invalid_config(
            "the network config has no cniVersion",
        )),
        Some(Value::String(s)) => CniVersion::parse(s).ok_or_else(|| {
            CniError::incompatible_version(format!(
                "incompatible CNI versions: the config has cniVersion {s:?}, allot supports \
                 {SUPPORTED_VERSIONS:?}"
            ))
        }),
        Some(other) => Err(CniError::invalid_config(format!(
            "cniVersion must be a string, not {}",
            kind(other)
        ))),
    }
}

/// The network's `name` (required for ADD: the agent scopes claims by it).
pub fn network_name(conf: &Conf) -> Result<String, CniError> {
    match conf.get("name") {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(CniError::invalid_config(
            "the network config's name is empty",
        )),
        None | Some(Value::Null) => Err(CniError::invalid_config("the network config has no name")),
        Some(other) => Err(CniError::invalid_config(format!(
            "name must be a string, not {}",
            kind(other)
        ))),
    }
}

/// The `ipam` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpamConf {
    /// `socket`: the agent's unix socket (default `/run/allot/agent.sock`).
    pub socket: PathBuf,
    /// `default_ipv4_ippool` / `default_ipv6_ippool`: pool names, in the user's order.
    pub default_ipv4_pools: Vec<String>,
    pub default_ipv6_pools: Vec<String>,
    /// `timeout_ms`: bound on the whole exchange with the agent (connect included), for every
    /// verb. Unset: each verb has its own default.
    pub timeout: Option<Duration>,
    /// `journal`: the directory where a DEL the agent could not take is remembered for the
    /// agent to replay (default `/var/lib/allot/journal`; the agent's `--journal`).
    pub journal: PathBuf,
    /// `probe`: ARP/NDP probing of the ADD's addresses on the pod's link. `None`: the agent's
    /// defaults (`--probe-*`) apply; a section, even one that turns everything off, wins over
    /// them as a whole.
    pub probe: Option<ProbeSettings>,
    /// Keys allot does not know, with their values rendered as JSON.
    pub unknown: Vec<(String, String)>,
}

/// Fields allot reads from `ipam`.
const IPAM_FIELDS: &[&str] = &[
    "type",
    "socket",
    "default_ipv4_ippool",
    "default_ipv6_ippool",
    "timeout_ms",
    "journal",
    "probe",
];

/// `timeout_ms` above this is surely a mistake (ten minutes).
const MAX_TIMEOUT_MS: u64 = 600_000;

/// `sun_path` holds 108 bytes including the NUL.
const MAX_SOCKET_PATH: usize = 107;

impl Default for IpamConf {
    fn default() -> Self {
        IpamConf {
            socket: PathBuf::from(DEFAULT_SOCKET),
            default_ipv4_pools: Vec::new(),
            default_ipv6_pools: Vec::new(),
            timeout: None,
            journal: PathBuf::from(DEFAULT_JOURNAL),
            probe: None,
            unknown: Vec::new(),
        }
    }
}

impl IpamConf {
    /// Code 7 naming every unknown field (key and value, as the spec asks of code 2 errors).
    pub fn reject_unknown(&self) -> Result<(), CniError> {
        if self.unknown.is_empty() {
            return Ok(());
        }
        Err(CniError::invalid_config(format!(
            "unknown field{} in ipam: {} (allot knows {})",
            if self.unknown.len() == 1 { "" } else { "s" },
            self.describe_unknown(),
            IPAM_FIELDS.join(", ")
        )))
    }

    pub fn describe_unknown(&self) -> String {
        self.unknown
            .iter()
            .map(|(k, v)| format!("{k:?}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Parses `ipam`. The section is required: the runtime (or the main plugin) execs allot because
/// an `ipam.type` named it, so a config without one is not meant for allot.
pub fn ipam(conf: &Conf) -> Result<IpamConf, CniError> {
    let mut out = IpamConf::default();
    let section = match conf.get("ipam") {
        None | Some(Value::Null) => {
            return Err(CniError::invalid_config(
                "the network config has no ipam section (expected \"ipam\": {\"type\": \"allot\", …})",
            ));
        }
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(CniError::invalid_config(format!(
                "ipam must be an object, not {}",
                kind(other)
            )));
        }
    };
    for (key, value) in section {
        match key.as_str() {
            "type" => {
                // Not compared with "allot": the binary may be installed under another name.
                if !value.is_string() {
                    return Err(CniError::invalid_config(format!(
                        "ipam.type must be a string, not {}",
                        kind(value)
                    )));
                }
            }
            "socket" => out.socket = socket_path(value)?,
            "default_ipv4_ippool" => out.default_ipv4_pools = pool_list(key, value)?,
            "default_ipv6_ippool" => out.default_ipv6_pools = pool_list(key, value)?,
            "timeout_ms" => out.timeout = Some(timeout(value)?),
            "journal" => out.journal = journal_dir(value)?,
            "probe" => out.probe = Some(probe_section(value)?),
            _ => out.unknown.push((key.clone(), value.to_string())),
        }
    }
    Ok(out)
}

/// `ipam.probe`: `{"conflict": bool, "gateway": bool, "tries": 1-100, "timeoutMs": 1-10000}`,
/// every field optional (off, off, 3, 100).
fn probe_section(value: &Value) -> Result<ProbeSettings, CniError> {
    const FORM: &str = "{\"conflict\": true, \"gateway\": true, \"tries\": 3, \"timeoutMs\": 100}";
    if !value.is_object() {
        return Err(CniError::invalid_config(format!(
            "ipam.probe must be an object like {FORM}, not {}",
            kind(value)
        )));
    }
    let settings: ProbeSettings = serde_json::from_value(value.clone())
        .map_err(|e| CniError::invalid_config(format!("ipam.probe: {e} (expected {FORM})")))?;
    probe_config(&settings).map_err(|e| CniError::invalid_config(format!("ipam.probe: {e}")))?;
    Ok(settings)
}

/// Probe settings outside the probe's bounds. The message names the setting as the network
/// configuration spells it (`timeoutMs`, not the probe's `timeout`).
#[derive(Debug, thiserror::Error)]
#[error("{}", .source.to_string().replace("timeout is", "timeoutMs is"))]
pub struct ProbeConfigError {
    #[source]
    pub source: allot_probe::ProbeError,
}

/// The probe crate's configuration for `settings`, checked against its bounds.
pub fn probe_config(
    settings: &ProbeSettings,
) -> Result<allot_probe::ProbeConfig, ProbeConfigError> {
    let cfg = allot_probe::ProbeConfig {
        tries: settings.tries,
        timeout: Duration::from_millis(settings.timeout_ms),
        ..allot_probe::ProbeConfig::default()
    };
    cfg.validate()
        .map_err(|source| ProbeConfigError { source })?;
    Ok(cfg)
}

fn socket_path(value: &Value) -> Result<PathBuf, CniError> {
    let Value::String(s) = value else {
        return Err(CniError::invalid_config(format!(
            "ipam.socket must be a string, not {}",
            kind(value)
        )));
    };
    if !s.starts_with('/') {
        return Err(CniError::invalid_config(format!(
            "ipam.socket {s:?} must be an absolute path"
        )));
    }
    if s.len() > MAX_SOCKET_PATH {
        return Err(CniError::invalid_config(format!(
            "ipam.socket {s:?} is longer than {MAX_SOCKET_PATH} bytes, the limit for a unix \
             socket path"
        )));
    }
    Ok(PathBuf::from(s))
}

fn journal_dir(value: &Value) -> Result<PathBuf, CniError> {
    match value {
        Value::String(s) if s.starts_with('/') => Ok(PathBuf::from(s)),
        Value::String(s) => Err(CniError::invalid_config(format!(
            "ipam.journal {s:?} must be an absolute path"
        ))),
        other => Err(CniError::invalid_config(format!(
            "ipam.journal must be a directory path (string), not {}",
            kind(other)
        ))),
    }
}

/// A list of pool names (`null` is an empty list; a bare string is refused, as Spiderpool does).
fn pool_list(key: &str, value: &Value) -> Result<Vec<String>, CniError> {
    let items = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(a) => a,
        other => {
            return Err(CniError::invalid_config(format!(
                "ipam.{key} must be a list of pool names, not {}",
                kind(other)
            )));
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) if !s.is_empty() => Ok(s.clone()),
            Value::String(_) => Err(CniError::invalid_config(format!(
                "ipam.{key}[{i}] is an empty pool name"
            ))),
            other => Err(CniError::invalid_config(format!(
                "ipam.{key}[{i}] must be a pool name (string), not {}",
                kind(other)
            ))),
        })
        .collect()
}

fn timeout(value: &Value) -> Result<Duration, CniError> {
    match value.as_u64() {
        Some(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(CniError::invalid_config(format!(
            "ipam.timeout_ms must be an integer from 1 to {MAX_TIMEOUT_MS}, not {value}"
        ))),
    }
}

/// GC: `cni.dev/valid-attachments` (spec 1.1.0), or the pre-release spelling
/// `cni.dev/attachments` when the first is absent. JSON `null` is an empty list (libcni sends a
/// nil slice when no attachment is left). Neither key present is an error: releasing every
/// address of the network because a runtime forgot the list would be a disaster.
pub fn gc_attachments(conf: &Conf) -> Result<Vec<AttachmentId>, CniError> {
    let (key, value) = ["cni.dev/valid-attachments", "cni.dev/attachments"]
        .into_iter()
        .find_map(|k| conf.get(k).map(|v| (k, v)))
        .ok_or_else(|| {
            CniError::invalid_config(
                "GC needs cni.dev/valid-attachments in the network config; refusing to release \
                 every address of the network without it",
            )
        })?;
    let items = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(a) => a,
        other => {
            return Err(CniError::invalid_config(format!(
                "{key} must be a list, not {}",
                kind(other)
            )));
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = |name: &str| -> Result<String, CniError> {
                match item.get(name) {
                    Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                    _ => Err(CniError::invalid_config(format!(
                        "{key}[{i}] needs a non-empty string {name:?}: {item}"
                    ))),
                }
            };
            Ok(AttachmentId {
                container_id: field("containerID")?,
                if_name: field("ifname")?,
            })
        })
        .collect()
}

/// CHECK: the addresses of `prevResult.ips[].address`, or `None` without a `prevResult`.
pub fn prev_result_addresses(conf: &Conf) -> Result<Option<Vec<String>>, CniError> {
    let prev = match conf.get("prevResult") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(CniError::invalid_config(format!(
                "prevResult must be an object, not {}",
                kind(other)
            )));
        }
    };
    let ips = match prev.get("ips") {
        None | Some(Value::Null) => return Ok(Some(Vec::new())),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(CniError::invalid_config(format!(
                "prevResult.ips must be a list, not {}",
                kind(other)
            )));
        }
    };
    ips.iter()
        .enumerate()
        .map(|(i, ip)| match ip.get("address") {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(CniError::invalid_config(format!(
                "prevResult.ips[{i}] has no address: {ip}"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_api::codes;

    fn conf(json: &str) -> Conf {
        decode(json.as_bytes()).unwrap()
    }

    #[test]
    fn decode_failures_are_code_6() {
        for bad in ["", "  \n", "{", "[1]", "\"x\"", "{\"a\":}"] {
            let e = decode(bad.as_bytes()).unwrap_err();
            assert_eq!(e.code, codes::DECODE_FAILURE, "{bad:?}: {e}");
        }
        let e = decode(b"[]").unwrap_err();
        assert!(e.msg.contains("a list"), "{e}");
    }

    #[test]
    fn versions() {
        for v in SUPPORTED_VERSIONS {
            let c = conf(&format!(r#"{{"cniVersion":"{v}"}}"#));
            assert_eq!(cni_version(&c).unwrap().as_str(), *v);
        }
        assert!(CniVersion::V031 < CniVersion::V040 && CniVersion::V100 < CniVersion::V110);
        for v in ["0.2.0", "0.1.0", "1.0", "1.2.0", "1.1.0-rc1", ""] {
            let e = cni_version(&conf(&format!(r#"{{"cniVersion":"{v}"}}"#))).unwrap_err();
            assert_eq!(e.code, codes::INCOMPATIBLE_VERSION, "{v}");
            assert!(e.msg.contains("1.1.0"), "{e}");
        }
        let e = cni_version(&conf("{}")).unwrap_err();
        assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG);
        assert!(e.msg.contains("cniVersion"));
        let e = cni_version(&conf(r#"{"cniVersion":1}"#)).unwrap_err();
        assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG);
        assert_eq!(
            raw_version(&conf(r#"{"cniVersion":"9.9.9"}"#)),
            Some("9.9.9")
        );
    }

    #[test]
    fn network_name_is_required_and_a_string() {
        assert_eq!(network_name(&conf(r#"{"name":"net1"}"#)).unwrap(), "net1");
        for bad in [r#"{}"#, r#"{"name":""}"#, r#"{"name":3}"#] {
            let e = network_name(&conf(bad)).unwrap_err();
            assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG);
            assert!(e.msg.contains("name"), "{e}");
        }
    }

    #[test]
    fn ipam_section() {
        let c = conf(
            r#"{"cniVersion":"1.1.0","name":"n","type":"macvlan","master":"eth0",
                "ipam":{"type":"allot","socket":"/tmp/a.sock","default_ipv4_ippool":["p1","p2"],
                        "default_ipv6_ippool":["p6"],"timeout_ms":1500,"journal":"/run/j"}}"#,
        );
        let ipam = ipam(&c).unwrap();
        assert_eq!(
            ipam,
            IpamConf {
                socket: "/tmp/a.sock".into(),
                default_ipv4_pools: vec!["p1".into(), "p2".into()],
                default_ipv6_pools: vec!["p6".into()],
                timeout: Some(Duration::from_millis(1500)),
                journal: "/run/j".into(),
                probe: None,
                unknown: vec![],
            }
        );
        assert!(ipam.reject_unknown().is_ok());
    }

    #[test]
    fn probe_section() {
        let probe = |section: &str| {
            ipam(&conf(&format!(
                r#"{{"ipam":{{"type":"allot","probe":{section}}}}}"#
            )))
        };
        assert_eq!(
            probe(r#"{"conflict":true,"gateway":true,"tries":3,"timeoutMs":100}"#)
                .unwrap()
                .probe,
            Some(ProbeSettings {
                conflict: true,
                gateway: true,
                tries: 3,
                timeout_ms: 100
            })
        );
        // Omitted fields: off, 3 tries of 100 ms. An explicit section that turns everything
        // off is kept (it overrides the agent's defaults).
        assert_eq!(
            probe(r#"{"gateway":true}"#).unwrap().probe,
            Some(ProbeSettings {
                gateway: true,
                ..ProbeSettings::default()
            })
        );
        assert_eq!(probe("{}").unwrap().probe, Some(ProbeSettings::default()));
        assert_eq!(
            ipam(&conf(r#"{"ipam":{"type":"allot"}}"#)).unwrap().probe,
            None
        );
        for (bad, says) in [
            (r#"{"tries":0}"#, "tries is 0: use 1 to 100"),
            (r#"{"tries":101}"#, "tries is 101"),
            (r#"{"tries":-1}"#, "invalid value"),
            (r#"{"timeoutMs":0}"#, "timeoutMs is 0ns: use 1 ms to 10 s"),
            (r#"{"timeoutMs":20000}"#, "timeoutMs is 20s"),
            (r#"{"conflict":"yes"}"#, "expected a boolean"),
            (r#"{"timeout_ms":100}"#, "unknown field `timeout_ms`"),
            (r#"true"#, "must be an object"),
            (r#"null"#, "must be an object"),
        ] {
            let e = probe(bad).unwrap_err();
            assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG, "{bad}");
            assert!(
                e.msg.contains("ipam.probe") && e.msg.contains(says),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn ipam_defaults() {
        let i = ipam(&conf(r#"{"ipam":{"type":"allot"}}"#)).unwrap();
        assert_eq!(i, IpamConf::default());
        assert_eq!(i.socket, PathBuf::from("/run/allot/agent.sock"));
        for missing in ["{}", r#"{"ipam":null}"#] {
            let e = ipam(&conf(missing)).unwrap_err();
            assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG);
            assert!(e.msg.contains("ipam"), "{e}");
        }
    }

    #[test]
    fn unknown_ipam_fields_are_named() {
        let i = ipam(&conf(
            r#"{"ipam":{"type":"allot","default_ipv4_ipool":["p"],"x":1}}"#,
        ))
        .unwrap();
        let e = i.reject_unknown().unwrap_err();
        assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG);
        assert!(e.msg.contains("\"default_ipv4_ipool\": [\"p\"]"), "{e}");
        assert!(e.msg.contains("\"x\": 1"), "{e}");
    }

    #[test]
    fn ipam_type_errors_are_code_7_and_named() {
        for (bad, field) in [
            (r#"{"ipam":[]}"#, "ipam"),
            (r#"{"ipam":{"type":1}}"#, "ipam.type"),
            (r#"{"ipam":{"socket":5}}"#, "ipam.socket"),
            (r#"{"ipam":{"socket":"relative.sock"}}"#, "ipam.socket"),
            (
                r#"{"ipam":{"default_ipv4_ippool":{}}}"#,
                "ipam.default_ipv4_ippool",
            ),
            (
                r#"{"ipam":{"default_ipv4_ippool":"p"}}"#,
                "ipam.default_ipv4_ippool",
            ),
            (
                r#"{"ipam":{"default_ipv6_ippool":["a",2]}}"#,
                "ipam.default_ipv6_ippool[1]",
            ),
            (
                r#"{"ipam":{"default_ipv4_ippool":[""]}}"#,
                "ipam.default_ipv4_ippool[0]",
            ),
            (r#"{"ipam":{"timeout_ms":0}}"#, "ipam.timeout_ms"),
            (r#"{"ipam":{"timeout_ms":"5"}}"#, "ipam.timeout_ms"),
            (r#"{"ipam":{"timeout_ms":1.5}}"#, "ipam.timeout_ms"),
        ] {
            let e = ipam(&conf(bad)).unwrap_err();
            assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG, "{bad}");
            assert!(e.msg.contains(field), "{bad}: {e}");
        }
        let long = format!(r#"{{"ipam":{{"socket":"/{}"}}}}"#, "a".repeat(120));
        assert!(ipam(&conf(&long)).unwrap_err().msg.contains("longer"));
    }

    #[test]
    fn gc_attachments_from_either_key() {
        let a = gc_attachments(&conf(
            r#"{"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"},
                                            {"containerID":"c2","ifname":"net1"}]}"#,
        ))
        .unwrap();
        assert_eq!(a.len(), 2);
        assert_eq!(a[1].container_id, "c2");
        assert_eq!(a[1].if_name, "net1");
        let old = gc_attachments(&conf(
            r#"{"cni.dev/attachments":[{"containerID":"c","ifname":"e"}]}"#,
        ))
        .unwrap();
        assert_eq!(old.len(), 1);
        // The spec's key wins when both are present.
        let both = gc_attachments(&conf(
            r#"{"cni.dev/valid-attachments":[],"cni.dev/attachments":[{"containerID":"c","ifname":"e"}]}"#,
        ))
        .unwrap();
        assert!(both.is_empty());
        assert!(
            gc_attachments(&conf(r#"{"cni.dev/valid-attachments":null}"#))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn gc_attachment_errors() {
        let e = gc_attachments(&conf("{}")).unwrap_err();
        assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG);
        assert!(e.msg.contains("cni.dev/valid-attachments"), "{e}");
        let e = gc_attachments(&conf(r#"{"cni.dev/valid-attachments":{}}"#)).unwrap_err();
        assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG);
        let e = gc_attachments(&conf(
            r#"{"cni.dev/valid-attachments":[{"containerID":"c"}]}"#,
        ))
        .unwrap_err();
        assert!(e.msg.contains("[0]") && e.msg.contains("ifname"), "{e}");
    }

    #[test]
    fn prev_result() {
        assert_eq!(prev_result_addresses(&conf("{}")).unwrap(), None);
        let p = prev_result_addresses(&conf(
            r#"{"prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"eth0"}],
                "ips":[{"version":"4","address":"10.0.0.5/24","interface":0},{"address":"fd00::5/64"}]}}"#,
        ))
        .unwrap();
        assert_eq!(
            p,
            Some(vec!["10.0.0.5/24".to_string(), "fd00::5/64".to_string()])
        );
        assert_eq!(
            prev_result_addresses(&conf(r#"{"prevResult":{}}"#)).unwrap(),
            Some(vec![])
        );
        let e = prev_result_addresses(&conf(r#"{"prevResult":{"ips":[{}]}}"#)).unwrap_err();
        assert_eq!(e.code, codes::INVALID_NETWORK_CONFIG);
    }
}
