//! Starting a container of the pod, and its probes.
//!
//! A container whose image the node has ([`crate::image`]) runs as a process. Any other
//! container is stood in for: nothing runs, an init container is reported completed at once
//! and a container running (and ready) until it is stopped.

use std::time::{Duration, Instant};

use super::{Message, Worker};
use crate::node::containers::{self, Launch, State, Terminated};
use crate::node::env::{self, EnvContext, FieldContext};
use crate::node::events::Kind;
use crate::node::probe::{self, ProbeKind, Target};

impl Worker {
    pub(super) async fn start(&mut self, i: usize) {
        let spec = self.all[i].spec.clone();
        let image_ref = spec.image.clone().unwrap_or_default();
        let wanted = crate::image::normalize(&image_ref);
        let image = self
            .node
            .images
            .iter()
            .find(|im| im.reference == wanted)
            .cloned();
        let name = spec.name.clone();
        let host_network = self.host_network();
        let hostname = if host_network {
            self.node.id.name.clone()
        } else {
            self.pod
                .spec
                .as_ref()
                .and_then(|s| s.hostname.clone())
                .unwrap_or_else(|| self.record.name.clone())
        };
        let resolved = match &image {
            Some(image) => {
                let host_ips = self.node.host_ips.clone();
                let pod_ips = self.pod_ips.clone();
                let ctx = EnvContext {
                    fields: FieldContext {
                        node_name: &self.node.id.name,
                        host_ips: &host_ips,
                        pod_ips: &pod_ips,
                    },
                    objects: &self.node.objects,
                    api_host: &self.node.api_host,
                    api_port: self.node.api_port,
                    hostname: &hostname,
                };
                let env = env::resolve(&ctx, &self.pod, &spec, &image.config.env).await;
                let identity = containers::identity(&self.pod, &spec, Some(image));
                match (env, identity) {
                    (Ok(env), Ok(id)) => Some((env, id)),
                    (Err(e), _) | (_, Err(e)) => {
                        let message = format!("{e:#}");
                        let c = &mut self.all[i];
                        c.state = State::Waiting {
                            reason: "CreateContainerConfigError".into(),
                            message: Some(message.clone()),
                        };
                        // The kubelet tries again at its next sync of the pod.
                        c.next_start = Some(Instant::now() + Duration::from_secs(10));
                        self.event(
                            Some(&name),
                            Kind::Warning,
                            "Failed",
                            &format!("Error: {message}"),
                        )
                        .await;
                        return;
                    }
                }
            }
            None => None,
        };
        let generation = {
            let c = &mut self.all[i];
            if c.generation > 0 {
                c.restarts += 1;
            }
            c.generation += 1;
            c.container_id = Some(containers::new_id());
            c.next_start = None;
            c.kill_at = None;
            c.ready = false;
            c.started = false;
            c.generation
        };
        self.event(
            Some(&name),
            Kind::Normal,
            "Pulled",
            &format!("Container image {image_ref:?} already present on machine"),
        )
        .await;
        let (Some(image), Some(((env, known), (uid, gid, groups)))) = (image, resolved) else {
            let now = jiff::Timestamp::now();
            let c = &mut self.all[i];
            c.state = if c.init {
                c.ready = true;
                State::Terminated(Terminated {
                    exit_code: 0,
                    signal: None,
                    reason: "Completed".into(),
                    message: None,
                    started_at: Some(now),
                    finished_at: now,
                    container_id: c.container_id.clone(),
                })
            } else {
                c.started = true;
                c.ready = true;
                State::Running {
                    started_at: now,
                    pid: None,
                }
            };
            self.event(
                Some(&name),
                Kind::Normal,
                "Created",
                &format!("Created container: {name}"),
            )
            .await;
            self.event(
                Some(&name),
                Kind::Normal,
                "Started",
                &format!("Started container {name}"),
            )
            .await;
            return;
        };
        let argv = env::command_line(&spec, &image.config.entrypoint, &image.config.cmd, &known);
        let log_dir = self.node.fs.root.join(format!(
            "var/log/pods/{}_{}_{}",
            self.record.namespace, self.record.name, self.uid
        ));
        let _ = std::fs::create_dir_all(&log_dir);
        let log = log_dir.join(format!("{name}.log"));
        let containers_dir = self.dir.join("containers").join(&name);
        let netns = self.sandbox_netns();
        let launch = Launch {
            helper: &self.node.helper,
            pod: &self.pod,
            container: &spec,
            image: &image,
            volumes: &self.volumes.sources,
            netns: netns.as_deref(),
            hostname: &hostname,
            run_dir: containers_dir.join(generation.to_string()),
            log: &log,
            argv,
            env: &env,
            uid,
            gid,
        };
        match containers::launch(launch, groups).await {
            Ok(mut child) => {
                let pid = child.id().unwrap_or(0);
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let status = child.wait().await.ok();
                    let _ = tx
                        .send(Message::Exited {
                            container: i,
                            generation,
                            status,
                        })
                        .await;
                });
                let restarts = {
                    let c = &mut self.all[i];
                    c.state = State::Running {
                        started_at: jiff::Timestamp::now(),
                        pid: Some(pid),
                    };
                    c.uid = uid;
                    c.gid = gid;
                    c.env = env;
                    c.restarts
                };
                self.note_process(&name, pid, restarts);
                // The previous run's layers are of no use any more.
                if generation > 1 {
                    let _ =
                        std::fs::remove_dir_all(containers_dir.join((generation - 1).to_string()));
                }
                self.event(
                    Some(&name),
                    Kind::Normal,
                    "Created",
                    &format!("Created container: {name}"),
                )
                .await;
                self.event(
                    Some(&name),
                    Kind::Normal,
                    "Started",
                    &format!("Started container {name}"),
                )
                .await;
                self.start_probes(i, true);
            }
            Err(message) => {
                self.event(
                    Some(&name),
                    Kind::Warning,
                    "Failed",
                    &format!("Error: {message}"),
                )
                .await;
                let t = Terminated {
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    message: Some(message),
                    started_at: None,
                    finished_at: jiff::Timestamp::now(),
                    container_id: self.all[i].container_id.clone(),
                };
                self.exited(i, t).await;
            }
        }
    }

    fn sandbox_netns(&self) -> Option<std::path::PathBuf> {
        self.sandbox
            .as_ref()
            .and_then(|s| s.netns.as_deref().map(crate::net::netns_path))
    }

    /// Starts container `i`'s probes: after a start (`first`) its startup probe if it has
    /// one, else (and after the startup probe passed) its liveness and readiness probes. An
    /// init container has none; a container without a readiness probe is ready once started.
    pub(super) fn start_probes(&mut self, i: usize, first: bool) {
        let pod = self.pod.clone();
        let pod_ip = self
            .sandbox
            .as_ref()
            .and_then(|s| s.ips.first().copied())
            .or_else(|| self.pod_ips.first().copied());
        let helper = self.node.helper.clone();
        let recorder = self.node.recorder.clone();
        let tx = self.tx.clone();
        let c = &mut self.all[i];
        let Some(pid) = c.pid() else { return };
        if c.init {
            c.started = true;
            return;
        }
        let target = Target {
            pod,
            container_name: c.spec.name.clone(),
            container: i,
            generation: c.generation,
            pod_ip,
            ports: c.spec.ports.clone().unwrap_or_default(),
            pid,
            uid: c.uid,
            gid: c.gid,
            cwd: c.spec.working_dir.clone().unwrap_or_else(|| "/".into()),
            env: c.env.clone(),
            helper,
        };
        let (startup, liveness, readiness) = (
            c.spec.startup_probe.clone(),
            c.spec.liveness_probe.clone(),
            c.spec.readiness_probe.clone(),
        );
        let spawn = |kind: ProbeKind, p: k8s_openapi::api::core::v1::Probe| {
            tokio::spawn(probe::run(
                kind,
                p,
                target.clone(),
                tx.clone(),
                recorder.clone(),
            ))
        };
        if first && let Some(p) = startup {
            c.probes.push(spawn(ProbeKind::Startup, p));
            c.started = false;
            return;
        }
        if let Some(p) = liveness {
            c.probes.push(spawn(ProbeKind::Liveness, p));
        }
        match readiness {
            Some(p) => c.probes.push(spawn(ProbeKind::Readiness, p)),
            None => c.ready = true,
        }
        c.started = true;
    }
}
