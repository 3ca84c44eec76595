//! Pod networks through the node's CNI configuration, as containerd's CRI plugin drives them
//! (CNI specification 1.1, "Execution protocol" and "Network configuration lists"): the first
//! `*.conflist`, `*.conf` or `*.json` of `/etc/cni/net.d` in name order; its plugins called in
//! turn for ADD, each given the previous one's result as `prevResult`, and in reverse order for
//! DEL; plugins found in `/opt/cni/bin` and run on the node (see [`super::hostfs`]).
//!
//! Each attachment's configuration and result are cached under the node's `/var/lib/cni/results`
//! (as libcni caches them), so DEL uses the configuration the pod was added with and its result
//! as `prevResult`, also after the stand-in restarted or the configuration changed.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

use super::hostfs::NodeFs;

/// How long one plugin may run.
const PLUGIN_TIMEOUT: Duration = Duration::from_secs(120);
/// The plugin directory of the node (CNI_PATH).
const CNI_PATH: &str = "/opt/cni/bin";
/// The interface every pod gets.
pub const IFNAME: &str = "eth0";

/// Where, under the node's root, each ADD's duration is noted (one JSON line per ADD, see
/// [`Cni::note_add`]).
pub const ADD_LOG: &str = "var/log/cni-add.jsonl";

/// When an ADD asked for a slot and began, for [`Cni::note_add`].
struct AddTiming<'a> {
    pod: &'a PodRef,
    container_id: &'a str,
    waited: Duration,
    started: Instant,
}

/// Why a pod's network cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// No configuration (yet): a kubelet reports the runtime's network as not ready.
    #[error(
        "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: {0}"
    )]
    NotReady(String),
    /// A plugin failed.
    #[error("{0}")]
    Failed(String),
}

/// The arguments a runtime passes about a pod (CNI_ARGS).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// What is cached per attachment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attachment {
    pub container_id: String,
    pub netns: PathBuf,
    pub pod: PodRef,
    /// The network configuration list the pod was added with.
    pub network: Value,
    /// The last plugin's ADD result.
    pub result: Value,
}

impl Attachment {
    /// The pod's addresses from the result: those of the sandbox's `eth0` (by the result's
    /// interface indexes), else all of them; one per family, IPv4 first (a Pod holds at most
    /// one address of each family).
    pub fn pod_ips(&self) -> Vec<IpAddr> {
        let interfaces = self.result["interfaces"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ips = self.result["ips"].as_array().cloned().unwrap_or_default();
        let address = |ip: &Value| -> Option<IpAddr> {
            ip["address"].as_str()?.split('/').next()?.parse().ok()
        };
        let on_eth0: Vec<IpAddr> = ips
            .iter()
            .filter(|ip| {
                ip["interface"]
                    .as_u64()
                    .and_then(|i| interfaces.get(i as usize))
                    .is_some_and(|iface| {
                        iface["name"] == IFNAME
                            && iface["sandbox"].as_str().is_some_and(|s| !s.is_empty())
                    })
            })
            .filter_map(address)
            .collect();
        let all = if on_eth0.is_empty() {
            ips.iter().filter_map(address).collect()
        } else {
            on_eth0
        };
        let v4 = all.iter().find(|ip| ip.is_ipv4());
        let v6 = all.iter().find(|ip| ip.is_ipv6());
        v4.into_iter().chain(v6).copied().collect()
    }
}

/// The node's CNI: configuration directory, plugins, cache, and a bound on concurrent calls.
pub struct Cni {
    fs: Arc<NodeFs>,
    conf_dir: PathBuf,
    bin_dir: PathBuf,
    cache_dir: PathBuf,
    slots: Semaphore,
}

impl Cni {
    pub fn new(fs: Arc<NodeFs>, parallel: usize) -> Cni {
        Cni {
            conf_dir: fs.root.join("etc/cni/net.d"),
            bin_dir: fs.root.join("opt/cni/bin"),
            cache_dir: fs.root.join("var/lib/cni/results"),
            fs,
            slots: Semaphore::new(parallel.max(1)),
        }
    }

    /// The network configuration list in use, as containerd picks it; NotReady when none.
    pub fn network(&self) -> Result<Value, CniError> {
        let mut files: Vec<PathBuf> = fs::read_dir(&self.conf_dir)
            .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_default();
        files.retain(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e == "conflist" || e == "conf" || e == "json")
        });
        files.sort();
        let Some(first) = files.first() else {
            return Err(CniError::NotReady("cni plugin not initialized".into()));
        };
        let text = fs::read(first)
            .map_err(|e| CniError::NotReady(format!("reading {}: {e}", self.node_path(first))))?;
        let value: Value = serde_json::from_slice(&text)
            .map_err(|e| CniError::NotReady(format!("parsing {}: {e}", self.node_path(first))))?;
        let list = if first.extension().is_some_and(|e| e == "conflist") {
            value
        } else {
            // A single plugin's configuration is a list of one (libcni ConfListFromConf).
            json!({
                "cniVersion": value["cniVersion"],
                "name": value["name"],
                "plugins": [value],
            })
        };
        if list["plugins"].as_array().is_none_or(|p| p.is_empty()) {
            return Err(CniError::NotReady(format!(
                "{}: no plugins",
                self.node_path(first)
            )));
        }
        Ok(list)
    }

    fn node_path(&self, path: &Path) -> String {
        path.strip_prefix(&self.fs.root)
            .map(|p| format!("/{}", p.display()))
            .unwrap_or_else(|_| path.display().to_string())
    }

    fn cache_path(&self, network: &Value, container_id: &str) -> PathBuf {
        let name = network["name"].as_str().unwrap_or("network");
        self.cache_dir
            .join(format!("{name}-{container_id}-{IFNAME}"))
    }

    /// ADD of the pod's sandbox `container_id` with namespace `netns`: returns the attachment
    /// (also cached). On a plugin's failure the list is deleted again (as containerd tears
    /// down a sandbox whose network setup failed).
    pub async fn add(
        &self,
        container_id: &str,
        netns: &Path,
        pod: &PodRef,
    ) -> Result<Attachment, CniError> {
        let network = self.network()?;
        let asked = Instant::now();
        let _slot = self
            .slots
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let timing = AddTiming {
            pod,
            container_id,
            waited: asked.elapsed(),
            started: Instant::now(),
        };
        let plugins = network["plugins"].as_array().cloned().unwrap_or_default();
        let mut prev: Option<Value> = None;
        for plugin in &plugins {
            match self
                .call(
                    "ADD",
                    &network,
                    plugin,
                    prev.as_ref(),
                    container_id,
                    netns,
                    pod,
                )
                .await
            {
                Ok(result) => prev = Some(result),
                Err(e) => {
                    let attachment = Attachment {
                        container_id: container_id.into(),
                        netns: netns.into(),
                        pod: pod.clone(),
                        network: network.clone(),
                        result: prev.unwrap_or(Value::Null),
                    };
                    self.note_add(&timing, Some(&format!("{e:#}")));
                    if let Err(del) = self.del_locked(&attachment).await {
                        tracing::warn!("{}: DEL after a failed ADD: {del:#}", pod.name);
                    }
                    return Err(CniError::Failed(format!(
                        "failed to setup network for sandbox {container_id:?}: {e:#}"
                    )));
                }
            }
        }
        self.note_add(&timing, None);
        let attachment = Attachment {
            container_id: container_id.into(),
            netns: netns.into(),
            pod: pod.clone(),
            network: network.clone(),
            result: prev.unwrap_or(Value::Null),
        };
        let path = self.cache_path(&network, container_id);
        let write = fs::create_dir_all(&self.cache_dir).and_then(|()| {
            fs::write(
                &path,
                serde_json::to_vec(&attachment).expect("serializable"),
            )
        });
        if let Err(e) = write {
            tracing::warn!("caching {}: {e}", path.display());
        }
        Ok(attachment)
    }

    /// Appends one JSON line to the node's [`ADD_LOG`]: the pod, how long the ADD waited for
    /// a slot and how long the plugin chain took (what containerd's CNI call measures), and
    /// the error of one that failed. For benchmarks (`cargo bench -p allot-e2e --bench
    /// cluster_scale`).
    fn note_add(&self, timing: &AddTiming<'_>, error: Option<&str>) {
        use std::io::Write;
        let line = json!({
            "at": jiff::Timestamp::now().to_string(),
            "namespace": timing.pod.namespace,
            "pod": timing.pod.name,
            "uid": timing.pod.uid,
            "container": timing.container_id,
            "wait_ms": timing.waited.as_secs_f64() * 1e3,
            "add_ms": timing.started.elapsed().as_secs_f64() * 1e3,
            "ok": error.is_none(),
            "error": error,
        });
        let path = self.fs.root.join(ADD_LOG);
        let written = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            tracing::warn!("writing {}: {e}", path.display());
        }
    }

    /// DEL of an attachment (its cached configuration, its result as `prevResult`); removes
    /// the cache entry once every plugin succeeded.
    pub async fn del(&self, attachment: &Attachment) -> Result<()> {
        let _slot = self
            .slots
            .acquire()
            .await
            .expect("the semaphore is never closed");
        self.del_locked(attachment).await?;
        let _ = fs::remove_file(self.cache_path(&attachment.network, &attachment.container_id));
        Ok(())
    }

    async fn del_locked(&self, a: &Attachment) -> Result<()> {
        let plugins = a.network["plugins"].as_array().cloned().unwrap_or_default();
        let prev = (!a.result.is_null()).then_some(&a.result);
        let mut errors = Vec::new();
        for plugin in plugins.iter().rev() {
            if let Err(e) = self
                .call(
                    "DEL",
                    &a.network,
                    plugin,
                    prev,
                    &a.container_id,
                    &a.netns,
                    &a.pod,
                )
                .await
            {
                errors.push(format!("{e:#}"));
            }
        }
        if !errors.is_empty() {
            bail!("{}", errors.join("; "));
        }
        Ok(())
    }

    /// The cached attachment of sandbox `container_id`, if any (any network name).
    pub fn cached(&self, container_id: &str) -> Option<Attachment> {
        let entries = fs::read_dir(&self.cache_dir).ok()?;
        entries
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .ends_with(&format!("-{container_id}-{IFNAME}"))
            })
            .find_map(|e| serde_json::from_slice(&fs::read(e.path()).ok()?).ok())
    }

    #[allow(clippy::too_many_arguments)]
    async fn call(
        &self,
        command: &str,
        network: &Value,
        plugin: &Value,
        prev: Option<&Value>,
        container_id: &str,
        netns: &Path,
        pod: &PodRef,
    ) -> Result<Value> {
        let kind = plugin["type"]
            .as_str()
            .context("a plugin without \"type\"")?;
        if kind.contains('/') || !self.bin_dir.join(kind).exists() {
            bail!("plugin type={kind:?}: failed to find plugin {kind:?} in path [{CNI_PATH}]");
        }
        let mut conf = plugin.clone();
        conf["cniVersion"] = network["cniVersion"].clone();
        conf["name"] = network["name"].clone();
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            pod.namespace, pod.name, container_id, pod.uid
        );
        let mut cmd = self.fs.command(&Path::new(CNI_PATH).join(kind));
        cmd.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", IFNAME)
            .env("CNI_PATH", CNI_PATH)
            .env("CNI_ARGS", &args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("plugin type={kind:?}: starting it"))?;
        let mut stdin = child.stdin.take().expect("piped");
        let input = serde_json::to_vec(&conf)?;
        let output = tokio::time::timeout(PLUGIN_TIMEOUT, async {
            stdin.write_all(&input).await?;
            drop(stdin);
            child.wait_with_output().await
        })
        .await
        .with_context(|| {
            format!("plugin type={kind:?} ({command}): no answer within {PLUGIN_TIMEOUT:?}")
        })??;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            // The specification's error object: {"code", "msg", "details"}.
            let message = match serde_json::from_str::<Value>(&stdout) {
                Ok(err) if err["msg"].is_string() => {
                    let details = err["details"].as_str().unwrap_or_default();
                    let msg = err["msg"].as_str().unwrap_or_default();
                    if details.is_empty() {
                        msg.to_string()
                    } else {
                        format!("{msg}: {details}")
                    }
                }
                _ => format!(
                    "{} {}",
                    stdout.trim(),
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            };
            bail!(
                "plugin type={kind:?} failed ({}): {message}",
                command.to_lowercase()
            );
        }
        if command == "ADD" {
            serde_json::from_str(&stdout).with_context(|| {
                format!("plugin type={kind:?}: its ADD result is not JSON: {stdout:?}")
            })
        } else {
            Ok(Value::Null)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(result: Value) -> Attachment {
        Attachment {
            container_id: "c".into(),
            netns: "/run/netns/x".into(),
            pod: PodRef {
                namespace: "n".into(),
                name: "p".into(),
                uid: "u".into(),
            },
            network: json!({}),
            result,
        }
    }

    #[test]
    fn pod_ips_are_the_sandbox_eth0_addresses_one_per_family() {
        let a = attachment(json!({
            "interfaces": [{"name": "cni0"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
            "ips": [
                {"address": "10.0.0.1/24", "interface": 0},
                {"address": "2001:db8::5/64", "interface": 1},
                {"address": "203.0.113.7/24", "interface": 1},
                {"address": "203.0.113.8/24", "interface": 1},
            ],
        }));
        let ips: Vec<String> = a.pod_ips().iter().map(|i| i.to_string()).collect();
        assert_eq!(ips, ["203.0.113.7", "2001:db8::5"]);
        let bare = attachment(json!({"ips": [{"address": "192.0.2.9/24"}]}));
        assert_eq!(bare.pod_ips()[0].to_string(), "192.0.2.9");
    }
}
