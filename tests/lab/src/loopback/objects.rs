//! Objects as JSON, by `apiVersion` and plural: what a test inserts, edits, reads and deletes
//! without a typed client per kind.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;

use super::LoopbackControlPlane;

/// The API path of `plural` of `api_version` (`v1`, `apps/v1`, `allot.dev/v1alpha1`), in
/// `namespace` (all namespaces, or cluster-scoped, when `None`), of object `name` when given.
pub fn resource_path(
    api_version: &str,
    plural: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> String {
    let mut path = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    if let Some(ns) = namespace {
        path.push_str(&format!("/namespaces/{ns}"));
    }
    path.push('/');
    path.push_str(plural);
    if let Some(name) = name {
        path.push('/');
        path.push_str(name);
    }
    path
}

fn path_of(plural: &str, object: &Value, with_name: bool) -> Result<String> {
    let api_version = object["apiVersion"]
        .as_str()
        .context("the object has no apiVersion")?;
    let name = object["metadata"]["name"].as_str();
    if with_name && name.is_none() {
        bail!("the object has no metadata.name");
    }
    Ok(resource_path(
        api_version,
        plural,
        object["metadata"]["namespace"].as_str(),
        name.filter(|_| with_name),
    ))
}

async fn send(client: &kube::Client, request: http::Request<Vec<u8>>) -> Result<Value> {
    let what = format!("{} {}", request.method(), request.uri());
    client.request::<Value>(request).await.with_context(|| what)
}

fn json_request(method: http::Method, path: &str, body: &Value) -> Result<http::Request<Vec<u8>>> {
    Ok(http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(body)?)?)
}

impl LoopbackControlPlane {
    /// Creates `object` of `plural` (its `apiVersion`, `metadata.name` and, when namespaced,
    /// `metadata.namespace` set); returns it as stored. A `status` given is dropped by the
    /// server, as for any create: write it with [`Self::replace_status`].
    pub fn create(&self, plural: &str, object: Value) -> Result<Value> {
        let path = path_of(plural, &object, false)?;
        let request = json_request(http::Method::POST, &path, &object)?;
        self.block_on(send(&self.client, request))
    }

    /// Replaces `object` as `kubectl replace` does: on the `resourceVersion` it carries, or
    /// unconditionally without one where the kind allows it (built-in kinds; custom resources
    /// do not). Returns it as stored.
    pub fn replace(&self, plural: &str, object: Value) -> Result<Value> {
        let path = path_of(plural, &object, true)?;
        let request = json_request(http::Method::PUT, &path, &object)?;
        self.block_on(send(&self.client, request))
    }

    /// Edits object `name` as `kubectl edit` does: read, `change`d, replaced on the version
    /// read; read and changed again when another writer came first (409). Returns it as
    /// stored.
    pub fn edit(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
        change: impl Fn(&mut Value),
    ) -> Result<Value> {
        for _ in 0..10 {
            let mut object = self
                .get(api_version, plural, namespace, name)?
                .with_context(|| format!("no {plural} {name} to edit"))?;
            change(&mut object);
            let path = path_of(plural, &object, true)?;
            let request = json_request(http::Method::PUT, &path, &object)?;
            match self.block_on(self.client.request::<Value>(request)) {
                Ok(stored) => return Ok(stored),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e).with_context(|| format!("PUT {path}")),
            }
        }
        bail!("{plural} {name}: others kept changing it (409 ten times)")
    }

    /// Replaces the status of `object` through its status subresource (as a kubelet writes a
    /// pod's). Returns the object as stored.
    pub fn replace_status(&self, plural: &str, object: Value) -> Result<Value> {
        let path = format!("{}/status", path_of(plural, &object, true)?);
        let request = json_request(http::Method::PUT, &path, &object)?;
        self.block_on(send(&self.client, request))
    }

    /// Object `name` of `plural`, or None.
    pub fn get(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>> {
        let path = resource_path(api_version, plural, namespace, Some(name));
        let request = http::Request::get(&path).body(Vec::new())?;
        match self.block_on(self.client.request::<Value>(request)) {
            Ok(v) => Ok(Some(v)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e).with_context(|| format!("GET {path}")),
        }
    }

    /// Every object of `plural` of `api_version`, in every namespace, in the server's order
    /// (namespace, then name).
    pub fn list(&self, api_version: &str, plural: &str) -> Result<Vec<Value>> {
        let path = resource_path(api_version, plural, None, None);
        let request = http::Request::get(&path).body(Vec::new())?;
        let list = self.block_on(send(&self.client, request))?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// Deletes object `name` as `kubectl delete --force --grace-period=0` does (no kubelet
    /// confirms a bound pod's deletion here; finalizers are still honoured). False when there
    /// was none.
    pub fn delete(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<bool> {
        self.delete_with_grace(api_version, plural, namespace, name, 0)
    }

    /// Deletes object `name` with a grace period of `seconds`, as `kubectl delete
    /// --grace-period` does: a pod bound to a node stays, terminating, until its kubelet (none
    /// here) confirms or the object is deleted again with 0. False when there was none.
    pub fn delete_with_grace(
        &self,
        api_version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
        seconds: u64,
    ) -> Result<bool> {
        let path = resource_path(api_version, plural, namespace, Some(name));
        let body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1",
                                      "gracePeriodSeconds": seconds});
        let request = json_request(http::Method::DELETE, &path, &body)?;
        match self.block_on(self.client.request::<Value>(request)) {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e).with_context(|| format!("DELETE {path}")),
        }
    }

    /// Deletes every object of cluster-scoped `plural` (deletecollection) and waits until a
    /// list finds none (an object with finalizers stays until they are removed: this fails
    /// after 30 s).
    pub fn delete_all(&self, api_version: &str, plural: &str) -> Result<()> {
        let path = resource_path(api_version, plural, None, None);
        let body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1",
                                      "gracePeriodSeconds": 0});
        let request = json_request(http::Method::DELETE, &path, &body)?;
        self.block_on(send(&self.client, request))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = self.list(api_version, plural)?;
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} {plural} still exist 30 s after deleting them all",
                    left.len()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Creates `crds` (server-side apply, as `allotctl crds --apply` creates a missing one) and
/// waits until each is Established.
pub(super) async fn apply_crds(
    client: &kube::Client,
    crds: &[CustomResourceDefinition],
) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd.metadata.name.clone().context("a CRD without a name")?;
        api.patch(
            &name,
            &PatchParams::apply("allot-lab").force(),
            &Patch::Apply(crd),
        )
        .await
        .with_context(|| format!("applying CRD {name}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let live = api.get(&name).await?;
            let established = live
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            if established {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "CRD {name} is not Established after 30 s: {:?}",
                    live.status
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}
