//! The CNI environment (`CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`,
//! `CNI_PATH`) and the `CNI_ARGS` key/value list. Every failure here is code 4 (invalid
//! environment) with a message that names the variable.

use std::ffi::OsString;

use allot_api::{AttachmentId, PodIdentity};

use crate::error::CniError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Result<Self, CniError> {
        // The spec spells the verbs in upper case; runtimes never send anything else.
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            other => {
                return Err(CniError::invalid_env(format!(
                    "unknown CNI_COMMAND {other:?}: expected ADD, DEL, CHECK, STATUS, GC or VERSION"
                )));
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }
}

/// The `CNI_*` variables. Unset and empty are the same thing (runtimes sometimes export empty
/// values, e.g. `CNI_NETNS=` on DEL after the namespace is gone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: Option<String>,
    pub netns: Option<String>,
    pub ifname: Option<String>,
    pub args: Option<String>,
    /// Read for completeness; allot execs nothing, so it never needs it.
    pub path: Option<String>,
}

impl CniEnv {
    /// Reads the variables through `get` (`std::env::var_os` in the binary, a map in tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<Self, CniError> {
        let var = |name: &str| -> Result<Option<String>, CniError> {
            match get(name) {
                None => Ok(None),
                Some(v) if v.is_empty() => Ok(None),
                Some(v) => v
                    .into_string()
                    .map(Some)
                    .map_err(|_| CniError::invalid_env(format!("{name} is not valid UTF-8"))),
            }
        };
        let command = match var("CNI_COMMAND")? {
            Some(c) => Command::parse(&c)?,
            None => return Err(CniError::invalid_env("CNI_COMMAND is not set")),
        };
        Ok(CniEnv {
            command,
            container_id: var("CNI_CONTAINERID")?,
            netns: var("CNI_NETNS")?,
            ifname: var("CNI_IFNAME")?,
            args: var("CNI_ARGS")?,
            path: var("CNI_PATH")?,
        })
    }

    fn required<'a>(&self, name: &str, value: &'a Option<String>) -> Result<&'a str, CniError> {
        value.as_deref().ok_or_else(|| {
            CniError::invalid_env(format!("{name} is required for {}", self.command.name()))
        })
    }

    /// `CNI_CONTAINERID`: required, and shaped as the spec says (an alphanumeric, then
    /// alphanumerics, `_`, `.` or `-`).
    pub fn container_id(&self) -> Result<&str, CniError> {
        let id = self.required("CNI_CONTAINERID", &self.container_id)?;
        validate_container_id(id)?;
        Ok(id)
    }

    /// `CNI_IFNAME`: required, and a name Linux would accept.
    pub fn ifname(&self) -> Result<&str, CniError> {
        let name = self.required("CNI_IFNAME", &self.ifname)?;
        validate_ifname(name)?;
        Ok(name)
    }

    /// `CNI_NETNS`: required for ADD and CHECK (DEL may come after the namespace is gone).
    pub fn netns(&self) -> Result<&str, CniError> {
        self.required("CNI_NETNS", &self.netns)
    }

    pub fn attachment(&self) -> Result<AttachmentId, CniError> {
        Ok(AttachmentId {
            container_id: self.container_id()?.to_owned(),
            if_name: self.ifname()?.to_owned(),
        })
    }

    pub fn cni_args(&self) -> Result<CniArgs, CniError> {
        parse_cni_args(self.args.as_deref().unwrap_or(""))
    }
}

pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(CniError::invalid_env(format!(
            "CNI_CONTAINERID {id:?} is invalid: it must start with a letter or digit, followed by \
             letters, digits, '_', '.' or '-'"
        )))
    }
}

/// The rules libcni applies (IFNAMSIZ is 16 including the NUL).
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let problem = if name.len() > 15 {
        Some("longer than 15 bytes")
    } else if name == "." || name == ".." {
        Some("not a valid name")
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("contains '/', ':' or whitespace")
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => Err(CniError::invalid_env(format!(
            "CNI_IFNAME {name:?} is invalid: {p}"
        ))),
    }
}

/// What allot reads from `CNI_ARGS`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub pod_namespace: Option<String>,
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    /// `ALLOT_OWNER=Kind/name`: the pod's top-level controller, for standalone mode.
    pub owner: Option<(String, String)>,
    /// `ALLOT_OWNER=StatefulSet/name/replicas`: the set's replica count, so that a DEL of a
    /// scaled-down ordinal releases its address instead of keeping it.
    pub owner_replicas: Option<u32>,
}

/// Keys allot knows. `K8S_POD_INFRA_CONTAINER_ID` is what kubelet and Multus also send; it is
/// accepted and ignored (CNI_CONTAINERID is the same thing).
const KNOWN_KEYS: &[&str] = &[
    "IgnoreUnknown",
    "K8S_POD_NAMESPACE",
    "K8S_POD_NAME",
    "K8S_POD_UID",
    "K8S_POD_INFRA_CONTAINER_ID",
    "ALLOT_OWNER",
];

/// Parses `K=V;K2=V2` with the CNI conventions: unknown keys are an error unless
/// `IgnoreUnknown` is true (`1` or `true`, any case), as in libcni. Empty segments (a trailing
/// `;`) are skipped; a value may itself contain `=`. A known key given twice must say the
/// same both times (Multus passes the runtime's CNI_ARGS on after its own, which name the same
/// pod, and `IgnoreUnknown=true` beside the runtime's `IgnoreUnknown=1`); two different values
/// are an error (a pod identity must not be ambiguous).
pub fn parse_cni_args(s: &str) -> Result<CniArgs, CniError> {
    let mut out = CniArgs::default();
    let mut ignore_unknown = false;
    let mut unknown: Vec<&str> = Vec::new();
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for entry in s.split(';') {
        if entry.is_empty() {
            continue;
        }
        let Some((key, value)) = entry.split_once('=') else {
            return Err(CniError::invalid_env(format!(
                "CNI_ARGS entry {entry:?} is not KEY=VALUE"
            )));
        };
        if key.is_empty() {
            return Err(CniError::invalid_env(format!(
                "CNI_ARGS entry {entry:?} has an empty key"
            )));
        }
        if !KNOWN_KEYS.contains(&key) {
            unknown.push(key);
            continue;
        }
        if let Some(&(_, first)) = seen.iter().find(|(k, _)| *k == key) {
            let same = if key == "IgnoreUnknown" {
                parse_flag(first)? == parse_flag(value)?
            } else {
                first == value
            };
            if same {
                continue;
            }
            return Err(CniError::invalid_env(format!(
                "CNI_ARGS gives {key} twice, as {first:?} and as {value:?}: which pod this is \
                 cannot be told; check what calls the plugin (runtime, Multus)"
            )));
        }
        seen.push((key, value));
        let non_empty = |v: &str| (!v.is_empty()).then(|| v.to_owned());
        match key {
            "IgnoreUnknown" => ignore_unknown = parse_flag(value)?,
            "K8S_POD_NAMESPACE" => out.pod_namespace = non_empty(value),
            "K8S_POD_NAME" => out.pod_name = non_empty(value),
            "K8S_POD_UID" => out.pod_uid = non_empty(value),
            "ALLOT_OWNER" => {
                let (kind, name, replicas) = parse_owner(value)?;
                out.owner = Some((kind, name));
                out.owner_replicas = replicas;
            }
            _ => {} // K8S_POD_INFRA_CONTAINER_ID
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        return Err(CniError::invalid_env(format!(
            "CNI_ARGS has unknown keys {unknown:?} (known: {KNOWN_KEYS:?}; set IgnoreUnknown=1 to \
             ignore them)"
        )));
    }
    Ok(out)
}

/// `IgnoreUnknown`'s value, as libcni reads it.
fn parse_flag(value: &str) -> Result<bool, CniError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(CniError::invalid_env(format!(
            "CNI_ARGS IgnoreUnknown={value:?} is not a boolean (1, true, 0, false)"
        ))),
    }
}

/// `Kind/name`, or `Kind/name/replicas`.
fn parse_owner(value: &str) -> Result<(String, String, Option<u32>), CniError> {
    let bad = || {
        CniError::invalid_env(format!(
            "CNI_ARGS ALLOT_OWNER={value:?} is not Kind/name or Kind/name/replicas (e.g. \
             StatefulSet/db or StatefulSet/db/3)"
        ))
    };
    let mut parts = value.split('/');
    let (Some(kind), Some(name)) = (parts.next(), parts.next()) else {
        return Err(bad());
    };
    if kind.is_empty() || name.is_empty() {
        return Err(bad());
    }
    let replicas = match parts.next() {
        None => None,
        Some(n) => Some(n.parse::<u32>().map_err(|_| bad())?),
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok((kind.to_owned(), name.to_owned(), replicas))
}

impl CniArgs {
    /// The pod for an ADD: namespace and name are required.
    pub fn pod_identity(&self) -> Result<PodIdentity, CniError> {
        let missing = |key: &str| {
            CniError::invalid_env(format!(
                "CNI_ARGS must set {key} for ADD (kubelet and Multus always do; with cnitool, \
                 export CNI_ARGS=\"K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod\")"
            ))
        };
        let namespace = self
            .pod_namespace
            .clone()
            .ok_or_else(|| missing("K8S_POD_NAMESPACE"))?;
        let name = self
            .pod_name
            .clone()
            .ok_or_else(|| missing("K8S_POD_NAME"))?;
        let (owner_kind, owner_name) = match &self.owner {
            Some((k, n)) => (Some(k.clone()), Some(n.clone())),
            None => (None, None),
        };
        Ok(PodIdentity {
            namespace,
            name,
            uid: self.pod_uid.clone().unwrap_or_default(),
            owner_kind,
            owner_name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_api::codes;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> Result<CniEnv, CniError> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        CniEnv::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn reads_the_environment() {
        let env = env_of(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", "/var/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", "K8S_POD_NAME=p"),
            ("CNI_PATH", "/opt/cni/bin"),
        ])
        .unwrap();
        assert_eq!(env.command, Command::Add);
        assert_eq!(
            env.attachment().unwrap(),
            AttachmentId {
                container_id: "abc123".into(),
                if_name: "eth0".into()
            }
        );
        assert_eq!(env.netns().unwrap(), "/var/run/netns/x");
        assert_eq!(env.path.as_deref(), Some("/opt/cni/bin"));
    }

    #[test]
    fn missing_or_unknown_command_is_code_4() {
        let e = env_of(&[]).unwrap_err();
        assert_eq!(e.code, codes::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("CNI_COMMAND"), "{e}");
        let e = env_of(&[("CNI_COMMAND", "add")]).unwrap_err();
        assert_eq!(e.code, codes::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("\"add\""), "{e}");
    }

    #[test]
    fn empty_values_count_as_missing() {
        let env = env_of(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_NETNS", ""),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap();
        assert_eq!(env.netns, None);
        let e = env.netns().unwrap_err();
        assert!(e.msg.contains("CNI_NETNS") && e.msg.contains("DEL"), "{e}");
        let e = env.container_id().unwrap_err();
        assert_eq!(e.code, codes::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("CNI_CONTAINERID"), "{e}");
    }

    #[test]
    fn container_ids_and_ifnames_are_validated() {
        assert!(validate_container_id("a1_b.c-d").is_ok());
        for bad in ["", "-a", "_a", "a/b", "a b", "a;b"] {
            let e = validate_container_id(bad).unwrap_err();
            assert!(e.msg.contains("CNI_CONTAINERID"), "{bad}: {e}");
        }
        assert!(validate_ifname("eth0").is_ok());
        assert!(validate_ifname("net1.100").is_ok());
        assert!(validate_ifname("123456789012345").is_ok());
        for bad in ["1234567890123456", ".", "..", "a/b", "a:b", "a b"] {
            let e = validate_ifname(bad).unwrap_err();
            assert!(e.msg.contains("CNI_IFNAME"), "{bad}: {e}");
        }
    }

    #[test]
    fn kubelet_args_parse() {
        let a = parse_cni_args(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;\
             K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1;SOMETHING_ELSE=x",
        )
        .unwrap();
        assert_eq!(a.pod_namespace.as_deref(), Some("default"));
        assert_eq!(a.pod_name.as_deref(), Some("web-0"));
        assert_eq!(a.pod_uid.as_deref(), Some("u-1"));
        let pod = a.pod_identity().unwrap();
        assert_eq!(
            (pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str()),
            ("default", "web-0", "u-1")
        );
        assert_eq!(pod.owner_kind, None);
    }

    #[test]
    fn owner_is_kind_slash_name() {
        let a = parse_cni_args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=db-1;ALLOT_OWNER=StatefulSet/db")
            .unwrap();
        let pod = a.pod_identity().unwrap();
        assert_eq!(pod.owner_kind.as_deref(), Some("StatefulSet"));
        assert_eq!(pod.owner_name.as_deref(), Some("db"));
        assert_eq!(a.owner_replicas, None);
        let a = parse_cni_args("ALLOT_OWNER=StatefulSet/db/3").unwrap();
        assert_eq!(a.owner, Some(("StatefulSet".into(), "db".into())));
        assert_eq!(a.owner_replicas, Some(3));
        for bad in ["StatefulSet", "/db", "StatefulSet/", "a/b/c", ""] {
            let e = parse_cni_args(&format!("ALLOT_OWNER={bad}")).unwrap_err();
            assert_eq!(e.code, codes::INVALID_ENVIRONMENT);
            assert!(e.msg.contains("ALLOT_OWNER"), "{bad}: {e}");
        }
    }

    #[test]
    fn malformed_args_are_code_4_and_named() {
        let e = parse_cni_args("K8S_POD_NAME=p;oops").unwrap_err();
        assert_eq!(e.code, codes::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("\"oops\""), "{e}");
        let e = parse_cni_args("=v").unwrap_err();
        assert!(e.msg.contains("empty key"), "{e}");
        let e = parse_cni_args("K8S_POD_NAME=a;K8S_POD_NAME=b").unwrap_err();
        assert!(e.msg.contains("K8S_POD_NAME"), "{e}");
        let e = parse_cni_args("IgnoreUnknown=maybe").unwrap_err();
        assert!(e.msg.contains("IgnoreUnknown"), "{e}");
    }

    #[test]
    fn multus_repeating_the_runtimes_args_is_one_pod() {
        // What Multus 4.2 hands a delegate: its own pairs, then the runtime's as they came.
        let a = parse_cni_args(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-0;\
             K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u1;IgnoreUnknown=1;\
             K8S_POD_NAMESPACE=web;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;\
             K8S_POD_UID=u1;K8S_MULTUS_EXTRA=1",
        )
        .unwrap();
        assert_eq!(a.pod_name.as_deref(), Some("web-0"));
        assert_eq!(a.pod_uid.as_deref(), Some("u1"));
        // Said twice differently, the identity is refused, naming both.
        let e = parse_cni_args("K8S_POD_UID=u1;K8S_POD_UID=u2").unwrap_err();
        assert!(e.msg.contains("\"u1\"") && e.msg.contains("\"u2\""), "{e}");
        let e = parse_cni_args("IgnoreUnknown=1;IgnoreUnknown=false").unwrap_err();
        assert!(e.msg.contains("IgnoreUnknown"), "{e}");
    }

    #[test]
    fn unknown_keys_need_ignore_unknown() {
        let e = parse_cni_args("K8S_POD_NAME=p;FOO=1").unwrap_err();
        assert_eq!(e.code, codes::INVALID_ENVIRONMENT);
        assert!(
            e.msg.contains("FOO") && e.msg.contains("IgnoreUnknown"),
            "{e}"
        );
        assert!(parse_cni_args("FOO=1;IgnoreUnknown=true").is_ok());
        assert!(parse_cni_args("FOO=1;IgnoreUnknown=TRUE").is_ok());
        assert!(parse_cni_args("FOO=1;IgnoreUnknown=0").is_err());
    }

    #[test]
    fn values_may_contain_equals_and_segments_may_be_empty() {
        let a = parse_cni_args(";K8S_POD_NAME=a=b;;K8S_POD_NAMESPACE=ns;").unwrap();
        assert_eq!(a.pod_name.as_deref(), Some("a=b"));
        assert_eq!(parse_cni_args("").unwrap(), CniArgs::default());
    }

    #[test]
    fn add_needs_namespace_and_name() {
        let e = parse_cni_args("K8S_POD_NAME=p")
            .unwrap()
            .pod_identity()
            .unwrap_err();
        assert_eq!(e.code, codes::INVALID_ENVIRONMENT);
        assert!(e.msg.contains("K8S_POD_NAMESPACE"), "{e}");
        let e = parse_cni_args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=")
            .unwrap()
            .pod_identity()
            .unwrap_err();
        assert!(e.msg.contains("K8S_POD_NAME "), "{e}");
    }
}
