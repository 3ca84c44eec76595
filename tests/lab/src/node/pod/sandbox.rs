//! The pod's network sandbox: made (a namespace and CNI ADD, or the node's namespace for
//! hostNetwork), torn down (CNI DEL with the cached result, the namespace removed), and
//! picked up again from the pod's record after the stand-in restarted.

use std::time::{Duration, Instant};

use super::{Sandbox, Worker};
use crate::node::cni::{CniError, PodRef};
use crate::node::events::Kind;
use crate::node::state::PodRecord;

impl Worker {
    /// Picks up what a previous stand-in left: its processes are killed (their containers
    /// start again, as restarts), its sandbox is kept.
    pub(super) fn restore(&mut self) {
        let Some(record) = PodRecord::load(&self.dir) else {
            return;
        };
        for p in &record.processes {
            if crate::node::containers::start_ticks(p.pid) == Some(p.start_ticks) {
                // SAFETY: kill(2) of the process group the container leads.
                unsafe {
                    libc::kill(-(p.pid as libc::pid_t), libc::SIGKILL);
                }
            }
        }
        for c in &mut self.all {
            if let Some(n) = record.restarts.get(&c.spec.name) {
                c.restarts = *n;
                // Its next start is a restart.
                c.generation = 1;
            }
        }
        if let Some(id) = &record.sandbox_id {
            let attachment = self.node.cni.cached(id);
            let alive = match &record.netns {
                Some(ns) => crate::net::netns_path(ns).exists(),
                None => true,
            };
            if alive {
                let ips = match (&record.netns, &attachment) {
                    (None, _) => self.node.host_ips.clone(),
                    (Some(_), Some(a)) => a.pod_ips(),
                    (Some(_), None) => Vec::new(),
                };
                self.pod_ips = ips.clone();
                self.sandbox = Some(Sandbox {
                    id: id.clone(),
                    netns: record.netns.clone(),
                    ips,
                    attachment,
                });
            }
        }
        self.record = PodRecord {
            processes: Vec::new(),
            ..record
        };
        self.record.save(&self.dir);
    }

    /// Creates the sandbox; false (with an event and a retry time) when it cannot yet.
    pub(super) async fn create_sandbox(&mut self) -> bool {
        let id = crate::node::containers::new_id();
        if self.host_network() {
            self.record.sandbox_id = Some(id.clone());
            self.record.save(&self.dir);
            self.pod_ips = self.node.host_ips.clone();
            self.sandbox = Some(Sandbox {
                id,
                netns: None,
                ips: self.node.host_ips.clone(),
                attachment: None,
            });
            return true;
        }
        // The runtime's network must be ready before a sandbox is made at all.
        if let Err(e) = self.node.cni.network() {
            self.event(
                None,
                Kind::Warning,
                "NetworkNotReady",
                &format!("network is not ready: {e}"),
            )
            .await;
            self.retry_at = Some(Instant::now() + Duration::from_secs(2));
            return false;
        }
        let netns = format!("{}{}", crate::net::NETNS_PREFIX, &id[..16]);
        let created = crate::net::ip(&["netns", "add", &netns])
            .and_then(|_| crate::net::ip(&["-n", &netns, "link", "set", "lo", "up"]));
        if let Err(e) = created {
            self.event(
                None,
                Kind::Warning,
                "FailedCreatePodSandBox",
                &format!("{e:#}"),
            )
            .await;
            self.retry_later();
            return false;
        }
        self.record.sandbox_id = Some(id.clone());
        self.record.netns = Some(netns.clone());
        self.record.save(&self.dir);
        let pod_ref = PodRef {
            namespace: self.record.namespace.clone(),
            name: self.record.name.clone(),
            uid: self.uid.clone(),
        };
        match self
            .node
            .cni
            .add(&id, &crate::net::netns_path(&netns), &pod_ref)
            .await
        {
            Ok(attachment) => {
                let ips = attachment.pod_ips();
                self.pod_ips = ips.clone();
                self.retry_backoff = Duration::from_secs(1);
                self.sandbox = Some(Sandbox {
                    id,
                    netns: Some(netns),
                    ips,
                    attachment: Some(attachment),
                });
                true
            }
            Err(e) => {
                let _ = crate::net::ip(&["netns", "del", &netns]);
                self.record.sandbox_id = None;
                self.record.netns = None;
                self.record.save(&self.dir);
                let reason = match e {
                    CniError::NotReady(_) => "NetworkNotReady",
                    CniError::Failed(_) => "FailedCreatePodSandBox",
                };
                let message = match &e {
                    CniError::NotReady(_) => format!("network is not ready: {e}"),
                    CniError::Failed(_) => format!("Failed to create pod sandbox: {e}"),
                };
                self.event(None, Kind::Warning, reason, &message).await;
                self.retry_later();
                false
            }
        }
    }

    /// CNI DEL and the namespace's removal; the sandbox is forgotten once DEL succeeded.
    pub(super) async fn teardown_sandbox(&mut self) -> anyhow::Result<()> {
        let Some(sandbox) = &self.sandbox else {
            return Ok(());
        };
        if let Some(netns) = &sandbox.netns {
            let attachment = sandbox
                .attachment
                .clone()
                .or_else(|| self.node.cni.cached(&sandbox.id));
            if let Some(a) = attachment {
                self.node.cni.del(&a).await.map_err(|e| {
                    anyhow::anyhow!(
                        "failed to destroy network for sandbox {:?}: {e:#}",
                        sandbox.id
                    )
                })?;
            }
            let _ = crate::net::ip(&["netns", "del", netns]);
        }
        self.sandbox = None;
        self.record.sandbox_id = None;
        self.record.netns = None;
        self.record.save(&self.dir);
        Ok(())
    }
}
