//! Pod volumes, as a kubelet materializes them under `/var/lib/kubelet/pods/<uid>/volumes`:
//! `hostPath` (the node's path), `emptyDir`, `configMap`, `secret`, `downwardAPI` and
//! `projected` (ServiceAccount tokens from the TokenRequest API, bound to the pod, refreshed
//! after 80 % of their lifetime as the kubelet's token manager does; ConfigMaps; Secrets; the
//! downward API). Files are written as the kubelet's atomic writer writes them: a timestamped
//! directory, `..data` pointing at it, and each top-level name a link through `..data`, so a
//! reader never sees half an update.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount, Volume,
};
use kube::api::{Api, PostParams};

use super::env::{FieldContext, field_value};
use super::hostfs::NodeFs;

/// A file's content and mode.
type Files = BTreeMap<String, (Vec<u8>, u32)>;

/// How often mounted ConfigMaps, Secrets and the downward API are written again: the kubelet
/// propagates an update to a mounted volume within about a minute ("Mounted ConfigMaps are
/// updated automatically").
const RESYNC: Duration = Duration::from_secs(60);

/// How long a ConfigMap or Secret read is reused (the kubelet's cache-based manager uses a TTL
/// of the same order before it reads an object again).
const OBJECT_TTL: Duration = Duration::from_secs(30);

/// ConfigMaps and Secrets, read through the node's credentials (the Node authorizer lets a
/// node read those its pods reference), cached briefly.
/// (is a Secret, namespace, name) → (read at, data; None when it does not exist).
type Objects = HashMap<(bool, String, String), (Instant, Option<BTreeMap<String, Vec<u8>>>)>;

pub struct ObjectCache {
    client: kube::Client,
    map: Mutex<Objects>,
}

impl ObjectCache {
    pub fn new(client: kube::Client) -> ObjectCache {
        ObjectCache {
            client,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The data of a ConfigMap (`secret` false) or Secret, None when it does not exist.
    pub async fn data(
        &self,
        secret: bool,
        ns: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
        let key = (secret, ns.to_string(), name.to_string());
        if let Some((at, data)) = self.map.lock().unwrap_or_else(|e| e.into_inner()).get(&key)
            && at.elapsed() < OBJECT_TTL
        {
            return Ok(data.clone());
        }
        let data = if secret {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
            api.get_opt(name)
                .await
                .map_err(super::api_error)
                .with_context(|| format!("reading secret {ns}/{name}"))?
                .map(|s| {
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect()
                })
        } else {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
            api.get_opt(name)
                .await
                .map_err(super::api_error)
                .with_context(|| format!("reading configmap {ns}/{name}"))?
                .map(|c| {
                    let mut m: BTreeMap<String, Vec<u8>> = c
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect();
                    m.extend(
                        c.binary_data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0)),
                    );
                    m
                })
        };
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (Instant::now(), data.clone()));
        Ok(data)
    }
}

/// A pod's volumes on the node.
pub struct PodVolumes {
    dir: PathBuf,
    /// Volume name → the machine's path to bind into containers.
    pub sources: HashMap<String, PathBuf>,
    /// What each written volume holds, to skip rewriting unchanged files.
    written: HashMap<String, Files>,
    /// When a ServiceAccount token must be requested again.
    refresh_tokens_at: Option<Instant>,
    /// When the volumes were last written.
    materialized_at: Option<Instant>,
    /// Tokens in use: (volume, path) → (token, when to request another).
    tokens: HashMap<(String, String), (String, Instant)>,
}

/// What materializing a pod's volumes needs.
pub struct VolumeContext<'a> {
    pub client: &'a kube::Client,
    pub fs: &'a NodeFs,
    pub objects: &'a ObjectCache,
    pub fields: FieldContext<'a>,
}

impl PodVolumes {
    pub fn new(dir: PathBuf) -> PodVolumes {
        PodVolumes {
            dir,
            sources: HashMap::new(),
            written: HashMap::new(),
            refresh_tokens_at: None,
            materialized_at: None,
            tokens: HashMap::new(),
        }
    }

    /// When the volumes are due to be written again: a token's refresh, or the periodic
    /// resync of their sources.
    pub fn refresh_due(&self) -> Option<Instant> {
        let resync = self.materialized_at.map(|t| t + RESYNC);
        match (self.refresh_tokens_at, resync) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Makes (or refreshes) every volume of `pod`. The error names the volume, for the
    /// pod's FailedMount event.
    pub async fn materialize(&mut self, ctx: &VolumeContext<'_>, pod: &Pod) -> Result<()> {
        let volumes = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        self.materialized_at = Some(Instant::now());
        self.refresh_tokens_at = None;
        for volume in &volumes {
            self.volume(ctx, pod, volume).await.with_context(|| {
                format!("MountVolume.SetUp failed for volume {:?}", volume.name)
            })?;
        }
        Ok(())
    }

    async fn volume(&mut self, ctx: &VolumeContext<'_>, pod: &Pod, v: &Volume) -> Result<()> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let dir = self.dir.join(&v.name);
        let mut files = Files::new();
        let mode_of =
            |m: Option<i32>, default: Option<i32>| -> u32 { m.or(default).unwrap_or(0o644) as u32 };
        if let Some(hp) = &v.host_path {
            let path = ctx.fs.host_path(&hp.path)?;
            match hp.type_.as_deref().unwrap_or("") {
                "DirectoryOrCreate" | "" if !path.exists() => {
                    fs::create_dir_all(&path)?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
                }
                "FileOrCreate" if !path.exists() => {
                    if let Some(parent) = path.parent() {
                        fs::create_dir_all(parent)?;
                    }
                    fs::write(&path, b"")?;
                }
                "Directory" if !path.is_dir() => {
                    bail!("hostPath type check failed: {} is not a directory", hp.path)
                }
                "File" if !path.is_file() => {
                    bail!("hostPath type check failed: {} is not a file", hp.path)
                }
                "Socket" | "CharDevice" | "BlockDevice" if !path.exists() => {
                    bail!("hostPath type check failed: {} does not exist", hp.path)
                }
                _ => {}
            }
            self.sources.insert(v.name.clone(), path);
            return Ok(());
        }
        if v.empty_dir.is_some() {
            if !dir.exists() {
                fs::create_dir_all(&dir)?;
                // Any container user may write an emptyDir (the kubelet makes it 0777).
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o777))?;
            }
            self.sources.insert(v.name.clone(), dir);
            return Ok(());
        }
        if let Some(cm) = &v.config_map {
            let data = ctx.objects.data(false, ns, &cm.name).await?;
            add_keys(
                &mut files,
                data,
                &cm.name,
                "configmap",
                cm.items.as_deref(),
                cm.optional,
                cm.default_mode,
            )?;
        } else if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            let data = ctx.objects.data(true, ns, &name).await?;
            add_keys(
                &mut files,
                data,
                &name,
                "secret",
                s.items.as_deref(),
                s.optional,
                s.default_mode,
            )?;
        } else if let Some(d) = &v.downward_api {
            add_downward(
                &mut files,
                &ctx.fields,
                pod,
                d.items.as_deref().unwrap_or_default(),
                d.default_mode,
            )?;
        } else if let Some(p) = &v.projected {
            for source in p.sources.as_deref().unwrap_or_default() {
                if let Some(cm) = &source.config_map {
                    let data = ctx.objects.data(false, ns, &cm.name).await?;
                    add_keys(
                        &mut files,
                        data,
                        &cm.name,
                        "configmap",
                        cm.items.as_deref(),
                        cm.optional,
                        p.default_mode,
                    )?;
                }
                if let Some(s) = &source.secret {
                    let data = ctx.objects.data(true, ns, &s.name).await?;
                    add_keys(
                        &mut files,
                        data,
                        &s.name,
                        "secret",
                        s.items.as_deref(),
                        s.optional,
                        p.default_mode,
                    )?;
                }
                if let Some(d) = &source.downward_api {
                    add_downward(
                        &mut files,
                        &ctx.fields,
                        pod,
                        d.items.as_deref().unwrap_or_default(),
                        p.default_mode,
                    )?;
                }
                if let Some(t) = &source.service_account_token {
                    // A token is reused until its refresh is due.
                    let key = (v.name.clone(), t.path.clone());
                    let (token, refresh) = match self.tokens.get(&key) {
                        Some((token, refresh)) if Instant::now() < *refresh => {
                            (token.clone(), *refresh)
                        }
                        _ => {
                            let fresh = self
                                .token(ctx, pod, t.audience.clone(), t.expiration_seconds)
                                .await?;
                            self.tokens.insert(key, fresh.clone());
                            fresh
                        }
                    };
                    files.insert(
                        t.path.clone(),
                        (token.into_bytes(), mode_of(None, p.default_mode)),
                    );
                    self.refresh_tokens_at =
                        Some(self.refresh_tokens_at.map_or(refresh, |r| r.min(refresh)));
                }
                if source.cluster_trust_bundle.is_some() {
                    bail!(
                        "clusterTrustBundle sources are not supported by the lab's kubelet stand-in"
                    );
                }
            }
        } else {
            bail!(
                "this volume type is not supported by the lab's kubelet stand-in (hostPath, \
                 emptyDir, configMap, secret, downwardAPI and projected are)"
            );
        }
        if self.written.get(&v.name) != Some(&files) {
            write_atomic(&dir, &files)?;
            self.written.insert(v.name.clone(), files);
        }
        self.sources.insert(v.name.clone(), dir);
        Ok(())
    }

    /// A token for the pod's ServiceAccount, bound to the pod; returns it and when to refresh.
    async fn token(
        &self,
        ctx: &VolumeContext<'_>,
        pod: &Pod,
        audience: Option<String>,
        expiration: Option<i64>,
    ) -> Result<(String, Instant)> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let ttl = expiration.unwrap_or(3600);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audience.filter(|a| !a.is_empty()).into_iter().collect(),
                expiration_seconds: Some(ttl),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), ns);
        let answer = api
            .create_token_request(&sa, &PostParams::default(), &request)
            .await
            .map_err(super::api_error)
            .with_context(|| format!("requesting a token of serviceaccount {ns}/{sa}"))?;
        let status = answer.status.context("the TokenRequest has no status")?;
        // The server may shorten the lifetime; refresh after 80 % of what it granted.
        let granted = (status.expiration_timestamp.0.as_second()
            - jiff::Timestamp::now().as_second())
        .max(60) as u64;
        let refresh = Instant::now() + Duration::from_secs(granted * 4 / 5);
        Ok((status.token, refresh))
    }

    /// Removes the pod's volume directories (not hostPath ones: they are the node's).
    pub fn remove(&self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn add_keys(
    files: &mut Files,
    data: Option<BTreeMap<String, Vec<u8>>>,
    name: &str,
    kind: &str,
    items: Option<&[KeyToPath]>,
    optional: Option<bool>,
    default_mode: Option<i32>,
) -> Result<()> {
    let Some(data) = data else {
        if optional == Some(true) {
            return Ok(());
        }
        bail!("{kind} {name:?} not found");
    };
    let mode = default_mode.unwrap_or(0o644) as u32;
    match items {
        Some(items) if !items.is_empty() => {
            for item in items {
                let Some(value) = data.get(&item.key) else {
                    if optional == Some(true) {
                        continue;
                    }
                    bail!("{kind} {name:?}: no key {:?}", item.key);
                };
                let m = item.mode.map_or(mode, |m| m as u32);
                files.insert(item.path.clone(), (value.clone(), m));
            }
        }
        _ => {
            for (k, v) in data {
                files.insert(k, (v, mode));
            }
        }
    }
    Ok(())
}

fn add_downward(
    files: &mut Files,
    fields: &FieldContext<'_>,
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
) -> Result<()> {
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            field_value(fields, pod, &f.field_path)?
        } else if let Some(r) = &item.resource_field_ref {
            super::env::resource_value(pod, r.container_name.as_deref(), &r.resource)?
        } else {
            bail!(
                "downwardAPI item {:?}: neither fieldRef nor resourceFieldRef",
                item.path
            );
        };
        let mode = item.mode.or(default_mode).unwrap_or(0o644) as u32;
        files.insert(item.path.clone(), (value.into_bytes(), mode));
    }
    Ok(())
}

/// Writes `files` into `dir` as the kubelet's atomic writer does.
fn write_atomic(dir: &Path, files: &Files) -> Result<()> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    let stamp = jiff::Timestamp::now();
    let generation = format!("..{}", stamp.strftime("%Y_%m_%d_%H_%M_%S.%f"));
    let target = dir.join(&generation);
    fs::create_dir(&target)?;
    fs::set_permissions(&target, fs::Permissions::from_mode(0o755))?;
    for (rel, (bytes, mode)) in files {
        if rel.starts_with('/') || rel.split('/').any(|c| c == ".." || c.starts_with("..")) {
            bail!("file path {rel:?}: must be relative, without '..'");
        }
        let path = target.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&path, bytes)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(*mode))?;
    }
    let old = fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    let _ = fs::remove_file(&tmp);
    symlink(&generation, &tmp)?;
    fs::rename(&tmp, dir.join("..data"))?;
    let tops: std::collections::BTreeSet<&str> = files
        .keys()
        .map(|k| k.split('/').next().unwrap_or(k))
        .collect();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !tops.contains(name.as_str()) {
            let _ = fs::remove_file(entry.path());
        }
    }
    for top in tops {
        let link = dir.join(top);
        if link.symlink_metadata().is_err() {
            symlink(Path::new("..data").join(top), &link)?;
        }
    }
    if let Some(old) = old.filter(|o| *o != Path::new(&generation)) {
        let _ = fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_swaps_the_data_link_and_drops_removed_keys() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("v");
        let mut files = Files::new();
        files.insert("token".into(), (b"one".to_vec(), 0o644));
        files.insert("ca.crt".into(), (b"ca".to_vec(), 0o644));
        write_atomic(&vol, &files).unwrap();
        assert_eq!(fs::read(vol.join("token")).unwrap(), b"one");
        std::thread::sleep(Duration::from_millis(2));
        files.insert("token".into(), (b"two".to_vec(), 0o600));
        files.remove("ca.crt");
        write_atomic(&vol, &files).unwrap();
        assert_eq!(fs::read(vol.join("token")).unwrap(), b"two");
        assert!(
            vol.join("ca.crt").symlink_metadata().is_err(),
            "a removed key's link stays"
        );
        let generations: Vec<_> = fs::read_dir(&vol)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("..2"))
            .collect();
        assert_eq!(generations.len(), 1, "the old generation is removed");
        let mode = fs::metadata(vol.join("token"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
    }
}
