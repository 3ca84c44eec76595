//! The webhook as it runs: HTTPS on a loopback port verified against the CA it made itself, the
//! certificate renewed and served without a restart, the CA rotated with an overlap, a reset
//! caBundle repaired, two replicas racing for the Secret, against the in-memory API server.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use allot_controller::lease::Leadership;
use allot_controller::webhook::certs::{CertPolicy, Material, service_names};
use allot_controller::webhook::{Settings, Webhook};
use allot_core::store::MemoryStore;
use allot_k8s::openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use allot_k8s::openapi::api::core::v1::Secret;
use allot_test_apiserver::ApiServer;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

const NAMESPACE: &str = "allot";
const SERVICE: &str = "allot-webhook";

fn settings(certs: CertPolicy) -> Settings {
    Settings {
        bind: "127.0.0.1:0".parse().unwrap(),
        namespace: NAMESPACE.into(),
        service: SERVICE.into(),
        service_port: 443,
        secret: "allot-webhook-tls".into(),
        config_name: "allot".into(),
        owner: None,
        // Long: what these tests see happen is driven by watches and due renewals.
        check_every: Duration::from_secs(60),
        certs,
    }
}

fn long_lived() -> CertPolicy {
    CertPolicy::default()
}

async fn start(server: &ApiServer, leadership: Leadership, certs: CertPolicy) -> Webhook {
    let webhook = Webhook::start(
        server.client(),
        settings(certs),
        Arc::new(MemoryStore::new()),
        leadership,
    )
    .await
    .expect("the webhook starts");
    eventually("a certificate is served", || async {
        webhook.ready().then_some(())
    })
    .await;
    webhook
}

async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, mut f: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn stored_secret(server: &ApiServer) -> Option<Material> {
    let object = server.objects("secrets").into_iter().next()?;
    let secret: Secret = serde_json::from_value(object).unwrap();
    Some(Material::from_data(&secret.data.unwrap_or_default()).unwrap())
}

fn validating(server: &ApiServer) -> Option<ValidatingWebhookConfiguration> {
    let object = server
        .objects("validatingwebhookconfigurations")
        .into_iter()
        .next()?;
    Some(serde_json::from_value(object).unwrap())
}

fn mutating(server: &ApiServer) -> Option<MutatingWebhookConfiguration> {
    let object = server
        .objects("mutatingwebhookconfigurations")
        .into_iter()
        .next()?;
    Some(serde_json::from_value(object).unwrap())
}

fn validating_bundle(server: &ApiServer) -> Option<String> {
    let config = validating(server)?;
    let bundle = config.webhooks?[0].client_config.ca_bundle.clone()?;
    Some(String::from_utf8(bundle.0).unwrap())
}

/// One HTTPS exchange with the webhook at `addr`, trusting only the CAs of `trusted`, as the API
/// server does (it names the Service). The answer's status and body, and the certificate
/// served; `Err` when the handshake fails.
async fn exchange(
    addr: SocketAddr,
    trusted: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> Result<(u16, String, Vec<u8>), String> {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(trusted.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(format!("{SERVICE}.{NAMESPACE}.svc")).unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let served = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "allot-webhook")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let text = response.into_body().collect().await.unwrap().to_bytes();
    Ok((status, String::from_utf8_lossy(&text).into_owned(), served))
}

/// Writes `bytes` over TLS and returns what comes back before the server closes or pauses.
async fn raw(addr: SocketAddr, trusted: &str, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(trusted.as_bytes()) {
        roots.add(ca.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(format!("{SERVICE}.{NAMESPACE}.svc")).unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    tls.write_all(bytes).await.unwrap();
    let mut answer = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut answer))
        .await
        .map_or(0, |r| r.unwrap_or(0));
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

fn review(object: Value) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "u-1", "operation": "CREATE", "name": object["metadata"]["name"],
            "kind": {"group": "allot.dev", "version": "v1alpha1", "kind": "IPPool"},
            "resource": {"group": "allot.dev", "version": "v1alpha1", "resource": "ippools"},
            "userInfo": {"username": "admin"}, "object": object, "dryRun": false,
        }
    })
    .to_string()
    .into_bytes()
}

fn pool(name: &str, ips: &str) -> Value {
    json!({"apiVersion": "allot.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": name},
           "spec": {"subnet": "10.0.0.0/24", "ips": [ips]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_https_admission_review_is_answered_and_verified_against_the_generated_ca() {
    let server = ApiServer::new();
    server.insert("ippools", pool("a", "10.0.0.10-10.0.0.20"));
    let webhook = start(&server, Leadership::always(), long_lived()).await;
    let bundle = eventually("the configuration", || async { validating_bundle(&server) }).await;
    let material = stored_secret(&server).unwrap();
    assert_eq!(
        bundle, material.bundle,
        "the configuration trusts the Secret's CAs"
    );
    let addr = webhook.local_addr;

    let (status, body, _) = exchange(
        addr,
        &bundle,
        "POST",
        "/validate",
        review(pool("b", "10.0.0.15-10.0.0.30")),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["response"]["uid"], "u-1");
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(message.contains("are also in IPPool a"), "{message}");
    let (status, body, _) = exchange(
        addr,
        &bundle,
        "POST",
        "/validate",
        review(pool("b", "10.0.0.50")),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["response"]["allowed"],
        true
    );
    let (status, body, _) = exchange(
        addr,
        &bundle,
        "POST",
        "/mutate",
        review(pool("b", "10.0.0.50")),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["response"]["patchType"],
        "JSONPatch"
    );

    // Malformed requests: a 400 naming the problem, and the server keeps serving.
    let (status, body, _) = exchange(addr, &bundle, "POST", "/validate", b"{not json".to_vec())
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert!(body.contains("not an AdmissionReview"), "{body}");
    let empty = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string();
    let (status, body, _) = exchange(addr, &bundle, "POST", "/validate", empty.into_bytes())
        .await
        .unwrap();
    assert_eq!(
        (status, body.trim()),
        (400, "an AdmissionReview without a request")
    );
    // Too large: refused from the declared length, before the body is sent.
    let answer = raw(
        addr,
        &bundle,
        b"POST /validate HTTP/1.1\r\nhost: x\r\ncontent-length: 5242880\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // Not HTTP at all, inside TLS: the connection is dropped, the server goes on.
    let answer = raw(addr, &bundle, b"\x00\x01garbage\r\n\r\n").await;
    assert!(!answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (status, _, _) = exchange(addr, &bundle, "GET", "/validate", vec![])
        .await
        .unwrap();
    assert_eq!(status, 405);
    let (status, body, _) = exchange(addr, &bundle, "GET", "/healthz", vec![])
        .await
        .unwrap();
    assert_eq!((status, body.trim()), (200, "ok"));

    // A client trusting another CA does not get through: the verification above was real.
    let stranger = rcgen::generate_simple_self_signed(vec!["x".to_string()]).unwrap();
    let refused = exchange(addr, &stranger.cert.pem(), "GET", "/healthz", vec![]).await;
    assert!(
        refused.is_err(),
        "a handshake against a foreign CA must fail"
    );
    webhook.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configurations_are_created_with_the_chosen_policies() {
    let server = ApiServer::new();
    let webhook = start(&server, Leadership::always(), long_lived()).await;
    let config = eventually("the validating configuration", || async {
        validating(&server)
    })
    .await;
    let hook = &config.webhooks.as_ref().unwrap()[0];
    assert_eq!(hook.name, "validate.allot.dev");
    assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
    assert_eq!(hook.side_effects, "None");
    assert_eq!(hook.match_policy.as_deref(), Some("Equivalent"));
    assert_eq!(hook.timeout_seconds, Some(5));
    let service = hook.client_config.service.as_ref().unwrap();
    assert_eq!(
        (service.namespace.as_str(), service.name.as_str()),
        (NAMESPACE, SERVICE)
    );
    assert_eq!(
        (service.path.as_deref(), service.port),
        (Some("/validate"), Some(443))
    );
    let resources: BTreeSet<String> = hook
        .rules
        .iter()
        .flatten()
        .flat_map(|r| r.resources.clone().unwrap())
        .collect();
    assert_eq!(
        resources,
        [
            "ipamallocations",
            "ipampools",
            "ippools",
            "reservedips",
            "subnets"
        ]
        .map(String::from)
        .into()
    );
    let m = eventually("the mutating configuration", || async { mutating(&server) }).await;
    let hook = &m.webhooks.as_ref().unwrap()[0];
    assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(
        hook.client_config.service.as_ref().unwrap().path.as_deref(),
        Some("/mutate")
    );
    webhook.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_or_deleted_configuration_is_repaired_within_seconds() {
    let server = ApiServer::new();
    let webhook = start(&server, Leadership::always(), long_lived()).await;
    let bundle = eventually("the configuration", || async { validating_bundle(&server) }).await;
    let m = eventually("the mutating configuration", || async { mutating(&server) }).await;

    // What a `helm upgrade` re-applying a template with an empty caBundle leaves behind.
    let mut reset = server.objects("validatingwebhookconfigurations").remove(0);
    reset["webhooks"][0]["clientConfig"]
        .as_object_mut()
        .unwrap()
        .remove("caBundle");
    reset["metadata"]["labels"]["helm.sh/chart"] = json!("allot-0.1.0");
    server.edit("validatingwebhookconfigurations", reset);
    let repaired = eventually("caBundle repaired", || async {
        validating_bundle(&server).filter(|b| *b == bundle)
    })
    .await;
    assert_eq!(repaired, bundle);
    let labels = validating(&server).unwrap().metadata.labels.unwrap();
    assert_eq!(
        labels["helm.sh/chart"], "allot-0.1.0",
        "the labels of the object are kept"
    );

    // An old CA and a changed failure policy on the mutating one.
    let mut stale = serde_json::to_value(&m).unwrap();
    stale["webhooks"][0]["clientConfig"]["caBundle"] = json!("b2xkIENB");
    stale["webhooks"][0]["failurePolicy"] = json!("Fail");
    server.edit("mutatingwebhookconfigurations", stale);
    eventually("mutating configuration repaired", || async {
        let hook = mutating(&server)?.webhooks?.remove(0);
        (hook.client_config.ca_bundle?.0 == bundle.as_bytes()
            && hook.failure_policy.as_deref() == Some("Ignore"))
        .then_some(())
    })
    .await;

    // Deleted by hand: created again.
    server.remove(
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        None,
        "allot",
    );
    eventually("configuration created again", || async {
        validating_bundle(&server)
    })
    .await;
    webhook.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_is_renewed_and_served_without_a_restart() {
    let server = ApiServer::new();
    let certs = CertPolicy {
        serving_validity: Duration::from_secs(6),
        ..CertPolicy::default()
    };
    let webhook = start(&server, Leadership::always(), certs).await;
    let first = stored_secret(&server).unwrap();
    let (_, _, served) = exchange(webhook.local_addr, &first.bundle, "GET", "/healthz", vec![])
        .await
        .unwrap();
    assert_eq!(pem_of(&served), first.tls_cert);

    // Renewed with a third of its 6 s left, by the same CA: the next handshake gets it.
    let renewed = eventually("a renewed certificate", || async {
        stored_secret(&server).filter(|m| m.tls_cert != first.tls_cert)
    })
    .await;
    assert_eq!(renewed.ca_cert, first.ca_cert);
    assert!(renewed.serving_not_after().unwrap() > first.serving_not_after().unwrap());
    let served = eventually("the renewed certificate served", || async {
        let (_, _, served) = exchange(webhook.local_addr, &first.bundle, "GET", "/healthz", vec![])
            .await
            .ok()?;
        (pem_of(&served) != first.tls_cert).then_some(served)
    })
    .await;
    let now = stored_secret(&server).unwrap();
    assert!(
        [renewed.tls_cert, now.tls_cert].contains(&pem_of(&served)),
        "what is served is what the Secret holds"
    );
    webhook.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_is_rotated_with_an_overlap_in_the_bundle() {
    let server = ApiServer::new();
    let certs = CertPolicy {
        // Its successor joins with 5 s left, takes over a second later.
        ca_validity: Duration::from_secs(15),
        serving_validity: Duration::from_secs(60),
        ca_overlap: Duration::from_secs(1),
    };
    let webhook = start(&server, Leadership::always(), certs).await;
    let first = stored_secret(&server).unwrap();
    let addr = webhook.local_addr;

    // Step 1: the next CA joins the bundle (and the configurations) before it signs anything.
    let prepared = eventually("a next CA in the bundle", || async {
        stored_secret(&server).filter(|m| m.next_ca.is_some())
    })
    .await;
    let (next_ca, _) = prepared.next_ca.clone().unwrap();
    assert_eq!(prepared.ca_cert, first.ca_cert, "the old CA still signs");
    assert!(prepared.bundle.contains(&first.ca_cert) && prepared.bundle.contains(&next_ca));
    let config_bundle = eventually("the configuration trusts both", || async {
        validating_bundle(&server).filter(|b| b.contains(&next_ca))
    })
    .await;
    assert!(config_bundle.contains(&first.ca_cert));

    // Step 2: it takes over; the old CA stays trusted while a replica may serve what it signed.
    let promoted = eventually("the next CA signs", || async {
        stored_secret(&server).filter(|m| m.ca_cert == next_ca)
    })
    .await;
    assert!(promoted.next_ca.is_none());
    assert!(
        promoted.bundle.contains(&first.ca_cert) || unix_now() >= first_ca_expiry(&first),
        "the old CA stays in the bundle until it expires"
    );
    eventually(
        "the new certificate served, verified by the new CA alone",
        || async {
            exchange(addr, &next_ca, "GET", "/healthz", vec![])
                .await
                .ok()
        },
    )
    .await;
    // A client that trusts only the old CA no longer gets through.
    assert!(
        exchange(addr, &first.ca_cert, "GET", "/healthz", vec![])
            .await
            .is_err()
    );
    // Step 3: the expired old CA leaves the bundle, in the Secret and in the configurations.
    eventually("the old CA dropped", || async {
        let b = validating_bundle(&server)?;
        (!b.contains(&first.ca_cert) && b.contains(&next_ca)).then_some(())
    })
    .await;
    webhook.stop().await;
}

fn unix_now() -> i64 {
    allot_controller::webhook::secret::unix_now()
}

fn first_ca_expiry(m: &Material) -> i64 {
    let der = CertificateDer::from_pem_slice(m.ca_cert.as_bytes()).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    cert.validity().not_after.timestamp()
}

fn pem_of(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_starting_at_once_serve_the_one_certificate_that_won() {
    let server = ApiServer::new();
    // Creates take a while: both replicas read "no Secret" before either write lands; one
    // create wins, the other gets 409 AlreadyExists.
    server.delay("create", "secrets", Duration::from_millis(500));
    let (a, b) = tokio::join!(
        start(&server, Leadership::always(), long_lived()),
        start(&server, Leadership::default(), long_lived()),
    );
    server.clear_faults();
    assert_eq!(server.objects("secrets").len(), 1);
    assert_eq!(
        server.requests("create", "secrets"),
        2,
        "both tried to create it"
    );
    let material = stored_secret(&server).unwrap();
    for webhook in [&a, &b] {
        let (_, _, served) = exchange(
            webhook.local_addr,
            &material.bundle,
            "GET",
            "/healthz",
            vec![],
        )
        .await
        .unwrap();
        assert_eq!(
            pem_of(&served),
            material.tls_cert,
            "every replica serves the winner's"
        );
    }
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_serves_but_neither_writes_configurations_nor_renews_early() {
    let server = ApiServer::new();
    let certs = CertPolicy {
        serving_validity: Duration::from_secs(12),
        ..CertPolicy::default()
    };
    let follower = start(&server, Leadership::default(), certs.clone()).await;
    let first = stored_secret(&server).unwrap();
    // Past two thirds of the certificate's life: a leader would have renewed it by now.
    tokio::time::sleep(Duration::from_millis(8_500)).await;
    assert_eq!(
        stored_secret(&server).unwrap(),
        first,
        "a follower renews only what expired"
    );
    assert!(validating(&server).is_none() && mutating(&server).is_none());

    // A leader comes: it renews at once and writes the configurations; the follower serves the
    // renewed certificate through its watch of the Secret.
    let leader = start(&server, Leadership::always(), certs).await;
    let renewed = eventually("renewed by the leader", || async {
        stored_secret(&server).filter(|m| m.tls_cert != first.tls_cert)
    })
    .await;
    eventually("the follower serves it", || async {
        let (_, _, served) = exchange(
            follower.local_addr,
            &renewed.bundle,
            "GET",
            "/healthz",
            vec![],
        )
        .await
        .ok()?;
        (pem_of(&served) != first.tls_cert).then_some(())
    })
    .await;
    assert!(validating(&server).is_some());
    leader.stop().await;
    follower.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_secret_is_replaced_and_served() {
    let server = ApiServer::new();
    let webhook = start(&server, Leadership::default(), long_lived()).await;
    let first = stored_secret(&server).unwrap();
    let mut broken = server.objects("secrets").remove(0);
    broken["data"]["tls.key"] = json!("bm90IGEga2V5"); // "not a key"
    server.edit("secrets", broken);
    let repaired = eventually("the Secret repaired", || async {
        stored_secret(&server).filter(|m| m.tls_cert != first.tls_cert)
    })
    .await;
    let secret = server.objects("secrets").remove(0);
    let reason = secret["metadata"]["annotations"]["allot.dev/webhook-certificate-reason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("tls.key"), "{reason}");
    eventually("the repaired certificate served", || async {
        exchange(
            webhook.local_addr,
            &repaired.bundle,
            "GET",
            "/healthz",
            vec![],
        )
        .await
        .ok()
    })
    .await;
    assert_eq!(
        service_names(SERVICE, NAMESPACE)[0],
        "allot-webhook.allot.svc"
    );
    webhook.stop().await;
}
