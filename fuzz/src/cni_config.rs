//! Target `cni_config`: the CNI environment (`CNI_*` variables, the `CNI_ARGS` list) and the
//! network config on stdin, through `allot_cni`'s parsers and through `cmd::run` for every
//! invocation that fails before it would reach the agent.
//!
//! Input: `NAME=VALUE` lines (raw bytes, so values may be invalid UTF-8), a blank line, then
//! stdin. Without a blank line the whole input is the environment and stdin is empty.
//!
//! Invariants beyond "no panic":
//! - a parsed `CNI_ARGS` rendered back as `K=V;…` parses to the same thing, and a pod identity
//!   has a namespace and a name;
//! - an accepted container ID, interface name, version, network name, `ipam` section and GC
//!   attachment list have the properties their parsers promise;
//! - an accepted config serialised again decodes to the same config and the same `ipam` (floats
//!   up to serde_json's last-bit rounding, see [`same_json`]);
//! - `cmd::run` fails with exactly the code of the first check that fails, in the order its
//!   module documents, and prints a CNI error object echoing the caller's `cniVersion`.
//!   Invocations that would pass every check are not run: they would call the agent.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use allot_api::codes;
use allot_cni::cmd;
use allot_cni::config::{self, CniVersion, Conf};
use allot_cni::env::{self, CniArgs, CniEnv, Command};
use allot_cni::error::CniError;
use serde_json::Value;

/// Where the socket of a config is pointed before `cmd::run` sees it, in case this target's
/// prediction is ever wrong: a fuzzer must never reach a real agent.
const NO_SOCKET: &str = "/nonexistent/allot-fuzz/agent.sock";

pub fn run(data: &[u8]) {
    let (env_text, stdin) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &data[..0]),
    };
    let vars: Vec<(&[u8], &[u8])> = env_text
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let eq = line.iter().position(|&b| b == b'=')?;
            Some((&line[..eq], &line[eq + 1..]))
        })
        .collect();
    let get = |name: &str| -> Option<OsString> {
        vars.iter()
            .find(|(k, _)| *k == name.as_bytes())
            .map(|(_, v)| OsString::from_vec(v.to_vec()))
    };

    let env = CniEnv::from_vars(get);
    if let Ok(env) = &env {
        check_env(env);
    }
    let conf = config::decode(stdin);
    if let Ok(conf) = &conf {
        check_conf(conf);
    }

    let expected = match first_failure(&env, &conf) {
        Verdict::ReachesAgent => return,
        Verdict::Version => None,
        Verdict::Fails(code) => Some(code),
    };
    let stdin = match &conf {
        Ok(conf) if expected.is_some() && config::ipam(conf).is_ok() => {
            let mut conf = conf.clone();
            if let Some(Value::Object(ipam)) = conf.get_mut("ipam") {
                ipam.insert("socket".into(), NO_SOCKET.into());
            }
            serde_json::to_vec(&conf).expect("a JSON map serialises")
        }
        _ => stdin.to_vec(),
    };
    let outcome = cmd::run(get, &mut stdin.as_slice(), false, &mut std::io::sink());
    let Some(expected) = expected else {
        assert_eq!(outcome.exit, 0, "VERSION failed: {outcome:?}");
        assert_eq!(outcome.stdout, Some(cmd::version_info()));
        return;
    };
    assert_eq!(outcome.exit, 1, "expected code {expected}: {outcome:?}");
    let printed: Value = serde_json::from_str(outcome.stdout.as_deref().unwrap_or(""))
        .unwrap_or_else(|e| panic!("the error object is not JSON ({e}): {outcome:?}"));
    assert_eq!(printed["code"], expected, "{printed}");
    assert!(printed["msg"].as_str().is_some_and(|m| !m.is_empty()));
    // The caller's version is echoed once the config has been read, which is after the
    // environment.
    let echoed = match (&env, &conf) {
        (Ok(_), Ok(conf)) => config::raw_version(conf),
        _ => None,
    };
    let echoed = echoed.unwrap_or(CniVersion::LATEST.as_str());
    assert_eq!(printed["cniVersion"], echoed, "{printed}");
}

fn check_env(env: &CniEnv) {
    assert_eq!(Command::parse(env.command.name()).ok(), Some(env.command));
    if let Ok(id) = env.container_id() {
        assert!(
            id.starts_with(|c: char| c.is_ascii_alphanumeric()),
            "{id:?}"
        );
        assert!(!id.contains(['/', ' ', '\n']), "{id:?}");
    }
    if let Ok(name) = env.ifname() {
        assert!(!name.is_empty() && name.len() <= 15, "{name:?}");
        assert!(!name.contains(['/', ':']) && name != "." && name != "..");
    }
    if let Ok(args) = env.cni_args() {
        check_cni_args(&args);
    }
}

fn check_cni_args(args: &CniArgs) {
    let mut rendered = Vec::new();
    for (key, value) in [
        ("K8S_POD_NAMESPACE", &args.pod_namespace),
        ("K8S_POD_NAME", &args.pod_name),
        ("K8S_POD_UID", &args.pod_uid),
    ] {
        if let Some(v) = value {
            assert!(!v.is_empty() && !v.contains(';'), "{key}={v:?}");
            rendered.push(format!("{key}={v}"));
        }
    }
    if let Some((kind, name)) = &args.owner {
        assert!(!kind.is_empty() && !name.is_empty() && !name.contains('/'));
        match args.owner_replicas {
            Some(replicas) => rendered.push(format!("ALLOT_OWNER={kind}/{name}/{replicas}")),
            None => rendered.push(format!("ALLOT_OWNER={kind}/{name}")),
        }
    } else {
        assert_eq!(args.owner_replicas, None, "replicas without an owner");
    }
    let again = env::parse_cni_args(&rendered.join(";"))
        .unwrap_or_else(|e| panic!("{rendered:?} no longer parses: {e}"));
    assert_eq!(&again, args);
    if let Ok(pod) = args.pod_identity() {
        assert!(!pod.namespace.is_empty() && !pod.name.is_empty(), "{pod:?}");
    }
}

fn check_conf(conf: &Conf) {
    if let Ok(version) = config::cni_version(conf) {
        assert_eq!(CniVersion::parse(version.as_str()), Some(version));
        assert_eq!(config::raw_version(conf), Some(version.as_str()));
    }
    if let Ok(name) = config::network_name(conf) {
        assert!(!name.is_empty());
    }
    let ipam = config::ipam(conf);
    if let Ok(ipam) = &ipam {
        let socket = ipam.socket.to_str().expect("parsed from a JSON string");
        assert!(socket.starts_with('/') && socket.len() <= 107, "{socket:?}");
        if let Some(t) = ipam.timeout {
            assert!((1..=600_000).contains(&t.as_millis()), "{t:?}");
        }
        let names = ipam
            .default_ipv4_pools
            .iter()
            .chain(&ipam.default_ipv6_pools);
        assert!(names.clone().all(|n| !n.is_empty()));
        assert_eq!(ipam.reject_unknown().is_ok(), ipam.unknown.is_empty());
    }
    if let Ok(attachments) = config::gc_attachments(conf) {
        assert!(
            attachments
                .iter()
                .all(|a| !a.container_id.is_empty() && !a.if_name.is_empty())
        );
    }
    let _ = config::prev_result_addresses(conf);

    let text = serde_json::to_vec(conf).expect("a JSON map serialises");
    let again = config::decode(&text).expect("a serialised config decodes again");
    assert!(same_json(
        &Value::Object(again.clone()),
        &Value::Object(conf.clone())
    ));
    match (config::ipam(&again), ipam) {
        // Unknown fields are kept as rendered JSON, where a float may differ in its last digit.
        (Ok(again), Ok(ipam)) => {
            let keys = |i: &config::IpamConf| -> Vec<String> {
                i.unknown.iter().map(|(k, _)| k.clone()).collect()
            };
            assert_eq!(keys(&again), keys(&ipam));
            assert_eq!(
                (
                    again.socket,
                    again.timeout,
                    again.default_ipv4_pools,
                    again.default_ipv6_pools
                ),
                (
                    ipam.socket,
                    ipam.timeout,
                    ipam.default_ipv4_pools,
                    ipam.default_ipv6_pools
                )
            );
        }
        (Err(again), Err(ipam)) => assert_eq!(again.code, ipam.code),
        (again, ipam) => panic!("ipam was {ipam:?}, re-serialised it is {again:?}"),
    }
}

/// JSON equality, except that floats may differ in the last bits: serde_json (without its
/// `float_roundtrip` feature, which allot does not need) parses some long decimals to a
/// neighbouring double, so `1.5e34` written as 15 followed by 33 zeros reads back as
/// `1.4999999999999999e34` and that text reads back as `1.5e34`.
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs())
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

enum Verdict {
    /// Every check passes: `cmd::run` would call the agent.
    ReachesAgent,
    /// `CNI_COMMAND=VERSION`: answered at once.
    Version,
    /// `cmd::run` fails with this code before calling the agent.
    Fails(u32),
}

/// The checks of `cmd::run` in the order its module documents, written out again: the first
/// that fails decides the code.
fn first_failure(env: &Result<CniEnv, CniError>, conf: &Result<Conf, CniError>) -> Verdict {
    let env = match env {
        Ok(env) => env,
        Err(e) => return Verdict::Fails(e.code),
    };
    if env.command == Command::Version {
        return Verdict::Version;
    }
    let conf = match conf {
        Ok(conf) => conf,
        Err(e) => return Verdict::Fails(e.code),
    };
    match verb_checks(env, conf) {
        Ok(()) => Verdict::ReachesAgent,
        Err(e) => Verdict::Fails(e.code),
    }
}

fn verb_checks(env: &CniEnv, conf: &Conf) -> Result<(), CniError> {
    let version = config::cni_version(conf)?;
    let since = match env.command {
        Command::Check => Some(CniVersion::V040),
        Command::Status | Command::Gc => Some(CniVersion::V110),
        _ => None,
    };
    if since.is_some_and(|since| version < since) {
        return Err(CniError::new(codes::INCOMPATIBLE_VERSION, "verb too new"));
    }
    match env.command {
        Command::Add => {
            env.attachment()?;
            env.netns()?;
            env.cni_args()?.pod_identity()?;
            config::network_name(conf)?;
            config::ipam(conf)?.reject_unknown()
        }
        Command::Del => {
            env.attachment()?;
            config::ipam(conf).map(drop)
        }
        Command::Check => {
            env.attachment()?;
            env.netns()?;
            env.cni_args()?;
            config::ipam(conf)?.reject_unknown()?;
            config::prev_result_addresses(conf).map(drop)
        }
        Command::Status => config::ipam(conf)?.reject_unknown(),
        Command::Gc => {
            config::ipam(conf)?.reject_unknown()?;
            config::network_name(conf)?;
            config::gc_attachments(conf).map(drop)
        }
        Command::Version => Ok(()),
    }
}
