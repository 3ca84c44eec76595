//! Debian's `docker-registry` (distribution 2.8) on a loopback port, with a config file and
//! storage of its own in a temporary directory; stopped on drop.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry and waits until `/v2/` answers. Panics (with what to install) when
    /// Debian's docker-registry is missing: `scripts/setup.sh` installs it.
    pub fn start() -> Registry {
        assert!(
            Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} is missing: run scripts/setup.sh (Debian package docker-registry)"
        );
        let dir = tempfile::Builder::new()
            .prefix("allot-e2e-registry-")
            .tempdir()
            .unwrap();
        // A free port: bind, read it, release it (the registry binds it a moment later).
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {REGISTRY_BIN}: {e}"));
        let mut registry = Registry { child, addr, dir };
        registry.wait_ready();
        registry
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "docker-registry exited ({status}): {}",
                    std::fs::read_to_string(self.dir.path().join("registry.log"))
                        .unwrap_or_default()
                );
            }
            if self.get("/v2/").is_some_and(|code| code == 200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer on {} within 20 s: {}",
                self.addr,
                std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The status code of a GET, or None when nothing answers.
    fn get(&self, path: &str) -> Option<u16> {
        let mut s = TcpStream::connect(&self.addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .ok()?;
        let mut head = String::new();
        s.read_to_string(&mut head).ok()?;
        head.split_whitespace().nth(1)?.parse().ok()
    }

    /// The file holding blob `digest` (`sha256:HEX`) in the registry's storage, for tests that
    /// tamper with what the registry serves.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
