//! Policy components as OCI artifacts (`oci://HOST/REPO:TAG` or `oci://HOST/REPO@sha256:…`),
//! in the shape the CNCF wasm OCI artifact layout and Kubewarden use: an image manifest whose
//! config is `application/vnd.wasm.config.v0+json` and whose one layer is the component,
//! `application/vnd.wasm.content.layer.v1+wasm`.
//!
//! Pulling verifies what it gets: the manifest against the reference's digest (when it names
//! one), the component against the manifest's layer digest, and the size against a cap before
//! and while reading. Anything that does not match is an error, never bytes.
//!
//! Registries on loopback (`localhost`, `127.0.0.0/8`, `[::1]`) are spoken to over plain HTTP,
//! as Docker does; others over HTTPS (rustls with ring, as the rest of allot), unless listed
//! in [`Options::plain_http`].

use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// How long a whole pull (or push) may take: a registry that stalls or drips must not hold an
/// agent's policy follower forever.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(120);

/// The largest component pulled (as the agent's other sources: the default policy is well under
/// 1 MiB).
pub const MAX_COMPONENT_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(
        "{0:?} is not an OCI reference: write oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:HEX"
    )]
    BadReference(String),
    #[error("{reference}: the registry answered: {reason}")]
    Registry { reference: String, reason: String },
    #[error("{reference}: {reason}; refusing it")]
    Invalid { reference: String, reason: String },
    #[error(
        "{reference}: {what} has digest {actual}, not {expected}: the registry served something else; refusing it"
    )]
    DigestMismatch {
        reference: String,
        what: &'static str,
        expected: String,
        actual: String,
    },
}

/// How to reach registries.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Registries (`HOST` or `HOST:PORT`) spoken to over plain HTTP besides loopback ones.
    pub plain_http: Vec<String>,
    /// Basic credentials; anonymous when absent.
    pub credentials: Option<(String, String)>,
}

/// A parsed `oci://` source.
#[derive(Clone, Debug)]
pub struct OciSource {
    text: String,
    reference: Reference,
}

impl OciSource {
    pub fn parse(text: &str) -> Result<Self, OciError> {
        let bad = || OciError::BadReference(text.to_string());
        let rest = text.strip_prefix("oci://").ok_or_else(bad)?;
        // A bare name would silently mean docker.io/library/NAME:latest: insist on a host.
        let (host, path) = rest.split_once('/').ok_or_else(bad)?;
        if host.is_empty()
            || path.is_empty()
            || !(host.contains('.') || host.contains(':') || host == "localhost")
        {
            return Err(bad());
        }
        let reference: Reference = rest.parse().map_err(|_| bad())?;
        if reference.tag().is_none() && reference.digest().is_none() {
            return Err(bad());
        }
        if let Some(d) = reference.digest()
            && !is_sha256_digest(d)
        {
            return Err(bad());
        }
        Ok(OciSource {
            text: text.to_string(),
            reference,
        })
    }

    /// The manifest digest the reference pins (`sha256:…`), if any.
    pub fn digest(&self) -> Option<&str> {
        self.reference.digest()
    }

    /// `oci://REGISTRY/REPO@DIGEST`.
    pub fn with_digest(&self, digest: &str) -> String {
        format!(
            "oci://{}/{}@{digest}",
            self.reference.registry(),
            self.reference.repository()
        )
    }
}

impl std::fmt::Display for OciSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn is_sha256_digest(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => registry.split(':').next().unwrap_or(""),
    };
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn client(source: &OciSource, options: &Options) -> Client {
    // reqwest is built without a crypto provider of its own: use ring, as kube and etcd-client do.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let registry = source.reference.resolve_registry().to_string();
    let plain = is_loopback(&registry) || options.plain_http.contains(&registry);
    Client::new(ClientConfig {
        protocol: if plain {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        connect_timeout: Some(Duration::from_secs(10)),
        read_timeout: Some(Duration::from_secs(30)),
        // A manifest list is not what `push` makes: refuse it rather than pick a platform.
        platform_resolver: None,
        ..Default::default()
    })
}

fn auth(options: &Options) -> RegistryAuth {
    match &options.credentials {
        Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
        None => RegistryAuth::Anonymous,
    }
}

/// What a push stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// The manifest's digest: pin it with `oci://…@DIGEST`.
    pub manifest_digest: String,
    /// The component's own sha256 (what a Policy's `sha256` field names).
    pub component_digest: String,
    /// `oci://REGISTRY/REPO@MANIFEST_DIGEST`.
    pub pinned: String,
}

fn timed_out(reference: &str) -> OciError {
    OciError::Registry {
        reference: reference.to_string(),
        reason: format!("no complete answer within {} s", TRANSFER_TIMEOUT.as_secs()),
    }
}

/// Pushes `component` as an artifact to `target` (which must name a tag).
pub async fn push(component: &[u8], target: &str, options: &Options) -> Result<Pushed, OciError> {
    tokio::time::timeout(TRANSFER_TIMEOUT, push_unbounded(component, target, options))
        .await
        .unwrap_or_else(|_| Err(timed_out(target)))
}

async fn push_unbounded(
    component: &[u8],
    target: &str,
    options: &Options,
) -> Result<Pushed, OciError> {
    let source = OciSource::parse(target)?;
    if source.reference.digest().is_some() {
        return Err(OciError::Invalid {
            reference: target.into(),
            reason: "a push needs a tag (oci://HOST/REPO:TAG); the registry gives the digest"
                .into(),
        });
    }
    let component_digest = sha256_digest(component);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": [component_digest],
    }))
    .expect("a JSON value serializes");
    let layers = [ImageLayer::new(
        component.to_vec(),
        LAYER_MEDIA_TYPE.to_string(),
        None,
    )];
    let config = Config::new(config, CONFIG_MEDIA_TYPE.to_string(), None);
    let manifest = OciImageManifest::build(&layers, &config, None);
    // The digest of the manifest as the client serializes it (canonical JSON).
    let client = client(&source, options);
    let registry_error = |e: oci_client::errors::OciDistributionError| OciError::Registry {
        reference: target.into(),
        reason: e.to_string(),
    };
    client
        .push(
            &source.reference,
            &layers,
            config,
            &auth(options),
            Some(manifest),
        )
        .await
        .map_err(registry_error)?;
    let (_, manifest_digest) = client
        .pull_manifest_raw(&source.reference, &auth(options), &[OCI_IMAGE_MEDIA_TYPE])
        .await
        .map_err(registry_error)?;
    Ok(Pushed {
        pinned: source.with_digest(&manifest_digest),
        manifest_digest,
        component_digest,
    })
}

/// A component pulled and verified.
#[derive(Clone, Debug)]
pub struct Pulled {
    pub component: Vec<u8>,
    pub manifest_digest: String,
    pub component_digest: String,
}

/// Pulls the component `source` names, verifying every digest on the way.
pub async fn pull(source: &OciSource, options: &Options) -> Result<Pulled, OciError> {
    tokio::time::timeout(TRANSFER_TIMEOUT, pull_unbounded(source, options))
        .await
        .unwrap_or_else(|_| Err(timed_out(&source.text)))
}

async fn pull_unbounded(source: &OciSource, options: &Options) -> Result<Pulled, OciError> {
    let reference = source.text.clone();
    let client = client(source, options);
    let registry_error = |e: oci_client::errors::OciDistributionError| match e {
        oci_client::errors::OciDistributionError::DigestError(d) => OciError::Invalid {
            reference: reference.clone(),
            reason: format!("what the registry served does not match its digest ({d})"),
        },
        e => OciError::Registry {
            reference: reference.clone(),
            reason: e.to_string(),
        },
    };
    let invalid = |reason: String| OciError::Invalid {
        reference: reference.clone(),
        reason,
    };
    let (raw, _) = client
        .pull_manifest_raw(&source.reference, &auth(options), &[OCI_IMAGE_MEDIA_TYPE])
        .await
        .map_err(registry_error)?;
    let manifest_digest = sha256_digest(&raw);
    if let Some(expected) = source.digest()
        && expected != manifest_digest
    {
        return Err(OciError::DigestMismatch {
            reference,
            what: "the manifest",
            expected: expected.into(),
            actual: manifest_digest,
        });
    }
    let manifest: OciImageManifest = serde_json::from_slice(&raw)
        .map_err(|e| invalid(format!("the manifest cannot be read: {e}")))?;
    let layers: Vec<_> = manifest
        .layers
        .iter()
        .filter(|l| l.media_type == LAYER_MEDIA_TYPE)
        .collect();
    let [layer] = layers[..] else {
        return Err(invalid(format!(
            "the artifact has {} layers of type {LAYER_MEDIA_TYPE}, not one: is it an allot \
             policy pushed with `allotctl policy push`?",
            layers.len()
        )));
    };
    if !is_sha256_digest(&layer.digest) {
        return Err(invalid(format!(
            "the component's digest {:?} is not a sha256 digest",
            layer.digest
        )));
    }
    if layer.size < 0 || layer.size as u64 > MAX_COMPONENT_BYTES {
        return Err(invalid(format!(
            "the component is {} bytes, above the limit of {} MiB",
            layer.size,
            MAX_COMPONENT_BYTES >> 20
        )));
    }
    let mut out = Capped {
        bytes: Vec::with_capacity(layer.size as usize),
        cap: layer.size as usize,
    };
    client
        .pull_blob(&source.reference, layer, &mut out)
        .await
        .map_err(registry_error)?;
    let component_digest = sha256_digest(&out.bytes);
    if component_digest != layer.digest {
        return Err(OciError::DigestMismatch {
            reference,
            what: "the component",
            expected: layer.digest.clone(),
            actual: component_digest,
        });
    }
    Ok(Pulled {
        component: out.bytes,
        manifest_digest,
        component_digest,
    })
}

/// A writer that refuses more than the manifest said the component holds.
struct Capped {
    bytes: Vec<u8>,
    cap: usize,
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.bytes.len() + buf.len() > self.cap {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "the registry sent more than the {} bytes announced",
                    self.cap
                ),
            )));
        }
        self.bytes.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_need_a_host_and_a_tag_or_a_sha256_digest() {
        let d = format!("sha256:{}", "ab".repeat(32));
        for good in [
            "oci://127.0.0.1:5000/allot/policy:v1".to_string(),
            "oci://localhost/p:v1".to_string(),
            format!("oci://registry.example.com/team/policy@{d}"),
        ] {
            OciSource::parse(&good).unwrap();
        }
        for bad in [
            "127.0.0.1:5000/allot/policy:v1",
            "oci://policy:v1",
            "oci://policy",
            "oci://registry.example.com/policy@sha256:abc",
            "oci://registry.example.com/",
            "oci://registry.example.com/policy@md5:00",
        ] {
            assert!(OciSource::parse(bad).is_err(), "{bad}");
        }
        let s = OciSource::parse(&format!("oci://127.0.0.1:5000/a/b@{d}")).unwrap();
        assert_eq!(s.digest(), Some(d.as_str()));
        assert_eq!(
            s.with_digest("sha256:00"),
            "oci://127.0.0.1:5000/a/b@sha256:00"
        );
    }

    #[test]
    fn loopback_registries_are_plain_http_and_others_are_not() {
        for r in [
            "127.0.0.1:5000",
            "localhost:5000",
            "localhost",
            "[::1]:5000",
            "127.1.2.3",
        ] {
            assert!(is_loopback(r), "{r}");
        }
        for r in [
            "10.0.0.1:5000",
            "registry.example.com",
            "ghcr.io",
            "[fd00::1]:5000",
        ] {
            assert!(!is_loopback(r), "{r}");
        }
    }

    #[tokio::test]
    async fn the_capped_writer_refuses_more_than_announced() {
        use tokio::io::AsyncWriteExt;
        let mut w = Capped {
            bytes: Vec::new(),
            cap: 4,
        };
        w.write_all(b"abcd").await.unwrap();
        assert!(w.write_all(b"e").await.is_err());
        assert_eq!(w.bytes, b"abcd");
    }
}
