//! The HTTPS server every replica runs: `POST /validate`, `POST /mutate`, `GET /healthz`.
//!
//! TLS with rustls on ring; the certificate comes from a [`Certified`] resolver the keeper
//! swaps when the Secret changes, so a renewed certificate is served from the next handshake
//! on, without a restart. Bounded: at most [`MAX_CONNECTIONS`] connections, [`MAX_BODY`] bytes
//! per request, [`HANDSHAKE_TIMEOUT`] for a TLS handshake, [`REQUEST_TIMEOUT`] to read and answer
//! a request. A malformed AdmissionReview gets a 400 naming the problem.

use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use super::admit::{self, Lookup};
use super::certs::Material;

/// Connections served at once; more wait in the listen queue.
pub const MAX_CONNECTIONS: usize = 64;
/// An AdmissionReview carries the object and the old object; objects are at most ~1.5 MiB.
pub const MAX_BODY: usize = 4 << 20;
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longer than any `timeoutSeconds` of the configurations: the API server gives up first.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopping server waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(10);

type Reply = Response<Full<Bytes>>;

/// Why a Secret's certificate and key cannot be served; each names the Secret's key.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// `tls.crt` is not a PEM certificate chain.
    #[error("tls.crt: {0}")]
    Certificate(#[source] rustls::pki_types::pem::Error),
    /// `tls.key` is not a PEM private key.
    #[error("tls.key: {0}")]
    Key(#[source] rustls::pki_types::pem::Error),
    /// `tls.key` is a key that ring cannot sign with.
    #[error("tls.key: {0}")]
    UnsupportedKey(#[source] rustls::Error),
}

/// The serving certificate, swapped in place when the Secret changes.
#[derive(Debug, Default)]
pub struct Certified {
    current: RwLock<Option<(String, Arc<CertifiedKey>)>>,
}

impl Certified {
    /// Serves `material`'s certificate from the next handshake on; `Ok(false)` when it is
    /// already served.
    pub fn install(&self, material: &Material) -> Result<bool, InstallError> {
        if self
            .read()
            .as_ref()
            .is_some_and(|(pem, _)| *pem == material.tls_cert)
        {
            return Ok(false);
        }
        let chain = CertificateDer::pem_slice_iter(material.tls_cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(InstallError::Certificate)?;
        let key = PrivateKeyDer::from_pem_slice(material.tls_key.as_bytes())
            .map_err(InstallError::Key)?;
        let key = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(InstallError::UnsupportedKey)?;
        let certified = Arc::new(CertifiedKey::new(chain, key));
        *self.current.write().unwrap_or_else(|p| p.into_inner()) =
            Some((material.tls_cert.clone(), certified));
        Ok(true)
    }

    /// Whether a certificate is loaded.
    pub fn ready(&self) -> bool {
        self.read().is_some()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Option<(String, Arc<CertifiedKey>)>> {
        self.current.read().unwrap_or_else(|p| p.into_inner())
    }
}

impl ResolvesServerCert for Certified {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.read().as_ref().map(|(_, key)| key.clone())
    }
}

/// TLS settings: ring, TLS 1.2 and 1.3, HTTP/1.1, the certificate `certified` holds.
pub fn tls_config(certified: Arc<Certified>) -> Result<Arc<ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(certified);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves on `listener` until `stop` turns true, then lets requests in flight finish (for
/// [`DRAIN`] at most).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    lookup: Lookup,
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = stopped(&mut stop) => break,
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("webhook: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let acceptor = acceptor.clone();
        let lookup = lookup.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, "webhook: TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "webhook: TLS handshake timed out");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req| {
                let lookup = lookup.clone();
                async move {
                    let reply = tokio::time::timeout(REQUEST_TIMEOUT, handle(req, &lookup))
                        .await
                        .unwrap_or_else(|_| {
                            text(StatusCode::SERVICE_UNAVAILABLE, "timed out: try again")
                        });
                    Ok::<_, Infallible>(reply)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(REQUEST_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, "webhook: connection ended: {e}");
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN) => tracing::warn!("webhook: gave up waiting for requests in flight"),
    }
}

async fn handle(req: Request<Incoming>, lookup: &Lookup) -> Reply {
    let path = req.uri().path().to_string();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
        (&Method::POST, "/validate" | "/mutate") => {
            let review = match read_review(req).await {
                Ok(r) => r,
                Err(reply) => return reply,
            };
            let response = if path == "/validate" {
                admit::validate(&review, lookup).await
            } else {
                admit::mutate(&review)
            };
            json(StatusCode::OK, &response.into_review())
        }
        (_, "/healthz" | "/validate" | "/mutate") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: POST /validate or /mutate",
        ),
    }
}

/// The request of an AdmissionReview, or the 4xx reply saying what is wrong with it.
async fn read_review(req: Request<Incoming>) -> Result<AdmissionRequest<DynamicObject>, Reply> {
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("an AdmissionReview is at most {MAX_BODY} bytes"),
        )
    };
    // Refused before a byte of the body is read when its length is declared.
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(e) => {
            return Err(text(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the body: {e}"),
            ));
        }
    };
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(&body).map_err(|e| {
        text(
            StatusCode::BAD_REQUEST,
            &format!("not an AdmissionReview: {e}"),
        )
    })?;
    review.try_into().map_err(|_| {
        text(
            StatusCode::BAD_REQUEST,
            "an AdmissionReview without a request",
        )
    })
}

fn json<T: serde::Serialize>(status: StatusCode, body: &T) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(body).expect("an AdmissionReview serialises"),
    )));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn text(status: StatusCode, body: &str) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Completes once `stop` says true (or its sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn material_that_cannot_be_served_names_the_key_at_fault() {
        let material = Material {
            tls_cert: String::new(),
            tls_key: "not a key".into(),
            ca_cert: String::new(),
            ca_key: String::new(),
            next_ca: None,
            bundle: String::new(),
        };
        let certified = Certified::default();
        let e = certified.install(&material).unwrap_err();
        assert!(matches!(e, InstallError::Key(_)), "{e}");
        assert!(e.to_string().starts_with("tls.key: "), "{e}");
        assert!(!certified.ready());
    }
}
