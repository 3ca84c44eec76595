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
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

impl EtcdServer {
    /// Starts a fresh, empty etcd and waits until it is healthy.
    pub fn start() -> EtcdServer {
        let dir = std::env::temp_dir().join(format!(
            "allot-etcd-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).expect("etcd test directory");
        let mut server = EtcdServer {
            dir,
            client: free_port(),
            peer: free_port(),
            child: None,
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
        let client = format!("http://{}", self.client);
        let peer = format!("http://{}", self.peer);
        let log = std::fs::File::create(self.dir.join("etcd.log")).expect("etcd log");
        let child = Command::new("etcd")
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
