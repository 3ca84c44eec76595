//! The verbs: read the environment and stdin, ask the agent, print a result or an error object.
//!
//! Order of checks: `CNI_COMMAND` (code 4) → VERSION answers at once → stdin is a JSON object
//! (6) → `cniVersion` is present (7) and supported (1) → the verb exists in that version (1) →
//! the verb's `CNI_*` variables (4) → the `ipam` section (7) → the agent. Error objects echo the
//! caller's `cniVersion` string once it has been read, else the newest version.

use std::any::Any;
use std::io::{IsTerminal, Read, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use allot_api::{AddRequest, DelRequest, GcRequest, GcResponse, IpamResult, StatusResponse, codes};

use crate::client::{CallError, Client};
use crate::config::{self, CniVersion, Conf, IpamConf, SUPPORTED_VERSIONS};
use crate::env::{CniEnv, Command};
use crate::error::CniError;
use crate::{journal, probe, result};

/// Default bound on the exchange with the agent, per verb (ipam `timeout_ms` overrides all).
/// ADD may run conflict and gateway probes (three tries of 100 ms per address, plus retries on
/// conflicts), so it gets the most.
fn default_timeout(command: Command) -> Duration {
    Duration::from_secs(match command {
        Command::Add => 30,
        Command::Gc => 60,
        Command::Status => 5,
        Command::Del | Command::Check | Command::Version => 15,
    })
}

/// What the process prints and how it exits.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: Option<String>,
    pub exit: i32,
}

impl Outcome {
    fn success(stdout: Option<String>) -> Self {
        Outcome { stdout, exit: 0 }
    }

    fn failure(version: &str, err: &CniError) -> Self {
        Outcome {
            stdout: Some(err.to_json(version)),
            exit: 1,
        }
    }
}

/// The process: run the verb, print, exit code.
///
/// A panic is a bug, but it must still leave the runtime a CNI error object rather than a bare
/// exit status and a Rust backtrace. The panic hook prints the object on stdout (so this holds
/// even if a build ever sets `panic = "abort"`) before the default hook writes the message to
/// stderr; `catch_unwind` then turns the unwinding into exit status 1. Code 5 ("I/O failure")
/// because the spec has no "internal error" code, 5 is the generic failure runtimes already see
/// from Go plugins, and allot-api has no code of its own for it (yet).
pub fn main_guarded() -> i32 {
    let default_hook = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        // Only the main thread's panic ends the process; the connect helper's would not.
        let on_main = std::thread::current().name() == Some("main");
        if on_main && !PANIC_REPORTED.swap(true, Ordering::SeqCst) {
            let err = panic_error(info.payload());
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{}", err.to_json(CniVersion::LATEST.as_str()));
            let _ = stdout.flush();
        }
        default_hook(info);
    }));
    let outcome = guarded(|| {
        let stdin = std::io::stdin();
        let stdin_is_tty = stdin.is_terminal();
        run(
            |name| std::env::var_os(name),
            &mut stdin.lock(),
            stdin_is_tty,
            &mut std::io::stderr(),
        )
    });
    if let Some(out) = &outcome.stdout {
        let mut stdout = std::io::stdout().lock();
        // Nothing useful can be done if stdout is gone.
        let _ = writeln!(stdout, "{out}");
        let _ = stdout.flush();
    }
    outcome.exit
}

/// Set once the panic hook has printed the error object.
static PANIC_REPORTED: AtomicBool = AtomicBool::new(false);

fn panic_error(payload: &(dyn Any + Send)) -> CniError {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    CniError::io("internal error in allot (a bug: please report it)").with_details(what)
}

/// Runs `f`; a panic becomes exit status 1 with a code-5 error object (unless the panic hook
/// already printed one).
pub fn guarded(f: impl FnOnce() -> Outcome) -> Outcome {
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(outcome) => outcome,
        Err(_) if PANIC_REPORTED.load(Ordering::SeqCst) => Outcome {
            stdout: None,
            exit: 1,
        },
        Err(payload) => Outcome::failure(CniVersion::LATEST.as_str(), &panic_error(&*payload)),
    }
}

/// One invocation. `get` reads environment variables, `stdin` is the network config, `log` is
/// stderr.
pub fn run(
    get: impl Fn(&str) -> Option<std::ffi::OsString>,
    stdin: &mut dyn Read,
    stdin_is_tty: bool,
    log: &mut dyn Write,
) -> Outcome {
    let latest = CniVersion::LATEST.as_str();
    let env = match CniEnv::from_vars(get) {
        Ok(env) => env,
        Err(e) => return Outcome::failure(latest, &e),
    };
    if env.command == Command::Version {
        // The runtime sends {"cniVersion": …} on stdin; read it so that the writer never sees
        // EPIPE, but answer the same whatever it says. Skip it when a person runs
        // `CNI_COMMAND=VERSION allot` at a terminal.
        if !stdin_is_tty {
            let _ = std::io::copy(stdin, &mut std::io::sink());
        }
        return Outcome::success(Some(version_info()));
    }
    let mut input = Vec::new();
    if let Err(e) = stdin.read_to_end(&mut input) {
        return Outcome::failure(latest, &CniError::io(format!("cannot read stdin: {e}")));
    }
    let conf = match config::decode(&input) {
        Ok(c) => c,
        Err(e) => return Outcome::failure(latest, &e),
    };
    let reply_version = config::raw_version(&conf).unwrap_or(latest).to_owned();
    match dispatch(&env, &conf, log) {
        Ok(stdout) => Outcome::success(stdout),
        Err(e) => Outcome::failure(&reply_version, &e),
    }
}

pub fn version_info() -> String {
    serde_json::json!({
        "cniVersion": CniVersion::LATEST.as_str(),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
    .to_string()
}

fn dispatch(env: &CniEnv, conf: &Conf, log: &mut dyn Write) -> Result<Option<String>, CniError> {
    let version = config::cni_version(conf)?;
    require_version(env.command, version)?;
    match env.command {
        Command::Add => add(env, conf, version, log).map(Some),
        Command::Del => del(env, conf, log).map(|()| None),
        Command::Check => check(env, conf).map(|()| None),
        Command::Status => status(env, conf).map(|()| None),
        Command::Gc => gc(env, conf, log).map(|()| None),
        Command::Version => Ok(Some(version_info())),
    }
}

/// CHECK arrived in spec 0.4.0, STATUS and GC in 1.1.0. A config of an older version asking for
/// them is an incompatible version (code 1), not an unsupported field (code 2, which the spec
/// reserves for network config fields): that is what libcni's skel returns ("config version
/// does not allow CHECK/STATUS/GC"), so runtimes already understand it.
fn require_version(command: Command, version: CniVersion) -> Result<(), CniError> {
    let since = match command {
        Command::Check => CniVersion::V040,
        Command::Status | Command::Gc => CniVersion::V110,
        _ => return Ok(()),
    };
    if version >= since {
        return Ok(());
    }
    Err(CniError::incompatible_version(format!(
        "config version {} does not allow {}: it needs cniVersion {} or later",
        version.as_str(),
        command.name(),
        since.as_str()
    )))
}

fn client(command: Command, ipam: &IpamConf) -> Client {
    Client::new(
        ipam.socket.clone(),
        ipam.timeout.unwrap_or_else(|| default_timeout(command)),
    )
}

/// ADD and CHECK: the runtime should retry while the agent is down or slow (code 11); what
/// the agent itself says passes through.
fn agent_error(err: CallError, client: &Client) -> CniError {
    let text = err.describe(&client.socket, client.timeout);
    match err {
        CallError::Agent(e) => e,
        CallError::Unreachable(_) | CallError::TimedOut | CallError::Broken(_) => {
            CniError::try_again(format!("try again later: {text}"))
        }
        // 503 is how an HTTP server says "not now".
        CallError::Status(503, _) => CniError::try_again(format!("try again later: {text}")),
        CallError::Status(..) | CallError::Protocol(_) => CniError::io(text),
    }
}

fn decode_answer<T: serde::de::DeserializeOwned>(
    body: &[u8],
    client: &Client,
) -> Result<T, CniError> {
    serde_json::from_slice(body).map_err(|e| {
        CniError::io(format!(
            "allot-agent at {} answered with a body allot cannot decode: {e}",
            client.socket.display()
        ))
    })
}

fn add(
    env: &CniEnv,
    conf: &Conf,
    version: CniVersion,
    log: &mut dyn Write,
) -> Result<String, CniError> {
    let attachment = env.attachment()?;
    let netns = env.netns()?.to_owned();
    let pod = env.cni_args()?.pod_identity()?;
    let network = config::network_name(conf)?;
    let ipam = config::ipam(conf)?;
    ipam.reject_unknown()?;
    let request = AddRequest {
        container_id: attachment.container_id,
        if_name: attachment.if_name,
        netns,
        network,
        default_ipv4_pools: ipam.default_ipv4_pools.clone(),
        default_ipv6_pools: ipam.default_ipv6_pools.clone(),
        // Multus does not tell IPAM plugins which NetworkAttachmentDefinition they serve; the
        // agent derives it from the pod in cluster mode.
        multus_name: String::new(),
        pod,
        probe: ipam.probe,
        parent: probe::parent_link(conf),
    };
    let client = client(Command::Add, &ipam);
    // An agent restarting (its DaemonSet rolled, its container restarted) is waited for,
    // within the ADD's timeout; one that stays away is "try again later" (code 11).
    let body = client
        .post_waiting_for_agent(allot_api::ADD, &request)
        .map_err(|e| agent_error(e, &client))?;
    let answer: IpamResult = decode_answer(&body, &client)?;
    // The network's own section wins, as a whole; without one, the agent's defaults.
    let settings = ipam.probe.or(answer.probe).filter(|p| p.enabled());
    let answer = match settings {
        None => answer,
        Some(settings) => {
            let mut agent = ProbeAgent {
                client: &client,
                env,
                conf,
                log: Vec::new(),
            };
            let settled = probe::settle(
                std::path::Path::new(&request.netns),
                &request.if_name,
                settings,
                &request,
                answer,
                &mut agent,
                log,
            );
            let _ = log.write_all(&agent.log);
            settled?
        }
    };
    result::render(&answer, version)
}

/// The agent as the probe flow sees it: quarantine over the socket, release as a DEL (so that
/// it is journaled when the agent has gone away meanwhile).
struct ProbeAgent<'a> {
    client: &'a Client,
    env: &'a CniEnv,
    conf: &'a Conf,
    log: Vec<u8>,
}

impl probe::Agent for ProbeAgent<'_> {
    fn quarantine(
        &mut self,
        request: &allot_api::QuarantineRequest,
    ) -> Result<Option<IpamResult>, CniError> {
        let body = self
            .client
            .post(allot_api::QUARANTINE, request)
            .map_err(|e| agent_error(e, self.client))?;
        if !request.replace {
            return Ok(None);
        }
        decode_answer(&body, self.client).map(Some)
    }

    fn release(&mut self) {
        if let Err(e) = del(self.env, self.conf, &mut self.log) {
            let _ = writeln!(
                self.log,
                "allot: ADD failed and releasing its addresses failed too ({}): the runtime's \
                 DEL or GC will release them",
                e.msg
            );
        }
    }
}

/// DEL never fails because the agent is down or stuck: the pod must be able to go away. The
/// DEL is remembered in the journal, and the agent replays it when it is back (GC, from the
/// runtime or the controller, is the last resort). The agent is told when this gives up
/// waiting, and does not act on the DEL past that moment (the runtime may re-add the container
/// then: see `allot_api::deadline`); it answers so if it reaches the DEL as this still waits,
/// and the DEL is journaled the same. Any other answer from the agent, error or not, is
/// reported as it is.
fn del(env: &CniEnv, conf: &Conf, log: &mut dyn Write) -> Result<(), CniError> {
    let attachment = env.attachment()?;
    let ipam = config::ipam(conf)?;
    if !ipam.unknown.is_empty() {
        // An unknown field cannot change what DEL releases; refusing to release would only
        // leak the address.
        let _ = writeln!(
            log,
            "allot: DEL: ignoring unknown ipam field(s) {}",
            ipam.describe_unknown()
        );
    }
    // The replica count only decides keep-or-release; a malformed CNI_ARGS must not block DEL.
    let owner_replicas = match env.cni_args() {
        Ok(args) => args.owner_replicas,
        Err(e) => {
            let _ = writeln!(log, "allot: DEL: ignoring CNI_ARGS: {}", e.msg);
            None
        }
    };
    let client = client(Command::Del, &ipam);
    let request = DelRequest {
        attachment,
        owner_replicas,
        issued_at: None,
        // Taken before the call's timer starts: the agent stops before this gives up.
        monotonic_deadline_ms: Some(allot_api::deadline::after(client.timeout)),
    };
    match client.post(allot_api::DEL, &request) {
        Ok(_) => Ok(()),
        Err(e) if e.is_transport() || is_past_deadline(&e) => {
            let why = e.describe(&client.socket, client.timeout);
            let journaled = DelRequest {
                issued_at: Some(unix_now()),
                // Replayed late on purpose, after the deadline (and maybe a reboot).
                monotonic_deadline_ms: None,
                ..request
            };
            let id = &journaled.attachment;
            match journal::record(&ipam.journal, &journaled) {
                Ok(path) => {
                    let _ = writeln!(
                        log,
                        "allot: DEL {}/{}: {why}; remembered in {} for the agent to replay",
                        id.container_id,
                        id.if_name,
                        path.display()
                    );
                }
                Err(j) => {
                    let _ = writeln!(
                        log,
                        "allot: DEL {}/{}: {why}; cannot remember it in {} ({j}): GC will \
                         release the address later",
                        id.container_id,
                        id.if_name,
                        ipam.journal.display()
                    );
                }
            }
            Ok(())
        }
        Err(CallError::Agent(e)) => Err(e),
        Err(e) => Err(CniError::io(e.describe(&client.socket, client.timeout))),
    }
}

/// The agent reached the DEL only after its deadline, and did nothing.
fn is_past_deadline(e: &CallError) -> bool {
    matches!(e, CallError::Agent(e) if e.code == codes::PAST_DEADLINE)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn check(env: &CniEnv, conf: &Conf) -> Result<(), CniError> {
    let attachment = env.attachment()?;
    env.netns()?;
    // Not needed by CHECK, but a malformed CNI_ARGS is malformed for every verb that gets one.
    env.cni_args()?;
    let ipam = config::ipam(conf)?;
    ipam.reject_unknown()?;
    let prev = config::prev_result_addresses(conf)?;
    let client = client(Command::Check, &ipam);
    let body = client
        .post(allot_api::CHECK, &attachment)
        .map_err(|e| agent_error(e, &client))?;
    let held: IpamResult = decode_answer(&body, &client)?;
    result::validate(&held)?;
    if held.ips.is_empty() {
        return Err(CniError::new(
            result::CHECK_MISMATCH,
            "allot holds no address for this attachment",
        ));
    }
    // A runtime may omit prevResult; then holding the claim is all CHECK can verify.
    match prev {
        Some(prev) => result::check_matches(&held, &prev),
        None => Ok(()),
    }
}

/// STATUS: agent unreachable, not answering, or not ready → 50 (cannot serve ADD). Pools
/// without free addresses are not a reason to fail: runtimes gate node readiness on STATUS, and
/// marking a healthy node NotReady would evict its pods. Exhaustion fails the ADD (code 100)
/// that meets it. An `ErrorBody` from the agent passes through.
fn status(_env: &CniEnv, conf: &Conf) -> Result<(), CniError> {
    let ipam = config::ipam(conf)?;
    ipam.reject_unknown()?;
    let client = client(Command::Status, &ipam);
    let not_available = |msg: String| CniError::new(codes::PLUGIN_NOT_AVAILABLE, msg);
    let body = match client.get(allot_api::STATUS) {
        Ok(body) => body,
        Err(CallError::Agent(e)) => return Err(e),
        Err(e) => return Err(not_available(e.describe(&client.socket, client.timeout))),
    };
    let status: StatusResponse = serde_json::from_slice(&body).map_err(|e| {
        not_available(format!(
            "allot-agent at {} answered a status allot cannot decode: {e}",
            client.socket.display()
        ))
    })?;
    status_verdict(&status)
}

pub fn status_verdict(status: &StatusResponse) -> Result<(), CniError> {
    if !status.ready {
        let msg = if status.message.is_empty() {
            "allot-agent is not ready".to_string()
        } else {
            format!("allot-agent is not ready: {}", status.message)
        };
        return Err(CniError::new(codes::PLUGIN_NOT_AVAILABLE, msg));
    }
    Ok(())
}

/// GC: forwards the attachments still in use; the agent releases every other claim of this
/// network. Retried later by the runtime on failure (code 11 while the agent is away).
fn gc(_env: &CniEnv, conf: &Conf, log: &mut dyn Write) -> Result<(), CniError> {
    let ipam = config::ipam(conf)?;
    ipam.reject_unknown()?;
    let request = GcRequest {
        network: config::network_name(conf)?,
        valid_attachments: config::gc_attachments(conf)?,
    };
    let client = client(Command::Gc, &ipam);
    let body = client
        .post(allot_api::GC, &request)
        .map_err(|e| agent_error(e, &client))?;
    // Success is the 2xx; the body is only for the log.
    match serde_json::from_slice::<GcResponse>(&body) {
        Ok(r) if !r.released.is_empty() => {
            let _ = writeln!(
                log,
                "allot: GC released {} address(es): {}",
                r.released.len(),
                r.released.join(", ")
            );
        }
        Ok(_) => {}
        Err(e) => {
            let _ = writeln!(
                log,
                "allot: GC succeeded, but its answer did not decode: {e}"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_api::PoolStatus;
    use std::collections::HashMap;
    use std::ffi::OsString;

    fn run_with(vars: &[(&str, &str)], stdin: &str) -> (Outcome, String) {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        let mut log = Vec::new();
        let out = run(
            |k| map.get(k).cloned(),
            &mut stdin.as_bytes(),
            false,
            &mut log,
        );
        (out, String::from_utf8(log).unwrap())
    }

    fn code_of(out: &Outcome) -> (u64, String) {
        let v: serde_json::Value = serde_json::from_str(out.stdout.as_ref().unwrap()).unwrap();
        (
            v["code"].as_u64().unwrap(),
            v["cniVersion"].as_str().unwrap().to_owned(),
        )
    }

    #[test]
    fn version_ignores_stdin() {
        let (out, _) = run_with(&[("CNI_COMMAND", "VERSION")], "not json at all");
        assert_eq!(out.exit, 0);
        let v: serde_json::Value = serde_json::from_str(out.stdout.as_ref().unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]})
        );
    }

    #[test]
    fn verbs_need_their_version() {
        for (cmd, v) in [("CHECK", "0.3.1"), ("STATUS", "1.0.0"), ("GC", "0.4.0")] {
            let (out, _) = run_with(
                &[("CNI_COMMAND", cmd)],
                &format!(r#"{{"cniVersion":"{v}"}}"#),
            );
            assert_eq!(code_of(&out), (1, v.to_string()), "{cmd} {v}");
        }
    }

    #[test]
    fn errors_echo_the_callers_version() {
        let (out, _) = run_with(
            &[("CNI_COMMAND", "ADD")],
            r#"{"cniVersion":"0.3.1","name":"n"}"#,
        );
        assert_eq!(code_of(&out), (4, "0.3.1".into()));
        let (out, _) = run_with(&[("CNI_COMMAND", "ADD")], r#"{"cniVersion":"0.2.0"}"#);
        assert_eq!(code_of(&out), (1, "0.2.0".into()));
        let (out, _) = run_with(&[("CNI_COMMAND", "ADD")], "{");
        assert_eq!(code_of(&out), (6, "1.1.0".into()));
        let (out, _) = run_with(&[], "{}");
        assert_eq!(code_of(&out), (4, "1.1.0".into()));
    }

    #[test]
    fn del_with_a_missing_netns_and_no_agent_succeeds_and_is_journaled() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("gone.sock");
        let journal = dir.path().join("journal");
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"type":"allot","socket":"{}","journal":"{}","typo":1}}}}"#,
            sock.display(),
            journal.display()
        );
        let del = |args: &str| {
            run_with(
                &[
                    ("CNI_COMMAND", "DEL"),
                    ("CNI_CONTAINERID", "c1"),
                    ("CNI_IFNAME", "eth0"),
                    ("CNI_ARGS", args),
                ],
                &conf,
            )
        };
        let before = unix_now();
        let (out, log) = del("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=db-2;ALLOT_OWNER=StatefulSet/db/2");
        assert_eq!(
            out,
            Outcome {
                stdout: None,
                exit: 0
            }
        );
        assert!(
            log.contains("typo") && log.contains("remembered in"),
            "{log}"
        );
        let entry: DelRequest =
            serde_json::from_slice(&std::fs::read(journal.join("c1@eth0.json")).unwrap()).unwrap();
        assert_eq!(entry.owner_replicas, Some(2));
        assert!(entry.issued_at.unwrap() >= before);
        assert_eq!(
            entry.monotonic_deadline_ms, None,
            "replayed late on purpose"
        );

        // A malformed CNI_ARGS does not block DEL either.
        let (out, log) = del("garbage");
        assert_eq!(out.exit, 0);
        assert!(log.contains("ignoring CNI_ARGS"), "{log}");
    }

    /// DEL on `socket`, timing out after `timeout_ms`, journaling next to the socket.
    fn del_via(socket: &std::path::Path, timeout_ms: u64) -> (Outcome, String) {
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"type":"allot","socket":"{}","journal":"{}","timeout_ms":{timeout_ms}}}}}"#,
            socket.display(),
            socket.with_file_name("journal").display()
        );
        let vars = [
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
        ];
        run_with(&vars, &conf)
    }

    /// The agent is told when the plugin gives up (its timeout from the start), so that it
    /// never acts on the DEL after the plugin journaled it.
    #[test]
    fn del_tells_the_agent_when_it_gives_up() {
        use crate::client::tests::{http, serve_once};
        let (_dir, socket, agent) = serve_once(http("200 OK", "{}"));
        let before = allot_api::deadline::now_ms();
        let (out, _) = del_via(&socket, 2000);
        let after = allot_api::deadline::now_ms();
        assert_eq!(out.exit, 0);
        let sent = String::from_utf8(agent.join().unwrap()).unwrap();
        let body = sent.split("\r\n\r\n").nth(1).unwrap();
        let request: DelRequest = serde_json::from_str(body).unwrap();
        let deadline = request.monotonic_deadline_ms.expect("a deadline");
        assert!(
            (before + 2000..=after + 2000).contains(&deadline),
            "{before} + 2000 <= {deadline} <= {after} + 2000"
        );
    }

    /// An agent that reached the DEL past that deadline did nothing: the DEL is journaled, as
    /// when the plugin times out, and the pod can go away.
    #[test]
    fn a_del_the_agent_reached_too_late_is_journaled() {
        use crate::client::tests::{http, serve_once};
        let late = r#"{"code":108,"msg":"reached after the plugin gave up"}"#;
        let (dir, socket, agent) = serve_once(http("504 Gateway Timeout", late));
        let (out, log) = del_via(&socket, 2000);
        agent.join().unwrap();
        assert_eq!(out.exit, 0, "{out:?} {log}");
        assert!(log.contains("remembered in"), "{log}");
        let entry: DelRequest = serde_json::from_slice(
            &std::fs::read(dir.path().join("journal/c1@eth0.json")).unwrap(),
        )
        .unwrap();
        assert!(entry.issued_at.is_some());
        assert_eq!(entry.monotonic_deadline_ms, None);
    }

    #[test]
    fn del_that_cannot_be_journaled_still_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("gone.sock");
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","name":"n","ipam":{{"type":"allot","socket":"{}","journal":"{}"}}}}"#,
            sock.display(),
            not_a_dir.display()
        );
        let (out, log) = run_with(
            &[
                ("CNI_COMMAND", "DEL"),
                ("CNI_CONTAINERID", "c1"),
                ("CNI_IFNAME", "eth0"),
            ],
            &conf,
        );
        assert_eq!(out.exit, 0);
        assert!(log.contains("GC will release"), "{log}");
    }

    #[test]
    fn panics_become_error_objects() {
        let out = guarded(|| panic!("boom {}", 1));
        assert_eq!(out.exit, 1);
        let v: serde_json::Value = serde_json::from_str(out.stdout.as_ref().unwrap()).unwrap();
        assert_eq!(v["code"], 5);
        assert_eq!(v["details"], "boom 1");
        let out = guarded(|| std::panic::panic_any(7u8));
        assert_eq!(out.exit, 1);
    }

    fn pool(name: &str, free: u64) -> PoolStatus {
        PoolStatus {
            name: name.into(),
            ip_version: 4,
            total: 10,
            free,
            cooling: 0,
            state: "serving".into(),
            claims: 0,
        }
    }

    #[test]
    fn status_verdicts() {
        let ok = StatusResponse {
            ready: true,
            message: String::new(),
            pools: vec![pool("a", 0), pool("b", 3)],
            degraded: false,
            problems: vec![],
        };
        assert!(status_verdict(&ok).is_ok());
        let e = status_verdict(&StatusResponse {
            ready: false,
            message: "loading pools".into(),
            ..ok.clone()
        })
        .unwrap_err();
        assert_eq!(e.code, codes::PLUGIN_NOT_AVAILABLE);
        assert!(e.msg.contains("loading pools"));
        // Exhausted pools, no pools, a degraded configuration: the agent still serves (ADD
        // fails with 100 where no address is left); the node stays Ready.
        for status in [
            StatusResponse {
                pools: vec![pool("a", 0), pool("b", 0)],
                ..ok.clone()
            },
            StatusResponse {
                pools: vec![],
                ..ok.clone()
            },
            StatusResponse {
                degraded: true,
                ..ok.clone()
            },
        ] {
            assert!(status_verdict(&status).is_ok(), "{status:?}");
        }
    }
}
