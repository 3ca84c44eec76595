//! A real etcd for tests: one member on loopback ports of its own, in a directory of its own,
//! with fast elections (healthy in about 0.1 s). Stopped and removed on drop.
//!
//! Needs Debian's `etcd-server` (`scripts/setup.sh` installs it).

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or stopped, between [`EtcdServer::stop`] and [`EtcdServer::start_again`]) etcd.
pub struct EtcdServer {
    dir: PathBuf,
    client: SocketAddr,
    peer: SocketAddr,
    child: Option<Child>,
    /// Serve clients over TLS with these certificates, asking for client certificates.
    tls: Option<TestPki>,
}

/// Certificates for a TLS etcd, made with the openssl command: a CA, a server certificate for
/// 127.0.0.1, and a client certificate, all signed by the CA.
#[derive(Clone, Debug)]
pub struct TestPki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TestPki {
    pub fn generate(dir: &Path) -> TestPki {
        std::fs::create_dir_all(dir).expect("pki directory");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("openssl (Debian's openssl package)");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=allot-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        for (name, ext) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth",
            ),
            ("client", "extendedKeyUsage=clientAuth"),
        ] {
            std::fs::write(dir.join(format!("{name}.ext")), ext).expect("extension file");
            run(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN=allot-test-{name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ]);
        }
        TestPki {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.pem"),
            client_key: dir.join("client.key"),
        }
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

impl EtcdServer {
    /// Starts a fresh, empty etcd and waits until it is healthy.
    pub fn start() -> EtcdServer {
        Self::start_with(false)
    }

    /// Starts a fresh etcd that serves clients over TLS only and requires a client certificate
    /// signed by its CA ([`EtcdServer::pki`]).
    pub fn start_tls() -> EtcdServer {
        Self::start_with(true)
    }

    /// The certificates of a TLS etcd.
    pub fn pki(&self) -> Option<&TestPki> {
        self.tls.as_ref()
    }

    fn start_with(tls: bool) -> EtcdServer {
        let dir = std::env::temp_dir().join(format!(
            "allot-etcd-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).expect("etcd test directory");
        let tls = tls.then(|| TestPki::generate(&dir.join("pki")));
        let mut server = EtcdServer {
            dir,
            client: free_port(),
            peer: free_port(),
            child: None,
            tls,
        };
        server.start_again();
        server
    }

    /// `HOST:PORT` of the client URL.
    pub fn endpoint(&self) -> String {
        self.client.to_string()
    }

    /// `etcd://HOST:PORT`, as `--store` takes it.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.client)
    }

    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// Kills etcd (SIGKILL: a crash, not a shutdown). Its data stays for [`Self::start_again`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data, and waits until it is healthy.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "etcd is already running");
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://{}", self.client);
        let peer = format!("http://{}", self.peer);
        let log = std::fs::File::create(self.dir.join("etcd.log")).expect("etcd log");
        let mut command = Command::new("etcd");
        if let Some(pki) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&pki.server_cert)
                .arg("--key-file")
                .arg(&pki.server_key)
                .arg("--trusted-ca-file")
                .arg(&pki.ca)
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", "test", "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run etcd ({e}): install Debian's etcd-server (scripts/setup.sh)")
            });
        self.child = Some(child);
        self.wait_healthy();
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.healthy() {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "etcd exited ({status}) before it was healthy: {}",
                    std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "etcd on {} was not healthy within 20 s",
                self.client
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// etcd's `/health`: a member that has a leader answers `"health":"true"`.
    fn healthy(&self) -> bool {
        if self.tls.is_some() {
            return self
                .etcdctl_command(&["endpoint", "health", "--command-timeout", "1s"])
                .output()
                .is_ok_and(|o| o.status.success());
        }
        let Ok(mut s) = TcpStream::connect_timeout(&self.client, Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let request = format!("GET /health HTTP/1.0\r\nHost: {}\r\n\r\n", self.client);
        let mut answer = String::new();
        s.write_all(request.as_bytes()).is_ok()
            && s.read_to_string(&mut answer).is_ok()
            && answer.contains("\"health\":\"true\"")
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TCP proxy on loopback in front of etcd, which a test can cut (every connection closed,
/// new ones refused) and restore: a network partition between one client and etcd while
/// others keep talking to it.
pub struct CutProxy {
    listen: SocketAddr,
    state: std::sync::Arc<ProxyState>,
}

#[derive(Default)]
struct ProxyState {
    cut: std::sync::atomic::AtomicBool,
    /// Bumped at each cut: connections of an older generation close themselves.
    generation: std::sync::atomic::AtomicU64,
    /// Forwarding threads running.
    active: std::sync::atomic::AtomicUsize,
}

impl CutProxy {
    pub fn start(target: SocketAddr) -> CutProxy {
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        let listen = listener.local_addr().expect("proxy address");
        let state = std::sync::Arc::new(ProxyState::default());
        let shared = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if shared.cut.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let generation = shared.generation.load(Ordering::SeqCst);
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    let (Ok(mut from), Ok(mut to)) = (from, to) else {
                        continue;
                    };
                    let state = shared.clone();
                    state.active.fetch_add(1, Ordering::SeqCst);
                    std::thread::spawn(move || {
                        let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            if state.generation.load(Ordering::SeqCst) != generation {
                                break;
                            }
                            match from.read(&mut buf) {
                                Ok(0) => break,
                                Ok(n) => {
                                    if to.write_all(&buf[..n]).is_err() {
                                        break;
                                    }
                                }
                                Err(e)
                                    if matches!(
                                        e.kind(),
                                        std::io::ErrorKind::WouldBlock
                                            | std::io::ErrorKind::TimedOut
                                    ) => {}
                                Err(_) => break,
                            }
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        state.active.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            }
        });
        CutProxy { listen, state }
    }

    /// `etcd://…` through the proxy.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.listen)
    }

    /// Closes every connection and refuses new ones until [`CutProxy::restore`]; returns once
    /// nothing more is forwarded.
    pub fn cut(&self) {
        use std::sync::atomic::Ordering;
        self.state.cut.store(true, Ordering::SeqCst);
        self.state.generation.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.state.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Closes every connection (mid-request, whatever was in flight) but accepts new ones.
    pub fn reset(&self) {
        self.state
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.state
            .cut
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl EtcdServer {
    /// The client address, for a [`CutProxy`].
    pub fn client_addr(&self) -> SocketAddr {
        self.client
    }

    /// etcdctl (API 3) on this etcd, with its certificates when it serves TLS.
    fn etcdctl_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("etcdctl");
        command.env("ETCDCTL_API", "3");
        match &self.tls {
            Some(pki) => {
                command
                    .args(["--endpoints", &format!("https://{}", self.client)])
                    .arg("--cacert")
                    .arg(&pki.ca)
                    .arg("--cert")
                    .arg(&pki.client_cert)
                    .arg("--key")
                    .arg(&pki.client_key);
            }
            None => {
                command.args(["--endpoints", &self.endpoint()]);
            }
        }
        command.args(args);
        command
    }

    /// Runs etcdctl on this etcd and returns what it printed; panics when it fails. Tests read
    /// etcd with it to check what is stored, not what allot says.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let out = self
            .etcdctl_command(args)
            .output()
            .expect("etcdctl (Debian's etcd-client)");
        assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The keys under `prefix`, as etcdctl lists them.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.etcdctl(&["get", "--prefix", prefix, "--keys-only"])
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// How many keys are under `prefix` (a range's count is every key in it, whatever the
    /// limit).
    pub fn count(&self, prefix: &str) -> u64 {
        let json = self.etcdctl(&["get", "--prefix", prefix, "--limit", "1", "-w", "json"]);
        json_number(&json, "count").unwrap_or(0)
    }

    /// Compacts etcd's history up to its current revision (what `--auto-compaction` does).
    pub fn compact(&self) {
        let json = self.etcdctl(&["get", "x", "-w", "json"]);
        let revision = json_number(&json, "revision").expect("etcdctl reports the revision");
        self.etcdctl(&["compact", &revision.to_string()]);
    }
}

/// The first number after `"field":` in etcdctl's JSON.
fn json_number(json: &str, field: &str) -> Option<u64> {
    let digits: String = json
        .split(&format!("\"{field}\":"))
        .nth(1)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
