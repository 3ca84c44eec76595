//! The fake agent (a unix socket served by a thread that reads one HTTP request and answers a
//! canned response) and the plugin binary run as a runtime runs it: what every test of the
//! plugin builds on.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use allot_api::{IpConfig, IpamResult, RouteConfig};
use serde_json::{Value, json};

pub const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

// ---------------------------------------------------------------------------------------------
// The fake agent.

#[derive(Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

pub enum Reply {
    /// Status line code and body (sent with Content-Length).
    Http(u16, String),
    /// Accept, read the request, say nothing for this long, close.
    Silence(Duration),
    /// Raw bytes.
    Raw(&'static [u8]),
}

pub struct FakeAgent {
    pub _dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub handle: JoinHandle<Option<Seen>>,
}

impl FakeAgent {
    pub fn start(reply: Reply) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        let handle = thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut stream = loop {
                match listener.accept() {
                    Ok((s, _)) => break s,
                    Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
                    Err(_) => return None,
                }
            };
            stream.set_nonblocking(false).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let seen = read_request(&mut stream);
            match reply {
                Reply::Http(code, body) => {
                    let resp = format!(
                        "HTTP/1.1 {code} Whatever\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(resp.as_bytes());
                }
                Reply::Silence(d) => thread::sleep(d),
                Reply::Raw(bytes) => {
                    let _ = stream.write_all(bytes);
                }
            }
            Some(seen)
        });
        FakeAgent {
            _dir: dir,
            socket,
            handle,
        }
    }

    pub fn ok(body: Value) -> Self {
        Self::start(Reply::Http(200, body.to_string()))
    }

    /// The request the agent saw (panics if the plugin never connected).
    pub fn seen(self) -> Seen {
        self.handle
            .join()
            .unwrap()
            .expect("the plugin never called the agent")
    }
}

pub fn read_request(stream: &mut impl Read) -> Seen {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).unwrap();
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        if let httparse::Status::Complete(head) = req.parse(&buf).unwrap() {
            let len = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| {
                    std::str::from_utf8(h.value)
                        .unwrap()
                        .parse::<usize>()
                        .unwrap()
                })
                .unwrap_or(0);
            if buf.len() >= head + len {
                assert!(
                    req.headers
                        .iter()
                        .any(|h| h.name.eq_ignore_ascii_case("host")),
                    "HTTP/1.1 needs Host"
                );
                return Seen {
                    method: req.method.unwrap().to_owned(),
                    path: req.path.unwrap().to_owned(),
                    body: buf[head..head + len].to_vec(),
                };
            }
        }
        assert!(n > 0, "the plugin closed mid-request");
    }
}

// ---------------------------------------------------------------------------------------------
// Running the plugin.

pub struct Run {
    pub exit: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?} / stderr {:?}",
                self.stdout, self.stderr
            )
        })
    }

    /// Asserts a CNI error object with `code` and returns it.
    pub fn error(&self, code: u64) -> Value {
        assert_eq!(
            self.exit, 1,
            "stdout {:?} stderr {:?}",
            self.stdout, self.stderr
        );
        let v = self.json();
        assert_eq!(v["code"], code, "{v}");
        assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(v["cniVersion"].is_string(), "{v}");
        v
    }

    pub fn silent_success(&self) {
        assert_eq!(
            (self.exit, self.stdout.as_str()),
            (0, ""),
            "stderr {:?}",
            self.stderr
        );
    }
}

pub fn plugin(vars: &[(&str, &str)], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_allot"))
        .env_clear()
        .envs(vars.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The plugin may exit before reading (VERSION at a terminal, early errors): ignore EPIPE.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    Run {
        exit: out.status.code().expect("killed by a signal"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

pub const CID: &str = "0123abcd";

pub fn add_env(netns: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", "ADD".into()),
        ("CNI_CONTAINERID", CID.into()),
        ("CNI_NETNS", netns.into()),
        ("CNI_IFNAME", "net1".into()),
        ("CNI_PATH", "/opt/cni/bin".into()),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=db-0;K8S_POD_INFRA_CONTAINER_ID=0123abcd;\
             K8S_POD_UID=uid-1;ALLOT_OWNER=StatefulSet/db"
                .into(),
        ),
    ]
}

pub fn with_command(cmd: &str) -> Vec<(&'static str, String)> {
    let mut env = add_env("/var/run/netns/pod");
    env[0].1 = cmd.into();
    env
}

pub fn run_env(env: &[(&'static str, String)], stdin: &str) -> Run {
    let vars: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    plugin(&vars, stdin)
}

pub fn without(env: &[(&'static str, String)], key: &str) -> Vec<(&'static str, String)> {
    env.iter().filter(|(k, _)| *k != key).cloned().collect()
}

pub fn set(
    env: &[(&'static str, String)],
    key: &'static str,
    value: &str,
) -> Vec<(&'static str, String)> {
    let mut e = without(env, key);
    e.push((key, value.into()));
    e
}

pub fn conf(version: &str, socket: &Path) -> String {
    conf_with(version, socket, json!({}))
}

pub fn journal_of(socket: &Path) -> PathBuf {
    socket
        .parent()
        .expect("socket in a directory")
        .join("journal")
}

/// A macvlan network config with an allot ipam section; `extra_ipam` fields are merged in.
pub fn conf_with(version: &str, socket: &Path, extra_ipam: Value) -> String {
    let mut ipam = json!({
        "type": "allot",
        "socket": socket,
        "default_ipv4_ippool": ["v4-a", "v4-b"],
        "default_ipv6_ippool": ["v6-a"],
        // Never the real /var/lib/allot/journal: next to the socket, in the test's directory.
        "journal": journal_of(socket),
    });
    for (k, v) in extra_ipam.as_object().unwrap() {
        ipam[k] = v.clone();
    }
    json!({
        "cniVersion": version,
        "name": "underlay",
        "type": "macvlan",
        "master": "eth1",
        "mode": "bridge",
        "ipam": ipam,
    })
    .to_string()
}

pub fn missing_socket() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-agent.sock");
    (dir, path)
}

/// A socket file with nobody listening: connect is refused.
pub fn dead_socket() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dead.sock");
    drop(UnixListener::bind(&path).unwrap());
    (dir, path)
}

pub fn dual_stack_result() -> IpamResult {
    IpamResult {
        ips: vec![
            IpConfig {
                address: "10.6.0.12/24".into(),
                gateway: Some("10.6.0.1".into()),
                pool: "v4-a".into(),
            },
            IpConfig {
                address: "fd00:6::12/64".into(),
                gateway: Some("fd00:6::1".into()),
                pool: "v6-a".into(),
            },
        ],
        routes: vec![RouteConfig {
            dst: "10.7.0.0/16".into(),
            gw: Some("10.6.0.254".into()),
        }],
        probe: None,
        preprobed: None,
        guest_addresses: Vec::new(),
    }
}

/// `DEVICE:INODE` of the test's network namespace (the plugin's, since it runs as a child).
pub fn own_netns() -> String {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata("/proc/self/ns/net").unwrap();
    format!("{}:{}", meta.dev(), meta.ino())
}
